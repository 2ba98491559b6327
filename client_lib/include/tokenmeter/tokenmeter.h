/*
 * libtokenmeter: report LLM request events to tokenmeterd.
 *
 * C ABI, C99-clean. Handles are opaque; no struct layout is part of the ABI.
 *
 * Model. An engine creates one tm_client per process (or per engine
 * instance). Each event call stamps the event (CLOCK_MONOTONIC nanoseconds;
 * pass t_ns = 0 for "now") and appends it to the calling thread's own
 * preallocated buffer: no lock, no system call, no allocation. A background
 * thread owned by the client drains those buffers every flush interval
 * (default 20 ms, sooner when a batch fills), encodes msgpack BATCH frames
 * (docs/protocol.md) and writes them to the daemon's Unix socket.
 *
 * The daemon may be absent, slow or restarting. The background thread
 * connects without involving the callers, reconnects with capped backoff
 * (10 ms doubling to 1 s), and sends HELLO again on every new connection.
 * While it cannot send, events stay in the per-thread buffers; when a
 * thread's buffer is full, that thread's new events are dropped and counted.
 * The library never raises SIGPIPE, never writes to stdout/stderr, never
 * throws, and never blocks a caller of an event function.
 *
 * Threads. Event functions may be called from any number of threads at
 * once. The first event call a thread makes on a client allocates and
 * pre-faults that thread's buffer (buffer capacity x 32 bytes; 2 MiB by
 * default); tm_thread_attach() does that ahead of time so that no event call
 * ever allocates. A thread's buffer is recycled after the thread exits and
 * its events are sent. At most `max_threads` threads (default 64) may
 * report at once; events from further threads are dropped and counted.
 *
 * Costs (docs/performance.md has the measured figures and the command):
 * an event call with a caller-supplied timestamp is a few stores into a
 * cache-hot buffer (about 8-10 ns measured); with t_ns = 0 add one
 * clock_gettime through the vDSO (16 to 30 ns depending on the machine:
 * 28 ns on the KVM guest of docs/performance.md).
 *
 * Return values. Every int-returning function returns TM_OK (0) or a
 * negative TM_E_* code (tm_register_value(): a positive id in place of
 * TM_OK); tm_strerror() names it. Event functions return
 * TM_E_INVALID for bad arguments (the event is not sent and is counted as
 * rejected) and TM_E_DROPPED when the buffer was full (counted as dropped).
 * Engines normally ignore the result: the counts reach the daemon in every
 * BATCH's dropped_total and are readable through tm_client_stats().
 * On a closed client they return TM_E_CLOSED, in the child of a fork()
 * TM_E_FORKED (both: the event is not sent and is counted as rejected; see
 * tm_client_close() and "fork()" below). The arguments are checked first:
 * bad ones are TM_E_INVALID on a closed client too (counted as rejected
 * alike).
 *
 * fork(). A client belongs to the process that created it. In the child of
 * a fork() an inherited client is inert (a pthread_atfork handler marks it
 * so, in the child only): its sender thread did not come along, its socket
 * is the parent's connection, and its buffers hold copies of events the
 * parent sends. So in the child every event call on it returns TM_E_FORKED
 * and counts the event as rejected (TM_STAT_EVENTS_REJECTED: what the child
 * discarded), tm_client_flush() and tm_thread_attach() return TM_E_FORKED,
 * tm_client_stats() works (the counters as inherited, plus the child's
 * rejections), and tm_client_close() returns TM_E_FORKED, sending nothing
 * and freeing nothing (the pages stay shared with the parent copy-on-write;
 * the handle becomes a tombstone as after any close). The child closes its
 * copies of the client's two descriptors at fork time, so the parent's
 * connection ends when the parent's does. The events buffered at fork time
 * are the parent's: its client sends them once; the child's copies are
 * never sent and not counted again. A child that reports creates its own
 * client (tm_client_new() works in the child). Restarting the inherited
 * client in the child instead was not chosen: it would need a thread made
 * inside the atfork handler or on an event call, and a fresh connection
 * from each prefork worker that never reports. The parent's client is
 * unaffected by the fork.
 */
#ifndef TOKENMETER_TOKENMETER_H_
#define TOKENMETER_TOKENMETER_H_

#include <stddef.h>
#include <stdint.h>

#include "tokenmeter/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TM_API __attribute__((visibility("default")))
#else
#define TM_API
#endif

/* ---- status codes ------------------------------------------------------ */

#define TM_OK 0
#define TM_E_INVALID (-1)      /* bad argument; nothing was done */
#define TM_E_DROPPED (-2)      /* buffer full or too many threads; counted */
#define TM_E_NOMEM (-3)        /* an allocation failed */
#define TM_E_TIMEOUT (-4)      /* the wait ran out before the work was done */
#define TM_E_DISCONNECTED (-5) /* the daemon is away; events stay buffered */
#define TM_E_SYSTEM (-6)       /* the OS refused (e.g. thread creation) */
#define TM_E_CLOSED (-7)       /* the client was closed; nothing was done */
#define TM_E_FORKED (-8)       /* the client was inherited through fork() */

/* Static English text for a status code; never NULL. Any thread. */
TM_API const char* tm_strerror(int status);

/* The library's version, e.g. "0.1.0". */
TM_API const char* tm_version(void);

/* CLOCK_MONOTONIC now, in nanoseconds: the clock every event uses. */
TM_API uint64_t tm_now_ns(void);

/* ---- options ----------------------------------------------------------- */

typedef struct tm_options tm_options;

/* A fresh options object with the defaults below; NULL when out of memory.
 * Free with tm_options_free(). Options objects are not thread-safe. */
TM_API tm_options* tm_options_new(void);
TM_API void tm_options_free(tm_options* opts); /* NULL is a no-op */

/* Every setter copies its arguments and returns TM_OK, or TM_E_INVALID
 * (leaving the option unchanged) for NULL or a value outside the rules.
 * Strings are NUL-terminated, well-formed UTF-8 (checked: bytes that are
 * not are TM_E_INVALID, as the daemon would refuse them), at most
 * TM_MAX_STRING_BYTES bytes. O(length); any thread, one options object at a
 * time. */

/* Daemon socket. Default TM_DEFAULT_SOCKET_PATH. Must fit sun_path
 * (107 bytes). */
TM_API int tm_options_set_socket_path(tm_options* opts, const char* path);
/* Engine family, e.g. "vllm"; names the metric namespace. Must match
 * [a-zA-Z_][a-zA-Z0-9_-]*. Default "tokenmeter-engine". */
TM_API int tm_options_set_engine(tm_options* opts, const char* engine);
/* Served model name (the model_name label). Required, non-empty. */
TM_API int tm_options_set_model(tm_options* opts, const char* model);
/* This engine instance (the `engine` label), e.g. "dp0". Default: not sent,
 * which the daemon reads as "0". */
TM_API int tm_options_set_instance(tm_options* opts, const char* instance);
/* Request-id space shared with other connections of the same engine, model
 * and scope (a frontend and an engine-core process). Default: private. */
