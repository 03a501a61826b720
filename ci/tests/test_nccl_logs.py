"""ci/nccl_logs.py against recorded NCCL logs and nccl-tests output (tests/fixtures/)."""
import sys
import os
import unittest

import helpers
import nccl_logs as nl

SCRIPT = os.path.join(helpers.CI, "nccl_logs.py")


def log(name):
    return helpers.read_fixture("nccl", name)


class PluginProof(unittest.TestCase):
    def test_nccl_2_30_plugin_log_proves_it(self):
        for rank in (0, 1):
            p = nl.check_plugin_log(log(f"2.30-plugin.rank{rank}.log"))
            self.assertTrue(p.ok, nl.describe(p, "x"))
            self.assertEqual((p.nccl_version, p.plugin_abi), ("2.30.7", "v12"))
            self.assertIn("Loaded net plugin MPIB (v12)", p.found["loaded"])
            self.assertTrue(p.found["using"].endswith("Using network MPIB"))
            self.assertIn(f"{1 - rank}[0] -> {rank}[0] [receive] via NET/MPIB/0", log(f"2.30-plugin.rank{rank}.log"))

    def test_nccl_2_21_plugin_log_proves_it(self):
        p = nl.check_plugin_log(log("2.21-plugin.rank0.log"))
        self.assertTrue(p.ok, nl.describe(p, "x"))
        self.assertEqual((p.nccl_version, p.plugin_abi), ("2.21.5", "v8"))
        self.assertIn("via NET/MPIB/0", p.found["via"])

    def test_older_channel_forms_count(self):
        p = nl.check_plugin_log(log("2.18-legacy-plugin.rank0.log"))
        self.assertTrue(p.ok, nl.describe(p, "x"))
        self.assertEqual(p.plugin_abi, "v6")
        for line in ("Ring 00 : 0 -> 1 [send] via NET/MPIB/1", "Channel 00 : 0[1b000] -> 1[1b000] [send] via NET/MPIB/0/GDRDMA(PCI)"):
            self.assertEqual(nl.check_plugin_log("Loaded net plugin MPIB\nUsing network MPIB\n" + line).missing, [])

    def test_plugin_not_found_fails_naming_every_line(self):
        p = nl.check_plugin_log(log("2.21-not-found.rank0.log"))
        self.assertFalse(p.ok)
        self.assertEqual(p.missing, ["Loaded net plugin MPIB", "Using network MPIB", "via NET/MPIB/<dev>"])
        self.assertIn("Using network Socket", p.unexpected)
        text = nl.describe(p, "rank0")
        self.assertIn("missing line: 'Using network MPIB'", text)
        self.assertIn("NCCL says: Using network Socket", text)
        self.assertIn("hint: NET/Plugin: Could not find: /work/mpib/target/relase/libnccl-net-mpib.so", text)

    def test_no_channels_fails_on_the_via_line(self):
        p = nl.check_plugin_log(log("2.30-no-channels.rank0.log"))
        self.assertEqual(p.missing, ["via NET/MPIB/<dev>"])
        self.assertEqual(p.unexpected, [])
        text = nl.describe(p, "rank0")
        self.assertIn("NOT proven", text)
        self.assertIn("NCCL WARN MPIB: connect to 10.20.0.7:41877 gave up", text)

    def test_a_second_comm_on_another_network_fails(self):
        text = log("2.30-plugin.rank0.log") + "h:1:2 [0] NCCL INFO Using network Socket\nh:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
        p = nl.check_plugin_log(text)
        self.assertEqual(p.unexpected, ["Using network Socket", "via NET/Socket/"])

    def test_names_are_whole_words(self):
        p = nl.check_plugin_log("Loaded net plugin MPIBX (v12)\nUsing network MPIB-2\nvia NET/MPIBX/0\n")
        self.assertEqual(len(p.missing), 3)

    def test_empty_log_says_nccl_did_not_log(self):
        self.assertIn("was NCCL_DEBUG=INFO set", nl.describe(nl.check_plugin_log(""), "x"))


class BaselineProof(unittest.TestCase):
    def test_socket_baseline_passes(self):
        for rank in (0, 1):
            p = nl.check_baseline_log(log(f"2.30-baseline.rank{rank}.log"))
            self.assertTrue(p.ok, nl.describe(p, "x"))
        self.assertTrue(nl.check_baseline_log(log("2.21-not-found.rank0.log")).ok)

    def test_plugin_log_is_not_a_baseline(self):
        p = nl.check_baseline_log(log("2.30-plugin.rank0.log"))
        self.assertFalse(p.ok)
        self.assertEqual(p.missing, ["Using network Socket", "via NET/Socket/<dev>"])
        self.assertIn("Loaded net plugin MPIB", p.unexpected)
        self.assertIn("Using network MPIB", p.unexpected)

    def test_baseline_log_is_not_a_plugin_proof(self):
        self.assertFalse(nl.check_plugin_log(log("2.30-baseline.rank0.log")).ok)


