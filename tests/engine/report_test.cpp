#include "engine/report.h"

#include <gtest/gtest.h>

#include <clocale>

namespace tokenmeter::engine {
namespace {

constexpr uint64_t kMs = 1'000'000;

TEST(SummaryTest, EmptyHasZeroes) {
  std::vector<double> v;
  const Summary s = Summarize(v);
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.sum, 0.0);
  EXPECT_EQ(s.p50, 0.0);
  EXPECT_EQ(s.p99, 0.0);
}

TEST(SummaryTest, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // 1..100, unsorted
  const Summary s = Summarize(v);
  EXPECT_EQ(s.count, 100u);
  EXPECT_EQ(s.sum, 5050.0);
  EXPECT_EQ(s.p50, 50.0);
  EXPECT_EQ(s.p99, 99.0);
}

TEST(SummaryTest, SmallSets) {
  std::vector<double> one = {3.5};
  Summary s = Summarize(one);
  EXPECT_EQ(s.p50, 3.5);
  EXPECT_EQ(s.p99, 3.5);
  std::vector<double> three = {3, 1, 2};
  s = Summarize(three);
  EXPECT_EQ(s.p50, 2.0);
  EXPECT_EQ(s.p99, 3.0);
}

// One request, the daemon's own hand-written example
// (tests/e2e/daemon_e2e_test.py): the same intervals to the nanosecond.
TEST(RecorderTest, ComputesTheDaemonsIntervals) {
  const uint64_t t0 = 1'000'000 * kMs;
  Recorder rec(1);
  rec.Arrived(0, t0, 100);
  rec.Queued(0, t0 + 1 * kMs + 1);
  rec.Scheduled(0, t0 + 3 * kMs + 2);
  rec.Tokens(0, t0 + 10 * kMs + 3, 1);
  rec.Tokens(0, t0 + 25 * kMs + 5, 2);
  rec.Tokens(0, t0 + 40 * kMs + 8, 1);
  rec.Finished(0, t0 + 41 * kMs + 13, Finish::kStop);
  const Report r = rec.Build("cpu", true, 0);
  EXPECT_EQ(r.requests, 1u);
  EXPECT_EQ(r.finished_stop, 1u);
  EXPECT_EQ(r.prompt_tokens, 100u);
  EXPECT_EQ(r.generation_tokens, 4u);
  EXPECT_EQ(r.ttft.sum, (10 * kMs + 3) / 1e9);
  EXPECT_EQ(r.itl.count, 2u);
  EXPECT_DOUBLE_EQ(r.itl.sum, (30 * kMs + 5) / 1e9);
  EXPECT_EQ(r.e2e.sum, (41 * kMs + 13) / 1e9);
  EXPECT_EQ(r.queue.sum, (2 * kMs + 1) / 1e9);
  EXPECT_EQ(r.prefill.sum, (7 * kMs + 1) / 1e9);
  EXPECT_EQ(r.decode.sum, (30 * kMs + 5) / 1e9);
  EXPECT_EQ(r.inference.sum, (37 * kMs + 6) / 1e9);
  EXPECT_DOUBLE_EQ(r.tpot.sum, (30 * kMs + 5) / 3.0 / 1e9);
  EXPECT_DOUBLE_EQ(r.duration_s, (41 * kMs + 13) / 1e9);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 4 / r.duration_s);
}

TEST(RecorderTest, ScheduledAgainAfterPreemptionKeepsTheFirstTime) {
  Recorder rec(1);
  rec.Arrived(0, 10 * kMs, 5);
  rec.Queued(0, 10 * kMs);
  rec.Scheduled(0, 12 * kMs);
  rec.Preempted();
  rec.Scheduled(0, 50 * kMs);
  rec.Tokens(0, 60 * kMs, 1);
  rec.Finished(0, 60 * kMs, Finish::kLength);
  const Report r = rec.Build("cpu", false, 0);
  EXPECT_EQ(r.queue.sum, 2 * kMs / 1e9);
  EXPECT_EQ(r.prefill.sum, 48 * kMs / 1e9);
  EXPECT_EQ(r.preemptions, 1u);
  EXPECT_EQ(r.finished_length, 1u);
  EXPECT_EQ(r.tpot.count, 0u);  // one token: no time per output token
  EXPECT_EQ(r.decode.count, 1u);
  EXPECT_EQ(r.decode.sum, 0.0);
}

