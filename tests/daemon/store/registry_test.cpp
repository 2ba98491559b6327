// Registry: option checks (bucket overrides, request labels), series
// identities, the series cap, one profile per namespace; RequestLabels and
// EngineSeries' label cells.
#include "daemon/store/registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/base/state_io.h"
#include "daemon/exposition/exposition.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/profile.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {
namespace {

std::unique_ptr<Registry> MustCreate(const RegistryOptions& options) {
  std::unique_ptr<Registry> reg;
  const Status s = Registry::Create(options, &reg);
  EXPECT_TRUE(s.ok()) << s.message();
  return reg;
}

TEST(RegistryTest, DefaultOptionsGiveDocumentedBuckets) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < kNumHistograms; ++i) {
    const EngineMetricDef& d = kEngineMetrics[kFirstHistogram + i];
    SCOPED_TRACE(d.suffix);
    const HistogramLayout& layout = s->hist(d.id).layout();
    EXPECT_EQ(layout.bounds(), DefaultBuckets(d.buckets, 32768));
    EXPECT_EQ(layout.divisor(), d.seconds ? 1e9 : 1.0);
    EXPECT_EQ(layout.le_text().back(), "+Inf");
  }
  EXPECT_EQ(s->hist(kRequestPromptTokens).layout().bounds().back(), 20000);
}

TEST(RegistryTest, MaxModelLenSetsTokenBuckets) {
  RegistryOptions options;
  options.max_model_len = 100;
  auto reg = MustCreate(options);
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  for (EngineMetric m :
       {kRequestPromptTokens, kRequestGenerationTokens,
        kRequestMaxNumGenerationTokens, kRequestParamsMaxTokens}) {
    EXPECT_EQ(s->hist(m).layout().bounds(), OneTwoFive(100));
  }
  EXPECT_EQ(s->hist(kRequestParamsN).layout().bounds(),
            (std::vector<double>{1, 2, 5, 10, 20}));
}

TEST(RegistryTest, BucketOverrideReplacesOneHistogram) {
  RegistryOptions options;
  options.buckets["time_to_first_token_seconds"] = {0.1, 0.5, 1};
  options.buckets["iteration_tokens_total"] = {1, 1000};
  auto reg = MustCreate(options);
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  EXPECT_EQ(s->hist(kTimeToFirstToken).layout().bounds(),
            (std::vector<double>{0.1, 0.5, 1}));
  EXPECT_EQ(s->hist(kTimeToFirstToken).layout().le_text(),
            (std::vector<std::string>{"0.1", "0.5", "1", "+Inf"}));
  EXPECT_EQ(s->hist(kIterationTokens).layout().bounds(),
            (std::vector<double>{1, 1000}));
  EXPECT_EQ(s->hist(kInterTokenLatency).layout().bounds(),
            DefaultBuckets(BucketSet::kItl, 32768));
  s->hist(kTimeToFirstToken).Observe(500'000'000);
  EXPECT_EQ(s->hist(kTimeToFirstToken).counts(),
            (std::vector<uint64_t>{0, 1, 0, 0}));
}

struct BadOptionsCase {
  const char* name;
  std::string suffix;  // empty: no bucket override
  std::vector<double> bounds;
  uint64_t max_model_len;
  const char* message_part;
};

TEST(RegistryTest, RejectsBadOptions) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const BadOptionsCase cases[] = {
      {"unknown histogram",
       "no_such_histogram",
       {1, 2},
       32768,
       "no_such_histogram"},
      {"a counter is not a histogram",
       "prompt_tokens",
       {1, 2},
       32768,
       "prompt_tokens"},
      {"decreasing",
       "time_to_first_token_seconds",
       {0.5, 0.1},
       32768,
       "time_to_first_token_seconds"},
      {"repeated bound",
       "inter_token_latency_seconds",
       {0.1, 0.1},
       32768,
       "inter_token_latency_seconds"},
      {"no bounds", "request_params_n", {}, 32768, "request_params_n"},
      {"infinite bound",
       "e2e_request_latency_seconds",
       {1, inf},
       32768,
       "e2e_request_latency_seconds"},
      {"NaN bound",
       "e2e_request_latency_seconds",
       {nan},
       32768,
       "e2e_request_latency_seconds"},
      {"max model len 0", "", {}, 0, "max-model-len"},
      {"bounds that meet in SGLang's MB",
       "kv_transfer_bytes",
       {1, 1.0000000000000002},  // one ulp apart
       32768,
       "sglang profile's unit"},
      {"a profile's name: bounds checked too",
       "kv_transfer_latency_ms",
       {7, 3},
       32768,
       "kv_transfer_latency_ms"},
  };
  for (const BadOptionsCase& c : cases) {
    SCOPED_TRACE(c.name);
    RegistryOptions options;
    options.max_model_len = c.max_model_len;
    if (!c.suffix.empty()) options.buckets[c.suffix] = c.bounds;
    std::unique_ptr<Registry> reg;
    const Status s = Registry::Create(options, &reg);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(c.message_part), std::string::npos)
        << s.message();
    EXPECT_EQ(reg, nullptr);
  }
}

