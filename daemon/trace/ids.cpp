#include "daemon/trace/ids.h"

namespace tokenmeter::daemon::trace {
namespace {

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void PutBigEndian(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    p[i] = uint8_t(v);
    v >>= 8;
  }
}

}  // namespace

RandomIdSource::RandomIdSource(uint64_t seed) {
  // splitmix64 never yields four zeros in a row, the one state xoshiro
  // must not start from.
  for (uint64_t& s : s_) s = SplitMix64(seed);
}

uint64_t RandomIdSource::Next() {
  const uint64_t result = Rotl(s_[0] + s_[3], 23) + s_[0];
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

TraceId RandomIdSource::NewTraceId() {
  TraceId id;
  do {
    PutBigEndian(id.data(), Next());
    PutBigEndian(id.data() + 8, Next());
  } while (IsZero(id));
  return id;
}

SpanId RandomIdSource::NewSpanId() {
  uint64_t v;
  do {
    v = Next();
  } while (v == 0);
  SpanId id;
  PutBigEndian(id.data(), v);
  return id;
}

TraceId CountingIdSource::NewTraceId() {
  TraceId id;
  PutBigEndian(id.data(), trace_base_);
  PutBigEndian(id.data() + 8, ++traces_);
  return id;
}

SpanId CountingIdSource::NewSpanId() {
  SpanId id;
  PutBigEndian(id.data(), span_base_ + ++spans_);
  return id;
}

}  // namespace tokenmeter::daemon::trace
