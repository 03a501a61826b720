"""ci/elf_check.py: recorded readelf/ldd output of the plugin, and live small libraries."""
import glob
import os
import platform
import sys
import unittest
from unittest import mock

import helpers  # first: puts ci/ on sys.path

import elf_check as ec  # noqa: E402

SCRIPT = os.path.join(helpers.CI, "elf_check.py")
LIB = "target/release/libnccl-net-mpib.so"


def recorded(build="plugin", **edits):
    """A runner answering readelf/ldd with the recorded output of a build of the plugin
    (`plugin`: cargo's on Debian 12, `release`: ci/release.sh's); `edits` maps a fixture
    suffix to a function changing its text."""
    files = {"-h": "readelf-h", "-d": "readelf-d", "-V": "readelf-V", "--dyn-syms": "readelf-dyn-syms"}

    def run(cmd):
        key = "ldd" if cmd[0] == "ldd" else files[cmd[1]]
        text = helpers.read_fixture("elf", f"{build}.{key}.txt")
        return edits.get(key, lambda t: t)(text)

    return run


class Recorded(unittest.TestCase):
    def test_the_plugin_as_built_on_debian_12(self):
        rep = ec.check(LIB, run=recorded(), host=False)
        self.assertEqual(rep.problems, [])
        self.assertEqual(rep.machine, "x86_64")
        self.assertEqual(rep.needed, ["libgcc_s.so.1", "libc.so.6", "ld-linux-x86-64.so.2"])
        self.assertEqual(rep.glibc, "GLIBC_2.34")
        self.assertEqual(rep.glibc_symbols, ["pthread_key_create", "pthread_key_delete", "pthread_setspecific"])
        self.assertEqual(rep.version_needs["libgcc_s.so.1"], ["GCC_3.0", "GCC_3.3", "GCC_4.2.0"])
        self.assertEqual(rep.plugin_symbols, [f"ncclNetPlugin_v{n}" for n in range(6, 13)])
        self.assertEqual(sorted(rep.ldd_resolved), ["libc.so.6", "libgcc_s.so.1"])
        text = rep.render()
        self.assertIn("glibc floor:    GLIBC_2.34 (needed by pthread_key_create", text)
        self.assertIn("verdict: loads on this host as it is", text)

    def test_libibverbs_needed_is_refused(self):
        add = lambda t: t.replace(" 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]", " 0x0000000000000001 (NEEDED)             Shared library: [libibverbs.so.1]\n 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]")  # noqa: E731
        missing = lambda t: t + "\tlibibverbs.so.1 => not found\n"  # noqa: E731
        rep = ec.check(LIB, run=recorded(**{"readelf-d": add, "ldd": missing}), host=False)
        self.assertIn("libibverbs.so.1 is NEEDED: RDMA libraries must be dlopened at run time, not linked", rep.problems)
        self.assertIn("libibverbs.so.1 not found by the dynamic loader (ldd)", rep.problems)
        self.assertIn("WILL NOT LOAD", rep.render())

    def test_host_glibc_older_than_the_floor(self):
        with mock.patch.object(ec, "host_glibc", return_value="2.31"), mock.patch.object(ec.platform, "machine", return_value="x86_64"):
            rep = ec.check(LIB, run=recorded(), use_ldd=False)
        self.assertEqual(rep.problems, ["needs GLIBC_2.34, this host has glibc 2.31"])
        with mock.patch.object(ec, "host_glibc", return_value="2.35"), mock.patch.object(ec.platform, "machine", return_value="x86_64"):
            self.assertEqual(ec.check(LIB, run=recorded(), use_ldd=False).problems, [])

    def test_other_machine(self):
        with mock.patch.object(ec.platform, "machine", return_value="aarch64"), mock.patch.object(ec, "host_glibc", return_value="2.39"):
            rep = ec.check(LIB, run=recorded(), use_ldd=False)
        self.assertEqual(rep.problems, ["built for x86_64, this host is aarch64"])

    def test_no_entry_points(self):
        strip = lambda t: "\n".join(line for line in t.splitlines() if "ncclNetPlugin" not in line)  # noqa: E731
        rep = ec.check(LIB, run=recorded(**{"readelf-dyn-syms": strip}), host=False, use_ldd=False)
        self.assertEqual(rep.plugin_symbols, [])
        self.assertIn("exports no ncclNetPlugin_v<N> symbol", rep.problems[0])

    def test_newer_glibc_version_wins(self):
        bump = lambda t: t.replace("  0x00f0:   Name: GLIBC_2.34  Flags: none  Version: 13", "  0x00f0:   Name: GLIBC_2.34  Flags: none  Version: 13\n  0x0110:   Name: GLIBC_2.38  Flags: none  Version: 16")  # noqa: E731
        self.assertEqual(ec.check(LIB, run=recorded(**{"readelf-V": bump}), host=False, use_ldd=False).glibc, "GLIBC_2.38")

    def test_version_order_is_numeric(self):
        names = ["GLIBC_2.14", "GLIBC_2.3.4", "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.4"]
        self.assertEqual(max(names, key=ec.version_key), "GLIBC_2.34")
        self.assertEqual(sorted(names, key=ec.version_key)[0], "GLIBC_2.2.5")
        self.assertIsNone(ec.max_glibc({"libgcc_s.so.1": ["GCC_3.0"]}))

    def test_ldd_parse(self):
        found, missing = ec.parse_ldd("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f00)\n\tlibfoo.so => not found\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f01)\n")
        self.assertEqual(found, {"libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6"})
        self.assertEqual(missing, ["libfoo.so"])


