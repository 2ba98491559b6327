// The metrics encoder's side of otlp_metrics_otel_test.py: builds two
// registries with known data (the exposition tests' PopulatedRegistry and
// ProfilesRegistry, plus histogram observations on native bucket
// boundaries, in the zero bucket and spread over many octaves) and writes,
// for each registry NAME (populated, profiles), into OUT_DIR:
//
//   NAME.txt            /metrics in text 0.0.4
//   NAME.prom.pb        /metrics in the Prometheus protobuf format
//                       (length-delimited MetricFamily messages)
//   NAME.exp.pb         the OTLP ExportMetricsServiceRequest, exponential
//   NAME.exp.json       histograms, protobuf and OTLP/JSON
//   NAME.explicit.pb    the same with explicit-bucket histograms
//   NAME.explicit.json
//
// all rendered from the same registry at the same moment. The OTLP points
// carry time_unix_nano kTime and start_time_unix_nano kStart, except the
// series with the label engine="1", whose start is kStart + 1 (the
// per-series hook). Resource: service.name "tokenmeterd",
// service.instance.id "test:9400"; scope "tokenmeterd" "test".
//
// Usage: encode_metrics_tool OUT_DIR
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "daemon/exposition/exposition.h"
#include "daemon/exposition/proto_writer.h"
#include "daemon/otlp_metrics/otlp_metrics_encoder.h"
#include "daemon/store/catalog.h"
#include "tests/daemon/exposition/exposition_fixture.h"

namespace td = tokenmeter::daemon;
namespace om = tokenmeter::daemon::otlp_metrics;

namespace {

constexpr uint64_t kTime = 1'750'000'000'000'000'123ULL;
constexpr uint64_t kStart = 1'749'999'000'000'000'000ULL;

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  return bool(f);
}

// Observations that exercise the native buckets: exact powers of two
// (bucket boundaries at every schema >= 0), zeros, and a deterministic
// log-uniform spread over ~12 octaves.
void Spread(td::EngineSeries& s) {
  td::Histogram& ttft = s.hist(td::kTimeToFirstToken);  // ns -> s
  for (int e = -6; e <= 3; ++e) ttft.Observe(std::ldexp(1.0, e) * 1e9);
  ttft.Observe(0);
  ttft.Observe(0);
  uint64_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = double(x >> 11) * 0x1p-53;  // [0, 1)
    ttft.Observe(std::exp2(-8 + 12 * u) * 1e9);
  }
  td::Histogram& prompt = s.hist(td::kRequestPromptTokens);
  for (double t : {0.0, 1.0, 2.0, 3.0, 4.0, 1024.0, 1025.0, 70000.0}) {
    prompt.Observe(t);
  }
}

bool WriteAll(const std::string& dir, const std::string& name,
              const td::Registry& reg) {
  bool ok = true;
  std::string text;
  td::Render(reg, td::ExpositionFormat::kText004, text);
  ok &= Write(dir + "/" + name + ".txt", text);
  std::string prom;
  td::ProtoWriter pw(prom);
  td::Render(reg, pw);
  ok &= Write(dir + "/" + name + ".prom.pb", prom);
  for (const om::HistogramForm form :
       {om::HistogramForm::kExponential, om::HistogramForm::kExplicit}) {
    for (const om::OtlpEncoding encoding :
         {om::OtlpEncoding::kProtobuf, om::OtlpEncoding::kJson}) {
      om::OtlpMetricsOptions o;
      o.encoding = encoding;
      o.histograms = form;
      o.time_unix_nano = kTime;
      o.start_time_unix_nano = kStart;
      o.start_time = [](std::string_view, const td::SampleLabels& l) {
        for (const auto& [k, v] : l.pairs) {
          if (k == "engine" && v == "1") return kStart + 1;
        }
        return uint64_t(0);
      };
      o.resource_attributes = {{"service.name", "tokenmeterd"},
                               {"service.instance.id", "test:9400"}};
      o.scope_version = "test";
      om::OtlpMetricsEncoder enc(o);
      td::Render(reg, enc);
      const std::string path =
          dir + "/" + name +
          (form == om::HistogramForm::kExponential ? ".exp" : ".explicit") +
          (encoding == om::OtlpEncoding::kProtobuf ? ".pb" : ".json");
      ok &= Write(path, enc.body());
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  namespace et = td::exposition_test;
  const et::Exposed populated = et::PopulatedRegistry();
  Spread(
      *populated->GetOrCreate({"vllm", "llama-3-8b", "0", {{"tier", "gold"}}}));
  const et::Exposed profiles = et::ProfilesRegistry();
  if (!WriteAll(dir, "populated", *populated) ||
      !WriteAll(dir, "profiles", *profiles)) {
    std::fprintf(stderr, "%s: cannot write into %s\n", argv[0], dir.c_str());
    return 1;
  }
  return 0;
}
