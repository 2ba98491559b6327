// FrameDecoder against bytes written by hand from docs/protocol.md and the
// msgpack spec (https://github.com/msgpack/msgpack/blob/master/spec.md).
// Nothing here is produced by an encoder of ours: every header byte is
// spelled out (fixstr 0xa0|len, fixarray 0x90|n, fixmap 0x80|n, ...); the
// few helpers only repeat or concatenate such bytes.
#include "daemon/ingest/frame_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tokenmeter::daemon {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes Cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// `n` copies of byte `b`.
Bytes Repeat(size_t n, uint8_t b) { return Bytes(n, b); }

// ---------------------------------------------------------------------------
// Recording sink: one log line per callback, and copies of what came.

// An ARRIVED's lora and labels params (Batch::arrivals), copied.
struct ArrivalCopy {
  std::string lora;
  std::vector<std::pair<std::string, std::string>> labels;
  bool has_priority = false;  // 1.2
  int32_t priority = 0;
  std::string traceparent = {};
  std::string tracestate = {};
};

struct BatchCopy {
  uint64_t seq = 0;
  uint64_t dropped_total = 0;
  std::vector<Event> events;           // rid.text cleared; see rid_texts
  std::vector<std::string> rid_texts;  // per event, "" for numeric ids
  std::vector<uint64_t> positions;
  std::vector<ArrivalCopy> arrivals;  // Batch::arrivals, in order
  uint32_t bad_fields = 0;            // Batch::bad_fields
  // Batch::field_drops as (event, fields).
  std::vector<std::pair<uint32_t, uint32_t>> field_drops;
};

std::string Describe(const Event& e, std::string_view rid_text,
                     const std::vector<uint64_t>& positions) {
  std::string s(EventKindName(e.kind));
  s += " t=" + std::to_string(e.t_ns);
  if (e.kind != EventKind::kStep) {
    s += e.rid.is_string ? " rid=s:" + std::string(rid_text)
                         : " rid=n:" + std::to_string(e.rid.number);
  }
  switch (e.kind) {
    case EventKind::kArrived:
      s += " prompt=" + std::to_string(e.count);
      if (e.has_max_tokens) s += " max_tokens=" + std::to_string(e.max_tokens);
      if (e.has_n) s += " n=" + std::to_string(e.n);
      break;
    case EventKind::kTokens:
      s += " n=" + std::to_string(e.count);
      break;
    case EventKind::kFinished:
      s += " reason=" + std::string(FinishReasonName(e.reason));
      break;
    case EventKind::kStep: {
      const StepStats& st = e.step;
      s += " has=" + std::to_string(st.has);
      s += " running=" + std::to_string(st.running);
      s += " waiting=" + std::to_string(st.waiting);
      s += " kv=" + std::to_string(st.kv_usage);
      s += " prompt=" + std::to_string(st.prompt_tokens);
      s += " gen=" + std::to_string(st.generation_tokens);
      s += " pq=" + std::to_string(st.prefix_queries);
      s += " ph=" + std::to_string(st.prefix_hits);
      s += " sd=" + std::to_string(st.spec_drafts);
      s += " sdt=" + std::to_string(st.spec_draft_tokens);
      s += " sat=" + std::to_string(st.spec_accepted_tokens);
      s += " pos=[";
      for (uint32_t i = 0; i < st.pos_count; ++i) {
        s += std::to_string(positions[st.pos_begin + i]) + ",";
      }
      s += "]";
      break;
    }
    default:
      break;
  }
  return s;
}

class RecordingSink : public FrameSink {
 public:
  void OnHello(const Hello& hello) override {
    hellos.push_back(hello);
    std::string line = "hello proto=" + std::to_string(hello.proto) +
                       " engine=" + hello.engine + " model=" + hello.model +
                       " instance=" + hello.instance;
    if (hello.has_scope) line += " scope=" + hello.scope;
    for (const auto& label : hello.labels) {
      line += " label:" + label.first + "=" + label.second;
    }
    if (hello.has_pid) line += " pid=" + std::to_string(hello.pid);
    if (!hello.profile.empty()) line += " profile=" + hello.profile;
    for (const auto& e : hello.cache_config) {
      line += " cache_config:" + e.key + "=" + e.value;
    }
    if (hello.has_max_lora)
      line += " max_lora=" + std::to_string(hello.max_lora);
    log.push_back(line);
  }
  void OnBatch(const Batch& batch) override {
    BatchCopy copy;
    copy.seq = batch.seq;
    copy.dropped_total = batch.dropped_total;
    copy.positions = batch.positions;
    copy.bad_fields = batch.bad_fields;
    for (const Batch::FieldDrops& f : batch.field_drops) {
      copy.field_drops.emplace_back(f.event, f.fields);
    }
    for (const ArrivedExtras& x : batch.arrivals) {
      ArrivalCopy a{std::string(x.lora),
                    {},
                    x.has_priority,
                    x.priority,
                    std::string(x.traceparent),
                    std::string(x.tracestate)};
      for (uint8_t i = 0; i < x.num_labels; ++i) {
        a.labels.emplace_back(x.labels[i].first, x.labels[i].second);
      }
      copy.arrivals.push_back(std::move(a));
    }
    std::string line = "batch seq=" + std::to_string(batch.seq) +
                       " dropped=" + std::to_string(batch.dropped_total);
    for (const Event& e : batch.events) {
      line += " | " + Describe(e, e.rid.text, batch.positions);
      if (e.extras != Event::kNoExtras) {
        const ArrivalCopy& a = copy.arrivals.at(e.extras);
        line += " lora=" + a.lora;
        for (const auto& [k, v] : a.labels) line += " label:" + k + "=" + v;
      }
      copy.rid_texts.emplace_back(e.rid.text);
      copy.events.push_back(e);
      copy.events.back().rid.text = {};
    }
    batches.push_back(std::move(copy));
    log.push_back(line);
  }
  void OnGoodbye() override {
    ++goodbyes;
    log.push_back("goodbye");
  }
  void OnEventError(IngestError error) override {
    event_errors.push_back(error);
    log.push_back("event_error " + std::string(IngestErrorName(error)));
  }

  // All events of all batches.
  std::vector<Event> AllEvents() const {
    std::vector<Event> out;
    for (const BatchCopy& b : batches) {
      out.insert(out.end(), b.events.begin(), b.events.end());
    }
    return out;
  }

  std::vector<Hello> hellos;
  std::vector<BatchCopy> batches;
  int goodbyes = 0;
  std::vector<IngestError> event_errors;
  std::vector<std::string> log;
};

bool Feed(FrameDecoder& d, const Bytes& bytes, FrameSink& sink) {
  return d.Feed(bytes.data(), bytes.size(), sink);
}

// ---------------------------------------------------------------------------
// Hand-written pieces.

// HELLO meta entries.
const Bytes kProto = {0xa5, 'p', 'r', 'o', 't', 'o', 0x01};
const Bytes kEngine = {0xa6, 'e',  'n', 'g', 'i', 'n',
                       'e',  0xa4, 'v', 'l', 'l', 'm'};
const Bytes kModel = {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa2, 'm', '1'};

// [0, {"proto": 1, "engine": "vllm", "model": "m1"}]
const Bytes kHello = {0x92, 0x00, 0x83,                       //
                      0xa5, 'p',  'r',  'o', 't', 'o', 0x01,  //
                      0xa6, 'e',  'n',  'g', 'i', 'n', 'e',   //
                      0xa4, 'v',  'l',  'l', 'm',             //
                      0xa5, 'm',  'o',  'd', 'e', 'l',        //
                      0xa2, 'm',  '1'};

// [2]
const Bytes kGoodbye = {0x91, 0x02};

// A HELLO frame [0, meta] whose meta is a fixmap of n entries.
Bytes HelloOf(uint8_t n, std::initializer_list<Bytes> entries) {
  Bytes out = {0x92, 0x00, static_cast<uint8_t>(0x80 | n)};
  for (const Bytes& e : entries) out.insert(out.end(), e.begin(), e.end());
  return out;
}

// A BATCH frame [1, 0, 0, [events]] with a fixarray of n events.
Bytes BatchOf(uint8_t n, std::initializer_list<Bytes> events) {
  Bytes out = {0x94, 0x01, 0x00, 0x00, static_cast<uint8_t>(0x90 | n)};
  for (const Bytes& e : events) out.insert(out.end(), e.begin(), e.end());
  return out;
}

// Events, t = 1000.. (0xcd 0x03 0xe8 = uint16 1000), rid 7 or "r-1".
const Bytes kArrived = {0x94, 0x01, 0xcd, 0x03, 0xe8, 0x07, 0x0c};
const Bytes kQueued = {0x93, 0x02, 0xcd, 0x03, 0xe9, 0x07};
const Bytes kScheduled = {0x93, 0x03, 0xcd, 0x03, 0xea, 0x07};
const Bytes kTokens = {0x94, 0x04, 0xcd, 0x03, 0xeb, 0x07, 0x01};
const Bytes kFinished = {0x94, 0x05, 0xcd, 0x03, 0xec, 0x07,
                         0xa4, 's',  't',  'o',  'p'};
const Bytes kPreempted = {0x93, 0x06, 0xcd, 0x03, 0xed, 0x07};
const Bytes kStep = {0x93, 0x07, 0xcd, 0x03, 0xee, 0x80};

// ---------------------------------------------------------------------------
// HELLO

TEST(FrameDecoderTest, AcceptsMinimalHello) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, kHello, sink));
  ASSERT_EQ(sink.hellos.size(), 1u);
  const Hello& h = sink.hellos[0];
  EXPECT_EQ(h.proto, 1);
  EXPECT_EQ(h.engine, "vllm");
  EXPECT_EQ(h.model, "m1");
  EXPECT_EQ(h.instance, "0");
  EXPECT_FALSE(h.has_scope);
  EXPECT_TRUE(h.labels.empty());
  EXPECT_FALSE(h.has_pid);
  EXPECT_TRUE(d.saw_hello());
  EXPECT_FALSE(d.saw_goodbye());
  EXPECT_EQ(d.buffered_bytes(), 0u);
}

TEST(FrameDecoderTest, AcceptsHelloWithEveryOptionalKey) {
  const Bytes bytes = {
      0x92, 0x00, 0x87,  // [0, {7 entries}]
      0xa5, 'p', 'r', 'o', 't', 'o', 0x01,
      // "engine": "tokenmeter-engine" (17 bytes)
      0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xb1, 't', 'o', 'k', 'e', 'n', 'm',
      'e', 't', 'e', 'r', '-', 'e', 'n', 'g', 'i', 'n', 'e',
      // "model": "llama-3" as str8
      0xa5, 'm', 'o', 'd', 'e', 'l', 0xd9, 0x07, 'l', 'l', 'a', 'm', 'a', '-',
      '3',
      // "instance": "dp0"
      0xa8, 'i', 'n', 's', 't', 'a', 'n', 'c', 'e', 0xa3, 'd', 'p', '0',
      // "scope": "srv1"
      0xa5, 's', 'c', 'o', 'p', 'e', 0xa4, 's', 'r', 'v', '1',
      // "labels": {"region": "eu", "_tier": "gold"}
      0xa6, 'l', 'a', 'b', 'e', 'l', 's', 0x82,            //
      0xa6, 'r', 'e', 'g', 'i', 'o', 'n', 0xa2, 'e', 'u',  //
      0xa5, '_', 't', 'i', 'e', 'r', 0xa4, 'g', 'o', 'l', 'd',
      // "pid": 4242 as uint16
      0xa3, 'p', 'i', 'd', 0xcd, 0x10, 0x92};
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, bytes, sink));
  ASSERT_EQ(sink.hellos.size(), 1u);
  const Hello& h = sink.hellos[0];
  EXPECT_EQ(h.engine, "tokenmeter-engine");
  EXPECT_EQ(h.model, "llama-3");
  EXPECT_EQ(h.instance, "dp0");
  EXPECT_TRUE(h.has_scope);
  EXPECT_EQ(h.scope, "srv1");
  ASSERT_EQ(h.labels.size(), 2u);
  EXPECT_EQ(h.labels[0].first, "region");
  EXPECT_EQ(h.labels[0].second, "eu");
  EXPECT_EQ(h.labels[1].first, "_tier");
  EXPECT_EQ(h.labels[1].second, "gold");
  EXPECT_TRUE(h.has_pid);
  EXPECT_EQ(h.pid, 4242);
}

TEST(FrameDecoderTest, AcceptsUtf8ModelAndNegativePid) {
  // "model": "modèle" (è = c3 a8), "pid": -1.
  const Bytes bytes = HelloOf(4, {kProto,
                                  kEngine,
                                  {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa7, 'm',
                                   'o', 'd', 0xc3, 0xa8, 'l', 'e'},
                                  {0xa3, 'p', 'i', 'd', 0xff}});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, bytes, sink));
  ASSERT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(sink.hellos[0].model, "mod\xc3\xa8le");
  EXPECT_EQ(sink.hellos[0].pid, -1);
}

TEST(FrameDecoderTest, IgnoresUnknownHelloKeysOfAnyType) {
  const Bytes bytes = HelloOf(
      11, {kProto,
           {0xa1, 'a', 0xc0},                                // nil
           {0xa1, 'b', 0xc3},                                // true
           {0xa1, 'c', 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0},  // 1.0
           {0xa1, 'd', 0x92, 0x01, 0x81, 0xa1, 'x', 0x90},   // [1, {x: []}]
           {0xa1, 'e', 0xc4, 0x02, 0xff, 0x00},              // bin8
           {0xa1, 'f', 0xd5, 0x01, 0xaa, 0xbb},              // fixext 2
           {0xa1, 'g', 0xc7, 0x01, 0x05, 0xcc},              // ext8
           {0xa1, 'h', 0xa2, 0xff, 0xfe},  // not UTF-8, but ignored
           kEngine,
           kModel});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, bytes, sink)) << IngestErrorName(d.error());
  ASSERT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(sink.hellos[0].engine, "vllm");
}

TEST(FrameDecoderTest, AcceptsHelloWithExactlyEightLabels) {
  const Bytes bytes = HelloOf(
      4, {kProto,
          kEngine,
          kModel,
          {0xa6, 'l',  'a',  'b',  'e',  'l',  's',  0x88,  //
           0xa1, 'a',  0xa1, '1',  0xa1, 'b',  0xa1, '2',  0xa1, 'c',  0xa1,
           '3',  0xa1, 'd',  0xa1, '4',  0xa1, 'e',  0xa1, '5',  0xa1, 'f',
           0xa1, '6',  0xa1, 'g',  0xa1, '7',  0xa1, 'h',  0xa1, '8'}});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, bytes, sink));
  ASSERT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(sink.hellos[0].labels.size(), 8u);
}

struct ErrorCase {
  const char* name;
  Bytes bytes;
  IngestError want;
};

// Feeds each case to a fresh decoder; expects a frame-level failure.
void ExpectFrameErrors(const std::vector<ErrorCase>& cases,
                       const DecoderLimits& limits = DecoderLimits{}) {
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    RecordingSink sink;
    FrameDecoder d(limits);
    EXPECT_FALSE(Feed(d, c.bytes, sink));
    EXPECT_TRUE(d.failed());
    EXPECT_EQ(IngestErrorName(d.error()), IngestErrorName(c.want));
    EXPECT_TRUE(sink.event_errors.empty());
  }
}

TEST(FrameDecoderTest, RejectsBadHello) {
  const Bytes kLabelsKey = {0xa6, 'l', 'a', 'b', 'e', 'l', 's'};
  ExpectFrameErrors({
      {"no meta", {0x91, 0x00}, IngestError::kBadHello},
      {"meta not a map", {0x92, 0x00, 0x90}, IngestError::kBadHello},
      {"meta nil", {0x92, 0x00, 0xc0}, IngestError::kBadHello},
      {"missing proto", HelloOf(2, {kEngine, kModel}), IngestError::kBadHello},
      {"missing engine", HelloOf(2, {kProto, kModel}), IngestError::kBadHello},
      {"missing model", HelloOf(2, {kProto, kEngine}), IngestError::kBadHello},
      {"proto 2",
       HelloOf(3, {{0xa5, 'p', 'r', 'o', 't', 'o', 0x02}, kEngine, kModel}),
       IngestError::kBadHello},
      {"proto 0",
       HelloOf(3, {{0xa5, 'p', 'r', 'o', 't', 'o', 0x00}, kEngine, kModel}),
       IngestError::kBadHello},
      {"proto -1",
       HelloOf(3, {{0xa5, 'p', 'r', 'o', 't', 'o', 0xff}, kEngine, kModel}),
       IngestError::kBadHello},
      {"proto str",
       HelloOf(3,
               {{0xa5, 'p', 'r', 'o', 't', 'o', 0xa1, '1'}, kEngine, kModel}),
       IngestError::kBadHello},
      {"proto float",
       HelloOf(3, {{0xa5, 'p', 'r', 'o', 't', 'o', 0xca, 0x3f, 0x80, 0, 0},
                   kEngine,
                   kModel}),
       IngestError::kBadHello},
      {"engine int",
       HelloOf(3, {kProto, {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0x01}, kModel}),
       IngestError::kBadHello},
      {"engine not utf-8",
       HelloOf(3, {kProto,
                   {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa2, 0xc3, 0x28},
                   kModel}),
       IngestError::kBadHello},
      {"model empty",
       HelloOf(3, {kProto, kEngine, {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa0}}),
       IngestError::kBadHello},
      {"model nil",
       HelloOf(3, {kProto, kEngine, {0xa5, 'm', 'o', 'd', 'e', 'l', 0xc0}}),
       IngestError::kBadHello},
      {"model bin",
       HelloOf(
           3,
           {kProto, kEngine, {0xa5, 'm', 'o', 'd', 'e', 'l', 0xc4, 0x01, 'm'}}),
       IngestError::kBadHello},
      {"model overlong utf-8",  // c0 af: '/' in two bytes
       HelloOf(3, {kProto,
                   kEngine,
                   {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa2, 0xc0, 0xaf}}),
       IngestError::kBadHello},
      {"model utf-16 surrogate",  // ed a0 80: U+D800
       HelloOf(3, {kProto,
                   kEngine,
                   {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa3, 0xed, 0xa0, 0x80}}),
       IngestError::kBadHello},
      {"model truncated utf-8",
       HelloOf(
           3,
           {kProto, kEngine, {0xa5, 'm', 'o', 'd', 'e', 'l', 0xa2, 'm', 0xe2}}),
       IngestError::kBadHello},
      {"instance int",
       HelloOf(4, {kProto,
                   kEngine,
                   kModel,
                   {0xa8, 'i', 'n', 's', 't', 'a', 'n', 'c', 'e', 0x00}}),
       IngestError::kBadHello},
      {"scope array",
       HelloOf(
           4, {kProto, kEngine, kModel, {0xa5, 's', 'c', 'o', 'p', 'e', 0x90}}),
       IngestError::kBadHello},
      {"labels array",
       HelloOf(4, {kProto, kEngine, kModel, Cat({kLabelsKey, {0x90}})}),
       IngestError::kBadHello},
      {"label value int",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey, {0x81, 0xa1, 'a', 0x01}})}),
       IngestError::kBadHello},
      {"label name int",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey, {0x81, 0x01, 0xa1, 'a'}})}),
       IngestError::kBadHello},
      {"label value not utf-8",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey, {0x81, 0xa1, 'a', 0xa1, 0xff}})}),
       IngestError::kBadHello},
      {"int key", HelloOf(4, {kProto, kEngine, kModel, {0x01, 0x01}}),
       IngestError::kBadHello},
      {"nil key", HelloOf(4, {kProto, kEngine, kModel, {0xc0, 0x01}}),
       IngestError::kBadHello},
      {"key not utf-8",
       HelloOf(4, {kProto, kEngine, kModel, {0xa1, 0xff, 0x01}}),
       IngestError::kBadHello},
      {"proto twice", HelloOf(4, {kProto, kEngine, kModel, kProto}),
       IngestError::kBadHello},
  });
}

