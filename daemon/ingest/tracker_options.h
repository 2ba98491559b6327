// The tracker's options (--grace, --idle-timeout, --max-requests and the
// timestamp window).
#ifndef TOKENMETER_DAEMON_INGEST_TRACKER_OPTIONS_H_
#define TOKENMETER_DAEMON_INGEST_TRACKER_OPTIONS_H_

#include <cstddef>
#include <cstdint>

#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

struct TrackerOptions {
  uint64_t grace_ns = 2'000'000'000;           // finished requests kept
  uint64_t idle_timeout_ns = 600'000'000'000;  // unfinished, no events
  size_t max_requests = 1'000'000;
  uint64_t max_future_ns = TM_MAX_FUTURE_NS;
  uint64_t max_past_ns = TM_MAX_PAST_NS;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_TRACKER_OPTIONS_H_
