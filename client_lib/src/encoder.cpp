#include "encoder.h"

#include <msgpack.h>

#include <cstring>

#include "ring.h"
#include "tokenmeter/protocol.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::client {
namespace {

int WriteCallback(void* data, const char* buf, size_t len) {
  static_cast<ByteBuffer*>(data)->Append(buf, len);
  return 0;
}

class Packer {
 public:
  explicit Packer(ByteBuffer* out) {
    msgpack_packer_init(&pk_, out, WriteCallback);
  }
  void Array(uint32_t n) { msgpack_pack_array(&pk_, n); }
  void Map(uint32_t n) { msgpack_pack_map(&pk_, n); }
  void Uint(uint64_t v) { msgpack_pack_uint64(&pk_, v); }
  void Int(int64_t v) { msgpack_pack_int64(&pk_, v); }
  void Double(double v) { msgpack_pack_double(&pk_, v); }
  void Bool(bool v) {
    if (v) {
      msgpack_pack_true(&pk_);
    } else {
      msgpack_pack_false(&pk_);
    }
  }
  void Str(const char* s, size_t n) {
    msgpack_pack_str(&pk_, n);
    msgpack_pack_str_body(&pk_, s, n);
  }
  void Str(const std::string& s) { Str(s.data(), s.size()); }
  void Str(const char* s) { Str(s, std::strlen(s)); }

 private:
  msgpack_packer pk_;
};

constexpr const char* kStepKeyNames[TM_STEP_KEY_COUNT] = {
    TM_STEP_RUNNING,           TM_STEP_WAITING,
    TM_STEP_KV_USAGE,          TM_STEP_PROMPT_TOKENS,
    TM_STEP_GENERATION_TOKENS, TM_STEP_PREFIX_QUERIES,
    TM_STEP_PREFIX_HITS,       TM_STEP_SPEC_DRAFTS,
    TM_STEP_SPEC_DRAFT_TOKENS, TM_STEP_SPEC_ACCEPTED_TOKENS,
    TM_STEP_WAITING_DEFERRED,
};
static_assert(TM_STEP_KEY_COUNT == 11);

// SLEEP values by part, indexed by the record's 2-bit code (0: keep).
constexpr const char* kSchedulerNames[] = {nullptr, TM_SLEEP_RUNNING,
                                           TM_SLEEP_PAUSED};
constexpr const char* kWeightsNames[] = {
    nullptr, TM_SLEEP_RESIDENT, TM_SLEEP_OFFLOADED, TM_SLEEP_DISCARDED};
constexpr const char* kKvCacheNames[] = {nullptr, TM_SLEEP_RESIDENT,
                                         TM_SLEEP_RELEASED};

// REQUEST_SUMMARY's optional fields, in kSummary* bit order (ring.h).
constexpr const char* kSummaryFieldNames[kNumSummaryFields] = {
    TM_SUM_CACHED_TOKENS,
    TM_SUM_MAX_TOKENS,
    TM_SUM_N,
    TM_SUM_MAX_GENERATION_TOKENS,
    TM_SUM_TTFT,
    TM_SUM_QUEUE,
    TM_SUM_PREFILL,
    TM_SUM_DECODE,
    TM_SUM_INFERENCE,
    TM_SUM_E2E,
    TM_SUM_TPOT};
// LATENCIES' counts, in bit order (ring.h).
constexpr const char* kLatCountNames[kNumLatCounts] = {
    TM_LAT_PROMPT_TOKENS, TM_LAT_GENERATION_TOKENS, TM_LAT_PREEMPTIONS};
constexpr const char* kReasonNames[] = {TM_REASON_STOP, TM_REASON_LENGTH,
                                        TM_REASON_ABORT, TM_REASON_ERROR};

// Packs the request id at `p` and returns the number of words it took.
uint32_t PackRid(Packer& pk, uint32_t rid_len, const uint64_t* p) {
  if (rid_len == 0) {
    pk.Uint(*p);
    return 1;
  }
  pk.Str(reinterpret_cast<const char*>(p), rid_len);
  return (rid_len + 7) / 8;
}

// Bytes of one event built in place and appended to the buffer at once:
// the encoding msgpack-c's packer chooses (the smallest form of each uint
// and str header), without a call into the buffer per item. For the
// events with the most items per record (KV_TRANSFER).
class EventBytes {
 public:
  void Byte(uint8_t b) { buf_[n_++] = b; }
  void Raw(const void* p, size_t n) {
    std::memcpy(buf_ + n_, p, n);
    n_ += n;
  }
  void Uint(uint64_t v) {
    if (v < 128) {
      Byte(uint8_t(v));
    } else if (v < 256) {
      Byte(0xcc);
      Byte(uint8_t(v));
    } else if (v < 65536) {
      Byte(0xcd);
      Big(v, 2);
    } else if (v <= 0xffffffffu) {
      Byte(0xce);
      Big(v, 4);
    } else {
      Byte(0xcf);
      Big(v, 8);
    }
  }
  // A str of at most 255 bytes (fixstr or str8).
  void Str(const char* s, size_t n) {
    if (n < 32) {
      Byte(uint8_t(0xa0 | n));
    } else {
      Byte(0xd9);
      Byte(uint8_t(n));
    }
    Raw(s, n);
  }
  // A literal key or value of fewer than 32 bytes: fixstr.
  template <size_t N>
  void Fix(const char (&s)[N]) {
    static_assert(N - 1 < 32);
    Byte(uint8_t(0xa0 | (N - 1)));
    Raw(s, N - 1);
  }
  void AppendTo(ByteBuffer* out) const { out->Append(buf_, n_); }

