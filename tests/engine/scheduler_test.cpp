#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>

namespace tokenmeter::engine {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(uint32_t max_batch, uint32_t budget, uint32_t blocks,
            uint32_t block_size = 4, uint32_t max_lora = 0,
            bool priority = false) {
    kv_ = std::make_unique<BlockManager>(
        KvCacheOptions{blocks, block_size, true});
    sched_ = std::make_unique<Scheduler>(
        SchedulerOptions{max_batch, budget, max_lora, priority}, *kv_);
  }
  // A request with a priority (priority scheduling).
  Request* AddPriority(int32_t priority, uint32_t prompt_len = 4) {
    std::vector<int32_t> p(prompt_len);
    std::iota(p.begin(), p.end(), 1000 * int32_t(requests_.size() + 1));
    requests_.push_back(
        std::make_unique<Request>(requests_.size() + 1, std::move(p), 100, 1));
    requests_.back()->priority = priority;
    sched_->Add(requests_.back().get());
    return requests_.back().get();
  }
  // A disaggregated decode request: its prompt's K/V come from elsewhere.
  Request* AddRemote(uint32_t prompt_len, int32_t first_token = 1) {
    Request* r = Add(prompt_len, 100, first_token);
    r->remote_kv = true;
    return r;
  }
  Request* Add(uint32_t prompt_len, uint32_t max_tokens = 100,
               int32_t first_token = 1, int32_t lora = -1) {
    std::vector<int32_t> p(prompt_len);
    std::iota(p.begin(), p.end(), first_token);
    requests_.push_back(std::make_unique<Request>(requests_.size() + 1,
                                                  std::move(p), max_tokens, 1));
    requests_.back()->lora = lora;
    sched_->Add(requests_.back().get());
    return requests_.back().get();
  }
  // A request with adapter `lora` and a prompt of its own.
  Request* AddLora(int32_t lora, uint32_t prompt_len = 4) {
    return Add(prompt_len, 100, 100 * int32_t(requests_.size() + 1), lora);
  }
  static bool Loaded(const SchedulerOutput& out, int32_t adapter,
                     int32_t evicted) {
    for (const AdapterLoad& l : out.lora_loads) {
      if (l.adapter == adapter) return l.evicted == evicted;
    }
    return false;
  }
  // Runs the planned step: advances every chunk and appends a token to
  // every sequence that reached its end.
  void Execute(const SchedulerOutput& out) {
    for (const ScheduledChunk& c : out.chunks) {
      sched_->Advance(c);
      if (c.request->num_computed == c.request->num_tokens()) {
        c.request->tokens.push_back(7);
      }
    }
  }
  uint32_t TokensFor(const SchedulerOutput& out, const Request* r) {
    for (const ScheduledChunk& c : out.chunks) {
      if (c.request == r) return c.num_tokens;
    }
    return 0;
  }

  std::unique_ptr<BlockManager> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<std::unique_ptr<Request>> requests_;
  SchedulerOutput out_;
};

TEST_F(SchedulerTest, AdmitsWaitingRequestsInArrivalOrder) {
  Make(8, 1000, 100);
  Request* a = Add(10);
  Request* b = Add(10);
  Request* c = Add(10);
  sched_->Schedule(&out_);
  ASSERT_EQ(out_.chunks.size(), 3u);
  EXPECT_EQ(out_.chunks[0].request, a);
  EXPECT_EQ(out_.chunks[1].request, b);
  EXPECT_EQ(out_.chunks[2].request, c);
  ASSERT_EQ(out_.first_scheduled.size(), 3u);
  EXPECT_EQ(out_.first_scheduled[0], a);
  EXPECT_EQ(sched_->num_running(), 3u);
  EXPECT_EQ(sched_->num_waiting(), 0u);
}

