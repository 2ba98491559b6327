// Daemon as main() builds it: a Config parsed from flags (--ingest in a temp
// dir, --listen 127.0.0.1:0), Create, Start, Run on a thread of its own; a
// raw engine client on the ingest socket, /metrics scraped over real TCP,
// then SIGTERM (what systemd sends) stops it. Only the public Daemon API and
// the exposition text are used.
#include "daemon/daemon.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "daemon/config.h"
#include "testutil/frames.h"
#include "testutil/poll.h"
#include "testutil/socket.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon {
namespace {

using testutil::PollUntil;
using testutil::TestSocket;

uint64_t MonotonicNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// GET /metrics with Connection: close; the whole response, or "" when the
// request failed.
std::string Scrape(uint16_t port) {
  TestSocket s(AF_INET);
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
  std::string response;
  if (!s.ConnectLoopback(port) || !s.SendAll(request) ||
      !s.ReadToEof(&response)) {
    return "";
  }
  return response;
}

// Open descriptors that are epoll instances: a libuv loop owns one from
// uv_loop_init() until a uv_loop_close() that succeeds (one that finds a
// handle still open returns UV_EBUSY and keeps it).
int OpenEpollFds() {
  int count = 0;
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const auto target = std::filesystem::read_symlink(entry.path(), link_ec);
    if (!link_ec && target == "anon_inode:[eventpoll]") ++count;
  }
  return count;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    // Hermetic: no sockets from a socket unit, no systemd notifications.
    for (const char* name :
         {"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "NOTIFY_SOCKET",
          "WATCHDOG_USEC", "WATCHDOG_PID"}) {
      unsetenv(name);
    }
  }

  testutil::TempDir dir_;
  const std::string ingest_path_ = dir_.File("ingest.sock");
};

TEST_F(DaemonTest, ServesMetricsOverTcpAndStopsCleanlyOnSigterm) {
  const int epoll_fds_before = OpenEpollFds();
  const char* argv[] = {"tokenmeterd",
                        "--ingest",
                        ingest_path_.c_str(),
                        "--listen",
                        "127.0.0.1:0",
                        "--log-interval",
                        "0"};
  Config config;
  Status s = ParseConfig(int(std::size(argv)), argv, &config);
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<Daemon> daemon;
  s = Daemon::Create(config, &daemon);
  ASSERT_TRUE(s.ok()) << s.message();
  s = daemon->Start();
  ASSERT_TRUE(s.ok()) << s.message();
  const uint16_t port = daemon->http_port();
  ASSERT_NE(port, 0);

  std::atomic<bool> returned{false};
  std::atomic<int> run_rc{-1};
  std::thread loop([&] {
    run_rc = daemon->Run();  // 0 only when uv_loop_close() returned 0
    returned = true;
  });

  TestSocket engine(AF_UNIX);
  ASSERT_TRUE(engine.ConnectUnix(ingest_path_));
  // t is now: the daemon skips events more than 1 s ahead of its clock or
  // 1 h behind it.
  const testutil::Bytes frames =
      testutil::Cat({testutil::VllmHello(),
                     testutil::TokensBatch(0, MonotonicNowNs(), 7, 3)});
  ASSERT_TRUE(engine.SendAll(frames));

  const std::string series =
      "\nvllm:generation_tokens_total{model_name=\"m\",engine=\"0\"} 3\n";
  std::string response;
  EXPECT_TRUE(PollUntil([&] {
    response = Scrape(port);
    return response.find(series) != std::string::npos;
  })) << response;
  EXPECT_EQ(response.rfind("HTTP/1.1 200 ", 0), 0u) << response;
  EXPECT_NE(response.find("\r\nContent-Type: text/plain; version=0.0.4; "
                          "charset=utf-8\r\n"),
            std::string::npos)
      << response;
  EXPECT_NE(response.find("\ntokenmeter_ingest_connections 1\n"),
            std::string::npos);

  // The daemon's own SIGTERM handler (libuv's, on its loop) takes it.
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  if (!PollUntil([&] { return returned.load(); })) {
    ADD_FAILURE() << "Run() did not return after SIGTERM";
    std::abort();  // the loop thread cannot be joined
  }
  loop.join();
  EXPECT_EQ(run_rc.load(), 0) << "uv_loop_close() found handles still open";
  // Run() returned: every listener and connection is closed.
  std::string after;
  EXPECT_TRUE(engine.ReadToEof(&after));
  struct stat st {};
  EXPECT_NE(lstat(ingest_path_.c_str(), &st), 0) << "ingest socket left";
  EXPECT_EQ(Scrape(port), "") << "the HTTP port still answers";

  // ~Daemon() closes its loop; had a handle been left open, uv_loop_close()
  // would fail with UV_EBUSY and the loop's epoll descriptor would stay.
  daemon.reset();
  EXPECT_EQ(OpenEpollFds(), epoll_fds_before);
}

}  // namespace
}  // namespace tokenmeter::daemon