TEST(FrameDecoderTest, RejectsBadName) {
  const Bytes kLabelsKey = {0xa6, 'l', 'a', 'b', 'e', 'l', 's'};
  ExpectFrameErrors({
      {"engine starts with digit",
       HelloOf(3, {kProto,
                   {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa2, '1', 'v'},
                   kModel}),
       IngestError::kBadName},
      {"engine starts with dash",
       HelloOf(3, {kProto,
                   {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa2, '-', 'v'},
                   kModel}),
       IngestError::kBadName},
      {"engine with space",
       HelloOf(3, {kProto,
                   {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa3, 'v', ' ', 'l'},
                   kModel}),
       IngestError::kBadName},
      {"engine with dot",
       HelloOf(3, {kProto,
                   {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa3, 'v', '.', 'l'},
                   kModel}),
       IngestError::kBadName},
      {"engine non-ascii",  // é, valid UTF-8
       HelloOf(3, {kProto,
                   {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa2, 0xc3, 0xa9},
                   kModel}),
       IngestError::kBadName},
      {"engine empty",
       HelloOf(3, {kProto, {0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa0}, kModel}),
       IngestError::kBadName},
      {"label name with dash",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey, {0x81, 0xa3, 'a', '-', 'b', 0xa1, 'x'}})}),
       IngestError::kBadName},
      {"label name starts with digit",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey, {0x81, 0xa2, '1', 'a', 0xa1, 'x'}})}),
       IngestError::kBadName},
      {"label name empty",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey, {0x81, 0xa0, 0xa1, 'x'}})}),
       IngestError::kBadName},
      {"label name twice",
       HelloOf(4, {kProto, kEngine, kModel,
                   Cat({kLabelsKey,
                        {0x82, 0xa1, 'a', 0xa1, 'x', 0xa1, 'a', 0xa1, 'y'}})}),
       IngestError::kBadName},
  });
}

TEST(FrameDecoderTest, RejectsReservedLabel) {
  const char* kReserved[] = {
      "model_name", "engine", "engine_family", "finished_reason",
      "position",   "le",     "quantile",      "interval",
      "reason",     "kind",   "__name__",      "__x",
      "__"};
  for (const char* name : kReserved) {
    SCOPED_TRACE(name);
    const size_t len = std::string_view(name).size();
    Bytes label = {0xa6, 'l',  'a',
                   'b',  'e',  'l',
                   's',  0x81, static_cast<uint8_t>(0xa0 | len)};
    label.insert(label.end(), name, name + len);
    label.insert(label.end(), {0xa1, 'x'});
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    EXPECT_FALSE(Feed(d, HelloOf(4, {kProto, kEngine, kModel, label}), sink));
    EXPECT_EQ(d.error(), IngestError::kReservedLabel);
    EXPECT_TRUE(sink.hellos.empty());
  }
}

TEST(FrameDecoderTest, RejectsTooManyLabels) {
  const Bytes bytes = HelloOf(
      4, {kProto,
          kEngine,
          kModel,
          {0xa6, 'l', 'a',  'b', 'e',  'l', 's',  0x89,  //
           0xa1, 'a', 0xa1, '1', 0xa1, 'b', 0xa1, '2',  0xa1, 'c', 0xa1, '3',
           0xa1, 'd', 0xa1, '4', 0xa1, 'e', 0xa1, '5',  0xa1, 'f', 0xa1, '6',
           0xa1, 'g', 0xa1, '7', 0xa1, 'h', 0xa1, '8',  0xa1, 'i', 0xa1, '9'}});
  ExpectFrameErrors({{"nine labels", bytes, IngestError::kTooManyLabels}});
}

// ---------------------------------------------------------------------------
// Frame structure and sequencing

TEST(FrameDecoderTest, RejectsBadFrame) {
  ExpectFrameErrors({
      {"top-level int", Cat({kHello, {0x01}}), IngestError::kBadFrame},
      {"top-level int first", {0x00}, IngestError::kBadFrame},
      {"top-level map", Cat({kHello, {0x80}}), IngestError::kBadFrame},
      {"top-level str", Cat({kHello, {0xa1, 'x'}}), IngestError::kBadFrame},
      {"top-level nil", Cat({kHello, {0xc0}}), IngestError::kBadFrame},
      {"empty array", Cat({kHello, {0x90}}), IngestError::kBadFrame},
      {"negative frame type", Cat({kHello, {0x91, 0xff}}),
       IngestError::kBadFrame},
      {"negative frame type int8", Cat({kHello, {0x91, 0xd0, 0x80}}),
       IngestError::kBadFrame},
      {"str frame type", Cat({kHello, {0x91, 0xa1, '1'}}),
       IngestError::kBadFrame},
      {"float frame type", Cat({kHello, {0x91, 0xca, 0x3f, 0x80, 0, 0}}),
       IngestError::kBadFrame},
      {"array frame type", Cat({kHello, {0x91, 0x91, 0x01}}),
       IngestError::kBadFrame},
      {"unknown frame type 3", Cat({kHello, {0x91, 0x03}}),
       IngestError::kBadFrame},
      {"unknown frame type 256", Cat({kHello, {0x91, 0xcd, 0x01, 0x00}}),
       IngestError::kBadFrame},
      {"batch of 3", Cat({kHello, {0x93, 0x01, 0x00, 0x00}}),
       IngestError::kBadFrame},
      {"batch seq negative", Cat({kHello, {0x94, 0x01, 0xff, 0x00, 0x90}}),
       IngestError::kBadFrame},
      {"batch seq str", Cat({kHello, {0x94, 0x01, 0xa1, '0', 0x00, 0x90}}),
       IngestError::kBadFrame},
      {"batch dropped nil", Cat({kHello, {0x94, 0x01, 0x00, 0xc0, 0x90}}),
       IngestError::kBadFrame},
      {"batch events map", Cat({kHello, {0x94, 0x01, 0x00, 0x00, 0x80}}),
       IngestError::kBadFrame},
      {"batch events nil", Cat({kHello, {0x94, 0x01, 0x00, 0x00, 0xc0}}),
       IngestError::kBadFrame},
      {"frame after goodbye", Cat({kHello, kGoodbye, BatchOf(1, {kTokens})}),
       IngestError::kBadFrame},
      {"goodbye after goodbye", Cat({kHello, kGoodbye, kGoodbye}),
       IngestError::kBadFrame},
      {"hello after goodbye", Cat({kHello, kGoodbye, kHello}),
       IngestError::kBadFrame},
      {"non-array after goodbye", Cat({kHello, kGoodbye, {0x01}}),
       IngestError::kBadFrame},
  });
}

TEST(FrameDecoderTest, RejectsFrameAfterGoodbyeAtItsFirstByte) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, kGoodbye}), sink));
  EXPECT_TRUE(d.saw_goodbye());
  EXPECT_EQ(sink.goodbyes, 1);
  EXPECT_FALSE(Feed(d, {0x94}, sink));
  EXPECT_EQ(d.error(), IngestError::kBadFrame);
}

TEST(FrameDecoderTest, RejectsInvalidMsgpack) {
  ExpectFrameErrors({
      {"0xc1 at top level", {0xc1}, IngestError::kInvalidMsgpack},
      {"0xc1 as frame type", {0x91, 0xc1}, IngestError::kInvalidMsgpack},
      {"0xc1 in HELLO",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xc1},
       IngestError::kInvalidMsgpack},
      {"0xc1 in an event",
       Cat({kHello, BatchOf(1, {{0x93, 0x02, 0x00, 0xc1}})}),
       IngestError::kInvalidMsgpack},
  });
}

TEST(FrameDecoderTest, RejectsBatchBeforeHello) {
  ExpectFrameErrors({
      {"batch first", BatchOf(1, {kTokens}), IngestError::kBatchBeforeHello},
      {"goodbye first", kGoodbye, IngestError::kBatchBeforeHello},
      {"batch first, non-minimal type",
       {0x94, 0xcc, 0x01, 0x00, 0x00, 0x90},
       IngestError::kBatchBeforeHello},
  });
  // Known at the frame type, before the rest of the frame arrives.
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  EXPECT_TRUE(Feed(d, {0x94}, sink));
  EXPECT_FALSE(Feed(d, {0x01}, sink));
  EXPECT_EQ(d.error(), IngestError::kBatchBeforeHello);
}

TEST(FrameDecoderTest, RejectsSecondHello) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  EXPECT_FALSE(Feed(d, Cat({kHello, BatchOf(1, {kTokens}), kHello}), sink));
  EXPECT_EQ(d.error(), IngestError::kSecondHello);
  EXPECT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(sink.batches.size(), 1u);
}

// ---------------------------------------------------------------------------
// Limits

TEST(FrameDecoderTest, RejectsStringTooLongAtItsHeader) {
  // [0, {<str32 of 4 GiB - 1>: ...}]: fails once the 5 header bytes are in.
  const Bytes prefix = {0x92, 0x00, 0x81};
  const Bytes header = {0xdb, 0xff, 0xff, 0xff, 0xff};
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, prefix, sink));
  for (size_t i = 0; i + 1 < header.size(); ++i) {
    ASSERT_TRUE(d.Feed(&header[i], 1, sink)) << i;
  }
  EXPECT_FALSE(d.Feed(&header.back(), 1, sink));
  EXPECT_EQ(d.error(), IngestError::kStringTooLong);
  EXPECT_EQ(d.buffered_bytes(), prefix.size() + header.size());
}

TEST(FrameDecoderTest, RejectsStringTooLong) {
  // 257 bytes: one past TM_MAX_STRING_BYTES, for str, bin and ext alike.
  ExpectFrameErrors({
      {"str16 257",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xda, 0x01, 0x01},
       IngestError::kStringTooLong},
      {"str16 as key",
       {0x92, 0x00, 0x81, 0xda, 0x01, 0x01},
       IngestError::kStringTooLong},
      {"bin16 257",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xc5, 0x01, 0x01},
       IngestError::kStringTooLong},
      {"bin32 4 GiB",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xc6, 0xff, 0xff, 0xff, 0xff},
       IngestError::kStringTooLong},
      {"ext16 257",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xc8, 0x01, 0x01, 0x05},
       IngestError::kStringTooLong},
      {"ext32 4 GiB",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xc9, 0xff, 0xff, 0xff, 0xff, 0x05},
       IngestError::kStringTooLong},
      {"rid str16 257",
       Cat({kHello, BatchOf(1, {{0x93, 0x02, 0x00, 0xda, 0x01, 0x01}})}),
       IngestError::kStringTooLong},
  });
  // 256 bytes is fine.
  const Bytes ok =
      Cat({HelloOf(4, {kProto, kEngine, kModel, {0xa1, 'x', 0xda, 0x01, 0x00}}),
           Repeat(256, 'a')});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  EXPECT_TRUE(Feed(d, ok, sink));
  EXPECT_EQ(sink.hellos.size(), 1u);
}

TEST(FrameDecoderTest, RejectsStringTooLongUnderAConfiguredLimit) {
  DecoderLimits limits;
  limits.max_string_bytes = 4;
  {
    RecordingSink sink;
    FrameDecoder d(limits);
    // [0, {"abcd": ...: a 4-byte fixstr key is fine.
    EXPECT_TRUE(Feed(d, {0x92, 0x00, 0x81, 0xa4, 'a', 'b', 'c', 'd'}, sink));
  }
  ExpectFrameErrors(
      {{"fixstr 5", {0x92, 0x00, 0x81, 0xa5}, IngestError::kStringTooLong},
       {"str8 5", {0x92, 0x00, 0x81, 0xd9, 0x05}, IngestError::kStringTooLong},
       {"fixext 8",
        {0x92, 0x00, 0x81, 0xa1, 'x', 0xd7, 0x01},
        IngestError::kStringTooLong}},
      limits);
}

TEST(FrameDecoderTest, RejectsFrameTooLargeFromDeclaredCount) {
  // Counts that cannot fit in 1 MiB, one byte per element at least: each
  // fails at its header with a handful of bytes buffered.
  const std::vector<ErrorCase> cases = {
      {"frame array32 of 2^20",
       {0xdd, 0x00, 0x10, 0x00, 0x00},
       IngestError::kFrameTooLarge},
      {"meta map32 of 2^19 entries",
       {0x92, 0x00, 0xdf, 0x00, 0x08, 0x00, 0x00},
       IngestError::kFrameTooLarge},
      {"value array32 of 4 Gi",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff},
       IngestError::kFrameTooLarge},
      {"value map32 of 4 Gi",
       {0x92, 0x00, 0x81, 0xa1, 'x', 0xdf, 0xff, 0xff, 0xff, 0xff},
       IngestError::kFrameTooLarge},
  };
  ExpectFrameErrors(cases);
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    EXPECT_FALSE(Feed(d, c.bytes, sink));
    EXPECT_EQ(d.buffered_bytes(), c.bytes.size());
  }
}

TEST(FrameDecoderTest, RejectsFrameTooLargeWhenDeclaredLengthPassesBudget) {
  // Limit 16: [0, {"x": <str 20>}] is 2 + 1 + 2 + 1 + 20 bytes.
  DecoderLimits limits;
  limits.max_frame_bytes = 16;
  ExpectFrameErrors({{"str past budget",
                      {0x92, 0x00, 0x81, 0xa1, 'x', 0xb4},
                      IngestError::kFrameTooLarge}},
                    limits);
}

TEST(FrameDecoderTest, RejectsIncompleteFrameAtTheLimit) {
  // Limit 8: [0, {"x": 0xcf ...}] stops at 8 bytes in the middle of a uint64
  // header; it cannot complete within the limit.
  DecoderLimits limits;
  limits.max_frame_bytes = 8;
  const Bytes bytes = {0x92, 0x00, 0x81, 0xa1, 'x', 0xcf, 0x00, 0x00};
  RecordingSink sink;
  FrameDecoder d(limits);
  ASSERT_TRUE(d.Feed(bytes.data(), 7, sink));
  EXPECT_EQ(d.buffered_bytes(), 7u);
  // Only the one byte the limit still allows is offered.
  EXPECT_EQ(d.Prepare(100).size(), 1u);
  EXPECT_FALSE(d.Feed(&bytes[7], 1, sink));
  EXPECT_EQ(d.error(), IngestError::kFrameTooLarge);
}

// [1, 0, 0, [], pad...] of exactly `total` bytes: pads are str8 of 255 bytes
// (257 encoded) and a last fixstr; trailing frame elements are ignored.
Bytes PaddedBatch(size_t total) {
  const size_t kHeader = 7;  // dc nn nn 01 00 00 90
  const size_t rest = total - kHeader;
  const size_t full = (rest - 1) / 257;  // keep 1..257 bytes for the last
  const size_t last = rest - full * 257;
  const size_t elems = 4 + full + 1;
  Bytes out = {0xdc,
               static_cast<uint8_t>(elems >> 8),
               static_cast<uint8_t>(elems & 0xff),
               0x01,
               0x00,
               0x00,
               0x90};
  for (size_t i = 0; i < full; ++i) {
    out.insert(out.end(), {0xd9, 0xff});
    out.insert(out.end(), 255, 'p');
  }
  if (last <= 32) {
    out.push_back(static_cast<uint8_t>(0xa0 | (last - 1)));
    out.insert(out.end(), last - 1, 'q');
  } else {
    out.insert(out.end(), {0xd9, static_cast<uint8_t>(last - 2)});
    out.insert(out.end(), last - 2, 'q');
  }
  return out;
}

TEST(FrameDecoderTest, AcceptsFrameOfExactlyOneMiB) {
  const Bytes frame = PaddedBatch(1024 * 1024);
  ASSERT_EQ(frame.size(), 1024u * 1024u);
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, kHello, sink));
  for (size_t i = 0; i < frame.size(); i += 4096) {
    const size_t n = std::min<size_t>(4096, frame.size() - i);
    ASSERT_TRUE(d.Feed(&frame[i], n, sink)) << i;
    EXPECT_LE(d.buffered_bytes(), 1024u * 1024u);
  }
  ASSERT_EQ(sink.batches.size(), 1u);
  EXPECT_TRUE(sink.batches[0].events.empty());
  EXPECT_EQ(d.buffered_bytes(), 0u);
}

TEST(FrameDecoderTest, RejectsOneMiBPlusOneFrameOnceTheLimitPasses) {
  const Bytes frame = PaddedBatch(1024 * 1024 + 1);
  ASSERT_EQ(frame.size(), 1024u * 1024u + 1);
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, kHello, sink));
  size_t fed = 0;
  while (fed < frame.size()) {
    const size_t n = std::min<size_t>(4096, frame.size() - fed);
    if (!d.Feed(&frame[fed], n, sink)) break;
    fed += n;
    EXPECT_LE(d.buffered_bytes(), 1024u * 1024u);
  }
  EXPECT_TRUE(d.failed());
  EXPECT_EQ(d.error(), IngestError::kFrameTooLarge);
  // Not before the bytes seen could tell: the last pad's header is within
  // the last 300 bytes.
  EXPECT_GE(fed + 4096, frame.size() - 300);
  EXPECT_TRUE(sink.batches.empty());
}

TEST(FrameDecoderTest, RejectsBatchTooLarge) {
  ExpectFrameErrors({
      {"65537 events",
       Cat({kHello, {0x94, 0x01, 0x00, 0x00, 0xdd, 0x00, 0x01, 0x00, 0x01}}),
       IngestError::kBatchTooLarge},
      {"4 Gi events",
       Cat({kHello, {0x94, 0x01, 0x00, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}}),
       IngestError::kBatchTooLarge},
  });
  DecoderLimits limits;
  limits.max_batch_events = 2;
  RecordingSink sink;
  FrameDecoder d(limits);
  ASSERT_TRUE(Feed(d, kHello, sink));
  EXPECT_TRUE(Feed(d, BatchOf(2, {kTokens, kTokens}), sink));
  // Fails at the events array header, before any event arrives.
  EXPECT_FALSE(Feed(d, {0x94, 0x01, 0x01, 0x00, 0x93}, sink));
  EXPECT_EQ(d.error(), IngestError::kBatchTooLarge);
  EXPECT_EQ(sink.batches.size(), 1u);
}

TEST(FrameDecoderTest, RejectsTooDeep) {
  // [0, {"proto": 1, "engine": ..., "model": ..., "x": [[[...0]]]}]: the
  // frame is depth 1, meta 2, so k nested arrays reach depth 2 + k.
  auto hello_with_nesting = [](size_t k) {
    return Cat({HelloOf(4, {kProto, kEngine, kModel, {0xa1, 'x'}}),
                Repeat(k, 0x91),
                {0x00}});
  };
  {
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    EXPECT_TRUE(Feed(d, hello_with_nesting(30), sink));
    EXPECT_EQ(sink.hellos.size(), 1u);
  }
  ExpectFrameErrors({
      {"depth 33", hello_with_nesting(31), IngestError::kTooDeep},
      {"depth 100000", hello_with_nesting(100000), IngestError::kTooDeep},
      {"empty map at depth 33",
       Cat({HelloOf(1, {{0xa1, 'x'}}), Repeat(30, 0x91), {0x80}}),
       IngestError::kTooDeep},
      {"deep inside an event",
       Cat({kHello,
            {0x94, 0x01, 0x00, 0x00, 0x91, 0x94, 0x04, 0x00, 0x07},
            Repeat(40, 0x91),
            {0x01}}),
       IngestError::kTooDeep},
  });
}

// ---------------------------------------------------------------------------
// Events