TEST_F(SchedulerTest, BatchNeverExceedsMaxBatch) {
  Make(2, 1000, 100);
  Request* a = Add(4);
  Request* b = Add(4);
  Request* c = Add(4);
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.chunks.size(), 2u);
  EXPECT_EQ(sched_->num_waiting(), 1u);
  Execute(out_);
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.chunks.size(), 2u);  // a and b decode; c still waits
  EXPECT_EQ(TokensFor(out_, c), 0u);
  Execute(out_);
  sched_->Finish(a);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, b), 1u);
  EXPECT_EQ(TokensFor(out_, c), 4u);
  ASSERT_EQ(out_.first_scheduled.size(), 1u);
  EXPECT_EQ(out_.first_scheduled[0], c);
}

TEST_F(SchedulerTest, TokenBudgetLimitsAStep) {
  Make(8, 10, 100);
  Add(6);
  Add(6);
  Request* c = Add(6);
  sched_->Schedule(&out_);
  uint32_t total = 0;
  for (const auto& ch : out_.chunks) total += ch.num_tokens;
  EXPECT_EQ(total, 10u);
  EXPECT_EQ(TokensFor(out_, c), 0u);
  EXPECT_EQ(sched_->num_waiting(), 1u);
}

TEST_F(SchedulerTest, ChunksALongPrefillAcrossSteps) {
  Make(8, 8, 100);
  Request* a = Add(20);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 8u);
  Execute(out_);
  EXPECT_EQ(a->num_computed, 8u);
  EXPECT_EQ(a->num_output(), 0u);  // no token from a partial prefill
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 8u);
  EXPECT_TRUE(out_.first_scheduled.empty());
  Execute(out_);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 4u);
  Execute(out_);
  EXPECT_EQ(a->num_output(), 1u);  // the last chunk yields the first token
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 1u);  // then decode
}

TEST_F(SchedulerTest, RunningDecodesGoBeforeNewPrefills) {
  Make(8, 4, 100);
  Request* a = Add(4);
  sched_->Schedule(&out_);
  Execute(out_);
  Request* b = Add(10);
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.chunks[0].request, a);
  EXPECT_EQ(TokensFor(out_, a), 1u);
  EXPECT_EQ(TokensFor(out_, b), 3u);  // the rest of the budget
}

TEST_F(SchedulerTest, WaitingHeadBlocksTheQueueWhenItDoesNotFit) {
  Make(8, 1000, 5, 4);   // 20 slots
  Request* a = Add(12);  // 3 blocks, a 4th for its first output token
  sched_->Schedule(&out_);
  Execute(out_);
  Request* b = Add(8, 100, 50);  // 2 blocks: does not fit
  Request* c = Add(2, 100, 80);  // 1 block: would fit, but FCFS
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 1u);
  EXPECT_EQ(TokensFor(out_, b), 0u);
  EXPECT_EQ(TokensFor(out_, c), 0u);
  EXPECT_EQ(sched_->num_waiting(), 2u);
}

TEST_F(SchedulerTest, PreemptsTheLatestRunningRequestWhenBlocksRunOut) {
  Make(8, 1000, 4, 4);           // 16 slots
  Request* a = Add(8);           // 2 blocks
  Request* b = Add(8, 100, 50);  // 2 blocks
  sched_->Schedule(&out_);
  Execute(out_);  // both at 9 tokens, 2 blocks each: cache full
  ASSERT_EQ(kv_->num_free_blocks(), 0u);
  sched_->Schedule(&out_);
  // a needs a third block for its 9th position: b is preempted.
  ASSERT_EQ(out_.preempted.size(), 1u);
  EXPECT_EQ(out_.preempted[0], b);
  EXPECT_EQ(TokensFor(out_, a), 1u);
  EXPECT_EQ(TokensFor(out_, b), 0u);
  EXPECT_EQ(b->num_computed, 0u);
  EXPECT_TRUE(b->kv.blocks.empty());
  EXPECT_EQ(b->state, RequestState::kWaiting);
  EXPECT_EQ(b->num_output(), 1u);  // its output survives
  EXPECT_EQ(sched_->num_waiting(), 1u);
  EXPECT_EQ(sched_->waiting().front(), b);
}

