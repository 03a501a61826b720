#!/usr/bin/env python3
"""Runs cargo and prints where it put the artifacts asked for, from cargo's own report.

    ci/cargo_artifacts.py KIND:NAME... -- CARGO_ARGS...

    e.g. ci/cargo_artifacts.py bin:mpib-perf cdylib:mpib -- build --release --workspace

Scripts must not guess paths under target/: CARGO_TARGET_DIR moves the whole tree, a
workspace member's outputs land in the workspace's target dir, and a library built only as
a dependency (`cargo build --bin X` from another package, `cargo test --test X`) stays in
deps/ instead of being copied up. Cargo says where each file is: with
--message-format=json-render-diagnostics it prints one `compiler-artifact` message per unit
it built or found fresh, while its progress and diagnostics go to stderr as usual.

For each KIND:NAME, in the order asked, one line on stdout: the artifact of the target NAME
(cargo's target name: `mpib` for the library, `mpib-perf`, `conformance`, ...) of KIND:
  bin       the binary's executable
  example   the example's executable
  test      the test harness of an integration test target (tests/NAME.rs)
  cdylib    the C shared library (.so)
The last matching message wins (a unit reported twice is the same file).

Exit status: cargo's when cargo fails; 1 when something asked for is not in the report
(said on stderr, with what the report held); 2 on bad usage. $CARGO names cargo (cargo sets
it for the processes it runs), else `cargo` on PATH.
"""
import json
import os
import subprocess
import sys

KINDS = ("bin", "example", "test", "cdylib")
SHARED_LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")


def usage(message):
    print(f"cargo_artifacts.py: {message}", file=sys.stderr)
    print("usage: ci/cargo_artifacts.py KIND:NAME... -- CARGO_ARGS...   (KIND: " + ", ".join(KINDS) + ")",
          file=sys.stderr)
    sys.exit(2)


def parse_wanted(words):
    wanted = []
    for w in words:
        kind, sep, name = w.partition(":")
        if not sep or not name or kind not in KINDS:
            usage(f"{w!r} is not KIND:NAME")
        wanted.append((kind, name))
    return wanted


def path_of(message, kind):
    """The file of this compiler-artifact message that KIND asks for, else None."""
    target = message.get("target", {})
    kinds = target.get("kind", [])
    is_test_build = message.get("profile", {}).get("test", False)
    if kind == "test":
        return message.get("executable") if "test" in kinds and is_test_build else None
    if is_test_build:
        # `cargo test` also builds each bin and lib as a test harness under the same name.
        return None
    if kind in ("bin", "example"):
        return message.get("executable") if kind in kinds else None
    if kind == "cdylib" and "cdylib" in kinds:
        for f in message.get("filenames", []):
            if f.endswith(SHARED_LIBRARY_SUFFIXES):
                return f
    return None


def select(messages, wanted):
    """{(kind, name): path} for every wanted artifact the messages report."""
    found = {}
    for m in messages:
        if m.get("reason") != "compiler-artifact":
            continue
        name = m.get("target", {}).get("name")
        for kind, want_name in wanted:
            if name == want_name:
                p = path_of(m, kind)
                if p:
                    found[(kind, want_name)] = p
    return found


def describe(messages):
    """The local packages' artifacts (not the dependencies' nor build scripts), for an error."""
    seen = []
    for m in messages:
        t = m.get("target", {})
        local = "path+file://" in m.get("package_id", "")
        if m.get("reason") == "compiler-artifact" and local and "custom-build" not in t.get("kind", []):
            test = " (test build)" if m.get("profile", {}).get("test") else ""
            seen.append(f"{'/'.join(t.get('kind', []))}:{t.get('name')}{test}")
    return ", ".join(seen) or "nothing"


def main(argv):
    if "--" not in argv:
        usage("missing -- before cargo's arguments")
    cut = argv.index("--")
    wanted = parse_wanted(argv[:cut])
    cargo_args = argv[cut + 1:]
    if not wanted or not cargo_args:
        usage("name at least one KIND:NAME and a cargo command")
    cargo = os.environ.get("CARGO") or "cargo"
    cmd = [cargo, *cargo_args, "--message-format=json-render-diagnostics"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    except OSError as e:
        print(f"cargo_artifacts.py: cannot run {cargo}: {e}", file=sys.stderr)
        return 1
    messages = []
    for line in proc.stdout:
        # Only JSON on stdout with this format; a build script's stray line is not ours.
        if line.startswith("{"):
            try:
                messages.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    rc = proc.wait()
    if rc != 0:
        return rc
    found = select(messages, wanted)
    missing = [f"{k}:{n}" for k, n in wanted if (k, n) not in found]
    if missing:
        print(f"cargo_artifacts.py: `cargo {' '.join(cargo_args)}` reported no {', '.join(missing)} "
              f"(it reported: {describe(messages)})", file=sys.stderr)
        return 1
    for key in wanted:
        print(found[key])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
