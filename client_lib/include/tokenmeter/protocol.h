/*
 * tokenmeter ingest protocol, version 1: the wire constants and the naming
 * rules shared by the client library and the daemon. docs/protocol.md
 * describes the bytes; this header names the numbers and strings in it and
 * holds the one implementation of the HELLO rules (name syntax, reserved
 * label names, UTF-8) that both sides apply, so that the client accepts
 * exactly what the daemon accepts. C99 and C++ clean; no state; the checks
 * are pure static inline functions that allocate nothing and never fail.
 */
#ifndef TOKENMETER_PROTOCOL_H_
#define TOKENMETER_PROTOCOL_H_

#include <stddef.h>
#include <string.h>

/* Protocol version carried in HELLO's `proto` key. */
#define TM_PROTO_VERSION 1

/* Default ingest socket path (a systemd socket unit creates it). */
#define TM_DEFAULT_SOCKET_PATH "/run/tokenmeter/ingest.sock"

/* Frame types: the first element of every top-level msgpack array. */
#define TM_FRAME_HELLO 0   /* [0, meta] */
#define TM_FRAME_BATCH 1   /* [1, seq, dropped_total, [event, ...]] */
#define TM_FRAME_GOODBYE 2 /* [2] */
/* 1.1, daemon -> client, only after HELLO `ack: true`: no BATCH of the
 * session with a seq at or below `seq` needs to be sent again. */
#define TM_FRAME_ACK 3 /* [3, seq] */

/* Event kinds: the first element of every event array. */
#define TM_EV_ARRIVED 1     /* [1, t, rid, prompt_tokens(, params)] */
#define TM_EV_QUEUED 2      /* [2, t, rid] */
#define TM_EV_SCHEDULED 3   /* [3, t, rid] */
#define TM_EV_TOKENS 4      /* [4, t, rid, n] */
#define TM_EV_FINISHED 5    /* [5, t, rid, reason] */
#define TM_EV_PREEMPTED 6   /* [6, t, rid] */
#define TM_EV_STEP 7        /* [7, t, stats] */
#define TM_EV_EXPERT_LOAD 8 /* 1.1: [8, t, layer, counts] */
/* 1.2 (protocol-v1.md "Additions in 1.2"). A 1.1 daemon counts these as
 * unknown_kind. */
#define TM_EV_ADMISSION_REJECTED 9 /* [9, t, reason(, rid)] */
#define TM_EV_KV_TRANSFER 10       /* [10, t, rid, info] */
#define TM_EV_SLEEP 11             /* [11, t, state] */
/* 1.3 (docs/protocol.md "Additions in 1.3"): what an engine hands over only
 * as computed figures, without per-request events. A 1.2 daemon counts
 * these as unknown_kind. */
#define TM_EV_REQUEST_SUMMARY 12 /* [12, t, reason, summary(, rid)] */
#define TM_EV_LATENCIES 13       /* [13, t, ttft, itl(, counts)] */
/* The highest event kind this header knows. */
#define TM_EV_LAST TM_EV_LATENCIES

/* Default limits (the daemon may be configured to raise or lower them). */
#define TM_MAX_FRAME_BYTES (1024u * 1024u)
#define TM_MAX_BATCH_EVENTS 65536u
#define TM_MAX_STRING_BYTES 256u
#define TM_MAX_RID_BYTES 128u
#define TM_MAX_HELLO_LABELS 8u
/* 1.1: HELLO cache_config entries; ARRIVED params lora bytes, labels
 * entries and label value bytes. */
#define TM_MAX_CACHE_CONFIG 32u
#define TM_MAX_LORA_BYTES 128u
#define TM_MAX_REQUEST_LABELS 4u
#define TM_MAX_REQUEST_LABEL_VALUE_BYTES 128u
/* 1.1: EXPERT_LOAD layer (below) and counts entries (1 .. this many). */
#define TM_MAX_MOE_LAYERS 4096u
#define TM_MAX_MOE_EXPERTS 1024u