TEST_F(SchedulerTest, PreemptedRequestGoesBeforeNewArrivalsAndRecomputes) {
  Make(8, 1000, 4, 4);
  Request* a = Add(8, 2);
  Request* b = Add(8, 100, 50);
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->Schedule(&out_);  // preempts b
  ASSERT_EQ(out_.preempted.size(), 1u);
  Execute(out_);
  Request* c = Add(2, 100, 80);
  sched_->Finish(a);  // a reached its 2 tokens
  sched_->Schedule(&out_);
  // b comes back first and recomputes prompt + output; not "first" again.
  ASSERT_GE(out_.chunks.size(), 1u);
  EXPECT_EQ(out_.chunks[0].request, b);
  EXPECT_TRUE(std::find(out_.first_scheduled.begin(),
                        out_.first_scheduled.end(),
                        b) == out_.first_scheduled.end());
  // b's freed prompt blocks stayed cached until a took one of them: the
  // first is found again, the rest (prompt tail and output) recomputed.
  EXPECT_EQ(out_.prefix_hits, 4u);
  EXPECT_EQ(b->num_computed, 4u);
  EXPECT_EQ(TokensFor(out_, b), 5u);
  EXPECT_EQ(TokensFor(out_, c), 2u);
}

TEST_F(SchedulerTest, AStepThatPreemptsAdmitsNobody) {
  Make(8, 1000, 4, 4);
  Add(8);
  Add(8, 100, 50);
  sched_->Schedule(&out_);
  Execute(out_);
  Request* c = Add(1, 100, 80);
  sched_->Schedule(&out_);
  ASSERT_EQ(out_.preempted.size(), 1u);
  EXPECT_EQ(TokensFor(out_, c), 0u);
}

TEST_F(SchedulerTest, CountsPrefixCacheQueriesAndHits) {
  Make(8, 1000, 100, 4);
  Request* a = Add(10);  // 2 full blocks
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.prefix_queries, 10u);
  EXPECT_EQ(out_.prefix_hits, 0u);
  Execute(out_);
  Request* b = Add(10);  // same prompt
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.prefix_queries, 10u);
  EXPECT_EQ(out_.prefix_hits, 8u);
  EXPECT_EQ(b->num_computed, 8u);
  EXPECT_EQ(TokensFor(out_, b), 2u);
  EXPECT_EQ(b->kv.blocks[0], a->kv.blocks[0]);
}

TEST_F(SchedulerTest, ARequestWaitsUntilItsAdapterCanBeResident) {
  Make(8, 1000, 100, 4, /*max_lora=*/1);
  Request* a = AddLora(0);
  Request* b = AddLora(1);  // the one slot holds adapter 0, in use
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 4u);
  EXPECT_EQ(TokensFor(out_, b), 0u);
  ASSERT_EQ(out_.lora_loads.size(), 1u);
  EXPECT_TRUE(Loaded(out_, 0, -1));  // into the empty slot
  EXPECT_EQ(a->lora_slot, 0);
  EXPECT_EQ(out_.lora_skips, 1u);
  EXPECT_EQ(b->state, RequestState::kWaiting);
  EXPECT_EQ(b->lora_slot, -1);
  Execute(out_);
  for (int step = 0; step < 3; ++step) {  // b waits as long as a runs
    sched_->Schedule(&out_);
    EXPECT_EQ(TokensFor(out_, b), 0u);
    EXPECT_TRUE(out_.lora_loads.empty());
    Execute(out_);
  }
  sched_->Finish(a);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, b), 4u);
  ASSERT_EQ(out_.lora_loads.size(), 1u);
  EXPECT_TRUE(Loaded(out_, 1, 0));  // adapter 0 evicted, nobody uses it
  EXPECT_EQ(b->lora_slot, 0);
  EXPECT_EQ(sched_->adapter_slots().SlotOf(0), -1);
  EXPECT_EQ(sched_->adapter_slots().SlotOf(1), 0);
}

