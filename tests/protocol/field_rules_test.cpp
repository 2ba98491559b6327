// The protocol 1.2 field rules of protocol.h, applied by both sides: for
// every candidate reason, connector, traceparent and tracestate, and for
// KV_TRANSFER bytes, the client call accepts the value exactly when the
// daemon's FrameDecoder keeps it (no bad_event, no bad_field). Event bytes
// are written by hand from docs/protocol.md (no encoder of ours); the
// candidates are edge cases and seeded random strings.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "daemon/ingest/frame_decoder.h"
#include "tests/protocol/hand_bytes.h"
#include "tokenmeter/protocol.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::daemon {
namespace {

void Uint64(Bytes& b, uint64_t v) {
  b.push_back(0xcf);
  for (int i = 7; i >= 0; --i) b.push_back(uint8_t(v >> (8 * i)));
}

// [0, {"proto":1,"engine":"e","model":"m"}]
const Bytes kHello = {0x92, 0x00, 0x83, 0xa5, 'p', 'r', 'o', 't',  'o',
                      0x01, 0xa6, 'e',  'n',  'g', 'i', 'n', 'e',  0xa1,
                      'e',  0xa5, 'm',  'o',  'd', 'e', 'l', 0xa1, 'm'};

struct Sink : FrameSink {
  void OnHello(const Hello&) override {}
  void OnBatch(const Batch& b) override {
    events += b.events.size();
    bad_fields += b.bad_fields;
  }
  void OnGoodbye() override {}
  void OnEventError(IngestError) override { ++errors; }
  size_t events = 0;
  uint32_t bad_fields = 0;
  int errors = 0;
};

// Whether the daemon keeps `event` whole: applied, nothing dropped. A
// string limit of 1024 lets the field rules, not the frame limit, judge.
bool DaemonKeeps(const Bytes& event) {
  Bytes frame = kHello;
  const Bytes head = {0x94, 0x01, 0x00, 0x00, 0x91};
  frame.insert(frame.end(), head.begin(), head.end());
  frame.insert(frame.end(), event.begin(), event.end());
  DecoderLimits limits;
  limits.max_string_bytes = 1024;
  FrameDecoder d{limits};
  Sink sink;
  EXPECT_TRUE(d.Feed(frame.data(), frame.size(), sink));
  return sink.events == 1 && sink.errors == 0 && sink.bad_fields == 0;
}

class FieldRules : public ::testing::Test {
 protected:
  void SetUp() override {
    tm_options* o = tm_options_new();
    ASSERT_NE(o, nullptr);
    ASSERT_EQ(tm_options_set_socket_path(o, "/nonexistent/field-rules.sock"),
              TM_OK);
    ASSERT_EQ(tm_options_set_model(o, "m"), TM_OK);
    ASSERT_EQ(tm_client_new(o, &client_), TM_OK);
    tm_options_free(o);
  }
  void TearDown() override { tm_client_close(client_, nullptr, 0); }

  bool ClientAcceptsReason(const std::string& reason) {
    return tm_admission_rejected(client_, 1000, reason.c_str()) == TM_OK;
  }
  bool ClientAcceptsConnector(const std::string& connector) {
    tm_kv_transfer_info info = TM_KV_TRANSFER_INFO_INIT;
    info.start_ns = 1;
    info.connector = connector.c_str();
    return tm_kv_transfer(client_, 1000, 7, &info) == TM_OK;
  }
  bool ClientAcceptsBytes(uint64_t bytes) {
    tm_kv_transfer_info info = TM_KV_TRANSFER_INFO_INIT;
    info.start_ns = 1;
    info.bytes = bytes;
    return tm_kv_transfer(client_, 1000, 7, &info) == TM_OK;
  }
  // Whether the client sends both trace strings: one that breaks its rule
  // is left out (counted in TM_STAT_FIELDS_DROPPED), the ARRIVED sent all
  // the same (or dropped for a full buffer, which counts the fields too).
  bool ClientAcceptsTrace(const std::string& parent, const std::string& state) {
    tm_request_params p = TM_REQUEST_PARAMS_INIT;
    p.traceparent = parent.c_str();
    p.tracestate = state.c_str();
    const uint64_t before = FieldsDropped();
    const int rc = tm_arrived_params(client_, 1000, 7, 10, &p);
    EXPECT_TRUE(rc == TM_OK || rc == TM_E_DROPPED) << rc;
    return FieldsDropped() == before;
  }
  uint64_t FieldsDropped() const {
    uint64_t s[TM_STAT_COUNT] = {};
    EXPECT_EQ(tm_client_stats(client_, s, TM_STAT_COUNT), TM_OK);
    return s[TM_STAT_FIELDS_DROPPED];
  }

