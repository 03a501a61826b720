"""Shared by the CPU tests of ci/: paths, the ci/ modules on sys.path, small builders."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
TESTS = os.path.dirname(os.path.abspath(__file__))
CI = os.path.dirname(TESTS)
ROOT = os.path.dirname(CI)
FAKES = os.path.join(TESTS, "fakes")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
# Where cargo puts its output: CARGO_TARGET_DIR (relative to where cargo ran: ci/test.sh runs
# it, and these tests, from the root) when set, else the workspace's target/.
TARGET = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target")
if CI not in sys.path:
    sys.path.insert(0, CI)


def fixture(*parts):
    return os.path.join(FIXTURES, *parts)


def read_fixture(*parts):
    with open(fixture(*parts), encoding="utf-8") as f:
        return f.read()


def run(cmd, env=None, timeout=120, cwd=ROOT):
    """Runs a command with PYTHONDONTWRITEBYTECODE; returns CompletedProcess (text)."""
    full = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    full.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


def have_cc():
    return shutil.which("cc") is not None


def build_so(directory, name, source, libs=(), soname=None):
    """cc -shared: a small ELF shared object (for the library checks)."""
    c = os.path.join(directory, name + ".c")
    with open(c, "w", encoding="utf-8") as f:
        f.write(source)
    out = os.path.join(directory, name)
    cmd = ["cc", "-shared", "-fPIC", "-o", out, c, "-L" + directory, "-Wl,--no-as-needed"]
    cmd += [f"-l{lib}" for lib in libs] + ["-Wl,-rpath," + directory]
    if soname:
        cmd.append("-Wl,-soname," + soname)
    subprocess.run(cmd, check=True, capture_output=True)
    return out


PLUGIN_LIKE = "int ncclNetPlugin_v8[64];\nint ncclNetPlugin_v12[64];\n"


def plugin_like_so(directory):
    """A library with NCCL's entry-point symbols and only libc NEEDED: passes elf_check."""
    return build_so(directory, "libnccl-net-fake.so", PLUGIN_LIKE)


def ibverbs_linked_so(directory):
    """Plugin-like, but linked against a stand-in libibverbs.so.1: elf_check must refuse it."""
    build_so(directory, "libibverbs.so", "int ibv_stand_in;\n", soname="libibverbs.so.1")
    os.symlink(os.path.join(directory, "libibverbs.so"), os.path.join(directory, "libibverbs.so.1"))
    return build_so(directory, "libnccl-net-bad.so", PLUGIN_LIKE, libs=["ibverbs"])


def tempdir(testcase):
    d = tempfile.mkdtemp(prefix="mpib-ci-")
    testcase.addCleanup(shutil.rmtree, d, True)
    return d
