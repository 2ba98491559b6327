// The exporter on a real libuv loop (this thread) against real HTTP and
// HTTPS servers (test_server.h, threads of this process): what goes on the
// wire, retries and their delays, the queue bound, shutdown, TLS. Every
// test checks that the counts add up and ends with uv_loop_close() == 0.
#include "daemon/otlp/otlp_http_exporter.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <uv.h>
#include <zlib.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "test_server.h"
#include "testutil/log_capture.h"
#include "testutil/poll.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon::otlp {
namespace {

using std::chrono::milliseconds;
using testutil::ReceivedRequest;
using testutil::Reply;
using testutil::TestServer;
using Kind = testutil::Reply::Kind;
using SteadyClock = std::chrono::steady_clock;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kS = 1'000'000'000;

// A body with every byte value, NULs included.
std::string BinaryBody(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s += static_cast<char>((i * 7 + i / 256) % 256);
  return s;
}

std::string Gunzip(const std::string& in) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return "<inflateInit2 failed>";
  std::string out(in.size() * 20 + 1024, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_FINISH);
  out.resize(z.total_out);
  inflateEnd(&z);
  return rc == Z_STREAM_END ? out : "<not one whole gzip stream>";
}

// Protobuf ExportTraceServiceResponse{partial_success{rejected_spans: n,
// error_message: msg}} (n < 128, msg < 120 bytes).
std::string ProtobufPartialSuccess(int n, const std::string& msg) {
  std::string inner;
  inner += '\x08';
  inner += static_cast<char>(n);
  inner += '\x12';
  inner += static_cast<char>(msg.size());
  inner += msg;
  std::string body = "\x0a";
  body += static_cast<char>(inner.size());
  return body + inner;
}

struct Result {
  ExportResult::Kind kind;
  uint32_t items;
  uint32_t rejected;
  uint32_t attempts;
  long http_status;
  uint64_t elapsed_ns;
  std::string detail;
};

void ExpectBalanced(const OtlpExporterStats& s) {
  EXPECT_EQ(s.submitted_items, s.exported_items + s.dropped_items +
                                   s.failed_items + s.queued_items +
                                   s.in_flight_items)
      << "submitted " << s.submitted_items << " exported " << s.exported_items
      << " dropped " << s.dropped_items << " failed " << s.failed_items
      << " queued " << s.queued_items << " in flight " << s.in_flight_items;
}

class OtlpHttpExporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // As the daemon's main() does; the servers write to closed sockets.
    signal(SIGPIPE, SIG_IGN);
    // libcurl honours proxy variables; these tests talk to 127.0.0.1.
    for (const char* v : {"http_proxy", "https_proxy", "HTTPS_PROXY",
                          "ALL_PROXY", "all_proxy"}) {
      unsetenv(v);
    }
    ASSERT_EQ(uv_loop_init(&loop_), 0);
  }

  void TearDown() override {
    if (exporter_ != nullptr) ShutdownAndWait(0);
    if (ticker_started_) {
      uv_close(reinterpret_cast<uv_handle_t*>(&ticker_), nullptr);
      ticker_started_ = false;
    }
    uv_run(&loop_, UV_RUN_NOWAIT);
    servers_.clear();
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  TestServer* Serve(testutil::Script script,
                    std::optional<TestServer::Tls> tls = std::nullopt) {
    servers_.push_back(std::make_unique<TestServer>(std::move(script), tls));
    EXPECT_TRUE(servers_.back()->Start()) << servers_.back()->error();
    return servers_.back().get();
  }

  static OtlpConfig Config(const std::string& url) {
    OtlpConfig c;
    c.endpoint = url;
    c.endpoint_source = EndpointSource::kFlag;
    c.timeout_ns = 5 * kS;
    return c;
  }

  // Fast retries, so that tests take milliseconds.
  static OtlpExporterOptions Options() {
    OtlpExporterOptions o;
    o.retry.initial_backoff_ns = 10 * kMs;
    o.retry.max_backoff_ns = 40 * kMs;
    o.retry.max_elapsed_ns = 20 * kS;
    o.retry.max_attempts = 4;
    o.jitter_seed = 1;
    return o;
  }

  void Make(OtlpConfig config, OtlpExporterOptions options) {
    options.on_result = [this](const ExportResult& r) {
      results_.push_back({r.kind, r.items, r.rejected, r.attempts,
                          r.http_status, r.elapsed_ns, std::string(r.detail)});
      // Exact here: this runs on the loop thread.
      ExpectBalanced(exporter_->stats());
      if (then_) then_(r);
    };
    Status s = OtlpHttpExporter::Create(&loop_, std::move(config),
                                        std::move(options), &exporter_);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  // Steps the loop until `cond` holds.
  ::testing::AssertionResult RunUntil(
      const std::function<bool()>& cond,
      milliseconds timeout = milliseconds(10000)) {
    return testutil::PollUntil(
        [&] {
          uv_run(&loop_, UV_RUN_NOWAIT);
          return cond();
        },
        timeout);
  }

  OtlpExporterStats Stats() const { return exporter_->stats(); }

  static uint64_t NowNs() { return SystemClock().NowNs(); }

  // Shuts down with `deadline_ns` (0: now) and waits for done.
  void ShutdownAndWait(uint64_t deadline_ns) {
    bool done = false;
    exporter_->Shutdown(deadline_ns, [&done] { done = true; });
    EXPECT_FALSE(done) << "done ran inside Shutdown()";
    EXPECT_TRUE(RunUntil([&] { return done; }));
    ExpectBalanced(Stats());
    EXPECT_EQ(Stats().queued_items, 0u);
    EXPECT_EQ(Stats().in_flight_items, 0u);
    exporter_.reset();
  }

  // A 10 ms repeating timer on the loop that records the largest gap
  // between two of its callbacks: a blocked loop shows as a large gap.
  void StartTicker() {
    uv_timer_init(&loop_, &ticker_);
    ticker_.data = this;
    ticker_started_ = true;
    last_tick_ = SteadyClock::now();
    uv_timer_start(
        &ticker_,
        [](uv_timer_t* t) {
          auto* self = static_cast<OtlpHttpExporterTest*>(t->data);
          const auto now = SteadyClock::now();
          self->max_tick_gap_ =
              std::max(self->max_tick_gap_, now - self->last_tick_);
          self->last_tick_ = now;
          ++self->ticks_;
        },
        10, 10);
  }

  uv_loop_t loop_;
  std::unique_ptr<OtlpHttpExporter> exporter_;
  std::vector<Result> results_;
  // Also called from on_result, after the recording.
  std::function<void(const ExportResult&)> then_;
  std::vector<std::unique_ptr<TestServer>> servers_;
  uv_timer_t ticker_;
  bool ticker_started_ = false;
  SteadyClock::time_point last_tick_;
  SteadyClock::duration max_tick_gap_{0};
  int ticks_ = 0;
};

TEST_F(OtlpHttpExporterTest, PostsTheBodyAndHeadersExactly) {
  TestServer* server =
      Serve([](const ReceivedRequest&, int) { return Reply::Status(200); });
  OtlpConfig c = Config(server->Url("/v1/traces"));
  c.headers = {{"x-api-key", "s3cr3t"}, {"X-Tenant", "a b,c"}, {"x-empty", ""}};
  Make(c, Options());
  // Over 1 MiB: where libcurl would add "Expect: 100-continue" (and wait
  // for a 100 that many receivers never send).
  const std::string body = BinaryBody(1536 * 1024);
  ASSERT_TRUE(exporter_->Submit(body, 7));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 7; }));

  const std::vector<ReceivedRequest> got = server->requests();
  ASSERT_EQ(got.size(), 1u);
  const ReceivedRequest& r = got[0];
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.target, "/v1/traces");
  EXPECT_EQ(r.Header("content-type"), "application/x-protobuf");
  EXPECT_EQ(r.Header("content-length"), std::to_string(body.size()));
  EXPECT_EQ(r.Header("content-encoding"), std::nullopt);
  EXPECT_EQ(r.Header("expect"), std::nullopt);
  EXPECT_EQ(r.Header("user-agent"), "tokenmeterd");
  EXPECT_EQ(r.Header("x-api-key"), "s3cr3t");
  EXPECT_EQ(r.Header("x-tenant"), "a b,c");
  EXPECT_EQ(r.Header("x-empty"), "");
  EXPECT_EQ(r.body, body);

  const OtlpExporterStats s = Stats();
  EXPECT_EQ(s.submitted_items, 7u);
  EXPECT_EQ(s.requests_sent, 1u);
  EXPECT_EQ(s.retries, 0u);
  EXPECT_EQ(s.bytes_sent, body.size());
  EXPECT_EQ(s.responses_2xx, 1u);
  EXPECT_EQ(s.failed_items + s.dropped_items, 0u);
  ExpectBalanced(s);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].kind, ExportResult::Kind::kExported);
  EXPECT_EQ(results_[0].items, 7u);
  EXPECT_EQ(results_[0].attempts, 1u);
  EXPECT_EQ(results_[0].http_status, 200);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, JsonProtocolSendsJsonAndReusesTheConnection) {
  TestServer* server = Serve(
      [](const ReceivedRequest&, int) { return Reply::Status(200, "{}"); });
  OtlpConfig c = Config(server->Url("/v1/metrics"));
  c.protocol = Protocol::kHttpJson;
  Make(c, Options());
  ASSERT_TRUE(exporter_->Submit(R"({"resourceMetrics":[]})", 1));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 1; }));
  ASSERT_TRUE(exporter_->Submit(R"({"resourceMetrics":[1]})", 1));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 2; }));
  const auto got = server->requests();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].target, "/v1/metrics");
  EXPECT_EQ(got[0].Header("content-type"), "application/json");
  EXPECT_EQ(got[1].body, R"({"resourceMetrics":[1]})");
  EXPECT_EQ(server->connections(), 1) << "keep-alive connection not reused";
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, GzipBodyInflatesToTheOriginal) {
  TestServer* server =
      Serve([](const ReceivedRequest&, int) { return Reply::Status(200); });
  OtlpConfig c = Config(server->Url("/v1/traces"));
  c.compression = Compression::kGzip;
  Make(c, Options());
  std::string body;
  for (int i = 0; i < 500; ++i) body += "span " + std::to_string(i % 10) + ";";
  body += BinaryBody(100);
  ASSERT_TRUE(exporter_->Submit(body, 3));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 3; }));
  const auto got = server->requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].Header("content-encoding"), "gzip");
  EXPECT_EQ(got[0].Header("content-type"), "application/x-protobuf");
  EXPECT_LT(got[0].body.size(), body.size() / 4);
  EXPECT_EQ(Gunzip(got[0].body), body);
  EXPECT_EQ(Stats().bytes_sent, got[0].body.size());
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, RetriesAfter503HonouringRetryAfter) {
  TestServer* server = Serve([](const ReceivedRequest&, int index) {
    if (index > 0) return Reply::Status(200);
    Reply r = Reply::Status(503, "busy");
    r.headers = {{"Retry-After", "1"}};
    return r;
  });
  Make(Config(server->Url("/v1/traces")), Options());  // backoff 5-10 ms
  ASSERT_TRUE(exporter_->Submit("abc", 2));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 2; }));
  const auto got = server->requests();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].body, "abc");
  const auto gap =
      std::chrono::duration_cast<milliseconds>(got[1].at - got[0].at).count();
  EXPECT_GE(gap, 1000) << "Retry-After: 1 not honoured";
  EXPECT_LE(gap, 1500) << "retried much later than Retry-After said";
  const OtlpExporterStats s = Stats();
  EXPECT_EQ(s.requests_sent, 2u);
  EXPECT_EQ(s.retries, 1u);
  EXPECT_EQ(s.responses_error, 1u);
  EXPECT_EQ(s.responses_2xx, 1u);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].attempts, 2u);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, RetriesEachRetryableStatusWithBackoff) {
  const std::vector<int> statuses = {429, 502, 504, 200};
  TestServer* server = Serve([&](const ReceivedRequest&, int index) {
    return Reply::Status(statuses[static_cast<size_t>(index)]);
  });
  Make(Config(server->Url("/v1/traces")), Options());
  ASSERT_TRUE(exporter_->Submit("x", 1));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 1; }));
  const auto got = server->requests();
  ASSERT_EQ(got.size(), 4u);
  // Backoff 10, 20, 40 ms with jitter in [d/2, d].
  for (size_t i = 1; i < got.size(); ++i) {
    const auto gap =
        std::chrono::duration_cast<milliseconds>(got[i].at - got[i - 1].at);
    EXPECT_GE(gap.count(), 5 << (i - 1)) << "retry " << i;
  }
  EXPECT_EQ(Stats().retries, 3u);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, RetriesAfterConnectionReset) {
  TestServer* server = Serve([](const ReceivedRequest&, int index) {
    return index == 0 ? Reply::Of(Kind::kReset) : Reply::Status(200);
  });
  Make(Config(server->Url("/v1/traces")), Options());
  ASSERT_TRUE(exporter_->Submit("reset me", 5));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 5; }));
  EXPECT_EQ(server->request_count(), 2u);
  EXPECT_EQ(Stats().transport_errors, 1u);
  EXPECT_EQ(Stats().retries, 1u);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, RetriesARefusedConnectionThenFails) {
  // A port that was just free: nothing listens there.
  TestServer probe([](const ReceivedRequest&, int) { return Reply(); });
  ASSERT_TRUE(probe.Start());
  const std::string url = probe.Url("/v1/traces");
  probe.Stop();
  OtlpExporterOptions o = Options();
  o.retry.max_attempts = 3;
  Make(Config(url), o);
  ASSERT_TRUE(exporter_->Submit("x", 4));
  ASSERT_TRUE(RunUntil([&] { return Stats().failed_items == 4; }));
  EXPECT_EQ(Stats().requests_sent, 3u);
  EXPECT_EQ(Stats().transport_errors, 3u);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].kind, ExportResult::Kind::kFailed);
  EXPECT_EQ(results_[0].detail.rfind("gave up after 3 attempts: ", 0), 0u)
      << results_[0].detail;
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest,
       SilentServerTimesOutRetriesAndFailsLoopNotBlocked) {
  TestServer* server = Serve(
      [](const ReceivedRequest&, int) { return Reply::Of(Kind::kStall); });
  OtlpConfig c = Config(server->Url("/v1/traces"));
  c.timeout_ns = 200 * kMs;
  OtlpExporterOptions o = Options();
  o.retry.max_attempts = 3;
  Make(c, o);
  StartTicker();
  const auto start = SteadyClock::now();
  ASSERT_TRUE(exporter_->Submit("x", 9));
  ASSERT_TRUE(RunUntil([&] { return Stats().failed_items == 9; }));
  const auto took =
      std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start);
  EXPECT_GE(took.count(), 3 * 200);
  EXPECT_LT(took.count(), 3000);
  EXPECT_EQ(server->request_count(), 3u);
  EXPECT_EQ(Stats().transport_errors, 3u);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_NE(results_[0].detail.find("imed out"), std::string::npos)
      << results_[0].detail;
  // The loop kept running meanwhile.
  EXPECT_GE(ticks_, took.count() / 10 / 2);
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(max_tick_gap_).count(),
            100);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, QueueBoundHoldsWhileTheServerStalls) {
  TestServer* server = Serve(
      [](const ReceivedRequest&, int) { return Reply::Of(Kind::kStall); });
  OtlpExporterOptions o = Options();
  o.max_queue_items = 100;
  Make(Config(server->Url("/v1/traces")), o);
  const std::string body(1024, 'b');
  int accepted = 0;
  for (int i = 0; i < 50; ++i) {
    accepted += exporter_->Submit(body, 10) ? 1 : 0;
    uv_run(&loop_, UV_RUN_NOWAIT);
    const OtlpExporterStats s = Stats();
    ASSERT_LE(s.queued_items, 100u);
    ASSERT_LE(s.queued_bytes, 10u * body.size());
    ExpectBalanced(s);
  }
  // One body in flight, ten queued (100 items), the rest dropped.
  EXPECT_EQ(accepted, 11);
  OtlpExporterStats s = Stats();
  EXPECT_EQ(s.in_flight_items, 10u);
  EXPECT_EQ(s.queued_items, 100u);
  EXPECT_EQ(s.queued_bytes, 10u * body.size());
  EXPECT_EQ(s.dropped_items, 390u);
  // Behind queued bodies, a body larger than the whole bound never fits.
  EXPECT_FALSE(exporter_->Submit("big", 101));
  EXPECT_EQ(Stats().dropped_items, 491u);
  ASSERT_TRUE(RunUntil([&] { return server->request_count() == 1; }));

  const uint64_t t0 = NowNs();
  ShutdownAndWait(t0 + 200 * kMs);
  EXPECT_GE(NowNs() - t0, 200 * kMs);
  // exporter_ is gone; the last results tell the end.
  EXPECT_EQ(server->request_count(), 1u);
  uint64_t failed = 0;
  for (const Result& r : results_) {
    EXPECT_EQ(r.kind, ExportResult::Kind::kFailed);
    EXPECT_EQ(r.detail, "shutdown deadline");
    failed += r.items;
  }
  EXPECT_EQ(failed, 110u);
}