TM_API int tm_options_set_scope(tm_options* opts, const char* scope);
/* Adds a constant label. At most TM_MAX_HELLO_LABELS; names match
 * [a-zA-Z_][a-zA-Z0-9_]*, must not start with "__", must not repeat a label
 * already added nor one the daemon sets (TM_RESERVED_LABEL_NAMES in
 * protocol.h: model_name, engine, engine_family, finished_reason, position,
 * le, quantile, interval, reason, kind), nor a cache_config key already
 * added (both would be labels of <ns>:cache_config_info; the daemon refuses
 * such a HELLO as reserved_label). Exactly the labels the daemon accepts
 * pass: tm_proto_valid_label() is the check both sides apply. */
TM_API int tm_options_add_label(tm_options* opts, const char* name,
                                const char* value);
/* HELLO keys of protocol 1.1 (docs/protocol.md; a 1.0 daemon ignores
 * them). Same rules as the setters above: copied, TM_OK or TM_E_INVALID
 * (leaving the options unchanged). */

/* The naming profile of this client's series: TM_PROFILE_VLLM ("vllm"),
 * TM_PROFILE_SGLANG ("sglang") or TM_PROFILE_LMDEPLOY ("lmdeploy"); any
 * other string is TM_E_INVALID. Default: not sent (the daemon decides from
 * its --profile and the engine name). */
TM_API int tm_options_set_profile(tm_options* opts, const char* profile);
/* Adds an entry to HELLO's cache_config map (the engine's KV-cache
 * configuration, e.g. block_size 16, num_gpu_blocks 8192; each becomes a
 * label of <ns>:cache_config_info). Sent in the order added. At most
 * TM_MAX_CACHE_CONFIG (32) entries; keys follow the HELLO label rules
 * (tm_proto_valid_label(): [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__",
 * none of TM_RESERVED_LABEL_NAMES) and must not repeat an entry already
 * added, of any type, nor the name of a label added with
 * tm_options_add_label(). Values: a string (well-formed UTF-8, at most
 * TM_MAX_STRING_BYTES), an int64 (sent as a msgpack int), a finite double
 * (float64; NaN and infinities are TM_E_INVALID), a bool (0 false, anything
 * else true). */
TM_API int tm_options_add_cache_config_str(tm_options* opts, const char* key,
                                           const char* value);
TM_API int tm_options_add_cache_config_int(tm_options* opts, const char* key,
                                           int64_t value);
TM_API int tm_options_add_cache_config_float(tm_options* opts, const char* key,
                                             double value);
TM_API int tm_options_add_cache_config_bool(tm_options* opts, const char* key,
                                            int value);
/* HELLO max_lora: the most LoRA adapters the engine serves at once (the
 * max_lora label of <ns>:lora_requests_info). >= 0; default: not sent. */
TM_API int tm_options_set_max_lora(tm_options* opts, int64_t max_lora);

/* Events each thread's buffer holds while the daemon is slow or away. The
 * buffer is capacity x 32 bytes; an event takes 24 to 40 bytes with an
 * integer request id (a string id: its length rounded up to 8 bytes instead
 * of 8), a STEP 16 bytes plus 8 per key and per position, a tm_arrived_ex()
 * with a lora or labels 8 bytes more plus 8 per label plus the bytes of the
 * lora and of every label name and value, rounded up to 8 in all (at most
 * 1,856 bytes; a tm_arrived_params() with the 1.2 params the same plus the
 * traceparent's and tracestate's bytes, at most 2,168 bytes), a
 * tm_expert_load() 16 bytes plus 8 per expert (at most 8,208 bytes); the
 * 1.2 and 1.3 events as their calls say (at most 296 bytes; a
 * tm_latencies() at most 8,232). 1024 .. 16 Mi,
 * rounded up to a power of two. Default 65536. */
TM_API int tm_options_set_buffer_capacity(tm_options* opts, size_t events);
/* How often the sender drains the buffers when they are not filling up.
 * 1 .. 10000 ms. Default 20. */
TM_API int tm_options_set_flush_interval_ms(tm_options* opts, uint32_t ms);
/* How long tm_client_close() waits for buffered events to be sent.
 * 0 .. 600000 ms. Default 1000. */
TM_API int tm_options_set_close_timeout_ms(tm_options* opts, uint32_t ms);
/* Most threads reporting at once. 1 .. 4096. Default 64. */
TM_API int tm_options_set_max_threads(tm_options* opts, uint32_t n);
/* Acknowledged delivery (protocol 1.1, docs/protocol.md "Frame type 3:
 * ACK"): nonzero on (the default), 0 off. On, HELLO carries `ack: true`
 * and the sender keeps every batch it wrote, in a replay buffer of
 * tm_options_set_replay_bytes() bytes, until the daemon acks it; after a
 * reconnect it sends the batches not yet acked again, in order, with their
 * original seq (a daemon skips those it already applied), then new ones;
 * tm_client_close() also waits for the ACKs. Past the bound the oldest
 * batches are dropped from the buffer and their events counted as dropped
 * (TM_STAT_EVENTS_DROPPED and dropped_total; they were sent once, so they
 * are also in TM_STAT_EVENTS_SENT).
 *
 * Which daemon acks is learnt on each connection (protocol 1.2, "ACK at
 * HELLO"): a daemon that acks answers HELLO at once with the highest seq it
 * applied of this client's session. The sender replays only after that
 * answer, and only the batches above it; until then it writes new batches
 * only while nothing is waiting to be replayed and the replay buffer keeps
 * them without dropping one. With no answer within 1 s (a daemon of
 * protocol 1.0, or 1.1 before this rule, ignores `ack`) it replays nothing,
 * keeps nothing for replay on that connection, and counts the events it
 * discarded from the buffer in TM_STAT_EVENTS_DISCARDED (written once, not
 * dropped): so a client never sends a batch twice to a daemon that would
 * apply it twice. Against such a daemon, delivery is that of ack off, after
 * a wait of up to 1 s per connection when batches were kept.
 *
 * Off, a client writes each batch once (as protocol 1.0), and any byte the
 * daemon sends makes it close the connection and reconnect with backoff.
 * Either way HELLO carries `session`, a random number picked once per
 * client. The event calls cost the same either way: only the sender thread
 * does the work. Always TM_OK for a non-NULL `opts`. */
TM_API int tm_options_set_ack(tm_options* opts, int on);
/* The replay buffer's size in bytes (ack on): TM_MIN_REPLAY_BYTES (512 KiB,
 * two of the largest batches) .. TM_MAX_REPLAY_BYTES (1 GiB). Default
 * TM_DEFAULT_REPLAY_BYTES (4 MiB). tm_client_new() reserves it at once (no
 * allocation later); its pages become resident as batches are kept, up to
 * the whole size when the daemon is slow to ack. A batch takes its encoded
 * events plus 16 bytes, rounded up to 8. Not reserved with ack off. */
