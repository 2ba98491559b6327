// Every input the C ABI refuses: bad event arguments (rejected and counted,
// never sent), bad option values (refused, option unchanged), and NULL
// handles. One test per error mode.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "client_fixture.h"
#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

// ---- events ----------------------------------------------------------------

class EventValidationTest : public ClientFixture {
 protected:
  // No daemon for most of these: close drops what is buffered at once.
  void SetUp() override {
    OptionsPtr opts = DefaultOptions();
    ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
    NewClient(opts.get());
  }

  uint64_t Rejected() const { return Stats()[TM_STAT_EVENTS_REJECTED]; }
  uint64_t FieldsDropped() const { return Stats()[TM_STAT_FIELDS_DROPPED]; }

  // Calls every string-id event function with (rid, len); returns how many
  // returned TM_E_INVALID.
  int InvalidStringIdCalls(const char* rid, size_t len) {
    tm_client* c = client_;
    int invalid = 0;
    invalid += tm_arrived_str(c, 1, rid, len, 1, 0, 0) == TM_E_INVALID;
    invalid += tm_arrived_packed_str(c, rid, len, 1) == TM_E_INVALID;
    invalid += tm_queued_str(c, 1, rid, len) == TM_E_INVALID;
    invalid += tm_scheduled_str(c, 1, rid, len) == TM_E_INVALID;
    invalid += tm_tokens_str(c, 1, rid, len, 1) == TM_E_INVALID;
    invalid += tm_finished_str(c, 1, rid, len, TM_FINISH_STOP) == TM_E_INVALID;
    invalid += tm_preempted_str(c, 1, rid, len) == TM_E_INVALID;
    return invalid;
  }

  // Calls tm_arrived_ex and tm_arrived_ex_str with (lora, labels,
  // n_labels); returns how many returned TM_E_INVALID.
  int InvalidArrivedExCalls(const char* lora, const tm_label* labels,
                            size_t n_labels) {
    int invalid = 0;
    invalid += tm_arrived_ex(client_, 1, 1, 1, 0, 0, lora, labels, n_labels) ==
               TM_E_INVALID;
    invalid += tm_arrived_ex_str(client_, 1, "r", 1, 1, 0, 0, lora, labels,
                                 n_labels) == TM_E_INVALID;
    return invalid;
  }
  int InvalidLabelCalls(const char* name, const char* value) {
    const tm_label label = {name, value};
    return InvalidArrivedExCalls(nullptr, &label, 1);
  }

  // Starts the daemon and checks that of the calls so far only `event`
  // reached it, and that `rejected` events were counted, also in the
  // BATCH's dropped_total.
  void ExpectOnlySent(const std::string& event, uint64_t rejected) {
    StartServer();
    ASSERT_TRUE(WaitForEvents(1));
    ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
    const StatsArray s = Stats();
    EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], rejected);
    EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 1u);
    EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
    const TestServer::Connections conns = server_->Snapshot();
    ASSERT_TRUE(IsWellFormed(conns[0]));
    const std::vector<Value> events = EventsOf(conns[0]);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].ToString(), event);
    EXPECT_EQ(BatchesOf(conns[0])[0]->value.array[2].uint, rejected);
  }

  int Step(std::vector<tm_step_key> keys, std::vector<double> values) {
    return tm_step(client_, 1, keys.data(), values.data(), keys.size(), nullptr,
                   0);
  }
  int StepOne(tm_step_key key, double value) { return Step({key}, {value}); }
};

TEST_F(EventValidationTest, RejectsStringIdLongerThan128Bytes) {
  const std::string rid(TM_MAX_RID_BYTES + 1, 'r');
  EXPECT_EQ(InvalidStringIdCalls(rid.data(), rid.size()), 7);
  EXPECT_EQ(Rejected(), 7u);
  const std::string huge(100000, 'r');
  EXPECT_EQ(InvalidStringIdCalls(huge.data(), huge.size()), 7);
  EXPECT_EQ(Rejected(), 14u);
  // Exactly 128 bytes is fine.
  EXPECT_EQ(InvalidStringIdCalls(rid.data(), TM_MAX_RID_BYTES), 0);
  EXPECT_EQ(Rejected(), 14u);
}

TEST_F(EventValidationTest, RejectsEmptyStringId) {
  EXPECT_EQ(InvalidStringIdCalls("abc", 0), 7);
  EXPECT_EQ(Rejected(), 7u);
}

TEST_F(EventValidationTest, RejectsNullStringId) {
  EXPECT_EQ(InvalidStringIdCalls(nullptr, 3), 7);
  EXPECT_EQ(Rejected(), 7u);
}

