#!/usr/bin/python3
"""MoE state against the real daemon (issue 28, defect 4): any peer of the
ingest socket may send EXPERT_LOAD for up to 4096 layers of 1024 experts
on every engine series. The daemon must hold no more than docs/metrics.md
("MoE expert load", Memory) states: without --moe-expert-series at most
MOE_LAYER_BYTES per layer and MOE_SERIES_BYTES per series with MoE state,
layers capped by --max-moe-layers. A daemon that kept every expert's count
(8 bytes each: 32 MiB per series here) fails these tests.

Each test starts tokenmeterd with --max-engine-series 8, opens the 8
series, sends 4096 layers x 1024 experts on each (32768 EXPERT_LOADs,
33.5 M counts), and reads VmRSS from /proc/PID/status before and after.

Usage: moe_state_test.py TOKENMETERD [unittest args]
"""
import os
import re
import sys
import time
import unittest

import msgpack
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello  # noqa: E402
from hostile_test import rss_kib  # noqa: E402  (this folder's)

SERIES = 8
LAYERS = 4096          # TM_MAX_MOE_LAYERS
EXPERTS = 1024         # TM_MAX_MOE_EXPERTS
PER_BATCH = 512        # ~0.5 MiB frames, below --max-frame-bytes (1 MiB)
# The bound docs/metrics.md states (MoePart::kLayerBytes = 32, twice that
# with the vector's spare capacity; a series' MoePart and its vector's
# allocation).
MOE_LAYER_BYTES = 64
MOE_SERIES_BYTES = 128
# The baseline is taken after one batch of the same size on every
# connection (all to layer 0), so that the ingest path's own buffers (each
# connection's frame buffer, its decoded batch: 8 bytes per count, 4 MiB
# here) are already grown; what is left is the MoE state and what the
# allocator keeps around it.
INGEST_SLACK_KIB = 4 * 1024
# Under ASan (tests/hostile/meson.build sets ASAN_OPTIONS for such a build)
# freed blocks wait in a quarantine before they are reused: the batches
# freed during the flood fill it, so it counts as slack too.
_quarantine = re.search(r"quarantine_size_mb=(\d+)",
                        os.environ.get("ASAN_OPTIONS", ""))
if _quarantine:
    INGEST_SLACK_KIB += int(_quarantine.group(1)) * 1024


def wait_acked(sock, seq, timeout=120.0):
    """Reads ACK frames until one carries seq (the daemon applied the
    batch): done without a scrape, whose response buffer would count."""
    unpacker = msgpack.Unpacker()
    sock.settimeout(timeout)
    while True:
        data = sock.recv(4096)
        if not data:
            raise AssertionError(f"closed while waiting for ACK {seq}")
        unpacker.feed(data)
        for f in unpacker:
            # [3, nil] answers the HELLO before anything is applied.
            if f[0] == 3 and f[1] is not None and f[1] >= seq:
                return


def moe_bound_kib(layers, series):
    return (layers * MOE_LAYER_BYTES + series * MOE_SERIES_BYTES) // 1024


class MoeFlood(unittest.TestCase):
    args = ()

    def setUp(self):
        self.d = Daemon("--log-interval", "0", "--max-engine-series",
                        str(SERIES), *self.args).start()
        self.pid = self.d.proc.pid

    def tearDown(self):
        for s in getattr(self, "socks", []):
            s.close()
        rc = self.d.stop()
        self.d.cleanup()
        self.assertEqual(rc, 0, "daemon exited non-zero")

    def flood(self):
        """Opens SERIES series and sends LAYERS x EXPERTS on each; returns
        the RSS growth in KiB once every event was applied or refused."""
        self.socks = []
        for i in range(SERIES):
            s = self.d.connect()
            s.sendall(hello(model="moe", labels={"rank": str(i)},
                            session=1000 + i, ack=True))
            self.socks.append(s)
        counts = [1] * (EXPERTS - 1) + [9]  # imbalance 9 * 1024 / 1032
        # Warm-up: a batch of the flood's size on each series, to layer 0.
        warm = batch([[8, time.monotonic_ns(), 0, counts]] * PER_BATCH,
                     seq=0)
        for s in self.socks:
            s.sendall(warm)
        for s in self.socks:
            wait_acked(s, 0)
        rss0 = rss_kib(self.pid)
        frames = []
        for start in range(0, LAYERS, PER_BATCH):
            t = time.monotonic_ns()
            frames.append(batch([[8, t, layer, counts] for layer in
                                 range(start, start + PER_BATCH)],
                                seq=len(frames) + 1))
        for s in self.socks:
            for f in frames:
                s.sendall(f)
        for s in self.socks:
            wait_acked(s, len(frames))
        grew = rss_kib(self.pid) - rss0
        total = SERIES * PER_BATCH + SERIES * LAYERS

        def done():
            errors = self.d.value("tokenmeter_ingest_errors_total",
                                  reason="series_limit") or 0
            applied = self.d.value("tokenmeter_ingest_events_total",
                                   kind="expert_load") or 0
            return applied + errors == total
        tu.poll_until(done, timeout=120, what="every EXPERT_LOAD handled")
        return grew


