"""A vLLM-like serving loop that produces, iteration by iteration, the
SchedulerStats and IterationStats vLLM v0.12 hands its stat loggers (the
stand-in's types, vllm/), from random request lifecycles with a fixed seed.

It plays vLLM's two processes on one virtual clock: the engine core
(scheduler: a waiting queue, a running batch bounded in sequences and KV
blocks, preemption of the newest running request when the blocks run out,
chunk-free prefill, one decode token per step or 1 + accepted with
speculative decoding; its events stamped with its monotonic clock) and
the front end (OutputProcessor's bookkeeping: RequestStateStats per
request, arrival times on the wall clock, IterationStats.update_from_output
and update_from_finished_request, parallel-sampling groups of n requests
reported when the last one finishes). The two clocks have different
origins, as in vLLM: time to first token and end-to-end latency are wall
differences, the phases and the inter-token latency monotonic ones.

Requests finish by "stop" (their sampled length), "length" (max_tokens or
the model length) or, after their first token, "abort" and "error"; none
is aborted before its first token (vLLM then computes negative phase
times, which tokenmeter does not send: vllm_plugin_test checks that
apart).
"""
import random
from dataclasses import dataclass, field

from vllm.v1.engine import (EngineCoreEvent, EngineCoreEventType,
                            EngineCoreOutput, FinishReason)
from vllm.v1.metrics.stats import (IterationStats, PrefixCacheStats,
                                   RequestStateStats, SchedulerStats)
from vllm.v1.spec_decode.metrics import SpecDecodingStats

WALL0 = 1_750_000_000.0  # the front end's time.time() at t = 0
MONO0 = 5_000.0          # the engine core's time.monotonic() at t = 0


@dataclass
class _Group:
    n: int
    left: int
    max_generated: int = 0


@dataclass
class _Request:
    rid: str
    prompt: int
    max_tokens: object  # int, or None (unset: up to the model length)
    target: int          # tokens it generates before "stop"
    ending: FinishReason
    group: _Group
    cached: int
    stats: RequestStateStats = field(default_factory=RequestStateStats)
    generated: int = 0
    prefilled: bool = False
    events: list = field(default_factory=list)
    was_preempted: bool = False
    queued_at: float = 0.0  # engine core monotonic


