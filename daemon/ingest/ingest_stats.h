// The ingest pipeline's own counters (tokenmeter_ingest_*, and the clients'
// reported drops): written by the ingest server (connections, frames,
// frame errors, drops) and the tracker (events applied, event errors), and
// exposed through the registry, for which this is the Collector.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_INGEST_INGEST_STATS_H_
#define TOKENMETER_DAEMON_INGEST_INGEST_STATS_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "daemon/ingest/event.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

class IngestStats : public Collector {
 public:
  // Clients remembered per (engine family, model, instance) identity for
  // tokenmeter_client_dropped_events_total; past it the least recently
  // reporting one is folded into the identity's retired total (so the
  // counter never goes down).
  static constexpr size_t kMaxClientsPerIdentity = 256;

  // Registers itself with `registry` for the tokenmeter_ingest_* and
  // client-drop families (until destroyed). At most as many drop
  // identities as the registry's series cap (--max-engine-series) are kept;
  // reports for further ones are ignored.
  explicit IngestStats(Registry& registry);
  IngestStats(const IngestStats&) = delete;
  IngestStats& operator=(const IngestStats&) = delete;
  ~IngestStats() override;

  void SetConnections(int64_t n) { connections_ = n; }
  void CountFrame() { ++frames_; }
  void CountEvent(EventKind kind) { ++events_[size_t(kind) - 1]; }
  void CountError(IngestError e) { ++errors_[size_t(e)]; }
  void CountErrors(IngestError e, uint64_t n) { errors_[size_t(e)] += n; }
  // A replayed BATCH skipped because its session had applied it.
  void CountDuplicateBatch() { ++duplicate_batches_; }
  // The drop totals of one (engine family, model, instance) identity.
  struct Drops;
  // The identity's entry, made if new: resolved once per connection (its
  // first BATCH), so that a BATCH copies no string. nullptr when
  // max_identities are known (reports for it are ignored). Stable for the
  // life of the stats. O(log identities).
  Drops* DropsFor(const std::string& family, const std::string& model,
                  const std::string& instance);
  // The latest dropped_total a client of `identity` (null: ignored)
  // reported. `client` tells clients of one identity apart (their pid,
  // else a connection id). O(log clients), at most
  // kMaxClientsPerIdentity.
  void SetClientDropped(Drops* identity, int64_t client,
                        uint64_t dropped_total);
  // Both at once (tests, benches).
  void SetClientDropped(const std::string& family, const std::string& model,
                        const std::string& instance, int64_t client,
                        uint64_t dropped_total) {
    SetClientDropped(DropsFor(family, model, instance), client, dropped_total);
  }

  int64_t connections() const { return connections_; }
  uint64_t frames() const { return frames_; }
  uint64_t events(EventKind kind) const { return events_[size_t(kind) - 1]; }
  uint64_t events_total() const;
  uint64_t errors(IngestError e) const { return errors_[size_t(e)]; }
  uint64_t duplicate_batches() const { return duplicate_batches_; }
  size_t drop_identities() const { return dropped_.size(); }

  void Collect(DaemonMetric id, MetricWriter& w) const override;

  // Snapshots (daemon/base/state_io.h): every counter and the clients'
  // drop totals (the connection gauge is not state). LoadState() fills
  // fresh stats.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 public:
  struct Drops {
    struct Client {
      uint64_t dropped_total = 0;
      uint64_t updated = 0;  // report sequence number, for the fold
    };
    std::map<int64_t, Client> clients;
    uint64_t retired = 0;  // folded clients' last totals
  };

 private:
  const size_t max_identities_;
  int64_t connections_ = 0;
  uint64_t frames_ = 0;
  uint64_t duplicate_batches_ = 0;
  std::array<uint64_t, kNumEventKinds> events_{};
  std::array<uint64_t, size_t(IngestError::kCount)> errors_{};
  std::map<std::tuple<std::string, std::string, std::string>, Drops> dropped_;
  uint64_t reports_ = 0;
  Registration registration_;  // last: unregisters first
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_INGEST_STATS_H_
