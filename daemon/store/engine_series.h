// One engine series: every metric of one identity (namespace, profile,
// model_name, engine instance, HELLO labels), stored by catalog id so that a
// metric is declared once (catalog.cpp) and then only observed: the
// exposition (through the series' profile table) and the summary line read
// it back by id. Request-level metrics of requests with per-request labels
// go to one cell of values per label combination.
//
// Single-threaded: everything runs on the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_ENGINE_SERIES_H_
#define TOKENMETER_DAEMON_STORE_ENGINE_SERIES_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/histogram.h"
#include "daemon/store/part.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {

// Histograms are contiguous in the catalog, from kTimeToFirstToken to
// kLastHistogram (Registry::Create checks it).
inline constexpr EngineMetric kFirstHistogram = kTimeToFirstToken;
inline constexpr int kNumHistograms = kLastHistogram - kTimeToFirstToken + 1;

using LabelPairs = std::vector<std::pair<std::string, std::string>>;

// The identity of an engine series. Canonical: labels sorted by name, so
// that two HELLOs whose labels differ only in order name one series.
struct SeriesIdentity {
  std::string ns;        // metric namespace (profile.h ProfileNamespace())
  std::string model;     // model_name
  std::string instance;  // engine
  LabelPairs labels;     // sorted by name (Canonical())
  // Last: one namespace holds one profile (Registry::NamespaceConflict()),
  // so it never orders series of a namespace.
  Profile profile = Profile::kVllm;

  auto operator<=>(const SeriesIdentity&) const = default;
  // This identity with its labels sorted by name.
  SeriesIdentity Canonical() const;
};

// The metric namespace for a HELLO engine name: every character outside
// [a-zA-Z0-9_] becomes '_'.
std::string SanitizeNamespace(std::string_view engine);

// A gauge set from STEP data when the engine sends it, else derived from
// request states (+1/-1 as requests move). kv_cache_usage_perc is only set.
struct GaugeCell {
  double set_value = 0;
  int64_t derived = 0;
  bool has_set = false;
  double value() const {
    return has_set ? set_value : double(std::max<int64_t>(0, derived));
  }
};

// The values of one label set: every metric of the catalog, by id.
class SeriesValues {
 public:
  // layouts: kNumHistograms entries, in catalog order, outliving this.
  explicit SeriesValues(const std::vector<HistogramLayout>& layouts);
  SeriesValues(const SeriesValues&) = delete;
  SeriesValues& operator=(const SeriesValues&) = delete;

  // Scalar counters. Saturating: a counter stops at 2^64 - 1 instead of
  // wrapping to a small value (which Prometheus would read as a reset).
  void Add(EngineMetric m, uint64_t n) { SaturatingAdd(counts_[m], n); }
  uint64_t count(EngineMetric m) const { return counts_[m]; }

  // Counters with an own label: child `i` is FixedLabelValues(m)[i], or
  // position i for an index label (children grow to fit).
  void AddChild(EngineMetric m, size_t i, uint64_t n) {
    std::vector<uint64_t>& c = children_[m];
    if (c.size() <= i) c.resize(i + 1, 0);
    SaturatingAdd(c[i], n);
  }
  const std::vector<uint64_t>& children(EngineMetric m) const {
    return children_[m];
  }

  // Gauges.
  void Set(EngineMetric m, double v) {
    gauges_[m].set_value = v;
    gauges_[m].has_set = true;
  }
  void AddDerived(EngineMetric m, int64_t delta) {
    gauges_[m].derived += delta;
  }
  const GaugeCell& gauge(EngineMetric m) const { return gauges_[m]; }

  Histogram& hist(EngineMetric m) { return hists_[m - kFirstHistogram]; }
  const Histogram& hist(EngineMetric m) const {
    return hists_[m - kFirstHistogram];
  }

  // Snapshots (daemon/base/state_io.h): every value above.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  static void SaturatingAdd(uint64_t& acc, uint64_t n) {
    if (__builtin_add_overflow(acc, n, &acc)) acc = UINT64_MAX;
  }

  std::array<uint64_t, kNumEngineMetrics> counts_{};
  std::array<GaugeCell, kNumEngineMetrics> gauges_{};
  std::array<std::vector<uint64_t>, kNumEngineMetrics> children_;
  std::vector<Histogram> hists_;
};

// The per-request label values of one observation, packed: 16 bits per
// --request-label, in flag order (RequestLabels value ids). 0: every label
// empty, also when no request label is configured.
using LabelKey = uint64_t;

class RequestLabels;

// A series' labels in a snapshot (daemon/base/state_io.h): a count and the
// (name, value) pairs; LoadLabelPairs() takes at most 64 pairs of at most
// kMaxLabelStateBytes each.
inline constexpr size_t kMaxLabelStateBytes = 4096;
void SaveLabelPairs(StateWriter& w, const LabelPairs& pairs);
LabelPairs LoadLabelPairs(StateReader& r);

// One series' values for one request-label key, with its sample labels.
struct LabelCell {
  LabelKey key = 0;
  std::unique_ptr<SeriesValues> values;
  std::string label_text;  // the series' labels, then the request labels
  LabelPairs label_pairs;
};

class EngineSeries : public SeriesValues {
 public:
  // `identity` canonical; `label_order` the same labels in the order the
  // exposition shows them (the first HELLO's). layouts: kNumHistograms
  // entries, in catalog order, outliving the series. `request_labels` (not
  // null, outliving the series) names the per-request labels.
  EngineSeries(SeriesIdentity identity, const LabelPairs& label_order,
               const std::vector<HistogramLayout>& layouts,
               RequestLabels& request_labels);
  EngineSeries(const EngineSeries&) = delete;
  EngineSeries& operator=(const EngineSeries&) = delete;