// A body larger than the bound (a metrics push of more data points than
// --otlp-queue-spans) goes into an empty queue, not dropped every time;
// behind it, the bound holds.
TEST_F(OtlpHttpExporterTest, AnEmptyQueueTakesABodyLargerThanTheBound) {
  TestServer* server = Serve(
      [](const ReceivedRequest&, int) { return Reply::Of(Kind::kStall); });
  OtlpExporterOptions o = Options();
  o.max_queue_items = 100;
  Make(Config(server->Url("/v1/metrics")), o);
  // Straight out of the queue into the free slot.
  EXPECT_TRUE(exporter_->Submit("first", 250));
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(Stats().in_flight_items, 250u);
  EXPECT_EQ(Stats().queued_items, 0u);
  // The slot is busy: this one waits in the empty queue, past the bound.
  EXPECT_TRUE(exporter_->Submit("second", 150));
  EXPECT_EQ(Stats().queued_items, 150u);
  // The queue holds a body: nothing more, however small.
  EXPECT_FALSE(exporter_->Submit("third", 1));
  OtlpExporterStats s = Stats();
  EXPECT_EQ(s.dropped_items, 1u);
  ExpectBalanced(s);
  ASSERT_TRUE(RunUntil([&] { return server->request_count() == 1; }));
  ShutdownAndWait(NowNs() + 50 * kMs);
}

