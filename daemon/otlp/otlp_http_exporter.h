// The OTLP/HTTP transport: POSTs already-encoded export requests (the
// caller encodes spans or metric data points) to one endpoint, on the
// daemon's libuv loop, through libcurl's multi-socket interface (a
// uv_poll_t per socket curl asks to watch, one uv_timer_t for curl's
// timeouts). Nothing here blocks the loop: name resolution runs on
// libcurl's resolver thread, every socket is non-blocking, and the only
// work done on the loop is curl's protocol and TLS processing, gzip at
// Submit() and reading the response.
//
// Queue: bodies wait in FIFO order in a queue bounded in items (spans or
// data points, as the caller counts them): a body whose items would take
// the queue past max_queue_items is dropped (the newest is dropped, the
// queued ones are kept) and its items counted as dropped; an empty queue
// takes one body whatever its size (a metrics push larger than the bound
// is sent, not dropped at every interval). At most
// max_in_flight bodies are out of the queue at once, each either being
// sent or waiting for its next attempt. Memory: the queued and in-flight
// bodies (compressed, with gzip) plus, per body in flight, one libcurl
// easy handle and at most max_response_bytes of the response; with a
// receiver that never answers it stays at that, whatever is submitted.
//
// Delivery: a 2xx response exports the body's items (minus those an OTLP
// partial_success rejects, which count as failed and as rejected; a
// partial_success, rejections or a warning alone, is logged: the first,
// then at most one line a minute);
// 429/502/503/504 and connection errors or timeouts are retried after
// max(backoff with jitter, Retry-After) (retry.h) until the policy's
// attempt or elapsed-time bound, then failed; any other status (400, 401,
// 404, 413, ...) and permanent transport errors (certificate
// verification) fail the body at once. A body is sent as one request;
// bodies are never merged or split.
//
// libcurl's defaults that stay: the proxy variables (https_proxy,
// http_proxy, no_proxy) are honoured as the OpenTelemetry SDKs do; no
// redirects are followed (a 3xx fails the body); HTTP/2 is used over TLS
// where the receiver offers it. A client key with a passphrase is not
// supported.
//
// Counting: every item submitted ends in exactly one of exported, dropped
// or failed, and until then is queued or in flight, so at every moment on
// the loop thread
//   submitted == exported + dropped + failed + queued + in_flight.
//
// Threads: Create, Submit, Shutdown and the destructor run on the loop's
// thread (Create may run on another before the loop runs); stats() may
// be called from any thread (each counter is exact; from another thread
// a snapshot may straddle an update, so the sum above may be off by one
// body's items there).
#ifndef TOKENMETER_DAEMON_OTLP_OTLP_HTTP_EXPORTER_H_
#define TOKENMETER_DAEMON_OTLP_OTLP_HTTP_EXPORTER_H_

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/base/clock.h"
#include "daemon/base/status.h"
#include "daemon/otlp/otlp_config.h"
#include "daemon/otlp/retry.h"

namespace tokenmeter::daemon::otlp {

// How one body ended, for the caller's log and histograms
// (tokenmeter_otlp_export_seconds). Views are valid during the call only.
struct ExportResult {
  enum class Kind : uint8_t { kExported, kFailed };
  Kind kind = Kind::kExported;
  uint32_t items = 0;     // The body's items.
  uint32_t rejected = 0;  // Of them, rejected by a partial_success.
  uint32_t attempts = 0;  // Requests sent for it (0: failed unsent).
  long http_status = 0;   // Of the last attempt; 0 without a response.
  // From the first attempt's start to the end (retries included).
  uint64_t elapsed_ns = 0;
  // The last attempt alone.
  uint64_t last_attempt_ns = 0;
  // Why it failed (the status and up to 256 bytes of the response, or
  // libcurl's error text, or "shutdown deadline"), or the receiver's
  // partial_success message; empty otherwise.
  std::string_view detail;
};

struct OtlpExporterOptions {
  // --otlp-queue-spans: queued items at most (in flight not counted),
  // except that an empty queue takes one body of any size.
  uint64_t max_queue_items = 65536;
  // Bodies out of the queue at once (sending or waiting to retry), 1..8.
  uint32_t max_in_flight = 1;
  RetryPolicy retry;
  // Response bytes kept per attempt (to read a partial_success or an
  // error message); the rest is read and discarded.
  size_t max_response_bytes = 64 * 1024;
  // The User-Agent header.
  std::string user_agent = "tokenmeterd";
  // Called on the loop thread once per body that ends exported or failed
  // (not for dropped ones). May call Submit() and Shutdown().
  std::function<void(const ExportResult&)> on_result;
  // Seeds the backoff jitter; 0: from std::random_device.
  uint64_t jitter_seed = 0;
  // Time since the first attempt and for the shutdown deadline
  // (CLOCK_MONOTONIC ns) and Retry-After dates (Unix seconds). Borrowed,
  // must outlive the exporter; null: the system clocks. The waits
  // themselves are libuv timers (real time).
  const Clock* clock = nullptr;
};

// Counters since Create (items are the caller's units).
struct OtlpExporterStats {
  uint64_t submitted_items = 0;
  uint64_t exported_items = 0;
  uint64_t dropped_items = 0;     // queue full, or submitted after Shutdown
  uint64_t failed_items = 0;      // gave up, permanent error, or rejected
  uint64_t rejected_items = 0;    // of failed: a partial_success's count
  uint64_t queued_items = 0;      // now
  uint64_t queued_bytes = 0;      // now (bodies as they will be sent)
  uint64_t in_flight_items = 0;   // now: sending or waiting to retry
  uint64_t requests_sent = 0;     // attempts started (retries included)
  uint64_t retries = 0;           // attempts after a body's first
  uint64_t bytes_sent = 0;        // request body bytes put on the wire
  uint64_t responses_2xx = 0;     // attempts answered 2xx
  uint64_t responses_error = 0;   // attempts answered with another status
  uint64_t transport_errors = 0;  // attempts that got no response
};

class OtlpHttpExporter {
 public:
  // Checks the options (max_in_flight 1..8, max_queue_items >= 1,
  // retry.max_attempts >= 1), that the config is enabled and its
  // certificate files are readable, and sets up libcurl (the first call
  // in the process runs curl_global_init, which initialises OpenSSL: make
  // it before starting other threads that use OpenSSL) and the loop's
  // handles. Borrows the loop, which must outlive the exporter. An error
  // is one line naming the file or option. Cost: no I/O but the file
  // checks; nothing is connected until the first Submit.
  static Status Create(uv_loop_t* loop, OtlpConfig config,
                       OtlpExporterOptions options,
                       std::unique_ptr<OtlpHttpExporter>* out);

