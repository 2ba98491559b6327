#include "engine/kv_cache.h"

#include <cstdlib>

#include "engine/rng.h"

namespace tokenmeter::engine {

BlockManager::BlockManager(const KvCacheOptions& o)
    : num_blocks_(o.num_blocks),
      block_size_(o.block_size),
      prefix_caching_(o.prefix_caching),
      num_free_(o.num_blocks),
      refs_(o.num_blocks, 0),
      hash_(o.num_blocks, 0),
      hashed_(o.num_blocks, 0),
      prev_(o.num_blocks, kNil),
      next_(o.num_blocks, kNil),
      in_free_list_(o.num_blocks, 0) {
  if (num_blocks_ == 0 || block_size_ == 0) std::abort();
  for (uint32_t b = 0; b < num_blocks_; ++b) PushBack(int32_t(b));
  cached_.reserve(num_blocks_);
}

uint64_t BlockManager::ChainHash(uint64_t parent, const int32_t* tokens,
                                 uint32_t n) {
  uint64_t h = Mix64(parent ^ 0x6b76626cULL);
  for (uint32_t i = 0; i < n; ++i) h = Mix64(h ^ uint32_t(tokens[i]));
  return h;
}

std::vector<int32_t> BlockManager::FindCachedPrefix(const int32_t* prompt,
                                                    uint32_t prompt_len,
                                                    uint32_t num_tokens) const {
  std::vector<int32_t> found;
  if (!prefix_caching_ || num_tokens == 0) return found;
  uint32_t max_blocks = prompt_len / block_size_;
  const uint32_t keep_one = (num_tokens - 1) / block_size_;
  if (keep_one < max_blocks) max_blocks = keep_one;
  uint64_t h = 0;
  for (uint32_t b = 0; b < max_blocks; ++b) {
    h = ChainHash(h, prompt + size_t(b) * block_size_, block_size_);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    found.push_back(it->second);
  }
  return found;
}

bool BlockManager::Allocate(KvSeq& seq, const std::vector<int32_t>* cached,
                            uint32_t num_tokens) {
  const bool take_cached = cached != nullptr && !cached->empty();
  if (take_cached && !seq.blocks.empty()) std::abort();
  const uint32_t have = uint32_t(seq.blocks.size()) +
                        (take_cached ? uint32_t(cached->size()) : 0);
  const uint32_t need = BlocksFor(num_tokens);
  const uint32_t fresh = need > have ? need - have : 0;
  // Cached blocks nobody holds sit in the free list: taking them uses up
  // free blocks too.
  uint32_t revived = 0;
  if (take_cached) {
    for (int32_t b : *cached) revived += refs_[size_t(b)] == 0 ? 1 : 0;
  }
  if (fresh + revived > num_free_) return false;

  if (take_cached) {
    uint64_t h = 0;
    for (int32_t b : *cached) {
      if (refs_[size_t(b)]++ == 0) {
        Unlink(b);
        --num_free_;
      }
      seq.blocks.push_back(b);
      h = hash_[size_t(b)];
    }
    seq.num_hashed = uint32_t(cached->size());
    seq.last_hash = h;
  }
  for (uint32_t i = 0; i < fresh; ++i) {
    const int32_t b = PopFront();
    if (hashed_[size_t(b)]) {  // evict its cached prefix
      auto it = cached_.find(hash_[size_t(b)]);
      if (it != cached_.end() && it->second == b) cached_.erase(it);
      hashed_[size_t(b)] = 0;
    }
    refs_[size_t(b)] = 1;
    --num_free_;
    seq.blocks.push_back(b);
  }
  return true;
}

void BlockManager::CommitPrompt(KvSeq& seq, const int32_t* prompt,
                                uint32_t prompt_len, uint32_t num_computed) {
  if (!prefix_caching_) return;
  const uint32_t upto = num_computed < prompt_len ? num_computed : prompt_len;
  const uint32_t full = upto / block_size_;
  while (seq.num_hashed < full && seq.num_hashed < seq.blocks.size()) {
    const uint32_t b = seq.num_hashed;
    const uint64_t h =
        ChainHash(seq.last_hash, prompt + size_t(b) * block_size_, block_size_);
    const int32_t block = seq.blocks[b];
    if (!hashed_[size_t(block)] && cached_.find(h) == cached_.end()) {
      hash_[size_t(block)] = h;
      hashed_[size_t(block)] = 1;
      cached_.emplace(h, block);
    }
    seq.last_hash = h;
    ++seq.num_hashed;
  }
}

void BlockManager::Free(KvSeq& seq) {
  for (size_t i = seq.blocks.size(); i-- > 0;) {
    const int32_t b = seq.blocks[i];
    if (refs_[size_t(b)] == 0) std::abort();
    if (--refs_[size_t(b)] == 0) {
      if (hashed_[size_t(b)]) {
        PushBack(b);  // cached: evicted last, least recently freed first
      } else {
        PushFront(b);
      }
      ++num_free_;
    }
  }
  seq.blocks.clear();
  seq.num_hashed = 0;
  seq.last_hash = 0;
}

void BlockManager::Reset() {
  if (num_free_ != num_blocks_) std::abort();
  cached_.clear();
  head_ = tail_ = kNil;
  for (uint32_t b = 0; b < num_blocks_; ++b) {
    hashed_[b] = 0;
    hash_[b] = 0;
    prev_[b] = next_[b] = kNil;
    in_free_list_[b] = 0;
  }
  for (uint32_t b = 0; b < num_blocks_; ++b) PushBack(int32_t(b));
}

void BlockManager::Unlink(int32_t b) {
  const auto i = size_t(b);
  if (!in_free_list_[i]) std::abort();
  if (prev_[i] != kNil) {
    next_[size_t(prev_[i])] = next_[i];
  } else {
    head_ = next_[i];
  }
  if (next_[i] != kNil) {
    prev_[size_t(next_[i])] = prev_[i];
  } else {
    tail_ = prev_[i];
  }
  prev_[i] = next_[i] = kNil;
  in_free_list_[i] = 0;
}

void BlockManager::PushFront(int32_t b) {
  const auto i = size_t(b);
  prev_[i] = kNil;
  next_[i] = head_;
  if (head_ != kNil) prev_[size_t(head_)] = b;
  head_ = b;
  if (tail_ == kNil) tail_ = b;
  in_free_list_[i] = 1;
}

void BlockManager::PushBack(int32_t b) {
  const auto i = size_t(b);
  next_[i] = kNil;
  prev_[i] = tail_;
  if (tail_ != kNil) next_[size_t(tail_)] = b;
  tail_ = b;
  if (head_ == kNil) head_ = b;
  in_free_list_[i] = 1;
}

int32_t BlockManager::PopFront() {
  const int32_t b = head_;
  if (b == kNil) std::abort();
  Unlink(b);
  return b;
}

}  // namespace tokenmeter::engine
