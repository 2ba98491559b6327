#include "daemon/pipeline/pipeline.h"

#include <unordered_map>
#include <vector>

#include "spdlog/fmt/fmt.h"

namespace tokenmeter::daemon {

Pipeline::Pipeline(const PipelineOptions& options) : options_(options) {}

Pipeline::~Pipeline() = default;

Status Pipeline::Create(uv_loop_t* loop, const Clock& clock,
                        const PipelineOptions& options,
                        std::unique_ptr<Pipeline>* out) {
  std::unique_ptr<Pipeline> p(new Pipeline(options));
  Status s = Registry::Create(options.registry, &p->registry_);
  if (!s.ok()) return s;
  p->registry_->SetClock(&clock);
  p->stats_ = std::make_unique<IngestStats>(*p->registry_);
  p->tracker_ = std::make_unique<Tracker>(*p->registry_, *p->stats_, clock,
                                          options.tracker);
  p->server_ = std::make_unique<IngestServer>(loop, *p->registry_, *p->tracker_,
                                              *p->stats_, options.ingest);
  *out = std::move(p);
  return Status::Ok();
}

void Pipeline::SaveState(StateWriter& w) {
  std::unordered_map<const EngineSeries*, uint32_t> index;
  registry_->SaveState(w, &index);
  tracker_->SaveState(w, index);
  stats_->SaveState(w);
  server_->SaveState(w);
}

void Pipeline::LoadState(StateReader& r) {
  std::vector<EngineSeries*> by_index;
  registry_->LoadState(r, &by_index);
  tracker_->LoadState(r, by_index);
  stats_->LoadState(r);
  server_->LoadState(r);
}

SnapshotFingerprint Pipeline::Fingerprint() const {
  SnapshotFingerprint fp;
  // The layouts of the first `histograms` histograms of each profile.
  const auto buckets = [this](size_t metrics, size_t histograms) {
    std::string out =
        fmt::format("metrics {} histograms {}", metrics, histograms);
    for (int p = 0; p < kNumProfiles; ++p) {
      const std::vector<HistogramLayout>& layouts =
          registry_->layouts(Profile(p));
      for (size_t i = 0; i < histograms && i < layouts.size(); ++i) {
        const HistogramLayout& l = layouts[i];
        out += fmt::format(";{}:", l.divisor());
        for (double b : l.bounds()) out += fmt::format("{},", b);
      }
    }
    return out;
  };
  fp.parts[0] = buckets(kNumEngineMetrics, kNumHistograms);
  // Formats 1 to 4 hold the 1.1 catalog, whose histograms come first.
  fp.legacy_buckets = buckets(kFormat4Metrics, kFormat4Histograms);
  const IngestOptions& ingest = options_.ingest;
  fp.parts[1] = fmt::format(
      "profile {} namespace {}",
      ingest.profile ? std::string(ProfileName(*ingest.profile)) : "auto",
      ingest.namespace_override);
  std::string& labels = fp.parts[2];
  labels = fmt::format("values {}", options_.registry.request_label_values);
  for (const std::string& n : RequestLabelNames(options_.registry)) {
    labels += ";" + n;
  }
  return fp;
}

}  // namespace tokenmeter::daemon
