"""lmdeploy/metrics/loggers.py (v0.16.0), its behaviour reproduced.

PrometheusStatLogger is the reference the tokenmeter adapter is checked
against: the same series names, help texts, labels (model_name, engine =
str(dp_rank)), buckets and observations as LMDeploy's, with the same
prometheus_client calls per record_* call, on prometheus_client's default
registry (as LMDeploy's; a new one first unregisters every collector whose
name holds "lmdeploy"). LoggingStatLogger keeps LMDeploy's 10-second
throughput line.
"""
import time
from abc import ABC, abstractmethod
from datetime import datetime

import numpy as np

from lmdeploy.messages import ResponseType

# LMDeploy's bucket lists (loggers.py, v0.16.0).
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                            4096, 8192, 16384]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                640.0, 2560.0]
TOKEN_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                         0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                           15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                           480.0, 960.0, 1920.0, 7680.0]
HIT_RATIO_BUCKETS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


class StatLoggerBase(ABC):

    @abstractmethod
    def record_schedule(self, stats):
        ...

    @abstractmethod
    def record_iteration(self, stats):
        ...

    @abstractmethod
    def record_specdecode(self, stats):
        ...

    def log(self):  # noqa: B027 (LMDeploy's default does nothing)
        pass


class LoggingStatLogger(StatLoggerBase):
    """Token throughput since the last log() and the latest scheduler
    stats, printed by log() (every 10 s from the API server)."""

    def __init__(self, dp_rank=0):
        self.dp_rank = dp_rank
        self.last_scheduler_stats = None
        self._reset(time.perf_counter())

    def _reset(self, now):
        self.last_log_time = now
        self.total_prompt_tokens = 0
        self.total_generation_tokens = 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = None

    def record_schedule(self, stats):
        self.last_scheduler_stats = stats

    def record_iteration(self, stats):
        self.total_prompt_tokens += stats.prompt_tokens
        self.total_generation_tokens += stats.new_generation_tokens

    def record_specdecode(self, stats):
        if stats.num_drafts <= 0:
            return
        if self.num_accepted_tokens_per_pos is None:
            self.num_accepted_tokens_per_pos = np.zeros(stats.num_spec_tokens)
        self.num_drafts += stats.num_drafts
        self.num_draft_tokens += stats.num_draft_tokens
        self.num_accepted_tokens += stats.num_accepted_tokens
        self.num_accepted_tokens_per_pos += stats.num_accepted_tokens_per_pos

    def record_finish(self, stats):
        pass

    def log(self):
        now = time.perf_counter()
        if self.total_prompt_tokens == 0 and self.total_generation_tokens == 0:
            self._reset(now)
            return
        span = now - self.last_log_time
        s = self.last_scheduler_stats
        line = (f"[{datetime.fromtimestamp(time.time()):%Y-%m-%d %H:%M:%S} "
                f"DP{self.dp_rank}] Avg thr (in/out): "
                f"{self.total_prompt_tokens / span:.1f} / "
                f"{self.total_generation_tokens / span:.1f} tokens/s")
        if s is not None:
            line += (f", Engine (running/waiting): {s.num_running_reqs} / "
                     f"{s.num_waiting_reqs}, KV cache: "
                     f"{s.gpu_cache_usage * 100:.1f}%")
        print(line, flush=True)
        self._reset(now)


def _prometheus():
    import prometheus_client
    if hasattr(prometheus_client, "disable_created_metrics"):
        prometheus_client.disable_created_metrics()
    else:  # prometheus_client < 0.17 (Debian 12 has 0.16): the same switch
        import prometheus_client.metrics
        prometheus_client.metrics._use_created = False
    return prometheus_client