TEST_F(SchedulerTest, LaterRequestsGoAheadWhenTheirAdapterFits) {
  Make(8, 1000, 100, 4, /*max_lora=*/1);
  Request* a = AddLora(0);
  Request* b = AddLora(1);        // waits
  Request* c = AddLora(0);        // resident: goes ahead of b
  Request* d = Add(4, 100, 900);  // base model: needs no slot
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, a), 4u);
  EXPECT_EQ(TokensFor(out_, b), 0u);
  EXPECT_EQ(TokensFor(out_, c), 4u);
  EXPECT_EQ(TokensFor(out_, d), 4u);
  EXPECT_EQ(c->lora_slot, 0);
  EXPECT_EQ(d->lora_slot, -1);
  EXPECT_EQ(out_.lora_loads.size(), 1u);  // adapter 0 once, for a and c
  ASSERT_EQ(sched_->num_waiting(), 1u);
  EXPECT_EQ(sched_->waiting().front(), b);
  Execute(out_);
  sched_->Finish(a);  // c still pins adapter 0
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, b), 0u);
  Execute(out_);
  sched_->Finish(c);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, b), 4u);
  EXPECT_TRUE(Loaded(out_, 1, 0));
}

TEST_F(SchedulerTest, EvictsTheLeastRecentlyUsedIdleAdapter) {
  Make(8, 1000, 100, 4, /*max_lora=*/2);
  Request* a = AddLora(0);
  Request* b = AddLora(1);
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.lora_loads.size(), 2u);
  Execute(out_);
  sched_->Finish(a);  // adapter 0 idle first
  sched_->Finish(b);  // then adapter 1
  AddLora(2);
  sched_->Schedule(&out_);
  ASSERT_EQ(out_.lora_loads.size(), 1u);
  EXPECT_TRUE(Loaded(out_, 2, 0));  // 0 was used least recently
  EXPECT_EQ(sched_->adapter_slots().SlotOf(1), 1);
}

TEST_F(SchedulerTest, NeverEvictsAnAdapterARunningRequestUses) {
  Make(8, 1000, 100, 4, /*max_lora=*/2);
  Request* a = AddLora(0);
  Request* b = AddLora(1);
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->Finish(b);  // adapter 1 idle; 0 (older) still pinned by a
  Request* c = AddLora(2);
  sched_->Schedule(&out_);
  EXPECT_TRUE(Loaded(out_, 2, 1));
  EXPECT_EQ(sched_->adapter_slots().SlotOf(0), a->lora_slot);
  EXPECT_EQ(c->lora_slot, 1);
  // Both slots pinned now: a fourth adapter waits, and a resident one not.
  Request* d = AddLora(3);
  Request* e = AddLora(0);
  Execute(out_);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, d), 0u);
  EXPECT_EQ(TokensFor(out_, e), 4u);
  EXPECT_TRUE(out_.lora_loads.empty());
  EXPECT_EQ(sched_->adapter_slots().num_idle(), 0u);
}

TEST_F(SchedulerTest, AResidentAdapterIsReusedWithoutALoad) {
  Make(8, 1000, 100, 4, /*max_lora=*/2);
  Request* a = AddLora(5);
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->Finish(a);
  Request* b = AddLora(5);
  sched_->Schedule(&out_);
  EXPECT_TRUE(out_.lora_loads.empty());
  EXPECT_EQ(a->lora_slot, -1);  // released when it finished
  EXPECT_EQ(b->lora_slot, 0);
  EXPECT_EQ(sched_->adapter_slots().SlotOf(5), b->lora_slot);
}

TEST_F(SchedulerTest, PreemptionReleasesTheAdapter) {
  Make(8, 1000, 4, 4, /*max_lora=*/1);
  Request* a = Add(8, 100, 1, 0);   // 2 blocks
  Request* b = Add(8, 100, 50, 0);  // 2 blocks, same adapter
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->Schedule(&out_);  // a needs a third block: b is preempted
  ASSERT_EQ(out_.preempted.size(), 1u);
  EXPECT_EQ(out_.preempted[0], b);
  EXPECT_EQ(b->lora_slot, -1);
  EXPECT_EQ(a->lora_slot, 0);
  Execute(out_);
  sched_->Finish(a);
  EXPECT_EQ(sched_->adapter_slots().num_idle(), 1u);  // nobody pins it
  sched_->Schedule(&out_);  // b comes back; adapter 0 still resident
  EXPECT_EQ(out_.chunks[0].request, b);
  EXPECT_TRUE(out_.lora_loads.empty());
  EXPECT_EQ(b->lora_slot, 0);
}

