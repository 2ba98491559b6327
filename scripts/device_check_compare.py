#!/usr/bin/python3
"""scripts/device-check.sh's comparison: a --disaggregate --report against a
running tokenmeterd's /metrics, with the standard library only (the device
machine has none of the test suite's modules). The same figures as
tests/engine/engine_e2e_test.py's DisaggregatedAgainstDaemon, per process
(instance <instance>-prefill / -decode): finished requests by reason, prompt
and generation tokens, admission rejections, prompt tokens by source, KV
transfers (count, time, bytes, failures) by role, waiting by reason, the
sleep state, and the per-request 1.2 histograms.

Usage: device_check_compare.py REPORT.json METRICS_URL BACKEND
Exit 0 when every figure is equal, 1 (naming each difference) otherwise.
"""
import json
import re
import sys
import time
import urllib.request

NS = "tokenmeter_engine"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(url):
    """{(name, frozenset(labels)): value} of one text exposition."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError(f"unparsed line: {line!r}")
        labels = frozenset((k, v.replace('\\"', '"').replace("\\\\", "\\"))
                           for k, v in LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def total(samples, name, **labels):
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items()
               if n == name and want <= ls)


def main():
    report_path, url, backend = sys.argv[1:4]
    with open(report_path) as f:
        report = json.load(f)
    sent = sum(report[p]["client_events_sent"] for p in ("prefill", "decode"))
    deadline = time.monotonic() + 30
    while True:
        samples = scrape(url)
        applied = total(samples, "tokenmeter_ingest_events_total")
        if applied >= sent or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    bad = []

    def eq(what, got, want, rel=0.0):
        ok = abs(got - want) <= rel * abs(want) + 1e-9
        print(f"  {'ok ' if ok else 'BAD'} {what}: daemon {got:g}, "
              f"report {want:g}")
        if not ok:
            bad.append(what)

    eq("events applied", applied, sent)
    eq("ingest errors", total(samples, "tokenmeter_ingest_errors_total"), 0)
    for part in ("prefill", "decode"):
        r = report[part]
        if r.get("backend") != backend:
            bad.append(f"{part} backend {r.get('backend')!r}, not {backend}")
        labels = {"model_name": r["identity"]["model"],
                  "engine": r["identity"]["instance"],
                  "kv_role": r["identity"]["labels"]["kv_role"]}
        print(f"{part} ({labels['engine']}, backend {r.get('backend')}):")

        def v(name, **extra):
            return total(samples, f"{NS}:{name}", **labels, **extra)

        for reason in ("stop", "length", "error"):
            eq(f"finished {reason}", v("request_success_total",
                                       finished_reason=reason),
               r["finished"][reason])
        eq("prompt tokens", v("prompt_tokens_total"), r["prompt_tokens"])
        eq("generation tokens", v("generation_tokens_total"),
           r["generation_tokens"])
        eq("admission rejections", v("admission_rejections_total"),
           sum(r["admission_rejections"].values()))
        for reason, n in r["admission_rejections"].items():
            eq(f"rejections {reason}",
               v("admission_rejections_total", reason=reason), n)
        for source, n in r["prompt_tokens_by_source"].items():
            eq(f"prompt tokens from {source}",
               v("prompt_tokens_by_source_total", source=source), n)
        eq("prompt tokens cached", v("prompt_tokens_cached_total"),
           r["prompt_tokens_cached"])
        for key, hist in (("request_prefill_kv_computed_tokens",
                           "request_prefill_kv_computed_tokens"),
                          ("request_num_preemptions",
                           "request_num_preemptions"),
                          ("kv_wait_s", "request_kv_wait_time_seconds")):
            eq(f"{hist} count", v(hist + "_count"), r[key]["count"])
            eq(f"{hist} sum", v(hist + "_sum"), r[key]["sum"], 1e-6)
        for role in ("send", "recv"):
            fig = r["kv_transfer"][role]
            eq(f"kv {role} transfers",
               v("kv_transfer_time_seconds_count", role=role), fig["count"])
            eq(f"kv {role} time", v("kv_transfer_time_seconds_sum",
                                    role=role), fig["time_s"]["sum"], 1e-6)
            eq(f"kv {role} bytes", v("kv_transfer_bytes_sum", role=role),
               fig["bytes"])
            for reason, n in fig["failures"].items():
                eq(f"kv {role} failures {reason}",
                   v("kv_transfer_failures_total", role=role, reason=reason),
                   n)
        last = r["last_step"]
        eq("waiting deferred", v("num_requests_waiting_by_reason",
                                 reason="deferred"), last["waiting_deferred"])
        sleep = r["sleep"]
        if sleep["transitions"] > 0:
            for resource in ("scheduler", "weights", "kv_cache"):
                eq(f"sleep {resource} {sleep[resource]}",
                   v("engine_sleep_resource_state", resource=resource,
                     state=sleep[resource]), 1)
    kv = sum(report[p]["kv_transfer"][role]["count"]
             for p in ("prefill", "decode") for role in ("send", "recv"))
    sleeps = sum(report[p]["sleep"]["transitions"]
                 for p in ("prefill", "decode"))
    if kv == 0 or sleeps == 0:
        bad.append(f"the run made {kv} KV transfers and {sleeps} sleep "
                   "transitions: nothing was handed over or slept")
    for b in bad:
        print(f"difference: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