/* The largest count one event may carry (TOKENS n, ARRIVED prompt_tokens
 * and params, every STEP count and spec_accepted_per_pos entry, each
 * EXPERT_LOAD count): no engine produces more in one event, so a larger
 * value is not data (it would wrap the daemon's counters). A required one
 * (TOKENS n, ARRIVED prompt_tokens, an EXPERT_LOAD count) makes the event a
 * bad_event; since 1.2 an optional one (ARRIVED max_tokens and n, a STEP
 * key or position) is dropped as a bad_field, the event applied. */
#define TM_MAX_EVENT_COUNT 4294967295ull /* 2^32 - 1 */

/* Accepted event times relative to the daemon's clock. */
#define TM_MAX_FUTURE_NS 1000000000ull           /* 1 s */
#define TM_MAX_PAST_NS (3600ull * 1000000000ull) /* 1 hour */

/* HELLO meta keys. */
#define TM_HELLO_PROTO "proto"
#define TM_HELLO_ENGINE "engine"
#define TM_HELLO_MODEL "model"
#define TM_HELLO_INSTANCE "instance"
#define TM_HELLO_SCOPE "scope"
#define TM_HELLO_LABELS "labels"
#define TM_HELLO_PID "pid"
/* 1.1 HELLO keys (protocol-v1.md "Additions in 1.1"). */
#define TM_HELLO_PROFILE "profile" /* "vllm", "sglang", "lmdeploy" */
#define TM_HELLO_CACHE_CONFIG                                         \
  "cache_config"                     /* map str -> str/int/float/bool \
                                      */
#define TM_HELLO_MAX_LORA "max_lora" /* int */
#define TM_HELLO_SESSION "session"   /* uint, one per client instance */
#define TM_HELLO_ACK "ack"           /* bool; needs session */
#define TM_PROFILE_VLLM "vllm"
#define TM_PROFILE_SGLANG "sglang"
#define TM_PROFILE_LMDEPLOY "lmdeploy"

/* ARRIVED params keys. */
#define TM_PARAM_MAX_TOKENS "max_tokens"
#define TM_PARAM_N "n"
#define TM_PARAM_LORA "lora"     /* 1.1: str, 1..TM_MAX_LORA_BYTES */
#define TM_PARAM_LABELS "labels" /* 1.1: map str -> str, per-request labels */
/* 1.2: int, TM_MIN_PRIORITY .. TM_MAX_PRIORITY (lower runs first). */
#define TM_PARAM_PRIORITY "priority"
/* 1.2: str, the W3C traceparent (tm_proto_valid_traceparent()). */
#define TM_PARAM_TRACEPARENT "traceparent"
/* 1.2: str, the W3C tracestate (tm_proto_valid_tracestate()). */
#define TM_PARAM_TRACESTATE "tracestate"
#define TM_MIN_PRIORITY (-2147483647 - 1)
#define TM_MAX_PRIORITY 2147483647
#define TM_TRACEPARENT_BYTES 55u
#define TM_MAX_TRACESTATE_BYTES 256u
#define TM_MAX_TRACESTATE_MEMBERS 32u

/* 1.2: SCHEDULED info keys ([3, t, rid, info], the first SCHEDULED's):
 * uints, cached + external at most the request's prompt tokens. */
#define TM_SCHED_CACHED_TOKENS "cached_tokens"
#define TM_SCHED_EXTERNAL_TOKENS "external_tokens"

/* 1.2: "label-value syntax" (ADMISSION_REJECTED reason, KV_TRANSFER reason
 * and connector): 1 to this many bytes of UTF-8 without control characters
 * (tm_proto_valid_label_value()). */
#define TM_MAX_LABEL_VALUE_BYTES 64u

/* 1.2: KV_TRANSFER info keys. role and start are required. */
#define TM_KV_ROLE "role"           /* TM_KV_ROLE_SEND or TM_KV_ROLE_RECV */
#define TM_KV_START "start"         /* uint ns, <= the event's t */
#define TM_KV_BYTES "bytes"         /* uint */
#define TM_KV_BLOCKS "blocks"       /* uint */
#define TM_KV_OK "ok"               /* bool, default true */
#define TM_KV_REASON "reason"       /* label-value syntax, on failure */
#define TM_KV_CONNECTOR "connector" /* label-value syntax */
#define TM_KV_ROLE_SEND "send"      /* the prefill side */
#define TM_KV_ROLE_RECV "recv"      /* the decode side */
/* The largest KV_TRANSFER bytes / blocks value (a larger one is dropped as
 * bad_field): 2^48 - 1, 256 TiB in one transfer. */