TEST(RecorderTest, SumsOverRequestsAndCountsFinishReasons) {
  Recorder rec(3);
  for (size_t i = 0; i < 3; ++i) {
    const uint64_t a = (i + 1) * 100 * kMs;
    rec.Arrived(i, a, 10);
    rec.Queued(i, a);
    rec.Scheduled(i, a + kMs);
    rec.Tokens(i, a + 2 * kMs, 1);
    rec.Tokens(i, a + 4 * kMs, 1);
    rec.Finished(i, a + 4 * kMs, i == 0 ? Finish::kStop : Finish::kLength);
  }
  const Report r = rec.Build("cpu", true, 5);
  EXPECT_EQ(r.requests, 3u);
  EXPECT_EQ(r.finished_stop, 1u);
  EXPECT_EQ(r.finished_length, 2u);
  EXPECT_EQ(r.prompt_tokens, 30u);
  EXPECT_EQ(r.generation_tokens, 6u);
  EXPECT_EQ(r.ttft.count, 3u);
  EXPECT_DOUBLE_EQ(r.ttft.sum, 3 * 0.002);
  EXPECT_EQ(r.itl.count, 3u);
  EXPECT_DOUBLE_EQ(r.itl.p50, 0.002);
  EXPECT_DOUBLE_EQ(r.duration_s, 0.304 - 0.1);
  EXPECT_EQ(r.client_dropped_events, 5u);
}

TEST(ReportJsonTest, HasTheFixedKeysInOrder) {
  Report r;
  r.client_events_sent = 7;
  r.client_reconnects = 2;
  r.client_events_rejected = 3;
  r.requests = 2;
  r.finished_stop = 1;
  r.finished_length = 1;
  r.ttft = {2, 0.25, 0.1, 0.15};
  r.backend = "cpu";
  r.metrics = true;
  const std::string j = ReportJson(r);
  const char* keys[] = {"\"requests\": 2",
                        "\"finished\": {\"stop\": 1, \"length\": 1}",
                        "\"prompt_tokens\"",
                        "\"generation_tokens\"",
                        "\"duration_s\"",
                        "\"output_tokens_per_s\"",
                        "\"ttft_s\": {\"count\": 2, \"sum\": 0.25, "
                        "\"p50\": 0.1, \"p99\": 0.15}",
                        "\"itl_s\"",
                        "\"e2e_s\"",
                        "\"queue_s\"",
                        "\"prefill_s\"",
                        "\"decode_s\"",
                        "\"inference_s\"",
                        "\"tpot_s\"",
                        "\"backend\": \"cpu\"",
                        "\"metrics\": true",
                        "\"client_dropped_events\": 0",
                        "\"client_events_sent\": 7",
                        "\"client_reconnects\": 2",
                        "\"client_events_rejected\": 3"};
  size_t at = 0;
  for (const char* k : keys) {
    const size_t found = j.find(k, at);
    ASSERT_NE(found, std::string::npos) << k << " in " << j;
    at = found;
  }
}

TEST(ReportJsonTest, NumbersIgnoreTheLocale) {
  // A locale with a decimal comma, when the system has one.
  const char* old = std::setlocale(LC_NUMERIC, nullptr);
  const std::string saved = old != nullptr ? old : "C";
  std::setlocale(LC_NUMERIC, "de_DE.UTF-8");
  Report r;
  r.duration_s = 1.5;
  const std::string j = ReportJson(r);
  std::setlocale(LC_NUMERIC, saved.c_str());
  EXPECT_NE(j.find("\"duration_s\": 1.5"), std::string::npos) << j;
}

TEST(ReportJsonTest, DoublesRoundTrip) {
  Report r;
  r.itl.sum = 136.96624295000595;
  const std::string j = ReportJson(r);
  EXPECT_NE(j.find("136.96624295000595"), std::string::npos) << j;
}

