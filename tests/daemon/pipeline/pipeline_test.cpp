// The pipeline core (daemon/pipeline/pipeline.h): built in one call from
// its options (or refused with the registry's message), its four parts
// wired, saved and loaded as one, and the fingerprint of what a snapshot
// of it depends on.
#include "daemon/pipeline/pipeline.h"

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>

#include "daemon/exposition/exposition.h"

namespace tokenmeter::daemon {
namespace {

class FixedClock : public Clock {
 public:
  uint64_t NowNs() const override { return 1'000'000'000'000; }
  double UnixNowS() const override { return 1'700'000'000; }
};

std::unique_ptr<Pipeline> Make(const FixedClock& clock,
                               const PipelineOptions& options = {}) {
  std::unique_ptr<Pipeline> p;
  const Status s = Pipeline::Create(nullptr, clock, options, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

void Feed(Pipeline& p, const FixedClock& clock) {
  EngineSeries* s = p.registry().GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  const Source src{s, 1};
  Event ev{};
  ev.rid.number = 7;
  const uint64_t t = clock.NowNs() - 1'000'000;
  for (EventKind kind : {EventKind::kArrived, EventKind::kScheduled,
                         EventKind::kTokens, EventKind::kTokens}) {
    ev.kind = kind;
    ev.t_ns = t + 1000 * uint64_t(kind);
    ev.count = kind == EventKind::kArrived ? 12 : 1;
    p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  }
  p.stats().SetClientDropped("vllm", "m", "0", 42, 3);
}

std::string Text(const Pipeline& p) {
  std::string out;
  Render(p.registry(), ExpositionFormat::kText004, out);
  return out;
}

TEST(PipelineTest, RefusesWhatTheRegistryRefuses) {
  FixedClock clock;
  PipelineOptions options;
  options.registry.native_histogram_schema = 9;
  std::unique_ptr<Pipeline> p;
  const Status s = Pipeline::Create(nullptr, clock, options, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "--native-histogram-schema must be -4 to 8");
  EXPECT_EQ(p, nullptr);
}

TEST(PipelineTest, WiresTrackerStatsAndRegistryTogether) {
  FixedClock clock;
  auto p = Make(clock);
  Feed(*p, clock);
  EXPECT_EQ(p->stats().events(EventKind::kTokens), 2u);
  EXPECT_EQ(p->tracker().size(), 1u);
  const std::string text = Text(*p);
  EXPECT_NE(text.find("vllm:generation_tokens_total{model_name=\"m\","
                      "engine=\"0\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("tokenmeter_tracked_requests 1\n"), std::string::npos);
  EXPECT_NE(text.find("tokenmeter_client_dropped_events_total{engine_family="
                      "\"vllm\",model_name=\"m\",engine=\"0\"} 3\n"),
            std::string::npos);
}

TEST(PipelineTest, SavesAndLoadsAsOne) {
  FixedClock clock;
  auto a = Make(clock);
  Feed(*a, clock);
  std::string bytes;
  StateWriter w(bytes);
  a->SaveState(w);

  auto b = Make(clock);
  StateReader r(bytes.data(), bytes.size());
  b->LoadState(r);
  ASSERT_TRUE(r.ok() && r.at_end());
  EXPECT_EQ(Text(*b), Text(*a));
  EXPECT_EQ(b->tracker().size(), 1u);
  // The same bytes again.
  std::string again;
  StateWriter w2(again);
  b->SaveState(w2);
  EXPECT_EQ(again, bytes);

  // Every truncation is refused.
  for (size_t n = 0; n < bytes.size(); n += 7) {
    auto c = Make(clock);
    StateReader t(bytes.data(), n);
    c->LoadState(t);
    EXPECT_FALSE(t.ok() && t.at_end()) << n;
  }
}

// Protocol 1.2 state: every part of the new events and a request in
// flight with its extras (SCHEDULED info, preemptions, a received KV,
// priority and trace context) survive a save and load.
void Feed12(Pipeline& p, const FixedClock& clock) {
  EngineSeries* s = p.registry().GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  const Source src{s, 1};
  const uint64_t t = clock.NowNs() - 1'000'000;
  const std::string tp =
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  ArrivedExtras x;
  x.has_priority = true;
  x.priority = -3;
  x.traceparent = tp;
  x.tracestate = "k=v";
  Event ev{};
  ev.rid.number = 7;
  ev.kind = EventKind::kArrived;
  ev.t_ns = t;
  ev.count = 100;
  ev.extras = 0;
  p.tracker().Apply(src, ev, nullptr, clock.NowNs(), std::span(&x, 1));
  ev.extras = Event::kNoExtras;
  ev.kind = EventKind::kScheduled;
  ev.t_ns = t + 10;
  ev.scheduled = ScheduledInfo{40, 10, 3, true};
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kKvTransfer;
  ev.t_ns = t + 30;
  ev.kv_transfer = KvTransferInfo{};
  ev.kv_transfer.role = KvRole::kRecv;
  ev.kv_transfer.start_ns = t + 20;
  ev.kv_transfer.ok = true;
  ev.kv_transfer.has_bytes = true;
  ev.kv_transfer.bytes = 1 << 20;
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kv_transfer.ok = false;
  ev.kv_transfer.reason = TextRef::Of("timeout");
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kPreempted;
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kAdmissionRejected;
  ev.admission = AdmissionInfo{TextRef::Of("queue_full"), false};
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kSleep;
  ev.sleep = SleepInfo{SchedulerState::kPaused, WeightsState::kKeep,
                       KvCacheState::kReleased};
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kStep;
  ev.step = StepStats{};
  ev.step.has = StepStats::kWaiting | StepStats::kWaitingDeferred;
  ev.step.waiting = 3;
  ev.step.waiting_deferred = 1;
  p.tracker().Apply(src, ev, nullptr, clock.NowNs());
}

TEST(PipelineTest, SavesAndLoadsTheProtocol12State) {
  FixedClock clock;
  auto a = Make(clock);
  Feed12(*a, clock);
  std::string bytes;
  StateWriter w(bytes);
  a->SaveState(w);
  auto b = Make(clock);
  StateReader r(bytes.data(), bytes.size());
  b->LoadState(r);
  ASSERT_TRUE(r.ok() && r.at_end());
  const std::string text = Text(*b);
  EXPECT_EQ(text, Text(*a));
  for (const char* family :
       {"admission_rejections_total", "num_requests_waiting_by_reason",
        "kv_transfer_time_seconds", "kv_transfer_failures_total",
        "engine_sleep_state"}) {
    EXPECT_NE(text.find(family), std::string::npos) << family;
  }
  std::string again;
  StateWriter w2(again);
  b->SaveState(w2);
  EXPECT_EQ(again, bytes);  // the request's extras included
  // The request finishes on the loaded side as it would have on the first.
  for (Pipeline* p : {a.get(), b.get()}) {
    EngineSeries* s = p->registry().GetOrCreate({"vllm", "m", "0", {}});
    Event ev{};
    ev.rid.number = 7;
    ev.kind = EventKind::kTokens;
    ev.t_ns = clock.NowNs() - 500'000;
    ev.count = 1;
    p->tracker().Apply({s, 1}, ev, nullptr, clock.NowNs());
    ev.kind = EventKind::kFinished;
    p->tracker().Apply({s, 1}, ev, nullptr, clock.NowNs());
  }
  EXPECT_EQ(Text(*b), Text(*a));
  EXPECT_NE(Text(*b).find("vllm:prompt_tokens_by_source_total{model_name="
                          "\"m\",engine=\"0\",source=\"local_cache_hit\"} "
                          "40\n"),
            std::string::npos);
  for (size_t n = 0; n < bytes.size(); n += 5) {
    auto c = Make(clock);
    StateReader t(bytes.data(), n);
    c->LoadState(t);
    EXPECT_FALSE(t.ok() && t.at_end()) << n;
  }
}

TEST(PipelineTest, FingerprintNamesWhatASnapshotDependsOn) {
  FixedClock clock;
  const SnapshotFingerprint base = Make(clock)->Fingerprint();
  EXPECT_EQ(Make(clock)->Fingerprint().parts, base.parts);
  auto differs_in = [&](const PipelineOptions& o) {
    const SnapshotFingerprint fp = Make(clock, o)->Fingerprint();
    for (size_t i = 0; i < fp.parts.size(); ++i) {
      if (fp.parts[i] != base.parts[i]) return int(i);
    }
    return -1;
  };
  PipelineOptions buckets;
  buckets.registry.buckets["time_to_first_token_seconds"] = {0.1, 1};
  EXPECT_EQ(differs_in(buckets), 0);
  // What formats 1 to 4 were written with: the 1.1 catalog's histograms
  // only, which the buckets of a 1.2 histogram do not change.
  EXPECT_EQ(base.legacy_buckets.rfind("metrics 41 histograms 20;", 0), 0u);
  EXPECT_NE(base.legacy_buckets, base.parts[0]);
  PipelineOptions new_buckets;
  new_buckets.registry.buckets["request_num_preemptions"] = {1, 2};
  const SnapshotFingerprint nb = Make(clock, new_buckets)->Fingerprint();
  EXPECT_NE(nb.parts[0], base.parts[0]);
  EXPECT_EQ(nb.legacy_buckets, base.legacy_buckets);
  PipelineOptions profile;
  profile.ingest.profile = Profile::kSglang;
  EXPECT_EQ(differs_in(profile), 1);
  PipelineOptions ns;
  ns.ingest.namespace_override = "llm";
  EXPECT_EQ(differs_in(ns), 1);
  PipelineOptions labels;
  labels.registry.request_labels = {"tenant"};
  EXPECT_EQ(differs_in(labels), 2);
  PipelineOptions values;
  values.registry.request_label_values = 7;
  EXPECT_EQ(differs_in(values), 2);
  // What a snapshot does not depend on.
  PipelineOptions other;
  other.tracker.grace_ns = 1;
  other.ingest.max_connections = 3;
  other.registry.max_engine_series = 10;
  EXPECT_EQ(differs_in(other), -1);
}

// A pipeline without a grace period that hands the requests it retires to
// `sink`, loaded from the snapshot `bytes`; *whole: every byte was read.
std::unique_ptr<Pipeline> RestoredWithSink(const FixedClock& clock,
                                           const std::string& bytes,
                                           trace::TimelineSink* sink,
                                           bool* whole) {
  PipelineOptions no_grace;
  no_grace.tracker.grace_ns = 0;
  auto p = Make(clock, no_grace);
  p->tracker().AddTimelineSink(sink);
  StateReader r(bytes.data(), bytes.size());
  p->LoadState(r);
  *whole = r.ok() && r.at_end();
  return p;
}

// Format 6: a finished request's reason, the series' and the registry's
// start times survive a save and load; the restored request hands its
// reason to the timeline sinks when it retires.
TEST(PipelineTest, RestoredRequestKeepsItsFinishReasonAndStartTimes) {
  FixedClock clock;
  auto a = Make(clock);
  EngineSeries* s = a->registry().GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->start_unix_ns(), 1'700'000'000'000'000'000u);
  EXPECT_EQ(a->registry().start_unix_ns(), 1'700'000'000'000'000'000u);
  const Source src{s, 1};
  Event ev{};
  ev.rid.number = 9;
  ev.t_ns = clock.NowNs() - 1'000'000;
  ev.kind = EventKind::kArrived;
  ev.count = 3;
  a->tracker().Apply(src, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kFinished;
  ev.t_ns += 1000;
  ev.reason = FinishReason::kError;
  a->tracker().Apply(src, ev, nullptr, clock.NowNs());
  std::string bytes;
  StateWriter w(bytes);
  a->SaveState(w);

  struct Sink : trace::TimelineSink {
    void OnRetired(trace::RequestTimeline& t, bool) override {
      reasons.push_back(t.finish_reason);
    }
    std::vector<std::string> reasons;
  } sink;
  bool whole = false;
  auto b = RestoredWithSink(clock, bytes, &sink, &whole);
  ASSERT_TRUE(whole);
  EXPECT_EQ(b->registry().GetOrCreate({"vllm", "m", "0", {}})->start_unix_ns(),
            1'700'000'000'000'000'000u);
  EXPECT_EQ(b->registry().start_unix_ns(), 1'700'000'000'000'000'000u);
  EXPECT_EQ(b->tracker().size(), 1u);
  b->tracker().Sweep();
  EXPECT_EQ(b->tracker().size(), 0u);
  EXPECT_EQ(sink.reasons, std::vector<std::string>{"error"});
}

// A request restored from a snapshot keeps its preemption count for the
// timeline sinks (the spans' tokenmeter.preemptions), though the list of
// its preemptions is not saved.
TEST(PipelineTest, RestoredRequestKeepsItsPreemptionCount) {
  FixedClock clock;
  auto a = Make(clock);
  EngineSeries* s = a->registry().GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  const Source src{s, 1};
  Event ev{};
  ev.rid.number = 4;
  ev.t_ns = clock.NowNs() - 1'000'000;
  ev.kind = EventKind::kArrived;
  ev.count = 3;
  a->tracker().Apply(src, ev, nullptr, clock.NowNs());
  for (EventKind k :
       {EventKind::kScheduled, EventKind::kPreempted, EventKind::kScheduled,
        EventKind::kPreempted, EventKind::kScheduled}) {
    ev.kind = k;
    ev.t_ns += 1000;
    a->tracker().Apply(src, ev, nullptr, clock.NowNs());
  }
  std::string bytes;
  StateWriter w(bytes);
  a->SaveState(w);

  struct Sink : trace::TimelineSink {
    void OnRetired(trace::RequestTimeline& t, bool) override {
      counts.push_back(t.preemption_count);
      listed.push_back(t.preemptions.size());
    }
    std::vector<uint32_t> counts;
    std::vector<size_t> listed;
  } sink;
  bool whole = false;
  auto b = RestoredWithSink(clock, bytes, &sink, &whole);
  ASSERT_TRUE(whole);
  EngineSeries* s2 = b->registry().GetOrCreate({"vllm", "m", "0", {}});
  ev.kind = EventKind::kPreempted;  // a third, after the restore
  ev.t_ns += 1000;
  b->tracker().Apply({s2, 1}, ev, nullptr, clock.NowNs());
  ev.kind = EventKind::kFinished;
  ev.t_ns += 1000;
  ev.reason = FinishReason::kStop;
  b->tracker().Apply({s2, 1}, ev, nullptr, clock.NowNs());
  b->tracker().Sweep();
  EXPECT_EQ(sink.counts, std::vector<uint32_t>{3});
  EXPECT_EQ(sink.listed, std::vector<size_t>{1});
}

}  // namespace
}  // namespace tokenmeter::daemon
