// Keyed hashes of request ids, for the tracker's index (tracker.h,
// request_index.h).
//
// The ids come from the peers on the ingest socket. With a hash that
// anyone can compute (the tracker used one before), a peer could choose
// ids that all fall into one probe run of RequestIndex and make every
// look-up of every engine's requests walk it: a few thousand such ids turn
// the daemon's O(1) per event into O(ids) (hash flooding). Keyed with 256
// random bits drawn when the daemon starts, the home slot of an id is
// unpredictable to a peer that does not know the key:
//
//   * a string id: SipHash-1-3 (Aumasson and Bernstein; what Python and
//     Rust's standard maps use against the same attack) of its bytes under
//     a 128-bit key, then mixed with its id space as an integer id is;
//   * an integer id: two rounds of a 64 x 64 -> 128-bit multiply folded to
//     64 bits (the mix of wyhash and of Go's runtime map hash without AES),
//     the first of the id and the id space each XORed with 64 key bits.
//
// The keyed hashes cost about what the unkeyed ones did: the integer mix is
// two multiplies as before; SipHash-1-3 over a 40-byte id is a few rounds
// of adds and rotates where FNV-1a multiplied once per byte.
//
// Thread-compatible (const after construction).
#ifndef TOKENMETER_DAEMON_INGEST_REQUEST_HASH_H_
#define TOKENMETER_DAEMON_INGEST_REQUEST_HASH_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tokenmeter::daemon {

// SipHash-C-D of `s` under the key (k0, k1) (little-endian words of the
// 16-byte key), as in the reference implementation. C compression rounds
// per 8-byte word, D finalization rounds.
template <int C, int D>
uint64_t SipHash(uint64_t k0, uint64_t k1, std::string_view s) {
  uint64_t v0 = k0 ^ 0x736f6d6570736575ull;
  uint64_t v1 = k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ull;
  uint64_t v3 = k1 ^ 0x7465646279746573ull;
  const auto rotl = [](uint64_t x, int b) {
    return (x << b) | (x >> (64 - b));
  };
  const auto round = [&] {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  };
  const auto load_le = [](const unsigned char* p, size_t n) {
    uint64_t w = 0;
    for (size_t i = 0; i < n; ++i) w |= uint64_t(p[i]) << (8 * i);
    return w;
  };
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const size_t whole = n & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m;
    std::memcpy(&m, p + i, 8);
    if constexpr (std::endian::native == std::endian::big) {
      m = __builtin_bswap64(m);
    }
    v3 ^= m;
    for (int r = 0; r < C; ++r) round();
    v0 ^= m;
  }
  const uint64_t last = (uint64_t(n) << 56) | load_le(p + whole, n - whole);
  v3 ^= last;
  for (int r = 0; r < C; ++r) round();
  v0 ^= last;
  v2 ^= 0xff;
  for (int r = 0; r < D; ++r) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

class RequestHash {
 public:
  // A key of 256 random bits from std::random_device (once, at start).
  RequestHash();
  // A given key (tests): SipHash's (k0, k1) and the integer mix's (m0, m1).
  RequestHash(uint64_t k0, uint64_t k1, uint64_t m0, uint64_t m1)
      : k0_(k0), k1_(k1), m0_(m0), m1_(m1) {}

  // The hash of integer id `num` (or of a string id's Bytes()) in request
  // id space `space`. A few nanoseconds; inline.
  uint64_t Int(uint64_t space, uint64_t num) const {
    return Fold(Fold(num ^ m0_, space ^ m1_), 0x9e3779b97f4a7c15ull);
  }
  // The hash of a string id's bytes (1 to TM_MAX_RID_BYTES), before Int().
  uint64_t Bytes(std::string_view s) const {
    return SipHash<1, 3>(k0_, k1_, s);
  }

 private:
  __extension__ using U128 = unsigned __int128;  // GCC and Clang
  static uint64_t Fold(uint64_t a, uint64_t b) {
    const U128 p = static_cast<U128>(a) * b;
    return uint64_t(p) ^ uint64_t(p >> 64);
  }

  uint64_t k0_, k1_, m0_, m1_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_REQUEST_HASH_H_