// Start times (the OTLP metrics' start_time_unix_nano): each series is
// stamped with the wall clock when made, the registry when its clock is
// set; a snapshot (format 6) carries both (an older one leaves the load's:
// tests/e2e/state_e2e_test.py loads a format 2 snapshot).
TEST(RegistryTest, StartTimesStampedAndCarriedBySnapshots) {
  struct Wall : Clock {
    uint64_t NowNs() const override { return 0; }
    double UnixNowS() const override { return now; }
    double now = 1'700'000'000.5;
  } wall;
  auto saved = MustCreate(RegistryOptions{});
  EXPECT_EQ(saved->start_unix_ns(), 0u);  // no clock yet
  saved->SetClock(&wall);
  EXPECT_EQ(saved->start_unix_ns(), 1'700'000'000'500'000'000u);
  wall.now = 1'700'000'100;
  EngineSeries* a = saved->GetOrCreate({"vllm", "m", "0", {}});
  wall.now = 1'700'000'200;
  EngineSeries* b = saved->GetOrCreate({"vllm", "m", "1", {}});
  EXPECT_EQ(a->start_unix_ns(), 1'700'000'100'000'000'000u);
  EXPECT_EQ(b->start_unix_ns(), 1'700'000'200'000'000'000u);
  EXPECT_EQ(saved->GetOrCreate({"vllm", "m", "0", {}})->start_unix_ns(),
            a->start_unix_ns());  // found, not made again
  std::string bytes;
  StateWriter w(bytes);
  std::unordered_map<const EngineSeries*, uint32_t> index;
  saved->SaveState(w, &index);

  wall.now = 1'800'000'000;  // the restart, later
  auto loaded = MustCreate(RegistryOptions{});
  loaded->SetClock(&wall);
  StateReader r(bytes.data(), bytes.size());
  std::vector<EngineSeries*> by_index;
  loaded->LoadState(r, &by_index);
  ASSERT_TRUE(r.ok() && r.at_end());
  EXPECT_EQ(loaded->start_unix_ns(), 1'700'000'000'500'000'000u);
  EXPECT_EQ(loaded->GetOrCreate({"vllm", "m", "0", {}})->start_unix_ns(),
            1'700'000'100'000'000'000u);
  EXPECT_EQ(loaded->GetOrCreate({"vllm", "m", "1", {}})->start_unix_ns(),
            1'700'000'200'000'000'000u);
  // A series made after the restart starts then.
  EXPECT_EQ(loaded->GetOrCreate({"vllm", "m", "2", {}})->start_unix_ns(),
            1'800'000'000'000'000'000u);
}

TEST(RegistryTest, SameIdentitySameSeries) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* a = reg->GetOrCreate({"vllm", "m", "0", {}});
  EngineSeries* b = reg->GetOrCreate({"vllm", "m", "0", {}});
  EngineSeries* c = reg->GetOrCreate({"vllm", "m", "1", {}});
  EngineSeries* d = reg->GetOrCreate({"vllm", "m", "0", {{"k", "v"}}});
  EngineSeries* e = reg->GetOrCreate({"sglang", "m", "0", {}});
  EngineSeries* f = reg->GetOrCreate({"vllm", "m2", "0", {}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_NE(a, e);
  EXPECT_NE(a, f);
  EXPECT_EQ(reg->series_count(), 5u);
}

TEST(RegistryTest, SeriesCapReturnsNullAndCounts) {
  RegistryOptions options;
  options.max_engine_series = 2;
  auto reg = MustCreate(options);
  EngineSeries* a = reg->GetOrCreate({"vllm", "m", "0", {}});
  EngineSeries* b = reg->GetOrCreate({"sglang", "m", "0", {}});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reg->GetOrCreate({"vllm", "m", "1", {}}), nullptr);
  EXPECT_EQ(reg->GetOrCreate({"vllm", "m", "2", {}}), nullptr);
  EXPECT_EQ(reg->series_rejected(), 2u);
  // Known identities still resolve.
  EXPECT_EQ(reg->GetOrCreate({"vllm", "m", "0", {}}), a);
  EXPECT_EQ(reg->series_rejected(), 2u);
  EXPECT_EQ(reg->series_count(), 2u);
}