# What ci/release.sh allows a released x86_64 library to need.
RELEASE_NEEDED = ["libc.so.6", "libm.so.6", "libgcc_s.so.1", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                  "ld-linux-x86-64.so.2"]


class ReleaseChecks(unittest.TestCase):
    def test_the_released_library_needs_glibc_2_28_and_glibcs_own_libraries(self):
        rep = ec.check(LIB, run=recorded("release"), host=False, max_glibc_allowed="2.28", allow_needed=RELEASE_NEEDED)
        self.assertEqual(rep.problems, [])
        self.assertEqual(rep.glibc, "GLIBC_2.28")
        self.assertEqual(rep.glibc_symbols, ["statx"])
        self.assertEqual(rep.needed, ["libc.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2"])
        self.assertEqual(rep.plugin_symbols, [f"ncclNetPlugin_v{n}" for n in range(6, 13)])
        self.assertIn("verdict: fit for release (glibc <= 2.28; NEEDED within libc.so.6,", rep.render())

    def test_a_build_against_the_hosts_glibc_is_not_fit_for_release(self):
        rep = ec.check(LIB, run=recorded(), host=False, max_glibc_allowed="2.28", allow_needed=RELEASE_NEEDED)
        self.assertEqual(len(rep.problems), 1, rep.problems)
        self.assertTrue(rep.problems[0].startswith("needs GLIBC_2.34 (by pthread_key_create, pthread_key_delete, "
                                                   "pthread_setspecific): above glibc 2.28"), rep.problems)
        self.assertIn("verdict: NOT FIT FOR RELEASE", rep.render())
        # The floor itself is allowed: 2.34 passes a 2.34 bound, and 2.3.4 < 2.28 < 2.34.
        self.assertEqual(ec.check(LIB, run=recorded(), host=False, max_glibc_allowed="2.34").problems, [])

    def test_a_library_needed_beyond_the_allowed_ones_is_named(self):
        rep = ec.check(LIB, run=recorded("release"), host=False, allow_needed=["libc.so.6", "ld-linux-x86-64.so.2"])
        self.assertEqual(rep.problems, [
            "libpthread.so.0 is NEEDED: not one of the libraries allowed (libc.so.6, ld-linux-x86-64.so.2)",
            "libdl.so.2 is NEEDED: not one of the libraries allowed (libc.so.6, ld-linux-x86-64.so.2)",
        ])

    def test_a_program_needs_no_entry_points(self):
        strip = lambda t: "\n".join(line for line in t.splitlines() if "ncclNetPlugin" not in line)  # noqa: E731
        run = recorded("release", **{"readelf-dyn-syms": strip})
        self.assertIn("exports no ncclNetPlugin_v<N> symbol", ec.check(LIB, run=run, host=False).problems[0])
        rep = ec.check(LIB, run=run, host=False, program=True)
        self.assertEqual(rep.problems, [])
        self.assertTrue(rep.render().startswith("program: "))
        self.assertNotIn("NCCL entry points", rep.render())

    def test_option_values(self):
        self.assertEqual(ec.glibc_version("2.28"), "2.28")
        self.assertEqual(ec.glibc_version("GLIBC_2.3.4"), "2.3.4")
        self.assertEqual(ec.sonames("libc.so.6, libm.so.6"), ["libc.so.6", "libm.so.6"])
        for bad in ("2", "2.x", "GLIBC_", ""):
            with self.assertRaises(ec.argparse.ArgumentTypeError):
                ec.glibc_version(bad)
        with self.assertRaises(ec.argparse.ArgumentTypeError):
            ec.sonames("libc.so.6,,libm.so.6")
        r = helpers.run([sys.executable, SCRIPT, "--max-glibc", "2.x", "x.so"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("is not a glibc version", r.stderr)


@unittest.skipUnless(helpers.have_cc(), "needs cc")
class Live(unittest.TestCase):
    def test_a_plugin_like_library_passes(self):
        lib = helpers.plugin_like_so(helpers.tempdir(self))
        r = helpers.run([sys.executable, SCRIPT, lib])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("NCCL entry points: ncclNetPlugin_v8, ncclNetPlugin_v12", r.stdout)
        self.assertIn("ldd: libc.so.6 =>", r.stdout)

    def test_a_library_linking_libibverbs_fails(self):
        lib = helpers.ibverbs_linked_so(helpers.tempdir(self))
        r = helpers.run([sys.executable, SCRIPT, lib])
        self.assertEqual(r.returncode, 1)
        self.assertIn("PROBLEM: libibverbs.so.1 is NEEDED", r.stdout)

    def test_usage(self):
        r = helpers.run([sys.executable, SCRIPT])
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage: elf_check.py", r.stderr)
        r = helpers.run([sys.executable, SCRIPT, "/nonexistent.so"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("no such file", r.stderr)


class BuiltPlugin(unittest.TestCase):
    """The library this checkout built, where there is one (ci/build-plugin.sh or cargo test)."""

    def test_built_plugin_loads_here(self):
        built = os.path.join(helpers.TARGET, "release", "libnccl-net-mpib.so")
        libs = [p for p in (built, *glob.glob(os.path.join(helpers.TARGET, "debug", "libmpib.so"))) if os.path.exists(p)]
        if not libs:
            self.skipTest(f"no built plugin in {helpers.TARGET}")
        for lib in libs:
            rep = ec.check(lib)
            self.assertEqual(rep.problems, [], rep.render())
            self.assertFalse(any(n.startswith("libibverbs") for n in rep.needed))
            self.assertEqual(rep.machine, platform.machine())


if __name__ == "__main__":
    unittest.main()
