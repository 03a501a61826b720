"""ci/torch_collectives.py without a GPU: arithmetic, sizes, arguments, tables, statistics,
and the launcher with a stand-in worker."""
import json
import os
import subprocess
import sys
import time
import unittest
from contextlib import redirect_stderr
from io import StringIO

import helpers
import torch_collectives as tc

SCRIPT = os.path.join(helpers.CI, "torch_collectives.py")


class Arithmetic(unittest.TestCase):
    def test_busbw_factors_are_nccl_tests(self):
        self.assertEqual(tc.busbw_factor("all_reduce", 2), 1.0)
        self.assertEqual(tc.busbw_factor("all_reduce", 8), 1.75)
        for op in ("all_gather", "reduce_scatter", "all_to_all"):
            self.assertEqual(tc.busbw_factor(op, 2), 0.5)
            self.assertEqual(tc.busbw_factor(op, 8), 0.875)
        self.assertEqual(tc.busbw_factor("sendrecv", 2), 1.0)
        self.assertEqual(tc.busbw_factor("sendrecv", 16), 1.0)
        self.assertEqual(tc.busbw_factor("all_reduce", 1), 0.0)
        with self.assertRaises(ValueError):
            tc.busbw_factor("broadcast", 2)
        with self.assertRaises(ValueError):
            tc.busbw_factor("all_reduce", 0)

    def test_algbw_is_bytes_per_second_in_1e9(self):
        self.assertAlmostEqual(tc.algbw_gbps(10**9, 1.0), 1.0)
        self.assertAlmostEqual(tc.algbw_gbps(1 << 20, 100e-6), 10.48576)
        for bad in (0.0, -1.0):
            with self.assertRaises(ValueError):
                tc.algbw_gbps(1024, bad)

    def test_busbw_and_row(self):
        self.assertAlmostEqual(tc.busbw_gbps("all_gather", 1 << 30, 0.5, 4), (1 << 30) / 0.5 / 1e9 * 0.75)
        row = tc.make_row("all_reduce", 1 << 20, 250e-6, 4, 0, 20)
        self.assertAlmostEqual(row["time_us"], 250.0)
        self.assertAlmostEqual(row["algbw"], (1 << 20) / 250e-6 / 1e9)
        self.assertAlmostEqual(row["busbw"], row["algbw"] * 1.5)
        self.assertEqual((row["wrong"], row["iters"]), (0, 20))


class Sizes(unittest.TestCase):
    def test_parse_size(self):
        cases = {"4096": 4096, "1K": 1024, "1k": 1024, "1KiB": 1024, "1KB": 1024, "256M": 256 << 20, "2G": 2 << 30, " 8 ": 8}
        for text, want in cases.items():
            self.assertEqual(tc.parse_size(text), want, text)
        for bad in ("0", "-1", "1T", "abc", "", "1.5M"):
            with self.assertRaises(ValueError, msg=bad):
                tc.parse_size(bad)

    def test_default_sizes_are_1k_to_256m(self):
        sizes = tc.size_list(tc.parse_size("1K"), tc.parse_size("256M"))
        self.assertEqual(len(sizes), 19)
        self.assertEqual((sizes[0], sizes[-1]), (1024, 256 << 20))
        self.assertTrue(all(b == 2 * a for a, b in zip(sizes, sizes[1:])))

    def test_size_list_edges(self):
        self.assertEqual(tc.size_list(1024, 1024), [1024])
        self.assertEqual(tc.size_list(1024, 20000, 4), [1024, 4096, 16384])
        for args in ((0, 1024, 2), (2048, 1024, 2), (1024, 4096, 1)):
            with self.assertRaises(ValueError, msg=args):
                tc.size_list(*args)

    def test_auto_iters_and_human_size(self):
        self.assertEqual(tc.auto_iters(1024), 50)
        self.assertEqual(tc.auto_iters(32 << 20), 32)
        self.assertEqual(tc.auto_iters(256 << 20), 5)
        self.assertEqual(tc.human_size(1024), "1 KiB")
        self.assertEqual(tc.human_size(256 << 20), "256 MiB")
        self.assertEqual(tc.human_size(1536), "1.5 KiB")
        self.assertEqual(tc.human_size(100), "100 B")


