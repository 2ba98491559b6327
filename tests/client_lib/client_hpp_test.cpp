// The C++ wrapper (tokenmeter/client.hpp) over a real socket.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/client.hpp"

namespace tokenmeter::testing {
namespace {

class CppClientTest : public ::testing::Test {
 protected:
  Options BaseOptions() const {
    Options o;
    o.socket_path = socket_path_;
    o.model = "qwen";
    return o;
  }
  void StartServer() {
    server_ = std::make_unique<TestServer>(socket_path_);
    ASSERT_TRUE(server_->ok()) << server_->error();
  }
  bool WaitForEvents(size_t n) {
    return server_->WaitUntil(
        [n](const TestServer::Connections& c) { return CountEvents(c) >= n; });
  }
  bool WaitForEof(size_t index) {
    return server_->WaitUntil([index](const TestServer::Connections& c) {
      return c.size() > index && c[index].eof;
    });
  }
  // Closes `client`, checks that it sent `sent` events and rejected none,
  // and returns the events of its only connection as text.
  std::vector<std::string> CloseAndGetEvents(Client* client, uint64_t sent) {
    const Stats stats = client->Close();
    EXPECT_EQ(stats.events_sent, sent);
    EXPECT_EQ(stats.events_rejected, 0u);
    EXPECT_TRUE(WaitForEof(0));
    const TestServer::Connections conns = server_->Snapshot();
    EXPECT_TRUE(IsWellFormed(conns.at(0)));
    std::vector<std::string> shapes;
    for (const Value& ev : EventsOf(conns.at(0))) {
      shapes.push_back(ev.ToString());
    }
    return shapes;
  }

