#include "daemon/ingest/frame_decoder.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string_view>

namespace tokenmeter::daemon {
namespace {

// ---------------------------------------------------------------------------
// msgpack headers (https://github.com/msgpack/msgpack/blob/master/spec.md).
// One parser serves both the scanner (bytes may be missing) and the frame
// reader (bytes already checked), so the two cannot disagree.

enum class Type : uint8_t {
  kNil,
  kBool,
  kUint,     // any int encoding whose value is >= 0; value = the value
  kNegInt,   // any int encoding whose value is < 0; value = int64 bits
  kFloat32,  // value = the IEEE bits
  kFloat64,
  kStr,  // value = payload length
  kBin,
  kExt,      // value = data length; the ext type byte is part of the header
  kArray,    // value = element count
  kMap,      // value = entry count
  kInvalid,  // 0xc1, never used
};

struct Header {
  Type type;
  uint8_t size;  // header bytes
  uint64_t value;
};

[[gnu::always_inline]] inline uint64_t LoadBe(const uint8_t* p, int n) {
  // n is 1, 2, 4 or 8; fixed-size loads compile to a mov and a bswap.
  switch (n) {
    case 1:
      return p[0];
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return std::endian::native == std::endian::little ? __builtin_bswap16(v)
                                                        : v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return std::endian::native == std::endian::little ? __builtin_bswap32(v)
                                                        : v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return std::endian::native == std::endian::little ? __builtin_bswap64(v)
                                                        : v;
    }
  }
}

// Header bytes of 0xc0..0xdf.
constexpr std::array<uint8_t, 32> kHeaderSize = {
    1, 1, 1, 1, 2, 3, 5, 3,  // c0 nil, c1, c2/c3 bool, c4-c6 bin, c7 ext8
    4, 6, 5, 9, 2, 3, 5, 9,  // c8-c9 ext, ca-cb float, cc-cf uint
    2, 3, 5, 9, 2, 2, 2, 2,  // d0-d3 int, d4-d7 fixext
    2, 2, 3, 5, 3, 5, 3, 5,  // d8 fixext, d9-db str, dc-dd array, de-df map
};

// Encoded size of the scalars whose size the first byte tells (ints,
// floats, nil, bool); 0 for everything else.
constexpr std::array<uint8_t, 256> kFixedSize = [] {
  std::array<uint8_t, 256> t{};
  for (int b = 0x00; b <= 0x7f; ++b) t[b] = 1;  // positive fixint
  for (int b = 0xe0; b <= 0xff; ++b) t[b] = 1;  // negative fixint
  t[0xc0] = t[0xc2] = t[0xc3] = 1;              // nil, false, true
  t[0xca] = 5;                                  // float32
  t[0xcb] = 9;                                  // float64
  t[0xcc] = t[0xd0] = 2;
  t[0xcd] = t[0xd1] = 3;
  t[0xce] = t[0xd2] = 5;
  t[0xcf] = t[0xd3] = 9;
  return t;
}();

inline Header SignedHeader(int64_t v, uint8_t size) {
  if (v >= 0) return {Type::kUint, size, static_cast<uint64_t>(v)};
  return {Type::kNegInt, size, static_cast<uint64_t>(v)};
}

// Parses the header at p (avail >= 1 bytes readable). Returns false when
// the header is longer than avail.
[[gnu::always_inline]] inline bool ParseHeader(const uint8_t* p, size_t avail,
                                               Header* h) {
  const uint8_t b = p[0];
  if (b <= 0x7f) {
    *h = {Type::kUint, 1, b};
    return true;
  }
  if (b >= 0xe0) {
    *h = {Type::kNegInt, 1,
          static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(b)))};
    return true;
  }
  if (b <= 0x8f) {
    *h = {Type::kMap, 1, static_cast<uint64_t>(b & 0x0f)};
    return true;
  }
  if (b <= 0x9f) {
    *h = {Type::kArray, 1, static_cast<uint64_t>(b & 0x0f)};
    return true;
  }
  if (b <= 0xbf) {
    *h = {Type::kStr, 1, static_cast<uint64_t>(b & 0x1f)};
    return true;
  }
  const uint8_t size = kHeaderSize[b - 0xc0];
  if (avail < size) return false;
  switch (b) {
    case 0xc0:
      *h = {Type::kNil, 1, 0};
      break;
    case 0xc1:
      *h = {Type::kInvalid, 1, 0};
      break;
    case 0xc2:
    case 0xc3:
      *h = {Type::kBool, 1, static_cast<uint64_t>(b - 0xc2)};
      break;
    case 0xc4:
    case 0xc5:
    case 0xc6:
      *h = {Type::kBin, size, LoadBe(p + 1, size - 1)};
      break;
    case 0xc7:
    case 0xc8:
    case 0xc9:  // length, then the type byte
      *h = {Type::kExt, size, LoadBe(p + 1, size - 2)};
      break;
    case 0xca:
      *h = {Type::kFloat32, size, LoadBe(p + 1, 4)};
      break;
    case 0xcb:
      *h = {Type::kFloat64, size, LoadBe(p + 1, 8)};
      break;
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
      *h = {Type::kUint, size, LoadBe(p + 1, size - 1)};
      break;
    case 0xd0:
      *h = SignedHeader(static_cast<int8_t>(p[1]), size);
      break;
    case 0xd1:
      *h = SignedHeader(static_cast<int16_t>(LoadBe(p + 1, 2)), size);
      break;
    case 0xd2:
      *h = SignedHeader(static_cast<int32_t>(LoadBe(p + 1, 4)), size);
      break;
    case 0xd3:
      *h = SignedHeader(static_cast<int64_t>(LoadBe(p + 1, 8)), size);
      break;
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:  // fixext 1, 2, 4, 8, 16: the type byte, then the data
      *h = {Type::kExt, size, uint64_t{1} << (b - 0xd4)};
      break;
    case 0xd9:
    case 0xda:
    case 0xdb:
      *h = {Type::kStr, size, LoadBe(p + 1, size - 1)};
      break;
    case 0xdc:
    case 0xdd:
      *h = {Type::kArray, size, LoadBe(p + 1, size - 1)};
      break;
    default:  // 0xde, 0xdf
      *h = {Type::kMap, size, LoadBe(p + 1, size - 1)};
      break;
  }
  return true;
}

inline bool HasPayload(Type t) {
  return t == Type::kStr || t == Type::kBin || t == Type::kExt;
}

// Elements a container header opens (a map entry is two).
inline uint64_t Children(const Header& h) {
  if (h.type == Type::kArray) return h.value;
  if (h.type == Type::kMap) return h.value * 2;
  return 0;
}

// Returns the end of the n values at p. Out of line, and not a Reader
// member, so that a Reader's position can live in a register.
[[gnu::noinline]] const uint8_t* SkipValues(const uint8_t* p,
                                            const uint8_t* end, uint64_t n) {
  while (n > 0) {
    --n;
    Header h;
    if (p >= end || !ParseHeader(p, static_cast<size_t>(end - p), &h)) {
      std::abort();  // the scanner let through what it should not have
    }
    p += h.size;
    if (HasPayload(h.type)) {
      if (h.value > static_cast<uint64_t>(end - p)) std::abort();
      p += h.value;
    } else {
      n += Children(h);
    }
  }
  return p;
}

// ---------------------------------------------------------------------------
// Reader over one complete frame that the scanner has already checked:
// every header and payload the reader reaches lies inside the frame. The
// checks below only guard against a bug (abort, a broken invariant).

class Reader {
 public:
  Reader(const uint8_t* begin, const uint8_t* end) : p_(begin), end_(end) {}

  [[gnu::always_inline]] inline Header Next() {
    Header h;
    if (p_ >= end_ || !ParseHeader(p_, static_cast<size_t>(end_ - p_), &h)) {
      std::abort();
    }
    p_ += h.size;
    return h;
  }

  // A positive fixint or a uint 8/16/32/64: true with *v and the reader
  // past it; false, the reader where it was, for anything else.
  [[gnu::always_inline]] inline bool TryReadUint(uint64_t* v) {
    if (p_ < end_) {
      const uint8_t b = *p_;
      if (b <= 0x7f) {
        *v = b;
        ++p_;
        return true;
      }
      // uint 64, 16, 8, 32: a branch each that advances by a constant
      // (as in the scanner's fast path), so that the next value's read
      // need not wait for this one's size.
      if (b == 0xcf) return TakeUint<8>(v);
      if (b == 0xcd) return TakeUint<2>(v);
      if (b == 0xcc) return TakeUint<1>(v);
      if (b == 0xce) return TakeUint<4>(v);
    }
    return false;
  }

