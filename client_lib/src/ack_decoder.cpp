#include "ack_decoder.h"

#include "tokenmeter/protocol.h"

namespace tokenmeter::client {
namespace {

constexpr uint8_t kNil = 0xc0;

// The frame's length from its third byte (the seq's first), or 0 when that
// byte starts neither an unsigned integer nor nil.
size_t FrameLength(uint8_t seq_tag) {
  if (seq_tag <= 0x7f || seq_tag == kNil) return 3;
  switch (seq_tag) {
    case 0xcc:
      return 4;
    case 0xcd:
      return 5;
    case 0xce:
      return 7;
    case 0xcf:
      return 11;
    default:
      return 0;
  }
}

}  // namespace

bool AckDecoder::Feed(const uint8_t* data, size_t n, uint64_t* acked,
                      bool* any) {
  *any = false;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = data[i];
    if (have_ == 0 && b != 0x92) return false;  // fixarray of 2
    if (have_ == 1 && b != TM_FRAME_ACK) return false;
    frame_[have_++] = b;
    if (have_ < 3) continue;
    const size_t len = FrameLength(frame_[2]);
    if (len == 0) return false;
    if (have_ < len) continue;
    have_ = 0;
    ++frames_;
    if (frame_[2] == kNil) continue;  // the answer "nothing applied yet"
    uint64_t seq = len == 3 ? frame_[2] : 0;
    for (size_t k = 3; k < len; ++k) seq = seq << 8 | frame_[k];
    if (!*any || seq > *acked) *acked = seq;
    *any = true;
  }
  return true;
}

}  // namespace tokenmeter::client
