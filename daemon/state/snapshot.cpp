#include "daemon/state/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {
namespace {

constexpr std::string_view kMagic = "TMSTATE\n";
// The boot id file is read whole: a few bytes, never more than this.
constexpr uint64_t kMaxBootIdFileBytes = 4096;

uint32_t Checksum(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (!bytes.empty()) {
    const uInt n = uInt(std::min<size_t>(bytes.size(), 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), n);
    bytes.remove_prefix(n);
  }
  return uint32_t(crc);
}

std::string Errno(std::string_view what, const std::string& path) {
  return std::string(what) + " " + path + ": " + std::strerror(errno);
}

// One open descriptor, closed when this goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  const int fd_;
};

// Why a directory (or a file in it) is not the daemon's alone; empty when
// it is: owned by the effective uid, writable by neither group nor others.
std::string NotOurs(const struct stat& st) {
  if (st.st_uid != geteuid()) {
    return fmt::format("is owned by uid {}, not by the daemon's uid {}",
                       st.st_uid, geteuid());
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return fmt::format("is writable by its group or others (mode {:04o})",
                       st.st_mode & 07777);
  }
  return {};
}

// Checks the directory open at `fd` (a descriptor of `dir.path`).
Status CheckStateDir(int fd, const StateDir& dir, bool log_unsafe) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return Status::Error("--state-dir: " + Errno("cannot stat", dir.path));
  }
  const std::string why = NotOurs(st);
  if (!why.empty() && !dir.unsafe_ok) {
    return Status::Error(fmt::format(
        "--state-dir: {} {}: whoever else can change it can plant the "
        "snapshot the daemon loads; make it the daemon's alone (chown to "
        "uid {}, chmod go-w) or pass --state-dir-unsafe-ok",
        dir.path, why, geteuid()));
  }
  if (!why.empty() && log_unsafe) {
    spdlog::warn(
        "state: {} {}; used all the same (--state-dir-unsafe-ok), its files "
        "are still checked",
        dir.path, why);
  }
  return Status::Ok();
}

