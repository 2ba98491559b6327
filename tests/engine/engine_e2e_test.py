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


def capture_wire(extra):
    """Runs the engine against a plain Unix listener that never answers and
    returns (report, hello meta, ARRIVED events) from the bytes it wrote."""
    with tempfile.TemporaryDirectory(prefix="tm-wire-", dir="/tmp") as tmp:
        path = os.path.join(tmp, "ingest.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(30)
        chunks = []

        def read_all():
            conn, _ = listener.accept()
            conn.settimeout(30)
            with conn:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        return
                    chunks.append(data)

        reader = threading.Thread(target=read_all)
        reader.start()
        try:
            report = run_engine(path, os.path.join(tmp, "report.json"),
                                extra=extra)
        finally:
            reader.join(timeout=30)
            listener.close()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(b"".join(chunks))
    frames = list(unpacker)
    hellos = [f[1] for f in frames if f[0] == 0]
    arrived = [e for f in frames if f[0] == 1 for e in f[3] if e[0] == 1]
    return report, hellos, arrived


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


if __name__ == "__main__":
    tu.main()
