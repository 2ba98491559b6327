// The one table of every series tokenmeterd exposes (docs/metrics.md is
// checked against it by a test). Engine series are named <ns>:<suffix>;
// daemon series are named in full.
#ifndef TOKENMETER_DAEMON_STORE_CATALOG_H_
#define TOKENMETER_DAEMON_STORE_CATALOG_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tokenmeter::daemon {

enum class MetricType : uint8_t { kCounter, kGauge, kHistogram };
std::string_view MetricTypeName(MetricType type);

// Default bucket sets of the engine histograms.
enum class BucketSet : uint8_t {
  kNone,
  kTtft,       // seconds
  kItl,        // seconds (ITL and TPOT)
  kPhase,      // seconds (e2e, queue, prefill, decode, inference)
  kTokens,     // 1-2-5 series up to --max-model-len
  kIteration,  // tokens per scheduler iteration
  kParamsN,    // 1 2 5 10 20
  // SGLang's defaults (its metrics collector).
  kSglangTtft,
  kSglangItl,
  kSglangE2e,
  kSglangQueue,
  kSglangTokens,
  // LMDeploy's time per output token and inter-token latency.
  kLmdeployItl,
  kMoeImbalance,  // 1 1.05 1.1 1.25 1.5 2 3 5 10 20 (max / mean)
  kPreemptions,   // 0 1 2 3 4 5 10 20 (PREEMPTED events per request)
  kKvBytes,       // 2^11, 2^13, ..., 2^33 (KV_TRANSFER bytes)
  kRatio,         // 0 0.1 0.2 ... 1 (LMDeploy's cache hit ratio)
  kSglangKvMs,    // SGLang's KV transfer latency, ms
  kSglangKvMb,    // SGLang's KV transfer size, MB
};

// The engine metrics the daemon measures, by the names of the vLLM
// catalog (metrics-v1.md; the vllm profile shows them in this order). What
// each naming profile exposes, under which names and buckets, is the
// profile's table (profile.h). Values index kEngineMetrics.
enum EngineMetric : uint8_t {
  kNumRequestsRunning,
  kNumRequestsWaiting,
  kKvCacheUsagePerc,
  kPrefixCacheQueries,
  kPrefixCacheHits,
  kNumPreemptions,
  kPromptTokens,
  kGenerationTokens,
  kRequestSuccess,
  kTimeToFirstToken,
  kInterTokenLatency,
  kRequestTimePerOutputToken,
  kE2eRequestLatency,
  kRequestQueueTime,
  kRequestPrefillTime,
  kRequestDecodeTime,
  kRequestInferenceTime,
  kRequestPromptTokens,
  kRequestGenerationTokens,
  kRequestMaxNumGenerationTokens,
  kRequestParamsMaxTokens,
  kRequestParamsN,
  kIterationTokens,
  // Not in the vLLM catalog, measured for the profiles that show them
  // (EngineSeries::uses()). Histograms first (contiguous with the above):
  kTimePerOutputTokenChunk,    // LMDeploy: each TOKENS after the first,
                               // interval / n
  kInterTokenLatencyPerToken,  // SGLang: interval / n, weight n
  kIterationTokensChunk,       // LMDeploy: per TOKENS, n (+ prompt at first)
  kRequestDecodeToFinish,      // LMDeploy: FINISHED - first TOKENS
  kRequestInferenceToFinish,   // LMDeploy: FINISHED - SCHEDULED
  kMoeImbalance,               // every profile: max / mean per EXPERT_LOAD
  // Protocol 1.2 (metrics-v1.md "Catalog 1.2 additions"), histograms.
  kRequestPrefillKvComputedTokens,  // prompt - cached - external, FINISHED
  kRequestNumPreemptions,           // PREEMPTED events, at FINISHED
  kRequestKvWaitTime,               // first ok recv - SCHEDULED, FINISHED
  kRequestCachedTokens,             // LMDeploy: cached + external, at FINISHED
  kRequestCacheHitRatio,            // LMDeploy: (cached + external) / prompt
  // KV_TRANSFER t - start and bytes: the layouts of the KV-transfer part's
  // per-role histograms (store/parts/kv_transfer.h); the series' own
  // histograms of these two stay empty.
  kKvTransferTime,
  kKvTransferBytes,
  kSpecDecodeNumDrafts,
  kSpecDecodeNumDraftTokens,
  kSpecDecodeNumAcceptedTokens,
  kSpecDecodeNumAcceptedTokensPerPos,
  // Not in the vLLM catalog: counters at FINISHED (SGLang).
  kPromptTokensAtFinish,
  kGenerationTokensAtFinish,
  kNumFinishedRequests,
  kNumAbortedRequests,
  // Not in the vLLM catalog: gauges over the summary window (SGLang's
  // gen_throughput, cache_hit_rate, spec_accept_length, spec_accept_rate).
  kWindowGenerationThroughput,
  kWindowCacheHitRate,
  kWindowSpecAcceptLength,
  kWindowSpecAcceptRate,
  // Protocol 1.2: prompt tokens by where they came from, at the first
  // TOKENS (SCHEDULED info).
  kPromptTokensBySource,  // own label source (kPromptSourceValues)
  kPromptTokensCached,    // local_cache_hit + external_kv_transfer
  kNumEngineMetrics,
};
// Histograms are contiguous: kTimeToFirstToken .. kLastHistogram.
inline constexpr EngineMetric kLastHistogram = kKvTransferBytes;

