#!/usr/bin/python3
"""Cost of tokenmeter's vLLM stat-logger plugin on vLLM's logging path,
beside vLLM's own Prometheus logger doing its work for the same stats.

vLLM's front end calls every stat logger's record(scheduler_stats,
iteration_stats, engine_idx=...) once per engine-core iteration, in its
output-handling loop. This replays one recorded workload (the vLLM v0.12
stand-in's tests/python/standins/vllm_workload.py: speculative decoding,
parallel sampling, preemptions, every finish reason; fixed seed) through:

  vllm   the stand-in's PrometheusStatLogger (tests/python/standins: what
         vLLM's logger computes, with prometheus_client 0.16 from Debian),
         registering into its own CollectorRegistry;
  plugin tokenmeter.integrations.vllm.TokenmeterStatLogger, its client
         connected to a tokenmeterd (--tokenmeterd) or to no daemon at all
         (the default: the events are buffered, then dropped at close; the
         calls cost the same).

Both see the same list of (SchedulerStats, IterationStats), built before
any timing. A repetition times each logger over every iteration once, in
turn (CPU time of the calling thread), so that a shared machine's load
falls on both alike; the figure is the median over --reps of ns per
record() call, and the ratio plugin / vllm of each repetition's pair, whose
median decides: the plugin must cost at most what vLLM's logger costs
(ratio <= 1).

    PYTHONPATH=<build>/client_lib/python bench/python/vllm_plugin_bench.py \\
        [--iterations 2000] [--reps 7] [--tokenmeterd PATH]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "python", "standins"))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))

import prometheus_client  # noqa: E402
import tokenmeter  # noqa: E402
from vllm.config import (ModelConfig, SpeculativeConfig,  # noqa: E402
                         VllmConfig)
from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: E402
from vllm_workload import Workload  # noqa: E402

from tokenmeter.integrations import vllm as plugin  # noqa: E402


def timed(logger, steps):
    t0 = time.thread_time_ns()
    for s, it in steps:
        logger.record(s, it, engine_idx=0)
    return (time.thread_time_ns() - t0) / len(steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--tokenmeterd", default="",
                    help="a tokenmeterd binary to report to (default: none)")
    args = ap.parse_args()

    w = Workload(seed=args.seed, spec_tokens=3, arrivals_per_s=60.0)
    steps = [(s, it) for _ in range(args.iterations)
             for _, s, it in w.step()]
    per = {
        "finished requests": sum(len(it.finished_requests)
                                 for _, it in steps),
        "times to first token": sum(len(it.time_to_first_tokens_iter)
                                    for _, it in steps),
        "inter-token latencies": sum(len(it.inter_token_latencies_iter)
                                     for _, it in steps),
    }
    cfg = VllmConfig(model_config=ModelConfig(model="org/model-a",
                                              max_model_len=2048),
                     speculative_config=SpeculativeConfig(3))
    daemon = None
    if args.tokenmeterd:
        import tokenmeter_testutil as tu
        daemon = tu.Daemon("--log-interval", "0",
                           binary=args.tokenmeterd).start()
        os.environ[plugin.SOCKET_VAR] = daemon.sock
    else:
        os.environ[plugin.SOCKET_VAR] = os.path.join(
            tempfile.gettempdir(), "no-tokenmeterd-here.sock")
    rows = {"vllm": [], "plugin": []}
    ratios = []
    try:
        for _ in range(args.reps):
            PrometheusStatLogger.registry = prometheus_client.CollectorRegistry()
            ref = PrometheusStatLogger(cfg, [0])
            ours = plugin.TokenmeterStatLogger(cfg, [0])
            ours.log_engine_initialized()
            a = timed(ref, steps)
            b = timed(ours, steps)
            rows["vllm"].append(a)
            rows["plugin"].append(b)
            ratios.append(b / a)
            stats = [c.close() for c in ours.clients.values()]
            if ours.errors or any(s.events_rejected for s in stats):
                print("INVALID: the plugin failed or the library rejected "
                      f"events ({ours.errors}, {stats})")
                return 2
    finally:
        if daemon is not None:
            daemon.stop()
            daemon.cleanup()
    print(f"tokenmeter backend: {tokenmeter.backend}; daemon: "
          f"{'tokenmeterd' if daemon else 'none'}; {len(steps)} record() "
          "calls of " + ", ".join(f"{v} {k}" for k, v in per.items()))
    for name, v in rows.items():
        print(f"{name:8s} {statistics.median(v) / 1000:8.2f} us per record()"
              f"  (min {min(v) / 1000:.2f}, max {max(v) / 1000:.2f})")
    r = statistics.median(ratios)
    print(f"ratio plugin / vllm: {r:.3f} (median of {len(ratios)} "
          f"repetitions) {'PASS' if r <= 1.0 else 'MISS'}: at most 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
