#include "engine/scheduler.h"

#include <algorithm>
#include <cstdlib>

namespace tokenmeter::engine {

Scheduler::Scheduler(const SchedulerOptions& o, BlockManager& kv)
    : options_(o), kv_(kv), lora_(o.max_lora) {
  if (o.max_batch == 0 || o.max_tokens_per_step == 0) std::abort();
}

void Scheduler::Add(Request* r) {
  if (r->lora >= 0 && options_.max_lora == 0) std::abort();
  r->state = RequestState::kWaiting;
  waiting_.push_back(r);
}

void Scheduler::ReleaseAdapter(Request* r) {
  if (r->lora < 0) return;
  lora_.Release(r->lora);
  r->lora_slot = -1;
}

void Scheduler::Preempt(Request* r, SchedulerOutput* out) {
  kv_.Free(r->kv);
  ReleaseAdapter(r);
  r->num_computed = 0;
  r->state = RequestState::kWaiting;
  waiting_.push_front(r);
  out->preempted.push_back(r);
}

void Scheduler::Schedule(SchedulerOutput* out) {
  out->chunks.clear();
  out->first_scheduled.clear();
  out->preempted.clear();
  out->prefix_queries = 0;
  out->prefix_hits = 0;
  out->lora_loads.clear();
  out->lora_skips = 0;
  uint32_t budget = options_.max_tokens_per_step;

  // Running requests first. Every running request has at least one token to
  // compute: its last output token, or the rest of its prefill.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Request* r = running_[i];
    const uint32_t n = std::min(r->num_tokens() - r->num_computed, budget);
    bool self_preempted = false;
    while (!kv_.Allocate(r->kv, nullptr, r->num_computed + n)) {
      // The lowest priority is the most recently scheduled: the last one.
      Request* victim = running_.back();
      running_.pop_back();
      Preempt(victim, out);
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    out->chunks.push_back({r, n});
    budget -= n;
    ++i;
  }

  // Then waiting requests, unless this step had to preempt.
  if (!out->preempted.empty()) return;
  size_t w = 0;  // waiting_[0, w) were passed over for their adapter
  while (w < waiting_.size() && running_.size() < options_.max_batch &&
         budget > 0) {
    Request* r = waiting_[w];
    if (r->lora >= 0 && !lora_.CanAcquire(r->lora)) {
      if (++out->lora_skips >= kMaxLoraSkips) break;
      ++w;
      continue;
    }
    const std::vector<int32_t> cached =
        kv_.FindCachedPrefix(r->tokens.data(), r->prompt_len, r->num_tokens());
    const uint32_t hit_tokens = uint32_t(cached.size()) * kv_.block_size();
    const uint32_t n = std::min(r->num_tokens() - hit_tokens, budget);
    if (!kv_.Allocate(r->kv, &cached, hit_tokens + n)) break;
    if (r->lora >= 0) {
      AdapterLoad load;
      bool loaded = false;
      r->lora_slot = lora_.Acquire(r->lora, &load, &loaded);
      if (loaded) out->lora_loads.push_back(load);
    }
    out->prefix_queries += r->prompt_len;
    out->prefix_hits += hit_tokens;
    r->num_computed = hit_tokens;
    r->state = RequestState::kRunning;
    waiting_.erase(waiting_.begin() + ptrdiff_t(w));
    running_.push_back(r);
    if (!r->ever_scheduled) {
      r->ever_scheduled = true;
      out->first_scheduled.push_back(r);
    }
    out->chunks.push_back({r, n});
    budget -= n;
  }
}

void Scheduler::Advance(const ScheduledChunk& c) {
  Request* r = c.request;
  r->num_computed += c.num_tokens;
  if (r->num_computed > r->num_tokens()) std::abort();
  kv_.CommitPrompt(r->kv, r->tokens.data(), r->prompt_len, r->num_computed);
}

void Scheduler::Finish(Request* r) {
  auto it = std::find(running_.begin(), running_.end(), r);
  if (it == running_.end()) std::abort();
  running_.erase(it);
  kv_.Free(r->kv);
  ReleaseAdapter(r);
  r->state = RequestState::kFinished;
}

}  // namespace tokenmeter::engine
