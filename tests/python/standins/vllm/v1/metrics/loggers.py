"""vllm.v1.metrics.loggers at v0.12: the stat-logger interface, plugin
loading, the manager AsyncLLM drives, and PrometheusStatLogger.

The interface and the manager's dispatch are vLLM's (class and method
names, signatures, which logger gets which call). PrometheusStatLogger is a
reimplementation, from reading vLLM's, of what its logger computes with
prometheus_client from the same stats: the same families (names, types,
label names, buckets) and the same observations per record(); it is the
reference tokenmeterd's series are compared with. It registers into
PrometheusStatLogger.registry (prometheus_client's default registry, as
vLLM's does, unless a test sets another), first unregistering the vllm:
families a previous logger left there."""
import logging
from abc import ABC, abstractmethod

import prometheus_client

from vllm.plugins import STAT_LOGGER_PLUGINS_GROUP, load_plugins_by_group
from vllm.v1.engine import FinishReason

logger = logging.getLogger(__name__)


class StatLoggerBase(ABC):
    """What AsyncLLM calls on every stat logger."""

    @abstractmethod
    def __init__(self, vllm_config, engine_index=0): ...

    @abstractmethod
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx=0): ...

    @abstractmethod
    def log_engine_initialized(self): ...

    def log(self):  # noqa: B027
        pass

    def record_sleep_state(self, is_awake, level):  # noqa: B027
        pass


class AggregateStatLoggerBase(StatLoggerBase):
    """A logger that sees every data-parallel engine."""

    @abstractmethod
    def __init__(self, vllm_config, engine_indexes): ...


def load_stat_logger_plugin_factories():
    factories = []
    for name, cls in load_plugins_by_group(STAT_LOGGER_PLUGINS_GROUP).items():
        if not isinstance(cls, type) or not issubclass(cls, StatLoggerBase):
            raise TypeError(f"Stat logger plugin {name!r} must be a subclass "
                            f"of StatLoggerBase (got {cls!r}).")
        factories.append(cls)
    return factories


class PerEngineStatLoggerAdapter(AggregateStatLoggerBase):
    """One per-engine logger per engine index. It forwards record(), log()
    and log_engine_initialized(), not record_sleep_state() (vLLM's does
    not either)."""

    def __init__(self, vllm_config, engine_indexes, per_engine_factory):
        self.loggers = {i: per_engine_factory(vllm_config, i)
                        for i in engine_indexes}

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx=0):
        if engine_idx in self.loggers:
            self.loggers[engine_idx].record(
                scheduler_stats, iteration_stats,
                mm_cache_stats=mm_cache_stats, engine_idx=engine_idx)

    def log(self):
        for x in self.loggers.values():
            x.log()

    def log_engine_initialized(self):
        for x in self.loggers.values():
            x.log_engine_initialized()