#define TM_MAX_KV_TRANSFER_BYTES 281474976710655ull

/* 1.2: SLEEP state keys and values; a key not given keeps its value. */
#define TM_SLEEP_SCHEDULER "scheduler" /* "running", "paused" */
#define TM_SLEEP_WEIGHTS "weights"   /* "resident", "offloaded", "discarded" */
#define TM_SLEEP_KV_CACHE "kv_cache" /* "resident", "released" */
#define TM_SLEEP_RUNNING "running"
#define TM_SLEEP_PAUSED "paused"
#define TM_SLEEP_RESIDENT "resident"
#define TM_SLEEP_OFFLOADED "offloaded"
#define TM_SLEEP_DISCARDED "discarded"
#define TM_SLEEP_RELEASED "released"

/* 1.3: REQUEST_SUMMARY summary keys. prompt_tokens and generation_tokens
 * are required (uints <= TM_MAX_EVENT_COUNT); the others optional: the
 * counts uints <= TM_MAX_EVENT_COUNT (cached_tokens at most prompt_tokens),
 * the durations uint ns <= TM_MAX_DURATION_NS. */
#define TM_SUM_PROMPT_TOKENS "prompt_tokens"
#define TM_SUM_GENERATION_TOKENS "generation_tokens"
#define TM_SUM_CACHED_TOKENS "cached_tokens"
#define TM_SUM_MAX_TOKENS "max_tokens"
#define TM_SUM_N "n"
/* Of a request group (vLLM's parallel sampling, n > 1): the most tokens one
 * of its requests generated; given on the summary that completes it. */
#define TM_SUM_MAX_GENERATION_TOKENS "max_generation_tokens"
#define TM_SUM_TTFT "ttft"           /* time to first token */
#define TM_SUM_QUEUE "queue"         /* queued to scheduled */
#define TM_SUM_PREFILL "prefill"     /* scheduled to first token */
#define TM_SUM_DECODE "decode"       /* first token to last token */
#define TM_SUM_INFERENCE "inference" /* scheduled to last token */
#define TM_SUM_E2E "e2e"             /* arrival to finish */
#define TM_SUM_TPOT "tpot"           /* time per output token */
/* The longest duration 1.3 events carry: 2^48 - 1 ns (about 78 hours). */
#define TM_MAX_DURATION_NS 281474976710655ull

/* 1.3: LATENCIES: ttft and itl are arrays of uint ns (each <=
 * TM_MAX_DURATION_NS), at most TM_MAX_LATENCIES values in the two together;
 * the optional counts map holds uints <= TM_MAX_EVENT_COUNT. */
#define TM_MAX_LATENCIES 1024u
#define TM_LAT_PROMPT_TOKENS "prompt_tokens"
#define TM_LAT_GENERATION_TOKENS "generation_tokens"
#define TM_LAT_PREEMPTIONS "preemptions"

/* FINISHED reasons. */
#define TM_REASON_STOP "stop"
#define TM_REASON_LENGTH "length"
#define TM_REASON_ABORT "abort"
#define TM_REASON_ERROR "error"

/* STEP stats keys. */
#define TM_STEP_RUNNING "running"
#define TM_STEP_WAITING "waiting"
#define TM_STEP_KV_USAGE "kv_usage"
#define TM_STEP_PROMPT_TOKENS "prompt_tokens"
#define TM_STEP_GENERATION_TOKENS "generation_tokens"
#define TM_STEP_PREFIX_QUERIES "prefix_queries"
#define TM_STEP_PREFIX_HITS "prefix_hits"
#define TM_STEP_SPEC_DRAFTS "spec_drafts"
#define TM_STEP_SPEC_DRAFT_TOKENS "spec_draft_tokens"
#define TM_STEP_SPEC_ACCEPTED_TOKENS "spec_accepted_tokens"
#define TM_STEP_SPEC_ACCEPTED_PER_POS "spec_accepted_per_pos"
/* 1.2: of `waiting`, those waiting for something other than capacity. */
#define TM_STEP_WAITING_DEFERRED "waiting_deferred"

