// The rendered exposition: a golden file (TOKENMETER_UPDATE_GOLDEN=1
// rewrites it), our own structural checks (promtool does not notice
// unsorted le buckets or a missing +Inf), OpenMetrics specifics, two
// real parsers (promtool and Python's prometheus_client), and the protobuf
// exposition read back with the generated code: the same samples as the
// text, and the native buckets.
#include "daemon/exposition/exposition.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/base/text_format.h"
#include "daemon/exposition/process_collector.h"
#include "daemon/exposition/proto_writer.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/store/catalog.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"
#include "metrics.pb.h"
#include "testutil/library_proto_writer.h"

#ifndef TOKENMETER_TEST_DATA_DIR
#error "TOKENMETER_TEST_DATA_DIR must name tests/data"
#endif

namespace tokenmeter::daemon {
namespace {

constexpr char kGoldenPath[] =
    TOKENMETER_TEST_DATA_DIR "/exposition_golden.txt";
constexpr char kOddLabel[] = "back\\slash \"quoted\"\nnew line";

// ---- a registry with known data in every family
// --------------------------------

// Deterministic data for one series; `k` (1, 2, 3) varies the numbers.
void Fill(SeriesValues& s, uint64_t k, bool step_gauges, bool spec_positions) {
  if (step_gauges) {
    s.Set(kNumRequestsRunning, double(3 * k));
    s.Set(kNumRequestsWaiting, double(k));
  }
  s.AddDerived(kNumRequestsRunning, int64_t(2 * k));
  s.AddDerived(kNumRequestsWaiting, int64_t(5 * k));
  s.Set(kKvCacheUsagePerc, 0.25 * double(k));
  s.Add(kPrefixCacheQueries, 1000 * k);
  s.Add(kPrefixCacheHits, 250 * k);
  s.Add(kNumPreemptions, k);
  s.Add(kPromptTokens, 512 * k);
  s.Add(kGenerationTokens, 128 * k);
  s.AddChild(kRequestSuccess, 0, 10 * k);  // stop
  s.AddChild(kRequestSuccess, 1, 2 * k);   // length
  s.AddChild(kRequestSuccess, 2, k);       // abort
  s.Add(kSpecDecodeNumDrafts, 4 * k);
  s.Add(kSpecDecodeNumDraftTokens, 12 * k);
  s.Add(kSpecDecodeNumAcceptedTokens, 7 * k);
  if (spec_positions) {
    s.AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 4 * k);
    s.AddChild(kSpecDecodeNumAcceptedTokensPerPos, 1, 2 * k);
    s.AddChild(kSpecDecodeNumAcceptedTokensPerPos, 2, k);
  }
  // Every histogram: an observation exactly at its first bound (le is
  // inclusive), one between bounds, one past the last bound (+Inf).
  for (int m = kFirstHistogram; m < kFirstHistogram + kNumHistograms; ++m) {
    Histogram& h = s.hist(EngineMetric(m));
    const auto& b = h.layout().bounds();
    const double d = h.layout().divisor();
    const double mid = b.size() >= 2
                           ? (b[b.size() / 2 - 1] + b[b.size() / 2]) / 2
                           : b.front() / 2;
    h.Observe(std::round(b.front() * d));
    h.Observe(std::round(mid * d) + double(k));
    h.Observe(std::round(b.back() * d) * 2 + double(k));
  }
  s.hist(kTimeToFirstToken).Observe(123'456'789);
}

// The tracker's and the daemon's own families, with fixed values (their
// owners need a running daemon; the e2e tests render those).
class FixedCollector : public Collector {
 public:
  explicit FixedCollector(Registry& reg) : registration_(reg, this, kOwned) {}
  void Collect(DaemonMetric id, MetricWriter& w) const override {
    const SampleLabels none;
    switch (id) {
      case kBuildInfo:
        w.Sample(none.WithOwn("version", TOKENMETER_VERSION), uint64_t{1});
        break;
      case kTrackedRequests:
        w.Sample(none, double(tracked));
        break;
      case kEvictedRequests:
        w.Sample(none, evicted);
        break;
      case kIncompleteIntervals:
      case kNegativeIntervals:
        for (size_t i = 0; i < size_t(Interval::kCount); ++i) {
          w.Sample(none.WithOwn("interval", IntervalName(Interval(i))),
                   id == kIncompleteIntervals ? incomplete[i] : negative[i]);
        }
        break;
      case kScrapeDuration:
        w.Sample(none, scrape_duration_seconds);
        break;
      case kHttpResponses:
        for (const auto& [code, count] : http_responses) {
          w.Sample(none.WithOwn("code", code), count);
        }
        break;
      case kHttpConnectionsRejected:
        w.Sample(none, http_connections_rejected);
        break;
      case kStateSnapshots:
        w.Sample(none.WithOwn("result", "ok"), snapshots_ok);
        w.Sample(none.WithOwn("result", "error"), uint64_t{0});
        break;
      case kStateRestored:
        w.Sample(none, uint64_t{restored ? 1u : 0u});
        break;
      default:
        break;
    }
  }

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
struct Exposed {
  std::unique_ptr<Registry> reg;
  std::unique_ptr<IngestStats> ingest;
  std::unique_ptr<ProcessCollector> process;
  std::unique_ptr<FixedCollector> fixed;
  Registry* operator->() const { return reg.get(); }
  Registry& operator*() const { return *reg; }
};

Exposed MakeExposed(const RegistryOptions& options) {
  Exposed e;
  const Status st = Registry::Create(options, &e.reg);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return e;
  e.ingest = std::make_unique<IngestStats>(*e.reg);
  e.process = std::make_unique<ProcessCollector>(*e.reg);
  e.fixed = std::make_unique<FixedCollector>(*e.reg);
  return e;
}

Exposed PopulatedRegistry() {
  Exposed reg = MakeExposed(RegistryOptions{});
  EngineSeries* a =
      reg->GetOrCreate({"vllm", "llama-3-8b", "0", {{"tier", "gold"}}});
  EngineSeries* b =
      reg->GetOrCreate({"vllm", "llama-3-8b", "1", {{"tier", kOddLabel}}});
  EngineSeries* c = reg->GetOrCreate(
      {"tokenmeter_engine", "tiny \"model\"", "dp0", {{"zone", "eu\\1"}}});
  Fill(*a, 1, /*step_gauges=*/true, /*spec_positions=*/true);
  Fill(*b, 2, /*step_gauges=*/false, /*spec_positions=*/false);
  Fill(*c, 3, /*step_gauges=*/false, /*spec_positions=*/true);
  IngestStats& in = *reg.ingest;
  in.SetClientDropped("tokenmeter-engine", "tiny \"model\"", "dp0", 100, 5);
  in.SetClientDropped("tokenmeter-engine", "tiny \"model\"", "dp0", 200, 7);
  in.SetClientDropped("vllm", "llama-3-8b", "1", 300, 1);
  in.SetConnections(3);
  for (int i = 0; i < 1234; ++i) in.CountFrame();
  for (int k = 0; k < kNumEventKinds; ++k) {
    for (int i = 0; i < 100 + k; ++i) in.CountEvent(EventKind(k + 1));
  }
  for (size_t r = 0; r < size_t(IngestError::kCount); ++r) {
    for (size_t i = 0; i < r; ++i) in.CountError(IngestError(r));
  }
  FixedCollector& d = *reg.fixed;
  d.tracked = 42;
  d.evicted = 6;
  for (size_t i = 0; i < size_t(Interval::kCount); ++i) {
    d.incomplete[i] = i + 1;
    d.negative[i] = 2 * i;
  }
  d.scrape_duration_seconds = 0.00125;
  d.http_responses = {{"200", 41}, {"404", 2}, {"other", 1}};
  d.http_connections_rejected = 3;
  return reg;
}

std::string Render(const Registry& reg, ExpositionFormat format) {
  std::string out;
  daemon::Render(reg, format, out);
  return out;
}

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

// ---- a small parser of the text formats
// ---------------------------------------

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
  std::string value_text;
};

struct Family {
  std::string name;
  std::string type;
  bool has_help = false;
  std::vector<Sample> samples;
};

bool IsNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c == ':' || (!first && c >= '0' && c <= '9');
}

