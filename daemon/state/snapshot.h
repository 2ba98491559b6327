// State snapshots (--state-dir): the file that lets a restarted tokenmeterd
// go on where the previous process stopped, its counters never reset, its
// requests in flight still joined.
//
// File DIR/snapshot, written atomically (DIR/snapshot.tmp, fsync, rename,
// fsync of DIR):
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
// Not thread-safe, except WriteFileAtomically(), which touches nothing but
// its arguments and the file system (the daemon calls it off the loop).
#ifndef TOKENMETER_DAEMON_STATE_SNAPSHOT_H_
#define TOKENMETER_DAEMON_STATE_SNAPSHOT_H_

#include <array>
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
  static constexpr std::array<std::string_view, 3> kPartNames = {
      "histogram buckets", "naming profile or namespace", "request labels"};
};

// The boot id in `path` (whitespace trimmed); an error naming the file when
// it cannot be read or is empty.
Status ReadBootId(const std::string& path, std::string* boot_id);

// Makes DIR if it does not exist (mode 0750) and checks that it is a
// directory the daemon can write; the error names the flag and the path.
Status PrepareStateDir(const std::string& dir);

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
// sets the file aside with the reason. An unreadable file (other than
// absent) is set aside too; nothing here is fatal.
LoadOutcome LoadSnapshot(const std::string& dir, const std::string& boot_id,
                         const SnapshotFingerprint& fp,
                         const std::function<bool(StateReader&)>& apply);

// Writes `bytes` to DIR/NAME through DIR/NAME.tmp: write, fsync, rename,
// fsync DIR. Any thread. The error names the step and the path.
Status WriteFileAtomically(const std::string& dir, std::string_view name,
                           std::string_view bytes);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STATE_SNAPSHOT_H_