  // The uint of N bytes after the header byte at p_: true with *v and the
  // reader past it; false, the reader where it was, when the bytes end.
  template <int N>
  [[gnu::always_inline]] inline bool TakeUint(uint64_t* v) {
    if (end_ - p_ <= N) return false;
    *v = LoadBe(p_ + 1, N);
    p_ += 1 + N;
    return true;
  }

  // Reads a non-negative int of any encoding. False for anything else
  // (the value's header then consumed).
  [[gnu::always_inline]] inline bool ReadUint(uint64_t* v) {
    if (TryReadUint(v)) return true;
    const Header h = Next();
    *v = h.value;
    return h.type == Type::kUint;
  }

  // Reads an array header. False for anything else (header consumed).
  [[gnu::always_inline]] inline bool ReadArray(uint64_t* count) {
    if (p_ < end_ && (*p_ & 0xf0) == 0x90) {
      *count = *p_ & 0x0f;
      ++p_;
      return true;
    }
    const Header h = Next();
    *count = h.value;
    return h.type == Type::kArray;
  }

  // The payload of a str/bin/ext header just read.
  std::string_view Payload(const Header& h) {
    if (h.value > static_cast<uint64_t>(end_ - p_)) std::abort();
    std::string_view s(reinterpret_cast<const char*>(p_), h.value);
    p_ += h.value;
    return s;
  }

  // Skips whatever follows the header h just read (payload or children).
  void SkipBody(const Header& h) {
    if (HasPayload(h.type)) {
      Payload(h);
    } else {
      Skip(Children(h));
    }
  }

  // Skips n whole values.
  void Skip(uint64_t n) {
    if (n > 0) p_ = SkipValues(p_, end_, n);
  }