bool ParseValue(std::string_view v, double* out) {
  if (v == "+Inf") {
    *out = INFINITY;
    return true;
  }
  if (v == "-Inf") {
    *out = -INFINITY;
    return true;
  }
  if (v == "NaN") {
    *out = NAN;
    return true;
  }
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && end == v.data() + v.size();
}

// Parses one sample line; returns an error or "".
std::string ParseSample(std::string_view line, Sample* s) {
  size_t i = 0;
  while (i < line.size() && IsNameChar(line[i], i == 0)) ++i;
  if (i == 0) return "no metric name";
  s->name = std::string(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t start = i;
      while (i < line.size() && IsNameChar(line[i], i == start) &&
             line[i] != ':') {
        ++i;
      }
      if (i == start) return "no label name";
      std::string name(line.substr(start, i - start));
      if (line.substr(i, 2) != "=\"") return "expected =\" after " + name;
      i += 2;
      std::string value;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\') {
          if (i + 1 >= line.size()) return "dangling backslash";
          const char e = line[i + 1];
          if (e == 'n') {
            value += '\n';
          } else if (e == '\\' || e == '"') {
            value += e;
          } else {
            return std::string("bad escape \\") + e;
          }
          i += 2;
        } else {
          value += line[i++];
        }
      }
      if (i >= line.size()) return "unterminated label value";
      ++i;  // closing quote
      s->labels.emplace_back(std::move(name), std::move(value));
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return "unterminated label set";
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') return "expected a space";
  s->value_text = std::string(line.substr(i + 1));
  if (!ParseValue(s->value_text, &s->value)) {
    return "bad value \"" + s->value_text + "\"";
  }
  return "";
}

// Parses an exposition into families; reports every problem with its line.
std::vector<Family> Parse(const std::string& text, ExpositionFormat format) {
  std::vector<Family> families;
  if (text.empty() || text.back() != '\n') {
    ADD_FAILURE() << "exposition does not end with a newline";
  }
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool saw_eof = false;
  while (std::getline(in, line)) {
    ++lineno;
    SCOPED_TRACE("line " + std::to_string(lineno) + ": " + line);
    if (saw_eof) ADD_FAILURE() << "content after # EOF";
    if (line == "# EOF") {
      saw_eof = true;
      continue;
    }
    if (line.starts_with("# HELP ")) {
      const std::string rest = line.substr(7);
      Family f;
      f.name = rest.substr(0, rest.find(' '));
      f.has_help = true;
      families.push_back(std::move(f));
      continue;
    }
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      if (families.empty() || families.back().name != name) {
        ADD_FAILURE() << "TYPE without a HELP for the same name";
        families.push_back(Family{name, "", false, {}});
      }
      if (!families.back().type.empty()) ADD_FAILURE() << "second TYPE";
      families.back().type = type;
      continue;
    }
    if (line.starts_with("#")) {
      ADD_FAILURE() << "unexpected comment";
      continue;
    }
    Sample s;
    const std::string err = ParseSample(line, &s);
    if (!err.empty()) {
      ADD_FAILURE() << err;
      continue;
    }
    if (families.empty() || families.back().type.empty()) {
      ADD_FAILURE() << "sample before HELP and TYPE";
      continue;
    }
    families.back().samples.push_back(std::move(s));
  }
  EXPECT_EQ(saw_eof, format == ExpositionFormat::kOpenMetrics100);
  return families;
}

std::string LabelsWithout(const Sample& s, std::string_view skip) {
  std::string key;
  for (const auto& [n, v] : s.labels) {
    if (n == skip) continue;
    key += n + "=" + v + ";";
  }
  return key;
}

void CheckHistogram(const Family& f) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative)
    bool last_inf = false;
    bool has_sum = false;
    bool has_count = false;
    double count = -1;
  };
  std::map<std::string, Series> series;
  for (const Sample& s : f.samples) {
    Series& ser = series[LabelsWithout(s, "le")];
    if (s.name == f.name + "_bucket") {
      ASSERT_FALSE(s.labels.empty());
      const auto& [n, le_text] = s.labels.back();
      EXPECT_EQ(n, "le") << f.name << ": le is not the last label";
      double le = 0;
      ASSERT_TRUE(ParseValue(le_text, &le)) << f.name << " le=" << le_text;
      EXPECT_FALSE(ser.last_inf) << f.name << ": bucket after +Inf";
      if (!ser.buckets.empty()) {
        EXPECT_GT(le, ser.buckets.back().first)
            << f.name << ": le not strictly increasing at " << le_text;
        EXPECT_GE(s.value, ser.buckets.back().second)
            << f.name << ": cumulative count decreases at " << le_text;
      }
      ser.buckets.emplace_back(le, s.value);
      ser.last_inf = le_text == "+Inf";
    } else if (s.name == f.name + "_sum") {
      ser.has_sum = true;
    } else if (s.name == f.name + "_count") {
      ser.has_count = true;
      ser.count = s.value;
    } else {
      ADD_FAILURE() << f.name << ": unexpected sample " << s.name;
    }
  }
  EXPECT_FALSE(series.empty()) << f.name;
  for (const auto& [labels, ser] : series) {
    SCOPED_TRACE(f.name + "{" + labels + "}");
    EXPECT_TRUE(ser.last_inf) << "last bucket is not le=\"+Inf\"";
    EXPECT_TRUE(ser.has_sum);
    ASSERT_TRUE(ser.has_count);
    ASSERT_FALSE(ser.buckets.empty());
    EXPECT_EQ(ser.buckets.back().second, ser.count) << "+Inf bucket != _count";
  }
}

// Every structural rule of the catalog and the format; returns the families.
std::vector<Family> CheckStructure(const std::string& text,
                                   ExpositionFormat format) {
  const bool om = format == ExpositionFormat::kOpenMetrics100;
  std::vector<Family> families = Parse(text, format);
  std::set<std::string> family_names;
  std::set<std::string> series_keys;
  for (const Family& f : families) {
    SCOPED_TRACE(f.name);
    EXPECT_TRUE(family_names.insert(f.name).second) << "family repeated";
    EXPECT_TRUE(f.has_help);
    EXPECT_TRUE(f.type == "counter" || f.type == "gauge" ||
                f.type == "histogram")
        << f.type;
    const bool engine = f.name.find(':') != std::string::npos;
    for (const Sample& s : f.samples) {
      EXPECT_TRUE(
          series_keys.insert(s.name + "{" + LabelsWithout(s, "") + "}").second)
          << "series repeated: " << s.name;
      if (engine) {
        if (s.labels.size() < 2) {
          ADD_FAILURE() << s.name << ": fewer than two labels";
          continue;
        }
        EXPECT_EQ(s.labels[0].first, "model_name") << s.name;
        EXPECT_EQ(s.labels[1].first, "engine") << s.name;
      }
      std::set<std::string> label_names;
      for (const auto& [n, v] : s.labels) {
        EXPECT_TRUE(label_names.insert(n).second) << "label repeated: " << n;
      }
    }
    if (f.type == "counter") {
      const bool total = f.name.ends_with("_total");
      EXPECT_EQ(total, !om) << "counter TYPE name and _total";
      const std::string sample_name = om ? f.name + "_total" : f.name;
      for (const Sample& s : f.samples) {
        EXPECT_EQ(s.name, sample_name);
        EXPECT_TRUE(s.name.ends_with("_total")) << s.name;
      }
    } else if (f.type == "gauge") {
      for (const Sample& s : f.samples) EXPECT_EQ(s.name, f.name);
    } else if (f.type == "histogram") {
      CheckHistogram(f);
    }
  }
  return families;
}

