// IngestServer on a real libuv loop and a real Unix socket in a temp dir.
// The test thread is the loop thread: it steps the loop with
// uv_run(UV_RUN_NOWAIT) while it polls, so reading the registry needs no
// lock. Clients are raw sockets writing bytes by hand from docs/protocol.md
// (as in frame_decoder_test.cpp); what the server did is read back from the
// rendered exposition text only. Every test ends with the server closed, the
// loop run to completion and uv_loop_close() == 0.
#include "daemon/ingest/ingest_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/exposition/exposition.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/pipeline/pipeline.h"
#include "spdlog/spdlog.h"
#include "testutil/frames.h"
#include "testutil/log_capture.h"
#include "testutil/poll.h"
#include "testutil/socket.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon {
namespace {

using testutil::Bytes;
using testutil::Cat;
using testutil::PollUntil;
using testutil::TestSocket;
using testutil::TokensBatch;

// The tracker's clock, and the events' timestamps: the daemon skips events
// more than 1 s ahead of its clock or 1 h behind it.
constexpr uint64_t kNowNs = 5'000'000'000'000;

// Wall time for lora_requests_info.
constexpr double kUnixNowS = 1'764'633'600.25;

class FixedClock : public Clock {
 public:
  uint64_t NowNs() const override { return kNowNs; }
  double UnixNowS() const override { return kUnixNowS; }
};

class IngestServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    loop_initialized_ = true;
    Status s = Pipeline::Create(&loop_, clock_,
                                {registry_options_, TrackerOptions(), options_},
                                &pipeline_);
    ASSERT_TRUE(s.ok()) << s.message();
    registry_ = &pipeline_->registry();
    stats_ = &pipeline_->stats();
    tracker_ = &pipeline_->tracker();
    server_ = &pipeline_->server();
    s = server_->Listen(path_);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  void TearDown() override {
    if (server_ != nullptr && !closed_) CloseServer();
    pipeline_.reset();
    if (loop_initialized_) {
      EXPECT_EQ(uv_loop_close(&loop_), 0);
    }
  }

  // Close(), then the loop runs until nothing is left on it (uv_run()
  // returns 0: no active handle or request).
  void CloseServer() {
    closed_ = true;
    bool done = false;
    server_->Close([&done] { done = true; });
    EXPECT_TRUE(
        PollUntil([&] { return uv_run(&loop_, UV_RUN_NOWAIT) == 0 && done; }));
  }

  // Steps the loop until `cond` holds.
  ::testing::AssertionResult RunUntil(const std::function<bool()>& cond) {
    return PollUntil([&] {
      uv_run(&loop_, UV_RUN_NOWAIT);
      return cond();
    });
  }

  std::string Exposition() const {
    std::string out;
    Render(*registry_, ExpositionFormat::kText004, out);
    return out;
  }

  // True when the exposition has the line `series value`.
  bool Shows(const std::string& series, const std::string& value) const {
    return ("\n" + Exposition()).find("\n" + series + " " + value + "\n") !=
           std::string::npos;
  }

  IngestOptions options_;
  RegistryOptions registry_options_;
  testutil::TempDir dir_;
  const std::string path_ = dir_.File("ingest.sock");
  uv_loop_t loop_{};
  bool loop_initialized_ = false;
  FixedClock clock_;
  std::unique_ptr<Pipeline> pipeline_;
  Registry* registry_ = nullptr;
  IngestStats* stats_ = nullptr;
  Tracker* tracker_ = nullptr;
  IngestServer* server_ = nullptr;
  bool closed_ = false;
};

constexpr char kGenerationTokens[] =
    "vllm:generation_tokens_total{model_name=\"m\",engine=\"0\"}";
constexpr char kConnections[] = "tokenmeter_ingest_connections";
constexpr char kFrames[] = "tokenmeter_ingest_frames_total";
constexpr char kTokensEvents[] =
    "tokenmeter_ingest_events_total{kind=\"tokens\"}";
constexpr char kInvalidMsgpackErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"invalid_msgpack\"}";

