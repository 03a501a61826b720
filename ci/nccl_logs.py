#!/usr/bin/env python3
"""Reads what NCCL and nccl-tests print, and says whether a run proves what it should.

* `proof`: each rank's NCCL log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET) must show that
  NCCL loaded the plugin, chose it as its network, and connected channels through it:
      NET/Plugin: Loaded net plugin MPIB (v12)                    (every NCCL since 2.12)
      Using network MPIB                                          (src/init.cc)
      Channel 00/0 : 0[0] -> 1[0] [send] via NET/MPIB/0           (2.19+; older: 0[1b000],
      Channel 00 : 0[1b000] -> 1[1b000] [send] via NET/MPIB/0      "Ring 00 : 0 -> 1", PXN
                                                                   "NET/MPIB/0(1)", suffixes
                                                                   /GDRDMA, (PCI), /Shared)
* `baseline`: the same for NCCL's own socket transport, and no trace of the plugin.
* `nccl-tests`: the output of an nccl-tests binary run with `-c 1`: every `#wrong` is 0, the
  footer says `# Out of bounds values : 0 OK`, and there is an average bus bandwidth.

Standard library only; no NCCL, CUDA or torch needed (this runs in CI on a CPU machine).
Exit status of the command line: 0 proven / clean, 1 not, 2 usage error.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

PLUGIN_NAME = "MPIB"


# --------------------------------------------------------------------------------------------
# NCCL logs
# --------------------------------------------------------------------------------------------


def proof_patterns(name: str) -> List[tuple]:
    """(key, the line as the user should look for it, regex) for each proving line."""
    n = re.escape(name)
    return [
        ("loaded", f"Loaded net plugin {name}", re.compile(rf"Loaded net plugin\s+{n}(?![\w-])(?:\s*\(v(?P<ver>\d+)\))?")),
        ("using", f"Using network {name}", re.compile(rf"Using network\s+{n}(?![\w-])")),
        ("via", f"via NET/{name}/<dev>", re.compile(rf"via NET/{n}/(?P<dev>\d+)")),
    ]


_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)")
_NETWORK = re.compile(r"Using network\s+(?P<net>\S+)")
_VIA = re.compile(r"via NET/(?P<net>[^/\s]+)/\d+")
_WARN = re.compile(r"NCCL WARN\s+(?P<msg>.*)")
# Lines that explain why the plugin was not used (shown with a failure).
_HINTS = (
    re.compile(r"NET/Plugin\s*:?\s*(?:Could not find|Plugin load returned|No plugin found|dlerror=).*"),
    re.compile(r"Failed to initialize NET plugin \S+.*"),
    re.compile(r"(?:Error: network \S+ not found|Failed to initialize any NET plugin).*"),
    re.compile(r"MPIB: .*(?:fail|error|invalid|unknown|cannot|not ).*", re.IGNORECASE),
)


@dataclass
class LogProof:
    """What one rank's NCCL log shows."""

    name: str
    found: Dict[str, str] = field(default_factory=dict)  # key -> first matching line
    missing: List[str] = field(default_factory=list)  # the lines the user should look for
    unexpected: List[str] = field(default_factory=list)  # lines that must not be there
    nccl_version: Optional[str] = None
    plugin_abi: Optional[str] = None  # "v12" from "Loaded net plugin MPIB (v12)"
    networks: List[str] = field(default_factory=list)  # every "Using network X", in order
    via: List[str] = field(default_factory=list)  # every "via NET/X/" transport name
    hints: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected


def _scan(text: str, name: str) -> LogProof:
    proof = LogProof(name=name)
    pats = proof_patterns(name)
    for line in text.splitlines():
        for key, _, rx in pats:
            m = rx.search(line)
            if m and key not in proof.found:
                proof.found[key] = line.strip()
                if key == "loaded" and m.group("ver"):
                    proof.plugin_abi = "v" + m.group("ver")
        if proof.nccl_version is None:
            m = _VERSION.search(line)
            if m:
                proof.nccl_version = m.group("v")
        m = _NETWORK.search(line)
        if m:
            proof.networks.append(m.group("net"))
        m = _VIA.search(line)
        if m:
            proof.via.append(m.group("net"))
        m = _WARN.search(line)
        if m and len(proof.warnings) < 8:
            proof.warnings.append(m.group("msg").strip())
        for rx in _HINTS:
            m = rx.search(line)
            if m and len(proof.hints) < 8 and m.group(0).strip() not in proof.hints:
                proof.hints.append(m.group(0).strip())
    return proof


