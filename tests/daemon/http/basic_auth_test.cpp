// BasicAuth's cache (a hit proves the password, failures never cached,
// bounded with least-recently-used eviction) and BasicAuthVerifier (bcrypt
// on libuv's thread pool, a bounded number in flight, callers that leave
// while their check runs). The loop runs on the test thread.
#include "daemon/http/basic_auth.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test_certs.h"
#include "testutil/poll.h"

namespace tokenmeter::daemon::http {
namespace {

using Decision = BasicAuth::Decision;
using Result = BasicAuthVerifier::Result;
using testutil::Basic;
using testutil::BcryptHash;
using testutil::PollUntil;

std::unique_ptr<BasicAuth> MakeAuth(
    const std::map<std::string, std::string>& users,
    BasicAuth::Options options = BasicAuth::Options()) {
  std::unique_ptr<BasicAuth> auth;
  Status s = BasicAuth::Create(users, options, &auth);
  EXPECT_TRUE(s.ok()) << s.message();
  return auth;
}

// Decide(), then for a miss Run() and, when it passes, Remember().
bool CheckThrough(BasicAuth& auth, const std::string& authorization,
                  Decision* first) {
  BasicAuth::Attempt attempt;
  *first = auth.Decide(authorization, &attempt);
  if (*first != Decision::kNeedsBcrypt) return *first == Decision::kAllowed;
  if (!attempt.Run()) return false;
  auth.Remember(attempt);
  return true;
}

TEST(BasicAuthTest, CacheHitProvesThePassword) {
  auto auth =
      MakeAuth({{"prom", BcryptHash("pw")}, {"other", BcryptHash("pw")}});
  Decision d;
  EXPECT_TRUE(CheckThrough(*auth, Basic("prom:pw"), &d));
  EXPECT_EQ(d, Decision::kNeedsBcrypt);  // The first time: bcrypt.
  EXPECT_EQ(auth->cached(), 1u);
  EXPECT_TRUE(CheckThrough(*auth, Basic("prom:pw"), &d));
  EXPECT_EQ(d, Decision::kAllowed);  // Then the cache.
  // The same user with another password, and another user with the same
  // password, miss the cache and fail or pass on bcrypt's word alone.
  for (const char* wrong : {"prom:PW", "prom:pw ", "prom:", "prom:pwpw"}) {
    EXPECT_FALSE(CheckThrough(*auth, Basic(wrong), &d)) << wrong;
    EXPECT_EQ(d, Decision::kNeedsBcrypt) << wrong;
  }
  EXPECT_TRUE(CheckThrough(*auth, Basic("other:pw"), &d));
  EXPECT_EQ(d, Decision::kNeedsBcrypt);
  EXPECT_EQ(auth->cached(), 2u);
}

TEST(BasicAuthTest, FailuresAreNeverCached) {
  auto auth = MakeAuth({{"prom", BcryptHash("pw")}});
  Decision d;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(CheckThrough(*auth, Basic("prom:guess"), &d));
    EXPECT_EQ(d, Decision::kNeedsBcrypt);
    // An unknown user costs a bcrypt too (against a dummy hash), so timing
    // does not tell users apart, and never passes.
    EXPECT_FALSE(CheckThrough(*auth, Basic("nobody:pw"), &d));
    EXPECT_EQ(d, Decision::kNeedsBcrypt);
  }
  EXPECT_EQ(auth->cached(), 0u);
  // No credential at all is refused without a bcrypt.
  BasicAuth::Attempt attempt;
  EXPECT_EQ(auth->Decide("Bearer x", &attempt), Decision::kDenied);
  EXPECT_EQ(auth->Decide("", &attempt), Decision::kDenied);
}

TEST(BasicAuthTest, CacheEvictsTheLeastRecentlyUsed) {
  BasicAuth::Options options;
  options.cache_entries = 2;
  auto auth = MakeAuth({{"a", BcryptHash("pa")},
                        {"b", BcryptHash("pb")},
                        {"c", BcryptHash("pc")}},
                       options);
  Decision d;
  ASSERT_TRUE(CheckThrough(*auth, Basic("a:pa"), &d));
  ASSERT_TRUE(CheckThrough(*auth, Basic("b:pb"), &d));
  ASSERT_TRUE(CheckThrough(*auth, Basic("a:pa"), &d));  // a is now newest
  EXPECT_EQ(d, Decision::kAllowed);
  ASSERT_TRUE(CheckThrough(*auth, Basic("c:pc"), &d));  // evicts b
  EXPECT_EQ(d, Decision::kNeedsBcrypt);
  EXPECT_EQ(auth->cached(), 2u);
  BasicAuth::Attempt attempt;
  EXPECT_EQ(auth->Decide(Basic("a:pa"), &attempt), Decision::kAllowed);
  EXPECT_EQ(auth->Decide(Basic("c:pc"), &attempt), Decision::kAllowed);
  BasicAuth::Attempt evicted;
  EXPECT_EQ(auth->Decide(Basic("b:pb"), &evicted), Decision::kNeedsBcrypt);
  EXPECT_TRUE(evicted.Run());  // Evicted, not forgotten how to pass.
  EXPECT_EQ(auth->cached(), 2u);
}

// Zero-sized bounds are the caller's bug, not input: they abort.
TEST(BasicAuthDeathTest, ZeroBoundsAbort) {
  BasicAuth::Options no_cache;
  no_cache.cache_entries = 0;
  std::unique_ptr<BasicAuth> auth;
  EXPECT_DEATH((void)BasicAuth::Create({}, no_cache, &auth), "");
  std::shared_ptr<BasicAuth> ok = MakeAuth({});
  BasicAuthVerifier::Options no_flight;
  no_flight.max_in_flight = 0;
  EXPECT_DEATH(BasicAuthVerifier(uv_default_loop(), ok, no_flight), "");
  EXPECT_DEATH(BasicAuthVerifier(uv_default_loop(), nullptr, {}), "");
}

class BasicAuthVerifierTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    fast_hash_ = BcryptHash("pw");
    ASSERT_FALSE(fast_hash_.empty());
  }

  void TearDown() override {
    if (verifier_ != nullptr && !closed_) {
      bool drained = false;
      if (!verifier_->Close([&drained] { drained = true; })) {
        EXPECT_TRUE(PollUntil([&] {
          uv_run(&loop_, UV_RUN_NOWAIT);
          return drained;
        }));
      }
    }
    verifier_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  void MakeVerifier(std::map<std::string, std::string> users,
                    BasicAuthVerifier::Options options) {
    auth_ = MakeAuth(users);
    verifier_ = std::make_unique<BasicAuthVerifier>(&loop_, auth_, options);
  }

  // Starts a check expected to wait or run; its result lands in
  // results_[index] (nullopt until then).
  BasicAuthVerifier::Job* Pending(const std::string& user_pass) {
    const size_t index = results_.size();
    results_.emplace_back();
    BasicAuthVerifier::Job* job = nullptr;
    std::optional<Result> now = verifier_->Check(
        Basic(user_pass),
        [this, index](Result r) {
          EXPECT_FALSE(results_[index].has_value()) << "called twice";
          results_[index] = r;
          order_.push_back(index);
          max_in_flight_seen_ =
              std::max(max_in_flight_seen_, verifier_->in_flight());
        },
        &job);
    EXPECT_FALSE(now.has_value()) << user_pass;
    EXPECT_NE(job, nullptr);
    return job;
  }

  // Steps the loop until every pending check has answered.
  ::testing::AssertionResult RunUntilAnswered() {
    return PollUntil(
        [&] {
          uv_run(&loop_, UV_RUN_NOWAIT);
          for (const auto& r : results_) {
            if (!r) return false;
          }
          return true;
        },
        std::chrono::milliseconds(20000));
  }

  uv_loop_t loop_;
  std::string fast_hash_;
  std::shared_ptr<BasicAuth> auth_;
  std::unique_ptr<BasicAuthVerifier> verifier_;
  bool closed_ = false;
  std::vector<std::optional<Result>> results_;
  std::vector<size_t> order_;
  size_t max_in_flight_seen_ = 0;
};

