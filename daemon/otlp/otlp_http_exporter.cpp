#include "daemon/otlp/otlp_http_exporter.h"

#include <curl/curl.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "daemon/otlp/partial_success.h"

namespace tokenmeter::daemon::otlp {
namespace {

constexpr size_t kMaxDetailBytes = 256;
constexpr uint32_t kMaxInFlight = 8;

// One writer (the loop thread), any readers: plain relaxed load + store.
void Add(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) + n,
                std::memory_order_relaxed);
}
void Sub(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) - n,
                std::memory_order_relaxed);
}

Status CheckReadable(const char* what, const std::string& path) {
  if (path.empty()) return Status::Ok();
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Status::Error(std::string("cannot read the OTLP ") + what + " \"" +
                         path + "\": " + std::strerror(errno));
  }
  std::fclose(f);
  return Status::Ok();
}

bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    const auto lower = [](char c) {
      return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    };
    if (lower(s[i]) != lower(prefix[i])) return false;
  }
  return true;
}

std::string_view TrimLine(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' ||
                        s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// A printable prefix of a response body, for a log line.
std::string Printable(std::string_view bytes) {
  std::string out;
  for (char c : bytes.substr(0, kMaxDetailBytes)) {
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? c : '.';
  }
  return out;
}

// gzip (RFC 1952) of `in` at zlib's default level; false on a zlib error.
bool Gzip(std::string_view in, std::string* out) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  out->resize(deflateBound(&z, in.size()) + 32);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out->data());
  z.avail_out = static_cast<uInt>(out->size());
  const int rc = deflate(&z, Z_FINISH);
  out->resize(z.total_out);
  deflateEnd(&z);
  return rc == Z_STREAM_END;
}

std::once_flag curl_init_once;
CURLcode curl_init_result = CURLE_OK;

}  // namespace

struct OtlpHttpExporter::Body {
  std::string payload;
  uint32_t items = 0;
};

// One request slot: a body out of the queue, its easy handle, the timer
// that waits before its next attempt.
struct OtlpHttpExporter::Slot {
  OtlpHttpExporter* owner = nullptr;
  CURL* easy = nullptr;
  uv_timer_t retry_timer;
  std::unique_ptr<Body> body;  // null: the slot is free
  uint32_t attempts = 0;
  uint64_t first_start_ns = 0;
  uint64_t attempt_start_ns = 0;
  bool in_curl = false;      // added to the multi handle
  bool waiting = false;      // retry_timer running
  uint64_t retry_at_ns = 0;  // when it fires
  // The current attempt's response.
  std::string response;
  std::string retry_after;
  std::string response_type;
  char error[CURL_ERROR_SIZE];
};

struct OtlpHttpExporter::SocketWatch {
  uv_poll_t poll;
  OtlpHttpExporter* owner = nullptr;
  curl_socket_t socket = CURL_SOCKET_BAD;
  SocketWatch* next = nullptr;
  SocketWatch* prev = nullptr;
};

