// The whole loop on the CPU backend, without a daemon (--no-metrics).
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <memory>

#include "tests/engine/engine_runs.h"

namespace tokenmeter::engine {
namespace {

TEST(EngineTest, EveryRequestFinishesAndTheFiguresAddUp) {
  auto e = RunEngine(SmallRun());
  const Report r = e->BuildReport();
  EXPECT_EQ(r.requests, 24u);
  EXPECT_EQ(r.finished_stop + r.finished_length, 24u);
  EXPECT_EQ(r.ttft.count, 24u);
  EXPECT_EQ(r.e2e.count, 24u);
  EXPECT_EQ(r.queue.count, 24u);
  EXPECT_EQ(r.itl.count, r.generation_tokens - 24);
  EXPECT_NEAR(r.decode.sum, r.itl.sum, 1e-9 * r.itl.sum + 1e-12);
  EXPECT_GT(r.duration_s, 0);
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_FALSE(r.metrics);
  uint64_t generated = 0;
  for (size_t i = 0; i < e->num_requests(); ++i) {
    generated += e->Output(i).size();
  }
  EXPECT_EQ(generated, r.generation_tokens);
}

// Without preemption or prefix reuse every layer routes each computed
// token (every prompt token, every generated one but the last of each
// request) to top-k experts; counting off, the same outputs and no counts.
TEST(EngineTest, MoeCountsEveryComputedTokenPerLayer) {
  EngineOptions o = SmallRun();
  o.kv.prefix_caching = false;
  o.model.moe_experts = 8;
  o.model.moe_top_k = 3;
  o.expert_load_every = 7;
  auto e = RunEngine(o);
  const Report r = e->BuildReport();
  ASSERT_EQ(r.preemptions, 0u);
  EXPECT_EQ(r.moe_experts, 8u);
  EXPECT_EQ(r.moe_top_k, 3u);
  EXPECT_EQ(r.moe_expert_load_events, 0u);  // no client
  const uint64_t computed = r.prompt_tokens + r.generation_tokens - 24;
  ASSERT_EQ(r.moe_routed_tokens.size(), o.model.n_layers);
  ASSERT_EQ(r.moe_expert_tokens.size(), o.model.n_layers);
  for (size_t l = 0; l < r.moe_routed_tokens.size(); ++l) {
    EXPECT_EQ(r.moe_routed_tokens[l], 3 * computed) << "layer " << l;
    uint64_t sum = 0;
    for (uint64_t v : r.moe_expert_tokens[l]) sum += v;
    EXPECT_EQ(sum, r.moe_routed_tokens[l]);
    EXPECT_EQ(r.moe_expert_tokens[l].size(), 8u);
  }

  EngineOptions off = o;
  off.expert_load_every = 0;
  auto e2 = RunEngine(off);
  const Report r2 = e2->BuildReport();
  EXPECT_EQ(r2.moe_experts, 0u);
  EXPECT_TRUE(r2.moe_routed_tokens.empty());
  for (size_t i = 0; i < e->num_requests(); ++i) {
    EXPECT_EQ(e->Output(i), e2->Output(i)) << "request " << i;
  }
  // A mixture of experts is another function than the dense MLP.
  EngineOptions dense = o;
  dense.model.moe_experts = 0;
  auto e3 = RunEngine(dense);
  size_t same = 0;
  for (size_t i = 0; i < e->num_requests(); ++i) {
    same += e->Output(i) == e3->Output(i) ? 1 : 0;
  }
  EXPECT_LT(same, e->num_requests());
}

TEST(EngineTest, RequestsEndByStopOrAtTheirLength) {
  EngineOptions o = SmallRun();
  o.workload.requests = 60;
  o.workload.output_len = 64;
  o.kv.num_blocks = 1024;
  auto e = RunEngine(o);
  const Report r = e->BuildReport();
  // With 256 tokens and sampling at temperature 1, both happen.
  EXPECT_GT(r.finished_stop, 0u);
  EXPECT_GT(r.finished_length, 0u);
  for (size_t i = 0; i < e->num_requests(); ++i) {
    const auto out = e->Output(i);
    ASSERT_FALSE(out.empty());
    for (size_t k = 0; k + 1 < out.size(); ++k) ASSERT_NE(out[k], kStopToken);
  }
}

TEST(EngineTest, PreemptionAndPrefixCachingDoNotChangeOutputs) {
  EngineOptions roomy = SmallRun();
  roomy.kv.prefix_caching = false;
  auto a = RunEngine(roomy);
  EXPECT_EQ(a->BuildReport().preemptions, 0u);

  EngineOptions tight = SmallRun();
  tight.workload.shared_prefix = 0.5;
  tight.kv.num_blocks = 16;  // 128 slots: one request needs up to 13 blocks
  roomy.workload.shared_prefix = 0.5;
  auto b = RunEngine(roomy);
  auto c = RunEngine(tight);
  const Report rc = c->BuildReport();
  EXPECT_GT(rc.preemptions, 0u);
  EXPECT_GT(rc.prefix_cache_hits, 0u);
  EXPECT_EQ(rc.requests, 24u);
  for (size_t i = 0; i < b->num_requests(); ++i) {
    EXPECT_EQ(b->Output(i), c->Output(i)) << "request " << i;
  }
}

TEST(EngineTest, SameSeedSameOutputs) {
  auto a = RunEngine(SmallRun());
  EngineOptions o = SmallRun();
  o.scheduler.max_batch = 3;  // other batches, same function
  auto b = RunEngine(o);
  for (size_t i = 0; i < a->num_requests(); ++i) {
    EXPECT_EQ(a->Output(i), b->Output(i)) << "request " << i;
  }
}

TEST(EngineTest, IdlesUntilArrivalsWithARate) {
  EngineOptions o = SmallRun();
  o.workload.requests = 6;
  o.workload.rate = 50;
  auto e = RunEngine(o);
  const Report r = e->BuildReport();
  EXPECT_EQ(r.requests, 6u);
  // QUEUED happens when the loop admits a request, never before ARRIVED.
  EXPECT_GE(r.ttft.sum, r.prefill.sum);
}

EngineOptions LoraRun(uint32_t adapters, uint32_t max_lora) {
  EngineOptions o = SmallRun();
  o.workload.requests = 40;
  o.workload.lora_adapters = adapters;
  o.workload.tenants = 3;
  o.max_lora = max_lora;
  o.scheduler.max_lora = adapters > 0 ? max_lora : 0;
  o.lora_rank = 8;
  return o;
}

TEST(EngineTest, LoraRequestsWaitForSlotsAndEveryOneFinishes) {
  auto e = RunEngine(LoraRun(6, 2));
  const Report r = e->BuildReport();
  EXPECT_EQ(r.requests, 40u);
  ASSERT_EQ(r.lora_adapters.size(), 6u);
  uint64_t requests = 0, prompt = 0, generated = 0, loads = 0;
  for (const GroupCounts& g : r.lora_adapters) {
    requests += g.requests;
    prompt += g.prompt_tokens;
    generated += g.generation_tokens;
    loads += g.loads;
    EXPECT_EQ(g.finished_stop + g.finished_length, g.requests);
    if (g.requests > 0) {
      EXPECT_GE(g.loads, 1u) << g.name;
    }
  }
  EXPECT_EQ(requests, r.requests);  // every request has an adapter
  EXPECT_EQ(prompt, r.prompt_tokens);
  EXPECT_EQ(generated, r.generation_tokens);
  EXPECT_EQ(loads, r.lora_loads);
  // More adapters in use than slots: loads evict, and requests waited.
  EXPECT_GT(r.lora_evictions, 0u);
  EXPECT_EQ(r.lora_loads, r.lora_evictions + 2);  // two slots filled first
  EXPECT_GT(r.lora_skips, 0u);
  ASSERT_EQ(r.tenants.size(), 3u);
  uint64_t tenant_requests = 0;
  for (const GroupCounts& g : r.tenants) tenant_requests += g.requests;
  EXPECT_EQ(tenant_requests, r.requests);
}

TEST(EngineTest, AdaptersChangeOutputsButSlotsAndScheduleDoNot) {
  auto base = RunEngine(LoraRun(0, 4));
  auto one_slot = RunEngine(LoraRun(6, 1));
  auto many_slots = RunEngine(LoraRun(6, 6));
  EXPECT_EQ(base->BuildReport().lora_loads, 0u);
  EXPECT_EQ(many_slots->BuildReport().lora_evictions, 0u);
  size_t changed = 0;
  for (size_t i = 0; i < base->num_requests(); ++i) {
    EXPECT_EQ(one_slot->Output(i), many_slots->Output(i)) << "request " << i;
    changed += base->Output(i) != many_slots->Output(i);
  }
  EXPECT_GT(changed, base->num_requests() / 2);
}

}  // namespace
}  // namespace tokenmeter::engine