  const SeriesIdentity& identity() const { return identity_; }
  // The HELLO "engine" of the last connection that joined this series
  // (identity().ns is derived from it, or is --namespace's); empty until
  // one did since the daemon started (not in state snapshots). O(length).
  const std::string& hello_engine() const { return hello_engine_; }
  void set_hello_engine(std::string_view engine) {
    if (hello_engine_ != engine) hello_engine_.assign(engine);
  }
  Profile profile() const { return identity_.profile; }
  // Whether this series' profile reads metric m (ProfileUses()).
  bool uses(EngineMetric m) const { return uses_[m]; }
  // model_name="..",engine="..",k="v" (escaped, text formats).
  const std::string& label_text() const { return label_text_; }
  // (name, value) pairs in label_text() order, model_name and engine first.
  const LabelPairs& label_pairs() const { return label_pairs_; }

  // The values request-level metrics of a request with label key `key` are
  // observed into: this series' own for key 0 (every label empty), else a
  // cell created on first use. A value the series has not admitted and
  // cannot admit (--request-label-values reached) becomes __other__ in the
  // cell (the request was counted where it arrived). O(1) for key 0, a
  // hash lookup otherwise.
  SeriesValues& Cell(LabelKey key) {
    if (key == 0) return *this;
    return CellSlow(key);
  }
  // The values of the request-label set `set` (RequestLabels::InternSet()
  // id, its key and adapter): the same as Cell(labels.SetKey(set)), the
  // first kDirectSets ids found by index after their first use.
  static constexpr uint32_t kDirectSets = 256;
  SeriesValues& CellForSet(uint32_t set) {
    if (set < set_cells_.size() && set_cells_[set] != nullptr) {
      return *set_cells_[set];
    }
    return CellForSetSlow(set);
  }

  // With request labels on, the series' own values (every label empty) are
  // shown for request-level families only once a request without labels
  // used them (UseOwnCell()): a series whose every request is labelled
  // shows no empty-label copy at zero.
  void UseOwnCell() { own_cell_used_ = true; }
  bool own_cell_shown() const { return own_cell_used_ || request_labels_off_; }
  // The labels of this series' own values when request labels are on (the
  // empty value for each), else label_text().
  const std::string& base_label_text() const { return base_label_text_; }
  const LabelPairs& base_label_pairs() const { return base_label_pairs_; }
  // The cells other than key 0, in creation order.
  const std::vector<LabelCell>& cells() const { return cells_; }

  // Admits the value `id` of request label `label` into this series (the
  // place it keeps for the first --request-label-values values); false when
  // there is no place left. Ids 0 (empty) and 1 (__other__) always pass,
  // as does every value of a label not capped (RequestLabels::capped()).
  bool Admit(size_t label, uint16_t id);
  // Whether a value of request label `label` not yet admitted would be.
  bool HasRoom(size_t label) const;

  // This series' part of type P (store/parts/), made on first use: a
  // series pays one pointer per kind for parts it never uses. P has
  // kKind and a constructor taking the series. find_part(): the part if
  // made, else nullptr. O(1).
  template <typename P>
  P& part() {
    Part* p = parts_.get(P::kKind);
    if (p == nullptr) {
      auto made = std::make_unique<P>(*this);
      p = made.get();
      parts_.Put(std::move(made));
    }
    return static_cast<P&>(*p);
  }
  template <typename P>
  P* find_part() {
    return static_cast<P*>(parts_.get(P::kKind));
  }
  template <typename P>
  const P* find_part() const {
    return static_cast<const P*>(parts_.get(P::kKind));
  }
  const PartSet& parts() const { return parts_; }
  PartSet& parts() { return parts_; }

  // What parts read of the series: the request labels' tables (adapter
  // names) and the histogram layouts of its profile.
  RequestLabels& request_labels() const { return request_labels_; }
  const std::vector<HistogramLayout>& layouts() const { return layouts_; }

  // When the series began counting, Unix ns (0: unknown): its creation,
  // kept across restarts by the snapshot (format 6), so that a cumulative
  // value pushed over OTLP keeps its start time (no reset at the backend).
  uint64_t start_unix_ns() const { return start_unix_ns_; }
  void set_start_unix_ns(uint64_t t) { start_unix_ns_ = t; }

  // Snapshots: the label order (identity() is saved by the registry), the
  // series' values, its label cells, admitted values, its parts and (format
  // 6) its start time.
  // LoadState() fills a series just made from the same identity and label
  // order (format 3 and later; formats 1 and 2 kept cache_config, max_lora, the
  // MoE layers and the LoRA sets in fields of the series, read into parts).
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  SeriesValues& CellSlow(LabelKey key);
  SeriesValues& CellForSetSlow(uint32_t set);
  LabelCell MakeCell(LabelKey key);

  const SeriesIdentity identity_;
  std::string hello_engine_;
  uint64_t start_unix_ns_ = 0;
  RequestLabels& request_labels_;
  const std::vector<HistogramLayout>& layouts_;
  std::array<bool, kNumEngineMetrics> uses_{};
  LabelPairs label_pairs_;
  std::string label_text_;
  std::string base_label_text_;
  LabelPairs base_label_pairs_;
  std::vector<LabelCell> cells_;
  std::unordered_map<LabelKey, size_t> cell_index_;  // key -> cells_ index
  std::vector<SeriesValues*> set_cells_;  // [set id < kDirectSets] or null
  // Per request label: the value ids admitted, at most the cap.
  std::vector<std::vector<uint16_t>> admitted_;
  const bool request_labels_off_;
  bool own_cell_used_ = false;
  PartSet parts_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_ENGINE_SERIES_H_
