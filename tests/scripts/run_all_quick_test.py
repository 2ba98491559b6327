#!/usr/bin/python3
"""bench/run_all.sh --quick --no-build against a build's own binaries.

Usage: run_all_quick_test.py SOURCE_ROOT BUILD_ROOT

Checks that the script exits 0 and prints the whole table: every row below,
in order, each with a numeric tokenmeter figure, peer or limit figure and
ratio (finite, > 0), a goal and a verdict that agrees with them, or SKIP
with a reason that names a missing toolchain ("... not found ...", "built
without ..."); then the commit, load and commands lines. A row skipped for
any other reason (a binary not built, a run that did not happen) fails.
When some rows are skipped for a missing toolchain (no go, say) and all
else holds, the test exits 77 and says which.
"""

import math
import os
import re
import subprocess
import sys
import time

# The rows, in order: a piece of each figure's text (the table's first
# column), kept here rather than imported so that a row the table script
# loses fails this test.
ROWS = [
    "`tm_tokens`, caller `t_ns`, 1 thread: vs 15 ns",
    "`tm_tokens`, caller `t_ns`, 2 threads: vs 15 ns",
    "`tm_tokens`, `t_ns = 0` (now), 1 thread: vs 35 ns",
    "`tm_tokens` now / `clock_gettime` alone",
    "`tm_tokens` caller, shared / static library",
    "prometheus-cpp `Observe` / `tm_tokens`, 1 thread",
    "prometheus-cpp `Observe` / `tm_tokens`, 2 threads",
    "client_golang `Observe` classic / `tm_tokens`, 1 goroutine",
    "client_golang `Observe` classic / `tm_tokens`, 2 goroutines",
    "client_golang `Observe` native / `tm_tokens`, 1 goroutine",
    "client_golang `Observe` native / `tm_tokens`, 2 goroutines",
    "VictoriaMetrics `Update` / `tm_tokens`, 1 goroutine",
    "VictoriaMetrics `Update` / `tm_tokens`, 2 goroutines",
    "ingest: tokenmeterd / read + msgpack-c ceiling",
    "ingest: tokenmeterd vs 5 M events per CPU-s",
    "render text: prometheus-cpp / tokenmeterd",
    "render text: client_golang / tokenmeterd",
    "render text: VictoriaMetrics / tokenmeterd",
    "render: tokenmeterd protobuf / text",
    "render protobuf: libprotobuf classes / tokenmeterd",
    "render protobuf: client_golang / tokenmeterd",
    "Python: prometheus_client `observe` / `tokens(int)`",
    "Python: prometheus_client `observe` / `tokens(str)`",
    "Python: `tokens_batch` list[int] x256 vs 10 ns/event",
]
FIGURE = re.compile(r"^(\d+(\.\d+)?) (ns|ms|M)$")
MISSING_TOOLCHAIN = re.compile(r"not found|built without")


def fail(msg, output=""):
    print(output)
    print("FAIL: " + msg)
    return 1


def check_row(line, expected):
    """None when the row is fine, "skip: why" for a toolchain skip, or an
    error message."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 6:
        return f"row has {len(cells)} cells, not 6: {line}"
    figure, ours, peer, ratio, goal, verdict = cells
    if not figure.startswith(expected):
        return f"row {figure!r} where {expected!r} was expected"
    if verdict.startswith("SKIP: "):
        why = verdict[len("SKIP: "):]
        if not MISSING_TOOLCHAIN.search(why):
            return f"row {expected!r} skipped for no missing toolchain: {why}"
        if (ours, peer, ratio) != ("n/a", "n/a", "n/a"):
            return f"skipped row {expected!r} has figures: {line}"
        return "skip: " + why
    for cell in (ours, peer):
        if not FIGURE.match(cell):
            return f"row {expected!r}: {cell!r} is not a figure"
    m = re.fullmatch(r"\*\*(\d+\.\d+)\*\*", ratio)
    if not m:
        return f"row {expected!r}: ratio {ratio!r} is not a number"
    r = float(m.group(1))
    if not math.isfinite(r) or r <= 0:
        return f"row {expected!r}: ratio {r} is not finite and positive"
    if goal == "(none)":
        if verdict:
            return f"row {expected!r}: a verdict without a goal"
        return None
    g = re.fullmatch(r"(>=|<=) (\d+(\.\d+)?)", goal)
    if not g:
        return f"row {expected!r}: goal {goal!r} not understood"
    # The verdict is taken on the unrounded ratio: only check it where
    # rounding cannot flip it.
    bound = float(g.group(2))
    ok = r >= bound if g.group(1) == ">=" else r <= bound
    if abs(r - bound) > 0.006 and verdict != ("PASS" if ok else "MISS"):
        return f"row {expected!r}: verdict {verdict!r} for {r} {goal}"
    if verdict not in ("PASS", "MISS"):
        return f"row {expected!r}: verdict {verdict!r}"
    return None


def main(argv):
    src, build = argv[1], argv[2]
    t0 = time.monotonic()
    proc = subprocess.run(
        [os.path.join(src, "bench", "run_all.sh"), "--quick", "--no-build",
         build], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=170)
    output = proc.stdout
    took = time.monotonic() - t0
    if proc.returncode != 0:
        return fail(f"bench/run_all.sh exited {proc.returncode}", output)
    rows = [line for line in output.splitlines()
            if line.startswith("| ") and not line.startswith("| figure ")]
    if len(rows) != len(ROWS):
        return fail(f"{len(rows)} rows, {len(ROWS)} expected", output)
    skipped = []
    for line, expected in zip(rows, ROWS):
        err = check_row(line, expected)
        if err and err.startswith("skip: "):
            skipped.append(f"{expected}: {err[6:]}")
        elif err:
            return fail(err, output)
    for needed in (r"^Commit \w+", r"load average \(1/5/15 min\) [\d.]+ ",
                   r"^\s+\[c\] ", r"^\s+\[i\] "):
        if not re.search(needed, output, re.M):
            return fail(f"no line matching {needed!r}", output)
    if "INVALID" in output:
        return fail("a run was INVALID", output)
    print(output)
    print(f"run_all --quick: {len(rows)} rows in {took:.0f} s")
    if skipped:
        print("SKIP (a peer's toolchain is missing; every other row checked):")
        for s in skipped:
            print("  " + s)
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
