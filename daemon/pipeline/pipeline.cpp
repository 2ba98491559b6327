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
  std::string& buckets = fp.parts[0];
  buckets = fmt::format("metrics {} histograms {}", int(kNumEngineMetrics),
                        kNumHistograms);
  for (int p = 0; p < kNumProfiles; ++p) {
    for (const HistogramLayout& l : registry_->layouts(Profile(p))) {
      buckets += fmt::format(";{}:", l.divisor());
      for (double b : l.bounds()) buckets += fmt::format("{},", b);
    }
  }
  const IngestOptions& ingest = options_.ingest;
  fp.parts[1] = fmt::format(
      "profile {} namespace {}",
      ingest.profile ? std::string(ProfileName(*ingest.profile)) : "auto",
      ingest.namespace_override);
  std::string& labels = fp.parts[2];
  labels = fmt::format("values {}", options_.registry.request_label_values);
  for (const std::string& n : options_.registry.request_labels) {
    labels += ";" + n;
  }
  return fp;
}

}  // namespace tokenmeter::daemon
