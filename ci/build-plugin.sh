#!/usr/bin/env bash
# Builds the plugin (release) and puts it where NCCL finds it by name:
#   target/release/libnccl-net-mpib.so  (a link to cargo's libmpib.so)
# Then either  NCCL_NET_PLUGIN=mpib  with target/release on LD_LIBRARY_PATH,
# or           NCCL_NET_PLUGIN=$PWD/target/release/libnccl-net-mpib.so
# Usage: ci/build-plugin.sh [--debug]   (--debug: target/debug instead)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile=release
args=(--release)
if [[ ${1:-} == --debug ]]; then profile=debug; args=(); fi
cargo build "${args[@]}" --lib
dir=${CARGO_TARGET_DIR:-target}/$profile
ln -sf libmpib.so "$dir/libnccl-net-mpib.so"
echo "plugin: $(cd "$dir" && pwd)/libnccl-net-mpib.so"
