"""`pip install ./python` into a fresh virtual environment, offline, and
`import kvharbor` from there with no PYTHONPATH and no KVHARBOR_LIB: the
package finds libkvharbor_c.so where `cmake --install` puts it (PREFIX/lib
next to PREFIX/bin/kvharbord on PATH), or inside the package when the
library was copied into python/kvharbor/ before the install. Then a call
against a real kvharbord.

Needs Debian's python3-venv, python3-pip and python3-setuptools
(scripts/install_deps.sh); nothing is downloaded (--no-index,
--no-build-isolation: the build uses the system's setuptools)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from daemon import Daemon

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import sys, kvharbor
c = kvharbor.Client(sys.argv[1], timeout=10)
c.wait_connected(10)
print(kvharbor.__file__)
print(kvharbor._native.library()._name)
print(len(c.list_namespaces()))
"""


class InstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lib = os.environ.get("KVHARBOR_LIB")
        cls.kvharbord = os.environ.get("KVHARBORD")
        if not cls.lib or not cls.kvharbord:
            raise RuntimeError("set KVHARBOR_LIB and KVHARBORD")
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvh_py_install_")
        self.addCleanup(shutil.rmtree, self.tmp)
        # A copy of python/: the build writes build/ and *.egg-info there.
        self.src = os.path.join(self.tmp, "python")
        shutil.copytree(os.path.join(REPO, "python"), self.src,
                        ignore=shutil.ignore_patterns(
                            "__pycache__", "build", "*.egg-info", "*.so"))
        self.venv = os.path.join(self.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                        "--without-pip", self.venv], check=True)
        self.python = os.path.join(self.venv, "bin", "python")

    def pip_install(self):
        r = subprocess.run([self.python, "-m", "pip", "install", "--no-index",
                            "--no-build-isolation", "--no-deps", "--quiet",
                            self.src], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout)

    def probe(self, path_dirs):
        env = {k: v for k, v in os.environ.items()
               if k not in ("KVHARBOR_LIB", "PYTHONPATH")}
        env["PATH"] = os.pathsep.join(path_dirs + ["/usr/bin", "/bin"])
        r = subprocess.run([self.python, "-c", PROBE, self.daemon.address],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, cwd=self.tmp, env=env)
        self.assertEqual(r.returncode, 0, r.stdout)
        return r.stdout.split("\n")[:3]

    def test_library_from_the_install_prefix(self):
        self.pip_install()
        prefix = os.path.join(self.tmp, "prefix")
        os.makedirs(os.path.join(prefix, "bin"))
        os.makedirs(os.path.join(prefix, "lib"))
        os.symlink(self.kvharbord, os.path.join(prefix, "bin", "kvharbord"))
        lib = os.path.join(prefix, "lib", "libkvharbor_c.so")
        shutil.copy(self.lib, lib)
        package, loaded, count = self.probe([os.path.join(prefix, "bin")])
        self.assertTrue(package.startswith(self.venv), package)
        self.assertEqual(loaded, lib)
        self.assertEqual(count, "0")

    def test_library_inside_the_package(self):
        shutil.copy(self.lib, os.path.join(self.src, "kvharbor"))
        self.pip_install()
        package, loaded, _ = self.probe([])
        self.assertTrue(package.startswith(self.venv), package)
        self.assertEqual(loaded, os.path.join(os.path.dirname(package),
                                              "libkvharbor_c.so"))


if __name__ == "__main__":
    unittest.main()
