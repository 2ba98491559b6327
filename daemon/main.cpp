// tokenmeterd: see docs/operations.md.
#include <csignal>
#include <cstdio>
#include <memory>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/logging/log_setup.h"

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
  std::unique_ptr<Daemon> daemon;
  s = Daemon::Create(config, &daemon);
  if (s.ok()) s = daemon->Start();
  if (s.ok() && config.ready_fd >= 0) {
    s = tokenmeter::daemon::WriteReadyLine(
        config.ready_fd, daemon->http_address(), daemon->ingest_address());
  }
  if (s.ok()) return daemon->Run();
  std::fprintf(stderr, "tokenmeterd: %s\n", s.message().c_str());
  return 1;
}
