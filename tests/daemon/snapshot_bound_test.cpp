// The snapshot size bound (daemon/snapshot_bound.h): it covers a series
// filled to what its encoder can write, it grows with each cap, and at the
// default caps it sets aside the 2 GiB file of issue 28. The figures it
// prints are the ones docs/operations.md quotes.
#include "daemon/snapshot_bound.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_map>

#include "daemon/base/clock.h"
#include "daemon/base/state_io.h"
#include "daemon/ingest/event.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/tracker.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/kv_transfer.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/parts/sleep.h"
#include "daemon/store/parts/waiting_reason.h"

namespace tokenmeter::daemon {
namespace {

const SnapshotFingerprint kFp{{"buckets", "naming", "labels"}};

std::unique_ptr<Registry> MakeRegistry(const Config& config) {
  std::unique_ptr<Registry> r;
  EXPECT_TRUE(Registry::Create(config.registry, &r).ok());
  return r;
}

SnapshotBound BoundOf(const Config& config) {
  return MaxSnapshotBytes(config, *MakeRegistry(config), kFp);
}

TEST(SnapshotBoundTest, DefaultCapsSetAsideATwoGibFile) {
  const SnapshotBound b = BoundOf(Config{});
  std::cout << "default caps: per series " << b.per_series << " B, per request "
            << b.per_request << " B, fixed " << b.fixed << " B, total "
            << b.total << " B (" << (b.total >> 20) << " MiB)\n";
  EXPECT_LT(b.total, uint64_t{2} << 30);
  const Config c;
  EXPECT_EQ(b.total, b.fixed + c.registry.max_engine_series * b.per_series +
                         c.tracker.max_requests * b.per_request);
}

// One series with every string at its longest, every counter and child
// set, every histogram's native buckets at their most: its encoding (the
// registry's, with that one series) fits per_series.
TEST(SnapshotBoundTest, PerSeriesCoversAFullSeries) {
  Config config;
  std::unique_ptr<Registry> reg = MakeRegistry(config);
  const std::string long_string(TM_MAX_STRING_BYTES, 'x');
  LabelPairs labels;
  for (char c = 'a'; c < char('a' + TM_MAX_HELLO_LABELS); ++c) {
    labels.emplace_back(std::string(TM_MAX_STRING_BYTES, c), long_string);
  }
  EngineSeries* s =
      reg->GetOrCreate({long_string, long_string, long_string, labels});
  ASSERT_NE(s, nullptr);
  for (size_t m = 0; m < kNumEngineMetrics; ++m) {
    s->Add(EngineMetric(m), UINT64_MAX);
    s->Set(EngineMetric(m), 1.5);
  }
  for (size_t i = 0; i < config.ingest.limits.max_spec_positions; ++i) {
    s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, i, 1);
  }
  for (size_t i = 0; i < std::size(kFinishedReasonValues); ++i) {
    s->AddChild(kRequestSuccess, i, 1);
  }
  for (int h = 0; h < kNumHistograms; ++h) {
    Histogram& hist = s->hist(EngineMetric(kFirstHistogram + h));
    // Values 1e-9 to 1e12 in steps of 2^(1/8): far more native buckets
    // than kMaxBuckets, which the histogram then keeps to.
    for (int i = 0; i < 600; ++i) hist.Observe(std::pow(2.0, i / 8.0 - 30));
  }
  // The protocol 1.2 parts at their most: 16 reasons of 64 bytes and
  // __other__, both roles' histograms full, sleep and waiting.
  for (int i = 0; i < 17; ++i) {
    std::string reason(TM_MAX_LABEL_VALUE_BYTES, 'a');
    reason[0] = char('a' + i);
    s->part<AdmissionPart>().Reject(reason);
    for (size_t role = 0; role < 2; ++role) {
      s->part<KvTransferPart>().Add(role, 1, false, 0, false, reason);
    }
  }
  for (size_t role = 0; role < 2; ++role) {
    for (int i = 0; i < 600; ++i) {
      const double v = std::pow(2.0, i / 8.0 - 30);
      s->part<KvTransferPart>().Add(role, uint64_t(v * 1e9), true,
                                    uint64_t(v * 1e6), true, {});
    }
  }
  s->part<SleepPart>().Apply(1, 2, 1);
  s->part<WaitingReasonPart>().Set(9, 3);
  std::string out;
  StateWriter w(out);
  std::unordered_map<const EngineSeries*, uint32_t> index;
  reg->SaveState(w, &index);
  const SnapshotBound b = MaxSnapshotBytes(config, *reg, kFp);
  std::cout << "a full series encodes to " << out.size() << " B of "
            << b.per_series << " B\n";
  EXPECT_LE(out.size(), b.per_series);
  // Generous, not absurd: the allowances (parts, client drop counts) are
  // less than the values themselves.
  EXPECT_GT(out.size(), b.per_series / 2);
}

// With --priority-label the priority label's cells are not held to
// --request-label-values (its five buckets always pass): a series with one
// value per label and every bucket still fits the bound.
TEST(SnapshotBoundTest, PerSeriesCoversEveryPriorityBucket) {
  Config config;
  config.registry.request_labels = {"tenant"};
  config.registry.request_label_values = 1;
  config.registry.priority_label = true;
  std::unique_ptr<Registry> reg = MakeRegistry(config);
  EngineSeries* s = reg->GetOrCreate({"m", "e", "ns", {}});
  ASSERT_NE(s, nullptr);
  RequestLabels& labels = reg->request_labels();
  size_t cells = 0;
  for (const std::string_view tenant : {"", "a", "__other__"}) {
    for (const std::string_view bucket : {"<-1", "-1", "0", "1", ">1"}) {
      LabelKey key = 0;
      key = RequestLabels::Pack(key, 0, labels.Intern(0, tenant));
      key = RequestLabels::Pack(key, 1, labels.Intern(1, bucket));
      ASSERT_TRUE(s->Admit(0, RequestLabels::Unpack(key, 0)));
      ASSERT_TRUE(s->Admit(1, RequestLabels::Unpack(key, 1))) << bucket;
      if (key == 0) continue;  // the series' own cell
      SeriesValues& v = s->Cell(key);
      for (int h = 0; h < kNumHistograms; ++h) {
        Histogram& hist = v.hist(EngineMetric(kFirstHistogram + h));
        for (int i = 0; i < 600; ++i) {
          hist.Observe(std::pow(2.0, i / 8.0 - 30));
        }
      }
      ++cells;
    }
  }
  EXPECT_EQ(cells, 14u);
  EXPECT_EQ(s->cells().size(), 14u);
  std::string out;
  StateWriter w(out);
  std::unordered_map<const EngineSeries*, uint32_t> index;
  reg->SaveState(w, &index);
  const SnapshotBound b = MaxSnapshotBytes(config, *reg, kFp);
  EXPECT_LE(out.size(), b.per_series);
}

class FixedClock : public Clock {
 public:
  uint64_t NowNs() const override { return 1'000'000'000'000; }
  double UnixNowS() const override { return 1'700'000'000; }
};

// One tracked request with the longest id and every protocol 1.2 extra
// at its longest (max_tokens, n, priority, the W3C trace context, a KV
// wait still open; the extras' counts and flags have a fixed size): what
// it adds to the tracker's encoding fits per_request.
TEST(SnapshotBoundTest, PerRequestCoversAFullRequest) {
  Config config;
  std::unique_ptr<Registry> reg = MakeRegistry(config);
  IngestStats stats(*reg);
  FixedClock clock;
  Tracker tracker(*reg, stats, clock, config.tracker);
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  std::unordered_map<const EngineSeries*, uint32_t> index{{s, 0}};
  auto encoded = [&] {
    std::string out;
    StateWriter w(out);
    tracker.SaveState(w, index);
    return out.size();
  };
  const size_t empty = encoded();
  const uint64_t now = clock.NowNs();
  const std::string id(TM_MAX_RID_BYTES, 'r');
  Event ev;
  ev.rid.is_string = true;
  ev.rid.text = id;
  ev.kind = EventKind::kKvTransfer;
  ev.t_ns = now - 10;
  ev.kv_transfer.role = KvRole::kRecv;
  ev.kv_transfer.ok = true;
  ev.kv_transfer.start_ns = now - 20;
  const Source src{s, 1};
  tracker.Apply(src, ev, nullptr, now);
  ev.kind = EventKind::kArrived;
  ev.t_ns = now - 100;
  ev.count = 100;
  ev.has_max_tokens = ev.has_n = true;
  ev.max_tokens = ev.n = TM_MAX_EVENT_COUNT;
  ev.extras = 0;
  ArrivedExtras x;
  x.has_priority = true;
  x.priority = INT32_MIN;
  const std::string parent =
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const std::string state(TM_MAX_TRACESTATE_BYTES, 'a');
  x.traceparent = parent;
  x.tracestate = state;
  tracker.Apply(src, ev, nullptr, now, std::span(&x, 1));
  ev.extras = Event::kNoExtras;
  ev.kind = EventKind::kTokens;
  ev.t_ns = now - 5;
  ev.count = 1;
  tracker.Apply(src, ev, nullptr, now);
  ev.kind = EventKind::kFinished;
  ev.t_ns = now - 1;
  tracker.Apply(src, ev, nullptr, now);
  ASSERT_EQ(tracker.size(), 1u);
  const size_t one = encoded() - empty;
  const SnapshotBound b = MaxSnapshotBytes(config, *reg, kFp);
  std::cout << "a full request encodes to " << one << " B of " << b.per_request
            << " B\n";
  EXPECT_LE(one, b.per_request);
  EXPECT_GT(one, b.per_request - 16);  // the bound is tight
}

TEST(SnapshotBoundTest, GrowsWithEachCap) {
  const Config base;
  const SnapshotBound b = BoundOf(base);
  Config more_series = base;
  more_series.registry.max_engine_series *= 2;
  const SnapshotBound s = BoundOf(more_series);
  // The shared spaces (4 per series by default) grow with the series too.
  EXPECT_GE(s.total - b.total, base.registry.max_engine_series * b.per_series);
  Config more_requests = base;
  more_requests.tracker.max_requests *= 2;
  EXPECT_EQ(BoundOf(more_requests).total - b.total,
            base.tracker.max_requests * b.per_request);
  Config labelled = base;
  labelled.registry.request_labels = {"tenant"};
  const SnapshotBound l = BoundOf(labelled);
  // One label of 100 values: 101 more cells per series.
  EXPECT_GT(l.per_series, 100 * b.per_series / 2);
  Config more_values = labelled;
  more_values.registry.request_label_values *= 2;
  EXPECT_GT(BoundOf(more_values).per_series, l.per_series);
  Config longer = base;
  longer.ingest.limits.max_spec_positions *= 2;
  EXPECT_GT(BoundOf(longer).per_series, b.per_series);
  Config more_layers = base;
  more_layers.registry.max_moe_layers *= 2;
  EXPECT_EQ(BoundOf(more_layers).total - b.total,
            base.registry.max_moe_layers * kMoeLayerBytes);
  Config experts = base;
  experts.registry.moe_expert_series = true;
  EXPECT_EQ(BoundOf(experts).total - b.total,
            base.registry.max_engine_series * 8);
}

// MoE layers at --max-moe-layers, each with its expert counts kept
// (--moe-expert-series, every expert an engine series): their encoding
// fits the bound's MoE terms.
TEST(SnapshotBoundTest, MoeLayersFitTheirTerms) {
  Config config;
  config.registry.max_engine_series = 1 + 64 * 16;
  config.registry.max_moe_layers = 64;
  config.registry.moe_expert_series = true;
  std::unique_ptr<Registry> reg = MakeRegistry(config);
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  std::string empty;
  {
    StateWriter w(empty);
    std::unordered_map<const EngineSeries*, uint32_t> index;
    reg->SaveState(w, &index);
  }
  const uint64_t counts[16] = {UINT32_MAX, 1, 2, 3};
  for (uint32_t layer = 0; layer < 64; ++layer) {
    ASSERT_TRUE(s->part<MoePart>().Add(layer * 64, counts, true));
  }
  std::string out;
  StateWriter w(out);
  std::unordered_map<const EngineSeries*, uint32_t> index;
  reg->SaveState(w, &index);
  // The part's own header (kind, length, layer count) is in per_series.
  const uint64_t moe_terms = 64 * kMoeLayerBytes + 64 * 16 * 8 + 32;
  std::cout << "64 layers x 16 experts encode to " << out.size() - empty.size()
            << " B of " << moe_terms << " B\n";
  EXPECT_LE(out.size() - empty.size(), moe_terms);
}

// Caps whose product passes 2^64 give 2^64 - 1, not a small number that
// would set every snapshot aside.
TEST(SnapshotBoundTest, SaturatesInsteadOfWrapping) {
  Config huge;
  huge.registry.request_labels = {"a", "b", "c", "d"};
  huge.registry.request_label_values = 65533;
  huge.tracker.max_requests = SIZE_MAX / 2;
  EXPECT_EQ(BoundOf(huge).total, UINT64_MAX);
}

}  // namespace
}  // namespace tokenmeter::daemon
