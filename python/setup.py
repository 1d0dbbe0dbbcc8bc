"""Builds the bitroll package; its build_py step generates bitroll/wire with flatc.

The FlatBuffers Python code of the wire protocol is generated from the checkout's
schema/rollout.fbs (or $BITROLL_FBS) by flatc (or $BITROLL_FLATC) into the built package, never
into the source tree and never at import. The rest of the metadata is in pyproject.toml.

bitroll.torch's compiled module (bitroll_kernels_ext, built by CMake from python/ext) is copied
into the package when $BITROLL_KERNELS_EXT names the built file; without it bitroll.torch is
installed but importing it says how to get the module.
"""

import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError, FileError

HERE = os.path.dirname(os.path.abspath(__file__))


def find_schema():
    fbs = os.path.abspath(os.environ.get("BITROLL_FBS") or
                          os.path.join(HERE, "..", "schema", "rollout.fbs"))
    if not os.path.isfile(fbs):
        raise FileError(f"bitroll: the wire schema {fbs} is missing: install from a bitroll "
                        "checkout (pip install ./python) or set BITROLL_FBS to rollout.fbs")
    return fbs


def find_flatc():
    flatc = os.environ.get("BITROLL_FLATC") or shutil.which("flatc")
    if not flatc or not os.access(flatc, os.X_OK):
        raise ExecError("bitroll: flatc, the FlatBuffers compiler, was not found (needed to "
                        "generate bitroll/wire from schema/rollout.fbs): install the Debian "
                        "package flatbuffers-compiler (apt-get install flatbuffers-compiler) or "
                        "set BITROLL_FLATC to a flatc executable")
    return flatc


def generate_wire(package_dir):
    """Writes package_dir/wire: `flatc --python --gen-object-api` of the schema."""
    flatc, fbs = find_flatc(), find_schema()
    with tempfile.TemporaryDirectory(prefix="bitroll-flatc-") as tmp:
        run = subprocess.run([flatc, "--python", "--gen-object-api", "-o", tmp, fbs],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            raise ExecError(f"bitroll: {flatc} failed on {fbs}:\n{run.stdout}")
        dst = os.path.join(package_dir, "wire")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(os.path.join(tmp, "bitroll", "wire"), dst)
    return sorted(os.path.join(dst, f) for f in os.listdir(dst) if f.endswith(".py"))


class BuildPyWithWire(build_py):
    """build_py, then flatc into the built package (the source folder for an editable install)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            package_dir = os.path.join(HERE, "bitroll")
        else:
            package_dir = os.path.join(self.build_lib, "bitroll")
        self._wire = generate_wire(package_dir)
        ext = os.environ.get("BITROLL_KERNELS_EXT")
        if ext:
            if not os.path.isfile(ext):
                raise FileError(f"bitroll: BITROLL_KERNELS_EXT={ext} is not a file")
            dst = os.path.join(package_dir, "torch", os.path.basename(ext))
            shutil.copyfile(ext, dst)
            self._wire.append(dst)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + list(getattr(self, "_wire", []))


setup(packages=["bitroll", "bitroll.torch"], cmdclass={"build_py": BuildPyWithWire})