TM_API int tm_options_set_replay_bytes(tm_options* opts, size_t bytes);
#define TM_MIN_REPLAY_BYTES ((size_t)512 * 1024)
#define TM_MAX_REPLAY_BYTES ((size_t)1 << 30)
#define TM_DEFAULT_REPLAY_BYTES ((size_t)4 << 20)

/* ---- client ------------------------------------------------------------ */

typedef struct tm_client tm_client;

/* Creates a client and starts its sender thread, which connects in the
 * background: a missing daemon is not an error. `opts` is copied and may be
 * freed afterwards. Returns TM_OK and sets *out, or TM_E_INVALID (NULL
 * argument, no model set), TM_E_NOMEM, TM_E_SYSTEM (thread creation). */
TM_API int tm_client_new(const tm_options* opts, tm_client** out);

/* Stops the client: waits up to the close timeout for every buffered event
 * to be written to the daemon and (ack on, tm_options_set_ack()) for the
 * daemon's ACK of every batch written, sends GOODBYE, closes the socket,
 * joins the sender thread and frees the buffers, the thread and the
 * socket. Events still unsent when the wait ends are counted as dropped;
 * events written but not yet acked then, as TM_STAT_EVENTS_UNACKED. If
 * `stats_out` is not NULL, the final counters are written there as by
 * tm_client_stats(). NULL client is a no-op (TM_OK). Returns TM_OK when
 * nothing was dropped nor left unacked at close, else TM_E_TIMEOUT; TM_E_CLOSED
 * (doing nothing but the stats) when the client was already closed or another
 * thread is closing it; TM_E_FORKED in the child of a fork() (see "fork()"
 * above).
 *
 * Calls racing the close, and calls after it, are safe. The handle itself
 * is never freed: it stays valid as a tombstone (about 1.3 KiB, holding
 * the final counters) until the process exits, so a tm_client* the
 * application still holds keeps working, and a process that creates and
 * closes clients in a loop keeps that much per client closed. On a closed
 * handle event calls return TM_E_CLOSED and count the event as rejected,
 * tm_client_flush() and tm_thread_attach() return TM_E_CLOSED, and
 * tm_client_stats() returns the final counters (plus those rejections).
 * An event call that overlaps the close either is sent like any event
 * before it (counted as sent, or as dropped if the close timeout runs out)
 * or returns TM_E_CLOSED; never both, never neither. A tm_client_flush()
 * overlapping it returns once the close has sent what it could (TM_OK,
 * TM_E_TIMEOUT or TM_E_DISCONNECTED), or at once with TM_E_CLOSED. Cost
 * beyond the sending: the close makes every thread of the process pass a
 * memory barrier once (membarrier(2), microseconds; it is what keeps the
 * event calls free of fences), then waits (yielding) for the event calls
 * and attaches already inside the client to leave it (each is a few
 * stores; an attach may allocate its buffer), and before freeing, for the
 * flush and stats calls in progress. Any thread. */
TM_API int tm_client_close(tm_client* client, uint64_t* stats_out,
                           size_t n_stats);

/* Waits until every event appended (by any thread) before the call has been
 * written to the socket. Returns TM_OK; TM_E_DISCONNECTED at once when the
 * daemon is away (events stay buffered); TM_E_TIMEOUT when timeout_ms ran
 * out first; TM_E_CLOSED / TM_E_FORKED (see tm_client_close()). Blocks
 * the caller: not for hot paths. Any thread. */
TM_API int tm_client_flush(tm_client* client, uint32_t timeout_ms);

/* Allocates and pre-faults the calling thread's buffer now so that no later
 * event call from this thread allocates. TM_OK, TM_E_DROPPED (max_threads
 * reached, or no memory), TM_E_CLOSED or TM_E_FORKED. Optional. */
TM_API int tm_thread_attach(tm_client* client);

/* Counters, indexes into the array tm_client_stats() fills. */
typedef enum tm_stat {
  TM_STAT_EVENTS_SENT = 0,       /* events written to the socket (once each,
                                    when first written: not on a replay) */
  TM_STAT_EVENTS_DROPPED = 1,    /* buffer full, no thread slot, or unsent
                                    when close gave up */
  TM_STAT_EVENTS_REJECTED = 2,   /* invalid arguments (e.g. id > 128 bytes) */
  TM_STAT_RECONNECTS = 3,        /* connections made after the first one */
  TM_STAT_BATCHES_SENT = 4,      /* BATCH frames written */
  TM_STAT_BYTES_SENT = 5,        /* bytes written, all frames */
  TM_STAT_CONNECTED = 6,         /* 1 while connected, else 0 */
  TM_STAT_CONNECT_FAILURES = 7,  /* connection attempts that failed */
  TM_STAT_BATCHES_REPLAYED = 8,  /* BATCH frames written again after a
                                    reconnect (ack on; not in BATCHES_SENT) */
  TM_STAT_EVENTS_UNACKED = 9,    /* written but not acked when close gave up
                                    waiting (ack on): delivered, maybe not
                                    durable; not counted as dropped */
  TM_STAT_EVENTS_DISCARDED = 10, /* written, kept for replay, and discarded
                                    unacked because the daemon did not
                                    answer HELLO's ack within 1 s (ack on;
                                    a daemon that does not ack): delivered
                                    at most once; not counted as dropped */
  TM_STAT_FIELDS_DROPPED = 11,   /* trace strings tm_arrived_params() left
                                    out for breaking their rule, of events
                                    appended without them (TM_OK); an event
                                    refused or dropped counts as that only */
  TM_STAT_COUNT = 12
} tm_stat;

/* Copies min(n, TM_STAT_COUNT) counters into out[] (indexed by tm_stat).
 * Each counter is read atomically; together they are not one snapshot.
 * Lock-free; any thread; also on a closed client (its final counters).
 * Returns TM_OK or TM_E_INVALID. */
TM_API int tm_client_stats(const tm_client* client, uint64_t* out, size_t n);

/* ---- events ------------------------------------------------------------ */
/*
 * Every event function: `t_ns` is CLOCK_MONOTONIC nanoseconds, 0 = now.
 * Request ids are a uint64 (`rid`) or a byte string (`rid`, `rid_len`,
 * 1..TM_MAX_RID_BYTES bytes, need not be NUL-terminated; longer or empty is
 * rejected). A request must use the same id form in all its events. Wait-free:
 * no lock, no system call (except clock_gettime for t_ns = 0), no allocation
 * (after the thread's first call, see above). Returns TM_OK, TM_E_INVALID
 * (rejected, counted), TM_E_DROPPED (buffer full, counted), or TM_E_CLOSED /
 * TM_E_FORKED (closed or inherited client; counted as rejected).
 */

/* The request entered the server. `max_tokens` and `n` are the request's
 * sampling parameters; 0 means "not given" and omits them. */
TM_API int tm_arrived(tm_client* client, uint64_t t_ns, uint64_t rid,
                      uint32_t prompt_tokens, uint32_t max_tokens, uint32_t n);
