// The rendered exposition in the text formats: a golden file
// (TOKENMETER_UPDATE_GOLDEN=1 rewrites it), our own structural checks
// (promtool does not notice unsorted le buckets or a missing +Inf),
// OpenMetrics specifics and two real parsers (promtool and Python's
// prometheus_client). The naming profiles are tested in
// tests/daemon/store/profile_test.cpp, the protobuf exposition in
// proto_writer_test.cpp.
#include "daemon/exposition/exposition.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"
#include "tests/daemon/exposition/exposition_fixture.h"

#ifndef TOKENMETER_TEST_DATA_DIR
#error "TOKENMETER_TEST_DATA_DIR must name tests/data"
#endif

namespace tokenmeter::daemon::exposition_test {
namespace {

constexpr char kGoldenPath[] =
    TOKENMETER_TEST_DATA_DIR "/exposition_golden.txt";

// The exposition without the process_* lines, which vary from run to run.
std::string WithoutProcessLines(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("process_") || line.starts_with("# HELP process_") ||
        line.starts_with("# TYPE process_")) {
      continue;
    }
    out += line;
    out += '\n';
  }
  return out;
}

// ---- golden file
// ----------------------------------------------------------------

TEST(ExpositionTest, MatchesGoldenFile) {
  const auto reg = PopulatedRegistry();
  ExpectGolden(kGoldenPath,
               WithoutProcessLines(Render(*reg, ExpositionFormat::kText004)));
}

TEST(ExpositionTest, GoldenHasEscapedLabelsAndBothNamespaces) {
  const auto reg = PopulatedRegistry();
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_NE(text.find("tier=\"back\\\\slash \\\"quoted\\\"\\nnew line\""),
            std::string::npos);
  EXPECT_NE(text.find("model_name=\"tiny \\\"model\\\"\""), std::string::npos);
  EXPECT_NE(text.find("zone=\"eu\\\\1\""), std::string::npos);
  EXPECT_NE(text.find("# TYPE vllm:time_to_first_token_seconds histogram\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE tokenmeter_engine:prompt_tokens_total counter\n"),
            std::string::npos);
  // One block per namespace, in namespace order: every tokenmeter_engine
  // family before every vllm family.
  EXPECT_LT(text.rfind("\ntokenmeter_engine:"), text.find("\nvllm:"));
  // Process metrics are there, just not compared byte for byte.
  EXPECT_NE(text.find("\nprocess_resident_memory_bytes "), std::string::npos);
  EXPECT_NE(text.find("\nprocess_cpu_seconds_total "), std::string::npos);
}

// ---- structure
// -------------------------------------------------------------------

// Whether some series of `reg` has a part of kind `k`.
bool AnySeriesHas(const Registry& reg, PartKind k) {
  bool any = false;
  reg.ForEachSeries(
      [&](const EngineSeries& s) { any = any || s.parts().get(k) != nullptr; });
  return any;
}

TEST(ExpositionTest, TextFormatStructure) {
  const auto reg = PopulatedRegistry();
  const std::vector<Family> families = CheckStructure(
      Render(*reg, ExpositionFormat::kText004), ExpositionFormat::kText004);
  // Every catalog family of both namespaces is present.
  std::set<std::string> names;
  for (const Family& f : families) names.insert(f.name);
  for (const char* ns : {"vllm:", "tokenmeter_engine:"}) {
    for (const FamilyDef& f : ProfileFamilies(Profile::kVllm)) {
      // Legacy names only with their option, a part's families only
      // for series that have the part.
      if (f.legacy ||
          (f.part != PartKind::kNone && !AnySeriesHas(*reg, f.part))) {
        continue;
      }
      std::string name = ns + std::string(FamilyName(f));
      if (f.type == MetricType::kCounter) name += "_total";
      EXPECT_TRUE(names.count(name)) << name;
    }
  }
  for (const DaemonMetricDef& d : kDaemonMetrics) {
    std::string name(d.name);
    if (d.type == MetricType::kCounter) name += "_total";
    // Shown only while --request-label names a label, or with tracing on
    // (--otlp-endpoint: the tracer owns them).
    const bool optional = d.id == kRequestLabelOverflow || d.id == kOtlpSpans ||
                          d.id == kOtlpExportSeconds || d.id == kOtlpQueueSpans;
    EXPECT_EQ(names.count(name), optional ? 0u : 1u) << name;
  }
}

