// What libtokenmeter puts on the wire: HELLO, BATCH, GOODBYE and every event
// layout, checked against docs/protocol.md with an independent decoder
// (msgpack-c's C API) and, for a table of events, byte for byte against
// encodings written by hand from the msgpack spec.
#include <msgpack.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "client_fixture.h"
#include "msgpack_value.h"
#include "protocol_checks.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

std::vector<std::string> ToStrings(const std::vector<Value>& values) {
  std::vector<std::string> out;
  for (const Value& v : values) out.push_back(v.ToString());
  return out;
}

std::vector<std::string> MapKeys(const Value& map) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : map.map) keys.push_back(k.str);
  std::sort(keys.begin(), keys.end());
  return keys;
}

class HelloTest : public ClientFixture {
 protected:
  // Connects a client built from `opts`, closes it, and returns the only
  // connection's HELLO after checking the connection.
  Value HelloOf(const tm_options* opts) {
    NewClient(opts);
    return CloseAndGetHello();
  }
  Value CloseAndGetHello() {
    EXPECT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
      return !c.empty() && !c[0].frames.empty();
    })) << "no HELLO";
    EXPECT_EQ(CloseClient(), TM_OK);
    EXPECT_TRUE(WaitForEof(0));
    const TestServer::Connections conns = server_->Snapshot();
    if (conns.size() != 1 || conns[0].frames.empty()) return Value{};
    EXPECT_TRUE(IsWellFormed(conns[0]));
    return conns[0].frames[0].value;
  }
};

TEST_F(HelloTest, SendsHelloFirstWithRequiredKeysOnly) {
  StartServer();
  const Value hello = HelloOf(DefaultOptions().get());
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  // session and ack (protocol 1.1) are always sent by default: the client
  // asks for ACKs unless tm_options_set_ack(opts, 0).
  EXPECT_EQ(MapKeys(meta),
            (std::vector<std::string>{"ack", "engine", "model", "pid", "proto",
                                      "session"}));
  EXPECT_EQ(meta.Find("proto")->uint, 1u);
  ASSERT_TRUE(meta.Find("session")->IsUint());
  EXPECT_NE(meta.Find("session")->uint, 0u);
  EXPECT_EQ(meta.Find("ack")->ToString(), "true");
  EXPECT_EQ(meta.Find("engine")->str, "tokenmeter-engine");
  EXPECT_EQ(meta.Find("model")->str, "m");
  EXPECT_EQ(meta.Find("pid")->uint, uint64_t(getpid()));
  EXPECT_EQ(meta.Find("instance"), nullptr);
  EXPECT_EQ(meta.Find("scope"), nullptr);
  EXPECT_EQ(meta.Find("labels"), nullptr);
}

TEST_F(HelloTest, SendsOptionalKeysWhenSet) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_engine(opts.get(), "vllm"), TM_OK);
  ASSERT_EQ(tm_options_set_model(opts.get(), "llama-3-8b"), TM_OK);
  ASSERT_EQ(tm_options_set_instance(opts.get(), "dp0"), TM_OK);
  ASSERT_EQ(tm_options_set_scope(opts.get(), "server-1"), TM_OK);
  ASSERT_EQ(tm_options_add_label(opts.get(), "region", "eu-west"), TM_OK);
  ASSERT_EQ(tm_options_add_label(opts.get(), "_tier2", ""), TM_OK);
  const Value hello = HelloOf(opts.get());
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  EXPECT_EQ(MapKeys(meta), (std::vector<std::string>{
                               "ack", "engine", "instance", "labels", "model",
                               "pid", "proto", "scope", "session"}));
  EXPECT_EQ(meta.Find("engine")->str, "vllm");
  EXPECT_EQ(meta.Find("model")->str, "llama-3-8b");
  EXPECT_EQ(meta.Find("instance")->str, "dp0");
  EXPECT_EQ(meta.Find("scope")->str, "server-1");
  const Value* labels = meta.Find("labels");
  ASSERT_TRUE(labels != nullptr && labels->IsMap());
  EXPECT_EQ(MapKeys(*labels), (std::vector<std::string>{"_tier2", "region"}));
  EXPECT_EQ(labels->Find("region")->str, "eu-west");
  EXPECT_EQ(labels->Find("_tier2")->str, "");
}

// With ack off, HELLO still carries the session but no ack key: the
// daemon never writes to this client.
TEST_F(HelloTest, SendsSessionWithoutAckWhenAckIsOff) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_ack(opts.get(), 0), TM_OK);
  const Value hello = HelloOf(opts.get());
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  EXPECT_EQ(MapKeys(meta), (std::vector<std::string>{"engine", "model", "pid",
                                                     "proto", "session"}));
  EXPECT_NE(meta.Find("session")->uint, 0u);
}

// One session per client instance: the same on every connection of a
// client, another for the next client made from the same options.
TEST_F(HelloTest, SessionRepeatsOnReconnectAndDiffersBetweenClients) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  NewClient(opts.get());
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return !c.empty() && !c[0].frames.empty();
  }));
  server_->Drop(0);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 2 && !c[1].frames.empty();
  }));
  ASSERT_EQ(CloseClient(), TM_OK);
  NewClient(opts.get());
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 3 && !c[2].frames.empty();
  }));
  ASSERT_EQ(CloseClient(), TM_OK);
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 3u);
  std::vector<uint64_t> sessions;
  for (const Connection& c : conns) {
    ASSERT_TRUE(IsValidHello(c.frames[0].value));
    const Value* session = c.frames[0].value.array[1].Find("session");
    ASSERT_NE(session, nullptr);
    sessions.push_back(session->uint);
  }
  EXPECT_EQ(sessions[0], sessions[1]);
  EXPECT_NE(sessions[0], sessions[2]);
  EXPECT_NE(sessions[2], 0u);
}

TEST_F(HelloTest, RejectedSettersLeaveOptionsUnchanged) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_engine(opts.get(), "sglang"), TM_OK);
  EXPECT_EQ(tm_options_set_engine(opts.get(), "not valid"), TM_E_INVALID);
  EXPECT_EQ(tm_options_set_model(opts.get(), ""), TM_E_INVALID);
  ASSERT_EQ(tm_options_add_label(opts.get(), "a", "1"), TM_OK);
  EXPECT_EQ(tm_options_add_label(opts.get(), "a", "2"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_label(opts.get(), "le", "3"), TM_E_INVALID);
  const std::string long_instance(TM_MAX_STRING_BYTES + 1, 'i');
  EXPECT_EQ(tm_options_set_instance(opts.get(), long_instance.c_str()),
            TM_E_INVALID);
  EXPECT_EQ(tm_options_set_socket_path(opts.get(), ""), TM_E_INVALID);
  const Value hello = HelloOf(opts.get());  // still reaches socket_path_
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  EXPECT_EQ(meta.Find("engine")->str, "sglang");
  EXPECT_EQ(meta.Find("model")->str, "m");
  EXPECT_EQ(meta.Find("instance"), nullptr);
  EXPECT_EQ(meta.Find("labels")->ToString(), R"({"a":"1"})");
}

// Protocol 1.1: profile, cache_config (each value type, in the order
// added) and max_lora.
TEST_F(HelloTest, SendsProtocol11KeysWhenSet) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_profile(opts.get(), TM_PROFILE_SGLANG), TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_int(opts.get(), "page_size", 16),
            TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_str(opts.get(), "dtype", "fp8_e4m3"),
            TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_float(opts.get(), "gpu_util", 0.5),
            TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_bool(opts.get(), "prefix", 7), TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_bool(opts.get(), "swap", 0), TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_int(opts.get(), "offset", -3), TM_OK);
  ASSERT_EQ(tm_options_add_cache_config_int(opts.get(), "num_pages", INT64_MAX),
            TM_OK);
  ASSERT_EQ(tm_options_set_max_lora(opts.get(), 8), TM_OK);
  const Value hello = HelloOf(opts.get());
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  EXPECT_EQ(MapKeys(meta), (std::vector<std::string>{
                               "ack", "cache_config", "engine", "max_lora",
                               "model", "pid", "profile", "proto", "session"}));
  EXPECT_EQ(meta.Find("profile")->str, "sglang");
  const Value* max_lora = meta.Find("max_lora");
  ASSERT_TRUE(max_lora->IsUint());
  EXPECT_EQ(max_lora->uint, 8u);
  const Value* cc = meta.Find("cache_config");
  ASSERT_TRUE(cc != nullptr && cc->IsMap());
  EXPECT_EQ(cc->ToString(),
            R"({"page_size":16,"dtype":"fp8_e4m3","gpu_util":0.5,)"
            R"("prefix":true,"swap":false,"offset":-3,)"
            R"("num_pages":9223372036854775807})");
  EXPECT_EQ(cc->Find("gpu_util")->type, Value::Type::kFloat64);
  EXPECT_EQ(cc->Find("gpu_util")->real, 0.5);
  EXPECT_EQ(cc->Find("prefix")->type, Value::Type::kBool);
  EXPECT_EQ(cc->Find("offset")->type, Value::Type::kInt);
  EXPECT_EQ(cc->Find("offset")->sint, -3);
}

TEST_F(HelloTest, SendsMaxLoraZero) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_max_lora(opts.get(), 0), TM_OK);
  ASSERT_EQ(tm_options_set_profile(opts.get(), TM_PROFILE_VLLM), TM_OK);
  ASSERT_EQ(tm_options_set_profile(opts.get(), TM_PROFILE_LMDEPLOY), TM_OK);
  const Value hello = HelloOf(opts.get());
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  EXPECT_EQ(meta.Find("max_lora")->ToString(), "0");
  EXPECT_EQ(meta.Find("profile")->str, "lmdeploy");  // the last one set
  EXPECT_EQ(meta.Find("cache_config"), nullptr);
}

TEST_F(HelloTest, RejectedProtocol11SettersLeaveOptionsUnchanged) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  tm_options* o = opts.get();
  ASSERT_EQ(tm_options_set_profile(o, TM_PROFILE_VLLM), TM_OK);
  EXPECT_EQ(tm_options_set_profile(o, "tgi"), TM_E_INVALID);
  ASSERT_EQ(tm_options_add_cache_config_int(o, "block_size", 16), TM_OK);
  EXPECT_EQ(tm_options_add_cache_config_int(o, "block_size", 32), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, "le", "x"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_str(o, "dtype", "\xff"), TM_E_INVALID);
  EXPECT_EQ(tm_options_add_cache_config_float(o, "util", NAN), TM_E_INVALID);
  ASSERT_EQ(tm_options_set_max_lora(o, 4), TM_OK);
  EXPECT_EQ(tm_options_set_max_lora(o, -1), TM_E_INVALID);
  const Value hello = HelloOf(o);
  ASSERT_TRUE(IsValidHello(hello));
  const Value& meta = hello.array[1];
  EXPECT_EQ(meta.Find("profile")->str, "vllm");
  EXPECT_EQ(meta.Find("cache_config")->ToString(), R"({"block_size":16})");
  EXPECT_EQ(meta.Find("max_lora")->uint, 4u);
}

TEST_F(HelloTest, ClientKeepsItsOwnCopyOfOptions) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_instance(opts.get(), "copy"), TM_OK);
  NewClient(opts.get());
  opts.reset();  // freed while the client still needs the values
  const Value hello = CloseAndGetHello();
  ASSERT_TRUE(IsValidHello(hello));
  EXPECT_EQ(hello.array[1].Find("instance")->str, "copy");
}

class EventLayoutTest : public ClientFixture {
 protected:
  // Closes the client, checks that it sent `sent` events, rejected none,
  // over one well-formed connection, and returns the events as decoded.
  std::vector<Value> CloseAndGetEvents(uint64_t sent) {
    StatsArray stats{};
    EXPECT_EQ(CloseClient(&stats), TM_OK);
    EXPECT_TRUE(WaitForEof(0));
    EXPECT_EQ(stats[TM_STAT_EVENTS_SENT], sent);
    EXPECT_EQ(stats[TM_STAT_EVENTS_REJECTED], 0u);
    const TestServer::Connections conns = server_->Snapshot();
    EXPECT_EQ(conns.size(), 1u);
    EXPECT_TRUE(IsWellFormed(conns.at(0)));
    return EventsOf(conns.at(0));
  }

