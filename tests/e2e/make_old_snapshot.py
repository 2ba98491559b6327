#!/usr/bin/env python3
"""Makes tests/data/snapshot_v2/: a state snapshot written by an older
tokenmeterd, and the exposition that daemon served just before it wrote it,
for state_e2e_test.py's OldFormat case (a new daemon must load the old
format and show exactly that exposition).

The checked-in files were made with tokenmeterd built from commit 162d07b
(snapshot format 2: the last before the engine-family parts), e.g.

  git worktree add /tmp/old 162d07b
  meson setup /tmp/old/b --buildtype=release -Dtests=disabled -Dcuda=disabled
  ninja -C /tmp/old/b daemon/tokenmeterd
  tests/e2e/make_old_snapshot.py /tmp/old/b/daemon/tokenmeterd \\
      tests/data/snapshot_v2

It feeds the old daemon bench/ab/same_exposition.py's randomized stream
(every 1.1 feature, all three profiles; seed 7, 600 requests), waits until
every request is retired (so that the snapshot holds none in flight: their
CLOCK_MONOTONIC times would mean nothing on another machine), scrapes
/metrics, stops the daemon with SIGTERM (its final snapshot) and copies:
  snapshot       DIR/snapshot as the old daemon wrote it
  boot_id        the boot id it was written under (a fixed string)
  args           the daemon's flags besides --ingest, --listen and the
                 state paths, one per line (the fingerprint depends on them)
  exposition.txt its /metrics (text 0.0.4) just before the stop

Usage: make_old_snapshot.py OLD_TOKENMETERD OUTDIR
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "ab"))
import same_exposition as se  # noqa: E402

BOOT_ID = "tokenmeter-snapshot-v2-fixture"
ARGS = ["--log-interval", "3600", "--finished-grace", "0.2",
        "--request-idle-timeout", "1", "--request-label", "tenant",
        "--request-label-values", "3", "--moe-expert-series"]


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    binary, out = argv[1], argv[2]
    tmp = tempfile.mkdtemp(prefix="tm-old-snap-", dir="/tmp")
    try:
        state = os.path.join(tmp, "state")
        boot = os.path.join(tmp, "boot_id")
        with open(boot, "w") as f:
            f.write(BOOT_ID + "\n")
        sock_path = os.path.join(tmp, "i.sock")
        port = se.free_port()
        log = open(os.path.join(tmp, "log"), "w")
        proc = subprocess.Popen(
            [binary, "--ingest", sock_path, "--listen", f"127.0.0.1:{port}",
             "--state-dir", state, "--boot-id-file", boot] + ARGS,
            stdout=log, stderr=subprocess.STDOUT)

        def get(path):
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.read().decode()

        def value(name):
            total = 0.0
            for line in get("/metrics").splitlines():
                if line.startswith(name) and line[len(name)] in " {":
                    total += float(line.rsplit(" ", 1)[1])
            return total

        deadline = time.monotonic() + 20
        while True:
            try:
                get("/healthz")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the daemon did not start")
                time.sleep(0.02)
        conns, steps = se.build_stream(7, 600)
        socks = {}
        for name, hello_bytes in conns.items():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock_path)
            s.sendall(hello_bytes)
            socks[name] = s
        frames = len(conns)
        for name, frame in steps:
            socks[name].sendall(frame)
            frames += 1
            deadline = time.monotonic() + 20
            while value("tokenmeter_ingest_frames_total") < frames:
                if time.monotonic() > deadline:
                    raise RuntimeError("the daemon stopped applying frames")
                time.sleep(0.005)
        for s in socks.values():
            s.close()
        deadline = time.monotonic() + 30
        while (value("tokenmeter_tracked_requests") > 0 or
               value("tokenmeter_ingest_connections") > 0):
            if time.monotonic() > deadline:
                raise RuntimeError("requests were not retired")
            time.sleep(0.05)
        exposition = get("/metrics")
        proc.send_signal(signal.SIGTERM)
        if proc.wait(timeout=30) != 0:
            raise RuntimeError("the daemon did not stop cleanly")
        log.close()
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(os.path.join(state, "snapshot"),
                        os.path.join(out, "snapshot"))
        with open(os.path.join(out, "boot_id"), "w") as f:
            f.write(BOOT_ID + "\n")
        with open(os.path.join(out, "args"), "w") as f:
            f.write("\n".join(ARGS) + "\n")
        with open(os.path.join(out, "exposition.txt"), "w") as f:
            f.write(exposition)
        print(f"wrote {out}: snapshot of "
              f"{os.path.getsize(os.path.join(out, 'snapshot'))} bytes, "
              f"{len(exposition.splitlines())} exposition lines")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
