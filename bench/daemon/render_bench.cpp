// /metrics render time of tokenmeterd beside prometheus-cpp
// (docs/performance.md, "tokenmeterd" / "Render").
//
// A Registry holds --identities engine series identities (default 42: about
// 12.5 k samples with the daemon's own series), every histogram filled with
// a spread of observations and every counter and gauge set. Cases:
//   tokenmeterd_render           Registry::Render(kText004) into a reused
//                                std::string (what a scrape does, including
//                                reading /proc/self for process_*).
//   tokenmeterd_render_protobuf
//                                the same registry in the protobuf
//                                exposition (ProtoWriter, native buckets),
//                                what a Prometheus with native histograms
//                                gets; goal: at most 1.5x tokenmeterd_render.
//   tokenmeterd_render_protobuf_library
//                                the same bytes from LibraryProtoWriter
//                                (protoc's classes and libprotobuf): why the
//                                daemon has its own encoder.
//   tokenmeterd_otlp_metrics/<form>/<encoding>
//                                the same registry as one OTLP
//                                ExportMetricsServiceRequest
//                                (daemon/otlp_metrics: exponential or
//                                explicit histograms, protobuf or JSON),
//                                one encoder Reset() and reused per push,
//                                as the metrics pusher does
//                                (docs/otlp-metrics.md, "Cost").
//   prometheus_cpp_collect_serialize
//                                the same families, label sets, bucket
//                                layouts and values in a prometheus::Registry:
//                                Collect(), then TextSerializer::Serialize()
//                                into a std::string (what prometheus-cpp's
//                                exposer does per scrape).
//   prometheus_cpp_serialize     Serialize() alone, on one Collect() result.
//
// The prometheus-cpp registry is built from a parse of tokenmeterd's own
// exposition, so the two hold the same samples by construction; before
// timing, both expositions are parsed again and compared sample by sample
// (name, label set, value), and the program exits 1 if they differ.
//
// Flags: --identities=N; --dump-text=FILE and --dump-protobuf=FILE write
// tokenmeterd's text and protobuf expositions of the registry (what
// bench/go's peers_bench builds its client_golang and VictoriaMetrics
// registries from: bench/run_all.sh); then any Google Benchmark flag.
#include <benchmark/benchmark.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/exposition/exposition.h"
#include "daemon/exposition/process_collector.h"
#include "daemon/exposition/proto_writer.h"
#include "daemon/otlp_metrics/otlp_metrics_encoder.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/store/registry.h"
#ifdef TOKENMETER_HAVE_METRICS_PB
#include "testutil/library_proto_writer.h"
#endif

namespace {

namespace td = tokenmeter::daemon;

// The daemon's own families that the Daemon class writes (build info, the
// scrape duration, the HTTP counters), with the values a quiet daemon has.
class SelfFamilies : public td::Collector {
 public:
  explicit SelfFamilies(td::Registry& reg) : registration_(reg, this, kOwned) {}
  void Collect(td::DaemonMetric id, td::MetricWriter& w) const override {
    const td::SampleLabels none;
    if (id == td::kBuildInfo) {
      w.Sample(none.WithOwn("version", "0.1.0"), uint64_t{1});
    } else if (id == td::kScrapeDuration) {
      w.Sample(none, 0.0042);
    } else if (id == td::kHttpConnectionsRejected) {
      w.Sample(none, uint64_t{0});
    }
  }