  // Makes `rounds` rounds of `per_round` event calls, emit(round, i), each
  // TM_OK, through the smallest buffer (1024 events: 4096 words), flushing
  // after each round so that records wrap around its end and each round
  // starts where the last one ended; closes the client and returns every
  // event the daemon decoded, once it checked that none was dropped.
  std::vector<Value> ThroughSmallestBuffer(
      int rounds, int per_round, const std::function<int(int, int)>& emit) {
    StartServer();
    OptionsPtr opts = DefaultOptions();
    EXPECT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
    NewClient(opts.get());
    if (HasFatalFailure()) return {};
    for (int round = 0; round < rounds; ++round) {
      for (int i = 0; i < per_round; ++i) {
        const int rc = emit(round, i);
        if (rc != TM_OK) {
          ADD_FAILURE() << "round " << round << " call " << i << ": " << rc;
          return {};
        }
      }
      EXPECT_EQ(tm_client_flush(client_, 5000), TM_OK);
    }
    StatsArray stats{};
    EXPECT_EQ(CloseClient(&stats), TM_OK);
    EXPECT_TRUE(WaitForEof(0));
    EXPECT_EQ(stats[TM_STAT_EVENTS_DROPPED], 0u);
    const TestServer::Connections conns = server_->Snapshot();
    EXPECT_TRUE(IsWellFormed(conns.at(0)));
    return EventsOf(conns.at(0));
  }
};
using ClockTest = ClientFixture;
using GoodbyeTest = ClientFixture;

// Every event kind with integer and string request ids, as the decoder sees
// it, in the order the one producing thread sent it.
TEST_F(EventLayoutTest, SendsEveryKindWithIntAndStringIds) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const char* kRid = "req-9";
  const size_t kLen = 5;
  EXPECT_EQ(tm_arrived(c, 1000, 1, 10, 0, 0), TM_OK);
  EXPECT_EQ(tm_arrived(c, 1001, 2, 20, 64, 0), TM_OK);
  EXPECT_EQ(tm_arrived(c, 1002, 3, 30, 0, 2), TM_OK);
  EXPECT_EQ(tm_arrived_str(c, 1003, kRid, kLen, 40, 0, 0), TM_OK);
  EXPECT_EQ(tm_arrived_str(c, 1004, kRid, kLen, 50, 0, 4), TM_OK);
  EXPECT_EQ(tm_queued(c, 1005, 1), TM_OK);
  EXPECT_EQ(tm_queued_str(c, 1006, kRid, kLen), TM_OK);
  EXPECT_EQ(tm_scheduled(c, 1007, 1), TM_OK);
  EXPECT_EQ(tm_scheduled_str(c, 1008, kRid, kLen), TM_OK);
  EXPECT_EQ(tm_tokens(c, 1009, 1, 1), TM_OK);
  EXPECT_EQ(tm_tokens_str(c, 1010, kRid, kLen, 4294967295u), TM_OK);
  EXPECT_EQ(tm_preempted(c, 1011, 1), TM_OK);
  EXPECT_EQ(tm_preempted_str(c, 1012, kRid, kLen), TM_OK);
  EXPECT_EQ(tm_finished(c, 1013, 1, TM_FINISH_STOP), TM_OK);
  EXPECT_EQ(tm_finished(c, 1014, 2, TM_FINISH_LENGTH), TM_OK);
  EXPECT_EQ(tm_finished_str(c, 1015, kRid, kLen, TM_FINISH_ABORT), TM_OK);
  EXPECT_EQ(tm_finished_str(c, 1016, "x", 1, TM_FINISH_ERROR), TM_OK);
  EXPECT_EQ(tm_step(c, 1017, nullptr, nullptr, 0, nullptr, 0), TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(ToStrings(EventsOf(conns[0])),
            (std::vector<std::string>{
                R"([1,1000,1,10])",
                R"([1,1001,2,20,{"max_tokens":64}])",
                R"([1,1002,3,30,{"n":2}])",
                R"([1,1003,"req-9",40])",
                R"([1,1004,"req-9",50,{"n":4}])",
                R"([2,1005,1])",
                R"([2,1006,"req-9"])",
                R"([3,1007,1])",
                R"([3,1008,"req-9"])",
                R"([4,1009,1,1])",
                R"([4,1010,"req-9",4294967295])",
                R"([6,1011,1])",
                R"([6,1012,"req-9"])",
                R"([5,1013,1,"stop"])",
                R"([5,1014,2,"length"])",
                R"([5,1015,"req-9","abort"])",
                R"([5,1016,"x","error"])",
                R"([7,1017,{}])",
            }));
}

TEST_F(EventLayoutTest, SendsArrivedWithBothParams) {
  StartServer();
  NewClient();
  EXPECT_EQ(tm_arrived(client_, 7, 70, 700, 4096, 3), TM_OK);
  EXPECT_EQ(tm_arrived_str(client_, 8, "r", 1, 800, 1, 1), TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));
  const std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 2u);
  for (const Value& ev : events) ASSERT_TRUE(IsValidEvent(ev));
  EXPECT_EQ(events[0].array.size(), 5u);
  EXPECT_EQ(events[0].array[2].uint, 70u);
  EXPECT_EQ(events[0].array[3].uint, 700u);
  const Value& p0 = events[0].array[4];
  EXPECT_EQ(MapKeys(p0), (std::vector<std::string>{"max_tokens", "n"}));
  EXPECT_EQ(p0.Find("max_tokens")->uint, 4096u);
  EXPECT_EQ(p0.Find("n")->uint, 3u);
  EXPECT_EQ(events[1].array[2].str, "r");
  const Value& p1 = events[1].array[4];
  EXPECT_EQ(p1.Find("max_tokens")->uint, 1u);
  EXPECT_EQ(p1.Find("n")->uint, 1u);
}

// Protocol 1.1 ARRIVED params: lora and labels, alone or with max_tokens
// and n, for integer and string ids, in the order max_tokens, n, lora,
// labels (labels in the order given).
TEST_F(EventLayoutTest, SendsArrivedWithLoraAndLabels) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const tm_label two[] = {{"tenant", "acme"}, {"tier", ""}};
  const tm_label one[] = {{"_x", "caf\xc3\xa9"}};
  EXPECT_EQ(tm_arrived_ex(c, 1000, 1, 10, 0, 0, "sql-lora", nullptr, 0), TM_OK);
  EXPECT_EQ(tm_arrived_ex(c, 1001, 2, 20, 64, 2, "a", two, 2), TM_OK);
  EXPECT_EQ(tm_arrived_ex(c, 1002, 3, 30, 0, 0, nullptr, one, 1), TM_OK);
  EXPECT_EQ(tm_arrived_ex(c, 1003, 4, 40, 0, 3, nullptr, two, 2), TM_OK);
  EXPECT_EQ(tm_arrived_ex_str(c, 1004, "req-9", 5, 50, 0, 0, "l", nullptr, 0),
            TM_OK);
  EXPECT_EQ(
      tm_arrived_ex_str(c, 1005, "req-9xyz", 5, 60, 128, 0, "lora-2", two, 2),
      TM_OK);
  EXPECT_EQ(tm_arrived_ex_str(c, 1006, "r", 1, 70, 0, 0, nullptr, one, 1),
            TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(ToStrings(EventsOf(conns[0])),
            (std::vector<std::string>{
                R"([1,1000,1,10,{"lora":"sql-lora"}])",
                R"([1,1001,2,20,{"max_tokens":64,"n":2,"lora":"a",)"
                R"("labels":{"tenant":"acme","tier":""}}])",
                R"([1,1002,3,30,{"labels":{"_x":"caf\xc3\xa9"}}])",
                R"([1,1003,4,40,{"n":3,"labels":{"tenant":"acme","tier":""}}])",
                R"([1,1004,"req-9",50,{"lora":"l"}])",
                R"([1,1005,"req-9",60,{"max_tokens":128,"lora":"lora-2",)"
                R"("labels":{"tenant":"acme","tier":""}}])",
                R"([1,1006,"r",70,{"labels":{"_x":"caf\xc3\xa9"}}])",
            }));
}

// Without lora and labels, tm_arrived_ex(_str) sends tm_arrived(_str)'s
// event: 4 elements without params, the same params otherwise.
TEST_F(EventLayoutTest, ArrivedExWithoutNewParamsIsArrived) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  EXPECT_EQ(tm_arrived_ex(c, 7, 70, 700, 0, 0, nullptr, nullptr, 0), TM_OK);
  EXPECT_EQ(tm_arrived(c, 7, 70, 700, 0, 0), TM_OK);
  EXPECT_EQ(tm_arrived_ex(c, 8, 80, 800, 5, 6, nullptr, nullptr, 0), TM_OK);
  EXPECT_EQ(tm_arrived(c, 8, 80, 800, 5, 6), TM_OK);
  const tm_label unused = {"ignored", "because n_labels is 0"};
  EXPECT_EQ(tm_arrived_ex_str(c, 9, "r", 1, 900, 0, 0, nullptr, &unused, 0),
            TM_OK);
  EXPECT_EQ(tm_arrived_str(c, 9, "r", 1, 900, 0, 0), TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const std::vector<Value> events = EventsOf(conns[0]);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].ToString(), "[1,7,70,700]");
  EXPECT_EQ(events[2].ToString(), R"([1,8,80,800,{"max_tokens":5,"n":6}])");
  EXPECT_EQ(events[4].ToString(), R"([1,9,"r",900])");
  const std::vector<const Frame*> batches = BatchesOf(conns[0]);
  ASSERT_EQ(batches.size(), 1u);
  for (size_t i = 0; i < 6; i += 2) {
    EXPECT_EQ(events[i].ToString(), events[i + 1].ToString()) << i;
  }
}

// The longest strings of a 1.1 ARRIVED: a 128-byte id, a 128-byte lora,
// four labels with 256-byte names and 128-byte values.
struct LongestArrivedStrings {
  LongestArrivedStrings() {
    for (char ch : {'a', 'b', 'c', 'd'}) {
      names.push_back(std::string(TM_MAX_STRING_BYTES - 1, ch) + "_");
      values.push_back(std::string(TM_MAX_REQUEST_LABEL_VALUE_BYTES, ch));
    }
    for (size_t i = 0; i < TM_MAX_REQUEST_LABELS; ++i) {
      labels[i] = {names[i].c_str(), values[i].c_str()};
    }
  }
  // Checks that the e-th decoded ARRIVED carries them, with prompt_tokens
  // `prompt` and `n_params` params in all.
  void Expect(const Value& ev, size_t e, uint64_t prompt,
              size_t n_params) const {
    ASSERT_EQ(ev.array.size(), 5u) << e;
    EXPECT_EQ(ev.array[2].str, rid) << e;
    EXPECT_EQ(ev.array[3].uint, prompt) << e;
    const Value& params = ev.array[4];
    ASSERT_EQ(params.map.size(), n_params) << e;
    EXPECT_EQ(params.Find("lora")->str, lora) << e;
    const Value* l = params.Find("labels");
    ASSERT_TRUE(l != nullptr && l->IsMap()) << e;
    ASSERT_EQ(l->map.size(), TM_MAX_REQUEST_LABELS) << e;
    for (size_t i = 0; i < TM_MAX_REQUEST_LABELS; ++i) {
      EXPECT_EQ(l->map[i].first.str, names[i]) << e;
      EXPECT_EQ(l->map[i].second.str, values[i]) << e;
    }
  }

  std::string rid = std::string(TM_MAX_RID_BYTES, 'r');
  std::string lora = std::string(TM_MAX_LORA_BYTES, 'l');
  std::vector<std::string> names, values;
  tm_label labels[TM_MAX_REQUEST_LABELS];
};

// The largest ARRIVED (the longest 1.1 strings, 232 words) round after
// round through the smallest buffer, so that records wrap around its end.
TEST_F(EventLayoutTest, LargestArrivedRecordsWrapTheBuffer) {
  const LongestArrivedStrings x;
  // 17 records of 232 words fill most of the 4096-word ring.
  constexpr int kPerRound = 17;
  const std::vector<Value> events =
      ThroughSmallestBuffer(5, kPerRound, [&](int round, int i) {
        return tm_arrived_ex_str(client_, 1 + i, x.rid.data(), x.rid.size(),
                                 uint32_t(round), 1, 1, x.lora.c_str(),
                                 x.labels, TM_MAX_REQUEST_LABELS);
      });
  ASSERT_EQ(events.size(), size_t{5 * kPerRound});
  for (size_t e = 0; e < events.size(); ++e) {
    x.Expect(events[e], e, e / kPerRound, 4);  // max_tokens, n, lora, labels
  }
}

