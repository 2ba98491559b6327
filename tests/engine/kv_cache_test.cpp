#include "engine/kv_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

namespace tokenmeter::engine {
namespace {

std::vector<int32_t> Tokens(size_t n, int32_t first = 1) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(BlockManagerTest, AllocatesWholeBlocksAndFreesThem) {
  BlockManager kv({8, 4, true});
  KvSeq s;
  ASSERT_TRUE(kv.Allocate(s, nullptr, 5));  // 2 blocks
  EXPECT_EQ(s.blocks.size(), 2u);
  EXPECT_EQ(kv.num_free_blocks(), 6u);
  EXPECT_DOUBLE_EQ(kv.Usage(), 0.25);
  ASSERT_TRUE(kv.Allocate(s, nullptr, 8));  // still 2
  EXPECT_EQ(s.blocks.size(), 2u);
  ASSERT_TRUE(kv.Allocate(s, nullptr, 9));  // a third
  EXPECT_EQ(s.blocks.size(), 3u);
  EXPECT_EQ(std::set<int32_t>(s.blocks.begin(), s.blocks.end()).size(), 3u);
  kv.Free(s);
  EXPECT_TRUE(s.blocks.empty());
  EXPECT_EQ(kv.num_free_blocks(), 8u);
  EXPECT_DOUBLE_EQ(kv.Usage(), 0.0);
}

TEST(BlockManagerTest, RefusesWhenOutOfBlocksAndChangesNothing) {
  BlockManager kv({4, 4, true});
  KvSeq a, b;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 12));  // 3 of 4 blocks
  EXPECT_FALSE(kv.Allocate(b, nullptr, 8));  // needs 2
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(kv.num_free_blocks(), 1u);
  EXPECT_FALSE(kv.Allocate(a, nullptr, 20));  // a needs 2 more
  EXPECT_EQ(a.blocks.size(), 3u);
  kv.Free(a);
  EXPECT_TRUE(kv.Allocate(b, nullptr, 16));
}

TEST(BlockManagerTest, FindsCommittedFullPromptBlocks) {
  BlockManager kv({16, 4, true});
  const auto prompt = Tokens(10);  // 2 full blocks + 2 tokens
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 10));
  kv.CommitPrompt(a, prompt.data(), 10, 10);
  EXPECT_EQ(a.num_hashed, 2u);

  // Same prompt: both full blocks found (the partial one never is).
  auto hit = kv.FindCachedPrefix(prompt.data(), 10, 10);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], a.blocks[0]);
  EXPECT_EQ(hit[1], a.blocks[1]);
  KvSeq b;
  ASSERT_TRUE(kv.Allocate(b, &hit, 10));
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_NE(b.blocks[2], a.blocks[2]);
  EXPECT_EQ(b.num_hashed, 2u);
  EXPECT_EQ(kv.num_free_blocks(), 16u - 4u);  // two shared, two own
}

TEST(BlockManagerTest, HashChainNamesTheWholePrefix) {
  BlockManager kv({16, 4, true});
  auto prompt = Tokens(12);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 12));
  kv.CommitPrompt(a, prompt.data(), 12, 12);
  // Same second and third blocks after a different first block: no hit.
  auto other = prompt;
  other[0] = 999;
  EXPECT_TRUE(kv.FindCachedPrefix(other.data(), 12, 13).empty());
  // Same first block, different second: only the first hits.
  other = prompt;
  other[5] = 999;
  EXPECT_EQ(kv.FindCachedPrefix(other.data(), 12, 13).size(), 1u);
  EXPECT_NE(BlockManager::ChainHash(0, prompt.data(), 4),
            BlockManager::ChainHash(1, prompt.data(), 4));
}

TEST(BlockManagerTest, LeavesOneTokenToCompute) {
  BlockManager kv({16, 4, true});
  const auto prompt = Tokens(8);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 8));
  kv.CommitPrompt(a, prompt.data(), 8, 8);
  // An 8-token prompt cached in full: only the first block may be reused,
  // so that its last token is computed and yields logits.
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 8, 8).size(), 1u);
  // With an output token after it, both prompt blocks may be reused.
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 8, 9).size(), 2u);
}

TEST(BlockManagerTest, CommitsOnlyComputedPromptBlocks) {
  BlockManager kv({16, 4, true});
  const auto prompt = Tokens(12);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 12));
  kv.CommitPrompt(a, prompt.data(), 12, 6);  // chunked prefill, 6 done
  EXPECT_EQ(a.num_hashed, 1u);
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 12, 13).size(), 1u);
  kv.CommitPrompt(a, prompt.data(), 12, 12);
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 12, 13).size(), 3u);
}

