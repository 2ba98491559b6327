// RequestKeeper: which requests it keeps and shows (the slowest and the
// failed of the window, at most `keep` per series), checked against a
// brute-force model over random streams, and what it takes from the
// tracker's timeline.
#include "daemon/requests/request_keeper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace tokenmeter::daemon::requests {
namespace {

constexpr uint64_t kSec = 1'000'000'000;

trace::RequestTimeline Request(int id, uint64_t arrived, uint64_t e2e,
                               const std::string& reason = "stop",
                               const std::string& engine = "0") {
  trace::RequestTimeline t;
  t.request_id = std::to_string(id);
  t.profile = "vllm";
  t.engine_family = "vllm";
  t.engine_labels = {{"model_name", "m"}, {"engine", engine}};
  t.arrived_ns = arrived;
  t.finished_ns = arrived + e2e;
  t.finish_reason = reason;
  return t;
}

std::vector<std::string> Ids(const SeriesRequests& s) {
  std::vector<std::string> ids;
  for (const KeptRequest* k : s.requests)
    ids.push_back(k->timeline->request_id);
  return ids;
}

TEST(RequestKeeperTest, ShowsFailedNewestFirstThenSlowest) {
  RequestKeeper k({.keep = 4, .window_ns = 900 * kSec});
  const uint64_t t0 = 1000 * kSec;
  int id = 0;
  for (uint64_t e2e : {5, 1, 9, 3, 7, 2}) {
    ++id;
    trace::RequestTimeline t = Request(id, t0 + id * kSec, e2e * kSec);
    k.OnRetired(t, false);
  }
  trace::RequestTimeline a = Request(100, t0 + 10 * kSec, kSec / 2, "abort");
  k.OnRetired(a, false);
  trace::RequestTimeline e = Request(101, t0 + 11 * kSec, kSec / 4, "error");
  k.OnRetired(e, false);
  const std::vector<SeriesRequests> shown = k.Select(t0 + 20 * kSec);
  ASSERT_EQ(shown.size(), 1u);
  EXPECT_EQ(Ids(shown[0]), (std::vector<std::string>{"101", "100", "3", "5"}));
  EXPECT_TRUE(shown[0].requests[0]->failed);
  EXPECT_EQ(shown[0].requests[2]->e2e_ns, 9 * kSec);
}

TEST(RequestKeeperTest, TakesTheTimelineItKeepsAndSkipsUnfinishedOnes) {
  RequestKeeper k({.keep = 2, .window_ns = 900 * kSec});
  trace::RequestTimeline t = Request(1, 10 * kSec, kSec);
  t.tokens = {{10 * kSec + 5, 1}, {10 * kSec + 9, 2}};
  k.OnRetired(t, false);
  EXPECT_TRUE(t.tokens.empty());  // moved out
  trace::RequestTimeline evicted = Request(2, 10 * kSec, kSec);
  k.OnRetired(evicted, true);
  trace::RequestTimeline unfinished = Request(3, 10 * kSec, kSec);
  unfinished.finished_ns = 0;
  k.OnRetired(unfinished, false);
  EXPECT_EQ(evicted.request_id, "2");  // not taken
  EXPECT_EQ(k.held(), 1u);
  const auto shown = k.Select(12 * kSec);
  ASSERT_EQ(shown.size(), 1u);
  EXPECT_EQ(shown[0].requests[0]->timeline->tokens.size(), 2u);
}

TEST(RequestKeeperTest, ForgetsWhatFinishedBeforeTheWindowAndEmptySeries) {
  RequestKeeper k({.keep = 3, .window_ns = 60 * kSec});
  trace::RequestTimeline a = Request(1, 0, 10 * kSec, "stop", "a");
  trace::RequestTimeline b = Request(2, 50 * kSec, 10 * kSec, "error", "b");
  k.OnRetired(a, false);
  k.OnRetired(b, false);
  EXPECT_EQ(k.Select(70 * kSec).size(), 2u);  // a finished at 10 s
  const auto shown = k.Select(71 * kSec);     // 10 s < 71 - 60
  ASSERT_EQ(shown.size(), 1u);
  EXPECT_EQ(shown[0].first->engine_labels[1].second, "b");
  EXPECT_EQ(k.Select(121 * kSec).size(), 0u);
  EXPECT_EQ(k.held(), 0u);
}

TEST(RequestKeeperTest, KeepsTheNewestFailedOnes) {
  RequestKeeper k({.keep = 2, .window_ns = 900 * kSec});
  for (int i = 1; i <= 5; ++i) {
    trace::RequestTimeline t = Request(i, i * kSec, kSec, "abort");
    k.OnRetired(t, false);
  }
  const auto shown = k.Select(10 * kSec);
  ASSERT_EQ(shown.size(), 1u);
  EXPECT_EQ(Ids(shown[0]), (std::vector<std::string>{"5", "4"}));
}

// The exact answer, from every request of the window.
std::vector<std::string> Model(const std::vector<trace::RequestTimeline>& all,
                               uint64_t now, uint64_t window, size_t keep) {
  std::vector<const trace::RequestTimeline*> failed, slow;
  for (const auto& t : all) {
    if (t.finished_ns + window < now) continue;
    const bool f = t.finish_reason == "abort" || t.finish_reason == "error";
    (f ? failed : slow).push_back(&t);
  }
  std::vector<std::string> out;
  for (auto it = failed.rbegin(); it != failed.rend() && out.size() < keep;
       ++it) {
    out.push_back((*it)->request_id);
  }
  std::reverse(slow.begin(), slow.end());  // newest first
  std::stable_sort(slow.begin(), slow.end(), [](auto* a, auto* b) {
    return a->finished_ns - a->arrived_ns > b->finished_ns - b->arrived_ns;
  });
  for (size_t i = 0; i < slow.size() && out.size() < keep; ++i) {
    out.push_back(slow[i]->request_id);
  }
  return out;
}

// Random e2e times (with ties), random failures, requests retired in
// finish order, looked at now and then: always the brute-force answer,
// while holding far fewer than the window's requests.
TEST(RequestKeeperTest, EqualsTheExactSlidingWindowAnswer) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const size_t keep = 1 + rng() % 6;
    const uint64_t window = 10 * kSec;  // about 200 requests
    RequestKeeper k({.keep = keep, .window_ns = window});
    std::vector<trace::RequestTimeline> all;
    uint64_t now = 100 * kSec;
    size_t max_held = 0;
    for (int i = 0; i < 3000; ++i) {
      now += rng() % (kSec / 10);
      const uint64_t e2e = (1 + rng() % 40) * (kSec / 20);
      const uint32_t r = rng() % 50;
      const std::string reason = r == 0 ? "error" : r == 1 ? "abort" : "stop";
      trace::RequestTimeline t = Request(i, now - e2e, e2e, reason);
      all.push_back(t);
      k.OnRetired(t, false);
      max_held = std::max(max_held, k.held());
      if (i % 97 == 0 || i == 2999) {
        const uint64_t at = now + rng() % (2 * kSec);
        const auto shown = k.Select(at);
        const auto want = Model(all, at, window, keep);
        ASSERT_EQ(shown.empty() ? std::vector<std::string>{} : Ids(shown[0]),
                  want)
            << "seed " << seed << " at request " << i;
      }
    }
    EXPECT_LE(max_held, k.MaxCandidates() + keep);
    EXPECT_LT(max_held, 80u) << "the window held far more";
    EXPECT_EQ(k.capped(), 0u) << "seed " << seed << ": the cap was reached";
  }
}

