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
                        "\"finished\": {\"stop\": 1, \"length\": 1, "
                        "\"error\": 0}",
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
      "\"length\": 1, \"error\": 0}, \"prompt_tokens\": 30, "
      "\"generation_tokens\": 7, \"loads\": 2}",
      "\"lora-1\": {\"requests\": 0,",
      "\"tenants\": {",
      "\"tenant-0\": {\"requests\": 0, \"finished\": {\"stop\": 1, "
      "\"length\": 1, \"error\": 0}, \"prompt_tokens\": 30, "
      "\"generation_tokens\": 7}}"};
  size_t at = 0;
  for (const char* k : keys) {
    const size_t found = j.find(k, at);
    ASSERT_NE(found, std::string::npos) << k << " in " << j;
    at = found;
  }
  // Without adapters or tenants the objects are empty.
  const std::string empty = ReportJson(Report());
  EXPECT_NE(empty.find("\"lora_adapters\": {},"), std::string::npos) << empty;
  EXPECT_NE(empty.find("\"tenants\": {},"), std::string::npos) << empty;
}

TEST(ReportJsonTest, MoeCountsCloseTheReportAsLists) {
  Report r;
  r.moe_experts = 3;
  r.moe_top_k = 2;
  r.moe_expert_load_events = 4;
  r.moe_routed_tokens = {10, 12};
  r.moe_expert_tokens = {{5, 0, 5}, {4, 4, 4}};
  const std::string j = ReportJson(r);
  EXPECT_NE(
      j.find("\"traceparents\": 0,\n \"moe_experts\": 3, \"moe_top_k\": 2, "
             "\"moe_expert_load_events\": 4,\n \"moe_routed_tokens\": "
             "[10, 12],\n \"moe_expert_tokens\": [\n  [5, 0, 5],\n  "
             "[4, 4, 4]]}\n"),
      std::string::npos)
      << j;
  // A dense run has none of the keys.
  EXPECT_EQ(ReportJson(Report()).find("moe_"), std::string::npos);
}