TEST(BlockManagerTest, FreedCachedBlocksStayFindableUntilReused) {
  BlockManager kv({4, 4, true});
  const auto prompt = Tokens(8);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 9));  // 3 blocks
  kv.CommitPrompt(a, prompt.data(), 8, 9);
  kv.Free(a);
  EXPECT_EQ(kv.num_free_blocks(), 4u);  // cached blocks count as free
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 8, 9).size(), 2u);

  // Unhashed free blocks are handed out before cached ones.
  KvSeq b;
  ASSERT_TRUE(kv.Allocate(b, nullptr, 8));  // 2 blocks
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 8, 9).size(), 2u);
  // Taking the rest evicts the cached prefix.
  KvSeq c;
  ASSERT_TRUE(kv.Allocate(c, nullptr, 8));
  EXPECT_TRUE(kv.FindCachedPrefix(prompt.data(), 8, 9).empty());
  EXPECT_EQ(kv.num_free_blocks(), 0u);
}

TEST(BlockManagerTest, RevivingCachedBlocksUsesFreeBlocks) {
  BlockManager kv({4, 4, true});
  const auto prompt = Tokens(8);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 9));
  kv.CommitPrompt(a, prompt.data(), 8, 9);
  kv.Free(a);
  KvSeq hold;
  ASSERT_TRUE(kv.Allocate(hold, nullptr, 4));  // 1 unhashed block
  auto hit = kv.FindCachedPrefix(prompt.data(), 8, 9);
  ASSERT_EQ(hit.size(), 2u);
  // 2 revived + 2 fresh > 3 free.
  KvSeq b;
  EXPECT_FALSE(kv.Allocate(b, &hit, 16));
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(kv.num_free_blocks(), 3u);
  ASSERT_TRUE(kv.Allocate(b, &hit, 12));  // 2 revived + 1 fresh
  EXPECT_EQ(kv.num_free_blocks(), 0u);
}

TEST(BlockManagerTest, SharedBlocksFreeOnlyWithTheirLastUser) {
  BlockManager kv({8, 4, true});
  const auto prompt = Tokens(8);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 9));
  kv.CommitPrompt(a, prompt.data(), 8, 9);
  auto hit = kv.FindCachedPrefix(prompt.data(), 8, 9);
  KvSeq b;
  ASSERT_TRUE(kv.Allocate(b, &hit, 9));
  EXPECT_EQ(kv.num_free_blocks(), 8u - 4u);
  kv.Free(a);
  EXPECT_EQ(kv.num_free_blocks(), 8u - 3u);  // a's own third block
  kv.Free(b);
  EXPECT_EQ(kv.num_free_blocks(), 8u);
}

TEST(BlockManagerTest, DisabledPrefixCacheNeverHits) {
  BlockManager kv({8, 4, false});
  const auto prompt = Tokens(8);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 9));
  kv.CommitPrompt(a, prompt.data(), 8, 9);
  EXPECT_TRUE(kv.FindCachedPrefix(prompt.data(), 8, 9).empty());
}

// Sleep mode releases the K/V: the prefix cache must forget them too.
TEST(BlockManagerTest, ResetForgetsThePrefixCache) {
  BlockManager kv({8, 4, true});
  const auto prompt = Tokens(9);
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 9));
  kv.CommitPrompt(a, prompt.data(), 9, 9);
  kv.Free(a);
  EXPECT_EQ(kv.num_cached_blocks(), 2u);
  EXPECT_EQ(kv.FindCachedPrefix(prompt.data(), 9, 9).size(), 2u);
  kv.Reset();
  EXPECT_EQ(kv.num_cached_blocks(), 0u);
  EXPECT_TRUE(kv.FindCachedPrefix(prompt.data(), 9, 9).empty());
  EXPECT_EQ(kv.num_free_blocks(), 8u);
  // Every block can be handed out again, each once.
  KvSeq b;
  ASSERT_TRUE(kv.Allocate(b, nullptr, 32));
  EXPECT_EQ(std::set<int32_t>(b.blocks.begin(), b.blocks.end()).size(), 8u);
  EXPECT_EQ(kv.num_free_blocks(), 0u);
}

TEST(BlockManagerDeathTest, ResetWhileABlockIsHeldAborts) {
  BlockManager kv({8, 4, true});
  KvSeq a;
  ASSERT_TRUE(kv.Allocate(a, nullptr, 4));
  EXPECT_DEATH(kv.Reset(), "");
}

}  // namespace
}  // namespace tokenmeter::engine