TEST(FrameDecoderTest, DecodesEveryEventKindWithIntIds) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, kHello, sink));
  ASSERT_TRUE(Feed(d,
                   BatchOf(7, {kArrived, kQueued, kScheduled, kTokens,
                               kPreempted, kFinished, kStep}),
                   sink));
  ASSERT_EQ(sink.batches.size(), 1u);
  const std::vector<Event>& ev = sink.batches[0].events;
  ASSERT_EQ(ev.size(), 7u);
  const EventKind kinds[] = {EventKind::kArrived,   EventKind::kQueued,
                             EventKind::kScheduled, EventKind::kTokens,
                             EventKind::kPreempted, EventKind::kFinished,
                             EventKind::kStep};
  const uint64_t times[] = {1000, 1001, 1002, 1003, 1005, 1004, 1006};
  for (size_t i = 0; i < ev.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(ev[i].kind, kinds[i]);
    EXPECT_EQ(ev[i].t_ns, times[i]);
    if (ev[i].kind != EventKind::kStep) {
      EXPECT_FALSE(ev[i].rid.is_string);
      EXPECT_EQ(ev[i].rid.number, 7u);
    }
  }
  EXPECT_EQ(ev[0].count, 12u);
  EXPECT_FALSE(ev[0].has_max_tokens);
  EXPECT_FALSE(ev[0].has_n);
  EXPECT_EQ(ev[3].count, 1u);
  EXPECT_EQ(ev[5].reason, FinishReason::kStop);
  EXPECT_EQ(ev[6].step.has, 0u);
  EXPECT_TRUE(sink.event_errors.empty());
}

TEST(FrameDecoderTest, DecodesEveryEventKindWithStringIds) {
  // rid "r-1" = a3 'r' '-' '1'; t = 0 .. 5.
  const Bytes batch = BatchOf(6, {{0x94, 0x01, 0x00, 0xa3, 'r', '-', '1', 0x0c},
                                  {0x93, 0x02, 0x01, 0xa3, 'r', '-', '1'},
                                  {0x93, 0x03, 0x02, 0xa3, 'r', '-', '1'},
                                  {0x94, 0x04, 0x03, 0xa3, 'r', '-', '1', 0x05},
                                  {0x93, 0x06, 0x04, 0xa3, 'r', '-', '1'},
                                  {0x94, 0x05, 0x05, 0xa3, 'r', '-', '1', 0xa6,
                                   'l', 'e', 'n', 'g', 't', 'h'}});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, batch}), sink));
  ASSERT_EQ(sink.batches.size(), 1u);
  const BatchCopy& b = sink.batches[0];
  ASSERT_EQ(b.events.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(b.events[i].rid.is_string);
    EXPECT_EQ(b.rid_texts[i], "r-1");
    EXPECT_EQ(b.events[i].t_ns, i);
  }
  EXPECT_EQ(b.events[0].kind, EventKind::kArrived);
  EXPECT_EQ(b.events[0].count, 12u);
  EXPECT_EQ(b.events[3].kind, EventKind::kTokens);
  EXPECT_EQ(b.events[3].count, 5u);
  EXPECT_EQ(b.events[4].kind, EventKind::kPreempted);
  EXPECT_EQ(b.events[5].kind, EventKind::kFinished);
  EXPECT_EQ(b.events[5].reason, FinishReason::kLength);
}

TEST(FrameDecoderTest, DecodesRequestIdLimits) {
  // A 128-byte str8 id is the longest accepted; a uint64 max id is fine.
  Bytes long_id = {0x93, 0x02, 0x00, 0xd9, 0x80};
  long_id.insert(long_id.end(), 128, 'z');
  const Bytes max_id = {0x93, 0x02, 0x00, 0xcf, 0xff, 0xff,
                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(2, {long_id, max_id})}), sink));
  ASSERT_EQ(sink.batches.size(), 1u);
  ASSERT_EQ(sink.batches[0].events.size(), 2u);
  EXPECT_EQ(sink.batches[0].rid_texts[0], std::string(128, 'z'));
  EXPECT_EQ(sink.batches[0].events[1].rid.number, UINT64_MAX);
}

TEST(FrameDecoderTest, DecodesFinishReasons) {
  const Bytes batch = BatchOf(
      4, {{0x94, 0x05, 0x00, 0x01, 0xa4, 's', 't', 'o', 'p'},
          {0x94, 0x05, 0x00, 0x02, 0xa6, 'l', 'e', 'n', 'g', 't', 'h'},
          {0x94, 0x05, 0x00, 0x03, 0xa5, 'a', 'b', 'o', 'r', 't'},
          {0x94, 0x05, 0x00, 0x04, 0xd9, 0x05, 'e', 'r', 'r', 'o', 'r'}});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, batch}), sink));
  const std::vector<Event> ev = sink.AllEvents();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].reason, FinishReason::kStop);
  EXPECT_EQ(ev[1].reason, FinishReason::kLength);
  EXPECT_EQ(ev[2].reason, FinishReason::kAbort);
  EXPECT_EQ(ev[3].reason, FinishReason::kError);
}

TEST(FrameDecoderTest, DecodesArrivedParamsPresentAndAbsent) {
  struct Case {
    const char* name;
    Bytes event;
    bool has_max_tokens;
    uint64_t max_tokens;
    bool has_n;
    uint64_t n;
  };
  const Case cases[] = {
      {"no params", {0x94, 0x01, 0x00, 0x07, 0x0c}, false, 0, false, 0},
      {"nil params", {0x95, 0x01, 0x00, 0x07, 0x0c, 0xc0}, false, 0, false, 0},
      {"empty params",
       {0x95, 0x01, 0x00, 0x07, 0x0c, 0x80},
       false,
       0,
       false,
       0},
      {"both",
       {0x95, 0x01, 0x00, 0x07, 0x0c, 0x82,  //
        0xaa, 'm',  'a',  'x',  '_',  't',  'o', 'k', 'e', 'n', 's', 0xcd, 0x01,
        0x00,  // max_tokens: 256
        0xa1, 'n',  0x02},
       true,
       256,
       true,
       2},
      {"max_tokens nil",
       {0x95, 0x01, 0x00, 0x07, 0x0c, 0x81,  //
        0xaa, 'm', 'a', 'x', '_', 't', 'o', 'k', 'e', 'n', 's', 0xc0},
       false,
       0,
       false,
       0},
      {"n only, zero",
       {0x95, 0x01, 0x00, 0x07, 0x0c, 0x81, 0xa1, 'n', 0x00},
       false,
       0,
       true,
       0},
      {"unknown keys",
       {0x95, 0x01, 0x00, 0x07, 0x0c, 0x84,  //
        0xab, 't',  'e',  'm',  'p',  'e',  'r',  'a',  't',  'u',  'r',
        'e',  0xcb, 0x3f, 0xe6, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66,  // 0.7
        0x01, 0x02,                                                  // int key
        0xa4, 's',  't',  'o',  'p',  0x91, 0xa1, 'x',  // "stop": ["x"]
        0xa1, 'n',  0x03},
       false,
       0,
       true,
       3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(1, {c.event})}), sink));
    ASSERT_TRUE(sink.event_errors.empty());
    const std::vector<Event> ev = sink.AllEvents();
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, EventKind::kArrived);
    EXPECT_EQ(ev[0].rid.number, 7u);
    EXPECT_EQ(ev[0].count, 12u);
    EXPECT_EQ(ev[0].has_max_tokens, c.has_max_tokens);
    EXPECT_EQ(ev[0].max_tokens, c.max_tokens);
    EXPECT_EQ(ev[0].has_n, c.has_n);
    EXPECT_EQ(ev[0].n, c.n);
  }
}

// STEP with every stats key (and one unknown).
const Bytes kFullStep = {
    0x93, 0x07, 0xcd, 0x07, 0xd0, 0x8c,  // [7, 2000, {12 entries}]
    0xa7, 'r',  'u',  'n',  'n',  'i',  'n',  'g',  0x03,  //
    0xa7, 'w',  'a',  'i',  't',  'i',  'n',  'g',  0x02,  //
    0xa8, 'k',  'v',  '_',  'u',  's',  'a',  'g',  'e',   //
    0xcb, 0x3f, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // 0.5
    0xad, 'p',  'r',  'o',  'm',  'p',  't',  '_',  't',  'o', 'k',
    'e',  'n',  's',  0xcd, 0x01, 0x00,  // 256
    0xb1, 'g',  'e',  'n',  'e',  'r',  'a',  't',  'i',  'o', 'n',
    '_',  't',  'o',  'k',  'e',  'n',  's',  0x10,  //
    0xae, 'p',  'r',  'e',  'f',  'i',  'x',  '_',  'q',  'u', 'e',
    'r',  'i',  'e',  's',  0x64,  //
    0xab, 'p',  'r',  'e',  'f',  'i',  'x',  '_',  'h',  'i', 't',
    's',  0x32,  //
    0xab, 's',  'p',  'e',  'c',  '_',  'd',  'r',  'a',  'f', 't',
    's',  0x04,  //
    0xb1, 's',  'p',  'e',  'c',  '_',  'd',  'r',  'a',  'f', 't',
    '_',  't',  'o',  'k',  'e',  'n',  's',  0x0c,  //
    0xb4, 's',  'p',  'e',  'c',  '_',  'a',  'c',  'c',  'e', 'p',
    't',  'e',  'd',  '_',  't',  'o',  'k',  'e',  'n',  's', 0x09,  //
    0xb5, 's',  'p',  'e',  'c',  '_',  'a',  'c',  'c',  'e', 'p',
    't',  'e',  'd',  '_',  'p',  'e',  'r',  '_',  'p',  'o', 's',
    0x93, 0x04, 0x03, 0x02,                                           //
    0xa6, 'f',  'u',  't',  'u',  'r',  'e',  0x81, 0xa1, 'k', 0x90,  // unknown
};

TEST(FrameDecoderTest, DecodesStepWithEveryKey) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(1, {kFullStep})}), sink));
  ASSERT_TRUE(sink.event_errors.empty());
  ASSERT_EQ(sink.batches.size(), 1u);
  const BatchCopy& b = sink.batches[0];
  ASSERT_EQ(b.events.size(), 1u);
  const Event& e = b.events[0];
  EXPECT_EQ(e.kind, EventKind::kStep);
  EXPECT_EQ(e.t_ns, 2000u);
  const StepStats& st = e.step;
  EXPECT_EQ(st.has, (1u << 11) - 1);  // all eleven keys
  EXPECT_EQ(st.running, 3u);
  EXPECT_EQ(st.waiting, 2u);
  EXPECT_EQ(st.kv_usage, 0.5);
  EXPECT_EQ(st.prompt_tokens, 256u);
  EXPECT_EQ(st.generation_tokens, 16u);
  EXPECT_EQ(st.prefix_queries, 100u);
  EXPECT_EQ(st.prefix_hits, 50u);
  EXPECT_EQ(st.spec_drafts, 4u);
  EXPECT_EQ(st.spec_draft_tokens, 12u);
  EXPECT_EQ(st.spec_accepted_tokens, 9u);
  ASSERT_EQ(st.pos_count, 3u);
  EXPECT_EQ(st.pos_begin, 0u);
  EXPECT_EQ(b.positions, (std::vector<uint64_t>{4, 3, 2}));
}

TEST(FrameDecoderTest, DecodesKvUsageEncodings) {
  struct Case {
    const char* name;
    Bytes value;
    double want;
  };
  const Case cases[] = {
      {"float32 0.75", {0xca, 0x3f, 0x40, 0x00, 0x00}, 0.75},
      {"float64 1.0", {0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, 1.0},
      {"float64 0.0", {0xcb, 0, 0, 0, 0, 0, 0, 0, 0}, 0.0},
      {"int 0", {0x00}, 0.0},
      {"int 1", {0x01}, 1.0},
      {"int 1 as uint16", {0xcd, 0x00, 0x01}, 1.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Bytes step = Cat(
        {{0x93, 0x07, 0x00, 0x81, 0xa8, 'k', 'v', '_', 'u', 's', 'a', 'g', 'e'},
         c.value});
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(1, {step})}), sink));
    const std::vector<Event> ev = sink.AllEvents();
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].step.has, static_cast<uint32_t>(StepStats::kKvUsage));
    EXPECT_EQ(ev[0].step.kv_usage, c.want);
  }
}

TEST(FrameDecoderTest, StepPositionsIndexTheBatch) {
  // STEPs with positions: one with a bad key beside them (the key is
  // dropped, the positions stay), one with a bad list of them (dropped,
  // nothing of it remains), a nil key (absent) and a key twice.
  const Bytes kPerPos = {0xb5, 's', 'p', 'e', 'c', '_', 'a', 'c',
                         'c',  'e', 'p', 't', 'e', 'd', '_', 'p',
                         'e',  'r', '_', 'p', 'o', 's'};
  const Bytes batch =
      BatchOf(5, {Cat({{0x93, 0x07, 0x01, 0x81}, kPerPos, {0x92, 0x05, 0x06}}),
                  Cat({{0x93, 0x07, 0x02, 0x82},
                       kPerPos,
                       {0x92, 0x09, 0x09},
                       {0xa7, 'r', 'u', 'n', 'n', 'i', 'n', 'g', 0xff}}),  // -1
                  Cat({{0x93, 0x07, 0x03, 0x81},
                       kPerPos,
                       {0x92, 0x04, 0xff}}),  // -1 in the list
                  Cat({{0x93, 0x07, 0x04, 0x82},
                       kPerPos,
                       {0x91, 0x07},
                       {0xa7, 'w', 'a', 'i', 't', 'i', 'n', 'g', 0xc0}}),
                  Cat({{0x93, 0x07, 0x05, 0x82},
                       kPerPos,
                       {0x91, 0x01},
                       kPerPos,
                       {0x92, 0x08, 0x08}})});  // the key twice: the last wins
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, batch}), sink));
  EXPECT_TRUE(sink.event_errors.empty());
  const BatchCopy& b = sink.batches.at(0);
  EXPECT_EQ(b.bad_fields, 2u);
  EXPECT_EQ(b.field_drops,
            (std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {2, 1}}));
  ASSERT_EQ(b.events.size(), 5u);
  EXPECT_EQ(b.positions, (std::vector<uint64_t>{5, 6, 9, 9, 7, 8, 8}));
  // {has positions, begin, count} of each STEP.
  const uint32_t kPos = StepStats::kSpecAcceptedPerPos;
  const uint32_t want[5][3] = {
      {kPos, 0, 2}, {kPos, 2, 2}, {0, 0, 0}, {kPos, 4, 1}, {kPos, 5, 2}};
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(b.events[i].step.has, want[i][0]);
    EXPECT_EQ(b.events[i].step.pos_begin, want[i][1]);
    EXPECT_EQ(b.events[i].step.pos_count, want[i][2]);
  }
}

TEST(FrameDecoderTest, SkipsUnknownKindAndAppliesTheRest) {
  const Bytes batch =
      BatchOf(5, {kQueued,
                  {0x93, 0x0e, 0x00, 0x07},  // kind 14 (1.3 knows 13)
                  {0x91, 0x00},              // kind 0
                  {0x95, 0xcd, 0x01, 0x00, 0x00, 0x80, 0x90, 0xa1, 'x'},  // 256
                  kTokens});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, batch}), sink));
  EXPECT_EQ(sink.event_errors,
            (std::vector<IngestError>{IngestError::kUnknownKind,
                                      IngestError::kUnknownKind,
                                      IngestError::kUnknownKind}));
  const std::vector<Event> ev = sink.AllEvents();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, EventKind::kQueued);
  EXPECT_EQ(ev[1].kind, EventKind::kTokens);
}

TEST(FrameDecoderTest, SkipsEventWithBadReason) {
  const Bytes batch = BatchOf(
      3, {kTokens,
          {0x94, 0x05, 0x00, 0x07, 0xa4, 'S', 't', 'o', 'p'},  // case matters
          {0x94, 0x05, 0x00, 0x08, 0xa0}});                    // empty
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, batch}), sink));
  EXPECT_EQ(sink.event_errors,
            (std::vector<IngestError>{IngestError::kBadReason,
                                      IngestError::kBadReason}));
  EXPECT_EQ(sink.AllEvents().size(), 1u);
}

// Feeds [QUEUED, event, TOKENS] in one batch: `event` is skipped as
// bad_event, the other two applied, and nothing of it (STEP positions,
// ARRIVED extras) is left in the batch.
void ExpectSkippedBetweenGoodEvents(const Bytes& event) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(
      Feed(d, Cat({kHello, BatchOf(3, {kQueued, event, kTokens})}), sink))
      << IngestErrorName(d.error());
  EXPECT_EQ(sink.event_errors,
            std::vector<IngestError>{IngestError::kBadEvent});
  const std::vector<Event> ev = sink.AllEvents();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, EventKind::kQueued);
  EXPECT_EQ(ev[1].kind, EventKind::kTokens);
  EXPECT_EQ(ev[1].count, 1u);
  EXPECT_TRUE(sink.batches[0].positions.empty());
  EXPECT_TRUE(sink.batches[0].arrivals.empty());
}

// uint64 2^32 and 2^64 - 1: above every count's range.
const Bytes k2To32 = {0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0};
const Bytes kMaxU64 = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

