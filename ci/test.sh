#!/usr/bin/env bash
# The project's test command (README "Test"), and all that .ci/run runs. On a fresh Debian 12
# machine with only Rust it first installs what the tests need (ci/setup.sh test says what and
# why), then runs, in this order, stopping at the first failure:
#   static checks   cargo fmt, cargo clippy, shellcheck and ci/lint-pipefail.py on every
#                   shell script of the checkout
#   cargo test      the whole workspace (unit, C header and loader, soft fabric, conformance,
#                   mpib-perf, ...), the loom models of the soft fabric's lock-free parts, then
#                   a bounded fuzz run of the soft fabric's frame decoder and of the set-up
#                   message decoder
#   ci/tests        the CPU-side tests of the CI scripts (python3 -m unittest)
#   ci/release.sh   the x86_64 release archive (glibc 2.28), its ELF checks, and its
#                   unpacked mpib-perf's checked run against its unpacked plugin
#   ci/rxe-test.sh  real verbs on Soft-RoCE in a qemu guest (under 1500 s)
#   ci/netem-rails.sh  the auto split on two shaped veth rails (root; under 300 s); a missed
#                   goal is printed, wrong bytes or a rank's error fail
#   ci/netem-peers.sh  the per-peer view ranks a slowed peer first (root; a few seconds;
#                   skipped, and said so, where namespaces or tc cannot be used)
# Its last line is `ci/test.sh: all passed` and how long each step took.
# Env: MPIB_FUZZ_SECONDS (30); CARGO_TARGET_DIR is followed everywhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t_start=$(date +%s)

# step NAME TITLE: starts a step; the seconds each took are printed at the end, by NAME.
times='' step_name='' step_t0=0 skipped=''
step() {
  local now
  now=$(date +%s)
  [[ -n $step_name ]] && times+="${times:+, }$step_name $((now - step_t0))s"
  step_name=$1 step_t0=$now
  [[ -n ${2:-} ]] && printf '\n== %s\n' "$2"
  return 0
}

# Every shell script of the checkout, tracked or new: *.sh, and files whose first line names
# sh or bash (.ci/run, ci/tests/fakes/fake-mpirun).
shell_scripts() {
  local f first
  while IFS= read -r -d '' f; do
    [[ -f $f ]] || continue
    if [[ $f == *.sh ]]; then
      echo "$f"
      continue
    fi
    first=''
    IFS= read -r first <"$f" || true
    if [[ $first =~ ^\#!.*[/[:space:]](ba)?sh([[:space:]]|$) ]]; then echo "$f"; fi
  done < <(git ls-files -z --cached --others --exclude-standard)
}

step setup "prerequisites (ci/setup.sh test)"
ci/setup.sh test

step fmt "cargo fmt --check"
cargo fmt --all -- --check
step clippy "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step lint-scripts "shellcheck and ci/lint-pipefail.py (every shell script)"
mapfile -t scripts < <(shell_scripts)
((${#scripts[@]} > 5)) || { echo "ci/test.sh: found only ${#scripts[@]} shell scripts (git ls-files failed?)"; exit 1; }
echo "${#scripts[@]} scripts: ${scripts[*]}"
# -x: follow the files they source (their `# shellcheck source=` paths are from the root).
shellcheck -x "${scripts[@]}"
# A pipeline whose reader stops early under pipefail (a random SIGPIPE failure) is not
# something shellcheck sees; ci/lint-pipefail.py does.
python3 ci/lint-pipefail.py "${scripts[@]}"

step build "cargo build -p mpib --lib (the cdylib the C loader tests dlopen)"
cargo build -p mpib --lib
step cargo-test "cargo test --workspace"
cargo test --workspace

step loom "loom models of the SPSC ring and the soft fabric's spin lock, CQ ring and key table (--cfg loom)"
# A build of its own (--cfg loom changes every crate's flags): its own target subdirectory,
# so the steps around it keep their cache. Measured on 2 cores shared with other builds:
# ~5 min from an empty directory (the dependencies), ~75 s after a change to the crate;
# the models run ~16 s. The time limit stops a model whose search has gone wide.
loom_target="${CARGO_TARGET_DIR:-target}/loom"
CARGO_TARGET_DIR=$loom_target RUSTFLAGS="--cfg loom" timeout -k 10 900 \
  cargo test --release -p mpib --lib loom_models

step fuzz "fuzz the soft fabric frame decoder and the set-up message decoder (bounded)"
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
# Measured on 2 cores: build ~90 s, run MPIB_FUZZ_SECONDS per target.
for target in frame_decode setup_decode; do
  (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" -- -max_total_time="${MPIB_FUZZ_SECONDS:-30}")
done

step ci-tests "CPU tests of the CI scripts (python3 -m unittest discover -s ci/tests)"
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s ci/tests

step header "header up to date"
git diff --exit-code -- include/ || { echo "include/mpib.h changed by the build: commit the regenerated header"; exit 1; }

step release "release archive (ci/release.sh --arch x86_64)"
# Built against glibc 2.28 with cargo zigbuild; checked: the highest GLIBC symbol version
# (<= 2.28), NEEDED (glibc's libraries and the loader only), the unpacked archive's
# SHA256SUMS, mpib-perf --list and a checked run. Measured on 2 cores: 127 s from an empty
# target dir, 9 s again (zig and cargo-zigbuild from PyPI: once per machine, 10-15 s more);
# 330 s while other builds kept the load average at 10.
ci/release.sh --arch x86_64

step rxe "Soft-RoCE suites (ci/rxe-test.sh)"
# Real verbs on Soft-RoCE (a qemu guest with two rxe devices): ci/rxe-vm/README.md. The
# time limit keeps a hung guest from eating the CI budget.
timeout -k 30 1500 ci/rxe-test.sh

step netem "emulated rails (ci/netem-rails.sh)"
# Its last line is `auto_vs_sum: R static_vs_sum: R settle_ms: MS`. A missed goal is
# printed, a failed run (wrong bytes, a rank's error, a hang) fails.
timeout -k 30 300 ci/netem-rails.sh --out target/netem
# The per-peer view: a hub and 4 peers in namespaces of their own, one peer's link slowed; the
# hub's latency ranking must list every peer and the slowed one first. Measured on 2 cores:
# 3 s (the debug example and library are cargo-test's, already built). Exit 77: this host
# cannot run it (not root, no namespaces, veth, bridge or qdisc): said, and listed at the end.
rc=0
timeout -k 10 180 ci/netem-peers.sh --out target/netem-peers || rc=$?
case $rc in
  0) ;;
  77) skipped+="${skipped:+, }netem-peers" ;;
  *) exit "$rc" ;;
esac

step end
echo "ci/test.sh: all passed in $((step_t0 - t_start))s ($times)${skipped:+; skipped: $skipped}"
