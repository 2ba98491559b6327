#!/usr/bin/python3
"""What metrics cost the reference engine: interleaved A/B runs of
tokenmeter-engine on a CPU-bound configuration, reporting to a running
tokenmeterd (A) versus --no-metrics (B), same seed, same work.

Prints each pair, then the median of the per-pair throughput ratios A/B
(output tokens/s, from the engine's own --report) and PASS or MISS against
the goal (>= 0.995). Wall-clock ratios on a busy machine are only as good
as the machine is quiet, so it also prints two figures that other load
disturbs less, from the CPU times the engine reports:

* loop-thread ratio: output tokens per CPU second of the engine loop
  thread, A over B (what the event calls cost the thread that runs the
  model);
* sender share: CPU time of the rest of the process (libtokenmeter's sender
  thread) over the loop thread's, in the A runs (what encoding and writing
  cost, on another core);
* daemon share: tokenmeterd's CPU during the A runs over their loop CPU
  (another process, which on a machine without a spare core competes too).

--aa runs B against B: the noise floor of the wall-clock ratio.

--moe E K measures the MoE metrics alone: both sides run the model with
--moe-experts E --moe-top-k K and report to the daemon; A counts routed
tokens and sends EXPERT_LOAD every 16 steps (the default), B runs
--expert-load-every 0 (no counting, no EXPERT_LOAD). The script checks
that A sent EXPERT_LOAD and B did not.

--instructions runs each side once under valgrind's callgrind instead,
counting the instructions of the engine loop thread (Engine::Run(), the
sender thread excluded): a deterministic figure, insensitive to the
machine's load, of what the event calls cost the thread that runs the
model; it prints B/A (the throughput ratio A/B the instruction counts
predict on a machine that runs them at one speed).

Usage: bench/engine/overhead.py [--build DIR] [--pairs N] [--aa]
                                [--moe E K] [--instructions]
                                [-- ENGINE ARGS]
docs/performance.md records the figures and the command.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

GOAL = 0.995

# The smallest model at full batch: the most events per unit of compute,
# i.e. the configuration where metrics cost the most. All requests at once
# (--rate 0), so the engine never idles: throughput is compute-bound.
CPU_BOUND = [
    "--backend", "cpu", "--model-size", "tiny", "--requests", "200",
    "--rate", "0", "--prompt-len", "96", "--output-len", "64",
    "--max-batch", "64", "--max-tokens-per-step", "1024",
    "--kv-blocks", "4096", "--block-size", "16", "--seed", "7", "--quiet",
]


def cpu_seconds(pid):
    """user + system CPU of a process, from /proc (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_engine(engine, args, report_path):
    subprocess.run([engine, *args, "--report", report_path], check=True)
    with open(report_path) as f:
        return json.load(f)


def loop_instructions(engine, args, out_dir, side):
    """Instructions callgrind counts inside Engine::Run() on its thread."""
    out = os.path.join(out_dir, f"callgrind.{side}")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         "--toggle-collect=tokenmeter::engine::Engine::Run()", engine, *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        check=True)
    for line in proc.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1])
    sys.exit(f"no callgrind total in: {proc.stderr[-2000:]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build",
                   help="meson build directory (default: build)")
    p.add_argument("--pairs", type=int, default=31)
    p.add_argument("--aa", action="store_true",
                   help="control: no metrics on both sides")
    p.add_argument("--moe", nargs=2, type=int, metavar=("E", "K"),
                   help="A: MoE metrics on, B: --expert-load-every 0")
    p.add_argument("--instructions", action="store_true",
                   help="count the loop thread's instructions (callgrind)")
    p.add_argument("engine_args", nargs="*",
                   help="replace the CPU-bound configuration")
    a = p.parse_args()
    engine = os.path.join(a.build, "engine", "tokenmeter-engine")
    daemon = os.path.join(a.build, "daemon", "tokenmeterd")
    for path in (engine, daemon):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} not built (ninja -C {a.build})")
    args = a.engine_args or CPU_BOUND

    d = tu.Daemon("--log-interval", "0", binary=daemon,
                  prefix="tm-overhead-").start_or_exit()
    proc, sock = d.proc, d.sock
    report_path = os.path.join(d.dir, "report.json")
    if a.moe:
        args = args + ["--moe-experts", str(a.moe[0]),
                       "--moe-top-k", str(a.moe[1]), "--metrics-socket", sock]
        without = args + ["--expert-load-every", "0"]
        b_name = "--expert-load-every 0 (no MoE counts)"
        a_name = "MoE counts and EXPERT_LOAD every 16 steps"
    else:
        without = args + ["--no-metrics"]
        b_name = "--no-metrics"
        a_name = "metrics to a running tokenmeterd"
        args = args + ["--metrics-socket", sock]
    with_metrics = without if a.aa else args
    print(f"engine: {' '.join(args)}")
    print("A: " + (f"{b_name} (A/A control)" if a.aa else a_name) +
          f", B: {b_name}")
    if a.instructions:
        try:
            ia = loop_instructions(engine, with_metrics, d.dir, "A")
            ib = loop_instructions(engine, without, d.dir, "B")
        finally:
            d.stop()
            d.cleanup()
        ratio = ib / ia
        print(f"loop-thread instructions: A {ia:,}, B {ib:,}, B/A "
              f"{ratio:.6f}: {'PASS' if ratio >= GOAL else 'MISS'} "
              f"(goal >= {GOAL})")
        return 0 if ratio >= GOAL else 1
    print(f"{'pair':>4} {'A tok/s':>9} {'B tok/s':>9} {'ratio':>7} "
          f"{'loop ratio':>10} {'sender %':>8} {'dropped':>7}")
    ratios, loop_ratios, sender_shares = [], [], []
    daemon_cpu = a_loop_cpu = 0.0
    try:
        run_engine(engine, without, report_path)  # warm caches, page cache
        for i in range(a.pairs):
            # Alternate which side goes first, so that drift cancels.
            order = [("A", with_metrics), ("B", without)]
            if i % 2:
                order.reverse()
            res = {}
            for side, argv in order:
                d0 = cpu_seconds(proc.pid)
                res[side] = run_engine(engine, argv, report_path)
                if side == "A":
                    daemon_cpu += cpu_seconds(proc.pid) - d0
                    a_loop_cpu += res[side]["loop_cpu_s"]
            ra, rb = res["A"], res["B"]
            if ra["generation_tokens"] != rb["generation_tokens"]:
                sys.exit("runs did different work: same seed expected")
            if a.moe and (rb.get("moe_expert_load_events", 0) != 0 or
                          (ra.get("moe_expert_load_events", 0) == 0) !=
                          a.aa):
                sys.exit("EXPERT_LOAD expected from A only")
            ratio = ra["output_tokens_per_s"] / rb["output_tokens_per_s"]
            loop_ratio = rb["loop_cpu_s"] / ra["loop_cpu_s"]
            sender = (ra["process_cpu_s"] - ra["loop_cpu_s"]) / ra[
                "loop_cpu_s"]
            ratios.append(ratio)
            loop_ratios.append(loop_ratio)
            sender_shares.append(sender)
            print(f"{i + 1:>4} {ra['output_tokens_per_s']:>9.1f} "
                  f"{rb['output_tokens_per_s']:>9.1f} {ratio:>7.4f} "
                  f"{loop_ratio:>10.4f} {100 * sender:>8.3f} "
                  f"{ra['client_dropped_events']:>7}")
    finally:
        d.stop()
        d.cleanup()

    median = statistics.median(ratios)
    verdict = "PASS" if median >= GOAL else "MISS"
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [median] * 3
    print(f"median throughput ratio A/B: {median:.4f} over {len(ratios)} "
          f"pairs (quartiles {q[0]:.4f} .. {q[2]:.4f}): {verdict} "
          f"(goal >= {GOAL})")
    print(f"median loop-thread ratio (tokens per loop CPU second, A/B): "
          f"{statistics.median(loop_ratios):.4f}")
    print(f"median sender share (other threads' CPU / loop CPU, A): "
          f"{100 * statistics.median(sender_shares):.3f}%")
    print(f"daemon CPU during the A runs / their loop CPU: "
          f"{100 * daemon_cpu / a_loop_cpu:.2f}% (another process)")
    return 0 if median >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