TM_API int tm_arrived_str(tm_client* client, uint64_t t_ns, const char* rid,
                          size_t rid_len, uint32_t prompt_tokens,
                          uint32_t max_tokens, uint32_t n);
/* ARRIVED with the protocol 1.1 params (a 1.0 daemon ignores them):
 * `lora` the LoRA adapter serving the request, NULL for none, else a
 * NUL-terminated string of 1 .. TM_MAX_LORA_BYTES (128) bytes of
 * well-formed UTF-8; `labels` the request's labels (only those the daemon
 * enables with --request-label are used), n_labels <= TM_MAX_REQUEST_LABELS
 * (4) entries, `labels` may be NULL when n_labels is 0. Each name follows
 * the HELLO label rules (tm_proto_valid_label(): [a-zA-Z_][a-zA-Z0-9_]*, at
 * most TM_MAX_STRING_BYTES, not starting with "__", none of
 * TM_RESERVED_LABEL_NAMES) and appears once in the call; each value is a
 * NUL-terminated string of 0 .. TM_MAX_REQUEST_LABEL_VALUE_BYTES (128)
 * bytes of well-formed UTF-8. Anything else is TM_E_INVALID: counted as
 * rejected, nothing appended. The strings are copied into the buffer and
 * may be reused once the call returns. On the wire the params map holds
 * max_tokens and n (when nonzero), lora (when given) and labels (a map,
 * when n_labels > 0); with neither lora nor labels the event is exactly
 * tm_arrived()'s / tm_arrived_str()'s. Cost: tm_arrived()'s plus checking
 * and copying the strings (bounded: no scan goes past a limit); buffer
 * space as tm_options_set_buffer_capacity() says. Wait-free, any thread,
 * the same rules and results as the other event calls. */
typedef struct tm_label {
  const char* name;
  const char* value;
} tm_label;
TM_API int tm_arrived_ex(tm_client* client, uint64_t t_ns, uint64_t rid,
                         uint32_t prompt_tokens, uint32_t max_tokens,
                         uint32_t n, const char* lora, const tm_label* labels,
                         size_t n_labels);
TM_API int tm_arrived_ex_str(tm_client* client, uint64_t t_ns, const char* rid,
                             size_t rid_len, uint32_t prompt_tokens,
                             uint32_t max_tokens, uint32_t n, const char* lora,
                             const tm_label* labels, size_t n_labels);
/* The same event stamped now, without `n`, with both token counts in one
 * argument: `tokens` = prompt_tokens | (uint64_t)max_tokens << 32. Equal to
 * tm_arrived(client, 0, rid, (uint32_t)tokens, (uint32_t)(tokens >> 32), 0).
 * For bindings that pay per argument (Python's ctypes converts each one for
 * 40 to 90 ns; the tokenmeter package uses these for arrived()'s common
 * form); C and C++ callers gain nothing from them. */
TM_API int tm_arrived_packed(tm_client* client, uint64_t rid, uint64_t tokens);
TM_API int tm_arrived_packed_str(tm_client* client, const char* rid,
                                 size_t rid_len, uint64_t tokens);

/* ARRIVED with the protocol 1.2 params (protocol.md "Additions in 1.2"; a
 * 1.1 daemon ignores the new keys) in one struct, so that later params can
 * be added without another call. Initialize it with TM_REQUEST_PARAMS_INIT
 * (which sets `size`; every param "not given"), then set what the request
 * has:
 *
 *   tm_request_params p = TM_REQUEST_PARAMS_INIT;
 *   p.max_tokens = 256;
 *   p.has_priority = 1;
 *   p.priority = -5;
 *   p.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
 *   tm_arrived_params(client, 0, rid, 812, &p);
 *
 * `size` is sizeof(tm_request_params) as the caller was compiled: at least
 * the size of this (1.2) layout, else TM_E_INVALID; fields a newer header
 * appends past it are not read by this library (not sent). `max_tokens`,
 * `n`: as tm_arrived(), 0 means not given. `lora`, `labels`, `n_labels`:
 * the rules of tm_arrived_ex(). `priority` (TM_MIN_PRIORITY ..
 * TM_MAX_PRIORITY, every int32_t; lower runs first, as vLLM's priority
 * scheduling) is sent only when `has_priority` is nonzero. `traceparent`:
 * NULL for none, else a NUL-terminated W3C traceparent of version 00 that
 * tm_proto_valid_traceparent() accepts (exactly TM_TRACEPARENT_BYTES, 55,
 * bytes of lowercase hex and dashes, neither id all zeros). `tracestate`:
 * NULL for none, else a NUL-terminated W3C tracestate that
 * tm_proto_valid_tracestate() accepts (at most TM_MAX_TRACESTATE_BYTES,
 * 256, bytes and TM_MAX_TRACESTATE_MEMBERS list members; "" is one, and
 * sent). These are the checks the daemon applies (protocol.h), so what the
 * library sends the daemon keeps. The trace strings come from the caller's
 * HTTP headers, so one that breaks its rule does not cost the request its
 * ARRIVED: as W3C has a receiver do, it is left out (a malformed
 * traceparent with its tracestate), counted once each in
 * TM_STAT_FIELDS_DROPPED, and the event is sent without it (TM_OK). NULL
 * `p`, a short `size` or any other param breaking its rule is
 * TM_E_INVALID: counted as rejected, nothing appended. The strings are
 * copied into the buffer and may be reused once the call returns.
 *
 * Wire form: [1, t, rid, prompt_tokens, params], the params map holding, in
 * this order, max_tokens and n (when nonzero), lora, labels (a map),
 * priority (a msgpack int in its smallest encoding, negative ones as
 * negative fixint / int8 .. int32), traceparent and tracestate (strs), each
 * only when given; with nothing given the event is [1, t, rid,
 * prompt_tokens]. With none of the 1.2 params (priority, traceparent,
 * tracestate) the bytes are exactly tm_arrived_ex()'s. Buffer space:
 * tm_arrived_ex()'s, plus 8 bytes when any 1.2 param is given without a
 * lora or labels (the word that holds their lengths and the priority),
 * plus the bytes of the trace strings (tm_options_set_buffer_capacity()). Cost:
 * tm_arrived_ex()'s plus one bounded pass over each trace string (a traceparent
 * is 55 bytes, a tracestate at most 256) and its copy. Wait-free, any thread,
 * the same rules and results as the other event calls. */
typedef struct tm_request_params {
  size_t size;            /* sizeof(tm_request_params); set by
                             TM_REQUEST_PARAMS_INIT (lets the struct grow) */
  uint32_t max_tokens;    /* 0: not given */
  uint32_t n;             /* 0: not given */
  const char* lora;       /* NULL: none (rules of tm_arrived_ex) */
  const tm_label* labels; /* rules of tm_arrived_ex; NULL when n_labels 0 */
  size_t n_labels;
  int has_priority;        /* nonzero: `priority` is sent */
  int32_t priority;        /* TM_MIN_PRIORITY .. TM_MAX_PRIORITY */
  const char* traceparent; /* NULL: none; tm_proto_valid_traceparent() */
  const char* tracestate;  /* NULL: none; tm_proto_valid_tracestate() */
} tm_request_params;
#define TM_REQUEST_PARAMS_INIT \
  { sizeof(tm_request_params), 0, 0, NULL, NULL, 0, 0, 0, NULL, NULL }