// The decode side of a disaggregated request and its neighbours: prompt
// tokens by source at the first token, kv wait from the first successful
// recv, per-request preemptions and computed tokens at FINISHED, an error
// finish.
TEST(RecorderTest, ComputesTheProtocolTwelveFigures) {
  Recorder rec(4);
  // 0: 100 prompt tokens, 16 from the local cache, 83 received; its first
  // recv failed, the second succeeded.
  rec.Arrived(0, 10 * kMs, 100);
  rec.Queued(0, 10 * kMs);
  rec.Scheduled(0, 12 * kMs, 16, 83);
  rec.Scheduled(0, 13 * kMs, 0, 0);  // a later SCHEDULED changes nothing
  rec.KvTransfer(0, true, 12 * kMs, 15 * kMs, 4096, 6, false, "checksum");
  rec.KvTransfer(0, true, 15 * kMs, 19 * kMs, 4096, 6, true, "");
  rec.KvTransfer(0, true, 19 * kMs, 20 * kMs, 8, 1, true, "");  // not first
  rec.Tokens(0, 21 * kMs, 1);
  rec.Preempted(0);
  rec.Preempted(0);
  rec.Tokens(0, 30 * kMs, 1);
  rec.Finished(0, 30 * kMs, Finish::kLength);
  // 1: every recv failed; ends with an error, never a token.
  rec.Arrived(1, 10 * kMs, 50);
  rec.Queued(1, 10 * kMs);
  rec.Scheduled(1, 11 * kMs, 0, 49);
  rec.KvTransfer(1, true, 11 * kMs, 14 * kMs, 100, 2, false, "");
  rec.Finished(1, 14 * kMs, Finish::kError);
  // 2: all local, 8 cached; 3: never finishes.
  rec.Arrived(2, 10 * kMs, 20);
  rec.Scheduled(2, 11 * kMs, 8, 0);
  rec.Tokens(2, 12 * kMs, 1);
  rec.Finished(2, 12 * kMs, Finish::kStop);
  rec.Arrived(3, 10 * kMs, 30);
  rec.Scheduled(3, 11 * kMs, 0, 29);
  rec.Tokens(3, 12 * kMs, 1);
  rec.Rejected("queue_full");
  rec.Rejected("deadline");
  rec.Rejected("queue_full");
  rec.Handoff();
  rec.Traced();
  rec.LastStep(2, 5, 3, 0.25);
  const Report r = rec.Build("cpu", true, 0);

  EXPECT_EQ(r.requests, 3u);
  EXPECT_EQ(r.finished_error, 1u);
  // At the first token: requests 0, 2 and 3.
  EXPECT_EQ(r.prompt_tokens, 150u);
  EXPECT_EQ(r.prompt_local_cache_hit, 24u);
  EXPECT_EQ(r.prompt_external_kv, 112u);
  EXPECT_EQ(r.prompt_local_compute, 1u + 12u + 1u);
  // At FINISHED: requests 0, 1 and 2.
  EXPECT_EQ(r.prefill_kv_computed_tokens.count, 3u);
  EXPECT_EQ(r.prefill_kv_computed_tokens.sum, 1.0 + 1.0 + 12.0);
  EXPECT_EQ(r.num_preemptions_per_request.count, 3u);
  EXPECT_EQ(r.num_preemptions_per_request.sum, 2.0);
  EXPECT_EQ(r.preemptions, 2u);
  // The first successful recv's end minus the first SCHEDULED.
  EXPECT_EQ(r.kv_wait.count, 1u);
  EXPECT_EQ(r.kv_wait.sum, 7 * kMs / 1e9);
  EXPECT_EQ(r.kv_recv.count, 4u);
  EXPECT_EQ(r.kv_recv.bytes, 4096u + 4096u + 8u + 100u);
  EXPECT_EQ(r.kv_recv.blocks, 15u);
  EXPECT_DOUBLE_EQ(r.kv_recv.time_s.sum, (3 + 4 + 1 + 3) * kMs / 1e9);
  const std::vector<std::pair<std::string, uint64_t>> failures = {
      {"checksum", 1}, {"error", 1}};  // no reason: the daemon's default
  EXPECT_EQ(r.kv_recv.failures, failures);
  EXPECT_EQ(r.kv_send.count, 0u);
  const std::vector<std::pair<std::string, uint64_t>> rejections = {
      {"deadline", 1}, {"queue_full", 2}};
  EXPECT_EQ(r.admission_rejections, rejections);
  EXPECT_EQ(r.kv_handoffs, 1u);
  EXPECT_EQ(r.traceparents, 1u);
  EXPECT_EQ(r.last_step.running, 2u);
  EXPECT_EQ(r.last_step.waiting, 5u);
  EXPECT_EQ(r.last_step.waiting_deferred, 3u);
  EXPECT_EQ(r.last_step.kv_usage, 0.25);
  EXPECT_TRUE(r.priorities.empty());
}

TEST(RecorderTest, SleepKeepsTheStateAndTheTimeAsleep) {
  Recorder rec(1);
  Report r = rec.Build("cpu", true, 0);
  EXPECT_EQ(r.sleep.transitions, 0u);  // never sent: awake
  EXPECT_EQ(r.sleep.scheduler, "running");
  EXPECT_EQ(r.sleep.kv_cache, "resident");
  rec.Sleep(100 * kMs, "paused", "resident", "released", 4);
  r = rec.Build("cpu", true, 0);
  EXPECT_EQ(r.sleep.transitions, 1u);
  EXPECT_EQ(r.sleep.scheduler, "paused");
  EXPECT_EQ(r.sleep.kv_cache, "released");
  EXPECT_EQ(r.sleep.asleep_s, 0.0);  // still asleep: not counted yet
  rec.Sleep(350 * kMs, "running", "resident", "resident", 0);
  r = rec.Build("cpu", true, 0);
  EXPECT_EQ(r.sleep.transitions, 2u);
  EXPECT_EQ(r.sleep.scheduler, "running");
  EXPECT_EQ(r.sleep.weights, "resident");
  EXPECT_EQ(r.sleep.kv_cache, "resident");
  EXPECT_EQ(r.sleep.asleep_s, 250 * kMs / 1e9);
  EXPECT_EQ(r.sleep.preempted, 4u);
}

