#!/usr/bin/python3
"""Where `meson install` puts the Python package (from the build's
meson-info/intro-installed.json: nothing is installed): in a folder that
/usr/bin/python3 searches for the build's prefix (/usr:
/usr/lib/python3/dist-packages; /usr/local:
/usr/local/lib/python3.X/dist-packages, not lib/python3/dist-packages),
every file of the package in one folder, the extension beside the .py
files when /usr/bin/python3's headers (python3-dev) are there.

    install_dir_test.py BUILD_DIR

Skips (exit 77) for a prefix whose folders Debian's Python does not search
anyway (e.g. /opt/...), or without /usr/bin/python3.
"""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
PYTHON = "/usr/bin/python3"
PACKAGE_FILES = ("__init__.py", "__init__.pyi", "_common.py", "_lib.py",
                 "_native_client.py", "client.py", "py.typed")
INTEGRATION_FILES = ("__init__.py", "lmdeploy.py", "vllm.py")


def build_option(name):
    with open(os.path.join(BUILD, "meson-info",
                           "intro-buildoptions.json")) as f:
        return next(o["value"] for o in json.load(f) if o["name"] == name)


class InstallDir(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(BUILD, "meson-info",
                               "intro-installed.json")) as f:
            installed = json.load(f).values()
        cls.package = sorted(p for p in installed
                             if "/tokenmeter/" in p and "-packages/" in p)
        cls.prefix = build_option("prefix")

    def test_one_folder_with_every_file(self):
        # The package's folder, and its engine integrations beside it.
        folders = {os.path.dirname(p) for p in self.package}
        top = min(folders, key=len)
        self.assertEqual(folders, {top, os.path.join(top, "integrations")},
                         self.package)
        self.assertIn(os.path.join(top, "integrations", "__init__.py"),
                      self.package)
        names = {os.path.basename(p) for p in self.package
                 if os.path.dirname(p) == top}
        for f in PACKAGE_FILES:
            self.assertIn(f, names)
        # Every engine adapter in it.
        for f in INTEGRATION_FILES:
            self.assertIn(os.path.join(top, "integrations", f),
                          self.package)
        # The extension, beside the .py files, whenever python3-dev is there.
        native = [n for n in names if n.startswith("_native.")]
        headers = subprocess.run(
            [PYTHON, "-c", "import os, sysconfig; print(os.path.exists("
             "os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"],
            capture_output=True, text=True, check=True).stdout.strip()
        self.assertEqual(len(native), 1 if headers == "True" else 0, names)

    def test_folder_is_on_debians_python_path(self):
        site = os.path.dirname(os.path.dirname(self.package[0]))
        p = subprocess.run([PYTHON, "-c", "import sys; print('\\n'.join("
                            "sys.path))"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"}, check=True)
        self.assertIn(site, p.stdout.split("\n"),
                      f"{site} (prefix {self.prefix}) is not on "
                      f"{PYTHON}'s sys.path")
        self.assertNotEqual(site, "/usr/local/lib/python3/dist-packages")


if __name__ == "__main__":
    if not os.path.exists(PYTHON):
        tu.skip(f"no {PYTHON}")
    if build_option("prefix") not in ("/usr", "/usr/local"):
        tu.skip(f"prefix {build_option('prefix')}: Debian's Python searches "
                "only /usr and /usr/local")
    tu.main(sys.argv[:1])