 private:
  void Big(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) Byte(uint8_t(v >> (8 * i)));
  }
  // The largest KV_TRANSFER: array, kind, t, a TM_MAX_RID_BYTES str id,
  // the map of seven entries with uint64 start, bytes and blocks and the
  // longest reason and connector.
  static constexpr size_t kMax = 1 + 1 + 9 + (2 + TM_MAX_RID_BYTES) + 1 +
                                 (5 + 5) + (6 + 9) + (6 + 9) + (7 + 9) +
                                 (3 + 1) + (7 + 2 + TM_MAX_LABEL_VALUE_BYTES) +
                                 (10 + 2 + TM_MAX_LABEL_VALUE_BYTES);
  static_assert(TM_MAX_RID_BYTES <= 255 && TM_MAX_LABEL_VALUE_BYTES <= 255);
  uint8_t buf_[kMax];
  size_t n_ = 0;
};

// [10, t, rid, {role, start, bytes?, blocks?, ok?, reason?, connector?}]
// from the record's words after t (`p`).
void EncodeKvTransfer(uint32_t arg, uint32_t rid_len, uint64_t t,
                      const uint64_t* p, const ValueTable& values,
                      ByteBuffer* out) {
  // The amounts: packed in one word (kKvPacked, 0 = not given) or only
  // the given ones (kKvBytes / kKvBlocks).
  const uint32_t rid_words = rid_len == 0 ? 1 : (rid_len + 7) / 8;
  const uint64_t* a = p + rid_words + 1;
  uint64_t bytes = 0;
  uint64_t blocks = 0;
  bool has_bytes;
  bool has_blocks;
  uint32_t amount_words;
  if ((arg & kKvPacked) != 0) {
    const uint64_t bytes1 = a[0] & kKvPackedBytesMask;
    const uint64_t blocks1 = a[0] >> kKvPackedBytesBits;
    has_bytes = bytes1 != 0;
    has_blocks = blocks1 != 0;
    bytes = bytes1 - 1;
    blocks = blocks1 - 1;
    amount_words = 1;
  } else {
    has_bytes = (arg & kKvBytes) != 0;
    has_blocks = (arg & kKvBlocks) != 0;
    if (has_bytes) bytes = a[0];
    if (has_blocks) blocks = a[has_bytes];
    amount_words = uint32_t{has_bytes} + uint32_t{has_blocks};
  }
  const bool failed = (arg & kKvFailed) != 0;
  const uint32_t reason_len = KvReasonLen(arg);
  const uint32_t connector_len = KvConnectorLen(arg);
  EventBytes e;
  e.Byte(0x94);
  e.Byte(TM_EV_KV_TRANSFER);
  e.Uint(t);
  if (rid_len == 0) {
    e.Uint(p[0]);
  } else {
    e.Str(reinterpret_cast<const char*>(p), rid_len);
  }
  const uint64_t* q = p + rid_words;
  e.Byte(uint8_t(0x80 | (2 + has_bytes + has_blocks + failed +
                         (reason_len != 0) + (connector_len != 0))));
  e.Fix(TM_KV_ROLE);
  if ((arg & kKvRecv) != 0) {
    e.Fix(TM_KV_ROLE_RECV);
  } else {
    e.Fix(TM_KV_ROLE_SEND);
  }
  e.Fix(TM_KV_START);
  e.Uint(q[0]);
  q += 1 + amount_words;
  if (has_bytes) {
    e.Fix(TM_KV_BYTES);
    e.Uint(bytes);
  }
  if (has_blocks) {
    e.Fix(TM_KV_BLOCKS);
    e.Uint(blocks);
  }
  if (failed) {
    e.Fix(TM_KV_OK);
    e.Byte(0xc2);  // false
  }
  // Each string starts on a word of its own; a registered one is only its
  // id in the header.
  if (reason_len != 0) {
    e.Fix(TM_KV_REASON);
    if ((arg & kKvReasonId) != 0) {
      const std::string_view reason = values.Get(reason_len);
      e.Str(reason.data(), reason.size());
    } else {
      e.Str(reinterpret_cast<const char*>(q), reason_len);
      q += (reason_len + 7) / 8;
    }
  }
  if (connector_len != 0) {
    e.Fix(TM_KV_CONNECTOR);
    if ((arg & kKvConnectorId) != 0) {
      const std::string_view connector = values.Get(connector_len);
      e.Str(connector.data(), connector.size());
    } else {
      e.Str(reinterpret_cast<const char*>(q), connector_len);
    }
  }
  e.AppendTo(out);
}

}  // namespace