TEST_F(SchedulerTest, TheCacheStillBlocksTheQueueWithAdapters) {
  Make(8, 1000, 5, 4, /*max_lora=*/1);
  Request* a = Add(12, 100, 1, 0);  // 4 of the 5 blocks after a token
  sched_->Schedule(&out_);
  Execute(out_);
  Request* b = Add(8, 100, 50, 1);  // adapter 1 waits: passed over
  Request* c = Add(8, 100, 60, 0);  // fits the adapter, not the cache
  Request* d = Add(2, 100, 80, 0);  // would fit both, but c blocks
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.lora_skips, 1u);
  EXPECT_EQ(TokensFor(out_, a), 1u);
  EXPECT_EQ(TokensFor(out_, b), 0u);
  EXPECT_EQ(TokensFor(out_, c), 0u);
  EXPECT_EQ(TokensFor(out_, d), 0u);
  EXPECT_EQ(sched_->num_waiting(), 3u);
}

TEST_F(SchedulerTest, PassesOverAtMostkMaxLoraSkipsRequestsPerStep) {
  Make(8, 1000, 2000, 4, /*max_lora=*/1);
  AddLora(0);
  sched_->Schedule(&out_);
  Execute(out_);
  for (uint32_t i = 0; i < kMaxLoraSkips; ++i) AddLora(1, 1);
  Request* base = Add(1, 100, 7);  // behind them all
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.lora_skips, uint64_t(kMaxLoraSkips));
  EXPECT_EQ(TokensFor(out_, base), 0u);
}

TEST_F(SchedulerTest, PriorityOrdersTheQueueByPriorityThenArrival) {
  Make(8, 1000, 100, 4, 0, true);
  Request* a = AddPriority(1);
  Request* b = AddPriority(-1);
  Request* c = AddPriority(1);
  Request* d = AddPriority(0);
  ASSERT_EQ(sched_->num_waiting(), 4u);
  EXPECT_EQ(sched_->waiting()[0], b);
  EXPECT_EQ(sched_->waiting()[1], d);
  EXPECT_EQ(sched_->waiting()[2], a);
  EXPECT_EQ(sched_->waiting()[3], c);
  sched_->Schedule(&out_);
  ASSERT_EQ(out_.chunks.size(), 4u);
  EXPECT_EQ(out_.chunks[0].request, b);
  EXPECT_EQ(out_.chunks[1].request, d);
  EXPECT_EQ(out_.chunks[2].request, a);
  EXPECT_EQ(out_.chunks[3].request, c);
}

TEST_F(SchedulerTest, FcfsIgnoresPriorities) {
  Make(8, 1000, 100);
  Request* a = AddPriority(1);
  Request* b = AddPriority(-1);
  EXPECT_EQ(sched_->waiting()[0], a);
  EXPECT_EQ(sched_->waiting()[1], b);
}

TEST_F(SchedulerTest, PriorityFillsAFullBatchWithTheLowestValuesFirst) {
  Make(1, 1000, 100, 4, 0, true);
  AddPriority(3);
  Request* best = AddPriority(-7);
  AddPriority(0);
  sched_->Schedule(&out_);
  ASSERT_EQ(out_.chunks.size(), 1u);
  EXPECT_EQ(out_.chunks[0].request, best);
}