  const uint8_t* pos() const { return p_; }
  void set_pos(const uint8_t* p) { p_ = p; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// ---------------------------------------------------------------------------
// HELLO validation.

// Drops the value that starts at `at` (its header already read or not):
// the reader moves past it and the dropped field is counted.
void DropField(Reader& r, const uint8_t* at, uint32_t* bad_fields) {
  r.set_pos(at);
  r.Skip(1);
  ++*bad_fields;
}

// The HELLO rules live in protocol.h, shared with the client library.
bool IsValidUtf8(std::string_view s) {
  return tm_proto_valid_utf8(s.data(), s.size()) != 0;
}

bool IsValidName(std::string_view s, bool with_dash) {
  return tm_proto_valid_name(s.data(), s.size(), with_dash ? 1 : 0) != 0;
}

bool IsReservedLabel(std::string_view name) {
  return tm_proto_reserved_label(name.data(), name.size()) != 0;
}

// Reads a HELLO string value (any str, valid UTF-8).
bool ReadHelloString(Reader& r, const Header& h, std::string_view* out) {
  if (h.type != Type::kStr) return false;
  *out = r.Payload(h);
  return IsValidUtf8(*out);
}

IngestError ParseLabels(Reader& r, const Header& h, const DecoderLimits& limits,
                        Hello* hello) {
  if (h.type != Type::kMap) return IngestError::kBadHello;
  if (h.value > limits.max_hello_labels) return IngestError::kTooManyLabels;
  hello->labels.clear();
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view name, value;
    if (!ReadHelloString(r, r.Next(), &name)) return IngestError::kBadHello;
    if (!ReadHelloString(r, r.Next(), &value)) return IngestError::kBadHello;
    if (!IsValidName(name, /*with_dash=*/false)) return IngestError::kBadName;
    if (IsReservedLabel(name)) return IngestError::kReservedLabel;
    for (const auto& label : hello->labels) {
      if (label.first == name) return IngestError::kBadName;
    }
    hello->labels.emplace_back(name, value);
  }
  return IngestError::kCount;
}

// One HELLO cache_config entry's value: str (UTF-8), int, float (finite) or
// bool, rendered as the catalog says. False (nothing consumed beyond `v`'s
// header and payload) for anything else.
bool ParseCacheConfigValue(Reader& r, const Header& v, CacheConfigEntry* e) {
  char buf[32];
  std::to_chars_result res{buf, std::errc()};
  switch (v.type) {
    case Type::kStr: {
      const std::string_view text = r.Payload(v);
      if (!IsValidUtf8(text)) return false;
      e->value = text;
      return true;
    }
    case Type::kUint:
      res = std::to_chars(buf, buf + sizeof buf, v.value);
      e->number = double(v.value);
      break;
    case Type::kNegInt:
      res = std::to_chars(buf, buf + sizeof buf, int64_t(v.value));
      e->number = double(int64_t(v.value));
      break;
    case Type::kFloat32: {
      const float f = std::bit_cast<float>(uint32_t(v.value));
      if (!std::isfinite(f)) return false;
      res = std::to_chars(buf, buf + sizeof buf, f);
      e->number = f;
      break;
    }
    case Type::kFloat64: {
      const double d = std::bit_cast<double>(v.value);
      if (!std::isfinite(d)) return false;
      res = std::to_chars(buf, buf + sizeof buf, d);
      e->number = d;
      break;
    }
    case Type::kBool:
      e->value = v.value != 0 ? "True" : "False";
      return true;
    default:
      return false;
  }
  e->value.assign(buf, res.ptr);
  return true;
}

// HELLO cache_config: a map of at most TM_MAX_CACHE_CONFIG entries, keys by
// the HELLO label rules and unique, values str, int, float or bool. It
// only informs (protocol 1.2, partial acceptance): a value that is not such
// a map, or has too many entries, is dropped whole; an entry with a bad key
// or value is dropped; each counts once in hello->bad_fields.
void ParseCacheConfig(Reader& r, const uint8_t* at, const Header& h,
                      Hello* hello) {
  if (h.type != Type::kMap || h.value > TM_MAX_CACHE_CONFIG) {
    DropField(r, at, &hello->bad_fields);
    return;
  }
  hello->cache_config.clear();
  for (uint64_t i = 0; i < h.value; ++i) {
    const uint8_t* key_at = r.pos();
    std::string_view key;
    bool ok = ReadHelloString(r, r.Next(), &key) &&
              IsValidName(key, /*with_dash=*/false) && !IsReservedLabel(key);
    for (const auto& e : hello->cache_config) ok = ok && e.key != key;
    if (!ok) {
      // The entry: its key and its value.
      r.set_pos(key_at);
      r.Skip(2);
      ++hello->bad_fields;
      continue;
    }
    const uint8_t* value_at = r.pos();
    CacheConfigEntry entry{std::string(key), {}, std::nan("")};
    if (!ParseCacheConfigValue(r, r.Next(), &entry)) {
      DropField(r, value_at, &hello->bad_fields);
      continue;
    }
    hello->cache_config.push_back(std::move(entry));
  }
  hello->has_cache_config = true;
}

// Returns kCount when the meta map is a valid HELLO.
IngestError ParseHelloMeta(Reader& r, const DecoderLimits& limits,
                           Hello* hello) {
  const Header meta = r.Next();
  if (meta.type != Type::kMap) return IngestError::kBadHello;
  enum : uint32_t {
    kProto = 1,
    kEngine = 2,
    kModel = 4,
    kInstance = 8,
    kScope = 16,
    kLabels = 32,
    kPid = 64,
    kProfile = 128,
    kCacheConfig = 256,
    kMaxLora = 512,
    kSession = 1024,
    kAck = 2048,
  };
  uint32_t seen = 0;
  for (uint64_t i = 0; i < meta.value; ++i) {
    const Header kh = r.Next();
    if (kh.type != Type::kStr) return IngestError::kBadHello;
    const std::string_view key = r.Payload(kh);
    if (!IsValidUtf8(key)) return IngestError::kBadHello;
    const uint8_t* value_at = r.pos();
    const Header v = r.Next();
    uint32_t bit = 0;
    std::string_view s;
    if (key == TM_HELLO_PROTO) {
      bit = kProto;
      if (v.type != Type::kUint || v.value != TM_PROTO_VERSION) {
        return IngestError::kBadHello;
      }
      hello->proto = TM_PROTO_VERSION;
    } else if (key == TM_HELLO_ENGINE) {
      bit = kEngine;
      if (!ReadHelloString(r, v, &s)) return IngestError::kBadHello;
      if (!IsValidName(s, /*with_dash=*/true)) return IngestError::kBadName;
      hello->engine = s;
    } else if (key == TM_HELLO_MODEL) {
      bit = kModel;
      if (!ReadHelloString(r, v, &s) || s.empty()) {
        return IngestError::kBadHello;
      }
      hello->model = s;
    } else if (key == TM_HELLO_INSTANCE) {
      bit = kInstance;
      if (!ReadHelloString(r, v, &s)) return IngestError::kBadHello;
      hello->instance = s;
    } else if (key == TM_HELLO_SCOPE) {
      bit = kScope;
      if (!ReadHelloString(r, v, &s)) return IngestError::kBadHello;
      hello->scope = s;
      hello->has_scope = true;
    } else if (key == TM_HELLO_LABELS) {
      bit = kLabels;
      const IngestError e = ParseLabels(r, v, limits, hello);
      if (e != IngestError::kCount) return e;
    } else if (key == TM_HELLO_PID) {
      // Informs only (the client-drop slot): dropped when bad.
      bit = kPid;
      if ((v.type == Type::kUint &&
           v.value <= static_cast<uint64_t>(INT64_MAX)) ||
          v.type == Type::kNegInt) {
        hello->pid = static_cast<int64_t>(v.value);
        hello->has_pid = true;
      } else {
        DropField(r, value_at, &hello->bad_fields);
      }
    } else if (key == TM_HELLO_PROFILE) {
      bit = kProfile;
      if (!ReadHelloString(r, v, &s)) return IngestError::kBadHello;
      if (s != TM_PROFILE_VLLM && s != TM_PROFILE_SGLANG &&
          s != TM_PROFILE_LMDEPLOY) {
        return IngestError::kBadHello;
      }
      hello->profile = s;
    } else if (key == TM_HELLO_CACHE_CONFIG) {
      bit = kCacheConfig;
      ParseCacheConfig(r, value_at, v, hello);
    } else if (key == TM_HELLO_MAX_LORA) {
      // Informs only (a label of lora_requests_info): dropped when bad.
      bit = kMaxLora;
      if (v.type == Type::kUint &&
          v.value <= static_cast<uint64_t>(INT64_MAX)) {
        hello->max_lora = static_cast<int64_t>(v.value);
        hello->has_max_lora = true;
      } else {
        DropField(r, value_at, &hello->bad_fields);
      }
    } else if (key == TM_HELLO_SESSION) {
      bit = kSession;
      if (v.type != Type::kUint) return IngestError::kBadHello;
      hello->session = v.value;
      hello->has_session = true;
    } else if (key == TM_HELLO_ACK) {
      bit = kAck;
      if (v.type != Type::kBool) return IngestError::kBadHello;
      hello->ack = v.value != 0;
    } else {
      r.SkipBody(v);  // unknown key: forward compatibility
    }
    // A known key twice would make the HELLO ambiguous.
    if ((seen & bit) != 0) return IngestError::kBadHello;
    seen |= bit;
  }
  if ((seen & (kProto | kEngine | kModel)) != (kProto | kEngine | kModel)) {
    return IngestError::kBadHello;
  }
  // ACKs are per session: `ack: true` needs one.
  if (hello->ack && !hello->has_session) return IngestError::kBadHello;
  return IngestError::kCount;
}

// ---------------------------------------------------------------------------
// Events.

constexpr uint64_t kMinEventElements[] = {
    0,
    4,  // ARRIVED [1, t, rid, prompt_tokens(, params)]
    3,  // QUEUED
    3,  // SCHEDULED
    4,  // TOKENS [4, t, rid, n]
    4,  // FINISHED [5, t, rid, reason]
    3,  // PREEMPTED
    3,  // STEP [7, t, stats]
    4,  // EXPERT_LOAD [8, t, layer, counts]
    3,  // ADMISSION_REJECTED [9, t, reason(, rid)]
    4,  // KV_TRANSFER [10, t, rid, info]
    3,  // SLEEP [11, t, state]
    4,  // REQUEST_SUMMARY [12, t, reason, summary(, rid)]
    4,  // LATENCIES [13, t, ttft, itl(, counts)]
};
static_assert(std::size(kMinEventElements) == TM_EV_LAST + 1);

struct UintStatKey {
  std::string_view name;
  StepStats::Key bit;
  uint32_t StepStats::*field;
};

constexpr UintStatKey kUintStatKeys[] = {
    {TM_STEP_RUNNING, StepStats::kRunning, &StepStats::running},
    {TM_STEP_WAITING, StepStats::kWaiting, &StepStats::waiting},
    {TM_STEP_PROMPT_TOKENS, StepStats::kPromptTokens,
     &StepStats::prompt_tokens},
    {TM_STEP_GENERATION_TOKENS, StepStats::kGenerationTokens,
     &StepStats::generation_tokens},
    {TM_STEP_PREFIX_QUERIES, StepStats::kPrefixQueries,
     &StepStats::prefix_queries},
    {TM_STEP_PREFIX_HITS, StepStats::kPrefixHits, &StepStats::prefix_hits},
    {TM_STEP_SPEC_DRAFTS, StepStats::kSpecDrafts, &StepStats::spec_drafts},
    {TM_STEP_SPEC_DRAFT_TOKENS, StepStats::kSpecDraftTokens,
     &StepStats::spec_draft_tokens},
    {TM_STEP_SPEC_ACCEPTED_TOKENS, StepStats::kSpecAcceptedTokens,
     &StepStats::spec_accepted_tokens},
    {TM_STEP_WAITING_DEFERRED, StepStats::kWaitingDeferred,
     &StepStats::waiting_deferred},
};

// Reads the key of a params/stats entry. Non-string keys are unknown keys:
// the whole entry is skipped and false returned.
bool ReadEventMapKey(Reader& r, std::string_view* key) {
  const Header kh = r.Next();
  if (kh.type == Type::kStr) {
    *key = r.Payload(kh);
    return true;
  }
  r.SkipBody(kh);
  r.Skip(1);
  return false;
}

// ARRIVED params labels: a map of at most TM_MAX_REQUEST_LABELS entries,
// names by the HELLO label rules and unique, values str of at most
// TM_MAX_REQUEST_LABEL_VALUE_BYTES bytes, all valid UTF-8.
bool ParseRequestLabels(Reader& r, const Header& h, ArrivedExtras* x) {
  if (h.type != Type::kMap || h.value > TM_MAX_REQUEST_LABELS) return false;
  x->num_labels = 0;
  for (uint64_t i = 0; i < h.value; ++i) {
    const Header kh = r.Next();
    if (kh.type != Type::kStr) return false;
    const std::string_view name = r.Payload(kh);
    const Header vh = r.Next();
    if (vh.type != Type::kStr || vh.value > TM_MAX_REQUEST_LABEL_VALUE_BYTES) {
      return false;
    }
    const std::string_view value = r.Payload(vh);
    if (!IsValidName(name, /*with_dash=*/false) || IsReservedLabel(name) ||
        !IsValidUtf8(value)) {
      return false;
    }
    for (uint8_t j = 0; j < x->num_labels; ++j) {
      if (x->labels[j].first == name) return false;
    }
    x->labels[x->num_labels++] = {name, value};
  }
  return true;
}

// ARRIVED params: nil, or a map with optional int max_tokens and n, and
// (1.1) lora and labels and (1.2) priority, traceparent and tracestate,
// which go to `x`. A nil value is the key absent (a
// client's None). Each of them is an optional field (protocol 1.2,
// partial acceptance): one with a wrong type or out of its range is
// dropped and counted in *bad_fields, and so is a params value that is not
// a map (once); the event is applied without them.
void ParseParams(Reader& r, Event* e, ArrivedExtras* x, bool* has_extras,
                 uint32_t* bad_fields) {
  const uint8_t* params_at = r.pos();
  const Header h = r.Next();
  if (h.type == Type::kNil) return;
  if (h.type != Type::kMap) {
    DropField(r, params_at, bad_fields);
    return;
  }
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const uint8_t* at = r.pos();
    const Header v = r.Next();
    if (v.type == Type::kNil) continue;
    if (key == TM_PARAM_LORA) {
      if (v.type != Type::kStr || v.value < 1 || v.value > TM_MAX_LORA_BYTES) {
        DropField(r, at, bad_fields);
        continue;
      }
      const std::string_view lora = r.Payload(v);
      if (!IsValidUtf8(lora)) {
        ++*bad_fields;
        continue;
      }
      x->lora = lora;
      *has_extras = true;
    } else if (key == TM_PARAM_LABELS) {
      if (!ParseRequestLabels(r, v, x)) {
        x->num_labels = 0;  // the map is dropped whole
        DropField(r, at, bad_fields);
        continue;
      }
      *has_extras = *has_extras || x->num_labels > 0;
    } else if (key == TM_PARAM_PRIORITY) {
      const int64_t p = static_cast<int64_t>(v.value);
      if ((v.type != Type::kUint && v.type != Type::kNegInt) ||
          (v.type == Type::kUint && v.value > uint64_t(TM_MAX_PRIORITY)) ||
          (v.type == Type::kNegInt && p < TM_MIN_PRIORITY)) {
        DropField(r, at, bad_fields);
        continue;
      }
      x->priority = int32_t(p);
      x->has_priority = true;
      *has_extras = true;
    } else if (key == TM_PARAM_TRACEPARENT || key == TM_PARAM_TRACESTATE) {
      if (v.type != Type::kStr) {
        DropField(r, at, bad_fields);
        continue;
      }
      const std::string_view text = r.Payload(v);
      const bool parent = key == TM_PARAM_TRACEPARENT;
      if (parent ? !tm_proto_valid_traceparent(text.data(), text.size())
                 : !tm_proto_valid_tracestate(text.data(), text.size())) {
        ++*bad_fields;
        continue;
      }
      if (text.empty()) continue;  // an empty tracestate: none
      (parent ? x->traceparent : x->tracestate) = text;
      *has_extras = true;
    } else if (key == TM_PARAM_MAX_TOKENS || key == TM_PARAM_N) {
      if (v.type != Type::kUint || v.value > TM_MAX_EVENT_COUNT) {
        DropField(r, at, bad_fields);
        continue;
      }
      if (key == TM_PARAM_N) {
        e->n = v.value;
        e->has_n = true;
      } else {
        e->max_tokens = v.value;
        e->has_max_tokens = true;
      }
    } else {
      r.SkipBody(v);
    }
  }
}

