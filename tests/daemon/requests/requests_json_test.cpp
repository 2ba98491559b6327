// /api/v1/requests' documents from hand-made timelines: a small request
// byte for byte, and every field of the richer ones (phases from the span
// builder, KV transfers, preemptions, ticks, escaping); the Chrome trace's
// events. tests/e2e/requests_e2e_test.py parses both from a live daemon.
#include "daemon/requests/requests_json.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "test_timelines.h"

namespace tokenmeter::daemon::requests {
namespace {

constexpr uint64_t kSec = 1'000'000'000;

bool Has(const std::string& doc, const std::string& part) {
  return doc.find(part) != std::string::npos;
}

RenderOptions Options() {
  RenderOptions o;
  o.keep = 5;
  o.window_ns = 900 * kSec;
  o.now_unix_ns = 1767225600000000000;
  o.unix_minus_monotonic_ns = trace::testing::kTestOffsetNs;
  return o;
}

TEST(RequestsJsonTest, SmallRequestByteForByte) {
  RequestKeeper k({.keep = 5, .window_ns = 900 * kSec});
  trace::RequestTimeline t;
  t.request_id = "9";
  t.profile = "vllm";
  t.engine_family = "tokenmeter_engine";
  t.engine_labels = {{"model_name", "m"}, {"engine", "0"}};
  t.arrived_ns = 10 * kSec;
  t.scheduled_ns = 10 * kSec + 1000;
  t.first_token_ns = 10 * kSec + 5000;
  t.last_token_ns = 10 * kSec + 9000;
  t.finished_ns = 10 * kSec + 9500;
  t.finish_reason = "stop";
  t.prompt_tokens = 3;
  t.generation_tokens = 2;
  t.tokens = {{10 * kSec + 5000, 1}, {10 * kSec + 9000, 1}};
  k.OnRetired(t, false);
  RenderOptions o = Options();
  o.unix_minus_monotonic_ns = 1'000'000'000'000'000'000;
  std::string out;
  RenderRequestsJson(k.Select(11 * kSec), o, out);
  EXPECT_EQ(
      out,
      "{\"window_seconds\":900,\"keep_requests\":5,"
      "\"now_unix_ns\":1767225600000000000,"
      "\"unix_minus_monotonic_ns\":1000000000000000000,\"series\":[\n"
      "{\"engine_family\":\"tokenmeter_engine\",\"profile\":\"vllm\","
      "\"labels\":{\"model_name\":\"m\",\"engine\":"
      "\"0\"},\"requests\":[\n"
      "{\"request_id\":\"9\",\"kept\":\"slow\",\"finish_reason\":\"stop\","
      "\"e2e_seconds\":9.5e-06,\"start_unix_ns\":1000000010000000000,"
      "\"start_monotonic_ns\":10000000000,\"arrived_ns\":0,"
      "\"queued_ns\":null,\"scheduled_ns\":1000,\"first_token_ns\":5000,"
      "\"last_token_ns\":9000,\"finished_ns\":9500,\"prompt_tokens\":3,"
      "\"generation_tokens\":2,\"max_tokens\":null,\"n\":null,"
      "\"cached_tokens\":null,\"external_tokens\":null,\"priority\":null,"
      "\"lora\":null,\"labels\":{},\"phases\":["
      "{\"name\":\"queue\",\"start_ns\":0,\"end_ns\":1000,\"error\":false},"
      "{\"name\":\"prefill\",\"start_ns\":1000,\"end_ns\":5000,\"error\":"
      "false},"
      "{\"name\":\"decode\",\"start_ns\":5000,\"end_ns\":9500,\"error\":"
      "false}],\"preemptions\":[],\"kv_transfers\":[],"
      "\"tokens\":[[5000,1],[9000,1]],\"tokens_not_shown\":0,"
      "\"traceparent\":null,\"tracestate\":null,\"trace_id\":null}]}]}\n");
  // The Chrome trace's process: the family (not the profile's name here),
  // the profile, the labels.
  out.clear();
  RenderChromeTrace(k.Select(11 * kSec), o, out);
  EXPECT_NE(out.find("\"process_name\",\"pid\":1,\"tid\":0,\"args\":{"
                     "\"name\":\"tokenmeter_engine vllm model_name=m "
                     "engine=0\"}}"),
            std::string::npos)
      << out;
}

TEST(RequestsJsonTest, EveryFieldOfTheRicherTimelines) {
  RequestKeeper k({.keep = 5, .window_ns = 9000 * kSec});
  trace::RequestTimeline typical = trace::testing::TypicalTimeline();
  typical.exported_trace_id = "0af7651916cd43dd8448eb211c80319c";
  typical.trace_exported = std::make_shared<bool>(true);
  trace::RequestTimeline disagg = trace::testing::DisaggDecodeTimeline();
  trace::RequestTimeline failed = trace::testing::FailedTimeline();
  failed.profile = "vllm";
  failed.engine_family = "vllm";
  k.OnRetired(typical, false);
  k.OnRetired(disagg, false);
  k.OnRetired(failed, false);
  std::string out;
  const auto shown = k.Select(3001 * kSec);
  ASSERT_EQ(shown.size(), 3u);  // three series
  RenderRequestsJson(shown, Options(), out);
  // Typical: points after ARRIVED, info, priority, LoRA, labels, context.
  EXPECT_TRUE(Has(out,
                  "\"request_id\":\"42\",\"kept\":\"slow\","
                  "\"finish_reason\":\"stop\",\"e2e_seconds\":2.000500011,"
                  "\"start_unix_ns\":1767225600123456789,"
                  "\"start_monotonic_ns\":1000000000000,"
                  "\"arrived_ns\":0,\"queued_ns\":100000,"
                  "\"scheduled_ns\":49900001,"
                  "\"first_token_ns\":250000003,"
                  "\"last_token_ns\":2000000007,"
                  "\"finished_ns\":2000500011,\"prompt_tokens\":512,"
                  "\"generation_tokens\":200,\"max_tokens\":256,\"n\":1,"
                  "\"cached_tokens\":128,\"external_tokens\":0,"
                  "\"priority\":-3,\"lora\":\"sql-adapter\","
                  "\"labels\":{\"tenant\":\"acme\"},\"phases\":["
                  "{\"name\":\"queue\",\"start_ns\":100000,"
                  "\"end_ns\":49900001,\"error\":false}"))
      << out;
  EXPECT_TRUE(Has(out, "\"tokens\":[[250000003,1],[258793972,1],"));
  EXPECT_TRUE(Has(out,
                  "\"traceparent\":\"00-0af7651916cd43dd8448eb211c80319c"
                  "-b7ad6b7169203331-01\",\"tracestate\":\"vendor=abc,"
                  "other=x1\",\"trace_id\":"
                  "\"0af7651916cd43dd8448eb211c80319c\"}"));
  // Disaggregated decode: the KV recv, both preemptions, external tokens.
  EXPECT_TRUE(Has(out,
                  "\"kv_transfers\":[{\"role\":\"recv\","
                  "\"start_ns\":500017,\"end_ns\":9000019,\"ok\":true,"
                  "\"bytes\":33554432,\"blocks\":128,\"reason\":null,"
                  "\"connector\":\"nixl\"}]"))
      << out;
  EXPECT_TRUE(Has(out,
                  "\"preemptions\":[{\"preempted_ns\":300000029,"
                  "\"resumed_ns\":400000031},{\"preempted_ns\":"
                  "900000037,\"resumed_ns\":null}]"));
  EXPECT_TRUE(Has(out,
                  "{\"name\":\"kv_transfer.recv\",\"start_ns\":500017,"
                  "\"end_ns\":9000019,\"error\":false}"));
  EXPECT_TRUE(Has(out,
                  "{\"name\":\"preempted\",\"start_ns\":900000037,"
                  "\"end_ns\":1000300043,\"error\":false}"));
  EXPECT_TRUE(Has(out, "\"external_tokens\":992"));
  // Failed: shown as such, escaped id and labels, failed KV sends.
  EXPECT_TRUE(Has(out,
                  "{\"request_id\":\"req-\\\"\xce\xb1\\\"\\\\1\\t\","
                  "\"kept\":\"failed\",\"finish_reason\":\"error\""))
      << out;
  EXPECT_TRUE(Has(out, "\"user\":\"caf\xc3\xa9\""));
  EXPECT_TRUE(Has(out,
                  "\"ok\":false,\"bytes\":null,\"blocks\":null,"
                  "\"reason\":\"timeout\",\"connector\":\"lmcache\"}"));
  EXPECT_TRUE(Has(out,
                  "{\"name\":\"kv_transfer.send\",\"start_ns\":"
                  "100000012,\"end_ns\":200000014,\"error\":true}"))
      << out;
  EXPECT_TRUE(Has(out, "\"priority\":2147483647"));
  EXPECT_TRUE(Has(out, "\"trace_id\":null}"));
}

// A trace id shows once its spans were exported: not while the body is
// queued or in flight, not when it was dropped or its export failed
// (interfaces.md: "with their trace id when exported").
TEST(RequestsJsonTest, TraceIdOnlyOnceExported) {
  for (int state : {0, 1, 2}) {  // not traced, not (yet) exported, exported
    RequestKeeper k({.keep = 5, .window_ns = 900 * kSec});
    trace::RequestTimeline t = trace::testing::TypicalTimeline();
    auto exported = std::make_shared<bool>(state == 2);
    if (state != 0) {
      t.exported_trace_id = "0af7651916cd43dd8448eb211c80319c";
      t.trace_exported = exported;
    }
    k.OnRetired(t, false);
    std::string json, chrome;
    RenderRequestsJson(k.Select(1003 * kSec), Options(), json);
    RenderChromeTrace(k.Select(1003 * kSec), Options(), chrome);
    const bool shown = state == 2;
    EXPECT_EQ(Has(json, "\"trace_id\":\"0af7651916cd43dd8448eb211c80319c\""),
              shown)
        << state;
    EXPECT_EQ(Has(json, "\"trace_id\":null"), !shown) << state;
    EXPECT_EQ(Has(chrome, "\"trace_id\":"), shown) << state;
  }
}

TEST(RequestsJsonTest, ChromeTraceHasProcessesThreadsSpansAndTicks) {
  RequestKeeper k({.keep = 5, .window_ns = 900 * kSec});
  trace::RequestTimeline typical = trace::testing::TypicalTimeline();
  typical.exported_trace_id = "0af7651916cd43dd8448eb211c80319c";
  typical.trace_exported = std::make_shared<bool>(true);
  k.OnRetired(typical, false);
  std::string out;
  RenderChromeTrace(k.Select(1003 * kSec), Options(), out);
  EXPECT_TRUE(Has(out,
                  "{\"displayTimeUnit\":\"ms\",\"otherData\":{"
                  "\"start_unix_ns\":1767225600123456789,"
                  "\"start_monotonic_ns\":1000000000000},"
                  "\"traceEvents\":["));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,"
                  "\"tid\":0,\"args\":{\"name\":\"vllm model_name="
                  "llama-3-8b engine=0\"}}"));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,"
                  "\"tid\":1,\"args\":{\"name\":\"request 42 (stop)\"}}"));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"X\",\"name\":\"llm_request\",\"pid\":1,"
                  "\"tid\":1,\"cat\":\"request\",\"ts\":0,"
                  "\"dur\":2000500.011,\"args\":{\"trace_id\":"
                  "\"0af7651916cd43dd8448eb211c80319c\","
                  "\"gen_ai.provider.name\":\"vllm\","))
      << out;
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"X\",\"name\":\"queue\",\"pid\":1,\"tid\":1,"
                  "\"cat\":\"request\",\"ts\":100,\"dur\":49800.001,"
                  "\"args\":{}}"));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"i\",\"name\":\"tokens\",\"pid\":1,"
                  "\"tid\":1,\"cat\":\"tokens\",\"s\":\"t\","
                  "\"ts\":250000.003,\"args\":{\"n\":1}}"));
  size_t ticks = 0;
  for (size_t at = out.find("\"name\":\"tokens\""); at != std::string::npos;
       at = out.find("\"name\":\"tokens\"", at + 1)) {
    ++ticks;
  }
  EXPECT_EQ(ticks, 200u);
  EXPECT_EQ(out.substr(out.size() - 3), "]}\n");
}