// The loop keeps running while bcrypt runs: a 1 ms timer keeps firing
// during a cost-12 check (a quarter second of CPU or more); run on the
// loop, the check would stop it for all that time.
TEST_F(BasicAuthVerifierTest, ChecksRunOffTheLoop) {
  const std::string slow_hash = BcryptHash("pw", 12);
  ASSERT_FALSE(slow_hash.empty());
  MakeVerifier({{"prom", slow_hash}}, {});
  uv_timer_t timer;
  ASSERT_EQ(uv_timer_init(&loop_, &timer), 0);
  int ticks = 0;
  timer.data = &ticks;
  uv_timer_start(
      &timer, [](uv_timer_t* t) { ++*static_cast<int*>(t->data); }, 1, 1);
  Pending("prom:pw");
  // Check() returned before the answer: the bcrypt is on the pool.
  EXPECT_FALSE(results_[0].has_value());
  EXPECT_EQ(verifier_->in_flight(), 1u);
  ASSERT_TRUE(RunUntilAnswered());
  EXPECT_EQ(results_[0], Result::kAllowed);
  EXPECT_GE(ticks, 5) << "the loop stood still while bcrypt ran";
  uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
  uv_run(&loop_, UV_RUN_NOWAIT);  // Runs the close: `timer` is on the stack.
  // Now cached: answered at once, no callback.
  BasicAuthVerifier::Job* job = nullptr;
  EXPECT_EQ(verifier_->Check(
                Basic("prom:pw"), [](Result) { FAIL() << "called"; }, &job),
            Result::kAllowed);
  EXPECT_EQ(verifier_->in_flight(), 0u);
}