class PrometheusStatLogger(StatLoggerBase):

    def __init__(self, model_name, max_model_len, dp_rank=0):
        pc = _prometheus()
        self.dp_rank = dp_rank
        reg = pc.REGISTRY
        for collector in list(reg._collector_to_names):
            if "lmdeploy" in getattr(collector, "_name", ""):
                reg.unregister(collector)
        names = ["model_name", "engine"]
        values = [model_name, str(dp_rank)]
        self.info_backend_config = pc.Info(
            name="lmdeploy:backend_config",
            documentation="information of backend_config")

        def gauge(name, doc):
            return pc.Gauge(name=name, documentation=doc,
                            labelnames=names).labels(*values)

        def counter(name, doc):
            return pc.Counter(name=name, documentation=doc,
                              labelnames=names).labels(*values)

        def histogram(name, doc, buckets):
            return pc.Histogram(name=name, documentation=doc,
                                buckets=buckets,
                                labelnames=names).labels(*values)

        p = "lmdeploy:"
        self.gauge_scheduler_succeeded = gauge(
            p + "num_requests_succeeded", "Number of current succeeded requests.")
        self.gauge_scheduler_failed = gauge(
            p + "num_requests_failed", "Number of current failed requests.")
        self.gauge_scheduler_api_routed = gauge(
            p + "num_api_requests_routed",
            "Number of requests routed to request handles.")
        self.gauge_scheduler_api_waiting = gauge(
            p + "num_api_requests_waiting",
            "Number of requests waiting for free request handles.")
        self.gauge_scheduler_running = gauge(
            p + "num_requests_running",
            "Number of requests in model execution batches.")
        self.gauge_scheduler_waiting = gauge(
            p + "num_requests_waiting",
            "Number of requests waiting to be processed.")
        self.gauge_gpu_cache_usage = gauge(
            p + "gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.")
        self.gauge_prefix_cache_hit_rate = gauge(
            p + "prefix_cache_hit_rate",
            "Prefix-cache hit rate. 1 means 100 percent of queried prefix "
            "tokens hit.")
        self.counter_prompt_tokens = counter(
            p + "prompt_tokens_total", "Number of prefill tokens processed.")
        self.counter_generation_tokens = counter(
            p + "generation_tokens_total",
            "Number of generation tokens processed.")
        self.counter_spec_decode_num_drafts = counter(
            p + "spec_decode_num_drafts_total",
            "Number of speculative decoding drafts.")
        self.counter_spec_decode_num_draft_tokens = counter(
            p + "spec_decode_num_draft_tokens_total",
            "Number of speculative decoding draft tokens.")
        self.counter_spec_decode_num_accepted_tokens = counter(
            p + "spec_decode_num_accepted_tokens_total",
            "Number of speculative decoding accepted tokens.")
        self._per_pos_counter_family = pc.Counter(
            name=p + "spec_decode_num_accepted_tokens_per_pos_total",
            documentation="Number of accepted speculative decoding tokens "
            "per draft position.", labelnames=names + ["position"])
        self._per_pos_gauge_family = pc.Gauge(
            name=p + "spec_decode_per_position_accept_rate",
            documentation="Speculative decoding acceptance rate per draft "
            "position. 1 means 100 percent accepted.",
            labelnames=names + ["position"])
        self._per_pos = {}  # position -> (counter, gauge)
        self._values = values
        self.gauge_spec_decode_mean_accept_rate = gauge(
            p + "spec_decode_mean_accept_rate",
            "Mean speculative decoding acceptance rate. 1 means 100 percent "
            "accepted.")
        self.gauge_spec_decode_mean_accept_length = gauge(
            p + "spec_decode_mean_accept_length",
            "Mean speculative decoding acceptance length, including the "
            "bonus token.")
        success = pc.Counter(
            name=p + "request_success_total",
            documentation="Count of successfully processed requests.",
            labelnames=names + ["finished_reason"])
        # One child per ResponseType, made up front (all show 0).
        self.counter_request_success = {
            r: success.labels(*values, str(r)) for r in ResponseType}
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.histogram_num_prompt_tokens_request = histogram(
            p + "request_prompt_tokens", "Number of prefill tokens processed.",
            token_buckets)
        self.histogram_num_generation_tokens_request = histogram(
            p + "request_generation_tokens",
            "Number of generation tokens processed.", token_buckets)
        self.histogram_num_cached_tokens_request = histogram(
            p + "request_cached_tokens",
            "Number of prefix-cached input tokens per request.",
            token_buckets)
        self.histogram_cache_hit_ratio_request = histogram(
            p + "request_cache_hit_ratio",
            "Prefix cache hit ratio (cached_tokens / prompt_tokens) per "
            "request.", HIT_RATIO_BUCKETS)
        self.counter_cached_tokens_total = counter(
            p + "cached_tokens_total", "Total prefix-cached input tokens served.")
        self.histogram_iteration_tokens = histogram(
            p + "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS)
        self.histogram_time_to_first_token = histogram(
            p + "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.histogram_time_per_output_token = histogram(
            p + "time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TOKEN_LATENCY_BUCKETS)
        self.histogram_iter_token_latency = histogram(
            p + "iter_token_latency", "Histogram of inter-token latency",
            TOKEN_LATENCY_BUCKETS)
        self.histogram_e2e_time_request = histogram(
            p + "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS)
        self.histogram_queue_time_request = histogram(
            p + "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS)
        self.histogram_inference_time_request = histogram(
            p + "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS)
        self.histogram_prefill_time_request = histogram(
            p + "request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS)
        self.histogram_decode_time_request = histogram(
            p + "request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS)

    def record_schedule(self, stats):
        self.gauge_scheduler_succeeded.set(stats.num_succeeded_reqs)
        self.gauge_scheduler_failed.set(stats.num_failed_reqs)
        self.gauge_scheduler_api_routed.set(stats.num_api_routed_reqs)
        self.gauge_scheduler_api_waiting.set(stats.num_api_waiting_reqs)
        self.gauge_scheduler_running.set(stats.num_running_reqs)
        self.gauge_scheduler_waiting.set(stats.num_waiting_reqs)
        self.gauge_gpu_cache_usage.set(stats.gpu_cache_usage)
        self.gauge_prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)

    def record_iteration(self, stats):
        self.counter_prompt_tokens.inc(stats.prompt_tokens)
        self.counter_generation_tokens.inc(stats.new_generation_tokens)
        self.histogram_iteration_tokens.observe(stats.prompt_tokens +
                                                stats.new_generation_tokens)
        # Truthiness, as LMDeploy tests them: None and 0.0 are skipped.
        if stats.ttft:
            self.histogram_time_to_first_token.observe(stats.ttft)
        if stats.tpot:
            self.histogram_time_per_output_token.observe(stats.tpot)
        if stats.itl:
            self.histogram_iter_token_latency.observe(stats.itl)

    def record_finish(self, stats):
        self.counter_request_success[stats.finish_reason].inc()
        self.histogram_e2e_time_request.observe(stats.e2e_latency)
        self.histogram_queue_time_request.observe(stats.queued_time_interval)
        self.histogram_prefill_time_request.observe(
            stats.prefill_time_interval)
        self.histogram_inference_time_request.observe(
            stats.inference_time_interval)
        self.histogram_decode_time_request.observe(stats.decode_time_interval)
        self.histogram_num_prompt_tokens_request.observe(stats.prompt_tokens)
        self.histogram_num_generation_tokens_request.observe(
            stats.generation_tokens)
        self.histogram_num_cached_tokens_request.observe(stats.cached_tokens)
        if stats.prompt_tokens > 0:
            self.histogram_cache_hit_ratio_request.observe(
                stats.cached_tokens / stats.prompt_tokens)
        self.counter_cached_tokens_total.inc(stats.cached_tokens)

    def record_specdecode(self, stats):
        if stats.num_drafts <= 0:
            return
        self.counter_spec_decode_num_drafts.inc(stats.num_drafts)
        self.counter_spec_decode_num_draft_tokens.inc(stats.num_draft_tokens)
        self.counter_spec_decode_num_accepted_tokens.inc(
            stats.num_accepted_tokens)
        # The gauges from the counters' running totals (LMDeploy reads them
        # back from the counter children).
        drafts = self.counter_spec_decode_num_drafts._value.get()
        drafted = self.counter_spec_decode_num_draft_tokens._value.get()
        accepted = self.counter_spec_decode_num_accepted_tokens._value.get()
        self.gauge_spec_decode_mean_accept_rate.set(
            accepted / drafted if drafted > 0 else 0.0)
        self.gauge_spec_decode_mean_accept_length.set(1 + accepted / drafts)
        for pos, n in enumerate(stats.num_accepted_tokens_per_pos):
            pair = self._per_pos.get(pos)
            if pair is None:
                labels = self._values + [str(pos)]
                pair = (self._per_pos_counter_family.labels(*labels),
                        self._per_pos_gauge_family.labels(*labels))
                self._per_pos[pos] = pair
            pair[0].inc(float(n))
            pair[1].set(pair[0]._value.get() / drafts)


def build_buckets(mantissa_lst, max_value):
    """m * 10**e for e = 0, 1, ... and each mantissa m, while <= max_value."""
    out = []
    exponent = 0
    while True:
        for m in mantissa_lst:
            v = m * 10 ** exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


def build_1_2_5_buckets(max_value):
    return build_buckets([1, 2, 5], max_value)