// A snapshot's MoE layers count toward --max-moe-layers of the daemon that
// loads it, and its per-expert counts follow that daemon's
// --moe-expert-series: dropped without it, started at 0 with it.
TEST(RegistryTest, SnapshotMoeLayersFitTheLoadingOptions) {
  RegistryOptions with;
  with.moe_expert_series = true;
  auto saved = MustCreate(with);
  EngineSeries* a = saved->GetOrCreate({"vllm", "m", "0", {}});
  EngineSeries* b = saved->GetOrCreate({"vllm", "m", "1", {}});
  const uint64_t load[] = {4, 2};
  for (uint32_t layer : {0u, 1u, 2u}) {
    ASSERT_TRUE(saved->ReserveMoeLayer(2));
    ASSERT_TRUE(a->part<MoePart>().Add(layer, load, true));
  }
  ASSERT_TRUE(saved->ReserveMoeLayer(2));
  ASSERT_TRUE(b->part<MoePart>().Add(9, load, true));
  EXPECT_EQ(saved->moe_layers(), 4u);
  std::string bytes;
  StateWriter w(bytes);
  std::unordered_map<const EngineSeries*, uint32_t> index;
  saved->SaveState(w, &index);

  auto load_into = [&](const RegistryOptions& o, bool* ok) {
    auto reg = MustCreate(o);
    StateReader r(bytes.data(), bytes.size());
    std::vector<EngineSeries*> by_index;
    reg->LoadState(r, &by_index);
    *ok = r.ok() && r.at_end();
    return reg;
  };
  bool ok = false;
  auto same = load_into(with, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(same->moe_layers(), 4u);
  const EngineSeries* a2 = same->GetOrCreate({"vllm", "m", "0", {}});
  EXPECT_NE(a2->find_part<MoePart>()->FindLayer(2)->experts, nullptr);
  EXPECT_EQ(a2->find_part<MoePart>()->FindLayer(2)->experts[0], 4u);

  RegistryOptions without;
  auto plain = load_into(without, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(plain->moe_layers(), 4u);
  const EngineSeries* a3 = plain->GetOrCreate({"vllm", "m", "0", {}});
  const MoePart::Layer* l = a3->find_part<MoePart>()->FindLayer(2);
  EXPECT_EQ(l->experts, nullptr);
  EXPECT_EQ(l->expert_count, 2u);
  EXPECT_EQ(l->routed, 6u);
  // A cap one below what the snapshot holds refuses it, like a series
  // beyond --max-engine-series: three layers for four, or, with
  // --moe-expert-series, 9 series places for 2 series and 8 experts
  // (counted from the layers, whatever the snapshot's daemon counted). At
  // the cap it loads, full.
  RegistryOptions layers_below;
  layers_below.max_moe_layers = 3;
  RegistryOptions places_below = with;
  places_below.max_engine_series = 9;
  for (RegistryOptions o : {layers_below, places_below}) {
    load_into(o, &ok);
    EXPECT_FALSE(ok);
    if (o.moe_expert_series) {
      ++o.max_engine_series;
    } else {
      ++o.max_moe_layers;
    }
    auto full = load_into(o, &ok);
    EXPECT_TRUE(ok);
    EXPECT_FALSE(full->ReserveMoeLayer(1));
    EXPECT_EQ(full->series_rejected(), 1u);
    EXPECT_EQ(full->GetOrCreate({"vllm", "m", "2", {}}) == nullptr,
              o.moe_expert_series);
  }
  RegistryOptions loose = without;
  loose.max_engine_series = 3;  // without the option experts take none
  auto three_series = load_into(loose, &ok);
  EXPECT_TRUE(ok);
  EXPECT_NE(three_series->GetOrCreate({"vllm", "m", "2", {}}), nullptr);
}

TEST(RegistryTest, LabelTextIsEscapedInHelloOrder) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* s = reg->GetOrCreate(
      {"vllm", "m\"1", "dp\\0", {{"zone", "a\nb"}, {"app", "x"}}});
  EXPECT_EQ(s->label_text(),
            "model_name=\"m\\\"1\",engine=\"dp\\\\0\",zone=\"a\\nb\","
            "app=\"x\"");
}

// Two HELLOs whose labels differ only in order are one series: a real
// Prometheus would keep one of two samples with the same label set and
// silently drop the other engine's data.
TEST(RegistryTest, LabelOrderDoesNotMakeASecondSeries) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* ab =
      reg->GetOrCreate({"vllm", "m", "0", {{"a", "x"}, {"b", "y"}}});
  EngineSeries* ba =
      reg->GetOrCreate({"vllm", "m", "0", {{"b", "y"}, {"a", "x"}}});
  EXPECT_EQ(ab, ba);
  EXPECT_EQ(reg->series_count(), 1u);
  // Shown in the first HELLO's order; the identity is canonical.
  EXPECT_EQ(ab->label_text(), "model_name=\"m\",engine=\"0\",a=\"x\",b=\"y\"");
  EXPECT_EQ(ab->identity().labels, (LabelPairs{{"a", "x"}, {"b", "y"}}));
  EngineSeries* other =
      reg->GetOrCreate({"vllm", "m", "0", {{"b", "x"}, {"a", "y"}}});
  EXPECT_NE(other, ab);
  EXPECT_EQ(reg->series_count(), 2u);
}