TM_API int tm_arrived_params(tm_client* client, uint64_t t_ns, uint64_t rid,
                             uint32_t prompt_tokens,
                             const tm_request_params* p);
TM_API int tm_arrived_params_str(tm_client* client, uint64_t t_ns,
                                 const char* rid, size_t rid_len,
                                 uint32_t prompt_tokens,
                                 const tm_request_params* p);

/* The request entered the engine core's waiting queue (optional). */
TM_API int tm_queued(tm_client* client, uint64_t t_ns, uint64_t rid);
TM_API int tm_queued_str(tm_client* client, uint64_t t_ns, const char* rid,
                         size_t rid_len);

/* The request was scheduled for execution (the first time counts). */
TM_API int tm_scheduled(tm_client* client, uint64_t t_ns, uint64_t rid);
TM_API int tm_scheduled_str(tm_client* client, uint64_t t_ns, const char* rid,
                            size_t rid_len);
/* The first SCHEDULED with where the request's prompt tokens came from
 * (protocol 1.2, [3, t, rid, {"cached_tokens": c, "external_tokens": e}],
 * both keys always; a 1.1 daemon ignores the map): `cached_tokens` were
 * found in the local prefix cache, `external_tokens` received from another
 * instance or an external KV store instead of computed; the rest of the
 * prompt was computed. The daemon reads the map only on a request's first
 * SCHEDULED, and drops it (bad_field) when cached + external exceed the
 * request's prompt tokens, which the library does not know: the caller
 * keeps that sum within the ARRIVED prompt_tokens. Any uint32_t values are
 * valid here; the request id follows the rules above. Buffer space and
 * cost: tm_scheduled()'s plus one word (8 bytes) and one store. Wait-free,
 * any thread, the same rules and results as the other event calls. */
TM_API int tm_scheduled_ex(tm_client* client, uint64_t t_ns, uint64_t rid,
                           uint32_t cached_tokens, uint32_t external_tokens);
TM_API int tm_scheduled_ex_str(tm_client* client, uint64_t t_ns,
                               const char* rid, size_t rid_len,
                               uint32_t cached_tokens,
                               uint32_t external_tokens);

/* `n` >= 1 output tokens were produced for the request in one step. */
TM_API int tm_tokens(tm_client* client, uint64_t t_ns, uint64_t rid,
                     uint32_t n);
TM_API int tm_tokens_str(tm_client* client, uint64_t t_ns, const char* rid,
                         size_t rid_len, uint32_t n);

/* One engine step's output tokens in one call: for each i < count, the
 * event tm_tokens(client, t_ns, rids[i], n[i]) would append, all with one
 * timestamp (t_ns = 0 reads the clock once). `n` NULL means 1 token each. An
 * entry with n[i] == 0 is skipped (no event, not an error), so an engine may
 * pass every request of the step, with 0 for a prefill chunk that sampled
 * nothing. For bindings whose per-call overhead dwarfs an event (Python's
 * ctypes: 0.3 to 1 us a call) this is the hot path: one call per step.
 *
 * Cost: about 3 ns per event (the single calls' stores; one clock read per
 * call). Wait-free, any thread, same rules as the single calls.
 * Returns the number of events appended (0 .. count; count 0 is fine).
 * When the buffer fills, each event that does not fit is dropped and
 * counted, the others are appended. Returns TM_E_INVALID, appending
 * nothing, for a NULL client (nothing counted), or NULL `rids` with
 * count > 0, or count > TM_MAX_BATCH_EVENTS (65536): then `count` events
 * are counted as rejected. On a closed or inherited client returns
 * TM_E_CLOSED / TM_E_FORKED, its events counted as rejected. */
TM_API int tm_tokens_batch(tm_client* client, uint64_t t_ns,
                           const uint64_t* rids, const uint32_t* n,
                           size_t count);

/* The same with string ids. `ids` holds `count` ids back to back, each
 * followed by one NUL byte ("req-1\0req-2\0"), `ids_len` bytes in all: what
 * a binding gets from one join and one encode. Each id is 1 ..
 * TM_MAX_RID_BYTES bytes and cannot contain a NUL byte here (tm_tokens_str
 * takes such ids). The ids are checked before anything is appended: any
 * empty or overlong id, or `ids` not holding exactly `count` NUL-terminated
 * ids, returns TM_E_INVALID with nothing appended and `count` events
 * counted as rejected. Cost: the above plus a memchr and a copy per id. */
TM_API int tm_tokens_batch_str(tm_client* client, uint64_t t_ns,
                               const char* ids, size_t ids_len,
                               const uint32_t* n, size_t count);

typedef enum tm_finish_reason {
  TM_FINISH_STOP = 0,
  TM_FINISH_LENGTH = 1,
  TM_FINISH_ABORT = 2,
  TM_FINISH_ERROR = 3
} tm_finish_reason;

/* The request finished. Another reason value is rejected. */
TM_API int tm_finished(tm_client* client, uint64_t t_ns, uint64_t rid,
                       tm_finish_reason reason);
TM_API int tm_finished_str(tm_client* client, uint64_t t_ns, const char* rid,
                           size_t rid_len, tm_finish_reason reason);

/* The request lost its KV cache and went back to waiting. */
TM_API int tm_preempted(tm_client* client, uint64_t t_ns, uint64_t rid);
TM_API int tm_preempted_str(tm_client* client, uint64_t t_ns, const char* rid,
                            size_t rid_len);

/* STEP stats keys (docs/protocol.md names their wire strings). */
typedef enum tm_step_key {
  TM_STEP_KEY_RUNNING = 0,
  TM_STEP_KEY_WAITING = 1,
  TM_STEP_KEY_KV_USAGE = 2, /* the only fractional key, 0..1 */
  TM_STEP_KEY_PROMPT_TOKENS = 3,
  TM_STEP_KEY_GENERATION_TOKENS = 4,
  TM_STEP_KEY_PREFIX_QUERIES = 5,
  TM_STEP_KEY_PREFIX_HITS = 6,
  TM_STEP_KEY_SPEC_DRAFTS = 7,
  TM_STEP_KEY_SPEC_DRAFT_TOKENS = 8,
  TM_STEP_KEY_SPEC_ACCEPTED_TOKENS = 9,
  /* 1.2: of `waiting`, the requests waiting for something other than
   * capacity (a LoRA slot, a KV transfer in flight, a grammar compile).
   * Only with TM_STEP_KEY_WAITING in the same call and at most its value
   * (the daemon drops it otherwise): else the call is TM_E_INVALID. */
  TM_STEP_KEY_WAITING_DEFERRED = 10,
  TM_STEP_KEY_COUNT = 11
} tm_step_key;