 private:
  static constexpr td::DaemonMetric kOwned[] = {
      td::kBuildInfo, td::kScrapeDuration, td::kHttpResponses,
      td::kHttpConnectionsRejected};
  td::Registration registration_;
};

// The registry and every family owner, as the daemon wires them.
struct TmState {
  td::SystemClock clock;
  std::unique_ptr<td::Pipeline> pipeline;
  td::Registry* reg = nullptr;
  std::unique_ptr<td::ProcessCollector> process;
  std::unique_ptr<SelfFamilies> self;
  size_t series_count() const { return reg->series_count(); }
  void RenderProtobuf(std::string& out) const {
    td::ProtoWriter w(out);
    td::Render(*reg, w);
  }
#ifdef TOKENMETER_HAVE_METRICS_PB
  void RenderProtobufLibrary(std::string& out) const {
    td::LibraryProtoWriter w(out);
    td::Render(*reg, w);
  }
#endif
  void Render(std::string& out) const {
    td::Render(*reg, td::ExpositionFormat::kText004, out);
  }
};

// ---------------------------------------------------------------------------
// The tokenmeterd registry.

uint64_t Rand(uint64_t& s) {  // xorshift64*
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 2685821657736338717ull;
}

double Uniform(uint64_t& s) { return double(Rand(s) >> 11) * 0x1p-53; }

std::unique_ptr<TmState> BuildRegistry(int identities) {
  auto st = std::make_unique<TmState>();
  if (!td::Pipeline::Create(nullptr, st->clock, td::PipelineOptions{},
                            &st->pipeline)
           .ok()) {
    std::abort();
  }
  td::Registry* reg = &st->pipeline->registry();
  st->reg = reg;
  st->process = std::make_unique<td::ProcessCollector>(*reg);
  st->self = std::make_unique<SelfFamilies>(*reg);
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < identities; ++i) {
    td::SeriesIdentity id;
    id.ns = "vllm";
    id.model = "org/model-" + std::to_string(i / 8);
    id.instance = "dp" + std::to_string(i % 8);
    id.labels = {{"region", "eu-west-1"},
                 {"pool", "p" + std::to_string(i % 3)}};
    td::EngineSeries* s = reg->GetOrCreate(id);
    if (s == nullptr) std::abort();
    s->Set(td::kNumRequestsRunning, double(Rand(rng) % 256));
    s->Set(td::kNumRequestsWaiting, double(Rand(rng) % 64));
    s->Set(td::kKvCacheUsagePerc, Uniform(rng));
    const uint64_t queries = Rand(rng) % 1'000'000'000;
    s->Add(td::kPrefixCacheQueries, queries);
    s->Add(td::kPrefixCacheHits, queries / 3);
    s->Add(td::kNumPreemptions, Rand(rng) % 1000);
    s->Add(td::kPromptTokens, Rand(rng) % 10'000'000'000ull);
    s->Add(td::kGenerationTokens, Rand(rng) % 10'000'000'000ull);
    for (size_t r = 0; r < s->children(td::kRequestSuccess).size(); ++r) {
      s->AddChild(td::kRequestSuccess, r, Rand(rng) % 1'000'000);
    }
    const uint64_t drafts = Rand(rng) % 1'000'000;
    s->Add(td::kSpecDecodeNumDrafts, drafts);
    s->Add(td::kSpecDecodeNumDraftTokens, drafts * 4);
    s->Add(td::kSpecDecodeNumAcceptedTokens, drafts * 2);
    for (int m = td::kFirstHistogram;
         m < td::kFirstHistogram + td::kNumHistograms; ++m) {
      td::Histogram& h = s->hist(td::EngineMetric(m));
      // Log-uniform over the layout, a little past both ends, in raw units
      // (whole nanoseconds for the seconds histograms).
      // A layout whose first bound is 0 (request_num_preemptions): from
      // half its first positive bound (log(0) would make every value NaN).
      const std::vector<double>& b = h.layout().bounds();
      const double first = b.front() > 0 ? b.front() : b.size() > 1 ? b[1] : 1;
      const double lo = std::log(first / 2), hi = std::log(b.back() * 1.5);
      const double div = h.layout().divisor();
      for (int k = 0; k < 400; ++k) {
        double raw = std::exp(lo + (hi - lo) * Uniform(rng)) * div;
        if (div > 1) raw = std::round(raw);
        h.Observe(raw);
      }
    }
    st->pipeline->stats().SetClientDropped("vllm", id.model, id.instance,
                                           1000 + i, Rand(rng) % 100);
  }
  st->pipeline->stats().SetConnections(identities);
  return st;
}

// ---------------------------------------------------------------------------
// Text exposition parsing (the subset both serializers write).

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Family {
  std::string name, help, type;
  std::vector<Sample> samples;
};

bool ParseSampleLine(std::string_view line, Sample* s) {
  size_t i = line.find_first_of("{ ");
  if (i == std::string_view::npos) return false;
  s->name = line.substr(0, i);
  s->labels.clear();
  if (line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string_view::npos || eq + 1 >= line.size() ||
          line[eq + 1] != '"') {
        return false;
      }
      std::string name(line.substr(i, eq - i)), value;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          value += line[j] == 'n' ? '\n' : line[j];
        } else {
          value += line[j];
        }
      }
      s->labels[name] = value;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    ++i;  // '}'
  }
  while (i < line.size() && line[i] == ' ') ++i;
  const std::string value(line.substr(i));
  if (value == "+Inf") {
    s->value = HUGE_VAL;
  } else if (value == "-Inf") {
    s->value = -HUGE_VAL;
  } else {
    char* end = nullptr;
    s->value = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) return false;
  }
  return true;
}