  TempDir dir_;
  std::string socket_path_ = dir_.File("s");
  std::unique_ptr<TestServer> server_;
};

TEST_F(CppClientTest, CreateSendsHelloWithOptions) {
  StartServer();
  Options o = BaseOptions();
  o.engine = "vllm";
  o.instance = "dp1";
  o.scope = "api";
  o.labels = {{"zone", "a"}, {"pool", "gpu"}};
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  ASSERT_NE(client, nullptr);
  client->Close();
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const Value& meta = conns[0].frames.at(0).value.array.at(1);
  EXPECT_EQ(meta.Find("engine")->str, "vllm");
  EXPECT_EQ(meta.Find("model")->str, "qwen");
  EXPECT_EQ(meta.Find("instance")->str, "dp1");
  EXPECT_EQ(meta.Find("scope")->str, "api");
  EXPECT_EQ(meta.Find("labels")->Find("zone")->str, "a");
  EXPECT_EQ(meta.Find("labels")->Find("pool")->str, "gpu");
}

TEST_F(CppClientTest, CreateSendsProtocol11HelloKeys) {
  StartServer();
  Options o = BaseOptions();
  o.profile = "lmdeploy";
  o.cache_config = {{"block_size", 64},
                    {"quant_policy", "int8"},
                    {"cache_max_entry_count", 0.5},
                    {"enable_prefix_caching", true}};
  o.cache_config.emplace_back("num_gpu_blocks", int64_t{8192});
  o.max_lora = 0;
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  client->Close();
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const Value& meta = conns[0].frames.at(0).value.array.at(1);
  EXPECT_EQ(meta.Find("profile")->str, "lmdeploy");
  EXPECT_EQ(meta.Find("cache_config")->ToString(),
            R"({"block_size":64,"quant_policy":"int8",)"
            R"("cache_max_entry_count":0.5,"enable_prefix_caching":true,)"
            R"("num_gpu_blocks":8192})");
  EXPECT_EQ(meta.Find("max_lora")->ToString(), "0");
}

TEST_F(CppClientTest, CreateWithoutProtocol11OptionsSendsNoneOfTheirKeys) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  client->Close();
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  const Value& meta = conns.at(0).frames.at(0).value.array.at(1);
  EXPECT_EQ(meta.Find("profile"), nullptr);
  EXPECT_EQ(meta.Find("cache_config"), nullptr);
  EXPECT_EQ(meta.Find("max_lora"), nullptr);
}

TEST_F(CppClientTest, CreatePassesAckAndReplayBytes) {
  StartServer();
  Options o = BaseOptions();
  EXPECT_TRUE(o.ack);
  EXPECT_EQ(o.replay_bytes, size_t{4} << 20);
  o.ack = false;
  o.replay_bytes = TM_MIN_REPLAY_BYTES;
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  ASSERT_EQ(client->Tokens(uint64_t{1}, 1), TM_OK);
  ASSERT_EQ(client->Flush(5000), TM_OK);
  client->Close();
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  const Value& meta = conns.at(0).frames.at(0).value.array.at(1);
  EXPECT_EQ(meta.Find("ack"), nullptr);
  EXPECT_NE(meta.Find("session"), nullptr);
  EXPECT_TRUE(conns[0].acked.empty());
  Options too_small = BaseOptions();
  too_small.replay_bytes = TM_MIN_REPLAY_BYTES - 1;
  EXPECT_EQ(Client::Create(too_small, &client), TM_E_INVALID);
}

TEST_F(CppClientTest, CreateRejectsInvalidProtocol11Options) {
  std::unique_ptr<Client> client;
  Options bad_profile = BaseOptions();
  bad_profile.profile = "tgi";
  EXPECT_EQ(Client::Create(bad_profile, &client), TM_E_INVALID);
  Options dup_key = BaseOptions();
  dup_key.cache_config = {{"block_size", 16}, {"block_size", "16"}};
  EXPECT_EQ(Client::Create(dup_key, &client), TM_E_INVALID);
  Options nan_value = BaseOptions();
  nan_value.cache_config = {{"util", std::nan("")}};
  EXPECT_EQ(Client::Create(nan_value, &client), TM_E_INVALID);
  Options reserved_key = BaseOptions();
  reserved_key.cache_config = {{"engine", 1}};
  EXPECT_EQ(Client::Create(reserved_key, &client), TM_E_INVALID);
  Options negative_lora = BaseOptions();
  negative_lora.max_lora = -2;
  EXPECT_EQ(Client::Create(negative_lora, &client), TM_E_INVALID);
  EXPECT_EQ(client, nullptr);
}

TEST_F(CppClientTest, CreateRejectsInvalidOptions) {
  std::unique_ptr<Client> client;
  Options no_model = BaseOptions();
  no_model.model.clear();
  EXPECT_EQ(Client::Create(no_model, &client), TM_E_INVALID);
  EXPECT_EQ(client, nullptr);
  Options bad_engine = BaseOptions();
  bad_engine.engine = "v llm";
  EXPECT_EQ(Client::Create(bad_engine, &client), TM_E_INVALID);
  EXPECT_EQ(client, nullptr);
  Options reserved_label = BaseOptions();
  reserved_label.labels = {{"model_name", "x"}};
  EXPECT_EQ(Client::Create(reserved_label, &client), TM_E_INVALID);
  Options small_buffer = BaseOptions();
  small_buffer.buffer_capacity = 10;
  EXPECT_EQ(Client::Create(small_buffer, &client), TM_E_INVALID);
  EXPECT_EQ(client, nullptr);
}

// string_view ids need no NUL terminator; default timestamps are "now".
TEST_F(CppClientTest, SendsEventsWithStringViewIds) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const std::string ids = "req-1req-2";
  const std::string_view a(ids.data(), 5);
  const std::string_view b(ids.data() + 5, 5);
  const uint64_t before = NowNs();
  EXPECT_EQ(client->Arrived(a, 12), TM_OK);
  EXPECT_EQ(client->Arrived(b, 13, 100, 2), TM_OK);
  EXPECT_EQ(client->Queued(a), TM_OK);
  EXPECT_EQ(client->Scheduled(a), TM_OK);
  EXPECT_EQ(client->Tokens(a, 1), TM_OK);
  EXPECT_EQ(client->Preempted(a), TM_OK);
  EXPECT_EQ(client->Finished(a, FinishReason::kAbort), TM_OK);
  EXPECT_EQ(client->Finished(b, FinishReason::kLength), TM_OK);
  EXPECT_EQ(client->Arrived(uint64_t{77}, 5, 0, 0, 123), TM_OK);
  EXPECT_EQ(client->Tokens(uint64_t{77}, 3, 124), TM_OK);
  EXPECT_EQ(client->Finished(uint64_t{77}, FinishReason::kStop, 125), TM_OK);
  const uint64_t after = NowNs();
  const Stats stats = client->Close();
  EXPECT_EQ(stats.events_sent, 11u);
  ASSERT_TRUE(WaitForEof(0));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const std::vector<Value> events = EventsOf(conns[0]);
  ASSERT_EQ(events.size(), 11u);
  std::vector<std::string> shapes;
  for (size_t i = 0; i < events.size(); ++i) {
    Value ev = events[i];
    if (i < 8) {
      EXPECT_GE(ev.array[1].uint, before);
      EXPECT_LE(ev.array[1].uint, after);
      ev.array[1].uint = 0;  // compare the rest exactly
    }
    shapes.push_back(ev.ToString());
  }
  EXPECT_EQ(shapes, (std::vector<std::string>{
                        R"([1,0,"req-1",12])",
                        R"([1,0,"req-2",13,{"max_tokens":100,"n":2}])",
                        R"([2,0,"req-1"])",
                        R"([3,0,"req-1"])",
                        R"([4,0,"req-1",1])",
                        R"([6,0,"req-1"])",
                        R"([5,0,"req-1","abort"])",
                        R"([5,0,"req-2","length"])",
                        R"([1,123,77,5])",
                        R"([4,124,77,3])",
                        R"([5,125,77,"stop"])",
                    }));
}

