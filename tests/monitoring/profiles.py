"""What the monitoring tests know about tokenmeterd's naming profiles.

* catalogs(): every engine series each profile exposes, read from the
  generated tables of docs/metrics.md (which tests/docs/ checks against
  daemon/store/profile.cpp).
* NOT_EXPORTED: the targets of docs/grafana/tokenmeter.json that have no
  data in a profile because the engine family it follows exports no such
  quantity (the panel descriptions say so too). dashboard_test.py checks
  statically that these, and only these, name no series of the profile;
  live_prometheus_test.py that these, and only these, return nothing.
"""
import re

PROFILES = ("vllm", "sglang", "lmdeploy")

# (panel title, refId) -> why, per profile.
NOT_EXPORTED = {
    "vllm": {},
    "sglang": {
        ("Mean time per phase", "B"): "no prefill-time histogram",
        ("Mean time per phase", "C"): "no decode-time histogram",
        ("Phase p99", "B"): "no prefill-time histogram",
        ("Phase p99", "C"): "no decode-time histogram",
        ("Phase p99", "D"): "no inference-time histogram",
        ("Preemptions", "A"): "no preemption counter",
        ("Acceptance rate by draft position", "A"):
            "no per-position acceptance",
        ("Requested max_tokens", "A"): "no max_tokens histogram",
        ("Tokens per engine step", "A"): "no per-iteration histogram",
    },
    "lmdeploy": {
        ("Preemptions", "A"): "no preemption counter",
        ("Requested max_tokens", "A"): "no max_tokens histogram",
    },
}


def catalogs(metrics_md):
    """{profile: {exposed sample name, histograms as _bucket/_sum/_count}}
    from the generated profile tables of docs/metrics.md (the vllm
    profile's --legacy-names rows included); and the daemon's own series
    names."""
    with open(metrics_md) as f:
        text = f.read()
    out = {}
    for profile in PROFILES:
        m = re.search(rf"<!-- BEGIN GENERATED: profile {profile} -->\n(.*?)"
                      rf"<!-- END GENERATED: profile {profile} -->", text,
                      re.S)
        if not m:
            raise AssertionError(f"no generated table of profile {profile} "
                                 "in docs/metrics.md")
        names = set()
        for name, kind in re.findall(
                r"^\| `[^:`]+:([a-z0-9_]+)`[^|]*\| (\w+) \|", m.group(1),
                re.M):
            if kind == "histogram":
                names |= {name + s for s in ("_bucket", "_sum", "_count")}
            else:
                names.add(name)
        out[profile] = names
    daemon = set(re.findall(r"^\| `((?:tokenmeter|process)_[a-z0-9_]+)` \|",
                            text, re.M))
    return out, daemon


def profile_of(namespace):
    """The profile of a live test's engine family (metric namespace)."""
    return namespace if namespace in ("sglang", "lmdeploy") else "vllm"


def alternatives(expr):
    """The engine series names of each `or` alternative of a target, the
    way the dashboard writes a quantity that profiles name differently
    (`A or B`, at any depth)."""
    return [re.findall(r"\$\{namespace\}:(\w+)", part)
            for part in re.split(r"\bor\b", expr)]


def names_in_profile(expr, names):
    """True when some alternative of expr names only series of `names`
    (an expression without engine series counts as one alternative)."""
    alts = [a for a in alternatives(expr) if a]
    if not alts:
        return True
    return any(all(n in names for n in alt) for alt in alts)