TEST_F(EventValidationTest, RejectsZeroTokens) {
  EXPECT_EQ(tm_tokens(client_, 1, 1, 0), TM_E_INVALID);
  EXPECT_EQ(tm_tokens_str(client_, 1, "a", 1, 0), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsUnknownFinishReason) {
  for (int bad : {-1, 4, 1000}) {
    const auto reason = static_cast<tm_finish_reason>(bad);
    EXPECT_EQ(tm_finished(client_, 1, 1, reason), TM_E_INVALID) << bad;
    EXPECT_EQ(tm_finished_str(client_, 1, "a", 1, reason), TM_E_INVALID) << bad;
  }
  EXPECT_EQ(Rejected(), 6u);
}

TEST_F(EventValidationTest, RejectsDuplicateStepKey) {
  EXPECT_EQ(
      Step({TM_STEP_KEY_RUNNING, TM_STEP_KEY_WAITING, TM_STEP_KEY_RUNNING},
           {1, 2, 3}),
      TM_E_INVALID);
  EXPECT_EQ(Rejected(), 1u);
}

TEST_F(EventValidationTest, RejectsOutOfRangeStepKey) {
  EXPECT_EQ(StepOne(static_cast<tm_step_key>(TM_STEP_KEY_COUNT), 1),
            TM_E_INVALID);
  EXPECT_EQ(StepOne(static_cast<tm_step_key>(-1), 1), TM_E_INVALID);
  EXPECT_EQ(StepOne(static_cast<tm_step_key>(31), 1), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(EventValidationTest, RejectsTooManyStepKeys) {
  std::vector<tm_step_key> keys;
  for (int k = 0; k < TM_STEP_KEY_COUNT; ++k) {
    keys.push_back(static_cast<tm_step_key>(k));
  }
  keys.push_back(TM_STEP_KEY_RUNNING);
  EXPECT_EQ(Step(keys, std::vector<double>(keys.size(), 0.0)), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 1u);
}

TEST_F(EventValidationTest, RejectsKvUsageOutsideZeroToOne) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {1.0000001, 2.0, -0.001, -1.0, inf, -inf,
                     std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(StepOne(TM_STEP_KEY_KV_USAGE, bad), TM_E_INVALID) << bad;
  }
  EXPECT_EQ(Rejected(), 7u);
  EXPECT_EQ(StepOne(TM_STEP_KEY_KV_USAGE, 0.0), TM_OK);
  EXPECT_EQ(StepOne(TM_STEP_KEY_KV_USAGE, 1.0), TM_OK);
  EXPECT_EQ(Rejected(), 7u);
}

TEST_F(EventValidationTest, RejectsNegativeIntegerStepValues) {
  for (int k = 0; k < TM_STEP_KEY_COUNT; ++k) {
    if (k == TM_STEP_KEY_KV_USAGE) continue;
    EXPECT_EQ(StepOne(static_cast<tm_step_key>(k), -1.0), TM_E_INVALID) << k;
  }
  EXPECT_EQ(Rejected(), uint64_t{TM_STEP_KEY_COUNT - 1});
}

TEST_F(EventValidationTest, RejectsFractionalIntegerStepValues) {
  for (int k = 0; k < TM_STEP_KEY_COUNT; ++k) {
    if (k == TM_STEP_KEY_KV_USAGE) continue;
    EXPECT_EQ(StepOne(static_cast<tm_step_key>(k), 2.5), TM_E_INVALID) << k;
  }
  EXPECT_EQ(StepOne(TM_STEP_KEY_RUNNING, 1e-9), TM_E_INVALID);
  EXPECT_EQ(Rejected(), uint64_t{TM_STEP_KEY_COUNT});
}

// The daemon skips a count above TM_MAX_EVENT_COUNT as a bad event (it
// would wrap its counters); the client refuses it first, and counts it.
TEST_F(EventValidationTest, RejectsStepCountsAboveTheEventMaximum) {
  const double max = double(TM_MAX_EVENT_COUNT);
  EXPECT_EQ(StepOne(TM_STEP_KEY_WAITING, max + 1), TM_E_INVALID);
  EXPECT_EQ(StepOne(TM_STEP_KEY_PREFIX_QUERIES, 9007199254740992.0),
            TM_E_INVALID);
  EXPECT_EQ(StepOne(TM_STEP_KEY_WAITING, 1e300), TM_E_INVALID);
  EXPECT_EQ(
      StepOne(TM_STEP_KEY_WAITING, std::numeric_limits<double>::infinity()),
      TM_E_INVALID);
  EXPECT_EQ(
      StepOne(TM_STEP_KEY_WAITING, std::numeric_limits<double>::quiet_NaN()),
      TM_E_INVALID);
  const uint64_t too_many[] = {1, uint64_t{TM_MAX_EVENT_COUNT} + 1};
  EXPECT_EQ(tm_step(client_, 1, nullptr, nullptr, 0, too_many, 2),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 6u);
  EXPECT_EQ(StepOne(TM_STEP_KEY_WAITING, max), TM_OK);
  const uint64_t most[] = {1, TM_MAX_EVENT_COUNT};
  EXPECT_EQ(tm_step(client_, 1, nullptr, nullptr, 0, most, 2), TM_OK);
  EXPECT_EQ(Rejected(), 6u);
}

TEST_F(EventValidationTest, RejectsTooManySpecPositions) {
  std::vector<uint64_t> pos(TM_MAX_SPEC_POSITIONS + 1, 1);
  EXPECT_EQ(tm_step(client_, 1, nullptr, nullptr, 0, pos.data(), pos.size()),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 1u);
  EXPECT_EQ(tm_step(client_, 1, nullptr, nullptr, 0, pos.data(),
                    TM_MAX_SPEC_POSITIONS),
            TM_OK);
  EXPECT_EQ(Rejected(), 1u);
}

TEST_F(EventValidationTest, RejectsNullStepArrays) {
  const tm_step_key key = TM_STEP_KEY_RUNNING;
  const double value = 1;
  EXPECT_EQ(tm_step(client_, 1, nullptr, &value, 1, nullptr, 0), TM_E_INVALID);
  EXPECT_EQ(tm_step(client_, 1, &key, nullptr, 1, nullptr, 0), TM_E_INVALID);
  EXPECT_EQ(tm_step(client_, 1, &key, &value, 1, nullptr, 2), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(EventValidationTest, RejectsEmptyLora) {
  EXPECT_EQ(InvalidArrivedExCalls("", nullptr, 0), 2);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsLoraLongerThan128Bytes) {
  const std::string lora(TM_MAX_LORA_BYTES + 1, 'l');
  EXPECT_EQ(InvalidArrivedExCalls(lora.c_str(), nullptr, 0), 2);
  EXPECT_EQ(Rejected(), 2u);
  const std::string huge(100000, 'l');
  EXPECT_EQ(InvalidArrivedExCalls(huge.c_str(), nullptr, 0), 2);
  EXPECT_EQ(Rejected(), 4u);
  // Exactly 128 bytes is fine.
  EXPECT_EQ(InvalidArrivedExCalls(lora.c_str() + 1, nullptr, 0), 0);
  EXPECT_EQ(Rejected(), 4u);
}

TEST_F(EventValidationTest, RejectsMalformedUtf8Lora) {
  for (const char* bad : {"\xff", "\xc0\x80", "\xed\xa0\x80", "a\x80",
                          "\xe2\x82", "\xf4\x90\x80\x80"}) {
    EXPECT_EQ(InvalidArrivedExCalls(bad, nullptr, 0), 2) << bad;
  }
  EXPECT_EQ(Rejected(), 12u);
  EXPECT_EQ(InvalidArrivedExCalls("caf\xc3\xa9-\xf0\x9f\x98\x80", nullptr, 0),
            0);
}

TEST_F(EventValidationTest, RejectsFiveRequestLabels) {
  const tm_label labels[] = {
      {"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}, {"e", "5"}};
  EXPECT_EQ(InvalidArrivedExCalls(nullptr, labels, 5), 2);
  EXPECT_EQ(Rejected(), 2u);
  EXPECT_EQ(InvalidArrivedExCalls(nullptr, labels, TM_MAX_REQUEST_LABELS), 0);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsDuplicateRequestLabelName) {
  const tm_label labels[] = {{"tenant", "a"}, {"tier", "b"}, {"tenant", "a"}};
  EXPECT_EQ(InvalidArrivedExCalls(nullptr, labels, 3), 2);
  EXPECT_EQ(Rejected(), 2u);
  EXPECT_EQ(InvalidArrivedExCalls(nullptr, labels, 2), 0);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsReservedRequestLabelNames) {
  for (const char* name : {TM_RESERVED_LABEL_NAMES, "__x", "__"}) {
    EXPECT_EQ(InvalidLabelCalls(name, "v"), 2) << name;
  }
  EXPECT_EQ(Rejected(), 2u * (TM_NUM_RESERVED_LABELS + 2));
  EXPECT_EQ(InvalidLabelCalls("_x", "v"), 0);
}

TEST_F(EventValidationTest, RejectsMalformedRequestLabelNames) {
  const std::string too_long(TM_MAX_STRING_BYTES + 1, 'n');
  for (const char* bad :
       {"", "1a", "a-b", "a b", "a.b", "a:b", "\xc3\xa9", too_long.c_str()}) {
    EXPECT_EQ(InvalidLabelCalls(bad, "v"), 2) << bad;
  }
  EXPECT_EQ(Rejected(), 16u);
  EXPECT_EQ(InvalidLabelCalls(too_long.c_str() + 1, "v"), 0);
}

TEST_F(EventValidationTest, RejectsRequestLabelValueLongerThan128Bytes) {
  const std::string value(TM_MAX_REQUEST_LABEL_VALUE_BYTES + 1, 'v');
  EXPECT_EQ(InvalidLabelCalls("tenant", value.c_str()), 2);
  EXPECT_EQ(Rejected(), 2u);
  // Exactly 128 bytes, and the empty value, are fine.
  EXPECT_EQ(InvalidLabelCalls("tenant", value.c_str() + 1), 0);
  EXPECT_EQ(InvalidLabelCalls("tenant", ""), 0);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsMalformedUtf8RequestLabelValue) {
  for (const char* bad : {"\xff", "\xc0\x80", "\xed\xa0\x80", "a\x80"}) {
    EXPECT_EQ(InvalidLabelCalls("tenant", bad), 2) << bad;
  }
  EXPECT_EQ(Rejected(), 8u);
}

TEST_F(EventValidationTest, RejectsNullRequestLabels) {
  EXPECT_EQ(InvalidArrivedExCalls(nullptr, nullptr, 1), 2);
  EXPECT_EQ(InvalidLabelCalls(nullptr, "v"), 2);
  EXPECT_EQ(InvalidLabelCalls("tenant", nullptr), 2);
  EXPECT_EQ(Rejected(), 6u);
  // NULL labels with n_labels 0 is no labels.
  EXPECT_EQ(InvalidArrivedExCalls(nullptr, nullptr, 0), 0);
  EXPECT_EQ(Rejected(), 6u);
}

TEST_F(EventValidationTest, RejectsArrivedExWithBadStringId) {
  const tm_label label = {"tenant", "a"};
  const std::string long_rid(TM_MAX_RID_BYTES + 1, 'r');
  EXPECT_EQ(tm_arrived_ex_str(client_, 1, long_rid.data(), long_rid.size(), 1,
                              0, 0, "lora", &label, 1),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex_str(client_, 1, "r", 0, 1, 0, 0, "lora", &label, 1),
            TM_E_INVALID);
  EXPECT_EQ(
      tm_arrived_ex_str(client_, 1, nullptr, 1, 1, 0, 0, nullptr, nullptr, 0),
      TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
}

// A rejected ARRIVED takes no buffer space and never reaches the daemon,
// whichever rule it broke; the valid one around it is sent.
TEST_F(EventValidationTest, RejectedArrivedExIsNotSent) {
  const tm_label good = {"tenant", "a"};
  const tm_label dup[] = {{"tenant", "a"}, {"tenant", "b"}};
  const std::string long_lora(TM_MAX_LORA_BYTES + 1, 'l');
  EXPECT_EQ(tm_arrived_ex(client_, 1, 1, 1, 0, 0, "", nullptr, 0),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex(client_, 1, 2, 1, 0, 0, long_lora.c_str(), &good, 1),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex_str(client_, 1, "r", 1, 1, 0, 0, "ok", dup, 2),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex(client_, 1, 4, 1, 0, 0, nullptr, nullptr, 3),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex(client_, 5, 5, 9, 0, 0, "ok", &good, 1), TM_OK);
  ExpectOnlySent(R"([1,5,5,9,{"lora":"ok","labels":{"tenant":"a"}}])", 4);
}

// Rejected events take no buffer space and never reach the daemon; the
// daemon learns of them only through dropped_total.
TEST_F(EventValidationTest, RejectedEventsAreNotSent) {
  const std::string long_rid(TM_MAX_RID_BYTES + 1, 'r');
  const tm_step_key dup[] = {TM_STEP_KEY_RUNNING, TM_STEP_KEY_RUNNING};
  const double values[] = {1, 1};
  EXPECT_EQ(tm_tokens(client_, 1, 1, 0), TM_E_INVALID);
  EXPECT_EQ(tm_queued_str(client_, 1, long_rid.data(), long_rid.size()),
            TM_E_INVALID);
  EXPECT_EQ(tm_finished(client_, 1, 1, static_cast<tm_finish_reason>(9)),
            TM_E_INVALID);
  EXPECT_EQ(tm_step(client_, 1, dup, values, 2, nullptr, 0), TM_E_INVALID);
  EXPECT_EQ(tm_tokens(client_, 5, 1, 1), TM_OK);
  ExpectOnlySent("[4,5,1,1]", 4);
}

// tm_expert_load(): every error mode returns TM_E_INVALID, counts the event
// as rejected and sends nothing; the valid calls at each limit are sent.
TEST_F(EventValidationTest, RejectsExpertLoadLayerPastTheLimit) {
  const uint64_t counts[] = {1, 2};
  EXPECT_EQ(tm_expert_load(client_, 1, TM_MAX_MOE_LAYERS, counts, 2),
            TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, UINT32_MAX, counts, 2), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 2u);
  EXPECT_EQ(tm_expert_load(client_, 1, TM_MAX_MOE_LAYERS - 1, counts, 2),
            TM_OK);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsExpertLoadWithoutCounts) {
  const uint64_t counts[] = {1};
  EXPECT_EQ(tm_expert_load(client_, 1, 0, counts, 0), TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, nullptr, 0), TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, nullptr, 1), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(EventValidationTest, RejectsExpertLoadWithTooManyExperts) {
  const std::vector<uint64_t> counts(TM_MAX_MOE_EXPERTS + 1, 1);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, counts.data(), counts.size()),
            TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, counts.data(), SIZE_MAX),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 2u);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, counts.data(), TM_MAX_MOE_EXPERTS),
            TM_OK);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(EventValidationTest, RejectsExpertLoadCountsAboveTheEventMaximum) {
  std::vector<uint64_t> counts(256, TM_MAX_EVENT_COUNT);
  for (const size_t at : {size_t{0}, size_t{100}, size_t{255}}) {
    for (const uint64_t bad :
         {uint64_t{TM_MAX_EVENT_COUNT} + 1, uint64_t{1} << 63, UINT64_MAX}) {
      counts[at] = bad;
      EXPECT_EQ(tm_expert_load(client_, 1, 3, counts.data(), counts.size()),
                TM_E_INVALID)
          << at << " " << bad;
      counts[at] = TM_MAX_EVENT_COUNT;
    }
  }
  EXPECT_EQ(Rejected(), 9u);
  EXPECT_EQ(tm_expert_load(client_, 1, 3, counts.data(), counts.size()), TM_OK);
  EXPECT_EQ(Rejected(), 9u);
}

// A rejected EXPERT_LOAD takes no buffer space and never reaches the
// daemon, whichever rule it broke; the valid one after them is sent.
TEST_F(EventValidationTest, RejectedExpertLoadIsNotSent) {
  const std::vector<uint64_t> many(TM_MAX_MOE_EXPERTS + 1, 1);
  const uint64_t big[] = {1, uint64_t{TM_MAX_EVENT_COUNT} + 1};
  const uint64_t good[] = {4, 0, 6};
  EXPECT_EQ(tm_expert_load(client_, 1, TM_MAX_MOE_LAYERS, good, 3),
            TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, good, 0), TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, many.data(), many.size()),
            TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, nullptr, 3), TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 1, 0, big, 2), TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(client_, 5, 7, good, 3), TM_OK);
  ExpectOnlySent("[8,5,7,[4,0,6]]", 5);
}

// On a closed client tm_expert_load() is refused and counted like the other
// event calls; bad arguments are still TM_E_INVALID.
TEST_F(EventValidationTest, ExpertLoadOnAClosedClient) {
  tm_client* c = client_;
  ASSERT_EQ(CloseClient(), TM_OK);  // c stays valid: a tombstone
  const uint64_t counts[] = {1};
  EXPECT_EQ(tm_expert_load(c, 1, 0, counts, 1), TM_E_CLOSED);
  EXPECT_EQ(tm_expert_load(c, 1, 0, counts, 0), TM_E_INVALID);
  uint64_t stats[TM_STAT_COUNT] = {};
  ASSERT_EQ(tm_client_stats(c, stats, TM_STAT_COUNT), TM_OK);
  EXPECT_EQ(stats[TM_STAT_EVENTS_REJECTED], 2u);
  EXPECT_EQ(stats[TM_STAT_EVENTS_SENT], 0u);
}