// Opens `dir` (a symbolic link in its path is followed) and checks it; *fd
// then owns a descriptor of what was checked, which every later step goes
// through, so a path swapped afterwards changes nothing.
Status OpenStateDir(const StateDir& dir, bool log_unsafe, int* fd) {
  *fd = open(dir.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (*fd < 0 && errno == ENOTDIR) {
    return Status::Error("--state-dir: " + dir.path + " is not a directory");
  }
  if (*fd < 0) {
    return Status::Error("--state-dir: " + Errno("cannot open", dir.path));
  }
  Status s = CheckStateDir(*fd, dir, log_unsafe);
  if (!s.ok()) {
    close(*fd);
    *fd = -1;
  }
  return s;
}

// What a snapshot must be before a byte of it is read; empty when it is.
std::string NotASnapshotFile(const struct stat& st, uint64_t max_bytes) {
  if (S_ISLNK(st.st_mode)) return "a symbolic link, not followed";
  if (S_ISFIFO(st.st_mode)) return "a FIFO, not a regular file";
  if (S_ISSOCK(st.st_mode)) return "a socket, not a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory, not a regular file";
  if (!S_ISREG(st.st_mode)) return "a device, not a regular file";
  std::string why = NotOurs(st);
  if (!why.empty()) return "it " + why;
  if (uint64_t(st.st_size) > max_bytes) {
    return fmt::format(
        "{} bytes, more than the {} a snapshot of this configuration's caps "
        "can take (docs/operations.md, \"Who can reach what\")",
        st.st_size, max_bytes);
  }
  return {};
}

void SetAside(int dir_fd, const std::string& dir, const std::string& reason) {
  const std::string name(kSnapshotName);
  // snapshot.set-aside.<unix-time>, or .<unix-time>.<n> when a file set
  // aside in the same second has that name: one is never replaced by
  // another (the directory is the daemon's: no one else makes names).
  const std::string base = name + ".set-aside." + std::to_string(time(nullptr));
  std::string to = base;
  struct stat st {};
  for (int n = 1;
       n < 1000 && fstatat(dir_fd, to.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
       ++n) {
    to = base + "." + std::to_string(n);
  }
  if (renameat(dir_fd, name.c_str(), dir_fd, to.c_str()) != 0) {
    spdlog::warn(
        "state: {}/{} not restored ({}), and it could not be set aside as {}: "
        "{}",
        dir, name, reason, to, std::strerror(errno));
    return;
  }
  spdlog::warn("state: {}/{} not restored ({}); set aside as {}", dir, name,
               reason, to);
}

// Reads `fd` to its end into *out, at most `max_bytes` (*too_big past
// them); false with errno when a read fails. `size_hint`: fstat's size
// (/proc files report 0).
bool ReadAll(int fd, uint64_t size_hint, uint64_t max_bytes, std::string* out,
             bool* too_big) {
  out->resize(size_t(std::min(size_hint, max_bytes)) + 4096);
  size_t got = 0;
  while (true) {
    if (got > max_bytes) {
      *too_big = true;
      return true;
    }
    if (got == out->size()) out->resize(got * 2);
    const ssize_t n = read(fd, out->data() + got, out->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    got += size_t(n);
  }
  out->resize(got);
  return true;
}

}  // namespace

Status ReadBootId(const std::string& path, std::string* boot_id) {
  std::string text;
  bool too_big = false;
  // O_NONBLOCK: a FIFO named by mistake is an error, not a hang.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return Status::Error("--boot-id-file: " + Errno("cannot read", path));
  }
  Fd guard(fd);
  if (!ReadAll(fd, 0, kMaxBootIdFileBytes, &text, &too_big)) {
    return Status::Error("--boot-id-file: " + Errno("cannot read", path));
  }
  const size_t b = text.find_first_not_of(" \t\r\n");
  const size_t e = text.find_last_not_of(" \t\r\n");
  if (too_big || b == std::string::npos || e - b + 1 > 256) {
    return Status::Error("--boot-id-file: " + path +
                         " holds no boot id (1 to 256 bytes expected)");
  }
  *boot_id = text.substr(b, e - b + 1);
  return Status::Ok();
}

Status PrepareStateDir(const StateDir& dir) {
  if (mkdir(dir.path.c_str(), 0750) != 0 && errno != EEXIST) {
    return Status::Error("--state-dir: " + Errno("cannot create", dir.path));
  }
  int fd = -1;
  Status s = OpenStateDir(dir, true, &fd);
  if (!s.ok()) return s;
  Fd guard(fd);
  if (faccessat(AT_FDCWD, dir.path.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    return Status::Error("--state-dir: " + Errno("cannot write to", dir.path));
  }
  return Status::Ok();
}

void EncodeSnapshot(const std::string& boot_id, const SnapshotFingerprint& fp,
                    const std::function<void(StateWriter&)>& body,
                    std::string* out) {
  out->clear();
  out->append(kMagic);
  StateWriter w(*out);
  w.U32(kSnapshotVersion);
  w.Str(boot_id);
  for (const std::string& part : fp.parts) w.Str(part);
  body(w);
}

void SealSnapshot(std::string* bytes) {
  StateWriter w(*bytes);
  w.U32(Checksum(*bytes));
}

LoadOutcome LoadSnapshot(const StateDir& dir, uint64_t max_bytes,
                         const std::string& boot_id,
                         const SnapshotFingerprint& fp,
                         const std::function<bool(StateReader&)>& apply) {
  int dir_fd = -1;
  if (Status s = OpenStateDir(dir, false, &dir_fd); !s.ok()) {
    spdlog::warn("state: no snapshot read: {}", s.message());
    return LoadOutcome::kNone;
  }
  Fd dir_guard(dir_fd);
  const auto set_aside = [&](const std::string& reason) {
    SetAside(dir_fd, dir.path, reason);
  };
  const std::string name(kSnapshotName);
  // Looked at before it is opened: opening a FIFO or a device could block
  // or act on the device.
  struct stat st {};
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return LoadOutcome::kNone;
    set_aside(std::string("unreadable: ") + strerror(errno));
    return LoadOutcome::kSetAside;
  }
  if (std::string why = NotASnapshotFile(st, max_bytes); !why.empty()) {
    set_aside(why);
    return LoadOutcome::kSetAside;
  }
  const int fd = openat(dir_fd, name.c_str(),
                        O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return LoadOutcome::kNone;
    set_aside(std::string("unreadable: ") + strerror(errno));
    return LoadOutcome::kSetAside;
  }
  Fd file_guard(fd);
  // Again on what was opened: the name may have changed in between.
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = std::string("unreadable: ") + strerror(errno);
  } else {
    why = NotASnapshotFile(st, max_bytes);
  }
  std::string bytes;
  bool too_big = false;
  if (why.empty() &&
      !ReadAll(fd, uint64_t(st.st_size), max_bytes, &bytes, &too_big)) {
    why = std::string("unreadable: ") + strerror(errno);
  }
  if (why.empty() && too_big) {
    why = fmt::format("it grew past {} bytes while read", max_bytes);
  }
  if (!why.empty()) {
    set_aside(why);
    return LoadOutcome::kSetAside;
  }
  const size_t min = kMagic.size() + 4 + 4;
  if (bytes.size() < min || std::string_view(bytes).substr(0, 8) != kMagic) {
    set_aside("not a tokenmeterd snapshot, or truncated");
    return LoadOutcome::kSetAside;
  }
  const std::string_view covered(bytes.data(), bytes.size() - 4);
  StateReader tail(bytes.data() + covered.size(), 4);
  if (tail.U32() != Checksum(covered)) {
    set_aside("corrupt or truncated: the checksum does not match");
    return LoadOutcome::kSetAside;
  }
  StateReader r(covered.data() + kMagic.size(), covered.size() - kMagic.size());
  const uint32_t version = r.U32();
  if (version < kOldestStateFormatVersion || version > kSnapshotVersion) {
    set_aside(fmt::format("format version {}, this daemon reads {} to {}",
                          version, kOldestStateFormatVersion,
                          kSnapshotVersion));
    return LoadOutcome::kSetAside;
  }
  r.set_version(version);
  const std::string their_boot = r.Str(256);
  if (their_boot != boot_id) {
    set_aside(
        fmt::format("written in another boot ({}, this boot {}): "
                    "its CLOCK_MONOTONIC times mean nothing now",
                    their_boot, boot_id));
    return LoadOutcome::kSetAside;
  }
  for (size_t i = 0; i < fp.parts.size(); ++i) {
    const std::string& expected =
        i == 0 && version < 5 && !fp.legacy_buckets.empty() ? fp.legacy_buckets
                                                            : fp.parts[i];
    if (r.Str(1 << 20) != expected) {
      set_aside(fmt::format("written with other {} than configured now",
                            SnapshotFingerprint::kPartNames[i]));
      return LoadOutcome::kSetAside;
    }
  }
  if (!r.ok() || !apply(r)) {
    set_aside(
        "its contents do not decode, or hold more than this daemon's caps "
        "take (--max-requests, --max-engine-series, --max-moe-layers, ...)");
    return LoadOutcome::kSetAside;
  }
  return LoadOutcome::kRestored;
}

