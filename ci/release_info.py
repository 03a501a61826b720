#!/usr/bin/env python3
"""What ci/release.sh needs to know from cargo and the host, one fact per call.

    ci/release_info.py version            the plugin package's version (Cargo.toml), e.g. 0.1.0
    ci/release_info.py target-dir         cargo's target directory (CARGO_TARGET_DIR followed)
    ci/release_info.py triple ARCH        the Rust target of a release architecture
    ci/release_info.py allowed-needed ARCH  the sonames a released library may need, comma-separated

The first two ask `cargo metadata --no-deps` (cargo knows where CARGO_TARGET_DIR, a config
file or the workspace put the target directory; scripts must not guess). Exit status: 0,
1 when cargo fails or the package is missing, 2 on bad usage. Standard library only.
"""
import json
import os
import subprocess
import sys

PACKAGE = "mpib"

# Release architecture -> (Rust target, the dynamic loader's soname).
ARCHES = {
    "x86_64": ("x86_64-unknown-linux-gnu", "ld-linux-x86-64.so.2"),
    "aarch64": ("aarch64-unknown-linux-gnu", "ld-linux-aarch64.so.1"),
}

# What a released library may need: glibc's own libraries and the unwinder. libdl and
# libpthread hold dlopen and pthread_* before glibc 2.34 (they are empty stubs after it);
# librt, clock_* and shm_* before 2.17.
ALLOWED_NEEDED = ("libc.so.6", "libm.so.6", "libgcc_s.so.1", "libdl.so.2", "libpthread.so.0", "librt.so.1")


def package_version(metadata, name=PACKAGE):
    """The version of workspace package `name` in `cargo metadata` output (a dict)."""
    for p in metadata.get("packages", []):
        if p.get("name") == name:
            return p["version"]
    raise KeyError(f"cargo metadata lists no package {name!r}")


def target_directory(metadata):
    return metadata["target_directory"]


def triple(arch):
    return ARCHES[arch][0]


def allowed_needed(arch):
    return ",".join((*ALLOWED_NEEDED, ARCHES[arch][1]))


def metadata():
    cargo = os.environ.get("CARGO") or "cargo"
    out = subprocess.run([cargo, "metadata", "--no-deps", "--format-version", "1", "--locked"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def usage(msg):
    print(f"release_info.py: {msg}", file=sys.stderr)
    print("usage: ci/release_info.py version | target-dir | triple ARCH | allowed-needed ARCH"
          f"   (ARCH: {', '.join(ARCHES)})", file=sys.stderr)
    return 2


def main(argv):
    if not argv:
        return usage("say what to print")
    what, rest = argv[0], argv[1:]
    if what in ("triple", "allowed-needed"):
        if len(rest) != 1 or rest[0] not in ARCHES:
            return usage(f"{what} takes one architecture")
        print(triple(rest[0]) if what == "triple" else allowed_needed(rest[0]))
        return 0
    if what not in ("version", "target-dir") or rest:
        return usage(f"unknown request {' '.join(argv)!r}")
    try:
        m = metadata()
        print(package_version(m) if what == "version" else target_directory(m))
    except (OSError, subprocess.CalledProcessError, KeyError, ValueError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        print(f"release_info.py: cargo metadata: {detail.strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