// The params of an ARRIVED, with the lora and labels (if any) appended to
// batch.arrivals. Out of line: ParseEventBody, on every event's path, stays
// small enough to be inlined into the batch loop.
[[gnu::noinline]] void ParseArrivedParams(Reader& r, Batch& batch, Event* e,
                                          uint32_t* bad_fields) {
  ArrivedExtras x;
  bool has_extras = false;
  ParseParams(r, e, &x, &has_extras, bad_fields);
  if (has_extras) {
    e->extras = uint32_t(batch.arrivals.size());
    batch.arrivals.push_back(x);
  }
}

// EXPERT_LOAD: a layer below TM_MAX_MOE_LAYERS and an array of 1 to
// TM_MAX_MOE_EXPERTS counts, appended to `positions`.
[[gnu::noinline]] bool ParseExpertLoad(Reader& r,
                                       std::vector<uint64_t>& positions,
                                       Event* e) {
  uint64_t layer;
  if (!r.ReadUint(&layer) || layer >= TM_MAX_MOE_LAYERS) return false;
  const Header h = r.Next();
  if (h.type != Type::kArray || h.value < 1 || h.value > TM_MAX_MOE_EXPERTS) {
    return false;
  }
  ExpertLoadRef& x = e->expert_load_ref;
  x.layer = uint32_t(layer);
  x.begin = uint32_t(positions.size());
  for (uint64_t j = 0; j < h.value; ++j) {
    const Header c = r.Next();
    if (c.type != Type::kUint || c.value > TM_MAX_EVENT_COUNT) return false;
    positions.push_back(c.value);
  }
  x.count = uint32_t(h.value);
  return true;
}

// STEP stats map (required: anything else fails the event). A nil value
// is the key absent. Each key is an optional field (protocol 1.2, partial
// acceptance): one with a wrong type or out of its range is dropped and
// counted in *bad_fields, the rest of the STEP applied.
bool ParseStats(Reader& r, const DecoderLimits& limits,
                std::vector<uint64_t>& positions, StepStats* st,
                uint32_t* bad_fields) {
  const Header h = r.Next();
  if (h.type != Type::kMap) return false;
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const uint8_t* at = r.pos();
    const Header v = r.Next();
    if (v.type == Type::kNil) continue;
    bool known = false;
    for (const UintStatKey& k : kUintStatKeys) {
      if (key == k.name) {
        known = true;
        if (v.type != Type::kUint || v.value > TM_MAX_EVENT_COUNT) {
          DropField(r, at, bad_fields);
          break;
        }
        st->*k.field = uint32_t(v.value);
        st->has |= k.bit;
        break;
      }
    }
    if (known) continue;
    if (key == TM_STEP_KV_USAGE) {
      double d;
      if (v.type == Type::kUint) {
        d = static_cast<double>(v.value);
      } else if (v.type == Type::kFloat32) {
        d = std::bit_cast<float>(static_cast<uint32_t>(v.value));
      } else if (v.type == Type::kFloat64) {
        d = std::bit_cast<double>(v.value);
      } else {
        DropField(r, at, bad_fields);
        continue;
      }
      if (!(d >= 0.0 && d <= 1.0)) {  // NaN fails too
        ++*bad_fields;
        continue;
      }
      st->kv_usage = d;
      st->has |= StepStats::kKvUsage;
    } else if (key == TM_STEP_SPEC_ACCEPTED_PER_POS) {
      if (v.type != Type::kArray || v.value > limits.max_spec_positions) {
        DropField(r, at, bad_fields);
        continue;
      }
      const size_t before = positions.size();
      bool ok = true;
      for (uint64_t j = 0; j < v.value && ok; ++j) {
        const Header p = r.Next();
        if (p.type != Type::kUint || p.value > TM_MAX_EVENT_COUNT) {
          ok = false;
        } else {
          positions.push_back(p.value);
        }
      }
      if (!ok) {
        positions.resize(before);
        DropField(r, at, bad_fields);
        continue;
      }
      if ((st->has & StepStats::kSpecAcceptedPerPos) != 0) {
        // The key again: the last one wins.
        positions.erase(positions.begin() + st->pos_begin,
                        positions.begin() + st->pos_begin + st->pos_count);
        st->pos_begin = uint32_t(positions.size() - v.value);
      } else {
        st->pos_begin = static_cast<uint32_t>(before);
      }
      st->pos_count = static_cast<uint32_t>(v.value);
      st->has |= StepStats::kSpecAcceptedPerPos;
    } else {
      r.SkipBody(v);
    }
  }
  // waiting_deferred is a part of waiting: without it, or above it, the
  // key is dropped (once).
  if ((st->has & StepStats::kWaitingDeferred) != 0 &&
      ((st->has & StepStats::kWaiting) == 0 ||
       st->waiting_deferred > st->waiting)) {
    st->has &= ~uint32_t(StepStats::kWaitingDeferred);
    st->waiting_deferred = 0;
    ++*bad_fields;
  }
  return true;
}

// A str in label-value syntax (protocol.h): the value, or empty.
std::string_view LabelValue(Reader& r, const Header& h) {
  if (h.type != Type::kStr) {
    r.SkipBody(h);
    return {};
  }
  const std::string_view s = r.Payload(h);
  return tm_proto_valid_label_value(s.data(), s.size()) != 0
             ? s
             : std::string_view();
}

// SCHEDULED info (1.2): a map whose optional keys cached_tokens and
// external_tokens are uints; one not a uint is dropped (bad_field), a
// value that is not a map is dropped whole (once). One above
// TM_MAX_EVENT_COUNT is above any prompt, so the sum is: the map is
// dropped as one bad_field (the spec's rule for a sum above prompt_tokens).
// Whether the sum fits the request's prompt is otherwise the tracker's to
// check.
[[gnu::noinline]] void ParseScheduledInfo(Reader& r, ScheduledInfo* info,
                                          uint32_t* bad_fields) {
  const uint8_t* info_at = r.pos();
  const Header h = r.Next();
  if (h.type == Type::kNil) return;
  if (h.type != Type::kMap) {
    DropField(r, info_at, bad_fields);
    return;
  }
  info->present = true;
  bool above_any_prompt = false;
  // The count before this map: a map dropped whole counts once, whatever
  // keys of it were dropped on the way (protocol 1.2, partial acceptance).
  const uint32_t bad_before = *bad_fields;
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const uint8_t* at = r.pos();
    const Header v = r.Next();
    if (v.type == Type::kNil) continue;
    const bool cached = key == TM_SCHED_CACHED_TOKENS;
    if (!cached && key != TM_SCHED_EXTERNAL_TOKENS) {
      r.SkipBody(v);
      continue;
    }
    if (v.type != Type::kUint) {
      DropField(r, at, bad_fields);
      continue;
    }
    if (v.value > TM_MAX_EVENT_COUNT) {
      above_any_prompt = true;
      continue;
    }
    if (cached) {
      info->cached_tokens = uint32_t(v.value);
      info->has |= ScheduledInfo::kCached;
    } else {
      info->external_tokens = uint32_t(v.value);
      info->has |= ScheduledInfo::kExternal;
    }
  }
  if (above_any_prompt) {
    *info = ScheduledInfo{};
    *bad_fields = bad_before + 1;
  }
}

