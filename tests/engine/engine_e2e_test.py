#!/usr/bin/python3
"""End to end: tokenmeter-engine on the CPU backend -> libtokenmeter -> real
tokenmeterd -> HTTP scrape -> prometheus_client's parser. Every latency
histogram's _count and _sum must equal the engine's own --report figures
(computed from the very timestamps it sent), and so must the token
counters, finish reasons, preemptions and prefix-cache counters. Then the
same run with no daemon: the engine finishes and reports drops.

Environment: TOKENMETERD, TOKENMETER_ENGINE (paths of the built binaries).
"""
import os
import re
import socket
import sys
import tempfile
import threading
import unittest
from collections import Counter

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, poll_until  # noqa: E402

NS = "tokenmeter_engine"
LABELS = {"model_name": "e2e-tiny", "engine": "e2e"}

HISTOGRAMS = tu.ENGINE_REPORT_HISTOGRAMS

# 200 requests arriving at once into a 16-wide batch: a queue forms
# however fast the machine (at a finite rate a fast one keeps up). 48
# KV blocks of 8 slots hold about 384 tokens, less than 16 requests of
# ~80 tokens: preemptions. A shared prefix makes the prefix cache hit.
WORKLOAD = [
    "--requests", "200", "--rate", "0", "--prompt-len", "48",
    "--output-len", "32", "--max-batch", "16", "--max-tokens-per-step", "256",
    "--kv-blocks", "48", "--block-size", "8", "--shared-prefix", "0.35",
    "--seed", "3", "--backend", "cpu", "--model", "e2e-tiny",
    "--instance", "e2e", "--quiet",
]


# LoRA on top: 6 adapters, Zipf-skewed, through 2 slots, so adapters are
# loaded, evicted and waited for; 4 tenants. The engine's own per-adapter
# and per-tenant figures must add up to its totals.
LORA = ["--lora-adapters", "6", "--max-lora", "2", "--lora-rank", "4",
        "--tenants", "4"]


def run_engine(socket_path, report_path, timeout=60, extra=()):
    """Runs WORKLOAD (and `extra`) to the end on socket_path; returns its
    --report. A non-zero exit, or a run past `timeout` s, raises."""
    with tu.Engine(*WORKLOAD, *extra, socket=socket_path,
                   report=report_path) as engine:
        return engine.report(timeout=timeout)