/* ---- HELLO rules --------------------------------------------------------
 * Label names the daemon sets itself on some series; a HELLO label may not
 * use them, nor any name starting with TM_RESERVED_LABEL_PREFIX. */
#define TM_RESERVED_LABEL_PREFIX "__"
#define TM_RESERVED_LABEL_NAMES                                              \
  "model_name", "engine", "engine_family", "finished_reason", "position",    \
      "le", "quantile", "interval", "reason", "kind", /* 1.1: */ "max_lora", \
      "running_lora_adapters", "waiting_lora_adapters", "cache_source",      \
      "layer", "expert", /* 1.2: */ "source", "role", "sleep_state",         \
      "resource", "state", "stage"
#define TM_NUM_RESERVED_LABELS 22

/* 1 when s[0, len) is well-formed UTF-8 (no overlong forms, no surrogates,
 * nothing above U+10FFFF), else 0. Every HELLO string must be. O(len). */
static inline int tm_proto_valid_utf8(const char* s, size_t len) {
  const unsigned char* p = (const unsigned char*)s;
  const unsigned char* end = p + len;
  while (p < end) {
    const unsigned char b = *p;
    int n, i;
    unsigned long cp;
    if (b < 0x80) {
      ++p;
      continue;
    }
    if ((b & 0xe0) == 0xc0) {
      n = 1;
      cp = b & 0x1fu;
    } else if ((b & 0xf0) == 0xe0) {
      n = 2;
      cp = b & 0x0fu;
    } else if ((b & 0xf8) == 0xf0) {
      n = 3;
      cp = b & 0x07u;
    } else {
      return 0;
    }
    if (end - p <= n) return 0;
    for (i = 1; i <= n; ++i) {
      if ((p[i] & 0xc0) != 0x80) return 0;
      cp = (cp << 6) | (p[i] & 0x3fu);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return 0;
    }
    p += n + 1;
  }
  return 1;
}

/* 1 when s[0, len) matches [a-zA-Z_][a-zA-Z0-9_]* (with allow_dash, also
 * '-' after the first character: the HELLO `engine` rule), else 0. */
static inline int tm_proto_valid_name(const char* s, size_t len,
                                      int allow_dash) {
  size_t i;
  if (len == 0) return 0;
  for (i = 0; i < len; ++i) {
    const char c = s[i];
    const int alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const int digit = c >= '0' && c <= '9';
    if (!alpha && !(i > 0 && (digit || (allow_dash && c == '-')))) return 0;
  }
  return 1;
}

/* 1 when s[0, len) is a label name a HELLO may not use (one the daemon
 * sets, or one starting with TM_RESERVED_LABEL_PREFIX), else 0. */
static inline int tm_proto_reserved_label(const char* s, size_t len) {
  static const char* const kNames[TM_NUM_RESERVED_LABELS] = {
      TM_RESERVED_LABEL_NAMES};
  size_t i;
  if (len >= 2 && s[0] == '_' && s[1] == '_') return 1;
  for (i = 0; i < TM_NUM_RESERVED_LABELS; ++i) {
    if (strlen(kNames[i]) == len && memcmp(kNames[i], s, len) == 0) return 1;
  }
  return 0;
}

/* 1 when (name, value) may be a HELLO label: a valid, unreserved name and
 * two well-formed UTF-8 strings of at most TM_MAX_STRING_BYTES bytes. */
static inline int tm_proto_valid_label(const char* name, size_t name_len,
                                       const char* value, size_t value_len) {
  return name_len <= TM_MAX_STRING_BYTES && value_len <= TM_MAX_STRING_BYTES &&
         tm_proto_valid_name(name, name_len, 0) &&
         !tm_proto_reserved_label(name, name_len) &&
         tm_proto_valid_utf8(value, value_len);
}

/* ---- 1.2 field rules ---------------------------------------------------
 * 1 when s[0, len) is in label-value syntax: 1 to TM_MAX_LABEL_VALUE_BYTES
 * bytes of well-formed UTF-8 with no control character (U+0000..U+001F,
 * U+007F, U+0080..U+009F). O(len). */
