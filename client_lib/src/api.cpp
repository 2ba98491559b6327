// The C ABI: argument checks, options, and the event functions' hot path.
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "client.h"
#include "clock.h"
#include "tokenmeter/tokenmeter.h"

using tokenmeter::client::MakeHeader;
using tokenmeter::client::Ring;

namespace {

inline uint64_t Now() { return tokenmeter::client::MonotonicNowNs(); }

// A HELLO string: at most TM_MAX_STRING_BYTES bytes of UTF-8 (protocol.h
// holds the rules the daemon applies).
bool ValidString(const char* s) {
  if (s == nullptr) return false;
  const size_t n = std::strlen(s);
  return n <= TM_MAX_STRING_BYTES && tm_proto_valid_utf8(s, n) != 0;
}

bool ValidName(std::string_view s, bool allow_dash) {
  return tm_proto_valid_name(s.data(), s.size(), allow_dash ? 1 : 0) != 0;
}

// A HELLO cache_config entry: the key follows the HELLO label rules, is
// new and no HELLO label's name (the daemon refuses a HELLO whose label
// and cache_config key would both label <ns>:cache_config_info), and there
// is room for it.
int AddCacheConfig(tm_options* opts, const char* key,
                   tokenmeter::client::CacheConfigValue value) {
  if (opts == nullptr || key == nullptr) return TM_E_INVALID;
  const std::string_view k(key);
  if (!tm_proto_valid_label(key, k.size(), "", 0)) return TM_E_INVALID;
  auto& entries = opts->meta.cache_config;
  if (entries.size() >= TM_MAX_CACHE_CONFIG) return TM_E_INVALID;
  for (const auto& [existing, v] : entries) {
    if (existing == k) return TM_E_INVALID;
  }
  for (const auto& [label, v] : opts->meta.labels) {
    if (label == k) return TM_E_INVALID;
  }
  entries.emplace_back(std::string(k), std::move(value));
  return TM_OK;
}

// ---- hot path ---------------------------------------------------------------

inline uint32_t RidWords(size_t len) { return uint32_t((len + 7) / 8); }

// Every event call: Enter() (the client is open and this thread has a
// ring, marked "in a call"), reserve, write, commit, Leave().
inline int Full(Ring* r) {
  r->CountDrop();
  tm_client::Leave(r);
  return TM_E_DROPPED;
}

inline int Done(Ring* r) {
  r->Commit();
  tm_client::Leave(r);
  return TM_OK;
}

// Events whose layout is hdr, t, rid, and one word more when `extra` is
// not nullptr (inlined: the nullptr of the plain events folds away).
[[gnu::always_inline]] inline int EmitInt(tm_client* c, uint8_t kind,
                                          uint64_t t, uint64_t rid,
                                          uint32_t arg,
                                          const uint64_t* extra = nullptr) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t words = extra != nullptr ? 4 : 3;
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(kind, words, 0, arg);
  w[1] = t != 0 ? t : Now();
  w[2] = rid;
  if (extra != nullptr) w[3] = *extra;
  return Done(r);
}

[[gnu::always_inline]] inline int EmitStr(tm_client* c, uint8_t kind,
                                          uint64_t t, const char* rid,
                                          size_t len, uint32_t arg,
                                          const uint64_t* extra = nullptr) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (rid == nullptr || len == 0 || len > TM_MAX_RID_BYTES) [[unlikely]] {
    c->CountRejected();
    return TM_E_INVALID;
  }
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t rw = RidWords(len);
  const uint32_t words = 2 + rw + (extra != nullptr ? 1 : 0);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(kind, words, uint32_t(len), arg);
  w[1] = t != 0 ? t : Now();
  w[1 + rw] = 0;
  std::memcpy(w + 2, rid, len);
  if (extra != nullptr) w[2 + rw] = *extra;
  return Done(r);
}

// The int a C caller stored in an enum object, read without loading the
// enum: a value outside the enum is what the checks are for, and loading it
// as the enum type is undefined in C++ (UBSan's -fsanitize=enum).
template <typename Enum>
inline int EnumValue(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

inline uint64_t Params(uint32_t max_tokens, uint32_t n) {
  return (uint64_t{max_tokens} << 32) | n;
}

}  // namespace