struct OtlpHttpExporter::Counters {
  std::atomic<uint64_t> submitted_items{0};
  std::atomic<uint64_t> exported_items{0};
  std::atomic<uint64_t> dropped_items{0};
  std::atomic<uint64_t> failed_items{0};
  std::atomic<uint64_t> rejected_items{0};
  std::atomic<uint64_t> queued_items{0};
  std::atomic<uint64_t> queued_bytes{0};
  std::atomic<uint64_t> in_flight_items{0};
  std::atomic<uint64_t> requests_sent{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> responses_2xx{0};
  std::atomic<uint64_t> responses_error{0};
  std::atomic<uint64_t> transport_errors{0};
};

Status OtlpHttpExporter::Create(uv_loop_t* loop, OtlpConfig config,
                                OtlpExporterOptions options,
                                std::unique_ptr<OtlpHttpExporter>* out) {
  if (!config.enabled()) {
    return Status::Error("OTLP exporter: no endpoint configured");
  }
  if (options.max_in_flight < 1 || options.max_in_flight > kMaxInFlight) {
    return Status::Error("OTLP exporter: max_in_flight " +
                         std::to_string(options.max_in_flight) +
                         " is not from 1 to " + std::to_string(kMaxInFlight));
  }
  if (options.max_queue_items < 1) {
    return Status::Error("OTLP exporter: the queue bound must be at least 1");
  }
  if (options.retry.max_attempts < 1) {
    return Status::Error("OTLP exporter: max_attempts must be at least 1");
  }
  Status s = CheckReadable("certificate", config.certificate_file);
  if (!s.ok()) return s;
  s = CheckReadable("client certificate", config.client_certificate_file);
  if (!s.ok()) return s;
  s = CheckReadable("client key", config.client_key_file);
  if (!s.ok()) return s;
  std::call_once(curl_init_once, [] {
    curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
  });
  if (curl_init_result != CURLE_OK) {
    return Status::Error(std::string("OTLP exporter: libcurl: ") +
                         curl_easy_strerror(curl_init_result));
  }
  std::unique_ptr<OtlpHttpExporter> e(
      new OtlpHttpExporter(loop, std::move(config), std::move(options)));
  s = e->Init();
  if (!s.ok()) return s;
  *out = std::move(e);
  return Status::Ok();
}

OtlpHttpExporter::OtlpHttpExporter(uv_loop_t* loop, OtlpConfig config,
                                   OtlpExporterOptions options)
    : loop_(loop),
      config_(std::move(config)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : system_clock_),
      counters_(std::make_unique<Counters>()) {
  random_.seed(options_.jitter_seed != 0 ? options_.jitter_seed
                                         : std::random_device{}());
}

// Everything that can fail comes before the first uv_*_init: a handle
// once initialised must be closed through the loop.
Status OtlpHttpExporter::Init() {
  CURLM* multi = curl_multi_init();
  if (multi == nullptr) return Status::Error("OTLP exporter: curl_multi_init");
  multi_ = multi;
  curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION,
                    static_cast<curl_socket_callback>(
                        [](CURL* easy, curl_socket_t s, int what, void* userp,
                           void* socketp) {
                          return OnCurlSocket(easy, s, what, userp, socketp);
                        }));
  curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, this);
  curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION,
                    static_cast<curl_multi_timer_callback>(
                        [](CURLM* m, long timeout_ms, void* userp) {
                          return OnCurlTimer(m, timeout_ms, userp);
                        }));
  curl_multi_setopt(multi, CURLMOPT_TIMERDATA, this);
  // Idle connections kept for reuse: one per slot.
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS,
                    static_cast<long>(options_.max_in_flight));

  curl_slist* headers = nullptr;
  const auto append = [&headers](const std::string& line) {
    curl_slist* h = curl_slist_append(headers, line.c_str());
    if (h == nullptr) return false;
    headers = h;
    return true;
  };
  bool ok = append("Content-Type: " + std::string(config_.content_type()));
  if (config_.compression == Compression::kGzip) {
    ok = ok && append("Content-Encoding: gzip");
  }
  // No "Expect: 100-continue" (curl adds it to bodies over 1 KiB, then
  // waits up to a second for a 100 many receivers never send).
  ok = ok && append("Expect:");
  for (const auto& [name, value] : config_.headers) {
    // The framing headers are ours.
    static constexpr std::string_view kOurs[] = {
        "content-type",      "content-encoding", "content-length",
        "transfer-encoding", "expect",           "host",
        "connection"};
    bool ours = false;
    for (std::string_view o : kOurs) {
      ours = ours || (name.size() == o.size() && StartsWithIgnoreCase(name, o));
    }
    if (ours) continue;
    // "Name;" is curl's way to send a header with an empty value.
    ok = ok && append(value.empty() ? name + ";" : name + ": " + value);
  }
  headers_ = headers;
  if (!ok) return Status::Error("OTLP exporter: out of memory");

  for (uint32_t i = 0; i < options_.max_in_flight; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->owner = this;
    slot->easy = curl_easy_init();
    if (slot->easy == nullptr) {
      return Status::Error("OTLP exporter: curl_easy_init");
    }
    slots_.push_back(std::move(slot));
  }

  uv_timer_init(loop_, &curl_timer_);
  curl_timer_.data = this;
  uv_timer_init(loop_, &deadline_timer_);
  deadline_timer_.data = this;
  open_handles_ = 2;
  for (auto& slot : slots_) {
    uv_timer_init(loop_, &slot->retry_timer);
    slot->retry_timer.data = slot.get();
    ++open_handles_;
  }
  return Status::Ok();
}

