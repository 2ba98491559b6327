#!/usr/bin/python3
"""Static checks of docs/grafana/tokenmeter.json, of its native-histogram
edition tokenmeter-native.json, and of the rule files.

No Grafana runs here, so this checks what makes a dashboard import cleanly
and behave: the schema fields Grafana requires, a data source variable that
every panel and target uses, the job/instance/model_name/engine variables,
unique panel ids, a grid without overlaps, no undefined variable, and the
panels the monitoring issues ask for. Every series the dashboard and the
rules name must exist in some naming profile of docs/metrics.md (itself
checked against the code's tables by tests/docs/), and every target must
name series of every profile but where profiles.NOT_EXPORTED says the
engine family exports no such quantity. live_prometheus_test.py proves the
queries return data on a real Prometheus.
"""
import json
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import profiles  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
DASHBOARD = os.path.join(SRC, "docs", "grafana", "tokenmeter.json")
NATIVE_DASHBOARD = os.path.join(SRC, "docs", "grafana",
                                "tokenmeter-native.json")
NATIVE_SCRIPT = os.path.join(SRC, "scripts", "native-dashboard.py")
METRICS_MD = os.path.join(SRC, "docs", "metrics.md")
DOCS_PROM = os.path.join(SRC, "docs", "prometheus")

DS = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = {"__rate_interval", "__interval", "__range", "__all"}
PANEL_TYPES = {"row", "timeseries", "stat", "heatmap", "table"}


def catalog():
    """Every engine series name of any profile, each profile's, and the
    daemon's series names, from docs/metrics.md."""
    by_profile, daemon = profiles.catalogs(METRICS_MD)
    return set().union(*by_profile.values()), by_profile, daemon