extern "C" {

const char* tm_strerror(int status) {
  switch (status) {
    case TM_OK:
      return "ok";
    case TM_E_INVALID:
      return "invalid argument";
    case TM_E_DROPPED:
      return "event dropped: buffer full or no thread slot";
    case TM_E_NOMEM:
      return "out of memory";
    case TM_E_TIMEOUT:
      return "timed out";
    case TM_E_DISCONNECTED:
      return "daemon not connected";
    case TM_E_SYSTEM:
      return "system call failed";
    case TM_E_CLOSED:
      return "client closed: the call did nothing (counted as rejected)";
    case TM_E_FORKED:
      return "client inherited through fork(): inert in this process";
    default:
      return "unknown status";
  }
}

const char* tm_version(void) { return TOKENMETER_VERSION; }

uint64_t tm_now_ns(void) { return Now(); }

// ---- options ----------------------------------------------------------------

tm_options* tm_options_new(void) { return new (std::nothrow) tm_options(); }

void tm_options_free(tm_options* opts) { delete opts; }

int tm_options_set_socket_path(tm_options* opts, const char* path) {
  if (opts == nullptr || path == nullptr) return TM_E_INVALID;
  const size_t n = std::strlen(path);
  if (n == 0 || n >= sizeof(sockaddr_un::sun_path)) return TM_E_INVALID;
  opts->socket_path = path;
  return TM_OK;
}

int tm_options_set_engine(tm_options* opts, const char* engine) {
  if (opts == nullptr || !ValidString(engine) || !ValidName(engine, true)) {
    return TM_E_INVALID;
  }
  opts->meta.engine = engine;
  return TM_OK;
}

int tm_options_set_model(tm_options* opts, const char* model) {
  if (opts == nullptr || !ValidString(model) || model[0] == '\0') {
    return TM_E_INVALID;
  }
  opts->meta.model = model;
  return TM_OK;
}

int tm_options_set_instance(tm_options* opts, const char* instance) {
  if (opts == nullptr || !ValidString(instance)) return TM_E_INVALID;
  opts->meta.instance = instance;
  return TM_OK;
}

int tm_options_set_scope(tm_options* opts, const char* scope) {
  if (opts == nullptr || !ValidString(scope)) return TM_E_INVALID;
  opts->meta.scope = scope;
  return TM_OK;
}

int tm_options_add_label(tm_options* opts, const char* name,
                         const char* value) {
  if (opts == nullptr || !ValidString(name) || !ValidString(value)) {
    return TM_E_INVALID;
  }
  const std::string_view n(name);
  if (!tm_proto_valid_label(name, n.size(), value, std::strlen(value))) {
    return TM_E_INVALID;
  }
  if (opts->meta.labels.size() >= TM_MAX_HELLO_LABELS) return TM_E_INVALID;
  for (const auto& [existing, v] : opts->meta.labels) {
    if (existing == n) return TM_E_INVALID;
  }
  for (const auto& [key, v] : opts->meta.cache_config) {
    if (key == n) return TM_E_INVALID;
  }
  opts->meta.labels.emplace_back(name, value);
  return TM_OK;
}

int tm_options_set_profile(tm_options* opts, const char* profile) {
  if (opts == nullptr || profile == nullptr) return TM_E_INVALID;
  const std::string_view p(profile);
  if (p != TM_PROFILE_VLLM && p != TM_PROFILE_SGLANG &&
      p != TM_PROFILE_LMDEPLOY) {
    return TM_E_INVALID;
  }
  opts->meta.profile = p;
  return TM_OK;
}

int tm_options_add_cache_config_str(tm_options* opts, const char* key,
                                    const char* value) {
  if (!ValidString(value)) return TM_E_INVALID;
  return AddCacheConfig(opts, key, std::string(value));
}

int tm_options_add_cache_config_int(tm_options* opts, const char* key,
                                    int64_t value) {
  return AddCacheConfig(opts, key, value);
}

int tm_options_add_cache_config_float(tm_options* opts, const char* key,
                                      double value) {
  if (!std::isfinite(value)) return TM_E_INVALID;
  return AddCacheConfig(opts, key, value);
}

int tm_options_add_cache_config_bool(tm_options* opts, const char* key,
                                     int value) {
  return AddCacheConfig(opts, key, value != 0);
}

int tm_options_set_max_lora(tm_options* opts, int64_t max_lora) {
  if (opts == nullptr || max_lora < 0) return TM_E_INVALID;
  opts->meta.max_lora = max_lora;
  return TM_OK;
}

int tm_options_set_buffer_capacity(tm_options* opts, size_t events) {
  if (opts == nullptr || events < 1024 || events > (size_t{16} << 20)) {
    return TM_E_INVALID;
  }
  opts->buffer_capacity = events;
  return TM_OK;
}

int tm_options_set_flush_interval_ms(tm_options* opts, uint32_t ms) {
  if (opts == nullptr || ms < 1 || ms > 10000) return TM_E_INVALID;
  opts->flush_interval_ms = ms;
  return TM_OK;
}

int tm_options_set_close_timeout_ms(tm_options* opts, uint32_t ms) {
  if (opts == nullptr || ms > 600000) return TM_E_INVALID;
  opts->close_timeout_ms = ms;
  return TM_OK;
}

int tm_options_set_max_threads(tm_options* opts, uint32_t n) {
  if (opts == nullptr || n < 1 || n > 4096) return TM_E_INVALID;
  opts->max_threads = n;
  return TM_OK;
}

int tm_options_set_ack(tm_options* opts, int on) {
  if (opts == nullptr) return TM_E_INVALID;
  opts->ack = on != 0;
  return TM_OK;
}

int tm_options_set_replay_bytes(tm_options* opts, size_t bytes) {
  if (opts == nullptr || bytes < TM_MIN_REPLAY_BYTES ||
      bytes > TM_MAX_REPLAY_BYTES) {
    return TM_E_INVALID;
  }
  opts->replay_bytes = bytes;
  return TM_OK;
}

// ---- client -----------------------------------------------------------------

int tm_client_new(const tm_options* opts, tm_client** out) {
  if (opts == nullptr || out == nullptr || opts->meta.model.empty()) {
    return TM_E_INVALID;
  }
  *out = nullptr;
  try {
    // HELLO's informational pid: this process, not the options' zero.
    tm_options with_pid = *opts;
    with_pid.meta.pid = getpid();
    return tm_client::New(with_pid, out);
  } catch (...) {
    return TM_E_NOMEM;
  }
}

int tm_client_close(tm_client* client, uint64_t* stats_out, size_t n_stats) {
  if (client == nullptr) return TM_OK;
  // The handle is not freed: it stays as a tombstone (client.h).
  return client->Close(stats_out, n_stats);
}

int tm_client_flush(tm_client* client, uint32_t timeout_ms) {
  if (client == nullptr) return TM_E_INVALID;
  return client->Flush(timeout_ms);
}

int tm_thread_attach(tm_client* client) {
  if (client == nullptr) return TM_E_INVALID;
  return client->Attach();
}

int tm_client_stats(const tm_client* client, uint64_t* out, size_t n) {
  if (client == nullptr) return TM_E_INVALID;
  return client->Stats(out, n);
}

// ---- events -----------------------------------------------------------------

namespace {

// tm_arrived_ex()'s lora and labels and tm_arrived_params()'s priority and
// trace strings, checked, with their lengths and the words they take in the
// record (ring.h).
struct ArrivedExtras {
  const char* lora = nullptr;
  const tm_label* labels = nullptr;
  const char* traceparent = nullptr;
  const char* tracestate = nullptr;
  uint32_t lora_len = 0;
  uint32_t n_labels = 0;
  uint32_t tracestate_len = 0;
  uint64_t flags = 0;  // kExtra*: what of the 1.2 params is given
  int32_t priority = 0;
  uint32_t name_len[TM_MAX_REQUEST_LABELS] = {};
  uint32_t value_len[TM_MAX_REQUEST_LABELS] = {};
  uint32_t bytes = 0;    // of all the strings, back to back
  uint32_t words = 0;    // 0: nothing given; the record is tm_arrived()'s
  uint32_t dropped = 0;  // trace strings not sent (TM_STAT_FIELDS_DROPPED)
};

inline void CountWords(ArrivedExtras* x) {
  if (x->lora != nullptr || x->n_labels != 0 || x->flags != 0) {
    x->words = 1 + x->n_labels + (x->bytes + 7) / 8;
  }
}

// True when the 1.1 params follow tokenmeter.h's rules; fills *x. Bounded
// work: every strnlen stops one byte past its limit.
bool CheckExtras(const char* lora, const tm_label* labels, size_t n_labels,
                 ArrivedExtras* x) {
  if (n_labels > TM_MAX_REQUEST_LABELS || (labels == nullptr && n_labels != 0))
    return false;
  size_t bytes = 0;
  if (lora != nullptr) {
    const size_t len = strnlen(lora, TM_MAX_LORA_BYTES + 1);
    if (len == 0 || len > TM_MAX_LORA_BYTES ||
        tm_proto_valid_utf8(lora, len) == 0) {
      return false;
    }
    x->lora_len = uint32_t(len);
    bytes += len;
  }
  for (size_t i = 0; i < n_labels; ++i) {
    const char* name = labels[i].name;
    const char* value = labels[i].value;
    if (name == nullptr || value == nullptr) return false;
    const size_t nl = strnlen(name, TM_MAX_STRING_BYTES + 1);
    const size_t vl = strnlen(value, TM_MAX_REQUEST_LABEL_VALUE_BYTES + 1);
    if (vl > TM_MAX_REQUEST_LABEL_VALUE_BYTES ||
        tm_proto_valid_label(name, nl, value, vl) == 0) {
      return false;
    }
    for (size_t j = 0; j < i; ++j) {
      if (x->name_len[j] == nl && std::memcmp(labels[j].name, name, nl) == 0)
        return false;
    }
    x->name_len[i] = uint32_t(nl);
    x->value_len[i] = uint32_t(vl);
    bytes += nl + vl;
  }
  x->lora = lora;
  x->labels = labels;
  x->n_labels = uint32_t(n_labels);
  x->bytes = uint32_t(bytes);
  CountWords(x);
  return true;
}

// The size of tm_request_params as protocol 1.2 laid it out: a caller's
// `size` must cover it. A later header appends fields; this library reads
// none past it.
constexpr size_t kRequestParamsSize =
    offsetof(tm_request_params, tracestate) + sizeof(const char*);

// True when `p` follows tm_arrived_params()'s rules; fills *x. The trace
// strings are checked by protocol.h, as the daemon checks them, and one
// that breaks its rule is left out (x->dropped), not a refusal: they come
// from the caller's HTTP headers, and W3C has a receiver ignore a
// malformed context (and the tracestate of a malformed traceparent).
bool CheckParams(const tm_request_params* p, ArrivedExtras* x) {
  if (p == nullptr || p->size < kRequestParamsSize ||
      !CheckExtras(p->lora, p->labels, p->n_labels, x)) {
    return false;
  }
  if (p->has_priority != 0) {
    x->flags |= tokenmeter::client::kExtraPriority;
    x->priority = p->priority;
  }
  bool context_ok = true;
  if (p->traceparent != nullptr) {
    const size_t len = strnlen(p->traceparent, TM_TRACEPARENT_BYTES + 1);
    if (tm_proto_valid_traceparent(p->traceparent, len) != 0) {
      x->flags |= tokenmeter::client::kExtraTraceparent;
      x->traceparent = p->traceparent;
      x->bytes += TM_TRACEPARENT_BYTES;
    } else {
      context_ok = false;
      ++x->dropped;
    }
  }
  if (p->tracestate != nullptr) {
    const size_t len = strnlen(p->tracestate, TM_MAX_TRACESTATE_BYTES + 1);
    if (context_ok && tm_proto_valid_tracestate(p->tracestate, len) != 0) {
      x->flags |= tokenmeter::client::kExtraTracestate;
      x->tracestate = p->tracestate;
      x->tracestate_len = uint32_t(len);
      x->bytes += uint32_t(len);
    } else {
      ++x->dropped;
    }
  }
  CountWords(x);
  return true;
}

// Writes the x.words words of the extra params at w.
inline void WriteExtras(uint64_t* w, const ArrivedExtras& x) {
  // The padding after the bytes first: with no bytes, the last word is a
  // lengths word, written below.
  w[x.words - 1] = 0;
  w[0] = tokenmeter::client::ArrivedExtrasWord(
      x.lora_len, x.n_labels, x.tracestate_len, x.flags, x.priority);
  for (uint32_t i = 0; i < x.n_labels; ++i) {
    w[1 + i] = tokenmeter::client::PackLengths(x.name_len[i], x.value_len[i]);
  }
  char* p = reinterpret_cast<char*>(w + 1 + x.n_labels);
  if (x.lora != nullptr) {
    std::memcpy(p, x.lora, x.lora_len);
    p += x.lora_len;
  }
  for (uint32_t i = 0; i < x.n_labels; ++i) {
    std::memcpy(p, x.labels[i].name, x.name_len[i]);
    p += x.name_len[i];
    std::memcpy(p, x.labels[i].value, x.value_len[i]);
    p += x.value_len[i];
  }
  if (x.traceparent != nullptr) {
    std::memcpy(p, x.traceparent, TM_TRACEPARENT_BYTES);
    p += TM_TRACEPARENT_BYTES;
  }
  if (x.tracestate != nullptr) std::memcpy(p, x.tracestate, x.tracestate_len);
}

// `x`: the checked extra params, or nullptr for tm_arrived()'s record.
inline int ArrivedInt(tm_client* c, uint64_t t_ns, uint64_t rid,
                      uint32_t prompt_tokens, uint32_t max_tokens, uint32_t n,
                      const ArrivedExtras* x = nullptr) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t words = 4 + (x != nullptr ? x->words : 0);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(TM_EV_ARRIVED, words, 0, prompt_tokens);
  w[1] = t_ns != 0 ? t_ns : Now();
  w[2] = rid;
  w[3] = Params(max_tokens, n);
  if (x != nullptr) WriteExtras(w + 4, *x);
  return Done(r);
}

// Inlined into every entry point, so that the nullptr of tm_arrived_str()
// folds away (an outlined copy would take `x` on the stack).
[[gnu::always_inline]] inline int ArrivedStr(tm_client* c, uint64_t t_ns,
                                             const char* rid, size_t rid_len,
                                             uint32_t prompt_tokens,
                                             uint32_t max_tokens, uint32_t n,
                                             const ArrivedExtras* x = nullptr) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (rid == nullptr || rid_len == 0 || rid_len > TM_MAX_RID_BYTES)
      [[unlikely]] {
    c->CountRejected();
    return TM_E_INVALID;
  }
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t rw = RidWords(rid_len);
  const uint32_t words = 3 + rw + (x != nullptr ? x->words : 0);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(TM_EV_ARRIVED, words, uint32_t(rid_len), prompt_tokens);
  w[1] = t_ns != 0 ? t_ns : Now();
  w[1 + rw] = 0;
  std::memcpy(w + 2, rid, rid_len);
  w[2 + rw] = Params(max_tokens, n);
  if (x != nullptr) WriteExtras(w + 3 + rw, *x);
  return Done(r);
}

}  // namespace