TEST(FrameDecoderTest, SkipsBadEvent) {
  Bytes long_id = {0x93, 0x02, 0x00, 0xd9, 0x81};  // 129 bytes
  long_id.insert(long_id.end(), 129, 'z');
  struct Case {
    const char* name;
    Bytes event;
  };
  const Case cases[] = {
      {"int, not an array", {0x05}},
      {"map, not an array", {0x81, 0x01, 0x02}},
      {"str, not an array", {0xa1, 'x'}},
      {"empty array", {0x90}},
      {"negative kind", {0x93, 0xff, 0x00, 0x07}},
      {"str kind", {0x93, 0xa1, '2', 0x00, 0x07}},
      {"nil kind", {0x93, 0xc0, 0x00, 0x07}},
      {"ARRIVED of 3", {0x93, 0x01, 0x00, 0x07}},
      {"QUEUED of 2", {0x92, 0x02, 0x00}},
      {"SCHEDULED of 1", {0x91, 0x03}},
      {"TOKENS of 3", {0x93, 0x04, 0x00, 0x07}},
      {"FINISHED of 3", {0x93, 0x05, 0x00, 0x07}},
      {"PREEMPTED of 2", {0x92, 0x06, 0x00}},
      {"STEP of 2", {0x92, 0x07, 0x00}},
      {"t negative fixint", {0x93, 0x02, 0xff, 0x07}},
      {"t negative int64",
       {0x93, 0x02, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe,
        0x07}},
      {"t str", {0x93, 0x02, 0xa1, '0', 0x07}},
      {"t float", {0x93, 0x02, 0xca, 0x3f, 0x80, 0x00, 0x00, 0x07}},
      {"t nil", {0x93, 0x02, 0xc0, 0x07}},
      {"rid negative", {0x93, 0x02, 0x00, 0xd0, 0xfe}},
      {"rid empty str", {0x93, 0x02, 0x00, 0xa0}},
      {"rid 129 bytes", long_id},
      {"rid float", {0x93, 0x02, 0x00, 0xca, 0x3f, 0x80, 0x00, 0x00}},
      {"rid nil", {0x93, 0x02, 0x00, 0xc0}},
      {"rid array", {0x93, 0x02, 0x00, 0x91, 0x07}},
      {"rid bin", {0x93, 0x02, 0x00, 0xc4, 0x01, 'r'}},
      {"TOKENS n 0", {0x94, 0x04, 0x00, 0x07, 0x00}},
      {"TOKENS n negative", {0x94, 0x04, 0x00, 0x07, 0xff}},
      {"TOKENS n str", {0x94, 0x04, 0x00, 0x07, 0xa1, '1'}},
      {"TOKENS n float", {0x94, 0x04, 0x00, 0x07, 0xca, 0x3f, 0x80, 0, 0}},
      {"ARRIVED prompt negative", {0x94, 0x01, 0x00, 0x07, 0xd1, 0xff, 0x00}},
      {"ARRIVED prompt nil", {0x94, 0x01, 0x00, 0x07, 0xc0}},
      {"FINISHED reason int", {0x94, 0x05, 0x00, 0x07, 0x01}},
      {"FINISHED reason nil", {0x94, 0x05, 0x00, 0x07, 0xc0}},
      {"FINISHED reason bin", {0x94, 0x05, 0x00, 0x07, 0xc4, 0x01, 's'}},
      {"STEP stats array", {0x93, 0x07, 0x00, 0x90}},
      {"STEP stats nil", {0x93, 0x07, 0x00, 0xc0}},
      // Counts above TM_MAX_EVENT_COUNT (2^32 - 1): no engine produces
      // them in one event, and they would wrap the daemon's counters.
      {"TOKENS n 2^32", Cat({{0x94, 0x04, 0x00, 0x07}, k2To32})},
      {"TOKENS n 2^64-1", Cat({{0x94, 0x04, 0x00, 0x07}, kMaxU64})},
      {"ARRIVED prompt 2^32", Cat({{0x94, 0x01, 0x00, 0x07}, k2To32})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectSkippedBetweenGoodEvents(c.event);
  }
}

// Partial acceptance (protocol 1.2): an optional field (an ARRIVED params
// key, a STEP key, the params map itself) with a wrong type or out of its
// range is dropped and counted once as bad_field; its event is applied
// without it.
TEST(FrameDecoderTest, DropsABadOptionalFieldAndKeepsItsEvent) {
  Bytes many_positions = {0x93, 0x07, 0x00, 0x81, 0xb5, 's', 'p', 'e',
                          'c',  '_',  'a',  'c',  'c',  'e', 'p', 't',
                          'e',  'd',  '_',  'p',  'e',  'r', '_', 'p',
                          'o',  's',  0xdc, 0x00, 0x41};  // 65 positions
  many_positions.insert(many_positions.end(), 65, 0x01);
  const Bytes kKv = {0xa8, 'k', 'v', '_', 'u', 's', 'a', 'g', 'e'};
  const Bytes kRunning = {0xa7, 'r', 'u', 'n', 'n', 'i', 'n', 'g'};
  const Bytes kPerPos = {0xb5, 's', 'p', 'e', 'c', '_', 'a', 'c',
                         'c',  'e', 'p', 't', 'e', 'd', '_', 'p',
                         'e',  'r', '_', 'p', 'o', 's'};
  const Bytes kMaxTokens = {0xaa, 'm', 'a', 'x', '_', 't',
                            'o',  'k', 'e', 'n', 's'};
  const Bytes kPrefixQueries = {0xae, 'p', 'r', 'e', 'f', 'i', 'x', '_',
                                'q',  'u', 'e', 'r', 'i', 'e', 's'};
  struct Case {
    const char* name;
    Bytes event;
  };
  const Case cases[] = {
      {"ARRIVED params array", {0x95, 0x01, 0x00, 0x07, 0x0c, 0x90}},
      {"ARRIVED params str", {0x95, 0x01, 0x00, 0x07, 0x0c, 0xa1, 'x'}},
      {"ARRIVED max_tokens str",
       Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x81}, kMaxTokens, {0xa1, '1'}})},
      {"ARRIVED max_tokens negative",
       Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x81}, kMaxTokens, {0xff}})},
      {"ARRIVED n float",
       {0x95, 0x01, 0x00, 0x07, 0x0c, 0x81, 0xa1, 'n', 0xca, 0x3f, 0x80, 0, 0}},
      {"STEP running negative",
       Cat({{0x93, 0x07, 0x00, 0x81}, kRunning, {0xff}})},
      {"STEP running str",
       Cat({{0x93, 0x07, 0x00, 0x81}, kRunning, {0xa1, '3'}})},
      {"STEP running float",
       Cat({{0x93, 0x07, 0x00, 0x81}, kRunning, {0xca, 0x40, 0x40, 0, 0}})},
      {"STEP kv_usage 1.5", Cat({{0x93, 0x07, 0x00, 0x81},
                                 kKv,
                                 {0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}})},
      {"STEP kv_usage NaN", Cat({{0x93, 0x07, 0x00, 0x81},
                                 kKv,
                                 {0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0}})},
      {"STEP kv_usage float32 NaN",
       Cat({{0x93, 0x07, 0x00, 0x81}, kKv, {0xca, 0x7f, 0xc0, 0, 0}})},
      {"STEP kv_usage -0.25",
       Cat({{0x93, 0x07, 0x00, 0x81}, kKv, {0xca, 0xbe, 0x80, 0, 0}})},
      {"STEP kv_usage +inf",
       Cat({{0x93, 0x07, 0x00, 0x81}, kKv, {0xca, 0x7f, 0x80, 0, 0}})},
      {"STEP kv_usage int 2", Cat({{0x93, 0x07, 0x00, 0x81}, kKv, {0x02}})},
      {"STEP kv_usage int -1", Cat({{0x93, 0x07, 0x00, 0x81}, kKv, {0xff}})},
      {"STEP kv_usage str",
       Cat({{0x93, 0x07, 0x00, 0x81}, kKv, {0xa3, '0', '.', '5'}})},
      {"STEP spec_accepted_per_pos map",
       Cat({{0x93, 0x07, 0x00, 0x81}, kPerPos, {0x80}})},
      {"STEP spec_accepted_per_pos negative",
       Cat({{0x93, 0x07, 0x00, 0x81}, kPerPos, {0x92, 0x01, 0xff}})},
      {"STEP spec_accepted_per_pos str",
       Cat({{0x93, 0x07, 0x00, 0x81}, kPerPos, {0x91, 0xa1, '1'}})},
      {"STEP 65 positions", many_positions},
      {"ARRIVED max_tokens 2^32",
       Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x81}, kMaxTokens, k2To32})},
      {"ARRIVED n 2^32",
       Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x81, 0xa1, 'n'}, k2To32})},
      {"STEP running 2^32", Cat({{0x93, 0x07, 0x00, 0x81}, kRunning, k2To32})},
      {"STEP prefix_queries 2^64-1",
       Cat({{0x93, 0x07, 0x00, 0x81}, kPrefixQueries, kMaxU64})},
      {"STEP spec_accepted_per_pos 2^32",
       Cat({{0x93, 0x07, 0x00, 0x81}, kPerPos, {0x92, 0x01}, k2To32})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(
        Feed(d, Cat({kHello, BatchOf(3, {kQueued, c.event, kTokens})}), sink))
        << IngestErrorName(d.error());
    EXPECT_TRUE(sink.event_errors.empty());
    ASSERT_EQ(sink.batches.size(), 1u);
    EXPECT_EQ(sink.batches[0].bad_fields, 1u);
    EXPECT_EQ(sink.batches[0].field_drops,
              (std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}}));
    const std::vector<Event> ev = sink.AllEvents();
    ASSERT_EQ(ev.size(), 3u);
    EXPECT_EQ(ev[0].kind, EventKind::kQueued);
    EXPECT_EQ(ev[2].kind, EventKind::kTokens);
    // Applied without the field: nothing of it is left.
    EXPECT_FALSE(ev[1].has_max_tokens);
    EXPECT_FALSE(ev[1].has_n);
    if (ev[1].kind == EventKind::kArrived) {
      EXPECT_EQ(ev[1].count, 12u);  // the prompt tokens: kept
    } else {
      ASSERT_EQ(ev[1].kind, EventKind::kStep);
      EXPECT_EQ(ev[1].step.has, 0u);
    }
    EXPECT_TRUE(sink.batches[0].positions.empty());
    EXPECT_TRUE(sink.batches[0].arrivals.empty());
  }
  // field_drops names each event by its place among the valid ones (a
  // skipped event before it takes none) with its count: a map with a key
  // twice, both bad, drops two fields.
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  const Bytes twice = Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x82},
                           kMaxTokens,
                           {0xa1, '1'},
                           kMaxTokens,
                           k2To32});
  ASSERT_TRUE(Feed(d,
                   Cat({kHello, BatchOf(4, {{0x91, 0x04},
                                            kQueued,
                                            twice,
                                            Cat({{0x93, 0x07, 0x00, 0x81},
                                                 kKv,
                                                 {0xca, 0x7f, 0x80, 0, 0}})})}),
                   sink));
  EXPECT_EQ(sink.event_errors,
            std::vector<IngestError>{IngestError::kBadEvent});
  ASSERT_EQ(sink.batches.size(), 1u);
  EXPECT_EQ(sink.batches[0].bad_fields, 3u);
  EXPECT_EQ(sink.batches[0].field_drops,
            (std::vector<std::pair<uint32_t, uint32_t>>{{1, 2}, {2, 1}}));
}

// TM_MAX_EVENT_COUNT itself is a valid count in every count position.
TEST(FrameDecoderTest, AcceptsCountsUpToTheMaximum) {
  const Bytes kMax = {0xce, 0xff, 0xff, 0xff, 0xff};  // uint32 2^32 - 1
  const Bytes kPq = {0xae, 'p', 'r', 'e', 'f', 'i', 'x', '_',
                     'q',  'u', 'e', 'r', 'i', 'e', 's'};
  const Bytes kPerPos = {0xb5, 's', 'p', 'e', 'c', '_', 'a', 'c',
                         'c',  'e', 'p', 't', 'e', 'd', '_', 'p',
                         'e',  'r', '_', 'p', 'o', 's'};
  const Bytes tokens = Cat({{0x94, 0x04, 0x00, 0x07}, kMax});
  const Bytes arrived =
      Cat({{0x95, 0x01, 0x00, 0x07}, kMax, {0x81, 0xa1, 'n'}, kMax});
  const Bytes step =
      Cat({{0x93, 0x07, 0x00, 0x82}, kPq, kMax, kPerPos, {0x91}, kMax});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(3, {tokens, arrived, step})}), sink))
      << IngestErrorName(d.error());
  EXPECT_TRUE(sink.event_errors.empty());
  const std::vector<Event> ev = sink.AllEvents();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].count, TM_MAX_EVENT_COUNT);
  EXPECT_EQ(ev[1].count, TM_MAX_EVENT_COUNT);
  EXPECT_EQ(ev[1].n, TM_MAX_EVENT_COUNT);
  EXPECT_EQ(ev[2].step.prefix_queries, TM_MAX_EVENT_COUNT);
  ASSERT_EQ(sink.batches[0].positions.size(), 1u);
  EXPECT_EQ(sink.batches[0].positions[0], TM_MAX_EVENT_COUNT);
}

TEST(FrameDecoderTest, RejectsNegativeIntWhereUintExpected) {
  // Every int field, negative in some signed encoding: the event is
  // skipped, not the frame.
  const Bytes cases[] = {
      {0x94, 0x04, 0xd0, 0xff, 0x07, 0x01},                    // t int8 -1
      {0x94, 0x04, 0x00, 0xd1, 0xff, 0xff, 0x01},              // rid int16 -1
      {0x94, 0x04, 0x00, 0x07, 0xd2, 0xff, 0xff, 0xff, 0xff},  // n int32 -1
      {0x94, 0x01, 0x00, 0x07, 0xe0},                          // prompt -32
      {0x94, 0xd0, 0xfc, 0x00, 0x07, 0x01},                    // kind -4
  };
  for (const Bytes& event : cases) {
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(1, {event})}), sink));
    EXPECT_EQ(sink.event_errors,
              std::vector<IngestError>{IngestError::kBadEvent});
    EXPECT_TRUE(sink.AllEvents().empty());
  }
}

TEST(FrameDecoderTest, AcceptsNonMinimalIntEncodings) {
  // The value 5 in every int encoding, in every int position of TOKENS and
  // as frame type, seq and kind.
  const Bytes fives[] = {
      {0x05},
      {0xcc, 0x05},
      {0xcd, 0x00, 0x05},
      {0xce, 0x00, 0x00, 0x00, 0x05},
      {0xcf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05},
      {0xd0, 0x05},
      {0xd1, 0x00, 0x05},
      {0xd2, 0x00, 0x00, 0x00, 0x05},
      {0xd3, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05},
  };
  for (const Bytes& five : fives) {
    SCOPED_TRACE(static_cast<int>(five[0]));
    const Bytes batch = Cat({{0x94, 0xcc, 0x01},
                             five,
                             five,
                             {0x92},
                             {0x94, 0xd0, 0x04},
                             five,
                             five,
                             five,
                             {0x94, 0xcd, 0x00, 0x04, 0x00, 0x00, 0x01}});
    const Bytes hello =
        Cat({{0x92, 0xd3, 0,   0,   0,   0,   0,    0, 0, 0, 0x83,  //
              0xa5, 'p',  'r', 'o', 't', 'o', 0xce, 0, 0, 0, 0x01},
             kEngine,
             kModel});
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, Cat({hello, batch}), sink))
        << IngestErrorName(d.error());
    ASSERT_EQ(sink.hellos.size(), 1u);
    ASSERT_EQ(sink.batches.size(), 1u);
    EXPECT_EQ(sink.batches[0].seq, 5u);
    EXPECT_EQ(sink.batches[0].dropped_total, 5u);
    const std::vector<Event>& ev = sink.batches[0].events;
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0].kind, EventKind::kTokens);
    EXPECT_EQ(ev[0].t_ns, 5u);
    EXPECT_EQ(ev[0].rid.number, 5u);
    EXPECT_EQ(ev[0].count, 5u);
    EXPECT_EQ(ev[1].kind, EventKind::kTokens);
    EXPECT_TRUE(sink.event_errors.empty());
  }
}

TEST(FrameDecoderTest, DecodesFullRangeTimestamps) {
  const Bytes batch = BatchOf(2, {{0x93, 0x02, 0xcf, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff, 0x01},
                                  {0x93, 0x02, 0xd3, 0x7f, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff, 0x01}});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, batch}), sink));
  const std::vector<Event> ev = sink.AllEvents();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].t_ns, UINT64_MAX);
  EXPECT_EQ(ev[1].t_ns, static_cast<uint64_t>(INT64_MAX));
}

TEST(FrameDecoderTest, IgnoresExtraTrailingElements) {
  const Bytes hello = Cat({{0x93},
                           Bytes(kHello.begin() + 1, kHello.end()),
                           {0x81, 0xa1, 'x', 0x01}});
  const Bytes batch = {
      0x96, 0x01, 0x00, 0x00, 0x94,                    // [1,0,0,[4 ev],
      0x96, 0x04, 0x0a, 0x07, 0x02, 0x90, 0xa1, 'x',   //   TOKENS +2
      0x95, 0x02, 0x0b, 0x07, 0xc0, 0x81, 0x01, 0x02,  //   QUEUED +2
      0x96, 0x05, 0x0c, 0x07, 0xa5, 'a',  'b',  'o',  'r',
      't',  0xc3, 0xc2, 0x94, 0x07, 0x0d, 0x80, 0xcb, 0,
      0,    0,    0,    0,    0,    0,    0,  //   STEP +1
      0xa1, 'y',  0x80};                      // ...,"y",{}]
  const Bytes goodbye = {0x93, 0x02, 0x90, 0xa1, 'z'};
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({hello, batch, goodbye}), sink));
  EXPECT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(sink.goodbyes, 1);
  EXPECT_TRUE(sink.event_errors.empty());
  const std::vector<Event> ev = sink.AllEvents();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].kind, EventKind::kTokens);
  EXPECT_EQ(ev[0].count, 2u);
  EXPECT_EQ(ev[1].kind, EventKind::kQueued);
  EXPECT_EQ(ev[1].t_ns, 11u);
  EXPECT_EQ(ev[2].kind, EventKind::kFinished);
  EXPECT_EQ(ev[2].reason, FinishReason::kAbort);
  EXPECT_EQ(ev[3].kind, EventKind::kStep);
  EXPECT_EQ(ev[3].t_ns, 13u);
}

// ---------------------------------------------------------------------------
// Protocol 1.1: HELLO profile, cache_config and max_lora; ARRIVED lora and
// labels.

// The characters of `s`, without a header (the header byte is spelled out
// where it is used).
Bytes Chars(std::string_view s) { return Bytes(s.begin(), s.end()); }

const Bytes kProfileKey = {0xa7, 'p', 'r', 'o', 'f', 'i', 'l', 'e'};
const Bytes kCacheConfigKey = {0xac, 'c', 'a', 'c', 'h', 'e', '_',
                               'c',  'o', 'n', 'f', 'i', 'g'};
const Bytes kMaxLoraKey = {0xa8, 'm', 'a', 'x', '_', 'l', 'o', 'r', 'a'};
const Bytes kSessionKey = Cat({{0xa7}, Chars("session")});
const Bytes kAckKey = Cat({{0xa3}, Chars("ack")});
const Bytes kLoraKey = {0xa4, 'l', 'o', 'r', 'a'};
const Bytes kLabelsParamKey = {0xa6, 'l', 'a', 'b', 'e', 'l', 's'};

// A HELLO of proto, engine, model and `extra` (one meta entry, key and
// value).
Bytes HelloWith(const Bytes& extra) {
  return HelloOf(4, {kProto, kEngine, kModel, extra});
}

// A HELLO whose cache_config is the one entry {"k": <value>}.
Bytes HelloWithCacheConfigValue(const Bytes& value) {
  return HelloWith(Cat({kCacheConfigKey, {0x81, 0xa1, 'k'}, value}));
}

// A HELLO that the decoder accepts; its Hello.
Hello DecodeHelloOk(const Bytes& bytes) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  EXPECT_TRUE(Feed(d, bytes, sink)) << IngestErrorName(d.error());
  EXPECT_EQ(sink.hellos.size(), 1u);
  return sink.hellos.empty() ? Hello{} : sink.hellos[0];
}

TEST(FrameDecoderTest, AcceptsEachProfile) {
  for (const char* p : {"vllm", "sglang", "lmdeploy"}) {
    SCOPED_TRACE(p);
    const std::string_view name(p);
    const Hello h = DecodeHelloOk(HelloWith(
        Cat({kProfileKey, {uint8_t(0xa0 | name.size())}, Chars(name)})));
    EXPECT_EQ(h.profile, name);
  }
  EXPECT_EQ(DecodeHelloOk(kHello).profile, "");
}

TEST(FrameDecoderTest, RejectsProfileNotOneOfTheThree) {
  ExpectFrameErrors({
      {"auto (a daemon flag value, not a HELLO one)",
       HelloWith(Cat({kProfileKey, {0xa4}, Chars("auto")})),
       IngestError::kBadHello},
      {"upper case", HelloWith(Cat({kProfileKey, {0xa4}, Chars("VLLM")})),
       IngestError::kBadHello},
      {"trailing space", HelloWith(Cat({kProfileKey, {0xa5}, Chars("vllm ")})),
       IngestError::kBadHello},
      {"tensorrt", HelloWith(Cat({kProfileKey, {0xa3}, Chars("trt")})),
       IngestError::kBadHello},
      {"empty", HelloWith(Cat({kProfileKey, {0xa0}})), IngestError::kBadHello},
      {"int", HelloWith(Cat({kProfileKey, {0x01}})), IngestError::kBadHello},
      {"nil", HelloWith(Cat({kProfileKey, {0xc0}})), IngestError::kBadHello},
      {"not utf-8", HelloWith(Cat({kProfileKey, {0xa2, 0xc3, 0x28}})),
       IngestError::kBadHello},
      {"twice",
       HelloOf(5, {kProto, kEngine, kModel,
                   Cat({kProfileKey, {0xa4}, Chars("vllm")}),
                   Cat({kProfileKey, {0xa4}, Chars("vllm")})}),
       IngestError::kBadHello},
  });
}

