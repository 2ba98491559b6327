// Where trace and span ids come from: an interface, so that tests get
// predictable ids, with a fast seeded generator for the daemon.
//
// Ids are random as W3C Trace Context Level 2 asks (and OpenTelemetry's
// ratio sampling relies on: it reads the trace id's 7 rightmost bytes as
// its randomness), never all zeros. The generator is xoshiro256++
// (Blackman and Vigna), seeded through splitmix64: not cryptographic, which
// ids need not be; two daemons seeded differently give independent
// streams, so collisions are as likely as for any 128/64-bit random id.
#ifndef TOKENMETER_DAEMON_TRACE_IDS_H_
#define TOKENMETER_DAEMON_TRACE_IDS_H_

#include <cstdint>

#include "daemon/trace/span.h"

namespace tokenmeter::daemon::trace {

class IdSource {
 public:
  virtual ~IdSource() = default;
  // A new trace id, never all zeros.
  virtual TraceId NewTraceId() = 0;
  // A new span id, never all zeros.
  virtual SpanId NewSpanId() = 0;
};

// xoshiro256++ from a 64-bit seed. The caller picks the seed (e.g. from
// std::random_device or getrandom(2) once at start; this room does no
// I/O). A few ns an id; one thread at a time; never fails.
class RandomIdSource final : public IdSource {
 public:
  explicit RandomIdSource(uint64_t seed);

  TraceId NewTraceId() override;
  SpanId NewSpanId() override;
  // The next 64 random bits.
  uint64_t Next();

 private:
  uint64_t s_[4] = {};
};

// Predictable ids for tests and tools: the n-th trace id (n from 1) holds
// `trace_base` in its first 8 bytes and n in its last 8 (big-endian), the
// n-th span id is `span_base + n`. Never zero unless span_base is chosen
// to wrap to it.
class CountingIdSource final : public IdSource {
 public:
  explicit CountingIdSource(uint64_t trace_base = 0, uint64_t span_base = 0)
      : trace_base_(trace_base), span_base_(span_base) {}

  TraceId NewTraceId() override;
  SpanId NewSpanId() override;

 private:
  uint64_t trace_base_;
  uint64_t span_base_;
  uint64_t traces_ = 0;
  uint64_t spans_ = 0;
};

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_IDS_H_