int tm_arrived(tm_client* c, uint64_t t_ns, uint64_t rid,
               uint32_t prompt_tokens, uint32_t max_tokens, uint32_t n) {
  return ArrivedInt(c, t_ns, rid, prompt_tokens, max_tokens, n);
}

int tm_arrived_str(tm_client* c, uint64_t t_ns, const char* rid, size_t rid_len,
                   uint32_t prompt_tokens, uint32_t max_tokens, uint32_t n) {
  return ArrivedStr(c, t_ns, rid, rid_len, prompt_tokens, max_tokens, n);
}

int tm_arrived_ex(tm_client* c, uint64_t t_ns, uint64_t rid,
                  uint32_t prompt_tokens, uint32_t max_tokens, uint32_t n,
                  const char* lora, const tm_label* labels, size_t n_labels) {
  if (c == nullptr) return TM_E_INVALID;
  ArrivedExtras x;
  if (!CheckExtras(lora, labels, n_labels, &x)) {
    c->CountRejected();
    return TM_E_INVALID;
  }
  return ArrivedInt(c, t_ns, rid, prompt_tokens, max_tokens, n,
                    x.words != 0 ? &x : nullptr);
}

int tm_arrived_ex_str(tm_client* c, uint64_t t_ns, const char* rid,
                      size_t rid_len, uint32_t prompt_tokens,
                      uint32_t max_tokens, uint32_t n, const char* lora,
                      const tm_label* labels, size_t n_labels) {
  if (c == nullptr) return TM_E_INVALID;
  ArrivedExtras x;
  if (!CheckExtras(lora, labels, n_labels, &x)) {
    c->CountRejected();
    return TM_E_INVALID;
  }
  return ArrivedStr(c, t_ns, rid, rid_len, prompt_tokens, max_tokens, n,
                    x.words != 0 ? &x : nullptr);
}

int tm_arrived_params(tm_client* c, uint64_t t_ns, uint64_t rid,
                      uint32_t prompt_tokens, const tm_request_params* p) {
  if (c == nullptr) return TM_E_INVALID;
  ArrivedExtras x;
  if (!CheckParams(p, &x)) {
    c->CountRejected();
    return TM_E_INVALID;
  }
  const int rc = ArrivedInt(c, t_ns, rid, prompt_tokens, p->max_tokens, p->n,
                            x.words != 0 ? &x : nullptr);
  // Counted for an event appended only: one refused or dropped is counted
  // as that alone.
  if (rc == TM_OK && x.dropped != 0) c->CountFieldsDropped(x.dropped);
  return rc;
}

int tm_arrived_params_str(tm_client* c, uint64_t t_ns, const char* rid,
                          size_t rid_len, uint32_t prompt_tokens,
                          const tm_request_params* p) {
  if (c == nullptr) return TM_E_INVALID;
  ArrivedExtras x;
  if (!CheckParams(p, &x)) {
    c->CountRejected();
    return TM_E_INVALID;
  }
  const int rc = ArrivedStr(c, t_ns, rid, rid_len, prompt_tokens, p->max_tokens,
                            p->n, x.words != 0 ? &x : nullptr);
  if (rc == TM_OK && x.dropped != 0) c->CountFieldsDropped(x.dropped);
  return rc;
}

int tm_arrived_packed(tm_client* c, uint64_t rid, uint64_t tokens) {
  return ArrivedInt(c, 0, rid, uint32_t(tokens), uint32_t(tokens >> 32), 0);
}

int tm_arrived_packed_str(tm_client* c, const char* rid, size_t rid_len,
                          uint64_t tokens) {
  return ArrivedStr(c, 0, rid, rid_len, uint32_t(tokens),
                    uint32_t(tokens >> 32), 0);
}

int tm_queued(tm_client* c, uint64_t t_ns, uint64_t rid) {
  return EmitInt(c, TM_EV_QUEUED, t_ns, rid, 0);
}
int tm_queued_str(tm_client* c, uint64_t t_ns, const char* rid,
                  size_t rid_len) {
  return EmitStr(c, TM_EV_QUEUED, t_ns, rid, rid_len, 0);
}

int tm_scheduled(tm_client* c, uint64_t t_ns, uint64_t rid) {
  return EmitInt(c, TM_EV_SCHEDULED, t_ns, rid, 0);
}
int tm_scheduled_str(tm_client* c, uint64_t t_ns, const char* rid,
                     size_t rid_len) {
  return EmitStr(c, TM_EV_SCHEDULED, t_ns, rid, rid_len, 0);
}

