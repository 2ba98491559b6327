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
 * and params, every STEP count and spec_accepted_per_pos entry): no engine
 * produces more in one event, so a larger value is a bad event, not data
 * (it would wrap the daemon's counters). */
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

/* ---- HELLO rules --------------------------------------------------------
 * Label names the daemon sets itself on some series; a HELLO label may not
 * use them, nor any name starting with TM_RESERVED_LABEL_PREFIX. */
#define TM_RESERVED_LABEL_PREFIX "__"
#define TM_RESERVED_LABEL_NAMES                                              \
  "model_name", "engine", "engine_family", "finished_reason", "position",    \
      "le", "quantile", "interval", "reason", "kind", /* 1.1: */ "max_lora", \
      "running_lora_adapters", "waiting_lora_adapters", "cache_source",      \
      "layer", "expert"
#define TM_NUM_RESERVED_LABELS 16

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

#endif /* TOKENMETER_PROTOCOL_H_ */