TEST_F(EventLayoutTest, SendsStepWithEveryKey) {
  StartServer();
  NewClient();
  const tm_step_key keys[] = {
      TM_STEP_KEY_SPEC_ACCEPTED_TOKENS,  // any order in, key order irrelevant
      TM_STEP_KEY_RUNNING,
      TM_STEP_KEY_WAITING,
      TM_STEP_KEY_KV_USAGE,
      TM_STEP_KEY_PROMPT_TOKENS,
      TM_STEP_KEY_GENERATION_TOKENS,
      TM_STEP_KEY_PREFIX_QUERIES,
      TM_STEP_KEY_PREFIX_HITS,
      TM_STEP_KEY_SPEC_DRAFTS,
      TM_STEP_KEY_SPEC_DRAFT_TOKENS,
  };
  const double values[] = {10, 1, 2, 0.25, 4, 5, 6, 7, 8, 4294967295.0};
  uint64_t positions[TM_MAX_SPEC_POSITIONS];
  for (size_t i = 0; i < TM_MAX_SPEC_POSITIONS; ++i) positions[i] = i * 1000;
  ASSERT_EQ(
      tm_step(client_, 99, keys, values, 10, positions, TM_MAX_SPEC_POSITIONS),
      TM_OK);
  const tm_step_key one_key[] = {TM_STEP_KEY_KV_USAGE};
  const double one_value[] = {1.0};
  ASSERT_EQ(tm_step(client_, 100, one_key, one_value, 1, nullptr, 0), TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));

  const std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 2u);
  ASSERT_TRUE(IsValidEvent(events[0]));
  ASSERT_TRUE(IsValidEvent(events[1]));
  EXPECT_EQ(events[0].array[0].uint, 7u);
  EXPECT_EQ(events[0].array[1].uint, 99u);
  const Value& s = events[0].array[2];
  EXPECT_EQ(MapKeys(s), (std::vector<std::string>{
                            "generation_tokens", "kv_usage", "prefix_hits",
                            "prefix_queries", "prompt_tokens", "running",
                            "spec_accepted_per_pos", "spec_accepted_tokens",
                            "spec_draft_tokens", "spec_drafts", "waiting"}));
  EXPECT_EQ(s.Find("running")->uint, 1u);
  EXPECT_EQ(s.Find("waiting")->uint, 2u);
  EXPECT_TRUE(s.Find("kv_usage")->IsFloat());
  EXPECT_EQ(s.Find("kv_usage")->real, 0.25);
  EXPECT_EQ(s.Find("prompt_tokens")->uint, 4u);
  EXPECT_EQ(s.Find("generation_tokens")->uint, 5u);
  EXPECT_EQ(s.Find("prefix_queries")->uint, 6u);
  EXPECT_EQ(s.Find("prefix_hits")->uint, 7u);
  EXPECT_EQ(s.Find("spec_drafts")->uint, 8u);
  EXPECT_EQ(s.Find("spec_draft_tokens")->uint, TM_MAX_EVENT_COUNT);
  EXPECT_EQ(s.Find("spec_accepted_tokens")->uint, 10u);
  const Value* pos = s.Find("spec_accepted_per_pos");
  ASSERT_TRUE(pos != nullptr && pos->IsArray());
  ASSERT_EQ(pos->array.size(), TM_MAX_SPEC_POSITIONS);
  for (size_t i = 0; i < TM_MAX_SPEC_POSITIONS; ++i) {
    EXPECT_EQ(pos->array[i].uint, i * 1000) << i;
  }
  EXPECT_EQ(events[1].ToString(), R"([7,100,{"kv_usage":1.0}])");
}

// EXPERT_LOAD [8, t, layer, counts] (protocol 1.1) for 1, 256 and 1024
// experts and the first and last layer, decoded.
TEST_F(EventLayoutTest, SendsExpertLoad) {
  StartServer();
  NewClient();
  std::vector<uint64_t> c256(256), c1024(TM_MAX_MOE_EXPERTS);
  for (size_t i = 0; i < c256.size(); ++i) c256[i] = i * 1000;
  for (size_t i = 0; i < c1024.size(); ++i) {
    c1024[i] = i % 2 == 0 ? TM_MAX_EVENT_COUNT - i : i;
  }
  const uint64_t one[] = {42};
  ASSERT_EQ(tm_expert_load(client_, 11, 0, one, 1), TM_OK);
  ASSERT_EQ(tm_expert_load(client_, 12, 17, c256.data(), c256.size()), TM_OK);
  ASSERT_EQ(tm_expert_load(client_, 13, TM_MAX_MOE_LAYERS - 1, c1024.data(),
                           c1024.size()),
            TM_OK);
  ASSERT_EQ(tm_expert_load(client_, 14, TM_MAX_MOE_LAYERS - 1, one, 1), TM_OK);
  const std::vector<Value> events = CloseAndGetEvents(4);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].ToString(), "[8,11,0,[42]]");
  EXPECT_EQ(events[3].ToString(), "[8,14,4095,[42]]");
  const struct {
    uint64_t t;
    uint64_t layer;
    const std::vector<uint64_t>* counts;
  } kBig[] = {{12, 17, &c256}, {13, 4095, &c1024}};
  for (size_t e = 0; e < 2; ++e) {
    const Value& ev = events[1 + e];
    ASSERT_EQ(ev.array.size(), 4u) << e;
    EXPECT_EQ(ev.array[0].uint, 8u) << e;
    EXPECT_EQ(ev.array[1].uint, kBig[e].t) << e;
    EXPECT_EQ(ev.array[2].uint, kBig[e].layer) << e;
    const Value& counts = ev.array[3];
    ASSERT_TRUE(counts.IsArray()) << e;
    ASSERT_EQ(counts.array.size(), kBig[e].counts->size()) << e;
    for (size_t i = 0; i < counts.array.size(); ++i) {
      ASSERT_TRUE(counts.array[i].IsUint()) << e << " " << i;
      EXPECT_EQ(counts.array[i].uint, (*kBig[e].counts)[i]) << e << " " << i;
    }
  }
}

// The largest EXPERT_LOAD (1024 experts, 1026 words) round after round
// through the smallest buffer (4096 words), so that records wrap around
// its end; none is dropped.
TEST_F(EventLayoutTest, LargestExpertLoadRecordsWrapTheBuffer) {
  std::vector<uint64_t> counts(TM_MAX_MOE_EXPERTS);
  constexpr int kPerRound = 3;
  const std::vector<Value> events =
      ThroughSmallestBuffer(7, kPerRound, [&](int round, int i) {
        for (size_t k = 0; k < counts.size(); ++k) {
          counts[k] = k + uint64_t(round * kPerRound + i);
        }
        return tm_expert_load(client_, 1 + i, uint32_t(round), counts.data(),
                              counts.size());
      });
  ASSERT_EQ(events.size(), size_t{7 * kPerRound});
  for (size_t e = 0; e < events.size(); ++e) {
    const Value& ev = events[e];
    ASSERT_EQ(ev.array.size(), 4u) << e;
    EXPECT_EQ(ev.array[2].uint, e / kPerRound) << e;
    const Value& c = ev.array[3];
    ASSERT_EQ(c.array.size(), TM_MAX_MOE_EXPERTS) << e;
    for (size_t k = 0; k < c.array.size(); ++k) {
      ASSERT_EQ(c.array[k].uint, k + e) << e << " " << k;
    }
  }
}

// A buffer with room left for less than one 1024-expert event drops it
// (TM_E_DROPPED, counted) and takes the next one once the sender drained
// it.
TEST_F(EventLayoutTest, ExpertLoadIsDroppedWhenTheBufferIsFull) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
  NewClient(opts.get());  // no daemon: nothing drains
  const std::vector<uint64_t> counts(TM_MAX_MOE_EXPERTS, 1);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(tm_expert_load(client_, 1, 0, counts.data(), counts.size()),
              TM_OK)
        << i;
  }
  EXPECT_EQ(tm_expert_load(client_, 1, 0, counts.data(), counts.size()),
            TM_E_DROPPED);
  // 3 x 1026 words used: a 2-expert event (4 words) still fits.
  EXPECT_EQ(tm_expert_load(client_, 1, 0, counts.data(), 2), TM_OK);
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 1u);
  EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], 0u);
}

// KV_TRANSFER's lean path (ids, a caller's t_ns) on a full buffer: the
// transfer is dropped (TM_E_DROPPED, counted as dropped), a transfer that
// breaks a rule is still rejected (TM_E_INVALID, counted as rejected, not
// dropped), in both id forms and with t_ns = 0; the thread's first call,
// before it has a ring, takes the general path and is appended.
TEST_F(EventLayoutTest, KvTransferOnAFullBufferIsDroppedUnlessItBreaksARule) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
  NewClient(opts.get());  // no daemon: nothing drains
  const int id = tm_register_value(client_, "nixl");
  ASSERT_EQ(id, 1);
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.start_ns = 500;
  kv.bytes = 1 << 20;
  kv.blocks = 64;
  kv.connector_id = uint32_t(id);
  // 4096 words hold 819 records of 5 words.
  int appended = 0;
  while (tm_kv_transfer(client_, 1000, uint64_t(appended), &kv) == TM_OK) {
    ASSERT_LT(++appended, 1024);
  }
  EXPECT_GE(appended, 800);
  StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 1u);
  EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], 0u);
  EXPECT_EQ(tm_kv_transfer_str(client_, 1000, "r", 1, &kv), TM_E_DROPPED);
  EXPECT_EQ(tm_kv_transfer(client_, 0, 1, &kv), TM_E_DROPPED);
  tm_kv_transfer_info bad = kv;
  bad.start_ns = 1001;
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 1, &bad), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer_str(client_, 1000, "r", 1, &bad), TM_E_INVALID);
  bad = kv;
  bad.connector_id = uint32_t(id) + 1;
  EXPECT_EQ(tm_kv_transfer(client_, 0, 1, &bad), TM_E_INVALID);
  s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 3u);
  EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], 3u);
}

// A connector string of up to 16 printable bytes takes the lean path's
// record (6 words for "nixl": header, t, id, start, the packed amounts,
// the string) where the general path writes 7 (bytes and blocks a word
// each): the buffer's 4096 words hold some 680 of them, not 585; a full
// buffer drops the next one (TM_E_DROPPED) and one that breaks a rule is
// still rejected.
TEST_F(EventLayoutTest, KvTransferWithAConnectorStringTakesTheLeanRecord) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
  NewClient(opts.get());  // no daemon: nothing drains
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.start_ns = 500;
  kv.bytes = 1 << 20;
  kv.blocks = 64;
  kv.connector = "nixl";
  int appended = 0;
  while (tm_kv_transfer(client_, 1000, uint64_t(appended), &kv) == TM_OK) {
    ASSERT_LT(++appended, 1024);
  }
  EXPECT_GE(appended, 650);
  EXPECT_LE(appended, 683);
  tm_kv_transfer_info bad = kv;
  bad.start_ns = 1001;
  EXPECT_EQ(tm_kv_transfer(client_, 1000, 1, &bad), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer_str(client_, 1000, "r", 1, &bad), TM_E_INVALID);
  EXPECT_EQ(tm_kv_transfer_str(client_, 1000, "r", 1, &kv), TM_E_DROPPED);
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 2u);
  EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], 2u);
}

// ---- protocol 1.2 -----------------------------------------------------------

constexpr const char* kTraceparent =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// ARRIVED with the 1.2 params (priority, traceparent, tracestate), alone and
// with the 1.1 ones, for integer and string ids, in the order max_tokens, n,
// lora, labels, priority, traceparent, tracestate.
TEST_F(EventLayoutTest, SendsArrivedWithProtocol12Params) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const tm_label two[] = {{"tenant", "acme"}, {"tier", ""}};
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.has_priority = 1;
  p.priority = -7;
  EXPECT_EQ(tm_arrived_params(c, 1000, 1, 10, &p), TM_OK);
  p = TM_REQUEST_PARAMS_INIT;
  p.has_priority = 1;  // priority 0 is a priority
  p.traceparent = kTraceparent;
  EXPECT_EQ(tm_arrived_params(c, 1001, 2, 20, &p), TM_OK);
  p = TM_REQUEST_PARAMS_INIT;
  p.tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
  EXPECT_EQ(tm_arrived_params_str(c, 1002, "req-9", 5, 30, &p), TM_OK);
  p.tracestate = "";  // given, and valid
  EXPECT_EQ(tm_arrived_params(c, 1003, 4, 40, &p), TM_OK);
  p = TM_REQUEST_PARAMS_INIT;
  p.max_tokens = 64;
  p.n = 2;
  p.lora = "sql-lora";
  p.labels = two;
  p.n_labels = 2;
  p.has_priority = 1;
  p.priority = TM_MAX_PRIORITY;
  p.traceparent = kTraceparent;
  p.tracestate = "a=1";
  EXPECT_EQ(tm_arrived_params_str(c, 1004, "r", 1, 50, &p), TM_OK);
  p.priority = TM_MIN_PRIORITY;
  p.has_priority = 0;  // not given: priority not sent, whatever its value
  EXPECT_EQ(tm_arrived_params(c, 1005, 6, 60, &p), TM_OK);
  const std::string tp = std::string("\"") + kTraceparent + "\"";
  EXPECT_EQ(ToStrings(CloseAndGetEvents(6)),
            (std::vector<std::string>{
                R"([1,1000,1,10,{"priority":-7}])",
                R"([1,1001,2,20,{"priority":0,"traceparent":)" + tp + "}]",
                R"([1,1002,"req-9",30,{"tracestate":)"
                R"("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}])",
                R"([1,1003,4,40,{"tracestate":""}])",
                R"([1,1004,"r",50,{"max_tokens":64,"n":2,"lora":"sql-lora",)"
                R"("labels":{"tenant":"acme","tier":""},"priority":2147483647,)"
                R"("traceparent":)" +
                    tp + R"(,"tracestate":"a=1"}])",
                R"([1,1005,6,60,{"max_tokens":64,"n":2,"lora":"sql-lora",)"
                R"("labels":{"tenant":"acme","tier":""},"traceparent":)" +
                    tp + R"(,"tracestate":"a=1"}])",
            }));
}