// ---- protocol 1.2
// -------------------------------------------------------------

constexpr const char* kGoodTraceparent =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// A struct as a newer header would lay it out: `s` and a field appended,
// `size` covering both. This library reads `s` only.
template <typename Struct>
struct Grown {
  explicit Grown(const Struct& in) : s(in) { s.size = sizeof *this; }
  Struct s;
  uint64_t newer_field = 42;
};

class Protocol12ValidationTest : public EventValidationTest {
 protected:
  // tm_arrived_params and tm_arrived_params_str with `p`; how many returned
  // TM_E_INVALID.
  int InvalidParamsCalls(const tm_request_params* p) {
    int invalid = 0;
    invalid += tm_arrived_params(client_, 1, 1, 1, p) == TM_E_INVALID;
    invalid += tm_arrived_params_str(client_, 1, "r", 1, 1, p) == TM_E_INVALID;
    return invalid;
  }
  // tm_arrived_params and tm_arrived_params_str with `p`, which must both
  // send the ARRIVED (TM_OK); how many left `n` trace strings out
  // (TM_STAT_FIELDS_DROPPED up by n). A malformed trace string costs the
  // request nothing but itself (W3C: a receiver ignores it).
  int DroppedFieldCalls(const tm_request_params* p, uint64_t n = 1) {
    int dropped = 0;
    for (int str = 0; str < 2; ++str) {
      const uint64_t before = FieldsDropped();
      const uint64_t rejected = Rejected();
      EXPECT_EQ(str != 0 ? tm_arrived_params_str(client_, 1, "r", 1, 1, p)
                         : tm_arrived_params(client_, 1, 1, 1, p),
                TM_OK);
      EXPECT_EQ(Rejected(), rejected);
      dropped += FieldsDropped() == before + n;
    }
    return dropped;
  }
  int DroppedTraceparentCalls(const std::string& tp) {
    tm_request_params p = TM_REQUEST_PARAMS_INIT;
    p.traceparent = tp.c_str();
    return DroppedFieldCalls(&p);
  }
  int DroppedTracestateCalls(const std::string& ts) {
    tm_request_params p = TM_REQUEST_PARAMS_INIT;
    p.tracestate = ts.c_str();
    return DroppedFieldCalls(&p);
  }
  // The three tm_admission_rejected calls with `reason`.
  int InvalidReasonCalls(const char* reason) {
    int invalid = 0;
    invalid += tm_admission_rejected(client_, 1, reason) == TM_E_INVALID;
    invalid += tm_admission_rejected_rid(client_, 1, reason, 1) == TM_E_INVALID;
    invalid +=
        tm_admission_rejected_str(client_, 1, reason, "r", 1) == TM_E_INVALID;
    return invalid;
  }
  // tm_kv_transfer and tm_kv_transfer_str at t = 1000 with `kv`.
  int InvalidKvCalls(const tm_kv_transfer_info* kv, uint64_t t = 1000) {
    int invalid = 0;
    invalid += tm_kv_transfer(client_, t, 1, kv) == TM_E_INVALID;
    invalid += tm_kv_transfer_str(client_, t, "r", 1, kv) == TM_E_INVALID;
    return invalid;
  }
  static tm_kv_transfer_info Kv() {
    tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
    kv.start_ns = 500;
    return kv;
  }
  int InvalidKvStringCalls(const char* reason, const char* connector) {
    tm_kv_transfer_info kv = Kv();
    kv.ok = 0;
    kv.reason = reason;
    kv.connector = connector;
    return InvalidKvCalls(&kv);
  }
};

// Strings that break label-value syntax (tm_proto_valid_label_value): the
// empty string, 65 bytes, C0 and C1 control characters, DEL, malformed UTF-8
// (one after 16 printable bytes: the KV_TRANSFER lean path's edge).
std::vector<std::string> BadLabelValues() {
  return {"",
          std::string(TM_MAX_LABEL_VALUE_BYTES + 1, 'r'),
          std::string(100000, 'r'),
          "queue\x01full",
          "NixlConnectorV16\x01",
          "NixlConnectorV16\xff",
          "tab\there",
          "line\n",
          "\x1f",
          "del\x7f",
          "c1 \xc2\x80",
          "c1 \xc2\x9f",
          "\xff",
          "trunc\xc3",
          "\xc0\x80",
          "\xed\xa0\x80"};
}

// What the rule accepts passes: 1 and 64 bytes, UTF-8 letters, a no-break
// space (U+00A0, just past the C1 controls), spaces and punctuation.
std::vector<std::string> GoodLabelValues() {
  return {"x",
          std::string(TM_MAX_LABEL_VALUE_BYTES, 'r'),
          "d\xc3\xa9lai d\xc3\xa9pass\xc3\xa9",
          "nbsp\xc2\xa0",
          "token cap (8192)",
          "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./",
          std::string(TM_MAX_LABEL_VALUE_BYTES - 2, 'a') + "\xc3\xa9"};
}

TEST_F(Protocol12ValidationTest, RejectsNullRequestParams) {
  EXPECT_EQ(InvalidParamsCalls(nullptr), 2);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(Protocol12ValidationTest, RejectsRequestParamsSizeTooSmall) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  for (const size_t size :
       {size_t{0}, size_t{1}, offsetof(tm_request_params, traceparent),
        offsetof(tm_request_params, tracestate), sizeof p - 1}) {
    p.size = size;
    EXPECT_EQ(InvalidParamsCalls(&p), 2) << size;
  }
  EXPECT_EQ(Rejected(), 10u);
  // A larger struct (a newer header's) is read up to this layout's end.
  Grown<tm_request_params> grown{TM_REQUEST_PARAMS_INIT};
  EXPECT_EQ(InvalidParamsCalls(&grown.s), 0);
  EXPECT_EQ(Rejected(), 10u);
}

TEST_F(Protocol12ValidationTest, DropsTraceparentWithUppercaseHex) {
  std::string tp = kGoodTraceparent;
  tp[3] = 'A';
  EXPECT_EQ(DroppedTraceparentCalls(tp), 2);
  tp = kGoodTraceparent;
  tp[40] = 'F';  // in the parent id
  EXPECT_EQ(DroppedTraceparentCalls(tp), 2);
  tp = kGoodTraceparent;
  tp[54] = 'B';  // in the flags
  EXPECT_EQ(DroppedTraceparentCalls(tp), 2);
  EXPECT_EQ(FieldsDropped(), 6u);
}

TEST_F(Protocol12ValidationTest, DropsTraceparentOfAnotherVersion) {
  for (const char* version : {"01", "ff", "0a", "10"}) {
    std::string tp = kGoodTraceparent;
    tp.replace(0, 2, version);
    EXPECT_EQ(DroppedTraceparentCalls(tp), 2) << version;
  }
  EXPECT_EQ(FieldsDropped(), 8u);
}

TEST_F(Protocol12ValidationTest, DropsTraceparentWithAllZeroIds) {
  EXPECT_EQ(DroppedTraceparentCalls("00-00000000000000000000000000000000-"
                                    "00f067aa0ba902b7-01"),
            2);
  EXPECT_EQ(DroppedTraceparentCalls("00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                    "0000000000000000-01"),
            2);
  EXPECT_EQ(FieldsDropped(), 4u);
  // Flags 00 (not sampled) are fine.
  EXPECT_EQ(DroppedTraceparentCalls("00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                    "00f067aa0ba902b7-00"),
            0);
  EXPECT_EQ(FieldsDropped(), 4u);
}

TEST_F(Protocol12ValidationTest, DropsTraceparentOfTheWrongLength) {
  const std::string good = kGoodTraceparent;
  EXPECT_EQ(DroppedTraceparentCalls(""), 2);
  EXPECT_EQ(DroppedTraceparentCalls(good.substr(0, 54)), 2);
  EXPECT_EQ(DroppedTraceparentCalls(good + "0"), 2);
  EXPECT_EQ(DroppedTraceparentCalls(good + "-00"), 2);  // a future version's
  EXPECT_EQ(DroppedTraceparentCalls(good + std::string(10000, 'f')), 2);
  EXPECT_EQ(FieldsDropped(), 10u);
}

TEST_F(Protocol12ValidationTest, DropsMalformedTraceparent) {
  std::vector<std::string> bad;
  for (const size_t dash : {size_t{2}, size_t{35}, size_t{52}}) {
    std::string tp = kGoodTraceparent;
    tp[dash] = '_';
    bad.push_back(tp);
  }
  std::string tp = kGoodTraceparent;
  tp[10] = 'g';
  bad.push_back(tp);
  tp = kGoodTraceparent;
  tp[20] = ' ';
  bad.push_back(tp);
  for (const std::string& b : bad) {
    EXPECT_EQ(DroppedTraceparentCalls(b), 2) << b;
  }
  EXPECT_EQ(FieldsDropped(), 2 * bad.size());
}

TEST_F(Protocol12ValidationTest, DropsTracestateLongerThan256Bytes) {
  const std::string ts = "a=" + std::string(TM_MAX_TRACESTATE_BYTES - 1, 'v');
  EXPECT_EQ(DroppedTracestateCalls(ts), 2);
  EXPECT_EQ(DroppedTracestateCalls("a=" + std::string(100000, 'v')), 2);
  EXPECT_EQ(FieldsDropped(), 4u);
  EXPECT_EQ(DroppedTracestateCalls(ts.substr(0, TM_MAX_TRACESTATE_BYTES)), 0);
  EXPECT_EQ(FieldsDropped(), 4u);
}

TEST_F(Protocol12ValidationTest, DropsTracestateWithTooManyMembers) {
  std::string ts;
  for (unsigned i = 0; i < TM_MAX_TRACESTATE_MEMBERS; ++i) {
    ts += (i == 0 ? "k" : ",k") + std::to_string(i) + "=v";
  }
  EXPECT_EQ(DroppedTracestateCalls(ts), 0);
  EXPECT_EQ(DroppedTracestateCalls(ts + ",z=v"), 2);
  EXPECT_EQ(FieldsDropped(), 2u);
}

TEST_F(Protocol12ValidationTest, DropsMalformedTracestate) {
  for (const char* bad :
       {"Rojo=00f067aa0ba902b7", "rojo", "rojo=", "=value", "ro jo=1",
        "rojo=a=b", "rojo=1,congo", "_x=1", "a@=1", "@a=1", "a@b@c=1",
        "rojo=caf\xc3\xa9", "rojo=line\nbreak", "rojo=\x01"}) {
    EXPECT_EQ(DroppedTracestateCalls(bad), 2) << bad;
  }
  EXPECT_EQ(FieldsDropped(), 28u);
  // The W3C forms that are valid pass: empty, empty members, spaces and
  // tabs around members, multi-tenant keys, spaces inside a value.
  for (const char* good :
       {"", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", " a=1 ,\tb=2",
        "a=1,,b=2", "fw529a3039@dt=x", "a=b c", "k_-*/9=v"}) {
    EXPECT_EQ(DroppedTracestateCalls(good), 0) << good;
  }
  EXPECT_EQ(FieldsDropped(), 28u);
}

// The key rules of W3C Trace Context (and of OpenTelemetry's validators,
// @opentelemetry/core): a simple key starts with a lowercase letter; a
// tenant@system key has a tenant of 1 to 241 characters starting with a
// letter or digit and a system of 1 to 14 starting with a letter.
TEST_F(Protocol12ValidationTest, TracestateKeysFollowW3C) {
  const std::string tenant241 = "t" + std::string(240, '0');
  const std::string simple256 = "k" + std::string(255, '_');
  for (const std::string& good :
       {std::string("a=1"), std::string("z9_-*/=1"), std::string("0t@s=1"),
        std::string("9@z=1"), std::string("t@abcdefghijklmn=1"),
        std::string("t-_*/@s0_-*/=1"), tenant241 + "@s=1"}) {
    EXPECT_EQ(DroppedTracestateCalls(good), 0) << good;
    EXPECT_EQ(tm_proto_valid_tracestate(good.data(), good.size()), 1) << good;
  }
  EXPECT_EQ(tm_proto_valid_tracestate(simple256.data(), 256), 0);  // no '='
  for (const std::string& bad :
       {std::string("1abc=x"), std::string("9=1"), std::string("-a=1"),
        std::string("*a=1"), std::string("t@1s=1"), std::string("t@_s=1"),
        std::string("t@-s=1"), std::string("t@abcdefghijklmno=1"),
        std::string("_t@s=1"), tenant241 + "0@s=1", std::string("t@S=1")}) {
    EXPECT_EQ(DroppedTracestateCalls(bad), 2) << bad;
    EXPECT_EQ(tm_proto_valid_tracestate(bad.data(), bad.size()), 0) << bad;
  }
  EXPECT_EQ(FieldsDropped(), 22u);
}

// A malformed traceparent takes its tracestate along (W3C: a receiver
// that cannot parse traceparent does not read tracestate), each counted;
// a good traceparent keeps its place when only the tracestate is bad.
TEST_F(Protocol12ValidationTest, DropsTracestateWithAMalformedTraceparent) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.traceparent = "00-not-a-traceparent";
  p.tracestate = "rojo=00f067aa0ba902b7";
  EXPECT_EQ(DroppedFieldCalls(&p, 2), 2);
  p.traceparent = kGoodTraceparent;
  p.tracestate = "Rojo=1";
  EXPECT_EQ(DroppedFieldCalls(&p, 1), 2);
  EXPECT_EQ(FieldsDropped(), 6u);
  EXPECT_EQ(Rejected(), 0u);
  // A bad label still refuses the call, a trace string or not.
  const tm_label bad_label{"__x", "v"};
  p.labels = &bad_label;
  p.n_labels = 1;
  EXPECT_EQ(InvalidParamsCalls(&p), 2);
  EXPECT_EQ(Rejected(), 2u);
}

// priority is an int32_t: every value is in range, the limits included;
// any nonzero has_priority sends it.
TEST_F(Protocol12ValidationTest, AcceptsPriorityLimits) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  for (const int32_t prio : {TM_MIN_PRIORITY, -1, 0, 1, TM_MAX_PRIORITY}) {
    p.has_priority = 7;
    p.priority = prio;
    EXPECT_EQ(InvalidParamsCalls(&p), 0) << prio;
  }
  EXPECT_EQ(Rejected(), 0u);
}