void ByteBuffer::Append(const void* data, size_t n) {
  const auto* b = static_cast<const uint8_t*>(data);
  bytes_.insert(bytes_.end(), b, b + n);
}

void EncodeHello(const HelloMeta& meta, ByteBuffer* out) {
  Packer pk(out);
  pk.Array(2);
  pk.Uint(TM_FRAME_HELLO);
  const uint32_t n = 5 + meta.ack + !meta.instance.empty() +
                     !meta.scope.empty() + !meta.labels.empty() +
                     !meta.profile.empty() + !meta.cache_config.empty() +
                     meta.max_lora.has_value();
  pk.Map(n);
  pk.Str(TM_HELLO_PROTO);
  pk.Uint(TM_PROTO_VERSION);
  pk.Str(TM_HELLO_ENGINE);
  pk.Str(meta.engine);
  pk.Str(TM_HELLO_MODEL);
  pk.Str(meta.model);
  if (!meta.instance.empty()) {
    pk.Str(TM_HELLO_INSTANCE);
    pk.Str(meta.instance);
  }
  if (!meta.scope.empty()) {
    pk.Str(TM_HELLO_SCOPE);
    pk.Str(meta.scope);
  }
  if (!meta.labels.empty()) {
    pk.Str(TM_HELLO_LABELS);
    pk.Map(static_cast<uint32_t>(meta.labels.size()));
    for (const auto& [name, value] : meta.labels) {
      pk.Str(name);
      pk.Str(value);
    }
  }
  if (!meta.profile.empty()) {
    pk.Str(TM_HELLO_PROFILE);
    pk.Str(meta.profile);
  }
  if (!meta.cache_config.empty()) {
    pk.Str(TM_HELLO_CACHE_CONFIG);
    pk.Map(static_cast<uint32_t>(meta.cache_config.size()));
    for (const auto& [key, value] : meta.cache_config) {
      pk.Str(key);
      if (const auto* s = std::get_if<std::string>(&value)) {
        pk.Str(*s);
      } else if (const auto* i = std::get_if<int64_t>(&value)) {
        pk.Int(*i);
      } else if (const auto* d = std::get_if<double>(&value)) {
        pk.Double(*d);
      } else {
        pk.Bool(std::get<bool>(value));
      }
    }
  }
  if (meta.max_lora.has_value()) {
    pk.Str(TM_HELLO_MAX_LORA);
    pk.Int(*meta.max_lora);
  }
  pk.Str(TM_HELLO_SESSION);
  pk.Uint(meta.session);
  if (meta.ack) {
    pk.Str(TM_HELLO_ACK);
    pk.Bool(true);
  }
  pk.Str(TM_HELLO_PID);
  pk.Int(meta.pid);
}