TEST_F(IngestServerTest, AppliesHelloAndBatchFromARawClient) {
  TestSocket client(AF_UNIX);
  ASSERT_TRUE(client.ConnectUnix(path_));
  ASSERT_TRUE(client.SendAll(
      Cat({testutil::VllmHello(), TokensBatch(0, kNowNs, 7, 3)})));
  ASSERT_TRUE(RunUntil([&] { return Shows(kGenerationTokens, "3"); }))
      << Exposition();
  EXPECT_TRUE(Shows(kFrames, "2"));
  EXPECT_TRUE(Shows(kTokensEvents, "1"));
  EXPECT_TRUE(Shows(kConnections, "1"));
  EXPECT_EQ(server_->connections(), 1u);
  EXPECT_FALSE(client.SawEof());
}

TEST_F(IngestServerTest, BadFrameClosesOnlyThatConnectionAndIsCounted) {
  TestSocket good(AF_UNIX);
  TestSocket bad(AF_UNIX);
  ASSERT_TRUE(good.ConnectUnix(path_));
  ASSERT_TRUE(bad.ConnectUnix(path_));
  ASSERT_TRUE(good.SendAll(testutil::VllmHello()));
  ASSERT_TRUE(
      bad.SendAll(Cat({testutil::VllmHello(), testutil::InvalidMsgpack()})));
  ASSERT_TRUE(RunUntil([&] { return bad.SawEof(); }));
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 1; }));
  EXPECT_TRUE(Shows(kInvalidMsgpackErrors, "1")) << Exposition();
  EXPECT_TRUE(Shows(kConnections, "1"));
  // The other connection still works.
  ASSERT_TRUE(good.SendAll(TokensBatch(0, kNowNs, 7, 5)));
  ASSERT_TRUE(RunUntil([&] { return Shows(kGenerationTokens, "5"); }))
      << Exposition();
  EXPECT_FALSE(good.SawEof());
}

TEST_F(IngestServerTest, CloseAppliesWhatWasSentThenEndsEveryConnection) {
  TestSocket client(AF_UNIX);
  ASSERT_TRUE(client.ConnectUnix(path_));
  ASSERT_TRUE(client.SendAll(testutil::VllmHello()));
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 1; }));
  // Sent, but not yet read by the loop when Close() starts.
  ASSERT_TRUE(client.SendAll(TokensBatch(0, kNowNs, 7, 4)));
  CloseServer();
  EXPECT_TRUE(Shows(kGenerationTokens, "4")) << Exposition();
  EXPECT_TRUE(Shows(kConnections, "0"));
  EXPECT_EQ(server_->connections(), 0u);
  EXPECT_TRUE(client.SawEof());
  struct stat st {};
  EXPECT_NE(lstat(path_.c_str(), &st), 0) << path_ << " was not unlinked";
  // TearDown checks uv_loop_close().
}

// [0, {"proto": 1, "engine": "vllm", "model": "m", "scope": <scope>}]
Bytes ScopedHello(char scope) {
  Bytes b = {0x92, 0x00, 0x84, 0xa5, 'p', 'r', 'o', 't',  'o',  0x01,
             0xa6, 'e',  'n',  'g',  'i', 'n', 'e', 0xa4, 'v',  'l',
             'l',  'm',  0xa5, 'm',  'o', 'd', 'e', 'l',  0xa1, 'm',
             0xa5, 's',  'c',  'o',  'p', 'e', 0xa1};
  b.push_back(uint8_t(scope));
  return b;
}

class SharedSpaceCapTest : public IngestServerTest {
 protected:
  SharedSpaceCapTest() { options_.max_shared_spaces = 2; }
};

constexpr char kSeriesLimitErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"series_limit\"}";