TEST_F(OtlpHttpExporterTest, ClientErrorsAreNotRetried) {
  const std::vector<int> statuses = {400, 401, 404, 413, 500, 301};
  TestServer* server = Serve([&](const ReceivedRequest&, int index) {
    return Reply::Status(statuses[static_cast<size_t>(index)],
                         index == 0 ? "bad span\n" : "");
  });
  Make(Config(server->Url("/v1/traces")), Options());
  for (size_t i = 0; i < statuses.size(); ++i) {
    ASSERT_TRUE(exporter_->Submit("x", 2));
    ASSERT_TRUE(RunUntil([&] { return results_.size() == i + 1; }));
    EXPECT_EQ(results_[i].kind, ExportResult::Kind::kFailed);
    EXPECT_EQ(results_[i].http_status, statuses[i]);
    EXPECT_EQ(results_[i].attempts, 1u);
  }
  EXPECT_EQ(results_[0].detail, "HTTP 400: bad span.");
  EXPECT_EQ(server->request_count(), statuses.size());
  EXPECT_EQ(Stats().retries, 0u);
  EXPECT_EQ(Stats().failed_items, 2 * statuses.size());
  EXPECT_EQ(Stats().responses_error, statuses.size());
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, PartialSuccessCountsRejectedItemsAsFailed) {
  TestServer* server = Serve([](const ReceivedRequest&, int index) {
    Reply r;
    if (index == 0) {
      r = Reply::Status(200, ProtobufPartialSuccess(3, "too old"));
      r.headers = {{"Content-Type", "application/x-protobuf"}};
    } else if (index == 1) {
      r = Reply::Status(
          200,
          R"({"partialSuccess":{"rejectedSpans":"2","errorMessage":"x"}})");
      r.headers = {{"Content-Type", "application/json"}};
    } else {
      // More rejected than sent: clamped.
      r = Reply::Status(200, ProtobufPartialSuccess(99, ""));
    }
    return r;
  });
  Make(Config(server->Url("/v1/traces")), Options());
  ASSERT_TRUE(exporter_->Submit("a", 10));
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 1; }));
  ASSERT_TRUE(exporter_->Submit("b", 10));
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 2; }));
  ASSERT_TRUE(exporter_->Submit("c", 10));
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 3; }));
  EXPECT_EQ(results_[0].rejected, 3u);
  EXPECT_EQ(results_[0].detail, "too old");
  EXPECT_EQ(results_[1].rejected, 2u);
  EXPECT_EQ(results_[2].rejected, 10u);
  const OtlpExporterStats s = Stats();
  EXPECT_EQ(s.exported_items, 7u + 8u + 0u);
  EXPECT_EQ(s.failed_items, 3u + 2u + 10u);
  EXPECT_EQ(s.rejected_items, 15u);
  EXPECT_EQ(s.retries, 0u);
  ShutdownAndWait(NowNs() + kS);
}

