#!/usr/bin/env bash
# Builds the plugin (release) and puts it where NCCL finds it by name: a link
# libnccl-net-mpib.so next to cargo's libmpib.so (target/release/ unless CARGO_TARGET_DIR
# says otherwise). Its last line is `plugin: <absolute path of that link>`. Then either
#   NCCL_NET_PLUGIN=mpib  with that folder on LD_LIBRARY_PATH,
#   or NCCL_NET_PLUGIN=<that path>
# Usage: ci/build-plugin.sh [--debug]   (--debug: the dev profile instead)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
args=(--release)
if [[ ${1:-} == --debug ]]; then args=(); fi
# Where cargo put the library: its own report (ci/cargo_artifacts.py), not a guess.
lib=$(ci/cargo_artifacts.py cdylib:mpib -- build "${args[@]}" -p mpib --lib)
dir=$(dirname "$lib")
ln -sf "$(basename "$lib")" "$dir/libnccl-net-mpib.so"
echo "plugin: $(cd "$dir" && pwd)/libnccl-net-mpib.so"