// ---- golden file
// ----------------------------------------------------------------

// Compares `got` with the golden file at `path` (TOKENMETER_UPDATE_GOLDEN=1
// rewrites it first).
void ExpectGolden(const char* path, const std::string& got) {
  const char* update = std::getenv("TOKENMETER_UPDATE_GOLDEN");
  if (update != nullptr && std::string_view(update) == "1") {
    std::filesystem::create_directories(TOKENMETER_TEST_DATA_DIR);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << got;
    std::cerr << "rewrote " << path << "\n";
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path << " is missing; run with TOKENMETER_UPDATE_GOLDEN=1";
  const std::string want((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  if (got == want) return;
  // Point at the first differing line rather than printing both files.
  std::istringstream g(got), w(want);
  std::string gl, wl;
  int lineno = 0;
  while (true) {
    ++lineno;
    const bool gm = static_cast<bool>(std::getline(g, gl));
    const bool wm = static_cast<bool>(std::getline(w, wl));
    if (!gm && !wm) break;
    if (gm != wm || gl != wl) {
      ADD_FAILURE() << path << ":" << lineno
                    << " differs\n  want: " << (wm ? wl : "<end of file>")
                    << "\n  got:  " << (gm ? gl : "<end of output>")
                    << "\n(TOKENMETER_UPDATE_GOLDEN=1 rewrites the file "
                       "after an intended change)";
      return;
    }
  }
  ADD_FAILURE() << "outputs differ only in a final newline";
}

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

TEST(ExpositionTest, TextFormatStructure) {
  const auto reg = PopulatedRegistry();
  const std::vector<Family> families = CheckStructure(
      Render(*reg, ExpositionFormat::kText004), ExpositionFormat::kText004);
  // Every catalog family of both namespaces is present.
  std::set<std::string> names;
  for (const Family& f : families) names.insert(f.name);
  for (const char* ns : {"vllm:", "tokenmeter_engine:"}) {
    for (const FamilyDef& f : ProfileFamilies(Profile::kVllm)) {
      // Legacy names, cache_config and MoE only with their options / data.
      if (f.legacy || f.part == PartKind::kMoe ||
          f.part == PartKind::kCacheConfig) {
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
    // Shown only while --request-label names a label.
    EXPECT_EQ(names.count(name), d.id == kRequestLabelOverflow ? 0u : 1u)
        << name;
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

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::istringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    char tmpl[] = "/tmp/tm_exposition_XXXXXX";
    const int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    path_ = tmpl;
    if (fd >= 0) {
      EXPECT_EQ(write(fd, contents.data(), contents.size()),
                ssize_t(contents.size()));
      close(fd);
    }
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The two findings docs/metrics.md keeps on purpose.
bool IsExpectedLintFinding(const std::string& line) {
  if (line.find("metric names should not contain ':'") != std::string::npos) {
    return true;
  }
  return line.find("iteration_tokens_total") != std::string::npos &&
         line.find("non-counter metrics should not have \"_total\" suffix") !=
             std::string::npos;
}

// Runs `promtool check metrics` on `text`: exit 0, or exit 3 with only
// findings `expected` accepts.
void ExpectOnlyExpectedLints(const std::string& promtool,
                             const std::string& text,
                             bool (*expected)(const std::string&)) {
  const TempFile file(text);
  const CommandResult r = RunCommand("'" + promtool + "' check metrics < '" +
                                     file.path() + "' 2>&1");
  ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3)
      << "promtool exit " << r.exit_code << ":\n"
      << r.output;
  std::istringstream in(r.output);
  std::string line;
  int findings = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++findings;
    EXPECT_TRUE(expected(line)) << "promtool: " << line;
  }
  EXPECT_EQ(findings > 0, r.exit_code == 3) << r.output;
}

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

TEST(ExpositionTest, PythonPrometheusClientParsesItAndValuesRoundTrip) {
  const char* python = "/usr/bin/python3";
  if (access(python, X_OK) != 0) GTEST_SKIP() << python << " missing";
  const auto reg = PopulatedRegistry();
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const TempFile script(kPythonParse);
  const TempFile file(text);
  const CommandResult r =
      RunCommand(std::string(python) + " '" + script.path() + "' < '" +
                 file.path() + "' 2>&1");
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
  size_t sample_lines = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] != '#') ++sample_lines;
  }
  EXPECT_EQ(got["samples"], std::to_string(sample_lines));
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
  const char* python = "/usr/bin/python3";
  if (access(python, X_OK) != 0) GTEST_SKIP() << python << " missing";
  const auto reg = PopulatedRegistry();
  const std::string text = Render(*reg, ExpositionFormat::kOpenMetrics100);
  const TempFile script(kPythonOpenMetricsParse);
  const TempFile file(text);
  const CommandResult r =
      RunCommand(std::string(python) + " '" + script.path() + "' < '" +
                 file.path() + "' 2>&1");
  if (r.exit_code == 77) GTEST_SKIP() << "prometheus_client not installed";
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t sample_lines = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] != '#') ++sample_lines;
  }
  EXPECT_EQ(r.output, "samples " + std::to_string(sample_lines) + "\n");
}

// ---- naming profiles, router series, per-request labels
// ---------------------------------------

constexpr char kProfilesGoldenPath[] =
    TOKENMETER_TEST_DATA_DIR "/exposition_profiles_golden.txt";
constexpr char kMetricsDocPath[] =
    TOKENMETER_TEST_DATA_DIR "/../../docs/metrics.md";

// The label key of per-request label values (one per --request-label, ""
// for none), admitted into `s` as the tracker would at ARRIVED.
LabelKey KeyOf(Registry& reg, EngineSeries& s,
               std::initializer_list<std::string_view> values) {
  LabelKey key = 0;
  size_t i = 0;
  for (std::string_view v : values) {
    uint16_t id = reg.request_labels().Intern(i, v);
    if (!s.Admit(i, id)) id = RequestLabels::kOther;
    key = RequestLabels::Pack(key, i, id);
    ++i;
  }
  return key;
}

