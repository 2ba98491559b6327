// The periodic summary line, one per engine series, in vLLM's shape:
//   engine=<instance> model=<m>: Avg prompt throughput: X tokens/s, Avg
//   generation throughput: Y tokens/s, Running: N reqs, Waiting: N reqs,
//   GPU KV cache usage: P%, Prefix cache hit rate: H%
// plus spec-decode figures when the engine reports them. A series idle for
// the last two windows logs at debug level only.
#ifndef TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
#define TOKENMETER_DAEMON_LOGGING_SUMMARY_H_

#include <string>

#include "daemon/metrics/registry.h"

namespace tokenmeter::daemon {

// The line for one series over a window of `window_s` seconds; updates the
// series' window bookkeeping. Sets *idle when nothing happened in it.
std::string SummaryLine(EngineSeries& s, double window_s, bool* idle);

// Logs every series' line (info, or debug when idle two windows running).
void LogSummaries(Registry& registry, double window_s);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