// The 1.1 params keep tm_arrived_ex()'s rules inside the struct, and a
// string id its rules.
TEST_F(Protocol12ValidationTest, RejectsBadLoraLabelsAndIdInRequestParams) {
  const tm_label reserved = {"engine", "x"};
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.lora = "";
  EXPECT_EQ(InvalidParamsCalls(&p), 2);
  p = TM_REQUEST_PARAMS_INIT;
  p.labels = &reserved;
  p.n_labels = 1;
  EXPECT_EQ(InvalidParamsCalls(&p), 2);
  p.labels = nullptr;
  EXPECT_EQ(InvalidParamsCalls(&p), 2);
  p = TM_REQUEST_PARAMS_INIT;
  p.n_labels = TM_MAX_REQUEST_LABELS + 1;
  EXPECT_EQ(InvalidParamsCalls(&p), 2);
  p = TM_REQUEST_PARAMS_INIT;
  p.has_priority = 1;
  EXPECT_EQ(tm_arrived_params_str(client_, 1, "r", 0, 1, &p), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_params_str(client_, 1, nullptr, 1, 1, &p), TM_E_INVALID);
  const std::string long_rid(TM_MAX_RID_BYTES + 1, 'r');
  EXPECT_EQ(tm_arrived_params_str(client_, 1, long_rid.data(), long_rid.size(),
                                  1, &p),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 11u);
}

TEST_F(Protocol12ValidationTest, RejectedArrivedParamsAreNotSent) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  const tm_label reserved{"engine", "x"};
  p.labels = &reserved;
  p.n_labels = 1;
  p.traceparent = kGoodTraceparent;
  EXPECT_EQ(tm_arrived_params(client_, 1, 1, 1, &p), TM_E_INVALID);
  p = TM_REQUEST_PARAMS_INIT;
  p.lora = "";
  p.has_priority = 1;
  EXPECT_EQ(tm_arrived_params(client_, 1, 2, 1, &p), TM_E_INVALID);
  p = TM_REQUEST_PARAMS_INIT;
  p.size = 8;
  EXPECT_EQ(tm_arrived_params(client_, 1, 3, 1, &p), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_params(client_, 1, 4, 1, nullptr), TM_E_INVALID);
  p = TM_REQUEST_PARAMS_INIT;
  p.has_priority = 1;
  p.priority = -3;
  EXPECT_EQ(tm_arrived_params(client_, 5, 5, 9, &p), TM_OK);
  ExpectOnlySent(R"([1,5,5,9,{"priority":-3}])", 4);
}

// A malformed trace string is left out, the rest of the ARRIVED sent: the
// request keeps its TTFT, queue and e2e time over a bad header.
TEST_F(Protocol12ValidationTest, MalformedTraceStringsAreLeftOut) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.traceparent = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";
  p.tracestate = "rojo=1";
  EXPECT_EQ(tm_arrived_params(client_, 1, 1, 1, &p), TM_OK);
  p = TM_REQUEST_PARAMS_INIT;
  p.traceparent = kGoodTraceparent;
  p.tracestate = "Bad=1";
  p.has_priority = 1;
  EXPECT_EQ(tm_arrived_params_str(client_, 2, "r2", 2, 7, &p), TM_OK);
  StartServer();
  ASSERT_TRUE(WaitForEvents(2));
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  const StatsArray st = Stats();
  EXPECT_EQ(st[TM_STAT_EVENTS_SENT], 2u);
  EXPECT_EQ(st[TM_STAT_EVENTS_REJECTED], 0u);
  EXPECT_EQ(st[TM_STAT_FIELDS_DROPPED], 3u);
  const std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].ToString(), "[1,1,1,1]");
  EXPECT_EQ(events[1].ToString(), std::string(R"([1,2,"r2",7,{"priority":0,)") +
                                      R"("traceparent":")" + kGoodTraceparent +
                                      R"("}])");
}

// TM_STAT_FIELDS_DROPPED counts the trace strings left out of an ARRIVED
// appended only: one refused (a bad id, a closed client) or dropped (a
// full buffer) counts as that alone.
TEST_F(Protocol12ValidationTest, FieldsDroppedCountOnlyWithAnArrivedAppended) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.traceparent = "bad";  // left out, and its tracestate with it: 2 fields
  p.tracestate = "a=b";
  EXPECT_EQ(tm_arrived_params_str(client_, 1, "", 0, 5, &p), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 1u);
  EXPECT_EQ(FieldsDropped(), 0u);
  EXPECT_EQ(tm_arrived_params(client_, 1, 1, 5, &p), TM_OK);
  EXPECT_EQ(FieldsDropped(), 2u);
  tm_client* closed = client_;
  // Its one ARRIVED unsent (no daemon): TM_E_TIMEOUT. `closed` stays
  // valid: a tombstone.
  ASSERT_EQ(CloseClient(), TM_E_TIMEOUT);
  EXPECT_EQ(tm_arrived_params(closed, 1, 2, 5, &p), TM_E_CLOSED);
  EXPECT_EQ(tm_arrived_params_str(closed, 1, "r", 1, 5, &p), TM_E_CLOSED);
  StatsArray s{};
  ASSERT_EQ(tm_client_stats(closed, s.data(), s.size()), TM_OK);
  EXPECT_EQ(s[TM_STAT_FIELDS_DROPPED], 2u);

  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
  NewClient(opts.get());  // no daemon: nothing drains
  uint64_t rid = 0;
  while (tm_tokens(client_, 1, ++rid, 1) == TM_OK) ASSERT_LT(rid, 1u << 20);
  EXPECT_EQ(tm_arrived_params(client_, 1, 1, 5, &p), TM_E_DROPPED);
  EXPECT_EQ(tm_arrived_params_str(client_, 1, "r", 1, 5, &p), TM_E_DROPPED);
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_DROPPED], 3u);
  EXPECT_EQ(FieldsDropped(), 0u);
}