// An SGLang and an LMDeploy series with data in every family, per-request
// label cells (--request-label tenant, two places; the empty value's only
// in SGLang's), cache_config, max_lora and LoRA sets.
Exposed ProfilesRegistry() {
  RegistryOptions options;
  options.request_labels = {"tenant"};
  options.request_label_values = 2;
  Exposed reg = MakeExposed(options);
  EngineSeries* sg =
      reg->GetOrCreate({"sglang", "qwen-7b", "0", {}, Profile::kSglang});
  EngineSeries* lm = reg->GetOrCreate({"lmdeploy",
                                       "internlm2",
                                       "tp0",
                                       {{"zone", "eu\"1"}},
                                       Profile::kLmdeploy});
  for (EngineSeries* s : {sg, lm}) {
    const uint64_t k = s == sg ? 1 : 2;
    Fill(*s, k, /*step_gauges=*/s == sg, /*spec_positions=*/true);
    s->Add(kPromptTokensAtFinish, 300 * k);
    s->Add(kGenerationTokensAtFinish, 90 * k);
    s->Add(kNumFinishedRequests, 12 * k);
    s->Add(kNumAbortedRequests, k);
    s->AddChild(kRequestSuccess, 3, 4 * k);  // error
    s->Set(kWindowGenerationThroughput, 42.5 * double(k));
    s->Set(kWindowCacheHitRate, 0.25);
    s->Set(kWindowSpecAcceptLength, 2.75);
    s->Set(kWindowSpecAcceptRate, 0.625);
    SeriesValues& acme = s->Cell(KeyOf(*reg, *s, {"acme"}));
    Fill(acme, k + 2, false, false);
    acme.Add(kPromptTokensAtFinish, 30 * k);
    acme.Add(kGenerationTokensAtFinish, 9 * k);
    acme.Add(kNumFinishedRequests, 2 * k);
    acme.Add(kNumAbortedRequests, k);
    Fill(s->Cell(KeyOf(*reg, *s, {"globex"})), k + 4, false, false);
    s->Cell(KeyOf(*reg, *s, {"initech"})).Add(kGenerationTokens, 7);
  }
  // SGLang's series had requests without labels, LMDeploy's did not: only
  // the first shows the empty-label copy.
  sg->UseOwnCell();
  reg->request_labels().CountOverflow(0);
  reg->request_labels().CountOverflow(0);
  const double kNaN = std::nan("");
  sg->part<CacheConfigPart>().Set({{"page_size", "16", 16},
                                   {"num_pages", "8192", 8192},
                                   {"dtype", "auto", kNaN}});
  lm->part<CacheConfigPart>().Set({{"block_size", "64", 64},
                                   {"enable_prefix_caching", "True", kNaN},
                                   {"cache_max_entry_count", "0.8", 0.8}});
  lm->part<LoraPart>().SetMaxLora(4);
  RequestLabels& labels = reg->request_labels();
  sg->part<LoraPart>().InitTime(1'764'633'600.5);
  lm->part<LoraPart>().InitTime(1'764'633'600.5);
  lm->part<LoraPart>().Add(labels.InternLora("sql-lora"), true, 1,
                           1'764'633'700.25);
  lm->part<LoraPart>().Add(labels.InternLora("chat"), true, 1, 1'764'633'701);
  lm->part<LoraPart>().Add(labels.InternLora("sql-lora"), false, 1,
                           1'764'633'702);
  return reg;
}

// The lines of engine families and of tokenmeter_request_label_overflow:
// what the profiles change (the rest is the first golden file's).
std::string ProfileLines(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string_view name = line;
    if (name.starts_with("# HELP ") || name.starts_with("# TYPE ")) {
      name.remove_prefix(7);
    }
    name = name.substr(0, name.find_first_of("{ "));
    if (name.find(':') != std::string_view::npos ||
        name.starts_with("tokenmeter_request_label_overflow")) {
      out += line;
      out += '\n';
    }
  }
  return out;
}

TEST(ExpositionTest, ProfilesMatchTheirGoldenFile) {
  const auto reg = ProfilesRegistry();
  ExpectGolden(kProfilesGoldenPath,
               ProfileLines(Render(*reg, ExpositionFormat::kText004)));
}

TEST(ExpositionTest, ProfilesStructure) {
  const auto reg = ProfilesRegistry();
  CheckStructure(Render(*reg, ExpositionFormat::kText004),
                 ExpositionFormat::kText004);
  CheckStructure(Render(*reg, ExpositionFormat::kOpenMetrics100),
                 ExpositionFormat::kOpenMetrics100);
}

// The (name, type) rows of docs/metrics.md's generated table of `profile`,
// `<ns>` replaced by `ns`; legacy rows only with `legacy`.
std::set<std::pair<std::string, std::string>> DocRows(
    const std::string& profile, const std::string& ns, bool legacy) {
  std::ifstream in(kMetricsDocPath);
  EXPECT_TRUE(in) << kMetricsDocPath;
  const std::string begin = "<!-- BEGIN GENERATED: profile " + profile + " -->";
  std::set<std::pair<std::string, std::string>> rows;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == begin) inside = true;
    if (!inside) continue;
    if (line.starts_with("<!-- END GENERATED")) break;
    if (!line.starts_with("| `")) continue;
    const size_t close = line.find('`', 3);
    std::string name = line.substr(3, close - 3);
    if (name.starts_with("<ns>:")) name = ns + name.substr(4);
    const size_t type_start = line.find("| ", close) + 2;
    const std::string type =
        line.substr(type_start, line.find(' ', type_start) - type_start);
    const bool is_legacy =
        line.substr(close, line.find('|', close) - close).find("legacy") !=
        std::string::npos;
    if (is_legacy && !legacy) continue;
    rows.emplace(name, type);
  }
  EXPECT_FALSE(rows.empty()) << profile;
  return rows;
}

// The (name, type) of every engine family rendered.
std::set<std::pair<std::string, std::string>> EngineFamilies(
    const std::string& text) {
  std::set<std::pair<std::string, std::string>> out;
  for (const Family& f : Parse(text, ExpositionFormat::kText004)) {
    if (f.name.find(':') != std::string::npos) out.emplace(f.name, f.type);
  }
  return out;
}

// One series of `p` with data in every family its table has.
std::string RenderOneSeries(Profile p, bool legacy_names) {
  RegistryOptions options;
  options.legacy_names = legacy_names;
  options.moe_expert_series = true;
  std::unique_ptr<Registry> reg;
  EXPECT_TRUE(Registry::Create(options, &reg).ok());
  const std::string ns = ProfileNamespace(p, "vllm", "");
  EngineSeries* s = reg->GetOrCreate({ns, "m", "0", {}, p});
  Fill(*s, 1, true, true);
  s->part<CacheConfigPart>().Set(
      {{"page_size", "16", 16}, {"num_pages", "4", 4}});
  const uint64_t counts[] = {3, 1};
  EXPECT_TRUE(s->part<MoePart>().Add(0, std::span<const uint64_t>(counts, 2)));
  return Render(*reg, ExpositionFormat::kText004);
}

TEST(ExpositionTest, EachProfileShowsTheFamiliesOfItsDocsTable) {
  struct Case {
    Profile profile;
    bool legacy;
  };
  for (const Case c :
       {Case{Profile::kVllm, false}, Case{Profile::kVllm, true},
        Case{Profile::kSglang, false}, Case{Profile::kSglang, true},
        Case{Profile::kLmdeploy, false}, Case{Profile::kLmdeploy, true}}) {
    const std::string name(ProfileName(c.profile));
    SCOPED_TRACE(name + (c.legacy ? " --legacy-names" : ""));
    // --legacy-names adds vLLM's aliases only.
    const bool legacy = c.legacy && c.profile == Profile::kVllm;
    EXPECT_EQ(EngineFamilies(RenderOneSeries(c.profile, c.legacy)),
              DocRows(name, "vllm", legacy));
  }
}

bool HasLine(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(ExpositionTest, MoeSeriesPerLayerAndExpert) {
  for (const bool expert_series : {false, true}) {
    SCOPED_TRACE(expert_series);
    RegistryOptions options;
    options.moe_expert_series = expert_series;
    std::unique_ptr<Registry> reg;
    ASSERT_TRUE(Registry::Create(options, &reg).ok());
    EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
    EngineSeries* dense = reg->GetOrCreate({"vllm", "m", "1", {}});
    ASSERT_NE(dense, nullptr);
    const uint64_t a[] = {6, 2, 0, 0};  // max 6, mean 2: imbalance 3
    const uint64_t b[] = {1, 1, 1, 1};  // balanced
    const uint64_t zero[] = {0, 0, 0, 0};
    const uint64_t wrong[] = {1, 2};
    ASSERT_TRUE(s->part<MoePart>().Add(3, std::span<const uint64_t>(a, 4)));
    ASSERT_TRUE(s->part<MoePart>().Add(3, std::span<const uint64_t>(b, 4)));
    ASSERT_TRUE(s->part<MoePart>().Add(
        7, std::span<const uint64_t>(zero, 4)));  // fixes 4 experts, no ratio
    EXPECT_FALSE(s->part<MoePart>().Add(
        3, std::span<const uint64_t>(wrong, 2)));  // the count is fixed
    const std::string text = Render(*reg, ExpositionFormat::kText004);
    const std::string l = "model_name=\"m\",engine=\"0\"";
    EXPECT_TRUE(HasLine(
        text, "vllm:moe_routed_tokens_total{" + l + ",layer=\"3\"} 12"));
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_routed_tokens_total{" + l + ",layer=\"7\"} 0"));
    // The latest load with a non-zero sum: the balanced one.
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_layer_imbalance{" + l + ",layer=\"3\"} 1"));
    EXPECT_EQ(text.find("vllm:moe_layer_imbalance{" + l + ",layer=\"7\"}"),
              std::string::npos);
    EXPECT_TRUE(HasLine(text, "vllm:moe_imbalance_count{" + l + "} 2"));
    EXPECT_TRUE(HasLine(text, "vllm:moe_imbalance_sum{" + l + "} 4"));
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_imbalance_bucket{" + l + ",le=\"1\"} 1"));
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_imbalance_bucket{" + l + ",le=\"3\"} 2"));
    // Every expert of a known layer, 0 until it gets tokens; only with
    // --moe-expert-series.
    EXPECT_EQ(HasLine(text, "vllm:moe_expert_tokens_total{" + l +
                                ",layer=\"3\",expert=\"0\"} 7"),
              expert_series);
    EXPECT_EQ(HasLine(text, "vllm:moe_expert_tokens_total{" + l +
                                ",layer=\"7\",expert=\"3\"} 0"),
              expert_series);
    // A series without EXPERT_LOAD has no MoE samples.
    EXPECT_EQ(text.find("moe_routed_tokens_total{model_name=\"m\",engine="
                        "\"1\""),
              std::string::npos);
  }
}

