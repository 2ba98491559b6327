// Ingest frames written by hand from docs/protocol.md ("Worked bytes"), for
// tests that drive the daemon through a raw socket. Nothing here comes from
// an encoder of ours: every msgpack header byte is spelled out.
#ifndef TOKENMETER_TESTS_TESTUTIL_FRAMES_H_
#define TOKENMETER_TESTS_TESTUTIL_FRAMES_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace tokenmeter::testutil {

using Bytes = std::vector<uint8_t>;

inline Bytes Cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// HELLO [0, {"proto": 1, "engine": "vllm", "model": "m"}]: series
// vllm:*{model_name="m",engine="0"}.
inline Bytes VllmHello() {
  return {
      0x92, 0x00, 0x83,                            // array(2), 0, map(3)
      0xa5, 'p',  'r',  'o', 't', 'o', 0x01,       // "proto": 1
      0xa6, 'e',  'n',  'g', 'i', 'n', 'e',        // "engine":
      0xa4, 'v',  'l',  'l', 'm',                  //   "vllm"
      0xa5, 'm',  'o',  'd', 'e', 'l', 0xa1, 'm',  // "model": "m"
  };
}

// BATCH [1, seq, 0, [[4, t_ns, rid, n]]]: one TOKENS event, t as uint64
// (0xcf), seq, rid and n positive fixints (< 128).
inline Bytes TokensBatch(uint8_t seq, uint64_t t_ns, uint8_t rid, uint8_t n) {
  Bytes b = {0x94, 0x01, seq, 0x00, 0x91, 0x94, 0x04, 0xcf};
  for (int shift = 56; shift >= 0; shift -= 8) {
    b.push_back(uint8_t(t_ns >> shift));
  }
  b.push_back(rid);
  b.push_back(n);
  return b;
}

// 0xc1 is never used in msgpack: invalid_msgpack.
inline Bytes InvalidMsgpack() { return {0xc1}; }

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_TESTUTIL_FRAMES_H_