int tm_scheduled_ex(tm_client* c, uint64_t t_ns, uint64_t rid,
                    uint32_t cached_tokens, uint32_t external_tokens) {
  const uint64_t info =
      tokenmeter::client::PackLengths(cached_tokens, external_tokens);
  return EmitInt(c, TM_EV_SCHEDULED, t_ns, rid,
                 tokenmeter::client::kScheduledInfo, &info);
}
int tm_scheduled_ex_str(tm_client* c, uint64_t t_ns, const char* rid,
                        size_t rid_len, uint32_t cached_tokens,
                        uint32_t external_tokens) {
  const uint64_t info =
      tokenmeter::client::PackLengths(cached_tokens, external_tokens);
  return EmitStr(c, TM_EV_SCHEDULED, t_ns, rid, rid_len,
                 tokenmeter::client::kScheduledInfo, &info);
}

int tm_tokens(tm_client* c, uint64_t t_ns, uint64_t rid, uint32_t n) {
  if (n == 0) [[unlikely]] {
    if (c != nullptr) c->CountRejected();
    return TM_E_INVALID;
  }
  return EmitInt(c, TM_EV_TOKENS, t_ns, rid, n);
}
int tm_tokens_str(tm_client* c, uint64_t t_ns, const char* rid, size_t rid_len,
                  uint32_t n) {
  if (n == 0) [[unlikely]] {
    if (c != nullptr) c->CountRejected();
    return TM_E_INVALID;
  }
  return EmitStr(c, TM_EV_TOKENS, t_ns, rid, rid_len, n);
}

// ---- step batches -----------------------------------------------------------

// The first entry of a batch that carries an event (n NULL: 1 token each).
static size_t FirstEvent(const uint32_t* n, size_t count) {
  size_t i = 0;
  if (n != nullptr) {
    while (i < count && n[i] == 0) ++i;
  }
  return i;
}

// Enters `c` for a batch with an event at `first`. When it cannot, every
// event of the batch is counted (rejected on a closed or inherited client,
// dropped when the thread gets no slot) and the code returned.
static int BatchEnter(tm_client* c, const uint32_t* n, size_t first,
                      size_t count, Ring** r) {
  const int rc = c->Enter(r, 0);
  if (rc != TM_OK) [[unlikely]] {
    uint64_t events = 0;
    for (size_t i = first; i < count; ++i) {
      events += n == nullptr || n[i] != 0;
    }
    if (rc == TM_E_DROPPED) {
      c->CountDropped(events);
    } else {
      c->CountRejected(events);
    }
  }
  return rc;
}

int tm_tokens_batch(tm_client* c, uint64_t t_ns, const uint64_t* rids,
                    const uint32_t* n, size_t count) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if ((rids == nullptr && count != 0) || count > TM_MAX_BATCH_EVENTS)
      [[unlikely]] {
    c->CountRejected(count);
    return TM_E_INVALID;
  }
  const size_t first = FirstEvent(n, count);
  if (first == count) return 0;  // no event: no thread attached, no drop
  Ring* r;
  const int rc = BatchEnter(c, n, first, count, &r);
  if (rc != TM_OK) [[unlikely]]
    return rc == TM_E_DROPPED ? 0 : rc;
  const uint64_t t = t_ns != 0 ? t_ns : Now();
  int appended = 0;
  for (size_t i = first; i < count; ++i) {
    const uint32_t k = n != nullptr ? n[i] : 1;
    if (k == 0) continue;
    uint64_t* w = r->Reserve(3);
    if (w == nullptr) [[unlikely]] {
      r->CountDrop();
      continue;
    }
    w[0] = MakeHeader(TM_EV_TOKENS, 3, 0, k);
    w[1] = t;
    w[2] = rids[i];
    r->Commit();
    ++appended;
  }
  tm_client::Leave(r);
  return appended;
}

int tm_tokens_batch_str(tm_client* c, uint64_t t_ns, const char* ids,
                        size_t ids_len, const uint32_t* n, size_t count) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  // Every id is checked before any is appended: a malformed batch is
  // rejected whole, never half sent.
  bool ok = count <= TM_MAX_BATCH_EVENTS && (ids != nullptr || count == 0);
  const char* const end = ok && ids != nullptr ? ids + ids_len : ids;
  const char* p = ids;
  for (size_t i = 0; ok && i < count; ++i) {
    const void* nul = std::memchr(p, 0, size_t(end - p));
    const size_t len =
        nul != nullptr ? size_t(static_cast<const char*>(nul) - p) : 0;
    ok = len >= 1 && len <= TM_MAX_RID_BYTES;
    p += len + 1;
  }
  if (!ok || p != end) [[unlikely]] {
    c->CountRejected(count);
    return TM_E_INVALID;
  }
  const size_t first = FirstEvent(n, count);
  if (first == count) return 0;
  Ring* r;
  const int rc = BatchEnter(c, n, first, count, &r);
  if (rc != TM_OK) [[unlikely]]
    return rc == TM_E_DROPPED ? 0 : rc;
  const uint64_t t = t_ns != 0 ? t_ns : Now();
  int appended = 0;
  const char* id = ids;
  for (size_t i = 0; i < count; ++i) {
    const size_t len = std::strlen(id);  // checked above: 1 .. 128
    const char* rid = id;
    id += len + 1;
    const uint32_t k = n != nullptr ? n[i] : 1;
    if (k == 0) continue;
    const uint32_t words = 2 + RidWords(len);
    uint64_t* w = r->Reserve(words);
    if (w == nullptr) [[unlikely]] {
      r->CountDrop();
      continue;
    }
    w[0] = MakeHeader(TM_EV_TOKENS, words, uint32_t(len), k);
    w[1] = t;
    w[words - 1] = 0;
    std::memcpy(w + 2, rid, len);
    r->Commit();
    ++appended;
  }
  tm_client::Leave(r);
  return appended;
}

static bool ValidReason(tm_finish_reason reason) {
  const int r = static_cast<int>(reason);
  return r >= TM_FINISH_STOP && r <= TM_FINISH_ERROR;
}

int tm_finished(tm_client* c, uint64_t t_ns, uint64_t rid,
                tm_finish_reason reason) {
  if (!ValidReason(reason)) [[unlikely]] {
    if (c != nullptr) c->CountRejected();
    return TM_E_INVALID;
  }
  return EmitInt(c, TM_EV_FINISHED, t_ns, rid, uint32_t(reason));
}
int tm_finished_str(tm_client* c, uint64_t t_ns, const char* rid,
                    size_t rid_len, tm_finish_reason reason) {
  if (!ValidReason(reason)) [[unlikely]] {
    if (c != nullptr) c->CountRejected();
    return TM_E_INVALID;
  }
  return EmitStr(c, TM_EV_FINISHED, t_ns, rid, rid_len, uint32_t(reason));
}

int tm_preempted(tm_client* c, uint64_t t_ns, uint64_t rid) {
  return EmitInt(c, TM_EV_PREEMPTED, t_ns, rid, 0);
}
int tm_preempted_str(tm_client* c, uint64_t t_ns, const char* rid,
                     size_t rid_len) {
  return EmitStr(c, TM_EV_PREEMPTED, t_ns, rid, rid_len, 0);
}