static inline int tm_proto_valid_label_value(const char* s, size_t len) {
  size_t i;
  if (len == 0 || len > TM_MAX_LABEL_VALUE_BYTES) return 0;
  for (i = 0; i < len; ++i) {
    const unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f) return 0;
    /* U+0080..U+009F are encoded C2 80 .. C2 9F. */
    if (c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] < 0xa0) return 0;
  }
  return tm_proto_valid_utf8(s, len);
}

/* 1 when c is a lowercase hex digit. */
static inline int tm_proto_lower_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* 1 when s[0, len) is a W3C traceparent of version 00:
 * "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>", 55 bytes,
 * lowercase hex, neither id all zeros. O(1). */
static inline int tm_proto_valid_traceparent(const char* s, size_t len) {
  size_t i;
  int trace_nonzero = 0, parent_nonzero = 0;
  if (len != TM_TRACEPARENT_BYTES || s[0] != '0' || s[1] != '0' ||
      s[2] != '-' || s[35] != '-' || s[52] != '-') {
    return 0;
  }
  for (i = 3; i < 55; ++i) {
    if (i == 35 || i == 52) continue;
    if (!tm_proto_lower_hex(s[i])) return 0;
    if (s[i] != '0') {
      if (i < 35) {
        trace_nonzero = 1;
      } else if (i < 52) {
        parent_nonzero = 1;
      }
    }
  }
  return trace_nonzero && parent_nonzero;
}

/* 1 when the sampled flag of a valid traceparent is set. */
static inline int tm_proto_traceparent_sampled(const char* s) {
  const char c = s[54];
  const int low = c >= 'a' ? c - 'a' + 10 : c - '0';
  return low & 1;
}

/* 1 when s[0, len) is a W3C tracestate: at most TM_MAX_TRACESTATE_BYTES
 * bytes and TM_MAX_TRACESTATE_MEMBERS list members separated by ',', each
 * empty (spaces and tabs only) or `key=value` with optional spaces or tabs
 * around it; key W3C Trace Context's: [a-z][a-z0-9_*\/-]* (simple-key), or
 * tenant@system with tenant [a-z0-9][a-z0-9_*\/-]* of at most 241 bytes and
 * system [a-z][a-z0-9_*\/-]* of at most 14 (multi-tenant-key); value 1 to
 * 256 printable ASCII characters other than ',' and '=', not ending in a
 * space. O(len). */
static inline int tm_proto_valid_tracestate(const char* s, size_t len) {
  size_t i = 0, members = 0;
  if (len > TM_MAX_TRACESTATE_BYTES) return 0;
  while (i <= len) {
    size_t end = i, b, e, eq;
    size_t at = 0; /* the '@' of a tenant@system key; 0: none */
    while (end < len && s[end] != ',') ++end;
    b = i;
    e = end;
    while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
    if (b < e) {
      if (++members > TM_MAX_TRACESTATE_MEMBERS) return 0;
      for (eq = b; eq < e && s[eq] != '='; ++eq) {
        const char c = s[eq];
        if (c == '@') {
          if (at != 0 || eq == b) return 0;
          at = eq;
          continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              (eq > b && (c == '_' || c == '-' || c == '*' || c == '/')))) {
          return 0;
        }
      }
      if (eq == b || eq == e || eq + 1 == e) return 0;
      if (at == 0) {
        /* simple-key: a lowercase letter first */
        if (s[b] < 'a' || s[b] > 'z') return 0;
      } else if (at - b > 241 || eq - at - 1 < 1 || eq - at - 1 > 14 ||
                 s[at + 1] < 'a' || s[at + 1] > 'z') {
        /* tenant-id 1..241 (its first character checked above), system-id
         * 1..14 with a lowercase letter first */
        return 0;
      }
      for (eq = eq + 1; eq < e; ++eq) {
        const char c = s[eq];
        if (c < 0x20 || c > 0x7e || c == ',' || c == '=') return 0;
      }
    } else {
      /* An empty member; its span holds only OWS (checked above). */
    }
    if (end == len) break;
    i = end + 1;
  }
  for (i = 0; i < len; ++i) {
    if ((unsigned char)s[i] < 0x20 && s[i] != '\t') return 0;
    if ((unsigned char)s[i] > 0x7e) return 0;
  }
  return 1;
}

#endif /* TOKENMETER_PROTOCOL_H_ */
