// The gauges engines compute over a window (SGLang's gen_throughput,
// cache_hit_rate, spec_accept_length, spec_accept_rate): at the end of each
// summary window (--log-interval, 10 s when that is 0) the daemon sets them
// from the counters' increase over the window (store/series_windows.h),
// for the series whose profile shows them.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_WINDOW_GAUGES_H_
#define TOKENMETER_DAEMON_STORE_WINDOW_GAUGES_H_

#include "daemon/store/registry.h"
#include "daemon/store/series_windows.h"

namespace tokenmeter::daemon {

class WindowGauges {
 public:
  // Ends a window of `window_s` seconds (> 0; otherwise nothing happens):
  // sets every window gauge of every series that uses one. O(series).
  void Update(Registry& registry, double window_s);
  // Starts every series' window at its counters' present values (after a
  // snapshot was loaded: the restored totals are not one window's). O(series).
  void Restart(const Registry& registry) { windows_.Restart(registry); }

 private:
  SeriesWindows windows_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_WINDOW_GAUGES_H_