OtlpHttpExporter::~OtlpHttpExporter() {
  // Handles initialised and not closed would leave the loop pointing at
  // freed memory.
  if (open_handles_ != 0) std::abort();
  for (auto& slot : slots_) {
    if (slot->easy != nullptr) curl_easy_cleanup(slot->easy);
  }
  if (multi_ != nullptr) curl_multi_cleanup(static_cast<CURLM*>(multi_));
  curl_slist_free_all(static_cast<curl_slist*>(headers_));
}

OtlpExporterStats OtlpHttpExporter::stats() const {
  constexpr auto r = std::memory_order_relaxed;
  const Counters& c = *counters_;
  OtlpExporterStats s;
  s.submitted_items = c.submitted_items.load(r);
  s.exported_items = c.exported_items.load(r);
  s.dropped_items = c.dropped_items.load(r);
  s.failed_items = c.failed_items.load(r);
  s.rejected_items = c.rejected_items.load(r);
  s.queued_items = c.queued_items.load(r);
  s.queued_bytes = c.queued_bytes.load(r);
  s.in_flight_items = c.in_flight_items.load(r);
  s.requests_sent = c.requests_sent.load(r);
  s.retries = c.retries.load(r);
  s.bytes_sent = c.bytes_sent.load(r);
  s.responses_2xx = c.responses_2xx.load(r);
  s.responses_error = c.responses_error.load(r);
  s.transport_errors = c.transport_errors.load(r);
  return s;
}

uint64_t OtlpHttpExporter::NowNs() const { return clock_.NowNs(); }

uint64_t OtlpHttpExporter::BudgetNs() const {
  if (!shutting_down_) return UINT64_MAX;
  const uint64_t now = NowNs();
  return deadline_ns_ > now ? deadline_ns_ - now : 0;
}

bool OtlpHttpExporter::Submit(std::string body, uint32_t items) {
  Counters& c = *counters_;
  Add(c.submitted_items, items);
  // An empty queue takes a body whatever its size (a metrics push past
  // the bound would otherwise never be sent); behind others, a body must
  // fit the bound.
  const uint64_t queued = c.queued_items.load(std::memory_order_relaxed);
  if (shutting_down_ ||
      (queued != 0 && (queued >= options_.max_queue_items ||
                       items > options_.max_queue_items - queued))) {
    Add(c.dropped_items, items);
    return false;
  }
  auto b = std::make_unique<Body>();
  b->items = items;
  if (config_.compression == Compression::kGzip) {
    if (!Gzip(body, &b->payload)) {
      Add(c.failed_items, items);
      return false;
    }
  } else {
    b->payload = std::move(body);
  }
  Add(c.queued_items, items);
  Add(c.queued_bytes, b->payload.size());
  queue_.push_back(std::move(b));
  ++dispatch_depth_;
  Pump();
  --dispatch_depth_;
  AfterEvent();
  return true;
}

void OtlpHttpExporter::Pump() {
  if (closing_ || pumping_) return;
  pumping_ = true;
  Counters& c = *counters_;
  for (auto& slot : slots_) {
    while (!closing_ && slot->body == nullptr && !queue_.empty()) {
      slot->body = std::move(queue_.front());
      queue_.pop_front();
      const Body& b = *slot->body;
      Sub(c.queued_items, b.items);
      Sub(c.queued_bytes, b.payload.size());
      Add(c.in_flight_items, b.items);
      slot->attempts = 0;
      slot->first_start_ns = NowNs();
      StartAttempt(slot.get());
    }
  }
  pumping_ = false;
}