// KV_TRANSFER info (1.2): role and start are required (false: a bad
// event); bytes, blocks, ok, reason and connector are optional fields.
[[gnu::noinline]] bool ParseKvTransfer(Reader& r, uint64_t t_ns,
                                       KvTransferInfo* x,
                                       uint32_t* bad_fields) {
  const Header h = r.Next();
  if (h.type != Type::kMap) return false;
  bool has_role = false, has_start = false;
  uint32_t dropped = 0;
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const uint8_t* at = r.pos();
    const Header v = r.Next();
    if (key == TM_KV_ROLE) {
      if (v.type != Type::kStr) return false;
      const std::string_view role = r.Payload(v);
      if (role == TM_KV_ROLE_SEND) {
        x->role = KvRole::kSend;
      } else if (role == TM_KV_ROLE_RECV) {
        x->role = KvRole::kRecv;
      } else {
        return false;
      }
      has_role = true;
    } else if (key == TM_KV_START) {
      if (v.type != Type::kUint || v.value > t_ns) return false;
      x->start_ns = v.value;
      has_start = true;
    } else if (v.type == Type::kNil) {
      continue;  // an optional key absent
    } else if (key == TM_KV_BYTES || key == TM_KV_BLOCKS) {
      if (v.type != Type::kUint || v.value > TM_MAX_KV_TRANSFER_BYTES) {
        DropField(r, at, &dropped);
        continue;
      }
      if (key == TM_KV_BYTES) {
        x->bytes = v.value;
        x->has_bytes = true;
      } else {
        x->blocks = v.value;
        x->has_blocks = true;
      }
    } else if (key == TM_KV_OK) {
      if (v.type != Type::kBool) {
        DropField(r, at, &dropped);
        continue;
      }
      x->ok = v.value != 0;
    } else if (key == TM_KV_REASON || key == TM_KV_CONNECTOR) {
      const std::string_view value = LabelValue(r, v);
      if (value.empty()) {
        ++dropped;
        continue;
      }
      (key == TM_KV_REASON ? x->reason : x->connector) = TextRef::Of(value);
    } else {
      r.SkipBody(v);
    }
  }
  if (!has_role || !has_start) return false;
  *bad_fields += dropped;
  return true;
}

// SLEEP state (1.2): a map (required); each known key whose value is not
// one of its states is dropped (bad_field).
[[gnu::noinline]] bool ParseSleep(Reader& r, SleepInfo* x,
                                  uint32_t* bad_fields) {
  const Header h = r.Next();
  if (h.type != Type::kMap) return false;
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const Header v = r.Next();
    if (v.type == Type::kNil) continue;
    const bool scheduler = key == TM_SLEEP_SCHEDULER;
    const bool weights = key == TM_SLEEP_WEIGHTS;
    const bool kv = key == TM_SLEEP_KV_CACHE;
    if (!scheduler && !weights && !kv) {
      r.SkipBody(v);
      continue;
    }
    std::string_view value;
    if (v.type == Type::kStr) {
      value = r.Payload(v);
    } else {
      r.SkipBody(v);
    }
    bool ok = true;
    if (scheduler) {
      if (value == TM_SLEEP_RUNNING) {
        x->scheduler = SchedulerState::kRunning;
      } else if (value == TM_SLEEP_PAUSED) {
        x->scheduler = SchedulerState::kPaused;
      } else {
        ok = false;
      }
    } else if (weights) {
      if (value == TM_SLEEP_RESIDENT) {
        x->weights = WeightsState::kResident;
      } else if (value == TM_SLEEP_OFFLOADED) {
        x->weights = WeightsState::kOffloaded;
      } else if (value == TM_SLEEP_DISCARDED) {
        x->weights = WeightsState::kDiscarded;
      } else {
        ok = false;
      }
    } else {
      if (value == TM_SLEEP_RESIDENT) {
        x->kv_cache = KvCacheState::kResident;
      } else if (value == TM_SLEEP_RELEASED) {
        x->kv_cache = KvCacheState::kReleased;
      } else {
        ok = false;
      }
    }
    if (!ok) ++*bad_fields;
  }
  return true;
}

// A request id at the reader: a uint, or a str of 1 .. max_rid_bytes
// (false, the value skipped, for anything else). Inlined: every event but
// STEP's has one.
[[gnu::always_inline]] inline bool ParseRequestId(Reader& r,
                                                  const DecoderLimits& limits,
                                                  RequestId* rid) {
  // An integer id in one of its usual encodings without the general
  // header parse (the common case); anything else as before.
  if (r.TryReadUint(&rid->number)) [[likely]] {
    rid->is_string = false;
    return true;
  }
  const Header id = r.Next();
  if (id.type == Type::kUint) {
    rid->is_string = false;
    rid->number = id.value;
    return true;
  }
  if (id.type == Type::kStr && id.value >= 1 &&
      id.value <= limits.max_rid_bytes) {
    rid->is_string = true;
    rid->text = r.Payload(id);
    return true;
  }
  r.SkipBody(id);
  return false;
}

// An optional trailing request id (ADMISSION_REJECTED's, REQUEST_SUMMARY's):
// true with *rid set; false for nil, or for what is no id (then dropped:
// bad_field). The reader moves past it either way.
bool ParseOptionalRid(Reader& r, const DecoderLimits& limits, RequestId* rid,
                      uint32_t* bad_fields) {
  const uint8_t* at = r.pos();
  const Header peek = r.Next();
  r.set_pos(at);
  if (peek.type == Type::kNil) {
    r.Skip(1);
    return false;
  }
  if (ParseRequestId(r, limits, rid)) return true;
  DropField(r, at, bad_fields);
  return false;
}

// ADMISSION_REJECTED (1.2): the reason (required, label-value syntax),
// then an optional request id (one that is not an id is dropped:
// bad_field).
[[gnu::noinline]] bool ParseAdmission(Reader& r, uint64_t n,
                                      const DecoderLimits& limits, Event* e,
                                      uint32_t* bad_fields) {
  const Header h = r.Next();
  const std::string_view reason = LabelValue(r, h);
  if (reason.empty()) return false;
  e->admission.reason = TextRef::Of(reason);
  if (n >= 4) {
    e->admission.has_rid = ParseOptionalRid(r, limits, &e->rid, bad_fields);
  }
  return true;
}

bool ParseFinishReason(std::string_view s, FinishReason* reason) {
  if (s == TM_REASON_STOP) {
    *reason = FinishReason::kStop;
  } else if (s == TM_REASON_LENGTH) {
    *reason = FinishReason::kLength;
  } else if (s == TM_REASON_ABORT) {
    *reason = FinishReason::kAbort;
  } else if (s == TM_REASON_ERROR) {
    *reason = FinishReason::kError;
  } else {
    return false;
  }
  return true;
}

// The keys of a REQUEST_SUMMARY's durations, in SummaryDuration order.
constexpr std::string_view kSummaryDurationKeys[] = {
    TM_SUM_TTFT,      TM_SUM_QUEUE, TM_SUM_PREFILL, TM_SUM_DECODE,
    TM_SUM_INFERENCE, TM_SUM_E2E,   TM_SUM_TPOT};
static_assert(std::size(kSummaryDurationKeys) == kNumSummaryDurations);

