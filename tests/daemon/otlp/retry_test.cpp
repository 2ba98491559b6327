// The retry rules: which answers retry, Retry-After in both forms, the
// backoff's growth, cap and jitter range, and the give-up bounds.
#include "daemon/otlp/retry.h"

#include <curl/curl.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

namespace tokenmeter::daemon::otlp {
namespace {

constexpr uint64_t kS = 1'000'000'000;
constexpr uint64_t kNoBudget = UINT64_MAX;
// Wed, 21 Oct 2015 07:28:00 GMT
constexpr int64_t kDate = 1445412480;

TEST(RetryTest, HttpStatusClasses) {
  for (long s : {200L, 201L, 202L, 204L, 299L}) {
    EXPECT_EQ(ClassifyHttpStatus(s), Outcome::kExported) << s;
  }
  for (long s : {429L, 502L, 503L, 504L}) {
    EXPECT_EQ(ClassifyHttpStatus(s), Outcome::kRetry) << s;
  }
  for (long s : {100L, 301L, 304L, 400L, 401L, 403L, 404L, 408L, 413L, 415L,
                 500L, 501L, 505L}) {
    EXPECT_EQ(ClassifyHttpStatus(s), Outcome::kFailed) << s;
  }
}

TEST(RetryTest, TransportErrorClasses) {
  for (CURLcode c :
       {CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT, CURLE_RECV_ERROR,
        CURLE_SEND_ERROR, CURLE_GOT_NOTHING, CURLE_COULDNT_RESOLVE_HOST,
        CURLE_PARTIAL_FILE, CURLE_SSL_CONNECT_ERROR, CURLE_HTTP2_STREAM}) {
    EXPECT_EQ(ClassifyTransportError(c), Outcome::kRetry) << c;
  }
  for (CURLcode c : {CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM,
                     CURLE_SSL_CACERT_BADFILE, CURLE_URL_MALFORMAT,
                     CURLE_UNSUPPORTED_PROTOCOL, CURLE_OUT_OF_MEMORY,
                     CURLE_ABORTED_BY_CALLBACK}) {
    EXPECT_EQ(ClassifyTransportError(c), Outcome::kFailed) << c;
  }
}

TEST(RetryTest, RetryAfterDeltaSeconds) {
  EXPECT_EQ(ParseRetryAfterNs("0", kDate), 0u);
  EXPECT_EQ(ParseRetryAfterNs("1", kDate), kS);
  EXPECT_EQ(ParseRetryAfterNs(" 120 ", kDate), 120 * kS);
  EXPECT_EQ(ParseRetryAfterNs("86401", kDate), 86400 * kS);  // Clamped.
  EXPECT_EQ(ParseRetryAfterNs("999999999999999999999999", kDate), 86400 * kS);
}

TEST(RetryTest, RetryAfterHttpDates) {
  // The three forms RFC 9110 requires a recipient to read.
  EXPECT_EQ(ParseRetryAfterNs("Wed, 21 Oct 2015 07:28:30 GMT", kDate), 30 * kS);
  EXPECT_EQ(ParseRetryAfterNs("Wednesday, 21-Oct-15 07:28:05 GMT", kDate),
            5 * kS);
  EXPECT_EQ(ParseRetryAfterNs("Wed Oct 21 07:29:00 2015", kDate), 60 * kS);
  // In the past: now.
  EXPECT_EQ(ParseRetryAfterNs("Wed, 21 Oct 2015 07:00:00 GMT", kDate), 0u);
  // Far ahead: clamped to a day.
  EXPECT_EQ(ParseRetryAfterNs("Fri, 21 Oct 2016 07:28:00 GMT", kDate),
            86400 * kS);
}

TEST(RetryTest, RetryAfterUnparsable) {
  for (const char* v : {"", "  ", "-1", "1.5", "12abc", "soon",
                        "Wed, 32 Foo 2015 99:99:99 GMT"}) {
    EXPECT_EQ(ParseRetryAfterNs(v, kDate), std::nullopt) << v;
  }
}

TEST(RetryTest, BackoffDoublesToTheCapWithEqualJitter) {
  const RetryPolicy p;  // 1 s, 32 s.
  const uint64_t want_max[] = {1, 2, 4, 8, 16, 32, 32, 32};
  for (uint32_t retry = 1; retry <= 8; ++retry) {
    SCOPED_TRACE(retry);
    const uint64_t d = want_max[retry - 1] * kS;
    EXPECT_EQ(BackoffNs(p, retry, 0.0), d / 2);
    EXPECT_EQ(BackoffNs(p, retry, 0.5), d / 2 + d / 4);
    EXPECT_EQ(BackoffNs(p, retry, 1.0), d);
  }
  // Many doublings never overflow.
  EXPECT_EQ(BackoffNs(p, 1000, 1.0), 32 * kS);
  // Out-of-range randomness is clamped.
  EXPECT_EQ(BackoffNs(p, 1, 7.0), kS);
  EXPECT_EQ(BackoffNs(p, 1, -1.0), kS / 2);
}

TEST(RetryTest, NextDelayIsTheLargerOfBackoffAndRetryAfter) {
  const RetryPolicy p;
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, std::nullopt, 1.0, kNoBudget), kS);
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, 5 * kS, 1.0, kNoBudget), 5 * kS);
  EXPECT_EQ(NextRetryDelayNs(p, 3, 0, kS / 10, 1.0, kNoBudget), 4 * kS);
}

TEST(RetryTest, GivesUpAtMaxAttempts) {
  RetryPolicy p;
  p.max_attempts = 3;
  EXPECT_TRUE(NextRetryDelayNs(p, 2, 0, std::nullopt, 0, kNoBudget));
  EXPECT_EQ(NextRetryDelayNs(p, 3, 0, std::nullopt, 0, kNoBudget),
            std::nullopt);
  p.max_attempts = 1;  // No retry at all.
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, std::nullopt, 0, kNoBudget),
            std::nullopt);
}

TEST(RetryTest, GivesUpPastMaxElapsed) {
  RetryPolicy p;
  p.max_elapsed_ns = 10 * kS;
  EXPECT_EQ(NextRetryDelayNs(p, 1, 9 * kS, std::nullopt, 1.0, kNoBudget), kS);
  EXPECT_EQ(NextRetryDelayNs(p, 1, 9 * kS + 1, std::nullopt, 1.0, kNoBudget),
            std::nullopt);
  EXPECT_EQ(NextRetryDelayNs(p, 1, 11 * kS, std::nullopt, 0, kNoBudget),
            std::nullopt);
  // A Retry-After beyond the bound gives up at once instead of waiting.
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, 3600 * kS, 0, kNoBudget), std::nullopt);
}

TEST(RetryTest, GivesUpPastTheShutdownBudget) {
  const RetryPolicy p;
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, std::nullopt, 1.0, kS), kS);
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, std::nullopt, 1.0, kS - 1), std::nullopt);
  EXPECT_EQ(NextRetryDelayNs(p, 1, 0, std::nullopt, 0.0, 0), std::nullopt);
}

}  // namespace
}  // namespace tokenmeter::daemon::otlp
