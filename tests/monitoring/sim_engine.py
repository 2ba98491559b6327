"""A continuous-batching engine in miniature that speaks the ingest protocol
(docs/protocol.md) to tokenmeterd in real time, so that every series a
dashboard may query moves: arrivals, queueing, chunk-free prefill, decode
with speculative decoding, preemptions, the four finish reasons, and STEP
statistics with prefix-cache and per-position spec-decode keys.

It stands in for engines this repository does not ship (vLLM, SGLang,
LMDeploy); the reference engine (tokenmeter-engine) is real and is preferred
where it fits. Timestamps are time.monotonic_ns(), the daemon's clock.

Protocol 1.1 (docs/protocol.md): HELLO may carry `profile`, `cache_config`
and `max_lora`; ARRIVED params `lora` (the request's adapter) and `labels`
(the `tenant` request label). With adapters the scheduler keeps at most
max_lora of them running at once, as vLLM's max_loras does, so requests
really wait for an adapter and the waiting set of lora_requests_info moves.

With moe_layers > 0 the model is a mixture of experts: every token a step
processes (prompt and generated) goes through each MoE layer to top-k of
its experts, unevenly (one hot expert per layer, hotter in later layers),
and every few steps EXPERT_LOAD (kind 8) reports each layer's counts since
the previous one, the last partial ones before GOODBYE.

Protocol 1.2 (docs/protocol.md, "Additions in 1.2"; proto12=True, the
default): the engine sits behind a server that refuses every fifth
arrival (ADMISSION_REJECTED, kind 9: `token_cap` for a prompt over 768
tokens, `rate_limit` otherwise; every other one names its rid). ARRIVED
params carry `priority` and, for half the requests, a `traceparent`. The
first SCHEDULED of a request carries `info`: its prefix-cache hits
(`cached_tokens`) and, for a third of the requests (a disaggregated
decode instance), the rest of its prompt as `external_tokens`, received
by a KV_TRANSFER (kind 10) `recv` that ends in the request's prefill
step (the first one of the run, and one in twenty, fails with `timeout`
first and is retried); a third of the locally computed prompts are then
sent on (`send`, one in twenty failing with `peer_unreachable`). STEP
carries `waiting_deferred`: the waiting requests held back for an
adapter slot. Every `sleep_every_s` seconds the engine sleeps for
`sleep_s` (SLEEP, kind 11: scheduler paused, KV cache released, weights
offloaded or, every other time, discarded), admitting and generating
nothing meanwhile; it says it is awake at the start.
"""
import collections
import random
import socket
import threading
import time

import msgpack


def _frame(*items):
    return msgpack.packb(list(items), use_bin_type=True)


class _Request:
    __slots__ = ("rid", "prompt", "max_tokens", "target", "generated",
                 "prefilled", "lora", "arrived_s", "tenant", "scheduled_t",
                 "cached", "external", "preemptions")

    def __init__(self, rid, prompt, max_tokens, target, lora, arrived_s):
        self.rid = rid
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.target = target
        self.generated = 0
        self.prefilled = False
        self.lora = lora
        self.arrived_s = arrived_s
        self.tenant = ""
        self.scheduled_t = None  # the first SCHEDULED's t (1.2)
        self.cached = 0  # prompt tokens found in the prefix cache
        self.external = 0  # prompt tokens received over KV_TRANSFER
        self.preemptions = 0  # PREEMPTED events sent for it


