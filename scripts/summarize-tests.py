#!/usr/bin/python3
"""Prints 'N passed, N failed, N skipped' from meson's testlog.json.

Usage: summarize-tests.py BUILD_DIR [EXTRA_RESULTS] [--also PREFIX=DIR]...

BUILD_DIR's meson-logs/testlog.json holds the main run. EXTRA_RESULTS, if
it exists, holds more results, one "name ok|FAILED" per line (the fuzz
smoke's and the style check's, from scripts/test.sh). Each --also adds the
testlog.json of another build dir (the sanitizer runs), its tests named
PREFIX/NAME; a missing log there counts as one failed test. Exits 1 when a
test failed or a log is missing, else 0. Lists failed tests by name on the
lines before.
"""
import argparse
import json
import sys

PASS = {"OK", "EXPECTEDFAIL"}
SKIP = {"SKIP"}


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def add(self, name, result):
        if result in PASS:
            self.passed += 1
        elif result in SKIP:
            self.skipped += 1
        else:
            self.failed += 1
            print(f"FAILED: {name} ({result})")


def read_testlog(build_dir, prefix, tally):
    """Adds the results of BUILD_DIR's testlog.json; False when missing."""
    path = f"{build_dir}/meson-logs/testlog.json"
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    tally.add(prefix + record["name"], record["result"])
    except FileNotFoundError:
        print(f"no test log at {path}")
        tally.add(f"{prefix}(test log)", "MISSING")
        return False
    return True


def read_extra(path, tally):
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    tally.add(parts[0], "OK" if parts[1] == "ok" else parts[1])
    except FileNotFoundError:
        pass


def also_arg(value):
    prefix, sep, build_dir = value.partition("=")
    if not sep or not prefix or not build_dir:
        raise argparse.ArgumentTypeError(f"want PREFIX=DIR, got {value!r}")
    return prefix, build_dir


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("extra_results", nargs="?")
    parser.add_argument("--also", type=also_arg, action="append", default=[],
                        metavar="PREFIX=DIR")
    args = parser.parse_args(argv)
    tally = Tally()
    if not read_testlog(args.build_dir, "", tally):
        print("0 passed, 1 failed")
        return 1
    if args.extra_results:
        read_extra(args.extra_results, tally)
    for prefix, build_dir in args.also:
        read_testlog(build_dir, prefix + "/", tally)
    print(f"{tally.passed} passed, {tally.failed} failed, "
          f"{tally.skipped} skipped")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
