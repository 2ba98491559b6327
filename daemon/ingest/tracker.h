// The request tracker: joins each request's events (from one or several
// connections of one request-id space, in any order), computes the
// intervals of docs/protocol.md and updates the engine series.
//
// Each event sets one of a request's time points (arrived, queued,
// scheduled, first and last token, finished); one table (kIntervals in
// tracker.cpp) says which interval runs between which points, into which
// histogram, with whose labels and whether it waits for FINISHED; after
// every event that sets a new point one step observes what has become
// ready. Inter-token latency, observed per TOKENS event, is the only
// interval outside the table.
//
// Every event names the connection it came from through a Source; the
// observation of an interval goes to the series of the connection that sent
// the interval's closing event, whatever order the events came in.
//
// Owns the tokenmeter_tracked_requests, _evicted_requests_total,
// _incomplete_intervals_total and _negative_intervals_total families
// (registered with the registry while it lives); events applied and
// bad timestamps are counted in the IngestStats it is given.
//
// Memory: one 160-byte Request per tracked request in a slab, and its
// index slot (about 178 bytes resident with an integer id, see
// docs/performance.md; a string id's bytes beside it; with a timeline
// sink, a RequestTimeline), at most TrackerOptions::max_requests. The slab
// and the index keep their high-water mark.
// Single-threaded (the daemon's loop).
#ifndef TOKENMETER_DAEMON_INGEST_TRACKER_H_
#define TOKENMETER_DAEMON_INGEST_TRACKER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daemon/base/clock.h"
#include "daemon/ingest/event.h"
#include "daemon/ingest/frame_decoder.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/request_hash.h"
#include "daemon/ingest/request_index.h"
#include "daemon/ingest/tick_log.h"
#include "daemon/ingest/tracker_options.h"
#include "daemon/store/registry.h"
#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon {

// Where an event came from.
struct Source {
  EngineSeries* series;  // the sending connection's series (not null)
  uint64_t space;        // its request-id space
};

class Tracker : public Collector {
 public:
  Tracker(Registry& registry, IngestStats& ingest, const Clock& clock,
          TrackerOptions options);
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;
  ~Tracker() override;

  // Applies every event of a decoded batch (timestamps checked against one
  // reading of the clock), as Apply() on each in order would. In chunks of
  // kLookAhead events: the chunk's requests are looked up first, in one
  // loop whose look-ups do not wait for each other, and their lines
  // prefetched; the events are then applied with what was found (a
  // request removed meanwhile, by an eviction, voids the rest). Counts the
  // batch's field_drops of the events it applies as bad_field.
  void ApplyBatch(const Source& src, const Batch& batch);
  static constexpr size_t kLookAhead = 16;
  // Applies one event; `positions` backs a STEP's spec_accepted_per_pos,
  // `arrivals` an ARRIVED's lora and labels (Event::extras).
  void Apply(const Source& src, const Event& ev, const uint64_t* positions,
             uint64_t now_ns, std::span<const ArrivedExtras> arrivals = {}) {
    ApplyFound(src, ev, positions, now_ns, arrivals, nullptr);
  }

  // Retires finished requests past the grace period and evicts idle ones.
  // Cheap when there is nothing to do; the daemon calls it every 100 ms.
  void Sweep();
  // Retires every finished request now, as Sweep() does once its grace
  // period ends (incomplete intervals counted, timelines handed to the
  // sinks); requests not finished stay. For a stop that keeps no state:
  // every connection has been read to its end, so no late event can come,
  // and the requests' traces would otherwise be lost.
  void RetireFinished();

  // With sinks, every request hands its timeline (trace/timeline.h) to
  // them when it leaves: its points, identity and trace context, what a
  // heap block in its Extra keeps once the request has some (preemptions,
  // KV transfers, ARRIVED labels), and, when a sink wants them, its newest
  // TOKENS ticks (up to kMaxTokenTicks) from the tick log (TickLog: a
  // store into one ring per TOKENS event, the ring's newest 2^20 ticks of
  // all requests). A request with none of these costs nothing until it
  // leaves.
  // A request restored from a snapshot hands over its points, finish reason
  // and trace context (its lists and ticks were not saved; from a snapshot
  // older than format 6 its finish reason reads "stop").
  // Without sinks (the default): nothing is kept, one untaken branch per
  // event. Add them before events flow; they see each timeline in the
  // order added, and must outlive the tracker's use of them.
  void AddTimelineSink(trace::TimelineSink* sink) {
    sinks_.push_back(sink);
    has_sinks_ = true;
    if (sink->wants_token_ticks()) {
      token_ticks_ = true;
      ticks_.Enable();
    }
  }
  // Requests retired and evicted with a timeline (all of them with a sink).
  uint64_t timelines_handed() const { return timelines_handed_; }

