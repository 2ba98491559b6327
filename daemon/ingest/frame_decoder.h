// FrameDecoder: turns the byte stream of one ingest connection
// (docs/protocol.md) into HELLO / BATCH / GOODBYE callbacks on an injected
// FrameSink. One decoder per connection; single-threaded.
#ifndef TOKENMETER_DAEMON_INGEST_FRAME_DECODER_H_
#define TOKENMETER_DAEMON_INGEST_FRAME_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "daemon/ingest/decoder_limits.h"
#include "daemon/ingest/event.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

// One decoded BATCH frame.
struct Batch {
  uint64_t seq = 0;
  uint64_t dropped_total = 0;
  std::vector<Event> events;  // only the valid ones, in frame order
  // Storage for STEP spec_accepted_per_pos (see StepStats::pos_begin).
  std::vector<uint64_t> positions;
  // ARRIVED lora / labels params (see Event::extras).
  std::vector<ArrivedExtras> arrivals;
  // Optional fields dropped from the valid events (partial acceptance:
  // ARRIVED params, STEP keys): each counts as one bad_field when its
  // event is applied (Tracker::ApplyBatch(): an event then skipped for its
  // timestamp drops none, as one the decoder skipped drops none).
  uint32_t bad_fields = 0;
  // The valid events that lost fields, in order: their index in `events`
  // and how many fields each lost (the sum is bad_fields).
  struct FieldDrops {
    uint32_t event;
    uint32_t fields;
  };
  std::vector<FieldDrops> field_drops;
};

// Receives what a FrameDecoder decodes (leveldb-style injected reporter).
// Called synchronously from FrameDecoder::Commit()/Feed(); an
// implementation must not call back into the decoder that calls it.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // The connection's HELLO, validated (names, labels, UTF-8). Once.
  virtual void OnHello(const Hello& hello) = 0;
  // One BATCH: its valid events, after one OnEventError() per skipped
  // event. The batch and its string_views are valid during the call only.
  virtual void OnBatch(const Batch& batch) = 0;
  // The client said GOODBYE; any further frame is a kBadFrame error.
  virtual void OnGoodbye() = 0;
  // One event of the current BATCH was skipped; `error` is event level
  // (IsEventLevel(error)).
  virtual void OnEventError(IngestError error) = 0;
};

// Streaming decoder of one connection. Bytes may arrive split anywhere;
// a resumable scanner checks each frame's structure and every limit as the
// bytes arrive (a declared length or count past a limit fails as soon as
// its header is complete), so feeding costs O(bytes) however the stream is
// split, and memory stays at most max_frame_bytes plus a constant. A frame
// is decoded into typed values once it is complete. No allocation per
// event once the Batch vectors have grown to the largest batch seen.
//
// After a frame-level error the decoder is dead: every later call fails,
// and the caller closes the connection (counting error()).
class FrameDecoder {
 public:
  explicit FrameDecoder(const DecoderLimits& limits);
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;
  ~FrameDecoder();

  // Space to read the next bytes into (zero-copy, for a libuv alloc_cb):
  // at least min(max(hint, 1), what max_frame_bytes still allows for the
  // frame in progress) bytes; never more than that allowance. Empty only
  // after a failure. Invalidates any span returned before. May move or grow
  // the buffer (amortised O(1) per byte).
  std::span<char> Prepare(size_t hint);

  // `n` bytes were written at the start of the last Prepare() span. Decodes
  // every frame they complete and reports it to `sink`. Returns true while
  // the connection may go on; false after a frame-level error (error() says
  // which). Frames completed before the bad one have been delivered.
  // n larger than the prepared span is a broken invariant (abort).
  bool Commit(size_t n, FrameSink& sink);

  // Prepare + copy + Commit, for tests and simple callers.
  bool Feed(const void* data, size_t n, FrameSink& sink);

  // The frame-level error; meaningful only when failed().
  IngestError error() const { return error_; }
  bool failed() const { return failed_; }
  // Bytes of an incomplete frame held (0 between frames).
  size_t buffered_bytes() const { return end_ - start_; }
  bool saw_hello() const { return saw_hello_; }
  bool saw_goodbye() const { return saw_goodbye_; }

 private:
  bool Scan(FrameSink& sink);
  bool Deliver(FrameSink& sink);
  bool DecodeHello(const uint8_t* begin, const uint8_t* end, FrameSink& sink);
  bool DecodeBatch(const uint8_t* begin, const uint8_t* end, FrameSink& sink);
  bool Fail(IngestError error);

  const DecoderLimits limits_;

  // Buffer: [start_, end_) holds bytes not yet delivered; scan_ is where
  // the scanner resumes (past end_ while a str/bin/ext payload is
  // pending).
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0;
  size_t start_ = 0;
  size_t end_ = 0;
  size_t scan_ = 0;
  size_t prepared_ = 0;

  // Scanner state for the frame in progress: remaining elements of each
  // open container (a map entry counts 2); max_frame_bytes less the bytes
  // so far and one byte per element to come; the frame's own element count
  // and type.
  std::vector<uint64_t> stack_;
  uint32_t depth_ = 0;
  uint64_t slack_ = 0;
  // The open event's first element (its kind), from start_.
  size_t event_at_ = 0;
  uint64_t frame_elems_ = 0;
  uint64_t frame_type_ = 0;
  bool in_frame_ = false;

  bool saw_hello_ = false;
  bool saw_goodbye_ = false;
  bool failed_ = false;
  IngestError error_ = IngestError::kCount;

  Batch batch_;  // reused for every BATCH
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_FRAME_DECODER_H_