void OtlpHttpExporter::StartAttempt(Slot* slot) {
  CURL* e = slot->easy;
  curl_easy_reset(e);
  slot->response.clear();
  slot->retry_after.clear();
  slot->response_type.clear();
  slot->error[0] = '\0';
  const Body& b = *slot->body;
  // An attempt never runs past the shutdown deadline (at least 1 ms: the
  // deadline timer abandons it if the deadline is already here).
  const uint64_t timeout_ns = std::min(config_.timeout_ns, BudgetNs());
  const long timeout_ms =
      static_cast<long>(std::max<uint64_t>(1, timeout_ns / 1'000'000));

  curl_easy_setopt(e, CURLOPT_URL, config_.endpoint.c_str());
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
                   static_cast<curl_off_t>(b.payload.size()));
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, b.payload.data());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers_);
  curl_easy_setopt(e, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_PRIVATE, slot);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, slot->error);
  curl_easy_setopt(
      e, CURLOPT_WRITEFUNCTION,
      static_cast<curl_write_callback>(
          [](char* data, size_t size, size_t n, void* userp) -> size_t {
            auto* s = static_cast<Slot*>(userp);
            const size_t room =
                s->owner->options_.max_response_bytes - s->response.size();
            s->response.append(data, std::min(room, size * n));
            return size * n;
          }));
  curl_easy_setopt(e, CURLOPT_WRITEDATA, slot);
  curl_easy_setopt(
      e, CURLOPT_HEADERFUNCTION,
      static_cast<curl_write_callback>(
          [](char* data, size_t size, size_t n, void* userp) -> size_t {
            auto* s = static_cast<Slot*>(userp);
            const std::string_view line(data, size * n);
            if (StartsWithIgnoreCase(line, "HTTP/")) {
              // A new response (after a 1xx): forget the previous one's.
              s->retry_after.clear();
              s->response_type.clear();
            } else if (StartsWithIgnoreCase(line, "retry-after:")) {
              s->retry_after = TrimLine(line.substr(12));
            } else if (StartsWithIgnoreCase(line, "content-type:")) {
              s->response_type = TrimLine(line.substr(13));
            }
            return size * n;
          }));
  curl_easy_setopt(e, CURLOPT_HEADERDATA, slot);
  if (!config_.certificate_file.empty()) {
    curl_easy_setopt(e, CURLOPT_CAINFO, config_.certificate_file.c_str());
  }
  if (!config_.client_certificate_file.empty()) {
    curl_easy_setopt(e, CURLOPT_SSLCERT,
                     config_.client_certificate_file.c_str());
    curl_easy_setopt(e, CURLOPT_SSLKEY, config_.client_key_file.c_str());
  }

  Counters& c = *counters_;
  ++slot->attempts;
  slot->attempt_start_ns = NowNs();
  Add(c.requests_sent, 1);
  if (slot->attempts > 1) Add(c.retries, 1);
  const CURLMcode rc = curl_multi_add_handle(static_cast<CURLM*>(multi_), e);
  if (rc != CURLM_OK) {
    Finish(slot, ExportResult::Kind::kFailed, 0, 0,
           std::string("curl_multi_add_handle: ") + curl_multi_strerror(rc));
    return;
  }
  slot->in_curl = true;
}

void OtlpHttpExporter::ReadCompletions() {
  int left = 0;
  while (multi_ != nullptr) {
    CURLMsg* msg = curl_multi_info_read(static_cast<CURLM*>(multi_), &left);
    if (msg == nullptr) break;
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* easy = msg->easy_handle;
    const CURLcode code = msg->data.result;
    Slot* slot = nullptr;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &slot);
    if (slot != nullptr && slot->in_curl) Complete(slot, code);
  }
}