// A counter that would pass 2^64 - 1 stays there: wrapping to a small
// value would read as a counter reset (and a huge negative rate).
TEST(RegistryTest, CountersSaturateInsteadOfWrapping) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  s->Add(kGenerationTokens, UINT64_MAX - 1);
  s->Add(kGenerationTokens, 5);
  EXPECT_EQ(s->count(kGenerationTokens), UINT64_MAX);
  s->Add(kGenerationTokens, 1);
  EXPECT_EQ(s->count(kGenerationTokens), UINT64_MAX);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 2, UINT64_MAX);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 2, 7);
  EXPECT_EQ(s->children(kSpecDecodeNumAcceptedTokensPerPos)[2], UINT64_MAX);
  s->Add(kPromptTokens, 3);  // others are untouched
  EXPECT_EQ(s->count(kPromptTokens), 3u);
}

TEST(RegistryTest, SanitizesNamespaces) {
  EXPECT_EQ(SanitizeNamespace("tokenmeter-engine"), "tokenmeter_engine");
  EXPECT_EQ(SanitizeNamespace("vllm"), "vllm");
  EXPECT_EQ(SanitizeNamespace("Eng_1"), "Eng_1");
  EXPECT_EQ(SanitizeNamespace("a.b/c:d é"), "a_b_c_d___");
}

TEST(RegistryTest, ClientDroppedSumsClientsOfOneIdentity) {
  auto reg = MustCreate(RegistryOptions{});
  IngestStats stats(*reg);
  stats.SetClientDropped("vllm", "m", "0", 1, 5);
  stats.SetClientDropped("vllm", "m", "0", 2, 7);
  stats.SetClientDropped("vllm", "m", "0", 1, 9);  // latest value wins
  std::string text;
  Render(*reg, ExpositionFormat::kText004, text);
  EXPECT_NE(text.find("tokenmeter_client_dropped_events_total{engine_family="
                      "\"vllm\",model_name=\"m\",engine=\"0\"} 16\n"),
            std::string::npos)
      << text;
}

// Clients of one identity come and go (every engine restart is a new pid):
// past the cap the least recently reporting one is folded into a retired
// total, so memory stays bounded and the counter never goes down.
TEST(RegistryTest, ClientDroppedMapIsCappedWithoutLosingCounts) {
  RegistryOptions options;
  options.max_engine_series = 2;
  auto reg = MustCreate(options);
  IngestStats stats(*reg);
  const size_t cap = IngestStats::kMaxClientsPerIdentity;
  uint64_t expected = 0;
  for (size_t pid = 1; pid <= 3 * cap; ++pid) {
    stats.SetClientDropped("vllm", "m", "0", int64_t(pid), 2);
    expected += 2;
  }
  stats.SetClientDropped("vllm", "m", "0", int64_t(3 * cap), 5);  // latest
  expected += 3;
  std::string text;
  Render(*reg, ExpositionFormat::kText004, text);
  EXPECT_NE(text.find("tokenmeter_client_dropped_events_total{engine_family="
                      "\"vllm\",model_name=\"m\",engine=\"0\"} " +
                      std::to_string(expected) + "\n"),
            std::string::npos)
      << text;
  // Identities are capped at the series cap; further ones are not kept.
  stats.SetClientDropped("vllm", "m", "1", 1, 1);
  stats.SetClientDropped("vllm", "m", "2", 1, 1);
  EXPECT_EQ(stats.drop_identities(), 2u);
}

TEST(RegistryTest, CollectorsOwnTheirFamiliesUntilTheyGo) {
  auto reg = MustCreate(RegistryOptions{});
  std::string text;
  {
    IngestStats stats(*reg);
    stats.CountFrame();
    Render(*reg, ExpositionFormat::kText004, text);
    EXPECT_NE(text.find("tokenmeter_ingest_frames_total 1\n"),
              std::string::npos);
    EXPECT_EQ(reg->collector(kIngestFrames), &stats);
  }
  EXPECT_EQ(reg->collector(kIngestFrames), nullptr);
  text.clear();
  Render(*reg, ExpositionFormat::kText004, text);
  EXPECT_EQ(text.find("tokenmeter_ingest_frames"), std::string::npos);
}

