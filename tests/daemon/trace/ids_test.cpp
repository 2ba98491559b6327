// The id sources: the seeded generator's determinism and spread, the
// counting one's sequence.
#include "daemon/trace/ids.h"

#include <gtest/gtest.h>

#include <set>

namespace tokenmeter::daemon::trace {
namespace {

TEST(IdsTest, RandomIsDeterministicPerSeed) {
  RandomIdSource a(7);
  RandomIdSource b(7);
  RandomIdSource c(8);
  for (int i = 0; i < 100; ++i) {
    const TraceId ta = a.NewTraceId();
    EXPECT_EQ(ta, b.NewTraceId());
    EXPECT_NE(ta, c.NewTraceId());
    const SpanId sa = a.NewSpanId();
    EXPECT_EQ(sa, b.NewSpanId());
    EXPECT_NE(sa, c.NewSpanId());
  }
}

TEST(IdsTest, RandomIdsAreDistinctAndEveryBitVaries) {
  RandomIdSource ids(0);  // seed 0 is a seed like any other
  std::set<TraceId> traces;
  std::set<SpanId> spans;
  TraceId trace_or{};
  TraceId trace_and;
  trace_and.fill(0xff);
  for (int i = 0; i < 10000; ++i) {
    const TraceId t = ids.NewTraceId();
    EXPECT_FALSE(IsZero(t));
    traces.insert(t);
    for (size_t j = 0; j < 16; ++j) {
      trace_or[j] |= t[j];
      trace_and[j] &= t[j];
    }
    const SpanId s = ids.NewSpanId();
    EXPECT_FALSE(IsZero(s));
    spans.insert(s);
  }
  EXPECT_EQ(traces.size(), 10000u);
  EXPECT_EQ(spans.size(), 10000u);
  for (size_t j = 0; j < 16; ++j) {
    EXPECT_EQ(trace_or[j], 0xff) << j;
    EXPECT_EQ(trace_and[j], 0x00) << j;
  }
}

TEST(IdsTest, CountingIdsAreTheDocumentedSequence) {
  CountingIdSource ids(0x0102030405060708ULL, 0x10);
  const TraceId t1 = ids.NewTraceId();
  const TraceId want1 = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(t1, want1);
  EXPECT_EQ(ids.NewTraceId()[15], 2);
  const SpanId s1 = ids.NewSpanId();
  const SpanId want_s1 = {0, 0, 0, 0, 0, 0, 0, 0x11};
  EXPECT_EQ(s1, want_s1);
  EXPECT_EQ(ids.NewSpanId()[7], 0x12);
}

}  // namespace
}  // namespace tokenmeter::daemon::trace
