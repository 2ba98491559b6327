#!/usr/bin/python3
"""`meson install --destdir` of this build, checked as an installed system
would use it (docs/operations.md, "Install layout"):

* Layout: the exact file list (the Python package's files aside, which its
  own tests check); the units, sysusers.d and tmpfiles.d files where the
  systemd of this prefix looks, so that with a prefix other than /usr
  nothing lands outside it (no /lib/systemd/system); ExecStart and the
  --config file it names where the daemon and the example got installed.
* The example configuration lists every key of tokenmeterd --help at its
  default, and the daemon accepts it with every setting uncommented.
* pkg-config: `--libs` works without libmsgpack-dev's .pc; `--static`
  adds -lstdc++; a C program compiles and links against the installed
  library both dynamically and statically, and runs.

Usage: install_test.py BUILD_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

BUILD = ""

PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <tokenmeter/tokenmeter.h>

int main(int argc, char** argv) {
  tm_options* o = tm_options_new();
  tm_client* c = NULL;
  uint64_t stats[TM_STAT_COUNT];
  int rc;
  if (o == NULL || argc != 2) return 1;
  tm_options_set_socket_path(o, argv[1]); /* nobody listens: buffered */
  tm_options_set_model(o, "m");
  tm_options_set_close_timeout_ms(o, 0);
  if (tm_client_new(o, &c) != TM_OK) return 1;
  tm_options_free(o);
  tm_arrived(c, 0, 1, 10, 20, 1);
  tm_tokens(c, 0, 1, 1);
  rc = tm_client_close(c, stats, TM_STAT_COUNT);
  printf("libtokenmeter %s close=%s dropped=%llu\n", tm_version(),
         tm_strerror(rc), (unsigned long long)stats[TM_STAT_EVENTS_DROPPED]);
  return strcmp(tm_version(), "") == 0;
}
"""


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 300)
    return subprocess.run(cmd, **kw)


def options():
    r = run(["meson", "introspect", "--buildoptions", BUILD], check=True)
    return {o["name"]: o["value"] for o in json.loads(r.stdout)}


def under(prefix, d):
    return os.path.normpath(os.path.join(prefix, d))


def systemd_dir(prefix, var, define, fallback):
    """What systemd/meson.build computes (see there)."""
    if run(["pkg-config", "--exists", "systemd"]).returncode != 0:
        return under(prefix, fallback)
    own = run(["pkg-config", "--variable=prefix", "systemd"]).stdout.strip()
    if own == prefix:
        return run(["pkg-config", f"--variable={var}", "systemd"]
                   ).stdout.strip()
    d = run(["pkg-config", f"--define-variable={define}={prefix}",
             f"--variable={var}", "systemd"]).stdout.strip()
    return d if d.startswith(prefix + "/") else under(prefix, fallback)