// ---- profiles and per-request labels
// ------------------------------------------

TEST(RegistryTest, OneNamespaceHoldsOneProfile) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* a = reg->GetOrCreate({"x", "m", "0", {}, Profile::kVllm});
  ASSERT_NE(a, nullptr);
  const SeriesIdentity other{"x", "m", "1", {}, Profile::kSglang};
  EXPECT_TRUE(reg->NamespaceConflict(other));
  EXPECT_EQ(reg->GetOrCreate(other), nullptr);
  // Not the series cap.
  EXPECT_EQ(reg->series_rejected(), 0u);
  EXPECT_EQ(reg->series_count(), 1u);
  // The same identity under the other profile is refused too.
  EXPECT_EQ(reg->GetOrCreate({"x", "m", "0", {}, Profile::kLmdeploy}), nullptr);
  // The profile it has, and other namespaces, are fine.
  EXPECT_FALSE(reg->NamespaceConflict({"x", "m", "2", {}, Profile::kVllm}));
  EXPECT_NE(reg->GetOrCreate({"x", "m", "2", {}, Profile::kVllm}), nullptr);
  EXPECT_FALSE(reg->NamespaceConflict({"y", "m", "0", {}, Profile::kSglang}));
  EXPECT_NE(reg->GetOrCreate({"y", "m", "0", {}, Profile::kSglang}), nullptr);
  EXPECT_EQ(reg->GetOrCreate({"x", "m", "0", {}, Profile::kVllm}), a);
  EXPECT_EQ(reg->series_count(), 3u);
}

TEST(RegistryTest, SeriesKeepTheirProfilesBuckets) {
  RegistryOptions options;
  options.buckets["request_queue_time_seconds"] = {1, 2};
  auto reg = MustCreate(options);
  for (Profile p : {Profile::kVllm, Profile::kSglang, Profile::kLmdeploy}) {
    SCOPED_TRACE(ProfileName(p));
    EngineSeries* s =
        reg->GetOrCreate({ProfileNamespace(p, "e", ""), "m", "0", {}, p});
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->profile(), p);
    for (int i = 0; i < kNumHistograms; ++i) {
      const EngineMetricDef& d = kEngineMetrics[kFirstHistogram + i];
      SCOPED_TRACE(d.suffix);
      // An override names the measurement and holds in every profile.
      const std::vector<double> want =
          d.id == kRequestQueueTime
              ? std::vector<double>{1, 2}
              : DefaultBuckets(ProfileBuckets(p, d.id), 32768);
      EXPECT_EQ(s->hist(d.id).layout().bounds(), want);
    }
  }
  EXPECT_EQ(ProfileBuckets(Profile::kSglang, kTimeToFirstToken),
            BucketSet::kSglangTtft);
  EXPECT_EQ(ProfileBuckets(Profile::kLmdeploy, kInterTokenLatency),
            BucketSet::kLmdeployItl);
  EXPECT_EQ(ProfileBuckets(Profile::kVllm, kTimeToFirstToken),
            BucketSet::kTtft);
}

// The bounds of profile p's layout of histogram m, on a series of p.
std::vector<double> ProfileBounds(Registry& reg, Profile p, EngineMetric m) {
  EngineSeries* s =
      reg.GetOrCreate({ProfileNamespace(p, "e", ""), "m", "0", {}, p});
  EXPECT_NE(s, nullptr);
  return s == nullptr ? std::vector<double>{} : s->hist(m).layout().bounds();
}

std::vector<double> Defaults(Profile p, EngineMetric m) {
  return DefaultBuckets(ProfileBuckets(p, m), 32768);
}

