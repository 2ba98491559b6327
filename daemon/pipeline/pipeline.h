// The ingest pipeline as one object: the registry (the series store), the
// ingest counters, the request tracker and the ingest server, built in
// dependency order and saved and loaded as one (the core of a state
// snapshot). The daemon, the tests, the fuzzer and the benchmarks build
// this one object instead of assembling the four.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_PIPELINE_PIPELINE_H_
#define TOKENMETER_DAEMON_PIPELINE_PIPELINE_H_

#include <uv.h>

#include <memory>

#include "daemon/base/clock.h"
#include "daemon/base/state_io.h"
#include "daemon/base/status.h"
#include "daemon/ingest/ingest_options.h"
#include "daemon/ingest/ingest_server.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/tracker.h"
#include "daemon/ingest/tracker_options.h"
#include "daemon/state/snapshot.h"
#include "daemon/store/registry.h"
#include "daemon/store/registry_options.h"

namespace tokenmeter::daemon {

struct PipelineOptions {
  RegistryOptions registry;
  TrackerOptions tracker;
  IngestOptions ingest;
};

class Pipeline {
 public:
  // Checks the options (Registry::Create()) and builds the four. `loop`:
  // the loop the ingest server listens on and closes on (it may be null
  // for a pipeline that never listens: fed through tracker() or frames);
  // `clock` outlives the pipeline.
  static Status Create(uv_loop_t* loop, const Clock& clock,
                       const PipelineOptions& options,
                       std::unique_ptr<Pipeline>* out);
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  // The ingest server's Close() must have completed if it listened.
  ~Pipeline();

  Registry& registry() { return *registry_; }
  const Registry& registry() const { return *registry_; }
  IngestStats& stats() { return *stats_; }
  const IngestStats& stats() const { return *stats_; }
  Tracker& tracker() { return *tracker_; }
  const Tracker& tracker() const { return *tracker_; }
  IngestServer& server() { return *server_; }
  const PipelineOptions& options() const { return options_; }

  // Snapshots (daemon/base/state_io.h), in this order: the registry (and
  // what it holds), the tracker (its requests naming series by the
  // registry's index), the ingest stats, the ingest server. LoadState()
  // fills a pipeline that holds nothing yet (made by Create(), no
  // connection); the reader says whether it went well, and a pipeline
  // whose load failed halfway is to be thrown away. O(series + requests).
  void SaveState(StateWriter& w);
  void LoadState(StateReader& r);

  // What of the configuration a snapshot of this pipeline depends on: the
  // histogram layouts of every profile (and the catalog's size), the
  // naming (--profile, --namespace) and the request labels (names,
  // --request-label-values).
  SnapshotFingerprint Fingerprint() const;

 private:
  explicit Pipeline(const PipelineOptions& options);

  const PipelineOptions options_;
  // Dependency order: destroyed in reverse, each collector unregistering
  // before the registry goes.
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<IngestStats> stats_;
  std::unique_ptr<Tracker> tracker_;
  std::unique_ptr<IngestServer> server_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_PIPELINE_PIPELINE_H_