class Arguments(unittest.TestCase):
    def parse_error(self, argv):
        err = StringIO()
        with redirect_stderr(err), self.assertRaises(SystemExit) as cm:
            tc.parse_args(argv)
        self.assertEqual(cm.exception.code, 2)
        self.assertIn("usage:", err.getvalue())
        return err.getvalue()

    def test_defaults(self):
        a = tc.parse_args(["run", "--out-dir", "/tmp/x"])
        self.assertEqual(a.ops, list(tc.OPS))
        self.assertEqual(len(a.sizes), 19)
        self.assertEqual(a.json, "/tmp/x/mpib.json")
        self.assertEqual((a.gpu, a.nranks, a.iters, a.fake_hosts, a.stats), ("0", 2, 0, True, False))

    def test_options(self):
        a = tc.parse_args(["run", "--ops", "sendrecv,all_reduce", "--min-bytes", "64K", "--max-bytes", "1M", "--gpu", "local", "--no-fake-hosts", "--label", "x"])
        self.assertEqual(a.ops, ["sendrecv", "all_reduce"])
        self.assertEqual(a.sizes, [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20])
        self.assertEqual((a.gpu, a.fake_hosts, a.json), ("local", False, None))

    def test_bad_arguments_exit_2_with_usage(self):
        self.assertIn("broadcast", self.parse_error(["run", "--ops", "all_reduce,broadcast"]))
        self.assertIn("not a size", self.parse_error(["run", "--min-bytes", "1T"]))
        self.assertIn("multiples of 8", self.parse_error(["run", "--min-bytes", "12", "--max-bytes", "12"]))
        self.assertIn("min <= max", self.parse_error(["run", "--min-bytes", "1M", "--max-bytes", "1K"]))
        self.parse_error(["run", "--gpu", "first"])
        self.parse_error(["run", "--nranks", "1"])
        self.parse_error(["run", "--bogus"])
        self.parse_error([])

    def test_command_line_help_and_errors(self):
        r = helpers.run([sys.executable, SCRIPT, "--help"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("table", r.stdout)
        r = helpers.run([sys.executable, SCRIPT, "run", "--help"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("--max-bytes", r.stdout)
        r = helpers.run([sys.executable, SCRIPT, "run", "--frobnicate"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage: torch_collectives.py", r.stderr)

    def test_rank_env(self):
        env = tc.rank_env(1, "plugin", "/o", True, "mpib-proof", True)
        self.assertEqual(env, {"NCCL_HOSTID": "mpib-proof-rank1", "NCCL_DEBUG_FILE": "/o/plugin.rank1.nccl.log", "MPIB_STATS_FILE": "/o/plugin.rank1.stats"})
        self.assertEqual(tc.rank_env(0, "b", None, False, "p", True), {})
        r = helpers.run([sys.executable, SCRIPT, "rank-env", "--rank", "0", "--label", "baseline", "--out-dir", "/o"])
        self.assertEqual(r.stdout.split(), ["NCCL_DEBUG_FILE=/o/baseline.rank0.nccl.log", "NCCL_HOSTID=mpib-proof-rank0"])

    def test_no_torch_at_import(self):
        r = helpers.run([sys.executable, "-c", "import sys, torch_collectives; assert 'torch' not in sys.modules; print('ok')"], env={"PYTHONPATH": helpers.CI})
        self.assertEqual(r.stdout.strip(), "ok", r.stderr)


def rows(busbw_scale=1.0, wrong=0, ops=("all_reduce", "sendrecv"), sizes=(1024, 1 << 20)):
    out = []
    for op in ops:
        for s in sizes:
            out.append(tc.make_row(op, s, 1e-4 / busbw_scale, 2, wrong if (op, s) == (ops[0], sizes[-1]) else 0, 10))
    return out


class Tables(unittest.TestCase):
    def test_table_without_baseline(self):
        text = tc.format_table(rows(), labels=("mpib", "baseline"))
        head = text.splitlines()[0]
        self.assertIn("busbw(GB/s)", head)
        self.assertNotIn("ratio", head)
        self.assertIn("1 MiB", text)
        self.assertIn("# wrong elements: 0", text)
        self.assertNotIn("CORRUPTION", text)

    def test_table_with_baseline_has_ratio(self):
        mine, base = rows(busbw_scale=2.0), rows(busbw_scale=1.0)
        text = tc.format_table(mine, base, labels=("mpib", "socket"))
        lines = text.splitlines()
        self.assertIn("socket busbw", lines[0])
        self.assertIn("ratio", lines[0])
        body = [line for line in lines[1:] if line.startswith("  all_reduce") or line.startswith("  sendrecv")]
        self.assertEqual(len(body), 4 + 2)  # 4 table rows + 2 summary rows
        self.assertTrue(all(line.rstrip().endswith("2.00x") for line in body), body)
        # all_reduce 1 MiB in 50 us: algbw 20.972 GB/s, busbw (n=2) the same
        self.assertIn("20.972", text)
        self.assertIn("avg busbw (GB/s) per collective, mpib vs socket", text)

    def test_rows_in_collective_then_size_order_and_missing_baseline(self):
        mine = rows(ops=("sendrecv", "all_reduce"), sizes=(1 << 20, 1024))
        base = [r for r in rows() if r["op"] == "all_reduce"]
        pairs = tc.merge_rows(mine, base)
        self.assertEqual([(m["op"], m["size"]) for m, _ in pairs], [("all_reduce", 1024), ("all_reduce", 1 << 20), ("sendrecv", 1024), ("sendrecv", 1 << 20)])
        self.assertIsNone(pairs[2][1])
        text = tc.format_table(mine, base)
        sendrecv = [line for line in text.splitlines() if line.startswith("  sendrecv") and "KiB" in line][0]
        self.assertEqual(sendrecv.split()[-2:], ["-", "-"], sendrecv)

    def test_ratio_and_averages(self):
        self.assertEqual(tc.ratio(3.0, 1.5), 2.0)
        self.assertIsNone(tc.ratio(3.0, 0.0))
        self.assertIsNone(tc.ratio(None, 1.0))
        avg = tc.op_averages([{"op": "x", "busbw": 1.0}, {"op": "x", "busbw": 3.0}])
        self.assertEqual(avg, {"x": 2.0})

    def test_wrong_elements_are_shouted(self):
        text = tc.format_table(rows(wrong=7))
        self.assertIn("# wrong elements: 7  <-- DATA CORRUPTION", text)

    def test_table_command_merges_json_files(self):
        d = helpers.tempdir(self)
        for name, scale, wrong in (("mpib", 3.0, 0), ("socket", 1.0, 0), ("bad", 1.0, 2)):
            with open(os.path.join(d, name + ".json"), "w") as f:
                json.dump({"schema": tc.SCHEMA, "label": name, "rows": rows(busbw_scale=scale, wrong=wrong)}, f)
        r = helpers.run([sys.executable, SCRIPT, "table", os.path.join(d, "mpib.json"), "--baseline", os.path.join(d, "socket.json")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("socket busbw", r.stdout)
        self.assertIn("3.00x", r.stdout)
        r = helpers.run([sys.executable, SCRIPT, "table", os.path.join(d, "bad.json")])
        self.assertEqual(r.returncode, 1)
        with open(os.path.join(d, "junk.json"), "w") as f:
            json.dump({"rows": []}, f)
        with self.assertRaises(ValueError):
            tc.load_results(os.path.join(d, "junk.json"))


class Statistics(unittest.TestCase):
    def test_parse_stats_fixture(self):
        stats = tc.parse_stats(helpers.read_fixture("mpib-stats", "plugin.rank0.stats"))
        self.assertEqual(sorted(stats), [0, 1])
        self.assertEqual(stats[0]["name"], "soft0")
        self.assertEqual(stats[0]["bytes"], 5497558138)
        self.assertEqual(stats[1]["share_of_bytes"], 0.488)
        self.assertEqual(stats[1]["latency_p99_ns"], 90217)
        self.assertEqual(len(stats[0]), 19)
        self.assertNotIn("total_bytes", stats[0])

    def test_parse_stats_ignores_noise(self):
        self.assertEqual(tc.parse_stats("# c\nrail2_x: 1\nrailX_y: 2\nrail0_z:3.5\n\n"), {2: {"x": 1}, 0: {"z": 3.5}})

    def test_format_stats(self):
        text = tc.format_stats(tc.parse_stats(helpers.read_fixture("mpib-stats", "plugin.rank0.stats")), "s")
        self.assertIn("rail0 (SOUT)", text)
        self.assertIn("rail1 (SUP)", text)
        line = [x for x in text.splitlines() if x.split()[:1] == ["rnr"]][0]
        self.assertEqual(line.split(), ["rnr", "0", "0"])
        self.assertIn("no rail<N>_<key> lines", tc.format_stats({}, "empty"))

    def test_stats_command(self):
        r = helpers.run([sys.executable, SCRIPT, "stats", helpers.fixture("mpib-stats", "plugin.rank0.stats"), "/nonexistent.stats"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("latency_p95_ns", r.stdout)
        self.assertIn("/nonexistent.stats: not written", r.stdout)
        r = helpers.run([sys.executable, SCRIPT, "stats", "/nonexistent.stats"])
        self.assertEqual(r.returncode, 1)


class Launcher(unittest.TestCase):
    """`run` spawns the ranks with their environment; the stand-in worker records it."""

    def launch(self, mode, *extra, timeout=60):
        d = helpers.tempdir(self)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
        env.update(PROOF_WORKER="fake_worker", PYTHONPATH=helpers.FAKES, FAKE_MODE=mode, NCCL_NET="MPIB")
        env.update(PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, SCRIPT, "run", "--out-dir", d, "--max-bytes", "4K", "--stats", *extra]
        t0 = time.monotonic()
        r = subprocess.run(cmd, cwd=helpers.ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        return r, d, time.monotonic() - t0

    def test_two_ranks_each_with_its_own_host_log_and_stats(self):
        r, d, _ = self.launch("ok")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        envs = []
        for i in (0, 1):
            with open(os.path.join(d, f"mpib.rank{i}.env.json"), encoding="utf-8") as f:
                envs.append(json.load(f))
        for i, env in enumerate(envs):
            self.assertEqual(env["NCCL_HOSTID"], f"mpib-proof-rank{i}")
            self.assertEqual(env["NCCL_DEBUG_FILE"], os.path.join(d, f"mpib.rank{i}.nccl.log"))
            self.assertEqual(env["MPIB_STATS_FILE"], os.path.join(d, f"mpib.rank{i}.stats"))
            self.assertTrue(os.path.getsize(env["NCCL_DEBUG_FILE"]) > 0)
        data = tc.load_results(os.path.join(d, "mpib.json"))
        self.assertEqual(len(data["rows"]), 5 * 3)
        self.assertIn("busbw(GB/s)", r.stdout)
        self.assertIn("rail0 (SOUT)", r.stdout)
        self.assertTrue(os.path.exists(os.path.join(d, "mpib.rank1.out")))

    def test_wrong_elements_fail_the_run(self):
        r, _, _ = self.launch("corrupt")
        self.assertEqual(r.returncode, 1)
        self.assertIn("DATA CORRUPTION", r.stdout)

    def test_a_failing_rank_fails_the_run(self):
        r, _, _ = self.launch("crash")
        self.assertEqual(r.returncode, 7)
        self.assertIn("rank 1 exited with 7", r.stderr)

    def test_a_hanging_rank_is_stopped(self):
        r, _, took = self.launch("hang", "--timeout", "1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ranks stopped", r.stderr)
        self.assertLess(took, 30)


if __name__ == "__main__":
    unittest.main()