class WithinTheDefaultCap(MoeFlood):
    """8 x 4096 layers fit the default --max-moe-layers (262144): all are
    applied, and the daemon grows by no more than the stated bound."""

    def test_every_layer_applied_within_the_memory_bound(self):
        grew = self.flood()
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                      kind="expert_load"),
                         SERIES * PER_BATCH + SERIES * LAYERS)
        self.assertIn(self.d.value("tokenmeter_ingest_errors_total",
                                   reason="series_limit"), (None, 0))
        bound = moe_bound_kib(SERIES * LAYERS, SERIES)
        print(f"RSS grew {grew} KiB for {SERIES * LAYERS} layers of "
              f"{EXPERTS} experts; MoE bound {bound} KiB + ingest slack "
              f"{INGEST_SLACK_KIB} KiB", file=sys.stderr)
        self.assertLessEqual(grew, bound + INGEST_SLACK_KIB)
        # The exposed series are those of valid input: one routed-tokens
        # and one imbalance series per layer of every series (layer 0 has
        # the warm-up too).
        text = self.d.metrics_text()
        routed = re.findall(r"^vllm:moe_routed_tokens_total\{.*\} 1032$",
                            text, re.M)
        self.assertEqual(len(routed), SERIES * (LAYERS - 1))
        self.assertEqual(len(re.findall(
            r'^vllm:moe_routed_tokens_total\{.*layer="0"\} %d$' %
            (1032 * (PER_BATCH + 1)), text, re.M)), SERIES)
        self.assertEqual(len(re.findall(r"^vllm:moe_layer_imbalance\{",
                                        text, re.M)), SERIES * LAYERS)
        self.assertNotIn("moe_expert_tokens", text)


class BeyondTheCap(MoeFlood):
    """--max-moe-layers 10000: the first 10000 layers are applied, every
    later new layer is refused and counted as series_limit; memory stays
    within the bound of 10000 layers."""
    CAP = 10000
    args = ("--max-moe-layers", str(CAP))

    def test_layers_beyond_the_cap_refused_and_counted(self):
        grew = self.flood()
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                      kind="expert_load"),
                         SERIES * PER_BATCH + self.CAP)
        self.assertEqual(self.d.value("tokenmeter_ingest_errors_total",
                                      reason="series_limit"),
                         SERIES * LAYERS - self.CAP)
        bound = moe_bound_kib(self.CAP, SERIES)
        print(f"RSS grew {grew} KiB for {self.CAP} layers kept; MoE bound "
              f"{bound} KiB + ingest slack {INGEST_SLACK_KIB} KiB",
              file=sys.stderr)
        self.assertLessEqual(grew, bound + INGEST_SLACK_KIB)
        text = self.d.metrics_text()
        self.assertEqual(len(re.findall(r"^vllm:moe_routed_tokens_total\{",
                                        text, re.M)), self.CAP)
        # The connections stay open: a refused layer is an event-level
        # error, and a known layer still adds up.
        s = self.socks[0]
        s.sendall(batch([[8, time.monotonic_ns(), 0, [1] * EXPERTS]],
                        seq=LAYERS // PER_BATCH + 1))
        self.d.wait_value("vllm:moe_routed_tokens_total",
                          1032 * (PER_BATCH + 1) + 1024,
                          model_name="moe", engine="0", rank="0",
                          layer="0")


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
