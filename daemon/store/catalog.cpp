#include "daemon/store/catalog.h"

namespace tokenmeter::daemon {

using enum MetricType;

constinit const EngineMetricDef kEngineMetrics[kNumEngineMetrics] = {
    {kNumRequestsRunning, "num_requests_running", kGauge, "", BucketSet::kNone,
     false, "Number of requests in model execution batches.", false},
    {kNumRequestsWaiting, "num_requests_waiting", kGauge, "", BucketSet::kNone,
     false, "Number of requests waiting to be processed.", false},
    {kKvCacheUsagePerc, "kv_cache_usage_perc", kGauge, "", BucketSet::kNone,
     false, "KV-cache usage. 1 means 100 percent usage.", false},
    {kPrefixCacheQueries, "prefix_cache_queries", kCounter, "",
     BucketSet::kNone, false,
     "Prefix cache queries, in terms of number of queried tokens.", false},
    {kPrefixCacheHits, "prefix_cache_hits", kCounter, "", BucketSet::kNone,
     false, "Prefix cache hits, in terms of number of cached tokens.", false},
    {kNumPreemptions, "num_preemptions", kCounter, "", BucketSet::kNone, false,
     "Cumulative number of preemptions from the engine.", false},
    {kPromptTokens, "prompt_tokens", kCounter, "", BucketSet::kNone, false,
     "Number of prefill tokens processed.", true},
    {kGenerationTokens, "generation_tokens", kCounter, "", BucketSet::kNone,
     false, "Number of generation tokens processed.", true},
    {kRequestSuccess, "request_success", kCounter, "finished_reason",
     BucketSet::kNone, false, "Count of successfully processed requests.",
     true},
    {kTimeToFirstToken, "time_to_first_token_seconds", kHistogram, "",
     BucketSet::kTtft, true, "Histogram of time to first token in seconds.",
     true},
    {kInterTokenLatency, "inter_token_latency_seconds", kHistogram, "",
     BucketSet::kItl, true, "Histogram of inter-token latency in seconds.",
     true},
    {kRequestTimePerOutputToken, "request_time_per_output_token_seconds",
     kHistogram, "", BucketSet::kItl, true,
     "Histogram of time_per_output_token_seconds per request.", true},
    {kE2eRequestLatency, "e2e_request_latency_seconds", kHistogram, "",
     BucketSet::kPhase, true, "Histogram of e2e request latency in seconds.",
     true},
    {kRequestQueueTime, "request_queue_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in WAITING phase for request.", true},
    {kRequestPrefillTime, "request_prefill_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in PREFILL phase for request.", true},
    {kRequestDecodeTime, "request_decode_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in DECODE phase for request.", true},
    {kRequestInferenceTime, "request_inference_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in RUNNING phase for request.", true},
    {kRequestPromptTokens, "request_prompt_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Number of prefill tokens processed per request.", true},
    {kRequestGenerationTokens, "request_generation_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Number of generation tokens processed per request.", true},
    {kRequestMaxNumGenerationTokens, "request_max_num_generation_tokens",
     kHistogram, "", BucketSet::kTokens, false,
     "Histogram of maximum number of requested generation tokens.", true},
    {kRequestParamsMaxTokens, "request_params_max_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Histogram of the max_tokens request parameter.", true},
    {kRequestParamsN, "request_params_n", kHistogram, "", BucketSet::kParamsN,
     false, "Histogram of the n request parameter.", true},
    {kIterationTokens, "iteration_tokens_total", kHistogram, "",
     BucketSet::kIteration, false,
     "Histogram of number of tokens per engine_step.", false},
    {kTimePerOutputTokenChunk, "time_per_output_token_chunk_seconds",
     kHistogram, "", BucketSet::kLmdeployItl, true,
     "Time per output token of each output chunk after the first.", true},
    {kInterTokenLatencyPerToken, "inter_token_latency_per_token_seconds",
     kHistogram, "", BucketSet::kSglangItl, true,
     "Inter-token latency counted per token (chunk interval / tokens).", true},
    {kIterationTokensChunk, "iteration_tokens_chunk", kHistogram, "",
     BucketSet::kIteration, false,
     "Tokens of each output chunk of a request, its prompt with the first.",
     false},
    {kRequestDecodeToFinish, "request_decode_to_finish_seconds", kHistogram, "",
     BucketSet::kPhase, true, "FINISHED - first TOKENS.", true},
    {kRequestInferenceToFinish, "request_inference_to_finish_seconds",
     kHistogram, "", BucketSet::kPhase, true, "FINISHED - SCHEDULED.", true},
    {kMoeImbalance, "moe_imbalance", kHistogram, "", BucketSet::kMoeImbalance,
     false,
     "Max / mean of the tokens routed to a layer's experts, one observation "
     "per EXPERT_LOAD with a non-zero sum (1 = balanced).",
     false},
    {kRequestPrefillKvComputedTokens, "request_prefill_kv_computed_tokens",
     kHistogram, "", BucketSet::kTokens, false,
     "Histogram of new KV tokens computed during prefill (excluding cached "
     "tokens).",
     true},
    {kRequestNumPreemptions, "request_num_preemptions", kHistogram, "",
     BucketSet::kPreemptions, false, "Number of preemptions per request.",
     true},
    {kRequestKvWaitTime, "request_kv_wait_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of the time a decode request waited for its KV cache "
     "transfer after it was scheduled.",
     true},
    {kRequestCachedTokens, "request_cached_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Histogram of prefix-cached (and externally received) prompt tokens "
     "per request.",
     true},
    {kRequestCacheHitRatio, "request_cache_hit_ratio", kHistogram, "",
     BucketSet::kRatio, false,
     "Histogram of the cached share of each request's prompt tokens.", true},
    {kKvTransferTime, "kv_transfer_time_seconds", kHistogram, "",
     BucketSet::kItl, true, "Histogram of KV cache transfer time in seconds.",
     false},
    {kKvTransferBytes, "kv_transfer_bytes", kHistogram, "", BucketSet::kKvBytes,
     false, "Histogram of bytes moved by one KV cache transfer.", false},
    {kSpecDecodeNumDrafts, "spec_decode_num_drafts", kCounter, "",
     BucketSet::kNone, false, "Number of spec decoding drafts.", false},
    {kSpecDecodeNumDraftTokens, "spec_decode_num_draft_tokens", kCounter, "",
     BucketSet::kNone, false, "Number of draft tokens.", false},
    {kSpecDecodeNumAcceptedTokens, "spec_decode_num_accepted_tokens", kCounter,
     "", BucketSet::kNone, false, "Number of accepted tokens.", false},
    {kSpecDecodeNumAcceptedTokensPerPos,
     "spec_decode_num_accepted_tokens_per_pos", kCounter, "position",
     BucketSet::kNone, false, "Accepted tokens per draft position.", false},
    {kPromptTokensAtFinish, "prompt_tokens_at_finish", kCounter, "",
     BucketSet::kNone, false, "Prompt tokens, counted at FINISHED.", true},
    {kGenerationTokensAtFinish, "generation_tokens_at_finish", kCounter, "",
     BucketSet::kNone, false, "Generation tokens, counted at FINISHED.", true},
    {kNumFinishedRequests, "num_finished_requests", kCounter, "",
     BucketSet::kNone, false, "Finished requests, any reason.", true},
    {kNumAbortedRequests, "num_aborted_requests", kCounter, "",
     BucketSet::kNone, false, "Requests finished as abort.", true},
    {kWindowGenerationThroughput, "window_gen_throughput", kGauge, "",
     BucketSet::kNone, false,
     "Generation tokens per second over the last summary window.", false},
    {kWindowCacheHitRate, "window_cache_hit_rate", kGauge, "", BucketSet::kNone,
     false, "Prefix cache hits / queries over the last summary window.", false},
    {kWindowSpecAcceptLength, "window_spec_accept_length", kGauge, "",
     BucketSet::kNone, false,
     "1 + accepted tokens / drafts over the last summary window.", false},
    {kWindowSpecAcceptRate, "window_spec_accept_rate", kGauge, "",
     BucketSet::kNone, false,
     "Accepted tokens / draft tokens over the last summary window.", false},
    {kPromptTokensBySource, "prompt_tokens_by_source", kCounter, "source",
     BucketSet::kNone, false, "Number of prompt tokens by source.", true},
    {kPromptTokensCached, "prompt_tokens_cached", kCounter, "",
     BucketSet::kNone, false,
     "Number of cached prompt tokens (local prefix cache hits and tokens "
     "received from an external KV transfer).",
     true},
};

constinit const DaemonMetricDef kDaemonMetrics[kNumDaemonMetrics] = {
    {kBuildInfo, "tokenmeter_build_info", kGauge, "version",
     "A constant 1, labelled with the daemon's version."},
    {kIngestConnections, "tokenmeter_ingest_connections", kGauge, "",
     "Open engine connections."},
    {kIngestFrames, "tokenmeter_ingest_frames", kCounter, "",
     "Frames accepted (HELLO, BATCH, GOODBYE)."},
    {kIngestEvents, "tokenmeter_ingest_events", kCounter, "kind",
     "Events applied, by kind."},
    {kIngestErrors, "tokenmeter_ingest_errors", kCounter, "reason",
     "Rejected frames and events, by reason."},
    {kIngestDuplicateBatches, "tokenmeter_ingest_duplicate_batches", kCounter,
     "", "Replayed batches skipped because already applied."},
    {kClientDroppedEvents, "tokenmeter_client_dropped_events", kCounter,
     "engine_family,model_name,engine",
     "Events clients reported they had to drop (latest dropped_total)."},
    {kTrackedRequests, "tokenmeter_tracked_requests", kGauge, "",
     "Requests held in memory."},
    {kEvictedRequests, "tokenmeter_evicted_requests", kCounter, "",
     "Requests dropped for inactivity or capacity."},
    {kIncompleteIntervals, "tokenmeter_incomplete_intervals", kCounter,
     "interval",
     "Intervals not observed because an end never came (counted at "
     "retirement)."},
    {kNegativeIntervals, "tokenmeter_negative_intervals", kCounter, "interval",
     "Intervals not observed because the end came before the start."},
    {kScrapeDuration, "tokenmeter_scrape_duration_seconds", kGauge, "",
     "Time to render the previous scrape."},
    {kHttpResponses, "tokenmeter_http_responses", kCounter, "code",
     "HTTP responses sent, by status code."},
    {kHttpConnectionsRejected, "tokenmeter_http_connections_rejected", kCounter,
     "",
     "HTTP connections closed unanswered: --max-http-connections were "
     "open, or the daemon was out of file descriptors."},
    {kRequestLabelOverflow, "tokenmeter_request_label_overflow", kCounter,
     "label",
     "Requests whose per-request label value became __other__ "
     "(--request-label-values reached)."},
    {kStateSnapshots, "tokenmeter_state_snapshots", kCounter, "result",
     "State snapshots written (--state-dir), by result."},
    {kStateRestored, "tokenmeter_state_restored", kGauge, "",
     "1 when this process started from a state snapshot."},
    {kOtlpSpans, "tokenmeter_otlp_spans", kCounter, "result",
     "Request trace spans built for OTLP export (--otlp-endpoint), by "
     "result: exported, dropped (the export queue was full), failed."},
    {kOtlpExportSeconds, "tokenmeter_otlp_export_seconds", kHistogram, "",
     "Time to export one OTLP request of spans, retries included."},
    {kOtlpQueueSpans, "tokenmeter_otlp_queue_spans", kGauge, "",
     "Spans waiting for export (queued, in flight or being batched)."},
    {kProcessCpuSeconds, "process_cpu_seconds", kCounter, "",
     "Total user and system CPU time spent in seconds."},
    {kProcessResidentMemory, "process_resident_memory_bytes", kGauge, "",
     "Resident memory size in bytes."},
    {kProcessVirtualMemory, "process_virtual_memory_bytes", kGauge, "",
     "Virtual memory size in bytes."},
    {kProcessOpenFds, "process_open_fds", kGauge, "",
     "Number of open file descriptors."},
    {kProcessMaxFds, "process_max_fds", kGauge, "",
     "Maximum number of open file descriptors."},
    {kProcessStartTime, "process_start_time_seconds", kGauge, "",
     "Start time of the process since unix epoch in seconds."},
};

std::span<const std::string_view> FixedLabelValues(EngineMetric m) {
  if (m == kRequestSuccess) return kFinishedReasonValues;
  if (m == kPromptTokensBySource) return kPromptSourceValues;
  return {};
}

std::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case kCounter:
      return "counter";
    case kGauge:
      return "gauge";
    case kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool CountsFromProcessStart(std::string_view name) {
  return name.starts_with("process_") || name.starts_with("tokenmeter_otlp_");
}

std::vector<double> OneTwoFive(uint64_t max) {
  std::vector<double> out;
  for (uint64_t scale = 1;; scale *= 10) {
    for (uint64_t m : {1, 2, 5}) {
      if (m > max / scale) return out;  // m * scale > max, without overflow
      out.push_back(double(m * scale));
    }
    if (scale > max / 10) return out;
  }
}

std::vector<double> DefaultBuckets(BucketSet set, uint64_t max_model_len) {
  switch (set) {
    case BucketSet::kNone:
      return {};
    case BucketSet::kTtft:
      return {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
              0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
              20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
    case BucketSet::kItl:
      return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
              0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
    case BucketSet::kPhase:
      return {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
              5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
    case BucketSet::kTokens:
      return OneTwoFive(max_model_len);
    case BucketSet::kIteration:
      return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
    case BucketSet::kParamsN:
      return {1, 2, 5, 10, 20};
    case BucketSet::kSglangTtft:
      return {0.1, 0.2,  0.4,  0.6,  0.8,  1.0,  2.0,   4.0,   6.0,
              8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0};
    case BucketSet::kSglangItl:
      return {0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025,
              0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400,
              0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000};
    case BucketSet::kSglangE2e:
      return {0.1,   0.2,   0.4,   0.6,    0.8,    1.0,   2.0,  4.0,
              6.0,   8.0,   10.0,  20.0,   40.0,   60.0,  80.0, 100.0,
              200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0};
    case BucketSet::kSglangQueue:
      return {0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1,    2,
              3,   4,     5,     10,    15,    20,    30,    40,    50,   60,
              70,  80,    90,    100,   200,   300,   400,   500,   600,  700,
              800, 900,   1000,  1200,  1400,  1600,  1800,  2000,  2500, 3000};
    case BucketSet::kSglangTokens:
      return {100,    300,    500,    700,    1000,   1500,    2000,
              3000,   4000,   5000,   6000,   7000,   8000,    9000,
              10000,  12500,  15000,  17500,  20000,  22500,   25000,
              27500,  30000,  35000,  40000,  60000,  80000,   100000,
              200000, 300000, 400000, 600000, 800000, 1000000, 1100000};
    case BucketSet::kMoeImbalance:
      return {1, 1.05, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20};
    case BucketSet::kPreemptions:
      return {0, 1, 2, 3, 4, 5, 10, 20};
    case BucketSet::kRatio:
      return {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
    case BucketSet::kSglangKvMs:
      return {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000};
    case BucketSet::kSglangKvMb:
      return {1, 5, 10, 50, 100, 500, 1000, 5000, 10000};
    case BucketSet::kKvBytes: {
      std::vector<double> out;
      for (int e = 11; e <= 33; e += 2) out.push_back(double(uint64_t(1) << e));
      return out;
    }
    case BucketSet::kLmdeployItl:
      return {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4,
              0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  }
  return {};
}

std::string_view IntervalName(Interval interval) {
  switch (interval) {
    case Interval::kTtft:
      return "time_to_first_token";
    case Interval::kItl:
      return "inter_token_latency";
    case Interval::kE2e:
      return "e2e_request_latency";
    case Interval::kQueue:
      return "queue_time";
    case Interval::kPrefill:
      return "prefill_time";
    case Interval::kDecode:
      return "decode_time";
    case Interval::kInference:
      return "inference_time";
    case Interval::kTpot:
      return "time_per_output_token";
    case Interval::kKvWait:
      return "kv_wait_time";
    case Interval::kCount:
      break;
  }
  return "unknown";
}

}  // namespace tokenmeter::daemon