TEST(ExpositionTest, VllmLegacyNamesReadTheSameValues) {
  const std::string text = RenderOneSeries(Profile::kVllm, true);
  const std::string l = "{model_name=\"m\",engine=\"0\"}";
  EXPECT_TRUE(HasLine(text, "vllm:kv_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(HasLine(text, "vllm:gpu_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(
      HasLine(text, "vllm:gpu_prefix_cache_queries_total" + l + " 1000"));
  EXPECT_TRUE(HasLine(text, "vllm:gpu_prefix_cache_hits_total" + l + " 250"));
  EXPECT_TRUE(HasLine(text, "vllm:gpu_prefix_cache_hit_rate" + l + " 0.25"));
  // The ITL histogram under its pre-0.11 name: the same samples.
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> itl, tpot;
  while (std::getline(in, line)) {
    if (line.starts_with("vllm:inter_token_latency_seconds_")) {
      itl.push_back(line.substr(line.find('_', 5)));
    }
    if (line.starts_with("vllm:time_per_output_token_seconds_")) {
      tpot.push_back(line.substr(line.find('_', 5)));
    }
  }
  ASSERT_FALSE(itl.empty());
  ASSERT_EQ(itl.size(), tpot.size());
  for (size_t i = 0; i < itl.size(); ++i) {
    EXPECT_EQ(itl[i].substr(itl[i].find('{')),
              tpot[i].substr(tpot[i].find('{')));
  }
  // Without the option: none of them.
  const std::string plain = RenderOneSeries(Profile::kVllm, false);
  for (const char* alias :
       {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_hit_rate",
        "vllm:time_per_output_token_seconds"}) {
    EXPECT_EQ(plain.find(std::string("\n") + alias), std::string::npos)
        << alias;
  }
}

TEST(ExpositionTest, CacheConfigInfoCarriesEveryEntry) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* a = reg->GetOrCreate({"vllm", "m", "0", {{"tier", "x"}}});
  EngineSeries* b = reg->GetOrCreate({"vllm", "m", "1", {}});
  std::string text = Render(*reg, ExpositionFormat::kText004);
  // Absent while no HELLO sent one.
  EXPECT_EQ(text.find("cache_config_info"), std::string::npos);
  a->part<CacheConfigPart>().Set(
      {{"block_size", "16", 16},
       {"num_gpu_blocks", "8192", 8192},
       {"gpu_memory_utilization", "0.9", 0.9},
       {"enable_prefix_caching", "True", std::nan("")},
       {"cache_dtype", "a \"b\"", std::nan("")}});
  text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_TRUE(HasLine(
      text,
      "vllm:cache_config_info{model_name=\"m\",engine=\"0\",tier=\"x\","
      "block_size=\"16\",num_gpu_blocks=\"8192\",gpu_memory_utilization="
      "\"0.9\",enable_prefix_caching=\"True\",cache_dtype=\"a \\\"b\\\"\"} 1"))
      << text;
  EXPECT_EQ(text.find("vllm:cache_config_info{model_name=\"m\",engine=\"1\""),
            std::string::npos);
  // The latest HELLO's replaces it; an empty one keeps the family.
  a->part<CacheConfigPart>().Set({{"block_size", "32", 32}});
  b->part<CacheConfigPart>().Set({});
  text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_TRUE(HasLine(text,
                      "vllm:cache_config_info{model_name=\"m\",engine=\"0\","
                      "tier=\"x\",block_size=\"32\"} 1"));
  EXPECT_TRUE(
      HasLine(text, "vllm:cache_config_info{model_name=\"m\",engine=\"1\"} 1"));
  EXPECT_EQ(text.find("num_gpu_blocks"), std::string::npos);
}

TEST(ExpositionTest, SglangPageSizeAndNumPagesComeFromCacheConfig) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* a =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  EngineSeries* b =
      reg->GetOrCreate({"sglang", "m", "1", {}, Profile::kSglang});
  std::string text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_EQ(text.find("sglang:page_size"), std::string::npos);
  EXPECT_EQ(text.find("sglang:num_pages"), std::string::npos);
  EXPECT_EQ(text.find("sglang:cache_config_info"), std::string::npos);
  a->part<CacheConfigPart>().Set(
      {{"page_size", "16", 16}, {"num_pages", "8192", 8192}});
  // Not a number: no gauge sample, still a label.
  b->part<CacheConfigPart>().Set({{"page_size", "big", std::nan("")}});
  text = Render(*reg, ExpositionFormat::kText004);
  const std::string l0 = "{model_name=\"m\",engine=\"0\"";
  const std::string l1 = "{model_name=\"m\",engine=\"1\"";
  EXPECT_TRUE(HasLine(text, "sglang:cache_config_info" + l0 +
                                ",page_size=\"16\",num_pages=\"8192\"} 1"))
      << text;
  EXPECT_TRUE(
      HasLine(text, "sglang:cache_config_info" + l1 + ",page_size=\"big\"} 1"));
  EXPECT_TRUE(HasLine(text, "sglang:page_size" + l0 + "} 16"));
  EXPECT_TRUE(HasLine(text, "sglang:num_pages" + l0 + "} 8192"));
  EXPECT_EQ(text.find("sglang:page_size" + l1), std::string::npos);
  EXPECT_EQ(text.find("sglang:num_pages" + l1), std::string::npos);
  EXPECT_NE(text.find("# HELP sglang:cache_config_info Cache configuration "
                      "information.\n"),
            std::string::npos);
}