/* Most entries of spec_accepted_per_pos one STEP may carry. */
#define TM_MAX_SPEC_POSITIONS 64u

/* One scheduler iteration. keys[i] has value values[i] (i < n_keys); each
 * key at most once. Integer keys take whole values in 0 ..
 * TM_MAX_EVENT_COUNT (2^32 - 1, protocol.h: since 1.2 the daemon drops a
 * larger one as a bad_field, 1.1 skipped the event); kv_usage a value in
 * 0..1. `accepted_per_pos` (may be NULL
 * when n_pos is 0) holds the accepted tokens per draft position, at most
 * TM_MAX_SPEC_POSITIONS entries of at most TM_MAX_EVENT_COUNT each; it is
 * sent as spec_accepted_per_pos only when n_pos > 0. waiting_deferred
 * (protocol 1.2; a 1.1 daemon ignores it) only with waiting and at most
 * waiting's value. Anything else is rejected (TM_E_INVALID, counted as
 * rejected, nothing sent). */
TM_API int tm_step(tm_client* client, uint64_t t_ns, const tm_step_key* keys,
                   const double* values, size_t n_keys,
                   const uint64_t* accepted_per_pos, size_t n_pos);

/* MoE expert load (protocol 1.1 event kind 8, [8, t, layer, counts]):
 * counts[0..n) are the tokens MoE layer `layer` routed to each expert since
 * this engine's previous tm_expert_load() for that layer. `layer` <
 * TM_MAX_MOE_LAYERS (4096); 1 <= n <= TM_MAX_MOE_EXPERTS (1024); each
 * count at most TM_MAX_EVENT_COUNT (2^32 - 1). A layer keeps the number of
 * experts its first EXPERT_LOAD on a series gave: the daemon refuses one of
 * another length as a bad event (the library does not track layers).
 * Anything else, or NULL `counts`, is TM_E_INVALID: counted as rejected,
 * nothing appended. The counts are copied into the buffer (the array may be
 * reused once the call returns) and sent as a msgpack array of uints, each
 * in its smallest encoding (1 to 5 bytes). Buffer space: 16 + 8 x n bytes
 * (2,064 for 256 experts; 8,208 for 1024, a quarter of the smallest buffer,
 * tm_options_set_buffer_capacity()). Cost: one pass to check the counts
 * and one copy, linear in n: about 150 ns for 256 experts (client_bench
 * case tm_expert_load/256/caller_ts, on a 2-core VM). Wait-free, any
 * thread, the same rules and results as the other event calls (TM_OK,
 * TM_E_INVALID, TM_E_DROPPED when the buffer is full, TM_E_CLOSED /
 * TM_E_FORKED). */
TM_API int tm_expert_load(tm_client* client, uint64_t t_ns, uint32_t layer,
                          const uint64_t* counts, size_t n);

/* ---- protocol 1.2 events ------------------------------------------------
 * Event kinds a 1.1 daemon counts as unknown_kind and skips (the rest of
 * the batch is applied). "Label-value syntax" is the rule of
 * tm_proto_valid_label_value() in protocol.h, the check the daemon applies
 * too: 1 to TM_MAX_LABEL_VALUE_BYTES (64) bytes of well-formed UTF-8
 * without control characters (U+0000..U+001F, U+007F..U+009F); such strings
 * are NUL-terminated here and copied into the buffer (they may be reused
 * once the call returns). Each call is wait-free, may be made from any
 * thread, and has the results of the other event calls: TM_OK,
 * TM_E_INVALID (a rule broken: counted as rejected, nothing appended),
 * TM_E_DROPPED (buffer full, counted), TM_E_CLOSED / TM_E_FORKED. */

/* Registered values. A reason or connector sent often can be registered
 * once, checked and copied once, and then passed by id:
 * tm_admission_rejected_id*() and tm_kv_transfer_info's reason_id /
 * connector_id take it instead of the string and cost a tm_tokens()'s (no
 * pass over a string: docs/performance.md, "Protocol 1.2 client calls").
 * The wire is the same: the sender thread writes the id's string into the
 * event, so the daemon cannot tell the two apart.
 *
 * tm_register_value() registers `value` (label-value syntax) with the
 * client and returns its id, 1 .. TM_MAX_VALUE_IDS (255); registering the
 * same string again returns the same id. An id stays valid, for this client
 * only, until tm_client_close(). Errors (nothing registered): TM_E_INVALID
 * (NULL client or value, or not label-value syntax; not counted as a
 * rejected event: no event was made), TM_E_NOMEM (TM_MAX_VALUE_IDS distinct
 * values are registered, or the copy could not be allocated), TM_E_CLOSED
 * / TM_E_FORKED. Any thread; takes a mutex, allocates and compares with
 * the values already registered (linear): call it when the engine starts,
 * not per request. Passing an id that was not returned by this client's
 * tm_register_value() (0 included, where an id is required) makes an event
 * call TM_E_INVALID, counted as rejected, nothing appended. */
#define TM_MAX_VALUE_IDS 255
TM_API int tm_register_value(tm_client* client, const char* value);

/* The server refused a request before it entered the engine (a queue cap,
 * a token cap, an expired deadline): [9, t, reason], or with the request's
 * id [9, t, reason, rid] (_rid: an integer id; _str: a string id, the id
 * rules above). `reason` in label-value syntax, e.g. "queue_full". The
 * request never becomes a tracked request; the id only names it in traces
 * and logs. Buffer space: 16 bytes plus the id's (8 for an integer) plus
 * the reason's bytes rounded up to 8 (32 bytes for "queue_full" without an
 * id). Cost: a tm_tokens() plus one pass over the reason that checks and
 * copies it: about 11 to 14 ns with a caller timestamp where tm_tokens()
 * takes 9 to 10 (docs/performance.md, "Protocol 1.2 client calls", a 2-core
 * VM); tm_admission_rejected_id*() below cost a tm_tokens()'s. */
TM_API int tm_admission_rejected(tm_client* client, uint64_t t_ns,
                                 const char* reason);
TM_API int tm_admission_rejected_rid(tm_client* client, uint64_t t_ns,
                                     const char* reason, uint64_t rid);
TM_API int tm_admission_rejected_str(tm_client* client, uint64_t t_ns,
                                     const char* reason, const char* rid,
                                     size_t rid_len);
/* The same three with the reason registered (tm_register_value()):
 * `reason_id` instead of the string. Buffer space: 16 bytes plus the id's
 * (8 for an integer). Cost: a tm_tokens()'s (about 9 ns with a caller
 * timestamp on a 2-core VM; docs/performance.md). */
TM_API int tm_admission_rejected_id(tm_client* client, uint64_t t_ns,
                                    uint32_t reason_id);
TM_API int tm_admission_rejected_id_rid(tm_client* client, uint64_t t_ns,
                                        uint32_t reason_id, uint64_t rid);