Status WriteFileAtomically(const StateDir& dir, std::string_view name,
                           std::string_view bytes) {
  const std::string file(name);
  const std::string tmp = file + ".tmp";
  const std::string tmp_path = dir.path + "/" + tmp;
  int dir_fd = -1;
  if (Status s = OpenStateDir(dir, false, &dir_fd); !s.ok()) {
    return Status::Error("cannot write " + tmp_path + ": " + s.message());
  }
  Fd dir_guard(dir_fd);
  // Whatever is at the temporary name (a FIFO, a symbolic link, a file a
  // crash left) goes; O_EXCL then creates a new file or fails, and never
  // writes through what another process put there in between.
  if (unlinkat(dir_fd, tmp.c_str(), 0) != 0 && errno != ENOENT) {
    return Status::Error(Errno("cannot remove", tmp_path));
  }
  const int fd = openat(
      dir_fd, tmp.c_str(),
      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0640);
  if (fd < 0) return Status::Error(Errno("cannot create", tmp_path));
  const auto fail = [&](std::string_view what) {
    Status s = Status::Error(Errno(what, tmp_path));
    close(fd);
    unlinkat(dir_fd, tmp.c_str(), 0);
    return s;
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write");
    done += size_t(n);
  }
  if (fsync(fd) != 0) return fail("cannot fsync");
  close(fd);
  if (renameat(dir_fd, tmp.c_str(), dir_fd, file.c_str()) != 0) {
    Status s = Status::Error(
        Errno("cannot rename " + tmp_path + " to", dir.path + "/" + file));
    unlinkat(dir_fd, tmp.c_str(), 0);
    return s;
  }
  if (fsync(dir_fd) != 0) return Status::Error(Errno("cannot fsync", dir.path));
  return Status::Ok();
}

}  // namespace tokenmeter::daemon