struct EngineMetricDef {
  EngineMetric id;
  std::string_view suffix;  // counters without _total
  MetricType type;
  std::string_view own_label;  // "", "finished_reason" or "position"
  BucketSet buckets;           // histograms only
  bool seconds;                // histogram of nanosecond observations
  std::string_view help;
  // Observed per request (latency and token histograms, request_success,
  // prompt_tokens, generation_tokens): carries the per-request labels.
  bool request_level;
};
extern const EngineMetricDef kEngineMetrics[kNumEngineMetrics];

// The values of a fixed own label, in exposition order (every value is
// rendered, 0 included): request_success's finished_reason ("stop",
// "length", "abort", "error": the order of the protocol's reasons). Empty
// for scalar metrics and for an own label whose values are indices that
// appear as they are counted (spec_decode_num_accepted_tokens_per_pos).
std::span<const std::string_view> FixedLabelValues(EngineMetric m);
inline constexpr std::string_view kFinishedReasonValues[] = {"stop", "length",
                                                             "abort", "error"};
// prompt_tokens_by_source's source values, in exposition order.
inline constexpr std::string_view kPromptSourceValues[] = {
    "local_compute", "local_cache_hit", "external_kv_transfer"};
enum PromptSource : uint8_t { kLocalCompute, kLocalCacheHit, kExternalKv };

// Snapshot formats 1 to 4 saved the values of the catalog of 1.1 (41
// metrics, 20 histograms) without a length: the id now of the metric at
// index `i` of that catalog.
inline constexpr size_t kFormat4Metrics = 41;
inline constexpr size_t kFormat4Histograms = 20;
inline constexpr EngineMetric Format4Metric(size_t i) {
  return EngineMetric(i <= size_t(kMoeImbalance)
                          ? i
                          : i + size_t(kLastHistogram - kMoeImbalance));
}

// Daemon series (tokenmeter_* and process_*), in exposition order.
enum DaemonMetric : uint8_t {
  kBuildInfo,
  kIngestConnections,
  kIngestFrames,
  kIngestEvents,
  kIngestErrors,
  kIngestDuplicateBatches,
  kClientDroppedEvents,
  kTrackedRequests,
  kEvictedRequests,
  kIncompleteIntervals,
  kNegativeIntervals,
  kScrapeDuration,
  kHttpResponses,
  kHttpConnectionsRejected,
  kRequestLabelOverflow,
  kStateSnapshots,
  kStateRestored,
  kOtlpSpans,
  kOtlpExportSeconds,
  kOtlpQueueSpans,
  kProcessCpuSeconds,
  kProcessResidentMemory,
  kProcessVirtualMemory,
  kProcessOpenFds,
  kProcessMaxFds,
  kProcessStartTime,
  kNumDaemonMetrics,
};

struct DaemonMetricDef {
  DaemonMetric id;
  std::string_view name;  // counters without _total
  MetricType type;
  std::string_view labels;  // comma-separated label names, or ""
  std::string_view help;
};
extern const DaemonMetricDef kDaemonMetrics[kNumDaemonMetrics];
// The label value of what a cap leaves no place of its own: request-label
// values past --request-label-values, reasons past the 16 a series keeps.
inline constexpr std::string_view kOverflowLabelValue = "__other__";
// Whether the daemon family `name` (as kDaemonMetrics names it) counts
// from this process's start rather than from the daemon state's: the
// process_* families and the OTLP exporters' (tokenmeter_otlp_*), which no
// state snapshot holds. Their OTLP start time is the process's. O(1).
bool CountsFromProcessStart(std::string_view name);

// The default bounds of a bucket set (exposed units).
std::vector<double> DefaultBuckets(BucketSet set, uint64_t max_model_len);
// Mantissas 1, 2, 5 times powers of ten, every value <= max (max >= 1).
std::vector<double> OneTwoFive(uint64_t max);

// The intervals the tracker measures: the `interval` label values.
enum class Interval : uint8_t {
  kTtft,
  kItl,
  kE2e,
  kQueue,
  kPrefill,
  kDecode,
  kInference,
  kTpot,
  kKvWait,  // protocol 1.2: first successful recv - SCHEDULED
  kCount,
};
std::string_view IntervalName(Interval interval);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_CATALOG_H_