// Scopes are client input: at most max_shared_spaces are kept. A new one
// past the cap takes the place of a scope no open connection uses; with
// none, its HELLO is refused (series_limit) and only that peer is closed.
TEST_F(SharedSpaceCapTest, ScopesAreCappedAndUnusedOnesMakeRoom) {
  TestSocket a(AF_UNIX), c(AF_UNIX), a2(AF_UNIX);
  auto b = std::make_unique<TestSocket>(AF_UNIX);
  for (TestSocket* s : {&a, b.get(), &c, &a2}) {
    ASSERT_TRUE(s->ConnectUnix(path_));
  }
  ASSERT_TRUE(a.SendAll(ScopedHello('A')));
  ASSERT_TRUE(b->SendAll(ScopedHello('B')));
  ASSERT_TRUE(RunUntil([&] { return Shows(kFrames, "2"); })) << Exposition();
  ASSERT_TRUE(c.SendAll(ScopedHello('C')));
  ASSERT_TRUE(RunUntil([&] { return Shows(kSeriesLimitErrors, "1"); }))
      << Exposition();
  EXPECT_TRUE(RunUntil([&] { return c.SawEof(); }));
  // (A refused HELLO is still a frame accepted.) A known scope is joined,
  // not counted against the cap.
  ASSERT_TRUE(a2.SendAll(ScopedHello('A')));
  ASSERT_TRUE(RunUntil([&] { return Shows(kFrames, "4"); })) << Exposition();
  EXPECT_TRUE(Shows(kSeriesLimitErrors, "1"));
  // Once B's only connection is gone, a new scope takes its place.
  b.reset();
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 2; }));
  TestSocket d(AF_UNIX);
  ASSERT_TRUE(d.ConnectUnix(path_));
  ASSERT_TRUE(d.SendAll(ScopedHello('C')));
  ASSERT_TRUE(RunUntil([&] { return Shows(kFrames, "5"); })) << Exposition();
  EXPECT_TRUE(Shows(kSeriesLimitErrors, "1"));
  EXPECT_FALSE(d.SawEof());
}

using testutil::LogCapture;

constexpr char kHelloTimeoutErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"hello_timeout\"}";
constexpr char kUidLimitErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"uid_connection_limit\"}";
constexpr char kFdLimitErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"fd_limit\"}";

class HelloTimeoutTest : public IngestServerTest {
 protected:
  HelloTimeoutTest() { options_.hello_timeout_ns = 200'000'000; }  // 200 ms
};

// A connection that never completes a HELLO (silent, or half of one) is
// closed after the timeout and counted; the warning is logged once per
// burst; a connection that sent HELLO stays; one accepted later gets its
// own deadline.
TEST_F(HelloTimeoutTest, ClosesConnectionsWithoutHelloAndCountsThem) {
  LogCapture log;
  TestSocket silent(AF_UNIX), half(AF_UNIX), good(AF_UNIX);
  for (TestSocket* s : {&silent, &half, &good}) {
    ASSERT_TRUE(s->ConnectUnix(path_));
  }
  const Bytes hello = testutil::VllmHello();
  ASSERT_TRUE(half.SendAll(Bytes(hello.begin(), hello.begin() + 5)));
  ASSERT_TRUE(good.SendAll(hello));
  ASSERT_TRUE(RunUntil([&] { return silent.SawEof() && half.SawEof(); }));
  EXPECT_TRUE(Shows(kHelloTimeoutErrors, "2")) << Exposition();
  EXPECT_EQ(log.Count("closing the connection: hello_timeout"), 1u);
  ASSERT_TRUE(good.SendAll(TokensBatch(0, kNowNs, 7, 3)));
  ASSERT_TRUE(RunUntil([&] { return Shows(kGenerationTokens, "3"); }))
      << Exposition();
  EXPECT_FALSE(good.SawEof());
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 1; }));

  TestSocket late(AF_UNIX);
  ASSERT_TRUE(late.ConnectUnix(path_));
  ASSERT_TRUE(RunUntil([&] { return late.SawEof(); }));
  EXPECT_TRUE(Shows(kHelloTimeoutErrors, "3")) << Exposition();
  // No HELLO came in between: still the same burst.
  EXPECT_EQ(log.Count("closing the connection: hello_timeout"), 1u);
  EXPECT_FALSE(good.SawEof());
}

class PerUidCapTest : public IngestServerTest {
 protected:
  PerUidCapTest() { options_.max_connections_per_uid = 2; }
};