def check_plugin_log(text: str, name: str = PLUGIN_NAME) -> LogProof:
    """The proof that NCCL used plugin `name`: all three kinds of line, and no other network."""
    proof = _scan(text, name)
    for key, shown, _ in proof_patterns(name):
        if key not in proof.found:
            proof.missing.append(shown)
    for net in sorted(set(proof.networks) - {name}):
        proof.unexpected.append(f"Using network {net}")
    for net in sorted(set(proof.via) - {name}):
        proof.unexpected.append(f"via NET/{net}/")
    return proof


def check_baseline_log(text: str, net: str = "Socket", absent: str = PLUGIN_NAME) -> LogProof:
    """The proof that a run used NCCL's own transport `net` and did not load plugin `absent`."""
    proof = check_plugin_log(text, net)
    proof.missing = [m for m in proof.missing if not m.startswith("Loaded net plugin")]
    for key, shown, rx in proof_patterns(absent):
        if rx.search(text):
            proof.unexpected.append(shown)
    return proof


def describe(proof: LogProof, label: str) -> str:
    """A readable verdict; on failure it names every missing line and what the log says instead."""
    head = f"{label}: NCCL {proof.nccl_version or '?'}"
    if proof.ok:
        abi = f" (plugin ABI {proof.plugin_abi})" if proof.plugin_abi else ""
        return f"{head}: network {proof.name}{abi} proven by:\n" + "\n".join(
            f"    {proof.found[k]}" for k, _, _ in proof_patterns(proof.name) if k in proof.found
        )
    out = [f"{head}: NOT proven that NCCL used network {proof.name}"]
    out += [f"    missing line: {m!r}" for m in proof.missing]
    out += [f"    unexpected line: {u!r}" for u in proof.unexpected]
    if proof.networks:
        out.append(f"    NCCL says: Using network {', '.join(dict.fromkeys(proof.networks))}")
    out += [f"    hint: {h}" for h in proof.hints]
    out += [f"    NCCL WARN {w}" for w in proof.warnings]
    if not proof.nccl_version:
        out.append("    (no 'NCCL version' line: was NCCL_DEBUG=INFO set, and did NCCL start at all?)")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# nccl-tests output
# --------------------------------------------------------------------------------------------


@dataclass
class TestsRow:
    size: int
    count: int
    type: str
    redop: str
    root: str
    # out-of-place and in-place: (time_us, algbw, busbw, wrong); wrong None = "N/A" (no check)
    oop: Optional[tuple] = None
    ip: Optional[tuple] = None


@dataclass
class TestsResult:
    program: Optional[str] = None
    version: Optional[str] = None
    nccl_library: Optional[int] = None
    rows: List[TestsRow] = field(default_factory=list)
    oob: Optional[int] = None  # "# Out of bounds values : N OK|FAILED"
    avg_busbw: Optional[float] = None  # "# Avg bus bandwidth : X"
    failures: List[str] = field(default_factory=list)  # "Test NCCL failure ...", "# error: ..."

    def problems(self) -> List[str]:
        """Everything that makes the run not a clean, data-checked run."""
        p = []
        what = self.program or "nccl-tests"
        p += [f"{what}: {f}" for f in self.failures]
        if not self.rows:
            p.append(f"{what}: no result rows (did the test start? see its output)")
        for r in self.rows:
            for place, res in (("out-of-place", r.oop), ("in-place", r.ip)):
                if res is None:
                    continue
                wrong = res[3]
                if wrong is None:
                    p.append(f"{what}: size {r.size} {place}: #wrong is N/A (run with -c 1)")
                elif wrong != 0:
                    p.append(f"{what}: size {r.size} {place}: #wrong = {wrong:g} (data corruption)")
        if self.oob is None:
            p.append(f"{what}: no '# Out of bounds values' line (test did not finish)")
        elif self.oob != 0:
            p.append(f"{what}: Out of bounds values = {self.oob} (FAILED)")
        if self.avg_busbw is None:
            p.append(f"{what}: no '# Avg bus bandwidth' line (test did not finish)")
        return p


_T_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_T_VERSION = re.compile(r"nccl-tests version\s+(\S+)(?:.*nccl-library=(\d+))?")
_T_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_T_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_T_FAIL = re.compile(r"(Test (?:NCCL |CUDA )?failure.*|^#\s*error:\s*\S.*|Test timeout.*)")
_T_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+")


def _number(tok: str) -> Optional[float]:
    if tok == "N/A":
        return None
    return float(tok)


def _header_columns(line: str) -> Optional[List[str]]:
    cols = line.lstrip("#").split()
    if len(cols) >= 9 and cols[0] == "size" and "#wrong" in cols:
        return cols
    return None