// Without the 1.2 params tm_arrived_params(_str) sends tm_arrived_ex(_str)'s
// event, and tm_arrived(_str)'s without the 1.1 ones (the bytes: the
// EventBytesTest cases ArrivedParams*).
TEST_F(EventLayoutTest, ArrivedParamsWithoutNewParamsIsArrivedEx) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const tm_label one[] = {{"tenant", "acme"}};
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  EXPECT_EQ(tm_arrived_params(c, 7, 70, 700, &p), TM_OK);
  EXPECT_EQ(tm_arrived(c, 7, 70, 700, 0, 0), TM_OK);
  p.max_tokens = 5;
  p.n = 6;
  p.lora = "l";
  p.labels = one;
  p.n_labels = 1;
  EXPECT_EQ(tm_arrived_params(c, 8, 80, 800, &p), TM_OK);
  EXPECT_EQ(tm_arrived_ex(c, 8, 80, 800, 5, 6, "l", one, 1), TM_OK);
  EXPECT_EQ(tm_arrived_params_str(c, 9, "r", 1, 900, &p), TM_OK);
  EXPECT_EQ(tm_arrived_ex_str(c, 9, "r", 1, 900, 5, 6, "l", one, 1), TM_OK);
  const std::vector<Value> events = CloseAndGetEvents(6);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].ToString(), "[1,7,70,700]");
  for (size_t i = 0; i < 6; i += 2) {
    EXPECT_EQ(events[i].ToString(), events[i + 1].ToString()) << i;
  }
}

// The largest ARRIVED of all (every 1.1 and 1.2 param at its longest: 2,168
// bytes) round after round through the smallest buffer, wrapping its end.
TEST_F(EventLayoutTest, LargestArrivedParamsRecordsWrapTheBuffer) {
  const LongestArrivedStrings x;
  // 20 members "kNN=" + 6 bytes, then one that fills 256 bytes.
  std::string tracestate;
  for (int i = 0; i < 20; ++i) {
    tracestate += "k" + std::to_string(10 + i) + "=vvvvvv,";
  }
  tracestate +=
      "z=" + std::string(TM_MAX_TRACESTATE_BYTES - 2 - tracestate.size(), 'w');
  ASSERT_EQ(tracestate.size(), TM_MAX_TRACESTATE_BYTES);
  ASSERT_TRUE(tm_proto_valid_tracestate(tracestate.data(), tracestate.size()));
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.max_tokens = 1;
  p.n = 1;
  p.lora = x.lora.c_str();
  p.labels = x.labels;
  p.n_labels = TM_MAX_REQUEST_LABELS;
  p.has_priority = 1;
  p.priority = TM_MIN_PRIORITY;
  p.traceparent = kTraceparent;
  p.tracestate = tracestate.c_str();
  // 14 records of 271 words fill most of the 4096-word ring.
  constexpr int kPerRound = 14;
  const std::vector<Value> events =
      ThroughSmallestBuffer(5, kPerRound, [&](int round, int i) {
        return tm_arrived_params_str(client_, 1 + i, x.rid.data(), x.rid.size(),
                                     uint32_t(round), &p);
      });
  ASSERT_EQ(events.size(), size_t{5 * kPerRound});
  for (size_t e = 0; e < events.size(); ++e) {
    x.Expect(events[e], e, e / kPerRound, 7);
    const Value& params = events[e].array[4];
    EXPECT_EQ(params.Find("priority")->sint, INT64_C(-2147483648)) << e;
    EXPECT_EQ(params.Find("traceparent")->str, kTraceparent) << e;
    EXPECT_EQ(params.Find("tracestate")->str, tracestate) << e;
  }
}

// SCHEDULED with its info, ADMISSION_REJECTED in its three forms,
// KV_TRANSFER and SLEEP, with integer and string ids, as decoded.
TEST_F(EventLayoutTest, SendsProtocol12Events) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  EXPECT_EQ(tm_scheduled_ex(c, 1000, 1, 512, 0), TM_OK);
  EXPECT_EQ(tm_scheduled_ex_str(c, 1001, "req-9", 5, 0, 4294967295u), TM_OK);
  EXPECT_EQ(tm_admission_rejected(c, 1002, "queue_full"), TM_OK);
  EXPECT_EQ(tm_admission_rejected_rid(c, 1003, "token cap", 77), TM_OK);
  EXPECT_EQ(tm_admission_rejected_str(c, 1004, "d\xc3\xa9lai", "req-9", 5),
            TM_OK);
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.start_ns = 900;
  EXPECT_EQ(tm_kv_transfer(c, 1005, 1, &kv), TM_OK);
  kv.role = TM_KV_RECV;
  kv.start_ns = 1006;  // start == t is fine
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES;
  kv.blocks = 0;
  kv.connector = "nixl";
  EXPECT_EQ(tm_kv_transfer_str(c, 1006, "req-9", 5, &kv), TM_OK);
  kv.ok = 0;
  kv.bytes = TM_KV_UNKNOWN;
  kv.reason = "timeout";
  kv.start_ns = 0;
  EXPECT_EQ(tm_kv_transfer(c, 1007, 2, &kv), TM_OK);
  kv.ok = 1;  // a reason with success is sent as given
  kv.connector = nullptr;
  EXPECT_EQ(tm_kv_transfer(c, 1008, 3, &kv), TM_OK);
  EXPECT_EQ(tm_sleep_state(c, 1009, TM_SCHEDULER_PAUSED, TM_WEIGHTS_OFFLOADED,
                           TM_KV_CACHE_RELEASED),
            TM_OK);
  EXPECT_EQ(tm_sleep_state(c, 1010, TM_SCHEDULER_KEEP, TM_WEIGHTS_DISCARDED,
                           TM_KV_CACHE_KEEP),
            TM_OK);
  EXPECT_EQ(tm_sleep_state(c, 1011, TM_SCHEDULER_RUNNING, TM_WEIGHTS_RESIDENT,
                           TM_KV_CACHE_RESIDENT),
            TM_OK);
  EXPECT_EQ(tm_sleep_state(c, 1012, TM_SCHEDULER_KEEP, TM_WEIGHTS_KEEP,
                           TM_KV_CACHE_KEEP),
            TM_OK);
  const tm_step_key keys[] = {TM_STEP_KEY_WAITING_DEFERRED,
                              TM_STEP_KEY_WAITING};
  const double values[] = {3, 3};
  EXPECT_EQ(tm_step(c, 1013, keys, values, 2, nullptr, 0), TM_OK);
  EXPECT_EQ(ToStrings(CloseAndGetEvents(14)),
            (std::vector<std::string>{
                R"([3,1000,1,{"cached_tokens":512,"external_tokens":0}])",
                R"([3,1001,"req-9",{"cached_tokens":0,)"
                R"("external_tokens":4294967295}])",
                R"([9,1002,"queue_full"])",
                R"([9,1003,"token cap",77])",
                R"([9,1004,"d\xc3\xa9lai","req-9"])",
                R"([10,1005,1,{"role":"send","start":900}])",
                R"([10,1006,"req-9",{"role":"recv","start":1006,)"
                R"("bytes":281474976710655,"blocks":0,"connector":"nixl"}])",
                R"([10,1007,2,{"role":"recv","start":0,"blocks":0,"ok":false,)"
                R"("reason":"timeout","connector":"nixl"}])",
                R"([10,1008,3,{"role":"recv","start":0,"blocks":0,)"
                R"("reason":"timeout"}])",
                R"([11,1009,{"scheduler":"paused","weights":"offloaded",)"
                R"("kv_cache":"released"}])",
                R"([11,1010,{"weights":"discarded"}])",
                R"([11,1011,{"scheduler":"running","weights":"resident",)"
                R"("kv_cache":"resident"}])",
                R"([11,1012,{}])",
                R"([7,1013,{"waiting":3,"waiting_deferred":3}])",
            }));
}

// The protocol 1.3 calls: every field of a summary, none, each id form;
// latencies with and without counts, empty lists, the largest event.
TEST_F(EventLayoutTest, SendsProtocol13Events) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  tm_request_summary_info s = TM_REQUEST_SUMMARY_INFO_INIT;
  s.reason = TM_FINISH_LENGTH;
  s.prompt_tokens = 812;
  s.generation_tokens = 256;
  s.cached_tokens = 812;  // all of it: fine
  s.max_tokens = 256;
  s.n = 2;
  s.max_generation_tokens = 300;
  s.ttft_ns = 41000000;
  s.queue_ns = 0;
  s.prefill_ns = 6;
  s.decode_ns = 7;
  s.inference_ns = 8;
  s.e2e_ns = TM_MAX_DURATION_NS;
  s.tpot_ns = 9;
  EXPECT_EQ(tm_request_summary_rid(c, 1000, 7, &s), TM_OK);
  tm_request_summary_info bare = TM_REQUEST_SUMMARY_INFO_INIT;
  EXPECT_EQ(tm_request_summary(c, 1001, &bare), TM_OK);
  bare.reason = TM_FINISH_ERROR;
  bare.prompt_tokens = TM_MAX_EVENT_COUNT;
  bare.generation_tokens = TM_MAX_EVENT_COUNT;
  bare.e2e_ns = 1;
  EXPECT_EQ(tm_request_summary_str(c, 1002, "req-9", 5, &bare), TM_OK);
  const uint64_t ttft[] = {41000000, 1};
  const uint64_t itl[] = {0, TM_MAX_DURATION_NS, 127};
  EXPECT_EQ(tm_latencies(c, 1003, ttft, 2, itl, 3, nullptr), TM_OK);
  tm_iteration_counts counts = TM_ITERATION_COUNTS_INIT;
  counts.generation_tokens = 3;
  EXPECT_EQ(tm_latencies(c, 1004, nullptr, 0, itl, 1, &counts), TM_OK);
  counts.prompt_tokens = 812;
  counts.preemptions = TM_MAX_EVENT_COUNT;
  EXPECT_EQ(tm_latencies(c, 1005, ttft, 1, nullptr, 0, &counts), TM_OK);
  const tm_iteration_counts none = TM_ITERATION_COUNTS_INIT;
  EXPECT_EQ(tm_latencies(c, 1006, nullptr, 0, nullptr, 0, &none), TM_OK);
  EXPECT_EQ(ToStrings(CloseAndGetEvents(7)),
            (std::vector<std::string>{
                R"([12,1000,"length",{"prompt_tokens":812,)"
                R"("generation_tokens":256,"cached_tokens":812,)"
                R"("max_tokens":256,"n":2,"max_generation_tokens":300,)"
                R"("ttft":41000000,"queue":0,"prefill":6,"decode":7,)"
                R"("inference":8,"e2e":281474976710655,"tpot":9},7])",
                R"([12,1001,"stop",{"prompt_tokens":0,)"
                R"("generation_tokens":0}])",
                R"([12,1002,"error",{"prompt_tokens":4294967295,)"
                R"("generation_tokens":4294967295,"e2e":1},"req-9"])",
                R"([13,1003,[41000000,1],[0,281474976710655,127]])",
                R"([13,1004,[],[0],{"generation_tokens":3}])",
                R"([13,1005,[41000000],[],{"prompt_tokens":812,)"
                R"("generation_tokens":3,"preemptions":4294967295}])",
                R"([13,1006,[],[]])",
            }));
}