// Every test socket has this process's uid: past two open, a new one is
// closed at accept and counted (logged once per burst); a place freed is
// taken again; refused ones do not count against the total.
TEST_F(PerUidCapTest, RefusesConnectionsPastTheCapOfOneUid) {
  LogCapture log;
  TestSocket a(AF_UNIX);
  auto b = std::make_unique<TestSocket>(AF_UNIX);
  ASSERT_TRUE(a.ConnectUnix(path_));
  ASSERT_TRUE(b->ConnectUnix(path_));
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 2; }));
  TestSocket c(AF_UNIX), d(AF_UNIX);
  ASSERT_TRUE(c.ConnectUnix(path_));
  ASSERT_TRUE(d.ConnectUnix(path_));
  ASSERT_TRUE(RunUntil([&] { return c.SawEof() && d.SawEof(); }));
  EXPECT_TRUE(Shows(kUidLimitErrors, "2")) << Exposition();
  EXPECT_EQ(log.Count("closing the connection: uid_connection_limit (2 "
                      "connections of uid " +
                      std::to_string(getuid())),
            1u);
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 2; }));
  ASSERT_TRUE(
      a.SendAll(Cat({testutil::VllmHello(), TokensBatch(0, kNowNs, 7, 3)})));
  ASSERT_TRUE(RunUntil([&] { return Shows(kGenerationTokens, "3"); }))
      << Exposition();

  b.reset();
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 1; }));
  TestSocket e(AF_UNIX);
  ASSERT_TRUE(e.ConnectUnix(path_));
  ASSERT_TRUE(e.SendAll(testutil::VllmHello()));
  ASSERT_TRUE(RunUntil([&] { return Shows(kFrames, "3"); })) << Exposition();
  EXPECT_FALSE(e.SawEof());
  EXPECT_TRUE(Shows(kUidLimitErrors, "2"));
  EXPECT_EQ(server_->connections(), 2u);
}

// Fills this process's descriptor table: lowers the soft RLIMIT_NOFILE to
// a little above the highest open descriptor and takes every free one
// (/dev/null); gives them back and restores the limit when destroyed.
class FullFdTable {
 public:
  FullFdTable() {
    if (getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    int highest = 2;
    if (DIR* dir = opendir("/proc/self/fd")) {
      while (const dirent* e = readdir(dir)) {
        highest = std::max(highest, std::atoi(e->d_name));
      }
      closedir(dir);
    }
    rlimit low = saved_;
    low.rlim_cur = rlim_t(highest) + 16;
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return;
    lowered_ = true;
    for (;;) {
      const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        full_ = errno == EMFILE;
        break;
      }
      fds_.push_back(fd);
    }
  }
  FullFdTable(const FullFdTable&) = delete;
  FullFdTable& operator=(const FullFdTable&) = delete;
  ~FullFdTable() {
    for (int fd : fds_) close(fd);
    if (lowered_) setrlimit(RLIMIT_NOFILE, &saved_);
  }
  bool full() const { return full_; }

 private:
  rlimit saved_{};
  bool lowered_ = false;
  bool full_ = false;
  std::vector<int> fds_;
};

// accept() fails with EMFILE: each pending connection is still taken off
// the queue (accepted on the spare descriptor and closed at once, so the
// peer sees EOF rather than waiting), counted as fd_limit and logged once;
// once descriptors are free again, connections are served as before.
TEST_F(IngestServerTest, OutOfDescriptorsClosesPendingConnectionsAndRecovers) {
  LogCapture log;
  TestSocket a(AF_UNIX), b(AF_UNIX), c(AF_UNIX);
  for (TestSocket* s : {&a, &b, &c}) ASSERT_TRUE(s->ConnectUnix(path_));
  {
    FullFdTable full;
    ASSERT_TRUE(full.full());
    ASSERT_TRUE(
        RunUntil([&] { return a.SawEof() && b.SawEof() && c.SawEof(); }));
    EXPECT_TRUE(Shows(kFdLimitErrors, "3")) << Exposition();
    EXPECT_EQ(server_->connections(), 0u);
  }
  EXPECT_EQ(log.Count("closing the connection: fd_limit (accept: Too many "
                      "open files"),
            1u);
  TestSocket d(AF_UNIX);
  ASSERT_TRUE(d.ConnectUnix(path_));
  ASSERT_TRUE(
      d.SendAll(Cat({testutil::VllmHello(), TokensBatch(0, kNowNs, 7, 4)})));
  ASSERT_TRUE(RunUntil([&] { return Shows(kGenerationTokens, "4"); }))
      << Exposition();
  EXPECT_FALSE(d.SawEof());
  EXPECT_TRUE(Shows(kFdLimitErrors, "3"));
}

// ---- protocol 1.1 HELLO: profiles, cache_config, max_lora, label clashes
// -------------------------------

// A HELLO [0, {"proto": 1, "engine": <engine>, "model": "m", extra...}]
// whose meta map has 3 + `extra_entries` entries.
Bytes HelloOf(const Bytes& engine, uint8_t extra_entries, const Bytes& extra) {
  return Cat({{0x92, 0x00, uint8_t(0x83 + extra_entries), 0xa5, 'p', 'r', 'o',
               't', 'o', 0x01, 0xa6, 'e', 'n', 'g', 'i', 'n', 'e'},
              engine,
              {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'm'},
              extra});
}

