"""Request lifecycles of a continuous-batching engine, generated with a
fixed seed, replayed through the LMDeploy stand-in (lmdeploy/ beside this
file) as LMDeploy's AsyncEngine and API server drive its metrics path.

workload(seed) simulates, in virtual time, an LMDeploy-like PyTorch
engine: Poisson arrivals, a waiting queue, prefill steps (prefix-cache
hits skip whole 64-token blocks of a shared prefix), decode steps with
speculative decoding (3 draft tokens, 0..3 accepted, 1 + accepted new
tokens), preemption when the KV cache is full (PREEMPTED, later
SCHEDULED again; the sequence is recomputed), max-token limits, aborts
(CANCEL, with or without tokens, and one without req_metrics as after
/abort_request) and engine errors (INTERNAL_ENGINE_ERROR). Each engine
output reaches the async engine after a delivery delay; now and then two
steps' tokens reach it as one output (the API's consumer was late), so
outputs carry 1 to 8 tokens. Every stamp is wall-clock, as LMDeploy's.

replay() drives them, in time order, through AsyncEngine.generate() (one
task per request), metrics_processor's queue and task, and, every
`schedule_every` virtual seconds, update_schedule_stats() and
do_log_stats() as the API server's _force_log loop does. The stand-in's
stats module reads a VirtualClock, so RequestStats.arrival_time and
IterationStats.iteration_timestamp are the simulated times.
"""
import asyncio
import collections
import random
import time

from lmdeploy.messages import (EngineEvent, EngineOutput, EventType,
                               RequestMetrics, ResponseType, ScheduleMetrics)
from lmdeploy.metrics import stats as lmd_stats
from lmdeploy.metrics.metrics_processor import metrics_processor
from lmdeploy.metrics.stats import SchedulerStats

BLOCK = 64
SPEC_TOKENS = 3


class VirtualClock:
    """time.time() for the stand-in's stats module: `now` (wall seconds)."""

    def __init__(self, now):
        self.now = now

    def time(self):
        return self.now


class Timeline:
    """One request: arrival (virtual s), prompt length and its outputs as
    (delivery time, EngineOutput) in order."""
    __slots__ = ("rid", "arrival", "prompt", "outputs")

    def __init__(self, rid, arrival, prompt):
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.outputs = []


class _Seq:
    __slots__ = ("tl", "target", "generated", "cached", "events", "pending",
                 "pending_spec", "end", "kv")

    def __init__(self, tl, target, cached, end):
        self.tl = tl
        self.target = target
        self.generated = 0
        self.cached = cached
        self.events = []
        self.pending = []      # tokens not yet delivered (coalescing)
        self.pending_spec = None
        self.end = end         # "finish", "abort", "abort_empty",
        self.kv = 0            # "abort_nometrics", "error"