TEST(RecorderTest, CountsPerAdapterAndPerTenant) {
  Recorder rec(5, /*num_adapters=*/3, /*num_tenants=*/2);
  // request: adapter, tenant, prompt, tokens, reason
  struct R {
    int32_t lora, tenant;
    uint32_t prompt, tokens;
    Finish reason;
  };
  const R reqs[] = {{0, 0, 10, 3, Finish::kStop},
                    {0, 1, 20, 4, Finish::kLength},
                    {2, 1, 30, 1, Finish::kLength},
                    {-1, 0, 40, 2, Finish::kStop},
                    {2, -1, 50, 0, Finish::kNone}};  // never got a token
  for (size_t i = 0; i < 5; ++i) {
    const R& q = reqs[i];
    rec.Arrived(i, kMs, q.prompt);
    rec.Groups(i, q.lora, q.tenant);
    rec.Queued(i, kMs);
    rec.Scheduled(i, 2 * kMs);
    for (uint32_t k = 0; k < q.tokens; ++k) rec.Tokens(i, (3 + k) * kMs, 1);
    if (q.reason != Finish::kNone) rec.Finished(i, 9 * kMs, q.reason);
  }
  rec.LoraLoaded(0, false);
  rec.LoraLoaded(2, false);
  rec.LoraLoaded(0, true);
  rec.Step(0, 0, 7);
  rec.Step(0, 0, 2);
  const Report r = rec.Build("cpu", true, 0);
  // name, requests, stop, length, prompt tokens, generation tokens, loads.
  // The unfinished request counts nowhere; neither does its prompt (no
  // first token).
  const std::vector<GroupCounts> adapters = {{"lora-0", 2, 1, 1, 30, 7, 2},
                                             {"lora-1", 0, 0, 0, 0, 0, 0},
                                             {"lora-2", 1, 0, 1, 30, 1, 1}};
  const std::vector<GroupCounts> tenants = {{"tenant-0", 2, 2, 0, 50, 5, 0},
                                            {"tenant-1", 2, 0, 2, 50, 5, 0}};
  EXPECT_EQ(r.lora_adapters, adapters);
  EXPECT_EQ(r.tenants, tenants);
  EXPECT_EQ(r.lora_loads, 3u);
  EXPECT_EQ(r.lora_evictions, 1u);
  EXPECT_EQ(r.lora_skips, 9u);
  // The totals are unchanged by the groups.
  EXPECT_EQ(r.requests, 4u);
  EXPECT_EQ(r.prompt_tokens, 100u);
  EXPECT_EQ(r.generation_tokens, 10u);
}

TEST(ReportJsonTest, AdaptersAndTenantsFollowTheExistingKeys) {
  Report r;
  r.lora_loads = 3;
  r.lora_evictions = 1;
  r.lora_skips = 9;
  r.lora_adapters = {{"lora-0", 2, 1, 1, 30, 7, 2},
                     {"lora-1", 0, 0, 0, 0, 0, 0}};
  r.tenants = {{"tenant-0", 0, 1, 1, 30, 7, 0}};
  const std::string j = ReportJson(r);
  const char* keys[] = {
      "\"process_cpu_s\"",
      "\"lora_loads\": 3, \"lora_evictions\": 1, \"lora_skips\": 9",
      "\"lora_adapters\": {",
      "\"lora-0\": {\"requests\": 2, \"finished\": {\"stop\": 1, "
      "\"length\": 1}, \"prompt_tokens\": 30, \"generation_tokens\": 7, "
      "\"loads\": 2}",
      "\"lora-1\": {\"requests\": 0,",
      "\"tenants\": {",
      "\"tenant-0\": {\"requests\": 0, \"finished\": {\"stop\": 1, "
      "\"length\": 1}, \"prompt_tokens\": 30, \"generation_tokens\": 7}}"};
  size_t at = 0;
  for (const char* k : keys) {
    const size_t found = j.find(k, at);
    ASSERT_NE(found, std::string::npos) << k << " in " << j;
    at = found;
  }
  // Without adapters or tenants the objects are empty.
  const std::string empty = ReportJson(Report());
  EXPECT_NE(empty.find("\"lora_adapters\": {},"), std::string::npos) << empty;
  EXPECT_NE(empty.find("\"tenants\": {}}"), std::string::npos) << empty;
}

TEST(ReportJsonTest, MoeCountsCloseTheReportAsLists) {
  Report r;
  r.moe_experts = 3;
  r.moe_top_k = 2;
  r.moe_expert_load_events = 4;
  r.moe_routed_tokens = {10, 12};
  r.moe_expert_tokens = {{5, 0, 5}, {4, 4, 4}};
  const std::string j = ReportJson(r);
  EXPECT_NE(j.find("\"tenants\": {},\n \"moe_experts\": 3, \"moe_top_k\": 2, "
                   "\"moe_expert_load_events\": 4,\n \"moe_routed_tokens\": "
                   "[10, 12],\n \"moe_expert_tokens\": [\n  [5, 0, 5],\n  "
                   "[4, 4, 4]]}\n"),
            std::string::npos)
      << j;
  // A dense run has none of the keys.
  EXPECT_EQ(ReportJson(Report()).find("moe_"), std::string::npos);
}

}  // namespace
}  // namespace tokenmeter::engine
