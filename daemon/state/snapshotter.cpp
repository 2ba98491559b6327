#include "daemon/state/snapshotter.h"

#include <algorithm>
#include <utility>

#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {

// One snapshot write on libuv's thread pool.
struct Snapshotter::Write {
  uv_work_t req{};
  Snapshotter* snapshotter = nullptr;
  StateDir dir;
  std::string bytes;
  Status result = Status::Ok();
};

Snapshotter::Snapshotter(uv_loop_t* loop, const SnapshotterOptions& options)
    : loop_(loop), options_(options) {}

Snapshotter::~Snapshotter() = default;

Status Snapshotter::Create(uv_loop_t* loop, const SnapshotterOptions& options,
                           std::unique_ptr<Snapshotter>* out) {
  std::unique_ptr<Snapshotter> s(new Snapshotter(loop, options));
  if (!s->enabled()) {
    *out = std::move(s);
    return Status::Ok();
  }
  Status st = ReadBootId(options.boot_id_file, &s->boot_id_);
  if (!st.ok()) return st;
  st = PrepareStateDir(s->state_dir());
  if (!st.ok()) return st;
  *out = std::move(s);
  return Status::Ok();
}

LoadOutcome Snapshotter::Restore(const SnapshotFingerprint& fp,
                                 const std::function<bool(StateReader&)>& apply,
                                 bool* applied) {
  *applied = false;
  if (!enabled()) return LoadOutcome::kNone;
  const LoadOutcome outcome =
      LoadSnapshot(state_dir(), options_.max_snapshot_bytes, boot_id_, fp,
                   [&](StateReader& r) {
                     *applied = true;
                     return apply(r);
                   });
  restored_ = outcome == LoadOutcome::kRestored;
  // Half loaded: the counters start from nothing too.
  if (*applied && !restored_) ok_ = error_ = 0;
  return outcome;
}

void Snapshotter::SaveState(StateWriter& w) const {
  w.U64(ok_ + 1);
  w.U64(error_);
}

void Snapshotter::LoadState(StateReader& r) {
  ok_ = r.U64();
  error_ = r.U64();
}

void Snapshotter::Expose(Registry& registry) {
  static constexpr DaemonMetric kOwned[] = {kStateSnapshots, kStateRestored};
  registration_ = std::make_unique<Registration>(registry, this, kOwned);
}

void Snapshotter::Collect(DaemonMetric id, MetricWriter& w) const {
  const SampleLabels none;
  switch (id) {
    case kStateSnapshots:
      w.Sample(none.WithOwn("result", "ok"), ok_);
      w.Sample(none.WithOwn("result", "error"), error_);
      break;
    case kStateRestored:
      w.Sample(none, uint64_t{restored_ ? 1u : 0u});
      break;
    default:
      break;
  }
}

void Snapshotter::Start(const SnapshotFingerprint& fp,
                        std::function<void(StateWriter&)> encode,
                        std::function<void()> on_written) {
  if (!enabled()) return;
  fingerprint_ = fp;
  encode_ = std::move(encode);
  on_written_ = std::move(on_written);
  uv_timer_init(loop_, &timer_);
  timer_.data = this;
  started_ = true;
  const uint64_t ms = std::max<uint64_t>(1, options_.interval_ns / 1'000'000);
  uv_timer_start(
      &timer_,
      [](uv_timer_t* t) { static_cast<Snapshotter*>(t->data)->StartOne(); }, ms,
      ms);
}

void Snapshotter::Close(std::function<void()> done) {
  closing_ = true;
  if (!started_ || uv_is_closing(reinterpret_cast<uv_handle_t*>(&timer_))) {
    done();
    return;
  }
  close_done_ = std::move(done);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), [](uv_handle_t* h) {
    auto* self = static_cast<Snapshotter*>(h->data);
    auto done = std::move(self->close_done_);
    done();
  });
}

void Snapshotter::Encode(std::string* out) const {
  EncodeSnapshot(boot_id_, fingerprint_, encode_, out);
}

void Snapshotter::StartOne() {
  if (in_flight_ || closing_) return;
  auto* write = new Write;
  write->snapshotter = this;
  write->bytes.reserve(last_bytes_ + last_bytes_ / 8);
  write->dir = state_dir();
  write->req.data = write;
  Encode(&write->bytes);
  last_bytes_ = write->bytes.size();
  CheckBound(last_bytes_ + 4);
  in_flight_ = true;
  const int rc = uv_queue_work(
      loop_, &write->req,
      [](uv_work_t* req) {
        auto* w = static_cast<Write*>(req->data);
        SealSnapshot(&w->bytes);
        w->result = WriteFileAtomically(w->dir, kSnapshotName, w->bytes);
      },
      [](uv_work_t* req, int status) {
        std::unique_ptr<Write> w(static_cast<Write*>(req->data));
        Snapshotter* s = w->snapshotter;
        s->in_flight_ = false;
        s->OnWritten(status == 0 ? w->result
                                 : Status::Error(uv_strerror(status)));
        if (s->final_due_) s->WriteFinal(std::move(s->final_note_));
      });
  if (rc != 0) {
    in_flight_ = false;
    OnWritten(Status::Error(std::string("uv_queue_work: ") + uv_strerror(rc)));
    delete write;
  }
}

void Snapshotter::CheckBound(size_t bytes) {
  if (bytes <= options_.max_snapshot_bytes || over_bound_logged_) return;
  over_bound_logged_ = true;
  spdlog::warn(
      "state: a snapshot of {} bytes, more than the {} the caps allow for "
      "(docs/operations.md, \"Who can reach what\"): the next start will set "
      "it aside; logged once",
      bytes, options_.max_snapshot_bytes);
}

void Snapshotter::OnWritten(const Status& s) {
  if (s.ok()) {
    ++ok_;
    if (failing_) {
      failing_ = false;
      spdlog::info("state: snapshots are written again");
    }
    if (on_written_) on_written_();
    return;
  }
  ++error_;
  // Once per run of failures: a full disk would otherwise log every second.
  if (!failing_) {
    failing_ = true;
    spdlog::warn(
        "state: cannot write a snapshot: {}; ACKs wait until one is written, "
        "further failures are counted in tokenmeter_state_snapshots_total",
        s.message());
  }
}

void Snapshotter::WriteFinal(std::string note) {
  if (!enabled()) return;
  if (in_flight_) {
    final_due_ = true;
    final_note_ = std::move(note);
    return;
  }
  final_due_ = false;
  std::string bytes;
  Encode(&bytes);
  SealSnapshot(&bytes);
  CheckBound(bytes.size());
  const Status s = WriteFileAtomically(state_dir(), kSnapshotName, bytes);
  if (s.ok()) {
    ++ok_;
    spdlog::info("state: wrote {}/{} at stop ({} bytes, {})", options_.dir,
                 kSnapshotName, bytes.size(), note);
  } else {
    ++error_;
    spdlog::error("state: cannot write the snapshot at stop: {}", s.message());
  }
}

}  // namespace tokenmeter::daemon