TEST_F(Protocol12ValidationTest, RejectsScheduledExWithBadStringId) {
  const std::string long_rid(TM_MAX_RID_BYTES + 1, 'r');
  EXPECT_EQ(
      tm_scheduled_ex_str(client_, 1, long_rid.data(), long_rid.size(), 1, 1),
      TM_E_INVALID);
  EXPECT_EQ(tm_scheduled_ex_str(client_, 1, "r", 0, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_scheduled_ex_str(client_, 1, nullptr, 1, 1, 1), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
  EXPECT_EQ(tm_scheduled_ex_str(client_, 1, long_rid.data(), TM_MAX_RID_BYTES,
                                UINT32_MAX, UINT32_MAX),
            TM_OK);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(Protocol12ValidationTest, RejectsAdmissionReasonOutsideLabelValues) {
  EXPECT_EQ(InvalidReasonCalls(nullptr), 3);
  const std::vector<std::string> bad = BadLabelValues();
  for (const std::string& reason : bad) {
    EXPECT_EQ(InvalidReasonCalls(reason.c_str()), 3) << reason;
  }
  EXPECT_EQ(Rejected(), 3 + 3 * bad.size());
  for (const std::string& reason : GoodLabelValues()) {
    EXPECT_EQ(InvalidReasonCalls(reason.c_str()), 0) << reason;
  }
  EXPECT_EQ(Rejected(), 3 + 3 * bad.size());
}

TEST_F(Protocol12ValidationTest, RejectsAdmissionRejectedWithBadStringId) {
  const std::string long_rid(TM_MAX_RID_BYTES + 1, 'r');
  EXPECT_EQ(tm_admission_rejected_str(client_, 1, "full", long_rid.data(),
                                      long_rid.size()),
            TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_str(client_, 1, "full", "r", 0),
            TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_str(client_, 1, "full", nullptr, 1),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(Protocol12ValidationTest, RejectedAdmissionIsNotSent) {
  EXPECT_EQ(tm_admission_rejected(client_, 1, ""), TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_rid(client_, 1, "a\nb", 3), TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_str(client_, 1, "ok", "", 0), TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_rid(client_, 5, "queue_full", 9), TM_OK);
  ExpectOnlySent(R"([9,5,"queue_full",9])", 3);
}

TEST_F(Protocol12ValidationTest, RejectsNullKvTransferInfo) {
  EXPECT_EQ(InvalidKvCalls(nullptr), 2);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(Protocol12ValidationTest, RejectsKvTransferInfoSizeTooSmall) {
  tm_kv_transfer_info kv = Kv();
  for (const size_t size :
       {size_t{0}, offsetof(tm_kv_transfer_info, reason),
        offsetof(tm_kv_transfer_info, connector),
        offsetof(tm_kv_transfer_info, reason_id), sizeof kv - 1}) {
    kv.size = size;
    EXPECT_EQ(InvalidKvCalls(&kv), 2) << size;
  }
  EXPECT_EQ(Rejected(), 10u);
  Grown<tm_kv_transfer_info> grown{Kv()};
  EXPECT_EQ(InvalidKvCalls(&grown.s), 0);
  EXPECT_EQ(Rejected(), 10u);
}

TEST_F(Protocol12ValidationTest, RejectsUnknownKvRole) {
  tm_kv_transfer_info kv = Kv();
  for (const int role : {-1, 2, 100}) {
    kv.role = static_cast<tm_kv_role>(role);
    EXPECT_EQ(InvalidKvCalls(&kv), 2) << role;
  }
  EXPECT_EQ(Rejected(), 6u);
}

TEST_F(Protocol12ValidationTest, RejectsKvTransferStartAfterItsEnd) {
  tm_kv_transfer_info kv = Kv();
  kv.start_ns = 1001;
  EXPECT_EQ(InvalidKvCalls(&kv, 1000), 2);
  kv.start_ns = UINT64_MAX;
  EXPECT_EQ(InvalidKvCalls(&kv, 1000), 2);
  // t_ns 0: the start is checked against the clock the event is stamped
  // with; one a minute from now is after it.
  kv.start_ns = tm_now_ns() + 60000000000ull;
  EXPECT_EQ(InvalidKvCalls(&kv, 0), 2);
  EXPECT_EQ(Rejected(), 6u);
  kv.start_ns = 1000;  // the end itself is fine, and so is 0
  EXPECT_EQ(InvalidKvCalls(&kv, 1000), 0);
  kv.start_ns = 0;
  EXPECT_EQ(InvalidKvCalls(&kv, 1000), 0);
  kv.start_ns = tm_now_ns();
  EXPECT_EQ(InvalidKvCalls(&kv, 0), 0);
  EXPECT_EQ(Rejected(), 6u);
}

TEST_F(Protocol12ValidationTest, RejectsKvBytesAndBlocksOverTheLimit) {
  for (const uint64_t bad : {uint64_t{TM_MAX_KV_TRANSFER_BYTES} + 1,
                             uint64_t{1} << 63, UINT64_MAX - 1}) {
    tm_kv_transfer_info kv = Kv();
    kv.bytes = bad;
    EXPECT_EQ(InvalidKvCalls(&kv), 2) << bad;
    kv = Kv();
    kv.blocks = bad;
    EXPECT_EQ(InvalidKvCalls(&kv), 2) << bad;
  }
  EXPECT_EQ(Rejected(), 12u);
  tm_kv_transfer_info kv = Kv();
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES;
  kv.blocks = TM_MAX_KV_TRANSFER_BYTES;
  EXPECT_EQ(InvalidKvCalls(&kv), 0);
  kv.bytes = kv.blocks = TM_KV_UNKNOWN;  // not given
  EXPECT_EQ(InvalidKvCalls(&kv), 0);
  EXPECT_EQ(Rejected(), 12u);
}

TEST_F(Protocol12ValidationTest,
       RejectsKvReasonAndConnectorOutsideLabelValues) {
  const std::vector<std::string> bad = BadLabelValues();
  for (const std::string& s : bad) {
    EXPECT_EQ(InvalidKvStringCalls(s.c_str(), nullptr), 2) << s;
    EXPECT_EQ(InvalidKvStringCalls(nullptr, s.c_str()), 2) << s;
    EXPECT_EQ(InvalidKvStringCalls("timeout", s.c_str()), 2) << s;
  }
  EXPECT_EQ(Rejected(), 6 * bad.size());
  for (const std::string& s : GoodLabelValues()) {
    EXPECT_EQ(InvalidKvStringCalls(s.c_str(), s.c_str()), 0) << s;
    EXPECT_EQ(InvalidKvStringCalls(nullptr, s.c_str()), 0) << s;
  }
  EXPECT_EQ(InvalidKvStringCalls(nullptr, nullptr), 0);
  EXPECT_EQ(Rejected(), 6 * bad.size());
}

TEST_F(Protocol12ValidationTest, RejectsKvTransferWithBadStringId) {
  const tm_kv_transfer_info kv = Kv();
  const std::string long_rid(TM_MAX_RID_BYTES + 1, 'r');
  EXPECT_EQ(
      tm_kv_transfer_str(client_, 1000, long_rid.data(), long_rid.size(), &kv),
      TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer_str(client_, 1000, "r", 0, &kv), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer_str(client_, 1000, nullptr, 1, &kv), TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(Protocol12ValidationTest, RejectedKvTransferIsNotSent) {
  tm_kv_transfer_info kv = Kv();
  kv.role = static_cast<tm_kv_role>(5);
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 1, &kv), TM_E_INVALID);
  kv = Kv();
  kv.start_ns = 2000;
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 2, &kv), TM_E_INVALID);
  kv = Kv();
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES + 1;
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 3, &kv), TM_E_INVALID);
  kv = Kv();
  kv.connector = "";
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 4, &kv), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 5, nullptr), TM_E_INVALID);
  kv = Kv();
  kv.blocks = 16;
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 6, &kv), TM_OK);
  ExpectOnlySent(R"([10,1000,6,{"role":"send","start":500,"blocks":16}])", 5);
}

TEST_F(Protocol12ValidationTest, RejectsSleepStatesOutsideTheirEnums) {
  const auto s = [](int v) { return static_cast<tm_scheduler_state>(v); };
  const auto w = [](int v) { return static_cast<tm_weights_state>(v); };
  const auto k = [](int v) { return static_cast<tm_kv_cache_state>(v); };
  for (const int bad : {-2, 2, 100}) {
    EXPECT_EQ(tm_sleep_state(client_, 1, s(bad), w(-1), k(-1)), TM_E_INVALID)
        << bad;
    EXPECT_EQ(tm_sleep_state(client_, 1, s(-1), w(-1), k(bad)), TM_E_INVALID)
        << bad;
  }
  for (const int bad : {-2, 3, 100}) {
    EXPECT_EQ(tm_sleep_state(client_, 1, s(-1), w(bad), k(-1)), TM_E_INVALID)
        << bad;
  }
  EXPECT_EQ(Rejected(), 9u);
  for (int sv = -1; sv <= 1; ++sv) {
    for (int wv = -1; wv <= 2; ++wv) {
      for (int kv = -1; kv <= 1; ++kv) {
        EXPECT_EQ(tm_sleep_state(client_, 1, s(sv), w(wv), k(kv)), TM_OK);
      }
    }
  }
  EXPECT_EQ(Rejected(), 9u);
}

// waiting_deferred counts some of the waiting requests: without waiting, or
// above it, the daemon drops it, and the client refuses the STEP.
TEST_F(Protocol12ValidationTest, RejectsWaitingDeferredWithoutWaiting) {
  EXPECT_EQ(StepOne(TM_STEP_KEY_WAITING_DEFERRED, 0), TM_E_INVALID);
  EXPECT_EQ(Step({TM_STEP_KEY_RUNNING, TM_STEP_KEY_WAITING_DEFERRED}, {4, 1}),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 2u);
}

TEST_F(Protocol12ValidationTest, RejectsWaitingDeferredAboveWaiting) {
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING, TM_STEP_KEY_WAITING_DEFERRED}, {3, 4}),
            TM_E_INVALID);
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING_DEFERRED, TM_STEP_KEY_WAITING}, {1, 0}),
            TM_E_INVALID);
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING_DEFERRED, TM_STEP_KEY_WAITING},
                 {double(TM_MAX_EVENT_COUNT), double(TM_MAX_EVENT_COUNT) - 1}),
            TM_E_INVALID);
  EXPECT_EQ(Rejected(), 3u);
  // Equal, zero, and every key at once are fine, in any order.
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING_DEFERRED, TM_STEP_KEY_WAITING}, {3, 3}),
            TM_OK);
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING, TM_STEP_KEY_WAITING_DEFERRED}, {0, 0}),
            TM_OK);
  std::vector<tm_step_key> keys;
  for (int k = 0; k < TM_STEP_KEY_COUNT; ++k) {
    keys.push_back(static_cast<tm_step_key>(k));
  }
  EXPECT_EQ(Step(keys, std::vector<double>(keys.size(), 1.0)), TM_OK);
  EXPECT_EQ(Rejected(), 3u);
}

TEST_F(Protocol12ValidationTest, RejectedStepWithWaitingDeferredIsNotSent) {
  EXPECT_EQ(StepOne(TM_STEP_KEY_WAITING_DEFERRED, 1), TM_E_INVALID);
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING, TM_STEP_KEY_WAITING_DEFERRED}, {1, 2}),
            TM_E_INVALID);
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING, TM_STEP_KEY_WAITING_DEFERRED}, {1, 0.5}),
            TM_E_INVALID);
  EXPECT_EQ(Step({TM_STEP_KEY_WAITING, TM_STEP_KEY_WAITING_DEFERRED}, {2, 1}),
            TM_OK);
  ExpectOnlySent(R"([7,1,{"waiting":2,"waiting_deferred":1}])", 3);
}

