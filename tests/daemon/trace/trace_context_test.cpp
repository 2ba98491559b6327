// The W3C trace context of a request: traceparent parsing (table-driven),
// the tracestate rule, the trace randomness and hex ids.
#include "daemon/trace/trace_context.h"

#include <gtest/gtest.h>

#include <string>

namespace tokenmeter::daemon::trace {
namespace {

constexpr const char* kValid =
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

TEST(TraceContextTest, ParsesAValidTraceparent) {
  TraceContext ctx;
  ASSERT_TRUE(ParseTraceparent(kValid, &ctx));
  char trace[32];
  char span[16];
  HexId(ctx.trace_id, trace);
  HexId(ctx.parent_span_id, span);
  EXPECT_EQ(std::string(trace, 32), "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(std::string(span, 16), "b7ad6b7169203331");
  EXPECT_TRUE(ctx.has_parent);
  EXPECT_TRUE(ctx.parent_sampled);
}

TEST(TraceContextTest, SampledFlagIsBitZeroOfTraceFlags) {
  const struct {
    const char* flags;
    bool sampled;
  } cases[] = {{"00", false}, {"01", true},  {"02", false},
               {"03", true},  {"fe", false}, {"ff", true}};
  for (const auto& c : cases) {
    std::string tp = kValid;
    tp.replace(53, 2, c.flags);
    TraceContext ctx;
    ASSERT_TRUE(ParseTraceparent(tp, &ctx)) << tp;
    EXPECT_EQ(ctx.parent_sampled, c.sampled) << c.flags;
  }
}

TEST(TraceContextTest, RejectsInvalidTraceparents) {
  const char* cases[] = {
      "",
      "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  // upper
      "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  // version
      "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      "00-00000000000000000000000000000000-b7ad6b7169203331-01",   // zero id
      "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   // zero id
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",    // short
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-",  // long
      "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // separator
      "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",   // not hex
  };
  for (const char* c : cases) {
    TraceContext ctx;
    ctx.trace_id[0] = 0x42;
    EXPECT_FALSE(ParseTraceparent(c, &ctx)) << c;
    EXPECT_EQ(ctx.trace_id[0], 0x42) << "left untouched: " << c;
    EXPECT_FALSE(ctx.has_parent);
  }
}

TEST(TraceContextTest, ResolveUsesTheTraceparentAndAValidTracestate) {
  RequestTimeline t;
  t.traceparent = kValid;
  t.tracestate = "a=1, b=2";
  CountingIdSource ids;
  TraceContext ctx = ResolveTraceContext(t, ids);
  EXPECT_TRUE(ctx.has_parent);
  EXPECT_EQ(ctx.trace_state, "a=1, b=2");
  EXPECT_EQ(ctx.trace_id[0], 0x0a);
  // No id was drawn.
  EXPECT_EQ(ids.NewTraceId()[15], 1);

  t.tracestate = "=bad";
  ctx = ResolveTraceContext(t, ids);
  EXPECT_TRUE(ctx.has_parent);
  EXPECT_TRUE(ctx.trace_state.empty());
}

TEST(TraceContextTest, ResolveWithoutValidTraceparentDrawsATraceId) {
  RequestTimeline t;
  t.tracestate = "a=1";  // without a traceparent: ignored
  CountingIdSource ids(0x99);
  TraceContext ctx = ResolveTraceContext(t, ids);
  EXPECT_FALSE(ctx.has_parent);
  EXPECT_TRUE(IsZero(ctx.parent_span_id));
  EXPECT_TRUE(ctx.trace_state.empty());
  EXPECT_EQ(ctx.trace_id[7], 0x99);
  EXPECT_EQ(ctx.trace_id[15], 1);

  t.traceparent = "00-xyz";
  ctx = ResolveTraceContext(t, ids);
  EXPECT_FALSE(ctx.has_parent);
  EXPECT_EQ(ctx.trace_id[15], 2);
}

TEST(TraceContextTest, RandomnessIsTheSevenRightmostBytes) {
  TraceId id{};
  for (size_t i = 0; i < 16; ++i) id[i] = uint8_t(0xf0 + i);
  EXPECT_EQ(TraceRandomness(id), 0xf9fafbfcfdfeffULL);
  TraceId zero{};
  EXPECT_EQ(TraceRandomness(zero), 0u);
  TraceId ones;
  ones.fill(0xff);
  EXPECT_EQ(TraceRandomness(ones), (uint64_t(1) << 56) - 1);
}

}  // namespace
}  // namespace tokenmeter::daemon::trace