int tm_step(tm_client* c, uint64_t t_ns, const tm_step_key* keys,
            const double* values, size_t n_keys,
            const uint64_t* accepted_per_pos, size_t n_pos) {
  if (c == nullptr) return TM_E_INVALID;
  uint64_t slot_values[TM_STEP_KEY_COUNT];
  uint32_t mask = 0;
  bool ok = n_keys <= TM_STEP_KEY_COUNT && n_pos <= TM_MAX_SPEC_POSITIONS &&
            (n_keys == 0 || (keys != nullptr && values != nullptr)) &&
            (n_pos == 0 || accepted_per_pos != nullptr);
  for (size_t i = 0; ok && i < n_keys; ++i) {
    const int key = EnumValue(keys[i]);
    const double v = values[i];
    if (key < 0 || key >= TM_STEP_KEY_COUNT || (mask & (1u << key)) != 0) {
      ok = false;
      break;
    }
    mask |= 1u << key;
    if (key == TM_STEP_KEY_KV_USAGE) {
      if (!(v >= 0.0 && v <= 1.0)) ok = false;
      std::memcpy(&slot_values[key], &v, sizeof v);
    } else {
      if (!(v >= 0.0 && v <= double(TM_MAX_EVENT_COUNT)) ||
          v != std::floor(v)) {
        ok = false;
      }
      slot_values[key] = static_cast<uint64_t>(v);
    }
  }
  for (size_t i = 0; ok && i < n_pos; ++i) {
    if (accepted_per_pos[i] > TM_MAX_EVENT_COUNT) ok = false;
  }
  // waiting_deferred counts some of `waiting`: the daemon drops the key
  // without waiting or above it (bad_field) and applies the rest; the
  // client refuses the call, as for any other STEP key out of range
  // (tokenmeter.h), so that nothing it sends is dropped.
  constexpr uint32_t kWaiting = 1u << TM_STEP_KEY_WAITING;
  constexpr uint32_t kDeferred = 1u << TM_STEP_KEY_WAITING_DEFERRED;
  if (ok && (mask & kDeferred) != 0) {
    ok = (mask & kWaiting) != 0 && slot_values[TM_STEP_KEY_WAITING_DEFERRED] <=
                                       slot_values[TM_STEP_KEY_WAITING];
  }
  if (!ok) {
    c->CountRejected();
    return TM_E_INVALID;
  }
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) return rc;
  const uint32_t words =
      2 + uint32_t(__builtin_popcount(mask)) + uint32_t(n_pos);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) return Full(r);
  w[0] = MakeHeader(TM_EV_STEP, words, 0, mask | (uint32_t(n_pos) << 16));
  w[1] = t_ns != 0 ? t_ns : Now();
  uint64_t* p = w + 2;
  for (int key = 0; key < TM_STEP_KEY_COUNT; ++key) {
    if (mask & (1u << key)) *p++ = slot_values[key];
  }
  for (size_t i = 0; i < n_pos; ++i) *p++ = accepted_per_pos[i];
  return Done(r);
}

int tm_expert_load(tm_client* c, uint64_t t_ns, uint32_t layer,
                   const uint64_t* counts, size_t n) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  bool ok = layer < TM_MAX_MOE_LAYERS && n >= 1 && n <= TM_MAX_MOE_EXPERTS &&
            counts != nullptr;
  if (ok) [[likely]] {
    // One pass, no branch per count: a count above TM_MAX_EVENT_COUNT
    // (2^32 - 1) is one with a high bit set.
    uint64_t high = 0;
    for (size_t i = 0; i < n; ++i) high |= counts[i];
    static_assert(TM_MAX_EVENT_COUNT == 0xffffffffull);
    ok = (high >> 32) == 0;
  }
  if (!ok) [[unlikely]] {
    c->CountRejected();
    return TM_E_INVALID;
  }
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t words = 2 + uint32_t(n);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(TM_EV_EXPERT_LOAD, words, 0, layer);
  w[1] = t_ns != 0 ? t_ns : Now();
  std::memcpy(w + 2, counts, n * sizeof(uint64_t));
  return Done(r);
}

// ---- protocol 1.2 events ---------------------------------------------------

namespace {

using tokenmeter::client::KvArg;

// How many bytes of printable ASCII (0x20 .. 0x7e) `p` starts with, at most
// TM_MAX_LABEL_VALUE_BYTES. A byte is read only once every byte before it
// was printable (so not past a string's NUL); eight bytes a round, one
// bound check a round.
inline size_t PrintablePrefix(const unsigned char* p) {
  static_assert(TM_MAX_LABEL_VALUE_BYTES % 8 == 0);
  for (size_t n = 0; n < TM_MAX_LABEL_VALUE_BYTES; n += 8) {
#pragma GCC unroll 8
    for (size_t k = 0; k < 8; ++k) {
      if (p[n + k] - 0x20u >= 0x5fu) return n + k;
    }
  }
  return TM_MAX_LABEL_VALUE_BYTES;
}

// The length of the NUL-terminated `s` when it is in label-value syntax
// (tm_proto_valid_label_value(): the daemon's rule), else 0. Reads at most
// TM_MAX_LABEL_VALUE_BYTES + 1 bytes. The common case, 1 to 64 bytes of
// printable ASCII (which the rule accepts: tests/client_lib's
// LabelValueTest checks it), is settled by one pass here; any other string
// is decided by the rule itself.
inline size_t LabelValueLen(const char* s) {
  size_t n = PrintablePrefix(reinterpret_cast<const unsigned char*>(s));
  if (s[n] == '\0' && n != 0) [[likely]]
    return n;
  n = strnlen(s, TM_MAX_LABEL_VALUE_BYTES + 1);
  return tm_proto_valid_label_value(s, n) != 0 ? n : 0;
}

// The records hold strings as bytes in memory order; the word loads below
// build those words on a little-endian host.
static_assert(std::endian::native == std::endian::little);

// Bytes s[at, at + n) (n 1 .. 8) as the low bytes of a word, zero above;
// reads nothing outside them.
inline uint64_t LoadBytes(const char* s, size_t at, size_t n) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s) + at;
  if (n >= 4) {
    uint32_t lo, hi;  // two overlapping 4-byte loads cover 4 .. 8 bytes
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + n - 4, 4);
    return uint64_t{lo} | (uint64_t{hi} << (8 * (n - 4)));
  }
  return uint64_t{p[0]} | (uint64_t{p[n / 2]} << (8 * (n / 2))) |
         (uint64_t{p[n - 1]} << (8 * (n - 1)));
}

// Stores s[0, len) (len 1 .. 64) at w as ceil(len / 8) words, zero padded,
// reading only the string. Up to 16 bytes (most reasons and connectors),
// straight-line word loads; longer, a copy and a load of the last word.
inline void StoreString(uint64_t* w, const char* s, size_t len) {
  if (len <= 8) {
    *w = LoadBytes(s, 0, len);
    return;
  }
  const size_t last = (len - 1) / 8;  // the last word: 1 .. 7
  if (last == 1) {
    std::memcpy(w, s, 8);
  } else {
    std::memcpy(w, s, 8 * last);
  }
  // The 8 bytes that end the string, its last 1 .. 8 bytes shifted down.
  uint64_t end;
  std::memcpy(&end, s + len - 8, 8);
  w[last] = end >> (8 * (8 * (last + 1) - len));
}

inline uint32_t StringWords(size_t len) { return uint32_t(len + 7) / 8; }

inline int Reject(tm_client* c) {
  c->CountRejected();
  return TM_E_INVALID;
}

// Writes rid_words words at w: the integer id, or the string id zero padded.
inline void WriteRid(uint64_t* w, uint32_t rid_words, uint64_t rid,
                     const char* srid, size_t srid_len) {
  if (srid == nullptr) {
    w[0] = rid;
  } else {
    w[rid_words - 1] = 0;
    std::memcpy(w, srid, srid_len);
  }
}