// On a closed client the 1.2 calls are refused and counted like the other
// event calls; bad arguments are still TM_E_INVALID.
TEST_F(Protocol12ValidationTest, Protocol12CallsOnAClosedClient) {
  tm_client* c = client_;
  ASSERT_EQ(CloseClient(), TM_OK);  // c stays valid: a tombstone
  const tm_request_params p = TM_REQUEST_PARAMS_INIT;
  const tm_kv_transfer_info kv = Kv();
  EXPECT_EQ(tm_arrived_params(c, 1, 1, 1, &p), TM_E_CLOSED);
  EXPECT_EQ(tm_arrived_params_str(c, 1, "r", 1, 1, &p), TM_E_CLOSED);
  EXPECT_EQ(tm_scheduled_ex(c, 1, 1, 1, 1), TM_E_CLOSED);
  EXPECT_EQ(tm_scheduled_ex_str(c, 1, "r", 1, 1, 1), TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected(c, 1, "x"), TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected_rid(c, 1, "x", 1), TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected_str(c, 1, "x", "r", 1), TM_E_CLOSED);
  EXPECT_EQ(tm_kv_transfer(c, 1000, 1, &kv), TM_E_CLOSED);
  EXPECT_EQ(tm_kv_transfer_str(c, 1000, "r", 1, &kv), TM_E_CLOSED);
  EXPECT_EQ(tm_sleep_state(c, 1, TM_SCHEDULER_PAUSED, TM_WEIGHTS_KEEP,
                           TM_KV_CACHE_KEEP),
            TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected(c, 1, ""), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer(c, 1, 1, nullptr), TM_E_INVALID);
  uint64_t stats[TM_STAT_COUNT] = {};
  ASSERT_EQ(tm_client_stats(c, stats, TM_STAT_COUNT), TM_OK);
  EXPECT_EQ(stats[TM_STAT_EVENTS_REJECTED], 12u);
  EXPECT_EQ(stats[TM_STAT_EVENTS_SENT], 0u);
}

// tm_register_value(): label-value syntax, the same id for the same string,
// ids 1 .. TM_MAX_VALUE_IDS then TM_E_NOMEM; a refused registration is not
// a rejected event (no event was made).
TEST_F(Protocol12ValidationTest, RegistersValuesOnce) {
  EXPECT_EQ(tm_register_value(nullptr, "x"), TM_E_INVALID);
  EXPECT_EQ(tm_register_value(client_, nullptr), TM_E_INVALID);
  for (const std::string& v : BadLabelValues()) {
    EXPECT_EQ(tm_register_value(client_, v.c_str()), TM_E_INVALID) << v;
  }
  const int queue_full = tm_register_value(client_, "queue_full");
  EXPECT_EQ(queue_full, 1);
  EXPECT_EQ(tm_register_value(client_, "nixl"), 2);
  EXPECT_EQ(tm_register_value(client_, "queue_full"), queue_full);
  for (const std::string& v : GoodLabelValues()) {
    const int id = tm_register_value(client_, v.c_str());
    EXPECT_GT(id, 2) << v;
    EXPECT_EQ(tm_register_value(client_, v.c_str()), id) << v;
  }
  int last = 0;
  for (int i = 0; last >= 0; ++i) {
    last = tm_register_value(client_, ("v" + std::to_string(i)).c_str());
    if (last >= 0) {
      EXPECT_LE(last, TM_MAX_VALUE_IDS);
    }
  }
  EXPECT_EQ(last, TM_E_NOMEM);
  EXPECT_EQ(tm_register_value(client_,
                              ("v" + std::to_string(TM_MAX_VALUE_IDS)).c_str()),
            TM_E_NOMEM);
  EXPECT_EQ(tm_register_value(client_, "nixl"), 2);  // still there
  EXPECT_EQ(tm_admission_rejected_id(client_, 1, TM_MAX_VALUE_IDS), TM_OK);
  EXPECT_EQ(Rejected(), 0u);
}

// An id the client did not hand out, 0 where one is required, and a string
// given with the id of the same field are TM_E_INVALID, counted.
TEST_F(Protocol12ValidationTest, RejectsUnknownValueIds) {
  const uint32_t id = uint32_t(tm_register_value(client_, "queue_full"));
  ASSERT_EQ(id, 1u);
  for (const uint32_t bad : {0u, 2u, 255u, 256u, 0xffffffffu}) {
    EXPECT_EQ(tm_admission_rejected_id(client_, 1, bad), TM_E_INVALID) << bad;
    EXPECT_EQ(tm_admission_rejected_id_rid(client_, 1, bad, 7), TM_E_INVALID);
    EXPECT_EQ(tm_admission_rejected_id_str(client_, 1, bad, "r", 1),
              TM_E_INVALID);
  }
  EXPECT_EQ(Rejected(), 15u);
  EXPECT_EQ(tm_admission_rejected_id_str(client_, 1, id, nullptr, 1),
            TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_id_str(client_, 1, id, "r", 0), TM_E_INVALID);
  EXPECT_EQ(
      tm_admission_rejected_id_str(client_, 1, id, "r", TM_MAX_RID_BYTES + 1),
      TM_E_INVALID);
  EXPECT_EQ(Rejected(), 18u);
  tm_kv_transfer_info kv = Kv();
  for (const uint32_t bad : {2u, 255u, 0xffffffffu}) {
    kv.reason_id = bad;
    EXPECT_EQ(InvalidKvCalls(&kv), 2) << bad;
    kv.reason_id = 0;
    kv.connector_id = bad;
    EXPECT_EQ(InvalidKvCalls(&kv), 2) << bad;
    kv.connector_id = 0;
  }
  EXPECT_EQ(Rejected(), 30u);
  kv.reason = "timeout";  // a string and an id for one field
  kv.reason_id = id;
  EXPECT_EQ(InvalidKvCalls(&kv), 2);
  kv.reason = nullptr;
  kv.reason_id = 0;
  kv.connector = "nixl";
  kv.connector_id = id;
  EXPECT_EQ(InvalidKvCalls(&kv), 2);
  EXPECT_EQ(Rejected(), 34u);
  // The same id on another client is unknown there.
  tm_client* other = nullptr;
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
  ASSERT_EQ(tm_client_new(opts.get(), &other), TM_OK);
  EXPECT_EQ(tm_admission_rejected_id(other, 1, id), TM_E_INVALID);
  EXPECT_EQ(tm_register_value(other, "other"), 1);
  EXPECT_EQ(tm_admission_rejected_id(other, 1, id), TM_OK);
  tm_client_close(other, nullptr, 0);
  // Ids that are valid pass every rule of both calls.
  kv = Kv();
  kv.reason_id = id;
  kv.connector_id = id;
  EXPECT_EQ(InvalidKvCalls(&kv), 0);
  EXPECT_EQ(tm_admission_rejected_id(client_, 1, id), TM_OK);
  EXPECT_EQ(Rejected(), 34u);
}

// The other rules hold on the ids' path as on the strings' (the call takes
// a leaner path when reason and connector are NULL).
TEST_F(Protocol12ValidationTest, KvTransferWithIdsKeepsEveryRule) {
  const uint32_t id = uint32_t(tm_register_value(client_, "nixl"));
  tm_kv_transfer_info kv = Kv();
  kv.connector_id = id;
  kv.role = static_cast<tm_kv_role>(2);
  EXPECT_EQ(InvalidKvCalls(&kv), 2);
  kv.role = TM_KV_RECV;
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES + 1;
  EXPECT_EQ(InvalidKvCalls(&kv), 2);
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES;
  kv.blocks = TM_KV_UNKNOWN - 1;
  EXPECT_EQ(InvalidKvCalls(&kv), 2);
  kv.blocks = TM_KV_UNKNOWN;
  kv.start_ns = 1001;
  EXPECT_EQ(InvalidKvCalls(&kv, 1000), 2);
  kv.start_ns = 1000;
  EXPECT_EQ(InvalidKvCalls(&kv, 1000), 0);
  kv.size = offsetof(tm_kv_transfer_info, connector_id);
  EXPECT_EQ(InvalidKvCalls(&kv), 2);
  EXPECT_EQ(Rejected(), 10u);
}

// With ids, a transfer whose amounts fit the packed record (the lean
// path) and one whose amounts do not (bytes from 2^40 - 1, blocks from
// 2^24 - 1: the general path) are held to the same rules; so is one whose
// connector is a string (the lean path's second form up to 16 bytes of
// printable ASCII, the general path past them).
TEST_F(Protocol12ValidationTest, KvTransferWithIdsKeepsEveryRuleInBothForms) {
  const uint32_t id = uint32_t(tm_register_value(client_, "nixl"));
  constexpr uint64_t k24 = uint64_t{1} << 24;
  constexpr uint64_t k40 = uint64_t{1} << 40;
  const std::pair<uint64_t, uint64_t> forms[] = {{64, 16},
                                                 {k40 - 2, k24 - 2},
                                                 {TM_KV_UNKNOWN, TM_KV_UNKNOWN},
                                                 {k40 - 1, 16},
                                                 {64, k24 - 1},
                                                 {TM_MAX_KV_TRANSFER_BYTES, 0},
                                                 {0, TM_MAX_KV_TRANSFER_BYTES}};
  // nullptr: the connector by id.
  const char* const connectors[] = {
      nullptr,       "x", "nixl", "NixlConnectorV16", "P2pNcclConnector1",
      "d\xc3\xa9lai"};
  uint64_t rejected = 0;
  for (const auto& [bytes, blocks] : forms) {
    for (const char* connector : connectors) {
      const std::string what = std::to_string(bytes) + " " +
                               std::to_string(blocks) + " " +
                               (connector != nullptr ? connector : "(id)");
      const tm_kv_transfer_info good = [&] {
        tm_kv_transfer_info kv = Kv();
        kv.bytes = bytes;
        kv.blocks = blocks;
        kv.reason_id = id;
        kv.connector = connector;
        kv.connector_id = connector != nullptr ? 0 : id;
        return kv;
      }();
      tm_kv_transfer_info kv = good;
      EXPECT_EQ(InvalidKvCalls(&kv), 0) << what;
      kv.role = static_cast<tm_kv_role>(2);
      EXPECT_EQ(InvalidKvCalls(&kv), 2) << what;
      kv = good;
      kv.start_ns = 1001;
      EXPECT_EQ(InvalidKvCalls(&kv, 1000), 2) << what;
      kv = good;
      kv.reason_id = id + 1;
      EXPECT_EQ(InvalidKvCalls(&kv), 2) << what;
      kv = good;
      kv.connector_id = id + 1;  // unknown, or beside a string
      EXPECT_EQ(InvalidKvCalls(&kv), 2) << what;
      kv = good;
      kv.connector_id = id;  // known: unless beside a string, fine
      EXPECT_EQ(InvalidKvCalls(&kv), connector != nullptr ? 2 : 0) << what;
      kv = good;
      kv.size = offsetof(tm_kv_transfer_info, connector_id);
      EXPECT_EQ(InvalidKvCalls(&kv), 2) << what;
      rejected += connector != nullptr ? 12 : 10;
      // An amount past the bound beside this one.
      kv = good;
      kv.bytes = TM_MAX_KV_TRANSFER_BYTES + 1;
      EXPECT_EQ(InvalidKvCalls(&kv), 2) << what;
      kv = good;
      kv.blocks = TM_KV_UNKNOWN - 1;
      EXPECT_EQ(InvalidKvCalls(&kv), 2) << what;
      rejected += 4;
    }
  }
  EXPECT_EQ(Rejected(), rejected);
}

