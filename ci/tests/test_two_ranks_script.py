"""ci/nccl-two-ranks.sh and ci/nccl-rank-env.sh without a GPU: arguments, the environments
they build (--dry-run), fabric choice, and the whole flow with stand-ins for the PyTorch worker,
nccl-tests and mpirun."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import helpers

SCRIPT = os.path.join(helpers.CI, "nccl-two-ranks.sh")
RANK_ENV = os.path.join(helpers.CI, "nccl-rank-env.sh")


def script(*args, env=None, timeout=120):
    full = {"PYTHON": sys.executable}
    full.update(env or {})
    return helpers.run(["bash", SCRIPT, *args], env=full, timeout=timeout)


class Arguments(unittest.TestCase):
    def test_help_explains_everything(self):
        r = script("--help")
        self.assertEqual(r.returncode, 0)
        self.assertTrue(r.stdout.startswith("usage: ci/nccl-two-ranks.sh"))
        for words in ("NCCL_HOSTID", "NCCL_NET=MPIB", "NCCL_NET_PLUGIN", "Loaded net plugin MPIB", "Using network MPIB",
                      "via NET/MPIB", "NCCL_NET=Socket", "NCCL_NET_PLUGIN=none", "NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1",
                      "NCCL_MULTI_RANK_GPU_ENABLE=1", "MPIB_STATS_FILE", "NCCL_TESTS_DIR", "make MPI=1", "mpirun", "-c 1", "#wrong",
                      "--fabric soft|verbs|auto", "ibv_devices", "libibverbs", "GLIBC"):
            self.assertIn(words, r.stdout)
        self.assertEqual(script("-h").stdout, r.stdout)

    def test_bad_options_exit_2_with_usage(self):
        cases = {
            ("--bogus",): "unknown option: --bogus",
            ("--fabric", "ib"): "--fabric must be soft, verbs or auto",
            ("--fabric=rdma",): "--fabric must be soft, verbs or auto",
            ("--gpu", "x"): "--gpu must be a CUDA device number",
            ("--lifecycle", "two"): "--lifecycle must be a number of rounds",
            ("--timeout", "0"): "--timeout must be a positive number",
            ("--iters", "many"): "--iters must be a number",
            ("--nccl-version", "latest"): "--nccl-version must look like 2.21.5",
            ("--lib",): "--lib needs a value",
        }
        for args, message in cases.items():
            r = script(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(message, r.stderr, args)
            self.assertIn("usage: ci/nccl-two-ranks.sh", r.stderr, args)

    def test_missing_library(self):
        r = script("--lib", "/nonexistent/libnccl-net-mpib.so", "--out", helpers.tempdir(self))
        self.assertEqual(r.returncode, 1)
        self.assertIn("no such file", r.stderr)


class WithLibrary(unittest.TestCase):
    """A plugin-like library (passes elf_check, built once per class) and, per test, a
    temporary folder with an output folder in it."""

    @classmethod
    def setUpClass(cls):
        if not helpers.have_cc():
            raise unittest.SkipTest("needs cc")
        cls.libdir = tempfile.mkdtemp(prefix="mpib-ci-")
        cls.addClassCleanup(shutil.rmtree, cls.libdir, True)
        cls.lib = helpers.plugin_like_so(cls.libdir)

    def setUp(self):
        self.dir = helpers.tempdir(self)
        self.out = os.path.join(self.dir, "out")


class DryRun(WithLibrary):

    def dry(self, *args, env=None):
        r = script("--dry-run", "--lib", self.lib, "--out", self.out, *args, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def section(self, text, title):
        return text.split(f"== {title}", 1)[1].split("\n== ", 1)[0]

    def test_plugin_environment(self):
        out = self.dry("--nccl-version", "2.30.7")
        plugin = self.section(out, "PyTorch collectives through mpib")
        for want in (f"NCCL_NET_PLUGIN={self.lib}", "NCCL_NET=MPIB", "MPIB_FABRIC=soft", "NCCL_DEBUG=INFO",
                     "NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1", "NCCL_MULTI_RANK_GPU_ENABLE=1", "--label plugin", "--stats"):
            self.assertIn(want, plugin)
        self.assertIn("NCCL_DEBUG_SUBSYS=INIT\\,NET\\,ENV", plugin)
        for r in (0, 1):
            self.assertIn(f"rank {r}: MPIB_STATS_FILE={self.out}/plugin.rank{r}.stats NCCL_DEBUG_FILE={self.out}/plugin.rank{r}.nccl.log NCCL_HOSTID=mpib-proof-rank{r}", plugin)
        self.assertIn("PASS: library loads on this host as it is", out)
        self.assertIn("dry run: nothing was run", out)

    def test_baseline_disables_plugins_on_2_28_and_later(self):
        base = self.section(self.dry("--nccl-version", "2.28.3"), "PyTorch collectives through NCCL's socket transport")
        self.assertIn("NCCL_NET=Socket NCCL_NET_PLUGIN=none", base)
        self.assertIn("-u MPIB_STATS_FILE", base)
        self.assertNotIn("MPIB_FABRIC", base)
        self.assertNotIn("--stats", base)
        self.assertIn(f"rank 1: NCCL_DEBUG_FILE={self.out}/baseline.rank1.nccl.log NCCL_HOSTID=mpib-proof-rank1", base)

    def test_baseline_unsets_the_plugin_before_2_28(self):
        for version in ("2.21.5", "2.27.7"):
            base = self.section(self.dry("--nccl-version", version), "PyTorch collectives through NCCL's socket transport")
            self.assertIn("env -u NCCL_NET_PLUGIN", base)
            self.assertNotIn("NCCL_NET_PLUGIN=none", base)

    def test_no_baseline_and_options_reach_the_program(self):
        out = self.dry("--nccl-version", "2.30.7", "--no-baseline", "--gpu", "3", "--max-bytes=1M", "--ops", "sendrecv", "--iters", "7")
        self.assertNotIn("socket transport", out)
        self.assertIn("--gpu 3 --min-bytes 1K --max-bytes 1M --timeout 1800 --ops sendrecv --iters 7", out)

    def test_lifecycle_and_abort_reach_the_plugin_run_only(self):
        out = self.dry("--nccl-version", "2.30.7", "--lifecycle", "2", "--abort")
        self.assertIn("--stats --lifecycle 2 --abort", self.section(out, "PyTorch collectives through mpib"))
        base = self.section(out, "PyTorch collectives through NCCL's socket transport")
        self.assertNotIn("--lifecycle", base)
        self.assertNotIn("--abort", base)
        self.assertIn("--stats --lifecycle 0", self.dry("--nccl-version", "2.30.7"))

    def test_lifecycle_keeps_the_plugin_loaded_where_nccl_forgets_its_name(self):
        for version, forgets in (("2.26.6", False), ("2.27.3", True), ("2.28.9", True), ("2.29.7", True), ("2.30.3", False)):
            with self.subTest(version=version):
                out = self.dry("--nccl-version", version, "--lifecycle", "1")
                self.assertEqual("NCCL_NET_PLUGIN_REF_COUNT=1" in self.section(out, "PyTorch collectives through mpib"), forgets)
        self.assertNotIn("NCCL_NET_PLUGIN_REF_COUNT", self.dry("--nccl-version", "2.28.9"))
        out = self.dry("--nccl-version", "2.28.9", "--lifecycle", "1", env={"NCCL_NET_PLUGIN_REF_COUNT": "4"})
        self.assertNotIn("NCCL_NET_PLUGIN_REF_COUNT=1", out)

    def fake_ibv_devices(self, body):
        bin_dir = os.path.join(self.dir, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        path = os.path.join(bin_dir, "ibv_devices")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)
        return {"PATH": bin_dir + os.pathsep + os.environ["PATH"]}

    def test_fabric_auto_picks_verbs_when_devices_exist(self):
        env = self.fake_ibv_devices("printf '    device          \\t   node GUID\\n    ------          \\t----------------\\n    rxe0            \\t0000000000000000\\n    mlx5_1          \\tb8cef6030014d2d2\\n'\n")
        out = self.dry("--fabric", "auto", "--nccl-version", "2.30.7", env=env)
        self.assertIn("fabric: verbs (RDMA devices: rxe0 mlx5_1)", out)
        self.assertIn("MPIB_FABRIC=verbs", out)
        self.assertIn("fabric: verbs", self.dry("--fabric", "verbs", "--nccl-version", "2.30.7", env=env))

    def test_fabric_auto_without_devices_is_soft_and_verbs_fails(self):
        env = self.fake_ibv_devices("echo 'Failed to get IB devices list: Function not implemented' >&2; exit 1\n")
        self.assertIn("fabric: soft (RDMA devices: none)", self.dry("--fabric", "auto", "--nccl-version", "2.30.7", env=env))
        r = script("--dry-run", "--lib", self.lib, "--out", self.out, "--fabric", "verbs", env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--fabric verbs: ibv_devices lists no RDMA device", r.stderr)

    def test_check_lib_only(self):
        r = script("--check-lib-only", "--lib", self.lib, "--out", self.out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("NCCL entry points: ncclNetPlugin_v8, ncclNetPlugin_v12", r.stdout)
        self.assertNotIn("fabric:", r.stdout)
        bad = helpers.ibverbs_linked_so(self.dir)
        r = script("--check-lib-only", "--lib", bad, "--out", self.out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("libibverbs.so.1 is NEEDED", r.stdout)
        self.assertIn("the library would not load", r.stderr)

    def test_default_library_is_where_cargo_puts_it(self):
        # No --lib: ci/build-plugin.sh's link in cargo's release folder, CARGO_TARGET_DIR's
        # when it is set (a shared build cache), not the checkout's target/.
        target = os.path.join(self.dir, "cargo-target")
        os.makedirs(os.path.join(target, "release"))
        shutil.copy(self.lib, os.path.join(target, "release", "libnccl-net-mpib.so"))
        r = script("--check-lib-only", "--out", self.out, env={"CARGO_TARGET_DIR": target})
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(os.path.join(target, "release", "libnccl-net-mpib.so"), r.stdout)


class WholeFlow(WithLibrary):
    """The script end to end with the stand-in worker (tests/fixtures logs and figures)."""

    def flow(self, mode, *args, env=None):
        full = {"PROOF_WORKER": "fake_worker", "PYTHONPATH": helpers.FAKES, "FAKE_MODE": mode}
        full.update(env or {})
        return script("--lib", self.lib, "--out", self.out, "--nccl-version", "2.30.7", "--max-bytes", "4K", *args, env=full)

    def test_everything_proven(self):
        r = self.flow("ok")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for line in ("PASS  PyTorch collectives, through mpib: exact", "PASS  NCCL used the plugin: NCCL logs of both ranks prove it",
                     "PASS  PyTorch collectives, through Socket: exact",
                     "PASS  baseline used NCCL's socket transport, no plugin: NCCL logs of both ranks prove it"):
            self.assertIn(line, r.stdout)
        self.assertIn("network MPIB (plugin ABI v12) proven by", r.stdout)
        with open(os.path.join(self.out, "table.txt")) as f:
            table = f.read()
        self.assertIn("baseline busbw", table)
        self.assertIn("ratio", table)
        self.assertEqual(sum(1 for line in table.splitlines() if line.rstrip().endswith("x")), 15 + 5)
        self.assertIn("rail1 (SUP)", r.stdout)

    def test_missing_proof_line_fails_and_names_it(self):
        r = self.flow("no-channels")
        self.assertEqual(r.returncode, 1)
        self.assertIn("missing line: 'via NET/MPIB/<dev>'", r.stderr)
        self.assertIn("FAIL  NCCL used the plugin: NCCL logs do not prove it", r.stdout)

    def test_wrong_elements_fail(self):
        r = self.flow("corrupt", "--no-baseline")
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL  PyTorch collectives, through mpib (exit 1", r.stdout)
        self.assertIn("DATA CORRUPTION", r.stdout)

    def nccl_tests_dir(self, mpi=True, outputs=None):
        tests = os.path.join(self.dir, "nccl-tests")
        build = os.path.join(tests, "build")
        os.makedirs(build)
        helpers.build_so(build, "libmpi.so", "int mpi_stand_in;\n")
        for prog in ("sendrecv_perf", "all_reduce_perf", "alltoall_perf"):
            target = os.path.join(build, prog)
            if mpi:
                subprocess.run(["cc", "-o", target, os.path.join(helpers.FAKES, "fake_nccl_tests.c"), "-L" + build,
                                "-Wl,--no-as-needed", "-lmpi", "-Wl,-rpath," + build], check=True, capture_output=True)
            else:
                with open(target, "w") as f:
                    f.write("#!/bin/sh\nexit 0\n")
                os.chmod(target, 0o755)
        outs = os.path.join(self.dir, "outputs")
        os.makedirs(outs)
        for prog in ("sendrecv_perf", "all_reduce_perf", "alltoall_perf"):
            shutil.copy(helpers.fixture("nccl-tests", (outputs or {}).get(prog, f"{prog}.clean.out")), os.path.join(outs, f"{prog}.out"))
        return {"NCCL_TESTS_DIR": tests, "MPIRUN": os.path.join(helpers.FAKES, "fake-mpirun"), "FAKE_TESTS_DIR": outs,
                "FAKE_NCCL_LOG": helpers.fixture("nccl", "2.30-plugin.rank0.log"), "NCCL_TESTS_ARGS": "-b 1K -e 4K -f 2 -g 1"}

    def test_nccl_tests_clean(self):
        r = self.flow("ok", "--no-torch", env=self.nccl_tests_dir())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for prog in ("sendrecv_perf", "all_reduce_perf", "alltoall_perf"):
            self.assertIn(f"PASS  {prog} -c 1: every #wrong is 0", r.stdout)
            self.assertIn(f"PASS  {prog}: NCCL used the plugin: NCCL logs of both ranks prove it", r.stdout)
            for rank in (0, 1):
                with open(os.path.join(self.out, f"nccltests-{prog}.rank{rank}.nccl.log.args")) as f:
                    args = f.read()
                self.assertIn(f"NCCL_HOSTID=mpib-proof-rank{rank} NCCL_TESTS_DEVICE=0 NCCL_NET=MPIB -b 1K -e 4K -f 2 -g 1 -c 1", args)
        self.assertNotIn("PyTorch", r.stdout)
        self.assertIn("# Avg bus bandwidth    : 0.826603", r.stdout)

    def test_nccl_tests_corrupt(self):
        r = self.flow("ok", "--no-torch", env=self.nccl_tests_dir(outputs={"all_reduce_perf": "all_reduce_perf.corrupt.out"}))
        self.assertEqual(r.returncode, 1)
        self.assertIn("#wrong = 1.04858e+06", r.stderr)
        self.assertIn("FAIL  all_reduce_perf: data errors or an unfinished run", r.stdout)
        self.assertIn("PASS  sendrecv_perf -c 1: every #wrong is 0", r.stdout)

    def test_nccl_tests_without_mpi(self):
        r = self.flow("ok", "--no-torch", env=self.nccl_tests_dir(mpi=False))
        self.assertEqual(r.returncode, 1)
        self.assertIn("was built without MPI", r.stdout)
        self.assertIn("make MPI=1", r.stdout)


class RankEnv(unittest.TestCase):
    def test_rank_from_each_launcher(self):
        for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
            r = helpers.run(["bash", RANK_ENV, "env"], env={var: "1", "PROOF_OUT": "/o", "PROOF_TAG": "t"})
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertIn("NCCL_HOSTID=mpib-proof-rank1", lines, var)
            self.assertIn("NCCL_DEBUG_FILE=/o/t.rank1.nccl.log", lines)
            self.assertIn("MPIB_STATS_FILE=/o/t.rank1.stats", lines)

    def test_real_hosts_and_errors(self):
        r = helpers.run(["bash", RANK_ENV, "env"], env={"PMI_RANK": "0", "PROOF_FAKE_HOSTS": "0", "NCCL_HOSTID": "keep"})
        self.assertIn("NCCL_HOSTID=keep", r.stdout.splitlines())
        clean = {k: "" for k in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")}
        r = helpers.run(["bash", RANK_ENV, "env"], env=clean)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no rank in the environment", r.stderr)
        r = helpers.run(["bash", RANK_ENV])
        self.assertEqual(r.returncode, 2)
        self.assertIn("Usage: mpirun -np 2 ci/nccl-rank-env.sh", r.stdout)
        self.assertEqual(helpers.run(["bash", RANK_ENV, "--help"]).returncode, 0)


if __name__ == "__main__":
    unittest.main()
