#!/usr/bin/env bash
# The project's test command (README "Test"): formatting, lints, every test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n== %s\n' "$*"; }
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo test"
cargo test
step "CPU tests of the NCCL proof scripts (python3 -m unittest discover -s ci/tests)"
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s ci/tests
step "header up to date"
git diff --exit-code -- include/ || { echo "include/mpib.h changed by the build: commit the regenerated header"; exit 1; }
echo "ci/test.sh: all passed"
