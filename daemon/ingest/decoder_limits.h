// The frame decoder's options: what one ingest connection may send.
#ifndef TOKENMETER_DAEMON_INGEST_DECODER_LIMITS_H_
#define TOKENMETER_DAEMON_INGEST_DECODER_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

// Bounds on what one connection may send. A frame breaking one of them is a
// frame-level error (the connection is closed), except max_rid_bytes and
// max_spec_positions, which only invalidate the one event. max_frame_bytes
// must be at least 1 (the constructor aborts otherwise).
struct DecoderLimits {
  size_t max_frame_bytes = TM_MAX_FRAME_BYTES;  // encoded size of one frame
  uint32_t max_batch_events = TM_MAX_BATCH_EVENTS;
  uint32_t max_string_bytes = TM_MAX_STRING_BYTES;  // any str, bin or ext
  uint32_t max_rid_bytes = TM_MAX_RID_BYTES;        // a string request id
  uint32_t max_depth = 32;  // open arrays/maps, the frame itself counts 1
  uint32_t max_spec_positions = 64;  // STEP spec_accepted_per_pos length
  uint32_t max_hello_labels = TM_MAX_HELLO_LABELS;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_DECODER_LIMITS_H_