// A receiver's partial_success says why it dropped items (or warns with
// none dropped): logged, the first one at once, later ones at most once a
// minute, so a receiver that rejects every body does not flood the log.
TEST_F(OtlpHttpExporterTest, PartialSuccessIsLoggedAtMostOnceAMinute) {
  testutil::LogCapture log;
  TestServer* server = Serve([](const ReceivedRequest&, int index) {
    Reply r = Reply::Status(200, ProtobufPartialSuccess(3 - index, "too old"));
    r.headers = {{"Content-Type", "application/x-protobuf"}};
    return r;
  });
  Make(Config(server->Url("/v1/traces")), Options());
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(exporter_->Submit("a", 10));
    ASSERT_TRUE(RunUntil([&] { return results_.size() == i + 1; }));
  }
  EXPECT_EQ(log.Count("rejected 3 of 10 items: too old"), 1u);
  EXPECT_EQ(log.Count("rejected 2 of 10"), 0u);
  EXPECT_EQ(log.Count("rejected 1 of 10"), 0u);
  ShutdownAndWait(NowNs() + kS);

  // All accepted with a warning (proto3 JSON leaves out the zero count).
  server = Serve([](const ReceivedRequest&, int) {
    Reply r = Reply::Status(
        200, R"({"partialSuccess":{"errorMessage":"attribute cut"}})");
    r.headers = {{"Content-Type", "application/json"}};
    return r;
  });
  results_.clear();
  Make(Config(server->Url("/v1/traces")), Options());
  ASSERT_TRUE(exporter_->Submit("b", 7));
  ASSERT_TRUE(RunUntil([&] { return results_.size() == 1; }));
  EXPECT_EQ(results_[0].rejected, 0u);
  EXPECT_EQ(results_[0].detail, "attribute cut");
  EXPECT_EQ(Stats().exported_items, 7u);
  EXPECT_EQ(log.Count("accepted 7 items with a warning: attribute cut"), 1u);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTest, AtMostMaxInFlightRequestsAtOnce) {
  for (uint32_t in_flight : {1u, 2u}) {
    SCOPED_TRACE(in_flight);
    TestServer* server = Serve([](const ReceivedRequest&, int) {
      Reply r = Reply::Status(200);
      r.delay = milliseconds(50);
      return r;
    });
    OtlpExporterOptions o = Options();
    o.max_in_flight = in_flight;
    Make(Config(server->Url("/v1/traces")), o);
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(exporter_->Submit("x", 1));
    EXPECT_LE(Stats().in_flight_items, in_flight);
    ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 6; }));
    EXPECT_EQ(server->max_concurrent(), static_cast<int>(in_flight));
    ShutdownAndWait(NowNs() + kS);
  }
}

