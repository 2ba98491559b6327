#include "daemon/store/profile.h"

#include <string>

#include "daemon/store/engine_series.h"

namespace tokenmeter::daemon {

using enum MetricType;
using enum FamilySource;

namespace {

// A row that shows measured metric `m` under its catalog name and help.
FamilyDef Catalog(EngineMetric m, bool legacy = false) {
  return FamilyDef{{},    kEngineMetrics[m].type,    kMetric,
                   m,     kEngineMetrics[m].buckets, {},
                   legacy};
}

// Rows shared by every profile (metrics-v1.md "Router and autoscaler
// series"), under the profile's prefix.
constexpr FamilyDef kCacheConfigInfoRow{
    .name = "cache_config_info",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Information of the LLMEngine CacheConfig",
    .part = PartKind::kCacheConfig,
    .part_family = PartFamily::kCacheConfigInfo};
constexpr FamilyDef kLoraRequestsInfoRow{
    .name = "lora_requests_info",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Running stats on lora requests.",
    .part = PartKind::kLora,
    .part_family = PartFamily::kLoraRequestsInfo};

// MoE expert load (metrics-v1.md "MoE expert load"), in every profile.
constexpr FamilyDef kMoeRoutedTokensRow{
    .name = "moe_routed_tokens",
    .type = kCounter,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Tokens the MoE router of a layer sent to its experts.",
    .part = PartKind::kMoe,
    .part_family = PartFamily::kMoeRoutedTokens};
constexpr FamilyDef kMoeExpertTokensRow{
    .name = "moe_expert_tokens",
    .type = kCounter,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Tokens the MoE router of a layer sent to one expert.",
    .part = PartKind::kMoe,
    .part_family = PartFamily::kMoeExpertTokens};
constexpr FamilyDef kMoeLayerImbalanceRow{
    .name = "moe_layer_imbalance",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help =
        "Max / mean of the tokens per expert in the layer's latest "
        "EXPERT_LOAD with a non-zero sum (1 = balanced).",
    .part = PartKind::kMoe,
    .part_family = PartFamily::kMoeLayerImbalance};
// A measured histogram, shown only for series with the MoE part.
constexpr FamilyDef kMoeImbalanceRow{.name = "moe_imbalance",
                                     .type = kHistogram,
                                     .source = kMetric,
                                     .metric = kMoeImbalance,
                                     .buckets = BucketSet::kMoeImbalance,
                                     .part = PartKind::kMoe};

// Protocol 1.2 (metrics-v1.md "Catalog 1.2 additions"): the parts' rows,
// under the vLLM names (vllm/v1/metrics/loggers.py and the KV connectors'
// stats), in every profile unless the profile has its own.
constexpr FamilyDef kAdmissionRejectionsRow{
    .name = "admission_rejections",
    .type = kCounter,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Requests rejected at admission, by reason.",
    .part = PartKind::kAdmission,
    .part_family = PartFamily::kAdmissionRejections};
constexpr FamilyDef kWaitingByReasonRow{
    .name = "num_requests_waiting_by_reason",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Number of requests waiting, by reason (capacity or deferred).",
    .part = PartKind::kWaitingReason,
    .part_family = PartFamily::kWaitingByReason};
constexpr FamilyDef kKvTransferTimeRow{
    .name = "kv_transfer_time_seconds",
    .type = kHistogram,
    .source = kPart,
    .metric = kKvTransferTime,
    .buckets = BucketSet::kItl,
    .help = "Histogram of KV cache transfer time in seconds, by role.",
    .part = PartKind::kKvTransfer,
    .part_family = PartFamily::kKvTransferTime};
constexpr FamilyDef kKvTransferBytesRow{
    .name = "kv_transfer_bytes",
    .type = kHistogram,
    .source = kPart,
    .metric = kKvTransferBytes,
    .buckets = BucketSet::kKvBytes,
    .help = "Histogram of bytes moved by one KV cache transfer, by role.",
    .part = PartKind::kKvTransfer,
    .part_family = PartFamily::kKvTransferBytes};
constexpr FamilyDef kKvTransferFailuresRow{
    .name = "kv_transfer_failures",
    .type = kCounter,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "Failed KV cache transfers, by role and reason.",
    .part = PartKind::kKvTransfer,
    .part_family = PartFamily::kKvTransferFailures};
constexpr FamilyDef kSleepStateRow{
    .name = "engine_sleep_state",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help =
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
        "means engine is awake; weights_offloaded = 1 means sleep level 1; "
        "discard_all = 1 means sleep level 2.",
    .part = PartKind::kSleep,
    .part_family = PartFamily::kSleepState};
constexpr FamilyDef kSleepResourceStateRow{
    .name = "engine_sleep_resource_state",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help = "1 for the current state of each engine resource, 0 otherwise.",
    .part = PartKind::kSleep,
    .part_family = PartFamily::kSleepResourceState};
constexpr FamilyDef kFullyAwakeRow{
    .name = "engine_fully_awake",
    .type = kGauge,
    .source = kPart,
    .metric = kNumEngineMetrics,
    .buckets = BucketSet::kNone,
    .help =
        "1 when the scheduler runs and the weights and KV cache are resident.",
    .part = PartKind::kSleep,
    .part_family = PartFamily::kFullyAwake};

// vLLM v1 (v0.12), metrics-v1.md's table, then the router series.
// Dynamically initialized, from kEngineMetrics, which is constinit: it
// holds its values before any dynamic initializer runs, whatever the link
// order of the store library's objects.
const FamilyDef kVllm[] = {
    Catalog(kNumRequestsRunning),
    Catalog(kNumRequestsWaiting),
    Catalog(kKvCacheUsagePerc),
    Catalog(kPrefixCacheQueries),
    Catalog(kPrefixCacheHits),
    Catalog(kNumPreemptions),
    Catalog(kPromptTokens),
    Catalog(kGenerationTokens),
    Catalog(kRequestSuccess),
    Catalog(kTimeToFirstToken),
    Catalog(kInterTokenLatency),
    Catalog(kRequestTimePerOutputToken),
    Catalog(kE2eRequestLatency),
    Catalog(kRequestQueueTime),
    Catalog(kRequestPrefillTime),
    Catalog(kRequestDecodeTime),
    Catalog(kRequestInferenceTime),
    Catalog(kRequestPromptTokens),
    Catalog(kRequestGenerationTokens),
    Catalog(kRequestMaxNumGenerationTokens),
    Catalog(kRequestParamsMaxTokens),
    Catalog(kRequestParamsN),
    Catalog(kIterationTokens),
    Catalog(kSpecDecodeNumDrafts),
    Catalog(kSpecDecodeNumDraftTokens),
    Catalog(kSpecDecodeNumAcceptedTokens),
    Catalog(kSpecDecodeNumAcceptedTokensPerPos),
    kCacheConfigInfoRow,
    kLoraRequestsInfoRow,
    // --legacy-names: the pre-v1 names vLLM production-stack's router reads
    // (src/vllm_router/stats/engine_stats.py) and the ITL histogram's name
    // before 0.11.
    {"gpu_cache_usage_perc", kGauge, kMetric, kKvCacheUsagePerc,
     BucketSet::kNone,
     "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
     "vllm:kv_cache_usage_perc instead.",
     true},
    {"gpu_prefix_cache_queries", kCounter, kMetric, kPrefixCacheQueries,
     BucketSet::kNone,
     "GPU prefix cache queries, in terms of number of queried tokens. "
     "DEPRECATED: Use vllm:prefix_cache_queries instead.",
     true},
    {"gpu_prefix_cache_hits", kCounter, kMetric, kPrefixCacheHits,
     BucketSet::kNone,
     "GPU prefix cache hits, in terms of number of cached tokens. "
     "DEPRECATED: Use vllm:prefix_cache_hits instead.",
     true},
    {"gpu_prefix_cache_hit_rate",
     kGauge,
     kRatio,
     kPrefixCacheHits,
     BucketSet::kNone,
     "GPU prefix cache hit rate (hits / queries since the start).",
     true,
     {},
     kPrefixCacheQueries},
    {"time_per_output_token_seconds", kHistogram, kMetric, kInterTokenLatency,
     BucketSet::kItl,
     "Histogram of time per output token in seconds.DEPRECATED: Use "
     "vllm:inter_token_latency_seconds instead.",
     true},
    kMoeRoutedTokensRow,
    kMoeExpertTokensRow,
    kMoeLayerImbalanceRow,
    kMoeImbalanceRow,
    // Protocol 1.2.
    kAdmissionRejectionsRow,
    kWaitingByReasonRow,
    Catalog(kPromptTokensBySource),
    Catalog(kPromptTokensCached),
    Catalog(kRequestPrefillKvComputedTokens),
    Catalog(kRequestNumPreemptions),
    Catalog(kRequestKvWaitTime),
    kKvTransferTimeRow,
    kKvTransferBytesRow,
    kKvTransferFailuresRow,
    kSleepStateRow,
    kSleepResourceStateRow,
    kFullyAwakeRow,
};

// SGLang, its metrics collector at v0.5.12 (python/sglang/srt/observability/
// metrics_collector.py): the scheduler's gauges and the tokenizer's
// counters and histograms, with SGLang's buckets. docs/metrics.md says
// where the daemon's numbers come from.
const FamilyDef kSglang[] = {
    {"num_running_reqs", kGauge, kMetric, kNumRequestsRunning, BucketSet::kNone,
     "The number of running requests."},
    {"num_queue_reqs", kGauge, kMetric, kNumRequestsWaiting, BucketSet::kNone,
     "The number of requests in the waiting queue."},
    {"token_usage", kGauge, kMetric, kKvCacheUsagePerc, BucketSet::kNone,
     "The token usage."},
    {"gen_throughput", kGauge, kMetric, kWindowGenerationThroughput,
     BucketSet::kNone, "The generation throughput (token/s)."},
    {"cache_hit_rate", kGauge, kMetric, kWindowCacheHitRate, BucketSet::kNone,
     "The prefix cache hit rate."},
    {"spec_accept_length", kGauge, kMetric, kWindowSpecAcceptLength,
     BucketSet::kNone,
     "Mean acceptance length of speculative decoding (accepted drafts + "
     "bonus token per forward)."},
    {"spec_accept_rate", kGauge, kMetric, kWindowSpecAcceptRate,
     BucketSet::kNone,
     "Speculative acceptance rate (`accepted drafts / proposed drafts` in "
     "batch)."},
    {.name = "page_size",
     .type = kGauge,
     .source = kPart,
     .metric = kNumEngineMetrics,
     .buckets = BucketSet::kNone,
     .help = "KV cache page size in tokens.",
     .key = "page_size",
     .part = PartKind::kCacheConfig,
     .part_family = PartFamily::kCacheConfigValue},
    {.name = "num_pages",
     .type = kGauge,
     .source = kPart,
     .metric = kNumEngineMetrics,
     .buckets = BucketSet::kNone,
     .help = "Number of KV cache pages.",
     .key = "num_pages",
     .part = PartKind::kCacheConfig,
     .part_family = PartFamily::kCacheConfigValue},
    {"prompt_tokens", kCounter, kMetric, kPromptTokensAtFinish,
     BucketSet::kNone, "Number of prefill tokens processed."},
    {"generation_tokens", kCounter, kMetric, kGenerationTokensAtFinish,
     BucketSet::kNone, "Number of generation tokens processed."},
    {"cached_tokens",
     kCounter,
     kMetric,
     kPrefixCacheHits,
     BucketSet::kNone,
     "Number of cached prompt tokens by source (device/host/storage).",
     false,
     {},
     kNumEngineMetrics,
     false,
     "cache_source",
     "total"},
    {"num_requests", kCounter, kMetric, kNumFinishedRequests, BucketSet::kNone,
     "Number of requests processed."},
    {"num_aborted_requests", kCounter, kMetric, kNumAbortedRequests,
     BucketSet::kNone, "Number of requests aborted."},
    {"time_to_first_token_seconds", kHistogram, kMetric, kTimeToFirstToken,
     BucketSet::kSglangTtft, "Histogram of time to first token in seconds."},
    {"inter_token_latency_seconds", kHistogram, kMetric,
     kInterTokenLatencyPerToken, BucketSet::kSglangItl,
     "Histogram of inter-token latency in seconds."},
    {"e2e_request_latency_seconds", kHistogram, kMetric, kE2eRequestLatency,
     BucketSet::kSglangE2e,
     "Histogram of End-to-end request latency in seconds"},
    {"queue_time_seconds", kHistogram, kMetric, kRequestQueueTime,
     BucketSet::kSglangQueue, "Histogram of queueing time in seconds."},
    {"prompt_tokens_histogram", kHistogram, kMetric, kRequestPromptTokens,
     BucketSet::kSglangTokens, "Histogram of prompt token length."},
    {"generation_tokens_histogram", kHistogram, kMetric,
     kRequestGenerationTokens, BucketSet::kSglangTokens,
     "Histogram of generation token length."},
    // SGLang's own (before v0.5.12), which llm-d's endpoint picker reads.
    {.name = "cache_config_info",
     .type = kGauge,
     .source = kPart,
     .metric = kNumEngineMetrics,
     .buckets = BucketSet::kNone,
     .help = "Cache configuration information.",
     .part = PartKind::kCacheConfig,
     .part_family = PartFamily::kCacheConfigInfo},
    kLoraRequestsInfoRow,
    kMoeRoutedTokensRow,
    kMoeExpertTokensRow,
    kMoeLayerImbalanceRow,
    kMoeImbalanceRow,
    // Protocol 1.2: SGLang's own names where its collector has them
    // (v0.5.19, python/sglang/srt/observability/metrics_collector.py: the
    // queue rejections of PR #34320, the kv_transfer_* histograms in ms and
    // MB of PR #19009, the transfer failures; kv_transfer_metrics.py: the
    // timeouts), the vLLM suffixes for the rest.
    {.name = "num_queue_rejected_requests",
     .type = kCounter,
     .source = kPart,
     .metric = kNumEngineMetrics,
     .buckets = BucketSet::kNone,
     .help = "Number of requests rejected before entering the queue.",
     .part = PartKind::kAdmission,
     .part_family = PartFamily::kAdmissionRejections},
    kWaitingByReasonRow,
    Catalog(kPromptTokensBySource),
    Catalog(kPromptTokensCached),
    Catalog(kRequestPrefillKvComputedTokens),
    Catalog(kRequestNumPreemptions),
    Catalog(kRequestKvWaitTime),
    {.name = "kv_transfer_latency_ms",
     .type = kHistogram,
     .source = kPart,
     .metric = kKvTransferTime,
     .buckets = BucketSet::kSglangKvMs,
     .help = "Histogram of KV cache transfer latency in ms.",
     .part = PartKind::kKvTransfer,
     .part_family = PartFamily::kKvTransferTime,
     .divisor = 1e6},
    {.name = "kv_transfer_total_mb",
     .type = kHistogram,
     .source = kPart,
     .metric = kKvTransferBytes,
     .buckets = BucketSet::kSglangKvMb,
     .help = "Histogram of KV cache transfer size in MB.",
     .part = PartKind::kKvTransfer,
     .part_family = PartFamily::kKvTransferBytes,
     .divisor = 1048576},
    {.name = "num_transfer_failed_reqs",
     .type = kCounter,
     .source = kPart,
     .metric = kNumEngineMetrics,
     .buckets = BucketSet::kNone,
     .help = "Number of requests whose KV transfer failed.",
     .part = PartKind::kKvTransfer,
     .part_family = PartFamily::kKvTransferFailedTotal},
    {.name = "kv_transfer_timeouts",
     .type = kCounter,
     .source = kPart,
     .metric = kNumEngineMetrics,
     .buckets = BucketSet::kNone,
     .help = "KV timeout observations per sender/receiver, not unique failed "
             "requests.",
     .const_label = "stage",  // its values: KvTransferPart::kTimeoutStages
     .part = PartKind::kKvTransfer,
     .part_family = PartFamily::kKvTransferTimeouts},
    // SGLang has no failure series by role and reason: the vLLM suffix.
    kKvTransferFailuresRow,
    kSleepStateRow,
    kSleepResourceStateRow,
    kFullyAwakeRow,
};

// LMDeploy's finished_reason values: str() of its ResponseType members.
// LMDeploy itself counts FINISH only; an abort is its CANCEL, an error its
// INTERNAL_ENGINE_ERROR.
constexpr std::string_view kLmdeployReasons[] = {
    "ResponseType.FINISH", "ResponseType.FINISH", "ResponseType.CANCEL",
    "ResponseType.INTERNAL_ENGINE_ERROR"};

// LMDeploy, lmdeploy/metrics/loggers.py (v0.10): names, help and buckets
// as its PrometheusStatLogger declares them.
const FamilyDef kLmdeploy[] = {
    {"num_requests_running", kGauge, kMetric, kNumRequestsRunning,
     BucketSet::kNone, "Number of requests in model execution batches."},
    {"num_requests_waiting", kGauge, kMetric, kNumRequestsWaiting,
     BucketSet::kNone, "Number of requests waiting to be processed."},
    {"gpu_cache_usage_perc", kGauge, kMetric, kKvCacheUsagePerc,
     BucketSet::kNone, "GPU KV-cache usage. 1 means 100 percent usage."},
    {"prompt_tokens", kCounter, kMetric, kPromptTokens, BucketSet::kNone,
     "Number of prefill tokens processed."},
    {"generation_tokens", kCounter, kMetric, kGenerationTokens,
     BucketSet::kNone, "Number of generation tokens processed."},
    {"spec_decode_num_drafts", kCounter, kMetric, kSpecDecodeNumDrafts,
     BucketSet::kNone, "Number of speculative decoding drafts."},
    {"spec_decode_num_draft_tokens", kCounter, kMetric,
     kSpecDecodeNumDraftTokens, BucketSet::kNone,
     "Number of speculative decoding draft tokens."},
    {"spec_decode_num_accepted_tokens", kCounter, kMetric,
     kSpecDecodeNumAcceptedTokens, BucketSet::kNone,
     "Number of speculative decoding accepted tokens."},
    {"spec_decode_num_accepted_tokens_per_pos", kCounter, kMetric,
     kSpecDecodeNumAcceptedTokensPerPos, BucketSet::kNone,
     "Number of accepted speculative decoding tokens per draft position."},
    {"spec_decode_mean_accept_rate",
     kGauge,
     kRatio,
     kSpecDecodeNumAcceptedTokens,
     BucketSet::kNone,
     "Mean speculative decoding acceptance rate. 1 means 100 percent "
     "accepted.",
     false,
     {},
     kSpecDecodeNumDraftTokens},
    {"spec_decode_mean_accept_length",
     kGauge,
     kRatio,
     kSpecDecodeNumAcceptedTokens,
     BucketSet::kNone,
     "Mean speculative decoding acceptance length, including the bonus "
     "token.",
     false,
     {},
     kSpecDecodeNumDrafts,
     true},
    {"spec_decode_per_position_accept_rate",
     kGauge,
     kPerPositionRate,
     kSpecDecodeNumAcceptedTokensPerPos,
     BucketSet::kNone,
     "Speculative decoding acceptance rate per draft position. 1 means 100 "
     "percent accepted.",
     false,
     {},
     kSpecDecodeNumDrafts},
    {"request_success",
     kCounter,
     kMetric,
     kRequestSuccess,
     BucketSet::kNone,
     "Count of successfully processed requests.",
     false,
     {},
     kNumEngineMetrics,
     false,
     {},
     {},
     kLmdeployReasons},
    {"request_prompt_tokens", kHistogram, kMetric, kRequestPromptTokens,
     BucketSet::kTokens, "Number of prefill tokens processed."},
    {"request_generation_tokens", kHistogram, kMetric, kRequestGenerationTokens,
     BucketSet::kTokens, "Number of generation tokens processed."},
    {"iteration_tokens_total", kHistogram, kMetric, kIterationTokensChunk,
     BucketSet::kIteration, "Histogram of number of tokens per engine_step."},
    {"time_to_first_token_seconds", kHistogram, kMetric, kTimeToFirstToken,
     BucketSet::kTtft, "Histogram of time to first token in seconds."},
    {"time_per_output_token_seconds", kHistogram, kMetric,
     kTimePerOutputTokenChunk, BucketSet::kLmdeployItl,
     "Histogram of time per output token in seconds."},
    {"iter_token_latency", kHistogram, kMetric, kInterTokenLatency,
     BucketSet::kLmdeployItl, "Histogram of inter-token latency"},
    {"e2e_request_latency_seconds", kHistogram, kMetric, kE2eRequestLatency,
     BucketSet::kPhase, "Histogram of e2e request latency in seconds."},
    {"request_queue_time_seconds", kHistogram, kMetric, kRequestQueueTime,
     BucketSet::kPhase,
     "Histogram of time spent in WAITING phase for request."},
    {"request_inference_time_seconds", kHistogram, kMetric,
     kRequestInferenceToFinish, BucketSet::kPhase,
     "Histogram of time spent in RUNNING phase for request."},
    {"request_prefill_time_seconds", kHistogram, kMetric, kRequestPrefillTime,
     BucketSet::kPhase,
     "Histogram of time spent in PREFILL phase for request."},
    {"request_decode_time_seconds", kHistogram, kMetric, kRequestDecodeToFinish,
     BucketSet::kPhase, "Histogram of time spent in DECODE phase for request."},
    kCacheConfigInfoRow,
    kLoraRequestsInfoRow,
    kMoeRoutedTokensRow,
    kMoeExpertTokensRow,
    kMoeLayerImbalanceRow,
    kMoeImbalanceRow,
    // Protocol 1.2: LMDeploy's own cached-token series (v0.16.0,
    // lmdeploy/metrics/loggers.py: cached_tokens_total,
    // request_cached_tokens, request_cache_hit_ratio), the vLLM suffixes
    // for the rest (LMDeploy has no admission, KV-transfer, preemption or
    // sleep series).
    kAdmissionRejectionsRow,
    kWaitingByReasonRow,
    Catalog(kPromptTokensBySource),
    {.name = "cached_tokens",
     .type = kCounter,
     .source = kMetric,
     .metric = kPromptTokensCached,
     .buckets = BucketSet::kNone,
     .help = "Total prefix-cached input tokens served."},
    {.name = "request_cached_tokens",
     .type = kHistogram,
     .source = kMetric,
     .metric = kRequestCachedTokens,
     .buckets = BucketSet::kTokens,
     .help = "Number of prefix-cached input tokens per request."},
    {.name = "request_cache_hit_ratio",
     .type = kHistogram,
     .source = kMetric,
     .metric = kRequestCacheHitRatio,
     .buckets = BucketSet::kRatio,
     .help = "Prefix cache hit ratio per request."},
    Catalog(kRequestPrefillKvComputedTokens),
    Catalog(kRequestNumPreemptions),
    Catalog(kRequestKvWaitTime),
    kKvTransferTimeRow,
    kKvTransferBytesRow,
    kKvTransferFailuresRow,
    kSleepStateRow,
    kSleepResourceStateRow,
    kFullyAwakeRow,
};

}  // namespace

std::string_view ProfileName(Profile p) {
  switch (p) {
    case Profile::kVllm:
      return "vllm";
    case Profile::kSglang:
      return "sglang";
    case Profile::kLmdeploy:
      return "lmdeploy";
  }
  return "vllm";
}

std::optional<Profile> ParseProfile(std::string_view name) {
  for (int p = 0; p < kNumProfiles; ++p) {
    if (ProfileName(Profile(p)) == name) return Profile(p);
  }
  return std::nullopt;
}

Profile AutoProfile(std::string_view engine) {
  if (engine == "sglang") return Profile::kSglang;
  if (engine == "lmdeploy") return Profile::kLmdeploy;
  return Profile::kVllm;
}

std::span<const FamilyDef> ProfileFamilies(Profile p) {
  switch (p) {
    case Profile::kVllm:
      return kVllm;
    case Profile::kSglang:
      return kSglang;
    case Profile::kLmdeploy:
      return kLmdeploy;
  }
  return kVllm;
}

std::string_view FamilyName(const FamilyDef& f) {
  return f.name.empty() ? kEngineMetrics[f.metric].suffix : f.name;
}

std::string_view FamilyHelp(const FamilyDef& f) {
  return f.help.empty() && f.metric < kNumEngineMetrics
             ? kEngineMetrics[f.metric].help
             : f.help;
}

BucketSet ProfileBuckets(Profile p, EngineMetric m) {
  for (const FamilyDef& f : ProfileFamilies(p)) {
    if ((f.source == kMetric || f.source == kPart) && f.metric == m &&
        f.type == kHistogram) {
      return f.buckets;
    }
  }
  return kEngineMetrics[m].buckets;
}

double CatalogDivisor(EngineMetric m) {
  return kEngineMetrics[m].seconds ? 1e9 : 1.0;
}

double ProfileDivisor(Profile p, EngineMetric m) {
  for (const FamilyDef& f : ProfileFamilies(p)) {
    if ((f.source == kMetric || f.source == kPart) && f.metric == m &&
        f.type == kHistogram && f.divisor != 0) {
      return f.divisor;
    }
  }
  return CatalogDivisor(m);
}

bool ProfileUses(Profile p, EngineMetric m) {
  for (const FamilyDef& f : ProfileFamilies(p)) {
    const bool reads = f.source == kMetric || f.source == kRatio ||
                       f.source == kPerPositionRate;
    if (reads && (f.metric == m || f.metric2 == m)) return true;
  }
  return false;
}

std::string ProfileNamespace(Profile p, std::string_view engine,
                             std::string_view namespace_override) {
  if (!namespace_override.empty()) return std::string(namespace_override);
  if (p != Profile::kVllm) return std::string(ProfileName(p));
  return SanitizeNamespace(engine);
}

}  // namespace tokenmeter::daemon