TEST(FrameDecoderTest, RendersCacheConfigValues) {
  const double kNaN = std::nan("");
  struct Case {
    const char* name;
    Bytes value;
    std::string want;
    double number;  // NaN: not a number
  };
  const Case cases[] = {
      {"str as given", Cat({{0xa4}, Chars("fp8 ")}), "fp8 ", kNaN},
      {"str that looks like a number", Cat({{0xa2}, Chars("16")}), "16", kNaN},
      {"empty str", {0xa0}, "", kNaN},
      {"utf-8 str", {0xa2, 0xc3, 0xa9}, "\xc3\xa9", kNaN},
      {"fixint", {0x10}, "16", 16},
      {"zero", {0x00}, "0", 0},
      {"uint32", {0xce, 0x00, 0x01, 0x00, 0x00}, "65536", 65536},
      {"uint64 max",
       {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
       "18446744073709551615",
       18446744073709551615.0},
      {"negative fixint", {0xff}, "-1", -1},
      {"int16 -300", {0xd1, 0xfe, 0xd4}, "-300", -300},
      {"int64 min",
       {0xd3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
       "-9223372036854775808",
       -9223372036854775808.0},
      {"float64 0.9",
       {0xcb, 0x3f, 0xec, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcd},
       "0.9",
       0.9},
      {"float64 1.0", {0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, "1", 1.0},
      {"float64 -2.5", {0xcb, 0xc0, 0x04, 0, 0, 0, 0, 0, 0}, "-2.5", -2.5},
      {"float64 1e300",
       {0xcb, 0x7e, 0x37, 0xe4, 0x3c, 0x88, 0x00, 0x75, 0x9c},
       "1e+300",
       1e300},
      // Shortest round trip of the float32 itself, not of its double.
      {"float32 0.9", {0xca, 0x3f, 0x66, 0x66, 0x66}, "0.9", double(0.9f)},
      {"float32 0.5", {0xca, 0x3f, 0x00, 0x00, 0x00}, "0.5", 0.5},
      {"true", {0xc3}, "True", kNaN},
      {"false", {0xc2}, "False", kNaN},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Hello h = DecodeHelloOk(HelloWithCacheConfigValue(c.value));
    EXPECT_TRUE(h.has_cache_config);
    ASSERT_EQ(h.cache_config.size(), 1u);
    EXPECT_EQ(h.cache_config[0].key, "k");
    EXPECT_EQ(h.cache_config[0].value, c.want);
    if (std::isnan(c.number)) {
      EXPECT_TRUE(std::isnan(h.cache_config[0].number))
          << h.cache_config[0].number;
    } else {
      EXPECT_EQ(h.cache_config[0].number, c.number);
    }
  }
}

TEST(FrameDecoderTest, KeepsCacheConfigInHelloOrder) {
  // {"page_size": 16, "num_pages": 8192, "dtype": "auto"}
  const Hello h = DecodeHelloOk(HelloWith(Cat({kCacheConfigKey,
                                               {0x83, 0xa9},
                                               Chars("page_size"),
                                               {0x10, 0xa9},
                                               Chars("num_pages"),
                                               {0xcd, 0x20, 0x00, 0xa5},
                                               Chars("dtype"),
                                               {0xa4},
                                               Chars("auto")})));
  ASSERT_EQ(h.cache_config.size(), 3u);
  EXPECT_EQ(h.cache_config[0].key, "page_size");
  EXPECT_EQ(h.cache_config[0].value, "16");
  EXPECT_EQ(h.cache_config[1].key, "num_pages");
  EXPECT_EQ(h.cache_config[1].value, "8192");
  EXPECT_EQ(h.cache_config[1].number, 8192);
  EXPECT_EQ(h.cache_config[2].key, "dtype");
  EXPECT_EQ(h.cache_config[2].value, "auto");
  // An empty map is a cache_config too (cache_config_info with no entry).
  const Hello empty = DecodeHelloOk(HelloWith(Cat({kCacheConfigKey, {0x80}})));
  EXPECT_TRUE(empty.has_cache_config);
  EXPECT_TRUE(empty.cache_config.empty());
  EXPECT_FALSE(DecodeHelloOk(kHello).has_cache_config);
}

// n cache_config entries "a0": 0, "a1": 1, ... (map16 header).
Bytes CacheConfigOf(uint8_t n) {
  Bytes out = Cat({kCacheConfigKey, {0xde, 0x00, n}});
  for (uint8_t i = 0; i < n; ++i) {
    const std::string key = "a" + std::to_string(i);
    out.push_back(uint8_t(0xa0 | key.size()));
    out.insert(out.end(), key.begin(), key.end());
    out.push_back(i);  // positive fixint
  }
  return out;
}

TEST(FrameDecoderTest, AcceptsThirtyTwoCacheConfigEntries) {
  const Hello h = DecodeHelloOk(HelloWith(CacheConfigOf(32)));
  ASSERT_EQ(h.cache_config.size(), 32u);
  EXPECT_EQ(h.cache_config[31].key, "a31");
  EXPECT_EQ(h.cache_config[31].value, "31");
}

// cache_config only informs (protocol 1.2, partial acceptance): a value that
// is not a map of at most 32 entries is dropped whole, a bad entry alone;
// each counts once as bad_field and the HELLO is accepted.
TEST(FrameDecoderTest, DropsBadCacheConfig) {
  const Bytes kNaN64 = {0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0};
  struct Case {
    const char* name;
    Bytes bytes;
    bool has_cache_config;  // false: the map dropped whole
  };
  const Case cases[] = {
      {"not a map (array)", HelloWith(Cat({kCacheConfigKey, {0x91, 0x01}})),
       false},
      {"not a map (str)", HelloWith(Cat({kCacheConfigKey, {0xa1, 'x'}})),
       false},
      {"not a map (nil)", HelloWith(Cat({kCacheConfigKey, {0xc0}})), false},
      {"33 entries", HelloWith(CacheConfigOf(33)), false},
      {"key starts with a digit",
       HelloWith(Cat({kCacheConfigKey, {0x81, 0xa2, '1', 'k', 0x01}})), true},
      {"key with a dash",
       HelloWith(Cat({kCacheConfigKey, {0x81, 0xa3, 'a', '-', 'b', 0x01}})),
       true},
      {"key empty", HelloWith(Cat({kCacheConfigKey, {0x81, 0xa0, 0x01}})),
       true},
      {"key an int", HelloWith(Cat({kCacheConfigKey, {0x81, 0x01, 0x01}})),
       true},
      {"key not utf-8",
       HelloWith(Cat({kCacheConfigKey, {0x81, 0xa2, 0xc3, 0x28, 0x01}})), true},
      {"key reserved (model_name)",
       HelloWith(
           Cat({kCacheConfigKey, {0x81, 0xaa}, Chars("model_name"), {0x01}})),
       true},
      {"key reserved (max_lora)",
       HelloWith(
           Cat({kCacheConfigKey, {0x81, 0xa8}, Chars("max_lora"), {0x01}})),
       true},
      {"key reserved (__ prefix)",
       HelloWith(Cat({kCacheConfigKey, {0x81, 0xa3, '_', '_', 'k', 0x01}})),
       true},
      {"value an array", HelloWithCacheConfigValue({0x91, 0x01}), true},
      {"value a map", HelloWithCacheConfigValue({0x81, 0xa1, 'x', 0x01}), true},
      {"value nil", HelloWithCacheConfigValue({0xc0}), true},
      {"value bin", HelloWithCacheConfigValue({0xc4, 0x01, 'x'}), true},
      {"value ext", HelloWithCacheConfigValue({0xd4, 0x01, 0x00}), true},
      {"value float64 NaN", HelloWithCacheConfigValue(kNaN64), true},
      {"value float64 +inf",
       HelloWithCacheConfigValue({0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0}), true},
      {"value float64 -inf",
       HelloWithCacheConfigValue({0xcb, 0xff, 0xf0, 0, 0, 0, 0, 0, 0}), true},
      {"value float32 +inf",
       HelloWithCacheConfigValue({0xca, 0x7f, 0x80, 0x00, 0x00}), true},
      {"value float32 NaN",
       HelloWithCacheConfigValue({0xca, 0x7f, 0xc0, 0x00, 0x00}), true},
      {"value not utf-8", HelloWithCacheConfigValue({0xa2, 0xc3, 0x28}), true},
      {"value a lone continuation byte",
       HelloWithCacheConfigValue({0xa1, 0x80}), true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Hello h = DecodeHelloOk(c.bytes);
    EXPECT_EQ(h.has_cache_config, c.has_cache_config);
    EXPECT_TRUE(h.cache_config.empty());
    EXPECT_EQ(h.bad_fields, 1u);
    EXPECT_EQ(h.model, "m1");  // the rest of the HELLO is read
  }
  // A good entry beside bad ones is kept; a repeated key drops the repeat.
  const Hello h = DecodeHelloOk(HelloWith(
      Cat({kCacheConfigKey,
           {0x84, 0xa1, 'k', 0x01, 0xa1, 'k', 0x02, 0xa2, '1', 'x', 0x03},
           {0xa1, 'v', 0xc0}})));
  ASSERT_EQ(h.cache_config.size(), 1u);
  EXPECT_EQ(h.cache_config[0].key, "k");
  EXPECT_EQ(h.cache_config[0].value, "1");
  EXPECT_EQ(h.bad_fields, 3u);
  // Twice is still ambiguous: the HELLO is refused.
  ExpectFrameErrors({
      {"cache_config twice",
       HelloOf(5, {kProto, kEngine, kModel, Cat({kCacheConfigKey, {0x80}}),
                   Cat({kCacheConfigKey, {0x80}})}),
       IngestError::kBadHello},
  });
}

TEST(FrameDecoderTest, AcceptsMaxLora) {
  struct Case {
    const char* name;
    Bytes value;
    int64_t want;
  };
  const Case cases[] = {
      {"0", {0x00}, 0},
      {"8", {0x08}, 8},
      {"uint16", {0xcd, 0x01, 0x00}, 256},
      {"int64 max",
       {0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
       INT64_MAX},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Hello h = DecodeHelloOk(HelloWith(Cat({kMaxLoraKey, c.value})));
    EXPECT_TRUE(h.has_max_lora);
    EXPECT_EQ(h.max_lora, c.want);
  }
  EXPECT_FALSE(DecodeHelloOk(kHello).has_max_lora);
}

// max_lora only informs: a bad value is dropped (bad_field), the HELLO is
// accepted without it.
TEST(FrameDecoderTest, DropsBadMaxLora) {
  struct Case {
    const char* name;
    Bytes value;
  };
  const Case cases[] = {
      {"negative fixint", {0xff}},
      {"negative int8", {0xd0, 0x80}},
      {"above int64", {0xcf, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}},
      {"str", {0xa1, '8'}},
      {"float", {0xca, 0x41, 0x00, 0x00, 0x00}},
      {"bool", {0xc3}},
      {"nil", {0xc0}},
      {"array", {0x91, 0x01}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Hello h = DecodeHelloOk(HelloWith(Cat({kMaxLoraKey, c.value})));
    EXPECT_FALSE(h.has_max_lora);
    EXPECT_EQ(h.bad_fields, 1u);
  }
  ExpectFrameErrors({
      {"twice",
       HelloOf(5, {kProto, kEngine, kModel, Cat({kMaxLoraKey, {0x01}}),
                   Cat({kMaxLoraKey, {0x02}})}),
       IngestError::kBadHello},
  });
}

// pid only informs (the client-drop slot): a bad one is dropped.
TEST(FrameDecoderTest, DropsBadPid) {
  const Bytes kPidKey = {0xa3, 'p', 'i', 'd'};
  for (const Bytes& value :
       {Bytes{0xa1, '1'}, Bytes{0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}, Bytes{0xc0},
        Bytes{0x90}}) {
    SCOPED_TRACE(value[0]);
    const Hello h = DecodeHelloOk(HelloWith(Cat({kPidKey, value})));
    EXPECT_FALSE(h.has_pid);
    EXPECT_EQ(h.bad_fields, 1u);
  }
  const Hello good = DecodeHelloOk(HelloWith(Cat({kPidKey, {0x2a}})));
  EXPECT_TRUE(good.has_pid);
  EXPECT_EQ(good.pid, 42);
  EXPECT_EQ(good.bad_fields, 0u);
}

TEST(FrameDecoderTest, AcceptsSessionAndAck) {
  const Hello none = DecodeHelloOk(kHello);
  EXPECT_FALSE(none.has_session);
  EXPECT_FALSE(none.ack);
  const Hello s = DecodeHelloOk(HelloWith(Cat({kSessionKey, {0x07}})));
  EXPECT_TRUE(s.has_session);
  EXPECT_EQ(s.session, 7u);
  EXPECT_FALSE(s.ack);
  const Hello a = DecodeHelloOk(
      HelloOf(5, {kProto, kEngine, kModel,
                  Cat({kSessionKey,
                       {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}}),
                  Cat({kAckKey, {0xc3}})}));
  EXPECT_EQ(a.session, UINT64_MAX - 1);
  EXPECT_TRUE(a.ack);
  // ack false needs no session.
  const Hello f = DecodeHelloOk(HelloWith(Cat({kAckKey, {0xc2}})));
  EXPECT_FALSE(f.ack);
  EXPECT_FALSE(f.has_session);
}

TEST(FrameDecoderTest, RejectsBadSessionAndAck) {
  ExpectFrameErrors({
      {"ack without session", HelloWith(Cat({kAckKey, {0xc3}})),
       IngestError::kBadHello},
      {"negative session", HelloWith(Cat({kSessionKey, {0xff}})),
       IngestError::kBadHello},
      {"str session", HelloWith(Cat({kSessionKey, {0xa1, '1'}})),
       IngestError::kBadHello},
      {"nil session", HelloWith(Cat({kSessionKey, {0xc0}})),
       IngestError::kBadHello},
      {"int ack",
       HelloOf(5, {kProto, kEngine, kModel, Cat({kSessionKey, {0x01}}),
                   Cat({kAckKey, {0x01}})}),
       IngestError::kBadHello},
      {"session twice",
       HelloOf(5, {kProto, kEngine, kModel, Cat({kSessionKey, {0x01}}),
                   Cat({kSessionKey, {0x02}})}),
       IngestError::kBadHello},
      {"ack twice",
       HelloOf(6, {kProto, kEngine, kModel, Cat({kSessionKey, {0x01}}),
                   Cat({kAckKey, {0xc3}}), Cat({kAckKey, {0xc3}})}),
       IngestError::kBadHello},
  });
}

TEST(FrameDecoderTest, AcceptsHelloWithEveryNewKey) {
  const Hello h = DecodeHelloOk(HelloOf(
      6, {kProto, kEngine, kModel, Cat({kProfileKey, {0xa6}, Chars("sglang")}),
          Cat({kCacheConfigKey, {0x81, 0xa9}, Chars("page_size"), {0x10}}),
          Cat({kMaxLoraKey, {0x04}})}));
  EXPECT_EQ(h.profile, "sglang");
  ASSERT_EQ(h.cache_config.size(), 1u);
  EXPECT_EQ(h.cache_config[0].key, "page_size");
  EXPECT_EQ(h.max_lora, 4);
}

// [1, 1000, 7, 12, params] with a params map of n entries.
Bytes ArrivedWithParamsMap(uint8_t n, std::initializer_list<Bytes> entries) {
  Bytes out = {0x95, 0x01, 0xcd, 0x03,
               0xe8, 0x07, 0x0c, static_cast<uint8_t>(0x80 | n)};
  for (const Bytes& e : entries) out.insert(out.end(), e.begin(), e.end());
  return out;
}

TEST(FrameDecoderTest, DecodesArrivedLoraAndLabels) {
  Bytes lora128 = {0xd9, 0x80};  // str8 of 128 bytes
  lora128.insert(lora128.end(), 128, 'l');
  Bytes value128 = {0xd9, 0x80};
  value128.insert(value128.end(), 128, 'v');
  struct Case {
    const char* name;
    Bytes event;
    bool has_extras;
    ArrivalCopy want;
  };
  const Case cases[] = {
      {"lora",
       ArrivedWithParamsMap(1, {Cat({kLoraKey, {0xa2, 'a', '1'}})}),
       true,
       {"a1", {}}},
      {"lora of 128 bytes",
       ArrivedWithParamsMap(1, {Cat({kLoraKey, lora128})}),
       true,
       {std::string(128, 'l'), {}}},
      {"utf-8 lora",
       ArrivedWithParamsMap(1, {Cat({kLoraKey, {0xa2, 0xc3, 0xa9}})}),
       true,
       {"\xc3\xa9", {}}},
      {"labels",
       ArrivedWithParamsMap(1, {Cat({kLabelsParamKey,
                                     {0x82, 0xa6},
                                     Chars("tenant"),
                                     {0xa4},
                                     Chars("acme"),
                                     {0xa4},
                                     Chars("tier"),
                                     {0xa4},
                                     Chars("gold")})}),
       true,
       {"", {{"tenant", "acme"}, {"tier", "gold"}}}},
      {"four labels, one with an empty value, one of 128 bytes",
       ArrivedWithParamsMap(
           1, {Cat({kLabelsParamKey,
                    {0x84, 0xa1, 'a', 0xa1, '1', 0xa1, 'b', 0xa0, 0xa1, 'c'},
                    value128,
                    {0xa1, '_', 0xa1, '4'}})}),
       true,
       {"", {{"a", "1"}, {"b", ""}, {"c", std::string(128, 'v')}, {"_", "4"}}}},
      {"lora, labels and max_tokens",
       ArrivedWithParamsMap(
           3, {Cat({kLabelsParamKey, {0x81, 0xa1, 't', 0xa1, 'x'}}),
               {0xaa, 'm', 'a', 'x', '_', 't', 'o', 'k', 'e', 'n', 's', 0x20},
               Cat({kLoraKey, {0xa1, 'z'}})}),
       true,
       {"z", {{"t", "x"}}}},
      {"lora nil: absent",
       ArrivedWithParamsMap(1, {Cat({kLoraKey, {0xc0}})}),
       false,
       {}},
      {"labels nil: absent",
       ArrivedWithParamsMap(1, {Cat({kLabelsParamKey, {0xc0}})}),
       false,
       {}},
      {"labels empty: none",
       ArrivedWithParamsMap(1, {Cat({kLabelsParamKey, {0x80}})}),
       false,
       {}},
      {"neither", ArrivedWithParamsMap(0, {}), false, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(1, {c.event})}), sink))
        << IngestErrorName(d.error());
    ASSERT_TRUE(sink.event_errors.empty());
    ASSERT_EQ(sink.batches.size(), 1u);
    const BatchCopy& b = sink.batches[0];
    ASSERT_EQ(b.events.size(), 1u);
    EXPECT_EQ(b.events[0].count, 12u);
    if (!c.has_extras) {
      EXPECT_EQ(b.events[0].extras, Event::kNoExtras);
      EXPECT_TRUE(b.arrivals.empty());
      continue;
    }
    ASSERT_EQ(b.events[0].extras, 0u);
    ASSERT_EQ(b.arrivals.size(), 1u);
    EXPECT_EQ(b.arrivals[0].lora, c.want.lora);
    EXPECT_EQ(b.arrivals[0].labels, c.want.labels);
  }
}

TEST(FrameDecoderTest, ArrivalsIndexTheBatch) {
  const Bytes with_a = ArrivedWithParamsMap(1, {Cat({kLoraKey, {0xa1, 'a'}})});
  const Bytes with_b = ArrivedWithParamsMap(
      1, {Cat({kLabelsParamKey, {0x81, 0xa1, 't', 0xa1, 'b'}})});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d,
                   Cat({kHello, BatchOf(4, {with_a, kArrived, kTokens, with_b}),
                        BatchOf(1, {with_b})}),
                   sink));
  ASSERT_EQ(sink.batches.size(), 2u);
  const BatchCopy& b = sink.batches[0];
  ASSERT_EQ(b.events.size(), 4u);
  EXPECT_EQ(b.events[0].extras, 0u);
  EXPECT_EQ(b.events[1].extras, Event::kNoExtras);
  EXPECT_EQ(b.events[2].extras, Event::kNoExtras);
  EXPECT_EQ(b.events[3].extras, 1u);
  ASSERT_EQ(b.arrivals.size(), 2u);
  EXPECT_EQ(b.arrivals[0].lora, "a");
  EXPECT_EQ(b.arrivals[1].labels[0].second, "b");
  // Each batch starts its own.
  ASSERT_EQ(sink.batches[1].arrivals.size(), 1u);
  EXPECT_EQ(sink.batches[1].events[0].extras, 0u);
}

// lora and labels are optional params (protocol 1.2, partial acceptance):
// a bad one is dropped (a labels map whole, once) and the ARRIVED applied.
TEST(FrameDecoderTest, DropsBadLoraOrLabelsAndKeepsTheArrived) {
  Bytes lora129 = {0xd9, 0x81};
  lora129.insert(lora129.end(), 129, 'l');
  Bytes value129 = {0xd9, 0x81};
  value129.insert(value129.end(), 129, 'v');
  auto labels = [](const Bytes& map) {
    return ArrivedWithParamsMap(1, {Cat({kLabelsParamKey, map})});
  };
  auto lora = [](const Bytes& value) {
    return ArrivedWithParamsMap(1, {Cat({kLoraKey, value})});
  };
  struct Case {
    const char* name;
    Bytes event;
  };
  const Case cases[] = {
      {"lora empty", lora({0xa0})},
      {"lora of 129 bytes", lora(lora129)},
      {"lora an int", lora({0x01})},
      {"lora bin", lora({0xc4, 0x01, 'a'})},
      {"lora an array", lora({0x91, 0xa1, 'a'})},
      {"lora not utf-8", lora({0xa2, 0xc3, 0x28})},
      {"labels an array", labels({0x91, 0xa1, 'a'})},
      {"labels a str", labels({0xa1, 'a'})},
      {"labels five entries",
       labels({0x85, 0xa1, 'a',  0xa1, '1',  0xa1, 'b',  0xa1, '2',  0xa1, 'c',
               0xa1, '3',  0xa1, 'd',  0xa1, '4',  0xa1, 'e',  0xa1, '5'})},
      {"label name starts with a digit",
       labels({0x81, 0xa2, '1', 't', 0xa1, 'x'})},
      {"label name with a dash",
       labels({0x81, 0xa3, 't', '-', 'x', 0xa1, 'x'})},
      {"label name empty", labels({0x81, 0xa0, 0xa1, 'x'})},
      {"label name an int", labels({0x81, 0x01, 0xa1, 'x'})},
      {"label name reserved (model_name)",
       labels(Cat({{0x81, 0xaa}, Chars("model_name"), {0xa1, 'x'}}))},
      {"label name reserved (finished_reason)",
       labels(Cat({{0x81, 0xaf}, Chars("finished_reason"), {0xa1, 'x'}}))},
      {"label name reserved (__ prefix)",
       labels({0x81, 0xa3, '_', '_', 't', 0xa1, 'x'})},
      {"label name twice",
       labels({0x82, 0xa1, 't', 0xa1, 'x', 0xa1, 't', 0xa1, 'y'})},
      {"label value of 129 bytes", labels(Cat({{0x81, 0xa1, 't'}, value129}))},
      {"label value an int", labels({0x81, 0xa1, 't', 0x01})},
      {"label value nil", labels({0x81, 0xa1, 't', 0xc0})},
      {"label value bin", labels({0x81, 0xa1, 't', 0xc4, 0x01, 'x'})},
      {"label value not utf-8", labels({0x81, 0xa1, 't', 0xa2, 0xc3, 0x28})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(
        Feed(d, Cat({kHello, BatchOf(3, {kQueued, c.event, kTokens})}), sink));
    EXPECT_TRUE(sink.event_errors.empty());
    ASSERT_EQ(sink.batches.size(), 1u);
    const BatchCopy& b = sink.batches[0];
    EXPECT_EQ(b.bad_fields, 1u);
    ASSERT_EQ(b.events.size(), 3u);
    EXPECT_EQ(b.events[1].kind, EventKind::kArrived);
    EXPECT_EQ(b.events[1].count, 12u);
    EXPECT_EQ(b.events[1].extras, Event::kNoExtras);
    EXPECT_TRUE(b.arrivals.empty());
  }
}

TEST(FrameDecoderTest, DroppedLabelsKeepTheArrivedLora) {
  // A good lora, then bad labels: the labels are dropped, the lora kept;
  // the next ARRIVED's extras follow.
  const Bytes bad = ArrivedWithParamsMap(
      2, {Cat({kLoraKey, {0xa1, 'a'}}),
          Cat({kLabelsParamKey, {0x81, 0xa1, 't', 0x01}})});
  const Bytes good = ArrivedWithParamsMap(1, {Cat({kLoraKey, {0xa1, 'b'}})});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(2, {bad, good})}), sink));
  EXPECT_TRUE(sink.event_errors.empty());
  ASSERT_EQ(sink.batches.size(), 1u);
  const BatchCopy& b = sink.batches[0];
  EXPECT_EQ(b.bad_fields, 1u);
  ASSERT_EQ(b.events.size(), 2u);
  EXPECT_EQ(b.events[0].extras, 0u);
  EXPECT_EQ(b.events[1].extras, 1u);
  ASSERT_EQ(b.arrivals.size(), 2u);
  EXPECT_EQ(b.arrivals[0].lora, "a");
  EXPECT_TRUE(b.arrivals[0].labels.empty());
  EXPECT_EQ(b.arrivals[1].lora, "b");
}