class Workload:
    def __init__(self, seed=1, engines=(0,), max_model_len=2048,
                 spec_tokens=0, max_num_seqs=12, kv_blocks=400,
                 block_size=16, arrivals_per_s=40.0):
        self.rng = random.Random(seed)
        self.engines = list(engines)
        self.max_model_len = max_model_len
        self.spec_tokens = spec_tokens
        self.max_num_seqs = max_num_seqs
        self.kv_blocks = kv_blocks
        self.block_size = block_size
        self.arrivals_per_s = arrivals_per_s
        self.t = 0.0
        self.next_arrival = 0.0
        self.count = 0
        self.waiting = {e: [] for e in self.engines}
        self.running = {e: [] for e in self.engines}
        self.iterations = 0
        self.finished = 0

    # ---- the front end ---------------------------------------------------

    def _new_requests(self):
        """Requests that arrived by now, each group spread over the
        engines (vLLM's DP load balancing, here round robin)."""
        rng = self.rng
        while self.next_arrival <= self.t:
            arrival = self.next_arrival
            self.next_arrival += rng.expovariate(self.arrivals_per_s)
            n = rng.choice((1, 1, 1, 1, 2, 3))
            group = _Group(n, n)
            prompt = min(int(rng.lognormvariate(5.0, 1.0)) + 1,
                         self.max_model_len - 8)
            max_tokens = rng.choice((None, 16, 64, 128, 256, 1000))
            engine = self.engines[self.count % len(self.engines)]
            for _ in range(n):
                self.count += 1
                target = int(rng.lognormvariate(4.0, 0.9)) + 1
                roll = rng.random()
                ending = (FinishReason.ABORT if roll < 0.05 else
                          FinishReason.ERROR if roll < 0.07 else
                          FinishReason.STOP)
                cached = rng.choice((0, 0, prompt // 2, prompt - 1))
                r = _Request(f"req-{self.count}", prompt, max_tokens,
                             max(target, 2 if ending != FinishReason.STOP
                                 else 1), ending, group, max(cached, 0))
                r.stats.arrival_time = WALL0 + arrival
                # The engine core queues it a little later.
                queued = MONO0 + arrival + rng.uniform(0.0005, 0.003)
                r.queued_at = queued
                r.events.append(EngineCoreEvent(EngineCoreEventType.QUEUED,
                                                queued))
                self.waiting[engine].append(r)

    # ---- the engine core ---------------------------------------------------

    def _blocks(self, r):
        return (r.prompt + r.generated) // self.block_size + 1

    def _step(self, engine, step_start, step_end):
        """One scheduler step of one engine: (SchedulerStats, outputs)."""
        rng = self.rng
        running, waiting = self.running[engine], self.waiting[engine]
        prefix = PrefixCacheStats()
        # Preempt the newest running requests while the KV cache is short.
        used = sum(self._blocks(r) for r in running)
        while used > self.kv_blocks and len(running) > 1:
            r = running.pop()
            used -= self._blocks(r)
            r.events.append(EngineCoreEvent(EngineCoreEventType.PREEMPTED,
                                            MONO0 + step_start))
            r.prefilled = False  # recomputed when scheduled again
            r.was_preempted = True
            waiting.insert(0, r)
        # Admit waiting requests (queued by now) while seats and blocks last.
        while (waiting and len(running) < self.max_num_seqs and
               (waiting[0].was_preempted or
                waiting[0].queued_at <= MONO0 + step_start)):
            r = waiting[0]
            if used + self._blocks(r) > self.kv_blocks and running:
                break
            waiting.pop(0)
            used += self._blocks(r)
            r.events.append(EngineCoreEvent(EngineCoreEventType.SCHEDULED,
                                            MONO0 + step_start))
            hits = r.cached if not r.was_preempted else r.prompt // 2
            prefix.record(r.prompt, hits, preempted=r.was_preempted)
            running.append(r)
        spec = None
        outputs = []
        done = []
        for r in running:
            if not r.prefilled:
                # Prefill (or, after a preemption, the recompute of prompt
                # and output): one token.
                r.prefilled = True
                new = 1
            else:
                new = 1
                if self.spec_tokens:
                    if spec is None:
                        spec = SpecDecodingStats.new(self.spec_tokens)
                    accepted = rng.randint(0, self.spec_tokens)
                    spec.observe_draft(self.spec_tokens, accepted)
                    new += accepted
            limit = min(r.max_tokens or self.max_model_len,
                        self.max_model_len - r.prompt)
            end = min(r.target, limit)
            new = min(new, end - r.generated)
            r.generated += new
            reason = None
            if r.generated >= end:
                reason = (FinishReason.STOP if r.target <= limit and
                          r.ending == FinishReason.STOP else
                          r.ending if r.target <= limit else
                          FinishReason.LENGTH)
            elif r.ending != FinishReason.STOP and r.generated >= 1 and \
                    rng.random() < 0.02:
                reason = r.ending  # aborted / failed mid-decode
            outputs.append((r, EngineCoreOutput(
                request_id=r.rid, new_token_ids=[0] * new,
                finish_reason=reason, events=r.events or None,
                num_cached_tokens=r.cached)))
            r.events = []
            if reason is not None:
                done.append(r)
        for r in done:
            running.remove(r)
        used = sum(self._blocks(r) for r in running)
        stats = SchedulerStats(
            num_running_reqs=len(running), num_waiting_reqs=len(waiting),
            kv_cache_usage=min(used / self.kv_blocks, 1.0),
            prefix_cache_stats=prefix, spec_decoding_stats=spec)
        return stats, outputs, MONO0 + step_end

    # ---- one iteration -------------------------------------------------

    def step(self):
        """Advances the clock by one engine step and returns, per engine,
        (engine_idx, SchedulerStats, IterationStats) as vLLM's front end
        hands them to StatLoggerManager.record()."""
        rng = self.rng
        dt = rng.uniform(0.012, 0.045)
        start, self.t = self.t, self.t + dt
        self._new_requests()
        out = []
        for engine in self.engines:
            stats, outputs, core_ts = self._step(engine, start, self.t)
            it = IterationStats()
            # The front end processes the outputs a little after the step.
            it.iteration_timestamp = WALL0 + self.t + rng.uniform(0.0002,
                                                                  0.002)
            for r, o in outputs:
                is_prefilling = r.stats.num_generation_tokens == 0
                it.update_from_output(o, core_ts, is_prefilling, r.prompt,
                                      r.stats)
                if o.finish_reason is None:
                    continue
                self.finished += 1
                it.update_from_finished_request(
                    o.finish_reason, r.prompt, r.max_tokens, r.stats,
                    num_cached_tokens=r.cached)
                g = r.group
                g.left -= 1
                g.max_generated = max(g.max_generated,
                                      r.stats.num_generation_tokens)
                if g.left == 0:
                    it.observe_finished_group(g.n, g.max_generated)
            out.append((engine, stats, it))
        self.iterations += 1
        return out
