// Rng: a small seeded pseudo-random generator (splitmix64) with the few
// distributions the engine needs, written out so that a seed gives the same
// workload, weights and samples on every platform and standard library
// (std::uniform_*_distribution results are implementation-defined).
//
// Not thread-safe; one owner. Every call is O(1) and allocates nothing.
// C++17-clean (model weights are generated through it for both backends).
#ifndef TOKENMETER_ENGINE_RNG_H_
#define TOKENMETER_ENGINE_RNG_H_

#include <cmath>
#include <cstdint>

namespace tokenmeter::engine {

// One round of splitmix64's output function: a good 64-bit mixer.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t NextU64() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix64(state_);
  }
  // Uniform in [0, 1), 53 random bits.
  double Uniform01() { return double(NextU64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (lo <= hi). Modulo reduction; the bias is
  // below span / 2^64, far under anything a test could see.
  uint64_t UniformInt(uint64_t lo, uint64_t hi) {
    const uint64_t span = hi - lo + 1;
    if (span == 0) return NextU64();  // the full 64-bit range
    return lo + NextU64() % span;
  }
  // Exponential with the given mean.
  double Exponential(double mean) { return -std::log1p(-Uniform01()) * mean; }
  // Uniform float in [-a, a).
  float Symmetric(float a) { return float((2.0 * Uniform01() - 1.0) * a); }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_RNG_H_
