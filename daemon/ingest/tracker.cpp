#include "daemon/ingest/tracker.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "daemon/base/state_io.h"
#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/chunk_tokens.h"
#include "daemon/store/parts/kv_transfer.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/parts/sleep.h"
#include "daemon/store/parts/waiting_reason.h"

namespace tokenmeter::daemon {

namespace {

enum class Gauge : uint8_t { kNone, kWaiting, kRunning };

// A request's time points, in event terms. kQueueStart is not stored: it
// reads queued when known, else arrived (QUEUED is optional).
enum Point : uint8_t {
  kArrived,
  kQueued,
  kScheduled,
  kFirstToken,
  kLastToken,
  kFinished,
  kNumPoints,
  kQueueStart = kNumPoints,
};
constexpr uint8_t Bit(Point p) { return uint8_t(1u << p); }

// One interval: from `start` to `end`, observed into `metric` with the
// labels of the connection that sent the first token (kFirstToken) or the
// FINISHED (kFinished), either as soon as both ends are known or (at_finish)
// once the request has finished. It should exist once any point in
// `exists_if` is known; an at_finish one only if that holds when FINISHED
// is applied (and, per_token, the request then has more than one token):
// what is decided then is not revisited by later events. One that should
// exist but never closes is counted as incomplete when the request is
// retired. per_token divides the interval by generation tokens - 1 (TPOT).
// `needs` are points that must be known besides the two ends: the decode
// phase's rows need ARRIVED, because a request whose start the daemon
// never saw (it was in flight across a daemon restart) may have produced
// tokens before the first one seen, and its phases would be biased short.
// `profile_only` rows measure a metric only the series of some profiles
// show (EngineSeries::uses()): observed only into those, and never counted
// as incomplete or negative (the tokenmeter_* counters do not depend on
// profiles; the row of the same interval in the vLLM catalog counts).
struct IntervalDef {
  Interval interval;
  EngineMetric metric;
  Point start;
  Point end;
  Point labels;  // kFirstToken or kFinished
  bool at_finish;
  uint8_t exists_if;
  bool per_token;
  uint8_t needs;
  bool profile_only = false;
};

constexpr IntervalDef kIntervals[] = {
    {Interval::kTtft, kTimeToFirstToken, kArrived, kFirstToken, kFirstToken,
     false, Bit(kFirstToken), false, 0},
    {Interval::kPrefill, kRequestPrefillTime, kScheduled, kFirstToken,
     kFirstToken, false, Bit(kFirstToken), false, 0},
    {Interval::kE2e, kE2eRequestLatency, kArrived, kFinished, kFinished, true,
     Bit(kFinished), false, 0},
    // A request with tokens was scheduled, even if SCHEDULED has not come.
    {Interval::kQueue, kRequestQueueTime, kQueueStart, kScheduled, kFinished,
     true, uint8_t(Bit(kScheduled) | Bit(kFirstToken)), false, 0},
    {Interval::kDecode, kRequestDecodeTime, kFirstToken, kLastToken, kFinished,
     true, Bit(kFirstToken), false, Bit(kArrived)},
    {Interval::kInference, kRequestInferenceTime, kScheduled, kLastToken,
     kFinished, true, Bit(kFirstToken), false, Bit(kArrived)},
    {Interval::kTpot, kRequestTimePerOutputToken, kFirstToken, kLastToken,
     kFinished, true, Bit(kFirstToken), true, Bit(kArrived)},
    // LMDeploy ends its decode and inference phases at the finish.
    {Interval::kDecode, kRequestDecodeToFinish, kFirstToken, kFinished,
     kFinished, true, Bit(kFirstToken), false, Bit(kArrived), true},
    {Interval::kInference, kRequestInferenceToFinish, kScheduled, kFinished,
     kFinished, true, Bit(kFirstToken), false, Bit(kArrived), true},
};
constexpr size_t kNumIntervalDefs = std::size(kIntervals);
// The `closed` bit after the intervals': the per-request histograms,
// observed at finish once ARRIVED is known (prompt tokens and params come
// with it; generation tokens of a request whose start was never seen would
// be biased low).
constexpr uint16_t kArrivalStatsBit = uint16_t(1u << kNumIntervalDefs);
static_assert(kNumIntervalDefs < 16);
// TTFT's `closed` bit: prompt tokens (and their sources) are counted when
// it closes.
constexpr uint16_t kTtftBit = 1u << 0;
static_assert(kIntervals[0].interval == Interval::kTtft);
// Request stays 128 bytes (two cache lines; the map node 168): every
// TOKENS looks one up, and a larger one measurably slows ingest.
static_assert(kNumPoints <= 6);
// request_success's children are indexed by FinishReason.
static_assert(kNumFinishReasons == std::size(kFinishedReasonValues) &&
              size_t(FinishReason::kError) == 3);

}  // namespace

struct Tracker::Request {
  // The key (KeyView), compared first: on one cache line.
  uint64_t space = 0;
  uint64_t num = 0;
  uint8_t len = 0;      // of str; 0: an integer id
  uint32_t handle = 0;  // in the slab and the index
  Request* prev = nullptr;
  Request* next = nullptr;
  EngineSeries* first_token_series = nullptr;  // sent the first TOKENS
  EngineSeries* gauge_series = nullptr;        // holds the derived gauge
  uint64_t t_ns[kNumPoints] = {};              // valid where `known` says
  uint64_t activity_ns = 0;  // daemon clock: last event, or finish
  // With a sink that wants TOKENS ticks: the request's handle in ticks_
  // (TickLog); 0: none. Beside the fields every TOKENS writes.
  uint64_t ticks = 0;
  uint32_t prompt_tokens = 0;
  uint32_t generation_tokens = 0;
  uint32_t max_tokens = 0;
  uint32_t n = 0;
  // Per-request label values and LoRA adapter (ARRIVED), interned:
  // RequestLabels::InternSet(); 0: none.
  uint32_t label_set = 0;
  uint16_t closed = 0;  // kIntervals rows observed, and kArrivalStatsBit
  uint8_t known : kNumPoints = 0;  // Bit(Point) of the points set
  bool has_max_tokens : 1 = false;
  bool has_n : 1 = false;
  Gauge gauge : 2 = Gauge::kNone;
  bool has_extra : 1 = false;  // Tracker::extras_ holds its Extra
  FinishReason finish_reason : 2 = FinishReason::kStop;  // with kFinished
  EngineSeries* finish_series = nullptr;  // sent FINISHED (cold: last)
  std::unique_ptr<char[]> str;            // a string id's bytes