// What the daemon would refuse, the library refuses: counted as rejected,
// nothing sent.
TEST_F(EventLayoutTest, RefusesWhatBreaksTheProtocol13Rules) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const auto summary = [](void (*change)(tm_request_summary_info*)) {
    tm_request_summary_info s = TM_REQUEST_SUMMARY_INFO_INIT;
    s.prompt_tokens = 10;
    change(&s);
    return s;
  };
  const tm_request_summary_info bad[] = {
      summary([](tm_request_summary_info* s) { s->size = 8; }),
      summary([](tm_request_summary_info* s) {
        s->reason = static_cast<tm_finish_reason>(4);
      }),
      summary([](tm_request_summary_info* s) {
        s->reason = static_cast<tm_finish_reason>(-1);
      }),
      summary(
          [](tm_request_summary_info* s) { s->prompt_tokens = 1ull << 32; }),
      summary([](tm_request_summary_info* s) {
        s->generation_tokens = 1ull << 32;
      }),
      summary([](tm_request_summary_info* s) { s->cached_tokens = 11; }),
      summary([](tm_request_summary_info* s) { s->n = 1ull << 32; }),
      summary([](tm_request_summary_info* s) { s->max_tokens = 1ull << 32; }),
      summary([](tm_request_summary_info* s) {
        s->max_generation_tokens = TM_NOT_GIVEN - 1;
      }),
      summary([](tm_request_summary_info* s) { s->ttft_ns = 1ull << 48; }),
      summary(
          [](tm_request_summary_info* s) { s->tpot_ns = TM_NOT_GIVEN - 1; }),
  };
  for (const tm_request_summary_info& s : bad) {
    EXPECT_EQ(tm_request_summary(c, 1, &s), TM_E_INVALID);
  }
  const tm_request_summary_info ok = summary([](tm_request_summary_info*) {});
  EXPECT_EQ(tm_request_summary(c, 1, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_request_summary_str(c, 1, "", 0, &ok), TM_E_INVALID);
  EXPECT_EQ(tm_request_summary_str(c, 1, nullptr, 3, &ok), TM_E_INVALID);
  const std::string long_id(TM_MAX_RID_BYTES + 1, 'x');
  EXPECT_EQ(tm_request_summary_str(c, 1, long_id.data(), long_id.size(), &ok),
            TM_E_INVALID);
  std::vector<uint64_t> values(TM_MAX_LATENCIES + 1, 5);
  const uint64_t too_long[] = {1ull << 48};
  EXPECT_EQ(tm_latencies(c, 1, too_long, 1, nullptr, 0, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_latencies(c, 1, nullptr, 0, too_long, 1, nullptr), TM_E_INVALID);
  EXPECT_EQ(
      tm_latencies(c, 1, values.data(), values.size(), nullptr, 0, nullptr),
      TM_E_INVALID);
  EXPECT_EQ(tm_latencies(c, 1, values.data(), 1000, values.data(), 25, nullptr),
            TM_E_INVALID);
  EXPECT_EQ(tm_latencies(c, 1, nullptr, 1, nullptr, 0, nullptr), TM_E_INVALID);
  EXPECT_EQ(tm_latencies(c, 1, nullptr, 0, nullptr, 2, nullptr), TM_E_INVALID);
  tm_iteration_counts counts = TM_ITERATION_COUNTS_INIT;
  counts.preemptions = 1ull << 32;
  EXPECT_EQ(tm_latencies(c, 1, nullptr, 0, nullptr, 0, &counts), TM_E_INVALID);
  counts = TM_ITERATION_COUNTS_INIT;
  counts.size = 8;
  EXPECT_EQ(tm_latencies(c, 1, nullptr, 0, nullptr, 0, &counts), TM_E_INVALID);
  const size_t refused = std::size(bad) + 4 + 8;
  // The largest event is accepted: 1024 values together, every count.
  counts = TM_ITERATION_COUNTS_INIT;
  counts.prompt_tokens = counts.generation_tokens = counts.preemptions = 1;
  EXPECT_EQ(tm_latencies(c, 2, values.data(), 1000, values.data(), 24, &counts),
            TM_OK);
  StatsArray stats{};
  EXPECT_EQ(CloseClient(&stats), TM_OK);
  EXPECT_TRUE(WaitForEof(0));
  EXPECT_EQ(stats[TM_STAT_EVENTS_REJECTED], refused);
  EXPECT_EQ(stats[TM_STAT_EVENTS_SENT], 1u);
  EXPECT_EQ(tm_request_summary(nullptr, 1, &ok), TM_E_INVALID);
  EXPECT_EQ(tm_latencies(nullptr, 1, nullptr, 0, nullptr, 0, nullptr),
            TM_E_INVALID);
}

// The largest LATENCIES (1,029 words) wrap the smallest buffer as any
// record does: none is dropped, each arrives whole.
TEST_F(EventLayoutTest, LargestLatenciesRecordsWrapTheBuffer) {
  std::vector<uint64_t> values(TM_MAX_LATENCIES);
  for (size_t i = 0; i < values.size(); ++i) values[i] = i;
  tm_iteration_counts counts = TM_ITERATION_COUNTS_INIT;
  counts.prompt_tokens = counts.generation_tokens = counts.preemptions = 3;
  const std::vector<Value> events =
      ThroughSmallestBuffer(4, 3, [&](int round, int i) {
        return tm_latencies(
            client_, uint64_t(10 + round * 3 + i), values.data(),
            size_t(round * 100 + i), values.data(),
            TM_MAX_LATENCIES - size_t(round * 100 + i), &counts);
      });
  ASSERT_EQ(events.size(), 12u);
  for (size_t e = 0; e < events.size(); ++e) {
    const std::vector<Value>& a = events[e].array;
    const size_t n_ttft = (e / 3) * 100 + e % 3;
    ASSERT_EQ(a.size(), 5u);
    EXPECT_EQ(a[1].uint, 10 + e);
    ASSERT_EQ(a[2].array.size(), n_ttft);
    ASSERT_EQ(a[3].array.size(), TM_MAX_LATENCIES - n_ttft);
    for (size_t i = 0; i < a[3].array.size(); ++i) {
      ASSERT_EQ(a[3].array[i].uint, i);
    }
  }
}

// A registered reason or connector (tm_register_value()) is sent as its
// string: the same events as with the strings, ids mixed with strings too.
TEST_F(EventLayoutTest, SendsRegisteredValuesAsTheirStrings) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const int queue_full = tm_register_value(c, "queue_full");
  const int nixl = tm_register_value(c, "nixl");
  const int timeout = tm_register_value(c, "d\xc3\xa9lai");
  ASSERT_EQ(queue_full, 1);
  ASSERT_EQ(nixl, 2);
  ASSERT_EQ(timeout, 3);
  EXPECT_EQ(tm_admission_rejected_id(c, 1002, queue_full), TM_OK);
  EXPECT_EQ(tm_admission_rejected_id_rid(c, 1003, timeout, 77), TM_OK);
  EXPECT_EQ(tm_admission_rejected_id_str(c, 1004, nixl, "req-9", 5), TM_OK);
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.start_ns = 900;
  kv.connector_id = uint32_t(nixl);
  EXPECT_EQ(tm_kv_transfer(c, 1005, 1, &kv), TM_OK);
  kv.role = TM_KV_RECV;
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES;
  kv.blocks = 0;
  kv.ok = 0;
  kv.reason_id = uint32_t(timeout);
  EXPECT_EQ(tm_kv_transfer_str(c, 1006, "req-9", 5, &kv), TM_OK);
  kv.bytes = TM_KV_UNKNOWN;  // blocks only
  kv.ok = 1;
  kv.reason_id = 0;
  kv.connector_id = 0;
  EXPECT_EQ(tm_kv_transfer(c, 1007, 2, &kv), TM_OK);
  kv.blocks = TM_KV_UNKNOWN;  // bytes only, a string reason, an id connector
  kv.bytes = 4096;
  kv.ok = 0;
  kv.reason = "timeout";
  kv.connector_id = uint32_t(nixl);
  EXPECT_EQ(tm_kv_transfer(c, 1008, 3, &kv), TM_OK);
  kv.reason = nullptr;  // an id reason, a string connector
  kv.reason_id = uint32_t(queue_full);
  kv.connector_id = 0;
  kv.connector = "mooncake";
  EXPECT_EQ(tm_kv_transfer(c, 1009, 4, &kv), TM_OK);
  EXPECT_EQ(ToStrings(CloseAndGetEvents(8)),
            (std::vector<std::string>{
                R"([9,1002,"queue_full"])",
                R"([9,1003,"d\xc3\xa9lai",77])",
                R"([9,1004,"nixl","req-9"])",
                R"([10,1005,1,{"role":"send","start":900,"connector":"nixl"}])",
                R"([10,1006,"req-9",{"role":"recv","start":900,)"
                R"("bytes":281474976710655,"blocks":0,"ok":false,)"
                R"("reason":"d\xc3\xa9lai","connector":"nixl"}])",
                R"([10,1007,2,{"role":"recv","start":900,"blocks":0}])",
                R"([10,1008,3,{"role":"recv","start":900,"bytes":4096,)"
                R"("ok":false,"reason":"timeout","connector":"nixl"}])",
                R"([10,1009,4,{"role":"recv","start":900,"bytes":4096,)"
                R"("ok":false,"reason":"queue_full","connector":"mooncake"}])",
            }));
}

// The KV_TRANSFER records (ring.h: the packed amounts word of the ids path,
// both amount words when bytes or blocks do not fit 32 bits, the strings
// path's given words) reach the daemon as the same bytes for every
// combination of amounts (not given, small, at and past the packed word's
// edge, the bound), ok, role, reason and connector (none, registered or a
// string; a connector string of 1, 4, 8, 9, 16, 17 and 33 bytes and one
// not ASCII, in turn: the lean path takes up to 16 bytes of printable
// ASCII) and request id (integer or string): each event byte for byte
// against an encoding written here with msgpack-c's packer, in the order
// tokenmeter.h documents.
TEST_F(EventLayoutTest, KvTransferRecordFormsSendTheSameBytes) {
  StartServer();
  // Thousands of events flushed at close: room for a sanitizer build on a
  // loaded machine (a timeout here is the close's, not the encoding's).
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 30'000), TM_OK);
  NewClient(opts.get());
  tm_client* c = client_;
  // The registered connector, and eight connector strings taken in turn
  // (a pair of calls each: an integer and a string request id).
  const char* const kRegistered = "nixl-connector-with-a-long-name-x";
  const int timeout = tm_register_value(c, "timeout");
  const int nixl = tm_register_value(c, kRegistered);
  ASSERT_EQ(timeout, 1);
  ASSERT_EQ(nixl, 2);
  const char* const kReason = "timeout";
  const char* const kConnectors[] = {"x",
                                     "nixl",
                                     "mooncake",
                                     "mooncake2",
                                     "NixlConnectorV16",
                                     "P2pNcclConnector1",
                                     "nixl-connector-with-a-long-name-x",
                                     "d\xc3\xa9lai"};
  // The packed word holds bytes + 1 in 40 bits and blocks + 1 in 24.
  constexpr uint64_t k24 = uint64_t{1} << 24;
  constexpr uint64_t k40 = uint64_t{1} << 40;
  const uint64_t amounts[] = {TM_KV_UNKNOWN,
                              0,
                              64,
                              k24 - 2,
                              k24 - 1,
                              k24,
                              k40 - 2,
                              k40 - 1,
                              k40,
                              k40 + 5,
                              TM_MAX_KV_TRANSFER_BYTES};
  std::vector<std::vector<uint8_t>> expected;
  uint64_t t = 1000;
  for (const uint64_t bytes : amounts) {
    for (const uint64_t blocks : amounts) {
      for (const int ok : {1, 0}) {
        for (const tm_kv_role role : {TM_KV_SEND, TM_KV_RECV}) {
          // Bit 0: a reason, bit 1: a connector; registered or as strings.
          for (int fields = 0; fields < 4; ++fields) {
            for (const bool strings : {false, true}) {
              if (strings && fields == 0) continue;  // the same call
              for (const bool str_rid : {false, true}) {
                ++t;
                const char* const connector = kConnectors[(t / 2) % 8];
                tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
                kv.role = role;
                kv.start_ns = t % 3 == 0 ? t : t - 999;
                kv.bytes = bytes;
                kv.blocks = blocks;
                kv.ok = ok;
                if ((fields & 1) != 0) {
                  if (strings) {
                    kv.reason = kReason;
                  } else {
                    kv.reason_id = uint32_t(timeout);
                  }
                }
                if ((fields & 2) != 0) {
                  if (strings) {
                    kv.connector = connector;
                  } else {
                    kv.connector_id = uint32_t(nixl);
                  }
                }
                const int rc = str_rid
                                   ? tm_kv_transfer_str(c, t, "req-12", 6, &kv)
                                   : tm_kv_transfer(c, t, t * 7, &kv);
                ASSERT_EQ(rc, TM_OK) << t;

                msgpack_sbuffer sb;
                msgpack_sbuffer_init(&sb);
                msgpack_packer pk;
                msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
                auto str = [&pk](const char* s) {
                  msgpack_pack_str_with_body(&pk, s, std::strlen(s));
                };
                msgpack_pack_array(&pk, 4);
                msgpack_pack_uint64(&pk, TM_EV_KV_TRANSFER);
                msgpack_pack_uint64(&pk, t);
                if (str_rid) {
                  str("req-12");
                } else {
                  msgpack_pack_uint64(&pk, t * 7);
                }
                msgpack_pack_map(&pk, 2 + (bytes != TM_KV_UNKNOWN) +
                                          (blocks != TM_KV_UNKNOWN) +
                                          (ok == 0) + ((fields & 1) != 0) +
                                          ((fields & 2) != 0));
                str("role");
                str(role == TM_KV_RECV ? "recv" : "send");
                str("start");
                msgpack_pack_uint64(&pk, kv.start_ns);
                if (bytes != TM_KV_UNKNOWN) {
                  str("bytes");
                  msgpack_pack_uint64(&pk, bytes);
                }
                if (blocks != TM_KV_UNKNOWN) {
                  str("blocks");
                  msgpack_pack_uint64(&pk, blocks);
                }
                if (ok == 0) {
                  str("ok");
                  msgpack_pack_false(&pk);
                }
                if ((fields & 1) != 0) {
                  str("reason");
                  str(kReason);
                }
                if ((fields & 2) != 0) {
                  str("connector");
                  str(strings ? connector : kRegistered);
                }
                expected.emplace_back(sb.data, sb.data + sb.size);
                msgpack_sbuffer_destroy(&sb);
              }
            }
          }
        }
      }
    }
  }
  StatsArray stats{};
  ASSERT_EQ(CloseClient(&stats), TM_OK);
  ASSERT_TRUE(WaitForEof(0));
  EXPECT_EQ(stats[TM_STAT_EVENTS_SENT], expected.size());
  EXPECT_EQ(stats[TM_STAT_EVENTS_REJECTED], 0u);
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  // Each BATCH is its header [1, seq, dropped, <array of n>] and then its
  // n events back to back: compare those bytes with the next n expected.
  size_t next = 0;
  for (const Frame* f : BatchesOf(conns[0])) {
    const size_t n = f->value.array[3].array.size();
    ASSERT_LE(next + n, expected.size());
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_uint64(&pk, f->value.array[1].uint);
    msgpack_pack_uint64(&pk, f->value.array[2].uint);
    msgpack_pack_array(&pk, uint32_t(n));
    const std::vector<uint8_t> header(sb.data, sb.data + sb.size);
    msgpack_sbuffer_destroy(&sb);
    ASSERT_GE(f->raw.size(), header.size());
    ASSERT_TRUE(std::equal(header.begin(), header.end(), f->raw.begin()))
        << Hex(f->raw);
    size_t at = header.size();
    for (size_t i = 0; i < n; ++i) {
      const std::vector<uint8_t>& want = expected[next + i];
      const size_t end = std::min(f->raw.size(), at + want.size());
      const std::vector<uint8_t> got(f->raw.begin() + at, f->raw.begin() + end);
      ASSERT_EQ(Hex(got), Hex(want)) << "event " << next + i << ": "
                                     << f->value.array[3].array[i].ToString();
      at = end;
    }
    EXPECT_EQ(at, f->raw.size());
    next += n;
  }
  EXPECT_EQ(next, expected.size());
}

