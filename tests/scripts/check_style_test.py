#!/usr/bin/python3
"""scripts/check-style.sh's base on throwaway git repositories: a copy of
the script, .clang-format and .clang-tidy, committed as the fake
origin/main, then two commits: the first adds daemon/a_early.cpp, badly
formatted and with a clang-tidy finding (0 for a null pointer), the second
a clean daemon/b_late.cpp. By default the base is the start of the change
(the merge base with origin/main): both commits are checked, so both
findings of the earlier commit are reported. Without origin/main, or with
HEAD on it, the base is HEAD~1 as before, and the change is clean; BASE
and TOKENMETER_STYLE_BASE override the default, BASE first.
TOKENMETER_TIDY_MAX_FILES caps clang-tidy and names what it skipped.

clang-tidy runs on the two small files with a compile_commands.json of
their own (well under a second each). Exits 77 (skipped) without
clang-format-14, clang-tidy-14 or clang-tidy-diff-14.py, or without git.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

TOOLS = ("git", "clang-format-14", "clang-tidy-14", "clang-tidy-diff-14.py")
EARLY = "daemon/a_early.cpp"
LATE = "daemon/b_late.cpp"
# Not as clang-format writes it, and `int* p = 0` (modernize-use-nullptr).
BAD = "int  F( ) {int* p = 0; return p == nullptr;}\n"
CLEAN = "int G() { return 2; }\n"


class Repo:
    """A git repository in a temp dir with the style files committed as
    origin/main (refs/remotes/origin/main, no remote)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tm-style-", dir="/tmp")
        self.git("init", "-q", "-b", "main")
        os.makedirs(os.path.join(self.dir, "scripts"))
        for path in ("scripts/check-style.sh", ".clang-format",
                     ".clang-tidy"):
            shutil.copy(os.path.join(SRC, path), os.path.join(self.dir, path))
        self.start = self.commit("the style files")
        self.git("update-ref", "refs/remotes/origin/main", self.start)
        # clang-tidy's compile database, outside the repository's files.
        db = [{"directory": self.dir, "file": f,
               "arguments": ["c++", "-std=c++17", "-c", f]}
              for f in (EARLY, LATE)]
        os.makedirs(os.path.join(self.dir, ".build"))
        self.write(".build/compile_commands.json", json.dumps(db))
        self.write(".git/info/exclude", ".build/\n")

    def git(self, *args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=self.dir, check=True, capture_output=True,
            text=True).stdout.strip()

    def write(self, path, text):
        path = os.path.join(self.dir, path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def commit(self, message, **files):
        for path, text in files.items():
            self.write(path, text)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def check(self, *args, **env):
        """(exit code, output) of the repository's check-style.sh."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("TOKENMETER_STYLE_BASE",
                            "TOKENMETER_TIDY_MAX_FILES")} | env
        p = subprocess.run(
            [os.path.join(self.dir, "scripts/check-style.sh"), "-p",
             os.path.join(self.dir, ".build"), *args], env=env,
            capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout + p.stderr


class BaseSelection(unittest.TestCase):
    def setUp(self):
        missing = [t for t in TOOLS if not shutil.which(t)]
        if missing:
            self.skipTest(f"not installed: {' '.join(missing)}")
        self.repo = Repo()
        self.addCleanup(shutil.rmtree, self.repo.dir, ignore_errors=True)
        self.repo.commit("early", **{EARLY: BAD})
        self.repo.commit("late", **{LATE: CLEAN})
        self.short = self.repo.git("rev-parse", "--short", self.repo.start)

    def assert_clean_last_commit(self, rc, out, why):
        self.assertEqual(rc, 0, out)
        self.assertIn(f"({why}): 1 commit and the working tree", out)
        self.assertIn("clang-format: 1 files changed since", out)
        self.assertIn("clang-tidy: 1 files changed since", out)
        self.assertNotIn(EARLY, out)

    def test_default_is_the_merge_base_and_finds_the_earlier_commit(self):
        rc, out = self.repo.check()
        self.assertEqual(rc, 1, out)
        self.assertIn(f"check-style: base {self.short} (the merge base of "
                      "HEAD and origin/main): 2 commits", out)
        self.assertIn("clang-format: FAILED", out)
        self.assertIn(f"{EARLY}:1:", out)  # clang-format's finding
        self.assertIn("[modernize-use-nullptr]", out)
        self.assertIn(f"clang-tidy: FAILED on 2 files ({EARLY} {LATE})",
                      out)

    def test_without_origin_main_the_last_commit(self):
        self.repo.git("update-ref", "-d", "refs/remotes/origin/main")
        rc, out = self.repo.check()
        self.assert_clean_last_commit(rc, out, "no origin/main: the last "
                                      "commit")

    def test_head_on_origin_main_the_last_commit(self):
        self.repo.git("update-ref", "refs/remotes/origin/main", "HEAD")
        rc, out = self.repo.check()
        self.assert_clean_last_commit(rc, out, "HEAD is on origin/main: "
                                      "the last commit")

    def test_environment_overrides_the_default(self):
        rc, out = self.repo.check(TOKENMETER_STYLE_BASE="HEAD~1")
        self.assert_clean_last_commit(rc, out, "TOKENMETER_STYLE_BASE")

    def test_argument_overrides_the_environment(self):
        rc, out = self.repo.check("HEAD~1",
                                  TOKENMETER_STYLE_BASE=self.repo.start)
        self.assert_clean_last_commit(rc, out, "given")
        self.assertIn("base HEAD~1 = ", out)

    def test_tidy_cap_names_the_files_it_skips(self):
        rc, out = self.repo.check(TOKENMETER_TIDY_MAX_FILES="1")
        self.assertEqual(rc, 1, out)
        self.assertIn("clang-tidy: TOKENMETER_TIDY_MAX_FILES=1: checking 1 "
                      f"of 2 changed files; NOT checked: {LATE}", out)
        self.assertIn(f"clang-tidy: FAILED on 1 files ({EARLY})", out)
        rc, out = self.repo.check(TOKENMETER_TIDY_MAX_FILES="0")
        self.assertEqual(rc, 2, out)
        self.assertIn("is not a count of files", out)


if __name__ == "__main__":
    tu.main()
