#!/usr/bin/env bash
# The main job from a fresh clone (README "Quick start on two hosts"): installs the build's
# prerequisites when they are missing (ci/setup.sh build says what and why), builds the
# release workspace, and runs mpib-perf on the plugin library that build made. Arguments
# go to mpib-perf as they are:
#
#   ci/mpib-perf.sh                       # two local ranks, every size, every byte checked
#   ci/mpib-perf.sh --sizes 1M --bidir    # ... or any of mpib-perf's options (--help)
#
# Both paths come from cargo's own report of what it built (ci/cargo_artifacts.py), so a
# CARGO_TARGET_DIR and the workspace's layout are followed. `--plugin <libmpib.so>` is
# added unless the arguments have a --plugin of their own.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

"$ROOT/ci/setup.sh" build
echo "ci/mpib-perf.sh: cargo build --release --workspace" >&2
# In ROOT for cargo only: mpib-perf runs here, where relative paths in the arguments
# (--json FILE, --timeline FILE) were meant.
built=$(cd "$ROOT" && ci/cargo_artifacts.py bin:mpib-perf cdylib:mpib -- build --release --workspace)
{ read -r perf; read -r lib; } <<<"$built"

plugin=(--plugin "$lib")
for a in "$@"; do
  [[ $a == --plugin || $a == --plugin=* ]] && plugin=()
done
exec "$perf" "${plugin[@]}" "$@"