// ADMISSION_REJECTED with no id (has_rid false), an integer id (srid
// nullptr) or a string id (checked by the caller); the reason as a string
// (reason_id 0) or a registered value's id.
[[gnu::always_inline]] inline int Admission(tm_client* c, uint64_t t_ns,
                                            const char* reason,
                                            uint32_t reason_id, bool has_rid,
                                            uint64_t rid, const char* srid,
                                            size_t srid_len) {
  namespace tc = tokenmeter::client;
  size_t len = 0;
  uint32_t reason_arg = reason_id | tc::kAdmissionValueId;
  if (reason_id != 0) {
    if (!c->ValidValueId(reason_id)) [[unlikely]]
      return Reject(c);
  } else {
    len = reason != nullptr ? LabelValueLen(reason) : 0;
    if (len == 0) [[unlikely]]
      return Reject(c);
    reason_arg = uint32_t(len);
  }
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t rw = !has_rid ? 0 : srid == nullptr ? 1 : RidWords(srid_len);
  const uint32_t words = 2 + rw + StringWords(len);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  const uint32_t int_rid =
      has_rid && srid == nullptr ? tc::kAdmissionIntRid : 0;
  w[0] = MakeHeader(TM_EV_ADMISSION_REJECTED, words, uint32_t(srid_len),
                    reason_arg | int_rid);
  w[1] = t_ns != 0 ? t_ns : Now();
  if (has_rid) WriteRid(w + 2, rw, rid, srid, srid_len);
  if (len != 0) StoreString(w + 2 + rw, reason, len);
  return Done(r);
}

// The size of tm_kv_transfer_info as protocol 1.2 laid it out (see
// kRequestParamsSize).
constexpr size_t kKvTransferInfoSize =
    offsetof(tm_kv_transfer_info, connector_id) + sizeof(uint32_t);

// A KV_TRANSFER string field: its header field (length or registered id),
// its flag and its words in the record; false when it breaks a rule (a
// string not in label-value syntax, an unknown id, both given).
struct KvString {
  uint32_t field = 0;
  uint32_t flag = 0;
  uint32_t words = 0;
};
[[gnu::always_inline]] inline bool CheckKvString(const tm_client* c,
                                                 const char* s, uint32_t id,
                                                 uint32_t id_flag,
                                                 KvString* out) {
  if (id != 0) {
    out->field = id;
    out->flag = id_flag;
    return s == nullptr && c->ValidValueId(id);
  }
  if (s == nullptr) return true;
  const size_t len = LabelValueLen(s);
  out->field = uint32_t(len);
  out->words = StringWords(len);
  return len != 0;
}

// Any transfer: every rule checked (TM_E_INVALID, counted, for one
// broken), reason and connector as strings, ids or none, the amounts
// stored one word each when given (kKvBytes / kKvBlocks). Out of line:
// the public calls take KvTransferLeanForm() first and come here for what
// it leaves (a reason string, a connector string past 16 bytes or not
// printable ASCII, an amount past the packed word, a thread to attach, a
// full ring, a closed client, a broken rule). `t`:
// the event's time, nonzero (the clock read by the caller).
[[gnu::noinline]] int KvTransferGeneral(tm_client* c, uint64_t t, uint64_t rid,
                                        const char* srid, size_t srid_len,
                                        const tm_kv_transfer_info* info) {
  namespace tc = tokenmeter::client;
  if (info == nullptr || info->size < kKvTransferInfoSize) [[unlikely]]
    return Reject(c);
  const int role = EnumValue(info->role);
  const uint64_t bytes = info->bytes;
  const uint64_t blocks = info->blocks;
  if ((role != TM_KV_SEND && role != TM_KV_RECV) ||
      (bytes != TM_KV_UNKNOWN && bytes > TM_MAX_KV_TRANSFER_BYTES) ||
      (blocks != TM_KV_UNKNOWN && blocks > TM_MAX_KV_TRANSFER_BYTES))
      [[unlikely]] {
    return Reject(c);
  }
  const char* reason = info->reason;
  const char* connector = info->connector;
  KvString rs, cs;
  if (!CheckKvString(c, reason, info->reason_id, tc::kKvReasonId, &rs) ||
      !CheckKvString(c, connector, info->connector_id, tc::kKvConnectorId, &cs))
      [[unlikely]] {
    return Reject(c);
  }
  const uint64_t start = info->start_ns;
  if (start > t) [[unlikely]]
    return Reject(c);
  const bool has_bytes = bytes != TM_KV_UNKNOWN;
  const bool has_blocks = blocks != TM_KV_UNKNOWN;
  const uint32_t flags = (role == TM_KV_RECV ? tc::kKvRecv : 0) |
                         (info->ok == 0 ? tc::kKvFailed : 0) |
                         (has_bytes ? tc::kKvBytes : 0) |
                         (has_blocks ? tc::kKvBlocks : 0) | rs.flag | cs.flag;
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t rw = srid == nullptr ? 1 : RidWords(srid_len);
  const uint32_t words = 3 + rw + has_bytes + has_blocks + rs.words + cs.words;
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(TM_EV_KV_TRANSFER, words, uint32_t(srid_len),
                    KvArg(flags, rs.field, cs.field));
  w[1] = t;
  WriteRid(w + 2, rw, rid, srid, srid_len);
  uint64_t* p = w + 2 + rw;
  *p++ = start;
  if (has_bytes) *p++ = bytes;
  if (has_blocks) *p++ = blocks;
  if (rs.words != 0) StoreString(p, reason, rs.field);
  if (cs.words != 0) StoreString(p + rs.words, connector, cs.field);
  return Done(r);
}

// KvTransferLeanForm()'s "not here": nothing written, nothing counted.
constexpr int kTakeGeneralPath = 1;

// The lean path: a whole 1.2 struct without a reason string (a reason id
// or none), amounts that fit the packed word (kKvPacked: bytes + 1 in 40
// bits, blocks + 1 in 24, 0 = not given; both then within the 2^48 - 1
// bound), an event time `t` already known (nonzero), a thread the slot
// cache holds, an open client and room in the ring. Two forms
// (KvTransferAt() picks one): the connector an id or none (`connector`
// NULL; inlined into tm_kv_transfer() and tm_kv_transfer_str()), or the
// connector a string of 1 to 16 bytes of printable ASCII (`connector`: the
// struct's, read by the caller; out of line, KvTransferStrings*Id()),
// stored after the amounts word as the general path stores it. Anything
// else returns kTakeGeneralPath before anything is counted or committed,
// and the caller makes the call through KvTransferGeneral(), which checks
// every rule again (the same rules: a transfer this path refuses, the
// general one refuses too). No call on the way (TryEnter(), not Enter();
// the connector's scan and copy inline), so the compiler keeps the first
// form a leaf without a stack frame up to the ring (the second saves the
// registers its string takes): the record's words are stored as each
// field is read and each rule tested right after its field (a broken one
// leaves the reserved words uncommitted), so that few values stay live
// (the count of registered ids is read only for the ids' test); an
// integer request id is stored with the time, a string one copied last.
// Each field of the caller's struct is read once here (the caller has
// checked the struct's size, and in the second form read `reason`, NULL,
// and `connector`).
[[gnu::always_inline]] inline int KvTransferLeanForm(
    tm_client* c, uint64_t t, uint64_t rid, const char* srid, size_t srid_len,
    const tm_kv_transfer_info* info, const char* connector) {
  const bool connector_string = connector != nullptr;
  namespace tc = tokenmeter::client;
  // The connector string's length and words: printable ASCII settles it
  // (LabelValueLen()'s common case); anything else, and a string past two
  // words, is the general path's.
  size_t clen = 0;
  uint32_t cwords = 0;
  if (connector_string) {
    clen = PrintablePrefix(reinterpret_cast<const unsigned char*>(connector));
    if (clen == 0 || clen > 16 || connector[clen] != '\0') [[unlikely]]
      return kTakeGeneralPath;
    cwords = StringWords(clen);
  }
  Ring* r = c->TryEnter();
  if (r == nullptr) [[unlikely]]
    return kTakeGeneralPath;
  const uint32_t rw = srid == nullptr ? 1 : RidWords(srid_len);
  const uint32_t words = 4 + rw + cwords;
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]] {
    tm_client::Leave(r);
    return kTakeGeneralPath;
  }
  uint64_t* const p = w + 2 + rw;
  w[1] = t;
  if (srid == nullptr) w[2] = rid;
  {
    const uint64_t start = info->start_ns;
    p[0] = start;
    if (start > t) [[unlikely]]
      goto general;
  }
  {
    // An amount is TM_KV_UNKNOWN (+ 1 wraps to 0) or at most the bound.
    const uint64_t bytes1 = info->bytes + 1;
    const uint64_t blocks1 = info->blocks + 1;
    p[1] = tc::KvPackedAmounts(bytes1, blocks1);
    if (!tc::KvAmountsFitPacked(bytes1, blocks1)) [[unlikely]]
      goto general;
  }
  {
    static_assert(TM_KV_SEND == 0 && TM_KV_RECV == 1 && tc::kKvRecv == 1);
    const uint32_t role = uint32_t(EnumValue(info->role));
    if (role > TM_KV_RECV) [[unlikely]]
      goto general;
    // The reason's id flag always set (an id field of 0 is "none" for the
    // encoder), the connector's unless it is a string.
    uint32_t arg = role | (info->ok == 0 ? tc::kKvFailed : 0) | tc::kKvPacked |
                   tc::kKvReasonId |
                   (connector_string ? 0 : tc::kKvConnectorId);
    // An id is 0 or registered (1 .. the count), i.e. at most the count;
    // with a connector string, its id is 0 (not both).
    const uint32_t ids = c->ValueIds();
    const uint32_t reason_id = info->reason_id;
    if (reason_id > ids) [[unlikely]]
      goto general;
    arg |= KvArg(0, reason_id, 0);
    const uint32_t connector_id = info->connector_id;
    if (connector_id > (connector_string ? 0 : ids)) [[unlikely]]
      goto general;
    arg |= KvArg(0, 0, connector_string ? uint32_t(clen) : connector_id);
    w[0] = MakeHeader(TM_EV_KV_TRANSFER, words, uint32_t(srid_len), arg);
  }
  if (connector_string) StoreString(p + 2, connector, clen);
  // Last: a string id's copy may be a call, with little left to keep.
  if (srid != nullptr) WriteRid(w + 2, rw, rid, srid, srid_len);
  return Done(r);
