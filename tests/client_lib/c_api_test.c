/*
 * The C ABI used from C99 (built with -std=c99 -Wall -Wextra -Wpedantic
 * -Werror): options, a client with no daemon, events, stats, close.
 * Exits 0 when every check holds, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenmeter/protocol.h"
#include "tokenmeter/tokenmeter.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define CHECK_RC(expr, want)                                             \
  do {                                                                   \
    int rc_ = (expr);                                                    \
    if (rc_ != (want)) {                                                 \
      fprintf(stderr, "%s:%d: %s returned %d (%s), want %d\n", __FILE__, \
              __LINE__, #expr, rc_, tm_strerror(rc_), (int)(want));      \
      ++failures;                                                        \
    }                                                                    \
  } while (0)

int main(void) {
  char dir[] = "/tmp/tmc.XXXXXX";
  char path[128];
  tm_options* opts;
  tm_client* client = NULL;
  uint64_t stats[TM_STAT_COUNT];
  uint64_t final_stats[TM_STAT_COUNT];
  const tm_step_key keys[2] = {TM_STEP_KEY_RUNNING, TM_STEP_KEY_KV_USAGE};
  const double values[2] = {3.0, 0.5};
  const uint64_t positions[2] = {4, 2};
  const tm_label labels[2] = {{"tenant", "acme"}, {"tier", "gold"}};
  uint64_t experts[TM_MAX_MOE_EXPERTS + 1];
  tm_request_params params = TM_REQUEST_PARAMS_INIT;
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  const tm_step_key deferred_keys[2] = {TM_STEP_KEY_WAITING,
                                        TM_STEP_KEY_WAITING_DEFERRED};
  const double deferred_values[2] = {4.0, 1.0};
  const double too_many_deferred[2] = {1.0, 2.0};
  tm_request_summary_info summary = TM_REQUEST_SUMMARY_INFO_INIT;
  tm_iteration_counts counts = TM_ITERATION_COUNTS_INIT;
  const uint64_t ttft[2] = {41000000, 1};
  const uint64_t itl[1] = {TM_MAX_DURATION_NS};
  uint64_t now;
  size_t i;

  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  /* Nothing listens here: the client must work without a daemon. */
  snprintf(path, sizeof path, "%s/absent.sock", dir);
  for (i = 0; i < TM_MAX_MOE_EXPERTS + 1; ++i) experts[i] = i;

  CHECK(strcmp(tm_version(), "") != 0);
  CHECK(tm_strerror(TM_E_INVALID) != NULL);
  now = tm_now_ns();
  CHECK(now > 0);

  opts = tm_options_new();
  CHECK(opts != NULL);
  if (opts == NULL) return 1;
  /* No model yet: refused. */
  CHECK_RC(tm_client_new(opts, &client), TM_E_INVALID);
  CHECK(client == NULL);
  CHECK_RC(tm_options_set_socket_path(opts, path), TM_OK);
  CHECK_RC(tm_options_set_engine(opts, "c-engine"), TM_OK);
  CHECK_RC(tm_options_set_engine(opts, "c engine"), TM_E_INVALID);
  CHECK_RC(tm_options_set_model(opts, "c-model"), TM_OK);
  CHECK_RC(tm_options_set_instance(opts, "c0"), TM_OK);
  CHECK_RC(tm_options_set_scope(opts, "c-scope"), TM_OK);
  CHECK_RC(tm_options_add_label(opts, "lang", "c99"), TM_OK);
  CHECK_RC(tm_options_add_label(opts, "le", "x"), TM_E_INVALID);
  /* Protocol 1.1 HELLO keys. */
  CHECK_RC(tm_options_set_profile(opts, TM_PROFILE_VLLM), TM_OK);
  CHECK_RC(tm_options_set_profile(opts, "tgi"), TM_E_INVALID);
  CHECK_RC(tm_options_add_cache_config_int(opts, "block_size", 16), TM_OK);
  CHECK_RC(tm_options_add_cache_config_str(opts, "cache_dtype", "auto"), TM_OK);
  CHECK_RC(tm_options_add_cache_config_float(opts, "gpu_util", 0.9), TM_OK);
  CHECK_RC(tm_options_add_cache_config_bool(opts, "prefix_caching", 1), TM_OK);
  CHECK_RC(tm_options_add_cache_config_int(opts, "block_size", 32),
           TM_E_INVALID);
  CHECK_RC(tm_options_set_max_lora(opts, 4), TM_OK);
  CHECK_RC(tm_options_set_max_lora(opts, -1), TM_E_INVALID);
  CHECK_RC(tm_options_set_buffer_capacity(opts, 1024), TM_OK);
  CHECK_RC(tm_options_set_flush_interval_ms(opts, 5), TM_OK);
  CHECK_RC(tm_options_set_close_timeout_ms(opts, 50), TM_OK);
  CHECK_RC(tm_options_set_max_threads(opts, 2), TM_OK);
  CHECK_RC(tm_options_set_ack(opts, 0), TM_OK);
  CHECK_RC(tm_options_set_ack(opts, 7), TM_OK);
  CHECK_RC(tm_options_set_ack(NULL, 1), TM_E_INVALID);
  CHECK_RC(tm_options_set_replay_bytes(opts, TM_MIN_REPLAY_BYTES - 1),
           TM_E_INVALID);
  CHECK_RC(tm_options_set_replay_bytes(opts, TM_MAX_REPLAY_BYTES + 1),
           TM_E_INVALID);
  CHECK_RC(tm_options_set_replay_bytes(opts, TM_MIN_REPLAY_BYTES), TM_OK);
  CHECK_RC(tm_client_new(opts, &client), TM_OK);
  tm_options_free(opts);
  CHECK(client != NULL);
  if (client == NULL) return 1;

  CHECK_RC(tm_thread_attach(client), TM_OK);
  CHECK_RC(tm_arrived(client, 0, 1, 100, 256, 1), TM_OK);
  CHECK_RC(tm_arrived_str(client, now, "c-1", 3, 50, 0, 0), TM_OK);
  CHECK_RC(tm_arrived_packed(client, 2, 7 | (uint64_t)9 << 32), TM_OK);
  CHECK_RC(tm_arrived_packed_str(client, "c-2", 3, 7), TM_OK);
  CHECK_RC(tm_arrived_ex(client, 0, 3, 10, 0, 0, "sql-lora", labels, 2), TM_OK);
  CHECK_RC(tm_arrived_ex_str(client, 0, "c-3", 3, 10, 16, 1, NULL, labels, 1),
           TM_OK);
  CHECK_RC(tm_queued(client, 0, 1), TM_OK);
  CHECK_RC(tm_scheduled(client, 0, 1), TM_OK);
  CHECK_RC(tm_scheduled_str(client, 0, "c-1", 3), TM_OK);
  CHECK_RC(tm_tokens(client, 0, 1, 1), TM_OK);
  CHECK_RC(tm_tokens_str(client, 0, "c-1", 3, 4), TM_OK);
  CHECK_RC(tm_preempted(client, 0, 1), TM_OK);
  CHECK_RC(tm_step(client, 0, keys, values, 2, positions, 2), TM_OK);
  CHECK_RC(tm_finished(client, 0, 1, TM_FINISH_STOP), TM_OK);
  CHECK_RC(tm_finished_str(client, 0, "c-1", 3, TM_FINISH_LENGTH), TM_OK);
  CHECK_RC(tm_expert_load(client, 0, 0, experts, 256), TM_OK);
  CHECK_RC(tm_expert_load(client, now, TM_MAX_MOE_LAYERS - 1, experts,
                          TM_MAX_MOE_EXPERTS),
           TM_OK);
  /* Protocol 1.2. */
  CHECK(params.size == sizeof params);
  CHECK(params.lora == NULL && params.traceparent == NULL &&
        params.has_priority == 0);
  params.max_tokens = 256;
  params.labels = labels;
  params.n_labels = 2;
  params.has_priority = 1;
  params.priority = TM_MIN_PRIORITY;
  params.traceparent =
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  params.tracestate = "congo=t61rcWkgMzE";
  CHECK_RC(tm_arrived_params(client, 0, 5, 10, &params), TM_OK);
  CHECK_RC(tm_arrived_params_str(client, 0, "c-5", 3, 10, &params), TM_OK);
  CHECK_RC(tm_scheduled_ex(client, 0, 5, 8, 2), TM_OK);
  CHECK_RC(tm_scheduled_ex_str(client, 0, "c-5", 3, 8, 0), TM_OK);
  CHECK_RC(tm_admission_rejected(client, 0, "queue_full"), TM_OK);
  CHECK_RC(tm_admission_rejected_rid(client, 0, "queue_full", 6), TM_OK);
  CHECK_RC(tm_admission_rejected_str(client, 0, "queue_full", "c-6", 3), TM_OK);
  CHECK(kv.size == sizeof kv && kv.role == TM_KV_SEND && kv.ok != 0);
  CHECK(kv.bytes == TM_KV_UNKNOWN && kv.blocks == TM_KV_UNKNOWN);
  kv.role = TM_KV_RECV;
  kv.start_ns = now;
  kv.bytes = 1 << 20;
  kv.connector = "nixl";
  CHECK_RC(tm_kv_transfer(client, 0, 5, &kv), TM_OK);
  CHECK_RC(tm_kv_transfer_str(client, 0, "c-5", 3, &kv), TM_OK);
  CHECK_RC(tm_sleep_state(client, 0, TM_SCHEDULER_PAUSED, TM_WEIGHTS_OFFLOADED,
                          TM_KV_CACHE_KEEP),
           TM_OK);
  CHECK_RC(tm_step(client, 0, deferred_keys, deferred_values, 2, NULL, 0),
           TM_OK);
  /* Protocol 1.3: the summary's defaults (every optional field not given),
   * each id form, latencies with and without counts. */
  CHECK(summary.size == sizeof summary && summary.reason == TM_FINISH_STOP);
  CHECK(summary.cached_tokens == TM_NOT_GIVEN &&
        summary.tpot_ns == TM_NOT_GIVEN);
  CHECK(counts.size == sizeof counts && counts.preemptions == TM_NOT_GIVEN);
  summary.prompt_tokens = 812;
  summary.generation_tokens = 256;
  summary.e2e_ns = 2600000000u;
  CHECK_RC(tm_request_summary(client, 0, &summary), TM_OK);
  CHECK_RC(tm_request_summary_rid(client, 0, 8, &summary), TM_OK);
  CHECK_RC(tm_request_summary_str(client, 0, "c-8", 3, &summary), TM_OK);
  counts.generation_tokens = 3;
  CHECK_RC(tm_latencies(client, 0, ttft, 2, itl, 1, &counts), TM_OK);
  CHECK_RC(tm_latencies(client, 0, NULL, 0, itl, 1, NULL), TM_OK);
  /* Rejected: zero tokens, an empty id, an empty lora, and EXPERT_LOAD with
   * layer 4096, no experts, 1025 experts, NULL counts, a count > 2^32 - 1. */
  CHECK_RC(tm_tokens(client, 0, 1, 0), TM_E_INVALID);
  CHECK_RC(tm_queued_str(client, 0, "", 0), TM_E_INVALID);
  CHECK_RC(tm_arrived_ex(client, 0, 4, 10, 0, 0, "", NULL, 0), TM_E_INVALID);
  CHECK_RC(tm_expert_load(client, 0, TM_MAX_MOE_LAYERS, experts, 1),
           TM_E_INVALID);
  CHECK_RC(tm_expert_load(client, 0, 0, experts, 0), TM_E_INVALID);
  CHECK_RC(tm_expert_load(client, 0, 0, experts, TM_MAX_MOE_EXPERTS + 1),
           TM_E_INVALID);
  CHECK_RC(tm_expert_load(client, 0, 0, NULL, 1), TM_E_INVALID);
  experts[3] = TM_MAX_EVENT_COUNT + 1;
  CHECK_RC(tm_expert_load(client, 0, 0, experts, 4), TM_E_INVALID);
  /* Left out (1.2): an uppercase traceparent, and with it the tracestate
   * (two fields dropped); the ARRIVED is sent without them. */
  params.traceparent =
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";
  CHECK_RC(tm_arrived_params(client, 0, 7, 10, &params), TM_OK);
  /* Rejected (1.2): a params size too small, an empty reason, a start
   * after the end, an unknown role, a sleep state outside its enum,
   * waiting_deferred above waiting. */
  params.traceparent = NULL;
  params.size = sizeof params - 1;
  CHECK_RC(tm_arrived_params(client, 0, 7, 10, &params), TM_E_INVALID);
  CHECK_RC(tm_admission_rejected(client, 0, ""), TM_E_INVALID);
  kv.start_ns = now + 1;
  CHECK_RC(tm_kv_transfer(client, now, 7, &kv), TM_E_INVALID);
  kv.start_ns = now;
  kv.role = (tm_kv_role)2;
  CHECK_RC(tm_kv_transfer(client, now, 7, &kv), TM_E_INVALID);
  CHECK_RC(tm_sleep_state(client, 0, (tm_scheduler_state)2, TM_WEIGHTS_KEEP,
                          TM_KV_CACHE_KEEP),
           TM_E_INVALID);
  CHECK_RC(tm_step(client, 0, deferred_keys, too_many_deferred, 2, NULL, 0),
           TM_E_INVALID);
  /* Rejected (1.3): cached above the prompt, a duration past 2^48 - 1, a
   * latency past it, a NULL list of values. */
  summary.cached_tokens = 813;
  CHECK_RC(tm_request_summary(client, 0, &summary), TM_E_INVALID);
  summary.cached_tokens = TM_NOT_GIVEN;
  summary.ttft_ns = TM_MAX_DURATION_NS + 1;
  CHECK_RC(tm_request_summary(client, 0, &summary), TM_E_INVALID);
  CHECK_RC(tm_latencies(client, 0, itl, 1, ttft, 2, NULL), TM_OK);
  experts[0] = TM_MAX_DURATION_NS + 1;
  CHECK_RC(tm_latencies(client, 0, experts, 1, NULL, 0, NULL), TM_E_INVALID);
  CHECK_RC(tm_latencies(client, 0, NULL, 1, NULL, 0, NULL), TM_E_INVALID);

  CHECK_RC(tm_client_flush(client, 1000), TM_E_DISCONNECTED);
  for (i = 0; i < TM_STAT_COUNT; ++i) stats[i] = 12345;
  CHECK_RC(tm_client_stats(client, stats, TM_STAT_COUNT), TM_OK);
  CHECK(stats[TM_STAT_EVENTS_SENT] == 0);
  CHECK(stats[TM_STAT_EVENTS_REJECTED] == 18);
  CHECK(stats[TM_STAT_EVENTS_DROPPED] == 0);
  CHECK(stats[TM_STAT_FIELDS_DROPPED] == 2);
  CHECK(stats[TM_STAT_CONNECTED] == 0);
  CHECK(stats[TM_STAT_RECONNECTS] == 0);

  /* The 35 buffered events cannot be sent: dropped at close. */
  CHECK_RC(tm_client_close(client, final_stats, TM_STAT_COUNT), TM_E_TIMEOUT);
  CHECK(final_stats[TM_STAT_EVENTS_DROPPED] == 35);
  CHECK(final_stats[TM_STAT_EVENTS_REJECTED] == 18);
  CHECK(final_stats[TM_STAT_CONNECT_FAILURES] >= 1);
  CHECK(final_stats[TM_STAT_BATCHES_REPLAYED] == 0);
  CHECK(final_stats[TM_STAT_EVENTS_UNACKED] == 0);
  CHECK_RC(tm_client_close(NULL, NULL, 0), TM_OK);

  rmdir(dir);
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