// Arrived() with lora and request labels: string_views need no NUL
// terminator; an empty lora is none.
TEST_F(CppClientTest, ArrivedSendsLoraAndRequestLabels) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const std::string text = "sql-loratenantacmetiergold";
  const std::string_view lora(text.data(), 8);
  const RequestLabel labels[] = {
      {std::string_view(text.data() + 8, 6),
       std::string_view(text.data() + 14, 4)},
      {std::string_view(text.data() + 18, 4), std::string_view()}};
  EXPECT_EQ(client->Arrived(uint64_t{1}, 10, 0, 0, lora, labels, 100), TM_OK);
  EXPECT_EQ(client->Arrived(uint64_t{2}, 20, 32, 2, lora, {}, 101), TM_OK);
  EXPECT_EQ(client->Arrived(uint64_t{3}, 30, 0, 0, "", labels, 102), TM_OK);
  EXPECT_EQ(client->Arrived(uint64_t{4}, 40, 0, 0, "", {}, 103), TM_OK);
  EXPECT_EQ(client->Arrived("req-5", 50, 0, 1, "adapter", labels, 104), TM_OK);
  EXPECT_EQ(client->Arrived("req-6", 60, 0, 0, {}, {}, 105), TM_OK);
  const std::vector<RequestLabel> one = {{"tenant", "b"}};
  EXPECT_EQ(client->Arrived("req-7", 70, 0, 0, "a", one, 106), TM_OK);
  EXPECT_EQ(CloseAndGetEvents(client.get(), 7),
            (std::vector<std::string>{
                R"([1,100,1,10,{"lora":"sql-lora",)"
                R"("labels":{"tenant":"acme","tier":""}}])",
                R"([1,101,2,20,{"max_tokens":32,"n":2,"lora":"sql-lora"}])",
                R"([1,102,3,30,{"labels":{"tenant":"acme","tier":""}}])",
                R"([1,103,4,40])",
                R"([1,104,"req-5",50,{"n":1,"lora":"adapter",)"
                R"("labels":{"tenant":"acme","tier":""}}])",
                R"([1,105,"req-6",60])",
                R"([1,106,"req-7",70,{"lora":"a","labels":{"tenant":"b"}}])",
            }));
}

// What the C call refuses, and what cannot reach it (a NUL byte inside a
// string_view, a string longer than its buffer), is rejected and counted
// alike; nothing is sent.
TEST_F(CppClientTest, ArrivedRejectsInvalidLoraAndLabels) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const std::string long_lora(TM_MAX_LORA_BYTES + 1, 'l');
  const std::string long_value(TM_MAX_REQUEST_LABEL_VALUE_BYTES + 1, 'v');
  const std::string long_name(TM_MAX_STRING_BYTES + 1, 'n');
  const std::string nul_lora("a\0b", 3);
  const RequestLabel five[] = {
      {"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}, {"e", "5"}};
  const RequestLabel dup[] = {{"a", "1"}, {"a", "2"}};
  const RequestLabel reserved[] = {{"le", "1"}};
  const RequestLabel too_long_value[] = {{"a", long_value}};
  const RequestLabel too_long_name[] = {{long_name, "v"}};
  const RequestLabel nul_value[] = {{"a", std::string_view("x\0y", 3)}};
  uint64_t rid = 1;
  for (const auto& [lora, labels] :
       std::vector<std::pair<std::string_view, std::span<const RequestLabel>>>{
           {long_lora, {}},
           {nul_lora, {}},
           {"\xff", {}},
           {"", five},
           {"", dup},
           {"", reserved},
           {"", too_long_value},
           {"", too_long_name},
           {"", nul_value},
       }) {
    EXPECT_EQ(client->Arrived(rid, 1, 0, 0, lora, labels), TM_E_INVALID) << rid;
    EXPECT_EQ(client->Arrived("r", 1, 0, 0, lora, labels), TM_E_INVALID) << rid;
    ++rid;
  }
  EXPECT_EQ(client->GetStats().events_rejected, 18u);
  EXPECT_EQ(client->Arrived(uint64_t{99}, 1, 0, 0, "ok", {}, 7), TM_OK);
  const Stats stats = client->Close();
  EXPECT_EQ(stats.events_sent, 1u);
  ASSERT_TRUE(WaitForEof(0));
  const std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].ToString(), R"([1,7,99,1,{"lora":"ok"}])");
  // Closed: inert, like every call.
  EXPECT_EQ(client->Arrived(uint64_t{1}, 1, 0, 0, "ok", {}), TM_E_INVALID);
}

TEST_F(CppClientTest, TokensBatchSendsOneEventPerCountedEntry) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const uint64_t rids[] = {4, 5, 6};
  const uint32_t n[] = {2, 0, 7};
  EXPECT_EQ(client->TokensBatch(rids, 3, nullptr, 900), 3);
  EXPECT_EQ(client->TokensBatch(rids, 3, n, 901), 2);
  EXPECT_EQ(client->TokensBatch(nullptr, 1), TM_E_INVALID);
  const Stats stats = client->Close();
  EXPECT_EQ(stats.events_sent, 5u);
  EXPECT_EQ(stats.events_rejected, 1u);
  ASSERT_TRUE(WaitForEof(0));
  std::vector<std::string> shapes;
  for (const Value& ev : EventsOf(server_->Snapshot()[0])) {
    shapes.push_back(ev.ToString());
  }
  EXPECT_EQ(shapes, (std::vector<std::string>{
                        R"([4,900,4,1])",
                        R"([4,900,5,1])",
                        R"([4,900,6,1])",
                        R"([4,901,4,2])",
                        R"([4,901,6,7])",
                    }));
}

