#include "daemon/snapshot_bound.h"

#include <algorithm>
#include <string_view>

#include "daemon/ingest/ingest_stats.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/native_histogram.h"
#include "daemon/store/parts/reason_counts.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {
namespace {

// The encoders' sizes (daemon/base/state_io.h): a length-prefixed string, a
// count.
constexpr uint64_t kStr = 4;
constexpr uint64_t kCount = 8;
constexpr uint64_t kString = kStr + TM_MAX_STRING_BYTES;
// Tracker::Request's time points (tracker.cpp: static_assert(kNumPoints <=
// 6)).
constexpr uint64_t kRequestPoints = 6;

uint64_t Add(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t Mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

// Histogram::SaveState() with every native bucket in use.
uint64_t HistogramBytes(const HistogramLayout& layout) {
  const uint64_t classic = kCount + 8 * (layout.bounds().size() + 1) + 8 + 8;
  const uint64_t native =
      1 + 8 + 2 * kCount + NativeHistogram::kMaxBuckets * (4 + 8);
  return classic + native;
}

// ReasonCounts::SaveState() (store/parts/reason_counts.h) at its most.
constexpr uint64_t kReasonCountsBytes =
    kCount + ReasonCounts::kMaxReasons * (kStr + TM_MAX_LABEL_VALUE_BYTES + 8) +
    8;

// SeriesValues::SaveState(): the largest of the profiles' layouts.
uint64_t CellBytes(const Config& config, const Registry& registry) {
  uint64_t bytes = 2 * kCount;  // the number of metrics and of histograms
  for (size_t m = 0; m < kNumEngineMetrics; ++m) {
    const EngineMetricDef& def = kEngineMetrics[m];
    bytes += 8 + (8 + 8 + 1) + kCount;  // count, gauge cell, children
    if (def.own_label == "position") {
      bytes += 8 * uint64_t{config.ingest.limits.max_spec_positions};
    } else {
      bytes += 8 * FixedLabelValues(EngineMetric(m)).size();
    }
  }
  uint64_t hists = 0;
  for (size_t p = 0; p < kNumProfiles; ++p) {
    uint64_t sum = 0;
    for (const HistogramLayout& l : registry.layouts(Profile(p))) {
      sum += HistogramBytes(l);
    }
    hists = std::max(hists, sum);
  }
  return bytes + hists;
}

}  // namespace

SnapshotBound MaxSnapshotBytes(const Config& config, const Registry& registry,
                               const SnapshotFingerprint& fp) {
  const RegistryOptions& ro = config.registry;
  const uint64_t labels = RequestLabelNames(ro).size();
  const uint64_t values = ro.request_label_values;
  // Cells other than the series' own: every combination of the values
  // each label admits, "" and __other__ (at most RequestLabels::kMaxSets);
  // the label not capped (RequestLabels::capped(): --priority-label's)
  // admits its buckets other than "0" (the empty value's id), whatever
  // the cap.
  constexpr uint64_t kPriorityValues = 4;
  uint64_t cells = 0;
  if (labels > 0) {
    uint64_t combinations = 1;
    for (uint64_t i = 0; i < labels; ++i) {
      const bool capped = registry.request_labels().capped(size_t(i));
      combinations =
          Mul(combinations,
              (capped ? values : std::max(values, kPriorityValues)) + 2);
    }
    cells = std::min<uint64_t>(combinations - 1, RequestLabels::kMaxSets);
  }
  const uint64_t cell = CellBytes(config, registry);
  const uint64_t namespace_bytes = std::max<uint64_t>(
      TM_MAX_STRING_BYTES, config.ingest.namespace_override.size());

  SnapshotBound b;
  // Registry::SaveState() and EngineSeries::SaveState().
  b.per_series = kStr + namespace_bytes + 2 * kString + 1;
  b.per_series += kCount + TM_MAX_HELLO_LABELS * 2 * kString;
  b.per_series = Add(b.per_series, cell);
  b.per_series = Add(b.per_series, Mul(cells, 8 + cell));     // the cells
  b.per_series = Add(b.per_series, kCount + Mul(cells, 16));  // their index
  b.per_series += labels * (kCount + 2 * values);             // admitted ids
  b.per_series += 1 + kCount;                                 // own cell, parts
  b.per_series += kNumPartKinds;
  // Parts: cache config, LoRA (max_lora and the allowance), MoE's count
  // (its layers are counted once, below).
  b.per_series += kCount + TM_MAX_CACHE_CONFIG * (2 * kString + 8);
  b.per_series += kStr + 64 + kCount + kLoraSetsAllowance * (2 + 16) + 8;
  b.per_series += kCount;
  // Protocol 1.2 parts: admission reasons, waiting by reason, KV transfers
  // (a time and a bytes histogram and the failures per role, with the
  // largest of the profiles' layouts), sleep.
  b.per_series += kReasonCountsBytes + 16;
  uint64_t kv_hists = 0;
  for (size_t p = 0; p < kNumProfiles; ++p) {
    const std::vector<HistogramLayout>& l = registry.layouts(Profile(p));
    kv_hists = std::max(
        kv_hists,
        HistogramBytes(l[size_t(kKvTransferTime - kFirstHistogram)]) +
            HistogramBytes(l[size_t(kKvTransferBytes - kFirstHistogram)]));
  }
  b.per_series = Add(b.per_series, 2 * (kv_hists + kReasonCountsBytes));
  b.per_series += 3 + 8;
  b.per_series += 8;  // the start time (format 6)
  // IngestStats: one identity's drop counts per series.
  b.per_series += 3 * kString + 8 + kCount +
                  IngestStats::kMaxClientsPerIdentity * (8 + 8 + 8);

  // Tracker::SaveState(), one request.
  b.per_request = 8 + 8 + kStr + TM_MAX_RID_BYTES + 1 + 3 * 4 +
                  kRequestPoints * 8 + 8 + 5 * 4 + 2 + 1 + 1 + 1 + 1 + 1;
  // Its protocol 1.2 extras (Tracker::Extra): a flag, four counts, the KV
  // time, three flags, the trace context at its longest, and (format 7)
  // whether its KV wait is open.
  b.per_request += 1 + 4 * 4 + 8 + 3 + kStr + TM_TRACEPARENT_BYTES + kStr +
                   TM_MAX_TRACESTATE_BYTES + 1;

  // Counted once: the header and fingerprint, the request-label tables,
  // the shared spaces and sessions, MoE, and a page for the daemon's own
  // counters (tracker, ingest, snapshotter and HTTP: a few hundred bytes).
  b.fixed = 8 + 4 + kStr + 256 + 4 + 8;  // ... and the registry's start
  for (const std::string& part : fp.parts) b.fixed += kStr + part.size();
  b.fixed += labels * (kCount + (RequestLabels::kMaxValues - 2) *
                                    (kStr + TM_MAX_REQUEST_LABEL_VALUE_BYTES));
  b.fixed += kCount + 8 * labels;  // overflow counts
  b.fixed += kCount + RequestLabels::kMaxLoras * (kStr + TM_MAX_LORA_BYTES);
  b.fixed += kCount + RequestLabels::kMaxSets * (8 + 2);
  const uint64_t spaces = config.ingest.max_shared_spaces != 0
                              ? config.ingest.max_shared_spaces
                              : 4 * ro.max_engine_series;
  b.fixed = Add(b.fixed, Mul(spaces, 3 * kString + 2 + 8));      // spaces
  b.fixed = Add(b.fixed, Mul(spaces, 2 * kString + 8 + 8 + 1));  // sessions
  b.fixed = Add(b.fixed, Mul(ro.max_moe_layers, kMoeLayerBytes));
  if (ro.moe_expert_series)
    b.fixed = Add(b.fixed, Mul(ro.max_engine_series, 8));
  b.fixed = Add(b.fixed, 16 + 4096);

  b.total = Add(b.fixed, Add(Mul(ro.max_engine_series, b.per_series),
                             Mul(config.tracker.max_requests, b.per_request)));
  return b;
}

}  // namespace tokenmeter::daemon
