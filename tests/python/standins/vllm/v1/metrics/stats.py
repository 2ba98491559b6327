"""vllm.v1.metrics.stats at v0.12: what the engine core and the front end
hand a stat logger.

Clocks, as vLLM has them: RequestStateStats.arrival_time and
IterationStats.iteration_timestamp are the front end's time.time() (wall);
queued_ts, scheduled_ts, first_token_ts and last_token_ts are the engine
core's time.monotonic(). So time to first token and end-to-end latency are
wall-clock differences in the front end, inter-token latency and the
queue, prefill, decode and inference phases engine-core monotonic ones.
Every duration is float seconds; no record carries a request id."""
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.v1.spec_decode.metrics import SpecDecodingStats


@dataclass
class BaseCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass
class PrefixCacheStats(BaseCacheStats):
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens, num_hits, preempted):
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


@dataclass
class MultiModalCacheStats(BaseCacheStats):
    pass


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = field(
        default_factory=PrefixCacheStats)
    connector_prefix_cache_stats: Optional[PrefixCacheStats] = None
    kv_cache_eviction_events: list = field(default_factory=list)
    spec_decoding_stats: Optional[SpecDecodingStats] = None
    kv_connector_stats: Optional[dict[str, Any]] = None
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    cudagraph_stats: object = None


@dataclass
class RequestStateStats:
    num_generation_tokens: int = 0
    arrival_time: float = 0.0  # front end, wall clock
    queued_ts: float = 0.0     # engine core, monotonic
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    is_corrupted: bool = False


@dataclass
class FinishedRequestStats:
    finish_reason: object
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: Optional[int] = None
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    decode_time: float = 0.0
    mean_time_per_output_token: float = 0.0
    is_corrupted: bool = False
    num_cached_tokens: int = 0


class IterationStats:
    """One batch of engine-core outputs, as the front end saw it."""

    def __init__(self):
        self.iteration_timestamp = time.time()
        self.num_generation_tokens = 0
        self.num_prompt_tokens = 0
        self.num_preempted_reqs = 0
        self.finished_requests = []
        self.max_num_generation_tokens_iter = []
        self.n_params_iter = []
        self.time_to_first_tokens_iter = []
        self.inter_token_latencies_iter = []
        self.num_corrupted_reqs = 0

    def _time_since(self, start):
        return self.iteration_timestamp - start

    def update_from_output(self, output, engine_core_timestamp,
                           is_prefilling, prompt_len, req_stats,
                           lora_states=None, lora_name=None):
        new_tokens = len(output.new_token_ids)
        self.num_generation_tokens += new_tokens
        if is_prefilling:
            self.num_prompt_tokens += prompt_len
            latency = self._time_since(req_stats.arrival_time)
            self.time_to_first_tokens_iter.append(latency)
            req_stats.first_token_latency = latency
        req_stats.num_generation_tokens += new_tokens
        if output.events is not None:
            self.update_from_events(output.request_id, output.events,
                                    is_prefilling, req_stats)
        if is_prefilling:
            req_stats.first_token_ts = engine_core_timestamp
        else:
            self.inter_token_latencies_iter.append(
                engine_core_timestamp - req_stats.last_token_ts)
        req_stats.last_token_ts = engine_core_timestamp

    def update_from_events(self, req_id, events, is_prefilling, req_stats,
                           lora_states=None, lora_name=None):
        from vllm.v1.engine import EngineCoreEventType
        for event in events:
            if event.type == EngineCoreEventType.QUEUED:
                req_stats.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED:
                if req_stats.scheduled_ts == 0.0:  # the first one only
                    req_stats.scheduled_ts = event.timestamp
            elif event.type == EngineCoreEventType.PREEMPTED:
                self.num_preempted_reqs += 1

    def update_from_finished_request(self, finish_reason, num_prompt_tokens,
                                     max_tokens_param, req_stats,
                                     num_cached_tokens=0):
        decode = req_stats.last_token_ts - req_stats.first_token_ts
        generated = req_stats.num_generation_tokens
        self.finished_requests.append(FinishedRequestStats(
            finish_reason=finish_reason,
            e2e_latency=self._time_since(req_stats.arrival_time),
            num_prompt_tokens=num_prompt_tokens,
            num_generation_tokens=generated,
            max_tokens_param=max_tokens_param,
            queued_time=req_stats.scheduled_ts - req_stats.queued_ts,
            prefill_time=req_stats.first_token_ts - req_stats.scheduled_ts,
            inference_time=req_stats.last_token_ts - req_stats.scheduled_ts,
            decode_time=decode,
            # The prefill's token is not one of the decode's.
            mean_time_per_output_token=(decode / (generated - 1)
                                        if generated > 1 else 0),
            is_corrupted=req_stats.is_corrupted,
            num_cached_tokens=num_cached_tokens))
        if req_stats.is_corrupted:
            self.num_corrupted_reqs += 1

    def observe_finished_group(self, n_param, max_generation_tokens):
        """What vLLM's ParentRequest.observe_finished_request() appends when
        a request finishes and with it its group (n = 1: the request
        alone): its n param and the most tokens one of its requests
        generated."""
        self.max_num_generation_tokens_iter.append(max_generation_tokens)
        self.n_params_iter.append(n_param)
