#!/usr/bin/env python3
"""Will the built plugin load on this host as it is? Reads the library with readelf and ldd.

Reports and checks:
  * NEEDED libraries (readelf -d): no RDMA library may be one (libibverbs, librdmacm, the
    provider libraries): mpib dlopens libibverbs at run time, so it loads on hosts without it;
  * the ncclNetPlugin_v<N> symbols NCCL looks up (readelf --dyn-syms): at least one exported;
  * the highest GLIBC symbol version it needs (readelf -V), and the symbols that need it
    (readelf --dyn-syms): the host's glibc must be at least that (the "host floor");
  * the ELF machine against this host's (an x86-64 build does not load on aarch64 GH200);
  * with ldd: every NEEDED library resolves on this host.

A release (ci/release.sh) also asks for hosts other than this one:
  --max-glibc 2.28     the glibc floor must be at most this version (RHEL 8 has 2.28);
  --allow-needed A,B   every NEEDED library must be one of these sonames;
  --program            an executable (mpib-perf), not a plugin: no entry points expected.

    ci/elf_check.py target/release/libnccl-net-mpib.so [--no-ldd] [--no-host]
    ci/elf_check.py LIB --no-host --max-glibc 2.28 --allow-needed libc.so.6,libm.so.6

Standard library only. Exit status: 0 loads, 1 a problem, 2 usage error or unreadable file.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

FORBIDDEN_NEEDED = ("libibverbs", "librdmacm", "libmlx4", "libmlx5", "libefa", "libbnxt_re", "librxe")
MACHINES = {"Advanced Micro Devices X86-64": "x86_64", "AArch64": "aarch64", "PowerPC64": "ppc64le"}


def parse_needed(readelf_d: str) -> List[str]:
    """`readelf -d`: ' 0x...1 (NEEDED)  Shared library: [libc.so.6]' -> ['libc.so.6', ...]."""
    return re.findall(r"\(NEEDED\)\s+Shared library:\s*\[([^\]]+)\]", readelf_d)


def parse_version_needs(readelf_v: str) -> Dict[str, List[str]]:
    """`readelf -V`, section .gnu.version_r: {'libc.so.6': ['GLIBC_2.2.5', ...], ...}."""
    needs: Dict[str, List[str]] = {}
    section = readelf_v.split("Version needs section", 1)
    if len(section) < 2:
        return needs
    current = None
    for line in section[1].splitlines():
        m = re.search(r"File:\s*(\S+)", line)
        if m:
            current = m.group(1)
            needs.setdefault(current, [])
            continue
        m = re.search(r"Name:\s*(\S+)", line)
        if m and current:
            needs[current].append(m.group(1))
        elif line.strip() and not line.startswith(" "):
            break  # next section
    return needs


def parse_dyn_symbols(readelf_syms: str) -> Tuple[List[Tuple[str, str]], List[str]]:
    """`readelf --dyn-syms --wide`: (undefined (symbol, version) pairs, defined symbol names)."""
    undefined, defined = [], []
    for line in readelf_syms.splitlines():
        tok = line.split()
        if len(tok) < 8 or not tok[0].endswith(":"):
            continue
        name = tok[7]
        sym, _, ver = name.partition("@")
        ver = ver.lstrip("@")
        if tok[6] == "UND":
            if ver:
                undefined.append((sym, ver))
        else:
            defined.append(sym)
    return undefined, defined


def version_key(name: str) -> Tuple[int, ...]:
    """'GLIBC_2.3.4' -> (2, 3, 4)."""
    m = re.search(r"(\d+(?:\.\d+)*)$", name)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def max_glibc(needs: Dict[str, List[str]]) -> Optional[str]:
    versions = [v for vs in needs.values() for v in vs if v.startswith("GLIBC_") and version_key(v)]
    return max(versions, key=version_key) if versions else None


def parse_ldd(text: str) -> Tuple[Dict[str, str], List[str]]:
    """`ldd`: ({name: path}, [names not found])."""
    found, missing = {}, []
    for line in text.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s*(?:\(0x[0-9a-f]+\))?\s*$", line)
        if not m:
            continue
        if m.group(2) == "not found":
            missing.append(m.group(1))
        else:
            found[m.group(1)] = m.group(2)
    return found, missing


def parse_machine(readelf_h: str) -> Optional[str]:
    m = re.search(r"Machine:\s*(.+)", readelf_h)
    if not m:
        return None
    text = m.group(1).strip()
    return MACHINES.get(text, text)


def host_glibc() -> Optional[str]:
    """'2.36' from confstr, None off glibc (musl)."""
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    m = re.match(r"glibc\s+(\S+)", v)
    return m.group(1) if m else None


@dataclass
class Report:
    lib: str
    program: bool = False  # an executable, not a plugin
    release: Optional[str] = None  # the release checks asked for, in words
    machine: Optional[str] = None
    needed: List[str] = field(default_factory=list)
    version_needs: Dict[str, List[str]] = field(default_factory=dict)
    glibc: Optional[str] = None
    glibc_symbols: List[str] = field(default_factory=list)  # symbols that need `glibc`
    plugin_symbols: List[str] = field(default_factory=list)
    host_machine: Optional[str] = None
    host_glibc: Optional[str] = None
    ldd_resolved: Dict[str, str] = field(default_factory=dict)
    ldd_missing: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)

    def render(self) -> str:
        out = [f"{'program' if self.program else 'plugin library'}: {self.lib}"]
        out.append(f"  machine:        {self.machine or '?'}")
        out.append(f"  NEEDED:         {', '.join(self.needed) or '(none)'}")
        for lib, vers in self.version_needs.items():
            out.append(f"  needs from {lib}: {', '.join(vers)}")
        if self.glibc:
            out.append(f"  glibc floor:    {self.glibc} (needed by {', '.join(self.glibc_symbols) or '?'})")
        if not self.program:
            out.append(f"  NCCL entry points: {', '.join(self.plugin_symbols) or '(none)'}")
        if self.host_glibc or self.host_machine:
            out.append(f"  this host:      {self.host_machine or '?'}, glibc {self.host_glibc or '?'}")
        for name, path in self.ldd_resolved.items():
            out.append(f"  ldd: {name} => {path}")
        for name in self.ldd_missing:
            out.append(f"  ldd: {name} => not found")
        out += [f"  PROBLEM: {p}" for p in self.problems]
        if self.release:
            out.append("  verdict: " + (f"fit for release ({self.release})" if not self.problems else "NOT FIT FOR RELEASE"))
        else:
            out.append("  verdict: " + ("loads on this host as it is" if not self.problems else "WILL NOT LOAD as it is"))
        return "\n".join(out)


Runner = Callable[[List[str]], str]


def _run(cmd: List[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def check(lib: str, run: Runner = _run, use_ldd: bool = True, host: bool = True,
          max_glibc_allowed: Optional[str] = None, allow_needed: Optional[Sequence[str]] = None,
          program: bool = False) -> Report:
    """Reads `lib` with readelf (and ldd) through `run` and judges it. `host` compares with
    this machine (glibc, architecture); without it only the library's own facts are checked.
    `max_glibc_allowed` ('2.28') bounds the glibc floor, `allow_needed` lists the only sonames
    it may need, `program` says it is an executable (no NCCL entry points)."""
    rep = Report(lib=lib, program=program)
    rep.machine = parse_machine(run(["readelf", "-h", lib]))
    rep.needed = parse_needed(run(["readelf", "-d", lib]))
    rep.version_needs = parse_version_needs(run(["readelf", "-V", "--wide", lib]))
    undefined, defined = parse_dyn_symbols(run(["readelf", "--dyn-syms", "--wide", lib]))
    rep.glibc = max_glibc(rep.version_needs)
    rep.glibc_symbols = sorted({s for s, v in undefined if v == rep.glibc})
    rep.plugin_symbols = sorted((s for s in defined if re.fullmatch(r"ncclNetPlugin_v\d+", s)), key=version_key)
    for n in rep.needed:
        if n.startswith(FORBIDDEN_NEEDED):
            rep.problems.append(f"{n} is NEEDED: RDMA libraries must be dlopened at run time, not linked")
    if not rep.plugin_symbols and not program:
        rep.problems.append("exports no ncclNetPlugin_v<N> symbol: NCCL would not find a plugin in it")
    asked = [f"glibc <= {max_glibc_allowed}"] if max_glibc_allowed else []
    asked += ["NEEDED within " + ", ".join(allow_needed)] if allow_needed is not None else []
    rep.release = "; ".join(asked) or None
    if max_glibc_allowed and rep.glibc and version_key(rep.glibc) > version_key(max_glibc_allowed):
        rep.problems.append(f"needs {rep.glibc} (by {', '.join(rep.glibc_symbols) or '?'}): "
                            f"above glibc {max_glibc_allowed}, so it does not load where that is all there is")
    if allow_needed is not None:
        for n in rep.needed:
            if n not in allow_needed:
                rep.problems.append(f"{n} is NEEDED: not one of the libraries allowed ({', '.join(allow_needed)})")
    if host:
        rep.host_machine, rep.host_glibc = platform.machine(), host_glibc()
        if rep.machine and rep.machine != rep.host_machine:
            rep.problems.append(f"built for {rep.machine}, this host is {rep.host_machine}")
        if rep.glibc and rep.host_glibc and version_key(rep.host_glibc) < version_key(rep.glibc):
            rep.problems.append(f"needs {rep.glibc}, this host has glibc {rep.host_glibc}")
    if use_ldd:
        rep.ldd_resolved, rep.ldd_missing = parse_ldd(run(["ldd", lib]))
        rep.problems += [f"{n} not found by the dynamic loader (ldd)" for n in rep.ldd_missing]
    return rep


def glibc_version(text: str) -> str:
    """'2.28' (or 'GLIBC_2.28') -> '2.28'; anything else is a usage error."""
    v = text[len("GLIBC_"):] if text.startswith("GLIBC_") else text
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a glibc version such as 2.28")
    return v


def sonames(text: str) -> List[str]:
    """'libc.so.6,libm.so.6' -> ['libc.so.6', 'libm.so.6']; an empty entry is a usage error."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated sonames, none empty")
    return names


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="elf_check.py", description="Check that the plugin library loads on this host as it is.")
    p.add_argument("lib", metavar="LIB", help="the built plugin, e.g. target/release/libnccl-net-mpib.so")
    p.add_argument("--no-ldd", dest="ldd", action="store_false", help="do not run ldd")
    p.add_argument("--no-host", dest="host", action="store_false", help="do not compare with this host (glibc, machine)")
    p.add_argument("--max-glibc", metavar="VERSION", type=glibc_version,
                   help="the highest glibc it may need, e.g. 2.28")
    p.add_argument("--allow-needed", metavar="SONAMES", type=sonames,
                   help="comma-separated sonames: the only libraries it may need")
    p.add_argument("--program", action="store_true", help="an executable, not a plugin (no entry points expected)")
    args = p.parse_args(argv)
    if not os.path.isfile(args.lib):
        print(f"elf_check.py: {args.lib}: no such file", file=sys.stderr)
        return 2
    try:
        rep = check(args.lib, use_ldd=args.ldd, host=args.host, max_glibc_allowed=args.max_glibc,
                    allow_needed=args.allow_needed, program=args.program)
    except FileNotFoundError as e:
        print(f"elf_check.py: {e.filename} is not installed (Debian: apt-get install binutils)", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"elf_check.py: {' '.join(e.cmd)} failed: {e.stderr.strip()}", file=sys.stderr)
        return 2
    print(rep.render())
    return 1 if rep.problems else 0


if __name__ == "__main__":
    sys.exit(main())