class Installed(unittest.TestCase):  # one install for every check
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tm-install-", dir="/tmp")
        cls.dest = os.path.join(cls.tmp, "dest")
        r = run(["meson", "install", "-C", BUILD, "--no-rebuild", "--quiet",
                 "--destdir", cls.dest])
        if r.returncode != 0:
            shutil.rmtree(cls.tmp, True)
            raise AssertionError("meson install failed:\n" + r.stdout +
                                 r.stderr)
        cls.opt = options()
        p = cls.opt["prefix"]
        cls.dirs = {k: under(p, cls.opt[k]) for k in (
            "bindir", "sbindir", "libdir", "includedir", "datadir",
            "mandir", "sysconfdir")}
        cls.unitdir = systemd_dir(p, "systemdsystemunitdir", "rootprefix",
                                  "lib/systemd/system")
        cls.sysusersdir = systemd_dir(p, "sysusersdir", "prefix",
                                      "lib/sysusers.d")
        cls.tmpfilesdir = systemd_dir(p, "tmpfilesdir", "prefix",
                                      "lib/tmpfiles.d")
        cls.files = set()
        for root, _, names in os.walk(cls.dest):
            for n in names:
                cls.files.add("/" + os.path.relpath(os.path.join(root, n),
                                                    cls.dest))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    def path(self, installed):
        return os.path.join(self.dest, installed.lstrip("/"))

    def man_pages_built(self):
        return os.path.exists(os.path.join(BUILD, "docs", "man",
                                           "tokenmeterd.8"))

    def expected(self):
        d = self.dirs
        lib = d["libdir"]
        files = {
            f"{d['sbindir']}/tokenmeterd",
            f"{d['bindir']}/tokenmeter-engine",
            f"{d['bindir']}/tokenmeter-sglang",
            f"{lib}/libtokenmeter.so", f"{lib}/libtokenmeter.so.0",
            f"{lib}/libtokenmeter.so.0.1.0", f"{lib}/libtokenmeter.a",
            f"{lib}/pkgconfig/tokenmeter.pc",
            f"{self.unitdir}/tokenmeterd.service",
            f"{self.unitdir}/tokenmeterd.socket",
            f"{self.unitdir}/tokenmeterd-http.socket",
            f"{self.sysusersdir}/tokenmeter.conf",
            f"{self.tmpfilesdir}/tokenmeter.conf",
            f"{d['sysconfdir']}/tokenmeter/tokenmeterd.conf",
            f"{d['datadir']}/tokenmeter/grafana/tokenmeter.json",
            f"{d['datadir']}/tokenmeter/grafana/tokenmeter-native.json",
            f"{d['datadir']}/tokenmeter/grafana/tokenmeter-fleet.json",
        }
        files |= {f"{d['includedir']}/tokenmeter/{h}" for h in (
            "tokenmeter.h", "client.hpp", "protocol.h")}
        files |= {f"{d['datadir']}/tokenmeter/prometheus/{y}" for y in (
            "prometheus.yml", "global.yml", "tokenmeter.rules.yml",
            "tokenmeter.alerts.yml")}
        files |= {f"{d['datadir']}/tokenmeter/prometheus/fleet/{y}" for y in (
            "agent.yml", "host.yml", "central.yml", "host.rules.yml",
            "fleet.rules.yml")}
        files |= {f"{d['datadir']}/tokenmeter/kubernetes/{y}" for y in (
            "namespace.yaml", "daemonset.yaml", "podmonitor.yaml",
            "sidecar.yaml", "servicemonitor.yaml", "prometheusrule.yaml")}
        if self.man_pages_built():
            files |= {f"{d['mandir']}/man8/tokenmeterd.8",
                      f"{d['mandir']}/man1/tokenmeter-engine.1",
                      f"{d['mandir']}/man3/tokenmeter.3",
                      f"{d['mandir']}/man1/tokenmeter-sglang.1"}
        return files

    def test_file_list(self):
        python = {f for f in self.files
                  if re.search(r"/(dist|site)-packages/tokenmeter/", f)}
        self.assertTrue(any(f.endswith("/tokenmeter/__init__.py")
                            for f in python), sorted(self.files))
        others = self.files - python
        expected = self.expected()
        self.assertEqual(sorted(expected - others), [], "missing")
        self.assertEqual(sorted(others - expected), [], "not expected")

    def test_nothing_outside_the_prefix_but_sysconfdir(self):
        prefix = self.opt["prefix"]
        if prefix == "/usr":
            self.skipTest("prefix /usr: the distribution's own paths")
        outside = [f for f in self.files if not f.startswith(prefix + "/")
                   and not f.startswith(self.dirs["sysconfdir"] + "/")]
        self.assertEqual(outside, [])
        self.assertFalse(any(f.startswith("/lib/") for f in self.files))

    def test_exec_start_runs_the_installed_daemon_and_config(self):
        with open(self.path(f"{self.unitdir}/tokenmeterd.service")) as f:
            unit = f.read()
        self.assertEqual(re.findall(r"@[a-z_]+@", unit), [])
        lines = [l for l in unit.splitlines() if l.startswith("ExecStart=")]
        self.assertEqual(len(lines), 1, lines)
        argv = lines[0][len("ExecStart="):].split()
        self.assertEqual(argv[0], f"{self.dirs['sbindir']}/tokenmeterd")
        self.assertIn(argv[0], self.files)
        self.assertTrue(os.access(self.path(argv[0]), os.X_OK))
        self.assertEqual(argv[1], "--config")
        self.assertEqual(argv[2],
                         f"{self.dirs['sysconfdir']}/tokenmeter/"
                         "tokenmeterd.conf")
        self.assertIn(argv[2], self.files)
        # The state directory systemd makes (StateDirectory=tokenmeter).
        self.assertEqual(argv[3:], ["--state-dir", "${STATE_DIRECTORY}",
                                    "$TOKENMETERD_ARGS"])
        self.assertIn("\nStateDirectory=tokenmeter\n", unit)

    def test_installed_man_pages_are_the_generated_ones(self):
        if not self.man_pages_built():
            self.skipTest("man pages not built (scdoc missing)")
        with open(self.path(f"{self.dirs['mandir']}/man8/tokenmeterd.8"),
                  encoding="utf-8") as f:
            self.assertIn('.TH "tokenmeterd" "8"', f.read())


    def pkg_config(self, *args):
        pcdir = self.path(f"{self.dirs['libdir']}/pkgconfig")
        # Only the installed .pc: no msgpack.pc, as on a host without
        # libmsgpack-dev.
        env = dict(os.environ, PKG_CONFIG_LIBDIR=pcdir,
                   PKG_CONFIG_SYSROOT_DIR=self.dest)
        env.pop("PKG_CONFIG_PATH", None)
        r = run(["pkg-config", *args, "tokenmeter"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.split()

    def test_libs_need_no_other_package(self):
        self.assertEqual(self.pkg_config("--print-requires-private"), [])
        self.assertEqual(self.pkg_config("--print-requires"), [])
        libs = self.pkg_config("--libs")
        self.assertIn("-ltokenmeter", libs)
        self.assertIn("-L" + self.path(self.dirs["libdir"]), libs)
        static = self.pkg_config("--static", "--libs")
        self.assertIn("-lstdc++", static)
        self.assertTrue({"-pthread", "-lpthread"} & set(static), static)
        self.assertEqual([x for x in static if "msgpack" in x], [])

    def compile(self, name, libs):
        src = os.path.join(self.tmp, "prog.c")
        with open(src, "w") as f:
            f.write(PROGRAM)
        out = os.path.join(self.tmp, name)
        r = run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", src,
                 *self.pkg_config("--cflags"), "-o", out, *libs])
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def needed(self, binary):
        r = run(["readelf", "-d", binary], check=True)
        return re.findall(r"\(NEEDED\).*\[(.*)\]", r.stdout)

    def check_runs(self, binary, env=None):
        r = run([binary, os.path.join(self.tmp, "nobody.sock")],
                env=env, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"^libtokenmeter \d+\.\d+\.\d+ close=")

    def test_c_program_links_dynamically(self):
        exe = self.compile("prog-dynamic", self.pkg_config("--libs"))
        self.assertIn("libtokenmeter.so.0", self.needed(exe))
        self.check_runs(exe, dict(os.environ, LD_LIBRARY_PATH=self.path(
            self.dirs["libdir"])))

    def test_c_program_links_statically(self):
        libs = self.pkg_config("--static", "--libs")
        libs = [a if a != "-ltokenmeter" else
                "-Wl,-Bstatic,-ltokenmeter,-Bdynamic" for a in libs]
        exe = self.compile("prog-static", libs)
        self.assertFalse([n for n in self.needed(exe) if "tokenmeter" in n])
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        self.check_runs(exe, env)