TEST_F(CppClientTest, StepStatsSendsEachKeyOnce) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const uint64_t per_pos[] = {5, 3, 1};
  StepStats s;
  s.Running(1)
      .Running(4)  // a key set twice keeps the last value
      .Waiting(2)
      .KvUsage(0.75)
      .PromptTokens(100)
      .GenerationTokens(8)
      .PrefixQueries(64)
      .PrefixHits(32)
      .SpecDrafts(2)
      .SpecDraftTokens(6)
      .SpecAcceptedTokens(9)
      .SpecAcceptedPerPos(per_pos, 3);
  EXPECT_EQ(client->Step(s, 77), TM_OK);
  EXPECT_EQ(client->Step(StepStats().Waiting(0), 78), TM_OK);
  EXPECT_EQ(client->Step(StepStats(), 79), TM_OK);
  client->Close();
  ASSERT_TRUE(WaitForEof(0));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const std::vector<Value> events = EventsOf(conns[0]);
  ASSERT_EQ(events.size(), 3u);
  const Value& m = events[0].array[2];
  EXPECT_EQ(m.map.size(), 11u);
  EXPECT_EQ(m.CountKey("running"), 1u);
  EXPECT_EQ(m.Find("running")->uint, 4u);
  EXPECT_EQ(m.Find("waiting")->uint, 2u);
  EXPECT_EQ(m.Find("kv_usage")->real, 0.75);
  EXPECT_EQ(m.Find("prompt_tokens")->uint, 100u);
  EXPECT_EQ(m.Find("generation_tokens")->uint, 8u);
  EXPECT_EQ(m.Find("prefix_queries")->uint, 64u);
  EXPECT_EQ(m.Find("prefix_hits")->uint, 32u);
  EXPECT_EQ(m.Find("spec_drafts")->uint, 2u);
  EXPECT_EQ(m.Find("spec_draft_tokens")->uint, 6u);
  EXPECT_EQ(m.Find("spec_accepted_tokens")->uint, 9u);
  EXPECT_EQ(m.Find("spec_accepted_per_pos")->ToString(), "[5,3,1]");
  EXPECT_EQ(events[1].ToString(), R"([7,78,{"waiting":0}])");
  EXPECT_EQ(events[2].ToString(), R"([7,79,{}])");
}

TEST_F(CppClientTest, StepWithTooManyPositionsIsRejected) {
  std::unique_ptr<Client> client;
  Options o = BaseOptions();
  o.close_timeout_ms = 0;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  std::vector<uint64_t> pos(TM_MAX_SPEC_POSITIONS + 1, 1);
  EXPECT_EQ(
      client->Step(StepStats().SpecAcceptedPerPos(pos.data(), pos.size())),
      TM_E_INVALID);
  EXPECT_EQ(client->GetStats().events_rejected, 1u);
}

// ExpertLoad() takes any contiguous uint64_t range: an array, a vector, a
// subspan; t_ns defaults to now.
TEST_F(CppClientTest, ExpertLoadSendsCountsFromASpan) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const uint64_t arr[] = {3, 0, 300};
  std::vector<uint64_t> vec(256);
  for (size_t i = 0; i < vec.size(); ++i) vec[i] = i;
  const uint64_t before = NowNs();
  EXPECT_EQ(client->ExpertLoad(0, arr, 50), TM_OK);
  EXPECT_EQ(client->ExpertLoad(TM_MAX_MOE_LAYERS - 1, vec, 51), TM_OK);
  EXPECT_EQ(
      client->ExpertLoad(2, std::span<const uint64_t>(vec).subspan(1, 2), 52),
      TM_OK);
  EXPECT_EQ(client->ExpertLoad(3, arr), TM_OK);
  const uint64_t after = NowNs();
  const Stats stats = client->Close();
  EXPECT_EQ(stats.events_sent, 4u);
  EXPECT_EQ(stats.events_rejected, 0u);
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const std::vector<Value> events = EventsOf(conns[0]);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].ToString(), "[8,50,0,[3,0,300]]");
  EXPECT_EQ(events[1].array[2].uint, 4095u);
  ASSERT_EQ(events[1].array[3].array.size(), 256u);
  for (size_t i = 0; i < 256; ++i) {
    EXPECT_EQ(events[1].array[3].array[i].uint, i) << i;
  }
  EXPECT_EQ(events[2].ToString(), "[8,52,2,[1,2]]");
  const uint64_t t = events[3].array[1].uint;
  EXPECT_GE(t, before);
  EXPECT_LE(t, after);
  EXPECT_EQ(events[3].array[3].ToString(), "[3,0,300]");
}

// What the C call refuses is refused through the wrapper alike, and counted.
TEST_F(CppClientTest, ExpertLoadRejectsInvalidArguments) {
  std::unique_ptr<Client> client;
  Options o = BaseOptions();
  o.close_timeout_ms = 0;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  const std::vector<uint64_t> many(TM_MAX_MOE_EXPERTS + 1, 1);
  const uint64_t big[] = {uint64_t{TM_MAX_EVENT_COUNT} + 1};
  const uint64_t ok[] = {1};
  EXPECT_EQ(client->ExpertLoad(TM_MAX_MOE_LAYERS, ok), TM_E_INVALID);
  EXPECT_EQ(client->ExpertLoad(0, {}), TM_E_INVALID);
  EXPECT_EQ(client->ExpertLoad(0, many), TM_E_INVALID);
  EXPECT_EQ(client->ExpertLoad(0, big), TM_E_INVALID);
  EXPECT_EQ(client->GetStats().events_rejected, 4u);
}

// ---- protocol 1.2
// ------------------------------------------------------------

