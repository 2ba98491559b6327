#include "tests/daemon/exposition/exposition_fixture.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "daemon/exposition/exposition.h"
#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/kv_transfer.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/sleep.h"
#include "daemon/store/parts/waiting_reason.h"
#include "daemon/store/request_labels.h"

#ifndef TOKENMETER_VERSION
#error "TOKENMETER_VERSION must name the project's version"
#endif

namespace tokenmeter::daemon::exposition_test {
namespace {

// Whether `c` may stand in a metric name, first or not.
bool IsNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c == ':' || (!first && c >= '0' && c <= '9');
}

// A sample value, +Inf, -Inf and NaN included; false if not a number.
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

// The labels of `s` but `skip`, as one key: n=v;n=v;
std::string LabelsWithout(const Sample& s, std::string_view skip) {
  std::string key;
  for (const auto& [n, v] : s.labels) {
    if (n == skip) continue;
    key += n + "=" + v + ";";
  }
  return key;
}

// A histogram family's rules, series by series: le last, increasing,
// cumulative, ending in +Inf that equals _count; _sum and _count present.
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

}  // namespace

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
  // Their sources (protocol 1.2), which sum to them.
  s.AddChild(kPromptTokensBySource, kLocalCompute, 320 * k);
  s.AddChild(kPromptTokensBySource, kLocalCacheHit, 128 * k);
  s.AddChild(kPromptTokensBySource, kExternalKv, 64 * k);
  s.Add(kPromptTokensCached, 192 * k);
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

void FixedCollector::Collect(DaemonMetric id, MetricWriter& w) const {
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

// Data in every protocol 1.2 part of `s`: admission rejections by two
// reasons, waiting by reason, KV transfers of both roles (a send failed on
// a timeout, a recv on a bootstrap timeout), a sleep.
void FillProtocol12Parts(EngineSeries& s) {
  s.part<AdmissionPart>().Reject("queue_full");
  s.part<AdmissionPart>().Reject("queue_full");
  s.part<AdmissionPart>().Reject("token_cap");
  s.part<WaitingReasonPart>().Set(5, 2);
  KvTransferPart& kv = s.part<KvTransferPart>();
  kv.Add(0, 2'000'000, true, uint64_t{1} << 20, true, {});
  kv.Add(0, 9'000'000, false, 0, false, "timeout");
  kv.Add(1, 3'000'000, true, uint64_t{1} << 20, true, {});
  kv.Add(1, 4'000'000, false, 0, false, "bootstrap_timeout");
  s.part<SleepPart>().Apply(1, 1, 1);
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
  FillProtocol12Parts(*a);
  FillProtocol12Parts(*c);
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
  FillProtocol12Parts(*sg);
  FillProtocol12Parts(*lm);
  return reg;
}

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

void ExpectGolden(const char* path, const std::string& got) {
  const char* update = std::getenv("TOKENMETER_UPDATE_GOLDEN");
  if (update != nullptr && std::string_view(update) == "1") {
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
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

TempFile::TempFile(const std::string& contents) {
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

TempFile::~TempFile() { unlink(path_.c_str()); }

bool IsExpectedLintFinding(const std::string& line) {
  if (line.find("metric names should not contain ':'") != std::string::npos) {
    return true;
  }
  return line.find("iteration_tokens_total") != std::string::npos &&
         line.find("non-counter metrics should not have \"_total\" suffix") !=
             std::string::npos;
}

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

}  // namespace tokenmeter::daemon::exposition_test
