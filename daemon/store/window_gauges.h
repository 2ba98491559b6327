// The gauges engines compute over a window (SGLang's gen_throughput,
// cache_hit_rate, spec_accept_length, spec_accept_rate): at the end of each
// summary window (--log-interval, 10 s when that is 0) the daemon sets them
// from the counters' increase over the window, for the series whose profile
// shows them.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_WINDOW_GAUGES_H_
#define TOKENMETER_DAEMON_STORE_WINDOW_GAUGES_H_

#include <cstdint>
#include <unordered_map>

#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

class WindowGauges {
 public:
  // Ends a window of `window_s` seconds (> 0): sets every window gauge of
  // every series that uses one. O(series).
  void Update(Registry& registry, double window_s);
  // Starts every series' window at its counters' present values (after a
  // snapshot was loaded: the restored totals are not one window's). O(series).
  void Start(const Registry& registry);

 private:
  struct Last {
    uint64_t generation_tokens = 0;
    uint64_t prefix_queries = 0;
    uint64_t prefix_hits = 0;
    uint64_t spec_drafts = 0;
    uint64_t spec_draft_tokens = 0;
    uint64_t spec_accepted_tokens = 0;
    static Last Of(const EngineSeries& s);
  };
  // Bounded by the registry's series cap; series live as long as the
  // daemon, so their addresses are stable keys.
  std::unordered_map<const EngineSeries*, Last> last_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_WINDOW_GAUGES_H_