  OtlpHttpExporter(const OtlpHttpExporter&) = delete;
  OtlpHttpExporter& operator=(const OtlpHttpExporter&) = delete;
  // Requires Shutdown's `done` to have run (the loop's handles are closed
  // only then); aborts otherwise.
  ~OtlpHttpExporter();

  // Queues one encoded export request of `items` items and starts sending
  // it if a slot is free (then also the cost of starting a request: curl
  // setup, no I/O wait). Takes the body. Cost: with gzip, one deflate of
  // the body (zlib level 6); else a move. Never blocks, never throws:
  // false when the body was not queued, its items counted as dropped
  // (the queue holds bodies and would pass max_queue_items, or Shutdown
  // was called) or, if zlib fails (out of memory),
  // as failed. on_result is not called for such a body. Loop thread.
  bool Submit(std::string body, uint32_t items);

  // Stops taking bodies and sends what is queued and in flight until
  // `deadline_ns` (CLOCK_MONOTONIC of the options' clock), retrying only
  // where the retry would start before it and capping each attempt's
  // timeout at it. At the deadline, transfers still running are
  // abandoned and everything not exported counts as failed. Then the
  // exporter closes its libuv handles and libcurl state; `done` runs on
  // the loop thread once every handle is closed (never inside this call),
  // after which the exporter may be destroyed. Call once. Loop thread.
  void Shutdown(uint64_t deadline_ns, std::function<void()> done);

  // A snapshot of the counters. Any thread; no lock.
  OtlpExporterStats stats() const;

  // The endpoint requests go to.
  const std::string& endpoint() const { return config_.endpoint; }

 private:
  struct Body;
  struct Slot;
  struct SocketWatch;
  struct Counters;

  OtlpHttpExporter(uv_loop_t* loop, OtlpConfig config,
                   OtlpExporterOptions options);
  Status Init();

  // The loop's side.
  void Pump();
  void StartAttempt(Slot* slot);
  void ReadCompletions();
  void Complete(Slot* slot, int curl_code);
  void Finish(Slot* slot, ExportResult::Kind kind, uint32_t rejected,
              long http_status, std::string_view detail);
  void LogBurst(ExportResult::Kind kind, uint32_t items, uint32_t attempts,
                std::string_view detail);
  void LogPartialSuccess(uint32_t items, uint32_t rejected,
                         std::string_view message);
  void Abandon(std::string_view why);
  void StartRetryTimer(Slot* slot);
  void StartDeadlineTimer();
  void AfterEvent();
  void BeginClose();
  void CloseHandle(uv_handle_t* handle);
  void HandleClosed();
  uint64_t NowNs() const;
  uint64_t BudgetNs() const;

  // libcurl's callbacks (static: C function pointers).
  static int OnCurlSocket(void* easy, int socket, int what, void* userp,
                          void* socketp);
  static int OnCurlTimer(void* multi, long timeout_ms, void* userp);
  static void OnCurlTimeout(uv_timer_t* timer);
  static void OnPoll(uv_poll_t* poll, int status, int events);
  static void OnRetryTimer(uv_timer_t* timer);
  static void OnDeadline(uv_timer_t* timer);

  uv_loop_t* const loop_;
  const OtlpConfig config_;
  const OtlpExporterOptions options_;
  const SystemClock system_clock_;
  const Clock& clock_;
  std::mt19937_64 random_;

  void* multi_ = nullptr;    // CURLM*
  void* headers_ = nullptr;  // curl_slist*
  uv_timer_t curl_timer_;
  uv_timer_t deadline_timer_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::deque<std::unique_ptr<Body>> queue_;
  SocketWatch* watches_ = nullptr;  // Every open watch, linked.

  bool shutting_down_ = false;
  bool closing_ = false;
  bool pumping_ = false;    // inside Pump()
  int dispatch_depth_ = 0;  // > 0 inside our own callbacks
  int open_handles_ = 0;    // initialised and not yet closed
  uint64_t deadline_ns_ = 0;
  // The log's burst state: a failed body is logged when the one before it
  // was exported (or it is the first), a success after failures says how
  // many items failed meanwhile; every failure is counted regardless.
  bool failing_ = false;
  uint64_t items_failed_meanwhile_ = 0;
  // Partial successes (rejections or warnings from the receiver): one
  // line, then at most one a minute, counting those not logged.
  bool partial_logged_ = false;
  uint64_t partial_logged_ns_ = 0;
  uint64_t partial_not_logged_ = 0;
  std::function<void()> done_;

  std::unique_ptr<Counters> counters_;
};

}  // namespace tokenmeter::daemon::otlp

#endif  // TOKENMETER_DAEMON_OTLP_OTLP_HTTP_EXPORTER_H_
