// Bounded polling for tests: instead of sleeping for a fixed time and hoping
// the other side is done, call a condition until it holds or a deadline
// passes, and fail with a message that says how long it waited.
#ifndef TOKENMETER_TESTS_TESTUTIL_POLL_H_
#define TOKENMETER_TESTS_TESTUTIL_POLL_H_

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

namespace tokenmeter::testutil {

// Generous: success paths finish in milliseconds; this only bounds a failure
// (and leaves room for sanitizer builds on a loaded machine).
inline constexpr std::chrono::milliseconds kPollTimeout{5000};
// The pause between two calls of the condition.
inline constexpr std::chrono::microseconds kPollInterval{200};

// Calls `cond` (on this thread) until it returns true or `timeout` has
// passed, pausing kPollInterval between calls; `cond` is called at least
// once, and once more after the deadline. Use it as
// `ASSERT_TRUE(PollUntil([&] { return ...; }))`: on failure the message names
// the timeout and the number of calls. `cond` may do work of its own, e.g.
// step a libuv loop with uv_run(loop, UV_RUN_NOWAIT).
[[nodiscard]] inline ::testing::AssertionResult PollUntil(
    const std::function<bool()>& cond,
    std::chrono::milliseconds timeout = kPollTimeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int calls = 1;; ++calls) {
    if (cond()) return ::testing::AssertionSuccess();
    if (std::chrono::steady_clock::now() > deadline) {
      return ::testing::AssertionFailure()
             << "the condition was still false after " << timeout.count()
             << " ms (" << calls << " checks)";
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_TESTUTIL_POLL_H_
