#!/usr/bin/env python3
"""Same bytes in, same exposition out: two tokenmeterd binaries (an old and
a new build) get the same randomized ingest stream, and their /metrics must
be equal line for line, in text 0.0.4 and in OpenMetrics, and family for
family, byte for byte, in the protobuf format (what Prometheus asks for with
native histograms).

The stream (seeded) has requests split over a frontend and an engine-core
connection of one scope, with events in every order across the two (TOKENS
before ARRIVED, FINISHED before SCHEDULED, ...), missing starts (incomplete
intervals), time running backwards (negative intervals), preemptions,
integer and string ids, ARRIVED params (max_tokens, n, a LoRA adapter and a
per-request label: the daemons run with --request-label tenant (three
values a series, the fourth __other__) and
--moe-expert-series), STEP statistics with spec-decode positions,
EXPERT_LOAD of several layers (one of a wrong length), invalid events, a
private connection of another engine and a bad frame; an SGLang and an
LMDeploy connection (their naming profiles) with their own requests; HELLO
cache_config and max_lora. Steps are applied one at a time (each waits
until both daemons counted its frames), so both daemons see the same
order. Requests are retired by the tracker's cap (--max-requests 256), in
event order, never by the clock (which would differ between the two);
after the last step and the connections' close both are scraped.

Lines that describe the process or the scrape itself are left out of the
comparison: process_*, tokenmeter_scrape_duration_seconds and
tokenmeter_http_responses_total (each side counts its own polls); so is
the value (not the labels) of lora_requests_info, the wall time at which
each daemon saw the LoRA sets change. The summary window (which sets
SGLang's window gauges) is an hour, so that no window ends in a run.

Usage: bench/ab/same_exposition.py OLD_TOKENMETERD NEW_TOKENMETERD
         [--seed N] [--requests N] [--ignore NAME]...
         [--ignore-protobuf FAMILY]...
(--ignore: leave out the lines naming NAME, e.g. a family the new build
adds. --ignore-protobuf: leave out the protobuf family FAMILY, e.g. one
that gained a sample such as reason="bad_field"; its text samples are
still compared, less those --ignore names.)
Exit 0 when equal (prints the number of lines compared), 1 with a diff.
"""
import argparse
import difflib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import msgpack

IGNORED_PREFIXES = ("process_", "# HELP process_", "# TYPE process_")
IGNORED_NAMES = ("tokenmeter_scrape_duration_seconds",
                 "tokenmeter_http_responses")
# Samples whose value is a wall time: compared without it.
WALL_TIME_FAMILIES = ("lora_requests_info",)
# Requests are retired by the tracker's cap, in the order events were
# applied (finished ones first, else the least recently active), never by
# the clock: a grace period or idle timeout would retire a request at a
# wall time that differs between the two daemons, and a late event of it
# would then start it afresh in one and not in the other.
MAX_REQUESTS = 256
# What the stream must reach, so that a comparison covers it.
MUST_SHOW = ("sglang:", "lmdeploy:", "vllm:moe_expert_tokens_total{",
             "sglang:moe_layer_imbalance{", "vllm:cache_config_info{",
             "sglang:page_size{", 'tenant="acme"', 'tenant="__other__"',
             'reason="bad_event"', "lmdeploy:iteration_tokens_total_bucket{",
             "lmdeploy:time_per_output_token_seconds_bucket{")
PROTOBUF = ("application/vnd.google.protobuf; "
            "proto=io.prometheus.client.MetricFamily; encoding=delimited")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Daemon:
    def __init__(self, binary, tmp, name):
        self.dir = os.path.join(tmp, name)
        os.mkdir(self.dir)
        self.sock = os.path.join(self.dir, "i.sock")
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--ingest", self.sock, "--listen",
             f"127.0.0.1:{self.port}", "--log-interval", "3600",
             "--finished-grace", "3600", "--request-idle-timeout", "3600",
             "--max-requests", str(MAX_REQUESTS),
             "--request-label", "tenant", "--request-label-values", "3",
             "--moe-expert-series"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.get("/healthz")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{binary} did not start")
                time.sleep(0.02)

    def get(self, path, accept=None, raw=False):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if accept:
            req.add_header("Accept", accept)
        with urllib.request.urlopen(req, timeout=5) as r:
            body = r.read()
            return body if raw else body.decode()

    def value(self, name):
        total = 0.0
        for line in self.get("/metrics").splitlines():
            if line.startswith(name) and line[len(name)] in " {":
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


def hello(engine, model, instance, scope=None, labels=None,
          cache_config=None, max_lora=None):
    meta = {"proto": 1, "engine": engine, "model": model,
            "instance": instance}
    if scope is not None:
        meta["scope"] = scope
    if labels:
        meta["labels"] = labels
    if cache_config is not None:
        meta["cache_config"] = cache_config
    if max_lora is not None:
        meta["max_lora"] = max_lora
    return msgpack.packb([0, meta])