constexpr std::string_view kTraceparent =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST_F(CppClientTest, ArrivedSendsRequestParams) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  // Views into one buffer: the wrapper copies them NUL-terminated.
  const std::string text = std::string(kTraceparent) + "a=1,b=2tenantacme";
  const RequestLabel labels[] = {{std::string_view(text.data() + 62, 6),
                                  std::string_view(text.data() + 68, 4)}};
  RequestParams p;
  p.priority = -10;
  EXPECT_EQ(client->Arrived(uint64_t{1}, 10, p, 100), TM_OK);
  p = RequestParams{};
  p.max_tokens = 64;
  p.lora = "sql-lora";
  p.labels = labels;
  p.n_labels = 1;
  p.priority = 0;
  p.traceparent = std::string_view(text.data(), 55);
  p.tracestate = std::string_view(text.data() + 55, 7);
  EXPECT_EQ(client->Arrived("req-2", 20, p, 101), TM_OK);
  p = RequestParams{};
  p.n = 2;  // nothing of 1.1 or 1.2: tm_arrived()'s event
  EXPECT_EQ(client->Arrived(uint64_t{3}, 30, p, 102), TM_OK);
  EXPECT_EQ(CloseAndGetEvents(client.get(), 3),
            (std::vector<std::string>{
                R"([1,100,1,10,{"priority":-10}])",
                R"([1,101,"req-2",20,{"max_tokens":64,)"
                R"("lora":"sql-lora","labels":{"tenant":"acme"},)"
                R"("priority":0,"traceparent":")" +
                    std::string(kTraceparent) + R"(","tracestate":"a=1,b=2"}])",
                R"([1,102,3,30,{"n":2}])",
            }));
}

// What the C call refuses, and what cannot reach it (a NUL byte, a string
// longer than its buffer), is rejected and counted alike; nothing is sent.
// Trace strings are the exception: a malformed one, or one that cannot
// reach the C call, is left out and counted in fields_dropped, and the
// ARRIVED is sent without it.
TEST_F(CppClientTest, ArrivedRejectsInvalidRequestParams) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  const std::string long_tp = std::string(kTraceparent) + "0";
  const std::string nul_tp = std::string(kTraceparent.substr(0, 54)) + '\0';
  const std::string upper_tp =
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-"
      "00F067AA0BA902B7-01";
  const std::string long_ts = "a=" + std::string(TM_MAX_TRACESTATE_BYTES, 'v');
  const RequestLabel five[] = {
      {"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}, {"e", "5"}};
  const std::string nul_ts = std::string("a=1\0", 4);
  std::vector<RequestParams> bad(4);
  bad[0].labels = five;
  bad[0].n_labels = 5;
  bad[1].lora = std::string_view("a\0b", 3);
  bad[2].lora = "x";
  bad[2].traceparent = upper_tp;  // a bad label refuses the call anyway
  bad[2].labels = five;
  bad[2].n_labels = 5;
  bad[3].n_labels = 1;  // labels null: the C call's TM_E_INVALID
  for (size_t i = 0; i < bad.size(); ++i) {
    bad[i].priority = 1;
    EXPECT_EQ(client->Arrived(uint64_t{i}, 1, bad[i]), TM_E_INVALID) << i;
    EXPECT_EQ(client->Arrived("r", 1, bad[i]), TM_E_INVALID) << i;
  }
  EXPECT_EQ(client->GetStats().events_rejected, 2 * bad.size());
  std::vector<RequestParams> dropped(6);
  dropped[0].traceparent = long_tp;
  dropped[1].traceparent = nul_tp;
  dropped[2].traceparent = upper_tp;
  dropped[3].tracestate = long_ts;
  dropped[4].tracestate = "Bad=1";
  dropped[5].tracestate = nul_ts;
  for (size_t i = 0; i < dropped.size(); ++i) {
    dropped[i].priority = int32_t(i);
    EXPECT_EQ(client->Arrived(uint64_t{10 + i}, 1, dropped[i], 5), TM_OK) << i;
  }
  EXPECT_EQ(client->GetStats().fields_dropped, dropped.size());
  RequestParams ok;
  ok.traceparent = kTraceparent;
  EXPECT_EQ(client->Arrived(uint64_t{99}, 1, ok, 7), TM_OK);
  const Stats stats = client->Close();
  EXPECT_EQ(stats.events_sent, 1 + dropped.size());
  EXPECT_EQ(stats.events_rejected, 2 * bad.size());
  EXPECT_EQ(stats.fields_dropped, dropped.size());
  ASSERT_TRUE(WaitForEof(0));
  const std::vector<Value> events = EventsOf(server_->Snapshot()[0]);
  ASSERT_EQ(events.size(), 1 + dropped.size());
  for (size_t i = 0; i < dropped.size(); ++i) {
    // Sent with its priority, without the trace string.
    const Value& params = events[i].array[4];
    EXPECT_EQ(params.Find("priority")->uint, uint64_t(i)) << i;
    EXPECT_EQ(params.Find("traceparent"), nullptr) << i;
    EXPECT_EQ(params.Find("tracestate"), nullptr) << i;
  }
  EXPECT_EQ(events.back().array[4].Find("traceparent")->str, kTraceparent);
  EXPECT_EQ(client->Arrived(uint64_t{1}, 1, ok), TM_E_INVALID);  // closed
}

TEST_F(CppClientTest, SendsProtocol12Events) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  EXPECT_EQ(client->Scheduled(uint64_t{1}, SchedulingInfo{16, 32}, 100), TM_OK);
  EXPECT_EQ(client->Scheduled("req-2", SchedulingInfo{}, 101), TM_OK);
  EXPECT_EQ(client->AdmissionRejected("queue_full", 102), TM_OK);
  EXPECT_EQ(client->AdmissionRejected(uint64_t{3}, "token_cap", 103), TM_OK);
  const std::string reasons = "deadlinexyz";
  EXPECT_EQ(client->AdmissionRejected("req-4",
                                      std::string_view(reasons.data(), 8), 104),
            TM_OK);
  KvTransferInfo kv;
  kv.role = KvRole::kRecv;
  kv.start_ns = 50;
  kv.bytes = 1 << 20;
  kv.connector = std::string_view(reasons.data(), 4);  // "dead", copied
  EXPECT_EQ(client->KvTransfer(uint64_t{5}, kv, 105), TM_OK);
  kv = KvTransferInfo{};
  kv.start_ns = 106;
  kv.blocks = 0;
  kv.ok = false;
  kv.reason = "timeout";
  EXPECT_EQ(client->KvTransfer("req-6", kv, 106), TM_OK);
  EXPECT_EQ(client->SleepState(SchedulerState::kPaused, WeightsState::kKeep,
                               KvCacheState::kReleased, 107),
            TM_OK);
  EXPECT_EQ(client->SleepState(SchedulerState::kKeep, WeightsState::kDiscarded,
                               KvCacheState::kKeep, 108),
            TM_OK);
  EXPECT_EQ(client->Step(StepStats().Waiting(5).WaitingDeferred(2), 109),
            TM_OK);
  const uint64_t before = NowNs();
  EXPECT_EQ(client->AdmissionRejected("now"), TM_OK);
  const uint64_t after = NowNs();
  std::vector<std::string> shapes = CloseAndGetEvents(client.get(), 11);
  ASSERT_EQ(shapes.size(), 11u);
  const uint64_t t = EventsOf(server_->Snapshot()[0])[10].array[1].uint;
  EXPECT_GE(t, before);
  EXPECT_LE(t, after);
  shapes.pop_back();
  EXPECT_EQ(shapes,
            (std::vector<std::string>{
                R"([3,100,1,{"cached_tokens":16,"external_tokens":32}])",
                R"([3,101,"req-2",{"cached_tokens":0,"external_tokens":0}])",
                R"([9,102,"queue_full"])",
                R"([9,103,"token_cap",3])",
                R"([9,104,"deadline","req-4"])",
                R"([10,105,5,{"role":"recv","start":50,"bytes":1048576,)"
                R"("connector":"dead"}])",
                R"([10,106,"req-6",{"role":"send","start":106,"blocks":0,)"
                R"("ok":false,"reason":"timeout"}])",
                R"([11,107,{"scheduler":"paused","kv_cache":"released"}])",
                R"([11,108,{"weights":"discarded"}])",
                R"([7,109,{"waiting":5,"waiting_deferred":2}])",
            }));
}

