// ProcessCollector with a real Registry: the six process_* families of this
// test process, each figure checked against what the process can learn
// itself (its CPU clock, its fds, its RLIMIT_NOFILE, the wall clock), one
// /proc snapshot per render, and the families gone with the collector.
#include "daemon/exposition/process_collector.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/exposition/exposition.h"
#include "daemon/exposition/text_writer.h"
#include "daemon/store/registry.h"
#include "tests/daemon/exposition/exposition_fixture.h"

namespace tokenmeter::daemon::exposition_test {
namespace {

std::unique_ptr<Registry> NewRegistry() {
  std::unique_ptr<Registry> reg;
  const Status st = Registry::Create(RegistryOptions{}, &reg);
  EXPECT_TRUE(st.ok()) << st.message();
  return reg;
}

// The process_* families of one text render (structure checked), by
// family name: (type, the value of its one sample).
struct Figure {
  std::string type;
  double value = 0;
};
std::map<std::string, Figure> ProcessFigures(const Registry& reg) {
  std::map<std::string, Figure> out;
  const std::vector<Family> families = CheckStructure(
      Render(reg, ExpositionFormat::kText004), ExpositionFormat::kText004);
  for (const Family& f : families) {
    if (!f.name.starts_with("process_")) continue;
    EXPECT_EQ(f.samples.size(), 1u) << f.name;
    if (f.samples.size() != 1) continue;
    EXPECT_TRUE(f.samples[0].labels.empty()) << f.name;
    out[f.name] = Figure{f.type, f.samples[0].value};
  }
  return out;
}

// The value of family `family` in one render (-1, and a failure, if absent).
double Value(const Registry& reg, const std::string& family) {
  const std::map<std::string, Figure> figures = ProcessFigures(reg);
  const auto it = figures.find(family);
  EXPECT_NE(it, figures.end()) << family << " not rendered";
  return it == figures.end() ? -1 : it->second.value;
}

double ClockSeconds(clockid_t clock) {
  timespec ts{};
  EXPECT_EQ(clock_gettime(clock, &ts), 0);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// `n` more open descriptors (of /dev/null) while the object lives.
class OpenFds {
 public:
  explicit OpenFds(int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      EXPECT_GE(fd, 0);
      if (fd >= 0) fds_.push_back(fd);
    }
  }
  OpenFds(const OpenFds&) = delete;
  OpenFds& operator=(const OpenFds&) = delete;
  ~OpenFds() {
    for (int fd : fds_) close(fd);
  }

 private:
  std::vector<int> fds_;
};

TEST(ProcessCollectorTest, RendersTheSixProcessFamilies) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  std::map<std::string, std::string> types;
  for (const auto& [name, figure] : ProcessFigures(*reg)) {
    types[name] = figure.type;
  }
  const std::map<std::string, std::string> want = {
      {"process_cpu_seconds_total", "counter"},
      {"process_resident_memory_bytes", "gauge"},
      {"process_virtual_memory_bytes", "gauge"},
      {"process_open_fds", "gauge"},
      {"process_max_fds", "gauge"},
      {"process_start_time_seconds", "gauge"}};
  EXPECT_EQ(types, want);
}

TEST(ProcessCollectorTest, MemoryAndDescriptorFiguresAreConsistent) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  std::map<std::string, Figure> f = ProcessFigures(*reg);
  const double resident = f["process_resident_memory_bytes"].value;
  const double open_fds = f["process_open_fds"].value;
  const double max_fds = f["process_max_fds"].value;
  EXPECT_GT(resident, 0);
  EXPECT_GE(f["process_virtual_memory_bytes"].value, resident);
  EXPECT_GT(open_fds, 0);
  EXPECT_LE(open_fds, max_fds);
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  EXPECT_EQ(max_fds, double(rl.rlim_cur));
}

TEST(ProcessCollectorTest, MaxFdsIsTheSoftLimit) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  const rlim_t soft = old.rlim_cur == 200 ? 201 : 200;
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < soft) {
    GTEST_SKIP() << "hard RLIMIT_NOFILE " << old.rlim_max << " < " << soft;
  }
  // Lowering the soft limit below the hard one is always allowed, and so
  // is raising it back.
  const rlimit lowered{soft, old.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const double shown = Value(*reg, "process_max_fds");
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(shown, double(soft));
  EXPECT_EQ(Value(*reg, "process_max_fds"), double(old.rlim_cur));
}

