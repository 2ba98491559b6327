#include "daemon/ingest/tracker.h"

#include <time.h>

#include <cstring>

namespace tokenmeter::daemon {

uint64_t MonotonicClock::NowNs() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

namespace {

enum class Gauge : uint8_t { kNone, kWaiting, kRunning };

uint64_t HashBytes(std::string_view s) {
  // FNV-1a; ids are short and this is only a bucket hint (KeyEq compares
  // the bytes).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

struct Tracker::Request {
  const Key* key = nullptr;
  Request* prev = nullptr;
  Request* next = nullptr;
  EngineSeries* first_token_series = nullptr;  // sent the first TOKENS
  EngineSeries* finish_series = nullptr;       // sent FINISHED
  EngineSeries* gauge_series = nullptr;        // holds the derived gauge
  uint64_t arrived_ns = 0;
  uint64_t queued_ns = 0;
  uint64_t scheduled_ns = 0;
  uint64_t first_token_ns = 0;
  uint64_t last_token_ns = 0;
  uint64_t finished_ns = 0;
  uint64_t activity_ns = 0;  // daemon clock: last event, or finish
  uint32_t prompt_tokens = 0;
  uint32_t generation_tokens = 0;
  uint32_t max_tokens = 0;
  uint32_t n = 0;
  bool has_arrived : 1 = false;
  bool has_queued : 1 = false;
  bool has_scheduled : 1 = false;
  bool has_tokens : 1 = false;
  bool finished : 1 = false;
  bool has_max_tokens : 1 = false;
  bool has_n : 1 = false;
  bool ttft_done : 1 = false;
  bool prefill_done : 1 = false;
  // Finish-time observations still waiting for their start event.
  bool pending_e2e : 1 = false;
  bool pending_queue : 1 = false;
  bool pending_inference : 1 = false;
  bool pending_arrival_stats : 1 = false;  // prompt and params histograms
  Gauge gauge = Gauge::kNone;
};

size_t Tracker::KeyHash::Mix(uint64_t a, uint64_t b) noexcept {
  uint64_t h = a * 0x9e3779b97f4a7c15ull ^ b;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return size_t(h);
}

Tracker::Tracker(Registry& registry, const Clock& clock, TrackerOptions options)
    : registry_(registry),
      counters_(registry.counters()),
      clock_(clock),
      options_(options) {}

Tracker::~Tracker() = default;

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

void SetGauge(Tracker::Request& r, Gauge g, EngineSeries* s);

}  // namespace

Tracker::Request& Tracker::Find(const Source& src, const RequestId& rid,
                                uint64_t now_ns) {
  KeyView view{src.space, rid.number, {}};
  if (rid.is_string) {
    view.num = HashBytes(rid.text);
    view.str = rid.text;
  }
  auto it = requests_.find(view);
  if (it != requests_.end()) {
    Request& r = it->second;
    if (!r.finished) {
      Unlink(r, active_head_, active_tail_);
      Append(r, active_head_, active_tail_);
      r.activity_ns = now_ns;
    }
    return r;
  }
  if (requests_.size() >= options_.max_requests) {
    // Make room: a finished request past its use first, else the least
    // recently active one.
    if (finished_head_ != nullptr) {
      Remove(*finished_head_, /*evicted=*/false);
    } else if (active_head_ != nullptr) {
      Remove(*active_head_, /*evicted=*/true);
    }
  }
  Key key{view.space, view.num, nullptr, uint8_t(view.str.size())};
  if (rid.is_string) {
    key.str.reset(new char[view.str.size()]);
    std::memcpy(key.str.get(), view.str.data(), view.str.size());
  }
  auto [pos, inserted] = requests_.try_emplace(std::move(key));
  Request& r = pos->second;
  r.key = &pos->first;
  r.activity_ns = now_ns;
  Append(r, active_head_, active_tail_);
  counters_.tracked_requests = int64_t(requests_.size());
  return r;
}

namespace {

void SetGauge(Tracker::Request& r, Gauge g, EngineSeries* s) {
  if (r.gauge == Gauge::kWaiting) --r.gauge_series->derived_waiting;
  if (r.gauge == Gauge::kRunning) --r.gauge_series->derived_running;
  r.gauge = g;
  r.gauge_series = s;
  if (g == Gauge::kWaiting) ++s->derived_waiting;
  if (g == Gauge::kRunning) ++s->derived_running;
}

}  // namespace

void Tracker::Remove(Request& r, bool evicted) {
  // Intervals whose closing event came but whose start never did.
  auto incomplete = [this](Interval i) { ++counters_.incomplete[size_t(i)]; };
  if (r.has_tokens && !r.ttft_done) incomplete(Interval::kTtft);
  if (r.has_tokens && !r.prefill_done) incomplete(Interval::kPrefill);
  if (r.pending_e2e) incomplete(Interval::kE2e);
  if (r.pending_queue) incomplete(Interval::kQueue);
  if (r.pending_inference) incomplete(Interval::kInference);
  if (evicted) ++counters_.evicted_requests;
  SetGauge(r, Gauge::kNone, nullptr);
  if (r.finished) {
    Unlink(r, finished_head_, finished_tail_);
  } else {
    Unlink(r, active_head_, active_tail_);
  }
  const Key& k = *r.key;
  // Heterogeneous erase() is C++23; find() then erase the node.
  requests_.erase(requests_.find(
      KeyView{k.space, k.num, std::string_view(k.str.get(), k.len)}));
  counters_.tracked_requests = int64_t(requests_.size());
}

void Tracker::Sweep() {
  const uint64_t now = clock_.NowNs();
  while (finished_head_ != nullptr &&
         now - finished_head_->activity_ns >= options_.grace_ns) {
    Remove(*finished_head_, /*evicted=*/false);
  }
  while (active_head_ != nullptr &&
         now - active_head_->activity_ns >= options_.idle_timeout_ns) {
    Remove(*active_head_, /*evicted=*/true);
  }
}

void Tracker::Observe(EngineSeries& s, EngineMetric m, Interval interval,
                      int64_t delta_ns) {
  if (delta_ns < 0) {
    ++counters_.negative[size_t(interval)];
    return;
  }
  s.hist(m).Observe(double(delta_ns));
}

// ---- events
// ------------------------------------------------------------------

void Tracker::ApplyBatch(const Source& src, const Batch& batch) {
  const uint64_t now = clock_.NowNs();
  const uint64_t* positions = batch.positions.data();
  for (const Event& ev : batch.events) Apply(src, ev, positions, now);
}

void Tracker::Apply(const Source& src, const Event& ev,
                    const uint64_t* positions, uint64_t now_ns) {
  if (ev.t_ns > now_ns + options_.max_future_ns ||
      ev.t_ns + options_.max_past_ns < now_ns) {
    ++counters_.ingest_errors[size_t(IngestError::kBadTimestamp)];
    return;
  }
  ++counters_.ingest_events[size_t(ev.kind) - 1];
  if (ev.kind == EventKind::kStep) {
    OnStep(src, ev, positions);
    return;
  }
  Request& r = Find(src, ev.rid, now_ns);
  switch (ev.kind) {
    case EventKind::kArrived:
      OnArrived(src, ev, r);
      break;
    case EventKind::kQueued:
      OnQueued(ev, r);
      break;
    case EventKind::kScheduled:
      OnScheduled(src, ev, r);
      break;
    case EventKind::kTokens:
      OnTokens(src, ev, r);
      break;
    case EventKind::kFinished:
      OnFinished(src, ev, r, now_ns);
      break;
    case EventKind::kPreempted:
      OnPreempted(src, r);
      break;
    case EventKind::kStep:
      break;
  }
}

namespace {
int64_t Delta(uint64_t end, uint64_t start) { return int64_t(end - start); }
uint64_t QueueStart(const Tracker::Request& r) {
  return r.has_queued ? r.queued_ns : r.arrived_ns;
}
}  // namespace

void Tracker::OnArrived(const Source& src, const Event& ev, Request& r) {
  if (r.has_arrived) return;  // a repeated ARRIVED changes nothing
  r.has_arrived = true;
  r.arrived_ns = ev.t_ns;
  r.prompt_tokens = uint32_t(std::min<uint64_t>(ev.count, UINT32_MAX));
  r.has_max_tokens = ev.has_max_tokens;
  r.max_tokens = uint32_t(std::min<uint64_t>(ev.max_tokens, UINT32_MAX));
  r.has_n = ev.has_n;
  r.n = uint32_t(std::min<uint64_t>(ev.n, UINT32_MAX));
  if (!r.finished && !r.has_scheduled && !r.has_tokens &&
      r.gauge == Gauge::kNone) {
    SetGauge(r, Gauge::kWaiting, src.series);
  }
  if (r.has_tokens && !r.ttft_done) {
    // The first token came first: TTFT closes now, with its labels.
    r.ttft_done = true;
    Observe(*r.first_token_series, kTimeToFirstToken, Interval::kTtft,
            Delta(r.first_token_ns, r.arrived_ns));
    r.first_token_series->prompt_tokens += r.prompt_tokens;
  }
  if (r.finished) {
    EngineSeries& f = *r.finish_series;
    if (r.pending_e2e) {
      r.pending_e2e = false;
      Observe(f, kE2eRequestLatency, Interval::kE2e,
              Delta(r.finished_ns, r.arrived_ns));
    }
    if (r.pending_queue && r.has_scheduled) {
      r.pending_queue = false;
      Observe(f, kRequestQueueTime, Interval::kQueue,
              Delta(r.scheduled_ns, QueueStart(r)));
    }
    if (r.pending_arrival_stats) {
      r.pending_arrival_stats = false;
      f.hist(kRequestPromptTokens).Observe(r.prompt_tokens);
      if (r.has_max_tokens)
        f.hist(kRequestParamsMaxTokens).Observe(r.max_tokens);
      if (r.has_n) f.hist(kRequestParamsN).Observe(r.n);
    }
  }
}

void Tracker::OnQueued(const Event& ev, Request& r) {
  if (r.has_queued) return;
  r.has_queued = true;
  r.queued_ns = ev.t_ns;
  if (r.finished && r.pending_queue && r.has_scheduled) {
    r.pending_queue = false;
    Observe(*r.finish_series, kRequestQueueTime, Interval::kQueue,
            Delta(r.scheduled_ns, r.queued_ns));
  }
}

void Tracker::OnScheduled(const Source& src, const Event& ev, Request& r) {
  if (!r.finished && r.gauge != Gauge::kRunning) {
    SetGauge(r, Gauge::kRunning, src.series);
  }
  if (r.has_scheduled) return;  // later SCHEDULEDs do not move it
  r.has_scheduled = true;
  r.scheduled_ns = ev.t_ns;
  if (r.has_tokens && !r.prefill_done) {
    r.prefill_done = true;
    Observe(*r.first_token_series, kRequestPrefillTime, Interval::kPrefill,
            Delta(r.first_token_ns, r.scheduled_ns));
  }
  if (r.finished) {
    EngineSeries& f = *r.finish_series;
    if (r.pending_queue && (r.has_queued || r.has_arrived)) {
      r.pending_queue = false;
      Observe(f, kRequestQueueTime, Interval::kQueue,
              Delta(r.scheduled_ns, QueueStart(r)));
    }
    if (r.pending_inference) {
      r.pending_inference = false;
      Observe(f, kRequestInferenceTime, Interval::kInference,
              Delta(r.last_token_ns, r.scheduled_ns));
    }
  }
}

void Tracker::OnTokens(const Source& src, const Event& ev, Request& r) {
  EngineSeries& s = *src.series;
  s.generation_tokens += ev.count;
  r.generation_tokens = uint32_t(
      std::min<uint64_t>(uint64_t(r.generation_tokens) + ev.count, UINT32_MAX));
  if (r.has_tokens) {
    Observe(s, kInterTokenLatency, Interval::kItl,
            Delta(ev.t_ns, r.last_token_ns));
    if (ev.t_ns > r.last_token_ns) r.last_token_ns = ev.t_ns;
    return;
  }
  r.has_tokens = true;
  r.first_token_ns = r.last_token_ns = ev.t_ns;
  r.first_token_series = &s;
  if (!r.finished && r.gauge != Gauge::kRunning) {
    SetGauge(r, Gauge::kRunning, &s);
  }
  if (r.has_arrived) {
    r.ttft_done = true;
    Observe(s, kTimeToFirstToken, Interval::kTtft,
            Delta(r.first_token_ns, r.arrived_ns));
    s.prompt_tokens += r.prompt_tokens;
  }
  if (r.has_scheduled) {
    r.prefill_done = true;
    Observe(s, kRequestPrefillTime, Interval::kPrefill,
            Delta(r.first_token_ns, r.scheduled_ns));
  }
}

void Tracker::OnFinished(const Source& src, const Event& ev, Request& r,
                         uint64_t now_ns) {
  if (r.finished) return;  // a repeated FINISHED changes nothing
  EngineSeries& s = *src.series;
  r.finished = true;
  r.finished_ns = ev.t_ns;
  r.finish_series = &s;
  ++s.success[size_t(ev.reason)];
  SetGauge(r, Gauge::kNone, nullptr);
  Unlink(r, active_head_, active_tail_);
  r.activity_ns = now_ns;
  Append(r, finished_head_, finished_tail_);
  ObserveFinishTime(r);
}

void Tracker::ObserveFinishTime(Request& r) {
  EngineSeries& s = *r.finish_series;
  if (r.has_arrived) {
    Observe(s, kE2eRequestLatency, Interval::kE2e,
            Delta(r.finished_ns, r.arrived_ns));
    s.hist(kRequestPromptTokens).Observe(r.prompt_tokens);
    if (r.has_max_tokens) s.hist(kRequestParamsMaxTokens).Observe(r.max_tokens);
    if (r.has_n) s.hist(kRequestParamsN).Observe(r.n);
  } else {
    r.pending_e2e = true;
    r.pending_arrival_stats = true;
  }
  if (r.has_scheduled) {
    if (r.has_queued || r.has_arrived) {
      Observe(s, kRequestQueueTime, Interval::kQueue,
              Delta(r.scheduled_ns, QueueStart(r)));
    } else {
      r.pending_queue = true;
    }
  } else if (r.has_tokens) {
    // It must have been scheduled; the event has not come (yet).
    r.pending_queue = true;
  }
  if (r.has_tokens) {
    const int64_t decode = Delta(r.last_token_ns, r.first_token_ns);
    Observe(s, kRequestDecodeTime, Interval::kDecode, decode);
    if (r.has_scheduled) {
      Observe(s, kRequestInferenceTime, Interval::kInference,
              Delta(r.last_token_ns, r.scheduled_ns));
    } else {
      r.pending_inference = true;
    }
    if (r.generation_tokens > 1) {
      s.hist(kRequestTimePerOutputToken)
          .Observe(double(decode) / double(r.generation_tokens - 1));
    }
  }
  s.hist(kRequestGenerationTokens).Observe(r.generation_tokens);
  s.hist(kRequestMaxNumGenerationTokens).Observe(r.generation_tokens);
}

void Tracker::OnPreempted(const Source& src, Request& r) {
  ++src.series->preemptions;
  if (!r.finished) SetGauge(r, Gauge::kWaiting, src.series);
}

void Tracker::OnStep(const Source& src, const Event& ev,
                     const uint64_t* positions) {
  EngineSeries& s = *src.series;
  const StepStats& st = ev.step;
  if (st.has & StepStats::kRunning) {
    s.has_step_running = true;
    s.step_running = st.running;
  }
  if (st.has & StepStats::kWaiting) {
    s.has_step_waiting = true;
    s.step_waiting = st.waiting;
  }
  if (st.has & StepStats::kKvUsage) s.kv_usage = st.kv_usage;
  s.prefix_queries += st.prefix_queries;
  s.prefix_hits += st.prefix_hits;
  if (st.has & (StepStats::kPromptTokens | StepStats::kGenerationTokens)) {
    s.hist(kIterationTokens)
        .Observe(double(st.prompt_tokens + st.generation_tokens));
  }
  s.spec_drafts += st.spec_drafts;
  s.spec_draft_tokens += st.spec_draft_tokens;
  s.spec_accepted_tokens += st.spec_accepted_tokens;
  if (st.pos_count > 0) {
    if (s.spec_accepted_per_pos.size() < st.pos_count) {
      s.spec_accepted_per_pos.resize(st.pos_count, 0);
    }
    for (uint32_t i = 0; i < st.pos_count; ++i) {
      s.spec_accepted_per_pos[i] += positions[st.pos_begin + i];
    }
  }
}

}  // namespace tokenmeter::daemon