void OtlpHttpExporter::Complete(Slot* slot, int curl_code) {
  Counters& c = *counters_;
  CURL* e = slot->easy;
  curl_multi_remove_handle(static_cast<CURLM*>(multi_), e);
  slot->in_curl = false;
  curl_off_t uploaded = 0;
  if (curl_easy_getinfo(e, CURLINFO_SIZE_UPLOAD_T, &uploaded) == CURLE_OK &&
      uploaded > 0) {
    Add(c.bytes_sent, static_cast<uint64_t>(uploaded));
  }
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  const uint64_t now = NowNs();

  Outcome outcome;
  std::string detail;
  if (curl_code == CURLE_OK && status > 0) {
    outcome = ClassifyHttpStatus(status);
    Add(outcome == Outcome::kExported ? c.responses_2xx : c.responses_error, 1);
    if (outcome != Outcome::kExported) {
      detail = "HTTP " + std::to_string(status);
      if (!slot->response.empty()) detail += ": " + Printable(slot->response);
    }
  } else {
    Add(c.transport_errors, 1);
    outcome = ClassifyTransportError(curl_code);
    detail = slot->error[0] != '\0'
                 ? std::string(slot->error)
                 : curl_easy_strerror(static_cast<CURLcode>(curl_code));
  }

  if (outcome == Outcome::kExported) {
    std::optional<PartialSuccess> partial;
    if (!slot->response.empty()) {
      const bool json =
          slot->response_type.empty()
              ? config_.protocol == Protocol::kHttpJson
              : slot->response_type.find("json") != std::string::npos;
      partial = json ? ParseJsonPartialSuccess(slot->response)
                     : ParseProtobufPartialSuccess(slot->response);
    }
    uint32_t rejected = 0;
    if (partial.has_value()) {
      rejected = static_cast<uint32_t>(std::clamp<int64_t>(
          partial->rejected, 0, static_cast<int64_t>(slot->body->items)));
      detail = Printable(partial->error_message);
      if (rejected > 0 || !detail.empty()) {
        LogPartialSuccess(slot->body->items, rejected, detail);
      }
    }
    Finish(slot, ExportResult::Kind::kExported, rejected, status, detail);
    Pump();
    return;
  }
  if (outcome == Outcome::kRetry) {
    std::optional<uint64_t> retry_after;
    if (status > 0 && !slot->retry_after.empty()) {
      retry_after = ParseRetryAfterNs(slot->retry_after,
                                      static_cast<int64_t>(clock_.UnixNowS()));
    }
    const double unit = std::uniform_real_distribution<double>(0, 1)(random_);
    const std::optional<uint64_t> delay = NextRetryDelayNs(
        options_.retry, slot->attempts, now - slot->first_start_ns, retry_after,
        unit, BudgetNs());
    if (delay.has_value()) {
      slot->waiting = true;
      slot->retry_at_ns = now + *delay;
      StartRetryTimer(slot);
      return;
    }
    detail = "gave up after " + std::to_string(slot->attempts) +
             " attempts: " + detail;
  }
  Finish(slot, ExportResult::Kind::kFailed, 0, status, detail);
  Pump();
}

void OtlpHttpExporter::Finish(Slot* slot, ExportResult::Kind kind,
                              uint32_t rejected, long http_status,
                              std::string_view detail) {
  Counters& c = *counters_;
  const uint32_t items = slot->body->items;
  Sub(c.in_flight_items, items);
  if (kind == ExportResult::Kind::kExported) {
    Add(c.exported_items, items - rejected);
    Add(c.failed_items, rejected);
    Add(c.rejected_items, rejected);
  } else {
    Add(c.failed_items, items);
  }
  const uint64_t now = NowNs();
  ExportResult r;
  r.kind = kind;
  r.items = items;
  r.rejected = rejected;
  r.attempts = slot->attempts;
  r.http_status = http_status;
  r.elapsed_ns = slot->attempts > 0 ? now - slot->first_start_ns : 0;
  r.last_attempt_ns = slot->attempts > 0 ? now - slot->attempt_start_ns : 0;
  // The detail may point into the slot, which a Submit() from the
  // callback may reuse: keep a copy.
  const std::string text(detail);
  r.detail = text;
  LogBurst(kind, items, slot->attempts, text);
  slot->body.reset();
  slot->attempts = 0;
  slot->waiting = false;
  if (options_.on_result) options_.on_result(r);
}

