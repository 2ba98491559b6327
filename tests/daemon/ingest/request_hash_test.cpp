// The tracker's keyed request hash (daemon/ingest/request_hash.h): SipHash
// against published and independent values, keys that change every hash,
// and ids chosen to share one probe run under an unkeyed mix, which the
// keyed hash spreads over the index.
#include "daemon/ingest/request_hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/ingest/request_index.h"

namespace tokenmeter::daemon {
namespace {

std::string Range(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(char(i));
  return s;
}

TEST(SipHashTest, MatchesThePapersVector) {
  // SipHash-2-4, key 00 01 .. 0f, message 00 01 .. 0e (Aumasson and
  // Bernstein, "SipHash: a fast short-input PRF", appendix A).
  EXPECT_EQ(
      (SipHash<2, 4>(0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull, Range(15))),
      0xa129ca6149be45e5ull);
}

TEST(SipHashTest, OneThreeMatchesPython) {
  // CPython 3.11+ hashes bytes with SipHash-1-3; PYTHONHASHSEED=0 makes
  // its key zero: PYTHONHASHSEED=0 python3 -c 'print(hash(b"abc") % 2**64)'.
  EXPECT_EQ((SipHash<1, 3>(0, 0, "abc")), 13851880170939887858ull);
  EXPECT_EQ((SipHash<1, 3>(0, 0, std::string(40, 'a'))),
            2012732711654038980ull);
  EXPECT_EQ((SipHash<1, 3>(0, 0, "tokenmeter-request-0123456789abcdef")),
            3710631988262900702ull);
  EXPECT_EQ((SipHash<1, 3>(0, 0, Range(15))), 17514137373579004394ull);
  EXPECT_EQ((SipHash<1, 3>(0, 0, Range(8))), 16921169381604339434ull);
  EXPECT_EQ((SipHash<1, 3>(0, 0, Range(7))), 3389392686435873370ull);
  EXPECT_EQ(RequestHash(0, 0, 0, 0).Bytes("abc"), 13851880170939887858ull);
}

TEST(RequestHashTest, TheKeyChangesEveryHash) {
  const RequestHash a(1, 2, 3, 4), a2(1, 2, 3, 4), b(1, 2, 3, 5), c(1, 3, 3, 4);
  EXPECT_EQ(a.Int(7, 42), a2.Int(7, 42));
  EXPECT_EQ(a.Bytes("cmpl-1"), a2.Bytes("cmpl-1"));
  EXPECT_NE(a.Int(7, 42), b.Int(7, 42));
  EXPECT_NE(a.Bytes("cmpl-1"), c.Bytes("cmpl-1"));
  EXPECT_NE(a.Int(7, 42), a.Int(8, 42));  // the id space counts
  // Two daemons draw two keys.
  const RequestHash r1, r2;
  EXPECT_NE(r1.Int(0, 1), r2.Int(0, 1));
  EXPECT_NE(r1.Bytes("cmpl-1"), r2.Bytes("cmpl-1"));
}

// The tracker's hash before it was keyed: public, so a peer could invert it.
uint64_t UnkeyedMix(uint64_t a, uint64_t b) {
  uint64_t h = a * 0x9e3779b97f4a7c15ull ^ b;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

// The id whose UnkeyedMix in `space` is `target` (each step undone: the
// xorshift by 32 is its own inverse, the multiply by an odd constant is
// undone by its inverse mod 2^64).
uint64_t Preimage(uint64_t space, uint64_t target) {
  constexpr uint64_t c = 0xd6e8feb86659fd93ull;
  uint64_t inv = c;  // Newton: each step doubles the correct low bits
  for (int i = 0; i < 6; ++i) inv *= 2 - c * inv;
  uint64_t h = target;
  h ^= h >> 32;
  h *= inv;
  h ^= h >> 32;
  return h ^ (space * 0x9e3779b97f4a7c15ull);
}

size_t LongestRunOf(const std::vector<uint64_t>& hashes) {
  RequestIndex index;
  for (size_t i = 0; i < hashes.size(); ++i) {
    index.Insert(hashes[i], uint32_t(i));
  }
  return index.LongestRun();
}

TEST(RequestHashTest, IdsChosenToCollideDoNotShareAProbeRun) {
  constexpr uint64_t kSpace = 1;
  constexpr int kIds = 2048;
  // Ids a peer could pick against the unkeyed mix: every hash with the
  // same upper half, so the same home slot and the same tag: one run of
  // kIds slots that every look-up walks, comparing keys all the way.
  std::vector<uint64_t> ids;
  for (int i = 0; i < kIds; ++i) {
    ids.push_back(Preimage(kSpace, (uint64_t{0x5eed} << 32) | uint64_t(i)));
  }
  std::vector<uint64_t> unkeyed, keyed;
  const RequestHash hash;
  for (uint64_t id : ids) {
    ASSERT_EQ(UnkeyedMix(kSpace, id) >> 32, 0x5eedu);
    unkeyed.push_back(UnkeyedMix(kSpace, id));
    keyed.push_back(hash.Int(kSpace, id));
  }
  EXPECT_EQ(LongestRunOf(unkeyed), size_t(kIds));
  // Keyed, they spread like any ids: 2048 in 4096 slots, whose longest run
  // is a few dozen (the bound leaves a wide margin for chance).
  EXPECT_LT(LongestRunOf(keyed), 128u);
}

TEST(RequestHashTest, SequentialIdsSpread) {
  // Engines number their requests 0, 1, 2, ...: those too spread (the
  // index keys its home slot on the hash's upper half). 2,048 ids in 4,096
  // slots, as above (at the index's fullest, 3/4, runs of a few hundred
  // happen by chance).
  const RequestHash hash;
  std::vector<uint64_t> hashes;
  for (uint64_t id = 0; id < 2048; ++id) hashes.push_back(hash.Int(2, id));
  EXPECT_LT(LongestRunOf(hashes), 128u);
  hashes.clear();
  for (uint64_t id = 0; id < 2048; ++id) {
    hashes.push_back(hash.Int(2, hash.Bytes("cmpl-" + std::to_string(id))));
  }
  EXPECT_LT(LongestRunOf(hashes), 128u);
}

}  // namespace
}  // namespace tokenmeter::daemon
