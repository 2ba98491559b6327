#!/usr/bin/python3
"""Static checks of the fleet files (no root, no namespaces): promtool on
docs/prometheus/fleet/ (check config, check rules, the rule unit tests of
fleet/tests/), the fleet rules' shape (one group per topology, each reading
only its own inputs and labelling its series with its `via`, the same
records in both, quantiles only from summed bucket rates, engine series
that exist in some naming profile), and docs/grafana/tokenmeter-fleet.json
(what makes a dashboard import, and only recorded fleet series of both
`via`s). tests/fleet/fleet_test.py proves them on live Prometheus servers.

Exits 77 (skipped) without promtool (Debian package prometheus)."""
import json
import os
import re
import subprocess
import sys
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "monitoring"))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import profiles  # noqa: E402
import tokenmeter_testutil as tu  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
FLEET = os.path.join(SRC, "docs", "prometheus", "fleet")
DASHBOARD = os.path.join(SRC, "docs", "grafana", "tokenmeter-fleet.json")
METRICS_MD = os.path.join(SRC, "docs", "metrics.md")
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
DS = {"type": "prometheus", "uid": "${datasource}"}
GROUPS = {"tokenmeter-fleet-remote-write": "remote_write",
          "tokenmeter-fleet-federation": "federation"}


def promtool(*args):
    p = subprocess.run([PROMTOOL, *args], cwd=FLEET, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def rules(name):
    with open(os.path.join(FLEET, name)) as f:
        return yaml.safe_load(f)["groups"]


class Promtool(unittest.TestCase):
    def test_check_config(self):
        for name in ("agent.yml", "host.yml", "central.yml"):
            rc, out = promtool("check", "config", name)
            self.assertEqual(rc, 0, out)
        names = sorted(n for n in os.listdir(FLEET) if n.endswith(".yml"))
        self.assertEqual(names, ["agent.yml", "central.yml",
                                 "fleet.rules.yml", "host.rules.yml",
                                 "host.yml"])
        # Every one installed (<datadir>/tokenmeter/prometheus/fleet/), and
        # the fleet dashboard.
        with open(os.path.join(SRC, "docs", "meson.build")) as f:
            text = f.read()
        self.assertEqual(
            sorted(re.findall(r"'prometheus/fleet/([^']+)'", text)), names)
        self.assertIn("'grafana/tokenmeter-fleet.json'", text)

    def test_check_rules(self):
        for name in ("host.rules.yml", "fleet.rules.yml"):
            rc, out = promtool("check", "rules", name)
            self.assertEqual(rc, 0, out)

    def test_rule_unit_tests(self):
        tests = sorted(os.path.join("tests", n)
                       for n in os.listdir(os.path.join(FLEET, "tests")))
        self.assertEqual(tests, ["tests/fleet.test.yml",
                                 "tests/host.test.yml"])
        rc, out = promtool("test", "rules", *tests)
        self.assertEqual(rc, 0, out)


class FleetRules(unittest.TestCase):
    def test_one_group_per_via_with_the_same_records(self):
        groups = rules("fleet.rules.yml")
        self.assertEqual([g["name"] for g in groups], list(GROUPS))
        records = []
        for g in groups:
            via = GROUPS[g["name"]]
            for r in g["rules"]:
                self.assertEqual(r.get("labels"), {"via": via}, r["record"])
                self.assertRegex(r["record"],
                                 r"^(fleet_host_model|fleet_model|fleet|"
                                 r"fleet_job):[a-z0-9_]+:[a-z0-9_]+$")
            records.append([r["record"] for r in g["rules"]])
        self.assertEqual(records[0], records[1])
        self.assertEqual(len(records[0]), len(set(records[0])))
        # Per host, per model, fleet: the same quantities at each level.
        by_level = {}
        for rec in records[0]:
            level, rest = rec.split(":", 1)
            by_level.setdefault(level, set()).add(rest)
        self.assertEqual(by_level["fleet_host_model"], by_level["fleet_model"])
        self.assertEqual(by_level["fleet_model"], by_level["fleet"])
        for q in ("time_to_first_token_seconds:p50_5m",
                  "time_to_first_token_seconds:p99_5m",
                  "inter_token_latency_seconds:p50_5m",
                  "inter_token_latency_seconds:p99_5m",
                  "generation_tokens:rate5m", "prompt_tokens_total:sum",
                  "generation_tokens_total:sum", "request_success_total:sum",
                  "request_success:rate5m", "num_requests_waiting:sum",
                  "kv_cache_usage_perc:max", "kv_cache_usage_perc:avg"):
            self.assertIn(q, by_level["fleet_model"])

    def test_each_group_reads_only_its_own_inputs(self):
        host_records = {r["record"] for g in rules("host.rules.yml")
                        for r in g["rules"]}
        for g in rules("fleet.rules.yml"):
            for r in g["rules"]:
                e = r["expr"]
                named = set(re.findall(r"\b(host_[a-z]+:[a-z0-9_]+:[a-z]+)",
                                       e))
                raw = re.findall(r'\{__name__=~"([^"]+)"', e)
                if g["name"].endswith("remote-write"):
                    self.assertEqual(named, set(), r["record"])
                    self.assertTrue(raw or "up{" in e, r["record"])
                    for pattern in raw:
                        # An engine series name, which no host_model:* or
                        # fleet*:* record can match.
                        self.assertRegex(pattern, r"^\[\^:\]\+:[a-z_]+$")
                else:
                    self.assertEqual(raw, [], r["record"])
                    self.assertTrue(named, r["record"])
                    self.assertLessEqual(named, host_records, r["record"])
                # Only series of a host, never the store's own aggregates.
                for sel in re.findall(r"\{[^}]*\}", e):
                    self.assertIn('host!=""', sel, r["record"])

    def test_quantiles_only_from_summed_bucket_rates(self):
        n = 0
        for g in rules("fleet.rules.yml"):
            for r in g["rules"]:
                e = r["expr"]
                quantiles = re.findall(r"histogram_quantile\(", e)
                ok = re.findall(r"histogram_quantile\(0\.\d+, "
                                r"sum by \([a-z_, ]*\ble\) \(rate\(", e)
                self.assertEqual(len(quantiles), len(ok), r["record"])
                n += len(ok)
                # No rule reads a recorded quantile (a mean of them would
                # be no quantile).
                self.assertNotRegex(e, r":p\d\d_", r["record"])
        self.assertGreaterEqual(n, 24)

    def test_engine_series_exist_in_a_profile(self):
        by_profile, _ = profiles.catalogs(METRICS_MD)
        names = set().union(*by_profile.values())
        for name in ("host.rules.yml", "fleet.rules.yml"):
            with open(os.path.join(FLEET, name)) as f:
                found = re.findall(r'\[\^:\]\+:(\w+)"', f.read())
            self.assertTrue(found, name)
            for n in found:
                self.assertIn(n, names, name)


class FleetDashboard(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DASHBOARD) as f:
            cls.d = json.load(f)
        cls.records = {r["record"] for g in rules("fleet.rules.yml")
                       for r in g["rules"]}

    def test_importable(self):
        d = self.d
        self.assertGreaterEqual(d["schemaVersion"], 36)
        self.assertEqual(d["uid"], "tokenmeter-fleet")
        self.assertIsNone(d["id"])
        self.assertNotIn("__inputs", d)
        ids = [p["id"] for p in d["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        cells = set()
        for p in d["panels"]:
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells, p["title"])
                    cells.add((x, y))

    def test_variables(self):
        vs = {v["name"]: v for v in self.d["templating"]["list"]}
        self.assertEqual(list(vs), ["datasource", "via", "host",
                                        "model_name"])
        self.assertFalse(vs["via"]["multi"] or vs["via"]["includeAll"])
        for n in ("host", "model_name"):
            self.assertTrue(vs[n]["multi"] and vs[n]["includeAll"])
            self.assertEqual(vs[n]["allValue"], ".*")
        for n in ("via", "host", "model_name"):
            v = vs[n]
            self.assertEqual(v["datasource"], DS)
            self.assertEqual(v["definition"], v["query"]["query"])
            if n != "via":
                self.assertIn('via="$via"', v["definition"])

    def test_panels_read_recorded_fleet_series_of_one_via(self):
        targets = 0
        for p in self.d["panels"]:
            if p["type"] == "row":
                continue
            self.assertEqual(p["datasource"], DS, p["title"])
            self.assertTrue(p.get("description"), p["title"])
            for t in p["targets"]:
                targets += 1
                self.assertEqual(t["datasource"], DS, p["title"])
                names = re.findall(r"\b(fleet[a-z_]*:[a-z0-9_]+:[a-z0-9_]+)",
                                   t["expr"])
                self.assertTrue(names, p["title"])
                self.assertLessEqual(set(names), self.records, p["title"])
                # Every selector picks one via: no sum over both.
                sels = re.findall(r"fleet[a-z_]*:[a-z0-9_]+:[a-z0-9_]+\{"
                                  r"([^}]*)\}", t["expr"])
                self.assertEqual(len(sels), len(names), p["title"])
                for s in sels:
                    self.assertIn('via="$via"', s, p["title"])
                # No quantile is computed (or averaged) in the dashboard.
                self.assertNotIn("histogram_quantile", t["expr"])
                self.assertNotRegex(t["expr"], r"avg[ (]", p["title"])
        self.assertGreaterEqual(targets, 12)


if __name__ == "__main__":
    if not os.path.exists(PROMTOOL):
        tu.skip(f"no {PROMTOOL} (Debian's prometheus package)")
    tu.main()