  tm_client* client_ = nullptr;
};

// [9, 1000, reason]
Bytes Rejection(const std::string& reason) {
  Bytes b = {0x93, 0x09, 0xcd, 0x03, 0xe8};
  Str(b, reason);
  return b;
}

// [10, 1000, 7, {"role": "send", "start": 1, key: value}]
Bytes KvWith(const std::string& key, const Bytes& value) {
  Bytes b = {0x94, 0x0a, 0xcd, 0x03, 0xe8, 0x07, 0x83};
  Str(b, "role");
  Str(b, "send");
  Str(b, "start");
  b.push_back(0x01);
  Str(b, key);
  b.insert(b.end(), value.begin(), value.end());
  return b;
}

// [1, 1000, 7, 10, {"traceparent": p, "tracestate": s}]
Bytes ArrivedWithTrace(const std::string& parent, const std::string& state) {
  Bytes b = {0x95, 0x01, 0xcd, 0x03, 0xe8, 0x07, 0x0a, 0x82};
  Str(b, "traceparent");
  Str(b, parent);
  Str(b, "tracestate");
  Str(b, state);
  return b;
}

std::vector<std::string> LabelValueCandidates() {
  std::vector<std::string> c = {"a",
                                "queue_full",
                                std::string(64, 'x'),
                                std::string(65, 'x'),
                                "a b",
                                "a\tb",
                                "a\nb",
                                "\x7f",
                                "\xc2\x85",
                                "\xc2\xa0",
                                "\xc3\x28",
                                "\xe2\x80\xa8",
                                "\xf0\x9f\x98\x80",
                                "\xed\xa0\x80",
                                "caf\xc3\xa9"};
  std::mt19937 rng(29);
  const std::string alphabet = std::string("az09_- \t\n\x01\x7f") +
                               "\xc2\x80\x9f\xa0\xc3\xe2\xed\xf0\xff";
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int n = int(rng() % 70);
    for (int j = 0; j < n; ++j) s += alphabet[rng() % alphabet.size()];
    c.push_back(s);
  }
  return c;
}

TEST_F(FieldRules, AdmissionReasonsAgree) {
  for (const std::string& r : LabelValueCandidates()) {
    // The C call takes a NUL-terminated string: no embedded NUL here.
    EXPECT_EQ(ClientAcceptsReason(r), DaemonKeeps(Rejection(r))) << r;
  }
}

TEST_F(FieldRules, KvConnectorsAgree) {
  for (const std::string& c : LabelValueCandidates()) {
    if (c.empty()) continue;  // "" means none to the client
    Bytes v;
    Str(v, c);
    EXPECT_EQ(ClientAcceptsConnector(c), DaemonKeeps(KvWith("connector", v)))
        << c;
  }
}

TEST_F(FieldRules, KvBytesAgree) {
  for (uint64_t b :
       {uint64_t{0}, uint64_t{1} << 20, uint64_t{TM_MAX_KV_TRANSFER_BYTES},
        uint64_t{TM_MAX_KV_TRANSFER_BYTES} + 1, uint64_t{1} << 60}) {
    Bytes v;
    Uint64(v, b);
    EXPECT_EQ(ClientAcceptsBytes(b), DaemonKeeps(KvWith("bytes", v))) << b;
  }
}

TEST_F(FieldRules, TraceContextAgrees) {
  const std::string good =
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  std::vector<std::string> parents = {good};
  std::mt19937 rng(1200);
  const std::string hex = "0123456789abcdefABCDEF-x0";
  for (int i = 0; i < 3000; ++i) {
    std::string p = good;
    const int edits = 1 + int(rng() % 2);
    for (int e = 0; e < edits; ++e)
      p[rng() % p.size()] = hex[rng() % hex.size()];
    if (rng() % 10 == 0) p.pop_back();
    parents.push_back(p);
  }
  parents.push_back("00-00000000000000000000000000000000-00f067aa0ba902b7-01");
  parents.push_back("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01");
  for (const std::string& p : parents) {
    EXPECT_EQ(ClientAcceptsTrace(p, "k=v"),
              DaemonKeeps(ArrivedWithTrace(p, "k=v")))
        << p;
  }
  std::vector<std::string> states = {"k=v",
                                     "a=1,b=2",
                                     "a@b=1",
                                     " a=1 , b=2 ",
                                     ",,",
                                     "=v",
                                     "k=",
                                     "K=v",
                                     "a@=1",
                                     std::string(256 - 2, 'v').insert(0, "k="),
                                     std::string(257 - 2, 'v').insert(0, "k=")};
  const std::string alphabet = "az09=,@ \t_-*/A!~\x01";
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int n = 1 + int(rng() % 24);
    for (int j = 0; j < n; ++j) s += alphabet[rng() % alphabet.size()];
    states.push_back(s);
  }
  for (const std::string& s : states) {
    EXPECT_EQ(ClientAcceptsTrace(good, s),
              DaemonKeeps(ArrivedWithTrace(good, s)))
        << "[" << s << "]";
  }
}

}  // namespace
}  // namespace tokenmeter::daemon
