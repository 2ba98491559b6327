// The daemon's one clock type: CLOCK_MONOTONIC nanoseconds for every time
// point and interval, and the wall clock (Unix seconds) for the values that
// are wall times (lora_requests_info, the live page's time axis). Injected
// as `const Clock&`, so that tests control both.
#ifndef TOKENMETER_DAEMON_BASE_CLOCK_H_
#define TOKENMETER_DAEMON_BASE_CLOCK_H_

#include <cstdint>

namespace tokenmeter::daemon {

class Clock {
 public:
  virtual ~Clock() = default;
  // CLOCK_MONOTONIC, nanoseconds. Any thread; one clock_gettime (vDSO).
  virtual uint64_t NowNs() const = 0;
  // Wall time, Unix seconds: CLOCK_REALTIME unless a test overrides it.
  // Any thread.
  virtual double UnixNowS() const;
};

// clock.UnixNowS() in whole nanoseconds (to the double's precision, about
// 0.2 µs today): for start times, not for intervals.
inline uint64_t UnixNowNs(const Clock& clock) {
  const double s = clock.UnixNowS();
  return s > 0 ? uint64_t(s * 1e9) : 0;
}

// The system's clocks.
class SystemClock : public Clock {
 public:
  uint64_t NowNs() const override;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_BASE_CLOCK_H_
