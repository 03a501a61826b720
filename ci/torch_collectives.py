#!/usr/bin/env python3
"""PyTorch collectives through NCCL, checked exactly and timed: the proof that NCCL's
collectives through mpib are correct and how fast they are next to a baseline transport.

    torch_collectives.py run   [options]           two ranks (spawned here, or under torchrun)
    torch_collectives.py table PLUGIN.json [--baseline BASE.json]
    torch_collectives.py stats FILE...             print mpib per-rail statistics files
    torch_collectives.py rank-env --rank N ...     the per-rank environment `run` sets

`run` does all_reduce, all_gather, reduce_scatter, all_to_all and send/recv over sizes
1 KiB ... 256 MiB (float32 holding small integers, so every sum is exact and every element is
compared), and reports algorithm and bus bandwidth with nccl-tests' definitions:
    algbw = S / t          (S as nccl-tests counts it, see SIZE_MEANING; GB = 1e9 bytes)
    busbw = algbw * factor all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
                           sendrecv 1
t is the mean over ranks of the wall time per iteration (nccl-tests' default, -a 1).

Every rank is its own "host" (NCCL_HOSTID=<prefix>-rank<N>) so NCCL connects the ranks through
the network even on one machine and one GPU. Everything except the worker is plain Python:
torch is imported only inside the worker, so CI tests this file on a machine with no GPU.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")
SIZE_MEANING = {
    "all_reduce": "buffer bytes",
    "all_gather": "bytes received per rank (whole output)",
    "reduce_scatter": "bytes sent per rank (whole input)",
    "all_to_all": "bytes sent per rank",
    "sendrecv": "bytes sent per rank",
}
ELEM = 4  # float32
SCHEMA = 1
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

# --------------------------------------------------------------------------------------------
# arithmetic
# --------------------------------------------------------------------------------------------


def busbw_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth correction (doc/PERFORMANCE.md)."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, not {nranks}")
    if op == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (nranks - 1) / nranks
    if op == "sendrecv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def algbw_gbps(size: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"time must be positive, not {seconds}")
    return size / seconds / 1e9


def busbw_gbps(op: str, size: int, seconds: float, nranks: int) -> float:
    return algbw_gbps(size, seconds) * busbw_factor(op, nranks)


def parse_size(text: str) -> int:
    """'1K', '1KiB', '256M', '1G', '4096' -> bytes (K = 1024, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 1K, 256M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def size_list(min_bytes: int, max_bytes: int, factor: int = 2) -> List[int]:
    """min, min*factor, ... up to and including max (if it is on the progression)."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError(f"need 0 < min <= max, got {min_bytes}..{max_bytes}")
    if factor < 2:
        raise ValueError(f"factor must be >= 2, not {factor}")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def auto_iters(size: int) -> int:
    """Timed iterations for a size: about 1 GiB of traffic, between 5 and 50."""
    return max(5, min(50, (1 << 30) // size))


def human_size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------


def _row_key(row: Dict) -> tuple:
    op = row["op"]
    return (OPS.index(op) if op in OPS else len(OPS), op, row["size"])


def merge_rows(rows: List[Dict], baseline: Optional[List[Dict]]) -> List[tuple]:
    """(row, baseline row or None) pairs in table order; baseline-only rows come with row None."""
    base = {(r["op"], r["size"]): r for r in (baseline or [])}
    mine = {(r["op"], r["size"]): r for r in rows}
    keys = sorted(set(base) | set(mine), key=lambda k: _row_key({"op": k[0], "size": k[1]}))
    return [(mine.get(k), base.get(k)) for k in keys]


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: List[Dict], baseline: Optional[List[Dict]] = None, labels=("mpib", "baseline")) -> str:
    """The combined table: one line per (collective, size) with the run's time, algbw, busbw
    and #wrong, and with a baseline its busbw and the busbw ratio."""
    head = ["collective", "size", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"]
    if baseline is not None:
        head += [f"{labels[1]} busbw", "ratio"]
    lines = [head]
    for mine, base in merge_rows(rows, baseline):
        any_row = mine or base
        cells = [any_row["op"], human_size(any_row["size"])]
        if mine:
            cells += [
                _fmt(mine["time_us"], ".1f"),
                _fmt(mine["algbw"], ".3f"),
                _fmt(mine["busbw"], ".3f"),
                str(mine["wrong"]),
            ]
        else:
            cells += ["-", "-", "-", "-"]
        if baseline is not None:
            r = ratio(mine and mine["busbw"], base and base["busbw"])
            cells += [_fmt(base and base["busbw"], ".3f"), "-" if r is None else f"{r:.2f}x"]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        text = "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
        out.append(("# " if n == 0 else "  ") + text.rstrip())
    out.append("")
    out += summary_lines(rows, baseline, labels)
    return "\n".join(out)


def op_averages(rows: List[Dict]) -> Dict[str, float]:
    """Mean busbw per collective over its sizes (nccl-tests' 'Avg bus bandwidth')."""
    acc: Dict[str, List[float]] = {}
    for r in rows:
        acc.setdefault(r["op"], []).append(r["busbw"])
    return {op: sum(v) / len(v) for op, v in acc.items()}


def summary_lines(rows: List[Dict], baseline: Optional[List[Dict]], labels=("mpib", "baseline")) -> List[str]:
    mine, base = op_averages(rows), op_averages(baseline or [])
    out = [f"# avg busbw (GB/s) per collective, {labels[0]}" + (f" vs {labels[1]}" if baseline is not None else "")]
    for op in sorted(set(mine) | set(base), key=lambda o: _row_key({"op": o, "size": 0})):
        line = f"  {op:<15} {_fmt(mine.get(op), '.3f'):>9}"
        if baseline is not None:
            r = ratio(mine.get(op), base.get(op))
            line += f"  {_fmt(base.get(op), '.3f'):>9}  " + ("-" if r is None else f"{r:.2f}x")
        out.append(line)
    wrong = sum(r["wrong"] for r in rows)
    out.append(f"# wrong elements: {wrong}" + ("" if wrong == 0 else "  <-- DATA CORRUPTION"))
    return out


def make_row(op: str, size: int, seconds: float, nranks: int, wrong: int, iters: int) -> Dict:
    return {
        "op": op,
        "size": size,
        "time_us": seconds * 1e6,
        "algbw": algbw_gbps(size, seconds),
        "busbw": busbw_gbps(op, size, seconds, nranks),
        "wrong": wrong,
        "iters": iters,
    }


def load_results(path: str) -> Dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not a torch_collectives.py result (schema {SCHEMA})")
    for r in data["rows"]:
        missing = {"op", "size", "time_us", "algbw", "busbw", "wrong"} - set(r)
        if missing:
            raise ValueError(f"{path}: a row lacks {sorted(missing)}")
    return data


# --------------------------------------------------------------------------------------------
# mpib statistics files (MPIB_STATS_FILE): lines "rail<N>_<key>: <value>"
# --------------------------------------------------------------------------------------------

_STAT = re.compile(r"^\s*rail(\d+)_([A-Za-z0-9_]+)\s*:\s*(.*?)\s*$")


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_stats(text: str) -> Dict[int, Dict[str, object]]:
    """{rail: {key: value}}; keys keep file order; other lines (comments, totals) are ignored."""
    out: Dict[int, Dict[str, object]] = {}
    for line in text.splitlines():
        m = _STAT.match(line)
        if m:
            out.setdefault(int(m.group(1)), {})[m.group(2)] = _value(m.group(3))
    return out


def format_stats(stats: Dict[int, Dict[str, object]], title: str) -> str:
    if not stats:
        return f"# {title}: no rail<N>_<key> lines"
    rails = sorted(stats)
    keys: List[str] = []
    for r in rails:
        keys += [k for k in stats[r] if k not in keys]
    head = ["key"] + [f"rail{r}" + (" (SOUT)" if r == 0 else " (SUP)" if r == 1 else "") for r in rails]
    lines = [head] + [[k] + [str(stats[r].get(k, "-")) for r in rails] for k in keys]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    body = ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines]
    return "\n".join([f"# {title}"] + body)


def print_stats_files(paths: Sequence[str]) -> int:
    """Prints each file; returns how many were missing or empty."""
    absent = 0
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                print(format_stats(parse_stats(f.read()), f"mpib statistics {path}"))
        except OSError:
            print(f"# mpib statistics {path}: not written (the plugin writes it every MPIB_STATS_INTERVAL_MS and at close)")
            absent += 1
    return absent


# --------------------------------------------------------------------------------------------
# arguments and per-rank environment
# --------------------------------------------------------------------------------------------


def rank_env(rank: int, label: str, out_dir: Optional[str], fake_hosts: bool, hostid_prefix: str, stats: bool) -> Dict[str, str]:
    """What each rank sets before NCCL starts: its own NCCL_HOSTID (two "hosts" on one machine),
    its own NCCL log file and mpib statistics file (names as ci/nccl-rank-env.sh)."""
    env = {}
    if fake_hosts:
        env["NCCL_HOSTID"] = f"{hostid_prefix}-rank{rank}"
    if out_dir:
        env["NCCL_DEBUG_FILE"] = os.path.join(out_dir, f"{label}.rank{rank}.nccl.log")
        if stats:
            env["MPIB_STATS_FILE"] = os.path.join(out_dir, f"{label}.rank{rank}.stats")
    return env


def _ops(text: str) -> List[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {bad or text!r}; choose from {','.join(OPS)}")
    return ops


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _gpu(text: str) -> str:
    if text != "local" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"--gpu takes a CUDA device number or 'local', not {text!r}")
    return text


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--label", default="mpib", help="name of this run in files and tables (default mpib)")
    p.add_argument("--out-dir", default=None, help="rank logs, NCCL logs, stats and JSON go here")
    p.add_argument("--json", default=None, help="result file (default OUT_DIR/LABEL.json)")
    p.add_argument("--min-bytes", type=_size, default=parse_size("1K"), help="smallest size (default 1K)")
    p.add_argument("--max-bytes", type=_size, default=parse_size("256M"), help="largest size (default 256M)")
    p.add_argument("--factor", type=int, default=2, help="size step factor (default 2)")
    p.add_argument("--ops", type=_ops, default=list(OPS), help=f"comma list (default {','.join(OPS)})")
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: auto, 5..50)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations per size (default 3)")
    p.add_argument("--nranks", type=int, default=2, help="ranks to spawn when not under torchrun (default 2)")
    p.add_argument("--gpu", type=_gpu, default="0", help="CUDA device of every rank, or 'local' = LOCAL_RANK (default 0)")
    p.add_argument("--no-fake-hosts", dest="fake_hosts", action="store_false", help="keep NCCL_HOSTID as it is (real multi-node runs)")
    p.add_argument("--hostid-prefix", default="mpib-proof", help="NCCL_HOSTID is PREFIX-rank<N> (default mpib-proof)")
    p.add_argument("--stats", action="store_true", help="give each rank MPIB_STATS_FILE=OUT_DIR/LABEL.rank<N>.stats and print them")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the spawned ranks are killed (default 1800)")
    p.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (default: a free one)")
    p.add_argument(
        "--lifecycle",
        type=int,
        default=0,
        help="after the collectives, N rounds of: a second communicator beside the default one, both "
        "checked, both destroyed, the default one set up again (NCCL unloads and reloads the plugin) (default 0)",
    )
    p.add_argument(
        "--abort",
        action="store_true",
        help="at the end, abort a second communicator while a receive on it is in flight (its sender never "
        "sends), then check the default one still carries exact data",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torch_collectives.py",
        description="Two-rank PyTorch/NCCL collectives: exact checks, algbw/busbw table, mpib statistics.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    _run_options(sub.add_parser("run", help="run the collectives (spawns --nranks ranks unless under torchrun)"))
    t = sub.add_parser("table", help="print the table of a result, with a baseline column and the ratio")
    t.add_argument("result", metavar="RESULT.json")
    t.add_argument("--baseline", metavar="BASE.json", default=None)
    s = sub.add_parser("stats", help="print mpib statistics files")
    s.add_argument("files", nargs="+", metavar="FILE")
    e = sub.add_parser("rank-env", help="print the environment `run` gives one rank")
    _run_options(e)
    e.add_argument("--rank", type=int, required=True)
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.cmd in ("run", "rank-env"):
        try:
            args.sizes = size_list(args.min_bytes, args.max_bytes, args.factor)
        except ValueError as e:
            p.error(str(e))
        if args.iters < 0 or args.warmup < 0 or args.nranks < 2:
            p.error("--iters and --warmup must be >= 0 and --nranks >= 2")
        odd = [s for s in args.sizes if s % (ELEM * args.nranks)]
        if odd:
            p.error(f"sizes must be multiples of {ELEM * args.nranks} bytes ({ELEM}-byte elements x {args.nranks} ranks): {odd[:3]}")
        if args.json is None and args.out_dir:
            args.json = os.path.join(args.out_dir, f"{args.label}.json")
    return args


# --------------------------------------------------------------------------------------------
# launcher (no torch): spawns the ranks of one run on 127.0.0.1
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tee(src, dst_path: str) -> None:
    with open(dst_path, "w", encoding="utf-8") as dst:
        for line in iter(src.readline, ""):
            dst.write(line)
            dst.flush()
            sys.stdout.write(line)
            sys.stdout.flush()


def launch(args: argparse.Namespace, argv: Sequence[str]) -> int:
    out_dir = args.out_dir or os.path.join("target", "nccl-proof", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    if not args.out_dir:
        argv = list(argv) + ["--out-dir", out_dir]
        args.json = args.json or os.path.join(out_dir, f"{args.label}.json")
    port = args.port or free_port()
    print(f"[{args.label}] {args.nranks} ranks on 127.0.0.1:{port}, GPU {args.gpu}; logs in {out_dir}", flush=True)
    procs, tees = [], []
    for r in range(args.nranks):
        env = dict(os.environ)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(args.nranks))
        env.update(LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(args.nranks), PROOF_CHILD="1")
        env.update(rank_env(r, args.label, out_dir, args.fake_hosts, args.hostid_prefix, args.stats))
        log = os.path.join(out_dir, f"{args.label}.rank{r}.out")
        cmd = [sys.executable, os.path.abspath(__file__), "run", *argv]
        if r == 0:  # rank 0 prints progress: show it and keep it
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            t = threading.Thread(target=_tee, args=(p.stdout, log), daemon=True)
            t.start()
            tees.append(t)
        else:
            with open(log, "w", encoding="utf-8") as f:
                p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        procs.append(p)
    rcs, stopped = _wait_all(procs, args.timeout)
    if stopped:
        print(f"[{args.label}] ranks stopped: --timeout {args.timeout:g} s passed, or a rank failed and its peer did not finish", file=sys.stderr)
    for t in tees:
        t.join(timeout=10)
    for r, rc in enumerate(rcs):
        if rc != 0:
            print(f"[{args.label}] rank {r} exited with {rc}; last lines of {out_dir}/{args.label}.rank{r}.out:", file=sys.stderr)
            print(_tail(os.path.join(out_dir, f"{args.label}.rank{r}.out"), 25), file=sys.stderr)
    if args.json and os.path.exists(args.json) and rcs[0] in (0, 1):
        data = load_results(args.json)
        print(format_table(data["rows"], labels=(args.label, "baseline")))
    if args.stats:
        print_stats_files([os.path.join(out_dir, f"{args.label}.rank{r}.stats") for r in range(args.nranks)])
    return max(rcs) if all(rc >= 0 for rc in rcs) else 124


def _wait_all(procs, timeout: float) -> tuple:
    """Waits for every rank; once one fails (or time runs out) the others get 20 s, then are
    killed (a rank whose peer died waits in NCCL forever). Returns (exit codes, killed any)."""
    deadline, stopped = time.monotonic() + timeout, False
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        if failed:
            deadline = min(deadline, time.monotonic() + 20)
        if time.monotonic() > deadline:
            stopped = True
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            grace = time.monotonic() + 5
            while time.monotonic() < grace and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    return [p.wait() if p.returncode is None else p.returncode for p in procs], stopped


def _tail(path: str, n: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no output)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.cmd == "table":
        data = load_results(args.result)
        base = load_results(args.baseline) if args.baseline else None
        labels = (data.get("label", "mpib"), base.get("label", "baseline") if base else "baseline")
        print(format_table(data["rows"], base["rows"] if base else None, labels))
        return 1 if any(r["wrong"] for r in data["rows"]) else 0
    if args.cmd == "stats":
        return 1 if print_stats_files(args.files) == len(args.files) else 0
    if args.cmd == "rank-env":
        for k, v in sorted(rank_env(args.rank, args.label, args.out_dir, args.fake_hosts, args.hostid_prefix, args.stats).items()):
            print(f"{k}={v}")
        return 0
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    if not under_launcher:
        return launch(args, argv[1:])
    # The only path that needs torch. PROOF_WORKER names a stand-in module (CPU tests).
    module = importlib.import_module(os.environ.get("PROOF_WORKER") or "torch_collectives_worker")
    return module.worker(args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