// a (priority 5) runs first; b (priority 0) joins later. When the cache runs
// out, FCFS preempts the last scheduled (b), priority scheduling the worst
// priority (a), taking back the chunk a already had in that step.
TEST_F(SchedulerTest, PriorityPreemptsTheWorstRunningRequest) {
  for (bool priority : {false, true}) {
    SCOPED_TRACE(priority ? "priority" : "fcfs");
    requests_.clear();
    Make(8, 1000, 5, 4, 0, priority);
    Request* a = AddPriority(5);
    sched_->Schedule(&out_);
    Execute(out_);
    Request* b = AddPriority(0);
    bool preempted = false;
    for (int step = 0; step < 20 && !preempted; ++step) {
      sched_->Schedule(&out_);
      preempted = !out_.preempted.empty();
      if (!preempted) Execute(out_);
    }
    ASSERT_TRUE(preempted);
    ASSERT_EQ(out_.preempted.size(), 1u);
    Request* victim = priority ? a : b;
    Request* kept = priority ? b : a;
    EXPECT_EQ(out_.preempted[0], victim);
    EXPECT_EQ(victim->num_computed, 0u);
    EXPECT_EQ(victim->preemptions, 1u);
    EXPECT_EQ(TokensFor(out_, victim), 0u);  // its chunk was taken back
    EXPECT_EQ(TokensFor(out_, kept), 1u);
    ASSERT_EQ(sched_->num_running(), 1u);
    EXPECT_EQ(sched_->running()[0], kept);
    // Only the chunks that stay are paid for by blocks.
    EXPECT_EQ(kv_->num_free_blocks(), 5u - kept->kv.blocks.size());
  }
}

TEST_F(SchedulerTest, PriorityPutsAPreemptedRequestBackInItsPlace) {
  Make(8, 1000, 100, 4, 0, true);
  Request* a = AddPriority(2);
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->PreemptAll(&out_);
  ASSERT_EQ(sched_->num_waiting(), 1u);
  Request* c = AddPriority(10);
  Request* d = AddPriority(-3);
  Request* e = AddPriority(2);  // same priority, later arrival: after a
  ASSERT_EQ(sched_->num_waiting(), 4u);
  EXPECT_EQ(sched_->waiting()[0], d);
  EXPECT_EQ(sched_->waiting()[1], a);
  EXPECT_EQ(sched_->waiting()[2], e);
  EXPECT_EQ(sched_->waiting()[3], c);
}

TEST_F(SchedulerTest, RemoteRequestIsDeferredUntilItsKvLands) {
  Make(8, 1000, 100);
  Request* r = AddRemote(10);
  sched_->Schedule(&out_);
  EXPECT_TRUE(out_.chunks.empty());
  EXPECT_TRUE(out_.acted());
  ASSERT_EQ(out_.first_scheduled.size(), 1u);
  ASSERT_EQ(out_.kv_pulls.size(), 1u);
  EXPECT_EQ(out_.kv_pulls[0], r);
  EXPECT_EQ(r->state, RequestState::kDeferred);
  EXPECT_EQ(r->cached_tokens, 0u);
  EXPECT_EQ(r->external_tokens, 9u);  // all but the last prompt token
  EXPECT_EQ(r->kv_first_block, 0u);
  EXPECT_EQ(r->kv_num_blocks, 3u);     // positions 0..8
  EXPECT_EQ(r->kv.blocks.size(), 3u);  // the whole prompt: 10 positions
  EXPECT_EQ(sched_->num_deferred(), 1u);
  EXPECT_EQ(sched_->num_running(), 0u);
  EXPECT_EQ(sched_->num_waiting(), 0u);
  // Nothing to do until it lands.
  sched_->Schedule(&out_);
  EXPECT_FALSE(out_.acted());
  sched_->LandKv(r);
  EXPECT_EQ(r->state, RequestState::kRunning);
  EXPECT_EQ(r->num_computed, 9u);
  EXPECT_EQ(sched_->num_deferred(), 0u);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, r), 1u);  // the last prompt token: the logits
  EXPECT_TRUE(out_.first_scheduled.empty());
  Execute(out_);
  EXPECT_EQ(r->num_output(), 1u);
  // Its prompt's full blocks are in the prefix cache now.
  EXPECT_EQ(kv_->num_cached_blocks(), 2u);
}