TEST(ExpositionTest, SglangCountersAndWindowGauges) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  s->Add(kPromptTokens, 1);  // the vLLM counters are not what SGLang shows
  s->Add(kGenerationTokens, 2);
  s->Add(kPromptTokensAtFinish, 30);
  s->Add(kGenerationTokensAtFinish, 40);
  s->Add(kNumFinishedRequests, 5);
  s->Add(kNumAbortedRequests, 2);
  s->Add(kPrefixCacheHits, 77);
  s->Set(kWindowGenerationThroughput, 12.5);
  s->Set(kWindowCacheHitRate, 0.5);
  s->Set(kKvCacheUsagePerc, 0.125);
  s->AddDerived(kNumRequestsRunning, 3);
  s->AddDerived(kNumRequestsWaiting, 4);
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string l = "{model_name=\"m\",engine=\"0\"}";
  EXPECT_TRUE(HasLine(text, "sglang:prompt_tokens_total" + l + " 30")) << text;
  EXPECT_TRUE(HasLine(text, "sglang:generation_tokens_total" + l + " 40"));
  EXPECT_TRUE(HasLine(text, "sglang:num_requests_total" + l + " 5"));
  EXPECT_TRUE(HasLine(text, "sglang:num_aborted_requests_total" + l + " 2"));
  EXPECT_TRUE(HasLine(text,
                      "sglang:cached_tokens_total{model_name=\"m\",engine="
                      "\"0\",cache_source=\"total\"} 77"));
  EXPECT_TRUE(HasLine(text, "sglang:gen_throughput" + l + " 12.5"));
  EXPECT_TRUE(HasLine(text, "sglang:cache_hit_rate" + l + " 0.5"));
  EXPECT_TRUE(HasLine(text, "sglang:spec_accept_length" + l + " 0"));
  EXPECT_TRUE(HasLine(text, "sglang:token_usage" + l + " 0.125"));
  EXPECT_TRUE(HasLine(text, "sglang:num_running_reqs" + l + " 3"));
  EXPECT_TRUE(HasLine(text, "sglang:num_queue_reqs" + l + " 4"));
  EXPECT_NE(text.find("# TYPE sglang:prompt_tokens_histogram histogram\n"),
            std::string::npos);
  EXPECT_NE(text.find("sglang:queue_time_seconds_bucket{model_name=\"m\","
                      "engine=\"0\",le=\"0\"} 0\n"),
            std::string::npos);
}

TEST(ExpositionTest, LmdeployFinishedReasonsAreResponseTypes) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"lmdeploy", "m", "0", {}, Profile::kLmdeploy});
  s->AddChild(kRequestSuccess, size_t(FinishReason::kStop), 3);
  s->AddChild(kRequestSuccess, size_t(FinishReason::kLength), 2);
  s->AddChild(kRequestSuccess, size_t(FinishReason::kAbort), 1);
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string p =
      "lmdeploy:request_success_total{model_name=\"m\",engine=\"0\","
      "finished_reason=\"ResponseType.";
  EXPECT_TRUE(HasLine(text, p + "FINISH\"} 5")) << text;
  EXPECT_TRUE(HasLine(text, p + "CANCEL\"} 1"));
  EXPECT_TRUE(HasLine(text, p + "INTERNAL_ENGINE_ERROR\"} 0"));
  size_t samples = 0;
  for (size_t at = text.find("\nlmdeploy:request_success_total{");
       at != std::string::npos;
       at = text.find("\nlmdeploy:request_success_total{", at + 1)) {
    ++samples;
  }
  EXPECT_EQ(samples, 3u);
}

TEST(ExpositionTest, LmdeploySpecDecodeRatios) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"lmdeploy", "m", "0", {}, Profile::kLmdeploy});
  const std::string l = "{model_name=\"m\",engine=\"0\"";
  std::string text = Render(*reg, ExpositionFormat::kText004);
  // No drafts yet: 0, and no per-position series.
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_rate" + l + "} 0"));
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_length" + l + "} 0"));
  EXPECT_EQ(text.find("spec_decode_per_position_accept_rate"),
            std::string::npos);
  s->Add(kSpecDecodeNumDrafts, 4);
  s->Add(kSpecDecodeNumDraftTokens, 8);
  s->Add(kSpecDecodeNumAcceptedTokens, 6);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 3);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 1, 2);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 2, 1);
  text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_rate" + l + "} 0.75"));
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_length" + l + "} 2.5"));
  const std::string pos = "lmdeploy:spec_decode_per_position_accept_rate" + l;
  EXPECT_TRUE(HasLine(text, pos + ",position=\"0\"} 0.75")) << text;
  EXPECT_TRUE(HasLine(text, pos + ",position=\"1\"} 0.5"));
  EXPECT_TRUE(HasLine(text, pos + ",position=\"2\"} 0.25"));
}