class Dashboard(unittest.TestCase):
    PATH = DASHBOARD

    @classmethod
    def setUpClass(cls):
        with open(cls.PATH) as f:
            cls.d = json.load(f)
        cls.panels = cls.d["panels"]
        cls.vars = {v["name"]: v for v in cls.d["templating"]["list"]}
        cls.targets = [(p, t) for p in cls.panels
                       for t in p.get("targets", [])]

    def test_top_level_fields_grafana_needs(self):
        d = self.d
        self.assertIsInstance(d["schemaVersion"], int)
        self.assertGreaterEqual(d["schemaVersion"], 36)  # Grafana 9+
        self.assertRegex(d["uid"], r"^[a-zA-Z0-9_-]{1,40}$")
        self.assertTrue(d["title"])
        self.assertIsNone(d["id"])  # import assigns one
        self.assertIn("from", d["time"])
        self.assertIsInstance(d["panels"], list)
        self.assertNotIn("__inputs", d)  # a datasource variable instead

    def test_variables(self):
        names = [v["name"] for v in self.d["templating"]["list"]]
        self.assertEqual(names[0], "datasource")
        for n in ("job", "namespace", "instance", "model_name", "engine"):
            self.assertIn(n, names)
        ds = self.vars["datasource"]
        self.assertEqual((ds["type"], ds["query"]), ("datasource",
                                                     "prometheus"))
        for v in self.d["templating"]["list"][1:]:
            self.assertEqual(v["type"], "query", v["name"])
            self.assertEqual(v["datasource"], DS, v["name"])
            self.assertEqual(v["definition"], v["query"]["query"], v["name"])
            self.assertRegex(v["definition"], r"^label_values\(", v["name"])
            # A variable uses only variables defined before it.
            before = set(names[:names.index(v["name"])])
            used = set(re.findall(r"\$\{?(\w+)", v["definition"]))
            self.assertLessEqual(used, before, v["name"])
        for n in ("instance", "model_name", "engine"):
            v = self.vars[n]
            self.assertTrue(v["multi"] and v["includeAll"], n)
            self.assertEqual(v["allValue"], ".*", n)
        for n in ("job", "namespace"):  # used with = and in metric names
            self.assertFalse(self.vars[n]["multi"] or
                             self.vars[n]["includeAll"], n)
        # Every profile's running-requests gauge (SGLang: num_running_reqs).
        self.assertEqual(
            self.vars["namespace"]["regex"],
            "/^([^:]+):(?:num_requests_running|num_running_reqs)$/")

    def test_panels_ids_datasources_targets(self):
        ids = [p["id"] for p in self.panels]
        self.assertEqual(len(ids), len(set(ids)), "duplicate panel ids")
        for p in self.panels:
            self.assertIn(p["type"], PANEL_TYPES, p["title"])
            self.assertTrue(p["title"])
            if p["type"] == "row":
                self.assertEqual(p.get("panels"), [], p["title"])
                self.assertFalse(p.get("collapsed"), p["title"])
                self.assertNotIn("targets", p)
                continue
            self.assertEqual(p["datasource"], DS, p["title"])
            self.assertTrue(p.get("description"), p["title"])
            self.assertTrue(p["targets"], p["title"])
            refs = [t["refId"] for t in p["targets"]]
            self.assertEqual(len(refs), len(set(refs)), p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"], DS, p["title"])
                self.assertTrue(t["expr"].strip(), p["title"])
            if p["type"] == "heatmap":
                for t in p["targets"]:
                    self.assertEqual(t.get("format"), "heatmap", p["title"])
                    self.assertIn("by (le)", t["expr"], p["title"])

    def test_grid_has_no_overlaps(self):
        cells = {}
        for p in self.panels:
            g = p["gridPos"]
            for k in ("h", "w", "x", "y"):
                self.assertIsInstance(g[k], int, p["title"])
            self.assertTrue(0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"])
            self.assertTrue(g["w"] > 0 and g["h"] > 0, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    other = cells.setdefault((x, y), p["title"])
                    self.assertEqual(other, p["title"],
                                     f"{p['title']} overlaps {other}")

    def test_every_variable_used_is_defined(self):
        defined = set(self.vars) | BUILTINS
        for p, t in self.targets:
            used = {a or b for a, b in
                    re.findall(r"\$\{(\w+)\}|\$(\w+)", t["expr"])}
            self.assertLessEqual(used, defined, p["title"])
            # Engine series name the namespace as ${namespace}: a bare
            # $namespace: would still work, but ${} is unambiguous.
            self.assertNotRegex(t["expr"], r"\$namespace:", p["title"])

    def test_engine_series_filter_on_every_variable(self):
        for p, t in self.targets:
            for m in re.finditer(r"\$\{namespace\}:(\w+)\{([^}]*)\}",
                                 t["expr"]):
                for label in ("job", "instance", "model_name", "engine"):
                    self.assertIn(f"{label}", m.group(2),
                                  f"{p['title']}: {m.group(1)} lacks {label}")
            for m in re.finditer(r"\b((?:tokenmeter|process)_\w+|up|"
                                 r"scrape_duration_seconds)\{([^}]*)\}",
                                 t["expr"]):
                self.assertIn('job="$job"', m.group(2), p["title"])
                self.assertIn('instance=~"$instance"', m.group(2),
                              p["title"])

    def test_every_series_named_exists_in_the_catalog(self):
        engine_series, _, daemon = catalog()
        self.assertGreater(len(engine_series), 60)
        for p, t in self.targets:
            for name in re.findall(r"\$\{namespace\}:(\w+)", t["expr"]):
                self.assertIn(name, engine_series, p["title"])
            for name in re.findall(r"\b((?:tokenmeter|process)_\w+)\{",
                                   t["expr"]):
                self.assertIn(name, daemon, p["title"])

    def test_every_target_names_each_profiles_series(self):
        """Per profile, a target has an `or` alternative whose series all
        exist in that profile, unless NOT_EXPORTED lists it (and then it
        has none: the list stays true)."""
        _, by_profile, _ = catalog()
        keys = {(p["title"], t["refId"]) for p, t in self.targets}
        for profile, names in by_profile.items():
            missing = profiles.NOT_EXPORTED[profile]
            self.assertLessEqual(set(missing), keys, profile)
            for p, t in self.targets:
                key = (p["title"], t["refId"])
                self.assertEqual(
                    profiles.names_in_profile(t["expr"], names),
                    key not in missing, f"{profile}: {key}: {t['expr']}")
                if key in missing:
                    # The panel tells the user why it is empty.
                    self.assertIn(profile_name(profile), p["description"],
                                  key)

    def test_the_panels_the_issue_asks_for(self):
        exprs = "\n".join(t["expr"] for _, t in self.targets)
        for h in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                  "request_time_per_output_token_seconds",
                  "e2e_request_latency_seconds"):
            for q in ("0.5", "0.9", "0.99"):
                self.assertIn(f"histogram_quantile({q}, sum by (le) "
                              f"(rate(${{namespace}}:{h}_bucket", exprs)
            self.assertIn(f"${{namespace}}:{h}_sum", exprs)
            self.assertIn(f"${{namespace}}:{h}_count", exprs)
        for name in ("request_queue_time_seconds_sum",
                     "request_prefill_time_seconds_sum",
                     "request_decode_time_seconds_sum",
                     "prompt_tokens_total", "generation_tokens_total",
                     "num_requests_running", "num_requests_waiting",
                     "kv_cache_usage_perc", "prefix_cache_hits_total",
                     "prefix_cache_queries_total", "request_success_total",
                     "num_preemptions_total",
                     "spec_decode_num_accepted_tokens_total",
                     "spec_decode_num_draft_tokens_total",
                     "spec_decode_num_accepted_tokens_per_pos_total",
                     "request_prompt_tokens_bucket",
                     "request_generation_tokens_bucket"):
            self.assertIn(f"${{namespace}}:{name}", exprs)
        for name in ("tokenmeter_ingest_connections",
                     "tokenmeter_ingest_errors_total",
                     "tokenmeter_client_dropped_events_total",
                     "tokenmeter_scrape_duration_seconds", "up{"):
            self.assertIn(name, exprs)
        # Per tenant (the request label of --request-label tenant) and per
        # LoRA adapter set (lora_requests_info), in every profile.
        for h in ("time_to_first_token_seconds",
                  "e2e_request_latency_seconds"):
            for q in ("0.5", "0.99"):
                self.assertIn(f"histogram_quantile({q}, sum by (tenant, le) "
                              f"(rate(${{namespace}}:{h}_bucket", exprs)
        self.assertIn("sum by (tenant) (rate(${namespace}:"
                      "generation_tokens_total", exprs)
        for label in ("running_lora_adapters", "waiting_lora_adapters"):
            self.assertIn(f"count by ({label}) (${{namespace}}:"
                          "lora_requests_info", exprs)
        # MoE expert load (EXPERT_LOAD): imbalance per layer with the
        # histogram's quantiles, routed tokens per layer, and the grid of
        # every layer's experts (test_moe_expert_grid).
        self.assertIn("max by (layer) (${namespace}:moe_layer_imbalance{",
                      exprs)
        for q in ("0.5", "0.99"):
            self.assertIn(f"clamp_min(histogram_quantile({q}, sum by (le) "
                          "(rate(${namespace}:moe_imbalance_bucket", exprs)
        self.assertIn("sum by (layer) (rate(${namespace}:"
                      "moe_routed_tokens_total{", exprs)
        self.assertIn("sum by (layer, expert) (rate(${namespace}:"
                      "moe_expert_tokens_total{", exprs)
        # Protocol 1.2: admission rejections, waiting by reason, prompt
        # tokens by source and the cached share, KV transfers (latency and
        # size quantiles by role, bytes/s, failures) and sleep state; per
        # request, the computed prompt tokens and the KV wait (p50, p99)
        # and the preemptions (mean, p99).
        self.check_protocol_12_panels(exprs, [
            "sum by (reason) (rate(${namespace}:admission_rejections_total{",
            "sum by (reason) (${namespace}:num_requests_waiting_by_reason{",
            "sum by (source) (rate(${namespace}:"
            "prompt_tokens_by_source_total{",
            "sum(rate(${namespace}:prompt_tokens_cached_total{",
            "sum by (role, reason) (rate(${namespace}:"
            "kv_transfer_failures_total{",
            "sum by (role) (rate(${namespace}:kv_transfer_bytes_sum{",
            "sum by (sleep_state) (${namespace}:engine_sleep_state{",
            "sum(1 - ${namespace}:engine_fully_awake{",
            "sum by (resource, state) (${namespace}:"
            "engine_sleep_resource_state{",
        ] + [f"histogram_quantile({q}, sum by (role, le) (rate(${{namespace}}:"
             f"{h}_bucket{{"
             for q in ("0.5", "0.99")
             for h in ("kv_transfer_time_seconds", "kv_transfer_bytes")] +
            [f"histogram_quantile({q}, sum by (le) (rate(${{namespace}}:"
             f"{h}_bucket{{" for q in ("0.5", "0.99")
             for h in ("request_prefill_kv_computed_tokens",
                       "request_kv_wait_time_seconds")] + [
            "histogram_quantile(0.99, sum by (le) (rate(${namespace}:"
            "request_num_preemptions_bucket{",
            "sum(rate(${namespace}:request_num_preemptions_sum{",
            "sum(rate(${namespace}:request_num_preemptions_count{"])
        # Aggregation over hosts and engines: no engine series plotted raw.
        for p, t in self.targets:
            self.assertRegex(t["expr"], r"^(histogram_quantile|sum|max|avg|"
                             r"count|time\(\) - max|clamp_min|"
                             r"1 \+ sum|up|tokenmeter_scrape|scrape_duration|"
                             r"rate\(process|process_)", p["title"])

    # The protocol 1.2 series (metrics-v1.md "Catalog 1.2 additions"; and
    # SGLang's own names of the same facts, docs/metrics.md "Protocol 1.2
    # series") and the titles of the panels that show them.
    PROTOCOL_12_SERIES = (
        "admission_rejections_total", "num_requests_waiting_by_reason",
        "prompt_tokens_by_source_total", "prompt_tokens_cached_total",
        "request_prefill_kv_computed_tokens", "request_num_preemptions",
        "request_kv_wait_time_seconds",
        "kv_transfer_time_seconds", "kv_transfer_bytes",
        "kv_transfer_failures_total", "engine_sleep_state",
        "engine_sleep_resource_state", "engine_fully_awake",
        "num_queue_rejected_requests_total", "kv_transfer_latency_ms",
        "kv_transfer_total_mb", "num_transfer_failed_reqs_total",
        "kv_transfer_timeouts_total")
    PROTOCOL_12_PANELS = (
        "Admission rejections by reason", "Requests waiting by reason",
        "Prompt tokens by source", "Cached prompt share",
        "Computed prompt tokens per request", "Preemptions per request",
        "KV transfer time by role", "KV transfer failures by reason",
        "KV transfer bytes/s by role", "KV transfer size by role",
        "KV wait per request", "Engines by sleep state",
        "Engine resources by sleep state")

    def check_protocol_12_panels(self, exprs, wanted):
        """Each query of `wanted` is in `exprs`; every 1.2 series is shown,
        in the two rows of 1.2 panels (no other panel names them: the
        live tests let an engine that sends no 1.2 event leave only
        these empty)."""
        for w in wanted:
            self.assertIn(w, exprs)
        rows = [p["title"] for p in self.panels if p["type"] == "row"]
        for title in ("Admission and prompt sources", "KV transfer and sleep"):
            self.assertIn(title, rows)
        shown = set()
        for p, t in self.targets:
            names = set(re.findall(r"\$\{namespace\}:(\w+?)(?:_bucket|_sum|"
                                   r"_count)?\{", t["expr"]))
            if p["title"] == "Prefix-cache hit rate":
                # LMDeploy's hits: its cached tokens less those received by
                # KV transfer, prompt_tokens_by_source (which every engine
                # fills) `or vector(0)`: never empty for want of 1.2.
                self.assertLessEqual(names & set(self.PROTOCOL_12_SERIES),
                                     {"prompt_tokens_by_source_total"})
                self.assertIn("or vector(0))", t["expr"])
                continue
            if names & set(self.PROTOCOL_12_SERIES):
                self.assertIn(p["title"], self.PROTOCOL_12_PANELS)
                shown |= names
        self.assertLessEqual(set(self.PROTOCOL_12_SERIES), shown)
        self.assertEqual(
            {p["title"] for p in self.panels} & set(self.PROTOCOL_12_PANELS),
            set(self.PROTOCOL_12_PANELS))

    def test_moe_expert_grid(self):
        """The layer x expert grid: Grafana's heatmap panel puts time on
        one axis, so the grid is a table whose Grouping to matrix
        transformation makes a row per layer and a column per expert, in
        numeric order (the transformation keeps the order in which values
        first appear: sorted by layer, then stably by expert), coloured on
        one scale."""
        grids = [p for p in self.panels
                 if any(t["id"] == "groupingToMatrix"
                        for t in p.get("transformations", []))]
        self.assertEqual(len(grids), 1)
        p = grids[0]
        self.assertEqual(p["type"], "table")
        (t,) = p["targets"]
        self.assertRegex(t["expr"], r"^sum by \(layer, expert\) \(rate\("
                         r"\$\{namespace\}:moe_expert_tokens_total\{"
                         r"[^}]*\}\[\$__range\]\)\)$")
        self.assertEqual((t["format"], t["instant"], t["range"]),
                         ("table", True, False))
        steps = [(x["id"], x["options"]) for x in p["transformations"]]
        self.assertEqual([i for i, _ in steps], [
            "convertFieldType", "sortBy", "sortBy", "groupingToMatrix"])
        self.assertEqual(
            {(c["targetField"], c["destinationType"])
             for c in steps[0][1]["conversions"]},
            {("layer", "number"), ("expert", "number")})
        self.assertEqual([o["sort"] for _, o in steps[1:3]],
                         [[{"field": "layer", "desc": False}],
                          [{"field": "expert", "desc": False}]])
        m = steps[3][1]
        self.assertEqual((m["rowField"], m["columnField"], m["valueField"]),
                         ("layer", "expert", "Value"))
        d = p["fieldConfig"]["defaults"]
        self.assertEqual(d["custom"]["cellOptions"]["type"],
                         "color-background")
        self.assertTrue(d["color"]["mode"].startswith("continuous-"))
        # The row-name column ("layer\\expert") is not coloured.
        (o,) = p["fieldConfig"]["overrides"]
        self.assertEqual(o["matcher"], {"id": "byName",
                                        "options": "layer\\expert"})
        self.assertIn("--moe-expert-series", p["description"])


def profile_name(profile):
    """How a panel description names the engine family of a profile."""
    return {"vllm": "vLLM", "sglang": "SGLang", "lmdeploy": "LMDeploy"}[
        profile]


class NativeDashboard(Dashboard):
    """docs/grafana/tokenmeter-native.json, the classic dashboard's queries
    over native histograms (scripts/native-dashboard.py): every check of
    the classic one, and that it is what the script writes now."""
    PATH = NATIVE_DASHBOARD

    def with_classic_names(self):
        """The targets with each native histogram name X written X_bucket,
        as the catalog names the series; of a classic heatmap's three
        quantiles only the first (A, the heatmap's refId: they name the
        same series)."""
        engine_series, _, _ = catalog()
        with open(DASHBOARD) as f:
            heatmaps = {p["title"] for p in json.load(f)["panels"]
                        if p["type"] == "heatmap"}

        def name(m):
            n = m.group(1)
            if n not in engine_series and n + "_bucket" in engine_series:
                n += "_bucket"
            return "${namespace}:" + n
        out = []
        for p, t in self.targets:
            if p["title"] in heatmaps and t["refId"] != "A":
                continue
            t = dict(t, expr=re.sub(r"\$\{namespace\}:(\w+)", name,
                                    t["expr"]))
            out.append((p, t))
        return out

    def test_histogram_panels_say_they_read_native_buckets(self):
        # A classic description names bucket bounds ("buckets 0 1 2 3 ...")
        # that the native series do not have: each panel reading a native
        # histogram says so.
        for p, t in self.targets:
            if re.search(r"histogram_(quantile|fraction)\(",
                         t["expr"]):
                self.assertIn("Native edition", p.get("description", ""),
                              p["title"])

    def test_every_series_named_exists_in_the_catalog(self):
        self.targets = self.with_classic_names()
        super().test_every_series_named_exists_in_the_catalog()

    def test_every_target_names_each_profiles_series(self):
        self.targets = self.with_classic_names()
        super().test_every_target_names_each_profiles_series()

    def test_the_panels_the_issue_asks_for(self):
        """The classic dashboard's, in native form (the panels are the
        same: test_no_classic_histogram_series_left)."""
        exprs = "\n".join(t["expr"] for _, t in self.targets)
        for h in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                  "request_time_per_output_token_seconds",
                  "e2e_request_latency_seconds"):
            for q in ("0.5", "0.9", "0.99"):
                self.assertIn(f"histogram_quantile({q}, sum(rate("
                              f"${{namespace}}:{h}{{", exprs)
            for f in ("histogram_sum", "histogram_count"):
                self.assertIn(f"{f}(rate(${{namespace}}:{h}{{", exprs)
        for h in ("time_to_first_token_seconds",
                  "e2e_request_latency_seconds"):
            for q in ("0.5", "0.99"):
                self.assertIn(f"histogram_quantile({q}, sum by (tenant) "
                              f"(rate(${{namespace}}:{h}{{", exprs)
        # The 1.2 histograms, native: KV transfers by role, and per
        # request the computed prompt tokens, the KV wait and the
        # preemptions.
        self.check_protocol_12_panels(exprs, [
            f"histogram_quantile({q}, sum by (role) (rate(${{namespace}}:"
            f"{h}{{" for q in ("0.5", "0.99")
            for h in ("kv_transfer_time_seconds", "kv_transfer_bytes")] + [
            "sum by (role) (histogram_sum(rate(${namespace}:"
            "kv_transfer_bytes{"] + [
            f"histogram_quantile({q}, sum(rate(${{namespace}}:{h}{{"
            for q in ("0.5", "0.99")
            for h in ("request_prefill_kv_computed_tokens",
                      "request_kv_wait_time_seconds")] + [
            "histogram_quantile(0.99, sum(rate(${namespace}:"
            "request_num_preemptions{",
            "sum(histogram_sum(rate(${namespace}:request_num_preemptions{",
            "sum(histogram_count(rate(${namespace}:"
            "request_num_preemptions{"])

    def test_is_what_the_script_writes_from_the_classic_one(self):
        r = subprocess.run([sys.executable, NATIVE_SCRIPT, "--check"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_no_classic_histogram_series_left(self):
        with open(DASHBOARD) as f:
            classic_text = f.read()
        classic = json.loads(classic_text)
        for p, t in self.targets:
            self.assertNotRegex(t["expr"], r"_bucket\b", p["title"])
            # X_sum / X_count of a histogram X (one with X_bucket).
            for m in re.finditer(r"([\w${}:]+)_(sum|count)\b(?!\()",
                                 t["expr"]):
                self.assertNotIn(m.group(1) + "_bucket", classic_text,
                                 f"{p['title']}: {m.group(0)}")
        self.assertNotIn("heatmap", {p["type"] for p in self.panels})
        self.assertIn("native-histograms", self.d["tags"])
        self.assertNotEqual(self.d["uid"], classic["uid"])
        self.assertEqual([p["title"] for p in self.panels],
                         [p["title"] for p in classic["panels"]])


class Rules(unittest.TestCase):
    def rule_files(self):
        return sorted(n for n in os.listdir(DOCS_PROM)
                      if n.endswith((".rules.yml", ".alerts.yml")))

    def test_rule_files_present(self):
        # No recording rules for LMDeploy's names any more: the lmdeploy
        # profile exposes them.
        self.assertEqual(self.rule_files(),
                         ["tokenmeter.alerts.yml", "tokenmeter.rules.yml"])

    def test_every_series_named_exists_in_the_catalog(self):
        engine_series, _, daemon = catalog()
        for fname in self.rule_files():
            with open(os.path.join(DOCS_PROM, fname)) as f:
                text = f.read()
            names = re.findall(r'\[\^:\]\+:(\w+)"', text)
            self.assertTrue(names or "alerts" in fname, fname)
            for name in names:
                self.assertIn(name, engine_series, fname)
            # No selector names one engine family: rules match them all.
            self.assertNotRegex(text, r"\b(vllm|sglang|lmdeploy):\w+[{\[ )]",
                                fname)
            for name in re.findall(r"\b(tokenmeter_\w+)\{", text):
                self.assertIn(name, daemon, fname)

    def test_the_alerts_the_issue_asks_for(self):
        with open(os.path.join(DOCS_PROM, "tokenmeter.alerts.yml")) as f:
            alerts = re.findall(r"- alert: (\w+)", f.read())
        self.assertEqual(alerts, [
            "TokenmeterTTFTP99High", "TokenmeterQueueGrowing",
            "TokenmeterKVCacheNearFull", "TokenmeterIngestErrors",
            "TokenmeterClientDroppedEvents", "TokenmeterDaemonDown"])
        with open(os.path.join(DOCS_PROM, "tests",
                               "tokenmeter.test.yml")) as f:
            tested = set(re.findall(r"alertname: (\w+)", f.read()))
        self.assertEqual(tested, set(alerts), "every alert has a unit test")

    def test_recording_rules_cover_the_dashboard_quantiles(self):
        with open(os.path.join(DOCS_PROM, "tokenmeter.rules.yml")) as f:
            records = set(re.findall(r"- record: (\S+)", f.read()))
        for h in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                  "request_time_per_output_token_seconds",
                  "e2e_request_latency_seconds"):
            for q in ("p50", "p90", "p99", "mean"):
                self.assertIn(f"namespace_model:{h}:{q}_5m", records)


if __name__ == "__main__":
    unittest.main(verbosity=2)
