// BuildSpans() on hand-made timelines: which spans, their times, parents,
// flags, status and every attribute's exact value.
#include "daemon/trace/span_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string>
#include <vector>

#include "test_timelines.h"

namespace tokenmeter::daemon::trace {
namespace {

using testing::kTestOffsetNs;

std::string Render(const Attribute& a) {
  std::string out(a.key_prefix);
  out += a.key;
  out += '=';
  char buf[32];
  switch (a.type) {
    case Attribute::Type::kString:
      return out + "s:" + std::string(a.str);
    case Attribute::Type::kBool:
      return out + (a.bool_value ? "b:true" : "b:false");
    case Attribute::Type::kInt: {
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, a.int_value);
      return out + "i:" + std::string(buf, end);
    }
    case Attribute::Type::kDouble: {
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, a.double_value);
      return out + "d:" + std::string(buf, end);
    }
    case Attribute::Type::kStringArray1:
      return out + "a:" + std::string(a.str);
  }
  return out;
}

std::vector<std::string> Attrs(const SpanBatch& b, size_t span) {
  std::vector<std::string> out;
  for (const Attribute& a : b.AttributesOf(b.spans.at(span))) {
    out.push_back(Render(a));
  }
  return out;
}

std::vector<std::string> Names(const SpanBatch& b) {
  std::vector<std::string> out;
  for (const Span& s : b.spans) out.emplace_back(s.name);
  return out;
}

uint64_t Unix(uint64_t mono) { return mono + uint64_t(kTestOffsetNs); }

// The spans' views point into `t`: keep it alive while reading them.
SpanBatch Build(const RequestTimeline& t, CountingIdSource* ids = nullptr) {
  CountingIdSource own(0xabc, 0x100);
  SpanOptions options;
  options.unix_minus_monotonic_ns = kTestOffsetNs;
  SpanBatch b;
  BuildSpans(t, options, ids ? *ids : own, &b);
  return b;
}

SpanBatch Build(RequestTimeline&& t, CountingIdSource* ids = nullptr) = delete;

SpanId Sid(uint64_t v) {
  SpanId id;
  for (int i = 7; i >= 0; --i, v >>= 8) id[size_t(i)] = uint8_t(v);
  return id;
}

TEST(SpanBuilderTest, TypicalRequestGivesRootAndThreePhases) {
  const RequestTimeline t = testing::TypicalTimeline();
  const SpanBatch b = Build(t);
  ASSERT_EQ(Names(b), (std::vector<std::string>{"llm_request", "queue",
                                                "prefill", "decode"}));
  const Span& root = b.spans[0];
  EXPECT_EQ(root.kind, SpanKind::kServer);
  EXPECT_EQ(root.start_unix_ns, Unix(t.arrived_ns));
  EXPECT_EQ(root.end_unix_ns, Unix(t.finished_ns));
  EXPECT_EQ(root.start_unix_ns, 1767225600123456789ULL);
  EXPECT_EQ(root.status_code, StatusCode::kUnset);
  EXPECT_EQ(Attrs(b, 0),
            (std::vector<std::string>{
                "gen_ai.provider.name=s:vllm",
                "gen_ai.request.model=s:llama-3-8b",
                "gen_ai.request.max_tokens=i:256",
                "gen_ai.usage.input_tokens=i:512",
                "gen_ai.usage.output_tokens=i:200",
                "gen_ai.usage.cache_read.input_tokens=i:128",
                "gen_ai.response.finish_reasons=a:stop",
                "gen_ai.latency.time_in_queue=d:0.049800001",
                "gen_ai.latency.time_to_first_token=d:0.250000003",
                "gen_ai.latency.e2e=d:2.000500011",
                "gen_ai.latency.time_in_model_prefill=d:0.200100002",
                "gen_ai.latency.time_in_model_decode=d:1.750000004",
                "gen_ai.latency.time_in_model_inference=d:1.950100006",
                "tokenmeter.request_id=s:42",
                "tokenmeter.external_tokens=i:0",
                "tokenmeter.preemptions=i:0",
                "tokenmeter.priority=i:-3",
                "tokenmeter.lora=s:sql-adapter",
                "tokenmeter.engine.model_name=s:llama-3-8b",
                "tokenmeter.engine.engine=s:0",
                "tokenmeter.label.tenant=s:acme",
            }));
  // queued -> scheduled, scheduled -> first token, first token -> finished.
  EXPECT_EQ(b.spans[1].start_unix_ns, Unix(t.queued_ns));
  EXPECT_EQ(b.spans[1].end_unix_ns, Unix(t.scheduled_ns));
  EXPECT_EQ(b.spans[2].start_unix_ns, Unix(t.scheduled_ns));
  EXPECT_EQ(b.spans[2].end_unix_ns, Unix(t.first_token_ns));
  EXPECT_EQ(b.spans[3].start_unix_ns, Unix(t.first_token_ns));
  EXPECT_EQ(b.spans[3].end_unix_ns, Unix(t.finished_ns));
  for (size_t i = 1; i < b.spans.size(); ++i) {
    EXPECT_EQ(b.spans[i].kind, SpanKind::kInternal);
    EXPECT_EQ(b.spans[i].parent_span_id, root.span_id);
    EXPECT_EQ(b.spans[i].trace_id, root.trace_id);
    EXPECT_TRUE(Attrs(b, i).empty()) << b.spans[i].name;
  }
}