def varint(data, i):
    """The protobuf varint at data[i:]: (value, next index)."""
    v = shift = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7f) << shift
        shift += 7
        if b < 0x80:
            return v, i


def protobuf_families(data):
    """Splits a delimited MetricFamily stream into {name: message bytes}
    (field 1 of each message is its name)."""
    out, i = {}, 0
    while i < len(data):
        n, i = varint(data, i)
        msg = data[i:i + n]
        i += n
        tag, j = varint(msg, 0)
        if tag != (1 << 3 | 2):
            raise ValueError("a MetricFamily without its name first")
        length, j = varint(msg, j)
        name = msg[j:j + length].decode()
        if name in out:
            raise ValueError(f"family {name} twice")
        out[name] = msg
    return out


def comparable_lines(text, ignore):
    lines = []
    for line in text.splitlines():
        if line.startswith(IGNORED_PREFIXES) or any(
                n in line for n in IGNORED_NAMES + tuple(ignore)):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not line.startswith("#") and name.endswith(WALL_TIME_FAMILIES):
            line = line.rsplit(" ", 1)[0] + " <wall time>"
        lines.append(line)
    return lines


def build_stream(seed, n_requests):
    """Returns (connections, steps): connection name -> HELLO bytes, and a
    list of (connection, frame bytes, frames in it)."""
    rng = random.Random(seed)
    conns = {
        "front": hello("vllm", "m", "front", scope="s",
                       labels={"zone": "a", "app": "x"}),
        "core": hello("vllm", "m", "core", scope="s",
                      labels={"zone": "a", "app": "x"},
                      cache_config={"block_size": 16, "cache_dtype": "auto",
                                    "gpu_memory_utilization": 0.9,
                                    "enable_prefix_caching": True},
                      max_lora=4),
        "solo": hello("tokenmeter-engine", "tiny", "dp0",
                      labels={"tier": 'q"uote\\d'}),
        "sglang": hello("sglang", "qwen", "0",
                        cache_config={"page_size": 16, "num_pages": 4096},
                        max_lora=2),
        "lmdeploy": hello("lmdeploy", "internlm", "tp0", labels={"dc": "b"}),
    }
    experts = {"core": 8, "sglang": 4}
    base = now_ns() - 600 * 10**9  # ten minutes ago: inside the hour
    events = {name: [] for name in conns}
    for i in range(n_requests):
        rid = i if rng.random() < 0.7 else f"req-{i}-{rng.random():.6f}"
        t = base + i * 1_000_000 + rng.randrange(1000)
        arrived = [1, t, rid, rng.randrange(1, 4000)]
        if rng.random() < 0.5:
            params = {}
            if rng.random() < 0.8:
                params["max_tokens"] = rng.randrange(1, 2000)
            if rng.random() < 0.5:
                params["n"] = rng.randrange(1, 6)
            if rng.random() < 0.3:
                params["lora"] = rng.choice(["sql", "chat", "code"])
            if rng.random() < 0.4:
                params["labels"] = {"tenant": rng.choice(
                    ["acme", "globex", "initech", 'q"t'])}
            arrived.append(params)
        front, core = [], []
        if rng.random() > 0.05:  # 5 %: ARRIVED never comes
            front.append(arrived)
        t += rng.randrange(0, 5_000_000)
        if rng.random() < 0.5:
            core.append([2, t, rid])
        t += rng.randrange(0, 20_000_000)
        if rng.random() > 0.03:  # 3 %: SCHEDULED never comes
            core.append([3, t if rng.random() > 0.02 else t - 10**9, rid])
        n_tok = rng.choice([0, 1, 2, 5, 20])
        for k in range(n_tok):
            t += rng.randrange(1_000_000, 30_000_000)
            if rng.random() < 0.02:
                core.append([6, t, rid])  # preempted
            back = 50_000_000 if rng.random() < 0.01 else 0
            core.append([4, t - back, rid, rng.choice([1, 1, 1, 4])])
        t += rng.randrange(0, 5_000_000)
        if rng.random() > 0.05:  # 5 %: never finishes (idle eviction)
            reason = rng.choice(["stop", "length", "abort", "error"])
            core.append([5, t, rid, reason])
        if rng.random() < 0.01:
            core.append([4, t, rid, "bad"])  # invalid event
        where = rng.random()
        if where < 0.2:  # some requests go to the private connection
            events["solo"].extend(front + core)
        elif where < 0.3:  # and to SGLang's, and LMDeploy's
            events["sglang"].extend(front + core)
        elif where < 0.4:
            events["lmdeploy"].extend(front + core)
        else:
            events["front"].extend(front)
            events["core"].extend(core)
        if i % 40 == 0:
            name = rng.choice(list(experts))
            layer = rng.randrange(3)
            n = experts[name] if rng.random() > 0.05 else experts[name] + 1
            events[name].append([8, t, layer,
                                 [rng.randrange(0, 500) for _ in range(n)]])
        if i % 50 == 0:
            step = {"running": rng.randrange(64), "kv_usage": rng.random(),
                    "prompt_tokens": rng.randrange(4096),
                    "generation_tokens": rng.randrange(256),
                    "prefix_queries": rng.randrange(10000),
                    "prefix_hits": rng.randrange(5000),
                    "spec_drafts": rng.randrange(10),
                    "spec_draft_tokens": rng.randrange(40),
                    "spec_accepted_tokens": rng.randrange(20),
                    "spec_accepted_per_pos": [rng.randrange(9)
                                              for _ in range(rng.randrange(5))]}
            if rng.random() < 0.5:
                step["waiting"] = rng.randrange(32)
            events["core"].append([7, t, step])
    # Cut each connection's events into batches and interleave the
    # connections in a random order of batches: one step per batch.
    steps = []
    queues = {}
    for name, evs in events.items():
        batches, seq = [], 0
        for start in range(0, len(evs), 97):
            batches.append(msgpack.packb([1, seq, 0, evs[start:start + 97]]))
            seq += 1
        queues[name] = batches
    order = [n for n, b in queues.items() for _ in b]
    rng.shuffle(order)
    for name in order:
        steps.append((name, queues[name].pop(0)))
    return conns, steps


