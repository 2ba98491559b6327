#include "daemon/ingest/request_hash.h"

#include <random>

namespace tokenmeter::daemon {

RequestHash::RequestHash() {
  // As the tracer seeds its ids (tracing/tracer.cpp): libstdc++'s device
  // reads the CPU's or the kernel's random source.
  std::random_device device;
  uint64_t key[4];
  for (uint64_t& k : key) k = (uint64_t(device()) << 32) | device();
  k0_ = key[0];
  k1_ = key[1];
  m0_ = key[2];
  m1_ = key[3];
}

}  // namespace tokenmeter::daemon