TEST_F(SchedulerTest, RemoteRequestTakesTheLocalPrefixCacheFirst) {
  Make(8, 1000, 100);
  Request* x = Add(12);  // tokens 1..12: three full blocks once computed
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->Finish(x);
  Request* r = AddRemote(14);  // tokens 1..14
  sched_->Schedule(&out_);
  ASSERT_EQ(out_.kv_pulls.size(), 1u);
  EXPECT_EQ(r->cached_tokens, 12u);
  EXPECT_EQ(r->external_tokens, 1u);  // position 12; 13 is computed here
  EXPECT_EQ(r->kv_first_block, 3u);
  EXPECT_EQ(r->kv_num_blocks, 1u);
  EXPECT_EQ(out_.prefix_hits, 12u);
  // With every pulled position cached, nothing is pulled.
  Request* q = AddRemote(13);  // tokens 1..13
  sched_->Schedule(&out_);
  EXPECT_TRUE(out_.kv_pulls.empty());
  EXPECT_EQ(q->state, RequestState::kRunning);
  EXPECT_EQ(q->cached_tokens, 12u);
  EXPECT_EQ(q->external_tokens, 0u);
  EXPECT_EQ(TokensFor(out_, q), 1u);
}

TEST_F(SchedulerTest, DeferredRequestsHoldTheirBatchSeats) {
  Make(1, 1000, 100);
  Request* r = AddRemote(10);
  Request* q = Add(4);
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.kv_pulls.size(), 1u);
  EXPECT_TRUE(out_.chunks.empty());
  sched_->Schedule(&out_);
  EXPECT_FALSE(out_.acted());  // q waits for the seat
  EXPECT_EQ(sched_->num_waiting(), 1u);
  sched_->LandKv(r);
  sched_->Schedule(&out_);
  EXPECT_EQ(TokensFor(out_, q), 0u);
  EXPECT_EQ(TokensFor(out_, r), 1u);
}

TEST_F(SchedulerTest, AbortDeferredFreesItsBlocks) {
  Make(8, 1000, 20);
  Request* r = AddRemote(10);
  sched_->Schedule(&out_);
  EXPECT_EQ(kv_->num_free_blocks(), 17u);
  sched_->AbortDeferred(r);
  EXPECT_EQ(kv_->num_free_blocks(), 20u);
  EXPECT_EQ(r->state, RequestState::kFinished);
  EXPECT_EQ(sched_->num_deferred(), 0u);
}

TEST_F(SchedulerTest, FinishHoldKeepsTheBlocksUntilReleased) {
  Make(8, 1000, 20);
  Request* a = Add(10);
  sched_->Schedule(&out_);
  Execute(out_);
  sched_->FinishHold(a);
  EXPECT_EQ(a->state, RequestState::kHeld);
  EXPECT_EQ(sched_->num_running(), 0u);
  EXPECT_EQ(kv_->num_free_blocks(), 17u);
  sched_->ReleaseHeld(a);
  EXPECT_EQ(a->state, RequestState::kFinished);
  EXPECT_EQ(kv_->num_free_blocks(), 20u);
}

TEST_F(SchedulerTest, PreemptAllEmptiesTheBatchAndPausingAdmitsNobody) {
  Make(8, 1000, 100);
  Request* a = AddPriority(0);  // FCFS: the priority plays no part
  Request* b = AddPriority(0);
  sched_->Schedule(&out_);
  Execute(out_);
  Request* c = AddPriority(0);  // arrives: waits behind the preempted ones
  sched_->PreemptAll(&out_);
  ASSERT_EQ(out_.preempted.size(), 2u);
  EXPECT_EQ(sched_->num_running(), 0u);
  EXPECT_EQ(kv_->num_free_blocks(), 100u);
  ASSERT_EQ(sched_->num_waiting(), 3u);
  EXPECT_EQ(sched_->waiting()[0], a);  // scheduling order kept
  EXPECT_EQ(sched_->waiting()[1], b);
  EXPECT_EQ(sched_->waiting()[2], c);
  sched_->set_admitting(false);
  sched_->Schedule(&out_);
  EXPECT_FALSE(out_.acted());
  sched_->set_admitting(true);
  sched_->Schedule(&out_);
  EXPECT_EQ(out_.chunks.size(), 3u);
  // Recompute: prompt + its token, the full prompt block from the cache.
  EXPECT_EQ(TokensFor(out_, a), 1u);
  EXPECT_EQ(TokensFor(out_, c), 4u);
  EXPECT_EQ(out_.prefix_hits, 8u);
}

}  // namespace
}  // namespace tokenmeter::engine
