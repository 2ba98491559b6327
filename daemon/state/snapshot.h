// State snapshots (--state-dir): the file that lets a restarted tokenmeterd
// go on where the previous process stopped, its counters never reset, its
// requests in flight still joined.
//
// File DIR/snapshot, written atomically (DIR/snapshot.tmp created afresh,
// fsync, rename, fsync of DIR):
//
//   "TMSTATE\n"         8 bytes
//   u32 version         kSnapshotVersion
//   str boot id         the --boot-id-file contents, trimmed
//   str fingerprint[3]  buckets, naming, request labels (SnapshotFingerprint)
//   payload             each component's SaveState(): the pipeline's
//                       (Pipeline::SaveState()), the snapshotter's
//                       counters, the HTTP server's (Daemon::EncodeState())
//   u32 checksum        CRC-32 (zlib's) of every byte before it
//
// (state_io.h encodings: little-endian fixed-width integers, strings as a
// u32 length and the bytes.) A file that fails any of these checks is set
// aside, never mixed in: renamed to snapshot.set-aside.<unix-time> and
// logged once at warning level with the reason.
//
// What the daemon trusts (docs/operations.md, "Who can reach what"): a
// directory that only its own uid can change (owned by its effective uid,
// not writable by group or others; --state-dir-unsafe-ok waives that), and
// in it only a regular file owned by that uid, not writable by group or
// others, no larger than the bound the caps give (daemon/snapshot_bound.h).
// Nothing there is followed, opened before it is checked, or written
// through: every file is reached relative to a descriptor of the directory
// that passed the checks, with O_NOFOLLOW, and the temporary file is made
// with O_CREAT | O_EXCL.
//
// Not thread-safe, except WriteFileAtomically(), which touches nothing but
// its arguments and the file system (the daemon calls it off the loop).
#ifndef TOKENMETER_DAEMON_STATE_SNAPSHOT_H_
#define TOKENMETER_DAEMON_STATE_SNAPSHOT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "daemon/base/state_io.h"
#include "daemon/base/status.h"

namespace tokenmeter::daemon {

// The format written (state_io.h: 2, each histogram with its native
// buckets); versions from kOldestStateFormatVersion on are read.
inline constexpr uint32_t kSnapshotVersion = kStateFormatVersion;
inline constexpr std::string_view kSnapshotName = "snapshot";

// What of the configuration a snapshot depends on, as three strings that
// must equal the running configuration's: the histogram bucket layouts of
// every profile (and the catalog's size), the naming (--profile,
// --namespace) and the request labels (names, --request-label-values).
// Pipeline::Fingerprint() makes it.
struct SnapshotFingerprint {
  std::array<std::string, 3> parts;
  // parts[0] as formats 1 to 4 wrote it (the 1.1 catalog's histograms):
  // an older snapshot is compared with this one. Empty: the same as
  // parts[0].
  std::string legacy_buckets = {};
  static constexpr std::array<std::string_view, 3> kPartNames = {
      "histogram buckets", "naming profile or namespace", "request labels"};
};

// The boot id in `path` (whitespace trimmed); an error naming the file when
// it cannot be read or is empty.
Status ReadBootId(const std::string& path, std::string* boot_id);

// The state directory and how far it is trusted.
struct StateDir {
  std::string path;  // --state-dir
  // --state-dir-unsafe-ok: use a directory owned by another uid or writable
  // by its group or others (its files are checked all the same).
  bool unsafe_ok = false;
};

// Makes the directory if it does not exist (mode 0750) and checks it: a
// directory (a symbolic link to one is followed: systemd's StateDirectory=
// with DynamicUser= makes one) that the daemon can write, owned by the
// daemon's effective uid and writable by no one else (unless unsafe_ok,
// which logs one warning instead). The error is one line naming the flag,
// the path and the remedy. A few system calls; any thread.
Status PrepareStateDir(const StateDir& dir);

// Header and body(writer) into *out (cleared first): what the loop does.
// SealSnapshot() then appends the checksum, O(bytes), on any thread.
void EncodeSnapshot(const std::string& boot_id, const SnapshotFingerprint& fp,
                    const std::function<void(StateWriter&)>& body,
                    std::string* out);
void SealSnapshot(std::string* bytes);

enum class LoadOutcome {
  kNone,      // no snapshot in DIR
  kRestored,  // apply() took it
  kSetAside,  // refused: renamed and logged
};

// Reads DIR/snapshot and, when its header, boot id, fingerprint and
// checksum pass, calls apply(reader over the payload); apply returns true
// when it took the payload whole (reader ok and at its end). Anything else
// sets the file aside with the reason. Before a byte is read the file must
// be a regular file (a symbolic link, FIFO, socket, device or directory is
// set aside without being opened or followed), owned by the daemon's
// effective uid, not writable by group or others, and at most `max_bytes`
// long (the daemon's bound from its caps, daemon/snapshot_bound.h): such a
// file is set aside, one warning line, without a byte read, so a sparse
// file of any size costs a few system calls. An unreadable file (other
// than absent) is set aside too; nothing here is fatal. A directory that
// fails PrepareStateDir()'s checks now is not read (one warning; kNone).
// O(file size) in time and memory; the loop's thread, at start.
LoadOutcome LoadSnapshot(const StateDir& dir, uint64_t max_bytes,
                         const std::string& boot_id,
                         const SnapshotFingerprint& fp,
                         const std::function<bool(StateReader&)>& apply);

// Writes `bytes` to DIR/NAME through DIR/NAME.tmp: checks the directory as
// PrepareStateDir() does (without making it), removes whatever is at the
// temporary name, creates it with O_CREAT | O_EXCL | O_NOFOLLOW (never
// through a link, never into a FIFO or another file, never blocking),
// write, fsync, rename, fsync DIR. O(bytes) plus two fsyncs; any thread.
// The error names the step and the path; nothing is left at the temporary
// name after a failure that this call could clean up.
Status WriteFileAtomically(const StateDir& dir, std::string_view name,
                           std::string_view bytes);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STATE_SNAPSHOT_H_