// One warning when exports start failing, one line when they succeed
// again: an operator sees a receiver that is down or refuses without a log
// line per body (the counts are the callers' series). Quiet once Shutdown()
// was called: what the stop's drain could not send is in the counts and the
// stop's summary, and a start that failed says so in one line alone.
void OtlpHttpExporter::LogBurst(ExportResult::Kind kind, uint32_t items,
                                uint32_t attempts, std::string_view detail) {
  if (shutting_down_) return;
  if (kind == ExportResult::Kind::kFailed) {
    items_failed_meanwhile_ += items;
    if (failing_) return;
    failing_ = true;
    std::string why(detail.empty() ? std::string_view("no detail") : detail);
    for (char& ch : why) {
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
    }
    spdlog::warn(
        "OTLP: export to {} failed after {} attempt(s), {} items: {}; "
        "later failures are counted, not logged, until an export succeeds",
        config_.endpoint, attempts, items, why);
    return;
  }
  if (!failing_) return;
  spdlog::info("OTLP: exports to {} succeed again ({} items failed meanwhile)",
               config_.endpoint, items_failed_meanwhile_);
  failing_ = false;
  items_failed_meanwhile_ = 0;
}

// A receiver that rejects some items, or accepts them with a warning
// (OTLP partial_success: rejected 0 and a message), says why in its
// message: the first such answer is logged, then at most one a minute
// (with the count of those in between), so that a receiver rejecting
// every body does not flood the journal.
void OtlpHttpExporter::LogPartialSuccess(uint32_t items, uint32_t rejected,
                                         std::string_view message) {
  constexpr uint64_t kEveryNs = 60'000'000'000;
  const uint64_t now = NowNs();
  if (partial_logged_ && now - partial_logged_ns_ < kEveryNs) {
    ++partial_not_logged_;
    return;
  }
  const std::string since =
      partial_not_logged_ == 0
          ? std::string()
          : fmt::format(" ({} more partial successes since the last line)",
                        partial_not_logged_);
  const std::string_view why = message.empty() ? "no message" : message;
  if (rejected > 0) {
    spdlog::warn("OTLP: {} rejected {} of {} items: {}{}", config_.endpoint,
                 rejected, items, why, since);
  } else {
    spdlog::warn("OTLP: {} accepted {} items with a warning: {}{}",
                 config_.endpoint, items, why, since);
  }
  partial_logged_ = true;
  partial_logged_ns_ = now;
  partial_not_logged_ = 0;
}

// The deadline: everything still out of the queue or in it fails.
void OtlpHttpExporter::Abandon(std::string_view why) {
  for (auto& slot : slots_) {
    if (slot->body == nullptr) continue;
    if (slot->in_curl) {
      curl_multi_remove_handle(static_cast<CURLM*>(multi_), slot->easy);
      slot->in_curl = false;
    }
    if (slot->waiting) uv_timer_stop(&slot->retry_timer);
    Finish(slot.get(), ExportResult::Kind::kFailed, 0, 0, why);
  }
  Counters& c = *counters_;
  while (!queue_.empty()) {
    std::unique_ptr<Body> b = std::move(queue_.front());
    queue_.pop_front();
    Sub(c.queued_items, b->items);
    Sub(c.queued_bytes, b->payload.size());
    Add(c.failed_items, b->items);
    if (options_.on_result) {
      ExportResult r;
      r.kind = ExportResult::Kind::kFailed;
      r.items = b->items;
      r.detail = why;
      options_.on_result(r);
    }
  }
}

void OtlpHttpExporter::Shutdown(uint64_t deadline_ns,
                                std::function<void()> done) {
  if (shutting_down_) std::abort();  // Call once.
  shutting_down_ = true;
  deadline_ns_ = deadline_ns;
  done_ = std::move(done);
  StartDeadlineTimer();
  // A body waiting for a retry that would start after the deadline fails
  // now rather than at the deadline.
  for (auto& slot : slots_) {
    if (slot->waiting && slot->retry_at_ns > deadline_ns) {
      uv_timer_stop(&slot->retry_timer);
      Finish(slot.get(), ExportResult::Kind::kFailed, 0, 0,
             "shutdown deadline before the next attempt");
    }
  }
  Pump();
  AfterEvent();
}