const Bytes kVllmEngine = {0xa4, 'v', 'l', 'l', 'm'};
const Bytes kSglangEngine = {0xa6, 's', 'g', 'l', 'a', 'n', 'g'};
const Bytes kProfileVllm = {0xa7, 'p',  'r', 'o', 'f', 'i', 'l',
                            'e',  0xa4, 'v', 'l', 'l', 'm'};
// "cache_config": {"block_size": 16}
const Bytes kCacheConfigBlockSize = {
    0xac, 'c',  'a', 'c', 'h', 'e', '_', 'c', 'o', 'n', 'f', 'i', 'g',
    0x81, 0xaa, 'b', 'l', 'o', 'c', 'k', '_', 's', 'i', 'z', 'e', 0x10};

constexpr char kBadHelloErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"bad_hello\"}";
constexpr char kReservedLabelErrors[] =
    "tokenmeter_ingest_errors_total{reason=\"reserved_label\"}";

TEST_F(IngestServerTest, KeepsCacheConfigAndMaxLoraOnTheSeries) {
  TestSocket client(AF_UNIX);
  ASSERT_TRUE(client.ConnectUnix(path_));
  // + "max_lora": 4
  ASSERT_TRUE(client.SendAll(
      HelloOf(kVllmEngine, 2,
              Cat({kCacheConfigBlockSize,
                   {0xa8, 'm', 'a', 'x', '_', 'l', 'o', 'r', 'a', 0x04}}))));
  const std::string l = "{model_name=\"m\",engine=\"0\"";
  ASSERT_TRUE(RunUntil([&] {
    return Shows("vllm:cache_config_info" + l + ",block_size=\"16\"}", "1");
  })) << Exposition();
  EXPECT_TRUE(Shows("vllm:lora_requests_info" + l +
                        ",max_lora=\"4\",running_lora_adapters=\"\","
                        "waiting_lora_adapters=\"\"}",
                    "1764633600.25"))
      << Exposition();
  EXPECT_FALSE(client.SawEof());
}

class RequestLabelClashTest : public IngestServerTest {
 protected:
  RequestLabelClashTest() { registry_options_.request_labels = {"tenant"}; }
};

// A HELLO label the daemon would set on the same series again (a
// --request-label, or a cache_config key of the same HELLO) is refused:
// reserved_label, that connection closed, the others unaffected.
TEST_F(RequestLabelClashTest, HelloLabelClashIsRefusedAsReservedLabel) {
  LogCapture log;
  TestSocket good(AF_UNIX), tenant(AF_UNIX), block_size(AF_UNIX);
  for (TestSocket* s : {&good, &tenant, &block_size}) {
    ASSERT_TRUE(s->ConnectUnix(path_));
  }
  ASSERT_TRUE(good.SendAll(testutil::VllmHello()));
  // "labels": {"tenant": "x"}
  ASSERT_TRUE(
      tenant.SendAll(HelloOf(kVllmEngine, 1,
                             {0xa6, 'l', 'a', 'b', 'e', 'l', 's', 0x81, 0xa6,
                              't', 'e', 'n', 'a', 'n', 't', 0xa1, 'x'})));
  ASSERT_TRUE(RunUntil([&] { return tenant.SawEof(); }));
  EXPECT_TRUE(Shows(kReservedLabelErrors, "1")) << Exposition();
  // "labels": {"block_size": "16"}, "cache_config": {"block_size": 16}
  ASSERT_TRUE(block_size.SendAll(
      HelloOf(kVllmEngine, 2,
              Cat({{0xa6, 'l', 'a', 'b', 'e', 'l', 's', 0x81, 0xaa, 'b', 'l',
                    'o',  'c', 'k', '_', 's', 'i', 'z', 'e',  0xa2, '1', '6'},
                   kCacheConfigBlockSize}))));
  ASSERT_TRUE(RunUntil([&] { return block_size.SawEof(); }));
  EXPECT_TRUE(Shows(kReservedLabelErrors, "2")) << Exposition();
  EXPECT_EQ(log.Count("closing the connection: reserved_label (HELLO label "
                      "\"tenant\""),
            1u);
  EXPECT_EQ(log.Count("closing the connection: reserved_label (HELLO label "
                      "\"block_size\""),
            1u);
  // No series was made for them.
  EXPECT_EQ(registry_->series_count(), 1u);
  ASSERT_TRUE(good.SendAll(TokensBatch(0, kNowNs, 7, 3)));
  ASSERT_TRUE(RunUntil([&] {
    return Shows(
        "vllm:generation_tokens_total{model_name=\"m\",engine="
        "\"0\",tenant=\"\"}",
        "3");
  })) << Exposition();
  EXPECT_FALSE(good.SawEof());
}