// ---------------------------------------------------------------------------
// Streaming

// A stream touching every kind of frame and event, with string ids, params,
// a full STEP, an invalid event, and a payload longer than a read.
Bytes MixedStream() {
  return Cat({
      kHello,
      BatchOf(8,
              {kArrived,
               kQueued,
               kScheduled,
               kTokens,
               kPreempted,
               kFinished,
               kFullStep,
               // params {"n": 2, "lora": "a", "labels": {"t": "x"}}
               {0x95, 0x01, 0x00, 0xa3, 'r',  '-',  '1',  0x0c, 0x83, 0xa1, 'n',
                0x02, 0xa4, 'l',  'o',  'r',  'a',  0xa1, 'a',  0xa6, 'l',  'a',
                'b',  'e',  'l',  's',  0x81, 0xa1, 't',  0xa1, 'x'}}),
      {0x94, 0x01, 0x01, 0xcd, 0x01, 0x00, 0x93},  // [1, 1, 256, [3 events]]
      {0x94, 0x04, 0x05, 0xa3, 'r', '-', '1', 0x03},
      {0x93, 0x09, 0x05, 0x07},  // unknown kind
      {0x94, 0x05, 0x06, 0xa3, 'r', '-', '1', 0xa5, 'e', 'r', 'r', 'o', 'r'},
      kGoodbye,
  });
}

TEST(FrameDecoderTest, DecodesByteByByteFeedIdentically) {
  const Bytes stream = MixedStream();
  RecordingSink whole;
  {
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, stream, whole));
    EXPECT_EQ(d.buffered_bytes(), 0u);
  }
  ASSERT_EQ(whole.log.size(), 5u);  // hello, batch, error, batch, goodbye
  RecordingSink bytewise;
  FrameDecoder d{DecoderLimits{}};
  for (size_t i = 0; i < stream.size(); ++i) {
    ASSERT_TRUE(d.Feed(&stream[i], 1, bytewise)) << i;
  }
  EXPECT_EQ(bytewise.log, whole.log);
  EXPECT_EQ(d.buffered_bytes(), 0u);
  EXPECT_TRUE(d.saw_goodbye());
}

TEST(FrameDecoderTest, DecodesAnySplitIdentically) {
  const Bytes stream = MixedStream();
  RecordingSink whole;
  {
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(d, stream, whole));
  }
  for (size_t chunk = 2; chunk <= 37; ++chunk) {
    SCOPED_TRACE(chunk);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    size_t i = 0;
    while (i < stream.size()) {
      // Zero-copy path: Prepare a span, fill part of it, Commit.
      const std::span<char> space = d.Prepare(chunk);
      ASSERT_GE(space.size(), chunk);
      const size_t n = std::min({chunk, space.size(), stream.size() - i});
      std::memcpy(space.data(), &stream[i], n);
      ASSERT_TRUE(d.Commit(n, sink));
      i += n;
    }
    EXPECT_EQ(sink.log, whole.log);
  }
}

TEST(FrameDecoderTest, DecodesTwoFramesInOneFeed) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(1, {kTokens})}), sink));
  EXPECT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(sink.batches.size(), 1u);
  // Two batches and half of a third.
  const Bytes third = BatchOf(1, {kQueued});
  ASSERT_TRUE(Feed(d,
                   Cat({BatchOf(1, {kArrived}), BatchOf(1, {kFinished}),
                        Bytes(third.begin(), third.begin() + 4)}),
                   sink));
  EXPECT_EQ(sink.batches.size(), 3u);
  EXPECT_EQ(d.buffered_bytes(), 4u);
  ASSERT_TRUE(Feed(d, Bytes(third.begin() + 4, third.end()), sink));
  EXPECT_EQ(sink.batches.size(), 4u);
  EXPECT_EQ(d.buffered_bytes(), 0u);
}

TEST(FrameDecoderTest, DeliversFramesBeforeTheBadOne) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  EXPECT_FALSE(Feed(
      d,
      Cat({kHello, BatchOf(1, {kTokens}), {0x91, 0x05}, BatchOf(1, {kTokens})}),
      sink));
  EXPECT_EQ(d.error(), IngestError::kBadFrame);
  EXPECT_EQ(sink.log.size(), 2u);
  // Dead from now on.
  EXPECT_FALSE(Feed(d, BatchOf(1, {kTokens}), sink));
  EXPECT_TRUE(d.Prepare(100).empty());
  EXPECT_FALSE(d.Commit(0, sink));
  EXPECT_EQ(sink.log.size(), 2u);
}

TEST(FrameDecoderTest, ReportsEventErrorsBeforeTheirBatch) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(2, {{0x90}, {0x90}})}), sink));
  ASSERT_EQ(sink.log.size(), 4u);
  EXPECT_EQ(sink.log[1], "event_error bad_event");
  EXPECT_EQ(sink.log[2], "event_error bad_event");
  EXPECT_EQ(sink.log[3], "batch seq=0 dropped=0");  // empty, still delivered
}

TEST(FrameDecoderTest, PrepareOffersAtLeastTheHint) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  EXPECT_GE(d.Prepare(0).size(), 1u);
  EXPECT_GE(d.Prepare(65536).size(), 65536u);
  EXPECT_LE(d.Prepare(1 << 30).size(), size_t{TM_MAX_FRAME_BYTES});
  // Part of a frame, then a large hint: the allowance shrinks by it.
  ASSERT_TRUE(Feed(d, Bytes(kHello.begin(), kHello.begin() + 10), sink));
  EXPECT_EQ(d.Prepare(1 << 30).size(), TM_MAX_FRAME_BYTES - 10);
  // A span may be only partly used.
  std::span<char> space = d.Prepare(64);
  std::memcpy(space.data(), &kHello[10], 5);
  ASSERT_TRUE(d.Commit(5, sink));
  space = d.Prepare(64);
  std::memcpy(space.data(), &kHello[15], kHello.size() - 15);
  ASSERT_TRUE(d.Commit(kHello.size() - 15, sink));
  EXPECT_EQ(sink.hellos.size(), 1u);
  EXPECT_EQ(d.buffered_bytes(), 0u);
}

TEST(FrameDecoderTest, DecodesManyBatchesThroughSmallReads) {
  // 200 batches of 300 TOKENS events each, fed in odd-sized reads.
  Bytes batch = {0x94, 0x01, 0x00, 0x00, 0xdc, 0x01, 0x2c};  // 300 events
  for (int i = 0; i < 300; ++i) {
    batch.insert(batch.end(),
                 {0x94, 0x04, 0xcf, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
                  0x00, 0xce, 0x00, 0x01, 0x00, 0x00, 0x01});
  }
  Bytes stream = kHello;
  for (int i = 0; i < 200; ++i) {
    batch[2] = static_cast<uint8_t>(i & 0x7f);
    stream.insert(stream.end(), batch.begin(), batch.end());
  }
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  for (size_t i = 0; i < stream.size(); i += 1000) {
    const size_t n = std::min<size_t>(1000, stream.size() - i);
    ASSERT_TRUE(d.Feed(&stream[i], n, sink));
  }
  ASSERT_EQ(sink.batches.size(), 200u);
  for (const BatchCopy& b : sink.batches) {
    ASSERT_EQ(b.events.size(), 300u);
    EXPECT_EQ(b.events[299].t_ns, uint64_t{1} << 40);
    EXPECT_EQ(b.events[299].rid.number, 65536u);
  }
}

TEST(FrameDecoderTest, NamesEveryReason) {
  const char* want[] = {"invalid_msgpack",    "bad_frame",
                        "frame_too_large",    "string_too_long",
                        "batch_too_large",    "too_deep",
                        "batch_before_hello", "second_hello",
                        "bad_hello",          "bad_name",
                        "reserved_label",     "too_many_labels",
                        "peer_not_allowed",   "series_limit",
                        "connection_limit",   "uid_connection_limit",
                        "hello_timeout",      "fd_limit",
                        "bad_event",          "bad_timestamp",
                        "bad_reason",         "unknown_kind",
                        "bad_field"};
  ASSERT_EQ(std::size(want), static_cast<size_t>(IngestError::kCount));
  for (size_t i = 0; i < std::size(want); ++i) {
    EXPECT_EQ(IngestErrorName(static_cast<IngestError>(i)), want[i]);
  }
  EXPECT_EQ(EventKindName(EventKind::kArrived), "arrived");
  EXPECT_EQ(EventKindName(EventKind::kQueued), "queued");
  EXPECT_EQ(EventKindName(EventKind::kScheduled), "scheduled");
  EXPECT_EQ(EventKindName(EventKind::kTokens), "tokens");
  EXPECT_EQ(EventKindName(EventKind::kFinished), "finished");
  EXPECT_EQ(EventKindName(EventKind::kPreempted), "preempted");
  EXPECT_EQ(EventKindName(EventKind::kStep), "step");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kAbort), "abort");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

// ---------------------------------------------------------------------------
// EXPERT_LOAD (protocol 1.1, kind 8): [8, t, layer, counts]

// An EXPERT_LOAD at t = 1000 of `layer` with `counts`, written byte by byte:
// fixarray(4), 8, uint16 1000, the layer (uint16), the counts array.
Bytes ExpertLoad(uint16_t layer, const std::vector<uint64_t>& counts) {
  Bytes out = {0x94,          0x08, 0xcd, 0x03, 0xe8, 0xcd, uint8_t(layer >> 8),
               uint8_t(layer)};
  const size_t n = counts.size();
  if (n < 16) {
    out.push_back(uint8_t(0x90 | n));
  } else {
    out.insert(out.end(), {0xdc, uint8_t(n >> 8), uint8_t(n)});
  }
  for (uint64_t c : counts) {
    out.push_back(0xcf);  // uint64
    for (int i = 7; i >= 0; --i) out.push_back(uint8_t(c >> (8 * i)));
  }
  return out;
}

TEST(FrameDecoderTest, DecodesExpertLoad) {
  std::vector<uint64_t> wide(1024);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = i;
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d,
                   Cat({kHello, BatchOf(3, {ExpertLoad(0, {5, 0, 7}), kTokens,
                                            ExpertLoad(4095, wide)})}),
                   sink));
  EXPECT_TRUE(sink.event_errors.empty());
  ASSERT_EQ(sink.batches.size(), 1u);
  const BatchCopy& b = sink.batches[0];
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].kind, EventKind::kExpertLoad);
  EXPECT_EQ(b.events[0].t_ns, 1000u);
  const ExpertLoadView first = b.events[0].expert_load(b.positions.data());
  EXPECT_EQ(first.layer, 0u);
  EXPECT_EQ(first.counts.data(), b.positions.data());
  EXPECT_EQ(first.counts.size(), 3u);
  const ExpertLoadView last = b.events[2].expert_load(b.positions.data());
  EXPECT_EQ(last.layer, 4095u);
  EXPECT_EQ(last.counts.data(), b.positions.data() + 3);
  EXPECT_EQ(last.counts.size(), 1024u);
  ASSERT_EQ(b.positions.size(), 3u + 1024u);
  EXPECT_EQ(b.positions[0], 5u);
  EXPECT_EQ(b.positions[2], 7u);
  EXPECT_EQ(b.positions[3 + 1023], 1023u);
  EXPECT_EQ(EventKindName(EventKind::kExpertLoad), "expert_load");
}

TEST(FrameDecoderTest, SkipsBadExpertLoadAndAppliesTheRest) {
  const std::vector<uint64_t> too_many(1025, 1);
  struct Case {
    const char* what;
    Bytes event;
  } cases[] = {
      {"layer 4096", ExpertLoad(4096, {1})},
      {"no counts", ExpertLoad(1, {})},
      {"1025 counts", ExpertLoad(1, too_many)},
      {"a count over 2^32 - 1", ExpertLoad(1, {1, 4294967296ull})},
      {"counts not an array", {0x94, 0x08, 0xcd, 0x03, 0xe8, 0x01, 0xa1, 'x'}},
      {"a negative count", {0x94, 0x08, 0xcd, 0x03, 0xe8, 0x01, 0x91, 0xff}},
      {"layer not an int",
       {0x94, 0x08, 0xcd, 0x03, 0xe8, 0xa1, 'x', 0x91, 0x01}},
      {"three elements", {0x93, 0x08, 0xcd, 0x03, 0xe8, 0x01}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    ASSERT_TRUE(Feed(
        d, Cat({kHello, BatchOf(3, {kQueued, c.event, ExpertLoad(2, {3})})}),
        sink));
    EXPECT_EQ(sink.event_errors,
              std::vector<IngestError>{IngestError::kBadEvent});
    ASSERT_EQ(sink.batches.size(), 1u);
    const BatchCopy& b = sink.batches[0];
    ASSERT_EQ(b.events.size(), 2u);
    const ExpertLoadView load = b.events[1].expert_load(b.positions.data());
    EXPECT_EQ(load.layer, 2u);
    // The skipped event's counts are not left behind.
    EXPECT_EQ(load.counts.data(), b.positions.data());
    EXPECT_EQ(b.positions, std::vector<uint64_t>{3});
  }
}

}  // namespace
}  // namespace tokenmeter::daemon

namespace tokenmeter::daemon {
namespace {

// ---------------------------------------------------------------------------
// Protocol 1.2: the new event kinds and fields, with partial acceptance.

// A fixstr: the header 0xa0 | length, then the bytes (at most 31).
Bytes S(std::string_view text) {
  Bytes out = {static_cast<uint8_t>(0xa0 | text.size())};
  out.insert(out.end(), text.begin(), text.end());
  return out;
}

// One batch of [QUEUED, event, TOKENS] decoded; the middle event.
struct Middle {
  bool fed = false;
  std::vector<IngestError> errors;
  uint32_t bad_fields = 0;
  std::vector<Event> events;
  std::vector<std::string> rid_texts;
  std::vector<ArrivalCopy> arrivals;
  std::vector<std::string> text;  // reason, connector of a KV/admission
  std::vector<uint64_t> positions;
};

Middle DecodeMiddle(const Bytes& event) {
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  Middle m;
  m.fed = Feed(d, Cat({kHello, BatchOf(3, {kQueued, event, kTokens})}), sink);
  m.errors = sink.event_errors;
  if (!sink.batches.empty()) {
    m.bad_fields = sink.batches[0].bad_fields;
    m.events = sink.batches[0].events;
    m.rid_texts = sink.batches[0].rid_texts;
    m.arrivals = sink.batches[0].arrivals;
    m.positions = sink.batches[0].positions;
  }
  return m;
}

// KV_TRANSFER [10, t=1000, 7, info] with `n` info entries.
Bytes KvOf(uint8_t n, std::initializer_list<Bytes> entries) {
  Bytes out = {
      0x94, 0x0a, 0xcd, 0x03, 0xe8, 0x07, static_cast<uint8_t>(0x80 | n)};
  for (const Bytes& e : entries) out.insert(out.end(), e.begin(), e.end());
  return out;
}

TEST(FrameDecoder12Test, DecodesAdmissionRejectedWithAndWithoutAnId) {
  {
    const Middle m = DecodeMiddle(Cat({{0x93, 0x09, 0x00}, S("queue_full")}));
    ASSERT_TRUE(m.fed);
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.events[1].kind, EventKind::kAdmissionRejected);
    EXPECT_FALSE(m.events[1].admission.has_rid);
    EXPECT_EQ(m.bad_fields, 0u);
  }
  {
    const Middle m = DecodeMiddle(Cat({{0x94, 0x09, 0x00}, S("x"), {0x07}}));
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_TRUE(m.events[1].admission.has_rid);
    EXPECT_EQ(m.events[1].rid.number, 7u);
  }
  {
    const Middle m = DecodeMiddle(Cat({{0x94, 0x09, 0x00}, S("x"), S("r-1")}));
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_TRUE(m.events[1].admission.has_rid);
    EXPECT_EQ(m.rid_texts[1], "r-1");
  }
  // An id that is no id (a float, an empty str): dropped, event kept.
  for (const Bytes& bad_id :
       {Bytes{0xca, 0x3f, 0x80, 0, 0}, Bytes{0xa0}, Bytes{0x90}}) {
    const Middle m = DecodeMiddle(Cat({{0x94, 0x09, 0x00}, S("x"), bad_id}));
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.events[1].kind, EventKind::kAdmissionRejected);
    EXPECT_FALSE(m.events[1].admission.has_rid);
    EXPECT_EQ(m.bad_fields, 1u);
  }
  // nil id: no id, nothing dropped.
  const Middle nil = DecodeMiddle(Cat({{0x94, 0x09, 0x00}, S("x"), {0xc0}}));
  ASSERT_EQ(nil.events.size(), 3u);
  EXPECT_EQ(nil.bad_fields, 0u);
}

