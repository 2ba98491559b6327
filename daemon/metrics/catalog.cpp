#include "daemon/metrics/catalog.h"

namespace tokenmeter::daemon {

using enum MetricType;

const EngineMetricDef kEngineMetrics[kNumEngineMetrics] = {
    {kNumRequestsRunning, "num_requests_running", kGauge, "", BucketSet::kNone,
     false, "Number of requests in model execution batches."},
    {kNumRequestsWaiting, "num_requests_waiting", kGauge, "", BucketSet::kNone,
     false, "Number of requests waiting to be processed."},
    {kKvCacheUsagePerc, "kv_cache_usage_perc", kGauge, "", BucketSet::kNone,
     false, "KV-cache usage. 1 means 100 percent usage."},
    {kPrefixCacheQueries, "prefix_cache_queries", kCounter, "",
     BucketSet::kNone, false,
     "Prefix cache queries, in terms of number of queried tokens."},
    {kPrefixCacheHits, "prefix_cache_hits", kCounter, "", BucketSet::kNone,
     false, "Prefix cache hits, in terms of number of cached tokens."},
    {kNumPreemptions, "num_preemptions", kCounter, "", BucketSet::kNone, false,
     "Cumulative number of preemptions from the engine."},
    {kPromptTokens, "prompt_tokens", kCounter, "", BucketSet::kNone, false,
     "Number of prefill tokens processed."},
    {kGenerationTokens, "generation_tokens", kCounter, "", BucketSet::kNone,
     false, "Number of generation tokens processed."},
    {kRequestSuccess, "request_success", kCounter, "finished_reason",
     BucketSet::kNone, false, "Count of successfully processed requests."},
    {kTimeToFirstToken, "time_to_first_token_seconds", kHistogram, "",
     BucketSet::kTtft, true, "Histogram of time to first token in seconds."},
    {kInterTokenLatency, "inter_token_latency_seconds", kHistogram, "",
     BucketSet::kItl, true, "Histogram of inter-token latency in seconds."},
    {kRequestTimePerOutputToken, "request_time_per_output_token_seconds",
     kHistogram, "", BucketSet::kItl, true,
     "Histogram of time_per_output_token_seconds per request."},
    {kE2eRequestLatency, "e2e_request_latency_seconds", kHistogram, "",
     BucketSet::kPhase, true, "Histogram of e2e request latency in seconds."},
    {kRequestQueueTime, "request_queue_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in WAITING phase for request."},
    {kRequestPrefillTime, "request_prefill_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in PREFILL phase for request."},
    {kRequestDecodeTime, "request_decode_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in DECODE phase for request."},
    {kRequestInferenceTime, "request_inference_time_seconds", kHistogram, "",
     BucketSet::kPhase, true,
     "Histogram of time spent in RUNNING phase for request."},
    {kRequestPromptTokens, "request_prompt_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Number of prefill tokens processed per request."},
    {kRequestGenerationTokens, "request_generation_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Number of generation tokens processed per request."},
    {kRequestMaxNumGenerationTokens, "request_max_num_generation_tokens",
     kHistogram, "", BucketSet::kTokens, false,
     "Histogram of maximum number of requested generation tokens."},
    {kRequestParamsMaxTokens, "request_params_max_tokens", kHistogram, "",
     BucketSet::kTokens, false,
     "Histogram of the max_tokens request parameter."},
    {kRequestParamsN, "request_params_n", kHistogram, "", BucketSet::kParamsN,
     false, "Histogram of the n request parameter."},
    {kIterationTokens, "iteration_tokens_total", kHistogram, "",
     BucketSet::kIteration, false,
     "Histogram of number of tokens per engine_step."},
    {kSpecDecodeNumDrafts, "spec_decode_num_drafts", kCounter, "",
     BucketSet::kNone, false, "Number of spec decoding drafts."},
    {kSpecDecodeNumDraftTokens, "spec_decode_num_draft_tokens", kCounter, "",
     BucketSet::kNone, false, "Number of draft tokens."},
    {kSpecDecodeNumAcceptedTokens, "spec_decode_num_accepted_tokens", kCounter,
     "", BucketSet::kNone, false, "Number of accepted tokens."},
    {kSpecDecodeNumAcceptedTokensPerPos,
     "spec_decode_num_accepted_tokens_per_pos", kCounter, "position",
     BucketSet::kNone, false, "Accepted tokens per draft position."},
};

const DaemonMetricDef kDaemonMetrics[kNumDaemonMetrics] = {
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
    case Interval::kCount:
      break;
  }
  return "unknown";
}

}  // namespace tokenmeter::daemon