// HELLO engine "sglang" is the sglang profile (auto); one that asks for the
// vllm profile would put vllm names in the same namespace: refused as
// bad_hello, that connection closed, the first one unaffected.
TEST_F(IngestServerTest, NamespaceOfAnotherProfileIsRefusedAsBadHello) {
  LogCapture log;
  TestSocket sglang(AF_UNIX), vllm(AF_UNIX);
  ASSERT_TRUE(sglang.ConnectUnix(path_));
  ASSERT_TRUE(vllm.ConnectUnix(path_));
  ASSERT_TRUE(sglang.SendAll(HelloOf(kSglangEngine, 0, {})));
  ASSERT_TRUE(RunUntil([&] { return registry_->series_count() == 1; }));
  ASSERT_TRUE(vllm.SendAll(HelloOf(kSglangEngine, 1, kProfileVllm)));
  ASSERT_TRUE(RunUntil([&] { return vllm.SawEof(); }));
  EXPECT_TRUE(Shows(kBadHelloErrors, "1")) << Exposition();
  EXPECT_TRUE(Shows(kSeriesLimitErrors, "0"));
  EXPECT_EQ(log.Count("closing the connection: bad_hello (profile vllm in "
                      "namespace \"sglang\""),
            1u);
  EXPECT_EQ(registry_->series_count(), 1u);
  ASSERT_TRUE(RunUntil([&] { return server_->connections() == 1; }));
  ASSERT_TRUE(sglang.SendAll(TokensBatch(0, kNowNs, 7, 3)));
  ASSERT_TRUE(RunUntil([&] { return Shows(kTokensEvents, "1"); }))
      << Exposition();
  EXPECT_TRUE(
      Shows("sglang:num_running_reqs{model_name=\"m\",engine=\"0\"}", "1"));
  EXPECT_FALSE(sglang.SawEof());
}

class NamespaceFlagTest : public IngestServerTest {
 protected:
  NamespaceFlagTest() {
    options_.namespace_override = "fleet";
    options_.profile = Profile::kLmdeploy;
  }
};

// --profile names the profile of HELLOs without one; with --namespace
// every series shares one namespace, so a HELLO of another profile is
// refused.
TEST_F(NamespaceFlagTest, ProfileFlagAndOneNamespace) {
  TestSocket a(AF_UNIX), b(AF_UNIX);
  ASSERT_TRUE(a.ConnectUnix(path_));
  ASSERT_TRUE(b.ConnectUnix(path_));
  ASSERT_TRUE(
      a.SendAll(Cat({testutil::VllmHello(), TokensBatch(0, kNowNs, 7, 3)})));
  ASSERT_TRUE(RunUntil([&] {
    return Shows(
        "fleet:generation_tokens_total{model_name=\"m\",engine="
        "\"0\"}",
        "3");
  })) << Exposition();
  EXPECT_NE(Exposition().find("# TYPE fleet:iter_token_latency histogram\n"),
            std::string::npos);
  ASSERT_TRUE(b.SendAll(HelloOf(kVllmEngine, 1, kProfileVllm)));
  ASSERT_TRUE(RunUntil([&] { return b.SawEof(); }));
  EXPECT_TRUE(Shows(kBadHelloErrors, "1")) << Exposition();
  EXPECT_FALSE(a.SawEof());
  // The series keeps the HELLO's engine (traces name it), not "fleet".
  const EngineSeries* s =
      registry_->GetOrCreate({"fleet", "m", "0", {}, Profile::kLmdeploy});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(registry_->series_count(), 1u);
  EXPECT_EQ(s->hello_engine(), "vllm");
}

}  // namespace
}  // namespace tokenmeter::daemon
