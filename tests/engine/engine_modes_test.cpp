// The engine's protocol 1.2 modes, whole loop, CPU backend, no daemon:
// the admission cap, priorities, the sleep/wake cycle, and --disaggregate
// run in-process (the prefill and the decode engine on two threads over a
// socket pair), compared with the monolithic engine.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <memory>
#include <thread>

#include "engine/engine.h"
#include "engine/kv_channel.h"
#include "tests/engine/engine_runs.h"

namespace tokenmeter::engine {
namespace {

uint64_t Sum(const std::vector<std::pair<std::string, uint64_t>>& counts) {
  uint64_t n = 0;
  for (const auto& [key, v] : counts) n += v;
  return n;
}

TEST(EngineModesTest, AdmissionCapRejectsArrivalsThatFindTheQueueFull) {
  EngineOptions o = SmallRun();
  o.max_queued = 5;
  auto e = RunEngine(o);
  const Report r = e->BuildReport();
  // All 24 arrive at once (rate 0), before the first step: 5 find room.
  EXPECT_EQ(r.requests, 5u);
  ASSERT_EQ(r.admission_rejections.size(), 1u);
  EXPECT_EQ(r.admission_rejections[0].first, "queue_full");
  EXPECT_EQ(r.admission_rejections[0].second, 19u);
  EXPECT_EQ(r.ttft.count, 5u);  // the rejected never became requests
  EXPECT_EQ(r.e2e.count, 5u);
  // The admitted ones compute what they would have without the cap.
  auto all = RunEngine(SmallRun());
  for (uint64_t id = 1; id <= 5; ++id) {
    EXPECT_EQ(e->OutputById(id), all->OutputById(id)) << "request " << id;
  }
  EXPECT_TRUE(e->OutputById(6).empty());
}

TEST(EngineModesTest, AdmissionCapWithArrivalsOverTimeLetsEveryOneResolve) {
  EngineOptions o = SmallRun();
  o.workload.requests = 40;
  o.workload.rate = 2000;
  o.max_queued = 2;
  auto e = RunEngine(o);
  const Report r = e->BuildReport();
  EXPECT_EQ(r.requests + Sum(r.admission_rejections), 40u);
  EXPECT_GE(r.requests, 2u);
}

TEST(EngineModesTest, PrioritiesKeepOutputsAndCountPerVllmBucket) {
  EngineOptions o = SmallRun();
  o.workload.priority_levels = 5;
  o.scheduler.priority = true;
  o.scheduler.max_batch = 2;
  auto p = RunEngine(o);
  auto fcfs = RunEngine(SmallRun());
  const Report r = p->BuildReport();
  EXPECT_EQ(r.requests, 24u);
  ASSERT_EQ(r.priorities.size(), 5u);
  uint64_t requests = 0, generated = 0;
  for (size_t b = 0; b < 5; ++b) {
    EXPECT_EQ(r.priorities[b].name, kPriorityBuckets[b]);
    requests += r.priorities[b].requests;
    generated += r.priorities[b].generation_tokens;
  }
  EXPECT_EQ(requests, 24u);
  EXPECT_EQ(generated, r.generation_tokens);
  // Priorities change the order, never a request's tokens.
  for (uint64_t id = 1; id <= 24; ++id) {
    EXPECT_EQ(p->OutputById(id), fcfs->OutputById(id)) << "request " << id;
  }
  EXPECT_TRUE(fcfs->BuildReport().priorities.empty());
}

// A run long enough that the sleep at 5 ms finds requests running: they
// are preempted, the cache released, and after the wake they recompute the
// same tokens.
TEST(EngineModesTest, SleepCyclePreemptsReleasesAndKeepsOutputs) {
  EngineOptions o = SmallRun();
  o.workload.requests = 48;
  o.workload.prompt_len = 160;
  o.kv.num_blocks = 1024;
  o.sleep_after_s = 0.005;
  o.wake_after_s = 0.05;
  auto e = RunEngine(o);
  EngineOptions awake = o;
  awake.sleep_after_s = awake.wake_after_s = -1;
  auto a = RunEngine(awake);
  const Report r = e->BuildReport();
  EXPECT_EQ(r.requests, 48u);
  EXPECT_EQ(r.sleep.transitions, 2u);
  EXPECT_EQ(r.sleep.scheduler, "running");
  EXPECT_EQ(r.sleep.kv_cache, "resident");
  EXPECT_EQ(r.sleep.weights, "resident");
  EXPECT_GE(r.sleep.asleep_s, 0.05);
  EXPECT_GT(r.sleep.preempted, 0u);
  EXPECT_GE(r.preemptions, r.sleep.preempted);
  EXPECT_EQ(r.num_preemptions_per_request.sum, double(r.preemptions));
  EXPECT_EQ(a->BuildReport().sleep.transitions, 0u);
  for (uint64_t id = 1; id <= 48; ++id) {
    EXPECT_EQ(e->OutputById(id), a->OutputById(id)) << "request " << id;
  }
}

// Both processes' engines on two threads of this one.
struct Disaggregated {
  explicit Disaggregated(const EngineOptions& o) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
    to_decode = std::make_unique<KvChannel>(fds[0]);
    to_prefill = std::make_unique<KvChannel>(fds[1]);
    Status s =
        Engine::Create(o, EngineRole::kPrefill, to_decode.get(), &prefill);
    EXPECT_TRUE(s.ok()) << s.message();
    s = Engine::Create(o, EngineRole::kDecode, to_prefill.get(), &decode);
    EXPECT_TRUE(s.ok()) << s.message();
    std::thread t([this] {
      decode_status = decode->Run();
      to_prefill.reset();  // on failure the prefill side sees it go
    });
    prefill_status = prefill->Run();
    if (!prefill_status.ok()) to_decode.reset();
    t.join();
    EXPECT_TRUE(prefill_status.ok()) << prefill_status.message();
    EXPECT_TRUE(decode_status.ok()) << decode_status.message();
    p = prefill->BuildReport();
    d = decode->BuildReport();
  }
  // A request's whole output: the decode side's, or the prefill side's
  // when it ended there.
  std::vector<int32_t> Output(uint64_t id) const {
    std::vector<int32_t> out = decode->OutputById(id);
    return out.empty() ? prefill->OutputById(id) : out;
  }
  std::unique_ptr<KvChannel> to_decode, to_prefill;
  std::unique_ptr<Engine> prefill, decode;
  Status prefill_status = Status::Ok(), decode_status = Status::Ok();
  Report p, d;
};

EngineOptions DisaggregatedRun() {
  EngineOptions o = SmallRun();
  o.disaggregate = true;
  o.trace_context = true;
  o.workload.shared_prefix = 0.3;  // the decode side's prefix cache hits
  return o;
}

TEST(EngineModesTest, DisaggregatedRunComputesWhatOneEngineComputes) {
  const EngineOptions o = DisaggregatedRun();
  Disaggregated run(o);
  EngineOptions mono = o;
  mono.disaggregate = false;
  auto m = RunEngine(mono);
  for (uint64_t id = 1; id <= 24; ++id) {
    EXPECT_EQ(run.Output(id), m->OutputById(id)) << "request " << id;
  }
  const Report& p = run.p;
  const Report& d = run.d;
  EXPECT_EQ(p.role, "prefill");
  EXPECT_EQ(d.role, "decode");
  EXPECT_EQ(p.instance, "prefill");
  EXPECT_EQ(d.instance, "decode");
  // The prefill side computes every prompt and one token each; a request
  // whose first token is the stop token ends there, the others go on.
  EXPECT_EQ(p.requests, 24u);
  EXPECT_EQ(p.generation_tokens, 24u);
  EXPECT_EQ(p.finished_length, p.kv_handoffs);
  EXPECT_EQ(p.finished_stop + p.kv_handoffs, 24u);
  EXPECT_EQ(d.kv_handoffs, p.kv_handoffs);
  EXPECT_EQ(d.requests, d.kv_handoffs);
  EXPECT_EQ(p.traceparents, 24u);
  EXPECT_EQ(d.traceparents, d.kv_handoffs);
  // Every transfer arrived: one per hand-over, unless the decode side's
  // prefix cache held every pulled position.
  EXPECT_EQ(p.kv_send.count, d.kv_recv.count);
  EXPECT_EQ(p.kv_send.bytes, d.kv_recv.bytes);
  EXPECT_EQ(p.kv_send.blocks, d.kv_recv.blocks);
  EXPECT_TRUE(p.kv_send.failures.empty());
  EXPECT_GT(d.kv_recv.count, 0u);
  EXPECT_EQ(d.kv_wait.count, d.kv_recv.count);
  EXPECT_EQ(p.kv_recv.count, 0u);
  EXPECT_EQ(d.kv_send.count, 0u);
  // Where the decode side's prompt tokens came from.
  EXPECT_EQ(
      d.prompt_local_compute + d.prompt_local_cache_hit + d.prompt_external_kv,
      d.prompt_tokens);
  EXPECT_EQ(d.prompt_local_compute, d.requests);  // the last prompt token
  EXPECT_GT(d.prompt_external_kv, 0u);
  EXPECT_GT(d.prompt_local_cache_hit, 0u);  // the shared prefix
  EXPECT_EQ(p.prompt_external_kv, 0u);
  EXPECT_EQ(p.prompt_local_compute + p.prompt_local_cache_hit, p.prompt_tokens);
  EXPECT_EQ(d.prefill_kv_computed_tokens.sum, double(d.requests));
  // A block record per transferred block.
  ModelConfig c;
  ASSERT_TRUE(ModelConfigForSize("tiny", &c));
  EXPECT_EQ(d.kv_recv.bytes, d.kv_recv.blocks * KvBlockBytes(c, {256, 8}));
  EXPECT_EQ(d.last_step.waiting_deferred, 0u);
  EXPECT_EQ(d.last_step.running, 0u);
}

// A hand-over that pulls nothing (one-token prompts: the decode side
// computes the last prompt token itself, and there is nothing before it;
// the same as a prefix cache that holds every pulled position) is
// acknowledged all the same: the prefill side frees the blocks it held
// for it, sends no KV_TRANSFER, and both processes end.
TEST(EngineModesTest, AHandOverThatPullsNothingIsReleased) {
  EngineOptions o = DisaggregatedRun();
  o.workload.prompt_len = 1;
  o.workload.shared_prefix = 0;
  Disaggregated run(o);
  const Report& p = run.p;
  const Report& d = run.d;
  EXPECT_GT(p.kv_handoffs, 0u);
  EXPECT_EQ(d.requests, p.kv_handoffs);
  EXPECT_EQ(p.kv_send.count, 0u);
  EXPECT_EQ(d.kv_recv.count, 0u);
  EXPECT_EQ(d.prompt_external_kv, 0u);
  EXPECT_EQ(d.finished_error, 0u);
  EngineOptions mono = o;
  mono.disaggregate = false;
  auto m = RunEngine(mono);
  for (uint64_t id = 1; id <= 24; ++id) {
    EXPECT_EQ(run.Output(id), m->OutputById(id)) << "request " << id;
  }
}

TEST(EngineModesTest, FailedTransfersAreRetriedThenTheRequestErrs) {
  EngineOptions o = DisaggregatedRun();
  o.workload.shared_prefix = 0;
  o.kv_fail_every = 1;  // every transfer arrives damaged
  o.kv_retries = 2;
  Disaggregated all_fail(o);
  const Report& p = all_fail.p;
  const Report& d = all_fail.d;
  EXPECT_GT(p.kv_handoffs, 0u);
  EXPECT_EQ(d.requests, p.kv_handoffs);
  EXPECT_EQ(d.finished_error, d.requests);  // each tried 3 times, then error
  EXPECT_EQ(d.generation_tokens, 0u);
  EXPECT_EQ(d.kv_recv.count, 3 * d.requests);
  ASSERT_EQ(d.kv_recv.failures.size(), 1u);
  EXPECT_EQ(d.kv_recv.failures[0].first, "checksum");
  EXPECT_EQ(d.kv_recv.failures[0].second, 3 * d.requests);
  EXPECT_EQ(p.kv_send.failures, d.kv_recv.failures);
  EXPECT_EQ(d.kv_wait.count, 0u);  // no successful recv
  EXPECT_EQ(d.ttft.count, 0u);
  EXPECT_EQ(d.e2e.count, d.requests);

  // Every second transfer damaged, one retry: some succeed on the retry.
  o.kv_fail_every = 2;
  o.kv_retries = 1;
  Disaggregated half(o);
  EngineOptions mono = o;
  mono.disaggregate = false;
  auto m = RunEngine(mono);
  const Report& d2 = half.d;
  const uint64_t failed = Sum(d2.kv_recv.failures);
  EXPECT_EQ(failed, d2.kv_recv.count / 2);
  EXPECT_EQ(d2.kv_wait.count, d2.kv_recv.count - failed);
  EXPECT_EQ(d2.kv_wait.count + d2.finished_error, d2.requests);
  EXPECT_EQ(Sum(half.p.kv_send.failures), failed);
  // What was decoded is what one engine computes.
  for (uint64_t id = 1; id <= 24; ++id) {
    const std::vector<int32_t> out = half.decode->OutputById(id);
    if (!out.empty()) {
      EXPECT_EQ(out, m->OutputById(id)) << "request " << id;
    }
  }
}

TEST(EngineModesTest, DecodeSideSleepsWhilePrefillKeepsHandingOver) {
  EngineOptions o = DisaggregatedRun();
  o.workload.requests = 48;
  o.workload.prompt_len = 160;
  o.kv.num_blocks = 1024;
  o.workload.priority_levels = 3;
  o.scheduler.priority = true;
  o.sleep_after_s = 0.01;
  o.wake_after_s = 0.05;
  Disaggregated run(o);
  EXPECT_EQ(run.p.sleep.transitions, 0u);  // the prefill side never sleeps
  EXPECT_EQ(run.d.sleep.transitions, 2u);
  EXPECT_EQ(run.d.sleep.kv_cache, "resident");
  EXPECT_GE(run.d.sleep.asleep_s, 0.05);
  EngineOptions mono = o;
  mono.disaggregate = false;
  mono.sleep_after_s = mono.wake_after_s = -1;
  auto m = RunEngine(mono);
  for (uint64_t id = 1; id <= 48; ++id) {
    EXPECT_EQ(run.Output(id), m->OutputById(id)) << "request " << id;
  }
  ASSERT_EQ(run.d.priorities.size(), 5u);
  EXPECT_EQ(run.d.priorities[0].requests + run.d.priorities[4].requests, 0u);
}

}  // namespace
}  // namespace tokenmeter::engine
