#!/usr/bin/env bash
# The project's test command (README "Test"): formatting, lints, every test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n== %s\n' "$*"; }
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo build (the cdylib the C loader tests dlopen)"
cargo build --lib
step "cargo test"
cargo test
step "fuzz the soft fabric frame decoder and the set-up message decoder (bounded)"
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
# Measured on 2 cores: install ~45 s (once per machine), build ~90 s, run MPIB_FUZZ_SECONDS
# per target.
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for target in frame_decode setup_decode; do
  (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" -- -max_total_time="${MPIB_FUZZ_SECONDS:-30}")
done
step "CPU tests of the NCCL proof scripts (python3 -m unittest discover -s ci/tests)"
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s ci/tests
step "header up to date"
git diff --exit-code -- include/ || { echo "include/mpib.h changed by the build: commit the regenerated header"; exit 1; }
echo "ci/test.sh: all passed"
