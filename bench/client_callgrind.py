#!/usr/bin/python3
"""Instructions per tm_tokens() call, counted by callgrind (load-independent).

Usage: client_callgrind.py BUILD [BUILD...] [--python] [--keep DIR]

For each BUILD (a meson build directory with bench/client_bench and
bench/client_bench_static built) runs, under valgrind --tool=callgrind:
  shared   bench/client_bench, case tm_tokens/caller_ts/threads:1
           (linked against libtokenmeter.so, loaded at start-up)
  static   bench/client_bench_static, the same case
  python-native (with --python, where BUILD has the extension and the
           package's copy in client_lib/python):
           Client.attach_thread(), then 20,000 Client.tokens(rid, 1, t_ns)
           calls, the library loaded by dlopen() as Python loads it (the
           daemon need not run: the events stay in the ring)
and prints, from `callgrind_annotate --inclusive=yes --tree=caller`, the
instructions of tm_tokens with everything it calls (inclusive Ir) over its
calls (the sum of its callers' call counts), and for the benchmarks the
calling loop's own instructions per call, where callgrind counts the
caller's PLT jump (shared) or nothing (static).

Exit status: 0, or 2 when a run fails or its output has no tm_tokens.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

PY_SCRIPT = """
import tokenmeter
c = tokenmeter.Client(model="m", socket_path="/nonexistent/tokenmeter.sock",
                      close_timeout=0.05)
c.attach_thread()
t = tokenmeter.now_ns()
for i in range(20000):
    c.tokens(i, 1, t + i)
c.close()
"""


def annotate(out):
    return subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--tree=caller",
         "--threshold=100", out],
        capture_output=True, text=True, check=True).stdout


def per_call(text, func="tm_tokens"):
    """(inclusive Ir, calls, [(caller, calls)]) of func."""
    star = re.compile(r"^\s*([\d,]+) .*\*  \S*:%s \[" % re.escape(func))
    caller = re.compile(r"^\s*[\d,]+ .*<\s+(\S*:.*?) \(([\d,]+)x\)")
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        for line in lines:
            m = star.match(line)
            if m:
                callers = []
                for other in lines:
                    c = caller.match(other)
                    if c:
                        callers.append((c.group(1),
                                        int(c.group(2).replace(",", ""))))
                return (int(m.group(1).replace(",", "")),
                        sum(n for _, n in callers), callers)
    return None


def self_ir(out, name):
    """Exclusive Ir of the function whose name starts with `name`."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", out],
                          capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+) .*?\S*:(.*) \[", line)
        if m and m.group(2).startswith(name):
            return int(m.group(1).replace(",", ""))
    return None


def callgrind(cmd, out, env=None):
    r = subprocess.run(["valgrind", "--tool=callgrind",
                        "--callgrind-out-file=" + out] + cmd,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, env=env, check=False)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d: %s" %
                           (" ".join(cmd), r.returncode, r.stderr[-800:]))


def main(argv):
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("builds", nargs="+")
    p.add_argument("--python", action="store_true")
    p.add_argument("--keep", default=None)
    args = p.parse_args(argv)
    out_dir = args.keep or tempfile.mkdtemp(prefix="tm-callgrind.")
    os.makedirs(out_dir, exist_ok=True)
    print("%-28s %-14s %10s %8s %9s %12s" %
          ("build", "case", "Ir", "calls", "Ir/call", "caller/call"))
    status = 0
    for i, build in enumerate(args.builds):
        runs = []
        for case, exe in (("shared", "client_bench"),
                          ("static", "client_bench_static")):
            runs.append((case, [os.path.join(build, "bench", exe),
                                "--benchmark_filter="
                                "^tm_tokens/caller_ts/threads:1$",
                                "--benchmark_min_time=0.01",
                                "--benchmark_repetitions=1"], None))
        pkg = os.path.join(build, "client_lib", "python")
        lib = os.path.join(build, "client_lib", "libtokenmeter.so")
        if args.python:
            # (ctypes too loads the library with dlopen(), but callgrind
            # does not see tm_tokens() entered from libffi as a call.)
            for backend in ("native",):
                env = dict(os.environ, PYTHONPATH=pkg,
                           TOKENMETER_LIBRARY=os.path.abspath(lib),
                           TOKENMETER_BACKEND=backend)
                runs.append(("python-" + backend,
                             [sys.executable, "-c", PY_SCRIPT], env))
        for case, cmd, env in runs:
            out = os.path.join(out_dir, "b%d-%s.out" % (i, case))
            try:
                callgrind(cmd, out, env)
            except RuntimeError as e:
                print("client_callgrind: %s" % e, file=sys.stderr)
                status = 2
                continue
            found = per_call(annotate(out))
            if found is None or found[1] == 0:
                print("client_callgrind: %s: no tm_tokens calls" % out,
                      file=sys.stderr)
                status = 2
                continue
            ir, calls, callers = found
            caller = ""
            if not case.startswith("python"):
                loop = max(callers, key=lambda c: c[1])[0].split(":", 1)[1]
                loop_ir = self_ir(out, loop[:60])
                if loop_ir is not None:
                    caller = "%.2f" % (loop_ir / calls)
            print("%-28s %-14s %10d %8d %9.2f %12s" %
                  (os.path.abspath(build)[-28:], case, ir, calls, ir / calls,
                   caller))
    print("callgrind outputs in %s" % out_dir)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