TM_API int tm_admission_rejected_id_str(tm_client* client, uint64_t t_ns,
                                        uint32_t reason_id, const char* rid,
                                        size_t rid_len);

/* One KV-cache transfer of a request ended (disaggregated prefill/decode):
 * [10, t, rid, info], t the time it ended. */
typedef enum tm_kv_role {
  TM_KV_SEND = 0, /* the prefill side sent the KV cache: "send" */
  TM_KV_RECV = 1  /* the decode side received it: "recv" */
} tm_kv_role;
/* bytes / blocks not given (not sent). */
#define TM_KV_UNKNOWN UINT64_MAX
typedef struct tm_kv_transfer_info {
  size_t size;           /* sizeof(tm_kv_transfer_info); set by
                            TM_KV_TRANSFER_INFO_INIT (lets the struct grow) */
  tm_kv_role role;       /* TM_KV_SEND or TM_KV_RECV */
  uint64_t start_ns;     /* CLOCK_MONOTONIC ns the transfer began; required:
                            at most the event time (t_ns, or now for 0) */
  uint64_t bytes;        /* TM_KV_UNKNOWN, or <= TM_MAX_KV_TRANSFER_BYTES */
  uint64_t blocks;       /* TM_KV_UNKNOWN, or <= TM_MAX_KV_TRANSFER_BYTES */
  int ok;                /* nonzero: the transfer succeeded (the default) */
  const char* reason;    /* NULL: none; label-value syntax, e.g. "timeout"
                            (the transfer timed out) or "bootstrap_timeout"
                            (the handshake before it did: SGLang's two
                            timeout stages, docs/metrics.md) */
  const char* connector; /* NULL: none; label-value syntax, e.g. "nixl" */
  uint32_t reason_id;    /* 0: none; else a tm_register_value() id, in
                            place of `reason` (then NULL) */
  uint32_t connector_id; /* 0: none; else an id in place of `connector` */
} tm_kv_transfer_info;
/* clang-format off */
#define TM_KV_TRANSFER_INFO_INIT \
  {sizeof(tm_kv_transfer_info), TM_KV_SEND, 0, TM_KV_UNKNOWN, TM_KV_UNKNOWN, \
   1, NULL, NULL, 0, 0}
/* clang-format on */
/* Initialize `info` with TM_KV_TRANSFER_INFO_INIT, then set role and
 * start_ns (both required; start_ns has no "not given") and what else is
 * known. `size` is sizeof(tm_kv_transfer_info) as the caller was compiled:
 * at least this (1.2) layout's, else TM_E_INVALID; fields a newer header
 * appends are not read. The rules, each the daemon's: `role` one of the
 * two; `start_ns` at most the event time (t_ns, or the clock read for
 * t_ns = 0); `bytes` and `blocks` TM_KV_UNKNOWN or at most
 * TM_MAX_KV_TRANSFER_BYTES (2^48 - 1); `reason` and `connector` NULL or in
 * label-value syntax; `reason_id` and `connector_id` 0 or an id this
 * client's tm_register_value() returned, and not given together with the
 * string of the same field. NULL `info` or any rule broken is
 * TM_E_INVALID: counted as rejected, nothing appended.
 *
 * Wire form: [10, t, rid, info], the info map holding, in this order,
 * "role" ("send" or "recv"), "start" (uint), "bytes" and "blocks" (uints,
 * when not TM_KV_UNKNOWN), "ok": false only when the transfer failed (the
 * protocol's default is true, so a success sends no "ok"), "reason" and
 * "connector" (strs, when given; a reason is sent as given, also with ok,
 * though the daemon uses it only on failure). Cost and buffer space
 * (integer id; a string id takes its bytes rounded up to 8 in place of 8;
 * times with a caller timestamp on a 2-core VM, docs/performance.md,
 * "Protocol 1.2 client calls" and the sections after it):
 *   - no string (no reason or connector, or registered ones: reason_id /
 *     connector_id, the strings NULL): a lean path, 40 bytes whatever is
 *     given, about a tm_tokens() (5.4 against 5.5 ns in alternating
 *     runs, up to 1.1x in others);
 *   - a connector string of 1 to 16 bytes of printable ASCII and no reason
 *     string: the same path, one pass over the string, 40 bytes plus the
 *     connector's rounded up to 8 (48 for "nixl"), about 1.6x a
 *     tm_tokens() (8.6 ns in the same run);
 *   - anything else (a reason string, another connector string), a
 *     thread's first call, bytes of 2^40 - 1 or more or blocks of 2^24 - 1
 *     or more: the general path, the checks and one pass over each string,
 *     32 bytes plus 8 for each of bytes and blocks given plus each string
 *     rounded up to 8 (64 bytes for a failed "nixl" transfer with bytes,
 *     blocks and the reason "timeout"), about 2.3x a tm_tokens() (12 ns
 *     for a "nixl" transfer in the same run, before the connector string
 *     took the lean path). */
TM_API int tm_kv_transfer(tm_client* client, uint64_t t_ns, uint64_t rid,
                          const tm_kv_transfer_info* info);
TM_API int tm_kv_transfer_str(tm_client* client, uint64_t t_ns, const char* rid,
                              size_t rid_len, const tm_kv_transfer_info* info);

/* The engine's sleep state changed (vLLM's sleep mode, SGLang's memory
 * release): [11, t, state], the state map holding, in this order,
 * "scheduler" ("running" / "paused"), "weights" ("resident" / "offloaded"
 * / "discarded") and "kv_cache" ("resident" / "released"), each only when
 * not *_KEEP: the daemon keeps a part not given at its previous value (an
 * engine that never sends SLEEP is awake). All three KEEP sends an empty
 * map, a valid event that changes nothing. A value outside its enum is
 * TM_E_INVALID (counted as rejected, nothing appended). Buffer space: 16
 * bytes. Cost: a tm_tokens()'s. */
typedef enum tm_scheduler_state {
  TM_SCHEDULER_KEEP = -1,
  TM_SCHEDULER_RUNNING = 0,
  TM_SCHEDULER_PAUSED = 1
} tm_scheduler_state;
typedef enum tm_weights_state {
  TM_WEIGHTS_KEEP = -1,
  TM_WEIGHTS_RESIDENT = 0,
  TM_WEIGHTS_OFFLOADED = 1,
  TM_WEIGHTS_DISCARDED = 2
} tm_weights_state;
typedef enum tm_kv_cache_state {
  TM_KV_CACHE_KEEP = -1,
  TM_KV_CACHE_RESIDENT = 0,
  TM_KV_CACHE_RELEASED = 1
} tm_kv_cache_state;
TM_API int tm_sleep_state(tm_client* client, uint64_t t_ns,
                          tm_scheduler_state scheduler,
                          tm_weights_state weights, tm_kv_cache_state kv_cache);