// A catalog name holds in every profile in the catalog's unit: SGLang's
// kv_transfer_latency_ms and kv_transfer_total_mb get the bounds in ms and
// MB (the observations are divided alike), printed as decimals.
TEST(RegistryTest, CatalogOverrideIsConvertedToAProfilesUnit) {
  RegistryOptions options;
  options.buckets["kv_transfer_time_seconds"] = {0.001, 0.5, 1.1, 30};
  options.buckets["kv_transfer_bytes"] = {1048576, 3 * 1048576.0, 1e9};
  auto reg = MustCreate(options);
  EXPECT_EQ(ProfileBounds(*reg, Profile::kVllm, kKvTransferTime),
            (std::vector<double>{0.001, 0.5, 1.1, 30}));
  EXPECT_EQ(ProfileBounds(*reg, Profile::kLmdeploy, kKvTransferBytes),
            (std::vector<double>{1048576, 3 * 1048576.0, 1e9}));
  EngineSeries* s =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->hist(kKvTransferTime).layout().le_text(),
            (std::vector<std::string>{"1", "500", "1100", "30000", "+Inf"}));
  EXPECT_EQ(s->hist(kKvTransferBytes).layout().le_text(),
            (std::vector<std::string>{"1", "3", "953.67431640625", "+Inf"}));
  // 15 ms lands in le="500" (ms), 3 MiB in le="3" (MB).
  s->hist(kKvTransferTime).Observe(15'000'000);
  EXPECT_EQ(s->hist(kKvTransferTime).counts(),
            (std::vector<uint64_t>{0, 1, 0, 0, 0}));
  s->hist(kKvTransferBytes).Observe(3 * 1048576);
  EXPECT_EQ(s->hist(kKvTransferBytes).counts(),
            (std::vector<uint64_t>{0, 1, 0, 0}));
}