// Protocol 1.3 through the wrapper: RequestSummary() with each id form,
// nullopt fields not sent; Latencies() from spans, with and without
// counts. Then a given UINT64_MAX is refused (it means "not given" only in
// C).
TEST_F(CppClientTest, SendsProtocol13Events) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  RequestSummary s;
  s.reason = FinishReason::kLength;
  s.prompt_tokens = 812;
  s.generation_tokens = 256;
  s.n = 2;
  s.e2e_ns = 2600;
  s.tpot_ns = 0;
  EXPECT_EQ(client->RequestSummary(s, 100), TM_OK);
  EXPECT_EQ(client->RequestSummary(uint64_t{7}, RequestSummary{}, 101), TM_OK);
  s.cached_tokens = 12;
  EXPECT_EQ(client->RequestSummary("req-8", s, 102), TM_OK);
  const std::vector<uint64_t> ttft = {41, 1};
  const uint64_t itl[] = {9};
  EXPECT_EQ(client->Latencies(ttft, itl, {}, 104), TM_OK);
  IterationCounts counts;
  counts.prompt_tokens = 812;
  counts.preemptions = 0;
  EXPECT_EQ(client->Latencies({}, itl, counts, 105), TM_OK);
  EXPECT_EQ(CloseAndGetEvents(client.get(), 5),
            (std::vector<std::string>{
                R"([12,100,"length",{"prompt_tokens":812,)"
                R"("generation_tokens":256,"n":2,"e2e":2600,"tpot":0}])",
                R"([12,101,"stop",{"prompt_tokens":0,"generation_tokens":0},)"
                R"(7])",
                R"([12,102,"length",{"prompt_tokens":812,)"
                R"("generation_tokens":256,"cached_tokens":12,"n":2,)"
                R"("e2e":2600,"tpot":0},"req-8"])",
                R"([13,104,[41,1],[9]])",
                R"([13,105,[],[9],{"prompt_tokens":812,"preemptions":0}])",
            }));
}

TEST_F(CppClientTest, Protocol13RefusesAGivenUint64Max) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  RequestSummary s;
  s.ttft_ns = UINT64_MAX;
  EXPECT_EQ(client->RequestSummary(s), TM_E_INVALID);
  IterationCounts counts;
  counts.generation_tokens = UINT64_MAX;
  EXPECT_EQ(client->Latencies({}, {}, counts), TM_E_INVALID);
  const Stats stats = client->Close();
  EXPECT_EQ(stats.events_rejected, 2u);
  EXPECT_EQ(stats.events_sent, 0u);
}