// On a closed or never-registered client: refused like the other calls.
TEST_F(Protocol12ValidationTest, ValueIdsOnAClosedClient) {
  tm_client* c = client_;
  const uint32_t id = uint32_t(tm_register_value(c, "queue_full"));
  ASSERT_EQ(CloseClient(), TM_OK);
  EXPECT_EQ(tm_register_value(c, "x"), TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected_id(c, 1, id), TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected_id_rid(c, 1, id, 1), TM_E_CLOSED);
  EXPECT_EQ(tm_admission_rejected_id_str(c, 1, id, "r", 1), TM_E_CLOSED);
  tm_kv_transfer_info kv = Kv();
  kv.connector_id = id;
  EXPECT_EQ(tm_kv_transfer(c, 1000, 1, &kv), TM_E_CLOSED);
  kv.connector_id = 0;
  kv.connector = "nixl";
  EXPECT_EQ(tm_kv_transfer(c, 1000, 1, &kv), TM_E_CLOSED);
  EXPECT_EQ(tm_kv_transfer_str(c, 1000, "r", 1, &kv), TM_E_CLOSED);
}

// LabelValueLen() (api.cpp) settles 1..64 bytes of printable ASCII without
// calling tm_proto_valid_label_value(): that is sound only while the rule
// accepts every such string. If protocol.h ever narrows the rule, this
// fails, and the fast path must follow.
TEST(LabelValueTest, RuleAcceptsEveryPrintableAsciiString) {
  for (int ch = 0x20; ch < 0x7f; ++ch) {
    for (const size_t len :
         {size_t{1}, size_t{2}, size_t{63}, size_t{TM_MAX_LABEL_VALUE_BYTES}}) {
      const std::string s(len, char(ch));
      EXPECT_EQ(tm_proto_valid_label_value(s.data(), s.size()), 1)
          << ch << " x " << len;
    }
  }
  std::string all;
  for (int ch = 0x20; ch < 0x7f; ++ch) all += char(ch);
  for (size_t at = 0; at + TM_MAX_LABEL_VALUE_BYTES <= all.size(); ++at) {
    EXPECT_EQ(
        tm_proto_valid_label_value(all.data() + at, TM_MAX_LABEL_VALUE_BYTES),
        1)
        << at;
  }
}

// ---- options ---------------------------------------------------------------

class OptionsTest : public ::testing::Test {
 protected:
  OptionsPtr opts_{tm_options_new()};
};

TEST_F(OptionsTest, RejectsBadEngineNames) {
  const std::string too_long(TM_MAX_STRING_BYTES + 1, 'e');
  for (const char* bad : {"", "1vllm", "-vllm", "v llm", "v.llm", "v/llm",
                          "v\xc3\xa9", "vllm\n", too_long.c_str()}) {
    EXPECT_EQ(tm_options_set_engine(opts_.get(), bad), TM_E_INVALID) << bad;
  }
  const std::string longest(TM_MAX_STRING_BYTES, 'e');
  for (const char* good :
       {"vllm", "tokenmeter-engine", "_a-1_b", "SGLang", longest.c_str()}) {
    EXPECT_EQ(tm_options_set_engine(opts_.get(), good), TM_OK) << good;
  }
}

TEST_F(OptionsTest, RejectsReservedLabelNames) {
  // Every name the daemon refuses as reserved_label (it once took "reason",
  // "kind", "interval" and "engine_family", which the daemon then refused
  // on every connection).
  for (const char* name :
       {"model_name", "engine", "engine_family", "finished_reason", "position",
        "le", "quantile", "interval", "reason", "kind"}) {
    EXPECT_EQ(tm_options_add_label(opts_.get(), name, "v"), TM_E_INVALID)
        << name;
  }
}

TEST_F(OptionsTest, RejectsMalformedUtf8Strings) {
  for (const char* bad : {"\xff", "\xc0\x80", "\xed\xa0\x80", "a\x80",
                          "\xe2\x82", "\xf4\x90\x80\x80"}) {
    EXPECT_EQ(tm_options_add_label(opts_.get(), "a", bad), TM_E_INVALID);
    EXPECT_EQ(tm_options_set_model(opts_.get(), bad), TM_E_INVALID);
    EXPECT_EQ(tm_options_set_instance(opts_.get(), bad), TM_E_INVALID);
    EXPECT_EQ(tm_options_set_scope(opts_.get(), bad), TM_E_INVALID);
  }
  EXPECT_EQ(tm_options_set_model(opts_.get(), "caf\xc3\xa9 \xf0\x9f\x98\x80"),
            TM_OK);
}

