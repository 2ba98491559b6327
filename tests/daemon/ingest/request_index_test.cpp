// RequestIndex against a reference map: random inserts, look-ups and
// erasures with hashes made to collide (same home slot, same upper half,
// runs that wrap around the array's end), growth, and the backward shift
// that keeps every remaining handle findable.
#include "daemon/ingest/request_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace tokenmeter::daemon {
namespace {

// Keys are handles' values: handle h has key keys[h]; the hash a test
// gives each key decides the collisions.
struct Model {
  explicit Model(uint64_t (*h)(uint64_t)) : hash(h) {}
  RequestIndex index;
  std::map<uint64_t, uint32_t> by_key;  // key -> handle
  std::vector<uint64_t> keys;           // handle -> key
  uint64_t (*hash)(uint64_t);

  uint32_t Find(uint64_t key) const {
    return index.Find(hash(key), [&](uint32_t h) { return keys[h] == key; });
  }
  void Insert(uint64_t key) {
    const uint32_t h = uint32_t(keys.size());
    keys.push_back(key);
    index.Insert(hash(key), h);
    by_key[key] = h;
  }
  void Erase(uint64_t key) {
    index.Erase(hash(key), by_key.at(key));
    by_key.erase(key);
  }
  void Check() const {
    ASSERT_EQ(index.size(), by_key.size());
    for (const auto& [key, h] : by_key) ASSERT_EQ(Find(key), h) << key;
  }
};

uint64_t Spread(uint64_t k) { return (k * 0x9e3779b97f4a7c15ull) ^ (k << 7); }
// Eight homes and four upper halves: long runs, equal tags of other keys.
uint64_t Crowded(uint64_t k) {
  return uint64_t((k % 8) | ((k % 4) << 3)) << 32;
}
// Homes at the array's last slots: runs wrap to slot 0.
uint64_t Wrapping(uint64_t k) { return uint64_t(13 + k % 3) << 32; }
// Every key the same hash.
uint64_t Same(uint64_t) { return uint64_t(7) << 32; }

TEST(RequestIndexTest, EmptyFindsNothing) {
  RequestIndex index;
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.Find(42, [](uint32_t) { return true; }), RequestIndex::kNone);
}

TEST(RequestIndexTest, FindAsksOnlyAboutMatchingUpperHalves) {
  RequestIndex index;
  index.Insert(uint64_t(5) << 32 | 1, 0);
  index.Insert(uint64_t(6) << 32 | 1, 1);
  std::vector<uint32_t> asked;
  EXPECT_EQ(index.Find(uint64_t(6) << 32,
                       [&](uint32_t h) {
                         asked.push_back(h);
                         return true;
                       }),
            1u);
  EXPECT_EQ(asked, std::vector<uint32_t>{1});
}

TEST(RequestIndexTest, GrowsAndKeepsEverything) {
  Model m(Spread);
  for (uint64_t k = 0; k < 10000; ++k) m.Insert(k);
  m.Check();
  EXPECT_GE(m.index.capacity() * 3, m.index.size() * 4);
  const size_t capacity = m.index.capacity();
  m.index.Reserve(capacity);  // more than fits at 3/4: grows
  EXPECT_GT(m.index.capacity(), capacity);
  m.Check();
}

TEST(RequestIndexTest, RandomOperationsMatchTheModel) {
  for (auto hash : {Spread, Crowded, Wrapping, Same}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(seed);
      Model m(hash);
      std::mt19937_64 rng(seed);
      auto next = [&rng](uint64_t n) { return rng() % n; };
      // Few live keys (crowded hashes make long runs), then many.
      const uint64_t space = hash == Spread ? 3000 : 40;
      for (int op = 0; op < 4000; ++op) {
        const uint64_t key = next(space);
        const bool present = m.by_key.count(key) != 0;
        if (!present && next(3) != 0) {
          m.Insert(key);
        } else if (present) {
          m.Erase(key);
        }
        if (op % 97 == 0) {
          m.Check();
          if (testing::Test::HasFatalFailure()) return;
        }
        const uint32_t want =
            m.by_key.count(key) != 0 ? m.by_key[key] : RequestIndex::kNone;
        ASSERT_EQ(m.Find(key), want) << "op " << op << " key " << key;
      }
      m.Check();
      while (!m.by_key.empty()) m.Erase(m.by_key.begin()->first);
      m.Check();
      EXPECT_EQ(m.index.size(), 0u);
    }
  }
}

}  // namespace
}  // namespace tokenmeter::daemon