void EncodeGoodbye(ByteBuffer* out) {
  Packer pk(out);
  pk.Array(1);
  pk.Uint(TM_FRAME_GOODBYE);
}

void EncodeBatchHeader(uint64_t seq, uint64_t dropped_total, uint32_t n_events,
                       ByteBuffer* out) {
  Packer pk(out);
  pk.Array(4);
  pk.Uint(TM_FRAME_BATCH);
  pk.Uint(seq);
  pk.Uint(dropped_total);
  pk.Array(n_events);
}

void EncodeEvent(const uint64_t* record, const ValueTable& values,
                 ByteBuffer* out) {
  Packer pk(out);
  const uint64_t hdr = record[0];
  const uint8_t kind = HeaderKind(hdr);
  const uint32_t arg = HeaderArg(hdr);
  const uint32_t rid_len = HeaderRidLen(hdr);
  const uint64_t t = record[1];
  const uint64_t* p = record + 2;
  switch (kind) {
    case TM_EV_ARRIVED: {
      const uint32_t rid_words = rid_len == 0 ? 1 : (rid_len + 7) / 8;
      const uint64_t* params = p + rid_words;
      const uint32_t max_tokens = static_cast<uint32_t>(*params >> 32);
      const uint32_t n = static_cast<uint32_t>(*params);
      // The extra params (lora, labels; priority, traceparent, tracestate)
      // follow when the record is longer than tm_arrived()'s (ring.h).
      uint64_t extras = 0;
      const uint64_t* label_lengths = nullptr;
      const char* bytes = nullptr;
      if (HeaderWords(hdr) > 3 + rid_words) {
        extras = params[1];
        label_lengths = params + 2;
        bytes =
            reinterpret_cast<const char*>(label_lengths + ExtrasLabels(extras));
      }
      const uint32_t lora_len = ExtrasLoraLen(extras);
      const uint32_t n_labels = ExtrasLabels(extras);
      const uint32_t n_params = (max_tokens != 0) + (n != 0) + (lora_len != 0) +
                                (n_labels != 0) +
                                ((extras & kExtraPriority) != 0) +
                                ((extras & kExtraTraceparent) != 0) +
                                ((extras & kExtraTracestate) != 0);
      pk.Array(n_params != 0 ? 5 : 4);
      pk.Uint(kind);
      pk.Uint(t);
      PackRid(pk, rid_len, p);
      pk.Uint(arg);
      if (n_params == 0) return;
      pk.Map(n_params);
      if (max_tokens != 0) {
        pk.Str(TM_PARAM_MAX_TOKENS);
        pk.Uint(max_tokens);
      }
      if (n != 0) {
        pk.Str(TM_PARAM_N);
        pk.Uint(n);
      }
      if (lora_len != 0) {
        pk.Str(TM_PARAM_LORA);
        pk.Str(bytes, lora_len);
        bytes += lora_len;
      }
      if (n_labels != 0) {
        pk.Str(TM_PARAM_LABELS);
        pk.Map(n_labels);
        for (uint32_t i = 0; i < n_labels; ++i) {
          const auto name_len = static_cast<uint32_t>(label_lengths[i]);
          const auto value_len = static_cast<uint32_t>(label_lengths[i] >> 32);
          pk.Str(bytes, name_len);
          bytes += name_len;
          pk.Str(bytes, value_len);
          bytes += value_len;
        }
      }
      if ((extras & kExtraPriority) != 0) {
        pk.Str(TM_PARAM_PRIORITY);
        pk.Int(ExtrasPriority(extras));
      }
      if ((extras & kExtraTraceparent) != 0) {
        pk.Str(TM_PARAM_TRACEPARENT);
        pk.Str(bytes, TM_TRACEPARENT_BYTES);
        bytes += TM_TRACEPARENT_BYTES;
      }
      if ((extras & kExtraTracestate) != 0) {
        pk.Str(TM_PARAM_TRACESTATE);
        pk.Str(bytes, ExtrasTracestateLen(extras));
      }
      return;
    }
    case TM_EV_QUEUED:
    case TM_EV_PREEMPTED:
      pk.Array(3);
      pk.Uint(kind);
      pk.Uint(t);
      PackRid(pk, rid_len, p);
      return;
    case TM_EV_SCHEDULED: {
      const bool info = (arg & kScheduledInfo) != 0;
      pk.Array(info ? 4 : 3);
      pk.Uint(kind);
      pk.Uint(t);
      const uint32_t rid_words = PackRid(pk, rid_len, p);
      if (info) {
        pk.Map(2);
        pk.Str(TM_SCHED_CACHED_TOKENS);
        pk.Uint(static_cast<uint32_t>(p[rid_words]));
        pk.Str(TM_SCHED_EXTERNAL_TOKENS);
        pk.Uint(static_cast<uint32_t>(p[rid_words] >> 32));
      }
      return;
    }
    case TM_EV_TOKENS:
      pk.Array(4);
      pk.Uint(kind);
      pk.Uint(t);
      PackRid(pk, rid_len, p);
      pk.Uint(arg);
      return;
    case TM_EV_FINISHED:
      pk.Array(4);
      pk.Uint(kind);
      pk.Uint(t);
      PackRid(pk, rid_len, p);
      pk.Str(kReasonNames[arg & 3]);
      return;
    case TM_EV_STEP: {
      const uint32_t mask = arg & 0x7ff;
      const uint32_t n_pos = arg >> 16;
      pk.Array(3);
      pk.Uint(kind);
      pk.Uint(t);
      pk.Map(static_cast<uint32_t>(__builtin_popcount(mask)) + (n_pos > 0));
      for (int key = 0; key < TM_STEP_KEY_COUNT; ++key) {
        if ((mask & (1u << key)) == 0) continue;
        pk.Str(kStepKeyNames[key]);
        if (key == TM_STEP_KEY_KV_USAGE) {
          double d;
          std::memcpy(&d, p, sizeof d);
          pk.Double(d);
        } else {
          pk.Uint(*p);
        }
        ++p;
      }
      if (n_pos > 0) {
        pk.Str(TM_STEP_SPEC_ACCEPTED_PER_POS);
        pk.Array(n_pos);
        for (uint32_t i = 0; i < n_pos; ++i) pk.Uint(p[i]);
      }
      return;
    }
    case TM_EV_EXPERT_LOAD: {
      const uint32_t n = HeaderWords(hdr) - 2;
      pk.Array(4);
      pk.Uint(kind);
      pk.Uint(t);
      pk.Uint(arg);
      pk.Array(n);
      for (uint32_t i = 0; i < n; ++i) pk.Uint(p[i]);
      return;
    }
    case TM_EV_ADMISSION_REJECTED: {
      const uint32_t reason_len = arg & 0xff;
      const bool int_rid = (arg & kAdmissionIntRid) != 0;
      const bool has_rid = int_rid || rid_len != 0;
      pk.Array(has_rid ? 4 : 3);
      pk.Uint(kind);
      pk.Uint(t);
      const uint32_t rid_words = !has_rid ? 0 : int_rid ? 1 : (rid_len + 7) / 8;
      if ((arg & kAdmissionValueId) != 0) {
        const std::string_view reason = values.Get(reason_len);
        pk.Str(reason.data(), reason.size());
      } else {
        pk.Str(reinterpret_cast<const char*>(p + rid_words), reason_len);
      }
      if (has_rid) PackRid(pk, rid_len, p);
      return;
    }
    case TM_EV_KV_TRANSFER:
      EncodeKvTransfer(arg, rid_len, t, p, values, out);
      return;
    case TM_EV_SLEEP: {
      const uint32_t scheduler = arg & 3;
      const uint32_t weights = (arg >> 2) & 3;
      const uint32_t kv_cache = (arg >> 4) & 3;
      pk.Array(3);
      pk.Uint(kind);
      pk.Uint(t);
      pk.Map((scheduler != 0) + (weights != 0) + (kv_cache != 0));
      if (scheduler != 0) {
        pk.Str(TM_SLEEP_SCHEDULER);
        pk.Str(kSchedulerNames[scheduler]);
      }
      if (weights != 0) {
        pk.Str(TM_SLEEP_WEIGHTS);
        pk.Str(kWeightsNames[weights]);
      }
      if (kv_cache != 0) {
        pk.Str(TM_SLEEP_KV_CACHE);
        pk.Str(kKvCacheNames[kv_cache]);
      }
      return;
    }
    case TM_EV_REQUEST_SUMMARY: {
      const uint32_t mask = arg >> kSummaryMaskShift;
      const bool int_rid = (arg & kSummaryIntRid) != 0;
      const bool has_rid = int_rid || rid_len != 0;
      const uint32_t rid_words = !has_rid ? 0 : int_rid ? 1 : (rid_len + 7) / 8;
      pk.Array(has_rid ? 5 : 4);
      pk.Uint(kind);
      pk.Uint(t);
      pk.Str(kReasonNames[arg & 3]);
      const uint64_t* q = p + rid_words;
      pk.Map(2 + static_cast<uint32_t>(__builtin_popcount(mask)));
      pk.Str(TM_SUM_PROMPT_TOKENS);
      pk.Uint(static_cast<uint32_t>(q[0]));
      pk.Str(TM_SUM_GENERATION_TOKENS);
      pk.Uint(static_cast<uint32_t>(q[0] >> 32));
      ++q;
      for (int i = 0; i < kNumSummaryFields; ++i) {
        if ((mask & (1u << i)) == 0) continue;
        pk.Str(kSummaryFieldNames[i]);
        pk.Uint(*q++);
      }
      if (has_rid) PackRid(pk, rid_len, p);
      return;
    }
    case TM_EV_LATENCIES: {
      const uint32_t n_ttft = arg & ((1u << kLatCountsShift) - 1);
      const uint32_t counts = arg >> kLatCountsShift;
      const uint32_t n_counts =
          static_cast<uint32_t>(__builtin_popcount(counts));
      const uint32_t n_itl = HeaderWords(hdr) - 2 - n_counts - n_ttft;
      pk.Array(counts != 0 ? 5 : 4);
      pk.Uint(kind);
      pk.Uint(t);
      const uint64_t* v = p + n_counts;
      pk.Array(n_ttft);
      for (uint32_t i = 0; i < n_ttft; ++i) pk.Uint(v[i]);
      pk.Array(n_itl);
      for (uint32_t i = 0; i < n_itl; ++i) pk.Uint(v[n_ttft + i]);
      if (counts != 0) {
        pk.Map(n_counts);
        const uint64_t* c = p;
        for (int i = 0; i < kNumLatCounts; ++i) {
          if ((counts & (1u << i)) == 0) continue;
          pk.Str(kLatCountNames[i]);
          pk.Uint(*c++);
        }
      }
      return;
    }
    default:
      // Records are written only by this library's event functions.
      __builtin_trap();
  }
}

}  // namespace tokenmeter::client