class NcclTestsOutput(unittest.TestCase):
    def parse(self, name):
        return nl.parse_nccl_tests(helpers.read_fixture("nccl-tests", name))

    def test_clean_runs(self):
        for prog in ("sendrecv_perf", "all_reduce_perf", "alltoall_perf"):
            r = self.parse(f"{prog}.clean.out")
            self.assertEqual(r.problems(), [], prog)
            self.assertEqual((r.program, r.version, r.nccl_library, r.oob), (prog, "2.17.6", 23007, 0))
            self.assertEqual(len(r.rows), 19)
            self.assertEqual((r.rows[0].size, r.rows[-1].size), (1024, 256 << 20))
            self.assertTrue(all(row.oop[3] == 0 and row.ip[3] == 0 for row in r.rows))
            self.assertGreater(r.avg_busbw, 0)
        r = self.parse("all_reduce_perf.clean.out")
        self.assertAlmostEqual(r.rows[-1].oop[2], 2.40)
        self.assertEqual(r.rows[0].redop, "sum")

    def test_corrupted_run(self):
        r = self.parse("all_reduce_perf.corrupt.out")
        self.assertEqual(r.oob, 3)
        problems = r.problems()
        self.assertIn("all_reduce_perf: size 16777216 out-of-place: #wrong = 1.04858e+06 (data corruption)", problems)
        self.assertIn("all_reduce_perf: size 134217728 in-place: #wrong = 3 (data corruption)", problems)
        self.assertIn("all_reduce_perf: Out of bounds values = 3 (FAILED)", problems)
        self.assertEqual(len(problems), 4)

    def test_unchecked_run(self):
        problems = self.parse("sendrecv_perf.nocheck.out").problems()
        self.assertEqual(len(problems), 38)
        self.assertTrue(all("N/A (run with -c 1)" in p for p in problems))

    def test_run_that_died(self):
        r = self.parse("sendrecv_perf.died.out")
        self.assertEqual(len(r.rows), 5)
        problems = r.problems()
        self.assertTrue(any("Test NCCL failure common.cu:1279" in p for p in problems), problems)
        self.assertTrue(any("no '# Out of bounds values' line" in p for p in problems))
        self.assertTrue(any("no '# Avg bus bandwidth' line" in p for p in problems))

    def test_no_output(self):
        problems = nl.parse_nccl_tests("").problems()
        self.assertIn("nccl-tests: no result rows (did the test start? see its output)", problems)

    def test_per_iteration_and_timestamp_columns(self):
        head = "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%           timestamp\n"
        row = "        1024           256     float     sum      -1    61.43    0.02    0.02       0    60.00    70.00    69.00     1.20    61.44    0.02    0.02       2    60.00    70.00    69.00     1.20  2026-03-02 10:14:07\n"
        foot = "# Out of bounds values : 1 FAILED\n# Avg bus bandwidth    : 0.02 \n"
        r = nl.parse_nccl_tests(head + row + foot)
        self.assertEqual(r.rows[0].oop, (61.43, 0.02, 0.02, 0.0))
        self.assertEqual(r.rows[0].ip, (61.44, 0.02, 0.02, 2.0))

    def test_nccl_info_lines_in_the_output_are_ignored(self):
        text = helpers.read_fixture("nccl-tests", "sendrecv_perf.clean.out")
        mixed = text.replace("# Using devices\n", "# Using devices\n" + log("2.30-plugin.rank0.log"))
        self.assertEqual(nl.parse_nccl_tests(mixed).problems(), [])
        self.assertEqual(len(nl.parse_nccl_tests(mixed).rows), 19)

    def test_blank_out_of_place_body(self):
        head = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
        row = "        1024           256     float     sum      -1" + " " * 32 + "    61.44    0.02    0.02       0\n"
        r = nl.parse_nccl_tests(head + row)
        self.assertIsNone(r.rows[0].oop)
        self.assertEqual(r.rows[0].ip, (61.44, 0.02, 0.02, 0.0))


class CommandLine(unittest.TestCase):
    def test_proof_of_both_ranks(self):
        r = helpers.run([sys.executable, SCRIPT, "proof", helpers.fixture("nccl", "2.30-plugin.rank0.log"), helpers.fixture("nccl", "2.30-plugin.rank1.log")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("network MPIB (plugin ABI v12) proven by"), 2)

    def test_one_bad_rank_fails(self):
        r = helpers.run([sys.executable, SCRIPT, "proof", helpers.fixture("nccl", "2.30-plugin.rank0.log"), helpers.fixture("nccl", "2.30-no-channels.rank0.log")])
        self.assertEqual(r.returncode, 1)
        self.assertIn("missing line: 'via NET/MPIB/<dev>'", r.stderr)

    def test_baseline_and_missing_file(self):
        r = helpers.run([sys.executable, SCRIPT, "baseline", helpers.fixture("nccl", "2.30-baseline.rank0.log")])
        self.assertEqual(r.returncode, 0, r.stderr)
        r = helpers.run([sys.executable, SCRIPT, "proof", "/nonexistent.log"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot read", r.stderr)

    def test_nccl_tests_command(self):
        r = helpers.run([sys.executable, SCRIPT, "nccl-tests", helpers.fixture("nccl-tests", "alltoall_perf.clean.out")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("alltoall_perf, 19 sizes", r.stdout)
        r = helpers.run([sys.executable, SCRIPT, "nccl-tests", helpers.fixture("nccl-tests", "all_reduce_perf.corrupt.out")])
        self.assertEqual(r.returncode, 1)
        self.assertIn("#wrong = 1.04858e+06", r.stderr)

    def test_usage_errors(self):
        for argv in ([], ["frob"], ["proof"], ["proof", "--bogus", "x"]):
            r = helpers.run([sys.executable, SCRIPT, *argv])
            self.assertEqual(r.returncode, 2, argv)
            self.assertIn("usage: nccl_logs.py", r.stderr)
        r = helpers.run([sys.executable, SCRIPT, "--help"])
        self.assertEqual(r.returncode, 0)


if __name__ == "__main__":
    unittest.main()
