#include "daemon/exposition/process_collector.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tokenmeter::daemon {
namespace {

constexpr DaemonMetric kOwned[] = {
    kProcessCpuSeconds, kProcessResidentMemory, kProcessVirtualMemory,
    kProcessOpenFds,    kProcessMaxFds,         kProcessStartTime,
};

}  // namespace

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const double ticks = double(sysconf(_SC_CLK_TCK));
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name, which may hold spaces: skip past ')'.
    const size_t close = line.rfind(')');
    std::istringstream in(line.substr(close + 2));
    std::string field;
    std::vector<std::string> f;
    while (in >> field) f.push_back(field);
    // f[0] is field 3 (state); utime is field 14, stime 15, starttime 22,
    // vsize 23, rss 24.
    if (f.size() > 21) {
      p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
      const double start_ticks = std::stod(f[19]);
      p.vsize_bytes = std::stod(f[20]);
      p.rss_bytes = std::stod(f[21]) * double(sysconf(_SC_PAGESIZE));
      std::ifstream boot("/proc/stat");
      std::string key;
      double btime = 0;
      while (boot >> key) {
        if (key == "btime") {
          boot >> btime;
          break;
        }
      }
      p.start_time_seconds = btime + start_ticks / ticks;
    }
  }
  std::error_code ec;
  size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  p.open_fds = double(fds);
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) p.max_fds = double(rl.rlim_cur);
  return p;
}

ProcessCollector::ProcessCollector(Registry& registry)
    : registration_(registry, this, kOwned) {}

ProcessCollector::~ProcessCollector() = default;

void ProcessCollector::Collect(DaemonMetric id, MetricWriter& w) const {
  const SampleLabels none;
  switch (id) {
    case kProcessCpuSeconds:
      w.Sample(none, stats_.cpu_seconds);
      break;
    case kProcessResidentMemory:
      w.Sample(none, stats_.rss_bytes);
      break;
    case kProcessVirtualMemory:
      w.Sample(none, stats_.vsize_bytes);
      break;
    case kProcessOpenFds:
      w.Sample(none, stats_.open_fds);
      break;
    case kProcessMaxFds:
      w.Sample(none, stats_.max_fds);
      break;
    case kProcessStartTime:
      w.Sample(none, stats_.start_time_seconds);
      break;
    default:
      break;
  }
}

}  // namespace tokenmeter::daemon
