#include "daemon/otlp/retry.h"

#include <curl/curl.h>

#include <algorithm>
#include <charconv>
#include <string>

namespace tokenmeter::daemon::otlp {
namespace {

constexpr uint64_t kNsPerS = 1'000'000'000;
constexpr uint64_t kMaxRetryAfterS = 86'400;

}  // namespace

Outcome ClassifyHttpStatus(long status) {
  if (status >= 200 && status < 300) return Outcome::kExported;
  switch (status) {
    case 429:
    case 502:
    case 503:
    case 504:
      return Outcome::kRetry;
    default:
      return Outcome::kFailed;
  }
}

Outcome ClassifyTransportError(int curl_code) {
  switch (static_cast<CURLcode>(curl_code)) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_HTTP2:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
      return Outcome::kRetry;
    default:
      return Outcome::kFailed;
  }
}

std::optional<uint64_t> ParseRetryAfterNs(std::string_view value,
                                          int64_t now_unix_s) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
    value.remove_prefix(1);
  }
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
    value.remove_suffix(1);
  }
  if (value.empty()) return std::nullopt;
  if (value.front() >= '0' && value.front() <= '9') {
    uint64_t s = 0;
    auto [end, ec] =
        std::from_chars(value.data(), value.data() + value.size(), s);
    if (end != value.data() + value.size()) return std::nullopt;
    if (ec == std::errc::result_out_of_range)
      s = kMaxRetryAfterS;
    else if (ec != std::errc())
      return std::nullopt;
    return std::min(s, kMaxRetryAfterS) * kNsPerS;
  }
  // curl_getdate: RFC 1123, RFC 850 and asctime forms; -1 when unparsable.
  const std::string copy(value);
  const time_t when = curl_getdate(copy.c_str(), nullptr);
  if (when == -1) return std::nullopt;
  if (when <= now_unix_s) return 0;
  const auto ahead = static_cast<uint64_t>(when - now_unix_s);
  return std::min(ahead, kMaxRetryAfterS) * kNsPerS;
}

uint64_t BackoffNs(const RetryPolicy& policy, uint32_t retry,
                   double unit_random) {
  uint64_t d = policy.initial_backoff_ns;
  for (uint32_t i = 1; i < retry && d < policy.max_backoff_ns; ++i) {
    d = d > policy.max_backoff_ns / 2 ? policy.max_backoff_ns : d * 2;
  }
  d = std::min(d, policy.max_backoff_ns);
  unit_random = std::clamp(unit_random, 0.0, 1.0);
  const uint64_t half = d / 2;
  return half +
         static_cast<uint64_t>(static_cast<double>(d - half) * unit_random);
}

std::optional<uint64_t> NextRetryDelayNs(const RetryPolicy& policy,
                                         uint32_t attempts, uint64_t elapsed_ns,
                                         std::optional<uint64_t> retry_after_ns,
                                         double unit_random,
                                         uint64_t budget_ns) {
  if (attempts >= std::max<uint32_t>(policy.max_attempts, 1)) {
    return std::nullopt;
  }
  uint64_t delay = BackoffNs(policy, attempts, unit_random);
  if (retry_after_ns.has_value()) delay = std::max(delay, *retry_after_ns);
  if (elapsed_ns > policy.max_elapsed_ns ||
      delay > policy.max_elapsed_ns - elapsed_ns || delay > budget_ns) {
    return std::nullopt;
  }
  return delay;
}

}  // namespace tokenmeter::daemon::otlp
