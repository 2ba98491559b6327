"""lmdeploy/metrics/stats.py (v0.16.0), its behaviour reproduced.

Every time here is wall-clock (time.time(), seconds as a float), as in
LMDeploy: RequestStats.arrival_time when the request's stats are made,
IterationStats.iteration_timestamp when an iteration's stats are made (in
AsyncEngine.generate, as each engine output arrives), and the engine's
EngineEvent / RequestMetrics.token_timestamp stamps. Tests replace this
module's `time` with a virtual clock (an object with a time() method).
"""
import time
from dataclasses import dataclass

import numpy as np

from lmdeploy.messages import EventType, ResponseType


@dataclass
class SchedulerStats:
    """API-server counts and the engine's scheduler gauges."""
    num_total_reqs: int = 0
    num_succeeded_reqs: int = 0
    num_cancelled_reqs: int = 0
    num_aborted_reqs: int = 0
    num_errored_reqs: int = 0
    num_api_routed_reqs: int = 0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    gpu_cache_usage: float = 0.0
    prefix_cache_hit_rate: float = 0.0

    @property
    def num_failed_reqs(self):
        return (self.num_cancelled_reqs + self.num_aborted_reqs +
                self.num_errored_reqs)

    @property
    def num_completed_reqs(self):
        return self.num_succeeded_reqs + self.num_failed_reqs

    @property
    def num_uncompleted_reqs(self):
        return self.num_total_reqs - self.num_completed_reqs

    @property
    def num_api_waiting_reqs(self):
        return self.num_uncompleted_reqs - self.num_api_routed_reqs

    def update_from_schedule_metrics(self, m):
        self.num_running_reqs = m.active_seqs
        self.num_waiting_reqs = m.waiting_seqs
        self.gpu_cache_usage = m.cache_usage
        self.prefix_cache_hit_rate = m.prefix_cache_hit_rate


class RequestStats:
    """One request's times (wall-clock seconds; 0.0 until known), token
    counts and finish reason. The intervals are plain differences, so an
    unset time (0.0) makes one hugely negative, as in LMDeploy."""

    def __init__(self, arrival_time=None, prompt_tokens=0):
        self.arrival_time = (time.time() if arrival_time is None
                             else arrival_time)
        self.prompt_tokens = prompt_tokens
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.queued_time = 0.0
        self.scheduled_time = 0.0
        self.first_token_time = 0.0
        self.lastest_token_time = 0.0  # LMDeploy's spelling
        self.finish_time = 0.0
        self.finish_reason = None

    def update_from_events(self, engine_events):
        for ev in engine_events:
            if ev.type == EventType.QUEUED:
                self.queued_time = ev.timestamp  # the latest QUEUED
            elif ev.type == EventType.SCHEDULED and self.scheduled_time == 0.0:
                self.scheduled_time = ev.timestamp  # the first SCHEDULED
            # PREEMPTED: ignored by LMDeploy v0.16.0

    @property
    def e2e_latency(self):
        return self.finish_time - self.arrival_time

    @property
    def queued_time_interval(self):
        return self.scheduled_time - self.queued_time

    @property
    def prefill_time_interval(self):
        return self.first_token_time - self.scheduled_time

    @property
    def decode_time_interval(self):
        return self.finish_time - self.first_token_time

    @property
    def inference_time_interval(self):
        return self.finish_time - self.scheduled_time


class IterationStats:
    """One engine output of one request (no request id): its new tokens,
    the prompt tokens on the request's first output, and TTFT (first
    output) or ITL and TPOT (later ones), all measured to
    iteration_timestamp."""

    def __init__(self):
        self.iteration_timestamp = time.time()
        self.new_generation_tokens = 0
        self.prompt_tokens = 0
        self.ttft = None
        self.tpot = None
        self.itl = None

    def update_from_output(self, outputs, req_stats):
        if outputs.req_metrics is None:
            return  # e.g. after /abort_request
        n = len(outputs.token_ids)
        if n == 0:
            return
        self.new_generation_tokens = n
        now = self.iteration_timestamp
        if req_stats.first_token_time == 0:
            req_stats.first_token_time = outputs.req_metrics.token_timestamp
            self.prompt_tokens = req_stats.prompt_tokens
            self.ttft = now - req_stats.arrival_time
        else:
            self.itl = now - req_stats.lastest_token_time
            self.tpot = self.itl / n
        req_stats.lastest_token_time = outputs.req_metrics.token_timestamp
        req_stats.generation_tokens += n
        if outputs.status != ResponseType.SUCCESS:
            req_stats.finish_reason = outputs.status
            req_stats.finish_time = now


@dataclass
class SpeculativeDecodingStats:
    """One output's speculative-decoding figures (made fresh per output)."""
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: np.ndarray = None

    def __post_init__(self):
        assert self.num_spec_tokens > 0
        self.num_accepted_tokens_per_pos = np.zeros(self.num_spec_tokens)

    def update_from_output(self, outputs):
        info = getattr(outputs.req_metrics, "spec_info", None)
        if info:
            self._add(info["num_draft_tokens"], info["num_accepted_tokens"])

    def update_per_draft(self, num_draft_tokens, num_accepted_tokens):
        if num_draft_tokens > 0:
            self._add(num_draft_tokens, num_accepted_tokens)

    def _add(self, drafted, accepted):
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        self.num_accepted_tokens_per_pos[:accepted] += 1
