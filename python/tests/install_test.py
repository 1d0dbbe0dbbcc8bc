"""The bitroll Python package as a user gets it: built by CMake, and installed with pip, offline.

Run by ctest (python_install_test) with /usr/bin/python3:
    install_test.py --source CHECKOUT --build-python BUILD/python

1. The build tree: PYTHONPATH=BUILD/python imports bitroll and its generated bitroll.wire from
   there, and a message survives encode -> decode.
2. No generation at import: the package without bitroll/wire fails to import with an ImportError
   that says how to build it, and runs no flatc (a fake flatc first on PATH records any call).
3. pip: `pip install --no-index --no-build-isolation` of a copy of the checkout's python/ and
   schema/ into a fresh venv (--system-site-packages: Debian's numpy, zmq, flatbuffers). From a
   folder outside the source tree, with the fake flatc first on PATH and no PYTHONPATH, bitroll
   and bitroll.wire come from the venv, flatc is not run, and messages round-trip.
4. Without flatc, the install fails and names the Debian package flatbuffers-compiler.
Without venv or pip the test fails and says which Debian package is missing (scripts/deps.sh
installs them). Exit status 0 = pass.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

# Runs in the interpreter under test: builds messages with the package and reads them back.
ROUND_TRIP = r'''
import os, sys
import numpy as np
import bitroll
from bitroll import messages, protocol as p
from bitroll.client import encode
from bitroll.wire.SubmitRollouts import SubmitRollouts
from bitroll.wire.Trajectory import TrajectoryT

print("bitroll", bitroll.__file__)
print("wire", bitroll.wire.__file__)
m = bitroll.submit_rollouts(7, [[1, 2, 3], "Once upon a time"], n=4,
                            params={"temperature": 0.7, "top_p": 0.9}, seed=2**64 - 1,
                            max_tokens=33, stop_ids=[5])
env = messages.decode(encode(p.Message.SubmitRollouts, m, 11, "client-x"))
s = messages.table(env, SubmitRollouts)
got = (env.MsgType(), env.RequestId(), env.ClientId(), s.GroupId(), s.N(), s.Seed(),
       s.MaxTokens(), s.Sampling().Temperature(), s.Sampling().TopP(), s.StopIdsAsNumpy().tolist(),
       s.Prompts(0).IdsAsNumpy().tolist(), s.Prompts(1).Text())
want = (p.Message.SubmitRollouts, 11, b"client-x", 7, 4, 2**64 - 1, 33, np.float32(0.7),
        np.float32(0.9), [5], [1, 2, 3], b"Once upon a time")
assert got == want, (got, want)

lps = np.array([-0.0, -1.2345678, -1e-40, -87.5, 0.0], np.float32)  # a subnormal, a signed zero
t = TrajectoryT()
t.groupId, t.promptIndex, t.sampleIndex, t.finish = 9, 2, 5, p.FinishReason.Stop
t.ids, t.logprobs, t.clientTag = [4, 400, 40000, 7, 2], lps, "tag"
env = messages.decode(encode(p.Message.Trajectory, t, 0, ""))
traj = messages.trajectory(messages.table(env, p.Trajectory))
assert (traj.group_id, traj.prompt_index, traj.sample_index, traj.finish, traj.client_tag) == \
    (9, 2, 5, "stop", "tag"), traj
assert traj.ids.dtype == np.int32 and traj.ids.tolist() == [4, 400, 40000, 7, 2], traj.ids
assert traj.logprobs.tobytes() == lps.tobytes(), (traj.logprobs.view(np.uint32),
                                                  lps.view(np.uint32))
try:
    messages.decode(b"\x00garbage")
    sys.exit("garbage decoded")
except bitroll.BitrollError as e:
    assert e.code == "protocol", e
print("round trip: OK")
'''


def fail(what):
    print("FAIL:", what, flush=True)
    sys.exit(1)


def run(cmd, **kw):
    print("$", " ".join(c if len(c) < 200 else c[:40] + "..." for c in cmd), flush=True)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def fake_flatc(tmp):
    """A folder with a `flatc` that records its call in a file and fails; (folder, record)."""
    d = os.path.join(tmp, "fakebin")
    os.mkdir(d)
    record = os.path.join(tmp, "flatc_was_called")
    with open(os.path.join(d, "flatc"), "w") as f:
        f.write(f"#!/bin/sh\necho \"$@\" >> '{record}'\nexit 1\n")
    os.chmod(os.path.join(d, "flatc"), 0o755)
    return d, record


def clean_env(path, pythonpath=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "BITROLL_FLATC", "BITROLL_FBS", "PYTHONHOME",
                        "VIRTUAL_ENV", "PIP_INDEX_URL", "PIP_FIND_LINKS")}
    env["PATH"] = path
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def check_build_tree(build_python, outside, fakebin, record):
    r = run(["/usr/bin/python3", "-c", ROUND_TRIP], cwd=outside,
            env=clean_env(fakebin + ":/usr/bin:/bin", build_python))
    print(r.stdout)
    if r.returncode != 0:
        fail(f"the build tree's package ({build_python}) does not work")
    if f"wire {os.path.join(build_python, 'bitroll', 'wire')}" not in r.stdout:
        fail("bitroll.wire was not imported from the build tree")
    if os.path.exists(record):
        fail("importing bitroll from the build tree ran flatc")


def check_import_guard(source, tmp, outside, fakebin, record):
    bare = os.path.join(tmp, "bare")
    shutil.copytree(os.path.join(source, "python", "bitroll"), os.path.join(bare, "bitroll"),
                    ignore=shutil.ignore_patterns("wire", "__pycache__"))
    r = run(["/usr/bin/python3", "-c", "import bitroll"], cwd=outside,
            env=clean_env(fakebin + ":/usr/bin:/bin", bare))
    print(r.stdout)
    if r.returncode == 0 or "ImportError" not in r.stdout:
        fail("the package without bitroll/wire imported (or failed without an ImportError)")
    for words in ("bitroll.wire is missing", "bitroll_python", "pip install ./python",
                  "flatbuffers-compiler"):
        if words not in r.stdout:
            fail(f"the ImportError does not say {words!r}")
    if os.path.exists(record):
        fail("importing bitroll without bitroll/wire ran flatc")


def copy_checkout(source, dst):
    """python/ and schema/ of the checkout (pip builds in the tree it is given: not the source)."""
    shutil.copytree(os.path.join(source, "python"), os.path.join(dst, "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "wire"))
    shutil.copytree(os.path.join(source, "schema"), os.path.join(dst, "schema"))
    return os.path.join(dst, "python")


def check_pip(source, tmp, outside, fakebin, record):
    venv = os.path.join(tmp, "venv")
    r = run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv])
    if r.returncode != 0:
        print(r.stdout)
        fail("FAILED LOUDLY: `python3 -m venv` does not work: install the Debian package "
             "python3-venv (scripts/deps.sh does)")
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
    r = run(pip + ["--version"])
    if r.returncode != 0:
        print(r.stdout)
        fail("FAILED LOUDLY: the venv has no pip: install the Debian package python3-pip "
             "(scripts/deps.sh does)")
    install = pip + ["install", "--no-index", "--no-build-isolation", "--disable-pip-version-check"]

    # Without flatc: a clear error naming the Debian package.
    src = copy_checkout(source, os.path.join(tmp, "checkout-noflatc"))
    r = run(install + [src], cwd=outside, env=clean_env(os.path.join(tmp, "empty")))
    print(r.stdout[-3000:])
    if r.returncode == 0:
        fail("pip install succeeded without flatc")
    if "flatbuffers-compiler" not in r.stdout:
        fail("the install error without flatc does not name flatbuffers-compiler")

    src = copy_checkout(source, os.path.join(tmp, "checkout"))
    r = run(install + [src], cwd=outside, env=clean_env(os.environ.get("PATH", "/usr/bin:/bin")))
    print(r.stdout[-3000:])
    if r.returncode != 0:
        fail("pip install of the checkout failed")
    if os.path.exists(os.path.join(source, "python", "bitroll", "wire")):
        print("note: the source tree has python/bitroll/wire (an editable install?)")

    r = run([os.path.join(venv, "bin", "python"), "-c", ROUND_TRIP], cwd=outside,
            env=clean_env(fakebin + ":/usr/bin:/bin"))
    print(r.stdout)
    if r.returncode != 0:
        fail("the installed package does not work")
    site = os.path.realpath(venv)
    for line in r.stdout.splitlines():
        if line.startswith(("bitroll ", "wire ")):
            path = os.path.realpath(line.split(" ", 1)[1])
            if not path.startswith(site + os.sep):
                fail(f"{line}: not from the venv {site}")
    if os.path.exists(record):
        fail("importing the installed bitroll ran flatc")
    return install, venv


TORCH_CHECK = """
import bitroll.torch as bt, torch
print("ext " + bt.ops.ext.__file__)
x = torch.ones(2, 3)
print("linear", bt.linear(x, torch.ones(4, 3)).tolist())
"""


def check_pip_torch(source, tmp, outside, build_python, install, venv):
    """pip install with BITROLL_KERNELS_EXT: bitroll.torch works from the venv alone."""
    built = sorted(glob.glob(os.path.join(build_python, "bitroll_kernels_ext*.so")))
    if not built or run(["/usr/bin/python3", "-c", "import torch"]).returncode != 0:
        print("skipped: needs the built bitroll_kernels_ext (pybind11-dev) and python3-torch")
        return
    src = copy_checkout(source, os.path.join(tmp, "checkout-torch"))
    env = clean_env(os.environ.get("PATH", "/usr/bin:/bin"))
    env["BITROLL_KERNELS_EXT"] = built[0]
    r = run(install + ["--force-reinstall", "--no-deps", src], cwd=outside, env=env)
    print(r.stdout[-2000:])
    if r.returncode != 0:
        fail("pip install with BITROLL_KERNELS_EXT failed")
    r = run([os.path.join(venv, "bin", "python"), "-c", TORCH_CHECK], cwd=outside,
            env=clean_env("/usr/bin:/bin"))
    print(r.stdout)
    if r.returncode != 0 or "linear [[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]" not in r.stdout:
        fail("bitroll.torch from the venv does not work")
    path = os.path.realpath(r.stdout.split("ext ", 1)[1].split()[0])
    if not path.startswith(os.path.realpath(venv) + os.sep):
        fail(f"bitroll_kernels_ext came from {path}, not the venv")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, help="the bitroll checkout")
    ap.add_argument("--build-python", required=True, help="<build>/python")
    a = ap.parse_args()
    source = os.path.abspath(a.source)
    with tempfile.TemporaryDirectory(prefix="bitroll-install-test-") as tmp:
        outside = os.path.join(tmp, "elsewhere")
        os.mkdir(outside)
        os.mkdir(os.path.join(tmp, "empty"))
        fakebin, record = fake_flatc(tmp)
        print("== 1. the build tree's package", flush=True)
        check_build_tree(os.path.abspath(a.build_python), outside, fakebin, record)
        print("== 2. no bitroll/wire: an ImportError, no flatc", flush=True)
        check_import_guard(source, tmp, outside, fakebin, record)
        print("== 3. pip install of the checkout, offline, into a venv", flush=True)
        install, venv = check_pip(source, tmp, outside, fakebin, record)
        print("== 4. pip install with the compiled bitroll.torch module", flush=True)
        check_pip_torch(source, tmp, outside, os.path.abspath(a.build_python), install, venv)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
