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
                 "prefilled", "lora", "arrived_s", "tenant")

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
    """

    def __init__(self, sock_path, engine, model, instance="0", *,
                 arrival_rate=8.0, step_s=0.025, max_running=6,
                 spec_tokens=3, kv_floor=0.2, drops_per_s=0.0, seed=1,
                 profile=None, cache_config=None, max_lora=None, loras=(),
                 tenants=(), untenanted=0.0, moe_layers=0, moe_experts=8,
                 moe_top_k=2, moe_every=4):
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
        self.rng = random.Random(seed)
        self.error = None
        self.finished = 0
        self.finished_by_tenant = {}  # tenant ("" for none) -> count
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
        return params

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
        waiting = collections.deque()
        running = []
        next_rid = 1
        seq = 0
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
                events.append([1, at, r.rid, prompt,
                               self._arrived_params(r)])
                events.append([2, at, r.rid])
                waiting.append(r)
                next_arrival += rng.expovariate(self.arrival_rate)
            # Now and then the scheduler preempts the newest running request.
            if running and rng.random() < 0.03:
                r = running.pop()
                r.prefilled = False  # recompute its prompt when rescheduled
                events.append([6, t, r.rid])
                waiting.appendleft(r)
            # Admit waiting requests into free slots, in order, passing over
            # those whose adapter cannot run now (max_lora adapters busy);
            # one passed over for a second stops the others, so that the
            # busy adapters drain and its own gets a slot.
            active = {r.lora for r in running if r.lora}
            passed = collections.deque()
            while waiting and len(running) < self.max_running:
                r = waiting.popleft()
                if (r.lora and r.lora not in active
                        and len(active) >= self.lora_slots):
                    passed.append(r)
                    if now - r.arrived_s > 1.0:
                        break
                    continue
                if r.lora:
                    active.add(r.lora)
                events.append([3, t, r.rid])
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
                if r.prefilled is None:  # admitted in this step: wait one
                    r.prefilled = False
                    still.append(r)
                    continue
                if not r.prefilled:
                    r.prefilled = True
                    stats["prompt_tokens"] += r.prompt
                    stats["prefix_queries"] += r.prompt
                    stats["prefix_hits"] += r.prompt * rng.choice([0, 1, 2]) // 4
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
                    self.finished_by_tenant[r.tenant] = \
                        self.finished_by_tenant.get(r.tenant, 0) + 1
                else:
                    still.append(r)
            running = still
            held = sum(r.prompt + r.generated for r in running)
            stats["running"] = len(running)
            stats["waiting"] = len(waiting)
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