// One thread registers values while another sends events naming the newest
// one, and the sender thread encodes them: each event carries the string of
// its id (the table's publication order; TSan checks it in the tsan build).
TEST_F(EventLayoutTest, RegistersWhileAnotherThreadSends) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  constexpr int kValues = 200;
  std::atomic<int> newest{0};
  std::thread registrar([c, &newest] {
    for (int i = 0; i < kValues; ++i) {
      const int id =
          tm_register_value(c, ("reason-" + std::to_string(i)).c_str());
      ASSERT_EQ(id, i + 1);
      newest.store(id, std::memory_order_release);
    }
  });
  uint64_t sent = 0;
  std::vector<int> ids;
  // At most 5,000 events (well within the buffer) while the values come.
  while (newest.load(std::memory_order_acquire) < kValues && sent < 5000) {
    const int id = newest.load(std::memory_order_acquire);
    if (id == 0) continue;
    ASSERT_EQ(tm_admission_rejected_id_rid(c, 10, uint32_t(id), sent), TM_OK);
    ids.push_back(id);
    ++sent;
  }
  registrar.join();
  ASSERT_EQ(tm_admission_rejected_id_rid(c, 10, kValues, sent), TM_OK);
  ids.push_back(kValues);
  ++sent;
  const std::vector<Value> events = CloseAndGetEvents(sent);
  ASSERT_EQ(events.size(), ids.size());
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].array.size(), 4u);
    EXPECT_EQ(events[i].array[2].str, "reason-" + std::to_string(ids[i] - 1));
    EXPECT_EQ(events[i].array[3].uint, i);
  }
}

// Reasons and connectors of every length 1 .. 64, printable ASCII and
// UTF-8 (which take the rule's path), arrive byte for byte: the library
// packs them into words itself.
TEST_F(EventLayoutTest, SendsLabelValuesOfEveryLength) {
  StartServer();
  NewClient();
  std::vector<std::string> values;
  for (size_t len = 1; len <= TM_MAX_LABEL_VALUE_BYTES; ++len) {
    std::string ascii;
    for (size_t i = 0; i < len; ++i) ascii += char('!' + (i * 7 + len) % 94);
    values.push_back(ascii);
    if (len >= 2) {  // "é" (2 bytes) at the end, then at the start
      values.push_back(ascii.substr(0, len - 2) + "\xc3\xa9");
      values.push_back("\xc3\xa9" + ascii.substr(0, len - 2));
    }
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& v = values[i];
    const std::string& other = values[values.size() - 1 - i];
    ASSERT_EQ(tm_admission_rejected_rid(client_, 10, v.c_str(), i), TM_OK) << v;
    tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
    kv.start_ns = 1;
    kv.reason = v.c_str();
    kv.connector = other.c_str();
    ASSERT_EQ(tm_kv_transfer(client_, 10, i, &kv), TM_OK) << v;
    kv.reason = nullptr;
    kv.connector = v.c_str();
    ASSERT_EQ(tm_kv_transfer_str(client_, 10, "r", 1, &kv), TM_OK) << v;
  }
  const std::vector<Value> events = CloseAndGetEvents(3 * values.size());
  ASSERT_EQ(events.size(), 3 * values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const Value& adm = events[3 * i];
    EXPECT_EQ(adm.array[2].str, values[i]) << i;
    EXPECT_EQ(adm.array[3].uint, i) << i;
    const Value& kv = events[3 * i + 1].array[3];
    EXPECT_EQ(kv.Find("reason")->str, values[i]) << i;
    EXPECT_EQ(kv.Find("connector")->str, values[values.size() - 1 - i]) << i;
    const Value& kv2 = events[3 * i + 2].array[3];
    EXPECT_EQ(kv2.Find("reason"), nullptr) << i;
    EXPECT_EQ(kv2.Find("connector")->str, values[i]) << i;
  }
}

// The largest KV_TRANSFER (a 128-byte id, bytes, blocks, a 64-byte reason
// and connector: 296 bytes) and ADMISSION_REJECTED through the smallest
// buffer, round after round.
TEST_F(EventLayoutTest, LargestProtocol12RecordsWrapTheBuffer) {
  const std::string rid(TM_MAX_RID_BYTES, 'r');
  const std::string reason(TM_MAX_LABEL_VALUE_BYTES, 'e');
  const std::string connector(TM_MAX_LABEL_VALUE_BYTES, 'c');
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.bytes = 1;
  kv.blocks = 2;
  kv.ok = 0;
  kv.reason = reason.c_str();
  kv.connector = connector.c_str();
  // Each call a KV_TRANSFER (37 words) then an ADMISSION_REJECTED (26):
  // 60 a round fill most of the ring.
  constexpr int kPerRound = 60;
  const std::vector<Value> events =
      ThroughSmallestBuffer(4, kPerRound, [&](int round, int) {
        kv.start_ns = uint64_t(round);
        const int rc =
            tm_kv_transfer_str(client_, 100, rid.data(), rid.size(), &kv);
        if (rc != TM_OK) return rc;
        return tm_admission_rejected_str(client_, 100, reason.c_str(),
                                         rid.data(), rid.size());
      });
  ASSERT_EQ(events.size(), size_t{2 * 4 * kPerRound});
  for (size_t e = 0; e < events.size(); e += 2) {
    const Value& info = events[e].array[3];
    EXPECT_EQ(events[e].array[2].str, rid) << e;
    EXPECT_EQ(info.Find("start")->uint, e / (2 * kPerRound)) << e;
    EXPECT_EQ(info.Find("reason")->str, reason) << e;
    EXPECT_EQ(info.Find("connector")->str, connector) << e;
    EXPECT_EQ(events[e + 1].array[2].str, reason) << e;
    EXPECT_EQ(events[e + 1].array[3].str, rid) << e;
  }
}

// t_ns = 0 means "now" on CLOCK_MONOTONIC, for every event function.
TEST_F(ClockTest, StampsZeroTimeWithMonotonicNow) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const tm_step_key key = TM_STEP_KEY_RUNNING;
  const double value = 1;
  const uint64_t before = MonotonicNs();
  const uint64_t now_before = tm_now_ns();
  EXPECT_EQ(tm_arrived(c, 0, 1, 1, 0, 0), TM_OK);
  EXPECT_EQ(tm_arrived_str(c, 0, "a", 1, 1, 0, 0), TM_OK);
  EXPECT_EQ(tm_queued(c, 0, 1), TM_OK);
  EXPECT_EQ(tm_queued_str(c, 0, "a", 1), TM_OK);
  EXPECT_EQ(tm_scheduled(c, 0, 1), TM_OK);
  EXPECT_EQ(tm_scheduled_str(c, 0, "a", 1), TM_OK);
  EXPECT_EQ(tm_tokens(c, 0, 1, 1), TM_OK);
  EXPECT_EQ(tm_tokens_str(c, 0, "a", 1, 1), TM_OK);
  EXPECT_EQ(tm_preempted(c, 0, 1), TM_OK);
  EXPECT_EQ(tm_preempted_str(c, 0, "a", 1), TM_OK);
  EXPECT_EQ(tm_finished(c, 0, 1, TM_FINISH_STOP), TM_OK);
  EXPECT_EQ(tm_finished_str(c, 0, "a", 1, TM_FINISH_STOP), TM_OK);
  EXPECT_EQ(tm_step(c, 0, &key, &value, 1, nullptr, 0), TM_OK);
  const uint64_t counts[] = {1, 2};
  EXPECT_EQ(tm_expert_load(c, 0, 0, counts, 2), TM_OK);
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.has_priority = 1;
  EXPECT_EQ(tm_arrived_params(c, 0, 1, 1, &p), TM_OK);
  EXPECT_EQ(tm_arrived_params_str(c, 0, "a", 1, 1, &p), TM_OK);
  EXPECT_EQ(tm_scheduled_ex(c, 0, 1, 1, 0), TM_OK);
  EXPECT_EQ(tm_scheduled_ex_str(c, 0, "a", 1, 1, 0), TM_OK);
  EXPECT_EQ(tm_admission_rejected(c, 0, "full"), TM_OK);
  EXPECT_EQ(tm_admission_rejected_rid(c, 0, "full", 1), TM_OK);
  EXPECT_EQ(tm_admission_rejected_str(c, 0, "full", "a", 1), TM_OK);
  // With t_ns 0 the start is checked against the clock read for the event.
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.start_ns = tm_now_ns();
  EXPECT_EQ(tm_kv_transfer(c, 0, 1, &kv), TM_OK);
  EXPECT_EQ(tm_kv_transfer_str(c, 0, "a", 1, &kv), TM_OK);
  EXPECT_EQ(tm_sleep_state(c, 0, TM_SCHEDULER_PAUSED, TM_WEIGHTS_KEEP,
                           TM_KV_CACHE_KEEP),
            TM_OK);
  const uint64_t now_after = tm_now_ns();
  const uint64_t after = MonotonicNs();
  EXPECT_LE(before, now_before);
  EXPECT_LE(now_before, now_after);
  EXPECT_LE(now_after, after);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));

  const std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 24u);
  uint64_t previous = before;
  for (const Value& ev : events) {
    ASSERT_TRUE(IsValidEvent(ev));
    const uint64_t t = ev.array[1].uint;
    EXPECT_GE(t, previous) << ev.ToString();
    EXPECT_LE(t, after) << ev.ToString();
    previous = t;
  }
}