  bool has(Point p) const {
    if (p == kQueueStart) return (known & (Bit(kQueued) | Bit(kArrived))) != 0;
    return (known & Bit(p)) != 0;
  }
  uint64_t at(Point p) const {
    if (p == kQueueStart) {
      return has(kQueued) ? t_ns[kQueued] : t_ns[kArrived];
    }
    return t_ns[p];
  }
  void set(Point p, uint64_t t) {
    t_ns[p] = t;
    known |= Bit(p);
  }
  bool finished() const { return has(kFinished); }
};
// 144 bytes of hot state (the key first, then what a TOKENS reads and
// writes, the tick handle among it), then the FINISHED series and a
// string id's bytes.
static_assert(sizeof(Tracker::Request) == 160);

namespace {

// vLLM's priority label: the priority bucketed to five values.
std::string_view PriorityBucket(int32_t p) {
  if (p < -1) return "<-1";
  if (p == -1) return "-1";
  if (p == 0) return "0";
  if (p == 1) return "1";
  return ">1";
}

// An interval's existence, per kIntervals (at_finish rows: as of the
// FINISHED; OnFinished closes the rows that do not exist then).
bool ShouldExist(const IntervalDef& d, const Tracker::Request& r) {
  if ((r.known & d.exists_if) == 0) return false;
  if (!d.at_finish) return true;
  return r.finished() && (!d.per_token || r.generation_tokens > 1);
}

}  // namespace

namespace {
constexpr DaemonMetric kOwned[] = {kTrackedRequests, kEvictedRequests,
                                   kIncompleteIntervals, kNegativeIntervals};
}  // namespace

Tracker::Tracker(Registry& registry, IngestStats& ingest, const Clock& clock,
                 TrackerOptions options)
    : registry_(registry),
      request_labels_(registry.request_labels()),
      labels_on_(registry.request_labels().enabled()),
      priority_label_(registry.options().priority_label
                          ? int(registry.request_labels().names().size()) - 1
                          : -1),
      ingest_(ingest),
      clock_(clock),
      options_(options),
      registration_(registry, this, kOwned) {}

Tracker::~Tracker() = default;

void Tracker::Collect(DaemonMetric id, MetricWriter& w) const {
  const SampleLabels none;
  switch (id) {
    case kTrackedRequests:
      w.Sample(none, double(index_.size()));
      break;
    case kEvictedRequests:
      w.Sample(none, evicted_);
      break;
    case kIncompleteIntervals:
    case kNegativeIntervals:
      for (size_t i = 0; i < size_t(Interval::kCount); ++i) {
        w.Sample(none.WithOwn("interval", IntervalName(Interval(i))),
                 id == kIncompleteIntervals ? incomplete_[i] : negative_[i]);
      }
      break;
    default:
      break;
  }
}

// ---- bookkeeping
// -------------------------------------------------------------

namespace {

template <typename R>
void Unlink(R& r, R*& head, R*& tail) {
  (r.prev ? r.prev->next : head) = r.next;
  (r.next ? r.next->prev : tail) = r.prev;
  r.prev = r.next = nullptr;
}

template <typename R>
void Append(R& r, R*& head, R*& tail) {
  r.prev = tail;
  r.next = nullptr;
  (tail ? tail->next : head) = &r;
  tail = &r;
}

void SetGauge(Tracker::Request& r, Gauge g, EngineSeries* s, uint16_t lora,
              const Clock& clock);

}  // namespace

inline Tracker::Request& Tracker::At(uint32_t handle) const {
  return slab_[handle / kSlabChunk][handle % kSlabChunk];
}

Tracker::Request* Tracker::Lookup(const KeyView& k, uint64_t hash) const {
  Request* found = nullptr;
  index_.Find(hash, [this, &k, &found](uint32_t h) {
    Request& q = At(h);
    if (q.num != k.num || q.space != k.space || q.len != k.str.size() ||
        (q.len != 0 && std::memcmp(q.str.get(), k.str.data(), q.len) != 0)) {
      return false;
    }
    found = &q;
    return true;
  });
  return found;
}

Tracker::Request& Tracker::NewRequest(const KeyView& k, uint64_t hash) {
  const bool reuse = !free_.empty();
  const uint32_t handle = reuse ? free_.back() : slab_used_;
  if (!reuse && handle / kSlabChunk == slab_.size()) {
    slab_.push_back(std::make_unique<Request[]>(kSlabChunk));
  }
  index_.Insert(hash, handle);  // may throw: nothing taken yet
  if (reuse) {
    free_.pop_back();
  } else {
    ++slab_used_;
  }
  Request& r = At(handle);
  r.space = k.space;
  r.num = k.num;
  r.handle = handle;
  r.len = uint8_t(k.str.size());
  if (!k.str.empty()) {
    r.str.reset(new char[k.str.size()]);
    std::memcpy(r.str.get(), k.str.data(), k.str.size());
  }
  return r;
}

inline Tracker::KeyView Tracker::ViewOf(uint64_t space,
                                        const RequestId& rid) const {
  KeyView view{space, rid.number, {}};
  if (rid.is_string) {
    view.num = hash_.Bytes(rid.text);
    view.str = rid.text;
  }
  return view;
}

inline Tracker::Request& Tracker::Touch(Request& r, uint64_t now_ns) {
  if (!r.finished()) {
    Unlink(r, active_head_, active_tail_);
    Append(r, active_head_, active_tail_);
    r.activity_ns = now_ns;
  }
  return r;
}

Tracker::Request& Tracker::Find(const Source& src, const RequestId& rid,
                                uint64_t now_ns) {
  const KeyView view = ViewOf(src.space, rid);
  const uint64_t hash = HashOf(view);
  if (Request* found = Lookup(view, hash)) return Touch(*found, now_ns);
  if (index_.size() >= options_.max_requests) {
    // Make room: a finished request past its use first, else the least
    // recently active one.
    if (finished_head_ != nullptr) {
      Remove(*finished_head_, /*evicted=*/false);
    } else if (active_head_ != nullptr) {
      Remove(*active_head_, /*evicted=*/true);
    }
  }
  Request& r = NewRequest(view, hash);
  r.activity_ns = now_ns;

  Append(r, active_head_, active_tail_);
  return r;
}

namespace {

// Moves a request between the derived waiting / running gauges (and, with
// an adapter, the LoRA sets of lora_requests_info).
// `lora`: the request's adapter (0: none).
void SetGauge(Tracker::Request& r, Gauge g, EngineSeries* s, uint16_t lora,
              const Clock& clock) {
  if (r.gauge == g && r.gauge_series == s) return;
  const double unix_s = lora != 0 ? clock.UnixNowS() : 0;
  if (r.gauge != Gauge::kNone) {
    const bool running = r.gauge == Gauge::kRunning;
    r.gauge_series->AddDerived(
        running ? kNumRequestsRunning : kNumRequestsWaiting, -1);
    if (lora != 0)
      r.gauge_series->part<LoraPart>().Add(lora, running, -1, unix_s);
  }
  r.gauge = g;
  r.gauge_series = s;
  if (g != Gauge::kNone) {
    const bool running = g == Gauge::kRunning;
    s->AddDerived(running ? kNumRequestsRunning : kNumRequestsWaiting, 1);
    if (lora != 0) s->part<LoraPart>().Add(lora, running, 1, unix_s);
  }
}

}  // namespace

void Tracker::Remove(Request& r, bool evicted) {
  // Intervals that should exist but whose other end never came.
  for (size_t i = 0; i < kNumIntervalDefs; ++i) {
    if ((r.closed & (1u << i)) == 0 && !kIntervals[i].profile_only &&
        ShouldExist(kIntervals[i], r)) {
      ++incomplete_[size_t(kIntervals[i].interval)];
    }
  }
  if (r.has_extra && FindExtra(r)->kv_wait_open) {
    ++incomplete_[size_t(Interval::kKvWait)];
  }
  if (evicted) ++evicted_;
  ++removed_;
  SetGauge(r, Gauge::kNone, nullptr, LoraOf(r), clock_);
  if (r.finished()) {
    Unlink(r, finished_head_, finished_tail_);
  } else {
    Unlink(r, active_head_, active_tail_);
  }
  if (has_sinks_) [[unlikely]] {
    HandOver(r, evicted);
  }
  if (r.has_extra) extras_.erase(&r);
  const uint32_t handle = r.handle;
  index_.Erase(hash_.Int(r.space, r.num), handle);
  r = Request{};
  free_.push_back(handle);
}

SeriesValues& Tracker::CellOf(EngineSeries& s, const Request& r) {
  if (!labels_on_) return s;  // every request in the series' own values
  return s.CellForSet(r.label_set);
}

uint16_t Tracker::LoraOf(const Request& r) const {
  return r.label_set == 0 ? 0 : request_labels_.SetLora(r.label_set);
}

void Tracker::Sweep() {
  const uint64_t now = clock_.NowNs();
  ticks_.Refill();
  while (finished_head_ != nullptr &&
         now - finished_head_->activity_ns >= options_.grace_ns) {
    Remove(*finished_head_, /*evicted=*/false);
  }
  while (active_head_ != nullptr &&
         now - active_head_->activity_ns >= options_.idle_timeout_ns) {
    Remove(*active_head_, /*evicted=*/true);
  }
}

void Tracker::RetireFinished() {
  ticks_.Refill();
  while (finished_head_ != nullptr) Remove(*finished_head_, /*evicted=*/false);
}

// A request's prompt tokens by source (protocol 1.2 SCHEDULED info;
// without it all computed) and the cached ones.
void Tracker::AddPromptSources(SeriesValues& s, const Request& r) const {
  const Extra* x = FindExtra(r);
  const uint32_t cached = x != nullptr && x->has_info ? x->cached_tokens : 0;
  const uint32_t external =
      x != nullptr && x->has_info ? x->external_tokens : 0;
  s.AddChild(kPromptTokensBySource, kLocalCompute,
             r.prompt_tokens - cached - external);
  s.AddChild(kPromptTokensBySource, kLocalCacheHit, cached);
  s.AddChild(kPromptTokensBySource, kExternalKv, external);
  s.Add(kPromptTokensCached, uint64_t(cached) + external);
}

void Tracker::CloseReady(Request& r) {
  for (size_t i = 0; i < kNumIntervalDefs; ++i) {
    const IntervalDef& d = kIntervals[i];
    if ((r.closed & (1u << i)) != 0 || !ShouldExist(d, r) || !r.has(d.start) ||
        !r.has(d.end) || (r.known & d.needs) != d.needs) {
      continue;
    }
    r.closed |= uint16_t(1u << i);
    EngineSeries& series =
        *(d.labels == kFirstToken ? r.first_token_series : r.finish_series);
    if (d.profile_only && !series.uses(d.metric)) continue;
    SeriesValues& s = CellOf(series, r);
    // Prompt tokens are counted when TTFT closes (the first token and the
    // ARRIVED that carries the count are both in), whatever its sign; so
    // are their sources, unless the request's FINISHED counted them
    // already (SGLang's profile, below: a first token after FINISHED).
    if (d.interval == Interval::kTtft) {
      s.Add(kPromptTokens, r.prompt_tokens);
      if (!series.uses(kPromptTokensAtFinish) ||
          (r.closed & kArrivalStatsBit) == 0) {
        AddPromptSources(s, r);
      }
    }
    const int64_t delta = int64_t(r.at(d.end) - r.at(d.start));
    if (delta < 0) {
      if (!d.profile_only) ++negative_[size_t(d.interval)];
    } else if (d.per_token) {
      s.hist(d.metric).Observe(double(delta) / double(r.generation_tokens - 1));
    } else {
      s.hist(d.metric).Observe(double(delta));
    }
  }
  if ((r.closed & kArrivalStatsBit) == 0 && r.finished() && r.has(kArrived)) {
    r.closed |= kArrivalStatsBit;
    SeriesValues& f = CellOf(*r.finish_series, r);
    f.hist(kRequestPromptTokens).Observe(r.prompt_tokens);
    if (r.has_max_tokens) f.hist(kRequestParamsMaxTokens).Observe(r.max_tokens);
    if (r.has_n) f.hist(kRequestParamsN).Observe(r.n);
    f.hist(kRequestGenerationTokens).Observe(r.generation_tokens);
    f.hist(kRequestMaxNumGenerationTokens).Observe(r.generation_tokens);
    // Protocol 1.2: computed prompt tokens, preemptions (the KV wait is
    // an interval of its own: CloseKvWait()).
    const Extra* x = FindExtra(r);
    uint32_t computed = r.prompt_tokens;
    if (x != nullptr && x->has_info) {
      computed -= x->cached_tokens + x->external_tokens;
    }
    f.hist(kRequestPrefillKvComputedTokens).Observe(computed);
    f.hist(kRequestNumPreemptions).Observe(x != nullptr ? x->preemptions : 0);
    if (r.finish_series->uses(kRequestCachedTokens)) {  // LMDeploy's
      const uint32_t cached = r.prompt_tokens - computed;
      f.hist(kRequestCachedTokens).Observe(cached);
      if (r.prompt_tokens > 0) {
        f.hist(kRequestCacheHitRatio)
            .Observe(double(cached) / double(r.prompt_tokens));
      }
    }
    // SGLang counts a request's tokens when it finishes, also those of a
    // request that ended before its first token; the sources of those
    // tokens are counted here for such a request, so that the three sum
    // to its prompt_tokens (a first token that comes later adds none).
    if (r.finish_series->uses(kPromptTokensAtFinish)) {
      f.Add(kPromptTokensAtFinish, r.prompt_tokens);
      f.Add(kGenerationTokensAtFinish, r.generation_tokens);
      if ((r.closed & kTtftBit) == 0) AddPromptSources(f, r);
    }
  }
}

void Tracker::CloseKvWait(Request& r) {
  Extra& x = *FindExtra(r);
  if (!x.kv_wait_open || !r.has(kScheduled)) return;
  x.kv_wait_open = false;
  const uint64_t scheduled = r.t_ns[kScheduled];
  if (x.kv_ready_ns < scheduled) {
    ++negative_[size_t(Interval::kKvWait)];
  } else {
    CellOf(*r.finish_series, r)
        .hist(kRequestKvWaitTime)
        .Observe(double(x.kv_ready_ns - scheduled));
  }
}

// ---- events
// ------------------------------------------------------------------

Tracker::Request* Tracker::Peek(const KeyView& k, uint64_t hash) const {
  Request* r = Lookup(k, hash);
  if (r == nullptr) return nullptr;
  // The lines of its hot state, and the neighbours Touch() relinks.
  const char* p = reinterpret_cast<const char*>(r);
  __builtin_prefetch(p, 1);
  __builtin_prefetch(p + 64, 1);
  __builtin_prefetch(p + 128, 1);
  if (!r->finished()) {
    if (r->prev != nullptr) __builtin_prefetch(r->prev, 1);
    if (r->next != nullptr) __builtin_prefetch(r->next, 1);
  }
  return r;
}

namespace {

// The kinds whose events look their request up (Tracker::Apply()).
bool LooksUpRequest(EventKind kind) {
  switch (kind) {
    case EventKind::kArrived:
    case EventKind::kQueued:
    case EventKind::kScheduled:
    case EventKind::kTokens:
    case EventKind::kFinished:
    case EventKind::kPreempted:
      return true;
    default:
      return false;
  }
}

}  // namespace

void Tracker::ApplyBatch(const Source& src, const Batch& batch) {
  const uint64_t now = clock_.NowNs();
  const uint64_t* positions = batch.positions.data();
  const Event* events = batch.events.data();
  const size_t count = batch.events.size();
  // The fields dropped from events that are applied: one skipped for its
  // timestamp below drops none (as one the decoder skipped).
  for (const Batch::FieldDrops& d : batch.field_drops) {
    if (d.event < count && InTime(events[d.event].t_ns, now)) {
      ingest_.CountErrors(IngestError::kBadField, d.fields);
    }
  }
  KeyView keys[kLookAhead];
  uint64_t hashes[kLookAhead];
  Request* found[kLookAhead];
  for (size_t base = 0; base < count; base += kLookAhead) {
    const size_t n = std::min(kLookAhead, count - base);
    // Three passes: the keys hashed and their index slots prefetched, the
    // look-ups (their requests' lines prefetched), the events applied.
    for (size_t i = 0; i < n; ++i) {
      const Event& ev = events[base + i];
      if (!LooksUpRequest(ev.kind)) continue;
      keys[i] = ViewOf(src.space, ev.rid);
      hashes[i] = HashOf(keys[i]);
      index_.Prefetch(hashes[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      found[i] = LooksUpRequest(events[base + i].kind)
                     ? Peek(keys[i], hashes[i])
                     : nullptr;
    }
    // What was found stays valid while no request is removed (requests
    // stay where they are in the slab until then).
    const uint64_t removed = removed_;
    for (size_t i = 0; i < n; ++i) {
      ApplyFound(src, events[base + i], positions, now, batch.arrivals,
                 removed_ == removed ? found[i] : nullptr);
    }
  }
}

void Tracker::ApplyFound(const Source& src, const Event& ev,
                         const uint64_t* positions, uint64_t now_ns,
                         std::span<const ArrivedExtras> arrivals,
                         Request* found) {
  if (!InTime(ev.t_ns, now_ns)) {
    ingest_.CountError(IngestError::kBadTimestamp);
    return;
  }
  if (ev.kind == EventKind::kExpertLoad) {
    OnExpertLoad(src, ev.expert_load(positions));
    return;
  }
  ingest_.CountEvent(ev.kind);
  switch (ev.kind) {
    case EventKind::kStep:
      OnStep(src, ev, positions);
      return;
    case EventKind::kAdmissionRejected:
      src.series->part<AdmissionPart>().Reject(ev.admission.reason.view());
      return;
    case EventKind::kKvTransfer:
      OnKvTransfer(src, ev, now_ns);
      return;
    case EventKind::kSleep:
      src.series->part<SleepPart>().Apply(int(ev.sleep.scheduler),
                                          int(ev.sleep.weights),
                                          int(ev.sleep.kv_cache));
      return;
    case EventKind::kRequestSummary:
      OnRequestSummary(src, ev);
      return;
    case EventKind::kLatencies:
      OnLatencies(src, ev, positions);
      return;
    default:
      break;
  }
  Request& r =
      found != nullptr ? Touch(*found, now_ns) : Find(src, ev.rid, now_ns);
  const uint8_t known_before = r.known;
  switch (ev.kind) {
    case EventKind::kArrived:
      OnArrived(src, ev, r, arrivals);
      break;
    case EventKind::kQueued:
      if (!r.has(kQueued)) r.set(kQueued, ev.t_ns);
      break;
    case EventKind::kScheduled:
      if (r.has_extra && has_sinks_) [[unlikely]] {
        trace::RequestTimeline* tl = FindExtra(r)->timeline.get();
        if (tl != nullptr && !tl->preemptions.empty() &&
            tl->preemptions.back().resumed_ns == 0) {
          tl->preemptions.back().resumed_ns = ev.t_ns;
        }
      }
      OnScheduled(src, r);
      if (!r.has(kScheduled)) {  // later ones: no
        r.set(kScheduled, ev.t_ns);
        if (ev.scheduled.present) OnScheduledInfo(ev.scheduled, r);
        // A KV wait left open at FINISHED closes now.
        if (r.has_extra && r.finished()) [[unlikely]]
          CloseKvWait(r);
      }
      break;
    case EventKind::kTokens:
      OnTokens(src, ev, r);
      break;
    case EventKind::kFinished:
      OnFinished(src, ev, r, now_ns);
      break;
    case EventKind::kPreempted:
      OnPreempted(src, r);
      if (has_sinks_ && !r.finished()) [[unlikely]] {
        TimelineOf(r).preemptions.push_back({ev.t_ns, 0});
      }
      break;
    case EventKind::kStep:
    case EventKind::kExpertLoad:
    case EventKind::kAdmissionRejected:
    case EventKind::kKvTransfer:
    case EventKind::kSleep:
    case EventKind::kRequestSummary:
    case EventKind::kLatencies:
      break;
  }
  // Only a new point can make an interval ready.
  if (r.known != known_before) CloseReady(r);
}

void Tracker::OnArrived(const Source& src, const Event& ev, Request& r,
                        std::span<const ArrivedExtras> arrivals) {
  if (r.has(kArrived)) return;  // a repeated ARRIVED changes nothing
  r.set(kArrived, ev.t_ns);
  const bool has_extras =
      ev.extras != Event::kNoExtras && ev.extras < arrivals.size();
  // Every request has a priority label with --priority-label ("0" when
  // the ARRIVED has none).
  if (has_extras || priority_label_ >= 0) {
    static const ArrivedExtras kNone;
    const ArrivedExtras& x = has_extras ? arrivals[ev.extras] : kNone;
    RequestLabels& labels = request_labels_;
    const uint16_t lora = labels.InternLora(x.lora);
    LabelKey key = 0;
    for (size_t i = 0; i < labels.names().size(); ++i) {
      std::string_view value;
      if (int(i) == priority_label_) {
        value = PriorityBucket(x.has_priority ? x.priority : 0);
      } else {
        for (uint8_t j = 0; j < x.num_labels; ++j) {
          if (x.labels[j].first == labels.names()[i]) {
            value = x.labels[j].second;
          }
        }
      }
      if (value.empty()) continue;
      // A value is interned only when a series takes it: values past every
      // series' cap are never kept (a flood of distinct values would
      // otherwise fill the table and leave no id for other series).
      uint16_t id = RequestLabels::kOther;
      if (const std::optional<uint16_t> known = labels.Find(i, value)) {
        if (src.series->Admit(i, *known)) id = *known;
      } else if (src.series->HasRoom(i)) {
        id = labels.Intern(i, value);
        if (!src.series->Admit(i, id)) id = RequestLabels::kOther;
      }
      // An engine's own "__other__" is that value, not an overflow.
      if (id == RequestLabels::kOther && value != RequestLabels::kOtherValue)
        labels.CountOverflow(i);
      key = RequestLabels::Pack(key, i, id);
    }
    r.label_set = labels.InternSet(key, lora);
    // A request already waiting or running (its ARRIVED came late) joins
    // its adapter's set now; with the set table full it has no adapter (and
    // must not be left in a set it would never leave).
    if (LoraOf(r) != 0 && r.gauge != Gauge::kNone) {
      r.gauge_series->part<LoraPart>().Add(
          LoraOf(r), r.gauge == Gauge::kRunning, 1, clock_.UnixNowS());
    }
  }
  if (has_extras && has_sinks_) [[unlikely]] {
    // The trace context is the Extra's (below); labels and adapter only
    // here.
    const ArrivedExtras& x = arrivals[ev.extras];
    if (!x.lora.empty() || x.num_labels != 0) {
      trace::RequestTimeline& tl = TimelineOf(r);
      tl.lora.assign(x.lora);
      for (uint8_t j = 0; j < x.num_labels; ++j) {
        tl.request_labels.emplace_back(x.labels[j].first, x.labels[j].second);
      }
    }
  }
  if (has_extras) {
    const ArrivedExtras& x = arrivals[ev.extras];
    if (x.has_priority || !x.traceparent.empty() || !x.tracestate.empty()) {
      Extra& e = ExtraOf(r);
      e.has_priority = x.has_priority;
      e.priority = x.priority;
      e.traceparent.assign(x.traceparent);
      e.tracestate.assign(x.tracestate);
    }
  }
  r.prompt_tokens = uint32_t(std::min<uint64_t>(ev.count, UINT32_MAX));
  // A SCHEDULED info that came first is checked against the prompt now.
  if (r.has_extra) {
    Extra& e = ExtraOf(r);
    if (e.has_info &&
        uint64_t(e.cached_tokens) + e.external_tokens > r.prompt_tokens) {
      e.has_info = false;
      e.cached_tokens = e.external_tokens = 0;
      ingest_.CountError(IngestError::kBadField);
    }
  }
  r.has_max_tokens = ev.has_max_tokens;
  r.max_tokens = uint32_t(std::min<uint64_t>(ev.max_tokens, UINT32_MAX));
  r.has_n = ev.has_n;
  r.n = uint32_t(std::min<uint64_t>(ev.n, UINT32_MAX));
  if (!r.finished() && !r.has(kScheduled) && !r.has(kFirstToken) &&
      r.gauge == Gauge::kNone) {
    SetGauge(r, Gauge::kWaiting, src.series, LoraOf(r), clock_);
  }
}

void Tracker::OnScheduled(const Source& src, Request& r) {
  if (!r.finished() && r.gauge != Gauge::kRunning) {
    SetGauge(r, Gauge::kRunning, src.series, LoraOf(r), clock_);
  }
}

void Tracker::OnTokens(const Source& src, const Event& ev, Request& r) {
  if (ticks_.writing()) [[unlikely]] {
    ticks_.Append(r.ticks, ev.t_ns, ev.count);
  }
  EngineSeries& s = *src.series;
  SeriesValues& cell = CellOf(s, r);
  cell.Add(kGenerationTokens, ev.count);
  r.generation_tokens = uint32_t(
      std::min<uint64_t>(uint64_t(r.generation_tokens) + ev.count, UINT32_MAX));
  if (r.has(kFirstToken)) {
    // Inter-token latency: one observation per TOKENS after the first.
    const int64_t itl = int64_t(ev.t_ns - r.t_ns[kLastToken]);
    if (itl < 0) {
      ++negative_[size_t(Interval::kItl)];
    } else {
      // vLLM's (and LMDeploy's iter_token_latency); SGLang shows only its
      // token-weighted one.
      size_t bucket = 0;
      if (s.uses(kInterTokenLatency)) {
        Histogram& h = cell.hist(kInterTokenLatency);
        bucket = h.layout().BucketFor(double(itl));
        h.ObserveIn(bucket, double(itl));
      }
      // LMDeploy's per-chunk time per output token: for a chunk of one token
      // the ITL's value, in the ITL's bucket when the layouts agree.
      if (s.uses(kTimePerOutputTokenChunk)) {
        Histogram& h = cell.hist(kTimePerOutputTokenChunk);
        if (ev.count == 1 && s.uses(kInterTokenLatency) &&
            s.part<ChunkTokensPart>().tpot_shares_itl_buckets()) {
          h.ObserveIn(bucket, double(itl));
        } else {
          h.Observe(double(itl) / double(ev.count));
        }
      }
      if (s.uses(kInterTokenLatencyPerToken)) {
        cell.hist(kInterTokenLatencyPerToken)
            .ObserveWeighted(double(itl) / double(ev.count), ev.count,
                             double(itl));
      }
    }
    if (s.uses(kIterationTokensChunk)) {
      s.part<ChunkTokensPart>().ObserveChunk(ev.count);
    }
    if (ev.t_ns > r.t_ns[kLastToken]) r.t_ns[kLastToken] = ev.t_ns;
    return;
  }
  r.set(kFirstToken, ev.t_ns);
  r.set(kLastToken, ev.t_ns);
  r.first_token_series = &s;
  if (s.uses(kIterationTokensChunk)) {
    s.hist(kIterationTokensChunk)
        .Observe(double(uint64_t(r.prompt_tokens) + ev.count));
  }
  if (!r.finished() && r.gauge != Gauge::kRunning) {
    SetGauge(r, Gauge::kRunning, &s, LoraOf(r), clock_);
  }
}

void Tracker::OnFinished(const Source& src, const Event& ev, Request& r,
                         uint64_t now_ns) {
  if (r.finished()) return;  // a repeated FINISHED changes nothing
  EngineSeries& s = *src.series;
  r.set(kFinished, ev.t_ns);
  r.finish_series = &s;
  r.finish_reason = ev.reason;
  // Which finish-time intervals exist is decided now, once.
  for (size_t i = 0; i < kNumIntervalDefs; ++i) {
    if (kIntervals[i].at_finish && !ShouldExist(kIntervals[i], r)) {
      r.closed |= uint16_t(1u << i);
    }
  }
  // So is whether the KV wait exists (protocol 1.2: a decode request
  // whose KV arrived); it closes now or with a later SCHEDULED.
  if (r.has_extra) {
    Extra& x = *FindExtra(r);
    x.kv_wait_open = x.kv_ready;
    CloseKvWait(r);
  }
  SeriesValues& cell = CellOf(s, r);
  cell.AddChild(kRequestSuccess, size_t(ev.reason), 1);
  if (s.uses(kNumFinishedRequests)) {
    cell.Add(kNumFinishedRequests, 1);
    if (ev.reason == FinishReason::kAbort) cell.Add(kNumAbortedRequests, 1);
  }
  SetGauge(r, Gauge::kNone, nullptr, LoraOf(r), clock_);
  Unlink(r, active_head_, active_tail_);
  r.activity_ns = now_ns;
  Append(r, finished_head_, finished_tail_);
}

void Tracker::OnPreempted(const Source& src, Request& r) {
  src.series->Add(kNumPreemptions, 1);
  if (!r.finished()) {
    uint32_t& n = ExtraOf(r).preemptions;
    if (n != UINT32_MAX) ++n;
  }
  if (!r.finished())
    SetGauge(r, Gauge::kWaiting, src.series, LoraOf(r), clock_);
}

trace::RequestTimeline& Tracker::TimelineOf(Request& r) {
  Extra& e = ExtraOf(r);
  if (!e.timeline) e.timeline = std::make_unique<trace::RequestTimeline>();
  return *e.timeline;
}

void Tracker::HandOver(Request& r, bool evicted) {
  // One lookup: the Extra gives the timeline made so far and its fields.
  Extra* e = FindExtra(r);
  std::unique_ptr<trace::RequestTimeline> tl =
      e != nullptr && e->timeline ? std::move(e->timeline)
                                  : std::make_unique<trace::RequestTimeline>();
  if (token_ticks_) {
    const uint64_t shown = ticks_.Collect(
        r.ticks, trace::RequestTimeline::kMaxTokenTicks, &tl->tokens);
    tl->tokens_not_shown =
        uint32_t(r.generation_tokens > shown ? r.generation_tokens - shown : 0);
  }
  if (r.len != 0) {
    tl->request_id.assign(r.str.get(), r.len);
    tl->string_id = true;
  } else {
    tl->request_id = std::to_string(r.num);
  }
  const auto point = [&r](Point p) { return r.has(p) ? r.t_ns[p] : 0; };
  tl->arrived_ns = point(kArrived);
  tl->queued_ns = point(kQueued);
  tl->scheduled_ns = point(kScheduled);
  tl->first_token_ns = point(kFirstToken);
  tl->last_token_ns = point(kLastToken);
  tl->finished_ns = point(kFinished);
  if (r.finished()) tl->finish_reason = FinishReasonName(r.finish_reason);
  tl->prompt_tokens = r.prompt_tokens;
  tl->generation_tokens = r.generation_tokens;
  tl->max_tokens = r.has_max_tokens ? r.max_tokens : 0;
  tl->n = r.has_n ? r.n : 0;
  if (e != nullptr) {
    tl->has_info = e->has_info;
    tl->cached_tokens = e->cached_tokens;
    tl->external_tokens = e->external_tokens;
    tl->has_priority = e->has_priority;
    tl->priority = e->priority;
    tl->traceparent = e->traceparent;
    tl->tracestate = e->tracestate;
    tl->preemption_count = e->preemptions;
  }
  tl->preemption_count =
      std::max(tl->preemption_count, uint32_t(tl->preemptions.size()));
  const EngineSeries* s = r.finish_series != nullptr ? r.finish_series
                          : r.first_token_series != nullptr
                              ? r.first_token_series
                              : r.gauge_series;
  if (s != nullptr) {
    tl->engine_labels = s->label_pairs();
    tl->profile = ProfileName(s->profile());
    tl->engine_family = s->identity().ns;
    // The HELLO's engine; its namespace for a series no HELLO joined since
    // the daemon started (restored from a snapshot).
    tl->engine =
        s->hello_engine().empty() ? s->identity().ns : s->hello_engine();
  }
  ++timelines_handed_;
  for (trace::TimelineSink* sink : sinks_) sink->OnRetired(*tl, evicted);
}

Tracker::Extra& Tracker::ExtraOf(Request& r) {
  r.has_extra = true;
  return extras_[&r];
}

Tracker::Extra* Tracker::FindExtra(const Request& r) {
  if (!r.has_extra) return nullptr;
  auto it = extras_.find(&r);
  return it == extras_.end() ? nullptr : &it->second;
}

const Tracker::Extra* Tracker::FindExtra(const Request& r) const {
  return const_cast<Tracker*>(this)->FindExtra(r);
}

// The first SCHEDULED's info (protocol 1.2): kept unless cached + external
// exceed the prompt (checked now if ARRIVED came, else at ARRIVED), which
// drops the map as one bad_field.
void Tracker::OnScheduledInfo(const ScheduledInfo& info, Request& r) {
  const uint32_t cached =
      (info.has & ScheduledInfo::kCached) != 0 ? info.cached_tokens : 0;
  const uint32_t external =
      (info.has & ScheduledInfo::kExternal) != 0 ? info.external_tokens : 0;
  if (r.has(kArrived) && uint64_t(cached) + external > r.prompt_tokens) {
    ingest_.CountError(IngestError::kBadField);
    return;
  }
  if (info.has == 0) return;
  Extra& e = ExtraOf(r);
  e.has_info = true;
  e.cached_tokens = cached;
  e.external_tokens = external;
}

// KV_TRANSFER (protocol 1.2): the series' KV-transfer part observes every
// transfer; a successful recv also marks, once, when the request's KV was
// ready (the request is looked up or made, as any event of it does). A
// send touches no request: on the prefill side it often ends after its
// request finished and was retired.
void Tracker::OnKvTransfer(const Source& src, const Event& ev,
                           uint64_t now_ns) {
  const KvTransferInfo& kv = ev.kv_transfer;
  src.series->part<KvTransferPart>().Add(size_t(kv.role), ev.t_ns - kv.start_ns,
                                         kv.has_bytes, kv.bytes, kv.ok,
                                         kv.reason.view());
  if (has_sinks_) [[unlikely]] {
    // The transfer joins its request's timeline: a recv finds (or makes)
    // the request below; a send only one still tracked (it often ends
    // after its request was retired, and must not make a new one).
    Request* tracked = nullptr;
    if (kv.role == KvRole::kRecv && kv.ok) {
      tracked = &Find(src, ev.rid, now_ns);
    } else {
      const KeyView view = ViewOf(src.space, ev.rid);
      tracked = Lookup(view, HashOf(view));
    }
    if (tracked != nullptr) {
      trace::KvTransfer t;
      t.start_ns = kv.start_ns;
      t.end_ns = ev.t_ns;
      t.recv = kv.role == KvRole::kRecv;
      t.ok = kv.ok;
      if (kv.has_bytes) t.bytes = kv.bytes;
      if (kv.has_blocks) t.blocks = kv.blocks;
      t.reason.assign(kv.reason.view());
      t.connector.assign(kv.connector.view());
      TimelineOf(*tracked).kv_transfers.push_back(std::move(t));
    }
  }
  if (kv.role != KvRole::kRecv || !kv.ok) return;
  Request& r = Find(src, ev.rid, now_ns);
  Extra& e = ExtraOf(r);
  if (!e.kv_ready) {
    e.kv_ready = true;
    e.kv_ready_ns = ev.t_ns;
    // The first successful recv of a request already finished (another
    // connection's, in the grace period): its wait exists from now on, as
    // if the recv had come before the FINISHED.
    if (r.finished()) {
      e.kv_wait_open = true;
      CloseKvWait(r);
    }
  }
}

// REQUEST_SUMMARY (protocol 1.3): what a retirement observes at finish,
// from the engine's own figures: the finish reason, the per-request token
// and parameter histograms, and each duration given (one not given is not
// observed, nor counted as incomplete: no request is tracked). Into the
// series' own values (no ARRIVED: with request labels on, the cell whose
// labels are all absent, shown from now on).
void Tracker::OnRequestSummary(const Source& src, const Event& ev) {
  EngineSeries& s = *src.series;
  s.UseOwnCell();
  const RequestSummaryInfo& q = ev.summary;
  const uint32_t prompt = uint32_t(ev.count);
  s.AddChild(kRequestSuccess, size_t(ev.reason), 1);
  if (s.uses(kNumFinishedRequests)) {
    s.Add(kNumFinishedRequests, 1);
    if (ev.reason == FinishReason::kAbort) s.Add(kNumAbortedRequests, 1);
  }
  s.hist(kRequestPromptTokens).Observe(prompt);
  s.hist(kRequestGenerationTokens).Observe(q.generation_tokens);
  if (ev.has_max_tokens) s.hist(kRequestParamsMaxTokens).Observe(ev.max_tokens);
  if (ev.has_n) s.hist(kRequestParamsN).Observe(ev.n);
  if ((q.has & RequestSummaryInfo::kMaxGenerationTokens) != 0) {
    s.hist(kRequestMaxNumGenerationTokens).Observe(q.max_generation_tokens);
  }
  if ((q.has & RequestSummaryInfo::kCachedTokens) != 0) {
    s.hist(kRequestPrefillKvComputedTokens).Observe(prompt - q.cached_tokens);
    if (s.uses(kRequestCachedTokens)) {  // LMDeploy's, counted at finish
      s.Add(kPromptTokensCached, q.cached_tokens);
      s.hist(kRequestCachedTokens).Observe(q.cached_tokens);
      if (prompt > 0) {
        s.hist(kRequestCacheHitRatio)
            .Observe(double(q.cached_tokens) / double(prompt));
      }
    }
  }
  // SGLang counts a request's tokens when it finishes, and their sources
  // with them (the cached ones a local cache hit, the rest computed: the
  // summary has no external figure), so that they sum to prompt_tokens.
  if (s.uses(kPromptTokensAtFinish)) {
    s.Add(kPromptTokensAtFinish, prompt);
    s.Add(kGenerationTokensAtFinish, q.generation_tokens);
    const uint32_t cached =
        (q.has & RequestSummaryInfo::kCachedTokens) != 0 ? q.cached_tokens : 0;
    s.AddChild(kPromptTokensBySource, kLocalCompute, prompt - cached);
    s.AddChild(kPromptTokensBySource, kLocalCacheHit, cached);
    if (!s.uses(kRequestCachedTokens)) s.Add(kPromptTokensCached, cached);
  }
  // Each duration into the histogram of that phase the series' profile
  // shows (LMDeploy's decode and inference end at the finish: the engine's
  // own figure is that one).
  const EngineMetric metrics[kNumSummaryDurations] = {
      kTimeToFirstToken,
      kRequestQueueTime,
      kRequestPrefillTime,
      s.uses(kRequestDecodeToFinish) ? kRequestDecodeToFinish
                                     : kRequestDecodeTime,
      s.uses(kRequestInferenceToFinish) ? kRequestInferenceToFinish
                                        : kRequestInferenceTime,
      kE2eRequestLatency,
      kRequestTimePerOutputToken,
  };
  for (size_t d = 0; d < kNumSummaryDurations; ++d) {
    if ((q.has & (1u << d)) != 0) {
      s.hist(metrics[d]).Observe(double(q.duration_ns[d]));
    }
  }
}

// LATENCIES (protocol 1.3): each time to first token and inter-token
// latency the engine computed, one observation each (the ITL into the
// histogram the series' profile shows: vLLM's and LMDeploy's per chunk,
// SGLang's per token, each value one token); the counts into the token
// and preemption counters; in the lmdeploy profile also LMDeploy's
// per-output iteration tokens and time per output token (below).
void Tracker::OnLatencies(const Source& src, const Event& ev,
                          const uint64_t* positions) {
  EngineSeries& s = *src.series;
  s.UseOwnCell();  // as OnRequestSummary()'s
  const LatenciesRef& l = ev.latencies;
  const uint64_t* v = positions + l.begin;
  if (l.ttft_count != 0) {
    Histogram& ttft = s.hist(kTimeToFirstToken);
    for (uint32_t i = 0; i < l.ttft_count; ++i) ttft.Observe(double(v[i]));
  }
  v += l.ttft_count;
  if (l.itl_count != 0 && s.uses(kInterTokenLatency)) {
    Histogram& itl = s.hist(kInterTokenLatency);
    for (uint32_t i = 0; i < l.itl_count; ++i) itl.Observe(double(v[i]));
  }
  if (l.itl_count != 0 && s.uses(kInterTokenLatencyPerToken)) {
    Histogram& itl = s.hist(kInterTokenLatencyPerToken);
    for (uint32_t i = 0; i < l.itl_count; ++i) {
      itl.ObserveWeighted(double(v[i]), 1, double(v[i]));
    }
  }
  // Prompt tokens, with their source where the profile's prompt_tokens
  // counts them here (not at finish): without a SCHEDULED info, computed.
  if ((l.has & LatenciesRef::kPromptTokens) != 0) {
    s.Add(kPromptTokens, l.prompt_tokens);
    if (!s.uses(kPromptTokensAtFinish)) {
      s.AddChild(kPromptTokensBySource, kLocalCompute, l.prompt_tokens);
    }
  }
  if ((l.has & LatenciesRef::kGenerationTokens) != 0) {
    s.Add(kGenerationTokens, l.generation_tokens);
  }
  if ((l.has & LatenciesRef::kPreemptions) != 0) {
    s.Add(kNumPreemptions, l.preemptions);
  }
  // LMDeploy's per-output figures. Its adapter sends one LATENCIES with
  // counts per engine output of one request (what LMDeploy's
  // record_iteration() gets), so, as for a TOKENS chunk: iteration tokens
  // = the output's prompt + generation tokens, and time per output token
  // = its one ITL / its generation tokens (LMDeploy's tpot).
  constexpr uint8_t kCounts =
      LatenciesRef::kPromptTokens | LatenciesRef::kGenerationTokens;
  if ((l.has & kCounts) != 0 && s.uses(kIterationTokensChunk)) {
    const uint64_t prompt =
        (l.has & LatenciesRef::kPromptTokens) != 0 ? l.prompt_tokens : 0;
    const uint64_t generated = (l.has & LatenciesRef::kGenerationTokens) != 0
                                   ? l.generation_tokens
                                   : 0;
    s.part<ChunkTokensPart>().ObserveChunk(prompt + generated);
    if (l.itl_count == 1 && generated != 0 &&
        s.uses(kTimePerOutputTokenChunk)) {
      s.hist(kTimePerOutputTokenChunk)
          .Observe(double(v[0]) / double(generated));
    }
  }
}

void Tracker::OnExpertLoad(const Source& src, const ExpertLoadView& load) {
  EngineSeries& s = *src.series;
  // A new layer takes a place of --max-moe-layers and its experts places
  // of the series cap (with --moe-expert-series); a known layer's count may
  // not change.
  const MoePart* moe = s.find_part<MoePart>();
  if ((moe == nullptr || !moe->has_layer(load.layer)) &&
      !registry_.ReserveMoeLayer(load.counts.size())) {
    ingest_.CountError(IngestError::kSeriesLimit);
    return;
  }
  if (!s.part<MoePart>().Add(load.layer, load.counts,
                             registry_.options().moe_expert_series)) {
    ingest_.CountError(IngestError::kBadEvent);
    return;
  }
  ingest_.CountEvent(EventKind::kExpertLoad);
}

void Tracker::OnStep(const Source& src, const Event& ev,
                     const uint64_t* positions) {
  EngineSeries& s = *src.series;
  const StepStats& st = ev.step;
  if (st.has & StepStats::kRunning) {
    s.Set(kNumRequestsRunning, double(st.running));
  }
  if (st.has & StepStats::kWaiting) {
    s.Set(kNumRequestsWaiting, double(st.waiting));
    // Waiting by reason: from the first STEP with waiting_deferred on.
    if (st.has & StepStats::kWaitingDeferred) {
      s.part<WaitingReasonPart>().Set(st.waiting, st.waiting_deferred);
    } else if (WaitingReasonPart* w = s.find_part<WaitingReasonPart>()) {
      w->Set(st.waiting, 0);
    }
  }
  if (st.has & StepStats::kKvUsage) s.Set(kKvCacheUsagePerc, st.kv_usage);
  s.Add(kPrefixCacheQueries, st.prefix_queries);
  s.Add(kPrefixCacheHits, st.prefix_hits);
  if (st.has & (StepStats::kPromptTokens | StepStats::kGenerationTokens)) {
    s.hist(kIterationTokens)
        .Observe(double(st.prompt_tokens + st.generation_tokens));
  }
  s.Add(kSpecDecodeNumDrafts, st.spec_drafts);
  s.Add(kSpecDecodeNumDraftTokens, st.spec_draft_tokens);
  s.Add(kSpecDecodeNumAcceptedTokens, st.spec_accepted_tokens);
  for (uint32_t i = st.pos_count; i > 0; --i) {
    s.AddChild(kSpecDecodeNumAcceptedTokensPerPos, i - 1,
               positions[st.pos_begin + i - 1]);
  }
}

void Tracker::SaveState(
    StateWriter& w,
    const std::unordered_map<const EngineSeries*, uint32_t>& series) const {
  auto series_index = [&series](const EngineSeries* s) {
    return s == nullptr ? UINT32_MAX : series.at(s);
  };
  w.U64(evicted_);
  for (uint64_t n : incomplete_) w.U64(n);
  for (uint64_t n : negative_) w.U64(n);
  w.U64(index_.size());
  for (const Request* head : {active_head_, finished_head_}) {
    for (const Request* r = head; r != nullptr; r = r->next) {
      w.U64(r->space);
      // A string id's num is its keyed hash, which the next daemon (another
      // key) recomputes from the bytes: 0 here, so that a snapshot holds
      // nothing of the key and its bytes do not depend on it.
      w.U64(r->len != 0 ? 0 : r->num);
      w.Str(std::string_view(r->str.get(), r->len));
      w.Bool(r->finished());
      w.U32(series_index(r->first_token_series));
      w.U32(series_index(r->finish_series));
      w.U32(series_index(r->gauge_series));
      for (uint64_t t : r->t_ns) w.U64(t);
      w.U64(r->activity_ns);
      w.U32(r->prompt_tokens);
      w.U32(r->generation_tokens);
      w.U32(r->max_tokens);
      w.U32(r->n);
      w.U32(r->label_set);
      w.U16(r->closed);
      w.U8(r->known);
      w.Bool(r->has_max_tokens);
      w.Bool(r->has_n);
      w.U8(uint8_t(r->gauge));
      w.U8(uint8_t(r->finish_reason));  // format 6: for the timelines
      // Format 5: the 1.2 extras.
      const Extra* x = FindExtra(*r);
      w.Bool(x != nullptr);
      if (x != nullptr) {
        w.U32(x->cached_tokens);
        w.U32(x->external_tokens);
        w.U32(x->preemptions);
        w.U32(uint32_t(x->priority));
        w.U64(x->kv_ready_ns);
        w.Bool(x->has_info);
        w.Bool(x->kv_ready);
        w.Bool(x->has_priority);
        w.Str(x->traceparent);
        w.Str(x->tracestate);
        w.Bool(x->kv_wait_open);  // format 7
      }
    }
  }
}

void Tracker::LoadState(StateReader& rd,
                        const std::vector<EngineSeries*>& series) {
  auto series_at = [&rd, &series](uint32_t i) -> EngineSeries* {
    if (i == UINT32_MAX) return nullptr;
    if (i >= series.size()) {
      rd.Fail();
      return nullptr;
    }
    return series[i];
  };
  evicted_ = rd.U64();
  // Format 7 adds the KV wait's counts (the last interval).
  const size_t intervals =
      rd.version() >= 7 ? incomplete_.size() : size_t(Interval::kKvWait);
  for (size_t i = 0; i < intervals; ++i) incomplete_[i] = rd.U64();
  for (size_t i = 0; i < intervals; ++i) negative_[i] = rd.U64();
  const size_t n = rd.Count(options_.max_requests, 64);
  index_.Reserve(n);
  for (size_t i = 0; i < n && rd.ok(); ++i) {
    const uint64_t space = rd.U64();
    uint64_t num = rd.U64();
    const std::string str = rd.Str(TM_MAX_RID_BYTES);
    if (!str.empty()) num = hash_.Bytes(str);
    const bool finished = rd.Bool();
    const KeyView view{space, num, str};
    const uint64_t hash = HashOf(view);
    if (Lookup(view, hash) != nullptr) {
      rd.Fail();
      break;
    }
    Request& r = NewRequest(view, hash);
    r.first_token_series = series_at(rd.U32());
    r.finish_series = series_at(rd.U32());
    r.gauge_series = series_at(rd.U32());
    for (uint64_t& t : r.t_ns) t = rd.U64();
    r.activity_ns = rd.U64();
    r.prompt_tokens = rd.U32();
    r.generation_tokens = rd.U32();
    r.max_tokens = rd.U32();
    r.n = rd.U32();
    r.label_set = rd.U32();
    r.closed = rd.U16();
    const uint8_t known = rd.U8();
    r.has_max_tokens = rd.Bool();
    r.has_n = rd.Bool();
    const uint8_t gauge = rd.U8();
    if (known >= (1u << kNumPoints) || gauge > uint8_t(Gauge::kRunning) ||
        (r.label_set != 0 && r.label_set >= request_labels_.set_count()) ||
        (gauge != uint8_t(Gauge::kNone) && r.gauge_series == nullptr)) {
      rd.Fail();
    }
    r.known = known & ((1u << kNumPoints) - 1);
    r.gauge = Gauge(gauge);
    if (rd.version() >= 6) {
      const uint8_t reason = rd.U8();
      if (reason >= kNumFinishReasons) rd.Fail();
      r.finish_reason = FinishReason(reason & 3);
    }
    if (rd.version() >= 5 && rd.Bool()) {
      Extra& x = ExtraOf(r);
      x.cached_tokens = rd.U32();
      x.external_tokens = rd.U32();
      x.preemptions = rd.U32();
      x.priority = int32_t(rd.U32());
      x.kv_ready_ns = rd.U64();
      x.has_info = rd.Bool();
      x.kv_ready = rd.Bool();
      x.has_priority = rd.Bool();
      x.traceparent = rd.Str(TM_TRACEPARENT_BYTES);
      x.tracestate = rd.Str(TM_MAX_TRACESTATE_BYTES);
      if (rd.version() >= 7) {
        x.kv_wait_open = rd.Bool();
        if (x.kv_wait_open && (!finished || !x.kv_ready)) rd.Fail();
      } else {
        // Before format 7 the KV wait was observed with the per-request
        // histograms (at FINISHED once ARRIVED is known): one not yet
        // decided is open now, and closes below if SCHEDULED is known.
        x.kv_wait_open =
            finished && x.kv_ready && (r.closed & kArrivalStatsBit) == 0;
      }
      if (uint64_t(x.cached_tokens) + x.external_tokens > r.prompt_tokens &&
          x.has_info && (known & Bit(kArrived)) != 0) {
        rd.Fail();
      }
    }
    if (r.finished() != finished) rd.Fail();
    if (finished && r.finish_series == nullptr) rd.Fail();
    if (rd.ok() && r.has_extra) CloseKvWait(r);
    if (finished) {
      Append(r, finished_head_, finished_tail_);
    } else {
      Append(r, active_head_, active_tail_);
    }
  }
}

}  // namespace tokenmeter::daemon
