// The protobuf wire format, written by hand (no generated code, no
// libprotobuf): what the OTLP encoders (daemon/trace/otlp_trace_encoder,
// daemon/otlp_metrics/otlp_metrics_encoder) share. Every tag here is one
// byte (field numbers below 16).
//
// The Put*() writers write at p, into room the caller made from the exact
// sizes (the *Size() functions), and return the end of what they wrote: no
// bounds check, no allocation, one pass. AppendExact() makes that room and
// aborts if a writer's bytes and the size it was given disagree (a broken
// invariant: the output would be garbage). The std::string* appenders grow
// the string as they go. Pure functions; any thread.
#ifndef TOKENMETER_DAEMON_BASE_PROTO_WIRE_H_
#define TOKENMETER_DAEMON_BASE_PROTO_WIRE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace tokenmeter::daemon::proto_wire {

inline constexpr uint32_t kVarint = 0;
inline constexpr uint32_t kFixed64 = 1;
inline constexpr uint32_t kLen = 2;
inline constexpr uint32_t kFixed32 = 5;

// The one-byte tag of `field` (< 16) with wire type `wire`.
constexpr uint8_t Tag1(uint32_t field, uint32_t wire) {
  return uint8_t(field << 3 | wire);
}

inline size_t VarintSize(uint64_t v) {
  return size_t(std::bit_width(v | 1) + 6) / 7;
}

// A length-delimited field of a one-byte tag holding n bytes.
inline size_t LenFieldSize(size_t n) { return 1 + VarintSize(n) + n; }

// sint32 / sint64 (ZigZag) as the varint's value.
inline uint64_t ZigZag32(int32_t v) {
  return uint32_t((uint32_t(v) << 1) ^ uint32_t(v >> 31));
}
inline uint64_t ZigZag64(int64_t v) {
  return (uint64_t(v) << 1) ^ uint64_t(v >> 63);
}

inline char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = char(v | 0x80);
    v >>= 7;
  }
  *p++ = char(v);
  return p;
}

inline char* PutRaw(char* p, const void* data, size_t n) {
  if (n) std::memcpy(p, data, n);
  return p + n;
}

inline char* PutVarintField(char* p, uint32_t field, uint64_t v) {
  *p++ = char(Tag1(field, kVarint));
  return PutVarint(p, v);
}

// Eight little-endian bytes (fixed64, sfixed64).
inline char* PutFixed64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) *p++ = char(v >> (8 * i));
  return p;
}

inline char* PutFixed64Field(char* p, uint32_t field, uint64_t v) {
  *p++ = char(Tag1(field, kFixed64));
  return PutFixed64(p, v);
}

inline char* PutDoubleField(char* p, uint32_t field, double v) {
  return PutFixed64Field(p, field, std::bit_cast<uint64_t>(v));
}

// A length-delimited field holding a followed by b.
inline char* PutLenField(char* p, uint32_t field, std::string_view a,
                         std::string_view b = {}) {
  *p++ = char(Tag1(field, kLen));
  p = PutVarint(p, a.size() + b.size());
  p = PutRaw(p, a.data(), a.size());
  return PutRaw(p, b.data(), b.size());
}

inline char* PutLenField(char* p, uint32_t field, const uint8_t* data,
                         size_t n) {
  return PutLenField(p, field,
                     std::string_view(reinterpret_cast<const char*>(data), n));
}

// A nested message's (or packed field's) tag and length; its body follows.
inline char* PutMessageHeader(char* p, uint32_t field, size_t body) {
  *p++ = char(Tag1(field, kLen));
  return PutVarint(p, body);
}

// Appends bytes made by `put`, exactly `n` of them, to *out.
template <typename Put>
void AppendExact(std::string* out, size_t n, Put put) {
  const size_t old = out->size();
  out->resize(old + n);
  char* const begin = out->data() + old;
  [[maybe_unused]] char* const end = put(begin);
  // The sizes and the writers agree, or the output is garbage: abort.
  if (size_t(end - begin) != n) std::abort();
}

inline void Varint(std::string* out, uint64_t v) {
  char buf[10];
  out->append(buf, size_t(PutVarint(buf, v) - buf));
}

// A length-delimited field holding `v`, appended.
inline void BytesField(std::string* out, uint32_t field, std::string_view v) {
  out->push_back(char(Tag1(field, kLen)));
  Varint(out, v.size());
  out->append(v);
}

}  // namespace tokenmeter::daemon::proto_wire

#endif  // TOKENMETER_DAEMON_BASE_PROTO_WIRE_H_