// REQUEST_SUMMARY (1.3): the reason (a str, required: another type is a bad
// event, another string bad_reason), the summary map (required) with its
// required prompt_tokens and generation_tokens, its optional counts and
// durations (each dropped alone when bad: bad_field; cached_tokens also
// above prompt_tokens), then an optional request id (dropped when it is no
// id). Returns kCount or the event's error.
[[gnu::noinline]] IngestError ParseRequestSummary(Reader& r, uint64_t n,
                                                  const DecoderLimits& limits,
                                                  Event* e,
                                                  uint32_t* bad_fields) {
  const Header rh = r.Next();
  if (rh.type != Type::kStr) {
    r.SkipBody(rh);
    return IngestError::kBadEvent;
  }
  if (!ParseFinishReason(r.Payload(rh), &e->reason)) {
    return IngestError::kBadReason;
  }
  RequestSummaryInfo& q = e->summary;
  const Header h = r.Next();
  if (h.type != Type::kMap) return IngestError::kBadEvent;
  bool has_prompt = false, has_generation = false;
  uint32_t dropped = 0;
  const uint8_t* cached_at = nullptr;
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const uint8_t* at = r.pos();
    const Header v = r.Next();
    const bool count_ok =
        v.type == Type::kUint && v.value <= TM_MAX_EVENT_COUNT;
    if (key == TM_SUM_PROMPT_TOKENS || key == TM_SUM_GENERATION_TOKENS) {
      if (!count_ok) return IngestError::kBadEvent;
      if (key == TM_SUM_PROMPT_TOKENS) {
        e->count = v.value;
        has_prompt = true;
      } else {
        q.generation_tokens = uint32_t(v.value);
        has_generation = true;
      }
      continue;
    }
    if (v.type == Type::kNil) continue;  // an optional key absent
    size_t d = 0;
    while (d < kNumSummaryDurations && key != kSummaryDurationKeys[d]) ++d;
    if (d < kNumSummaryDurations) {
      if (v.type != Type::kUint || v.value > TM_MAX_DURATION_NS) {
        DropField(r, at, &dropped);
        continue;
      }
      q.duration_ns[d] = v.value;
      q.has |= uint16_t(1u << d);
      continue;
    }
    const bool cached = key == TM_SUM_CACHED_TOKENS;
    const bool max_tokens = key == TM_SUM_MAX_TOKENS;
    const bool n_param = key == TM_SUM_N;
    const bool max_gen = key == TM_SUM_MAX_GENERATION_TOKENS;
    if (!cached && !max_tokens && !n_param && !max_gen) {
      r.SkipBody(v);
      continue;
    }
    if (!count_ok) {
      DropField(r, at, &dropped);
      continue;
    }
    if (cached) {
      q.cached_tokens = uint32_t(v.value);
      q.has |= RequestSummaryInfo::kCachedTokens;
      cached_at = at;
    } else if (max_tokens) {
      e->max_tokens = v.value;
      e->has_max_tokens = true;
    } else if (n_param) {
      e->n = v.value;
      e->has_n = true;
    } else {
      q.max_generation_tokens = uint32_t(v.value);
      q.has |= RequestSummaryInfo::kMaxGenerationTokens;
    }
  }
  if (!has_prompt || !has_generation) return IngestError::kBadEvent;
  if (cached_at != nullptr && q.cached_tokens > e->count) {
    q.has &= uint16_t(~RequestSummaryInfo::kCachedTokens);
    q.cached_tokens = 0;
    ++dropped;
  }
  if (n >= 5) q.has_rid = ParseOptionalRid(r, limits, &e->rid, &dropped);
  *bad_fields += dropped;
  return IngestError::kCount;
}

// One LATENCIES array: uints of at most TM_MAX_DURATION_NS, appended to
// `positions`; false (a bad event) for anything else or when the event's
// arrays together pass TM_MAX_LATENCIES.
bool ParseLatencyList(Reader& r, std::vector<uint64_t>& positions, size_t begin,
                      uint32_t* count) {
  uint64_t n;
  if (!r.ReadArray(&n) || positions.size() - begin + n > TM_MAX_LATENCIES) {
    return false;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t v;
    if (!r.ReadUint(&v) || v > TM_MAX_DURATION_NS) return false;
    positions.push_back(v);
  }
  *count = uint32_t(n);
  return true;
}

// LATENCIES (1.3): the ttft and itl arrays (required), then an optional
// counts map whose keys are optional fields.
[[gnu::noinline]] bool ParseLatencies(Reader& r, uint64_t n,
                                      std::vector<uint64_t>& positions,
                                      LatenciesRef* l, uint32_t* bad_fields) {
  const size_t begin = positions.size();
  l->begin = uint32_t(begin);
  if (!ParseLatencyList(r, positions, begin, &l->ttft_count) ||
      !ParseLatencyList(r, positions, begin, &l->itl_count)) {
    return false;
  }
  if (n < 5) return true;
  const uint8_t* map_at = r.pos();
  const Header h = r.Next();
  if (h.type == Type::kNil) return true;
  if (h.type != Type::kMap) {
    DropField(r, map_at, bad_fields);
    return true;
  }
  for (uint64_t i = 0; i < h.value; ++i) {
    std::string_view key;
    if (!ReadEventMapKey(r, &key)) continue;
    const uint8_t* at = r.pos();
    const Header v = r.Next();
    if (v.type == Type::kNil) continue;
    uint32_t LatenciesRef::*field;
    uint8_t bit;
    if (key == TM_LAT_PROMPT_TOKENS) {
      field = &LatenciesRef::prompt_tokens;
      bit = LatenciesRef::kPromptTokens;
    } else if (key == TM_LAT_GENERATION_TOKENS) {
      field = &LatenciesRef::generation_tokens;
      bit = LatenciesRef::kGenerationTokens;
    } else if (key == TM_LAT_PREEMPTIONS) {
      field = &LatenciesRef::preemptions;
      bit = LatenciesRef::kPreemptions;
    } else {
      r.SkipBody(v);
      continue;
    }
    if (v.type != Type::kUint || v.value > TM_MAX_EVENT_COUNT) {
      DropField(r, at, bad_fields);
      continue;
    }
    l->*field = uint32_t(v.value);
    l->has |= bit;
  }
  return true;
}

// The optional fields the last event of `batch` lost (`dropped`, not 0):
// counted in bad_fields and noted in field_drops. Called once the event is
// valid: a skipped event drops no field.
[[gnu::noinline]] void NoteDrops(Batch& batch, uint32_t dropped) {
  batch.bad_fields += dropped;
  batch.field_drops.push_back({uint32_t(batch.events.size() - 1), dropped});
}

// Parses the event at r into e. Returns kCount on success (r then at the
// event's end), else the event-level error (r anywhere inside the event).
// The optional fields a valid event lost go to batch (NoteDrops()): each
// kind that has some counts them in `dropped` and notes them once valid,
// so that the kinds without (TOKENS, FINISHED, ...) pay nothing for it.
[[gnu::always_inline]] inline IngestError ParseEventBody(
    Reader& r, uint64_t n, const DecoderLimits& limits, Batch& batch,
    Event* e) {
  uint64_t used = 3;
  uint32_t dropped = 0;
  if ((e->kind < EventKind::kStep || e->kind == EventKind::kKvTransfer) &&
      !ParseRequestId(r, limits, &e->rid)) {
    return IngestError::kBadEvent;
  }
  switch (e->kind) {
    case EventKind::kArrived:
      if (!r.ReadUint(&e->count) || e->count > TM_MAX_EVENT_COUNT) {
        return IngestError::kBadEvent;
      }
      used = 4;
      if (n >= 5) {
        ParseArrivedParams(r, batch, e, &dropped);
        if (dropped != 0) [[unlikely]]
          NoteDrops(batch, dropped);
        used = 5;
      }
      break;
    case EventKind::kTokens:
      if (!r.ReadUint(&e->count) || e->count == 0 ||
          e->count > TM_MAX_EVENT_COUNT) {
        return IngestError::kBadEvent;
      }
      used = 4;
      break;
    case EventKind::kFinished: {
      const Header s = r.Next();
      if (s.type != Type::kStr) return IngestError::kBadEvent;
      if (!ParseFinishReason(r.Payload(s), &e->reason)) {
        return IngestError::kBadReason;
      }
      used = 4;
      break;
    }
    case EventKind::kStep:
      e->step = StepStats{};
      if (!ParseStats(r, limits, batch.positions, &e->step, &dropped)) {
        return IngestError::kBadEvent;
      }
      if (dropped != 0) [[unlikely]]
        NoteDrops(batch, dropped);
      break;
    case EventKind::kExpertLoad:
      if (!ParseExpertLoad(r, batch.positions, e)) {
        return IngestError::kBadEvent;
      }
      used = 4;
      break;
    case EventKind::kScheduled:
      e->scheduled = ScheduledInfo{};
      if (n >= 4) {
        ParseScheduledInfo(r, &e->scheduled, &dropped);
        if (dropped != 0) [[unlikely]]
          NoteDrops(batch, dropped);
        used = 4;
      }
      break;
    case EventKind::kKvTransfer:
      e->kv_transfer = KvTransferInfo{};
      e->kv_transfer.ok = true;
      if (!ParseKvTransfer(r, e->t_ns, &e->kv_transfer, &dropped)) {
        return IngestError::kBadEvent;
      }
      if (dropped != 0) [[unlikely]]
        NoteDrops(batch, dropped);
      used = 4;
      break;
    case EventKind::kAdmissionRejected:
      e->admission = AdmissionInfo{};
      if (!ParseAdmission(r, n, limits, e, &dropped)) {
        return IngestError::kBadEvent;
      }
      if (dropped != 0) [[unlikely]]
        NoteDrops(batch, dropped);
      used = n >= 4 ? 4 : 3;
      break;
    case EventKind::kSleep:
      e->sleep = SleepInfo{SchedulerState::kKeep, WeightsState::kKeep,
                           KvCacheState::kKeep};
      if (!ParseSleep(r, &e->sleep, &dropped)) {
        return IngestError::kBadEvent;
      }
      if (dropped != 0) [[unlikely]]
        NoteDrops(batch, dropped);
      break;
    case EventKind::kRequestSummary: {
      e->summary = RequestSummaryInfo{};
      const IngestError err = ParseRequestSummary(r, n, limits, e, &dropped);
      if (err != IngestError::kCount) return err;
      if (dropped != 0) [[unlikely]]
        NoteDrops(batch, dropped);
      used = n >= 5 ? 5 : 4;
      break;
    }
    case EventKind::kLatencies:
      e->latencies = LatenciesRef{};
      if (!ParseLatencies(r, n, batch.positions, &e->latencies, &dropped)) {
        return IngestError::kBadEvent;
      }
      if (dropped != 0) [[unlikely]]
        NoteDrops(batch, dropped);
      used = n >= 5 ? 5 : 4;
      break;
    case EventKind::kQueued:
    case EventKind::kPreempted:
      break;
  }
  if (n > used) r.Skip(n - used);  // extra trailing elements: ignored
  return IngestError::kCount;
}

