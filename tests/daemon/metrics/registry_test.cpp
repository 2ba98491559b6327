// Registry: option checks (bucket overrides), series identities and the
// series cap.
#include "daemon/metrics/registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

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
  EXPECT_EQ(reg->counters().series_rejected, 2u);
  // Known identities still resolve.
  EXPECT_EQ(reg->GetOrCreate({"vllm", "m", "0", {}}), a);
  EXPECT_EQ(reg->counters().series_rejected, 2u);
  EXPECT_EQ(reg->series_count(), 2u);
}

TEST(RegistryTest, LabelTextIsEscapedInHelloOrder) {
  auto reg = MustCreate(RegistryOptions{});
  EngineSeries* s = reg->GetOrCreate(
      {"vllm", "m\"1", "dp\\0", {{"zone", "a\nb"}, {"app", "x"}}});
  EXPECT_EQ(s->label_text,
            "model_name=\"m\\\"1\",engine=\"dp\\\\0\",zone=\"a\\nb\","
            "app=\"x\"");
}

TEST(RegistryTest, SanitizesNamespaces) {
  EXPECT_EQ(SanitizeNamespace("tokenmeter-engine"), "tokenmeter_engine");
  EXPECT_EQ(SanitizeNamespace("vllm"), "vllm");
  EXPECT_EQ(SanitizeNamespace("Eng_1"), "Eng_1");
  EXPECT_EQ(SanitizeNamespace("a.b/c:d é"), "a_b_c_d___");
}

TEST(RegistryTest, ClientDroppedSumsClientsOfOneIdentity) {
  auto reg = MustCreate(RegistryOptions{});
  reg->SetClientDropped("vllm", "m", "0", 1, 5);
  reg->SetClientDropped("vllm", "m", "0", 2, 7);
  reg->SetClientDropped("vllm", "m", "0", 1, 9);  // latest value wins
  std::string text;
  reg->Render(ExpositionFormat::kText004, text);
  EXPECT_NE(text.find("tokenmeter_client_dropped_events_total{engine_family="
                      "\"vllm\",model_name=\"m\",engine=\"0\"} 16\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace tokenmeter::daemon