TEST(ProcessCollectorTest, OpeningDescriptorsRaisesOpenFdsByThatMany) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  const double before = Value(*reg, "process_open_fds");
  {
    const OpenFds more(7);
    EXPECT_EQ(Value(*reg, "process_open_fds"), before + 7);
  }
  EXPECT_EQ(Value(*reg, "process_open_fds"), before);
}

TEST(ProcessCollectorTest, StartTimeIsMomentsAgo) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  const double start = Value(*reg, "process_start_time_seconds");
  const double now = ClockSeconds(CLOCK_REALTIME);
  // The boot time in /proc/stat is whole seconds: up to 1 s late.
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 60)
      << "this test process started " << now - start << " s ago?";
}

TEST(ProcessCollectorTest, CpuSecondsFollowsTheProcessCpuClock) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  // /proc counts clock ticks: utime and stime each up to one tick short.
  const double tick = 1.0 / double(sysconf(_SC_CLK_TCK));
  const double before = ClockSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const double first = Value(*reg, "process_cpu_seconds_total");
  const double after = ClockSeconds(CLOCK_PROCESS_CPUTIME_ID);
  EXPECT_GE(first, before - 2 * tick);
  EXPECT_LE(first, after);
  // Work raises it: spin until it does, for at most 10 s of CPU.
  double now = first;
  volatile uint64_t sink = 0;
  while (now <= first && ClockSeconds(CLOCK_PROCESS_CPUTIME_ID) < after + 10) {
    for (int i = 0; i < 100'000; ++i) sink = sink + uint64_t(i);
    now = Value(*reg, "process_cpu_seconds_total");
  }
  EXPECT_GT(now, first);
}

// Records the one sample of each daemon family of a render, and opens `n`
// descriptors when the first process_* family begins: after the
// collector's BeginRender(), before any of its Collect() calls.
class OpeningWriter : public MetricWriter {
 public:
  explicit OpeningWriter(int n) : n_(n) {}
  void BeginFamily(std::string_view prefix, std::string_view name, MetricType,
                   std::string_view) override {
    family_ = std::string(prefix) + std::string(name);
    if (family_.starts_with("process_") && opened_ == nullptr) {
      opened_ = std::make_unique<OpenFds>(n_);
    }
  }
  void Sample(const SampleLabels&, uint64_t value) override {
    values[family_] = double(value);
  }
  void Sample(const SampleLabels&, double value) override {
    values[family_] = value;
  }
  void HistogramSample(const SampleLabels&, const Histogram&) override {}
  void Finish() override {}

  std::map<std::string, double> values;

 private:
  const int n_;
  std::string family_;
  std::unique_ptr<OpenFds> opened_;
};

TEST(ProcessCollectorTest, ReadsProcOncePerRender) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  const ProcessCollector collector(*reg);
  const double before = Value(*reg, "process_open_fds");
  {
    // The fds opened during the render, after its snapshot, are not in it
    // (process_open_fds comes after process_cpu_seconds).
    OpeningWriter w(5);
    daemon::Render(*reg, w);
    EXPECT_EQ(w.values.size(), 6u);
    EXPECT_EQ(w.values["process_open_fds"], before);
    // Collect() between renders keeps writing that snapshot.
    OpeningWriter again(0);
    again.BeginFamily("", "process_open_fds", MetricType::kGauge, "");
    collector.Collect(kProcessOpenFds, again);
    EXPECT_EQ(again.values["process_open_fds"], before);
    // The next render reads /proc again: the five are there.
    EXPECT_EQ(Value(*reg, "process_open_fds"), before + 5);
  }
}

TEST(ProcessCollectorTest, RegisteredForItsLifetime) {
  const auto reg = NewRegistry();
  ASSERT_NE(reg, nullptr);
  // Nothing else in the registry: an empty exposition.
  EXPECT_EQ(Render(*reg, ExpositionFormat::kText004), "");
  {
    const ProcessCollector collector(*reg);
    EXPECT_EQ(ProcessFigures(*reg).size(), 6u);
  }
  EXPECT_EQ(Render(*reg, ExpositionFormat::kText004), "");
  // The families are free again: a second collector may take them.
  const ProcessCollector second(*reg);
  EXPECT_EQ(ProcessFigures(*reg).size(), 6u);
}

}  // namespace
}  // namespace tokenmeter::daemon::exposition_test
