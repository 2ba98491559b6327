// The snapshotter (--state-dir): restores the newest snapshot at start,
// writes one every --snapshot-interval and a last one at stop, and exposes
// tokenmeter_state_snapshots_total and tokenmeter_state_restored. What a
// snapshot holds is its owner's business: the payload comes from an
// `encode` callback, and `on_written` says when a snapshot is on disk
// (the ingest server may then acknowledge what it holds).
//
// Each snapshot is encoded on the loop (the components' SaveState(),
// about 0.5 ms for 10,000 requests in flight, docs/performance.md) and
// checksummed and written on libuv's thread pool, one at a time: a tick
// that finds a write in flight is skipped. The final one is written on the
// loop, once no write is in flight.
//
// Single-threaded: the daemon's loop (the pool's work touches only its own
// bytes and the file system).
#ifndef TOKENMETER_DAEMON_STATE_SNAPSHOTTER_H_
#define TOKENMETER_DAEMON_STATE_SNAPSHOTTER_H_

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "daemon/base/state_io.h"
#include "daemon/base/status.h"
#include "daemon/state/snapshot.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

struct SnapshotterOptions {
  std::string dir;                       // --state-dir
  uint64_t interval_ns = 1'000'000'000;  // --snapshot-interval
  std::string boot_id_file;              // --boot-id-file
  bool dir_unsafe_ok = false;            // --state-dir-unsafe-ok
  // The largest snapshot Restore() reads (daemon/snapshot_bound.h); a
  // larger one written is logged once at warning level (the next start
  // would set it aside).
  uint64_t max_snapshot_bytes = UINT64_MAX;
};

class Snapshotter : public Collector {
 public:
  // Reads this boot's id and makes or checks the directory (errors name
  // the flag and the path; PrepareStateDir()). Starts nothing; `loop` outlives
  // it. Without a directory the snapshotter is inactive: Restore(), Start(),
  // Close() and WriteFinal() do nothing, and its families read 0.
  static Status Create(uv_loop_t* loop, const SnapshotterOptions& options,
                       std::unique_ptr<Snapshotter>* out);
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;
  // Close() must have completed if Start() was called.
  ~Snapshotter() override;

  // Loads DIR/snapshot if there is one that this boot and fingerprint
  // accept: apply(reader over the payload) takes it and returns true when
  // it took the payload whole. A file that fails is set aside (logged);
  // *applied says whether apply() ran at all (then, when it failed, its
  // owner's state is half loaded and to be rebuilt; the snapshotter's own
  // counters are reset). Call once, before Start().
  LoadOutcome Restore(const SnapshotFingerprint& fp,
                      const std::function<bool(StateReader&)>& apply,
                      bool* applied);
  // The snapshotter's part of the payload: its counters (a snapshot counts
  // itself as written: it is on disk, to be loaded, only if its write
  // succeeds).
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

  // Makes this the owner of tokenmeter_state_snapshots_total and
  // tokenmeter_state_restored in `registry` (until destroyed).
  void Expose(Registry& registry);

  // Starts the timer: every interval, encode(writer over the payload) on
  // the loop, the write on the pool, then on_written() on the loop when it
  // succeeded. The fingerprint is the one each snapshot is written with.
  void Start(const SnapshotFingerprint& fp,
             std::function<void(StateWriter&)> encode,
             std::function<void()> on_written);
  // Stops the timer (no snapshot starts from now on) and calls done() once
  // its handle is closed. A write in flight goes on.
  void Close(std::function<void()> done);
  // The snapshot at stop, written on the loop now, or when the write in
  // flight has finished. Logs what it wrote, its size and `note` (what the
  // owner says it holds, e.g. "12 requests in flight").
  void WriteFinal(std::string note);

  bool enabled() const { return !options_.dir.empty(); }
  // A periodic snapshot is being written on the pool.
  bool write_in_flight() const { return in_flight_; }
  bool restored() const { return restored_; }
  uint64_t written() const { return ok_; }
  uint64_t failed() const { return error_; }
  const std::string& dir() const { return options_.dir; }
  StateDir state_dir() const { return {options_.dir, options_.dir_unsafe_ok}; }

  void Collect(DaemonMetric id, MetricWriter& w) const override;

 private:
  struct Write;  // uv_work_t and its bytes
  Snapshotter(uv_loop_t* loop, const SnapshotterOptions& options);
  void StartOne();
  void Encode(std::string* out) const;
  void OnWritten(const Status& s);
  // Logs once when a snapshot of `bytes` is past max_snapshot_bytes.
  void CheckBound(size_t bytes);

  uv_loop_t* const loop_;
  const SnapshotterOptions options_;
  std::string boot_id_;
  SnapshotFingerprint fingerprint_;
  std::function<void(StateWriter&)> encode_;
  std::function<void()> on_written_;
  uv_timer_t timer_{};
  bool started_ = false;
  bool closing_ = false;
  std::function<void()> close_done_;
  bool restored_ = false;  // started from a snapshot
  uint64_t ok_ = 0;        // tokenmeter_state_snapshots_total
  uint64_t error_ = 0;
  bool in_flight_ = false;
  bool final_due_ = false;  // stopped while a write was in flight
  std::string final_note_;
  bool failing_ = false;            // the latest write failed (logged)
  size_t last_bytes_ = 0;           // the latest snapshot's size, to reserve
  bool over_bound_logged_ = false;  // a snapshot past max_snapshot_bytes
  std::unique_ptr<Registration> registration_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STATE_SNAPSHOTTER_H_
