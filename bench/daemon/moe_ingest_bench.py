#!/usr/bin/python3
"""What EXPERT_LOAD ingest costs tokenmeterd: the daemon's CPU share of one
core while a simulated MoE engine reports to it, with and without expert
load events, in one run.

The engine is this process, through the real client library (the Python
binding over libtokenmeter.so, over the daemon's Unix socket). It runs at
--steps-per-s (50) engine steps per second on a fixed schedule: every step
a tokens_batch() for the --batch (64) running requests and a step() with
running / waiting / kv_usage / token figures; a request that reaches its
output length (random, 32 .. 512 tokens) is finished and a new one arrives
and is scheduled in its place. Every --every (16) steps it also sends one
expert_load() for each of --layers (60) MoE layers with --experts (256)
counts: batch x every x top-k (8) routed tokens per layer (8,192), spread
over the experts by a per-layer log-normal weight (sigma 0.6: each layer
has its own hot experts) times log-normal noise per event (sigma 0.3), so
that the hottest expert gets about 5 times the mean and every event
differs. The count vectors are drawn before the runs (a pool of 16 per
layer, used in turn), so that drawing them costs the sender nothing while
it runs.

Six configurations, each on a fresh tokenmeterd (--log-interval 0):

  base          the engine without EXPERT_LOAD (the control);
  moe           the same engine with EXPERT_LOAD every --every steps;
  moe/1         EXPERT_LOAD every --stress-every (1) steps: 16 x the rate,
                so that the cost per event stands above the noise;
  base+series, moe+series, moe/1+series
                the same with --moe-expert-series (layers x experts =
                15,360 more series) and --max-engine-series 16384, since
                those series count toward that cap (default 4096).

Each round runs the six in a rotated order. Each run first sends for
--warmup seconds (the first EXPERT_LOAD of each layer creates its series
then), flushes the client, then times --duration seconds of the same
engine: the daemon's CPU time is the sum over its threads of
/proc/PID/task/TID/schedstat's run time (ns), read before the first timed
step and after the last one has been flushed and 0.2 s has passed; its
share of one core is CPU time / wall time of that span. The EXPERT_LOAD
share is moe - base of the same round (and moe+series - base+series): the
daemon's CPU that EXPERT_LOAD adds to the same engine's other events.
(moe/1 - base) / its events per second is the CPU per EXPERT_LOAD, and
that times the goal's rate a second estimate of the share. No
/metrics scrape happens inside the timed span (a scrape's render cost is
reported beside it: the daemon's CPU over 5 scrapes after the run).

Every run is verified from the daemon's /metrics after it (a failed check
is an error, exit 1): no event dropped by the client, no
tokenmeter_ingest_errors_total; tokenmeter_ingest_events_total of kind
expert_load, tokens, step, arrived, scheduled and finished equal to what
was sent (none of expert_load in the control runs);
<ns>:moe_routed_tokens_total of each layer equal to the sum of the counts
sent for it; with
--moe-expert-series, layers x experts moe_expert_tokens_total series, each
equal to the counts sent for that expert.

The sender's CPU (this process: the simulation loop and the library's
sender thread) is printed beside it: it is not the daemon's.

Usage: bench/daemon/moe_ingest_bench.py [--build DIR] [--duration S]
                                        [--rounds N] [--warmup S]
                                        [--stress-every N] [...]
docs/performance.md ("MoE expert load ingest") records the figures and the
command.
"""
import argparse
import glob
import math
import os
import random
import statistics
import sys
import time
from array import array

SRC = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

GOAL_PCT = 1.0  # EXPERT_LOAD ingest under 1 % of one core
NS = "moe_bench"
MODEL = "moe-bench"
POOL = 16  # count vectors per layer, used in turn
TOP_K = 8
LAYER_SIGMA = 0.6  # per-layer skew of the experts' load
NOISE_SIGMA = 0.3  # per-event noise


