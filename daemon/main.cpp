// tokenmeterd: see docs/operations.md.
#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/logging/log_setup.h"
#include "spdlog/fmt/fmt.h"
#include "spdlog/spdlog.h"

namespace {

// Raises the soft RLIMIT_NOFILE to the hard one (the daemon uses epoll, so
// descriptors above 1024 are fine); returns the soft limit now in force (0
// if unknown) and in *note the line that says so, logged once the daemon
// has started (a start-up error is one line on stderr: interfaces.md).
uint64_t RaiseFdLimit(std::string* note) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("file descriptors: getrlimit(RLIMIT_NOFILE): {}",
                 std::strerror(errno));
    return 0;
  }
  const rlim_t before = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      rl = raised;
    } else {
      spdlog::warn(
          "file descriptors: cannot raise the soft limit from {} to the hard "
          "limit {}: {}",
          uint64_t(rl.rlim_cur), uint64_t(rl.rlim_max), std::strerror(errno));
    }
  }
  *note = rl.rlim_cur != before
              ? fmt::format("file descriptors: soft limit {} (raised from {})",
                            uint64_t(rl.rlim_cur), uint64_t(before))
              : fmt::format(
                    "file descriptors: soft limit {} (the hard limit is {})",
                    uint64_t(rl.rlim_cur), uint64_t(rl.rlim_max));
  return uint64_t(rl.rlim_cur);
}

// Descriptors open now (those inherited included); 3 if /proc is absent.
uint64_t OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 3;
  uint64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n > 0 ? n - 1 : 0;  // not the directory's own descriptor
}

}  // namespace

int main(int argc, char** argv) {
  using tokenmeter::daemon::Config;
  using tokenmeter::daemon::Daemon;
  using tokenmeter::daemon::Status;

  // Peers that go away must not kill the daemon; writes report EPIPE.
  std::signal(SIGPIPE, SIG_IGN);

  Config config;
  Status s = tokenmeter::daemon::ParseConfig(argc, argv, &config);
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeterd: %s\n", s.message().c_str());
    return 2;
  }
  if (config.show_help) {
    std::fwrite(tokenmeter::daemon::UsageText().data(), 1,
                tokenmeter::daemon::UsageText().size(), stdout);
    return 0;
  }
  if (config.show_version) {
    std::printf("tokenmeterd %s\n", TOKENMETER_VERSION);
    return 0;
  }
  s = tokenmeter::daemon::SetUpLogging(config.log_level);
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeterd: --log-level: %s\n", s.message().c_str());
    return 2;
  }
  if (config.ready_fd >= 0) {
    s = tokenmeter::daemon::CheckReadyFd(config.ready_fd);
    if (!s.ok()) {
      std::fprintf(stderr, "tokenmeterd: %s\n", s.message().c_str());
      return 2;
    }
  }
  std::string fd_note, clamped;
  if (const uint64_t fd_limit = RaiseFdLimit(&fd_note); fd_limit > 0) {
    s = tokenmeter::daemon::FitConnectionCaps(fd_limit, OpenFds(), &config,
                                              &clamped);
    if (!s.ok()) {
      std::fprintf(stderr, "tokenmeterd: %s\n", s.message().c_str());
      return 1;
    }
  }
  s = Daemon::CheckOtlpSettings(config);
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeterd: %s\n", s.message().c_str());
    return 2;
  }
  std::unique_ptr<Daemon> daemon;
  s = Daemon::Create(config, &daemon);
  if (s.ok()) s = daemon->Start();
  if (s.ok()) {
    // Started: what was found about the descriptors (before the ready
    // line, which a supervisor may act on at once).
    if (!fd_note.empty()) spdlog::info("{}", fd_note);
    if (!clamped.empty()) spdlog::warn("{}", clamped);
  }
  if (s.ok() && config.ready_fd >= 0) {
    s = tokenmeter::daemon::WriteReadyLine(
        config.ready_fd, daemon->http_address(), daemon->ingest_address());
  }
  if (s.ok()) return daemon->Run();
  std::fprintf(stderr, "tokenmeterd: %s\n", s.message().c_str());
  return 1;
}
