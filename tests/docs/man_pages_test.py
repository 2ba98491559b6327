#!/usr/bin/python3
"""The man pages (docs/man/*.scd) against what they describe, so that they
cannot drift: every flag the built tokenmeterd and tokenmeter-engine list
in --help has an entry in the OPTIONS section of its page and every entry
there is in --help; the daemon's page has the flags
shared/design/interfaces.md fixes (its synopsis); tokenmeter(3) documents
every TM_API function of tokenmeter.h and no other; the generated pages
render without a groff warning (what lintian checks).

Usage: man_pages_test.py TOKENMETERD ENGINE HEADER SCD_DIR [PAGE ...]
(PAGE: the generated pages; without them the rendering check skips.)
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

DAEMON = ENGINE = HEADER = SCD_DIR = ""
PAGES = []

# A flag: "--name" or "-X".
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")


def help_flags(binary):
    """The flags of BINARY --help: those that start an option line (the
    text before the first run of two spaces), e.g. "  --ingest PATH   ...",
    "  -V, --version", "  --help, --version"."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    flags = set()
    for line in out.splitlines():
        if not re.match(r"^\s+-", line):
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        flags.update(FLAG.findall(head))
    return flags


def read(name):
    with open(os.path.join(SCD_DIR, name), encoding="utf-8") as f:
        return f.read()


def section(text, title):
    """The text of "# TITLE" up to the next top-level header."""
    m = re.search(r"^# %s\n(.*?)(?=^# |\Z)" % re.escape(title), text,
                  re.S | re.M)
    if not m:
        raise AssertionError(f"no section # {title}")
    return m.group(1)


def page_flags(text):
    """The flags the OPTIONS section defines: its unindented lines that
    start with a bold flag (*--ingest* _PATH_, *-V*, *--version*)."""
    flags = set()
    for line in section(text, "OPTIONS").splitlines():
        if line.startswith("*-"):
            flags.update(FLAG.findall(line.replace("*", " ")))
    return flags


class Flags(unittest.TestCase):
    def check(self, binary, page):
        in_help = help_flags(binary)
        in_page = page_flags(read(page))
        self.assertGreater(len(in_help), 5, in_help)
        self.assertEqual(sorted(in_help - in_page), [],
                         f"in {os.path.basename(binary)} --help but not in "
                         f"the OPTIONS of docs/man/{page}")
        self.assertEqual(sorted(in_page - in_help), [],
                         f"in the OPTIONS of docs/man/{page} but not in "
                         f"{os.path.basename(binary)} --help")

    def test_tokenmeterd_page_has_every_help_flag_and_no_other(self):
        self.check(DAEMON, "tokenmeterd.8.scd")

    def test_engine_page_has_every_help_flag_and_no_other(self):
        self.check(ENGINE, "tokenmeter-engine.1.scd")

    def test_synopses_have_the_fixed_interface(self):
        # shared/design/interfaces.md: these flags are the fixed ones.
        fixed = {
            "tokenmeterd.8.scd": [
                "--ingest", "--listen", "--log-interval", "--namespace",
                "--max-model-len", "--config", "--version", "--help"],
            "tokenmeter-engine.1.scd": [
                "--requests", "--rate", "--prompt-len", "--output-len",
                "--max-batch", "--seed", "--backend", "--metrics-socket",
                "--no-metrics", "--engine-name", "--model", "--instance",
                "--report"],
        }
        for page, flags in fixed.items():
            synopsis = set(FLAG.findall(
                section(read(page), "SYNOPSIS").replace("*", " ")))
            self.assertEqual(sorted(set(flags) - synopsis), [], page)


class CApi(unittest.TestCase):
    def test_every_tm_api_function_is_documented_and_no_other(self):
        with open(HEADER, encoding="utf-8") as f:
            header = f.read()
        declared = set(re.findall(r"TM_API\b[^;(]*?\b(tm_\w+)\s*\(", header))
        self.assertGreater(len(declared), 40, declared)
        text = read("tokenmeter.3.scd")
        # A definition: an unindented line naming the function in bold
        # before its parameters (*int tm_tokens*(...)).
        defined = set(re.findall(r"^\*(?:[^*\n]|\\\*)*?\b(tm_\w+)\*\(",
                                 text, re.M))
        mentioned = set(re.findall(r"\b(tm_\w+)\*?\(", text))
        self.assertEqual(sorted(declared - defined), [],
                         "TM_API functions without an entry in "
                         "docs/man/tokenmeter.3.scd")
        self.assertEqual(sorted(mentioned - declared), [],
                         "functions in docs/man/tokenmeter.3.scd that "
                         "tokenmeter.h does not declare")


class Rendering(unittest.TestCase):
    def test_pages_render_without_groff_warnings(self):
        if not PAGES:
            self.skipTest("the man pages were not built (scdoc missing)")
        if not shutil.which("man"):
            self.skipTest("man is not installed")
        for page in PAGES:
            # As lintian runs it (its groff-message check).
            r = subprocess.run(
                ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z",
                 page], capture_output=True, text=True, timeout=60,
                env=dict(os.environ, LC_ALL="C.UTF-8", MANROFFSEQ="",
                         MANWIDTH="80"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "", page)
            self.assertGreater(len(r.stdout), 1000, page)


if __name__ == "__main__":
    DAEMON, ENGINE, HEADER, SCD_DIR = (os.path.abspath(a)
                                       for a in sys.argv[1:5])
    PAGES = [os.path.abspath(a) for a in sys.argv[5:]
             if not a.startswith("-")]
    del sys.argv[1:]
    tu.main()