// The packed ARRIVED entries are tm_arrived(_str) stamped now with n = 0:
// the low 32 bits are prompt_tokens, the high 32 bits max_tokens.
TEST_F(ClockTest, PackedArrivedEqualsArrivedStampedNow) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  const uint64_t before = MonotonicNs();
  EXPECT_EQ(tm_arrived_packed(c, 5, 512), TM_OK);
  EXPECT_EQ(tm_arrived_packed(c, 6, 512 | uint64_t(256) << 32), TM_OK);
  EXPECT_EQ(tm_arrived_packed(c, UINT64_MAX, UINT64_MAX), TM_OK);
  EXPECT_EQ(tm_arrived_packed_str(c, "req-9xyz", 5, 40 | uint64_t(64) << 32),
            TM_OK);
  EXPECT_EQ(tm_arrived_packed_str(c, "r", 1, 0), TM_OK);
  const uint64_t after = MonotonicNs();
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));

  std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 5u);
  uint64_t previous = before;
  for (Value& ev : events) {
    ASSERT_TRUE(IsValidEvent(ev));
    const uint64_t t = ev.array[1].uint;
    EXPECT_GE(t, previous) << ev.ToString();
    EXPECT_LE(t, after) << ev.ToString();
    previous = t;
    ev.array[1].uint = 0;  // compared below without the time
  }
  EXPECT_EQ(ToStrings(events), (std::vector<std::string>{
                                   R"([1,0,5,512])",
                                   R"([1,0,6,512,{"max_tokens":256}])",
                                   R"([1,0,18446744073709551615,4294967295,)"
                                   R"({"max_tokens":4294967295}])",
                                   R"([1,0,"req-9",40,{"max_tokens":64}])",
                                   R"([1,0,"r",0])",
                               }));
}

// GOODBYE comes once, last, after every event, and then the client closes;
// the stats account for exactly the bytes and batches the server read.
TEST_F(GoodbyeTest, ArrivesLastAfterAllEvents) {
  StartServer();
  NewClient();
  constexpr uint32_t kEvents = 300;
  for (uint32_t i = 0; i < kEvents; ++i) {
    ASSERT_EQ(tm_tokens(client_, 1 + i, i, 1 + i), TM_OK);
  }
  StatsArray stats{};
  ASSERT_EQ(CloseClient(&stats), TM_OK);
  ASSERT_TRUE(WaitForEof(0));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  const Connection& conn = conns[0];
  ASSERT_TRUE(IsWellFormed(conn));
  ASSERT_GE(conn.frames.size(), 3u);
  EXPECT_EQ(conn.frames.back().raw, (std::vector<uint8_t>{0x91, 0x02}));
  EXPECT_EQ(conn.frames.back().value.ToString(), "[2]");
  EXPECT_EQ(conn.decoded_bytes, conn.bytes.size());
  const std::vector<Value> events = EventsOf(conn);
  ASSERT_EQ(events.size(), kEvents);
  for (uint32_t i = 0; i < kEvents; ++i) {
    EXPECT_EQ(events[i].array[3].uint, 1 + i);
  }
  EXPECT_EQ(stats[TM_STAT_EVENTS_SENT], kEvents);
  EXPECT_EQ(stats[TM_STAT_BATCHES_SENT], BatchesOf(conn).size());
  EXPECT_EQ(stats[TM_STAT_BYTES_SENT], conn.bytes.size());
  EXPECT_EQ(stats[TM_STAT_EVENTS_DROPPED], 0u);
  EXPECT_EQ(stats[TM_STAT_EVENTS_REJECTED], 0u);
  EXPECT_EQ(stats[TM_STAT_RECONNECTS], 0u);
  EXPECT_EQ(stats[TM_STAT_CONNECTED], 0u);
  EXPECT_EQ(stats[TM_STAT_CONNECT_FAILURES], 0u);
}

// ---- byte-exact encodings ---------------------------------------------------

struct BytesCase {
  const char* name;
  std::function<int(tm_client*)> emit;
  std::vector<uint8_t> event;  // the event's bytes, written by hand
};

