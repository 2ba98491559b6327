#!/usr/bin/env python3
"""The daemon's floors (docs/architecture.md, "Floors"): every folder of
daemon/ is one static library on a floor, and a file may include headers of
its own folder and of folders on lower floors only. This test holds the
floor map (the one place it is written) and checks against it:

  * every `#include "daemon/..."` of every file under daemon/;
  * the store's parts: only store/parts/ itself and the floors above the
    store include a part's header (the rest of the store knows the Part
    interface, store/part.h);
  * every daemon/<folder>/meson.build: the daemon_<folder>_dep libraries it
    names are of lower floors;
  * tests/daemon/ mirrors daemon/: tests/daemon/<path>/<name>_test.cpp tests
    daemon/<path>/<name>.{h,cpp}.

A folder the map does not name fails too (a new folder takes a floor here).
`--self-test` runs the checks on small made-up trees that break each rule.

Usage: floors_test.py SOURCE_ROOT | --self-test
"""
import os
import re
import sys
import tempfile

# The floor map. Floor 5 ("") is daemon/ itself: config, Daemon, main.
FLOORS = {
    "base": 0,
    "store": 1,
    "net": 1,
    "service": 1,
    "otlp": 1,
    "trace": 1,
    "exposition": 2,
    "http": 2,
    "state": 2,
    "tracing": 2,
    "otlp_metrics": 2,
    "ingest": 3,
    "logging": 3,
    "live": 3,
    "requests": 3,
    "pushing": 3,
    "pipeline": 4,
    "": 5,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"daemon/([^"]+)"', re.M)
# Folder names may hold underscores (otlp_metrics).
DEP = re.compile(r"\bdaemon_([a-z_]+)_dep\b")


def folder_of(rel):
    """daemon-relative path -> its folder ("" for daemon/ itself)."""
    return rel.split("/", 1)[0] if "/" in rel else ""


def check_includes(root):
    problems = []
    daemon = os.path.join(root, "daemon")
    for dirpath, _, files in os.walk(daemon):
        for name in sorted(files):
            if not name.endswith((".h", ".cpp")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, daemon)
            here = folder_of(rel)
            if here not in FLOORS:
                problems.append(f"daemon/{rel}: folder '{here}' has no floor "
                                "(add it to FLOORS in tests/daemon/"
                                "floors_test.py and to docs/architecture.md)")
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for target in INCLUDE.findall(text):
                there = folder_of(target)
                if there not in FLOORS:
                    problems.append(f"daemon/{rel} includes daemon/{target}: "
                                    f"folder '{there}' has no floor")
                elif there != here and FLOORS[there] >= FLOORS[here]:
                    problems.append(
                        f"daemon/{rel} includes daemon/{target}: "
                        f"{here or 'daemon'} (floor {FLOORS[here]}) may not "
                        f"include {there or 'daemon'} (floor {FLOORS[there]})")
                if (target.startswith("store/parts/") and here == "store"
                        and not rel.startswith("store/parts/")):
                    problems.append(
                        f"daemon/{rel} includes daemon/{target}: the store "
                        "knows parts through store/part.h only")
    return problems


def check_meson(root):
    problems = []
    daemon = os.path.join(root, "daemon")
    for here in sorted(FLOORS):
        if not here:
            continue
        path = os.path.join(daemon, here, "meson.build")
        if not os.path.exists(path):
            problems.append(f"daemon/{here}/meson.build: missing")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for there in sorted(set(DEP.findall(text))):
            if there == here:
                continue
            if there not in FLOORS:
                problems.append(f"daemon/{here}/meson.build names "
                                f"daemon_{there}_dep: no such floor")
            elif FLOORS[there] >= FLOORS[here]:
                problems.append(
                    f"daemon/{here}/meson.build depends on daemon_{there}_dep:"
                    f" {here} (floor {FLOORS[here]}) may not use {there} "
                    f"(floor {FLOORS[there]})")
    return problems


def check_mirror(root):
    problems = []
    tests = os.path.join(root, "tests", "daemon")
    for dirpath, _, files in os.walk(tests):
        for name in sorted(files):
            if not name.endswith("_test.cpp"):
                continue
            rel_dir = os.path.relpath(dirpath, tests)
            rel_dir = "" if rel_dir == "." else rel_dir
            base = name[:-len("_test.cpp")]
            candidates = [os.path.join(root, "daemon", rel_dir, base + ext)
                          for ext in (".cpp", ".h")]
            if not any(os.path.exists(c) for c in candidates):
                problems.append(
                    f"tests/daemon/{os.path.join(rel_dir, name)}: no "
                    f"daemon/{os.path.join(rel_dir, base)}.cpp or .h "
                    "(tests/daemon/ mirrors daemon/)")
    return problems


def check(root):
    return check_includes(root) + check_meson(root) + check_mirror(root)


def write(root, rel, text=""):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def good_tree(root):
    for here in FLOORS:
        if here:
            write(root, f"daemon/{here}/meson.build", "")
    write(root, "daemon/base/status.h")
    write(root, "daemon/store/registry.h", '#include "daemon/base/status.h"\n')
    write(root, "daemon/store/part.h")
    write(root, "daemon/store/parts/moe.h", '#include "daemon/store/part.h"\n')
    write(root, "daemon/ingest/tracker.cpp",
          '#include "daemon/store/parts/moe.h"\n'
          '#include "daemon/ingest/tracker.h"\n')
    write(root, "daemon/ingest/tracker.h")
    write(root, "daemon/ingest/meson.build",
          "deps = [daemon_store_dep, daemon_ingest_dep]\n")
    write(root, "daemon/daemon.cpp", '#include "daemon/ingest/tracker.h"\n')
    write(root, "tests/daemon/ingest/tracker_test.cpp")
    write(root, "tests/daemon/daemon_test.cpp")


def self_test():
    cases = [
        ("a clean tree", None, None),
        ("an upward include", "daemon/store/registry.h",
         '#include "daemon/ingest/tracker.h"\n'),
        ("a sideways include", "daemon/exposition/x.cpp",
         '#include "daemon/http/server.h"\n'),
        ("daemon/ below a folder", "daemon/base/x.h",
         '#include "daemon/config.h"\n'),
        ("the store including a part", "daemon/store/exposition_x.cpp",
         '#include "daemon/store/parts/moe.h"\n'),
        ("a folder without a floor", "daemon/otel/exporter.cpp", ""),
        ("an upward meson dependency", "daemon/store/meson.build",
         "deps = [daemon_ingest_dep]\n"),
        ("a test outside the mirror", "tests/daemon/ingest/nothing_test.cpp",
         ""),
    ]
    failed = 0
    for what, rel, text in cases:
        with tempfile.TemporaryDirectory() as root:
            good_tree(root)
            if rel is not None:
                write(root, rel, text)
            problems = check(root)
        ok = (not problems) if rel is None else len(problems) == 1
        print(f"{'ok' if ok else 'FAILED'}: {what}: {problems}")
        failed += not ok
    return 1 if failed else 0


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "--self-test":
        return self_test()
    problems = check(argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"floors: {len(problems)} problems")
        return 1
    print("floors: every include, meson dependency and test file agrees "
          "with the floor map")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