  size_t size() const { return index_.size(); }
  const Clock& clock() const { return clock_; }
  uint64_t evicted() const { return evicted_; }
  uint64_t incomplete(Interval i) const { return incomplete_[size_t(i)]; }
  uint64_t negative(Interval i) const { return negative_[size_t(i)]; }

  void Collect(DaemonMetric id, MetricWriter& w) const override;

  // Snapshots (daemon/base/state_io.h): the counters and every tracked
  // request, in list order, its series by the index Registry::SaveState()
  // gave them. LoadState() fills a tracker with no requests yet; a request
  // naming a series, a label set or a state out of range fails the reader.
  // O(requests).
  void SaveState(
      StateWriter& w,
      const std::unordered_map<const EngineSeries*, uint32_t>& series) const;
  void LoadState(StateReader& r, const std::vector<EngineSeries*>& series);

  struct Request;  // defined in tracker.cpp

  // What protocol 1.2 adds to a request, kept beside it (only requests
  // that have some: a 1.1 stream never makes one): its SCHEDULED info,
  // preemptions, when its KV arrived (decode side), its priority and W3C
  // trace context.
  struct Extra {
    uint32_t cached_tokens = 0;    // SCHEDULED info cached_tokens
    uint32_t external_tokens = 0;  // SCHEDULED info external_tokens
    uint32_t preemptions = 0;      // PREEMPTED events before FINISHED
    int32_t priority = 0;
    uint64_t kv_ready_ns = 0;  // t of the first successful recv
    bool has_info = false;     // the first SCHEDULED's info, accepted
    bool kv_ready = false;
    // The KV wait should exist (the request finished, a successful recv
    // known: at FINISHED, or a later recv) and is not observed yet: it
    // closes when SCHEDULED is known, or is counted incomplete at
    // retirement.
    bool kv_wait_open = false;
    bool has_priority = false;
    std::string traceparent;  // empty: none
    std::string tracestate;
    // With a timeline sink, made on first need: what the points and the
    // fields above do not hold (preemptions, KV transfers, labels). A
    // request without any gets its timeline at removal.
    std::unique_ptr<trace::RequestTimeline> timeline;
  };

 private:
  // A request's id in its id space (Source::space); `num` is the id, or
  // the hash of a string id (whose bytes `str` then holds).
  struct KeyView {
    uint64_t space;
    uint64_t num;
    std::string_view str;
  };
  // The index's hash of a key: keyed (request_hash.h), so that a peer
  // cannot choose ids that share a probe run.
  uint64_t HashOf(const KeyView& k) const { return hash_.Int(k.space, k.num); }
  // The lookup key of `rid` in request-id space `space`.
  KeyView ViewOf(uint64_t space, const RequestId& rid) const;

  // The tracked request with key `k` (hash `hash`), else nullptr.
  Request* Lookup(const KeyView& k, uint64_t hash) const;
  // A new request with key `k`, indexed (none with that key may exist);
  // not in a list.
  Request& NewRequest(const KeyView& k, uint64_t hash);
  Request& At(uint32_t handle) const;