std::vector<Family> ParseText(const std::string& text) {
  std::vector<Family> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.starts_with("# HELP ")) {
      const size_t sp = line.find(' ', 7);
      Family f;
      f.name = line.substr(7, sp - 7);
      for (size_t i = sp + 1; i < line.size(); ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) {
          ++i;
          f.help += line[i] == 'n' ? '\n' : line[i];
        } else {
          f.help += line[i];
        }
      }
      out.push_back(std::move(f));
    } else if (line.starts_with("# TYPE ")) {
      if (out.empty()) std::abort();
      out.back().type = line.substr(line.rfind(' ') + 1);
    } else if (line[0] != '#') {
      Sample s;
      if (out.empty() || !ParseSampleLine(line, &s)) {
        std::fprintf(stderr, "render_bench: cannot parse: %s\n", line.c_str());
        std::exit(1);
      }
      out.back().samples.push_back(std::move(s));
    }
  }
  return out;
}

// name{sorted labels} -> value, for comparing two expositions.
std::map<std::string, double> SampleMap(const std::string& text) {
  std::map<std::string, double> m;
  for (const Family& f : ParseText(text)) {
    for (const Sample& s : f.samples) {
      std::string key = s.name + "{";
      for (const auto& [k, v] : s.labels) key += k + "=" + v + ",";
      m[key + "}"] = s.value;
    }
  }
  return m;
}

// ---------------------------------------------------------------------------
// The prometheus-cpp mirror.

void BuildPrometheus(const std::string& text, prometheus::Registry& reg) {
  for (const Family& f : ParseText(text)) {
    if (f.type == "counter") {
      auto& fam =
          prometheus::BuildCounter().Name(f.name).Help(f.help).Register(reg);
      for (const Sample& s : f.samples) fam.Add(s.labels).Increment(s.value);
    } else if (f.type == "gauge") {
      auto& fam =
          prometheus::BuildGauge().Name(f.name).Help(f.help).Register(reg);
      for (const Sample& s : f.samples) fam.Add(s.labels).Set(s.value);
    } else if (f.type == "histogram") {
      auto& fam =
          prometheus::BuildHistogram().Name(f.name).Help(f.help).Register(reg);
      // Group by label set (without le): bounds, cumulative counts, sum.
      struct H {
        std::vector<double> bounds, cumulative;
        double sum = 0;
      };
      std::map<std::map<std::string, std::string>, H> hs;
      std::vector<std::map<std::string, std::string>> order;
      for (const Sample& s : f.samples) {
        auto labels = s.labels;
        labels.erase("le");
        auto [it, inserted] = hs.try_emplace(labels);
        if (inserted) order.push_back(labels);
        if (s.name == f.name + "_bucket") {
          if (s.labels.at("le") != "+Inf") {
            it->second.bounds.push_back(
                std::strtod(s.labels.at("le").c_str(), nullptr));
          }
          it->second.cumulative.push_back(s.value);
        } else if (s.name == f.name + "_sum") {
          it->second.sum = s.value;
        }
      }
      for (const auto& labels : order) {
        const H& h = hs[labels];
        std::vector<double> inc(h.cumulative.size());
        for (size_t i = 0; i < inc.size(); ++i) {
          inc[i] = h.cumulative[i] - (i > 0 ? h.cumulative[i - 1] : 0);
        }
        fam.Add(labels, h.bounds).ObserveMultiple(inc, h.sum);
      }
    } else {
      std::fprintf(stderr, "render_bench: unexpected type %s\n",
                   f.type.c_str());
      std::exit(1);
    }
  }
}

