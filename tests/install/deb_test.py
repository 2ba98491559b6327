#!/usr/bin/python3
"""Builds the Debian packages from a copy of the source tree (what git
tracks, plus files it does not ignore) with `dpkg-buildpackage -us -uc -b`,
and checks them: each package's file list, the conffile, the maintainer
scripts (sysusers, the sockets enabled, the service not), the service's
ExecStart, the dependencies, that the extracted engine runs against the
extracted library and the Python module imports (both backends), and that
lintian reports no error.

Slow (a full build without tests, then lintian): suite 'packaging', run by
scripts/test.sh with the others. The build directory and the packages are
removed afterwards; TOKENMETER_DEB_OUT=DIR keeps a copy of the .deb files;
TOKENMETER_DEB_PREBUILT=DIR checks the packages in DIR instead of building.

Usage: deb_test.py SOURCE_DIR
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

SOURCE = ""
PACKAGES = ["tokenmeterd", "libtokenmeter0", "libtokenmeter-dev",
            "python3-tokenmeter", "tokenmeter-engine"]


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)


def multiarch():
    return run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"],
               check=True).stdout.strip()


def expected_files():
    """Package -> the files it must hold (documentation aside)."""
    lib = f"/usr/lib/{multiarch()}"
    prom = "/usr/share/tokenmeter/prometheus"
    return {
        "tokenmeterd": {
            "/usr/sbin/tokenmeterd",
            "/lib/systemd/system/tokenmeterd.service",
            "/lib/systemd/system/tokenmeterd.socket",
            "/lib/systemd/system/tokenmeterd-http.socket",
            "/usr/lib/sysusers.d/tokenmeter.conf",
            "/usr/lib/tmpfiles.d/tokenmeter.conf",
            "/etc/tokenmeter/tokenmeterd.conf",
            "/usr/share/tokenmeter/grafana/tokenmeter.json",
            "/usr/share/tokenmeter/grafana/tokenmeter-native.json",
            f"{prom}/prometheus.yml", f"{prom}/global.yml",
            f"{prom}/tokenmeter.rules.yml", f"{prom}/tokenmeter.alerts.yml",
            "/usr/share/tokenmeter/grafana/tokenmeter-fleet.json",
            *(f"{prom}/fleet/{y}" for y in (
                "agent.yml", "host.yml", "central.yml", "host.rules.yml",
                "fleet.rules.yml")),
            *(f"/usr/share/tokenmeter/kubernetes/{y}" for y in (
                "namespace.yaml", "daemonset.yaml", "podmonitor.yaml",
                "sidecar.yaml", "servicemonitor.yaml",
                "prometheusrule.yaml")),
            "/usr/share/man/man8/tokenmeterd.8.gz",
            "/usr/share/doc/tokenmeterd/README.md.gz",
            "/usr/share/doc/tokenmeterd/operations.md.gz",
            "/usr/share/doc/tokenmeterd/metrics.md.gz",
        },
        "libtokenmeter0": {
            f"{lib}/libtokenmeter.so.0", f"{lib}/libtokenmeter.so.0.1.0",
        },
        "libtokenmeter-dev": {
            "/usr/include/tokenmeter/tokenmeter.h",
            "/usr/include/tokenmeter/client.hpp",
            "/usr/include/tokenmeter/protocol.h",
            f"{lib}/libtokenmeter.so", f"{lib}/libtokenmeter.a",
            f"{lib}/pkgconfig/tokenmeter.pc",
            "/usr/share/man/man3/tokenmeter.3.gz",
        },
        "python3-tokenmeter": {
            "/usr/lib/python3/dist-packages/tokenmeter/__init__.py",
            "/usr/lib/python3/dist-packages/tokenmeter/integrations/"
            "sglang.py",
            "/usr/bin/tokenmeter-sglang",
            "/usr/share/man/man1/tokenmeter-sglang.1.gz",
        },
        "tokenmeter-engine": {
            "/usr/bin/tokenmeter-engine",
            "/usr/share/man/man1/tokenmeter-engine.1.gz",
        },
    }


def allowed_extra(package, path):
    """Files beyond the expected ones a package may hold."""
    if path in (f"/usr/share/doc/{package}/changelog.gz",
                f"/usr/share/doc/{package}/copyright"):
        return True
    if package == "python3-tokenmeter":
        # Whatever the Python package installs (its own tests check it).
        return path.startswith("/usr/lib/python3/dist-packages/tokenmeter")
    return False


class Packages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not shutil.which("dpkg-buildpackage"):
            raise unittest.SkipTest("dpkg-buildpackage is not installed "
                                    "(apt-get install devscripts)")
        cls.tmp = tempfile.mkdtemp(prefix="tm-deb-", dir="/tmp")
        prebuilt = os.environ.get("TOKENMETER_DEB_PREBUILT")
        if prebuilt:  # checks only, of packages built before
            for f in glob.glob(os.path.join(prebuilt, "*.deb")) + glob.glob(
                    os.path.join(prebuilt, "*.changes")) + glob.glob(
                    os.path.join(prebuilt, "*.buildinfo")):
                shutil.copy(f, cls.tmp)
        else:
            cls.build()
        cls.debs = {}
        for deb in glob.glob(os.path.join(cls.tmp, "*.deb")):
            if "-dbgsym_" not in deb:
                cls.debs[os.path.basename(deb).split("_")[0]] = deb
        out = os.environ.get("TOKENMETER_DEB_OUT")
        if out:
            os.makedirs(out, exist_ok=True)
            for deb in cls.debs.values():
                shutil.copy(deb, out)
        cls.changes = glob.glob(os.path.join(cls.tmp, "*.changes"))

    @classmethod
    def build(cls):
        src = os.path.join(cls.tmp, "tokenmeter")
        os.mkdir(src)
        listed = run(["git", "-C", SOURCE, "ls-files", "-z", "-co",
                      "--exclude-standard"])
        if listed.returncode != 0:
            raise AssertionError("not a git checkout: " + listed.stderr)
        for rel in sorted(set(listed.stdout.split("\0")) - {""}):
            full = os.path.join(SOURCE, rel)
            if not os.path.isfile(full):  # deleted, not yet committed
                continue
            os.makedirs(os.path.join(src, os.path.dirname(rel)),
                        exist_ok=True)
            shutil.copy2(full, os.path.join(src, rel))
        deps = run(["dpkg-checkbuilddeps"], cwd=src)
        if deps.returncode != 0:
            shutil.rmtree(cls.tmp, True)
            raise AssertionError("Build-Depends missing (scripts/"
                                 "install-deps.sh installs them): " +
                                 deps.stderr)
        jobs = os.cpu_count() or 2
        start = time.monotonic()
        # No -dbgsym packages: they are not what this checks, and cost time.
        env = dict(os.environ, DEB_BUILD_OPTIONS=" ".join(
            [os.environ.get("DEB_BUILD_OPTIONS", ""), "noautodbgsym"]).strip())
        build = run(["dpkg-buildpackage", "-us", "-uc", "-b", f"-j{jobs}"],
                    cwd=src, env=env)
        cls.build_s = time.monotonic() - start
        cls.log = build.stdout + build.stderr
        if build.returncode != 0:
            shutil.rmtree(cls.tmp, True)
            raise AssertionError("dpkg-buildpackage failed:\n" +
                                 cls.log[-6000:])
        print(f"dpkg-buildpackage -b -j{jobs}: {cls.build_s:.0f} s",
              flush=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    def contents(self, package):
        r = run(["dpkg-deb", "-c", self.debs[package]], check=True)
        files = set()
        for line in r.stdout.splitlines():
            mode, path = line.split()[0], line.split()[5]
            if not mode.startswith("d"):
                path = path[1:]  # ./usr/... -> /usr/...
                # dh_compress leaves small documents uncompressed.
                if path.startswith("/usr/share/doc/") and path.endswith(
                        ".md"):
                    path += ".gz"
                files.add(path)
        return files

    def control(self, package, name):
        d = os.path.join(self.tmp, "control-" + package)
        if not os.path.isdir(d):
            run(["dpkg-deb", "-e", self.debs[package], d], check=True)
        path = os.path.join(d, name)
        if not os.path.exists(path):
            return ""
        with open(path) as f:
            return f.read()

    def field(self, package, name):
        return run(["dpkg-deb", "-f", self.debs[package], name],
                   check=True).stdout.strip()

    def extract(self, *packages):
        root = os.path.join(self.tmp, "root-" + "-".join(packages))
        if not os.path.isdir(root):
            for p in packages:
                run(["dpkg-deb", "-x", self.debs[p], root], check=True)
        return root

    def test_every_package_is_built(self):
        self.assertEqual(sorted(self.debs), sorted(PACKAGES))
        self.assertEqual(len(self.changes), 1)

    def test_file_lists(self):
        for package, expected in expected_files().items():
            with self.subTest(package=package):
                files = self.contents(package)
                self.assertEqual(sorted(expected - files), [], "missing")
                extra = [f for f in files - expected
                         if not allowed_extra(package, f)]
                self.assertEqual(extra, [], "not expected")

    def test_symbols_file_lists_every_exported_symbol(self):
        # debian/libtokenmeter0.symbols names each symbol with the version
        # that added it; a new or lost one is a dpkg-gensymbols warning
        # here: add it with the coming version (or bump the soname).
        if not hasattr(self, "log"):
            self.skipTest("packages built before (no build log)")
        self.assertNotRegex(self.log, r"dpkg-gensymbols: warning")

    def test_example_config_is_a_conffile(self):
        self.assertEqual(self.control("tokenmeterd", "conffiles").split(),
                         ["/etc/tokenmeter/tokenmeterd.conf"])

    def test_sockets_enabled_service_socket_activated(self):
        postinst = self.control("tokenmeterd", "postinst")
        code = "\n".join(l for l in postinst.splitlines()
                         if not l.strip().startswith("#"))
        # The group (sysusers) before /run/tokenmeter (tmpfiles, owned by
        # it) before the sockets (SocketGroup=tokenmeter).
        order = [code.index("systemd-sysusers"),
                 code.index("systemd-tmpfiles"),
                 code.index("deb-systemd-invoke")]
        self.assertEqual(order, sorted(order))
        for sock in ("tokenmeterd.socket", "tokenmeterd-http.socket"):
            self.assertIn(f"deb-systemd-helper enable '{sock}'", code)
        self.assertRegex(code, r"deb-systemd-invoke start "
                               r"'tokenmeterd-http\.socket' "
                               r"'tokenmeterd\.socket'")
        # The service: enabled only if it was before, never started by the
        # package, restarted after an upgrade if it runs.
        self.assertIn("deb-systemd-helper debian-installed "
                      "'tokenmeterd.service'", code)
        self.assertNotRegex(code, r"invoke (start|restart) [^\n]*"
                                  r"tokenmeterd\.service")
        self.assertRegex(code, r"deb-systemd-invoke try-restart "
                               r"'tokenmeterd\.service' >")
        # An upgrade leaves the sockets alone (engines are never refused);
        # removing the package stops them.
        for script in ("preinst", "postinst"):
            self.assertNotRegex(self.control("tokenmeterd", script),
                                r"(restart|stop) [^\n]*\.socket'", script)
        self.assertRegex(self.control("tokenmeterd", "prerm"),
                         r'"\$1" = remove[^\n]*\n\s*deb-systemd-invoke stop '
                         r"'tokenmeterd-http\.socket' 'tokenmeterd\.socket'")

    def test_service_runs_the_packaged_daemon_and_config(self):
        root = self.extract("tokenmeterd")
        with open(os.path.join(
                root, "lib/systemd/system/tokenmeterd.service")) as f:
            unit = f.read()
        self.assertIn("\nExecStart=/usr/sbin/tokenmeterd --config "
                      "/etc/tokenmeter/tokenmeterd.conf --state-dir "
                      "${STATE_DIRECTORY} $TOKENMETERD_ARGS\n", unit)
        self.assertIn("\nStateDirectory=tokenmeter\n", unit)
        daemon = os.path.join(root, "usr/sbin/tokenmeterd")
        r = run([daemon, "--config",
                 os.path.join(root, "etc/tokenmeter/tokenmeterd.conf"),
                 "--version"], timeout=30)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertRegex(r.stdout, r"^tokenmeterd \d")

    def test_dependencies(self):
        version = self.field("libtokenmeter0", "Version")
        self.assertIn(f"libtokenmeter0 (= {version})",
                      self.field("libtokenmeter-dev", "Depends"))
        py = self.field("python3-tokenmeter", "Depends")
        self.assertIn(f"libtokenmeter0 (= {version})", py)
        self.assertRegex(py, r"(^|, )python3(:any)?( |,|$)")
        self.assertRegex(self.field("tokenmeter-engine", "Depends"),
                         r"libtokenmeter0 \(>= 0\.1\.0\)")
        self.assertNotIn("msgpack", self.field("libtokenmeter-dev",
                                               "Depends"))
        self.assertIn("systemd", self.field("tokenmeterd", "Depends"))

    def test_engine_runs_against_the_packaged_library(self):
        root = self.extract("libtokenmeter0", "tokenmeter-engine")
        lib = {"LD_LIBRARY_PATH": os.path.join(root, "usr/lib", multiarch())}
        binary = os.path.join(root, "usr/bin/tokenmeter-engine")
        engine = tu.Engine("--requests", "5", "--no-metrics", "--quiet",
                           binary=binary, report=None, env=lib)
        self.addCleanup(engine.cleanup)
        engine.start().wait(timeout=120)  # a non-zero exit fails
        r = run(["ldd", binary], env=dict(os.environ, **lib))
        self.assertIn(root, r.stdout)  # the extracted library, not another

    def test_python_module_imports_from_the_package(self):
        root = self.extract("libtokenmeter0", "python3-tokenmeter")
        site = os.path.join(root, "usr/lib/python3/dist-packages")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TOKENMETER_", "PYTHON"))}
        env.update(PYTHONPATH=site, LD_LIBRARY_PATH=os.path.join(
            root, "usr/lib", multiarch()))
        # The extension when it was built (python3-dev is a Build-Depends),
        # and the ctypes fallback on the packaged libtokenmeter.so.0.
        for backend in ("native", "ctypes"):
            with self.subTest(backend=backend):
                r = run(["/usr/bin/python3", "-c",
                         "import tokenmeter; print(tokenmeter.backend, "
                         "tokenmeter.__file__)"],
                        env=dict(env, TOKENMETER_BACKEND=backend),
                        cwd=self.tmp, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.split(), [
                    backend, os.path.join(site, "tokenmeter", "__init__.py")])

    def test_lintian_reports_no_error(self):
        if not shutil.which("lintian"):
            self.skipTest("lintian is not installed")
        # Every tag down to info, pedantic and experimental ones, printed
        # for the log; errors fail (README.md explains what is left).
        r = run(["lintian", "-EvIL", "+pedantic", "--tag-display-limit", "0",
                 self.changes[0]], timeout=900)
        print(r.stdout + r.stderr, flush=True)
        errors = [l for l in r.stdout.splitlines() if l.startswith("E:")]
        self.assertEqual(errors, [])
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    SOURCE = os.path.abspath(sys.argv.pop(1))
    tu.main()