// Registered values through the wrapper: RegisterValue(), the ValueId
// overloads of AdmissionRejected() and KvTransferInfo's ids, sent as the
// strings.
TEST_F(CppClientTest, SendsRegisteredValues) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  ValueId queue_full, nixl, again;
  const std::string values = "queue_fullnixl";
  ASSERT_EQ(
      client->RegisterValue(std::string_view(values.data(), 10), &queue_full),
      TM_OK);
  ASSERT_EQ(
      client->RegisterValue(std::string_view(values.data() + 10, 4), &nixl),
      TM_OK);
  ASSERT_EQ(client->RegisterValue("queue_full", &again), TM_OK);
  EXPECT_EQ(queue_full.id, 1u);
  EXPECT_EQ(nixl.id, 2u);
  EXPECT_EQ(again.id, 1u);
  ValueId untouched{42};
  EXPECT_EQ(client->RegisterValue("", &untouched), TM_E_INVALID);
  EXPECT_EQ(client->RegisterValue("tab\t", &untouched), TM_E_INVALID);
  EXPECT_EQ(client->RegisterValue(std::string(65, 'r'), &untouched),
            TM_E_INVALID);
  EXPECT_EQ(client->RegisterValue("x", nullptr), TM_E_INVALID);
  EXPECT_EQ(untouched.id, 42u);
  EXPECT_EQ(client->AdmissionRejected(queue_full, 100), TM_OK);
  EXPECT_EQ(client->AdmissionRejected(uint64_t{3}, queue_full, 101), TM_OK);
  EXPECT_EQ(client->AdmissionRejected("req-4", nixl, 102), TM_OK);
  KvTransferInfo kv;
  kv.start_ns = 50;
  kv.bytes = 1 << 20;
  kv.connector_id = nixl;
  EXPECT_EQ(client->KvTransfer(uint64_t{5}, kv, 104), TM_OK);
  kv.ok = false;
  kv.reason_id = queue_full;
  EXPECT_EQ(client->KvTransfer("req-6", kv, 105), TM_OK);
  EXPECT_EQ(CloseAndGetEvents(client.get(), 5),
            (std::vector<std::string>{
                R"([9,100,"queue_full"])",
                R"([9,101,"queue_full",3])",
                R"([9,102,"nixl","req-4"])",
                R"([10,104,5,{"role":"send","start":50,"bytes":1048576,)"
                R"("connector":"nixl"}])",
                R"([10,105,"req-6",{"role":"send","start":50,)"
                R"("bytes":1048576,"ok":false,"reason":"queue_full",)"
                R"("connector":"nixl"}])",
            }));
}

// What the C calls refuse is refused through the wrapper alike, and
// counted; so is what cannot reach them (a reason with a NUL byte or longer
// than 64 bytes, bytes of UINT64_MAX, TM_KV_UNKNOWN in C).
TEST_F(CppClientTest, Protocol12CallsRejectInvalidArguments) {
  std::unique_ptr<Client> client;
  Options o = BaseOptions();
  o.close_timeout_ms = 0;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  const std::string long_reason(TM_MAX_LABEL_VALUE_BYTES + 1, 'r');
  const std::string_view nul_reason("a\0b", 3);
  EXPECT_EQ(client->AdmissionRejected(""), TM_E_INVALID);
  EXPECT_EQ(client->AdmissionRejected(long_reason), TM_E_INVALID);
  EXPECT_EQ(client->AdmissionRejected(uint64_t{1}, nul_reason), TM_E_INVALID);
  EXPECT_EQ(client->AdmissionRejected("r", "tab\t"), TM_E_INVALID);
  EXPECT_EQ(client->AdmissionRejected("", "ok"), TM_E_INVALID);  // empty id
  KvTransferInfo kv;
  kv.start_ns = 11;
  EXPECT_EQ(client->KvTransfer(uint64_t{1}, kv, 10), TM_E_INVALID);
  kv.start_ns = 1;
  kv.bytes = UINT64_MAX;
  EXPECT_EQ(client->KvTransfer(uint64_t{1}, kv, 10), TM_E_INVALID);
  kv.bytes = TM_MAX_KV_TRANSFER_BYTES + 1;
  EXPECT_EQ(client->KvTransfer(uint64_t{1}, kv, 10), TM_E_INVALID);
  kv.bytes.reset();
  kv.blocks = UINT64_MAX;
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_E_INVALID);
  kv.blocks.reset();
  kv.reason = long_reason;
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_E_INVALID);
  kv.reason = {};
  kv.connector = nul_reason;
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_E_INVALID);
  kv.connector = {};
  kv.role = static_cast<KvRole>(7);
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_E_INVALID);
  // Ids not registered, and a string with the id of its field.
  EXPECT_EQ(client->AdmissionRejected(ValueId{}, 10), TM_E_INVALID);
  EXPECT_EQ(client->AdmissionRejected(uint64_t{1}, ValueId{1}, 10),
            TM_E_INVALID);
  ValueId timeout;
  ASSERT_EQ(client->RegisterValue("timeout", &timeout), TM_OK);
  kv.role = KvRole::kSend;
  kv.reason = "timeout";
  kv.reason_id = timeout;
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_E_INVALID);
  kv.reason = {};
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_OK);
  EXPECT_EQ(client->SleepState(static_cast<SchedulerState>(5),
                               WeightsState::kKeep, KvCacheState::kKeep),
            TM_E_INVALID);
  EXPECT_EQ(client->Step(StepStats().WaitingDeferred(1)), TM_E_INVALID);
  EXPECT_EQ(client->Step(StepStats().Waiting(1).WaitingDeferred(2)),
            TM_E_INVALID);
  EXPECT_EQ(client->GetStats().events_rejected, 18u);
  kv.role = KvRole::kSend;
  EXPECT_EQ(client->KvTransfer("r", kv, 10), TM_OK);
  EXPECT_EQ(client->GetStats().events_rejected, 18u);
}

