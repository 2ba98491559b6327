#include "ack_decoder.h"

#include "tokenmeter/protocol.h"

namespace tokenmeter::client {
namespace {

constexpr uint8_t kNil = 0xc0;

enum class Parse { kNeedMore, kBad, kDone };

// The big-endian unsigned number in p[0..size).
uint64_t BigEndian(const uint8_t* p, size_t size) {
  uint64_t v = 0;
  for (size_t i = 0; i < size; ++i) v = v << 8 | p[i];
  return v;
}

// The element at p[0..n): a non-negative integer in any msgpack form
// (positive fixint, uint 8/16/32/64, int 8/16/32/64 holding a value >= 0),
// or nil where `nil_ok`. kDone with *used, *value and *nil set.
Parse Integer(const uint8_t* p, size_t n, bool nil_ok, size_t* used,
              uint64_t* value, bool* nil) {
  if (n == 0) return Parse::kNeedMore;
  const uint8_t tag = p[0];
  *nil = false;
  if (tag <= 0x7f) {
    *used = 1;
    *value = tag;
    return Parse::kDone;
  }
  if (tag == kNil) {
    if (!nil_ok) return Parse::kBad;
    *used = 1;
    *nil = true;
    return Parse::kDone;
  }
  // uint 8/16/32/64 (0xcc..0xcf) and int 8/16/32/64 (0xd0..0xd3): 1 << k
  // bytes; anything else (a negative fixint, a float, a string) is no
  // seq.
  const bool is_signed = tag >= 0xd0 && tag <= 0xd3;
  if (!is_signed && (tag < 0xcc || tag > 0xcf)) return Parse::kBad;
  const size_t size = size_t{1} << (tag & 0x03);
  // A signed form's sign bit is its first byte's top bit.
  if (is_signed && n > 1 && (p[1] & 0x80) != 0) return Parse::kBad;
  if (n < 1 + size) return Parse::kNeedMore;
  *used = 1 + size;
  *value = BigEndian(p + 1, size);
  return Parse::kDone;
}

// One [3, seq] frame at the start of p[0..n).
Parse Frame(const uint8_t* p, size_t n, size_t* used, uint64_t* seq,
            bool* nil) {
  if (n == 0) return Parse::kNeedMore;
  // The array header: fixarray, array 16 or array 32 of 2 elements.
  size_t at = 0;
  if (p[0] == 0x92) {
    at = 1;
  } else if (p[0] == 0xdc || p[0] == 0xdd) {
    const size_t size = p[0] == 0xdc ? 2 : 4;
    for (size_t i = 1; i <= size && i < n; ++i) {
      const uint8_t want = i == size ? 2 : 0;
      if (p[i] != want) return Parse::kBad;
    }
    if (n < 1 + size) return Parse::kNeedMore;
    at = 1 + size;
  } else {
    return Parse::kBad;
  }
  size_t type_size = 0;
  uint64_t type = 0;
  bool type_nil = false;
  Parse r = Integer(p + at, n - at, false, &type_size, &type, &type_nil);
  if (r != Parse::kDone) return r;
  if (type != TM_FRAME_ACK) return Parse::kBad;
  at += type_size;
  size_t seq_size = 0;
  r = Integer(p + at, n - at, true, &seq_size, seq, nil);
  if (r != Parse::kDone) return r;
  *used = at + seq_size;
  return Parse::kDone;
}

}  // namespace

bool AckDecoder::Feed(const uint8_t* data, size_t n, uint64_t* acked,
                      bool* any) {
  *any = false;
  for (size_t i = 0; i < n; ++i) {
    frame_[have_++] = data[i];
    size_t used = 0;
    uint64_t seq = 0;
    bool nil = false;
    const Parse r = Frame(frame_, have_, &used, &seq, &nil);
    if (r == Parse::kBad) return false;
    if (r == Parse::kNeedMore) continue;
    have_ = 0;
    ++frames_;
    if (nil) continue;  // the answer "nothing applied yet"
    if (!*any || seq > *acked) *acked = seq;
    *any = true;
  }
  return true;
}

}  // namespace tokenmeter::client