TEST_F(OptionsTest, RejectsDoubleUnderscoreLabelNames) {
  EXPECT_EQ(tm_options_add_label(opts_.get(), "__name__", "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(opts_.get(), "__", "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(opts_.get(), "_x", "v"), TM_OK);
}

TEST_F(OptionsTest, RejectsDuplicateLabelNames) {
  EXPECT_EQ(tm_options_add_label(opts_.get(), "region", "a"), TM_OK);
  EXPECT_EQ(tm_options_add_label(opts_.get(), "region", "b"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(opts_.get(), "region", "a"), TM_E_INVALID);
}

TEST_F(OptionsTest, RejectsMalformedLabelNames) {
  for (const char* bad : {"", "1a", "a-b", "a b", "a.b", "a:b"}) {
    EXPECT_EQ(tm_options_add_label(opts_.get(), bad, "v"), TM_E_INVALID) << bad;
  }
}

TEST_F(OptionsTest, RejectsNinthLabel) {
  for (int i = 0; i < int(TM_MAX_HELLO_LABELS); ++i) {
    const std::string name = "l" + std::to_string(i);
    EXPECT_EQ(tm_options_add_label(opts_.get(), name.c_str(), "v"), TM_OK);
  }
  EXPECT_EQ(tm_options_add_label(opts_.get(), "ninth", "v"), TM_E_INVALID);
}

TEST_F(OptionsTest, RejectsLabelValueTooLong) {
  const std::string value(TM_MAX_STRING_BYTES + 1, 'v');
  EXPECT_EQ(tm_options_add_label(opts_.get(), "a", value.c_str()),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(opts_.get(), "a", value.c_str() + 1), TM_OK);
}

TEST_F(OptionsTest, RejectsUnknownProfile) {
  for (const char* bad :
       {"", "VLLM", "vllm ", "trtllm", "tokenmeter-engine", "auto"}) {
    EXPECT_EQ(tm_options_set_profile(opts_.get(), bad), TM_E_INVALID) << bad;
  }
  for (const char* good :
       {TM_PROFILE_VLLM, TM_PROFILE_SGLANG, TM_PROFILE_LMDEPLOY}) {
    EXPECT_EQ(tm_options_set_profile(opts_.get(), good), TM_OK) << good;
  }
}

TEST_F(OptionsTest, RejectsCacheConfigEntryPastTheLimit) {
  for (int i = 0; i < int(TM_MAX_CACHE_CONFIG); ++i) {
    const std::string key = "k" + std::to_string(i);
    EXPECT_EQ(tm_options_add_cache_config_int(opts_.get(), key.c_str(), i),
              TM_OK);
  }
  tm_options* o = opts_.get();
  EXPECT_EQ(tm_options_add_cache_config_int(o, "more", 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, "more", "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_float(o, "more", 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_bool(o, "more", 1), TM_E_INVALID);
}

TEST_F(OptionsTest, RejectsDuplicateCacheConfigKey) {
  tm_options* o = opts_.get();
  EXPECT_EQ(tm_options_add_cache_config_int(o, "block_size", 16), TM_OK);
  EXPECT_EQ(tm_options_add_cache_config_int(o, "block_size", 32), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, "block_size", "16"),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_float(o, "block_size", 16),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_bool(o, "block_size", 1), TM_E_INVALID);
}

// A HELLO label and a cache_config key of the same name would both label
// <ns>:cache_config_info: the daemon refuses such a HELLO (reserved_label)
// on every reconnect, so neither call lets the second one in.
TEST_F(OptionsTest, RejectsCacheConfigKeyNamedLikeALabel) {
  tm_options* o = opts_.get();
  EXPECT_EQ(tm_options_add_label(o, "block_size", "16"), TM_OK);
  EXPECT_EQ(tm_options_add_cache_config_int(o, "block_size", 16), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, "block_size", "16"),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_int(o, "page_size", 16), TM_OK);
  EXPECT_EQ(tm_options_add_label(o, "page_size", "16"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(o, "tier", "a"), TM_OK);
}

TEST_F(OptionsTest, RejectsReservedCacheConfigKeys) {
  for (const char* key : {TM_RESERVED_LABEL_NAMES, "__x", "__"}) {
    EXPECT_EQ(tm_options_add_cache_config_int(opts_.get(), key, 1),
              TM_E_INVALID)
        << key;
  }
  EXPECT_EQ(tm_options_add_cache_config_int(opts_.get(), "_x", 1), TM_OK);
}

TEST_F(OptionsTest, RejectsMalformedCacheConfigKeys) {
  const std::string too_long(TM_MAX_STRING_BYTES + 1, 'k');
  for (const char* bad :
       {"", "1a", "a-b", "a b", "a.b", "\xc3\xa9", "\xff", too_long.c_str()}) {
    EXPECT_EQ(tm_options_add_cache_config_bool(opts_.get(), bad, 1),
              TM_E_INVALID)
        << bad;
  }
  EXPECT_EQ(
      tm_options_add_cache_config_bool(opts_.get(), too_long.c_str() + 1, 1),
      TM_OK);
}

TEST_F(OptionsTest, RejectsMalformedUtf8CacheConfigValue) {
  for (const char* bad : {"\xff", "\xc0\x80", "\xed\xa0\x80", "a\x80",
                          "\xe2\x82", "\xf4\x90\x80\x80"}) {
    EXPECT_EQ(tm_options_add_cache_config_str(opts_.get(), "dtype", bad),
              TM_E_INVALID);
  }
  const std::string too_long(TM_MAX_STRING_BYTES + 1, 'v');
  EXPECT_EQ(
      tm_options_add_cache_config_str(opts_.get(), "dtype", too_long.c_str()),
      TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(opts_.get(), "dtype",
                                            too_long.c_str() + 1),
            TM_OK);
}

TEST_F(OptionsTest, RejectsNonFiniteCacheConfigFloat) {
  for (double bad : {std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(tm_options_add_cache_config_float(opts_.get(), "f", bad),
              TM_E_INVALID)
        << bad;
  }
  EXPECT_EQ(tm_options_add_cache_config_float(
                opts_.get(), "f", std::numeric_limits<double>::max()),
            TM_OK);
}

TEST_F(OptionsTest, RejectsNegativeMaxLora) {
  EXPECT_EQ(tm_options_set_max_lora(opts_.get(), -1), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_max_lora(opts_.get(), INT64_MIN), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_max_lora(opts_.get(), 0), TM_OK);
  EXPECT_EQ(tm_options_set_max_lora(opts_.get(), INT64_MAX), TM_OK);
}

TEST_F(OptionsTest, RejectsSocketPathTooLongForSunPath) {
  // sun_path is 108 bytes: 107 characters and the terminating NUL.
  const std::string longest = "/" + std::string(106, 'p');
  const std::string too_long = longest + "p";
  EXPECT_EQ(tm_options_set_socket_path(opts_.get(), too_long.c_str()),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_set_socket_path(opts_.get(), ""), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_socket_path(opts_.get(), longest.c_str()), TM_OK);
}

TEST_F(OptionsTest, RejectsBufferCapacityOutOfRange) {
  for (size_t bad : {size_t{0}, size_t{1023}, (size_t{16} << 20) + 1,
                     std::numeric_limits<size_t>::max()}) {
    EXPECT_EQ(tm_options_set_buffer_capacity(opts_.get(), bad), TM_E_INVALID)
        << bad;
  }
  EXPECT_EQ(tm_options_set_buffer_capacity(opts_.get(), 1024), TM_OK);
  EXPECT_EQ(tm_options_set_buffer_capacity(opts_.get(), size_t{16} << 20),
            TM_OK);
}

TEST_F(OptionsTest, RejectsFlushIntervalOutOfRange) {
  EXPECT_EQ(tm_options_set_flush_interval_ms(opts_.get(), 0), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_flush_interval_ms(opts_.get(), 10001), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_flush_interval_ms(opts_.get(), 1), TM_OK);
  EXPECT_EQ(tm_options_set_flush_interval_ms(opts_.get(), 10000), TM_OK);
}

TEST_F(OptionsTest, RejectsCloseTimeoutOutOfRange) {
  EXPECT_EQ(tm_options_set_close_timeout_ms(opts_.get(), 600001), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_close_timeout_ms(opts_.get(), UINT32_MAX),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_set_close_timeout_ms(opts_.get(), 0), TM_OK);
  EXPECT_EQ(tm_options_set_close_timeout_ms(opts_.get(), 600000), TM_OK);
}

TEST_F(OptionsTest, RejectsMaxThreadsOutOfRange) {
  EXPECT_EQ(tm_options_set_max_threads(opts_.get(), 0), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_max_threads(opts_.get(), 4097), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_max_threads(opts_.get(), 1), TM_OK);
  EXPECT_EQ(tm_options_set_max_threads(opts_.get(), 4096), TM_OK);
}

TEST_F(OptionsTest, RejectsEmptyOrOverlongModel) {
  const std::string too_long(TM_MAX_STRING_BYTES + 1, 'm');
  EXPECT_EQ(tm_options_set_model(opts_.get(), ""), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_model(opts_.get(), too_long.c_str()), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_model(opts_.get(), too_long.c_str() + 1), TM_OK);
}

TEST_F(OptionsTest, RejectsOverlongInstanceAndScope) {
  const std::string too_long(TM_MAX_STRING_BYTES + 1, 's');
  EXPECT_EQ(tm_options_set_instance(opts_.get(), too_long.c_str()),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_set_scope(opts_.get(), too_long.c_str()), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_instance(opts_.get(), too_long.c_str() + 1), TM_OK);
  EXPECT_EQ(tm_options_set_scope(opts_.get(), too_long.c_str() + 1), TM_OK);
}

TEST_F(OptionsTest, RejectsNullArguments) {
  tm_options* o = opts_.get();
  EXPECT_EQ(tm_options_set_socket_path(o, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_engine(o, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_model(o, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_instance(o, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_scope(o, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(o, nullptr, "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(o, "n", nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_socket_path(nullptr, "/x"), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_engine(nullptr, "vllm"), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_model(nullptr, "m"), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_instance(nullptr, "i"), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_scope(nullptr, "s"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(nullptr, "n", "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_buffer_capacity(nullptr, 4096), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_flush_interval_ms(nullptr, 20), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_close_timeout_ms(nullptr, 20), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_max_threads(nullptr, 4), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_profile(o, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_profile(nullptr, "vllm"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, nullptr, "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, "k", nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(nullptr, "k", "v"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_int(o, nullptr, 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_int(nullptr, "k", 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_float(o, nullptr, 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_float(nullptr, "k", 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_bool(o, nullptr, 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_bool(nullptr, "k", 1), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_max_lora(nullptr, 1), TM_E_INVALID);
  tm_options_free(nullptr);  // a no-op
}

// ---- client creation and NULL handles --------------------------------------

TEST(ClientNewTest, RejectsOptionsWithoutModel) {
  OptionsPtr opts(tm_options_new());
  ASSERT_NE(opts, nullptr);
  tm_client* c = nullptr;
  EXPECT_EQ(tm_client_new(opts.get(), &c), TM_E_INVALID);
  EXPECT_EQ(c, nullptr);
}

TEST(ClientNewTest, RejectsNullArguments) {
  OptionsPtr opts(tm_options_new());
  ASSERT_EQ(tm_options_set_model(opts.get(), "m"), TM_OK);
  tm_client* c = nullptr;
  EXPECT_EQ(tm_client_new(nullptr, &c), TM_E_INVALID);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(tm_client_new(opts.get(), nullptr), TM_E_INVALID);
}

TEST(NullHandleTest, EventFunctionsRejectNullClient) {
  const tm_step_key key = TM_STEP_KEY_RUNNING;
  const double value = 1;
  EXPECT_EQ(tm_arrived(nullptr, 1, 1, 1, 0, 0), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_str(nullptr, 1, "a", 1, 1, 0, 0), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_packed(nullptr, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_packed_str(nullptr, "a", 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_queued(nullptr, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_queued_str(nullptr, 1, "a", 1), TM_E_INVALID);
  EXPECT_EQ(tm_scheduled(nullptr, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_scheduled_str(nullptr, 1, "a", 1), TM_E_INVALID);
  EXPECT_EQ(tm_tokens(nullptr, 1, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_tokens(nullptr, 1, 1, 0), TM_E_INVALID);
  EXPECT_EQ(tm_tokens_str(nullptr, 1, "a", 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_finished(nullptr, 1, 1, TM_FINISH_STOP), TM_E_INVALID);
  EXPECT_EQ(tm_finished(nullptr, 1, 1, static_cast<tm_finish_reason>(7)),
            TM_E_INVALID);
  EXPECT_EQ(tm_finished_str(nullptr, 1, "a", 1, TM_FINISH_STOP), TM_E_INVALID);
  EXPECT_EQ(tm_preempted(nullptr, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_preempted_str(nullptr, 1, "a", 1), TM_E_INVALID);
  EXPECT_EQ(tm_step(nullptr, 1, &key, &value, 1, nullptr, 0), TM_E_INVALID);
  const tm_label label = {"tenant", "a"};
  EXPECT_EQ(tm_arrived_ex(nullptr, 1, 1, 1, 0, 0, "l", &label, 1),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex(nullptr, 1, 1, 1, 0, 0, "", nullptr, 9),
            TM_E_INVALID);
  EXPECT_EQ(tm_arrived_ex_str(nullptr, 1, "a", 1, 1, 0, 0, "l", &label, 1),
            TM_E_INVALID);
  const uint64_t counts[] = {1};
  EXPECT_EQ(tm_expert_load(nullptr, 1, 0, counts, 1), TM_E_INVALID);
  EXPECT_EQ(tm_expert_load(nullptr, 1, TM_MAX_MOE_LAYERS, counts, 1),
            TM_E_INVALID);
  const tm_request_params p = TM_REQUEST_PARAMS_INIT;
  EXPECT_EQ(tm_arrived_params(nullptr, 1, 1, 1, &p), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_params(nullptr, 1, 1, 1, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_arrived_params_str(nullptr, 1, "a", 1, 1, &p), TM_E_INVALID);
  EXPECT_EQ(tm_scheduled_ex(nullptr, 1, 1, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_scheduled_ex_str(nullptr, 1, "a", 1, 1, 1), TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected(nullptr, 1, "x"), TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_rid(nullptr, 1, "x", 1), TM_E_INVALID);
  EXPECT_EQ(tm_admission_rejected_str(nullptr, 1, "x", "a", 1), TM_E_INVALID);
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  EXPECT_EQ(tm_kv_transfer(nullptr, 1, 1, &kv), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer_str(nullptr, 1, "a", 1, &kv), TM_E_INVALID);
  EXPECT_EQ(tm_sleep_state(nullptr, 1, TM_SCHEDULER_KEEP, TM_WEIGHTS_KEEP,
                           TM_KV_CACHE_KEEP),
            TM_E_INVALID);
}

TEST(NullHandleTest, ClientFunctionsRejectNullClient) {
  uint64_t stats[TM_STAT_COUNT] = {};
  EXPECT_EQ(tm_client_flush(nullptr, 10), TM_E_INVALID);
  EXPECT_EQ(tm_client_stats(nullptr, stats, TM_STAT_COUNT), TM_E_INVALID);
  EXPECT_EQ(tm_thread_attach(nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_client_close(nullptr, stats, TM_STAT_COUNT), TM_OK);
}

using StatsTest = ClientFixture;

TEST_F(StatsTest, RejectsNullOutputAndCopiesAtMostCount) {
  NewClient();
  EXPECT_EQ(tm_client_stats(client_, nullptr, 3), TM_E_INVALID);
  EXPECT_EQ(tm_client_stats(client_, nullptr, 0), TM_OK);
  uint64_t out[TM_STAT_COUNT + 2];
  std::memset(out, 0xab, sizeof out);
  EXPECT_EQ(tm_client_stats(client_, out, TM_STAT_COUNT + 2), TM_OK);
  EXPECT_EQ(out[TM_STAT_EVENTS_SENT], 0u);
  EXPECT_EQ(out[TM_STAT_COUNT], 0xababababababababu);
  EXPECT_EQ(out[TM_STAT_COUNT + 1], 0xababababababababu);
  uint64_t two[2] = {7, 7};
  EXPECT_EQ(tm_client_stats(client_, two, 1), TM_OK);
  EXPECT_EQ(two[0], 0u);
  EXPECT_EQ(two[1], 7u);
}

TEST(StrerrorTest, NamesEveryStatus) {
  const int codes[] = {TM_OK,      TM_E_INVALID, TM_E_DROPPED,
                       TM_E_NOMEM, TM_E_TIMEOUT, TM_E_DISCONNECTED,
                       TM_E_SYSTEM};
  std::vector<std::string> texts;
  for (int code : codes) {
    const char* s = tm_strerror(code);
    ASSERT_NE(s, nullptr);
    EXPECT_GT(std::strlen(s), 0u);
    texts.emplace_back(s);
  }
  std::sort(texts.begin(), texts.end());
  EXPECT_EQ(std::unique(texts.begin(), texts.end()), texts.end());
  ASSERT_NE(tm_strerror(-100), nullptr);
  ASSERT_NE(tm_strerror(42), nullptr);
}

TEST(VersionTest, IsDottedTriple) {
  const char* v = tm_version();
  ASSERT_NE(v, nullptr);
  unsigned major = 0, minor = 0, patch = 0;
  char tail = 0;
  EXPECT_EQ(std::sscanf(v, "%u.%u.%u%c", &major, &minor, &patch, &tail), 3)
      << v;
}

}  // namespace
}  // namespace tokenmeter::testing