/* ---- protocol 1.3 events ------------------------------------------------
 * For engines that hand over only figures they computed, without
 * per-request events (vLLM's stat-logger plugins, SGLang's and LMDeploy's
 * metric hooks): a finished request's summary, and one iteration's
 * latencies and counts. They never make a tracked request, and the daemon
 * computes nothing from their times: it observes the figures as given. A
 * 1.2 daemon counts both kinds as unknown_kind and skips them (the rest
 * of the batch is applied). Each call is wait-free, may be made from any
 * thread, never allocates, and has the results of the other event calls:
 * TM_OK, TM_E_INVALID (a rule broken: counted as rejected, nothing
 * appended), TM_E_DROPPED (buffer full, counted), TM_E_CLOSED /
 * TM_E_FORKED. */

/* A field of tm_request_summary_info or tm_iteration_counts that is not given
 * (not sent; the daemon then observes nothing for it). */
#define TM_NOT_GIVEN UINT64_MAX

/* One finished request as the engine computed it: [12, t, reason,
 * summary], or with the request's id [12, t, reason, summary, rid] (the
 * id only names it; the daemon tracks no request). */
typedef struct tm_request_summary_info {
  size_t size;                /* sizeof(tm_request_summary_info); set by
                                 TM_REQUEST_SUMMARY_INFO_INIT */
  tm_finish_reason reason;    /* one of the four */
  uint64_t prompt_tokens;     /* required, <= TM_MAX_EVENT_COUNT */
  uint64_t generation_tokens; /* required, <= TM_MAX_EVENT_COUNT */
  /* TM_NOT_GIVEN, or <= TM_MAX_EVENT_COUNT (cached_tokens also at most
   * prompt_tokens): prompt tokens found in a cache; the max_tokens and n
   * request params; of a request group (vLLM's parallel sampling), the
   * most tokens one of its requests generated, given on the summary of the
   * request whose finish completed the group. */
  uint64_t cached_tokens;
  uint64_t max_tokens;
  uint64_t n;
  uint64_t max_generation_tokens;
  /* Durations in ns, TM_NOT_GIVEN or <= TM_MAX_DURATION_NS (2^48 - 1):
   * time to first token, queue (queued to scheduled), prefill (scheduled to
   * first token), decode (first to last token), inference (scheduled to
   * last token), end to end, time per output token; each as the engine
   * defines and measured it, on whatever clock it used. */
  uint64_t ttft_ns;
  uint64_t queue_ns;
  uint64_t prefill_ns;
  uint64_t decode_ns;
  uint64_t inference_ns;
  uint64_t e2e_ns;
  uint64_t tpot_ns;
} tm_request_summary_info;
/* clang-format off */
#define TM_REQUEST_SUMMARY_INFO_INIT \
  {sizeof(tm_request_summary_info), TM_FINISH_STOP, 0, 0, TM_NOT_GIVEN, \
   TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN, \
   TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN}
/* clang-format on */
/* Initialize `s` with TM_REQUEST_SUMMARY_INFO_INIT, then set the reason, the
 * two token counts and what else is known. `size` at least this (1.3)
 * layout's, else TM_E_INVALID. The rules, each the daemon's: `reason` one
 * of the four; every count <= TM_MAX_EVENT_COUNT, cached_tokens <=
 * prompt_tokens; every duration <= TM_MAX_DURATION_NS. NULL `s` or any rule
 * broken is TM_E_INVALID: counted as rejected, nothing appended. _rid: an
 * integer id; _str: a string id (1 .. TM_MAX_RID_BYTES bytes).
 *
 * What the daemon does with it (docs/protocol.md, "Additions in 1.3"):
 * request_success_total{finished_reason}, the prompt and generation tokens
 * per request, each param and duration given into its histogram; nothing
 * else (no token counters, no inter-token latency, no trace).
 *
 * Wire form: the summary map holds, in this order, "prompt_tokens",
 * "generation_tokens", then "cached_tokens", "max_tokens", "n",
 * "max_generation_tokens", "ttft", "queue", "prefill", "decode",
 * "inference", "e2e", "tpot", each only when given, every value a uint in
 * its smallest encoding. Buffer space: 24 bytes plus the id's (8 for an
 * integer) plus 8 per field given (120 bytes with every field and an
 * integer id). Cost: one pass over the struct, about a tm_kv_transfer()'s
 * (docs/performance.md, "Protocol 1.3 client calls"). */
TM_API int tm_request_summary(tm_client* client, uint64_t t_ns,
                              const tm_request_summary_info* s);
TM_API int tm_request_summary_rid(tm_client* client, uint64_t t_ns,
                                  uint64_t rid,
                                  const tm_request_summary_info* s);
TM_API int tm_request_summary_str(tm_client* client, uint64_t t_ns,
                                  const char* rid, size_t rid_len,
                                  const tm_request_summary_info* s);

/* What one iteration counted for requests the engine reports no events of
 * (the optional counts of LATENCIES): prompt tokens (of the requests that
 * produced their first token), generation tokens, preemptions. Each
 * TM_NOT_GIVEN or <= TM_MAX_EVENT_COUNT. */
typedef struct tm_iteration_counts {
  size_t size; /* sizeof(tm_iteration_counts); TM_ITERATION_COUNTS_INIT */
  uint64_t prompt_tokens;
  uint64_t generation_tokens;
  uint64_t preemptions;
} tm_iteration_counts;
#define TM_ITERATION_COUNTS_INIT \
  { sizeof(tm_iteration_counts), TM_NOT_GIVEN, TM_NOT_GIVEN, TM_NOT_GIVEN }

/* One iteration's latencies as the engine computed them: [13, t, ttft,
 * itl], or with counts [13, t, ttft, itl, counts]. ttft[0..n_ttft) are
 * times to first token, itl[0..n_itl) inter-token latencies, in ns, each
 * <= TM_MAX_DURATION_NS, n_ttft + n_itl <= TM_MAX_LATENCIES (1024: split a
 * larger iteration into several calls); a pointer may be NULL when its
 * count is 0. `counts` NULL: none (else its `size` at least this layout's).
 * The daemon observes each value in its histogram (time to first token,
 * inter-token latency) and adds the counts to the token and preemption
 * counters. Anything else is TM_E_INVALID: counted as rejected, nothing
 * appended. The values are copied (the arrays may be reused once the call
 * returns) and sent as msgpack arrays of uints in their smallest encoding;
 * the counts map holds "prompt_tokens", "generation_tokens",
 * "preemptions" in this order, each only when given (no map when none
 * is). Buffer space: 16 bytes plus 8 per value and per count given (at most
 * 8,232 bytes). Cost: one pass to check the values and one copy, linear in
 * their number (docs/performance.md, "Protocol 1.3 client calls"). */
TM_API int tm_latencies(tm_client* client, uint64_t t_ns,
                        const uint64_t* ttft_ns, size_t n_ttft,
                        const uint64_t* itl_ns, size_t n_itl,
                        const tm_iteration_counts* counts);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TOKENMETER_TOKENMETER_H_ */