class EngineAgainstDaemon(unittest.TestCase):
    def setUp(self):
        self.d = Daemon("--log-interval", "0").start()
        self.addCleanup(self.d.cleanup)
        self.addCleanup(self.d.stop)

    def test_daemon_figures_equal_engine_report(self):
        report = run_engine(self.d.sock,
                            os.path.join(self.d.dir, "report.json"))
        d = self.d

        def success(reason):
            return d.value(f"{NS}:request_success_total",
                           finished_reason=reason, **LABELS) or 0

        # FINISHED is each request's last event and one connection's events
        # apply in order: once every success is counted, all is applied.
        poll_until(lambda: success("stop") + success("length")
                   == report["requests"],
                   what="every FINISHED applied")
        # Every event the client counted as written was applied (the
        # engine has exited, so its close has sent everything).
        def applied():
            return d.samples().sum("tokenmeter_ingest_events_total")
        self.assertGreater(report["client_events_sent"], 0)
        poll_until(lambda: applied() == report["client_events_sent"],
                   what="client_events_sent events applied")
        self.assertEqual(report["client_reconnects"], 0)
        self.assertEqual(report["client_events_rejected"], 0)
        samples = d.samples()
        key = frozenset(LABELS.items())

        def v(name):
            value = samples.get((f"{NS}:{name}", key))
            self.assertIsNotNone(value, name)
            return value

        self.assertEqual(report["requests"], 200)
        self.assertEqual(report["backend"], "cpu")
        self.assertTrue(report["metrics"])
        self.assertEqual(report["client_dropped_events"], 0)
        # The configuration did what it is for.
        self.assertGreater(report["preemptions"], 0)
        self.assertGreater(report["prefix_cache_hits"], 0)
        self.assertGreater(report["finished"]["stop"], 0)
        self.assertGreater(report["finished"]["length"], 0)
        # Without queueing, queue times are microseconds.
        self.assertGreater(report["queue_s"]["p99"], 0.01)

        for rkey, hist in HISTOGRAMS.items():
            with self.subTest(histogram=hist):
                self.assertEqual(v(hist + "_count"), report[rkey]["count"])
                self.assertGreater(report[rkey]["count"], 0)
                expected = report[rkey]["sum"]
                got = v(hist + "_sum")
                self.assertLessEqual(abs(got - expected),
                                     1e-6 * abs(expected) + 1e-12,
                                     f"{hist}_sum {got} vs {expected}")
        self.assertEqual(v("prompt_tokens_total"), report["prompt_tokens"])
        self.assertEqual(v("generation_tokens_total"),
                         report["generation_tokens"])
        self.assertEqual(v("request_generation_tokens_sum"),
                         report["generation_tokens"])
        self.assertEqual(success("stop"), report["finished"]["stop"])
        self.assertEqual(success("length"), report["finished"]["length"])
        self.assertEqual(success("abort"), 0)
        self.assertEqual(success("error"), 0)
        self.assertEqual(v("num_preemptions_total"), report["preemptions"])
        self.assertEqual(v("prefix_cache_queries_total"),
                         report["prefix_cache_queries"])
        self.assertEqual(v("prefix_cache_hits_total"),
                         report["prefix_cache_hits"])
        # After the last step nothing runs or waits.
        self.assertEqual(v("num_requests_running"), 0)
        self.assertEqual(v("num_requests_waiting"), 0)
        self.assertEqual(
            d.value("tokenmeter_ingest_errors_total", reason="bad_event")
            or 0, 0)


    def test_moe_expert_counters_equal_engine_report(self):
        """--moe-experts 16 --moe-top-k 2: the daemon's per-layer and
        per-expert counters equal the engine's own totals exactly, with
        the last partial counts (sent before close) included: 200 requests
        do not end on a multiple of --expert-load-every."""
        d = Daemon("--log-interval", "0", "--moe-expert-series").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        report = run_engine(d.sock, os.path.join(d.dir, "report.json"),
                            extra=["--moe-experts", "16", "--moe-top-k", "2",
                                   "--expert-load-every", "5"])
        self.assertEqual(report["moe_experts"], 16)
        self.assertEqual(report["moe_top_k"], 2)
        layers = len(report["moe_routed_tokens"])
        self.assertEqual(layers, 2)  # the tiny model
        self.assertNotEqual(report["steps"] % 5, 0, "no partial flush")
        flushes = -(-report["steps"] // 5)
        self.assertEqual(report["moe_expert_load_events"], flushes * layers)
        poll_until(lambda: (d.samples().sum("tokenmeter_ingest_events_total")
                            == report["client_events_sent"]),
                   what="every event applied")
        samples = d.samples()
        self.assertEqual(
            samples.value("tokenmeter_ingest_events_total",
                          kind="expert_load"),
            report["moe_expert_load_events"])
        for layer in range(layers):
            expert_tokens = report["moe_expert_tokens"][layer]
            self.assertEqual(len(expert_tokens), 16)
            # Every token of a layer is routed to 2 experts.
            self.assertEqual(sum(expert_tokens),
                             report["moe_routed_tokens"][layer])
            self.assertEqual(report["moe_routed_tokens"][layer] % 2, 0)
            self.assertEqual(
                samples.value(f"{NS}:moe_routed_tokens_total",
                              layer=str(layer), **LABELS),
                report["moe_routed_tokens"][layer])
            for expert, n in enumerate(expert_tokens):
                self.assertEqual(
                    samples.value(f"{NS}:moe_expert_tokens_total",
                                  layer=str(layer), expert=str(expert),
                                  **LABELS), n, f"layer {layer} expert {expert}")
            imbalance = samples.value(f"{NS}:moe_layer_imbalance",
                                      layer=str(layer), **LABELS)
            self.assertIsNotNone(imbalance)
            self.assertGreaterEqual(imbalance, 1.0)
            self.assertLessEqual(imbalance, 16.0)
        # Every routed token is a prompt or generated token the model
        # computed (preemption recomputes some, the prefix cache skips
        # some), so the totals are in the right range.
        self.assertGreater(report["moe_routed_tokens"][0],
                           report["generation_tokens"])
        # One imbalance observation per EXPERT_LOAD (all had tokens).
        self.assertEqual(samples.value(f"{NS}:moe_imbalance_count", **LABELS),
                         report["moe_expert_load_events"])
        self.assertEqual(
            samples.value("tokenmeter_ingest_errors_total",
                          reason="bad_event") or 0, 0)

    def test_lora_and_tenant_figures_add_up(self):
        report = run_engine(self.d.sock,
                            os.path.join(self.d.dir, "report.json"),
                            extra=LORA)
        d = self.d
        # The daemon applied every event the client wrote, none of them
        # refused: ARRIVED with `lora` and `labels` is well-formed.
        poll_until(lambda: d.samples().sum("tokenmeter_ingest_events_total")
                   == report["client_events_sent"],
                   what="client_events_sent events applied")
        self.assertEqual(
            d.value("tokenmeter_ingest_errors_total", reason="bad_event")
            or 0, 0)
        self.assertEqual(report["client_events_rejected"], 0)
        self.assertEqual(report["client_dropped_events"], 0)
        self.assertEqual(report["requests"], 200)
        adapters = report["lora_adapters"]
        tenants = report["tenants"]
        self.assertEqual(list(adapters), [f"lora-{i}" for i in range(6)])
        self.assertEqual(list(tenants), [f"tenant-{i}" for i in range(4)])
        for groups in (adapters, tenants):
            with self.subTest(groups=list(groups)[0]):
                for key in ("requests", "prompt_tokens",
                            "generation_tokens"):
                    self.assertEqual(sum(g[key] for g in groups.values()),
                                     report[key], key)
                for reason in ("stop", "length"):
                    self.assertEqual(
                        sum(g["finished"][reason] for g in groups.values()),
                        report["finished"][reason], reason)
                for g in groups.values():
                    self.assertEqual(g["finished"]["stop"]
                                     + g["finished"]["length"],
                                     g["requests"])
        # Zipf: the first adapter is the hottest.
        self.assertEqual(max(adapters.values(),
                             key=lambda g: g["requests"]),
                         adapters["lora-0"])
        # Six adapters through two slots: loads evict, requests wait.
        self.assertEqual(sum(g["loads"] for g in adapters.values()),
                         report["lora_loads"])
        self.assertEqual(report["lora_loads"], report["lora_evictions"] + 2)
        self.assertGreaterEqual(report["lora_loads"], 6)
        self.assertGreater(report["lora_skips"], 0)
        for name, g in adapters.items():
            if g["requests"] > 0:
                self.assertGreaterEqual(g["loads"], 1, name)


# Each naming profile's names for the report's histograms (docs/metrics.md).
# The reference engine makes one token per request per step, so SGLang's
# token-weighted inter-token latency and LMDeploy's per-chunk time per
# output token count what the report's itl_s counts, and its FINISHED comes
# with the last TOKENS, so LMDeploy's finish-ended phases equal the report's.
PROFILE_HISTOGRAMS = {
    "sglang": {
        "ttft_s": "time_to_first_token_seconds",
        "itl_s": "inter_token_latency_seconds",
        "e2e_s": "e2e_request_latency_seconds",
        "queue_s": "queue_time_seconds",
    },
    "lmdeploy": {
        "ttft_s": "time_to_first_token_seconds",
        "itl_s": "iter_token_latency",
        "e2e_s": "e2e_request_latency_seconds",
        "queue_s": "request_queue_time_seconds",
        "prefill_s": "request_prefill_time_seconds",
        "decode_s": "request_decode_time_seconds",
        "inference_s": "request_inference_time_seconds",
    },
}


class ProfilesAgainstDaemon(unittest.TestCase):
    """The same run in each naming profile, with LoRA adapters and tenants
    (--request-label tenant): the daemon's figures, under the profile's
    names, equal the engine's report; per tenant too."""

    def setUp(self):
        self.d = Daemon("--log-interval", "0", "--request-label",
                        "tenant").start()
        self.addCleanup(self.d.cleanup)
        self.addCleanup(self.d.stop)

    def run_profile(self, profile):
        report = run_engine(self.d.sock,
                            os.path.join(self.d.dir, "report.json"),
                            extra=[*LORA, "--metrics-profile", profile])
        d = self.d
        poll_until(lambda: d.samples().sum("tokenmeter_ingest_events_total")
                   == report["client_events_sent"],
                   what="client_events_sent events applied")
        self.assertEqual(report["client_events_rejected"], 0)
        self.assertEqual(report["client_dropped_events"], 0)
        self.assertEqual(d.samples().sum("tokenmeter_ingest_errors_total"), 0)
        return report, d.samples()

    def assert_close(self, got, want, what):
        self.assertIsNotNone(got, what)
        self.assertLessEqual(abs(got - want), 1e-6 * abs(want) + 1e-12,
                             f"{what}: {got} vs {want}")

    def check_histograms(self, ns, samples, report, names):
        for rkey, hist in names.items():
            with self.subTest(histogram=f"{ns}:{hist}"):
                self.assertGreater(report[rkey]["count"], 0)
                self.assertEqual(samples.sum(f"{ns}:{hist}_count", **LABELS),
                                 report[rkey]["count"])
                self.assert_close(samples.sum(f"{ns}:{hist}_sum", **LABELS),
                                  report[rkey]["sum"], f"{ns}:{hist}_sum")

    def check_tenants(self, ns, samples, report, success, generation):
        """Per tenant: finished requests and generation tokens."""
        tenants = report["tenants"]
        self.assertEqual(len(tenants), 4)
        for name, t in tenants.items():
            with self.subTest(tenant=name):
                self.assertEqual(
                    samples.sum(f"{ns}:{success}", tenant=name, **LABELS),
                    t["requests"])
                self.assertEqual(
                    samples.sum(f"{ns}:{generation}", tenant=name, **LABELS),
                    t["generation_tokens"])

    def check_router_series(self, ns, samples, cache_config):
        key_sets = [dict(ls) for (n, ls) in samples
                    if n == f"{ns}:cache_config_info"]
        self.assertEqual(len(key_sets), 1, key_sets)
        for k, v in cache_config.items():
            self.assertEqual(key_sets[0].get(k), v, k)
        lora = [(dict(ls), v) for (n, ls), v in samples.items()
                if n == f"{ns}:lora_requests_info"]
        self.assertEqual(len(lora), 1, lora)
        labels, value = lora[0]
        # Everything finished: both sets empty, changed during the run.
        self.assertEqual(labels["max_lora"], "2")
        self.assertEqual(labels["running_lora_adapters"], "")
        self.assertEqual(labels["waiting_lora_adapters"], "")
        self.assertGreater(value, 1.7e9)

    def test_vllm_profile_per_tenant(self):
        report, samples = self.run_profile("vllm")
        ns = NS
        names = dict(HISTOGRAMS)
        self.check_histograms(ns, samples, report, names)
        self.check_tenants(ns, samples, report, "request_success_total",
                           "generation_tokens_total")
        self.check_router_series(ns, samples, {"block_size": "8",
                                               "num_gpu_blocks": "48"})
        self.assertEqual(samples.value(f"{ns}:num_requests_running", **LABELS),
                         0)

    def test_sglang_profile_equals_report(self):
        report, samples = self.run_profile("sglang")
        ns = "sglang"
        self.check_histograms(ns, samples, report, PROFILE_HISTOGRAMS[ns])
        self.assertEqual(samples.sum(f"{ns}:prompt_tokens_total", **LABELS),
                         report["prompt_tokens"])
        self.assertEqual(
            samples.sum(f"{ns}:generation_tokens_total", **LABELS),
            report["generation_tokens"])
        self.assertEqual(samples.sum(f"{ns}:num_requests_total", **LABELS),
                         report["requests"])
        self.assertEqual(
            samples.sum(f"{ns}:cached_tokens_total", **LABELS),
            report["prefix_cache_hits"])
        # The last STEP's values.
        self.assertEqual(samples.value(f"{ns}:num_running_reqs", **LABELS), 0)
        self.assertEqual(samples.value(f"{ns}:num_queue_reqs", **LABELS), 0)
        self.assertEqual(samples.value(f"{ns}:page_size", **LABELS), 8)
        self.assertEqual(samples.value(f"{ns}:num_pages", **LABELS), 48)
        self.check_tenants(ns, samples, report, "num_requests_total",
                           "generation_tokens_total")
        self.check_router_series(ns, samples, {"page_size": "8",
                                               "num_pages": "48"})

    def test_lmdeploy_profile_equals_report(self):
        report, samples = self.run_profile("lmdeploy")
        ns = "lmdeploy"
        self.check_histograms(ns, samples, report, PROFILE_HISTOGRAMS[ns])
        # Per chunk of one token: TPOT = the inter-token interval.
        self.assertEqual(
            samples.sum(f"{ns}:time_per_output_token_seconds_count",
                        **LABELS), report["itl_s"]["count"])
        self.assert_close(
            samples.sum(f"{ns}:time_per_output_token_seconds_sum", **LABELS),
            report["itl_s"]["sum"], "time_per_output_token_seconds_sum")
        self.assertEqual(samples.sum(f"{ns}:prompt_tokens_total", **LABELS),
                         report["prompt_tokens"])
        self.assertEqual(
            samples.sum(f"{ns}:generation_tokens_total", **LABELS),
            report["generation_tokens"])
        self.assertEqual(
            samples.sum(f"{ns}:request_success_total",
                        finished_reason="ResponseType.FINISH", **LABELS),
            report["finished"]["stop"] + report["finished"]["length"])
        self.assertEqual(
            samples.value(f"{ns}:num_requests_running", **LABELS), 0)
        self.check_tenants(ns, samples, report, "request_success_total",
                           "generation_tokens_total")
        self.check_router_series(ns, samples, {"block_size": "8",
                                               "num_gpu_blocks": "48"})


class DecodeSideGivesUp(unittest.TestCase):
    def test_ends_with_an_empty_step(self):
        """The decode side's only request gives up on its KV (every
        transfer damaged, no retry) after the side's last step: a STEP of
        its own says nothing is left waiting and the cache is free, in the
        report and at the daemon."""
        d = Daemon("--log-interval", "0").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        args = ["--requests", "1", "--prompt-len", "16", "--output-len", "4",
                "--seed", "3", "--backend", "cpu", "--model", "e2e-tiny",
                "--instance", "e2e", "--quiet", "--disaggregate",
                "--kv-fail-every", "1", "--kv-retries", "0"]
        with tu.Engine(*args, socket=d.sock,
                       report=os.path.join(d.dir, "report.json")) as e:
            report = e.report(timeout=60)
        r = report["decode"]
        self.assertEqual(r["finished"]["error"], 1)
        empty = {"running": 0, "waiting": 0, "waiting_deferred": 0,
                 "kv_usage": 0}
        self.assertEqual(r["last_step"], empty)
        labels = part_labels("decode", r)
        sent = sum(report[p]["client_events_sent"]
                   for p in ("prefill", "decode"))
        poll_until(lambda: d.samples().sum("tokenmeter_ingest_events_total")
                   == sent, what="every event applied")
        self.assertEqual(d.value(f"{NS}:request_success_total",
                                 finished_reason="error", **labels), 1)
        for gauge in ("num_requests_running", "num_requests_waiting",
                      "kv_cache_usage_perc"):
            self.assertEqual(d.value(f"{NS}:{gauge}", **labels), 0, gauge)
        self.assertEqual(d.value(f"{NS}:num_requests_waiting_by_reason",
                                 reason="deferred", **labels), 0)


class EngineWithoutDaemon(unittest.TestCase):
    def test_finishes_and_reports_drops(self):
        with tempfile.TemporaryDirectory(prefix="tm-e2e-", dir="/tmp") as tmp:
            report = run_engine(os.path.join(tmp, "nobody.sock"),
                                os.path.join(tmp, "report.json"))
        self.assertEqual(report["requests"], 200)
        self.assertEqual(report["finished"]["stop"]
                         + report["finished"]["length"], 200)
        self.assertTrue(report["metrics"])
        self.assertGreater(report["client_dropped_events"], 0)


def record_connections(run, expect=2, timeout=60):
    """Runs run(socket_path, tmp_dir) against a plain Unix listener that
    records the bytes of `expect` connections and never answers; returns
    (run's result, [([hello meta, ...], [event, ...]), ...]) in connection
    order."""
    with tempfile.TemporaryDirectory(prefix="tm-rec-", dir="/tmp") as tmp:
        path = os.path.join(tmp, "ingest.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        listener.settimeout(timeout)
        streams = []

        def read(conn, chunks):
            conn.settimeout(timeout)
            with conn:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        return
                    chunks.append(data)

        def accept():
            readers = []
            for _ in range(expect):
                conn, _ = listener.accept()
                chunks = []
                streams.append(chunks)
                t = threading.Thread(target=read, args=(conn, chunks))
                t.start()
                readers.append(t)
            for t in readers:
                t.join(timeout)

        acceptor = threading.Thread(target=accept)
        acceptor.start()
        try:
            result = run(path, tmp)
        finally:
            acceptor.join(timeout)
            listener.close()
    connections = []
    for chunks in streams:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(b"".join(chunks))
        frames = list(unpacker)
        hellos = [f[1] for f in frames if f[0] == 0]
        events = [e for f in frames if f[0] == 1 for e in f[3]]
        connections.append((hellos, events))
    return result, connections


def capture_wire(extra):
    """Runs the engine against a plain Unix listener that never answers and
    returns (report, hello meta, ARRIVED events) from the bytes it wrote."""
    report, [(hellos, events)] = record_connections(
        lambda path, tmp: run_engine(path, os.path.join(tmp, "report.json"),
                                     extra=extra), expect=1, timeout=30)
    return report, hellos, [e for e in events if e[0] == 1]


class EngineWire(unittest.TestCase):
    def test_lora_tenants_and_vllm_cache_config(self):
        report, hellos, arrived = capture_wire(LORA)
        self.assertEqual(len(hellos), 1)
        meta = hellos[0]
        self.assertEqual(meta["cache_config"],
                         {"block_size": 8, "num_gpu_blocks": 48,
                          "enable_prefix_caching": True})
        self.assertEqual(meta["max_lora"], 2)
        self.assertNotIn("profile", meta)
        self.assertEqual(report["client_events_rejected"], 0)
        self.assertEqual(len(arrived), report["requests"])
        loras = Counter(e[4]["lora"] for e in arrived)
        tenants = Counter(e[4]["labels"]["tenant"] for e in arrived)
        for e in arrived:
            self.assertEqual(list(e[4]["labels"]), ["tenant"])
        self.assertEqual(
            loras, Counter({name: g["requests"] for name, g
                            in report["lora_adapters"].items()
                            if g["requests"] > 0}))
        self.assertEqual(
            tenants, Counter({name: g["requests"] for name, g
                              in report["tenants"].items()
                              if g["requests"] > 0}))

    def test_sglang_profile_without_lora_or_tenants(self):
        report, hellos, arrived = capture_wire(
            ["--metrics-profile", "sglang", "--tenants", "0",
             "--no-prefix-cache"])
        meta = hellos[0]
        self.assertEqual(meta["profile"], "sglang")
        self.assertEqual(meta["cache_config"],
                         {"page_size": 8, "num_pages": 48})
        self.assertNotIn("max_lora", meta)
        self.assertEqual(len(arrived), report["requests"])
        for e in arrived:  # exactly the 1.0 ARRIVED params
            self.assertEqual(set(e[4]), {"max_tokens", "n"})

    def test_profile_flag_is_sent_as_given(self):
        for profile in ("vllm", "lmdeploy"):
            with self.subTest(profile=profile):
                _, hellos, _ = capture_wire(["--metrics-profile", profile])
                self.assertEqual(hellos[0]["profile"], profile)
                self.assertIn("num_gpu_blocks", hellos[0]["cache_config"])


# --disaggregate: a prefill and a decode process, each with its own
# connection. The decode side sleeps from 0.05 s to 0.55 s; meanwhile the
# prefill side's small cache fills with K/V waiting to be pulled, its queue
# reaches --max-queued and arrivals are rejected. Every fifth KV transfer
# arrives damaged and is retried once. Priorities from 5 levels.
DISAGGREGATED = [
    "--requests", "150", "--rate", "300", "--prompt-len", "48",
    "--output-len", "24", "--max-batch", "16", "--max-tokens-per-step", "256",
    "--kv-blocks", "48", "--block-size", "8", "--shared-prefix", "0.35",
    "--seed", "7", "--backend", "cpu", "--model", "e2e-tiny",
    "--instance", "e2e", "--quiet", "--disaggregate", "--max-queued", "8",
    "--priority-levels", "5", "--kv-fail-every", "5", "--kv-retries", "1",
    "--sleep-after", "0.05", "--wake-after", "0.5",
]
TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-01$")
PRIORITY_BUCKETS = ["<-1", "-1", "0", "1", ">1"]


def part_labels(part, r):
    """The labels of the series of one --disaggregate process, `part`
    ("prefill" or "decode") with its report `r`."""
    return {"model_name": "e2e-tiny", "engine": f"e2e-{part}",
            "kv_role": r["identity"]["labels"]["kv_role"]}


def assert_counters_equal(tc, samples, r, labels):
    """The 1.0 counters of one process's series equal its report `r`:
    finished requests by reason, prompt and generation tokens,
    preemptions (each summed over the request labels)."""
    for reason in ("stop", "length", "error"):
        tc.assertEqual(samples.sum(f"{NS}:request_success_total",
                                   finished_reason=reason, **labels),
                       r["finished"][reason], reason)
    for name, key in (("prompt_tokens", "prompt_tokens"),
                      ("generation_tokens", "generation_tokens"),
                      ("num_preemptions", "preemptions")):
        tc.assertEqual(samples.sum(f"{NS}:{name}_total", **labels), r[key],
                       name)


def priority_bucket(p):
    return "<-1" if p < -1 else ">1" if p > 1 else str(p)


class Side:
    """One process's events, folded the way the daemon folds them."""

    def __init__(self, events):
        self.events = events
        self.kinds = Counter(e[0] for e in events)
        self.arrived = {}    # rid -> event
        self.scheduled = {}  # rid -> first SCHEDULED
        self.first_token = {}
        self.finished = {}   # rid -> (t, reason)
        self.preempted = Counter()
        self.transfers = []  # KV_TRANSFER events
        self.rejected = []
        self.sleeps = []
        self.steps = []
        for e in events:
            kind, rid = e[0], e[2] if len(e) > 2 else None
            if kind == 1:
                self.arrived[rid] = e
            elif kind == 3:
                self.scheduled.setdefault(rid, e)
            elif kind == 4:
                self.first_token.setdefault(rid, e[1])
            elif kind == 5:
                self.finished[rid] = (e[1], e[3])
            elif kind == 6:
                self.preempted[rid] += 1
            elif kind == 7:
                self.steps.append(e[2])
            elif kind == 9:
                self.rejected.append(e)
            elif kind == 10:
                self.transfers.append(e)
            elif kind == 11:
                self.sleeps.append(e[2])

    def info(self, rid):
        e = self.scheduled[rid]
        return e[3] if len(e) > 3 else {}


class DisaggregatedWire(unittest.TestCase):
    """The two processes' events as a recording socket receives them,
    against the merged --report: every 1.2 figure the report gives is what
    the daemon computes from the same events."""

    @classmethod
    def setUpClass(cls):
        def run(path, tmp):
            with tu.Engine(*DISAGGREGATED, "--no-ack", socket=path,
                           report=os.path.join(tmp, "report.json")) as e:
                return e.report(timeout=90)
        cls.report, conns = record_connections(run)
        cls.hellos = {}
        cls.sides = {}
        for hellos, events in conns:
            assert len(hellos) == 1, hellos
            meta = hellos[0]
            role = meta["labels"]["kv_role"]
            cls.hellos[role] = meta
            cls.sides[role] = Side(events)

    def near(self, got, want, what):
        self.assertLessEqual(abs(got - want), 1e-9 * abs(want) + 1e-12,
                             f"{what}: {got} vs {want}")

    def test_each_process_has_its_own_identity(self):
        self.assertEqual(set(self.sides), {"kv_producer", "kv_consumer"})
        for role, part in (("kv_producer", "prefill"),
                           ("kv_consumer", "decode")):
            meta = self.hellos[role]
            r = self.report[part]
            self.assertEqual(meta["engine"], "tokenmeter-engine")
            self.assertEqual(meta["model"], "e2e-tiny")
            self.assertEqual(meta["instance"], f"e2e-{part}")
            self.assertEqual(meta["labels"], {"kv_role": role})
            self.assertNotIn("scope", meta)
            self.assertEqual(r["role"], part)
            self.assertEqual(r["identity"],
                             {"engine": "tokenmeter-engine",
                              "model": "e2e-tiny",
                              "instance": f"e2e-{part}",
                              "labels": {"kv_role": role}})
            # Everything the client wrote was recorded; nothing refused.
            self.assertEqual(r["client_events_sent"],
                             len(self.sides[role].events))
            self.assertEqual(r["client_events_rejected"], 0)
            self.assertEqual(r["client_dropped_events"], 0)

    def test_both_sides_carry_the_same_trace_context(self):
        p = self.sides["kv_producer"]
        d = self.sides["kv_consumer"]
        self.assertGreater(len(d.arrived), 0)
        for rid, e in p.arrived.items():
            self.assertRegex(e[4]["traceparent"], TRACEPARENT)
        self.assertEqual(len({e[4]["traceparent"]
                              for e in p.arrived.values()}), len(p.arrived))
        for rid, e in d.arrived.items():
            self.assertIn(rid, p.arrived)
            theirs = p.arrived[rid][4]
            self.assertEqual(e[4]["traceparent"], theirs["traceparent"], rid)
            self.assertEqual(e[4]["priority"], theirs["priority"], rid)
            self.assertEqual(e[4]["labels"], theirs["labels"], rid)
            # The prefill side is asked for one token, the decode side for
            # the rest; only requests the prefill side ended by length go on.
            self.assertEqual(theirs["max_tokens"], 1)
            self.assertGreater(e[4]["max_tokens"], 1)
            self.assertEqual(p.finished[rid][1], "length")
        self.assertEqual(self.report["prefill"]["traceparents"],
                         len(p.arrived))
        self.assertEqual(self.report["decode"]["traceparents"],
                         len(d.arrived))

    def test_admission_rejections_equal_the_report(self):
        p = self.sides["kv_producer"]
        r = self.report["prefill"]
        reasons = Counter(e[2] for e in p.rejected)
        self.assertGreater(sum(reasons.values()), 0, "no rejection")
        self.assertEqual(dict(reasons), r["admission_rejections"])
        rejected = {e[3] for e in p.rejected}
        self.assertFalse(rejected & set(p.arrived), "a rejected one arrived")
        self.assertEqual(len(rejected) + len(p.arrived), 150)
        self.assertEqual(len(p.finished), r["requests"])
        # The decode side rejects nothing.
        self.assertEqual(self.sides["kv_consumer"].rejected, [])
        self.assertEqual(self.report["decode"]["admission_rejections"], {})

    def check_transfers(self, side, role, fig):
        transfers = side.transfers
        self.assertTrue(all(e[3]["role"] == role for e in transfers))
        self.assertTrue(all(e[3]["connector"] == "uds" for e in transfers))
        self.assertTrue(all(e[3]["start"] <= e[1] for e in transfers))
        self.assertEqual(len(transfers), fig["count"])
        failures = Counter(e[3].get("reason", "error") for e in transfers
                           if e[3].get("ok", True) is False)
        self.assertEqual(dict(failures), fig["failures"])
        self.assertEqual(sum(e[3]["bytes"] for e in transfers), fig["bytes"])
        self.assertEqual(sum(e[3]["blocks"] for e in transfers),
                         fig["blocks"])
        self.near(sum(e[1] - e[3]["start"] for e in transfers) / 1e9,
                  fig["time_s"]["sum"], f"{role} time_s sum")
        self.assertEqual(fig["time_s"]["count"], len(transfers))

    def test_kv_transfers_equal_the_report(self):
        p = self.sides["kv_producer"]
        d = self.sides["kv_consumer"]
        send = self.report["prefill"]["kv_transfer"]["send"]
        recv = self.report["decode"]["kv_transfer"]["recv"]
        self.check_transfers(p, "send", send)
        self.check_transfers(d, "recv", recv)
        self.assertEqual(self.report["prefill"]["kv_transfer"]["recv"]
                         ["count"], 0)
        self.assertEqual(self.report["decode"]["kv_transfer"]["send"]
                         ["count"], 0)
        # One transfer each way, the damaged ones seen on both sides.
        self.assertGreater(recv["count"], 0)
        self.assertEqual(send["count"], recv["count"])
        self.assertEqual(send["bytes"], recv["bytes"])
        self.assertEqual(send["failures"], recv["failures"])
        self.assertEqual(list(recv["failures"]), ["checksum"])
        self.assertEqual(recv["failures"]["checksum"], recv["count"] // 5)

    def test_decode_side_waits_for_its_kv(self):
        d = self.sides["kv_consumer"]
        r = self.report["decode"]
        # kv wait: the first successful recv's end - SCHEDULED, per
        # finished request that had one.
        waits = []
        for rid in d.finished:
            ok = [e[1] for e in d.transfers
                  if e[2] == rid and e[3].get("ok", True)]
            if ok:
                waits.append((min(ok) - d.scheduled[rid][1]) / 1e9)
        self.assertGreater(len(waits), 0)
        self.assertTrue(all(w >= 0 for w in waits))
        self.assertEqual(len(waits), r["kv_wait_s"]["count"])
        self.near(sum(waits), r["kv_wait_s"]["sum"], "kv_wait_s sum")
        # A request that errs had no successful transfer and no token.
        errors = [rid for rid, (_, reason) in d.finished.items()
                  if reason == "error"]
        self.assertEqual(len(errors), r["finished"]["error"])
        for rid in errors:
            self.assertNotIn(rid, d.first_token)
        # While K/V were in flight, STEP said so; never above waiting.
        for st in d.steps:
            self.assertLessEqual(st["waiting_deferred"], st["waiting"])
        self.assertGreater(max(st["waiting_deferred"] for st in d.steps), 0)
        for part, side in (("prefill", self.sides["kv_producer"]),
                           ("decode", d)):
            last = side.steps[-1]
            rep = self.report[part]["last_step"]
            self.assertEqual(last["waiting_deferred"], rep["waiting_deferred"])
            self.assertEqual(last["waiting"], rep["waiting"])
            self.assertEqual(last["running"], rep["running"])
            self.assertEqual(len(side.steps), self.report[part]["steps"])

    def test_prompt_tokens_by_source_equal_the_report(self):
        for part, role in (("prefill", "kv_producer"),
                           ("decode", "kv_consumer")):
            side = self.sides[role]
            r = self.report[part]
            got = Counter()
            computed = []
            for rid, e in side.arrived.items():
                prompt = e[3]
                info = side.info(rid)
                cached = info.get("cached_tokens", 0)
                external = info.get("external_tokens", 0)
                self.assertLessEqual(cached + external, prompt)
                if rid in side.first_token:
                    got["local_cache_hit"] += cached
                    got["external_kv_transfer"] += external
                    got["local_compute"] += prompt - cached - external
                if rid in side.finished:
                    computed.append(prompt - cached - external)
            with self.subTest(part=part):
                self.assertEqual(
                    {k: got[k] for k in r["prompt_tokens_by_source"]},
                    r["prompt_tokens_by_source"])
                self.assertEqual(sum(got.values()), r["prompt_tokens"])
                self.assertEqual(r["prompt_tokens_cached"],
                                 got["local_cache_hit"]
                                 + got["external_kv_transfer"])
                fig = r["request_prefill_kv_computed_tokens"]
                self.assertEqual(fig["count"], len(computed))
                self.assertEqual(fig["sum"], sum(computed))
        self.assertGreater(self.report["decode"]["prompt_tokens_by_source"]
                           ["external_kv_transfer"], 0)
        self.assertEqual(self.report["prefill"]["prompt_tokens_by_source"]
                         ["external_kv_transfer"], 0)

    def test_preemptions_and_priorities_equal_the_report(self):
        for part, role in (("prefill", "kv_producer"),
                           ("decode", "kv_consumer")):
            side = self.sides[role]
            r = self.report[part]
            with self.subTest(part=part):
                fig = r["request_num_preemptions"]
                self.assertEqual(fig["count"], len(side.finished))
                self.assertEqual(fig["sum"], sum(side.preempted[rid]
                                                 for rid in side.finished))
                self.assertEqual(sum(side.preempted.values()),
                                 r["preemptions"])
                buckets = Counter(
                    priority_bucket(side.arrived[rid][4]["priority"])
                    for rid in side.finished)
                self.assertEqual(list(r["priorities"]), PRIORITY_BUCKETS)
                self.assertEqual({b: buckets[b] for b in PRIORITY_BUCKETS},
                                 {b: g["requests"] for b, g
                                  in r["priorities"].items()})
                for e in side.arrived.values():
                    self.assertIn(e[4]["priority"], range(-2, 3))

    def test_decode_side_sleeps_once(self):
        d = self.sides["kv_consumer"]
        r = self.report["decode"]
        self.assertEqual(d.sleeps, [
            {"scheduler": "paused", "weights": "resident",
             "kv_cache": "released"},
            {"scheduler": "running", "weights": "resident",
             "kv_cache": "resident"}])
        self.assertEqual(r["sleep"]["transitions"], 2)
        self.assertEqual(r["sleep"]["kv_cache"], "resident")
        slept = [e[1] for e in d.events if e[0] == 11]
        self.near((slept[1] - slept[0]) / 1e9, r["sleep"]["asleep_s"],
                  "asleep_s")
        self.assertGreaterEqual(r["sleep"]["asleep_s"], 0.5)
        self.assertEqual(self.sides["kv_producer"].sleeps, [])
        # Requests arriving meanwhile waited: nothing ran while asleep.
        for e in d.events:
            if e[0] == 4:
                self.assertFalse(slept[0] < e[1] < slept[1], e)


class DisaggregatedAgainstDaemon(unittest.TestCase):
    """--disaggregate against the real daemon (with --priority-label): one
    engine series per process (instance e2e-prefill / e2e-decode), each
    equal to its own part of the report in every figure, the 1.2 ones
    included, and per priority bucket. A daemon that predates 1.2 is
    compat12's case, not this one: here every event must be applied."""

    def count(self, samples, name, labels, **extra):
        """The sum of the samples of `name` that carry `labels` and `extra`
        (request-level families are split by the priority label), which
        must exist: a family the daemon did not export is no 0."""
        want = {**labels, **extra}.items()
        self.assertTrue(any(n == name and want <= dict(ls).items()
                            for (n, ls) in samples),
                        f"no {name} {dict(want)}")
        return samples.sum(name, **labels, **extra)

    def check_12_series(self, samples, r, labels):
        def v(name, **extra):
            return self.count(samples, f"{NS}:{name}", labels, **extra)

        def gauge(name, **extra):
            got = samples.value(f"{NS}:{name}", **labels, **extra)
            self.assertIsNotNone(got, f"no {name} {extra}")
            return got

        def near(got, want, what):
            self.assertLessEqual(abs(got - want), 1e-6 * abs(want) + 1e-12,
                                 f"{what}: {got} vs {want}")

        for reason, n in r["admission_rejections"].items():
            self.assertEqual(v("admission_rejections_total", reason=reason),
                             n, reason)
        self.assertEqual(samples.sum(f"{NS}:admission_rejections_total",
                                     **labels),
                         sum(r["admission_rejections"].values()))
        for source, n in r["prompt_tokens_by_source"].items():
            self.assertEqual(v("prompt_tokens_by_source_total",
                               source=source), n, source)
        self.assertEqual(v("prompt_tokens_cached_total"),
                         r["prompt_tokens_cached"])
        for rkey, hist in (("request_prefill_kv_computed_tokens",
                            "request_prefill_kv_computed_tokens"),
                           ("request_num_preemptions",
                            "request_num_preemptions"),
                           ("kv_wait_s", "request_kv_wait_time_seconds")):
            if r[rkey]["count"] == 0:
                self.assertEqual(samples.sum(f"{NS}:{hist}_count", **labels),
                                 0, hist)
                continue
            self.assertEqual(v(hist + "_count"), r[rkey]["count"], hist)
            near(v(hist + "_sum"), r[rkey]["sum"], hist)
        for role in ("send", "recv"):
            fig = r["kv_transfer"][role]
            if fig["count"] == 0:
                self.assertEqual(samples.sum(
                    f"{NS}:kv_transfer_time_seconds_count", role=role,
                    **labels), 0, role)
                continue
            self.assertEqual(v("kv_transfer_time_seconds_count", role=role),
                             fig["count"], role)
            near(v("kv_transfer_time_seconds_sum", role=role),
                 fig["time_s"]["sum"], f"{role} time")
            self.assertEqual(v("kv_transfer_bytes_count", role=role),
                             fig["count"], role)
            self.assertEqual(v("kv_transfer_bytes_sum", role=role),
                             fig["bytes"], role)
            for reason, n in fig["failures"].items():
                self.assertEqual(v("kv_transfer_failures_total", role=role,
                                   reason=reason), n, f"{role} {reason}")
            # No failure the report does not have, under any reason.
            self.assertEqual(samples.sum(f"{NS}:kv_transfer_failures_total",
                                         role=role, **labels),
                             sum(fig["failures"].values()), role)
        last = r["last_step"]
        self.assertEqual(gauge("num_requests_running"), last["running"])
        self.assertEqual(gauge("num_requests_waiting"), last["waiting"])
        near(gauge("kv_cache_usage_perc"), last["kv_usage"], "kv_usage")
        self.assertEqual(gauge("num_requests_waiting_by_reason",
                               reason="deferred"), last["waiting_deferred"])
        self.assertEqual(gauge("num_requests_waiting_by_reason",
                               reason="capacity"),
                         last["waiting"] - last["waiting_deferred"])
        sleep = r["sleep"]
        if sleep["transitions"] > 0:
            awake = (sleep["scheduler"] == "running"
                     and sleep["kv_cache"] == "resident"
                     and sleep["weights"] == "resident")
            self.assertEqual(gauge("engine_fully_awake"), int(awake))
            for resource, states in (("scheduler", ("running", "paused")),
                                     ("weights", ("resident", "offloaded",
                                                  "discarded")),
                                     ("kv_cache", ("resident", "released"))):
                for state in states:
                    self.assertEqual(
                        gauge("engine_sleep_resource_state",
                              resource=resource, state=state),
                        int(state == sleep[resource]), (resource, state))
            # vLLM's legacy gauge (docs/metrics.md): awake, or which of
            # the weights' sleeping states, else all 0.
            legacy = ("awake" if awake else
                      "weights_offloaded" if sleep["weights"] == "offloaded"
                      else "discard_all" if sleep["weights"] == "discarded"
                      else None)
            for state in ("awake", "weights_offloaded", "discard_all"):
                self.assertEqual(gauge("engine_sleep_state",
                                       sleep_state=state),
                                 int(state == legacy), state)
        else:
            self.assertIsNone(samples.value(f"{NS}:engine_fully_awake",
                                            **labels))
        # Per priority bucket (--priority-levels and the daemon's
        # --priority-label): the request-level figures of each.
        self.assertEqual(list(r["priorities"]), PRIORITY_BUCKETS)
        for bucket, g in r["priorities"].items():
            for reason in ("stop", "length", "error"):
                self.assertEqual(
                    samples.sum(f"{NS}:request_success_total",
                                finished_reason=reason, priority=bucket,
                                **labels),
                    g["finished"][reason], (bucket, reason))
            self.assertEqual(samples.sum(f"{NS}:prompt_tokens_total",
                                         priority=bucket, **labels),
                             g["prompt_tokens"], bucket)
            self.assertEqual(samples.sum(f"{NS}:generation_tokens_total",
                                         priority=bucket, **labels),
                             g["generation_tokens"], bucket)

    def test_each_process_is_a_series_equal_to_its_report(self):
        d = Daemon("--log-interval", "0", "--priority-label").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        with tu.Engine(*DISAGGREGATED, socket=d.sock,
                       report=os.path.join(d.dir, "report.json")) as e:
            report = e.report(timeout=90)
        sent = sum(report[p]["client_events_sent"]
                   for p in ("prefill", "decode"))
        poll_until(lambda: d.samples().sum("tokenmeter_ingest_events_total")
                   == sent, what="every event applied")
        samples = d.samples()
        self.assertEqual(samples.sum("tokenmeter_ingest_errors_total"), 0)
        # What the comparison is about happened: rejections, failed
        # transfers and a sleep cycle (not two zeros compared).
        self.assertGreater(sum(sum(report[p]["admission_rejections"].values())
                               for p in ("prefill", "decode")), 0)
        self.assertGreater(sum(
            sum(report[p]["kv_transfer"][role]["failures"].values())
            for p in ("prefill", "decode") for role in ("send", "recv")), 0)
        self.assertEqual(report["decode"]["sleep"]["transitions"], 2)
        # Each side ends with nothing running, waiting or held: the prefill
        # side's last hand-overs freed their blocks after its last step.
        for part in ("prefill", "decode"):
            self.assertEqual(report[part]["last_step"],
                             {"running": 0, "waiting": 0,
                              "waiting_deferred": 0, "kv_usage": 0}, part)
        for part in ("prefill", "decode"):
            r = report[part]
            labels = part_labels(part, r)
            with self.subTest(part=part):
                # The series exist (a missing one would read as 0).
                self.count(samples, f"{NS}:prompt_tokens_total", labels)
                assert_counters_equal(self, samples, r, labels)
                for rkey, hist in HISTOGRAMS.items():
                    count = samples.sum(f"{NS}:{hist}_count", **labels)
                    self.assertEqual(count, r[rkey]["count"], hist)
                    got = samples.sum(f"{NS}:{hist}_sum", **labels)
                    self.assertLessEqual(
                        abs(got - r[rkey]["sum"]),
                        1e-6 * abs(r[rkey]["sum"]) + 1e-12, hist)
                self.check_12_series(samples, r, labels)


if __name__ == "__main__":
    tu.main()
