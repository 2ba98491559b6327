// The client library and the daemon apply one set of HELLO rules
// (protocol.h): for every candidate label name, label value, engine name
// and HELLO string, tm_options_* accepts it exactly when the daemon's
// FrameDecoder accepts a HELLO carrying it. HELLO bytes are written by hand
// from docs/protocol.md (no encoder of ours).
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

struct HelloFields {
  std::string engine = "e";
  std::string model = "m";
  std::string instance = "0";
  std::string scope = "s";
  std::string label_name = "region";
  std::string label_value = "v";
};

// [0, {"proto":1,"engine":..,"model":..,"instance":..,"scope":..,
//      "labels":{name: value}}]
Bytes HelloBytes(const HelloFields& f) {
  Bytes b = {0x92, 0x00, 0x86};
  Str(b, "proto");
  b.push_back(0x01);
  Str(b, "engine");
  Str(b, f.engine);
  Str(b, "model");
  Str(b, f.model);
  Str(b, "instance");
  Str(b, f.instance);
  Str(b, "scope");
  Str(b, f.scope);
  Str(b, "labels");
  b.push_back(0x81);
  Str(b, f.label_name);
  Str(b, f.label_value);
  return b;
}

class CountingSink : public FrameSink {
 public:
  void OnHello(const Hello&) override { ++hellos; }
  void OnBatch(const Batch&) override {}
  void OnGoodbye() override {}
  void OnEventError(IngestError) override {}
  int hellos = 0;
};

bool DaemonAccepts(const HelloFields& f) {
  FrameDecoder decoder{DecoderLimits{}};
  CountingSink sink;
  const Bytes b = HelloBytes(f);
  const bool ok = decoder.Feed(b.data(), b.size(), sink);
  EXPECT_EQ(ok, sink.hellos == 1);
  return ok && sink.hellos == 1;
}

// tm_options with every field of `f` set; TM_OK when every setter took it.
bool ClientAccepts(const HelloFields& f) {
  tm_options* o = tm_options_new();
  bool ok = tm_options_set_engine(o, f.engine.c_str()) == TM_OK &&
            tm_options_set_model(o, f.model.c_str()) == TM_OK &&
            tm_options_set_instance(o, f.instance.c_str()) == TM_OK &&
            tm_options_set_scope(o, f.scope.c_str()) == TM_OK &&
            tm_options_add_label(o, f.label_name.c_str(),
                                 f.label_value.c_str()) == TM_OK;
  tm_options_free(o);
  return ok;
}

std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// Strings without NUL (a C string cannot carry one).
std::vector<std::string> NameCandidates() {
  std::vector<std::string> v;
  static const char* const kReserved[] = {TM_RESERVED_LABEL_NAMES};
  for (const char* r : kReserved) {
    v.push_back(r);
    v.push_back(std::string(r) + "_");
    v.push_back("_" + std::string(r));
    std::string upper = r;
    for (char& c : upper) c = char(toupper(c));
    v.push_back(upper);
  }
  for (const char* s : {"",   "_",   "__",  "___", "__name__", "_x",  "x",
                        "a1", "1a",  "a-b", "-a",  "a.b",      "a b", "é",
                        "aé", "A_Z", "z9_", "__x", "x__",      "_9"}) {
    v.push_back(s);
  }
  for (int c = 1; c < 256; ++c) {
    v.push_back(std::string(1, char(c)));
    v.push_back("a" + std::string(1, char(c)));
  }
  for (size_t n : {31, 32, 255, 256, 257}) v.push_back(std::string(n, 'a'));
  std::mt19937 rng(12);
  const std::string alphabet = "ab_Z09-.\xc3\xa9 _";
  for (int i = 0; i < 3000; ++i) {
    std::string s(1 + rng() % 6, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    v.push_back(s);
  }
  return v;
}

std::vector<std::string> StringCandidates() {
  std::vector<std::string> v = {
      "v",
      "",
      "caf\xc3\xa9",           // 2-byte
      "\xe2\x82\xac",          // 3-byte
      "\xf0\x9f\x98\x80",      // 4-byte
      "\xf4\x8f\xbf\xbf",      // U+10FFFF
      "\xff",                  // never valid
      "\xc0\x80",              // overlong NUL
      "\xc1\xbf",              // overlong
      "\xe0\x80\xaf",          // overlong 3-byte
      "\xf0\x80\x80\xaf",      // overlong 4-byte
      "\xed\xa0\x80",          // surrogate U+D800
      "\xed\xbf\xbf",          // surrogate U+DFFF
      "\xf4\x90\x80\x80",      // above U+10FFFF
      "\xe2\x82",              // truncated
      "a\x80",                 // stray continuation
      "\xc3",                  // truncated at the end
      "\xf8\x88\x80\x80\x80",  // 5-byte form
      std::string(256, 'x'),   // at the limit
      std::string(257, 'x'),   // over it
      std::string(254, 'x') + "\xc3\xa9",
      std::string(255, 'x') + "\xc3\xa9",  // 257 bytes
  };
  std::mt19937 rng(34);
  for (int i = 0; i < 3000; ++i) {
    std::string s(1 + rng() % 5, ' ');
    for (char& c : s) c = char(1 + rng() % 255);
    v.push_back(s);
  }
  return v;
}

TEST(HelloRulesTest, LabelNamesAcceptedByClientExactlyWhenByDaemon) {
  int accepted = 0;
  for (const std::string& name : NameCandidates()) {
    HelloFields f;
    f.label_name = name;
    const bool client = ClientAccepts(f);
    EXPECT_EQ(client, DaemonAccepts(f)) << "label name " << Printable(name);
    accepted += client;
  }
  EXPECT_GT(accepted, 100);  // the table exercises both outcomes
}

TEST(HelloRulesTest, ReservedNamesAreRefusedByBoth) {
  static const char* const kReserved[] = {TM_RESERVED_LABEL_NAMES};
  ASSERT_EQ(std::size(kReserved), size_t{TM_NUM_RESERVED_LABELS});
  for (const char* r : kReserved) {
    HelloFields f;
    f.label_name = r;
    EXPECT_FALSE(ClientAccepts(f)) << r;
    EXPECT_FALSE(DaemonAccepts(f)) << r;
  }
}

TEST(HelloRulesTest, LabelValuesAcceptedByClientExactlyWhenByDaemon) {
  for (const std::string& value : StringCandidates()) {
    HelloFields f;
    f.label_value = value;
    EXPECT_EQ(ClientAccepts(f), DaemonAccepts(f))
        << "label value " << Printable(value);
  }
}

TEST(HelloRulesTest, EngineNamesAcceptedByClientExactlyWhenByDaemon) {
  for (const std::string& engine : NameCandidates()) {
    HelloFields f;
    f.engine = engine;
    EXPECT_EQ(ClientAccepts(f), DaemonAccepts(f))
        << "engine " << Printable(engine);
  }
}

TEST(HelloRulesTest, HelloStringsAcceptedByClientExactlyWhenByDaemon) {
  for (const std::string& s : StringCandidates()) {
    HelloFields model, instance, scope;
    model.model = instance.instance = scope.scope = s;
    EXPECT_EQ(ClientAccepts(model), DaemonAccepts(model))
        << "model " << Printable(s);
    EXPECT_EQ(ClientAccepts(instance), DaemonAccepts(instance))
        << "instance " << Printable(s);
    EXPECT_EQ(ClientAccepts(scope), DaemonAccepts(scope))
        << "scope " << Printable(s);
  }
}

}  // namespace
}  // namespace tokenmeter::daemon