// Close() flushes, says goodbye, and returns the final counters; the
// object stays usable but inert.
TEST_F(CppClientTest, CloseReturnsFinalStats) {
  StartServer();
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
  ASSERT_EQ(client->AttachThread(), TM_OK);
  for (uint32_t i = 1; i <= 100; ++i) {
    ASSERT_EQ(client->Tokens(uint64_t{1}, i, i), TM_OK);
  }
  EXPECT_EQ(client->Tokens(uint64_t{1}, 0), TM_E_INVALID);
  ASSERT_EQ(client->Flush(5000), TM_OK);
  EXPECT_TRUE(client->GetStats().connected);
  const Stats s = client->Close();
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  EXPECT_EQ(s.events_sent, 100u);
  EXPECT_EQ(s.events_dropped, 0u);
  EXPECT_EQ(s.events_rejected, 1u);
  EXPECT_EQ(s.reconnects, 0u);
  EXPECT_EQ(s.batches_sent, BatchesOf(conns[0]).size());
  EXPECT_EQ(s.bytes_sent, conns[0].bytes.size());
  EXPECT_FALSE(s.connected);
  EXPECT_EQ(s.connect_failures, 0u);
  // The test server acks every batch (ack is on by default).
  EXPECT_EQ(s.batches_replayed, 0u);
  EXPECT_EQ(s.events_unacked, 0u);
  EXPECT_EQ(conns[0].acked.size(), BatchesOf(conns[0]).size());
  // Closed: later calls do nothing and report the final counters.
  EXPECT_EQ(client->Tokens(uint64_t{1}, 1), TM_E_INVALID);
  EXPECT_EQ(client->Flush(10), TM_E_INVALID);
  EXPECT_EQ(client->handle(), nullptr);
  EXPECT_EQ(client->GetStats().events_sent, 100u);
  EXPECT_EQ(client->Close().events_sent, 100u);
  EXPECT_EQ(CountEvents(conns), 100u);
}

TEST_F(CppClientTest, DestructorClosesAndSaysGoodbye) {
  StartServer();
  {
    std::unique_ptr<Client> client;
    ASSERT_EQ(Client::Create(BaseOptions(), &client), TM_OK);
    EXPECT_EQ(client->Tokens("last", 1, 10), TM_OK);
  }
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(EventsOf(conns[0]).at(0).ToString(), R"([4,10,"last",1])");
  EXPECT_EQ(conns[0].frames.back().value.ToString(), "[2]");
}

// dropped_total in every BATCH header counts events the client threw away:
// rejected ones and those the full buffer refused while the daemon was away.
TEST_F(CppClientTest, BatchHeadersCarryDroppedTotal) {
  Options o = BaseOptions();
  o.buffer_capacity = 1024;
  std::unique_ptr<Client> client;
  ASSERT_EQ(Client::Create(o, &client), TM_OK);
  uint64_t accepted = 0;
  uint64_t dropped = 0;
  for (uint32_t i = 1; i <= 3000; ++i) {
    const int rc = client->Tokens(uint64_t{9}, i, i);
    accepted += rc == TM_OK;
    dropped += rc == TM_E_DROPPED;
  }
  ASSERT_EQ(accepted + dropped, 3000u);
  ASSERT_GT(dropped, 0u);
  EXPECT_EQ(client->Tokens(std::string_view(), 1), TM_E_INVALID);
  EXPECT_EQ(client->Finished(uint64_t{9}, static_cast<FinishReason>(5)),
            TM_E_INVALID);
  EXPECT_EQ(client->GetStats().events_dropped, dropped);
  EXPECT_EQ(client->GetStats().events_rejected, 2u);

  StartServer();
  ASSERT_TRUE(WaitForEvents(accepted));
  const TestServer::Connections early = server_->Snapshot();
  const std::vector<const Frame*> first = BatchesOf(early[0]);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first[0]->value.array[2].uint, dropped + 2);

  // One more rejected event shows in the next BATCH.
  EXPECT_EQ(client->Tokens(uint64_t{9}, 0), TM_E_INVALID);
  EXPECT_EQ(client->Tokens(uint64_t{9}, 1, 5), TM_OK);
  ASSERT_TRUE(WaitForEvents(accepted + 1));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  const std::vector<const Frame*> batches = BatchesOf(conns[0]);
  EXPECT_EQ(batches.back()->value.array[2].uint, dropped + 3);
  EXPECT_EQ(batches.back()->value.array[3].array.back().ToString(),
            "[4,5,9,1]");
}

}  // namespace
}  // namespace tokenmeter::testing