std::vector<uint8_t> Concat(std::vector<uint8_t> a,
                            const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
std::vector<uint8_t> Repeat(uint8_t byte, size_t n) {
  return std::vector<uint8_t>(n, byte);
}

// The bytes of `s` (no header), for the strings of the hand-written cases.
std::vector<uint8_t> B(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::vector<uint8_t> Cat(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& part : parts)
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

// Events that two calls must encode alike (tm_arrived_params without the
// 1.2 params and tm_arrived_ex / tm_arrived).
// [1, 0xffffffff (uint32), 200 (uint8), 65536 (uint32), {"n": 2}]
const std::vector<uint8_t> kArrivedOneParam = {
    0x95, 0x01, 0xce, 0xff, 0xff, 0xff, 0xff, 0xcc, 0xc8,
    0xce, 0x00, 0x01, 0x00, 0x00, 0x81, 0xa1, 'n',  0x02};
// [1, 2, 3, 4, {"lora": "ab", "labels": {"t": "", "u": "v"}}]
const std::vector<uint8_t> kArrivedLoraAndLabels = {
    0x95, 0x01, 0x02, 0x03, 0x04, 0x82, 0xa4, 'l',  'o', 'r',
    'a',  0xa2, 'a',  'b',  0xa6, 'l',  'a',  'b',  'e', 'l',
    's',  0x82, 0xa1, 't',  0xa0, 0xa1, 'u',  0xa1, 'v'};
// [1, 1, "r", 0]
const std::vector<uint8_t> kArrivedStringIdNoParams = {0x94, 0x01, 0x01,
                                                       0xa1, 'r',  0x00};
const std::string kTraceparentText =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// [1, 1, 2, 3, {"priority": <priority>}] from tm_arrived_params().
int ArrivedWithPriority(tm_client* c, int32_t priority) {
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.has_priority = 1;
  p.priority = priority;
  return tm_arrived_params(c, 1, 2, 3, &p);
}
std::vector<uint8_t> ArrivedPriorityBytes(std::vector<uint8_t> priority) {
  return Cat(
      {{0x95, 0x01, 0x01, 0x02, 0x03, 0x81, 0xa8}, B("priority"), priority});
}

const std::string kRid31(31, 'x');
const std::string kRid32(32, 'y');
const std::string kRid128(128, 'z');

const BytesCase kBytesCases[] = {
    // [4, 0x0102030405060708 (uint64), 7, 3]
    {"TokensIntId",
     [](tm_client* c) { return tm_tokens(c, 0x0102030405060708u, 7, 3); },
     {0x94, 0x04, 0xcf, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x07,
      0x03}},
    // [5, 1000 (uint16), "abc", "length"]
    {"FinishedStringId",
     [](tm_client* c) {
       return tm_finished_str(c, 1000, "abc", 3, TM_FINISH_LENGTH);
     },
     {0x94, 0x05, 0xcd, 0x03, 0xe8, 0xa3, 'a', 'b', 'c', 0xa6, 'l', 'e', 'n',
      'g', 't', 'h'}},
    // [5, 1, 0, "stop"]
    {"FinishedIntId",
     [](tm_client* c) { return tm_finished(c, 1, 0, TM_FINISH_STOP); },
     {0x94, 0x05, 0x01, 0x00, 0xa4, 's', 't', 'o', 'p'}},
    {"ArrivedWithOneParam",
     [](tm_client* c) { return tm_arrived(c, 0xffffffffu, 200, 65536, 0, 2); },
     kArrivedOneParam},
    {"ArrivedExLoraAndLabels",
     [](tm_client* c) {
       const tm_label labels[] = {{"t", ""}, {"u", "v"}};
       return tm_arrived_ex(c, 2, 3, 4, 0, 0, "ab", labels, 2);
     },
     kArrivedLoraAndLabels},
    // [1, 1, "r", 0, {"n": 1, "lora": 32 x "y" (str8)}]
    {"ArrivedExStr8Lora",
     [](tm_client* c) {
       return tm_arrived_ex_str(c, 1, "r", 1, 0, 0, 1, kRid32.c_str(), nullptr,
                                0);
     },
     Concat({0x95, 0x01, 0x01, 0xa1, 'r', 0x00, 0x82, 0xa1, 'n', 0x01, 0xa4,
             'l', 'o', 'r', 'a', 0xd9, 0x20},
            Repeat('y', 32))},
    // tm_arrived_ex_str without the 1.1 params
    {"ArrivedExStringIdNoParams",
     [](tm_client* c) {
       return tm_arrived_ex_str(c, 1, "r", 1, 0, 0, 0, nullptr, nullptr, 0);
     },
     kArrivedStringIdNoParams},
    {"ArrivedStringIdNoParams",
     [](tm_client* c) { return tm_arrived_str(c, 1, "r", 1, 0, 0, 0); },
     kArrivedStringIdNoParams},
    // ---- protocol 1.2 ----
    // tm_arrived_params without the 1.2 params: tm_arrived(_ex)'s bytes.
    {"ArrivedParamsStringIdNoParams",
     [](tm_client* c) {
       const tm_request_params p = TM_REQUEST_PARAMS_INIT;
       return tm_arrived_params_str(c, 1, "r", 1, 0, &p);
     },
     kArrivedStringIdNoParams},
    {"ArrivedParamsOneParam",
     [](tm_client* c) {
       tm_request_params p = TM_REQUEST_PARAMS_INIT;
       p.n = 2;
       return tm_arrived_params(c, 0xffffffffu, 200, 65536, &p);
     },
     kArrivedOneParam},
    {"ArrivedParamsLoraAndLabels",
     [](tm_client* c) {
       const tm_label labels[] = {{"t", ""}, {"u", "v"}};
       tm_request_params p = TM_REQUEST_PARAMS_INIT;
       p.lora = "ab";
       p.labels = labels;
       p.n_labels = 2;
       return tm_arrived_params(c, 2, 3, 4, &p);
     },
     kArrivedLoraAndLabels},
    // priority: a msgpack int in its smallest encoding
    {"ArrivedParamsPriorityNegativeFixint",
     [](tm_client* c) { return ArrivedWithPriority(c, -7); },
     ArrivedPriorityBytes({0xf9})},
    {"ArrivedParamsPriorityZero",
     [](tm_client* c) { return ArrivedWithPriority(c, 0); },
     ArrivedPriorityBytes({0x00})},
    {"ArrivedParamsPriorityInt8",
     [](tm_client* c) { return ArrivedWithPriority(c, -33); },
     ArrivedPriorityBytes({0xd0, 0xdf})},
    {"ArrivedParamsPriorityInt16",
     [](tm_client* c) { return ArrivedWithPriority(c, -129); },
     ArrivedPriorityBytes({0xd1, 0xff, 0x7f})},
    {"ArrivedParamsPriorityUint8",
     [](tm_client* c) { return ArrivedWithPriority(c, 200); },
     ArrivedPriorityBytes({0xcc, 0xc8})},
    {"ArrivedParamsPriorityMin",
     [](tm_client* c) { return ArrivedWithPriority(c, TM_MIN_PRIORITY); },
     ArrivedPriorityBytes({0xd2, 0x80, 0x00, 0x00, 0x00})},
    {"ArrivedParamsPriorityMax",
     [](tm_client* c) { return ArrivedWithPriority(c, TM_MAX_PRIORITY); },
     ArrivedPriorityBytes({0xce, 0x7f, 0xff, 0xff, 0xff})},
    // [1, 1, "r", 0, {"traceparent": 55 bytes (str8), "tracestate": "a=1"}]
    {"ArrivedParamsTraceContext",
     [](tm_client* c) {
       tm_request_params p = TM_REQUEST_PARAMS_INIT;
       p.traceparent = kTraceparentText.c_str();
       p.tracestate = "a=1";
       return tm_arrived_params_str(c, 1, "r", 1, 0, &p);
     },
     Cat({{0x95, 0x01, 0x01, 0xa1, 'r', 0x00, 0x82, 0xab},
          B("traceparent"),
          {0xd9, 0x37},
          B(kTraceparentText),
          {0xaa},
          B("tracestate"),
          {0xa3, 'a', '=', '1'}})},
    // [3, 1, 2, {"cached_tokens": 0, "external_tokens": 2^32 - 1}]
    {"ScheduledExIntId",
     [](tm_client* c) { return tm_scheduled_ex(c, 1, 2, 0, 4294967295u); },
     Cat({{0x94, 0x03, 0x01, 0x02, 0x82, 0xad},
          B("cached_tokens"),
          {0x00, 0xaf},
          B("external_tokens"),
          {0xce, 0xff, 0xff, 0xff, 0xff}})},
    // [3, 1, "ab", {"cached_tokens": 300, "external_tokens": 5}]
    {"ScheduledExStringId",
     [](tm_client* c) { return tm_scheduled_ex_str(c, 1, "ab", 2, 300, 5); },
     Cat({{0x94, 0x03, 0x01, 0xa2, 'a', 'b', 0x82, 0xad},
          B("cached_tokens"),
          {0xcd, 0x01, 0x2c, 0xaf},
          B("external_tokens"),
          {0x05}})},
    // [9, 5, "queue_full"]
    {"AdmissionRejectedNoId",
     [](tm_client* c) { return tm_admission_rejected(c, 5, "queue_full"); },
     Cat({{0x93, 0x09, 0x05, 0xaa}, B("queue_full")})},
    // [9, 5, "x", 300 (uint16)]
    {"AdmissionRejectedIntId",
     [](tm_client* c) { return tm_admission_rejected_rid(c, 5, "x", 300); },
     {0x94, 0x09, 0x05, 0xa1, 'x', 0xcd, 0x01, 0x2c}},
    // [9, 5, "x", "req-1"]
    {"AdmissionRejectedStringId",
     [](tm_client* c) {
       return tm_admission_rejected_str(c, 5, "x", "req-1xyz", 5);
     },
     Cat({{0x94, 0x09, 0x05, 0xa1, 'x', 0xa5}, B("req-1")})},
    // [9, 5, 64 x "e" (str8)]: the longest reason
    {"AdmissionRejectedLongestReason",
     [](tm_client* c) {
       return tm_admission_rejected(c, 5, std::string(64, 'e').c_str());
     },
     Concat({0x93, 0x09, 0x05, 0xd9, 0x40}, Repeat('e', 64))},
    // [10, 2, 7, {"role": "send", "start": 1}]
    {"KvTransferRequiredKeysOnly",
     [](tm_client* c) {
       tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
       kv.start_ns = 1;
       return tm_kv_transfer(c, 2, 7, &kv);
     },
     Cat({{0x94, 0x0a, 0x02, 0x07, 0x82, 0xa4},
          B("role"),
          {0xa4},
          B("send"),
          {0xa5},
          B("start"),
          {0x01}})},
    // [10, 65536 (uint32), "r", {"role": "recv", "start": 65535 (uint16),
    //  "bytes": 2^48 - 1 (uint64), "blocks": 1000 (uint16), "ok": false,
    //  "reason": "timeout", "connector": "nixl"}]
    {"KvTransferEveryKey",
     [](tm_client* c) {
       tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
       kv.role = TM_KV_RECV;
       kv.start_ns = 65535;
       kv.bytes = TM_MAX_KV_TRANSFER_BYTES;
       kv.blocks = 1000;
       kv.ok = 0;
       kv.reason = "timeout";
       kv.connector = "nixl";
       return tm_kv_transfer_str(c, 65536, "r", 1, &kv);
     },
     Cat({{0x94, 0x0a, 0xce, 0x00, 0x01, 0x00, 0x00, 0xa1, 'r', 0x87, 0xa4},
          B("role"),
          {0xa4},
          B("recv"),
          {0xa5},
          B("start"),
          {0xcd, 0xff, 0xff, 0xa5},
          B("bytes"),
          {0xcf, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xa6},
          B("blocks"),
          {0xcd, 0x03, 0xe8, 0xa2, 'o', 'k', 0xc2, 0xa6},
          B("reason"),
          {0xa7},
          B("timeout"),
          {0xa9},
          B("connector"),
          {0xa4},
          B("nixl")})},
    // [11, 5, {}]
    {"SleepNothingChanged",
     [](tm_client* c) {
       return tm_sleep_state(c, 5, TM_SCHEDULER_KEEP, TM_WEIGHTS_KEEP,
                             TM_KV_CACHE_KEEP);
     },
     {0x93, 0x0b, 0x05, 0x80}},
    // [11, 5, {"scheduler": "paused", "weights": "discarded",
    //  "kv_cache": "released"}]
    {"SleepEveryPart",
     [](tm_client* c) {
       return tm_sleep_state(c, 5, TM_SCHEDULER_PAUSED, TM_WEIGHTS_DISCARDED,
                             TM_KV_CACHE_RELEASED);
     },
     Cat({{0x93, 0x0b, 0x05, 0x83, 0xa9},
          B("scheduler"),
          {0xa6},
          B("paused"),
          {0xa7},
          B("weights"),
          {0xa9},
          B("discarded"),
          {0xa8},
          B("kv_cache"),
          {0xa8},
          B("released")})},
    // [7, 5, {"waiting": 3, "waiting_deferred": 2}]
    {"StepWaitingDeferred",
     [](tm_client* c) {
       const tm_step_key k[] = {TM_STEP_KEY_WAITING_DEFERRED,
                                TM_STEP_KEY_WAITING};
       const double v[] = {2, 3};
       return tm_step(c, 5, k, v, 2, nullptr, 0);
     },
     Cat({{0x93, 0x07, 0x05, 0x82, 0xa7},
          B("waiting"),
          {0x03, 0xb0},
          B("waiting_deferred"),
          {0x02}})},
    // [2, 127 (fixint), 128 (uint8)]
    {"QueuedFixintAndUint8",
     [](tm_client* c) { return tm_queued(c, 127, 128); },
     {0x93, 0x02, 0x7f, 0xcc, 0x80}},
    // [3, 255 (uint8), 256 (uint16)]
    {"ScheduledUint8AndUint16",
     [](tm_client* c) { return tm_scheduled(c, 255, 256); },
     {0x93, 0x03, 0xcc, 0xff, 0xcd, 0x01, 0x00}},
    // [6, 65535 (uint16), 65536 (uint32)]
    {"PreemptedUint16AndUint32",
     [](tm_client* c) { return tm_preempted(c, 65535, 65536); },
     {0x93, 0x06, 0xcd, 0xff, 0xff, 0xce, 0x00, 0x01, 0x00, 0x00}},
    // [6, 2^32 (uint64), 2^64 - 1 (uint64)]
    {"PreemptedUint64",
     [](tm_client* c) { return tm_preempted(c, 1ull << 32, UINT64_MAX); },
     {0x93, 0x06, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
      0x00, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
    // [4, 1, "ab", 100000 (uint32)]
    {"TokensStringIdUint32Count",
     [](tm_client* c) { return tm_tokens_str(c, 1, "ab", 2, 100000); },
     {0x94, 0x04, 0x01, 0xa2, 'a', 'b', 0xce, 0x00, 0x01, 0x86, 0xa0}},
    // [2, 1, 31 x "x"]: the longest fixstr
    {"QueuedFixstrId",
     [](tm_client* c) { return tm_queued_str(c, 1, kRid31.data(), 31); },
     Concat({0x93, 0x02, 0x01, 0xbf}, Repeat('x', 31))},
    // [2, 1, 32 x "y"]: the shortest str8
    {"QueuedStr8Id",
     [](tm_client* c) { return tm_queued_str(c, 1, kRid32.data(), 32); },
     Concat({0x93, 0x02, 0x01, 0xd9, 0x20}, Repeat('y', 32))},
    // [3, 1, 128 x "z"]: the longest id allowed
    {"ScheduledLongestId",
     [](tm_client* c) { return tm_scheduled_str(c, 1, kRid128.data(), 128); },
     Concat({0x93, 0x03, 0x01, 0xd9, 0x80}, Repeat('z', 128))},
    // [7, 5, {"running": 3}]
    {"StepOneKey",
     [](tm_client* c) {
       const tm_step_key k = TM_STEP_KEY_RUNNING;
       const double v = 3;
       return tm_step(c, 5, &k, &v, 1, nullptr, 0);
     },
     {0x93, 0x07, 0x05, 0x81, 0xa7, 'r', 'u', 'n', 'n', 'i', 'n', 'g', 0x03}},
    // [7, 5, {"spec_accepted_per_pos": [1, 0, 200]}]
    {"StepPositionsOnly",
     [](tm_client* c) {
       const uint64_t pos[] = {1, 0, 200};
       return tm_step(c, 5, nullptr, nullptr, 0, pos, 3);
     },
     Concat(Concat({0x93, 0x07, 0x05, 0x81, 0xb5},
                   std::vector<uint8_t>({'s', 'p', 'e', 'c', '_', 'a', 'c',
                                         'c', 'e', 'p', 't', 'e', 'd', '_',
                                         'p', 'e', 'r', '_', 'p', 'o', 's'})),
            {0x93, 0x01, 0x00, 0xcc, 0xc8})},
    // [7, 5, {"kv_usage": 0.5 (float64)}]
    {"StepKvUsage",
     [](tm_client* c) {
       const tm_step_key k = TM_STEP_KEY_KV_USAGE;
       const double v = 0.5;
       return tm_step(c, 5, &k, &v, 1, nullptr, 0);
     },
     {0x93, 0x07, 0x05, 0x81, 0xa8, 'k',  'v',  '_',  'u',  's',  'a',
      'g',  'e',  0xcb, 0x3f, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}},
    // [12, 5, "stop", {"prompt_tokens": 812, "generation_tokens": 256,
    //  "ttft": 41000000, "e2e": 2^48 - 1}, 7] (1.3)
    {"RequestSummaryWorked",
     [](tm_client* c) {
       tm_request_summary_info s = TM_REQUEST_SUMMARY_INFO_INIT;
       s.prompt_tokens = 812;
       s.generation_tokens = 256;
       s.ttft_ns = 41000000;
       s.e2e_ns = TM_MAX_DURATION_NS;
       return tm_request_summary_rid(c, 5, 7, &s);
     },
     Cat({{0x95, 0x0c, 0x05, 0xa4},
          B("stop"),
          {0x84, 0xad},
          B("prompt_tokens"),
          {0xcd, 0x03, 0x2c, 0xb1},
          B("generation_tokens"),
          {0xcd, 0x01, 0x00, 0xa4},
          B("ttft"),
          {0xce, 0x02, 0x71, 0x9c, 0x40, 0xa3},
          B("e2e"),
          {0xcf, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x07}})},
    // [13, 5, [41000000], [8000000, 0], {"generation_tokens": 2}] (1.3)
    {"LatenciesWorked",
     [](tm_client* c) {
       const uint64_t ttft[] = {41000000};
       const uint64_t itl[] = {8000000, 0};
       tm_iteration_counts n = TM_ITERATION_COUNTS_INIT;
       n.generation_tokens = 2;
       return tm_latencies(c, 5, ttft, 1, itl, 2, &n);
     },
     Cat({{0x95, 0x0d, 0x05, 0x91, 0xce, 0x02, 0x71, 0x9c, 0x40, 0x92, 0xce,
           0x00, 0x7a, 0x12, 0x00, 0x00, 0x81, 0xb1},
          B("generation_tokens"),
          {0x02}})},
    // [8, 5, 0, [7]]: EXPERT_LOAD with one expert
    {"ExpertLoadOneExpert",
     [](tm_client* c) {
       const uint64_t counts[] = {7};
       return tm_expert_load(c, 5, 0, counts, 1);
     },
     {0x94, 0x08, 0x05, 0x00, 0x91, 0x07}},
    // [8, 1, 4095 (uint16), [0, 127, 128 (uint8), 255, 256 (uint16), 65535,
    //  65536 (uint32), 2^32 - 1]]: every count in its smallest encoding
    {"ExpertLoadSmallestEncodings",
     [](tm_client* c) {
       const uint64_t counts[] = {0,     127,   128,        255,
                                  256,   65535, 65536,      TM_MAX_EVENT_COUNT};
       return tm_expert_load(c, 1, TM_MAX_MOE_LAYERS - 1, counts, 8);
     },
     {0x94, 0x08, 0x01, 0xcd, 0x0f, 0xff, 0x98, 0x00, 0x7f, 0xcc,
      0x80, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xcd, 0xff, 0xff, 0xce,
      0x00, 0x01, 0x00, 0x00, 0xce, 0xff, 0xff, 0xff, 0xff}},
    // [8, 1, 1, 16 x [0]]: 16 experts take an array16 header
    {"ExpertLoadArray16",
     [](tm_client* c) {
       const uint64_t counts[16] = {};
       return tm_expert_load(c, 1, 1, counts, 16);
     },
     Concat({0x94, 0x08, 0x01, 0x01, 0xdc, 0x00, 0x10}, Repeat(0x00, 16))},
};

class EventBytesTest : public ClientFixture,
                       public ::testing::WithParamInterface<BytesCase> {};

// One event per connection, so that the BATCH frame is exactly
// [1, 0, 0, [event]] = 94 01 00 00 91 <event>, followed by GOODBYE 91 02.
TEST_P(EventBytesTest, EncodesExactly) {
  StartServer();
  NewClient();
  ASSERT_EQ(GetParam().emit(client_), TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  const Connection& conn = conns[0];
  ASSERT_TRUE(IsWellFormed(conn));
  ASSERT_EQ(conn.frames.size(), 3u);
  const std::vector<uint8_t> batch =
      Concat({0x94, 0x01, 0x00, 0x00, 0x91}, GetParam().event);
  EXPECT_EQ(Hex(conn.frames[1].raw), Hex(batch));
  EXPECT_EQ(Hex(conn.frames[2].raw), "91 02");
  EXPECT_TRUE(IsValidEvent(conn.frames[1].value.array[3].array.at(0)));
}

INSTANTIATE_TEST_SUITE_P(HandWritten, EventBytesTest,
                         ::testing::ValuesIn(kBytesCases),
                         [](const ::testing::TestParamInfo<BytesCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace tokenmeter::testing