// Decodes one event of a batch, appending it to batch.events when valid.
// Returns kCount, or the reason it was skipped (r then past the event).
// Inlined into the batch loop (left to itself the compiler keeps it out
// of line: 27 instructions more per event, callgrind on
// daemon_ingest_bench --receivers inproc).
[[gnu::always_inline]] inline IngestError DecodeEvent(
    Reader& r, const DecoderLimits& limits, Batch& batch) {
  const uint8_t* start = r.pos();
  IngestError err = IngestError::kBadEvent;
  uint64_t n, kind, t;
  // Not an array, a kind that is no uint, too few elements or a t that is
  // no uint: kBadEvent.
  if (r.ReadArray(&n) && n >= 1 && r.ReadUint(&kind)) {
    if (kind < TM_EV_ARRIVED || kind > TM_EV_LAST) {
      err = IngestError::kUnknownKind;
    } else if (n >= kMinEventElements[kind] && r.ReadUint(&t)) {
      const size_t positions = batch.positions.size();
      const size_t arrivals = batch.arrivals.size();
      Event& e = batch.events.emplace_back(Event::ForDecoder{});
      e.kind = static_cast<EventKind>(kind);
      e.t_ns = t;
      err = ParseEventBody(r, n, limits, batch, &e);
      if (err == IngestError::kCount) return err;
      batch.events.pop_back();
      batch.positions.resize(positions);
      batch.arrivals.resize(arrivals);
    }
  }
  r.set_pos(start);
  r.Skip(1);
  return err;
}

// Checks an element of the frame array itself as soon as its header is
// complete: the type first, then sequencing, then the BATCH events count,
// so that none of them waits for the rest of the frame.
IngestError CheckFrameElement(const Header& h, uint64_t index, bool saw_hello,
                              const DecoderLimits& limits,
                              uint64_t* frame_type) {
  if (index == 0) {
    if (h.type != Type::kUint || h.value > TM_FRAME_GOODBYE) {
      return IngestError::kBadFrame;
    }
    if (h.value == TM_FRAME_HELLO) {
      if (saw_hello) return IngestError::kSecondHello;
    } else if (!saw_hello) {
      return IngestError::kBatchBeforeHello;
    }
    *frame_type = h.value;
  } else if (index == 3 && *frame_type == TM_FRAME_BATCH &&
             h.type == Type::kArray && h.value > limits.max_batch_events) {
    return IngestError::kBatchTooLarge;
  }
  return IngestError::kCount;
}

}  // namespace

// ---------------------------------------------------------------------------
// FrameDecoder

FrameDecoder::FrameDecoder(const DecoderLimits& limits)
    : limits_(limits), stack_(std::max<uint32_t>(limits.max_depth, 1)) {
  if (limits.max_frame_bytes == 0) std::abort();  // the flags forbid it
}

FrameDecoder::~FrameDecoder() = default;

bool FrameDecoder::Fail(IngestError error) {
  failed_ = true;
  error_ = error;
  prepared_ = 0;
  return false;
}

std::span<char> FrameDecoder::Prepare(size_t hint) {
  if (failed_) return {};
  const size_t buffered = end_ - start_;
  // Commit() fails a frame that reaches the limit incomplete, so this is
  // at least 1.
  const size_t allowed = limits_.max_frame_bytes - buffered;
  const size_t want = std::min(std::max<size_t>(hint, 1), allowed);
  if (cap_ - end_ < want) {
    if (start_ > 0) {
      // Moves only the unfinished frame, and start_ stays 0 until it is
      // delivered, so every byte moves at most once.
      std::memmove(buf_.get(), buf_.get() + start_, buffered);
      scan_ -= start_;
      start_ = 0;
      end_ = buffered;
    }
    if (cap_ - end_ < want) {
      constexpr size_t kMinCapacity = 4096;
      const size_t cap = std::min(
          limits_.max_frame_bytes,
          std::max({end_ + want, cap_ * 2, std::min(kMinCapacity, allowed)}));
      auto grown = std::make_unique_for_overwrite<char[]>(cap);
      if (end_ > 0) std::memcpy(grown.get(), buf_.get(), end_);
      buf_ = std::move(grown);
      cap_ = cap;
    }
  }
  prepared_ = std::min(cap_ - end_, allowed);
  return {buf_.get() + end_, prepared_};
}

bool FrameDecoder::Commit(size_t n, FrameSink& sink) {
  if (failed_) return false;
  if (n > prepared_) std::abort();  // wrote past the prepared span
  prepared_ = 0;
  end_ += n;
  if (!Scan(sink)) return false;
  if (start_ == end_) {
    start_ = end_ = scan_ = 0;
  } else if (end_ - start_ >= limits_.max_frame_bytes) {
    // Incomplete with the limit reached: it can only grow past it.
    return Fail(IngestError::kFrameTooLarge);
  }
  return true;
}

bool FrameDecoder::Feed(const void* data, size_t n, FrameSink& sink) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const std::span<char> space = Prepare(n);
    if (space.empty()) return false;
    const size_t k = std::min(space.size(), n);
    std::memcpy(space.data(), p, k);
    if (!Commit(k, sink)) return false;
    p += k;
    n -= k;
  }
  return !failed_;
}

namespace {

// Whether a string over the string limit whose header is at `header` is
// an ARRIVED params `tracestate`: protocol 1.2 drops a tracestate over
// 256 bytes (the general string limit) as a bad_field, as W3C lets a
// vendor drop tracestate, where any other string over the limit makes the
// frame string_too_long. Such a string is the value (an even count of
// elements `left` after it) in a map at an event's params depth of a BATCH
// (frame 1, events 2, event 3, params 4), in an event whose kind (at
// `event`, its first element) is ARRIVED, right after the key
// "tracestate" (as a fixstr, or a str 8, 16 or 32, which some encoders
// write). The frame budget still bounds it; the decoder's field rule
// drops it. The scanner keeps no note of which containers are maps, so a
// string that only looks so (in params that are an array, or after a
// longer string ending in those bytes) passes too and reaches a field of
// its own bounds (params not a map are dropped whole; a key is not
// compared past its length): none reads it unchecked.
bool OverlongTracestate(const uint8_t* base, size_t frame_start, size_t event,
                        size_t header, uint32_t depth, uint64_t left,
                        uint64_t frame_type) {
  constexpr std::string_view kKey = TM_PARAM_TRACESTATE;
  static_assert(kKey.size() < 32);
  const size_t n = kKey.size();
  if (frame_type != TM_FRAME_BATCH || depth != 4 || left % 2 != 0 ||
      header < frame_start + 1 + n ||
      std::memcmp(base + header - n, kKey.data(), n) != 0) {
    return false;
  }
  // The kind, in any uint form the decoder reads (before `header`: at hand).
  Header kind{};
  if (event >= header || !ParseHeader(base + event, header - event, &kind) ||
      kind.type != Type::kUint || kind.value != TM_EV_ARRIVED) {
    return false;
  }
  // The key's header, the bytes before those: one of the four str forms.
  const uint8_t* k = base + header - n;
  const size_t room = header - n - frame_start;
  const auto form = [&](std::initializer_list<uint8_t> h) {
    return room >= h.size() && std::equal(h.begin(), h.end(), k - h.size());
  };
  const auto len = static_cast<uint8_t>(n);
  return form({static_cast<uint8_t>(0xa0 | n)}) || form({0xd9, len}) ||
         form({0xda, 0x00, len}) || form({0xdb, 0x00, 0x00, 0x00, len});
}

}  // namespace