// A profile's own name (after the namespace) is in that family's unit and
// holds in the profiles that expose a histogram under it, over the catalog
// name; a --legacy-names alias is no name of its own.
TEST(RegistryTest, ProfileOwnNameOverridesItsHistogram) {
  RegistryOptions options;
  options.buckets["kv_transfer_latency_ms"] = {3, 7};
  options.buckets["kv_transfer_time_seconds"] = {0.5};
  options.buckets["queue_time_seconds"] = {1, 2, 3};
  options.buckets["request_decode_time_seconds"] = {4, 5};
  options.buckets["time_per_output_token_seconds"] = {0.25};
  auto reg = MustCreate(options);
  const Profile v = Profile::kVllm, s = Profile::kSglang,
                l = Profile::kLmdeploy;
  EXPECT_EQ(ProfileBounds(*reg, s, kKvTransferTime),
            (std::vector<double>{3, 7}));
  EXPECT_EQ(ProfileBounds(*reg, v, kKvTransferTime),
            (std::vector<double>{0.5}));
  EXPECT_EQ(ProfileBounds(*reg, l, kKvTransferTime),
            (std::vector<double>{0.5}));
  // sglang:queue_time_seconds; vLLM's and LMDeploy's are
  // request_queue_time_seconds.
  EXPECT_EQ(ProfileBounds(*reg, s, kRequestQueueTime),
            (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(ProfileBounds(*reg, v, kRequestQueueTime),
            Defaults(v, kRequestQueueTime));
  EXPECT_EQ(ProfileBounds(*reg, l, kRequestQueueTime),
            Defaults(l, kRequestQueueTime));
  // request_decode_time_seconds: vLLM's measures to the last token,
  // LMDeploy's to FINISHED; both are that name.
  EXPECT_EQ(ProfileBounds(*reg, v, kRequestDecodeTime),
            (std::vector<double>{4, 5}));
  EXPECT_EQ(ProfileBounds(*reg, l, kRequestDecodeToFinish),
            (std::vector<double>{4, 5}));
  // lmdeploy:time_per_output_token_seconds; vLLM's deprecated alias of
  // inter_token_latency_seconds keeps that histogram's bounds.
  EXPECT_EQ(ProfileBounds(*reg, l, kTimePerOutputTokenChunk),
            (std::vector<double>{0.25}));
  EXPECT_EQ(ProfileBounds(*reg, v, kInterTokenLatency),
            Defaults(v, kInterTokenLatency));
}

// Each profile's own histogram names are distinct and name distinct
// histograms, so that an override by name picks one layout.
TEST(RegistryTest, ProfileHistogramNamesAreOneToOne) {
  for (Profile p : {Profile::kVllm, Profile::kSglang, Profile::kLmdeploy}) {
    SCOPED_TRACE(ProfileName(p));
    std::vector<std::string_view> names;
    std::vector<EngineMetric> metrics;
    for (const FamilyDef& f : ProfileFamilies(p)) {
      if (f.type != MetricType::kHistogram || f.legacy) continue;
      if (f.source != FamilySource::kMetric && f.source != FamilySource::kPart)
        continue;
      for (size_t i = 0; i < names.size(); ++i) {
        EXPECT_NE(names[i], FamilyName(f));
        EXPECT_NE(metrics[i], f.metric) << FamilyName(f);
      }
      names.push_back(FamilyName(f));
      metrics.push_back(f.metric);
    }
  }
}

TEST(RegistryTest, ProfileNamesAndNamespaces) {
  EXPECT_EQ(ParseProfile("vllm"), Profile::kVllm);
  EXPECT_EQ(ParseProfile("sglang"), Profile::kSglang);
  EXPECT_EQ(ParseProfile("lmdeploy"), Profile::kLmdeploy);
  EXPECT_EQ(ParseProfile("auto"), std::nullopt);
  EXPECT_EQ(ParseProfile("SGLang"), std::nullopt);
  EXPECT_EQ(AutoProfile("sglang"), Profile::kSglang);
  EXPECT_EQ(AutoProfile("lmdeploy"), Profile::kLmdeploy);
  EXPECT_EQ(AutoProfile("vllm"), Profile::kVllm);
  EXPECT_EQ(AutoProfile("sglang-router"), Profile::kVllm);
  EXPECT_EQ(ProfileNamespace(Profile::kVllm, "tokenmeter-engine", ""),
            "tokenmeter_engine");
  EXPECT_EQ(ProfileNamespace(Profile::kSglang, "my-engine", ""), "sglang");
  EXPECT_EQ(ProfileNamespace(Profile::kLmdeploy, "x", ""), "lmdeploy");
  EXPECT_EQ(ProfileNamespace(Profile::kSglang, "x", "fleet"), "fleet");
}

TEST(RegistryTest, RejectsBadRequestLabelOptions) {
  struct Case {
    const char* name;
    std::vector<std::string> labels;
    size_t values;
  };
  const Case cases[] = {
      {"five labels", {"a", "b", "c", "d", "e"}, 100},
      {"no values", {"a"}, 0},
      {"65534 values", {"a"}, 65534},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RegistryOptions options;
    options.request_labels = c.labels;
    options.request_label_values = c.values;
    std::unique_ptr<Registry> reg;
    const Status s = Registry::Create(options, &reg);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--request-label"), std::string::npos)
        << s.message();
  }
  RegistryOptions edge;
  edge.request_labels = {"a", "b", "c", "d"};
  edge.request_label_values = 65533;
  MustCreate(edge);
}

TEST(RegistryTest, OverflowFamilyOnlyWithRequestLabels) {
  auto plain = MustCreate(RegistryOptions{});
  EXPECT_EQ(plain->collector(kRequestLabelOverflow), nullptr);
  RegistryOptions options;
  options.request_labels = {"tenant", "tier"};
  auto reg = MustCreate(options);
  ASSERT_NE(reg->collector(kRequestLabelOverflow), nullptr);
  reg->request_labels().CountOverflow(1);
  std::string text;
  Render(*reg, ExpositionFormat::kText004, text);
  EXPECT_NE(text.find("tokenmeter_request_label_overflow_total{label="
                      "\"tenant\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tokenmeter_request_label_overflow_total{label="
                      "\"tier\"} 1\n"),
            std::string::npos);
}

TEST(RequestLabelsTest, InternsValuesAndAdapters) {
  RequestLabels labels({"tenant", "tier"}, 100);
  EXPECT_TRUE(labels.enabled());
  EXPECT_EQ(labels.Intern(0, ""), RequestLabels::kEmpty);
  const uint16_t a = labels.Intern(0, "a");
  EXPECT_GE(a, 2u);
  EXPECT_EQ(labels.Intern(0, "a"), a);
  EXPECT_EQ(labels.Find(0, "a"), a);
  EXPECT_EQ(labels.Find(0, ""), RequestLabels::kEmpty);
  EXPECT_EQ(labels.Find(0, "b"), std::nullopt);
  EXPECT_EQ(labels.Find(1, "a"), std::nullopt);  // per label
  EXPECT_EQ(labels.Value(0, a), "a");
  EXPECT_EQ(labels.Value(0, RequestLabels::kEmpty), "");
  EXPECT_EQ(labels.Value(1, RequestLabels::kOther), "__other__");
  const LabelKey key = RequestLabels::Pack(RequestLabels::Pack(0, 0, a), 1, 7);
  EXPECT_EQ(RequestLabels::Unpack(key, 0), a);
  EXPECT_EQ(RequestLabels::Unpack(key, 1), 7u);
  EXPECT_EQ(RequestLabels::Unpack(RequestLabels::Pack(key, 0, 3), 0), 3u);
  EXPECT_EQ(RequestLabels::Unpack(RequestLabels::Pack(key, 0, 3), 1), 7u);
  EXPECT_EQ(labels.InternLora(""), 0u);
  const uint16_t x = labels.InternLora("x");
  EXPECT_NE(x, 0u);
  EXPECT_EQ(labels.InternLora("x"), x);
  EXPECT_NE(labels.InternLora("y"), x);
  EXPECT_EQ(labels.LoraName(x), "x");
  EXPECT_FALSE(RequestLabels({}, 100).enabled());
}

// A saved value that this daemon keeps at a fixed id ("__other__"; "0" of
// the priority label with --priority-label) would make a second sample
// with the same labels: the load fails (the snapshot is set aside).
TEST(RequestLabelsTest, LoadRefusesValuesKeptAtAFixedId) {
  const auto state = [](std::string_view value) {
    std::string bytes;
    StateWriter w(bytes);
    w.U64(1);  // one value after "" and __other__
    w.Str(value);
    w.U64s({0});  // overflow
    w.U64(0);     // loras
    w.U64(0);     // sets
    return bytes;
  };
  const auto loads = [](RequestLabels& labels, const std::string& bytes) {
    StateReader r(bytes.data(), bytes.size());
    labels.LoadState(r);
    return r.ok() && r.at_end();
  };
  RequestLabels tenant({"tenant"}, 100);
  EXPECT_FALSE(loads(tenant, state("__other__")));
  RequestLabels tenant2({"tenant"}, 100);
  EXPECT_TRUE(loads(tenant2, state("0")));
  EXPECT_EQ(tenant2.Find(0, "0"), 2u);
  RequestLabels priority({"priority"}, 100, /*last_is_priority=*/true);
  EXPECT_FALSE(loads(priority, state("0")));
  RequestLabels priority2({"priority"}, 100, /*last_is_priority=*/true);
  EXPECT_TRUE(loads(priority2, state("3")));
  EXPECT_EQ(priority2.Find(0, "3"), 2u);
}

TEST(EngineSeriesTest, CellsByLabelKeyWithinTheCap) {
  RegistryOptions options;
  options.request_labels = {"tenant"};
  options.request_label_values = 1;
  auto reg = MustCreate(options);
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {{"k", "v"}}});
  EXPECT_EQ(&s->Cell(0), static_cast<SeriesValues*>(s));
  EXPECT_EQ(s->base_label_text(),
            "model_name=\"m\",engine=\"0\",k=\"v\","
            "tenant=\"\"");
  EXPECT_EQ(s->label_text(), "model_name=\"m\",engine=\"0\",k=\"v\"");
  RequestLabels& labels = reg->request_labels();
  const uint16_t a = labels.Intern(0, "a");
  const uint16_t b = labels.Intern(0, "b");
  EXPECT_TRUE(s->Admit(0, a));
  EXPECT_TRUE(s->Admit(0, a));
  EXPECT_FALSE(s->Admit(0, b));
  EXPECT_TRUE(s->Admit(0, RequestLabels::kOther));
  EXPECT_TRUE(s->Admit(0, RequestLabels::kEmpty));
  SeriesValues& ca = s->Cell(RequestLabels::Pack(0, 0, a));
  EXPECT_EQ(&s->Cell(RequestLabels::Pack(0, 0, a)), &ca);
  // A value with no place here (admitted by another series) is __other__.
  SeriesValues& cb = s->Cell(RequestLabels::Pack(0, 0, b));
  EXPECT_EQ(&s->Cell(RequestLabels::Pack(0, 0, RequestLabels::kOther)), &cb);
  EXPECT_EQ(&s->Cell(RequestLabels::Pack(0, 0, b)), &cb);
  ASSERT_EQ(s->cells().size(), 2u);
  EXPECT_EQ(s->cells()[0].label_text,
            "model_name=\"m\",engine=\"0\",k=\"v\",tenant=\"a\"");
  EXPECT_EQ(s->cells()[1].label_text,
            "model_name=\"m\",engine=\"0\",k=\"v\",tenant=\"__other__\"");
  EXPECT_EQ(s->cells()[1].label_pairs.back(),
            (std::pair<std::string, std::string>{"tenant", "__other__"}));
}

TEST(EngineSeriesTest, MaxLoraAndCacheConfigLabels) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {{"k", "v"}}});
  EXPECT_EQ(s->find_part<LoraPart>()->max_lora(), "0");
  s->part<LoraPart>().SetMaxLora(16);
  EXPECT_EQ(s->find_part<LoraPart>()->max_lora(), "16");
  EXPECT_EQ(s->find_part<CacheConfigPart>(), nullptr);
  s->part<CacheConfigPart>().Set(
      {{"block_size", "16", 16}, {"x", "a\"b", std::nan("")}});
  EXPECT_NE(s->find_part<CacheConfigPart>(), nullptr);
  EXPECT_EQ(s->find_part<CacheConfigPart>()->info_text(),
            "model_name=\"m\",engine=\"0\",k=\"v\",block_size=\"16\","
            "x=\"a\\\"b\"");
  EXPECT_EQ(s->find_part<CacheConfigPart>()->info_pairs().back().second,
            "a\"b");
}

}  // namespace
}  // namespace tokenmeter::daemon
