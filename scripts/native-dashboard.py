#!/usr/bin/python3
"""Writes docs/grafana/tokenmeter-native.json, the dashboard for a
Prometheus that stores tokenmeterd's histograms as native histograms
(scraped over protobuf with --enable-feature=native-histograms), from
docs/grafana/tokenmeter.json, the dashboard for classic buckets.

Prometheus 2.42 to 2.44 keeps only the native form of a histogram that has
native buckets: its _bucket, _sum and _count series are not stored, so every
classic histogram query comes back empty there (docs/user-guide.md, "Native
histograms"). The native dashboard is the classic one, panel for panel, with
each histogram query rewritten:

  histogram_quantile(q, sum by (le, L) (rate(X_bucket{S}[W])))
      -> histogram_quantile(q, sum by (L) (rate(X{S}[W])))
  rate(X_sum{S}[W])    -> histogram_sum(rate(X{S}[W]))
  rate(X_count{S}[W])  -> histogram_count(rate(X{S}[W]))
  (increase() likewise)

and each heatmap of classic buckets (sum by (le) (increase(X_bucket...)))
turned into a time series of that histogram's p50, p90 and p99. Everything
else (variables, gauges, counters, layout) is the classic dashboard's.

Usage: scripts/native-dashboard.py [--check]
  --check  exit 1 (and say so) when the committed file differs from what
           this script writes; tests/monitoring/dashboard_test.py runs it.
"""
import copy
import json
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CLASSIC = os.path.join(SRC, "docs", "grafana", "tokenmeter.json")
NATIVE = os.path.join(SRC, "docs", "grafana", "tokenmeter-native.json")

NAME = r"[\w${}:]+?"
SEL = r"\{[^}]*\}"
RANGE = r"\[[^\]]+\]"
# sum by (..., le, ...) (rate|increase(X_bucket{S}[W]))
BUCKET_SUM = re.compile(
    r"sum by \(([^)]*)\) \((rate|increase)\((" + NAME + r")_bucket(" + SEL +
    RANGE + r")\)\)")
# rate|increase(X_sum|X_count{S}[W])
SUM_COUNT = re.compile(
    r"\b(rate|increase)\((" + NAME + r")_(sum|count)(" + SEL + RANGE + r")\)")
HEATMAP_TARGET = re.compile(
    r"^sum by \(le\) \(increase\((" + NAME + r")_bucket(" + SEL + r")" +
    RANGE + r"\)\)$")


def native_bucket_sum(m):
    by = [x.strip() for x in m.group(1).split(",") if x.strip() != "le"]
    if len(by) == len(m.group(1).split(",")):
        raise ValueError("a _bucket sum without le: " + m.group(0))
    head = f"sum by ({', '.join(by)}) " if by else "sum"
    return f"{head}({m.group(2)}({m.group(3)}{m.group(4)}))"


def rewrite(expr, histograms):
    out = BUCKET_SUM.sub(native_bucket_sum, expr)

    def sum_count(m):
        if m.group(2) not in histograms:
            return m.group(0)  # not a histogram's: left alone
        return (f"histogram_{m.group(3)}({m.group(1)}"
                f"({m.group(2)}{m.group(4)}))")
    out = SUM_COUNT.sub(sum_count, out)
    if "_bucket" in out:
        raise ValueError("a _bucket query this script cannot rewrite: " +
                         expr)
    return out


def heatmap_to_quantiles(panel):
    """A classic-bucket heatmap as a time series of p50, p90 and p99."""
    alternatives = []
    for part in panel["targets"][0]["expr"].split("\nor\n"):
        m = HEATMAP_TARGET.match(part.strip())
        if not m:
            raise ValueError("unexpected heatmap target: " + part)
        alternatives.append((m.group(1), m.group(2)))
    out = {k: v for k, v in panel.items() if k not in ("options", "type")}
    out["type"] = "timeseries"
    out["description"] = (panel.get("description", "") +
                          " Native edition: p50, p90 and p99 of the native "
                          "histogram instead of a heatmap of classic "
                          "buckets.").strip()
    unit = panel.get("options", {}).get("yAxis", {}).get("unit", "short")
    out["fieldConfig"] = {
        "defaults": {
            "unit": unit,
            "custom": {"drawStyle": "line", "lineWidth": 1,
                       "fillOpacity": 10, "showPoints": "never",
                       "spanNulls": False},
            "color": {"mode": "palette-classic"}},
        "overrides": []}
    out["options"] = {
        "legend": {"displayMode": "list", "placement": "bottom",
                   "showLegend": True, "calcs": []},
        "tooltip": {"mode": "multi", "sort": "desc"}}
    base = panel["targets"][0]
    out["targets"] = []
    for ref, q in zip("ABC", ("0.5", "0.9", "0.99")):
        t = {k: v for k, v in base.items()
             if k not in ("format", "legendFormat", "refId", "expr")}
        t["expr"] = "\nor\n".join(
            f"histogram_quantile({q}, sum(rate({name}{sel}"
            "[$__rate_interval])))" for name, sel in alternatives)
        t["legendFormat"] = "p" + q[2:].ljust(2, "0")
        t["refId"] = ref
        out["targets"].append(t)
    return out


def build(classic):
    exprs = [t["expr"] for p in classic["panels"]
             for t in p.get("targets", [])]
    histograms = set()
    for e in exprs:
        histograms.update(m.group(3) for m in BUCKET_SUM.finditer(e))
    d = copy.deepcopy(classic)
    d["uid"] = classic["uid"] + "-native"
    d["title"] = classic["title"] + " (native histograms)"
    d["description"] = (
        "tokenmeterd's dashboard for a Prometheus that stores its histograms "
        "as native histograms (protobuf scrapes with "
        "--enable-feature=native-histograms): every histogram panel reads "
        "the native series; generated from tokenmeter.json by "
        "scripts/native-dashboard.py.")
    d["tags"] = classic["tags"] + ["native-histograms"]
    panels = []
    for p in d["panels"]:
        if p.get("type") == "heatmap" and "_bucket" in json.dumps(
                p.get("targets", [])):
            panels.append(heatmap_to_quantiles(p))
            continue
        native = False
        for t in p.get("targets", []):
            before = t["expr"]
            t["expr"] = rewrite(t["expr"], histograms)
            native |= "_bucket" in before
        if native:
            # The classic text names bucket bounds the native series do
            # not have.
            p["description"] = (
                p.get("description", "") +
                " Native edition: from the native histogram, whose "
                "exponential buckets replace the classic bounds (any "
                "named above).").strip()
        panels.append(p)
    d["panels"] = panels
    return d


def render(d):
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def main(argv):
    with open(CLASSIC) as f:
        text = render(build(json.load(f)))
    if argv[1:] == ["--check"]:
        try:
            with open(NATIVE) as f:
                same = f.read() == text
        except OSError:
            same = False
        if not same:
            print(f"{NATIVE} is not what scripts/native-dashboard.py writes "
                  "from tokenmeter.json: run it", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    with open(NATIVE, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