TEST(FrameDecoder12Test, SkipsAdmissionRejectedWithABadReason) {
  Bytes long_reason = {0xd9, 65};
  long_reason.insert(long_reason.end(), 65, 'a');
  Bytes max_reason = {0xd9, 64};
  max_reason.insert(max_reason.end(), 64, 'a');
  const Bytes cases[] = {
      {0x93, 0x09, 0x00, 0xa0},                // empty
      Cat({{0x93, 0x09, 0x00}, S("a\nb")}),    // control character
      {0x93, 0x09, 0x00, 0xa2, 0xc2, 0x85},    // U+0085 (C1)
      {0x93, 0x09, 0x00, 0xa2, 0xc3, 0x28},    // not UTF-8
      Cat({{0x93, 0x09, 0x00}, long_reason}),  // 65 bytes
      {0x93, 0x09, 0x00, 0x07},                // an int
      {0x93, 0x09, 0x00, 0xc0},                // nil
      {0x92, 0x09, 0x00},                      // no reason
  };
  for (const Bytes& c : cases) {
    const Middle m = DecodeMiddle(c);
    ASSERT_TRUE(m.fed);
    EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadEvent});
    EXPECT_EQ(m.events.size(), 2u);
  }
  const Middle ok = DecodeMiddle(Cat({{0x93, 0x09, 0x00}, max_reason}));
  EXPECT_TRUE(ok.errors.empty());
  EXPECT_EQ(ok.events.size(), 3u);
}

TEST(FrameDecoder12Test, DecodesKvTransferWithEveryKey) {
  const Middle m =
      DecodeMiddle(KvOf(7, {S("role"),
                            S("recv"),
                            S("start"),
                            {0xcd, 0x03, 0x20},  // 800
                            S("bytes"),
                            {0xce, 0x00, 0x10, 0x00, 0x00},  // 2^20
                            S("blocks"),
                            {0x10},
                            S("ok"),
                            {0xc2},
                            S("reason"),
                            S("timeout"),
                            S("connector"),
                            S("nixl")}));
  ASSERT_TRUE(m.fed);
  ASSERT_EQ(m.events.size(), 3u);
  const Event& e = m.events[1];
  ASSERT_EQ(e.kind, EventKind::kKvTransfer);
  EXPECT_EQ(e.rid.number, 7u);
  EXPECT_EQ(e.kv_transfer.role, KvRole::kRecv);
  EXPECT_EQ(e.kv_transfer.start_ns, 800u);
  EXPECT_TRUE(e.kv_transfer.has_bytes);
  EXPECT_EQ(e.kv_transfer.bytes, 1u << 20);
  EXPECT_TRUE(e.kv_transfer.has_blocks);
  EXPECT_EQ(e.kv_transfer.blocks, 16u);
  EXPECT_FALSE(e.kv_transfer.ok);
  EXPECT_EQ(m.bad_fields, 0u);

  const Middle min = DecodeMiddle(
      KvOf(2, {S("start"), {0xcd, 0x03, 0xe8}, S("role"), S("send")}));
  ASSERT_EQ(min.events.size(), 3u);
  const KvTransferInfo& k = min.events[1].kv_transfer;
  EXPECT_EQ(k.role, KvRole::kSend);
  EXPECT_EQ(k.start_ns, 1000u);  // start == t is fine
  EXPECT_TRUE(k.ok);             // the default
  EXPECT_FALSE(k.has_bytes);
  EXPECT_FALSE(k.has_blocks);
  EXPECT_EQ(k.reason.size, 0u);
  EXPECT_EQ(k.connector.size, 0u);
}

TEST(FrameDecoder12Test, SkipsKvTransferWithoutItsRequiredKeys) {
  const Bytes start = Cat({S("start"), {0x00}});
  const Bytes role = Cat({S("role"), S("send")});
  const Bytes cases[] = {
      KvOf(1, {start}),                                 // no role
      KvOf(1, {role}),                                  // no start
      KvOf(2, {start, S("role"), S("both")}),           // bad role
      KvOf(2, {start, S("role"), {0x01}}),              // role an int
      KvOf(2, {start, S("role"), {0xc0}}),              // role nil
      KvOf(2, {role, S("start"), {0xcd, 0x03, 0xe9}}),  // start > t
      KvOf(2, {role, S("start"), {0xff}}),              // start < 0
      KvOf(2, {role, S("start"), S("0")}),              // start a str
      {0x94, 0x0a, 0x00, 0x07, 0x90},                   // info an array
      {0x93, 0x0a, 0x00, 0x07},                         // no info
      Cat({{0x94, 0x0a, 0x00, 0xca, 0, 0, 0, 0, 0x82}, role, start}),  // rid
  };
  for (const Bytes& c : cases) {
    const Middle m = DecodeMiddle(c);
    ASSERT_TRUE(m.fed);
    EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadEvent});
    EXPECT_EQ(m.events.size(), 2u);
    EXPECT_EQ(m.bad_fields, 0u);
  }
}

TEST(FrameDecoder12Test, DropsABadOptionalKvTransferKey) {
  const Bytes start = Cat({S("start"), {0x00}});
  const Bytes role = Cat({S("role"), S("send")});
  Bytes long_connector = {0xd9, 65};
  long_connector.insert(long_connector.end(), 65, 'c');
  const Bytes cases[] = {
      Cat({S("bytes"), S("1")}),
      Cat({S("bytes"), {0xff}}),
      Cat({S("bytes"), {0xcf, 0, 0x01, 0, 0, 0, 0, 0, 0}}),  // 2^48
      Cat({S("blocks"), {0xca, 0x3f, 0x80, 0, 0}}),
      Cat({S("ok"), {0x01}}),
      Cat({S("ok"), S("false")}),
      Cat({S("reason"), S("")}),
      Cat({S("reason"), S("a\tb")}),
      Cat({S("reason"), {0x01}}),
      Cat({S("connector"), long_connector}),
      Cat({S("connector"), {0x90}}),
  };
  for (const Bytes& bad : cases) {
    const Middle m = DecodeMiddle(KvOf(3, {role, start, bad}));
    ASSERT_TRUE(m.fed);
    EXPECT_TRUE(m.errors.empty());
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.bad_fields, 1u);
    const KvTransferInfo& k = m.events[1].kv_transfer;
    EXPECT_FALSE(k.has_bytes);
    EXPECT_FALSE(k.has_blocks);
    EXPECT_TRUE(k.ok);
    EXPECT_EQ(k.reason.size, 0u);
    EXPECT_EQ(k.connector.size, 0u);
  }
  // The largest bytes value, nil optional keys and unknown keys: kept.
  const Middle m =
      DecodeMiddle(KvOf(6, {role,
                            start,
                            S("bytes"),
                            {0xcf, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
                            S("ok"),
                            {0xc0},
                            S("reason"),
                            {0xc0},
                            S("later"),
                            {0x91, 0x01}}));
  ASSERT_EQ(m.events.size(), 3u);
  EXPECT_EQ(m.bad_fields, 0u);
  EXPECT_EQ(m.events[1].kv_transfer.bytes, TM_MAX_KV_TRANSFER_BYTES);
}

TEST(FrameDecoder12Test, DecodesSleepStates) {
  const Middle all = DecodeMiddle(Cat({{0x93, 0x0b, 0x00, 0x83},
                                       S("scheduler"),
                                       S("paused"),
                                       S("weights"),
                                       S("discarded"),
                                       S("kv_cache"),
                                       S("released")}));
  ASSERT_TRUE(all.fed);
  ASSERT_EQ(all.events.size(), 3u);
  const SleepInfo& s1 = all.events[1].sleep;
  EXPECT_EQ(s1.scheduler, SchedulerState::kPaused);
  EXPECT_EQ(s1.weights, WeightsState::kDiscarded);
  EXPECT_EQ(s1.kv_cache, KvCacheState::kReleased);
  EXPECT_EQ(all.bad_fields, 0u);

  const Middle some = DecodeMiddle(Cat({{0x93, 0x0b, 0x00, 0x82},
                                        S("weights"),
                                        S("offloaded"),
                                        S("kv_cache"),
                                        S("asleep")}));
  ASSERT_EQ(some.events.size(), 3u);
  const SleepInfo& s2 = some.events[1].sleep;
  EXPECT_EQ(s2.scheduler, SchedulerState::kKeep);
  EXPECT_EQ(s2.weights, WeightsState::kOffloaded);
  EXPECT_EQ(s2.kv_cache, KvCacheState::kKeep);  // "asleep": dropped
  EXPECT_EQ(some.bad_fields, 1u);

  const Middle empty = DecodeMiddle({0x93, 0x0b, 0x00, 0x80});
  ASSERT_EQ(empty.events.size(), 3u);  // valid: nothing changes
  for (const Bytes& bad :
       {Bytes{0x93, 0x0b, 0x00, 0x90}, Bytes{0x93, 0x0b, 0x00, 0xc0},
        Bytes{0x92, 0x0b, 0x00}}) {
    const Middle m = DecodeMiddle(bad);
    EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadEvent});
  }
  const Middle wrong =
      DecodeMiddle(Cat({{0x93, 0x0b, 0x00, 0x81}, S("scheduler"), {0x01}}));
  ASSERT_EQ(wrong.events.size(), 3u);
  EXPECT_EQ(wrong.bad_fields, 1u);
}

TEST(FrameDecoder12Test, DecodesScheduledInfo) {
  const Bytes head = {0x94, 0x03, 0x00, 0x07};
  const Middle m = DecodeMiddle(Cat({head,
                                     {0x82},
                                     S("cached_tokens"),
                                     {0x05},
                                     S("external_tokens"),
                                     {0xcd, 0x01, 0x00}}));
  ASSERT_EQ(m.events.size(), 3u);
  const ScheduledInfo& i = m.events[1].scheduled;
  EXPECT_TRUE(i.present);
  EXPECT_EQ(i.has, ScheduledInfo::kCached | ScheduledInfo::kExternal);
  EXPECT_EQ(i.cached_tokens, 5u);
  EXPECT_EQ(i.external_tokens, 256u);
  EXPECT_EQ(m.bad_fields, 0u);

  const Middle plain = DecodeMiddle(kScheduled);
  EXPECT_FALSE(plain.events[1].scheduled.present);
  const Middle nil = DecodeMiddle(Cat({head, {0xc0}}));
  EXPECT_FALSE(nil.events[1].scheduled.present);
  EXPECT_EQ(nil.bad_fields, 0u);

  const Bytes bad_cases[] = {
      Cat({head, S("info")}),                             // not a map
      Cat({head, {0x81}, S("cached_tokens"), S("5")}),    // a str
      Cat({head, {0x81}, S("cached_tokens"), {0xff}}),    // negative
      Cat({head, {0x81}, S("external_tokens"), k2To32}),  // 2^32
  };
  for (const Bytes& c : bad_cases) {
    const Middle b = DecodeMiddle(c);
    ASSERT_TRUE(b.fed);
    EXPECT_TRUE(b.errors.empty());
    ASSERT_EQ(b.events.size(), 3u);
    EXPECT_EQ(b.bad_fields, 1u);
    EXPECT_EQ(b.events[1].scheduled.has, 0);
  }
  // A bad key is dropped alone; one above 2^32 - 1 is above any prompt, so
  // the sum is: the whole map goes, as one bad_field.
  const Middle str = DecodeMiddle(Cat({head,
                                       {0x82},
                                       S("cached_tokens"),
                                       S("5"),
                                       S("external_tokens"),
                                       {0x03}}));
  EXPECT_EQ(str.bad_fields, 1u);
  EXPECT_EQ(str.events[1].scheduled.has, ScheduledInfo::kExternal);
  EXPECT_EQ(str.events[1].scheduled.external_tokens, 3u);
  const Middle above = DecodeMiddle(Cat({head,
                                         {0x82},
                                         S("cached_tokens"),
                                         k2To32,
                                         S("external_tokens"),
                                         {0x03}}));
  EXPECT_EQ(above.bad_fields, 1u);
  EXPECT_FALSE(above.events[1].scheduled.present);
  EXPECT_EQ(above.events[1].scheduled.has, 0);
  // A key of the wrong type beside one above any prompt: the map goes
  // whole, and a map dropped whole counts once, not once more per key.
  const Middle both = DecodeMiddle(Cat({head,
                                        {0x82},
                                        S("cached_tokens"),
                                        S("5"),
                                        S("external_tokens"),
                                        k2To32}));
  EXPECT_EQ(both.bad_fields, 1u);
  EXPECT_FALSE(both.events[1].scheduled.present);
}

TEST(FrameDecoder12Test, KeepsWaitingDeferredOnlyWithinWaiting) {
  const Bytes waiting = Cat({S("waiting"), {0x05}});
  const Bytes deferred2 = Cat({S("waiting_deferred"), {0x02}});
  const Bytes deferred9 = Cat({S("waiting_deferred"), {0x09}});
  // In either key order.
  for (const Bytes& step :
       {Cat({{0x93, 0x07, 0x00, 0x82}, waiting, deferred2}),
        Cat({{0x93, 0x07, 0x00, 0x82}, deferred2, waiting})}) {
    const Middle m = DecodeMiddle(step);
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.bad_fields, 0u);
    EXPECT_NE(m.events[1].step.has & StepStats::kWaitingDeferred, 0u);
    EXPECT_EQ(m.events[1].step.waiting_deferred, 2u);
  }
  for (const Bytes& step :
       {Cat({{0x93, 0x07, 0x00, 0x82}, waiting, deferred9}),  // above
        Cat({{0x93, 0x07, 0x00, 0x81}, deferred2}),           // no waiting
        Cat({{0x93, 0x07, 0x00, 0x82},
             waiting,
             S("waiting_deferred"),
             S("2")})}) {
    const Middle m = DecodeMiddle(step);
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.bad_fields, 1u);
    EXPECT_EQ(m.events[1].step.has & StepStats::kWaitingDeferred, 0u);
  }
}

TEST(FrameDecoder12Test, DecodesArrivedPriorityAndTraceContext) {
  const std::string tp =
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  Bytes traceparent = {0xd9, 55};
  traceparent.insert(traceparent.end(), tp.begin(), tp.end());
  const Bytes head = {0x95, 0x01, 0x00, 0x07, 0x0c};
  const Middle m = DecodeMiddle(Cat({head,
                                     {0x83},
                                     S("priority"),
                                     {0xfb},
                                     S("traceparent"),
                                     traceparent,
                                     S("tracestate"),
                                     S("rojo=00f067aa0ba902b7")}));
  ASSERT_EQ(m.events.size(), 3u);
  EXPECT_EQ(m.bad_fields, 0u);
  ASSERT_EQ(m.arrivals.size(), 1u);
  EXPECT_TRUE(m.arrivals[0].has_priority);
  EXPECT_EQ(m.arrivals[0].priority, -5);
  EXPECT_EQ(m.arrivals[0].traceparent, tp);
  EXPECT_EQ(m.arrivals[0].tracestate, "rojo=00f067aa0ba902b7");

  struct Limit {
    Bytes value;
    bool ok;
    int32_t expect;
  };
  const Limit limits[] = {
      {{0xce, 0x7f, 0xff, 0xff, 0xff}, true, INT32_MAX},
      {{0xd2, 0x80, 0x00, 0x00, 0x00}, true, INT32_MIN},
      {{0xce, 0x80, 0x00, 0x00, 0x00}, false, 0},  // 2^31
      {{0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff}, false, 0},
      {S("1"), false, 0},
      {{0xca, 0x3f, 0x80, 0, 0}, false, 0},
  };
  for (const Limit& l : limits) {
    const Middle p = DecodeMiddle(Cat({head, {0x81}, S("priority"), l.value}));
    ASSERT_EQ(p.events.size(), 3u);
    EXPECT_EQ(p.bad_fields, l.ok ? 0u : 1u);
    EXPECT_EQ(p.arrivals.size(), l.ok ? 1u : 0u);
    if (l.ok) {
      EXPECT_EQ(p.arrivals[0].priority, l.expect);
    }
  }
  // Malformed trace context: dropped, the request still starts.
  std::string upper = tp;
  upper[10] = 'F';
  std::string version = tp;
  version[1] = '1';
  std::string zero_id =
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
  for (const std::string& bad : {upper, version, zero_id, tp.substr(0, 54)}) {
    Bytes v = {0xd9, static_cast<uint8_t>(bad.size())};
    v.insert(v.end(), bad.begin(), bad.end());
    const Middle b = DecodeMiddle(Cat({head, {0x81}, S("traceparent"), v}));
    ASSERT_EQ(b.events.size(), 3u);
    EXPECT_EQ(b.bad_fields, 1u);
    EXPECT_TRUE(b.arrivals.empty());
    EXPECT_EQ(b.events[1].count, 12u);
  }
  for (const Bytes& bad :
       {S("no-equals"), S("a=b,,=c"), S("UP=1"), Bytes{0x07}}) {
    const Middle b = DecodeMiddle(Cat({head, {0x81}, S("tracestate"), bad}));
    ASSERT_EQ(b.events.size(), 3u);
    EXPECT_EQ(b.bad_fields, 1u);
    EXPECT_TRUE(b.arrivals.empty());
  }
}

// A str of `size` bytes of 'v' after "k=" (str 16 header).
Bytes LongState(size_t size) {
  std::string state = "k=";
  state.append(size - 2, 'v');
  // (Cat of two vectors, not an insert of the string's bytes: gcc 12
  // warns of a bounds error that is not there in the latter.)
  return Cat({{0xda, static_cast<uint8_t>(size >> 8),
               static_cast<uint8_t>(size & 0xff)},
              Bytes(state.begin(), state.end())});
}

// A tracestate over 256 bytes, the general string limit, is dropped as a
// bad_field and the request starts (protocol 1.2: W3C lets a vendor drop
// tracestate), under the default limit and a raised one alike: the
// scanner lets that one string past the limit.
TEST(FrameDecoder12Test, DropsATracestateOverItsLimit) {
  const Bytes key = S("tracestate");
  const Bytes bytes(key.begin() + 1, key.end());
  // The key as a fixstr, and as a str 8, 16 and 32.
  const Bytes keys[] = {key, Cat({{0xd9, 0x0a}, bytes}),
                        Cat({{0xda, 0x00, 0x0a}, bytes}),
                        Cat({{0xdb, 0x00, 0x00, 0x00, 0x0a}, bytes})};
  for (const uint32_t max_string : {256u, 1024u}) {
    for (const size_t size : {size_t{257}, size_t{1000}}) {
      for (const Bytes& k : keys) {
        SCOPED_TRACE(testing::Message()
                     << max_string << " " << size << " " << k.size());
        const Bytes event = Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x82},
                                 k,
                                 LongState(size),
                                 S("max_tokens"),
                                 {0x05}});
        DecoderLimits limits;
        limits.max_string_bytes = max_string;
        RecordingSink sink;
        FrameDecoder d{limits};
        ASSERT_TRUE(
            Feed(d, Cat({kHello, BatchOf(3, {kQueued, event, kTokens})}), sink))
            << IngestErrorName(d.error());
        ASSERT_EQ(sink.batches.size(), 1u);
        EXPECT_EQ(sink.batches[0].bad_fields, 1u);
        ASSERT_EQ(sink.batches[0].events.size(), 3u);
        EXPECT_EQ(sink.batches[0].events[1].kind, EventKind::kArrived);
        EXPECT_TRUE(sink.batches[0].arrivals.empty());
      }
    }
  }
}