TEST(ExpositionTest, StructureOfAnEmptyRegistryAndOfOverriddenBuckets) {
  const Exposed empty = MakeExposed(RegistryOptions{});
  CheckStructure(Render(*empty, ExpositionFormat::kText004),
                 ExpositionFormat::kText004);

  RegistryOptions options;
  options.max_model_len = 7;
  options.buckets["time_to_first_token_seconds"] = {1e-6, 0.1, 0.5, 1};
  options.buckets["request_params_n"] = {1};
  const Exposed reg = MakeExposed(options);
  EngineSeries* s = reg->GetOrCreate({"x", "m", "0", {}});
  Fill(*s, 1, false, false);
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  CheckStructure(text, ExpositionFormat::kText004);
  EXPECT_NE(text.find("x:time_to_first_token_seconds_bucket{model_name=\"m\","
                      "engine=\"0\",le=\"1e-06\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("x:request_prompt_tokens_bucket{model_name=\"m\","
                      "engine=\"0\",le=\"5\"}"),
            std::string::npos);
}

TEST(ExpositionTest, SecondsExposedToTheNanosecond) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  s->hist(kTimeToFirstToken).Observe(123'456'789);
  s->hist(kTimeToFirstToken).Observe(100'000'000);
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string p = "vllm:time_to_first_token_seconds";
  const std::string l = "{model_name=\"m\",engine=\"0\"";
  EXPECT_NE(text.find(p + "_sum" + l + "} 0.223456789\n"), std::string::npos);
  EXPECT_NE(text.find(p + "_bucket" + l + ",le=\"0.08\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find(p + "_bucket" + l + ",le=\"0.1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find(p + "_bucket" + l + ",le=\"0.25\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find(p + "_bucket" + l + ",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find(p + "_count" + l + "} 2\n"), std::string::npos);
}

TEST(ExpositionTest, OpenMetricsEndsWithEofAndNamesCountersWithoutTotal) {
  const auto reg = PopulatedRegistry();
  const std::string text = Render(*reg, ExpositionFormat::kOpenMetrics100);
  ASSERT_GE(text.size(), 6u);
  EXPECT_TRUE(text.ends_with("\n# EOF\n"));
  EXPECT_EQ(text.find("# EOF"), text.size() - 6) << "# EOF more than once";
  EXPECT_NE(text.find("# TYPE vllm:prompt_tokens counter\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE tokenmeter_ingest_frames counter\n"),
            std::string::npos);
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("# TYPE ") && line.ends_with(" counter")) {
      EXPECT_EQ(line.find("_total "), std::string::npos) << line;
    }
  }
  CheckStructure(text, ExpositionFormat::kOpenMetrics100);
  // The text format has no # EOF.
  EXPECT_EQ(Render(*reg, ExpositionFormat::kText004).find("# EOF"),
            std::string::npos);
}

// ---- real parsers
// -----------------------------------------------------------------

TEST(ExpositionTest, PromtoolFindsOnlyTheTwoKnownLints) {
  const std::string promtool = FindOnPath("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not on PATH";
  const auto reg = PopulatedRegistry();
  ExpectOnlyExpectedLints(promtool, Render(*reg, ExpositionFormat::kText004),
                          IsExpectedLintFinding);
}

constexpr char kPythonParse[] = R"PY(
import sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    sys.exit(77)
n = 0
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        n += 1
        if (s.name == "vllm:time_to_first_token_seconds_sum"
                and s.labels.get("engine") == "1"):
            print("ttft_sum", repr(s.value))
            print("tier", s.labels["tier"].encode().hex())
        if (s.name == "tokenmeter_engine:request_success_total"
                and s.labels.get("finished_reason") == "length"):
            print("model", s.labels["model_name"].encode().hex())
            print("success", repr(s.value))
        if s.name == "vllm:kv_cache_usage_perc" and s.labels["engine"] == "0":
            print("kv", repr(s.value))
print("samples", n)
)PY";

std::string Hex(std::string_view s) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

constexpr char kPython[] = "/usr/bin/python3";

// Runs the Python `script` with `text` on its standard input.
CommandResult RunPython(const char* script_text, const std::string& text) {
  const TempFile script(script_text);
  const TempFile file(text);
  return RunCommand(std::string(kPython) + " '" + script.path() + "' < '" +
                    file.path() + "' 2>&1");
}

// The sample lines of an exposition (neither comments nor empty).
size_t SampleLines(const std::string& text) {
  size_t n = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] != '#') ++n;
  }
  return n;
}

TEST(ExpositionTest, PythonPrometheusClientParsesItAndValuesRoundTrip) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " missing";
  const auto reg = PopulatedRegistry();
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const CommandResult r = RunPython(kPythonParse, text);
  if (r.exit_code == 77) GTEST_SKIP() << "prometheus_client not installed";
  ASSERT_EQ(r.exit_code, 0) << r.output;

  std::map<std::string, std::string> got;
  std::istringstream in(r.output);
  std::string key, value;
  while (in >> key >> value) got[key] = value;

  EngineSeries* b =
      reg->GetOrCreate({"vllm", "llama-3-8b", "1", {{"tier", kOddLabel}}});
  EXPECT_EQ(std::strtod(got["ttft_sum"].c_str(), nullptr),
            b->hist(kTimeToFirstToken).sum());
  EXPECT_EQ(got["tier"], Hex(kOddLabel));
  EXPECT_EQ(got["model"], Hex("tiny \"model\""));
  EXPECT_EQ(got["success"], "6.0");
  EXPECT_EQ(got["kv"], "0.25");
  EXPECT_EQ(got["samples"], std::to_string(SampleLines(text)));
}

constexpr char kPythonOpenMetricsParse[] = R"PY(
import sys
try:
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families)
except ImportError:
    sys.exit(77)
n = 0
for family in text_string_to_metric_families(sys.stdin.read()):
    n += len(family.samples)
print("samples", n)
)PY";

TEST(ExpositionTest, PythonOpenMetricsParserAcceptsIt) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " missing";
  const auto reg = PopulatedRegistry();
  const std::string text = Render(*reg, ExpositionFormat::kOpenMetrics100);
  const CommandResult r = RunPython(kPythonOpenMetricsParse, text);
  if (r.exit_code == 77) GTEST_SKIP() << "prometheus_client not installed";
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "samples " + std::to_string(SampleLines(text)) + "\n");
}

}  // namespace
}  // namespace tokenmeter::daemon::exposition_test
