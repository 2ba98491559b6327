"""What SGLang's own Prometheus collector computes, written for these tests
from reading SGLang (sgl-project/sglang main 8905cbd, after v0.5.15):

* python/sglang/srt/observability/metrics_collector.py,
  TokenizerMetricsCollector: prompt_tokens_total, generation_tokens_total,
  cached_tokens_total{cache_source}, num_requests_total,
  num_aborted_requests_total and the histograms time_to_first_token_seconds,
  inter_token_latency_seconds, e2e_request_latency_seconds,
  prompt_tokens_histogram, uncached_prompt_tokens_histogram,
  generation_tokens_histogram, with their default buckets;
  SchedulerMetricsCollector's queue_time_seconds (observed by the scheduler
  at a request's first forward entry, req_time_stats.py
  set_forward_entry_time).
* python/sglang/srt/managers/tokenizer_manager.py, collect_metrics(): on a
  request's first output TTFT (first output - received), on each later
  output with new tokens one inter-token observation of interval / new
  tokens weighted by the new tokens (the bucket gets n, _sum the whole
  interval), at its finish observe_one_finished_request(); abort_request()
  counts num_aborted_requests_total (a client's abort, not a finish reason).

Same names, help, label names and buckets, on a private prometheus_client
registry; no SGLang code is copied.
"""
from prometheus_client import CollectorRegistry, Counter, Histogram

TOKEN_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000,
    8000, 9000, 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500,
    30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
    600000, 800000, 1000000, 1100000)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80,
                100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80,
               100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025,
               0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400,
               0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2,
                 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200,
                 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600,
                 1800, 2000, 2500, 3000)


class SGLangCollector:
    """The tokenizer manager's and the scheduler's request metrics for one
    server whose labels are `labels` (SGLang: model_name and its rank
    labels)."""

    def __init__(self, labels):
        self.labels = dict(labels)
        names = list(self.labels)
        r = self.registry = CollectorRegistry()

        def counter(name, doc, extra=()):
            return Counter("sglang:" + name, doc, names + list(extra),
                           registry=r)

        def histogram(name, doc, buckets):
            return Histogram("sglang:" + name, doc, names, buckets=buckets,
                             registry=r)
        self.prompt_tokens_total = counter(
            "prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens_total = counter(
            "generation_tokens_total",
            "Number of generation tokens processed.")
        self.prompt_tokens_histogram = histogram(
            "prompt_tokens_histogram", "Histogram of prompt token length.",
            TOKEN_BUCKETS)
        self.uncached_prompt_tokens_histogram = histogram(
            "uncached_prompt_tokens_histogram",
            "Histogram of uncached (compute) prompt token length.",
            TOKEN_BUCKETS)
        self.generation_tokens_histogram = histogram(
            "generation_tokens_histogram",
            "Histogram of generation token length.", TOKEN_BUCKETS)
        self.cached_tokens_total = counter(
            "cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            ["cache_source"])
        self.num_requests_total = counter("num_requests_total",
                                          "Number of requests processed.")
        self.num_aborted_requests_total = counter(
            "num_aborted_requests_total", "Number of requests aborted.")
        self.ttft = histogram("time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in "
                             "seconds", E2E_BUCKETS)
        self.queue_time = histogram("queue_time_seconds",
                                    "Histogram of queueing time in seconds.",
                                    QUEUE_BUCKETS)

    # The tokenizer manager's calls (its collect_metrics / abort_request).
    def observe_one_finished_request(self, prompt_tokens, generation_tokens,
                                     cached_tokens, e2e_latency,
                                     cached_tokens_details=None):
        lb = self.labels
        self.prompt_tokens_total.labels(**lb).inc(prompt_tokens)
        self.generation_tokens_total.labels(**lb).inc(generation_tokens)
        if cached_tokens > 0:
            if cached_tokens_details:
                for source in ("device", "host"):
                    n = cached_tokens_details.get(source, 0)
                    if n > 0:
                        self.cached_tokens_total.labels(
                            **lb, cache_source=source).inc(n)
            else:
                self.cached_tokens_total.labels(
                    **lb, cache_source="total").inc(cached_tokens)
        self.num_requests_total.labels(**lb).inc()
        self.e2e.labels(**lb).observe(float(e2e_latency))
        self.prompt_tokens_histogram.labels(**lb).observe(
            float(prompt_tokens))
        self.uncached_prompt_tokens_histogram.labels(**lb).observe(
            float(prompt_tokens - cached_tokens))
        self.generation_tokens_histogram.labels(**lb).observe(
            float(generation_tokens))

    def observe_time_to_first_token(self, value):
        self.ttft.labels(**self.labels).observe(value)

    def observe_inter_token_latency(self, interval, num_new_tokens):
        """interval / n counted n times in its bucket, _sum += interval
        (prometheus_client has no weighted observe: n observations of
        interval / n, whose sum is interval up to float rounding)."""
        h = self.itl.labels(**self.labels)
        per_token = interval / num_new_tokens
        for _ in range(num_new_tokens):
            h.observe(per_token)

    def observe_one_aborted_request(self):
        self.num_aborted_requests_total.labels(**self.labels).inc()

    # The scheduler's.
    def observe_queue_time(self, latency):
        self.queue_time.labels(**self.labels).observe(latency)

    def samples(self):
        """{(name, frozenset(labels)): value} of every sample."""
        out = {}
        for fam in self.registry.collect():
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out
