#!/usr/bin/env bash
# Installs the build and test prerequisites on Debian 12 (idempotent). README "Set-up".
set -euo pipefail
# cmake + libclang-dev: rdma-mummy-sys builds its libibverbs dlopen stub with cmake and
# runs bindgen (libclang) on its vendored rdma-core headers. No rdma-core -dev package needed.
# iproute2 (ip, tc) + python3: ci/netem-rails.sh's namespaces, veth rails and shaping.
pkgs=(build-essential pkg-config binutils valgrind cmake libclang-dev iproute2 python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo --version
