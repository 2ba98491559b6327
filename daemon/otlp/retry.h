// The OTLP exporter's retry rules, as pure functions (no clock, no
// randomness of their own), so that tests can pin every case.
//
// OpenTelemetry's OTLP/HTTP rules: 429, 502, 503 and 504 are retryable,
// honouring Retry-After; every other 4xx/5xx is a permanent failure;
// connection failures and timeouts are retryable. The backoff is
// exponential (initial 1 s, doubling, at most 32 s) with jitter, and
// retries stop once a bound on attempts or on the time since the first
// attempt would be passed.
#ifndef TOKENMETER_DAEMON_OTLP_RETRY_H_
#define TOKENMETER_DAEMON_OTLP_RETRY_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace tokenmeter::daemon::otlp {

struct RetryPolicy {
  uint64_t initial_backoff_ns = 1'000'000'000;
  uint64_t max_backoff_ns = 32'000'000'000;
  // No retry is scheduled that would start later than this after the
  // first attempt started (the OpenTelemetry Go SDK's MaxElapsedTime).
  uint64_t max_elapsed_ns = 60'000'000'000;
  // Attempts per body, the first included; >= 1.
  uint32_t max_attempts = 8;
};

enum class Outcome : uint8_t { kExported, kRetry, kFailed };

// The outcome of an HTTP response: 2xx exported; 429, 502, 503, 504
// retry; anything else failed.
Outcome ClassifyHttpStatus(long status);

// The outcome of a transfer that ended without a response, by libcurl's
// CURLcode: could not resolve or connect, timed out, send/receive errors,
// an empty or cut reply, a TLS handshake that broke off (not a
// verification failure), HTTP/2 stream errors: retry. Anything else
// (certificate problems, a bad URL, out of memory): failed.
Outcome ClassifyTransportError(int curl_code);

// A Retry-After value (RFC 9110 10.2.3): delta-seconds ("120") or an
// HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT", also the RFC 850 and
// asctime forms), as nanoseconds from now; a date in the past gives 0.
// nullopt: empty or unparsable (then the backoff alone decides). Values
// over a day are clamped to a day.
std::optional<uint64_t> ParseRetryAfterNs(std::string_view value,
                                          int64_t now_unix_s);

// The backoff before retry number `retry` (1 for the first retry):
// d = min(initial * 2^(retry-1), max), then a point drawn uniformly in
// [d/2, d] by `unit_random` in [0, 1) ("equal jitter": never more than
// the cap, never less than half of it).
uint64_t BackoffNs(const RetryPolicy& policy, uint32_t retry,
                   double unit_random);

// What to do after attempt number `attempts` (1-based) failed
// retryably, `elapsed_ns` after the first attempt started: the delay
// before the next attempt (the larger of the backoff and Retry-After),
// or nullopt to give up, because `attempts` reached max_attempts or
// elapsed + delay would pass max_elapsed_ns or `budget_ns` (the time
// left before a shutdown deadline; UINT64_MAX when none).
std::optional<uint64_t> NextRetryDelayNs(const RetryPolicy& policy,
                                         uint32_t attempts, uint64_t elapsed_ns,
                                         std::optional<uint64_t> retry_after_ns,
                                         double unit_random,
                                         uint64_t budget_ns);

}  // namespace tokenmeter::daemon::otlp

#endif  // TOKENMETER_DAEMON_OTLP_RETRY_H_