TEST(ExpositionTest, LoraRequestsInfoIsOneSeriesPerEngineSeries) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* a = reg->GetOrCreate({"vllm", "m", "0", {}});
  EngineSeries* b = reg->GetOrCreate({"vllm", "m", "1", {{"tier", "x"}}});
  a->part<LoraPart>().InitTime(1'764'633'600);
  b->part<LoraPart>().InitTime(1'764'633'600);
  b->part<LoraPart>().SetMaxLora(8);
  RequestLabels& labels = reg->request_labels();
  const uint16_t x = labels.InternLora("x");
  const uint16_t y = labels.InternLora("y");
  b->part<LoraPart>().Add(y, true, 1, 1'764'633'601);
  b->part<LoraPart>().Add(x, true, 1, 1'764'633'602);
  b->part<LoraPart>().Add(x, false, 1, 1'764'633'603.5);
  b->part<LoraPart>().Add(y, true, 1,
                          1'764'633'604);  // a second request: no change
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string p = "vllm:lora_requests_info{model_name=\"m\",";
  EXPECT_TRUE(HasLine(text, p + "engine=\"0\",max_lora=\"0\","
                                "running_lora_adapters=\"\","
                                "waiting_lora_adapters=\"\"} 1764633600"))
      << text;
  EXPECT_TRUE(HasLine(text, p + "engine=\"1\",tier=\"x\",max_lora=\"8\","
                                "running_lora_adapters=\"x,y\","
                                "waiting_lora_adapters=\"x\"} 1764633603.5"));
  size_t samples = 0;
  for (size_t at = text.find("\nvllm:lora_requests_info{");
       at != std::string::npos;
       at = text.find("\nvllm:lora_requests_info{", at + 1)) {
    ++samples;
  }
  EXPECT_EQ(samples, 2u);
}

// The per-request labels go on request-level families only: not on
// gauges, STEP counters, num_preemptions or iteration histograms.
TEST(ExpositionTest, RequestLabelsOnlyOnRequestLevelFamilies) {
  for (Profile p : {Profile::kVllm, Profile::kSglang, Profile::kLmdeploy}) {
    SCOPED_TRACE(ProfileName(p));
    RegistryOptions options;
    options.request_labels = {"tenant"};
    options.legacy_names = true;
    std::unique_ptr<Registry> reg;
    ASSERT_TRUE(Registry::Create(options, &reg).ok());
    EngineSeries* s =
        reg->GetOrCreate({ProfileNamespace(p, "vllm", ""), "m", "0", {}, p});
    Fill(*s, 1, true, true);
    Fill(s->Cell(KeyOf(*reg, *s, {"acme"})), 2, true, true);
    s->part<CacheConfigPart>().Set({{"page_size", "16", 16}});
    const std::string text = Render(*reg, ExpositionFormat::kText004);
    std::map<std::string, bool> request_level;  // exposed name -> flag
    for (const FamilyDef& f : ProfileFamilies(p)) {
      std::string name =
          ProfileNamespace(p, "vllm", "") + ":" + std::string(FamilyName(f));
      if (f.type == MetricType::kCounter) name += "_total";
      request_level[name] = f.source == FamilySource::kMetric &&
                            kEngineMetrics[f.metric].request_level;
    }
    size_t labelled = 0;
    for (const Family& f : Parse(text, ExpositionFormat::kText004)) {
      if (f.name.find(':') == std::string::npos) continue;
      SCOPED_TRACE(f.name);
      ASSERT_TRUE(request_level.count(f.name));
      bool acme = false;
      for (const Sample& smp : f.samples) {
        bool has_tenant = false;
        for (const auto& [n, v] : smp.labels) {
          if (n != "tenant") continue;
          has_tenant = true;
          acme = acme || v == "acme";
        }
        EXPECT_EQ(has_tenant, request_level[f.name]) << smp.name;
      }
      EXPECT_EQ(acme, request_level[f.name]);
      if (acme) ++labelled;
    }
    size_t want = 0;
    for (const auto& [name, flag] : request_level) want += flag ? 1 : 0;
    EXPECT_EQ(labelled, want);
    EXPECT_GE(want, 10u);
  }
}

// What promtool finds in the profiles: the findings docs/metrics.md keeps
// on purpose for each (SGLang's *_histogram names, LMDeploy's
// iter_token_latency), nothing else, no parse error.
bool IsExpectedProfileLintFinding(const std::string& line) {
  if (IsExpectedLintFinding(line)) return true;
  for (const char* name :
       {"sglang:prompt_tokens_histogram", "sglang:generation_tokens_histogram",
        "lmdeploy:iter_token_latency"}) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

TEST(ExpositionTest, PromtoolFindsOnlyTheKnownLintsOfEachProfile) {
  const std::string promtool = FindOnPath("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not on PATH";
  const auto reg = ProfilesRegistry();
  ExpectOnlyExpectedLints(promtool, Render(*reg, ExpositionFormat::kText004),
                          IsExpectedProfileLintFinding);
}

// ---- the protobuf exposition
// ------------------------------------------------------

namespace pb = ::io::prometheus::client;

std::string RenderProtobuf(const Registry& reg) {
  std::string out;
  ProtoWriter w(out);
  daemon::Render(reg, w);
  return out;
}

// Every length-delimited MetricFamily; a failure unless the bytes end
// cleanly after the last.
std::vector<pb::MetricFamily> ParseProtobuf(const std::string& bytes) {
  google::protobuf::io::ArrayInputStream in(bytes.data(), int(bytes.size()));
  std::vector<pb::MetricFamily> out;
  while (true) {
    pb::MetricFamily f;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&f, &in,
                                                                  &clean_eof)) {
      EXPECT_TRUE(clean_eof)
          << "bad or truncated message after " << out.size() << " families";
      break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

const char* TypeName(pb::MetricType t) {
  switch (t) {
    case pb::COUNTER:
      return "counter";
    case pb::GAUGE:
      return "gauge";
    case pb::HISTOGRAM:
      return "histogram";
    default:
      return "other";
  }
}

// A protobuf family as the text 0.0.4 samples it stands for: a histogram's
// buckets with le (the +Inf one from the count), _sum and _count.
Family AsText(const pb::MetricFamily& f) {
  Family out{f.name(), TypeName(f.type()), true, {}};
  for (const pb::Metric& m : f.metric()) {
    Sample base;
    for (const pb::LabelPair& l : m.label()) {
      base.labels.emplace_back(l.name(), l.value());
    }
    auto add = [&](std::string name, double v, const char* le = nullptr,
                   double bound = 0) {
      Sample s = base;
      s.name = std::move(name);
      s.value = v;
      if (le != nullptr) {
        std::string text = le;
        if (text.empty()) AppendDouble(text, bound);
        s.labels.emplace_back("le", text);
      }
      out.samples.push_back(std::move(s));
    };
    switch (f.type()) {
      case pb::COUNTER:
        add(f.name(), m.counter().value());
        break;
      case pb::GAUGE:
        add(f.name(), m.gauge().value());
        break;
      case pb::HISTOGRAM:
        for (const pb::Bucket& b : m.histogram().bucket()) {
          add(f.name() + "_bucket", double(b.cumulative_count()), "",
              b.upper_bound());
        }
        add(f.name() + "_bucket", double(m.histogram().sample_count()), "+Inf");
        add(f.name() + "_sum", m.histogram().sample_sum());
        add(f.name() + "_count", double(m.histogram().sample_count()));
        break;
      default:
        ADD_FAILURE() << f.name() << ": unexpected type";
    }
  }
  return out;
}

// The HELP text of every family in a text 0.0.4 exposition, unescaped.
std::map<std::string, std::string> HelpTexts(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("# HELP ")) continue;
    const std::string rest = line.substr(7);
    const size_t space = rest.find(' ');
    std::string help;
    for (size_t i = space + 1; i < rest.size(); ++i) {
      if (rest[i] == '\\' && i + 1 < rest.size()) {
        help += rest[i + 1] == 'n' ? '\n' : rest[i + 1];
        ++i;
      } else {
        help += rest[i];
      }
    }
    out[rest.substr(0, space)] = help;
  }
  return out;
}

// The protobuf exposition holds exactly the text 0.0.4 exposition's
// families that have samples, in its order, with its names (counters with
// _total), types, help texts, labels (in order) and values (bit for bit);
// the process_* values, which move between two renders, by name only.
void ExpectProtobufEqualsText(const Registry& reg) {
  const std::string text = Render(reg, ExpositionFormat::kText004);
  const std::vector<Family> want = Parse(text, ExpositionFormat::kText004);
  const std::map<std::string, std::string> help = HelpTexts(text);
  const std::vector<pb::MetricFamily> got = ParseProtobuf(RenderProtobuf(reg));
  size_t g = 0;
  size_t samples = 0;
  for (const Family& w : want) {
    if (w.samples.empty()) continue;  // left out of protobuf
    SCOPED_TRACE(w.name);
    ASSERT_LT(g, got.size()) << "family missing";
    const Family f = AsText(got[g]);
    EXPECT_EQ(f.name, w.name);
    EXPECT_EQ(f.type, w.type);
    EXPECT_EQ(got[g].help(), help.at(w.name));
    ++g;
    if (w.name.starts_with("process_")) continue;
    ASSERT_EQ(f.samples.size(), w.samples.size());
    for (size_t i = 0; i < w.samples.size(); ++i) {
      EXPECT_EQ(f.samples[i].name, w.samples[i].name);
      EXPECT_EQ(f.samples[i].labels, w.samples[i].labels) << w.samples[i].name;
      EXPECT_EQ(std::bit_cast<uint64_t>(f.samples[i].value),
                std::bit_cast<uint64_t>(w.samples[i].value))
          << w.samples[i].name << " " << w.samples[i].value_text;
    }
    samples += w.samples.size();
  }
  EXPECT_EQ(g, got.size()) << "extra families";
  EXPECT_GT(samples, 300u);
}

// ProtoWriter (the daemon's hand-written encoder) against LibraryProtoWriter
// (protoc's classes and libprotobuf), on registries without process_*
// (whose values move between two renders): the same bytes.
void ExpectBothEncodersAgree(const Registry& reg) {
  std::string hand, library;
  ProtoWriter h(hand);
  daemon::Render(reg, h);
  LibraryProtoWriter l(library);
  daemon::Render(reg, l);
  EXPECT_GT(hand.size(), 100u);
  EXPECT_TRUE(hand == library)
      << hand.size() << " vs " << library.size() << " bytes";
}

TEST(ExpositionTest, ProtobufEncoderAgreesWithTheGeneratedCode) {
  for (int schema : {3, -4, 8}) {
    RegistryOptions options;
    options.native_histogram_schema = schema;
    options.request_labels = {"tenant"};
    std::unique_ptr<Registry> reg;
    ASSERT_TRUE(Registry::Create(options, &reg).ok());
    EngineSeries* a =
        reg->GetOrCreate({"vllm", "m", "0", {{"tier", kOddLabel}}});
    EngineSeries* b =
        reg->GetOrCreate({"sglang", "q", "1", {}, Profile::kSglang});
    Fill(*a, 1, true, true);
    Fill(*b, 2, true, true);
    // Wide spreads: many native buckets, gaps, reduced schemas, the zero
    // bucket, NaN and +Inf.
    Histogram& h = a->hist(kE2eRequestLatency);
    for (int i = 0; i < 5000; ++i)
      h.Observe(std::exp(double(i % 97) / 3) * 1e3);
    h.Observe(0);
    h.Observe(std::nan(""));
    h.Observe(HUGE_VAL);
    b->hist(kTimeToFirstToken).Observe(1e6);
    b->hist(kTimeToFirstToken).Observe(1e9);
    ExpectBothEncodersAgree(*reg);
  }
  std::unique_ptr<Registry> empty;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &empty).ok());
  empty->GetOrCreate({"vllm", "m", "0", {}});
  ExpectBothEncodersAgree(*empty);
}

TEST(ExpositionTest, ProtobufCarriesEverySampleOfTheText) {
  const auto reg = PopulatedRegistry();
  ExpectProtobufEqualsText(*reg);
}

TEST(ExpositionTest, ProtobufCarriesEverySampleOfTheTextInEachProfile) {
  const auto reg = ProfilesRegistry();
  ExpectProtobufEqualsText(*reg);
  RegistryOptions legacy;
  legacy.legacy_names = true;
  legacy.moe_expert_series = true;
  auto with_moe = MakeExposed(legacy);
  EngineSeries* s = with_moe->GetOrCreate({"vllm", "m", "0", {}});
  Fill(*s, 1, true, true);
  const uint64_t load[] = {6, 2, 0, 1};
  ASSERT_TRUE(s->part<MoePart>().Add(3, std::span<const uint64_t>(load, 4)));
  ExpectProtobufEqualsText(*with_moe);
}

// The native buckets of one histogram as (index, count), from its spans
// and deltas.
std::vector<std::pair<int32_t, uint64_t>> NativeBuckets(
    const pb::Histogram& h) {
  std::vector<std::pair<int32_t, uint64_t>> out;
  int32_t index = 0;
  int64_t count = 0;
  int d = 0;
  for (const pb::BucketSpan& span : h.positive_span()) {
    index += span.offset();
    for (uint32_t i = 0; i < span.length(); ++i) {
      EXPECT_LT(d, h.positive_delta_size());
      if (d >= h.positive_delta_size()) return out;
      count += h.positive_delta(d++);
      EXPECT_GT(count, 0) << "an empty bucket at " << index;
      out.emplace_back(index, uint64_t(count));
      ++index;
    }
  }
  EXPECT_EQ(d, h.positive_delta_size()) << "deltas without a span";
  return out;
}

const pb::Histogram* FindHistogram(const std::vector<pb::MetricFamily>& fs,
                                   const std::string& name) {
  for (const pb::MetricFamily& f : fs) {
    if (f.name() == name && f.metric_size() == 1) {
      return &f.metric(0).histogram();
    }
  }
  ADD_FAILURE() << name << " not found once";
  return nullptr;
}

TEST(ExpositionTest, ProtobufNativeBucketsAtEachSchema) {
  // Values well inside their buckets at every schema tried: bucket i of
  // schema s holds (2^((i-1) 2^-s), 2^(i 2^-s)], so the index of v is
  // ceil(log2(v) 2^s), computed here without the daemon's tables.
  const double values[] = {0.0071, 0.0071, 0.093, 0.41, 1.7, 1.7, 1.7, 3.3};
  for (int schema : {3, 0, -2, 8}) {
    SCOPED_TRACE("schema " + std::to_string(schema));
    RegistryOptions options;
    options.native_histogram_schema = schema;
    auto reg = MakeExposed(options);
    EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
    for (double v : values) s->hist(kTimeToFirstToken).Observe(v * 1e9);
    s->hist(kTimeToFirstToken).Observe(0);  // the zero bucket
    const std::vector<pb::MetricFamily> fs =
        ParseProtobuf(RenderProtobuf(*reg));
    const pb::Histogram* h =
        FindHistogram(fs, "vllm:time_to_first_token_seconds");
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->schema(), schema);
    EXPECT_EQ(h->zero_threshold(), 0x1p-128);
    EXPECT_EQ(h->zero_count(), 1u);
    EXPECT_EQ(h->sample_count(), std::size(values) + 1);
    EXPECT_EQ(h->negative_span_size(), 0);
    std::map<int32_t, uint64_t> want;
    for (double v : values) {
      ++want[int32_t(std::ceil(std::log2(v) * std::ldexp(1.0, schema)))];
    }
    using Buckets = std::vector<std::pair<int32_t, uint64_t>>;
    EXPECT_EQ(Buckets(want.begin(), want.end()), NativeBuckets(*h));
    // The classic buckets ride along unchanged.
    EXPECT_EQ(h->bucket_size(),
              int(s->hist(kTimeToFirstToken).layout().bounds().size()));
  }
}

TEST(ExpositionTest, ProtobufEmptyHistogramIsStillNative) {
  auto reg = MakeExposed(RegistryOptions{});
  reg->GetOrCreate({"vllm", "m", "0", {}});
  const std::vector<pb::MetricFamily> fs = ParseProtobuf(RenderProtobuf(*reg));
  const pb::Histogram* h =
      FindHistogram(fs, "vllm:time_to_first_token_seconds");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->sample_count(), 0u);
  EXPECT_EQ(h->schema(), 3);
  EXPECT_EQ(h->zero_threshold(), 0x1p-128);
  ASSERT_EQ(h->positive_span_size(), 1);
  EXPECT_EQ(h->positive_span(0).offset(), 0);
  EXPECT_EQ(h->positive_span(0).length(), 0u);
  EXPECT_EQ(h->positive_delta_size(), 0);
}

TEST(ExpositionTest, ProtobufSchemaOutOfRangeIsRejected) {
  for (int schema : {-5, 9}) {
    RegistryOptions options;
    options.native_histogram_schema = schema;
    std::unique_ptr<Registry> reg;
    const Status st = Registry::Create(options, &reg);
    EXPECT_FALSE(st.ok()) << schema;
    EXPECT_NE(st.message().find("native-histogram-schema"), std::string::npos);
  }
}

}  // namespace
}  // namespace tokenmeter::daemon