// Walks headers from scan_ to end_, keeping per open container the count
// of elements still to come. Every limit is checked on a header as soon as
// it is complete. slack_ is max_frame_bytes less the frame's bytes so far
// and one byte per element still to come: the frame cannot fit once an
// element would take more than that.
bool FrameDecoder::Scan(FrameSink& sink) {
  const auto* base = reinterpret_cast<const uint8_t*>(buf_.get());
  uint64_t* const stack = stack_.data();
  // Locals: stores through `stack` could otherwise alias the members.
  const size_t end = end_;
  const uint64_t max_frame = limits_.max_frame_bytes;
  const uint32_t max_string = limits_.max_string_bytes;
  const uint32_t max_depth = limits_.max_depth;
  size_t pos = scan_;
  uint32_t depth = depth_;
  uint64_t slack = slack_;
  size_t event_at = event_at_;
  IngestError error = IngestError::kCount;

  for (;;) {
    if (depth == 0) {
      if (in_frame_) {
        if (pos > end) break;  // its last payload is still arriving
        scan_ = pos;
        if (!Deliver(sink)) return false;
        continue;
      }
      if (pos >= end) break;
      Header h;
      if (!ParseHeader(base + pos, end - pos, &h)) break;
      if (h.type == Type::kInvalid) {
        error = IngestError::kInvalidMsgpack;
        break;
      }
      if (saw_goodbye_ || h.type != Type::kArray || h.value == 0) {
        error = IngestError::kBadFrame;
        break;
      }
      if (h.size + h.value > max_frame) {
        error = IngestError::kFrameTooLarge;
        break;
      }
      in_frame_ = true;
      frame_elems_ = h.value;
      stack[0] = h.value;
      depth = 1;
      slack = max_frame - h.size - h.value;
      pos += h.size;
      continue;
    }
    if (pos >= end) break;
    const uint8_t b = base[pos];
    const uint8_t fixed = kFixedSize[b];
    if (fixed != 0 && depth > 1) {
      // A scalar (int, float, nil, bool): the common case, only the frame
      // budget to check.
      if (end - pos < fixed) break;
      pos += fixed;
      if (fixed - 1u > slack) {
        error = IngestError::kFrameTooLarge;
        break;
      }
      slack -= fixed - 1u;
      if (--stack[depth - 1] != 0) continue;
    } else if ((b & 0xe0) == 0xa0 && depth > 1) {  // fixstr
      const uint32_t len = b & 0x1f;
      if (len > max_string &&
          !OverlongTracestate(base, start_, start_ + event_at, pos, depth,
                              stack[depth - 1] - 1, frame_type_)) {
        error = IngestError::kStringTooLong;
        break;
      }
      pos += 1 + len;
      if (len > slack) {
        error = IngestError::kFrameTooLarge;
        break;
      }
      slack -= len;
      if (--stack[depth - 1] != 0) continue;
    } else if ((b & 0xe0) == 0x80 && depth > 1) {  // fixmap, fixarray
      if ((b & 0xf0) == 0x90 && depth < max_depth &&
          end - pos > 9u * (b & 0x0fu)) {
        // A fixarray of scalars only (a TOKENS, QUEUED or PREEMPTED event
        // with an integer id: the common case) in one go: its cost against
        // the frame budget is its children plus each scalar's bytes beyond
        // the first, i.e. all its bytes after the header. Anything else, an
        // array near the end of the bytes at hand, or a budget it would
        // exceed, takes the general path below from the array's header,
        // which then reports exactly what it would have. Away from that
        // end every child is at hand (a scalar is at most 9 bytes), so
        // only their sizes are read.
        const size_t n = b & 0x0f;
        size_t p = pos + 1;
        size_t k = 0;
        // The encodings an event uses most by a branch each, each adding
        // a constant: a predicted branch lets the next child's load start
        // before this child's byte has arrived, where a size loaded from
        // a table (or computed from the byte) made every child wait for
        // the one before it.
        for (; k < n; ++k) {
          const uint8_t c = base[p];
          if (c <= 0x7f) {  // positive fixint: a kind, a count, small ids
            p += 1;
          } else if (c == 0xcf) {  // uint 64: a timestamp
            p += 9;
          } else if (c == 0xcd) {  // uint 16
            p += 3;
          } else {
            const uint8_t f = kFixedSize[c];
            if (f == 0) break;
            p += f;
          }
        }
        if (k == n && p - pos - 1 <= slack) {
          slack -= p - pos - 1;
          pos = p;
          if (--stack[depth - 1] != 0) continue;
          while (depth > 0 && stack[depth - 1] == 0) --depth;
          continue;
        }
      }
      if (depth >= max_depth) {
        error = IngestError::kTooDeep;
        break;
      }
      const uint64_t children = (b & 0x10) != 0 ? b & 0x0f : (b & 0x0f) * 2u;
      ++pos;
      --stack[depth - 1];
      if (children > slack) {
        error = IngestError::kFrameTooLarge;
        break;
      }
      slack -= children;
      if (children > 0) {
        if (depth == 2) event_at = pos - start_;  // an event's first element
        stack[depth++] = children;
        continue;
      }
    } else {
      Header h;
      if (!ParseHeader(base + pos, end - pos, &h)) break;
      if (h.type == Type::kInvalid) {
        error = IngestError::kInvalidMsgpack;
        break;
      }
      if (depth == 1) {
        error = CheckFrameElement(h, frame_elems_ - stack[0], saw_hello_,
                                  limits_, &frame_type_);
        if (error != IngestError::kCount) break;
      }
      --stack[depth - 1];
      pos += h.size;
      uint64_t cost = h.size - 1u;  // beyond the byte counted for it
      uint64_t children = 0;
      if (HasPayload(h.type)) {
        if (h.value > max_string &&
            (h.type != Type::kStr ||
             !OverlongTracestate(base, start_, start_ + event_at, pos - h.size,
                                 depth, stack[depth - 1], frame_type_))) {
          error = IngestError::kStringTooLong;
          break;
        }
        cost += h.value;
        pos += h.value;
      } else if (h.type == Type::kArray || h.type == Type::kMap) {
        if (depth >= max_depth) {
          error = IngestError::kTooDeep;
          break;
        }
        children = Children(h);  // < 2^33: no overflow
        cost += children;
      }
      if (cost > slack) {
        error = IngestError::kFrameTooLarge;
        break;
      }
      slack -= cost;
      if (children > 0) {
        if (depth == 2) event_at = pos - start_;  // as above
        stack[depth++] = children;
        continue;
      }
    }
    while (depth > 0 && stack[depth - 1] == 0) --depth;
  }
  scan_ = pos;
  depth_ = depth;
  slack_ = slack;
  event_at_ = event_at;
  if (error != IngestError::kCount) return Fail(error);
  return true;
}

bool FrameDecoder::Deliver(FrameSink& sink) {
  const auto* base = reinterpret_cast<const uint8_t*>(buf_.get());
  const uint8_t* begin = base + start_;
  const uint8_t* end = base + scan_;
  in_frame_ = false;
  start_ = scan_;
  switch (frame_type_) {
    case TM_FRAME_HELLO:
      return DecodeHello(begin, end, sink);
    case TM_FRAME_BATCH:
      return DecodeBatch(begin, end, sink);
    default:
      saw_goodbye_ = true;
      sink.OnGoodbye();
      return true;
  }
}

bool FrameDecoder::DecodeHello(const uint8_t* begin, const uint8_t* end,
                               FrameSink& sink) {
  Reader r(begin, end);
  const Header frame = r.Next();
  r.Next();  // the frame type
  if (frame.value < 2) return Fail(IngestError::kBadHello);
  Hello hello;
  const IngestError e = ParseHelloMeta(r, limits_, &hello);
  if (e != IngestError::kCount) return Fail(e);
  saw_hello_ = true;
  sink.OnHello(hello);
  return true;
}

bool FrameDecoder::DecodeBatch(const uint8_t* begin, const uint8_t* end,
                               FrameSink& sink) {
  Reader r(begin, end);
  const Header frame = r.Next();
  r.Next();  // the frame type
  if (frame.value < 4) return Fail(IngestError::kBadFrame);
  const Header seq = r.Next();
  if (seq.type != Type::kUint) return Fail(IngestError::kBadFrame);
  const Header dropped = r.Next();
  if (dropped.type != Type::kUint) return Fail(IngestError::kBadFrame);
  const Header events = r.Next();
  if (events.type != Type::kArray) return Fail(IngestError::kBadFrame);
  if (events.value > limits_.max_batch_events) {
    return Fail(IngestError::kBatchTooLarge);
  }
  batch_.seq = seq.value;
  batch_.dropped_total = dropped.value;
  batch_.events.clear();
  batch_.positions.clear();
  batch_.arrivals.clear();
  batch_.bad_fields = 0;
  batch_.field_drops.clear();
  for (uint64_t i = 0; i < events.value; ++i) {
    const IngestError err = DecodeEvent(r, limits_, batch_);
    if (err != IngestError::kCount) sink.OnEventError(err);
  }
  sink.OnBatch(batch_);
  return true;
}

}  // namespace tokenmeter::daemon
