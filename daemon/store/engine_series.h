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
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/histogram.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {

// Histograms are contiguous in the catalog, from kTimeToFirstToken to
// kMoeImbalance (Registry::Create checks it).
inline constexpr EngineMetric kFirstHistogram = kTimeToFirstToken;
inline constexpr int kNumHistograms = kMoeImbalance - kTimeToFirstToken + 1;

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

  // Snapshots (daemon/state/state_io.h): every value above.
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
  Profile profile() const { return identity_.profile; }
  // Whether this series' profile reads metric m (ProfileUses()).
  bool uses(EngineMetric m) const { return uses_[m]; }
  // Observes n into LMDeploy's per-chunk iteration tokens; the bucket of
  // the previous n is remembered (nearly every chunk has one token).
  void ObserveChunkTokens(uint64_t n) {
    Histogram& h = hist(kIterationTokensChunk);
    if (n != chunk_tokens_n_) {
      chunk_tokens_n_ = n;
      chunk_tokens_bucket_ = h.layout().BucketFor(double(n));
    }
    h.ObserveIn(chunk_tokens_bucket_, double(n));
  }
  // Whether LMDeploy's per-chunk TPOT and the ITL have the same bounds (a
  // chunk of one token then falls in the ITL's bucket).
  bool tpot_chunk_shares_itl_buckets() const { return tpot_shares_itl_; }
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
  // there is no place left. Ids 0 (empty) and 1 (__other__) always pass.
  bool Admit(size_t label, uint16_t id);
  // Whether a value of request label `label` not yet admitted would be.
  bool HasRoom(size_t label) const;

  // The HELLO cache_config of the latest HELLO that sent one (entries in
  // HELLO order: key, rendered value, number or NaN).
  struct CacheConfigEntry {
    std::string key;
    std::string value;
    double number;
  };
  void SetCacheConfig(std::vector<CacheConfigEntry> entries);
  bool has_cache_config() const { return has_cache_config_; }
  const std::vector<CacheConfigEntry>& cache_config() const {
    return cache_config_;
  }
  // The cache_config_info sample labels (series labels, then the entries).
  const std::string& cache_config_text() const { return cache_config_text_; }
  const LabelPairs& cache_config_pairs() const { return cache_config_pairs_; }

  // MoE expert load (EXPERT_LOAD). Per layer: the tokens routed to each
  // expert (the expert count fixed by the layer's first event), their sum,
  // and max / mean of the latest event with a non-zero sum.
  struct MoeLayer {
    std::vector<uint64_t> experts;
    uint64_t routed = 0;
    double imbalance = 0;
    bool has_imbalance = false;
  };
  // Adds one EXPERT_LOAD; false (nothing changed) when `n` differs from the
  // layer's expert count. O(n).
  bool AddExpertLoad(uint32_t layer, const uint64_t* counts, size_t n);
  bool has_moe() const { return !moe_.empty(); }
  bool has_moe_layer(uint32_t layer) const { return moe_.count(layer) != 0; }
  const std::map<uint32_t, MoeLayer>& moe() const { return moe_; }

  // The max_lora label (the latest HELLO's; "0" when none sent one).
  void SetMaxLora(int64_t max_lora);
  const std::string& max_lora() const { return max_lora_; }
  // LoRA adapters of requests waiting / running on this series, by adapter
  // id (RequestLabels::LoraName()); `unix_s` is the wall time of the call,
  // kept as the time of the last change when a set changes.
  void AddLora(uint16_t lora, bool running, int delta, double unix_s);
  // Adapter names of the running (or waiting) set, sorted, joined by ",".
  std::string LoraSet(bool running) const;
  double lora_changed_unix_s() const { return lora_changed_unix_s_; }
  // Sets the time of the last change if none is set yet (the series' first
  // HELLO: the sets start empty then).
  void InitLoraTime(double unix_s) {
    if (lora_changed_unix_s_ == 0) lora_changed_unix_s_ = unix_s;
  }

  // Snapshots: the label order (identity() is saved by the registry), the
  // series' values, its label cells, admitted values, cache_config,
  // max_lora, MoE layers and LoRA sets. LoadState() fills a series just
  // made from the same identity and label order.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  SeriesValues& CellSlow(LabelKey key);
  SeriesValues& CellForSetSlow(uint32_t set);
  LabelCell MakeCell(LabelKey key);

  const SeriesIdentity identity_;
  RequestLabels& request_labels_;
  const std::vector<HistogramLayout>& layouts_;
  std::array<bool, kNumEngineMetrics> uses_{};
  bool tpot_shares_itl_ = false;
  uint64_t chunk_tokens_n_ = UINT64_MAX;  // ObserveChunkTokens()'s memo
  size_t chunk_tokens_bucket_ = 0;
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
  bool has_cache_config_ = false;
  std::vector<CacheConfigEntry> cache_config_;
  std::string cache_config_text_;
  LabelPairs cache_config_pairs_;
  std::string max_lora_ = "0";
  std::map<uint32_t, MoeLayer> moe_;  // by layer
  // adapter id -> (waiting, running) request counts, for adapters in use.
  std::map<uint16_t, std::array<int64_t, 2>> lora_;
  double lora_changed_unix_s_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_ENGINE_SERIES_H_