general:
  tm_client::Leave(r);
  return kTakeGeneralPath;
}

// A struct with a string (reason or connector): the lean path's second
// form when the connector is the only one, else, and for whatever that
// form leaves, the general path. Out of line, so that the registers the
// string takes are saved here, not on the way of the form without
// strings; one function per kind of request id, so that each is compiled
// for its own. The caller has checked the struct's size.
[[gnu::always_inline]] inline int KvTransferStrings(
    tm_client* c, uint64_t t, uint64_t rid, const char* srid, size_t srid_len,
    const tm_kv_transfer_info* info) {
  const char* connector = info->connector;
  if (info->reason == nullptr && connector != nullptr) {
    const int rc =
        KvTransferLeanForm(c, t, rid, srid, srid_len, info, connector);
    if (rc != kTakeGeneralPath) [[likely]]
      return rc;
  }
  return KvTransferGeneral(c, t, rid, srid, srid_len, info);
}
[[gnu::noinline]] int KvTransferStringsIntId(tm_client* c, uint64_t t,
                                             uint64_t rid,
                                             const tm_kv_transfer_info* info) {
  return KvTransferStrings(c, t, rid, nullptr, 0, info);
}
[[gnu::noinline]] int KvTransferStringsStrId(tm_client* c, uint64_t t,
                                             const char* srid, size_t srid_len,
                                             const tm_kv_transfer_info* info) {
  return KvTransferStrings(c, t, 0, srid, srid_len, info);
}

// Both paths for an event time `t` (nonzero): a struct without strings
// takes the lean path's first form inline, one with a string
// KvTransferStrings*Id() (the second form, or the general path), one of
// the wrong size the general path (KvTransferGeneral()), as does whatever
// the first form leaves. Every way out before the first form is a tail
// call with the struct alone, so that the registers the first form saves
// are saved on its way only.
[[gnu::always_inline]] inline int KvTransferAt(
    tm_client* c, uint64_t t, uint64_t rid, const char* srid, size_t srid_len,
    const tm_kv_transfer_info* info) {
  if (info == nullptr || info->size < kKvTransferInfoSize) [[unlikely]]
    return KvTransferGeneral(c, t, rid, srid, srid_len, info);
  if ((reinterpret_cast<uintptr_t>(info->reason) |
       reinterpret_cast<uintptr_t>(info->connector)) != 0) [[unlikely]] {
    if (srid == nullptr) return KvTransferStringsIntId(c, t, rid, info);
    return KvTransferStringsStrId(c, t, srid, srid_len, info);
  }
  const int rc = KvTransferLeanForm(c, t, rid, srid, srid_len, info, nullptr);
  if (rc != kTakeGeneralPath) [[likely]]
    return rc;
  return KvTransferGeneral(c, t, rid, srid, srid_len, info);
}

// t_ns = 0: the clock read once, before the checks (start <= t compares
// with this read), then both paths. Out of line: the clock's call would
// give the callers a stack frame. One function per kind of request id, so
// that the integer one keeps only its three arguments across the clock.
[[gnu::noinline]] int KvTransferNowIntId(tm_client* c, uint64_t rid,
                                         const tm_kv_transfer_info* info) {
  return KvTransferAt(c, Now(), rid, nullptr, 0, info);
}
[[gnu::noinline]] int KvTransferNowStrId(tm_client* c, const char* srid,
                                         size_t srid_len,
                                         const tm_kv_transfer_info* info) {
  return KvTransferAt(c, Now(), 0, srid, srid_len, info);
}

}  // namespace

int tm_admission_rejected(tm_client* c, uint64_t t_ns, const char* reason) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  return Admission(c, t_ns, reason, 0, false, 0, nullptr, 0);
}

int tm_admission_rejected_rid(tm_client* c, uint64_t t_ns, const char* reason,
                              uint64_t rid) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  return Admission(c, t_ns, reason, 0, true, rid, nullptr, 0);
}

int tm_admission_rejected_str(tm_client* c, uint64_t t_ns, const char* reason,
                              const char* rid, size_t rid_len) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (rid == nullptr || rid_len == 0 || rid_len > TM_MAX_RID_BYTES)
      [[unlikely]] {
    return Reject(c);
  }
  return Admission(c, t_ns, reason, 0, true, 0, rid, rid_len);
}

int tm_admission_rejected_id(tm_client* c, uint64_t t_ns, uint32_t reason_id) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (reason_id == 0) [[unlikely]]
    return Reject(c);
  return Admission(c, t_ns, nullptr, reason_id, false, 0, nullptr, 0);
}

int tm_admission_rejected_id_rid(tm_client* c, uint64_t t_ns,
                                 uint32_t reason_id, uint64_t rid) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (reason_id == 0) [[unlikely]]
    return Reject(c);
  return Admission(c, t_ns, nullptr, reason_id, true, rid, nullptr, 0);
}

int tm_admission_rejected_id_str(tm_client* c, uint64_t t_ns,
                                 uint32_t reason_id, const char* rid,
                                 size_t rid_len) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (reason_id == 0 || rid == nullptr || rid_len == 0 ||
      rid_len > TM_MAX_RID_BYTES) [[unlikely]] {
    return Reject(c);
  }
  return Admission(c, t_ns, nullptr, reason_id, true, 0, rid, rid_len);
}

int tm_register_value(tm_client* c, const char* value) {
  if (c == nullptr) return TM_E_INVALID;
  return c->RegisterValue(value);
}

int tm_kv_transfer(tm_client* c, uint64_t t_ns, uint64_t rid,
                   const tm_kv_transfer_info* info) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (t_ns == 0) [[unlikely]]
    return KvTransferNowIntId(c, rid, info);
  return KvTransferAt(c, t_ns, rid, nullptr, 0, info);
}

int tm_kv_transfer_str(tm_client* c, uint64_t t_ns, const char* rid,
                       size_t rid_len, const tm_kv_transfer_info* info) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (rid == nullptr || rid_len == 0 || rid_len > TM_MAX_RID_BYTES)
      [[unlikely]] {
    return Reject(c);
  }
  if (t_ns == 0) [[unlikely]]
    return KvTransferNowStrId(c, rid, rid_len, info);
  return KvTransferAt(c, t_ns, 0, rid, rid_len, info);
}