TEST(SpanBuilderTest, TraceparentGivesTraceIdParentFlagsAndTraceState) {
  const RequestTimeline t = testing::TypicalTimeline();
  const SpanBatch b = Build(t);
  const Span& root = b.spans[0];
  const TraceId want = {0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd,
                        0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c};
  EXPECT_EQ(root.trace_id, want);
  EXPECT_EQ(root.parent_span_id, Sid(0xb7ad6b7169203331ULL));
  EXPECT_EQ(root.flags, 0x301u);
  for (const Span& s : b.spans) {
    EXPECT_EQ(s.trace_state, "vendor=abc,other=x1") << s.name;
    if (&s != &root) {
      EXPECT_EQ(s.flags, 0x101u) << s.name;
    }
  }
  // Span ids from the IdSource, in order, never the parent's.
  EXPECT_EQ(root.span_id, Sid(0x101));
  EXPECT_EQ(b.spans[3].span_id, Sid(0x104));
}

TEST(SpanBuilderTest, WithoutTraceparentANewTraceWithoutParent) {
  CountingIdSource ids(0xabc, 0x100);
  const RequestTimeline t = testing::DisaggDecodeTimeline();
  const SpanBatch b = Build(t, &ids);
  const Span& root = b.spans[0];
  const TraceId want = {0, 0, 0, 0, 0, 0, 0x0a, 0xbc, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(root.trace_id, want);
  EXPECT_TRUE(IsZero(root.parent_span_id));
  EXPECT_EQ(root.flags, 0x101u);
  EXPECT_TRUE(root.trace_state.empty());
}

TEST(SpanBuilderTest, EveryChildKindInOrder) {
  const RequestTimeline t = testing::DisaggDecodeTimeline();
  const SpanBatch b = Build(t);
  ASSERT_EQ(Names(b), (std::vector<std::string>{
                          "llm_request", "queue", "kv_transfer.recv", "prefill",
                          "preempted", "preempted", "decode"}));
  // No QUEUED: the queue starts at ARRIVED.
  EXPECT_EQ(b.spans[1].start_unix_ns, Unix(t.arrived_ns));
  const Span& kv = b.spans[2];
  EXPECT_EQ(kv.start_unix_ns, Unix(t.kv_transfers[0].start_ns));
  EXPECT_EQ(kv.end_unix_ns, Unix(t.kv_transfers[0].end_ns));
  EXPECT_EQ(kv.status_code, StatusCode::kUnset);
  EXPECT_EQ(Attrs(b, 2), (std::vector<std::string>{
                             "tokenmeter.kv.bytes=i:33554432",
                             "tokenmeter.kv.blocks=i:128",
                             "tokenmeter.kv.connector=s:nixl",
                         }));
  // Preempted -> rescheduled; never rescheduled -> FINISHED.
  EXPECT_EQ(b.spans[4].start_unix_ns, Unix(t.preemptions[0].preempted_ns));
  EXPECT_EQ(b.spans[4].end_unix_ns, Unix(t.preemptions[0].resumed_ns));
  EXPECT_EQ(Attrs(b, 4),
            (std::vector<std::string>{"tokenmeter.preemption.resumed=b:true"}));
  EXPECT_EQ(b.spans[5].start_unix_ns, Unix(t.preemptions[1].preempted_ns));
  EXPECT_EQ(b.spans[5].end_unix_ns, Unix(t.finished_ns));
  EXPECT_EQ(
      Attrs(b, 5),
      (std::vector<std::string>{"tokenmeter.preemption.resumed=b:false"}));
  const std::vector<std::string> root = Attrs(b, 0);
  EXPECT_EQ(root, (std::vector<std::string>{
                      "gen_ai.provider.name=s:sglang",
                      "gen_ai.request.model=s:qwen",
                      "gen_ai.request.max_tokens=i:64",
                      "gen_ai.usage.input_tokens=i:1000",
                      "gen_ai.usage.output_tokens=i:64",
                      "gen_ai.usage.cache_read.input_tokens=i:0",
                      "gen_ai.response.finish_reasons=a:length",
                      "gen_ai.latency.time_in_queue=d:0.010000013",
                      "gen_ai.latency.time_to_first_token=d:0.030000023",
                      "gen_ai.latency.e2e=d:1.000300043",
                      "gen_ai.latency.time_in_model_prefill=d:0.02000001",
                      "gen_ai.latency.time_in_model_decode=d:0.970000018",
                      "gen_ai.latency.time_in_model_inference=d:0.990000028",
                      "tokenmeter.request_id=s:7",
                      "tokenmeter.external_tokens=i:992",
                      "tokenmeter.preemptions=i:2",
                      "tokenmeter.engine.model_name=s:qwen",
                      "tokenmeter.engine.engine=s:1",
                  }));
}

TEST(SpanBuilderTest, KvFailureIsErrorWithItsReason) {
  const RequestTimeline t = testing::FailedTimeline();
  const SpanBatch b = Build(t);
  ASSERT_EQ(Names(b),
            (std::vector<std::string>{"llm_request", "queue",
                                      "kv_transfer.send", "kv_transfer.send"}));
  EXPECT_EQ(b.spans[2].status_code, StatusCode::kError);
  EXPECT_EQ(b.spans[2].status_message, "timeout");
  EXPECT_EQ(Attrs(b, 2),
            (std::vector<std::string>{"tokenmeter.kv.connector=s:lmcache",
                                      "error.type=s:timeout"}));
  // No reason: a fixed message and error.type _OTHER; zero duration kept.
  EXPECT_EQ(b.spans[3].status_code, StatusCode::kError);
  EXPECT_EQ(b.spans[3].status_message, "KV transfer failed");
  EXPECT_EQ(Attrs(b, 3), (std::vector<std::string>{"error.type=s:_OTHER"}));
  EXPECT_EQ(b.spans[3].start_unix_ns, b.spans[3].end_unix_ns);
}

TEST(SpanBuilderTest, FinishReasonErrorIsErrorAbortIsNot) {
  RequestTimeline t = testing::FailedTimeline();
  SpanBatch b = Build(t);
  EXPECT_EQ(b.spans[0].status_code, StatusCode::kError);
  EXPECT_EQ(b.spans[0].status_message, "request finished with error");
  const std::vector<std::string> root = Attrs(b, 0);
  EXPECT_EQ(root, (std::vector<std::string>{
                      "gen_ai.provider.name=s:vllm",
                      "gen_ai.request.model=s:m",
                      "gen_ai.request.choice.count=i:2",
                      "gen_ai.usage.input_tokens=i:9",
                      "gen_ai.usage.output_tokens=i:0",
                      "gen_ai.response.finish_reasons=a:error",
                      "gen_ai.latency.time_in_queue=d:0.000700006",
                      "gen_ai.latency.e2e=d:0.300000024",
                      "error.type=s:_OTHER",
                      "tokenmeter.request_id=s:" + t.request_id,
                      "tokenmeter.preemptions=i:0",
                      "tokenmeter.priority=i:2147483647",
                      "tokenmeter.engine.model_name=s:m",
                      "tokenmeter.engine.engine=s:0",
                      "tokenmeter.engine.instance=s:host-a",
                      "tokenmeter.label.route=s:" + std::string(150, 'r'),
                      "tokenmeter.label.user=s:caf\xc3\xa9",
                  }));
  // A restored request: its count, though its preemptions are not listed.
  t.preemption_count = 2;
  const std::vector<std::string> restored = Attrs(Build(t), 0);
  EXPECT_NE(
      std::find(restored.begin(), restored.end(), "tokenmeter.preemptions=i:2"),
      restored.end());
  t.preemption_count = 0;
  t.finish_reason = "abort";
  b = Build(t);
  EXPECT_EQ(b.spans[0].status_code, StatusCode::kUnset);
  EXPECT_TRUE(b.spans[0].status_message.empty());
  for (const std::string& a : Attrs(b, 0)) {
    EXPECT_NE(a.rfind("error.type", 0), 0u) << a;
  }
}

TEST(SpanBuilderTest, InvalidTraceparentStartsANewTraceAndDropsTracestate) {
  CountingIdSource ids(0x77, 0);
  const RequestTimeline t = testing::FailedTimeline();
  const SpanBatch b = Build(t, &ids);
  const TraceId want = {0, 0, 0, 0, 0, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(b.spans[0].trace_id, want);
  EXPECT_TRUE(IsZero(b.spans[0].parent_span_id));
  EXPECT_EQ(b.spans[0].flags, 0x101u);
  for (const Span& s : b.spans) EXPECT_TRUE(s.trace_state.empty());
}

TEST(SpanBuilderTest, InvalidTracestateIsDroppedValidTraceparentKept) {
  RequestTimeline t = testing::TypicalTimeline();
  t.tracestate = "Bad Key=1";
  const SpanBatch b = Build(t);
  EXPECT_EQ(b.spans[0].flags, 0x301u);
  EXPECT_EQ(b.spans[0].parent_span_id, Sid(0xb7ad6b7169203331ULL));
  for (const Span& s : b.spans) EXPECT_TRUE(s.trace_state.empty());
}

TEST(SpanBuilderTest, EvictedRequestSpansItsKnownPoints) {
  const RequestTimeline t = testing::EvictedTimeline();
  const SpanBatch b = Build(t);
  ASSERT_EQ(Names(b), (std::vector<std::string>{"llm_request", "prefill",
                                                "preempted", "decode"}));
  // Root: earliest point to latest point.
  EXPECT_EQ(b.spans[0].start_unix_ns, Unix(t.scheduled_ns));
  EXPECT_EQ(b.spans[0].end_unix_ns, Unix(t.last_token_ns));
  // Never resumed, no FINISHED: to the root's end. Decode to the last token.
  EXPECT_EQ(b.spans[2].end_unix_ns, Unix(t.last_token_ns));
  EXPECT_EQ(b.spans[3].start_unix_ns, Unix(t.first_token_ns));
  EXPECT_EQ(b.spans[3].end_unix_ns, Unix(t.last_token_ns));
  EXPECT_EQ(Attrs(b, 0),
            (std::vector<std::string>{
                "gen_ai.provider.name=s:lmdeploy",
                "gen_ai.usage.output_tokens=i:3",
                "gen_ai.latency.time_in_model_prefill=d:0.000300006",
                "gen_ai.latency.time_in_model_decode=d:0.00060001",
                "gen_ai.latency.time_in_model_inference=d:0.000900016",
                "tokenmeter.request_id=s:18446744073709551615",
                "tokenmeter.preemptions=i:1",
                "tokenmeter.evicted=b:true",
            }));
  // An unsampled parent still parents the spans (sampling is separate).
  EXPECT_EQ(b.spans[0].flags, 0x301u);
}

TEST(SpanBuilderTest, MissingPointsLeaveChildrenOut) {
  RequestTimeline t;
  t.request_id = "1";
  t.arrived_ns = 100;
  t.finished_ns = 900;
  t.finish_reason = "abort";
  SpanBatch b = Build(t);
  EXPECT_EQ(Names(b), (std::vector<std::string>{"llm_request"}));
  EXPECT_EQ(Attrs(b, 0), (std::vector<std::string>{
                             "gen_ai.usage.input_tokens=i:0",
                             "gen_ai.usage.output_tokens=i:0",
                             "gen_ai.response.finish_reasons=a:abort",
                             "gen_ai.latency.e2e=d:8e-07",
                             "tokenmeter.request_id=s:1",
                             "tokenmeter.preemptions=i:0",
                         }));
  // Scheduled but no token: queue only.
  t.scheduled_ns = 300;
  b = Build(t);
  EXPECT_EQ(Names(b), (std::vector<std::string>{"llm_request", "queue"}));
  // A first token but no SCHEDULED: decode only.
  t.scheduled_ns = 0;
  t.first_token_ns = 500;
  b = Build(t);
  EXPECT_EQ(Names(b), (std::vector<std::string>{"llm_request", "decode"}));
  // A KV transfer without its start: left out.
  KvTransfer kv;
  kv.end_ns = 400;
  t.kv_transfers.push_back(kv);
  b = Build(t);
  EXPECT_EQ(Names(b), (std::vector<std::string>{"llm_request", "decode"}));
}

TEST(SpanBuilderTest, InvertedChildIsLeftOutNeverNegative) {
  RequestTimeline t;
  t.request_id = "1";
  t.arrived_ns = 1000;
  t.queued_ns = 2000;
  t.scheduled_ns = 1500;    // before QUEUED
  t.first_token_ns = 1400;  // before SCHEDULED
  t.last_token_ns = 3000;
  t.finished_ns = 3000;
  t.preemptions.push_back({2500, 2400});  // resumed before preempted
  t.finish_reason = "stop";
  const SpanBatch b = Build(t);
  EXPECT_EQ(Names(b), (std::vector<std::string>{"llm_request", "decode"}));
  for (const Span& s : b.spans) EXPECT_LE(s.start_unix_ns, s.end_unix_ns);
  for (const std::string& a : Attrs(b, 0)) {
    EXPECT_NE(a.rfind("gen_ai.latency.time_in_queue", 0), 0u);
    EXPECT_NE(a.rfind("gen_ai.latency.time_in_model_prefill", 0), 0u);
  }
}

TEST(SpanBuilderTest, RootEndBeforeStartIsClampedToZeroLength) {
  RequestTimeline t;
  t.request_id = "1";
  t.arrived_ns = 5000;
  t.finished_ns = 4000;
  t.finish_reason = "stop";
  const SpanBatch b = Build(t);
  ASSERT_EQ(b.spans.size(), 1u);
  EXPECT_EQ(b.spans[0].start_unix_ns, Unix(5000));
  EXPECT_EQ(b.spans[0].end_unix_ns, Unix(5000));
  for (const std::string& a : Attrs(b, 0)) {
    EXPECT_NE(a.rfind("gen_ai.latency.e2e", 0), 0u);
  }
}

TEST(SpanBuilderTest, NoTimePointGivesNoSpan) {
  RequestTimeline t;
  t.request_id = "1";
  SpanBatch b;
  CountingIdSource ids;
  EXPECT_EQ(BuildSpans(t, SpanOptions(), ids, &b), 0u);
  EXPECT_TRUE(b.spans.empty());
  EXPECT_TRUE(b.attributes.empty());
  EXPECT_FALSE(RootExtent(t).valid);
}

TEST(SpanBuilderTest, ChoiceCountAndMaxTokensOnlyWhenMeaningful) {
  RequestTimeline t;
  t.request_id = "1";
  t.arrived_ns = 1;
  for (uint32_t n : {0u, 1u}) {
    t.n = n;
    const SpanBatch b = Build(t);
    for (const std::string& a : Attrs(b, 0)) {
      EXPECT_NE(a.rfind("gen_ai.request.choice.count", 0), 0u) << n;
      EXPECT_NE(a.rfind("gen_ai.request.max_tokens", 0), 0u) << n;
    }
  }
}

TEST(SpanBuilderTest, BatchAppendsRequestsWithTheirOwnAttributes) {
  CountingIdSource ids;
  SpanBatch b;
  SpanOptions options;
  const RequestTimeline typical = testing::TypicalTimeline();
  const RequestTimeline disagg = testing::DisaggDecodeTimeline();
  EXPECT_EQ(BuildSpans(typical, options, ids, &b), 4u);
  EXPECT_EQ(BuildSpans(disagg, options, ids, &b), 7u);
  ASSERT_EQ(b.spans.size(), 11u);
  EXPECT_EQ(b.spans[4].name, "llm_request");
  EXPECT_EQ(b.spans[4].attributes_begin, b.spans[3].attributes_end);
  EXPECT_EQ(b.spans.back().attributes_end, b.attributes.size());
  std::set<SpanId> span_ids;
  for (const Span& s : b.spans) {
    EXPECT_FALSE(IsZero(s.span_id));
    span_ids.insert(s.span_id);
  }
  EXPECT_EQ(span_ids.size(), b.spans.size());
  EXPECT_NE(b.spans[0].trace_id, b.spans[4].trace_id);
  b.Clear();
  EXPECT_TRUE(b.spans.empty() && b.attributes.empty());
}

TEST(SpanBuilderTest, ExplicitContextIsUsed) {
  const RequestTimeline t = testing::DisaggDecodeTimeline();
  TraceContext ctx;
  ASSERT_TRUE(ParseTraceparent(
      "00-11111111111111111111111111111111-2222222222222222-01", &ctx));
  CountingIdSource ids;
  SpanBatch b;
  BuildSpans(t, ctx, SpanOptions(), ids, &b);
  EXPECT_EQ(b.spans[0].trace_id[15], 0x11);
  EXPECT_EQ(b.spans[0].parent_span_id, Sid(0x2222222222222222ULL));
  // No trace id drawn: the first span id is the IdSource's first.
  EXPECT_EQ(b.spans[0].span_id, Sid(1));
}

TEST(SpanBuilderTest, ToUnixNsAddsTheOffsetAndClampsAtZero) {
  EXPECT_EQ(ToUnixNs(5, 10), 15u);
  EXPECT_EQ(ToUnixNs(15, -10), 5u);
  EXPECT_EQ(ToUnixNs(10, -10), 0u);
  EXPECT_EQ(ToUnixNs(5, -10), 0u);
  EXPECT_EQ(ToUnixNs(5, INT64_MIN), 0u);
  EXPECT_EQ(ToUnixNs(uint64_t(INT64_MAX) + 10, INT64_MIN), 9u);
  EXPECT_EQ(UnixMinusMonotonicNs(1767225600000000000ULL, 1000),
            1767225599999999000LL);
  EXPECT_EQ(UnixMinusMonotonicNs(1000, 3000), -2000);
}

TEST(SpanBuilderTest, RandomIdsAreUniqueAndNonZero) {
  RandomIdSource ids(12345);
  const RequestTimeline t = testing::DisaggDecodeTimeline();
  SpanBatch b;
  std::set<TraceId> traces;
  std::set<SpanId> spans;
  for (int i = 0; i < 1000; ++i) {
    b.Clear();
    BuildSpans(t, SpanOptions(), ids, &b);
    traces.insert(b.spans[0].trace_id);
    for (const Span& s : b.spans) spans.insert(s.span_id);
  }
  EXPECT_EQ(traces.size(), 1000u);
  EXPECT_EQ(spans.size(), 7000u);
}

}  // namespace
}  // namespace tokenmeter::daemon::trace
