// The client library's one clock: CLOCK_MONOTONIC in nanoseconds, the
// clock every event time and the daemon's checks use. Inline: the event
// functions call it on the hot path when the caller passes t = 0 (a vDSO
// call, no system call). Any thread; never fails.
#ifndef TOKENMETER_CLIENT_LIB_SRC_CLOCK_H_
#define TOKENMETER_CLIENT_LIB_SRC_CLOCK_H_

#include <time.h>

#include <cstdint>

namespace tokenmeter::client {

inline uint64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_CLOCK_H_
