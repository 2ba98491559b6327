// The series store: engine series by canonical identity, created at HELLO
// and never removed while the daemon runs (counters must not reset), at
// most RegistryOptions::max_engine_series of them; plus the table of which
// Collector owns each daemon family. The registry holds no values of its
// own but the series; exposition.h renders it, components observe into the
// series they resolved once (an ingest connection at HELLO).
//
// Single-threaded: everything runs on the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_REGISTRY_H_
#define TOKENMETER_DAEMON_STORE_REGISTRY_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/base/clock.h"
#include "daemon/base/status.h"
#include "daemon/store/catalog.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/histogram.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/registry_options.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {

class Registration;

class Registry {
 public:
  // Checks the options (known histogram names, increasing finite bounds,
  // also once converted to a profile's unit, the native schema's range)
  // and makes each profile's bucket layouts.
  static Status Create(const RegistryOptions& options,
                       std::unique_ptr<Registry>* out);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // The series of `id` (labels in any order: the identity is canonical),
  // created on first use with its labels shown in `id`'s order; nullptr
  // when the cap is reached (counted in series_rejected()) or when `id`'s
  // namespace holds series of another profile (NamespaceConflict()).
  // Stable pointer. O(log series).
  EngineSeries* GetOrCreate(const SeriesIdentity& id);
  // The wall clock that stamps each new series' start_unix_ns() and, once
  // set, the registry's start_unix_ns() (without one: 0). Set once, before
  // series are made; `clock` outlives the registry.
  void SetClock(const Clock* clock);
  // When this registry's state began, Unix ns: SetClock()'s time, or the
  // loaded snapshot's (format 6): the start of every daemon family's
  // cumulative values, kept across restarts.
  uint64_t start_unix_ns() const { return start_unix_ns_; }
  // SetClock()'s time, whatever a snapshot held: this process's start, for
  // the families that count from it (CountsFromProcessStart()).
  uint64_t process_start_unix_ns() const { return process_start_unix_ns_; }
  // True when a series of `id`'s namespace has a profile other than id's:
  // two profiles may name families alike, and one namespace shows one.
  bool NamespaceConflict(const SeriesIdentity& id) const;
  // Takes the places of a new MoE layer of `experts` experts: one of
  // --max-moe-layers and, with --moe-expert-series, `experts` of the series
  // cap; false (nothing taken, counted in series_rejected()) when either is
  // full. Places are never given back (series live as long as the daemon).
  // O(1).
  bool ReserveMoeLayer(size_t experts);
  size_t moe_layers() const { return moe_layers_; }
  RequestLabels& request_labels() { return request_labels_; }
  const RequestLabels& request_labels() const { return request_labels_; }
  size_t series_count() const { return series_.size(); }
  uint64_t series_rejected() const { return series_rejected_; }
  const RegistryOptions& options() const { return options_; }
  // The histogram layouts of profile p: kNumHistograms, in catalog order.
  const std::vector<HistogramLayout>& layouts(Profile p) const {
    return layouts_[size_t(p)];
  }

  // Every series, in exposition order (namespace, model, instance, labels).
  template <typename F>
  void ForEachSeries(F&& f) {
    for (auto& [id, s] : series_) f(*s);
  }
  template <typename F>
  void ForEachSeries(F&& f) const {
    for (const auto& [id, s] : series_) f(static_cast<const EngineSeries&>(*s));
  }

  // Makes `c` the owner of daemon family `id` (a family without one is not
  // exposed). Registering an id twice is a broken invariant (abort);
  // Unregister(id, c) gives it up (a no-op unless c owns it).
  void Register(DaemonMetric id, const Collector* c);
  void Unregister(DaemonMetric id, const Collector* c);
  const Collector* collector(DaemonMetric id) const { return collectors_[id]; }

  // Snapshots (daemon/base/state_io.h): the request labels, every series
  // (identity, label order, values) and the cap's counts. SaveState() gives
  // each series an index (in *index) that LoadState() resolves (in
  // *by_index), for other components' references to series. LoadState()
  // fills a registry with no series yet; a snapshot series the registry
  // cannot make (the cap is lower now, a namespace conflict) fails the
  // reader.
  void SaveState(
      StateWriter& w,
      std::unordered_map<const EngineSeries*, uint32_t>* index) const;
  void LoadState(StateReader& r, std::vector<EngineSeries*>* by_index);

 private:
  using Layouts = std::array<std::vector<HistogramLayout>, kNumProfiles>;
  Registry(const RegistryOptions& options, Layouts layouts);

  const RegistryOptions options_;
  const Layouts layouts_;  // per profile: kNumHistograms
  RequestLabels request_labels_;
  std::map<SeriesIdentity, std::unique_ptr<EngineSeries>> series_;
  std::map<std::string, Profile, std::less<>> ns_profiles_;
  uint64_t series_rejected_ = 0;
  const Clock* clock_ = nullptr;  // SetClock()
  uint64_t start_unix_ns_ = 0;
  uint64_t process_start_unix_ns_ = 0;
  size_t expert_series_ = 0;  // series cap places ReserveMoeLayer() took
  size_t moe_layers_ = 0;     // layers ReserveMoeLayer() let in
  std::array<const Collector*, kNumDaemonMetrics> collectors_{};
  std::unique_ptr<Registration> request_labels_registration_;
};

// Makes a collector the owner of some daemon families for as long as this
// object lives: a collector holds one as a member, constructed with
// `this`, so that it can never be rendered after it is gone.
class Registration {
 public:
  Registration(Registry& registry, const Collector* c,
               std::span<const DaemonMetric> ids)
      : registry_(registry), collector_(c), ids_(ids) {
    for (DaemonMetric id : ids_) registry_.Register(id, collector_);
  }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() {
    for (DaemonMetric id : ids_) registry_.Unregister(id, collector_);
  }

 private:
  Registry& registry_;
  const Collector* const collector_;
  const std::span<const DaemonMetric> ids_;  // static storage
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_REGISTRY_H_