TEST_F(OtlpHttpExporterTest, ShutdownSendsWhatIsQueuedBeforeTheDeadline) {
  TestServer* server = Serve([](const ReceivedRequest&, int) {
    Reply r = Reply::Status(200);
    r.delay = milliseconds(20);
    return r;
  });
  Make(Config(server->Url("/v1/traces")), Options());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(exporter_->Submit("x", 2));
  const auto start = SteadyClock::now();
  bool done = false;
  exporter_->Shutdown(NowNs() + 10 * kS, [&] { done = true; });
  EXPECT_FALSE(exporter_->Submit("late", 3));
  ASSERT_TRUE(RunUntil([&] { return done; }));
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(5))
      << "waited for the deadline with nothing left to send";
  const OtlpExporterStats s = Stats();
  EXPECT_EQ(s.exported_items, 10u);
  EXPECT_EQ(s.dropped_items, 3u);
  EXPECT_EQ(s.failed_items, 0u);
  ExpectBalanced(s);
  EXPECT_EQ(server->request_count(), 5u);
  exporter_.reset();
}

TEST_F(OtlpHttpExporterTest, ShutdownFailsAWaitingRetryDueAfterTheDeadline) {
  TestServer* server = Serve([](const ReceivedRequest&, int) {
    Reply r = Reply::Status(503);
    r.headers = {{"Retry-After", "30"}};
    return r;
  });
  OtlpExporterOptions o = Options();
  o.retry.max_elapsed_ns = 60 * kS;
  Make(Config(server->Url("/v1/traces")), o);
  ASSERT_TRUE(exporter_->Submit("x", 4));
  ASSERT_TRUE(RunUntil([&] {
    return server->request_count() == 1 && Stats().responses_error == 1;
  }));
  EXPECT_EQ(Stats().in_flight_items, 4u);  // Waiting 30 s to retry.
  const auto start = SteadyClock::now();
  ShutdownAndWait(NowNs() + 2 * kS);
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(1))
      << "waited for the deadline although the retry was due after it";
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].kind, ExportResult::Kind::kFailed);
  EXPECT_EQ(results_[0].items, 4u);
  EXPECT_EQ(results_[0].detail, "shutdown deadline before the next attempt");
}