TEST_F(BasicAuthVerifierTest, AnswersAtOnceWithoutBcrypt) {
  MakeVerifier({{"prom", fast_hash_}}, {});
  BasicAuthVerifier::Job* job = nullptr;
  auto never = [](Result) { FAIL() << "called"; };
  for (const std::string& bad : {std::string(""), std::string("Basic !!!"),
                                 std::string("Bearer x"), Basic("no-colon")}) {
    EXPECT_EQ(verifier_->Check(bad, never, &job), Result::kDenied) << bad;
  }
  EXPECT_EQ(verifier_->in_flight() + verifier_->waiting(), 0u);
}

// At most max_in_flight checks on the pool; then max_waiting wait, first
// come first served; beyond, kBusy at once.
TEST_F(BasicAuthVerifierTest, InFlightAndWaitingAreBounded) {
  BasicAuthVerifier::Options options;
  options.max_in_flight = 2;
  options.max_waiting = 3;
  MakeVerifier({{"prom", BcryptHash("pw", 8)}}, options);
  for (int i = 0; i < 5; ++i) Pending(i == 4 ? "prom:pw" : "prom:wrong");
  EXPECT_EQ(verifier_->in_flight(), 2u);
  EXPECT_EQ(verifier_->waiting(), 3u);
  BasicAuthVerifier::Job* job = nullptr;
  EXPECT_EQ(verifier_->Check(
                Basic("prom:also-wrong"), [](Result) { FAIL(); }, &job),
            Result::kBusy);
  ASSERT_TRUE(RunUntilAnswered());
  EXPECT_LE(max_in_flight_seen_, 2u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results_[i], Result::kDenied) << i;
  EXPECT_EQ(results_[4], Result::kAllowed);
  // The waiting ones started in order, each when a check ended: waiting
  // check k (2, 3, 4) started after k - 1 answers, so at least k - 1 came
  // before its own. (Checks running side by side may end in any order on
  // a loaded machine: the answers' order alone says no more.)
  for (size_t k = 2; k < 5; ++k) {
    const auto at = std::find(order_.begin(), order_.end(), k);
    ASSERT_NE(at, order_.end()) << k;
    EXPECT_GE(size_t(at - order_.begin()), k - 1) << k;
  }
  EXPECT_EQ(verifier_->in_flight() + verifier_->waiting(), 0u);
}

// A caller that leaves (its connection closed) is never called back; a
// waiting check is dropped, a running one finishes on the pool and a
// password that passes is still cached.
TEST_F(BasicAuthVerifierTest, AbandonedChecksNeverCallBack) {
  MakeVerifier({{"prom", BcryptHash("pw", 10)}}, {});
  BasicAuthVerifier::Job* running = Pending("prom:pw");
  BasicAuthVerifier::Job* waiting = Pending("prom:wrong");
  Pending("prom:wrong-too");
  EXPECT_EQ(verifier_->in_flight(), 1u);
  EXPECT_EQ(verifier_->waiting(), 2u);
  verifier_->Abandon(waiting);
  EXPECT_EQ(verifier_->waiting(), 1u);
  verifier_->Abandon(running);
  ASSERT_TRUE(PollUntil(
      [&] {
        uv_run(&loop_, UV_RUN_NOWAIT);
        return results_[2].has_value();
      },
      std::chrono::milliseconds(20000)));
  EXPECT_EQ(results_[2], Result::kDenied);
  EXPECT_FALSE(results_[0].has_value());
  EXPECT_FALSE(results_[1].has_value());
  EXPECT_EQ(auth_->cached(), 1u);
  BasicAuthVerifier::Job* job = nullptr;
  EXPECT_EQ(verifier_->Check(
                Basic("prom:pw"), [](Result) { FAIL(); }, &job),
            Result::kAllowed);
}

// Close() drops the waiting checks, waits for the running one (drained()
// runs once it is off the pool), and answers later checks kBusy.
TEST_F(BasicAuthVerifierTest, CloseWaitsForTheRunningCheck) {
  MakeVerifier({{"prom", BcryptHash("pw", 10)}}, {});
  Pending("prom:wrong");
  Pending("prom:wrong");
  bool drained = false;
  closed_ = true;
  ASSERT_FALSE(verifier_->Close([&drained] { drained = true; }));
  EXPECT_EQ(verifier_->waiting(), 0u);
  BasicAuthVerifier::Job* job = nullptr;
  EXPECT_EQ(verifier_->Check(
                Basic("prom:pw"), [](Result) { FAIL(); }, &job),
            Result::kBusy);
  EXPECT_TRUE(PollUntil([&] {
    uv_run(&loop_, UV_RUN_NOWAIT);
    return drained;
  }));
  EXPECT_EQ(verifier_->in_flight(), 0u);
  EXPECT_FALSE(results_[0].has_value());
  EXPECT_FALSE(results_[1].has_value());
  // Nothing left: a second verifier closes at once.
  BasicAuthVerifier idle(&loop_, auth_, {});
  EXPECT_TRUE(idle.Close([] { FAIL(); }));
}

}  // namespace
}  // namespace tokenmeter::daemon::http