def build_1_2_5_buckets(max_value):
    """1, 2, 5, 10, 20, 50, ... up to max_value."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                    960.0, 1920.0, 7680.0]
_ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                      8192, 16384]


class PrometheusStatLogger(AggregateStatLoggerBase):
    registry = prometheus_client.REGISTRY

    def __init__(self, vllm_config, engine_indexes=None):
        self.engine_indexes = engine_indexes or [0]
        self.vllm_config = vllm_config
        reg = self.registry
        for c in list(reg._collector_to_names):
            if any(n.startswith("vllm:") for n in reg._collector_to_names[c]):
                reg.unregister(c)
        model = vllm_config.model_config.served_model_name
        max_len = vllm_config.model_config.max_model_len
        self.show_hidden = \
            vllm_config.observability_config.show_hidden_metrics
        labels = ["model_name", "engine"]

        def per_engine(kind, name, extra_labels=(), **kw):
            m = kind(name, name, labelnames=labels + list(extra_labels),
                     registry=reg, **kw)
            if extra_labels:
                return m
            return {i: m.labels(model, str(i)) for i in self.engine_indexes}

        G, C, H = (prometheus_client.Gauge, prometheus_client.Counter,
                   prometheus_client.Histogram)
        self.running = per_engine(G, "vllm:num_requests_running")
        self.waiting = per_engine(G, "vllm:num_requests_waiting")
        sleep = per_engine(G, "vllm:engine_sleep_state", ["sleep_state"])
        self.sleep = {s: {i: sleep.labels(model, str(i), s)
                          for i in self.engine_indexes}
                      for s in ("awake", "weights_offloaded", "discard_all")}
        self.record_sleep_state()
        self.kv_usage = per_engine(G, "vllm:kv_cache_usage_perc")
        self.prefix_queries = per_engine(C, "vllm:prefix_cache_queries")
        self.prefix_hits = per_engine(C, "vllm:prefix_cache_hits")
        self.ext_queries = per_engine(C, "vllm:external_prefix_cache_queries")
        self.ext_hits = per_engine(C, "vllm:external_prefix_cache_hits")
        self.mm_queries = per_engine(C, "vllm:mm_cache_queries")
        self.mm_hits = per_engine(C, "vllm:mm_cache_hits")
        self.preemptions = per_engine(C, "vllm:num_preemptions")
        self.prompt_tokens = per_engine(C, "vllm:prompt_tokens")
        self.generation_tokens = per_engine(C, "vllm:generation_tokens")
        success = per_engine(C, "vllm:request_success", ["finished_reason"])
        self.success = {r: {i: success.labels(model, str(i), str(r))
                            for i in self.engine_indexes}
                        for r in FinishReason}
        tokens = build_1_2_5_buckets(max_len)
        self.req_prompt = per_engine(H, "vllm:request_prompt_tokens",
                                     buckets=tokens)
        self.req_generation = per_engine(H, "vllm:request_generation_tokens",
                                         buckets=tokens)
        self.iteration = per_engine(H, "vllm:iteration_tokens_total",
                                    buckets=_ITERATION_BUCKETS)
        self.max_generation = per_engine(
            H, "vllm:request_max_num_generation_tokens", buckets=tokens)
        self.n_param = per_engine(H, "vllm:request_params_n",
                                  buckets=[1, 2, 5, 10, 20])
        self.max_tokens = per_engine(H, "vllm:request_params_max_tokens",
                                     buckets=tokens)
        self.ttft = per_engine(H, "vllm:time_to_first_token_seconds",
                               buckets=_TTFT_BUCKETS)
        if self.show_hidden:
            self.tpot_hidden = per_engine(
                H, "vllm:time_per_output_token_seconds", buckets=_ITL_BUCKETS)
        self.itl = per_engine(H, "vllm:inter_token_latency_seconds",
                              buckets=_ITL_BUCKETS)
        self.req_tpot = per_engine(
            H, "vllm:request_time_per_output_token_seconds",
            buckets=_ITL_BUCKETS)
        self.e2e = per_engine(H, "vllm:e2e_request_latency_seconds",
                              buckets=_REQUEST_BUCKETS)
        self.queue = per_engine(H, "vllm:request_queue_time_seconds",
                                buckets=_REQUEST_BUCKETS)
        self.inference = per_engine(H, "vllm:request_inference_time_seconds",
                                    buckets=_REQUEST_BUCKETS)
        self.prefill = per_engine(H, "vllm:request_prefill_time_seconds",
                                  buckets=_REQUEST_BUCKETS)
        self.decode = per_engine(H, "vllm:request_decode_time_seconds",
                                 buckets=_REQUEST_BUCKETS)
        # Speculative decoding, when configured: four counters, the last
        # one per draft position (every position from the start).
        spec = vllm_config.speculative_config
        self.spec = None
        if spec is not None:
            self.spec = (per_engine(C, "vllm:spec_decode_num_drafts"),
                         per_engine(C, "vllm:spec_decode_num_draft_tokens"),
                         per_engine(C, "vllm:spec_decode_num_accepted_tokens"))
            per_pos = per_engine(C,
                                 "vllm:spec_decode_num_accepted_tokens_per_pos",
                                 ["position"])
            self.spec_pos = {
                i: [per_pos.labels(model, str(i), str(p))
                    for p in range(spec.num_speculative_tokens)]
                for i in self.engine_indexes}
        self.lora_info = None
        if vllm_config.lora_config is not None:
            self.max_lora = vllm_config.lora_config.max_loras
            self.lora_info = G("vllm:lora_requests_info",
                               "vllm:lora_requests_info",
                               ["max_lora", "waiting_lora_adapters",
                                "running_lora_adapters"], registry=reg)

    def log_engine_initialized(self):
        info = self.vllm_config.cache_config.metrics_info()
        gauge = prometheus_client.Gauge(
            "vllm:cache_config_info", "vllm:cache_config_info",
            list(info) + ["engine"], registry=self.registry)
        for i in self.engine_indexes:
            gauge.labels(**info, engine=str(i)).set(1)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx=0):
        i = engine_idx
        s = scheduler_stats
        if s is not None:
            self.running[i].set(s.num_running_reqs)
            self.waiting[i].set(s.num_waiting_reqs)
            self.kv_usage[i].set(s.kv_cache_usage)
            self.prefix_queries[i].inc(s.prefix_cache_stats.queries)
            self.prefix_hits[i].inc(s.prefix_cache_stats.hits)
            if s.connector_prefix_cache_stats is not None:
                self.ext_queries[i].inc(s.connector_prefix_cache_stats.queries)
                self.ext_hits[i].inc(s.connector_prefix_cache_stats.hits)
            sd = s.spec_decoding_stats
            if sd is not None and self.spec is not None:
                drafts, draft_tokens, accepted = self.spec
                drafts[i].inc(sd.num_drafts)
                draft_tokens[i].inc(sd.num_draft_tokens)
                accepted[i].inc(sd.num_accepted_tokens)
                for pos, counter in enumerate(self.spec_pos[i]):
                    counter.inc(sd.num_accepted_tokens_per_pos[pos])
            if self.lora_info is not None:
                self.lora_info.labels(
                    max_lora=self.max_lora,
                    waiting_lora_adapters=",".join(s.waiting_lora_adapters),
                    running_lora_adapters=",".join(s.running_lora_adapters),
                ).set_to_current_time()
        if mm_cache_stats is not None:
            self.mm_queries[i].inc(mm_cache_stats.queries)
            self.mm_hits[i].inc(mm_cache_stats.hits)
        it = iteration_stats
        if it is None:
            return
        self.preemptions[i].inc(it.num_preempted_reqs)
        self.prompt_tokens[i].inc(it.num_prompt_tokens)
        self.generation_tokens[i].inc(it.num_generation_tokens)
        self.iteration[i].observe(it.num_prompt_tokens +
                                  it.num_generation_tokens)
        for v in it.max_num_generation_tokens_iter:
            self.max_generation[i].observe(v)
        for v in it.n_params_iter:
            self.n_param[i].observe(v)
        for v in it.time_to_first_tokens_iter:
            self.ttft[i].observe(v)
        for v in it.inter_token_latencies_iter:
            self.itl[i].observe(v)
            if self.show_hidden:
                self.tpot_hidden[i].observe(v)
        for f in it.finished_requests:
            self.success[f.finish_reason][i].inc()
            self.e2e[i].observe(f.e2e_latency)
            self.queue[i].observe(f.queued_time)
            self.prefill[i].observe(f.prefill_time)
            self.inference[i].observe(f.inference_time)
            self.decode[i].observe(f.decode_time)
            self.req_prompt[i].observe(f.num_prompt_tokens)
            self.req_generation[i].observe(f.num_generation_tokens)
            self.req_tpot[i].observe(f.mean_time_per_output_token)
            if f.max_tokens_param:
                self.max_tokens[i].observe(f.max_tokens_param)

    def record_sleep_state(self, sleep=0, level=0):
        awake = 0 if sleep == 1 else 1
        offloaded = 1 if sleep == 1 and level == 1 else 0
        discarded = 1 if sleep == 1 and level == 2 else 0
        for i in self.engine_indexes:
            self.sleep["awake"][i].set(awake)
            self.sleep["weights_offloaded"][i].set(offloaded)
            self.sleep["discard_all"][i].set(discarded)


class StatLoggerManager:
    """What AsyncLLM calls: every custom logger factory (the plugins among
    them) as an aggregate logger (a subclass of AggregateStatLoggerBase,
    made with vllm_config= and engine_indexes=) or one per engine, then
    PrometheusStatLogger unless a custom logger is one."""

    def __init__(self, vllm_config, engine_idxs=None,
                 custom_stat_loggers=None, enable_default_loggers=True,
                 aggregate_engine_logging=False, client_count=1):
        self.engine_indexes = engine_idxs or [0]
        self.stat_loggers = []
        custom_prometheus = False
        for factory in custom_stat_loggers or []:
            if isinstance(factory, type) and issubclass(
                    factory, AggregateStatLoggerBase):
                x = factory(vllm_config=vllm_config,
                            engine_indexes=self.engine_indexes)
                custom_prometheus |= isinstance(x, PrometheusStatLogger)
            else:
                x = PerEngineStatLoggerAdapter(vllm_config,
                                               self.engine_indexes, factory)
            self.stat_loggers.append(x)
        if not custom_prometheus:
            self.stat_loggers.append(
                PrometheusStatLogger(vllm_config, self.engine_indexes))

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx=None):
        for x in self.stat_loggers:
            x.record(scheduler_stats, iteration_stats,
                     mm_cache_stats=mm_cache_stats,
                     engine_idx=0 if engine_idx is None else engine_idx)

    def record_sleep_state(self, sleep=0, level=0):
        for x in self.stat_loggers:
            x.record_sleep_state(sleep, level)

    def log(self):
        for x in self.stat_loggers:
            x.log()

    def log_engine_initialized(self):
        for x in self.stat_loggers:
            x.log_engine_initialized()