def workload(seed=20240611, requests=300, rate=40.0, base=0.0,
             kv_capacity=20_000, max_batch=48, max_new=400):
    """Returns (timelines, schedule samples): the samples are (virtual t,
    ScheduleMetrics) every 0.25 s of the run, the engine's state then."""
    rng = random.Random(seed)
    timelines = []
    t = 0.0
    for rid in range(requests):
        t += rng.expovariate(rate)
        prompt = max(4, min(4000, int(rng.lognormvariate(5.5, 0.9))))
        timelines.append(Timeline(rid, t, prompt))
    pending = collections.deque(timelines)
    waiting = collections.deque()
    running = []
    samples = []
    next_sample = 0.0
    now = 0.0
    hits = queries = 0
    used = 0
    n_seq = 0

    def emit(seq, token_t, status, tokens, spec=None, metrics=True):
        deliver = token_t + rng.uniform(0.0002, 0.003)
        rm = None
        if metrics:
            rm = RequestMetrics(token_timestamp=base + token_t,
                                engine_events=list(seq.events),
                                spec_info=spec, cached_tokens=seq.cached)
        seq.tl.outputs.append((deliver, EngineOutput(status, tokens,
                                                     req_metrics=rm)))

    while pending or waiting or running:
        if not running and not waiting and pending[0].arrival > now:
            now = pending[0].arrival
        while pending and pending[0].arrival <= now:
            tl = pending.popleft()
            n_seq += 1
            # A shared system prompt: some requests hit whole blocks of it.
            cached = 0
            if rng.random() < 0.45:
                cached = min(tl.prompt - 1, rng.choice((1, 2, 4, 8)) * BLOCK)
                cached -= cached % BLOCK
            r = rng.random()
            end = ("abort" if r < 0.03 else "abort_empty" if r < 0.05 else
                   "abort_nometrics" if r < 0.06 else "error" if r < 0.075
                   else "finish")
            target = max(1, min(max_new, int(rng.lognormvariate(4.0, 0.8))))
            seq = _Seq(tl, target, cached, end)
            # Queued by the engine shortly after it arrived, and never
            # after the step that may schedule it.
            seq.events.append(EngineEvent(EventType.QUEUED, base + min(
                tl.arrival + rng.uniform(0.0001, 0.001), now)))
            waiting.append(seq)
        while now >= next_sample:
            samples.append((next_sample, ScheduleMetrics(
                active_seqs=len(running), waiting_seqs=len(waiting),
                cache_usage=used / kv_capacity,
                prefix_cache_hit_rate=hits / queries if queries else 0.0)))
            next_sample += 0.25
        # Prefill whoever fits, else decode.
        batch = []
        budget = 8192
        while (waiting and len(running) + len(batch) < max_batch and
               budget > 0):
            seq = waiting[0]
            need = seq.tl.prompt + seq.generated
            if used + need + BLOCK > kv_capacity:
                break
            waiting.popleft()
            batch.append(seq)
            used += need
            seq.kv = need
            budget -= need - seq.cached
        if batch:
            computed = sum(s.tl.prompt + s.generated - s.cached
                           for s in batch)
            step = 0.004 + computed * 2.5e-5
            for seq in batch:
                seq.events.append(EngineEvent(EventType.SCHEDULED, base + now))
                if seq.generated == 0:
                    queries += seq.tl.prompt
                    hits += seq.cached
            now += step
            for seq in batch:
                running.append(seq)
                _advance(seq, 1, None, now, emit, rng)
            used -= _retire(running)
        elif running:
            step = 0.012 + 0.0004 * len(running)
            now += step
            for seq in list(running):
                accepted = rng.choice((0, 1, 1, 2, 2, 3))
                spec = {"num_draft_tokens": SPEC_TOKENS,
                        "num_accepted_tokens": accepted}
                _advance(seq, 1 + accepted, spec, now, emit, rng)
                used += 1 + accepted
                seq.kv += 1 + accepted
            used -= _retire(running)
            # KV full: preempt the newest running sequence.
            while used > kv_capacity and len(running) > 1:
                victim = running.pop()
                victim.events.append(EngineEvent(EventType.PREEMPTED,
                                                 base + now))
                used -= victim.kv
                victim.kv = 0
                waiting.appendleft(victim)
        else:
            now = max(now, pending[0].arrival) if pending else now + 0.01
    return timelines, samples


def _retire(running):
    """Takes the sequences that ended out of `running`; returns their KV."""
    freed = 0
    for seq in [s for s in running if s.tl.outputs and
                s.tl.outputs[-1][1].status != ResponseType.SUCCESS]:
        running.remove(seq)
        freed += seq.kv
    return freed


