// KvChannel: the link between the prefill and the decode process of
// `tokenmeter-engine --disaggregate` (docs/engine.md, "Disaggregated
// prefill and decode"): a connected AF_UNIX stream socket carrying framed
// messages, the requests handed over and the bytes of their KV caches.
//
// Frame: a uint32 byte count of what follows, a uint8 message type, then
// the body's fixed-width fields and length-prefixed strings and arrays, all
// in the host's byte order (both ends are the same binary on one host):
//
//   HANDOFF  prefill -> decode  a request whose prompt the prefill side has
//                               computed: id, max_tokens, priority, adapter,
//                               tenant, sampling seed, traceparent, prompt
//   PULL     decode -> prefill  "send blocks [first, first + n) of rid's
//                               prompt" (attempt 1, 2, ...)
//   KV       prefill -> decode  those blocks' records (Model::ReadKvBlocks)
//                               and a checksum of them
//   ACK      decode -> prefill  the KV arrived intact (ok) or not, with a
//                               reason, and whether a retry follows
//   END      prefill -> decode  no more hand-overs
//   REPORT   decode -> prefill  the decode process's --report JSON
//
// Non-blocking: the Send*() calls only append to an outgoing buffer;
// Pump() moves bytes both ways without blocking, Next() hands out each
// complete message, Wait() blocks until there is I/O to do or a deadline.
// Buffers: the outgoing one holds what the peer has not read yet (the KV
// of the pulls being served: each at most one request's prompt); the
// incoming one at most one frame of kMaxKvFrameBytes plus one read.
// A frame over the cap or a malformed body is an error (the peer is our
// own binary: the stream is broken). Not thread-safe: one loop owns it.
#ifndef TOKENMETER_ENGINE_KV_CHANNEL_H_
#define TOKENMETER_ENGINE_KV_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"

namespace tokenmeter::engine {

enum class KvMsgType : uint8_t {
  kHandoff = 1,
  kPull = 2,
  kKv = 3,
  kAck = 4,
  kEnd = 5,
  kReport = 6,
};

// The largest frame either side accepts (a 1 GiB KV message fits).
inline constexpr size_t kMaxKvFrameBytes = size_t(1) << 31;
// Caps inside a frame.
inline constexpr size_t kMaxKvPromptTokens = size_t(1) << 20;
inline constexpr size_t kMaxKvShortString = 64;  // traceparent, reason
inline constexpr size_t kMaxKvReportBytes = size_t(16) << 20;

struct KvHandoff {
  uint64_t rid = 0;
  uint32_t max_tokens = 0;
  int32_t priority = 0;
  bool has_priority = false;
  int32_t lora = -1;
  int32_t tenant = -1;
  uint64_t sampling_seed = 0;
  std::string traceparent;  // "" for none
  std::vector<int32_t> prompt;
};

struct KvPull {
  uint64_t rid = 0;
  uint32_t attempt = 0;  // 1, 2, ...
  uint32_t first_block = 0;
  uint32_t num_blocks = 0;
};

struct KvData {
  uint64_t rid = 0;
  uint32_t attempt = 0;
  uint32_t first_block = 0;
  uint32_t num_blocks = 0;
  uint64_t checksum = 0;  // KvChecksum() of the records as the sender read them
  std::vector<float> data;  // num_blocks block records
};

struct KvAck {
  uint64_t rid = 0;
  uint32_t attempt = 0;
  bool ok = false;
  bool retry = false;  // after a failure: a PULL for the next attempt follows
  std::string reason;  // on failure, e.g. "checksum"
};

// One received message: `type` says which member holds it (KvMsgType::kEnd
// has none; kReport's is `text`).
struct KvMessage {
  KvMsgType type = KvMsgType::kEnd;
  KvHandoff handoff;
  KvPull pull;
  KvData kv;
  KvAck ack;
  std::string text;
};

// A 64-bit checksum of `bytes` bytes (word-wise FNV-1a, then a final mix):
// what a KV message's receiver recomputes. O(bytes).
uint64_t KvChecksum(const void* data, size_t bytes);

class KvChannel {
 public:
  // Takes ownership of `fd`, a connected stream socket, and makes it
  // non-blocking.
  explicit KvChannel(int fd);
  KvChannel(const KvChannel&) = delete;
  KvChannel& operator=(const KvChannel&) = delete;
  ~KvChannel();

  // Append one message to the outgoing buffer (no I/O). SendKv's
  // `checksum` is sent as given, so that a test or the failure injection
  // can send records that do not match it.
  void SendHandoff(const KvHandoff& h);
  void SendPull(const KvPull& p);
  void SendKv(const KvPull& which, const float* data, size_t floats,
              uint64_t checksum);
  void SendAck(const KvAck& a);
  void SendEnd();
  void SendReport(std::string_view json);

  // Writes what the socket takes and (with `read`) reads what it has,
  // without blocking. Fails for a socket error; the peer closing is not an
  // error (closed()).
  Status Pump(bool read = true);
  // The next complete message, if any (*got false: none yet). Fails for a
  // malformed frame.
  Status Next(KvMessage* m, bool* got);
  // Blocks until the socket is readable, or writable while output is
  // pending, or CLOCK_MONOTONIC reaches deadline_ns (0: no deadline);
  // returns at once while a complete message is buffered. Interrupted by a
  // signal: returns early. Fails only for a poll error.
  Status Wait(uint64_t deadline_ns);
  // Blocks until every queued byte is written. Fails when the peer has
  // gone.
  Status Flush();
  // Blocks until the next message arrives. Fails when the peer closes
  // first.
  Status Receive(KvMessage* m);

  // The peer closed its end (after everything it sent was read).
  bool closed() const { return closed_; }
  size_t pending_out() const { return out_.size() - out_pos_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  void BeginFrame(KvMsgType type, size_t body_bytes);
  void Put(const void* p, size_t n);
  template <typename T>
  void PutValue(T v) {
    Put(&v, sizeof v);
  }
  void PutString(std::string_view s);
  // A whole frame is buffered (Next() has something or an error).
  bool HasFrame() const;

  int fd_;
  std::vector<uint8_t> out_;
  size_t out_pos_ = 0;
  std::vector<uint8_t> in_;
  size_t in_pos_ = 0;
  bool closed_ = false;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_KV_CHANNEL_H_