TEST(RecorderTest, CountsPerVllmPriorityBucket) {
  Recorder rec(6);
  rec.EnablePriorities();
  const int32_t priorities[] = {-5, -2, -1, 0, 1, 9};
  for (size_t i = 0; i < 6; ++i) {
    rec.Arrived(i, kMs, 10);
    rec.Priority(i, priorities[i]);
    rec.Scheduled(i, 2 * kMs);
    rec.Tokens(i, 3 * kMs, 1);
    rec.Finished(i, 3 * kMs, i == 5 ? Finish::kStop : Finish::kLength);
  }
  const Report r = rec.Build("cpu", true, 0);
  ASSERT_EQ(r.priorities.size(), 5u);
  const uint64_t want[] = {2, 1, 1, 1, 1};
  for (size_t b = 0; b < 5; ++b) {
    EXPECT_EQ(r.priorities[b].name, kPriorityBuckets[b]);
    EXPECT_EQ(r.priorities[b].requests, want[b]) << kPriorityBuckets[b];
    EXPECT_EQ(r.priorities[b].prompt_tokens, 10 * want[b]);
  }
  EXPECT_EQ(r.priorities[4].finished_stop, 1u);
  EXPECT_EQ(PriorityBucket(INT32_MIN), 0u);
  EXPECT_EQ(PriorityBucket(INT32_MAX), 4u);
}

TEST(ReportJsonTest, ProtocolTwelveFiguresFollowTheTenants) {
  Report r;
  r.role = "decode";
  r.engine_name = "tokenmeter-engine";
  r.model_name = "m";
  r.instance = "decode";
  r.labels = {{"kv_role", "kv_consumer"}};
  r.admission_rejections = {{"queue_full", 3}};
  r.prompt_local_compute = 4;
  r.prompt_local_cache_hit = 16;
  r.prompt_external_kv = 80;
  r.kv_recv.count = 2;
  r.kv_recv.failures = {{"checksum", 1}};
  r.kv_recv.bytes = 1024;
  r.kv_recv.blocks = 4;
  r.kv_recv.time_s = {2, 0.5, 0.2, 0.3};
  r.kv_wait = {1, 0.3, 0.3, 0.3};
  r.kv_handoffs = 1;
  r.sleep = {2, "running", "resident", "resident", 1.5, 7};
  r.last_step = {1, 2, 1, 0.5};
  r.priorities = {{"<-1"}, {"-1"}, {"0", 1, 1}, {"1"}, {">1"}};
  r.traceparents = 1;
  const std::string j = ReportJson(r);
  const char* keys[] = {
      "\"tenants\": {},\n \"role\": \"decode\", \"identity\": {\"engine\": "
      "\"tokenmeter-engine\", \"model\": \"m\", \"instance\": \"decode\", "
      "\"labels\": {\"kv_role\": \"kv_consumer\"}}",
      "\"admission_rejections\": {\"queue_full\": 3}",
      "\"prompt_tokens_by_source\": {\"local_compute\": 4, "
      "\"local_cache_hit\": 16, \"external_kv_transfer\": 80}, "
      "\"prompt_tokens_cached\": 96",
      "\"request_prefill_kv_computed_tokens\": {\"count\": 0",
      "\"request_num_preemptions\": {\"count\": 0",
      "\"kv_transfer\": {\"send\": {\"count\": 0, \"failures\": {}, "
      "\"bytes\": 0, \"blocks\": 0, \"time_s\": {\"count\": 0, \"sum\": 0, "
      "\"p50\": 0, \"p99\": 0}},\n  \"recv\": {\"count\": 2, \"failures\": "
      "{\"checksum\": 1}, \"bytes\": 1024, \"blocks\": 4, \"time_s\": "
      "{\"count\": 2, \"sum\": 0.5, \"p50\": 0.2, \"p99\": 0.3}}}",
      "\"kv_wait_s\": {\"count\": 1, \"sum\": 0.3,",
      "\"kv_handoffs\": 1",
      "\"sleep\": {\"transitions\": 2, \"scheduler\": \"running\", "
      "\"weights\": \"resident\", \"kv_cache\": \"resident\", \"asleep_s\": "
      "1.5, \"preempted\": 7}",
      "\"last_step\": {\"running\": 1, \"waiting\": 2, \"waiting_deferred\": "
      "1, \"kv_usage\": 0.5}",
      "\"priorities\": {\n  \"<-1\": {\"requests\": 0,",
      "\"0\": {\"requests\": 1, \"finished\": {\"stop\": 1, \"length\": 0, "
      "\"error\": 0}",
      "\">1\": {\"requests\": 0,",
      "\"traceparents\": 1}\n"};
  size_t at = 0;
  for (const char* k : keys) {
    const size_t found = j.find(k, at);
    ASSERT_NE(found, std::string::npos) << k << " in " << j;
    at = found;
  }
}

}  // namespace
}  // namespace tokenmeter::engine