class SimEngine(threading.Thread):
    """Runs until stop(); one connection, one BATCH per engine step.

    kv_floor: the KV-cache usage the engine never goes below (a value over
    0.95 makes the KV-cache alert's condition true).
    drops_per_s: dropped events the client reports per second in BATCH
    dropped_total (the client-drops alert).
    profile, cache_config, max_lora: the HELLO keys of protocol 1.1 (None:
    not sent).
    loras: adapter names; a request uses one of them (the first ones more
    often) or, one time in five, the base model. At most max_lora (default
    2) of them run at once.
    tenants: values of the ARRIVED label `tenant`, drawn uniformly; with
    untenanted > 0 that share of requests is sent without labels.
    proto12: send the protocol 1.2 events and keys (module docstring);
    False: a 1.1 engine, as the reference engine is until its client
    library has the 1.2 calls.
    """

    def __init__(self, sock_path, engine, model, instance="0", *,
                 arrival_rate=8.0, step_s=0.025, max_running=6,
                 spec_tokens=3, kv_floor=0.2, drops_per_s=0.0, seed=1,
                 profile=None, cache_config=None, max_lora=None, loras=(),
                 tenants=(), untenanted=0.0, moe_layers=0, moe_experts=8,
                 moe_top_k=2, moe_every=4, proto12=True, sleep_every_s=12.0,
                 sleep_s=1.0):
        super().__init__(daemon=True)
        self.sock_path = sock_path
        self.hello = {"proto": 1, "engine": engine, "model": model,
                      "instance": instance, "pid": 1000 + seed}
        if profile is not None:
            self.hello["profile"] = profile
        if cache_config is not None:
            self.hello["cache_config"] = dict(cache_config)
        if max_lora is not None:
            self.hello["max_lora"] = max_lora
        self.arrival_rate = arrival_rate
        self.step_s = step_s
        self.max_running = max_running
        self.spec_tokens = spec_tokens
        self.kv_floor = kv_floor
        self.drops_per_s = drops_per_s
        self.loras = list(loras)
        self.lora_slots = max_lora or 2
        self.tenants = list(tenants)
        self.untenanted = untenanted
        self.moe_layers = moe_layers
        self.moe_experts = moe_experts
        self.moe_top_k = moe_top_k
        self.moe_every = moe_every
        # The hot expert of each MoE layer: weight 2 + layer, the others 1
        # (each jittered by up to 10 % per EXPERT_LOAD).
        self.moe_hot = {layer: (3 * layer + seed) % moe_experts
                        for layer in range(moe_layers)}
        self.moe_routed = 0  # tokens x top-k reported per layer so far
        self.moe_last = {}  # layer -> the counts of its latest EXPERT_LOAD
        self.proto12 = proto12
        self.sleep_every_s = sleep_every_s
        self.sleep_s = sleep_s
        self.arrivals = 0  # every one the server saw, rejected ones too
        self.rejected = {}  # ADMISSION_REJECTED reason -> count
        self.recv_failed = 0  # KV_TRANSFER recv failures sent
        self.kv_failed = {}  # (role, reason) -> failed KV_TRANSFERs sent
        self.sleep_state = None  # the latest SLEEP state sent
        self.rng = random.Random(seed)
        self.error = None
        self.finished = 0
        self.finished_by_tenant = {}  # tenant ("" for none) -> count
        # Of the finished requests, what the per-request histograms of
        # protocol 1.2 observe: their PREEMPTED events, the prompt tokens
        # they computed (prompt - cached - external) and how many received
        # KV (a successful recv after their SCHEDULED).
        self.finished_preemptions = 0
        self.finished_computed = 0
        self.finished_kv_received = 0
        self._halt = threading.Event()
        self._pause = threading.Event()
        self._paused = threading.Event()
        self._resume = threading.Event()
        self.paused_state = None

    def stop(self):
        self._halt.set()
        self._resume.set()
        self.join(timeout=10)

    def pause(self, timeout=10):
        """Stops the engine between two steps, after its last BATCH was
        written, and returns what lora_requests_info must then show:
        (running adapters, waiting adapters), each sorted and joined by
        ","; finished_by_tenant holds still until resume(), which lets it
        go on as if no time had passed."""
        self._resume.clear()
        self._paused.clear()
        self._pause.set()
        if not self._paused.wait(timeout):
            raise AssertionError(f"sim engine did not pause: {self.error!r}")
        return self.paused_state

    def resume(self):
        self._pause.clear()
        self._resume.set()

    def run(self):
        try:
            self._run()
        except Exception as e:  # reported by the test, not lost in a thread
            self.error = e

    def _draw_lora(self):
        rng = self.rng
        if not self.loras or rng.random() < 0.2:
            return None
        # Skewed: adapter i with weight 1/(i+1).
        weights = [1 / (i + 1) for i in range(len(self.loras))]
        return rng.choices(self.loras, weights)[0]

    def _arrived_params(self, r):
        params = {"max_tokens": r.max_tokens, "n": 1}
        if r.lora is not None:
            params["lora"] = r.lora
        if self.tenants and self.rng.random() >= self.untenanted:
            r.tenant = self.rng.choice(self.tenants)
            params["labels"] = {"tenant": r.tenant}
        if self.proto12:
            rng = self.rng
            params["priority"] = rng.randint(-2, 2)
            if rng.random() < 0.5:
                # W3C trace context, version 00, sampled; ids not zero.
                params["traceparent"] = (
                    f"00-{rng.getrandbits(128) | 1:032x}-"
                    f"{rng.getrandbits(64) | 1:016x}-01")
        return params

    def _rejected(self, t, r):
        """ADMISSION_REJECTED for arrival r, or None when it is admitted:
        every fifth arrival is refused."""
        self.arrivals += 1
        if not self.proto12 or self.arrivals % 5:
            return None
        reason = "token_cap" if r.prompt > 768 else "rate_limit"
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return [9, t, reason, r.rid] if self.arrivals % 10 else [9, t, reason]

    def _scheduled(self, t, r):
        """SCHEDULED; the first one of a 1.2 engine carries `info`."""
        if not self.proto12 or r.scheduled_t is not None:
            return [3, t, r.rid]
        r.scheduled_t = t
        r.cached = r.prompt * self.rng.choice([0, 1, 2]) // 4
        info = {"cached_tokens": r.cached}
        if self.rng.random() < 1 / 3:
            r.external = r.prompt - r.cached
            info["external_tokens"] = r.external
        return [3, t, r.rid, info]

    def _kv_transfers(self, t, r):
        """The KV_TRANSFER events of r's first prefill step: the recv of
        its external tokens (a failed try first, sometimes), or a send of
        its computed prompt to a decode instance, now and then."""
        rng = self.rng
        size = {"bytes": r.prompt * 131072, "blocks": -(-r.prompt // 16),
                "connector": "nixl"}
        if r.external:
            events = []
            if self.recv_failed == 0 or rng.random() < 0.05:
                self.recv_failed += 1
                self._count_failure("recv", "timeout")
                events.append([10, max(r.scheduled_t, t - 5_000_000),
                               r.rid, dict(
                    size, role="recv", start=r.scheduled_t, ok=False,
                    reason="timeout")])
            events.append([10, t, r.rid, dict(size, role="recv",
                                              start=r.scheduled_t)])
            return events
        if rng.random() >= 1 / 3:
            return []
        info = dict(size, role="send",
                    start=t - rng.randint(2_000_000, 40_000_000))
        if rng.random() < 0.05:
            # SGLang's two timeout stages: the handshake's
            # (bootstrap_timeout) beside the transfer's (timeout).
            reason = ("bootstrap_timeout" if rng.random() < 0.5
                      else "peer_unreachable")
            info.update(ok=False, reason=reason)
            self._count_failure("send", reason)
        return [[10, t, r.rid, info]]

    def _count_failure(self, role, reason):
        self.kv_failed[role, reason] = self.kv_failed.get((role, reason),
                                                          0) + 1

    def _sleep_state(self, now, start, asleep):
        """(asleep, the SLEEP state to send or None): the engine sleeps
        during the last sleep_s of every sleep_every_s seconds, at level 1
        (weights offloaded) and level 2 (discarded) in turn."""
        if not self.proto12 or not self.sleep_every_s:
            return asleep, None
        cycle = int((now - start) // self.sleep_every_s)
        due = (now - start) % self.sleep_every_s >= \
            self.sleep_every_s - self.sleep_s
        if due == asleep:
            return asleep, None
        if due:
            return True, {"scheduler": "paused", "kv_cache": "released",
                          "weights": ("offloaded", "discarded")[cycle % 2]}
        return False, {"scheduler": "running", "weights": "resident",
                       "kv_cache": "resident"}

    def _expert_load(self, t, tokens):
        """EXPERT_LOAD events for `tokens` tokens through every MoE layer:
        the same tokens x top-k per layer, shared by the experts' weights
        (the rounding remainder to the hot expert)."""
        routed = tokens * self.moe_top_k
        events = []
        for layer, hot in self.moe_hot.items():
            w = [self.rng.uniform(0.9, 1.1) * (2 + layer if e == hot else 1)
                 for e in range(self.moe_experts)]
            counts = [int(routed * x / sum(w)) for x in w]
            counts[hot] += routed - sum(counts)
            events.append([8, t, layer, counts])
            self.moe_last[layer] = counts
        self.moe_routed += routed
        return events

    @staticmethod
    def _lora_set(requests):
        return ",".join(sorted({r.lora for r in requests if r.lora}))

    def _run(self):
        rng = self.rng
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.sock_path)
        s.sendall(_frame(0, self.hello))
        seq = 0
        if self.proto12 and self.sleep_every_s:
            # Awake from the start: the sleep series exist at once.
            self.sleep_state = {"scheduler": "running", "weights": "resident",
                                "kv_cache": "resident"}
            s.sendall(_frame(1, seq, 0, [[11, time.monotonic_ns(),
                                          self.sleep_state]]))
            seq += 1
        asleep = False
        waiting = collections.deque()
        running = []
        next_rid = 1
        dropped = 0.0
        moe_tokens = 0  # processed since the last EXPERT_LOAD
        start = time.monotonic()
        next_arrival = start + rng.expovariate(self.arrival_rate)
        step_no = 0
        while not self._halt.is_set():
            if self._pause.is_set():
                self.paused_state = (self._lora_set(running),
                                     self._lora_set(waiting))
                paused_at = time.monotonic()
                self._paused.set()
                self._resume.wait()
                # Resume as if no time had passed: no burst of arrivals.
                start += time.monotonic() - paused_at
                next_arrival += time.monotonic() - paused_at
                continue
            step_no += 1
            # Sleep to the next step boundary (no drift under load).
            delay = start + step_no * self.step_s - time.monotonic()
            if delay > 0 and self._halt.wait(delay):
                break
            now = time.monotonic()
            t = time.monotonic_ns()
            events = []
            asleep, state = self._sleep_state(now, start, asleep)
            if state is not None:
                self.sleep_state = state
                events.append([11, t, state])
            # Arrivals since the last step, at their own instants.
            while next_arrival <= now:
                prompt = rng.randint(32, 1024)
                max_tokens = rng.choice([16, 32, 64, 128])
                target = rng.randint(4, max_tokens)
                if rng.random() < 0.3:
                    target = max_tokens  # finishes by length
                r = _Request(next_rid, prompt, max_tokens, target,
                             self._draw_lora(), next_arrival)
                next_rid += 1
                at = t - int((now - next_arrival) * 1e9)
                next_arrival += rng.expovariate(self.arrival_rate)
                refused = self._rejected(at, r)
                if refused is not None:
                    events.append(refused)
                    continue
                events.append([1, at, r.rid, prompt,
                               self._arrived_params(r)])
                events.append([2, at, r.rid])
                waiting.append(r)
            # Now and then the scheduler preempts the newest running request.
            if running and not asleep and rng.random() < 0.03:
                r = running.pop()
                r.prefilled = False  # recompute its prompt when rescheduled
                r.preemptions += 1
                events.append([6, t, r.rid])
                waiting.appendleft(r)
            # Admit waiting requests into free slots, in order, passing over
            # those whose adapter cannot run now (max_lora adapters busy);
            # one passed over for a second stops the others, so that the
            # busy adapters drain and its own gets a slot.
            active = {r.lora for r in running if r.lora}
            passed = collections.deque()
            while waiting and len(running) < self.max_running and not asleep:
                r = waiting.popleft()
                if (r.lora and r.lora not in active
                        and len(active) >= self.lora_slots):
                    passed.append(r)
                    if now - r.arrived_s > 1.0:
                        break
                    continue
                if r.lora:
                    active.add(r.lora)
                events.append(self._scheduled(t, r))
                running.append(r)
                r.prefilled = None  # prefill runs in the next step
            waiting.extendleft(reversed(passed))
            stats = {"prompt_tokens": 0, "generation_tokens": 0,
                     "prefix_queries": 0, "prefix_hits": 0,
                     "spec_drafts": 0, "spec_draft_tokens": 0,
                     "spec_accepted_tokens": 0}
            per_pos = [0] * self.spec_tokens
            still = []
            for r in running:
                if asleep:  # paused: nothing runs
                    still.append(r)
                    continue
                if r.prefilled is None:  # admitted in this step: wait one
                    r.prefilled = False
                    still.append(r)
                    continue
                if not r.prefilled:
                    if self.proto12 and r.generated == 0:  # not a recompute
                        events += self._kv_transfers(t, r)
                    r.prefilled = True
                    stats["prompt_tokens"] += r.prompt
                    stats["prefix_queries"] += r.prompt
                    stats["prefix_hits"] += (
                        r.cached if self.proto12 else
                        r.prompt * rng.choice([0, 1, 2]) // 4)
                    n = 1
                elif self.spec_tokens:
                    accepted = 0
                    while (accepted < self.spec_tokens
                           and rng.random() < 0.7):
                        per_pos[accepted] += 1
                        accepted += 1
                    stats["spec_drafts"] += 1
                    stats["spec_draft_tokens"] += self.spec_tokens
                    stats["spec_accepted_tokens"] += accepted
                    n = 1 + accepted
                else:
                    n = 1
                n = min(n, r.target - r.generated)
                r.generated += n
                stats["generation_tokens"] += n
                events.append([4, t, r.rid, n])
                if r.generated >= r.target:
                    if rng.random() < 0.03:
                        reason = "abort"
                    elif rng.random() < 0.01:
                        reason = "error"
                    elif r.target == r.max_tokens:
                        reason = "length"
                    else:
                        reason = "stop"
                    events.append([5, t, r.rid, reason])
                    self.finished += 1
                    self.finished_preemptions += r.preemptions
                    self.finished_computed += r.prompt - r.cached - r.external
                    self.finished_kv_received += r.external > 0
                    self.finished_by_tenant[r.tenant] = \
                        self.finished_by_tenant.get(r.tenant, 0) + 1
                else:
                    still.append(r)
            running = still
            held = sum(r.prompt + r.generated for r in running)
            stats["running"] = len(running)
            stats["waiting"] = len(waiting)
            if self.proto12:
                # Held back for an adapter slot: not for capacity.
                busy = {r.lora for r in running if r.lora}
                stats["waiting_deferred"] = sum(
                    1 for r in waiting if r.lora and r.lora not in busy
                    and len(busy) >= self.lora_slots)
            stats["kv_usage"] = min(1.0, self.kv_floor +
                                    (1 - self.kv_floor) * held / 8192)
            if self.spec_tokens:
                stats["spec_accepted_per_pos"] = per_pos
            events.append([7, t, stats])
            if self.moe_layers:
                moe_tokens += stats["prompt_tokens"] + \
                    stats["generation_tokens"]
                if step_no % self.moe_every == 0 and moe_tokens:
                    events += self._expert_load(t, moe_tokens)
                    moe_tokens = 0
            dropped += self.drops_per_s * self.step_s
            s.sendall(_frame(1, seq, int(dropped), events))
            seq += 1
        if moe_tokens:
            s.sendall(_frame(1, seq, int(dropped),
                             self._expert_load(time.monotonic_ns(),
                                               moe_tokens)))
        s.sendall(_frame(2))
        s.close()
