#!/bin/bash
# Installs the host packages (apt, Debian 12) and unpacks a Debian kernel
# (linux-image-*-amd64, fetched with `apt-get download`, NOT installed on the
# host) into the cache. Idempotent: does nothing when all is already there.
#
# Env: RXE_VM_CACHE (default ~/.cache/mpib-rxe-vm)
#      RXE_VM_KERNEL_PKG (default: what linux-image-amd64 depends on)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ci/rxe-vm/lib.sh
. "$HERE/lib.sh"

# (dpkg-query's output is not piped into an early-exiting grep: under pipefail that can fail.)
installed() {
  local status
  status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 1
  [[ $status == "install ok installed" ]]
}
missing=()
for p in "${RXE_VM_HOST_PKGS[@]}"; do
  installed "$p" || missing+=("$p")
done
if ((${#missing[@]})); then
  rxe_vm_log "installing host packages: ${missing[*]}"
  t0=$(date +%s)
  export DEBIAN_FRONTEND=noninteractive
  # Another apt/dpkg may be running (e.g. a parallel session): wait for it.
  for _ in $(seq 120); do
    if ! command -v fuser >/dev/null || ! fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; then break; fi
    sleep 2
  done
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rxe_vm_log "host packages installed in $(( $(date +%s) - t0 ))s"
fi

mkdir -p "$RXE_VM_CACHE"
if [[ -f $RXE_VM_CACHE/kernel.env ]]; then
  # shellcheck source=/dev/null # written by setup-host.sh into the cache at run time
  . "$RXE_VM_CACHE/kernel.env"
  if [[ -f $KIMG && -f $KMODROOT/lib/modules/$KVER/modules.dep ]]; then
    exit 0
  fi
fi

t0=$(date +%s)
KPKG=${RXE_VM_KERNEL_PKG:-}
if [[ -z $KPKG ]]; then
  # The first linux-image-* the metapackage depends on (awk reads to the end: pipefail).
  # shellcheck disable=SC2016 # an awk program: $2 is awk's field
  first_dep='/Depends: linux-image-/ && kpkg == "" { kpkg = $2 } END { if (kpkg != "") print kpkg }'
  KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk "$first_dep")
  if [[ -z $KPKG ]]; then
    apt-get update -qq
    KPKG=$(apt-cache depends linux-image-amd64 | awk "$first_dep")
  fi
fi
[[ -n $KPKG ]] || { rxe_vm_log "cannot find the kernel package"; exit 1; }
rxe_vm_log "downloading kernel package $KPKG"
debdir=$RXE_VM_CACHE/debs
rm -rf "$debdir"; mkdir -p "$debdir"; chmod 777 "$debdir"
# apt-get download's note about the unsandboxed download (root) is noise here.
(cd "$debdir" && { apt-get download -qq "$KPKG" 2>&1 | grep -v 'Download is performed unsandboxed' || true; })
deb=$(ls "$debdir"/"$KPKG"_*.deb)
KMODROOT=$RXE_VM_CACHE/kernel
rm -rf "$KMODROOT"; mkdir -p "$KMODROOT"
dpkg-deb -x "$deb" "$KMODROOT"
kvers=("$KMODROOT"/lib/modules/*)
KVER=${kvers[0]##*/}
KIMG=$KMODROOT/boot/vmlinuz-$KVER
depmod -b "$KMODROOT" "$KVER"
# Under TCG, decompressing the xz bzImage costs ~5-10 s per boot. Debian's
# kernel has CONFIG_PVH, so qemu can boot the uncompressed ELF vmlinux
# directly: unpack it once here (fallback: the bzImage).
# The offset of the first match (grep prints OFFSET:MATCH; the match is binary, so sed too
# runs in the C locale, and reads to the end: pipefail).
off=$(LC_ALL=C grep -obUaP '\xfd\x37\x7a\x58\x5a\x00' "$KIMG" | LC_ALL=C sed -n '1s/:.*//p' || true)
if [[ -n $off ]]; then
  tail -c +$((off + 1)) "$KIMG" | xz -dcq > "$KMODROOT/boot/vmlinux-$KVER" 2>/dev/null || true
  notes=$(readelf -n "$KMODROOT/boot/vmlinux-$KVER" 2>/dev/null || true)
  if grep -q 'Xen.*0x00000012\|0x00000012' <<<"$notes"; then
    KIMG=$KMODROOT/boot/vmlinux-$KVER
  else
    rm -f "$KMODROOT/boot/vmlinux-$KVER"
  fi
fi
cat > "$RXE_VM_CACHE/kernel.env" <<EOV
KPKG=$KPKG
KVER=$KVER
KIMG=$KIMG
KMODROOT=$KMODROOT
EOV
rm -rf "$debdir"
rxe_vm_log "kernel $KVER unpacked in $(( $(date +%s) - t0 ))s"
