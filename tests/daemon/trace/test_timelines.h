// Hand-made retired-request timelines shared by the trace tests and the
// encoder tool (encode_spans_tool.cpp): every span kind, missing points,
// failures, a remote parent, and text that needs escaping. Times are
// CLOCK_MONOTONIC ns chosen so that no duration is a whole number of
// seconds (the OpenTelemetry JS SDK would send such a double as an int).
#ifndef TOKENMETER_TESTS_DAEMON_TRACE_TEST_TIMELINES_H_
#define TOKENMETER_TESTS_DAEMON_TRACE_TEST_TIMELINES_H_

#include <string>
#include <vector>

#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon::trace::testing {

// 2026-01-01T00:00:00.123456789Z minus a monotonic 1000 s.
inline constexpr int64_t kTestOffsetNs =
    1767225600123456789LL - 1000000000000LL;

// Queue, prefill, decode under a remote, sampled parent with a tracestate;
// labels; SCHEDULED info; priority; LoRA.
inline RequestTimeline TypicalTimeline() {
  RequestTimeline t;
  t.request_id = "42";
  t.engine = "vllm";
  t.profile = "vllm";
  t.engine_family = "vllm";
  t.engine_labels = {{"model_name", "llama-3-8b"}, {"engine", "0"}};
  t.request_labels = {{"tenant", "acme"}};
  t.lora = "sql-adapter";
  t.arrived_ns = 1000000000000;
  t.queued_ns = 1000000100000;
  t.scheduled_ns = 1000049900001;
  t.first_token_ns = 1000250000003;
  t.last_token_ns = 1002000000007;
  t.finished_ns = 1002000500011;
  t.finish_reason = "stop";
  t.prompt_tokens = 512;
  t.generation_tokens = 200;
  t.max_tokens = 256;
  t.n = 1;
  t.has_info = true;
  t.cached_tokens = 128;
  t.external_tokens = 0;
  t.has_priority = true;
  t.priority = -3;
  for (uint32_t i = 0; i < 200; ++i) {
    t.tokens.push_back({t.first_token_ns + i * 8793969ULL, 1});
  }
  t.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  t.tracestate = "vendor=abc,other=x1";
  return t;
}

// The decode side of a disaggregated request: a KV recv, a preemption
// rescheduled and one never rescheduled; no traceparent (a new trace).
inline RequestTimeline DisaggDecodeTimeline() {
  RequestTimeline t;
  t.request_id = "7";
  t.engine = "sglang";
  t.profile = "sglang";
  t.engine_family = "sglang";
  t.engine_labels = {{"model_name", "qwen"}, {"engine", "1"}};
  t.arrived_ns = 2000000000000;
  t.scheduled_ns = 2000010000013;
  KvTransfer kv;
  kv.start_ns = 2000000500017;
  kv.end_ns = 2000009000019;
  kv.recv = true;
  kv.bytes = 33554432;
  kv.blocks = 128;
  kv.connector = "nixl";
  t.kv_transfers.push_back(kv);
  t.first_token_ns = 2000030000023;
  t.preemptions.push_back({2000300000029, 2000400000031});
  t.preemptions.push_back({2000900000037, 0});
  t.last_token_ns = 2001000000041;
  t.finished_ns = 2001000300043;
  t.finish_reason = "length";
  t.prompt_tokens = 1000;
  t.generation_tokens = 64;
  t.max_tokens = 64;
  t.has_info = true;
  t.cached_tokens = 0;
  t.external_tokens = 992;
  return t;
}

// Finished with "error" after two failed KV sends (one with a reason, one
// without); a string request id and a label that need escaping; n = 2; a
// label value long enough for a two-byte protobuf length.
inline RequestTimeline FailedTimeline() {
  RequestTimeline t;
  t.request_id = "req-\"\xce\xb1\"\\1\t";
  t.string_id = true;
  t.engine = "vllm";
  t.engine_labels = {
      {"model_name", "m"}, {"engine", "0"}, {"instance", "host-a"}};
  t.request_labels = {{"route", std::string(150, 'r')},
                      {"user", "caf\xc3\xa9"}};
  t.arrived_ns = 3000000000047;
  t.queued_ns = 3000000000047;
  t.scheduled_ns = 3000000700053;
  KvTransfer a;
  a.start_ns = 3000100000059;
  a.end_ns = 3000200000061;
  a.ok = false;
  a.reason = "timeout";
  a.connector = "lmcache";
  t.kv_transfers.push_back(a);
  KvTransfer b;
  b.start_ns = 3000200000067;
  b.end_ns = 3000200000067;  // zero duration: kept
  b.ok = false;
  t.kv_transfers.push_back(b);
  t.finished_ns = 3000300000071;
  t.finish_reason = "error";
  t.prompt_tokens = 9;
  t.n = 2;
  t.has_priority = true;
  t.priority = 2147483647;
  // A bad traceparent (uppercase hex): ignored, a new trace; its
  // tracestate with it.
  t.traceparent = "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01";
  t.tracestate = "vendor=abc";
  return t;
}

// Retired without ARRIVED or FINISHED (evicted): the root runs from the
// earliest to the latest point; decode ends at the last token; the
// preemption never resumed ends at the root's end.
inline RequestTimeline EvictedTimeline() {
  RequestTimeline t;
  t.request_id = "18446744073709551615";
  t.engine = "lmdeploy";
  t.scheduled_ns = 4000000000073;
  t.first_token_ns = 4000000300079;
  t.preemptions.push_back({4000000500083, 0});
  t.last_token_ns = 4000000900089;
  t.generation_tokens = 3;
  t.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
  return t;
}

inline std::vector<RequestTimeline> AllTimelines() {
  return {TypicalTimeline(), DisaggDecodeTimeline(), FailedTimeline(),
          EvictedTimeline()};
}

}  // namespace tokenmeter::daemon::trace::testing

#endif  // TOKENMETER_TESTS_DAEMON_TRACE_TEST_TIMELINES_H_