class ExampleConfig(unittest.TestCase):
    """systemd/tokenmeterd.conf: "#key = value" lines are settings at their
    defaults (or an example value where there is no default), "# " lines
    commentary."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = os.path.join(BUILD, "daemon", "tokenmeterd")
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "..", "..", "systemd", "tokenmeterd.conf"),
                  encoding="utf-8") as f:
            cls.text = f.read()
        cls.settings = re.findall(r"^#([a-z][a-z0-9._-]*) = (.*)$",
                                  cls.text, re.M)
        cls.help = run([cls.daemon, "--help"], check=True).stdout

    def help_entries(self):
        """flag name -> its help text (continuation lines joined)."""
        entries, name = {}, None
        for line in self.help.splitlines():
            m = re.match(r"^  --([a-z][a-z0-9-]*)(.*)$", line)
            if m:
                name = m.group(1)
                entries[name] = m.group(2)
            elif name and line.startswith("    "):
                entries[name] += " " + line.strip()
            else:
                name = None
        return entries

    def test_every_key_once_and_no_other(self):
        keys = [k for k, _ in self.settings if not k.startswith("buckets.")]
        flags = set(self.help_entries()) - {"config", "help", "version"}
        self.assertEqual(sorted(flags - set(keys)), [], "keys missing")
        self.assertEqual(sorted(set(keys) - flags), [], "unknown keys")
        self.assertEqual(len(keys), len(set(keys)), "a key twice")

    def test_values_are_the_help_defaults(self):
        values = dict(self.settings)
        checked = 0
        for name, text in self.help_entries().items():
            m = re.search(r"\(default ([^\s,:)]+)[,)]", text)
            if m and name in values:
                self.assertEqual(values[name], m.group(1), name)
                checked += 1
        self.assertGreater(checked, 15)

    def write(self, text):
        fd, path = tempfile.mkstemp(prefix="tm-conf-", suffix=".conf",
                                    dir="/tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.addCleanup(os.unlink, path)
        return path

    def test_the_daemon_reads_it_as_installed_and_uncommented(self):
        as_installed = self.write(self.text)
        r = run([self.daemon, "--config", as_installed, "--version"])
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        uncommented = self.write(re.sub(r"^#([a-z])", r"\1", self.text,
                                        flags=re.M))
        r = run([self.daemon, "--config", uncommented, "--version"])
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        # ... and it was read: a bad key in the same place fails.
        bad = self.write(self.text + "no-such-key = 1\n")
        r = run([self.daemon, "--config", bad, "--version"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no-such-key", r.stderr)


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv.pop(1))
    tu.main()