// Perfetto and chrome://tracing need a thread's X events properly nested:
// a KV transfer from inside prefill into decode, and one that began before
// the request arrived, go to a second thread of the request, which the
// next request's threads follow.
TEST(RequestsJsonTest, ChromeTraceSpansThatCrossAPhaseGetAThreadOfTheirOwn) {
  RequestKeeper k({.keep = 5, .window_ns = 900 * kSec});
  trace::RequestTimeline t = trace::testing::TypicalTimeline();
  trace::KvTransfer across;
  across.start_ns = t.first_token_ns - 1000;  // inside prefill
  across.end_ns = t.first_token_ns + 1000;    // inside decode
  t.kv_transfers.push_back(across);
  trace::KvTransfer before;
  before.recv = true;
  before.start_ns = t.arrived_ns - 5000;
  before.end_ns = t.arrived_ns + 2000;  // inside the queue
  t.kv_transfers.push_back(before);
  k.OnRetired(t, false);
  trace::RequestTimeline plain = trace::testing::TypicalTimeline();
  plain.request_id = "43";
  plain.finished_ns += 1000;  // slower: listed first
  k.OnRetired(plain, false);
  std::string out;
  RenderChromeTrace(k.Select(1003 * kSec), Options(), out);
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,"
                  "\"tid\":1,\"args\":{\"name\":\"request 43 (stop)\"}}"))
      << out;
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,"
                  "\"tid\":2,\"args\":{\"name\":\"request 42 (stop)\"}}"));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,"
                  "\"tid\":3,\"args\":{\"name\":\"request 42 (stop) "
                  "[2]\"}}"));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":1,"
                  "\"tid\":3,\"args\":{\"sort_index\":3}}"));
  EXPECT_FALSE(Has(out, "\"tid\":4")) << out;
  // Both transfers on the second thread; the phases on the first.
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"X\",\"name\":\"kv_transfer.send\",\"pid\":1,"
                  "\"tid\":3,"));
  EXPECT_TRUE(Has(out,
                  "{\"ph\":\"X\",\"name\":\"kv_transfer.recv\",\"pid\":1,"
                  "\"tid\":3,"));
  for (const char* phase : {"queue", "prefill", "decode", "llm_request"}) {
    EXPECT_TRUE(Has(out, std::string("{\"ph\":\"X\",\"name\":\"") + phase +
                             "\",\"pid\":1,\"tid\":2,"))
        << phase;
  }
}

TEST(RequestsJsonTest, EmptyKeeperGivesEmptyDocuments) {
  RequestKeeper k({.keep = 5, .window_ns = 900 * kSec});
  std::string json, chrome;
  RenderRequestsJson(k.Select(kSec), Options(), json);
  RenderChromeTrace(k.Select(kSec), Options(), chrome);
  EXPECT_TRUE(Has(json, "\"series\":[]}\n"));
  EXPECT_TRUE(Has(chrome, "\"traceEvents\":[]}\n"));
}

}  // namespace
}  // namespace tokenmeter::daemon::requests
