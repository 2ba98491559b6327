// Decodes what the daemon sends a client that asked for ACKs (protocol
// 1.1): back-to-back [3, seq] frames, split across reads anywhere. Any
// msgpack form of them is read, as a general msgpack decoder would: the
// array a fixarray, array 16 or array 32 of 2 elements; the type and seq
// integers a positive fixint, uint 8/16/32/64 or int 8/16/32/64 holding a
// value >= 0; seq also nil (the answer to HELLO of a daemon that has
// applied nothing of the session, protocol 1.2 "ACK at HELLO"). Anything
// else is a protocol violation. Sender thread only; no allocation; each
// byte re-reads the partial frame (at most kMaxFrameBytes).
#ifndef TOKENMETER_CLIENT_LIB_SRC_ACK_DECODER_H_
#define TOKENMETER_CLIENT_LIB_SRC_ACK_DECODER_H_

#include <cstddef>
#include <cstdint>

namespace tokenmeter::client {

class AckDecoder {
 public:
  // Feeds `n` inbound bytes. Returns false on a byte that cannot begin or
  // continue an ACK frame (the decoder is then in an undefined state:
  // Reset() it with the new connection). Sets *acked to the highest seq of
  // the frames these bytes completed (before a bad byte, if any) and *any
  // to whether there was one; a [3, nil] frame carries none.
  bool Feed(const uint8_t* data, size_t n, uint64_t* acked, bool* any);
  // Forgets a partial frame and the frames counted (a new connection).
  void Reset() {
    have_ = 0;
    frames_ = 0;
  }
  // Complete frames decoded since Reset(), [3, nil] included: the first
  // one on a connection is the daemon's answer to HELLO.
  uint64_t frames() const { return frames_; }

  // The longest ACK: array 32 (5 bytes), then the type and the seq each
  // as an int 64 or uint 64 (9 bytes).
  static constexpr size_t kMaxFrameBytes = 23;

 private:
  uint8_t frame_[kMaxFrameBytes] = {};
  size_t have_ = 0;
  uint64_t frames_ = 0;
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_ACK_DECODER_H_