size_t CountSamples(const std::string& text) {
  size_t n = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start && text[start] != '#') ++n;
    start = end + 1;
  }
  return n;
}

// Writes `bytes` to `path` (nothing when path is null); false, with a line
// on stderr, when that fails.
bool WriteFile(const char* path, const std::string& bytes) {
  if (path == nullptr) return true;
  std::FILE* f = std::fopen(path, "wb");
  bool ok = f != nullptr &&
            std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) std::fprintf(stderr, "render_bench: cannot write %s\n", path);
  return ok;
}

struct Fixture {
  std::unique_ptr<TmState> tm;
  prometheus::Registry prom;
  size_t samples = 0;
};
Fixture* g_fixture = nullptr;

// One tokenmeterd render per iteration into a reused string, with the
// TmState method `render`.
template <void (TmState::*render)(std::string&) const>
void RenderCase(benchmark::State& state, bool count_samples) {
  const TmState& tm = *g_fixture->tm;
  std::string out;
  for (auto _ : state) {
    out.clear();
    (tm.*render)(out);
    benchmark::DoNotOptimize(out.data());
  }
  if (count_samples) state.counters["samples"] = double(CountSamples(out));
  state.counters["bytes"] = double(out.size());
}

void BM_TokenmeterdRender(benchmark::State& state) {
  RenderCase<&TmState::Render>(state, true);
}

// The same registry in the protobuf exposition (native buckets and all):
// what a Prometheus with --enable-feature=native-histograms gets.
void BM_TokenmeterdRenderProtobuf(benchmark::State& state) {
  RenderCase<&TmState::RenderProtobuf>(state, false);
}

#ifdef TOKENMETER_HAVE_METRICS_PB
// The same exposition built with the classes protoc generates from
// metrics.proto and serialized by libprotobuf: what the daemon would cost
// with the library (the reason for its own encoder).
void BM_TokenmeterdRenderProtobufLibrary(benchmark::State& state) {
  RenderCase<&TmState::RenderProtobufLibrary>(state, false);
}
#endif

// One OTLP push of the registry per iteration (range(0): 0 exponential,
// 1 explicit histograms; range(1): 0 protobuf, 1 JSON).
void BM_TokenmeterdOtlpMetrics(benchmark::State& state) {
  namespace om = td::otlp_metrics;
  om::OtlpMetricsOptions o;
  o.histograms = state.range(0) == 0 ? om::HistogramForm::kExponential
                                     : om::HistogramForm::kExplicit;
  o.encoding = state.range(1) == 0 ? om::OtlpEncoding::kProtobuf
                                   : om::OtlpEncoding::kJson;
  o.time_unix_nano = 1'750'000'000'000'000'000ULL;
  o.start_time_unix_nano = 1'749'000'000'000'000'000ULL;
  o.resource_attributes = {{"service.name", "tokenmeterd"},
                           {"service.instance.id", "bench:9400"}};
  om::OtlpMetricsEncoder enc(std::move(o));
  const td::Registry& reg = *g_fixture->tm->reg;
  uint64_t t = 0;
  for (auto _ : state) {
    enc.Reset(++t);
    td::Render(reg, enc);
    benchmark::DoNotOptimize(enc.body().data());
  }
  state.counters["data_points"] = double(enc.data_points());
  state.counters["bytes"] = double(enc.body().size());
}

