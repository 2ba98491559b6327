// What the exposition tests share (exposition_test, proto_writer_test,
// process_collector_test, tests/daemon/store/profile_test): registries
// with known data in every family, a small parser of the text formats with
// the structural checks promtool does not make, the golden-file comparison
// and the runner of promtool. Test-only; single-threaded; failures are
// reported through GoogleTest (ADD_FAILURE, EXPECT_*) in the calling test.
// The tests that use it live in its namespace, in an anonymous one.
#ifndef TOKENMETER_TESTS_DAEMON_EXPOSITION_EXPOSITION_FIXTURE_H_
#define TOKENMETER_TESTS_DAEMON_EXPOSITION_EXPOSITION_FIXTURE_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/exposition/process_collector.h"
#include "daemon/exposition/text_writer.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/store/catalog.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/registry.h"
#include "daemon/store/registry_options.h"

namespace tokenmeter::daemon::exposition_test {

// ---- registries with known data in every family

// A label value with a backslash, quotes and a newline: every escape.
inline constexpr char kOddLabel[] = "back\\slash \"quoted\"\nnew line";

// Deterministic data in every family of one series (or cell); `k` (1, 2,
// 3) varies the numbers; step gauges and per-position spec counts only
// when asked.
void Fill(SeriesValues& s, uint64_t k, bool step_gauges, bool spec_positions);

// The owner of the tracker's and the daemon's own families, with the fixed
// values of its public members (their real owners need a running daemon;
// the e2e tests render those). Registered with `reg` for its lifetime.
class FixedCollector : public Collector {
 public:
  explicit FixedCollector(Registry& reg) : registration_(reg, this, kOwned) {}
  void Collect(DaemonMetric id, MetricWriter& w) const override;

  int64_t tracked = 0;
  uint64_t evicted = 0;
  uint64_t incomplete[size_t(Interval::kCount)] = {};
  uint64_t negative[size_t(Interval::kCount)] = {};
  double scrape_duration_seconds = 0;
  std::vector<std::pair<std::string, uint64_t>> http_responses;
  uint64_t http_connections_rejected = 0;
  uint64_t snapshots_ok = 0;
  bool restored = false;

 private:
  static constexpr DaemonMetric kOwned[] = {
      kBuildInfo,           kTrackedRequests,         kEvictedRequests,
      kIncompleteIntervals, kNegativeIntervals,       kScrapeDuration,
      kHttpResponses,       kHttpConnectionsRejected, kStateSnapshots,
      kStateRestored};
  Registration registration_;
};

// A registry with an owner for every daemon family, as the daemon wires
// them: the real IngestStats and ProcessCollector, FixedCollector for the
// rest. Members go in reverse order, the collectors before the registry.
// Owns all four; `->` and `*` reach the registry.
struct Exposed {
  std::unique_ptr<Registry> reg;
  std::unique_ptr<IngestStats> ingest;
  std::unique_ptr<ProcessCollector> process;
  std::unique_ptr<FixedCollector> fixed;
  Registry* operator->() const { return reg.get(); }
  Registry& operator*() const { return *reg; }
};

// An Exposed registry made with `options`, no series yet; a test failure
// (and only `reg`, null) when Registry::Create() refuses the options.
Exposed MakeExposed(const RegistryOptions& options);

// The golden file's registry: three vLLM-profile series of two namespaces
// (odd label values among them), client drops, ingest counts and fixed
// daemon values.
Exposed PopulatedRegistry();

// An SGLang and an LMDeploy series with data in every family, per-request
// label cells (--request-label tenant, two places; the empty value's only
// in SGLang's), cache_config, max_lora and LoRA sets.
Exposed ProfilesRegistry();

// The label key of per-request label values (one per --request-label, ""
// for none), admitted into `s` as the tracker would at ARRIVED.
LabelKey KeyOf(Registry& reg, EngineSeries& s,
               std::initializer_list<std::string_view> values);

// The whole exposition of `reg` in `format`.
std::string Render(const Registry& reg, ExpositionFormat format);

// ---- a small parser of the text formats

// One sample line: its name, labels in order (unescaped) and value.
struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
  std::string value_text;
};

// One family: its HELP name, TYPE and samples, in exposition order.
struct Family {
  std::string name;
  std::string type;
  bool has_help = false;
  std::vector<Sample> samples;
};

// Parses an exposition into families; a test failure for every problem,
// with its line (and for a missing, or in text 0.0.4 present, # EOF).
std::vector<Family> Parse(const std::string& text, ExpositionFormat format);

// Parse() plus every structural rule of the catalog and the format (names,
// label order, no repeats, _total, sorted le buckets ending in +Inf that
// agree with _count); a test failure for each break. Returns the families.
std::vector<Family> CheckStructure(const std::string& text,
                                   ExpositionFormat format);

// ---- golden files

// Compares `got` with the golden file at `path`, a test failure naming the
// first differing line; TOKENMETER_UPDATE_GOLDEN=1 rewrites the file first.
void ExpectGolden(const char* path, const std::string& got);

// ---- other programs

// What a shell command wrote to stdout and how it exited (-1: it did not).
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

// Runs `cmd` with /bin/sh and waits for it.
CommandResult RunCommand(const std::string& cmd);

// The first executable `program` in $PATH, or "" where there is none.
std::string FindOnPath(const std::string& program);

// A file under /tmp holding `contents`, deleted with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& contents);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Whether a line of promtool's is one of the two findings docs/metrics.md
// keeps on purpose (':' in names; iteration_tokens_total, a histogram).
bool IsExpectedLintFinding(const std::string& line);

// Runs `promtool check metrics` on `text`: a test failure unless it exits
// 0, or 3 with findings that `expected` all accepts.
void ExpectOnlyExpectedLints(const std::string& promtool,
                             const std::string& text,
                             bool (*expected)(const std::string&));

}  // namespace tokenmeter::daemon::exposition_test

#endif  // TOKENMETER_TESTS_DAEMON_EXPOSITION_EXPOSITION_FIXTURE_H_