TEST_F(OtlpHttpExporterTest, ShutdownDuringAnAttemptGivesUpItsLateRetry) {
  // Shutdown before the 503 arrives: the retry decision then sees the
  // deadline and gives up at once instead of scheduling a 30 s wait.
  TestServer* server = Serve([](const ReceivedRequest&, int) {
    Reply r = Reply::Status(503);
    r.headers = {{"Retry-After", "30"}};
    r.delay = milliseconds(100);
    return r;
  });
  OtlpExporterOptions o = Options();
  o.retry.max_elapsed_ns = 60 * kS;
  Make(Config(server->Url("/v1/traces")), o);
  ASSERT_TRUE(exporter_->Submit("x", 4));
  ASSERT_TRUE(RunUntil([&] { return server->request_count() == 1; }));
  const auto start = SteadyClock::now();
  ShutdownAndWait(NowNs() + 5 * kS);
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(2));
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].detail.rfind("gave up after 1 attempts: HTTP 503", 0),
            0u)
      << results_[0].detail;
  EXPECT_EQ(server->request_count(), 1u);
}

TEST_F(OtlpHttpExporterTest, OnResultMayCallSubmitAndShutdown) {
  TestServer* server = Serve([](const ReceivedRequest& r, int) {
    return Reply::Status(r.body == "second" ? 400 : 200);
  });
  Make(Config(server->Url("/v1/traces")), Options());
  bool done = false;
  then_ = [&](const ExportResult& r) {
    if (results_.size() == 1) {
      EXPECT_TRUE(exporter_->Submit("second", 2));
    } else if (results_.size() == 2) {
      EXPECT_EQ(r.kind, ExportResult::Kind::kFailed);
      exporter_->Shutdown(NowNs() + kS, [&] { done = true; });
      EXPECT_FALSE(exporter_->Submit("third", 4));
    }
  };
  ASSERT_TRUE(exporter_->Submit("first", 1));
  ASSERT_TRUE(RunUntil([&] { return done; }));
  const OtlpExporterStats s = Stats();
  EXPECT_EQ(s.exported_items, 1u);
  EXPECT_EQ(s.failed_items, 2u);
  EXPECT_EQ(s.dropped_items, 4u);
  ExpectBalanced(s);
  EXPECT_EQ(server->request_count(), 2u);
  exporter_.reset();
}

TEST_F(OtlpHttpExporterTest, ShutdownWithNothingToSendClosesAtOnce) {
  TestServer* server =
      Serve([](const ReceivedRequest&, int) { return Reply::Status(200); });
  Make(Config(server->Url("/v1/traces")), Options());
  const auto start = SteadyClock::now();
  ShutdownAndWait(NowNs() + 60 * kS);
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(server->request_count(), 0u);
}

