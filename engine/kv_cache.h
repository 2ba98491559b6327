// BlockManager: the paged KV cache's bookkeeping. A fixed pool of blocks of
// `block_size` token slots; each sequence owns a block table (the block ids
// holding its positions 0, bs, 2bs, ...). The K/V values themselves live in
// the model backend, addressed through these block tables.
//
// Prefix cache: a full block of prompt tokens whose K/V have been computed
// is registered under the hash chain h(b) = H(h(b-1), tokens of block b),
// which names the whole prefix up to that block (K/V at a position depend on
// every earlier token). A later prompt with the same prefix finds those
// blocks and shares them (reference counts) instead of recomputing them.
// A registered block whose last user frees it stays cached but evictable:
// it counts as free, and allocation reuses the least recently freed ones
// last. Blocks without a hash are reused first.
//
// Memory: O(num_blocks) plus the hash map (at most num_blocks entries).
// Not thread-safe: the engine loop owns it. Every call is O(blocks touched).
#ifndef TOKENMETER_ENGINE_KV_CACHE_H_
#define TOKENMETER_ENGINE_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tokenmeter::engine {

struct KvCacheOptions {
  uint32_t num_blocks = 1024;
  uint32_t block_size = 16;
  bool prefix_caching = true;
};

// One sequence's share of the cache. Owned by the request; only the
// BlockManager changes it.
struct KvSeq {
  std::vector<int32_t> blocks;  // block table
  uint32_t num_hashed = 0;      // leading blocks registered or found cached
  uint64_t last_hash = 0;       // hash chain value of block num_hashed - 1
};

class BlockManager {
 public:
  explicit BlockManager(const KvCacheOptions& o);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  uint32_t block_size() const { return block_size_; }
  uint32_t num_blocks() const { return num_blocks_; }
  // Blocks no sequence holds, cached ones included.
  uint32_t num_free_blocks() const { return num_free_; }
  // Fraction of blocks some sequence holds, 0..1 (vLLM's kv_cache_usage).
  double Usage() const {
    return double(num_blocks_ - num_free_) / double(num_blocks_);
  }
  // Blocks needed to hold `tokens` positions.
  uint32_t BlocksFor(uint32_t tokens) const {
    return (tokens + block_size_ - 1) / block_size_;
  }

  // The cached blocks that hold the longest prefix of `prompt` made of full
  // blocks, leaving at least one token of `num_tokens` (the sequence's
  // length, prompt included) to compute. Changes nothing; pass the result to
  // Allocate() in the same scheduler step.
  std::vector<int32_t> FindCachedPrefix(const int32_t* prompt,
                                        uint32_t prompt_len,
                                        uint32_t num_tokens) const;

  // Makes `seq` hold enough blocks for `num_tokens` positions. For a
  // sequence with no blocks, `cached` (may be null) is the prefix found by
  // FindCachedPrefix(); those blocks are shared first. Returns false and
  // changes nothing when the pool cannot supply the new blocks.
  bool Allocate(KvSeq& seq, const std::vector<int32_t>* cached,
                uint32_t num_tokens);

  // Registers the sequence's full prompt blocks whose K/V are now computed
  // (positions < num_computed) in the prefix cache. A block whose prefix is
  // already cached in another block stays unregistered (a duplicate).
  void CommitPrompt(KvSeq& seq, const int32_t* prompt, uint32_t prompt_len,
                    uint32_t num_computed);

  // Releases every block of `seq` (tail first, so that a sequence's last
  // blocks are evicted before its first) and empties it.
  void Free(KvSeq& seq);

  // Forgets the prefix cache (sleep mode: the K/V values it named are
  // gone) and puts every block back in the free list in id order. Aborts
  // while a sequence holds a block. O(num_blocks).
  void Reset();

  // Blocks registered in the prefix cache (tests).
  size_t num_cached_blocks() const { return cached_.size(); }

  // The hash chain's next link, exposed for tests.
  static uint64_t ChainHash(uint64_t parent, const int32_t* tokens, uint32_t n);

 private:
  static constexpr int32_t kNil = -1;
  void Unlink(int32_t b);
  void PushFront(int32_t b);
  void PushBack(int32_t b);
  int32_t PopFront();

  const uint32_t num_blocks_;
  const uint32_t block_size_;
  const bool prefix_caching_;
  uint32_t num_free_;
  std::vector<uint32_t> refs_;
  std::vector<uint64_t> hash_;  // valid where hashed_
  std::vector<uint8_t> hashed_;
  // Free list, doubly linked through block ids: allocation pops the head.
  std::vector<int32_t> prev_, next_;
  std::vector<uint8_t> in_free_list_;
  int32_t head_ = kNil, tail_ = kNil;
  std::unordered_map<uint64_t, int32_t> cached_;  // hash -> block
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_KV_CACHE_H_