// Only the value of an ARRIVED params "tracestate" is let past the string
// limit: the same string as another key's value, as a key, in a HELLO, or
// at another depth is string_too_long, as before.
TEST(FrameDecoder12Test, OtherStringsOverTheLimitStillEndTheFrame) {
  const Bytes big = LongState(300);
  const struct {
    const char* what;
    Bytes frame;
  } cases[] = {
      {"lora value",
       Cat({kHello, BatchOf(1, {Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x81},
                                     S("lora"),
                                     big})})})},
      {"tracestate as a key",
       Cat({kHello, BatchOf(1, {Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x81},
                                     big,
                                     {0x01}})})})},
      {"a FINISHED reason after a tracestate string",
       Cat({kHello,
            BatchOf(1,
                    {Cat({{0x95, 0x05, 0x00, 0x07}, S("tracestate"), big})})})},
      // The key "tracestate" in an event map of another kind.
      {"a STEP stats value",
       Cat({kHello,
            BatchOf(1,
                    {Cat({{0x93, 0x07, 0x00, 0x81}, S("tracestate"), big})})})},
      {"a SCHEDULED info value",
       Cat({kHello, BatchOf(1, {Cat({{0x94, 0x03, 0x00, 0x07, 0x81},
                                     S("tracestate"),
                                     big})})})},
      {"a KV_TRANSFER info value",
       Cat({kHello, BatchOf(1, {Cat({{0x94, 0x0a, 0x00, 0x07, 0x81},
                                     S("tracestate"),
                                     big})})})},
      {"a SLEEP state value",
       Cat({kHello,
            BatchOf(1,
                    {Cat({{0x93, 0x0b, 0x00, 0x81}, S("tracestate"), big})})})},
      {"a STEP's after an ARRIVED",
       Cat({kHello,
            BatchOf(2,
                    {Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x80}}),
                     Cat({{0x93, 0x07, 0x00, 0x81}, S("tracestate"), big})})})},
      {"a HELLO value", Cat({{0x92, 0x00, 0x84},
                             S("proto"),
                             {0x01},
                             S("engine"),
                             S("vllm"),
                             S("model"),
                             S("m"),
                             S("tracestate"),
                             big})},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    RecordingSink sink;
    FrameDecoder d{DecoderLimits{}};
    EXPECT_FALSE(Feed(d, c.frame, sink));
    EXPECT_EQ(d.error(), IngestError::kStringTooLong);
  }
  // The scanner keeps no note of which containers are maps: params that
  // are an array ["tracestate", long string] pass it, and the decoder drops
  // them whole (params must be a map), as any params of the wrong type.
  const Middle m = DecodeMiddle(
      Cat({{0x95, 0x01, 0x00, 0x07, 0x0c, 0x92}, S("tracestate"), big}));
  EXPECT_TRUE(m.fed);
  ASSERT_EQ(m.events.size(), 3u);
  EXPECT_EQ(m.bad_fields, 1u);
  EXPECT_TRUE(m.arrivals.empty());
  // ARRIVED's kind in another uint form (uint 8) is still ARRIVED's.
  const Middle u8 = DecodeMiddle(
      Cat({{0x95, 0xcc, 0x01, 0x00, 0x07, 0x0c, 0x81}, S("tracestate"), big}));
  EXPECT_TRUE(u8.fed);
  ASSERT_EQ(u8.events.size(), 3u);
  EXPECT_EQ(u8.events[1].kind, EventKind::kArrived);
  EXPECT_EQ(u8.bad_fields, 1u);
}

// ---------------------------------------------------------------------------
// Protocol 1.3: REQUEST_SUMMARY and LATENCIES, with partial acceptance.

// REQUEST_SUMMARY [12, t=0, reason, {entries}] with `n` map entries, or with
// `rid` appended.
Bytes SummaryOf(std::string_view reason, uint8_t n,
                std::initializer_list<Bytes> entries) {
  Bytes out = Cat({{0x94, 0x0c, 0x00}, S(reason)});
  out.push_back(static_cast<uint8_t>(0x80 | n));
  for (const Bytes& e : entries) out.insert(out.end(), e.begin(), e.end());
  return out;
}
Bytes SummaryWithRid(std::string_view reason, uint8_t n,
                     std::initializer_list<Bytes> entries, const Bytes& rid) {
  Bytes out = SummaryOf(reason, n, entries);
  out[0] = 0x95;
  out.insert(out.end(), rid.begin(), rid.end());
  return out;
}
const Bytes kPrompt812 = Cat({S("prompt_tokens"), {0xcd, 0x03, 0x2c}});
const Bytes kGeneration256 = Cat({S("generation_tokens"), {0xcd, 0x01, 0x00}});

TEST(FrameDecoder13Test, DecodesRequestSummaryWithEveryKey) {
  const Middle m = DecodeMiddle(SummaryWithRid(
      "length", 13,
      {kPrompt812,
       kGeneration256,
       S("cached_tokens"),
       {0xcd, 0x02, 0x00},
       S("max_tokens"),
       {0xcd, 0x04, 0x00},
       S("n"),
       {0x02},
       S("max_generation_tokens"),
       {0xcd, 0x01, 0x2c},
       S("ttft"),
       {0xce, 0x02, 0x71, 0x9c, 0x40},  // 41,000,000
       S("queue"),
       {0x05},
       S("prefill"),
       {0x06},
       S("decode"),
       {0x07},
       S("inference"),
       {0x08},
       S("e2e"),
       {0xcf, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},  // 2^48 - 1
       S("tpot"),
       {0x09}},
      {0x07}));
  ASSERT_TRUE(m.fed);
  EXPECT_TRUE(m.errors.empty());
  ASSERT_EQ(m.events.size(), 3u);
  const Event& e = m.events[1];
  ASSERT_EQ(e.kind, EventKind::kRequestSummary);
  EXPECT_EQ(e.reason, FinishReason::kLength);
  EXPECT_EQ(e.count, 812u);
  EXPECT_TRUE(e.has_max_tokens);
  EXPECT_EQ(e.max_tokens, 1024u);
  EXPECT_TRUE(e.has_n);
  EXPECT_EQ(e.n, 2u);
  const RequestSummaryInfo& q = e.summary;
  EXPECT_EQ(q.generation_tokens, 256u);
  EXPECT_EQ(q.cached_tokens, 512u);
  EXPECT_EQ(q.max_generation_tokens, 300u);
  EXPECT_EQ(q.has, 0x1ffu);  // seven durations, cached, max generation
  const uint64_t durations[] = {41000000, 5, 6, 7, 8, TM_MAX_DURATION_NS, 9};
  for (size_t d = 0; d < kNumSummaryDurations; ++d) {
    EXPECT_EQ(q.duration_ns[d], durations[d]) << d;
  }
  EXPECT_TRUE(q.has_rid);
  EXPECT_EQ(e.rid.number, 7u);
  EXPECT_EQ(m.bad_fields, 0u);
}

TEST(FrameDecoder13Test, DecodesTheSmallestSummaryAndItsIds) {
  const Bytes zero = Cat({S("prompt_tokens"), {0x00}});
  const Bytes gen = Cat({S("generation_tokens"), {0x00}});
  {
    const Middle m = DecodeMiddle(SummaryOf("abort", 2, {gen, zero}));
    ASSERT_EQ(m.events.size(), 3u);
    const Event& e = m.events[1];
    EXPECT_EQ(e.reason, FinishReason::kAbort);
    EXPECT_EQ(e.count, 0u);
    EXPECT_FALSE(e.has_max_tokens);
    EXPECT_FALSE(e.has_n);
    EXPECT_EQ(e.summary.has, 0u);
    EXPECT_FALSE(e.summary.has_rid);
  }
  {
    const Middle m =
        DecodeMiddle(SummaryWithRid("error", 2, {zero, gen}, S("req-1")));
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.events[1].reason, FinishReason::kError);
    EXPECT_TRUE(m.events[1].summary.has_rid);
    EXPECT_EQ(m.rid_texts[1], "req-1");
  }
  // nil id and nil optional keys: absent, nothing dropped; unknown keys
  // (a later version's) are skipped.
  {
    const Middle m = DecodeMiddle(SummaryWithRid("stop", 5,
                                                 {zero,
                                                  gen,
                                                  S("ttft"),
                                                  {0xc0},
                                                  S("n"),
                                                  {0xc0},
                                                  S("later"),
                                                  {0x91, 0x01}},
                                                 {0xc0}));
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.events[1].summary.has, 0u);
    EXPECT_FALSE(m.events[1].has_n);
    EXPECT_FALSE(m.events[1].summary.has_rid);
    EXPECT_EQ(m.bad_fields, 0u);
  }
  // An id that is no id: dropped (bad_field), the summary kept.
  for (const Bytes& bad_id :
       {Bytes{0xca, 0x3f, 0x80, 0, 0}, Bytes{0xa0}, Bytes{0x90}}) {
    const Middle m =
        DecodeMiddle(SummaryWithRid("stop", 2, {zero, gen}, bad_id));
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_FALSE(m.events[1].summary.has_rid);
    EXPECT_EQ(m.bad_fields, 1u);
  }
}

TEST(FrameDecoder13Test, SkipsASummaryWithoutItsRequiredElements) {
  const Bytes zero = Cat({S("prompt_tokens"), {0x00}});
  const Bytes gen = Cat({S("generation_tokens"), {0x00}});
  const Bytes bad_events[] = {
      {0x94, 0x0c, 0x00, 0x00, 0x80},                // reason an int
      {0x94, 0x0c, 0x00, 0xc0, 0x80},                // reason nil
      Cat({{0x93, 0x0c, 0x00}, S("stop")}),          // no summary
      Cat({{0x94, 0x0c, 0x00}, S("stop"), {0x90}}),  // summary an array
      SummaryOf("stop", 1, {zero}),                  // no generation_tokens
      SummaryOf("stop", 1, {gen}),                   // no prompt_tokens
      SummaryOf("stop", 0, {}),
      SummaryOf("stop", 2, {gen, Cat({S("prompt_tokens"), {0xc0}})}),
      SummaryOf("stop", 2, {gen, Cat({S("prompt_tokens"), {0xff}})}),  // -1
      SummaryOf("stop", 2,
                {gen, Cat({S("prompt_tokens"),
                           {0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0}})}),  // 2^32
      SummaryOf("stop", 2, {zero, Cat({S("generation_tokens"), S("1")})}),
  };
  for (const Bytes& c : bad_events) {
    const Middle m = DecodeMiddle(c);
    ASSERT_TRUE(m.fed);
    EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadEvent});
    EXPECT_EQ(m.events.size(), 2u);
    EXPECT_EQ(m.bad_fields, 0u);
  }
  const Middle m = DecodeMiddle(SummaryOf("done", 2, {zero, gen}));
  EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadReason});
  EXPECT_EQ(m.events.size(), 2u);
}

TEST(FrameDecoder13Test, DropsABadOptionalSummaryKey) {
  const Bytes too_long = {0xcf, 0, 0x01, 0, 0, 0, 0, 0, 0};  // 2^48
  const Bytes two_32 = {0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0};    // 2^32
  const Bytes cases[] = {
      Cat({S("ttft"), too_long}),
      Cat({S("queue"), {0xff}}),
      Cat({S("prefill"), S("1")}),
      Cat({S("decode"), {0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}}),  // 1.0
      Cat({S("inference"), too_long}),
      Cat({S("e2e"), {0x90}}),
      Cat({S("tpot"), {0xc3}}),
      Cat({S("cached_tokens"), two_32}),
      Cat({S("cached_tokens"), {0xcd, 0x03, 0x2d}}),  // 813 > 812
      Cat({S("max_tokens"), two_32}),
      Cat({S("n"), {0xff}}),
      Cat({S("max_generation_tokens"), S("9")}),
  };
  for (const Bytes& bad : cases) {
    const Middle m =
        DecodeMiddle(SummaryOf("stop", 3, {kPrompt812, kGeneration256, bad}));
    ASSERT_TRUE(m.fed);
    EXPECT_TRUE(m.errors.empty());
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.bad_fields, 1u);
    const Event& e = m.events[1];
    EXPECT_EQ(e.summary.has, 0u);
    EXPECT_FALSE(e.has_max_tokens);
    EXPECT_FALSE(e.has_n);
    EXPECT_EQ(e.count, 812u);
    EXPECT_EQ(e.summary.generation_tokens, 256u);
  }
  // cached_tokens equal to prompt_tokens, either order: kept.
  const Middle m =
      DecodeMiddle(SummaryOf("stop", 3,
                             {Cat({S("cached_tokens"), {0xcd, 0x03, 0x2c}}),
                              kGeneration256, kPrompt812}));
  ASSERT_EQ(m.events.size(), 3u);
  EXPECT_EQ(m.bad_fields, 0u);
  EXPECT_EQ(m.events[1].summary.cached_tokens, 812u);
}

// LATENCIES [13, t=0, ttft, itl] (or with counts appended).
Bytes LatenciesOf(const Bytes& ttft, const Bytes& itl) {
  return Cat({{0x94, 0x0d, 0x00}, ttft, itl});
}
Bytes LatenciesWith(const Bytes& ttft, const Bytes& itl, const Bytes& counts) {
  return Cat({{0x95, 0x0d, 0x00}, ttft, itl, counts});
}

TEST(FrameDecoder13Test, DecodesLatenciesAndTheirCounts) {
  const Middle m = DecodeMiddle(LatenciesWith(
      {0x92, 0x01, 0xce, 0x02, 0x71, 0x9c, 0x40},
      {0x93, 0x03, 0x00, 0xcf, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
      Cat({{0x83},
           S("prompt_tokens"),
           {0xcd, 0x03, 0x2c},
           S("preemptions"),
           {0x02},
           S("generation_tokens"),
           {0x05}})));
  ASSERT_TRUE(m.fed);
  EXPECT_TRUE(m.errors.empty());
  ASSERT_EQ(m.events.size(), 3u);
  const LatenciesRef& l = m.events[1].latencies;
  ASSERT_EQ(m.events[1].kind, EventKind::kLatencies);
  EXPECT_EQ(l.ttft_count, 2u);
  EXPECT_EQ(l.itl_count, 3u);
  const std::vector<uint64_t> values(m.positions.begin() + l.begin,
                                     m.positions.begin() + l.begin + 5);
  EXPECT_EQ(values,
            (std::vector<uint64_t>{1, 41000000, 3, 0, TM_MAX_DURATION_NS}));
  EXPECT_EQ(l.has, 7u);
  EXPECT_EQ(l.prompt_tokens, 812u);
  EXPECT_EQ(l.generation_tokens, 5u);
  EXPECT_EQ(l.preemptions, 2u);
  EXPECT_EQ(m.bad_fields, 0u);

  // Empty lists, and no counts (nil, or absent).
  for (const Bytes& c :
       {LatenciesOf({0x90}, {0x90}), LatenciesWith({0x90}, {0x90}, {0xc0}),
        LatenciesWith({0x90}, {0x90}, {0x80})}) {
    const Middle e = DecodeMiddle(c);
    ASSERT_EQ(e.events.size(), 3u);
    EXPECT_EQ(e.events[1].latencies.ttft_count, 0u);
    EXPECT_EQ(e.events[1].latencies.itl_count, 0u);
    EXPECT_EQ(e.events[1].latencies.has, 0u);
    EXPECT_EQ(e.bad_fields, 0u);
  }
}

TEST(FrameDecoder13Test, LatenciesTakeAtMostTheLimitTogether) {
  // 1024 values, split 1000 + 24: accepted; one more: a bad event.
  auto list = [](uint16_t n) {
    Bytes out = {0xdc, static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
    out.insert(out.end(), n, 0x01);
    return out;
  };
  const Middle ok = DecodeMiddle(LatenciesOf(list(1000), list(24)));
  ASSERT_EQ(ok.events.size(), 3u);
  EXPECT_EQ(
      ok.events[1].latencies.ttft_count + ok.events[1].latencies.itl_count,
      TM_MAX_LATENCIES);
  for (const Bytes& c :
       {LatenciesOf(list(1000), list(25)), LatenciesOf(list(1025), {0x90}),
        LatenciesOf({0x90}, list(1025))}) {
    const Middle m = DecodeMiddle(c);
    ASSERT_TRUE(m.fed);
    EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadEvent});
    EXPECT_EQ(m.events.size(), 2u);
    EXPECT_TRUE(m.positions.empty());  // a skipped event leaves none behind
  }
}

TEST(FrameDecoder13Test, SkipsLatenciesWithABadList) {
  const Bytes cases[] = {
      {0x93, 0x0d, 0x00, 0x90},           // no itl
      LatenciesOf({0x80}, {0x90}),        // ttft a map
      LatenciesOf({0x90}, {0x01}),        // itl an int
      LatenciesOf({0x91, 0xff}, {0x90}),  // -1
      LatenciesOf({0x90}, {0x91, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}),  // 1.0
      LatenciesOf({0x91, 0xcf, 0, 0x01, 0, 0, 0, 0, 0, 0}, {0x90}),     // 2^48
      LatenciesOf({0x91, 0xc0}, {0x90}),                                // nil
  };
  for (const Bytes& c : cases) {
    const Middle m = DecodeMiddle(c);
    ASSERT_TRUE(m.fed);
    EXPECT_EQ(m.errors, std::vector<IngestError>{IngestError::kBadEvent});
    EXPECT_EQ(m.events.size(), 2u);
    EXPECT_EQ(m.bad_fields, 0u);
  }
}

TEST(FrameDecoder13Test, DropsABadLatencyCount) {
  const Bytes cases[] = {
      {0x01},  // not a map
      Cat({{0x81}, S("prompt_tokens"), {0xff}}),
      Cat({{0x81}, S("generation_tokens"), {0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0}}),
      Cat({{0x81}, S("preemptions"), S("1")}),
  };
  for (const Bytes& counts : cases) {
    const Middle m = DecodeMiddle(LatenciesWith({0x91, 0x07}, {0x90}, counts));
    ASSERT_TRUE(m.fed);
    EXPECT_TRUE(m.errors.empty());
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_EQ(m.bad_fields, 1u);
    EXPECT_EQ(m.events[1].latencies.has, 0u);
    EXPECT_EQ(m.events[1].latencies.ttft_count, 1u);
  }
}

TEST(FrameDecoder13Test, LatencyPositionsFollowAStepsInOneBatch) {
  // STEP with two spec positions, then LATENCIES: their values index the
  // same Batch::positions, each event its own range.
  const Bytes step = Cat({{0x93, 0x07, 0x00, 0x81},
                          S("spec_accepted_per_pos"),
                          {0x92, 0x0a, 0x0b}});
  const Bytes lat = LatenciesOf({0x91, 0x0c}, {0x92, 0x0d, 0x0e});
  RecordingSink sink;
  FrameDecoder d{DecoderLimits{}};
  ASSERT_TRUE(Feed(d, Cat({kHello, BatchOf(3, {step, lat, lat})}), sink));
  ASSERT_EQ(sink.batches.size(), 1u);
  const BatchCopy& b = sink.batches[0];
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.positions,
            (std::vector<uint64_t>{10, 11, 12, 13, 14, 12, 13, 14}));
  EXPECT_EQ(b.events[1].latencies.begin, 2u);
  EXPECT_EQ(b.events[2].latencies.begin, 5u);
}

}  // namespace
}  // namespace tokenmeter::daemon