int tm_sleep_state(tm_client* c, uint64_t t_ns, tm_scheduler_state scheduler,
                   tm_weights_state weights, tm_kv_cache_state kv_cache) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  const int s = static_cast<int>(scheduler);
  const int w = static_cast<int>(weights);
  const int k = static_cast<int>(kv_cache);
  if (s < TM_SCHEDULER_KEEP || s > TM_SCHEDULER_PAUSED || w < TM_WEIGHTS_KEEP ||
      w > TM_WEIGHTS_DISCARDED || k < TM_KV_CACHE_KEEP ||
      k > TM_KV_CACHE_RELEASED) [[unlikely]] {
    return Reject(c);
  }
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  uint64_t* rec = r->Reserve(2);
  if (rec == nullptr) [[unlikely]]
    return Full(r);
  rec[0] = MakeHeader(TM_EV_SLEEP, 2, 0, tokenmeter::client::SleepArg(s, w, k));
  rec[1] = t_ns != 0 ? t_ns : Now();
  return Done(r);
}

}  // extern "C"

// ---- protocol 1.3 events ---------------------------------------------------

namespace {

// The sizes of the 1.3 structs as protocol 1.3 laid them out.
constexpr size_t kRequestSummarySize =
    offsetof(tm_request_summary_info, tpot_ns) + sizeof(uint64_t);
constexpr size_t kIterationCountsSize =
    offsetof(tm_iteration_counts, preemptions) + sizeof(uint64_t);

// REQUEST_SUMMARY with no id (has_rid false), an integer id (srid nullptr)
// or a string id (checked by the caller). One pass over the struct's
// optional fields: each is TM_NOT_GIVEN or within its bound, the mask of
// those given built as it goes.
int Summary(tm_client* c, uint64_t t_ns, bool has_rid, uint64_t rid,
            const char* srid, size_t srid_len,
            const tm_request_summary_info* s) {
  namespace tc = tokenmeter::client;
  if (s == nullptr || s->size < kRequestSummarySize) [[unlikely]]
    return Reject(c);
  const int reason = EnumValue(s->reason);
  const uint64_t prompt = s->prompt_tokens;
  const uint64_t generation = s->generation_tokens;
  // In kSummary* bit order: the four counts, then the seven durations.
  const uint64_t fields[tc::kNumSummaryFields] = {
      s->cached_tokens, s->max_tokens, s->n,          s->max_generation_tokens,
      s->ttft_ns,       s->queue_ns,   s->prefill_ns, s->decode_ns,
      s->inference_ns,  s->e2e_ns,     s->tpot_ns};
  bool bad = reason < TM_FINISH_STOP || reason > TM_FINISH_ERROR ||
             prompt > TM_MAX_EVENT_COUNT || generation > TM_MAX_EVENT_COUNT;
  uint32_t mask = 0;
  for (int i = 0; i < tc::kNumSummaryFields; ++i) {
    if (fields[i] == TM_NOT_GIVEN) continue;
    mask |= 1u << i;
    bad |= fields[i] > (i < 4 ? TM_MAX_EVENT_COUNT : TM_MAX_DURATION_NS);
  }
  bad |= (mask & tc::kSummaryCached) != 0 && fields[0] > prompt;
  if (bad) [[unlikely]]
    return Reject(c);
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t rw = !has_rid ? 0 : srid == nullptr ? 1 : RidWords(srid_len);
  const uint32_t words = 3 + rw + uint32_t(std::popcount(mask));
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(
      TM_EV_REQUEST_SUMMARY, words, uint32_t(srid_len),
      tc::SummaryArg(uint32_t(reason), has_rid && srid == nullptr, mask));
  w[1] = t_ns != 0 ? t_ns : Now();
  if (has_rid) WriteRid(w + 2, rw, rid, srid, srid_len);
  uint64_t* p = w + 2 + rw;
  *p++ = tc::PackLengths(uint32_t(prompt), uint32_t(generation));
  for (int i = 0; i < tc::kNumSummaryFields; ++i) {
    if ((mask & (1u << i)) != 0) *p++ = fields[i];
  }
  return Done(r);
}

}  // namespace

extern "C" {

int tm_request_summary(tm_client* c, uint64_t t_ns,
                       const tm_request_summary_info* s) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  return Summary(c, t_ns, false, 0, nullptr, 0, s);
}

int tm_request_summary_rid(tm_client* c, uint64_t t_ns, uint64_t rid,
                           const tm_request_summary_info* s) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  return Summary(c, t_ns, true, rid, nullptr, 0, s);
}

int tm_request_summary_str(tm_client* c, uint64_t t_ns, const char* rid,
                           size_t rid_len, const tm_request_summary_info* s) {
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  if (rid == nullptr || rid_len == 0 || rid_len > TM_MAX_RID_BYTES)
      [[unlikely]] {
    return Reject(c);
  }
  return Summary(c, t_ns, true, 0, rid, rid_len, s);
}

int tm_latencies(tm_client* c, uint64_t t_ns, const uint64_t* ttft_ns,
                 size_t n_ttft, const uint64_t* itl_ns, size_t n_itl,
                 const tm_iteration_counts* counts) {
  namespace tc = tokenmeter::client;
  if (c == nullptr) [[unlikely]]
    return TM_E_INVALID;
  bool ok = n_ttft <= TM_MAX_LATENCIES && n_itl <= TM_MAX_LATENCIES &&
            n_ttft + n_itl <= TM_MAX_LATENCIES &&
            (ttft_ns != nullptr || n_ttft == 0) &&
            (itl_ns != nullptr || n_itl == 0);
  uint64_t count_words[tc::kNumLatCounts] = {};
  uint32_t mask = 0;
  if (ok && counts != nullptr) {
    ok = counts->size >= kIterationCountsSize;
    const uint64_t given[tc::kNumLatCounts] = {
        ok ? counts->prompt_tokens : TM_NOT_GIVEN,
        ok ? counts->generation_tokens : TM_NOT_GIVEN,
        ok ? counts->preemptions : TM_NOT_GIVEN};
    for (int i = 0; i < tc::kNumLatCounts; ++i) {
      if (given[i] == TM_NOT_GIVEN) continue;
      ok &= given[i] <= TM_MAX_EVENT_COUNT;
      count_words[std::popcount(mask)] = given[i];
      mask |= 1u << i;
    }
  }
  if (ok) [[likely]] {
    // One pass, no branch per value: every value at most 2^48 - 1 is one
    // with none of the high 16 bits set.
    uint64_t high = 0;
    for (size_t i = 0; i < n_ttft; ++i) high |= ttft_ns[i];
    for (size_t i = 0; i < n_itl; ++i) high |= itl_ns[i];
    static_assert(TM_MAX_DURATION_NS == (uint64_t{1} << 48) - 1);
    ok = (high >> 48) == 0;
  }
  if (!ok) [[unlikely]]
    return Reject(c);
  Ring* r;
  const int rc = c->Enter(&r);
  if (rc != TM_OK) [[unlikely]]
    return rc;
  const uint32_t n_counts = uint32_t(std::popcount(mask));
  const uint32_t words = 2 + n_counts + uint32_t(n_ttft + n_itl);
  uint64_t* w = r->Reserve(words);
  if (w == nullptr) [[unlikely]]
    return Full(r);
  w[0] = MakeHeader(TM_EV_LATENCIES, words, 0,
                    tc::LatenciesArg(uint32_t(n_ttft), mask));
  w[1] = t_ns != 0 ? t_ns : Now();
  uint64_t* p = w + 2;
  for (uint32_t i = 0; i < n_counts; ++i) *p++ = count_words[i];
  if (n_ttft != 0) std::memcpy(p, ttft_ns, n_ttft * sizeof(uint64_t));
  if (n_itl != 0) std::memcpy(p + n_ttft, itl_ns, n_itl * sizeof(uint64_t));
  return Done(r);
}

}  // extern "C"
