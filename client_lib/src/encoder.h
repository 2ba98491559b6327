// msgpack encoding of the protocol's frames (docs/protocol.md) from the
// ring's event records. Used only by the sender thread.
#ifndef TOKENMETER_CLIENT_LIB_SRC_ENCODER_H_
#define TOKENMETER_CLIENT_LIB_SRC_ENCODER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "value_table.h"

namespace tokenmeter::client {

// One HELLO cache_config value (protocol 1.1): str, int, float64 or bool.
using CacheConfigValue = std::variant<std::string, int64_t, double, bool>;

struct HelloMeta {
  std::string engine = "tokenmeter-engine";
  std::string model;
  std::string instance;  // empty: not sent
  std::string scope;     // empty: not sent
  std::vector<std::pair<std::string, std::string>> labels;
  // Protocol 1.1 keys.
  std::string profile;  // empty: not sent (the daemon decides)
  // In the order added; empty: not sent.
  std::vector<std::pair<std::string, CacheConfigValue>> cache_config;
  std::optional<int64_t> max_lora;  // nullopt: not sent
  // Picked once per client (client.cpp), repeated on every reconnect;
  // always sent (nonzero once picked).
  uint64_t session = 0;
  bool ack = false;  // sent only when true (needs session)
  int64_t pid = 0;
};

// A growable byte buffer that msgpack-c's packer writes into.
class ByteBuffer {
 public:
  void Append(const void* data, size_t n);
  void Clear() { bytes_.clear(); }
  const uint8_t* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  void Reserve(size_t n) { bytes_.reserve(n); }

 private:
  std::vector<uint8_t> bytes_;
};

// [0, meta]
void EncodeHello(const HelloMeta& meta, ByteBuffer* out);
// [2]
void EncodeGoodbye(ByteBuffer* out);
// The part of a BATCH before its events: [1, seq, dropped_total, <array
// header of n_events>]. The events follow it, back to back.
void EncodeBatchHeader(uint64_t seq, uint64_t dropped_total, uint32_t n_events,
                       ByteBuffer* out);
// Appends one event encoded from the record starting at `record` (a
// non-padding record written by the event functions); a registered value's
// id in the record is written as its string from `values`.
void EncodeEvent(const uint64_t* record, const ValueTable& values,
                 ByteBuffer* out);

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_ENCODER_H_
