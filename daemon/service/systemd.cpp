#include "daemon/service/systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef TOKENMETER_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace tokenmeter::daemon {
namespace {

constexpr int kListenFdsStart = 3;  // SD_LISTEN_FDS_START

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.emplace_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace

std::map<std::string, int> ParseListenFds(const char* listen_pid,
                                          const char* listen_fds,
                                          const char* listen_fdnames,
                                          int64_t self_pid) {
  std::map<std::string, int> out;
  if (listen_pid == nullptr || listen_fds == nullptr ||
      std::strtoll(listen_pid, nullptr, 10) != self_pid) {
    return out;
  }
  const long n = std::strtol(listen_fds, nullptr, 10);
  const std::vector<std::string> names =
      Split(listen_fdnames != nullptr ? listen_fdnames : "", ':');
  for (long i = 0; i < n && i < 64; ++i) {
    out.emplace(
        size_t(i) < names.size() && !names[i].empty() ? names[i] : "unknown",
        kListenFdsStart + int(i));
  }
  return out;
}

bool SendNotifyDatagram(const std::string& socket_path,
                        const std::string& message) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof addr.sun_path) {
    return false;
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const socklen_t len =
      socklen_t(offsetof(sockaddr_un, sun_path) + socket_path.size());
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const ssize_t n = sendto(fd, message.data(), message.size(), MSG_NOSIGNAL,
                           reinterpret_cast<sockaddr*>(&addr), len);
  close(fd);
  return n == ssize_t(message.size());
}

std::map<std::string, int> TakeInheritedSockets() {
  std::map<std::string, int> out;
#ifdef TOKENMETER_HAVE_LIBSYSTEMD
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  for (int i = 0; i < n; ++i) {
    const int fd = kListenFdsStart + i;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    out.emplace(names != nullptr && names[i] != nullptr ? names[i] : "unknown",
                fd);
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) free(names[i]);
    free(names);
  }
#else
  out = ParseListenFds(std::getenv("LISTEN_PID"), std::getenv("LISTEN_FDS"),
                       std::getenv("LISTEN_FDNAMES"), getpid());
  for (const auto& [name, fd] : out) fcntl(fd, F_SETFD, FD_CLOEXEC);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
#endif
  return out;
}

Notifier::Notifier() {
  if (const char* p = std::getenv("NOTIFY_SOCKET"); p != nullptr) {
    socket_path_ = p;
  }
  const char* usec = std::getenv("WATCHDOG_USEC");
  const char* wpid = std::getenv("WATCHDOG_PID");
  if (usec != nullptr &&
      (wpid == nullptr || std::strtoll(wpid, nullptr, 10) == getpid())) {
    watchdog_usec_ = std::strtoull(usec, nullptr, 10);
  }
}

bool Notifier::Send(const std::string& message) {
  if (!enabled()) return false;
#ifdef TOKENMETER_HAVE_LIBSYSTEMD
  return sd_notify(/*unset_environment=*/0, message.c_str()) > 0;
#else
  return SendNotifyDatagram(socket_path_, message);
#endif
}

}  // namespace tokenmeter::daemon