void BM_PrometheusCppCollectSerialize(benchmark::State& state) {
  const prometheus::TextSerializer serializer;
  std::string out;
  for (auto _ : state) {
    const std::vector<prometheus::MetricFamily> families =
        g_fixture->prom.Collect();
    out = serializer.Serialize(families);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["samples"] = double(CountSamples(out));
  state.counters["bytes"] = double(out.size());
}

void BM_PrometheusCppSerialize(benchmark::State& state) {
  const prometheus::TextSerializer serializer;
  const std::vector<prometheus::MetricFamily> families =
      g_fixture->prom.Collect();
  std::string out;
  for (auto _ : state) {
    out = serializer.Serialize(families);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["samples"] = double(CountSamples(out));
  state.counters["bytes"] = double(out.size());
}

BENCHMARK(BM_TokenmeterdRender)
    ->Name("tokenmeterd_render")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TokenmeterdRenderProtobuf)
    ->Name("tokenmeterd_render_protobuf")
    ->Unit(benchmark::kMillisecond);
#ifdef TOKENMETER_HAVE_METRICS_PB
BENCHMARK(BM_TokenmeterdRenderProtobufLibrary)
    ->Name("tokenmeterd_render_protobuf_library")
    ->Unit(benchmark::kMillisecond);
#endif
BENCHMARK(BM_TokenmeterdOtlpMetrics)
    ->Name("tokenmeterd_otlp_metrics")
    ->ArgNames({"explicit", "json"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PrometheusCppCollectSerialize)
    ->Name("prometheus_cpp_collect_serialize")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PrometheusCppSerialize)
    ->Name("prometheus_cpp_serialize")
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  int identities = 42;
  const char* dump_text = nullptr;
  const char* dump_protobuf = nullptr;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--identities=", 13) == 0) {
      identities = std::atoi(argv[i] + 13);
    } else if (std::strncmp(argv[i], "--dump-text=", 12) == 0) {
      dump_text = argv[i] + 12;
    } else if (std::strncmp(argv[i], "--dump-protobuf=", 16) == 0) {
      dump_protobuf = argv[i] + 16;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (identities < 1) {
    std::fprintf(stderr, "render_bench: --identities must be >= 1\n");
    return 2;
  }

  Fixture fixture;
  fixture.tm = BuildRegistry(identities);
  std::string ours;
  fixture.tm->Render(ours);
  BuildPrometheus(ours, fixture.prom);
  const prometheus::TextSerializer serializer;
  const std::string theirs = serializer.Serialize(fixture.prom.Collect());

  // Same samples on both sides, or the comparison means nothing.
  const auto a = SampleMap(ours), b = SampleMap(theirs);
  size_t mismatches = 0;
  for (const auto& [key, v] : a) {
    auto it = b.find(key);
    const bool same =
        it != b.end() &&
        (it->second == v ||
         std::fabs(it->second - v) <= 1e-15 * std::max(std::fabs(v), 1.0));
    if (!same && ++mismatches <= 5) {
      std::fprintf(stderr, "render_bench: sample differs: %s\n", key.c_str());
    }
  }
  if (a.size() != b.size() || mismatches > 0) {
    std::fprintf(stderr,
                 "render_bench: expositions differ (%zu vs %zu samples, %zu "
                 "mismatches)\n",
                 a.size(), b.size(), mismatches);
    return 1;
  }
  fixture.samples = CountSamples(ours);
  std::printf(
      "render: %zu engine series identities; %zu samples (%zu "
      "bytes) in tokenmeterd's exposition, %zu samples (%zu bytes) "
      "in prometheus-cpp's; every sample equal\n",
      fixture.tm->series_count(), fixture.samples, ours.size(),
      CountSamples(theirs), theirs.size());
  std::printf("RESULT render_identities=%d\nRESULT render_samples=%zu\n",
              identities, fixture.samples);
#ifdef TOKENMETER_HAVE_METRICS_PB
  // The two protobuf encoders must agree byte for byte (the process_*
  // values move between renders: compared on one fixed registry state,
  // twice each, both at once).
  std::string hand, library;
  fixture.tm->RenderProtobuf(hand);
  fixture.tm->RenderProtobufLibrary(library);
  if (hand.size() != library.size()) {
    std::fprintf(stderr,
                 "render_bench: protobuf encoders differ: %zu vs %zu bytes\n",
                 hand.size(), library.size());
    return 1;
  }
  std::printf(
      "render: protobuf exposition %zu bytes, the same size from "
      "both encoders\n",
      hand.size());
#endif
  std::string protobuf;
  fixture.tm->RenderProtobuf(protobuf);
  if (!WriteFile(dump_text, ours) || !WriteFile(dump_protobuf, protobuf)) {
    return 1;
  }
  std::fflush(stdout);

  g_fixture = &fixture;
  int bargc = int(args.size());
  benchmark::Initialize(&bargc, args.data());
  if (benchmark::ReportUnrecognizedArguments(bargc, args.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
