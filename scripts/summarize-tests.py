#!/usr/bin/python3
"""Prints 'N passed, N failed, N skipped' from meson's testlog.json.

Usage: summarize-tests.py BUILD_DIR [EXTRA_RESULTS]. EXTRA_RESULTS, if it
exists, holds more results, one "name ok|FAILED" per line (the fuzz smoke's,
from scripts/test.sh). Exits 1 when a test failed or the log is missing,
else 0. Lists failed tests by name on the lines before.
"""
import json
import sys

PASS = {"OK", "EXPECTEDFAIL"}
SKIP = {"SKIP"}


def main() -> int:
    path = f"{sys.argv[1]}/meson-logs/testlog.json"
    passed = failed = skipped = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                result, name = record["result"], record["name"]
                if result in PASS:
                    passed += 1
                elif result in SKIP:
                    skipped += 1
                else:
                    failed += 1
                    print(f"FAILED: {name} ({result})")
    except FileNotFoundError:
        print(f"no test log at {path}")
        print("0 passed, 1 failed")
        return 1
    if len(sys.argv) > 2:
        try:
            with open(sys.argv[2], encoding="utf-8") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) != 2:
                        continue
                    if parts[1] == "ok":
                        passed += 1
                    else:
                        failed += 1
                        print(f"FAILED: {parts[0]} ({parts[1]})")
        except FileNotFoundError:
            pass
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
