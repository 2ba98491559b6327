// Hand-written msgpack for the protocol tests: a str header and its bytes,
// spelled from the msgpack spec (fixstr 0xa0 | len, str8 0xd9, str16 0xda),
// so that no encoder of ours stands between the rules and the decoder.
#ifndef TOKENMETER_TESTS_PROTOCOL_HAND_BYTES_H_
#define TOKENMETER_TESTS_PROTOCOL_HAND_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tokenmeter::daemon {

using Bytes = std::vector<uint8_t>;

// Appends `s` as a msgpack str (at most 65,535 bytes).
inline void Str(Bytes& b, const std::string& s) {
  if (s.size() < 32) {
    b.push_back(uint8_t(0xa0 | s.size()));
  } else if (s.size() < 256) {
    b.push_back(0xd9);
    b.push_back(uint8_t(s.size()));
  } else {
    b.push_back(0xda);
    b.push_back(uint8_t(s.size() >> 8));
    b.push_back(uint8_t(s.size()));
  }
  b.insert(b.end(), s.begin(), s.end());
}

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_TESTS_PROTOCOL_HAND_BYTES_H_
