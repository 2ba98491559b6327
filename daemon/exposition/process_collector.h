// The standard process_* families (CPU seconds, resident and virtual
// memory, open and maximum file descriptors, start time), read from /proc
// once per render. Registers itself for those families with the registry
// it is given and unregisters when destroyed.
#ifndef TOKENMETER_DAEMON_EXPOSITION_PROCESS_COLLECTOR_H_
#define TOKENMETER_DAEMON_EXPOSITION_PROCESS_COLLECTOR_H_

#include "daemon/store/metric_writer.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

struct ProcessStats {
  double cpu_seconds = 0;
  double rss_bytes = 0;
  double vsize_bytes = 0;
  double open_fds = 0;
  double max_fds = 0;
  double start_time_seconds = 0;
};

// This process's figures from /proc/self (zeros where unreadable).
ProcessStats ReadProcessStats();

class ProcessCollector : public Collector {
 public:
  explicit ProcessCollector(Registry& registry);
  ProcessCollector(const ProcessCollector&) = delete;
  ProcessCollector& operator=(const ProcessCollector&) = delete;
  ~ProcessCollector() override;

  void BeginRender() const override { stats_ = ReadProcessStats(); }
  void Collect(DaemonMetric id, MetricWriter& w) const override;

 private:
  mutable ProcessStats stats_;  // the current render's snapshot
  Registration registration_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_EXPOSITION_PROCESS_COLLECTOR_H_