// Rounded up, from the current time (the loop's cached time may be
// behind); OnRetryTimer re-arms if libuv's coarser clock still fires it
// early, so that a Retry-After of 1 s never retries after 999 ms.
void OtlpHttpExporter::StartRetryTimer(Slot* slot) {
  const uint64_t now = NowNs();
  const uint64_t wait_ms = slot->retry_at_ns > now
                               ? (slot->retry_at_ns - now + 999'999) / 1'000'000
                               : 0;
  uv_update_time(loop_);
  uv_timer_start(&slot->retry_timer, OnRetryTimer, wait_ms, 0);
}

void OtlpHttpExporter::StartDeadlineTimer() {
  const uint64_t now = NowNs();
  const uint64_t wait_ms =
      deadline_ns_ > now ? (deadline_ns_ - now + 999'999) / 1'000'000 : 0;
  uv_update_time(loop_);
  uv_timer_start(&deadline_timer_, OnDeadline, wait_ms, 0);
}

void OtlpHttpExporter::AfterEvent() {
  if (dispatch_depth_ > 0 || !shutting_down_ || closing_) return;
  if (!queue_.empty()) return;
  for (const auto& slot : slots_) {
    if (slot->body != nullptr) return;
  }
  BeginClose();
}

void OtlpHttpExporter::BeginClose() {
  closing_ = true;
  uv_timer_stop(&deadline_timer_);
  CURLM* multi = static_cast<CURLM*>(multi_);
  for (auto& slot : slots_) {
    if (slot->in_curl) curl_multi_remove_handle(multi, slot->easy);
    slot->in_curl = false;
    curl_easy_cleanup(slot->easy);
    slot->easy = nullptr;
  }
  // Closes the cached connections; curl may report their sockets removed
  // (OnCurlSocket closes those watches).
  curl_multi_cleanup(multi);
  multi_ = nullptr;
  while (watches_ != nullptr) {
    SocketWatch* w = watches_;
    watches_ = w->next;
    w->next = w->prev = nullptr;
    uv_poll_stop(&w->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), [](uv_handle_t* h) {
      auto* watch = static_cast<SocketWatch*>(h->data);
      OtlpHttpExporter* owner = watch->owner;
      delete watch;
      owner->HandleClosed();
    });
  }
  CloseHandle(reinterpret_cast<uv_handle_t*>(&curl_timer_));
  CloseHandle(reinterpret_cast<uv_handle_t*>(&deadline_timer_));
  for (auto& slot : slots_) {
    CloseHandle(reinterpret_cast<uv_handle_t*>(&slot->retry_timer));
  }
}

void OtlpHttpExporter::CloseHandle(uv_handle_t* handle) {
  handle->data = this;
  uv_close(handle, [](uv_handle_t* h) {
    static_cast<OtlpHttpExporter*>(h->data)->HandleClosed();
  });
}

void OtlpHttpExporter::HandleClosed() {
  if (--open_handles_ > 0) return;
  std::function<void()> done = std::move(done_);
  if (done) done();
}

int OtlpHttpExporter::OnCurlSocket(void* /*easy*/, int s, int what, void* userp,
                                   void* socketp) {
  auto* self = static_cast<OtlpHttpExporter*>(userp);
  auto* watch = static_cast<SocketWatch*>(socketp);
  if (what == CURL_POLL_REMOVE) {
    if (watch != nullptr) {
      if (!self->closing_) {
        curl_multi_assign(static_cast<CURLM*>(self->multi_), s, nullptr);
      }
      // Unlink, stop, close; freed in the close callback.
      if (watch->prev != nullptr) watch->prev->next = watch->next;
      if (watch->next != nullptr) watch->next->prev = watch->prev;
      if (self->watches_ == watch) self->watches_ = watch->next;
      watch->next = watch->prev = nullptr;
      uv_poll_stop(&watch->poll);
      uv_close(reinterpret_cast<uv_handle_t*>(&watch->poll),
               [](uv_handle_t* h) {
                 auto* w = static_cast<SocketWatch*>(h->data);
                 OtlpHttpExporter* owner = w->owner;
                 delete w;
                 owner->HandleClosed();
               });
    }
    return 0;
  }
  if (self->closing_) return 0;
  if (watch == nullptr) {
    watch = new SocketWatch;
    watch->owner = self;
    watch->socket = s;
    if (uv_poll_init_socket(self->loop_, &watch->poll, s) != 0) {
      delete watch;
      return -1;
    }
    watch->poll.data = watch;
    ++self->open_handles_;
    watch->next = self->watches_;
    if (self->watches_ != nullptr) self->watches_->prev = watch;
    self->watches_ = watch;
    curl_multi_assign(static_cast<CURLM*>(self->multi_), s, watch);
  }
  int events = 0;
  if ((what & CURL_POLL_IN) != 0) events |= UV_READABLE;
  if ((what & CURL_POLL_OUT) != 0) events |= UV_WRITABLE;
  uv_poll_start(&watch->poll, events, OnPoll);
  return 0;
}

int OtlpHttpExporter::OnCurlTimer(void* /*multi*/, long timeout_ms,
                                  void* userp) {
  auto* self = static_cast<OtlpHttpExporter*>(userp);
  if (self->closing_) return 0;
  if (timeout_ms < 0) {
    uv_timer_stop(&self->curl_timer_);
  } else {
    uv_timer_start(&self->curl_timer_, OnCurlTimeout,
                   static_cast<uint64_t>(timeout_ms), 0);
  }
  return 0;
}

void OtlpHttpExporter::OnCurlTimeout(uv_timer_t* timer) {
  auto* self = static_cast<OtlpHttpExporter*>(timer->data);
  if (self->multi_ == nullptr) return;
  ++self->dispatch_depth_;
  int running = 0;
  curl_multi_socket_action(static_cast<CURLM*>(self->multi_),
                           CURL_SOCKET_TIMEOUT, 0, &running);
  self->ReadCompletions();
  --self->dispatch_depth_;
  self->AfterEvent();
}

void OtlpHttpExporter::OnPoll(uv_poll_t* poll, int status, int events) {
  auto* watch = static_cast<SocketWatch*>(poll->data);
  OtlpHttpExporter* self = watch->owner;
  if (self->multi_ == nullptr) return;
  int flags = 0;
  if (status < 0) {
    flags = CURL_CSELECT_ERR;
  } else {
    if ((events & UV_READABLE) != 0) flags |= CURL_CSELECT_IN;
    if ((events & UV_WRITABLE) != 0) flags |= CURL_CSELECT_OUT;
  }
  ++self->dispatch_depth_;
  int running = 0;
  // The watch may be closed (and the socket with it) during this call.
  curl_multi_socket_action(static_cast<CURLM*>(self->multi_), watch->socket,
                           flags, &running);
  self->ReadCompletions();
  --self->dispatch_depth_;
  self->AfterEvent();
}

void OtlpHttpExporter::OnRetryTimer(uv_timer_t* timer) {
  auto* slot = static_cast<Slot*>(timer->data);
  OtlpHttpExporter* self = slot->owner;
  if (self->NowNs() < slot->retry_at_ns) {
    self->StartRetryTimer(slot);
    return;
  }
  slot->waiting = false;
  ++self->dispatch_depth_;
  self->StartAttempt(slot);
  if (slot->body == nullptr) self->Pump();  // The attempt could not start.
  --self->dispatch_depth_;
  self->AfterEvent();
}

void OtlpHttpExporter::OnDeadline(uv_timer_t* timer) {
  auto* self = static_cast<OtlpHttpExporter*>(timer->data);
  // libuv timers count whole milliseconds of the loop's clock; the
  // deadline is the options' clock's.
  if (self->NowNs() < self->deadline_ns_) {
    self->StartDeadlineTimer();
    return;
  }
  ++self->dispatch_depth_;
  self->Abandon("shutdown deadline");
  --self->dispatch_depth_;
  self->AfterEvent();
}

}  // namespace tokenmeter::daemon::otlp