// Ever faster requests: none is ever beaten, so the cap decides, and the
// slowest stay.
TEST(RequestKeeperTest, CapsTheCandidatesByForgettingTheFastest) {
  const size_t keep = 3;
  RequestKeeper k({.keep = keep, .window_ns = 900 * kSec});
  for (int i = 0; i < 200; ++i) {
    trace::RequestTimeline t =
        Request(i, 10 * kSec + i * kSec, (300 - i) * (kSec / 100));
    k.OnRetired(t, false);
    EXPECT_LE(k.held(), k.MaxCandidates());
  }
  EXPECT_EQ(k.capped(), 200 - k.MaxCandidates());
  const auto shown = k.Select(300 * kSec);
  ASSERT_EQ(shown.size(), 1u);
  EXPECT_EQ(Ids(shown[0]), (std::vector<std::string>{"0", "1", "2"}));
}

TEST(RequestKeeperTest, KeepsSeriesApart) {
  RequestKeeper k({.keep = 1, .window_ns = 900 * kSec});
  trace::RequestTimeline a = Request(1, kSec, kSec, "stop", "0");
  trace::RequestTimeline b = Request(2, kSec, 2 * kSec, "stop", "1");
  trace::RequestTimeline c = Request(3, kSec, 3 * kSec, "stop", "0");
  c.profile = "sglang";  // same labels, another profile
  // Same labels and profile, another engine family (a tokenmeter-engine
  // beside a vLLM, both of the vllm profile).
  trace::RequestTimeline d = Request(4, kSec, 4 * kSec, "stop", "0");
  d.engine_family = "tokenmeter_engine";
  k.OnRetired(a, false);
  k.OnRetired(b, false);
  k.OnRetired(c, false);
  k.OnRetired(d, false);
  const auto shown = k.Select(10 * kSec);
  ASSERT_EQ(shown.size(), 4u);
  std::vector<std::string> ids;
  for (const SeriesRequests& s : shown) {
    ASSERT_EQ(s.requests.size(), 1u);
    ids.push_back(s.requests[0]->timeline->request_id);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"1", "2", "3", "4"}));
}

}  // namespace
}  // namespace tokenmeter::daemon::requests