def parse_nccl_tests(text: str) -> TestsResult:
    """Parses one nccl-tests run (stdout of rank 0). Columns are located from the header line,
    so per-iteration (-I) and timestamp columns do not shift #wrong."""
    res = TestsResult()
    cols: Optional[List[str]] = None
    for line in text.splitlines():
        m = _T_START.search(line)
        if m:
            res.program = m.group(1)
        m = _T_VERSION.search(line)
        if m and res.version is None:
            res.version = m.group(1)
            res.nccl_library = int(m.group(2)) if m.group(2) else None
        m = _T_OOB.search(line)
        if m:
            res.oob = int(m.group(1))
        m = _T_AVG.search(line)
        if m:
            try:
                res.avg_busbw = float(m.group(1))
            except ValueError:
                res.failures.append(f"unreadable average bus bandwidth {m.group(1)!r}")
        m = _T_FAIL.search(line)
        if m:
            res.failures.append(m.group(1).strip())
        if line.startswith("#"):
            cols = _header_columns(line) or cols
            continue
        if not _T_ROW.match(line):
            continue
        tok = line.split()
        starts = [i for i, c in enumerate(cols or []) if c in ("time", "cputime")] or [5, 9]
        ncols = len(cols) if cols else 13
        if len(tok) == ncols - 4 and len(starts) == 2:
            # nccl-tests prints a blank out-of-place body for some modes (only in-place)
            starts = [None, starts[1] - 4]
        try:
            row = TestsRow(size=int(tok[0]), count=int(tok[1]), type=tok[2], redop=tok[3], root=tok[4])
            groups = []
            for s in starts[:2]:
                groups.append(None if s is None else tuple(_number(t) for t in tok[s : s + 4]))
            row.oop = groups[0]
            row.ip = groups[1] if len(groups) > 1 else None
            for g in groups:
                if g is not None and len(g) != 4:
                    raise ValueError("short row")
        except (ValueError, IndexError):
            res.failures.append(f"unreadable result row: {line.strip()!r}")
            continue
        res.rows.append(row)
    return res


def summarize_nccl_tests(res: TestsResult) -> str:
    rows = res.rows
    biggest = max(rows, key=lambda r: r.size) if rows else None
    parts = [res.program or "nccl-tests", f"{len(rows)} sizes"]
    if biggest and biggest.oop:
        parts.append(f"busbw at {biggest.size} B: {biggest.oop[2]:g} GB/s")
    if res.avg_busbw is not None:
        parts.append(f"avg busbw {res.avg_busbw:g} GB/s")
    if res.oob is not None:
        parts.append(f"out of bounds {res.oob}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nccl_logs.py",
        description="Check NCCL logs for the lines proving the network used, and nccl-tests output for data errors.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("proof", help="each LOG (one rank's NCCL log) must prove NCCL used the plugin")
    a.add_argument("--net", default=PLUGIN_NAME, help="plugin name NCCL prints (default MPIB)")
    a.add_argument("logs", nargs="+", metavar="LOG")
    b = sub.add_parser("baseline", help="each LOG must prove NCCL used its own transport, not the plugin")
    b.add_argument("--net", default="Socket", help="expected network (default Socket)")
    b.add_argument("--absent", default=PLUGIN_NAME, help="plugin that must not appear (default MPIB)")
    b.add_argument("logs", nargs="+", metavar="LOG")
    c = sub.add_parser("nccl-tests", help="each OUT (nccl-tests stdout, -c 1) must be clean")
    c.add_argument("outputs", nargs="+", metavar="OUT")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    bad = 0
    paths = args.logs if args.cmd in ("proof", "baseline") else args.outputs
    for path in paths:
        try:
            text = _read(path)
        except OSError as e:
            print(f"{path}: cannot read: {e.strerror}", file=sys.stderr)
            bad += 1
            continue
        if args.cmd == "nccl-tests":
            res = parse_nccl_tests(text)
            problems = res.problems()
            if problems:
                bad += 1
                print(f"{path}: FAILED", file=sys.stderr)
                for pr in problems:
                    print(f"    {pr}", file=sys.stderr)
            else:
                print(f"{path}: OK: {summarize_nccl_tests(res)}")
            continue
        if args.cmd == "proof":
            proof = check_plugin_log(text, args.net)
        else:
            proof = check_baseline_log(text, args.net, args.absent)
        print(describe(proof, path), file=sys.stdout if proof.ok else sys.stderr)
        bad += not proof.ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