  Request& Find(const Source& src, const RequestId& rid, uint64_t now_ns);
  // Find() for a request already looked up (`r`, by Peek()).
  Request& Touch(Request& r, uint64_t now_ns);
  // Lookup(), with the request's lines (and its LRU neighbours)
  // prefetched; no change to anything.
  Request* Peek(const KeyView& k, uint64_t hash) const;
  // Apply() with the event's request already found (`found`, or nullptr:
  // look it up).
  void ApplyFound(const Source& src, const Event& ev, const uint64_t* positions,
                  uint64_t now_ns, std::span<const ArrivedExtras> arrivals,
                  Request* found);
  // Whether an event's `t_ns` is within max_future_ns ahead of and
  // max_past_ns behind `now_ns` (else it is skipped as bad_timestamp).
  bool InTime(uint64_t t_ns, uint64_t now_ns) const {
    return t_ns <= now_ns + options_.max_future_ns &&
           t_ns + options_.max_past_ns >= now_ns;
  }
  // The values of `s` a request-level observation of `r` goes to (its
  // label cell; the series itself without request labels).
  SeriesValues& CellOf(EngineSeries& s, const Request& r);
  uint16_t LoraOf(const Request& r) const;
  void Remove(Request& r, bool evicted);
  // Observes every interval of `r` whose ends are known (and, for those
  // observed at finish, that has finished), once each.
  void CloseReady(Request& r);
  // Adds r's prompt tokens by source and the cached ones to `s`.
  void AddPromptSources(SeriesValues& s, const Request& r) const;
  // The KV wait of a finished `r` whose wait is open, once SCHEDULED is
  // known: observed, or counted negative (a recv before SCHEDULED).
  void CloseKvWait(Request& r);

  void OnArrived(const Source& src, const Event& ev, Request& r,
                 std::span<const ArrivedExtras> arrivals);
  void OnScheduled(const Source& src, Request& r);
  void OnTokens(const Source& src, const Event& ev, Request& r);
  void OnFinished(const Source& src, const Event& ev, Request& r,
                  uint64_t now_ns);
  void OnPreempted(const Source& src, Request& r);
  void OnStep(const Source& src, const Event& ev, const uint64_t* positions);
  void OnExpertLoad(const Source& src, const ExpertLoadView& load);
  void OnScheduledInfo(const ScheduledInfo& info, Request& r);
  void OnKvTransfer(const Source& src, const Event& ev, uint64_t now_ns);
  // Protocol 1.3: a finished request as its engine computed it, and one
  // iteration's computed latencies and counts; neither touches a request.
  void OnRequestSummary(const Source& src, const Event& ev);
  void OnLatencies(const Source& src, const Event& ev,
                   const uint64_t* positions);
  // Fills the time points, tokens, identity and labels of r's timeline
  // (made now if r had none) and hands it to the sink.
  void HandOver(Request& r, bool evicted);
  // r's timeline, made on first use (with a sink).
  trace::RequestTimeline& TimelineOf(Request& r);
  // The request's Extra, made on first use.
  Extra& ExtraOf(Request& r);
  Extra* FindExtra(const Request& r);
  const Extra* FindExtra(const Request& r) const;

  Registry& registry_;
  RequestLabels& request_labels_;
  const bool labels_on_;  // some --request-label is configured
  // The index of the "priority" request label (--priority-label), or -1.
  const int priority_label_;
  IngestStats& ingest_;
  const Clock& clock_;
  const TrackerOptions options_;
  // Requests live in a slab of chunks (stable addresses: the lists, the
  // extras and ApplyBatch() hold pointers), found by handle through
  // index_; freed handles are reused, newest first. The slab keeps its
  // high-water mark of chunks.
  static constexpr uint32_t kSlabChunk = 512;
  const RequestHash hash_;  // a random key per tracker
  RequestIndex index_;
  std::vector<std::unique_ptr<Request[]>> slab_;
  std::vector<uint32_t> free_;
  uint32_t slab_used_ = 0;  // handles handed out from the slab's end
  // Extra of the requests whose has_extra bit is set.
  std::unordered_map<const Request*, Extra> extras_;
  // Intrusive lists through Request::prev/next: active requests by last
  // activity, finished ones by finish time (both oldest first).
  Request* active_head_ = nullptr;
  Request* active_tail_ = nullptr;
  Request* finished_head_ = nullptr;
  Request* finished_tail_ = nullptr;
  uint64_t evicted_ = 0;
  uint64_t removed_ = 0;  // Remove() calls: voids what Peek() found
  std::array<uint64_t, size_t(Interval::kCount)> incomplete_{};
  std::array<uint64_t, size_t(Interval::kCount)> negative_{};
  std::vector<trace::TimelineSink*> sinks_;
  bool has_sinks_ = false;    // !sinks_.empty(), one load on the event path
  bool token_ticks_ = false;  // a sink wants_token_ticks()
  TickLog ticks_;             // the TOKENS ticks, when token_ticks_
  uint64_t timelines_handed_ = 0;
  Registration registration_;  // last: unregisters first
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_TRACKER_H_
