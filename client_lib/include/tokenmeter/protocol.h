/*
 * tokenmeter ingest protocol, version 1: the wire constants shared by the
 * client library and the daemon. docs/protocol.md describes the bytes; this
 * header only names the numbers and strings in it. C99 and C++ clean; no
 * functions, no state.
 */
#ifndef TOKENMETER_PROTOCOL_H_
#define TOKENMETER_PROTOCOL_H_

/* Protocol version carried in HELLO's `proto` key. */
#define TM_PROTO_VERSION 1

/* Default ingest socket path (a systemd socket unit creates it). */
#define TM_DEFAULT_SOCKET_PATH "/run/tokenmeter/ingest.sock"

/* Frame types: the first element of every top-level msgpack array. */
#define TM_FRAME_HELLO 0   /* [0, meta] */
#define TM_FRAME_BATCH 1   /* [1, seq, dropped_total, [event, ...]] */
#define TM_FRAME_GOODBYE 2 /* [2] */

/* Event kinds: the first element of every event array. */
#define TM_EV_ARRIVED 1   /* [1, t, rid, prompt_tokens(, params)] */
#define TM_EV_QUEUED 2    /* [2, t, rid] */
#define TM_EV_SCHEDULED 3 /* [3, t, rid] */
#define TM_EV_TOKENS 4    /* [4, t, rid, n] */
#define TM_EV_FINISHED 5  /* [5, t, rid, reason] */
#define TM_EV_PREEMPTED 6 /* [6, t, rid] */
#define TM_EV_STEP 7      /* [7, t, stats] */

/* Default limits (the daemon may be configured to raise or lower them). */
#define TM_MAX_FRAME_BYTES (1024u * 1024u)
#define TM_MAX_BATCH_EVENTS 65536u
#define TM_MAX_STRING_BYTES 256u
#define TM_MAX_RID_BYTES 128u
#define TM_MAX_HELLO_LABELS 8u

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

/* ARRIVED params keys. */
#define TM_PARAM_MAX_TOKENS "max_tokens"
#define TM_PARAM_N "n"

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

#endif /* TOKENMETER_PROTOCOL_H_ */