def _advance(seq, n, spec, now, emit, rng):
    """The sequence got n tokens at `now`: deliver, coalesce or end it."""
    n = min(n, seq.target - seq.generated) if seq.end == "finish" else n
    seq.generated += n
    seq.pending.extend([7] * n)
    seq.pending_spec = spec
    first = len(seq.tl.outputs) == 0
    done = seq.generated >= seq.target
    if seq.end != "finish" and seq.generated >= max(2, seq.target // 2):
        # Ended part way: aborted or failed.
        status = (ResponseType.INTERNAL_ENGINE_ERROR if seq.end == "error"
                  else ResponseType.CANCEL)
        tokens = list(seq.pending) if seq.end == "abort" else []
        emit(seq, now, status, tokens, seq.pending_spec,
             metrics=seq.end != "abort_nometrics")
        seq.pending = []
        return
    if done:
        emit(seq, now, ResponseType.FINISH, list(seq.pending),
             seq.pending_spec)
        seq.pending = []
        return
    # The API's consumer was late now and then: hold for the next step.
    if not first and len(seq.pending) < 6 and rng.random() < 0.08:
        return
    emit(seq, now, ResponseType.SUCCESS, list(seq.pending), seq.pending_spec)
    seq.pending = []


def shift(timelines, base):
    """Adds `base` to every wall stamp of timelines made with base=0.0
    (the same floats as workload(base=base) makes)."""
    seen = set()
    for tl in timelines:
        for _, out in tl.outputs:
            rm = out.req_metrics
            if rm is None or id(rm) in seen:
                continue
            seen.add(id(rm))
            rm.token_timestamp += base
            for ev in rm.engine_events:
                if id(ev) not in seen:
                    seen.add(id(ev))
                    ev.timestamp += base


def reset_processor():
    """Puts the metrics_processor singleton back to its state at import."""
    metrics_processor.enable_metrics = False
    metrics_processor.scheduler_stats = SchedulerStats()
    metrics_processor.stat_loggers = []
    metrics_processor.metrics_queue = None
    metrics_processor.metrics_handler = None


async def replay(engine, timelines, samples, clock, base, pace=None):
    """Replays timelines (virtual times + base = wall seconds) through
    engine (the stand-in's AsyncEngine) and metrics_processor. pace: real
    seconds per virtual second (None: as fast as it goes). Returns when
    metrics_processor's queue is drained."""
    metrics_processor.start_metrics_handler(enable_metrics=True)
    events = []
    for tl in timelines:
        events.append((tl.arrival, 0, tl.rid, None))
        for i, (deliver, out) in enumerate(tl.outputs):
            events.append((deliver, 1, tl.rid, (i, out)))
    for t, m in samples:
        events.append((t, 2, -1, m))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    by_rid = {tl.rid: tl for tl in timelines}
    queues = {}
    state = {"blocked": 0, "done": 0, "started": 0}

    async def source(q):
        while True:
            state["blocked"] += 1
            item = await q.get()
            state["blocked"] -= 1
            if item is None:
                return
            yield item

    async def consume(tl, q):
        try:
            async for _ in engine.generate(tl.prompt, source(q)):
                pass
        finally:
            state["done"] += 1

    async def settle():
        while state["blocked"] + state["done"] < state["started"]:
            await asyncio.sleep(0)

    tasks = []
    real0 = time.monotonic()
    t0 = events[0][0] if events else 0.0
    for t, kind, rid, payload in events:
        if pace is not None:
            delay = real0 + (t - t0) * pace - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        clock.now = base + t
        if kind == 0:
            q = asyncio.Queue()
            queues[rid] = q
            state["started"] += 1
            tasks.append(asyncio.ensure_future(consume(by_rid[rid], q)))
        elif kind == 1:
            i, out = payload
            q = queues[rid]
            q.put_nowait(out)
            if i == len(by_rid[rid].outputs) - 1:
                q.put_nowait(None)
        else:
            await metrics_processor.update_schedule_stats(payload)
            await engine.do_log_stats()
        await settle()
    await asyncio.gather(*tasks)
    await metrics_processor.metrics_queue.join()


def use_clock(clock):
    """Makes the stand-in's stats module read `clock`."""
    lmd_stats.time = clock
