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
// A snapshot is read whole; past this it is set aside (the tracker's
// 1,000,000 requests take about 100 MB).
constexpr off_t kMaxSnapshotBytes = off_t{4} << 30;

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

void SetAside(const std::string& dir, const std::string& reason) {
  const std::string from = dir + "/" + std::string(kSnapshotName);
  const std::string to = from + ".set-aside." + std::to_string(time(nullptr));
  if (rename(from.c_str(), to.c_str()) != 0) {
    spdlog::warn(
        "state: {} not restored ({}), and it could not be set aside as {}: {}",
        from, reason, to, std::strerror(errno));
    return;
  }
  spdlog::warn("state: {} not restored ({}); set aside as {}", from, reason,
               to);
}

// Reads all of `path` into *out; false with errno when it cannot.
bool ReadFile(const std::string& path, std::string* out, bool* too_big) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return false;
  }
  if (st.st_size > kMaxSnapshotBytes) {
    close(fd);
    *too_big = true;
    return true;
  }
  // Until end of file: /proc files report a size of 0.
  out->resize(size_t(st.st_size) + 4096);
  size_t got = 0;
  while (true) {
    if (got == out->size()) {
      if (off_t(got) > kMaxSnapshotBytes) {
        close(fd);
        *too_big = true;
        return true;
      }
      out->resize(got * 2);
    }
    const ssize_t n = read(fd, out->data() + got, out->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      errno = e;
      return false;
    }
    if (n == 0) break;
    got += size_t(n);
  }
  out->resize(got);
  close(fd);
  return true;
}

}  // namespace

Status ReadBootId(const std::string& path, std::string* boot_id) {
  std::string text;
  bool too_big = false;
  if (!ReadFile(path, &text, &too_big)) {
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

Status PrepareStateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return Status::Error("--state-dir: " + Errno("cannot create", dir));
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    return Status::Error("--state-dir: " + Errno("cannot open", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::Error("--state-dir: " + dir + " is not a directory");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::Error("--state-dir: " + Errno("cannot write to", dir));
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

LoadOutcome LoadSnapshot(const std::string& dir, const std::string& boot_id,
                         const SnapshotFingerprint& fp,
                         const std::function<bool(StateReader&)>& apply) {
  const std::string path = dir + "/" + std::string(kSnapshotName);
  std::string bytes;
  bool too_big = false;
  if (!ReadFile(path, &bytes, &too_big)) {
    if (errno == ENOENT) return LoadOutcome::kNone;
    SetAside(dir, std::string("unreadable: ") + std::strerror(errno));
    return LoadOutcome::kSetAside;
  }
  if (too_big) {
    SetAside(dir, "larger than 4 GiB");
    return LoadOutcome::kSetAside;
  }
  const size_t min = kMagic.size() + 4 + 4;
  if (bytes.size() < min || std::string_view(bytes).substr(0, 8) != kMagic) {
    SetAside(dir, "not a tokenmeterd snapshot, or truncated");
    return LoadOutcome::kSetAside;
  }
  const std::string_view covered(bytes.data(), bytes.size() - 4);
  StateReader tail(bytes.data() + covered.size(), 4);
  if (tail.U32() != Checksum(covered)) {
    SetAside(dir, "corrupt or truncated: the checksum does not match");
    return LoadOutcome::kSetAside;
  }
  StateReader r(covered.data() + kMagic.size(), covered.size() - kMagic.size());
  const uint32_t version = r.U32();
  if (version < kOldestStateFormatVersion || version > kSnapshotVersion) {
    SetAside(dir,
             fmt::format("format version {}, this daemon reads {} to {}",
                         version, kOldestStateFormatVersion, kSnapshotVersion));
    return LoadOutcome::kSetAside;
  }
  r.set_version(version);
  const std::string their_boot = r.Str(256);
  if (their_boot != boot_id) {
    SetAside(dir, fmt::format("written in another boot ({}, this boot {}): "
                              "its CLOCK_MONOTONIC times mean nothing now",
                              their_boot, boot_id));
    return LoadOutcome::kSetAside;
  }
  for (size_t i = 0; i < fp.parts.size(); ++i) {
    if (r.Str(1 << 20) != fp.parts[i]) {
      SetAside(dir, fmt::format("written with other {} than configured now",
                                SnapshotFingerprint::kPartNames[i]));
      return LoadOutcome::kSetAside;
    }
  }
  if (!r.ok() || !apply(r)) {
    SetAside(dir, "its contents do not decode");
    return LoadOutcome::kSetAside;
  }
  return LoadOutcome::kRestored;
}

Status WriteFileAtomically(const std::string& dir, std::string_view name,
                           std::string_view bytes) {
  const std::string path = dir + "/" + std::string(name);
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return Status::Error(Errno("cannot create", tmp));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Status::Error(Errno("cannot write", tmp));
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += size_t(n);
  }
  if (fsync(fd) != 0) {
    Status s = Status::Error(Errno("cannot fsync", tmp));
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::Error(Errno("cannot rename " + tmp + " to", path));
    unlink(tmp.c_str());
    return s;
  }
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Status::Error(Errno("cannot open", dir));
  const int rc = fsync(dfd);
  const int e = errno;
  close(dfd);
  errno = e;
  if (rc != 0) return Status::Error(Errno("cannot fsync", dir));
  return Status::Ok();
}

}  // namespace tokenmeter::daemon