def run(old_bin, new_bin, seed, n_requests, ignore=(), ignore_protobuf=()):
    tmp = tempfile.mkdtemp(prefix="tm-same-")
    daemons = []
    try:
        daemons = [Daemon(old_bin, tmp, "old"), Daemon(new_bin, tmp, "new")]
        conns, steps = build_stream(seed, n_requests)
        socks = []
        for d in daemons:
            by_name = {}
            for name, hello_bytes in conns.items():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(d.sock)
                s.sendall(hello_bytes)
                by_name[name] = s
            socks.append(by_name)
        frames = len(conns)
        for name, frame in steps:
            frames += 1
            for d, by_name in zip(daemons, socks):
                by_name[name].sendall(frame)
            for d in daemons:
                deadline = time.monotonic() + 20
                while d.value("tokenmeter_ingest_frames_total") < frames:
                    if time.monotonic() > deadline:
                        raise RuntimeError("a daemon stopped applying frames")
                    time.sleep(0.005)
        # A bad frame on the private connection closes it (counted).
        for by_name in socks:
            by_name["solo"].sendall(b"\xc1")
        for by_name in socks:
            for s in by_name.values():
                s.close()
        for d in daemons:
            deadline = time.monotonic() + 30
            while d.value("tokenmeter_ingest_connections") > 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("connections were not closed")
                time.sleep(0.05)
        text = daemons[0].get("/metrics")
        missing = [m for m in MUST_SHOW if m not in text]
        if missing:
            print(f"the stream did not reach: {missing}")
            return 1
        compared = 0
        for accept in (None, "application/openmetrics-text; version=1.0.0"):
            texts = [comparable_lines(d.get("/metrics", accept), ignore)
                     for d in daemons]
            if texts[0] != texts[1]:
                sys.stdout.writelines(
                    l + "\n" for l in difflib.unified_diff(
                        texts[0], texts[1], "old", "new", lineterm="", n=1))
                print(f"DIFFER ({accept or 'text 0.0.4'})")
                return 1
            compared += len(texts[0])
        # The protobuf format, family by family (the wall-time family and
        # the process's own left out as above).
        fams = []
        for d in daemons:
            f = protobuf_families(d.get("/metrics", PROTOBUF, raw=True))
            fams.append({
                k: v for k, v in f.items()
                if not k.startswith("process_")
                and not any(n in k for n in IGNORED_NAMES)
                and not k.endswith(WALL_TIME_FAMILIES)
                and not any(n in k for n in ignore)
                and k not in ignore_protobuf})
        if fams[0] != fams[1]:
            for name in sorted(set(fams[0]) | set(fams[1])):
                if fams[0].get(name) != fams[1].get(name):
                    print(f"protobuf family {name} differs")
            print("DIFFER (protobuf)")
            return 1
        print(f"same exposition: {compared} lines equal (text 0.0.4 and "
              f"OpenMetrics), {len(fams[0])} protobuf families equal, "
              f"{len(steps)} batches of {n_requests} requests, seed {seed}")
        return 0
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--ignore", action="append", default=[],
                    metavar="NAME",
                    help="leave out lines naming NAME, e.g. a family the "
                    "new build adds (repeatable)")
    ap.add_argument("--ignore-protobuf", action="append", default=[],
                    metavar="FAMILY",
                    help="leave out the protobuf family FAMILY (its text "
                    "samples are still compared; repeatable)")
    a = ap.parse_args()
    sys.exit(run(a.old, a.new, a.seed, a.requests, a.ignore,
                 a.ignore_protobuf))


if __name__ == "__main__":
    main()
