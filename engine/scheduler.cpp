#include "engine/scheduler.h"

#include <algorithm>
#include <cstdlib>

namespace tokenmeter::engine {
namespace {

// Priority order: lower priority value first, then earlier arrival.
bool Before(const Request* a, const Request* b) {
  return a->priority != b->priority ? a->priority < b->priority
                                    : a->arrival_seq < b->arrival_seq;
}

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& o, BlockManager& kv)
    : options_(o), kv_(kv), lora_(o.max_lora) {
  if (o.max_batch == 0 || o.max_tokens_per_step == 0) std::abort();
}

void Scheduler::Add(Request* r) {
  if (r->lora >= 0 && options_.max_lora == 0) std::abort();
  if (r->arrival_seq == 0) r->arrival_seq = next_seq_++;
  r->state = RequestState::kWaiting;
  Enqueue(r, false);
}

void Scheduler::Enqueue(Request* r, bool front) {
  if (options_.priority) {
    waiting_.insert(
        std::upper_bound(waiting_.begin(), waiting_.end(), r, Before), r);
  } else if (front) {
    waiting_.push_front(r);
  } else {
    waiting_.push_back(r);
  }
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
  ++r->preemptions;
  Enqueue(r, true);
  out->preempted.push_back(r);
}

size_t Scheduler::VictimIndex() const {
  size_t v = running_.size() - 1;
  if (!options_.priority) return v;
  for (size_t i = 0; i < running_.size(); ++i) {
    if (Before(running_[v], running_[i])) v = i;
  }
  return v;
}

void Scheduler::Schedule(SchedulerOutput* out) {
  out->chunks.clear();
  out->first_scheduled.clear();
  out->preempted.clear();
  out->prefix_queries = 0;
  out->prefix_hits = 0;
  out->lora_loads.clear();
  out->lora_skips = 0;
  out->kv_pulls.clear();
  uint32_t budget = options_.max_tokens_per_step;

  // Running requests first. Every running request has at least one token to
  // compute: its last output token, or the rest of its prefill.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Request* r = running_[i];
    const uint32_t n = std::min(r->num_tokens() - r->num_computed, budget);
    bool self_preempted = false;
    while (!kv_.Allocate(r->kv, nullptr, r->num_computed + n)) {
      // The lowest priority: the most recently scheduled (FCFS), or the
      // highest (priority, arrival).
      const size_t v = VictimIndex();
      Request* victim = running_[v];
      running_.erase(running_.begin() + ptrdiff_t(v));
      if (v < i) {
        // It already has a chunk this step (priority scheduling only):
        // take the chunk and its budget back.
        auto c = std::find_if(out->chunks.begin(), out->chunks.end(),
                              [victim](const ScheduledChunk& ch) {
                                return ch.request == victim;
                              });
        if (c == out->chunks.end()) std::abort();
        budget += c->num_tokens;
        out->chunks.erase(c);
        --i;
      }
      Preempt(victim, out);
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) {
      if (!options_.priority) break;
      continue;  // running_[i] is now the next request
    }
    out->chunks.push_back({r, n});
    budget -= n;
    ++i;
  }

  // Then waiting requests, unless this step had to preempt or the engine
  // pauses.
  if (!out->preempted.empty() || !admitting_) return;
  size_t w = 0;  // waiting_[0, w) were passed over for their adapter
  while (w < waiting_.size() &&
         running_.size() + deferred_.size() < options_.max_batch &&
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
    // A remote request receives the prompt's K/V up to its last token,
    // which it computes itself for the first output token's logits.
    const bool remote = r->remote_kv && !r->ever_scheduled &&
                        r->num_tokens() == r->prompt_len &&
                        hit_tokens + 1 < r->prompt_len;
    const uint32_t external = remote ? r->prompt_len - 1 - hit_tokens : 0;
    const uint32_t n =
        remote ? 0 : std::min(r->num_tokens() - hit_tokens, budget);
    if (!kv_.Allocate(r->kv, &cached,
                      remote ? r->prompt_len : hit_tokens + n)) {
      break;
    }
    if (r->lora >= 0) {
      AdapterLoad load;
      bool loaded = false;
      r->lora_slot = lora_.Acquire(r->lora, &load, &loaded);
      if (loaded) out->lora_loads.push_back(load);
    }
    out->prefix_queries += r->prompt_len;
    out->prefix_hits += hit_tokens;
    r->num_computed = hit_tokens;
    waiting_.erase(waiting_.begin() + ptrdiff_t(w));
    if (!r->ever_scheduled) {
      r->ever_scheduled = true;
      r->cached_tokens = hit_tokens;
      r->external_tokens = external;
      out->first_scheduled.push_back(r);
    }
    if (remote) {
      r->state = RequestState::kDeferred;
      r->kv_first_block = hit_tokens / kv_.block_size();
      r->kv_num_blocks = kv_.BlocksFor(r->prompt_len - 1) - r->kv_first_block;
      deferred_.push_back(r);
      out->kv_pulls.push_back(r);
      continue;
    }
    r->state = RequestState::kRunning;
    running_.push_back(r);
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
  FinishHold(r);
  ReleaseHeld(r);
}

void Scheduler::FinishHold(Request* r) {
  auto it = std::find(running_.begin(), running_.end(), r);
  if (it == running_.end()) std::abort();
  running_.erase(it);
  ReleaseAdapter(r);
  r->state = RequestState::kHeld;
}

void Scheduler::ReleaseHeld(Request* r) {
  if (r->state != RequestState::kHeld) std::abort();
  kv_.Free(r->kv);
  r->state = RequestState::kFinished;
}

void Scheduler::LandKv(Request* r) {
  auto it = std::find(deferred_.begin(), deferred_.end(), r);
  if (it == deferred_.end() || r->state != RequestState::kDeferred) {
    std::abort();
  }
  deferred_.erase(it);
  r->num_computed = r->cached_tokens + r->external_tokens;
  kv_.CommitPrompt(r->kv, r->tokens.data(), r->prompt_len, r->num_computed);
  r->state = RequestState::kRunning;
  running_.push_back(r);
}

void Scheduler::AbortDeferred(Request* r) {
  auto it = std::find(deferred_.begin(), deferred_.end(), r);
  if (it == deferred_.end() || r->state != RequestState::kDeferred) {
    std::abort();
  }
  deferred_.erase(it);
  kv_.Free(r->kv);
  ReleaseAdapter(r);
  r->num_computed = 0;
  r->state = RequestState::kFinished;
}

void Scheduler::PreemptAll(SchedulerOutput* out) {
  // The last scheduled first: each goes to the front, so the queue's head
  // ends up in scheduling order.
  while (!running_.empty()) {
    Request* r = running_.back();
    running_.pop_back();
    Preempt(r, out);
  }
}

}  // namespace tokenmeter::engine