class OtlpHttpExporterTlsTest : public OtlpHttpExporterTest {
 protected:
  void SetUp() override {
    OtlpHttpExporterTest::SetUp();
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_TRUE(pki_.Make());
  }
  TestServer::Tls ServerTls(bool require_client) const {
    return {pki_.server_cert, pki_.server_key,
            require_client ? pki_.ca_file : ""};
  }
  testutil::TempDir dir_;
  testutil::TestPki pki_{dir_.path()};
};

TEST_F(OtlpHttpExporterTlsTest, CustomCaAndClientCertificate) {
  TestServer* server =
      Serve([](const ReceivedRequest&, int) { return Reply::Status(200); },
            ServerTls(/*require_client=*/true));
  OtlpConfig c = Config(server->Url("/v1/traces"));
  c.certificate_file = pki_.ca_file;
  c.client_certificate_file = pki_.client_cert;
  c.client_key_file = pki_.client_key;
  Make(c, Options());
  ASSERT_TRUE(exporter_->Submit("over tls", 3));
  ASSERT_TRUE(RunUntil([&] { return Stats().exported_items == 3; }))
      << (results_.empty() ? "" : results_[0].detail);
  const auto got = server->requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].body, "over tls");
  EXPECT_EQ(got[0].client_cn, "tokenmeter-test-client");
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTlsTest, UnknownCaFailsWithoutRetry) {
  TestServer* server =
      Serve([](const ReceivedRequest&, int) { return Reply::Status(200); },
            ServerTls(/*require_client=*/false));
  // No certificate: the system's trust store, which does not know our CA.
  Make(Config(server->Url("/v1/traces")), Options());
  ASSERT_TRUE(exporter_->Submit("x", 3));
  ASSERT_TRUE(RunUntil([&] { return Stats().failed_items == 3; }));
  EXPECT_EQ(Stats().requests_sent, 1u);
  EXPECT_EQ(Stats().retries, 0u);
  EXPECT_EQ(server->request_count(), 0u);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTlsTest, MissingClientCertificateIsRefused) {
  TestServer* server =
      Serve([](const ReceivedRequest&, int) { return Reply::Status(200); },
            ServerTls(/*require_client=*/true));
  OtlpConfig c = Config(server->Url("/v1/traces"));
  c.certificate_file = pki_.ca_file;
  OtlpExporterOptions o = Options();
  o.retry.max_attempts = 2;
  Make(c, o);
  ASSERT_TRUE(exporter_->Submit("x", 3));
  ASSERT_TRUE(RunUntil([&] { return Stats().failed_items == 3; }));
  EXPECT_EQ(server->request_count(), 0u);
  EXPECT_GE(server->handshake_failures(), 1);
  ShutdownAndWait(NowNs() + kS);
}

TEST_F(OtlpHttpExporterTlsTest, CreateRejectsUnreadableFilesAndBadOptions) {
  OtlpConfig c = Config("https://127.0.0.1:1/v1/traces");
  c.certificate_file = dir_.File("missing.pem");
  std::unique_ptr<OtlpHttpExporter> e;
  Status s = OtlpHttpExporter::Create(&loop_, c, Options(), &e);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "cannot read the OTLP certificate \"" +
                             dir_.File("missing.pem") +
                             "\": No such file or directory");
  c.certificate_file.clear();
  c.client_certificate_file = pki_.client_cert;
  c.client_key_file = dir_.File("nokey.pem");
  s = OtlpHttpExporter::Create(&loop_, c, Options(), &e);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("client key"), std::string::npos);

  OtlpExporterOptions o = Options();
  o.max_in_flight = 0;
  s = OtlpHttpExporter::Create(&loop_, Config("http://127.0.0.1:1/"), o, &e);
  EXPECT_EQ(s.message(), "OTLP exporter: max_in_flight 0 is not from 1 to 8");
  o = Options();
  o.max_queue_items = 0;
  EXPECT_FALSE(
      OtlpHttpExporter::Create(&loop_, Config("http://127.0.0.1:1/"), o, &e)
          .ok());
  EXPECT_FALSE(
      OtlpHttpExporter::Create(&loop_, OtlpConfig(), Options(), &e).ok());
  EXPECT_EQ(e, nullptr);
}

}  // namespace
}  // namespace tokenmeter::daemon::otlp
