#!/usr/bin/env bash
# Installs what the build, and with `test` the tests, need on Debian 12, saying what it
# installs and why; does nothing when everything is there. Nobody has to run it first:
# ci/mpib-perf.sh runs `ci/setup.sh build`, ci/test.sh runs `ci/setup.sh test`.
#
#   ci/setup.sh [build|test]      (default: test, which includes build)
#   ci/setup.sh release [ARCH...]  build, and what ci/release.sh needs for each ARCH
#                                  (x86_64, aarch64; default this host's)
#
# apt-get runs as root, through sudo when this is not root. Rust itself (cargo) must already
# be there (https://rustup.rs); its rustfmt and clippy components are added for `test`.
# ci/rxe-test.sh installs the Soft-RoCE rig's packages itself (ci/rxe-vm/setup-host.sh).
set -euo pipefail

what=${1:-test}
[[ $what == build || $what == test || $what == release ]] || {
  echo "usage: ci/setup.sh [build|test] | ci/setup.sh release [ARCH...]" >&2
  exit 2
}
shift || true
release_arches=("$@")
[[ $what == release ]] || ((${#release_arches[@]} == 0)) || { echo "ci/setup.sh: architectures only with release" >&2; exit 2; }
say() { echo "ci/setup.sh: $*" >&2; }

# Each entry: "package: why". rdma-mummy-sys (the libibverbs bindings) builds its dlopen
# stub of libibverbs with cmake and runs bindgen, which needs libclang, on its vendored
# rdma-core headers; no rdma-core -dev package is needed.
packages=(
  "build-essential: the C compiler and linker (rdma-mummy-sys's stub, the cdylib, the C tests)"
  "cmake: rdma-mummy-sys builds its libibverbs stub with cmake"
  "libclang-dev: bindgen (in rdma-mummy-sys's build) parses the rdma-core headers with libclang"
  "python3: ci/cargo_artifacts.py reads cargo's report of where it put the binaries"
)
if [[ $what == test ]]; then
  packages+=(
    "binutils: nm and readelf for the exported-symbol and ELF tests"
    "valgrind: the leak test (tests/leaks.rs)"
    "iproute2: ip and tc for ci/netem-rails.sh's namespaces and shaped rails"
    "shellcheck: ci/test.sh lints every shell script"
    "python3-prometheus-client: ci/tests parse the Prometheus textfile with prometheus_client's parser"
  )
fi

if [[ $what == release ]]; then
  ((${#release_arches[@]})) || release_arches=("$(uname -m)")
  packages+=(
    "binutils: readelf for ci/elf_check.py's checks of the released files"
    "python3-venv: ci/release.sh installs zig and cargo-zigbuild (PyPI) in a virtual environment"
  )
  for arch in "${release_arches[@]}"; do
    case $arch in
      x86_64 | aarch64) packages+=("binutils-${arch//_/-}-linux-gnu: ${arch}-linux-gnu-objcopy splits the $arch library's debug information") ;;
      *) say "no release for architecture $arch (x86_64, aarch64)"; exit 2 ;;
    esac
  done
fi

command -v cargo >/dev/null || { say "cargo is missing: install Rust first (https://rustup.rs), then run this again"; exit 1; }

# Packages not installed, from dpkg's own status.
missing=() why=()
installed() {
  local status
  status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 1
  [[ $status == "install ok installed" ]]
}
if command -v dpkg-query >/dev/null; then
  for entry in "${packages[@]}"; do
    p=${entry%%:*}
    installed "$p" || { missing+=("$p"); why+=("$entry"); }
  done
else
  say "no dpkg here (not Debian?): make sure these are installed:"
  printf '  %s\n' "${packages[@]}" >&2
fi

if ((${#missing[@]})); then
  say "installing ${#missing[@]} Debian package(s) the $what needs:"
  printf '  %s\n' "${why[@]}" >&2
  sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || {
      say "not root and no sudo: as root, run  apt-get install ${missing[*]}"
      exit 1
    }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Another apt or dpkg (a parallel job) holds the lock for a while: wait for it.
  apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 -qq)
  t0=$(date +%s)
  if ! "${apt[@]}" update || ! "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null; then
    say "could not install ${missing[*]} (see apt-get's message above); install them, then run this again"
    exit 1
  fi
  say "installed ${missing[*]} in $(($(date +%s) - t0))s"
else
  say "the $what's Debian packages are all installed (${packages[*]%%:*})"
fi

if [[ $what == test ]]; then
  # The Debian package serves Debian's python3; a python3 of its own first on PATH (pyenv,
  # a virtual environment) gets prometheus_client from PyPI.
  if ! python3 -c 'import prometheus_client' 2>/dev/null; then
    say "installing prometheus_client from PyPI for $(command -v python3) (ci/tests parse the Prometheus textfile)"
    python3 -m pip install --quiet prometheus_client ||
      say "could not install prometheus_client: ci/tests' Prometheus parse test will say it skipped"
  fi
  # cargo's subcommand, and the rustup component that provides it.
  for pair in fmt:rustfmt clippy:clippy; do
    if ! cargo "${pair%%:*}" --version >/dev/null 2>&1; then
      say "adding the Rust component ${pair#*:} (ci/test.sh checks formatting and lints)"
      rustup component add "${pair#*:}" >&2
    fi
  done
  # The soft fabric's frame decoder is fuzzed in ci/test.sh. ~45 s once per machine.
  if ! command -v cargo-fuzz >/dev/null; then
    say "installing cargo-fuzz (ci/test.sh fuzzes the soft fabric's frame decoder)"
    cargo install cargo-fuzz --locked
  fi
fi