def daemon_cpu_ns(pid):
    """Run time of all the daemon's threads (ns, /proc schedstat)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


def draw_pool(layers, experts, tokens, seed):
    """pool[layer][k]: array('Q') of `experts` counts summing to about
    `tokens` (skewed, random); sums[layer][k] their sums."""
    rng = random.Random(seed)
    pool, sums = [], []
    for _ in range(layers):
        base = [rng.lognormvariate(0.0, LAYER_SIGMA) for _ in range(experts)]
        vecs, vsums = [], []
        for _ in range(POOL):
            w = [b * rng.lognormvariate(0.0, NOISE_SIGMA) for b in base]
            scale = tokens / sum(w)
            v = array("Q", (int(x * scale + rng.random()) for x in w))
            vecs.append(v)
            vsums.append(sum(v))
        pool.append(vecs)
        sums.append(vsums)
    return pool, sums


class Engine:
    """The simulated engine: requests, steps and (optionally) expert load
    through one tokenmeter.Client; counts what it sent."""

    def __init__(self, client, args, pool, every, seed):
        self.c = client
        self.a = args
        self.pool = pool
        self.every = every  # steps between expert loads; 0: none
        self.rng = random.Random(seed)
        self.next_rid = 0
        self.rids = array("Q")
        self.left = []
        self.step_no = 0
        self.load_round = 0
        self.sent = {"tokens": 0, "step": 0, "arrived": 0, "finished": 0,
                     "scheduled": 0, "expert_load": 0}
        self.uses = [[0] * POOL for _ in range(args.layers)]
        for _ in range(args.batch):
            self.rids.append(self._arrive())
            self.left.append(self.rng.randint(32, 512))

    def _arrive(self):
        rid = self.next_rid
        self.next_rid += 1
        self.c.arrived(rid, self.rng.randint(64, 2048), 512)
        self.c.scheduled(rid)
        self.sent["arrived"] += 1
        self.sent["scheduled"] += 1
        return rid

    def step(self):
        c, s = self.c, self.sent
        n = c.tokens_batch(self.rids)
        if n != len(self.rids):
            raise RuntimeError(f"tokens_batch appended {n} of "
                               f"{len(self.rids)}: buffer full")
        s["tokens"] += n
        prompt = 0
        for i in range(len(self.left)):
            self.left[i] -= 1
            if self.left[i] == 0:
                c.finished(self.rids[i])
                s["finished"] += 1
                self.rids[i] = self._arrive()
                self.left[i] = self.rng.randint(32, 512)
                prompt += 1024
        c.step(running=len(self.rids), waiting=0,
               kv_usage=0.5 + 0.1 * math.sin(self.step_no / 100.0),
               prompt_tokens=prompt, generation_tokens=len(self.rids))
        s["step"] += 1
        self.step_no += 1
        if self.every and self.step_no % self.every == 0:
            k = self.load_round % POOL
            for layer in range(self.a.layers):
                rc = c.expert_load(layer, self.pool[layer][k])
                if rc != 0:
                    raise RuntimeError(f"expert_load returned {rc}")
                self.uses[layer][k] += 1
            s["expert_load"] += self.a.layers
            self.load_round += 1

    def run_for(self, seconds):
        """Steps on the fixed schedule for `seconds`; a late step is sent
        at once (the schedule catches up). Returns the steps that were
        late by more than one period."""
        period = 1.0 / self.a.steps_per_s
        steps = round(seconds * self.a.steps_per_s)
        t0 = time.monotonic()
        late = 0
        for i in range(steps):
            due = t0 + i * period
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            elif now - due > period:
                late += 1
            self.step()
        end = t0 + steps * period
        now = time.monotonic()
        if now < end:
            time.sleep(end - now)
        return late


def verify(d, eng, args, sums, series):
    """Checks the daemon applied every event; raises RuntimeError."""
    want_el = eng.sent["expert_load"]

    def applied():
        m = tu.scrape(d.port, timeout=30)
        got = m.value("tokenmeter_ingest_events_total", kind="tokens") or 0
        el = m.value("tokenmeter_ingest_events_total",
                     kind="expert_load") or 0
        done = got == eng.sent["tokens"] and el == want_el
        return (done or m.sum("tokenmeter_ingest_errors_total") > 0) and m
    m = tu.poll_until(applied, 30, interval=0.1,
                      what="every event applied (or an ingest error)")
    errs = {dict(ls).get("reason"): v for (n, ls), v in m.items()
            if n == "tokenmeter_ingest_errors_total" and v}
    if errs:
        raise RuntimeError(f"ingest errors: {errs}")
    for kind in ("step", "arrived", "finished", "scheduled"):
        got = m.value("tokenmeter_ingest_events_total", kind=kind) or 0
        if got != eng.sent[kind]:
            raise RuntimeError(f"{kind}: {got} applied, "
                               f"{eng.sent[kind]} sent")
    routed = {}
    experts = {}
    for (n, ls), v in m.items():
        ls = dict(ls)
        if n == f"{NS}:moe_routed_tokens_total":
            routed[int(ls["layer"])] = v
        elif n == f"{NS}:moe_expert_tokens_total":
            experts[(int(ls["layer"]), int(ls["expert"]))] = v
    want = {layer: sum(u * s for u, s in zip(eng.uses[layer], sums[layer]))
            for layer in range(args.layers)} if eng.every else {}
    if routed != want:
        bad = sorted(set(routed) ^ set(want)) or \
            [k for k in want if routed[k] != want[k]]
        raise RuntimeError(f"moe_routed_tokens_total differs from what was "
                           f"sent (layers {bad[:5]} ...)")
    routed_total = sum(routed.values())
    want_series = args.layers * args.experts if (eng.every and series) \
        else 0
    if len(experts) != want_series:
        raise RuntimeError(f"{len(experts)} moe_expert_tokens series, "
                           f"{want_series} expected")
    if want_series:
        for layer in range(args.layers):
            for e in range(args.experts):
                w = sum(u * eng.pool[layer][k][e]
                        for k, u in enumerate(eng.uses[layer]))
                if experts[(layer, e)] != w:
                    raise RuntimeError(
                        f"moe_expert_tokens_total{{layer={layer},expert={e}}}"
                        f" = {experts[(layer, e)]}, {w} sent")
    return m, want_el, routed_total, len(experts)


def scrape_cost_ms(d, n=5):
    """The daemon's CPU per /metrics scrape (ms), and the body's size."""
    before = daemon_cpu_ns(d.proc.pid)
    for _ in range(n):
        body = tu.metrics_text(d.port, timeout=30)
    return (daemon_cpu_ns(d.proc.pid) - before) / n / 1e6, len(body)


def run_one(daemon_bin, args, pool, sums, every, series, seed):
    import tokenmeter
    flags = ["--log-interval", "0"]
    if series:
        # layers x experts series count toward --max-engine-series
        # (default 4096: 16 layers of 256 experts).
        flags += ["--moe-expert-series", "--max-engine-series",
                  str(args.max_engine_series)]
    d = tu.Daemon(*flags, binary=daemon_bin, prefix="tm-moe-bench-")
    try:
        d.start()
        c = tokenmeter.Client(model=MODEL, engine=NS, socket_path=d.sock)
        try:
            tu.poll_until(lambda: c.stats().connected == 1, 10,
                          what="the client connected")
            eng = Engine(c, args, pool, every, seed)
            eng.run_for(args.warmup)
            c.flush(timeout=5)
            time.sleep(0.2)
            pid = d.proc.pid
            cpu0 = daemon_cpu_ns(pid)
            own0 = time.process_time()
            w0 = time.monotonic()
            late = eng.run_for(args.duration)
            c.flush(timeout=5)
            time.sleep(0.2)
            w1 = time.monotonic()
            own1 = time.process_time()
            cpu1 = daemon_cpu_ns(pid)
            st = c.stats()
            if st.events_dropped or st.events_rejected:
                raise RuntimeError(f"client dropped {st.events_dropped}, "
                                   f"rejected {st.events_rejected}")
        finally:
            c.close()
        _, el, routed, nseries = verify(d, eng, args, sums, series)
        ms, body = scrape_cost_ms(d)
        if d.stop(timeout=30) != 0:
            raise RuntimeError("tokenmeterd did not exit 0")
    finally:
        d.cleanup()
    wall = w1 - w0
    return {
        "share": (cpu1 - cpu0) / 1e9 / wall * 100,
        "sender": (own1 - own0) / wall * 100,
        "wall": wall, "late": late, "expert_load": el, "routed": routed,
        "series": nseries, "tokens": eng.sent["tokens"],
        "scrape_ms": ms, "body": body,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build-rel"),
                    help="meson build dir with daemon/tokenmeterd and "
                         "client_lib/libtokenmeter.so (release; default "
                         "build-rel)")
    ap.add_argument("--duration", type=float, default=30.0,
                    help="timed seconds per run (default 30)")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="untimed seconds before each timed span")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-per-s", type=float, default=50.0)
    ap.add_argument("--every", type=int, default=16,
                    help="steps between expert loads (default 16)")
    ap.add_argument("--stress-every", type=int, default=1,
                    help="also runs sending expert loads every N steps, "
                         "to measure the cost per event above the noise "
                         "(default 1; 0 leaves them out)")
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64,
                    help="running requests (tokens per step)")
    ap.add_argument("--max-engine-series", type=int, default=16384,
                    help="the daemon's series cap in the +series runs "
                         "(default 16384; layers x experts + 1 must fit)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    daemon = os.path.join(args.build, "daemon", "tokenmeterd")
    lib = os.path.join(args.build, "client_lib", "libtokenmeter.so")
    for p in (daemon, lib):
        if not os.path.exists(p):
            sys.exit(f"{p} is not built (ninja -C {args.build} "
                     f"daemon/tokenmeterd client_lib/libtokenmeter.so.0.1.0)")
    os.environ["TOKENMETER_LIBRARY"] = lib
    sys.path.insert(0, os.path.join(SRC, "client_lib", "python"))

    tokens = args.batch * args.every * TOP_K
    pool, sums = draw_pool(args.layers, args.experts, tokens, args.seed)
    imb = statistics.median(max(v) * len(v) / sum(v)
                            for vecs in pool for v in vecs)
    flat = sorted(x for vecs in pool for v in vecs for x in v)
    print(f"engine: {args.steps_per_s:g} steps/s, {args.batch} running "
          f"requests; every {args.every} steps {args.layers} EXPERT_LOAD x "
          f"{args.experts} experts (~{tokens} routed tokens per layer, "
          f"top-{TOP_K}; counts {flat[0]} .. {flat[-1]}, median "
          f"{statistics.median(flat):g}; max/mean per event, median "
          f"{imb:.2f})")
    print(f"{args.rounds} rounds x {4 + 2 * bool(args.stress_every)} runs, "
          f"{args.warmup:g} s warm-up + "
          f"{args.duration:g} s timed each; daemon {daemon}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)

    configs = [("base", 0, False), ("moe", args.every, False),
               ("base+series", 0, True), ("moe+series", args.every, True)]
    if args.stress_every:
        configs[2:2] = [(f"moe/{args.stress_every}", args.stress_every,
                         False)]
        configs.append((f"moe/{args.stress_every}+series", args.stress_every,
                        True))
    res = {name: [] for name, _, _ in configs}
    for r in range(args.rounds):
        k = r * len(configs) // max(args.rounds, 1)
        for name, every, series in configs[k:] + configs[:k]:
            x = run_one(daemon, args, pool, sums, every, series,
                        args.seed * 1000 + r)
            res[name].append(x)
            print(f"round {r + 1} {name:15} daemon {x['share']:6.3f} % of "
                  f"a core  (sender {x['sender']:4.1f} %; "
                  f"{x['tokens']} tokens, {x['expert_load']} expert loads, "
                  f"{x['routed']:.0f} routed, {x['series']} expert series; "
                  f"scrape {x['scrape_ms']:.2f} ms CPU, {x['body']} B; "
                  f"late steps {x['late']})", flush=True)

    def med(name, key="share"):
        return statistics.median(x[key] for x in res[name])

    def paired(base, moe):
        """Median over rounds of moe - base, and each round's."""
        diffs = [m["share"] - b["share"] for b, m in zip(res[base], res[moe])]
        return statistics.median(diffs), " ".join(f"{x:+.3f}" for x in diffs)

    print(f"\nload at the end {os.getloadavg()[0]:.2f}\n")
    print("daemon CPU, % of one core: median over rounds [each round]; "
          "daemon CPU per scrape after the run")
    steps = round(args.duration * args.steps_per_s)
    late = 0
    for name, _, _ in configs:
        each = []
        for x in res[name]:
            mark = "*" if x["late"] > 0.01 * steps else ""
            late += bool(mark)
            each.append(f"{x['share']:.3f}{mark}")
        print(f"  {name:15} {med(name):7.3f}   [{' '.join(each)}]   scrape "
              f"{med(name, 'scrape_ms'):.2f} ms")
    if late:
        print(f"  * more than 1 % of the {steps} steps late: the sender "
              f"was starved of CPU and sent late steps back to back (fewer "
              f"daemon wake-ups); {late} run(s)")
    rate = args.layers * args.steps_per_s / args.every  # events/s
    print(f"\nEXPERT_LOAD at the goal's rate: {rate:g} events/s, "
          f"{rate * args.experts:g} counts/s")
    ok_all = True
    for label, sfx in (("without --moe-expert-series", ""),
                       ("with --moe-expert-series", "+series")):
        d, each = paired("base" + sfx, "moe" + sfx)
        ok = d < GOAL_PCT
        ok_all &= ok
        print(f"EXPERT_LOAD share {label}: {d:.3f} % of one core "
              f"(moe{sfx} - base{sfx}, each round {each}); goal < "
              f"{GOAL_PCT:g} %: {'PASS' if ok else 'MISS'}")
        key = "series" if sfx else "plain"
        print(f"RESULT moe_expert_load_share_pct_{key}={d:.3f}")
        if args.stress_every:
            srate = args.layers * args.steps_per_s / args.stress_every
            ds, each = paired("base" + sfx, f"moe/{args.stress_every}" + sfx)
            us = ds / 100 / srate * 1e6
            proj = us * 1e-6 * rate * 100
            ok = proj < GOAL_PCT
            print(f"  stress, every {args.stress_every} step(s) "
                  f"({srate:g} events/s): {ds:.3f} % of one core (each "
                  f"round {each}) = {us:.2f} us CPU per EXPERT_LOAD; at "
                  f"{rate:g} events/s: {proj:.4f} % of one core: "
                  f"{'PASS' if ok else 'MISS'}")
            print(f"RESULT moe_expert_load_us_per_event_{key}={us:.2f}")
            print(f"RESULT moe_expert_load_projected_pct_{key}={proj:.4f}")
    own = statistics.median(x["sender"] for v in res.values() for x in v)
    print(f"sender CPU (this process, not the daemon's): median "
          f"{own:.1f} % of one core")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, AssertionError) as e:
        print(f"moe_ingest_bench: {e}", file=sys.stderr)
        sys.exit(1)
