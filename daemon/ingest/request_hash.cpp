#include "daemon/ingest/request_hash.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <exception>
#include <random>

namespace tokenmeter::daemon {
namespace {

// Fills `key` with random bits; false when the kernel gave fewer.
bool KernelRandom(uint64_t (&key)[4]) {
  const ssize_t n = getrandom(key, sizeof key, GRND_NONBLOCK);
  return n == ssize_t(sizeof key);
}

bool DeviceRandom(uint64_t (&key)[4]) {
  try {
    std::random_device device;
    for (uint64_t& k : key) k = (uint64_t(device()) << 32) | device();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The last resort: what differs between daemons and starts (the clocks,
// the pid, where ASLR put the stack and the code), spread by SipHash.
void FallbackRandom(uint64_t (&key)[4]) {
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  const uint64_t parts[5] = {
      uint64_t(mono.tv_sec) * 1000000000u + uint64_t(mono.tv_nsec),
      uint64_t(real.tv_sec) * 1000000000u + uint64_t(real.tv_nsec),
      uint64_t(getpid()), reinterpret_cast<uintptr_t>(&mono),
      reinterpret_cast<uintptr_t>(&FallbackRandom)};
  const std::string_view bytes(reinterpret_cast<const char*>(parts),
                               sizeof parts);
  for (uint64_t i = 0; i < 4; ++i) key[i] = SipHash<2, 4>(i, ~i, bytes);
}

}  // namespace

RequestHash::RequestHash() {
  uint64_t key[4];
  if (!KernelRandom(key) && !DeviceRandom(key)) FallbackRandom(key);
  k0_ = key[0];
  k1_ = key[1];
  m0_ = key[2];
  m1_ = key[3];
}

}  // namespace tokenmeter::daemon
