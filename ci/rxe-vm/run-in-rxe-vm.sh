#!/bin/bash
# run-in-rxe-vm.sh [options] DIR CMD [ARG...]
#
# Boots a Debian kernel under qemu with a busybox/rdma-core initramfs, loads
# rdma_rxe, creates two Soft-RoCE devices (rxe0 on 192.0.2.1, rxe1 on
# 192.0.2.2), mounts host folder DIR at /mnt/host (9p, read-write), runs CMD
# there with `sh`, prints its exit code, powers off and exits with that code.
#
# Options:
#   -t, --timeout SEC   hard limit for the whole VM run (default 600)
#   --copy              copy DIR into the initramfs instead of the 9p share
#                       (read-only snapshot; guest writes are lost)
#   --no-wire           do not add the policy routes that send rxe0<->rxe1
#                       traffic over the virtual wire (eth1 -> qemu hub ->
#                       eth0); without them only rxe0->rxe0 and rxe1->rxe1
#                       (loopback on one device) work
#   --lib FILE          also ship the shared libraries FILE needs (ldd), for
#                       host binaries that need libs the image lacks (repeat);
#                       executables at the top level of DIR get this anyway
#   --log FILE          serial console log (default: $RXE_VM_CACHE/last-run.log)
#   -v, --verbose       kernel messages and rxe/net state on the console
# Env: RXE_VM_CACHE (~/.cache/mpib-rxe-vm), RXE_VM_MEM (MiB, 2048),
#      RXE_VM_SMP (2), RXE_VM_NICS (1; 0 = no virtio NICs, the guest then
#      uses a veth pair), RXE_VM_ACCEL (auto|tcg|kvm; auto = kvm only if the CPU
#      shows vmx/svm, else tcg)
# In the guest the command sees RXE_DEV0/1, RXE_NETDEV0/1, RXE_IP0/1,
# RXE_GID_IDX0/1 (RoCE v2 IPv4 GID index), RXE_VM_WIRE and RXE_VM_GUEST=1.
# CMD runs under busybox sh as root, stdin /dev/null; use /usr/bin/ip for
# iproute2 (a plain `ip` there is the busybox applet).
# Exit codes: the command's, or 124 on timeout, 125 if setup/boot failed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ci/rxe-vm/lib.sh
. "$HERE/lib.sh"

TIMEOUT=600 SHARE=9p WIRE=1 VERBOSE=0 LOG='' LIBS=()
while (($#)); do
  case $1 in
    -t|--timeout) TIMEOUT=$2; shift 2 ;;
    --copy) SHARE=copy; shift ;;
    --wire) WIRE=1; shift ;;
    --no-wire) WIRE=0; shift ;;
    --lib) LIBS+=("$2"); shift 2 ;;
    --log) LOG=$2; shift 2 ;;
    -v|--verbose) VERBOSE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
(($# >= 2)) || { echo "usage: $0 [options] DIR CMD [ARG...]  (--help)" >&2; exit 2; }
DIR=$(realpath "$1"); shift
[[ -d $DIR ]] || { echo "not a directory: $DIR" >&2; exit 2; }
if (($# == 1)); then CMD=$1; else CMD=$(printf '%q ' "$@"); fi

T_START=$(date +%s.%N)
# Build what is missing or stale (under a lock: runs may be concurrent).
mkdir -p "$RXE_VM_CACHE"
OUT=$RXE_VM_CACHE/initramfs.cpio
exec 9> "$RXE_VM_CACHE/.lock"
flock 9
if [[ ! -f $OUT || ! -f $RXE_VM_CACHE/kernel.env ]] ||
   [[ -n $(find "$HERE" -maxdepth 1 \( -name 'guest-*.sh' -o -name build-initramfs.sh -o -name lib.sh -o -name setup-host.sh \) -newer "$OUT") ]]; then
  "$HERE/build-initramfs.sh"
fi
# shellcheck source=/dev/null # written by setup-host.sh into the cache at run time
. "$RXE_VM_CACHE/kernel.env"
LOG=${LOG:-$RXE_VM_CACHE/last-run.log}

TMP=$(mktemp -d /tmp/rxe-vm-run.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
OV=$TMP/overlay
mkdir -p "$OV/etc/rxe-vm" "$OV/mnt/host"
NONCE=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
cat > "$OV/etc/rxe-vm/run.env" <<EOV
RXE_VM_SHARE=$SHARE
RXE_VM_WIRE=$WIRE
RXE_VM_NONCE=$NONCE
RXE_VM_VERBOSE=$VERBOSE
EOV
printf '%s\n' "$CMD" > "$OV/etc/rxe-vm/cmd.sh"
[[ $SHARE == copy ]] && cp -a "$DIR/." "$OV/mnt/host/"
# Libraries of host-built executables: --lib files + ELF files at DIR's top.
while IFS= read -r -d '' f; do
  [[ $(head -c4 "$f" 2>/dev/null) == $'\x7fELF' ]] && LIBS+=("$f")
done < <(find "$DIR" -maxdepth 1 -type f -perm -u+x -print0)
for f in "${LIBS[@]}"; do
  for l in $(ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'); do
    g=$l; case $g in /lib/*|/lib64/*) g=/usr$g ;; esac
    [[ -e $RXE_VM_CACHE/initramfs-root$g ]] && continue
    mkdir -p "$OV$(dirname "$g")"; cp -L "$l" "$OV$g"
  done
done
# The kernel unpacks concatenated cpio archives one after the other.
(cd "$OV" && find . | cpio -o -H newc -R 0:0 --quiet) > "$TMP/overlay.cpio"
cat "$OUT" "$TMP/overlay.cpio" > "$TMP/initrd.cpio"
flock -u 9

ACCEL=${RXE_VM_ACCEL:-auto}
if [[ $ACCEL == auto ]]; then
  ACCEL=tcg
  if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then ACCEL=kvm; fi
fi
# shellcheck disable=SC2054 # the commas are inside qemu's option values, not between elements
if [[ $ACCEL == kvm ]]; then ACC=(-accel kvm -cpu host); else ACC=(-accel tcg,thread=multi -cpu max); fi
APPEND="console=ttyS0 panic=-1 mitigations=off"
((VERBOSE)) && APPEND+=" loglevel=7" || APPEND+=" quiet loglevel=3"
BIOS=(); [[ -f /usr/share/qemu/qboot.rom ]] && BIOS=(-bios /usr/share/qemu/qboot.rom)
NICS=()
# shellcheck disable=SC2054 # as above
[[ ${RXE_VM_NICS:-1} == 1 ]] && NICS=(
  -netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0,romfile=
  -netdev hubport,id=n1,hubid=0 -device virtio-net-pci,netdev=n1,romfile=)
SHAREDEV=()
# shellcheck disable=SC2054 # as above
[[ $SHARE == 9p ]] && SHAREDEV=(
  -fsdev "local,id=fs0,path=${DIR//,/,,},security_model=none"
  -device virtio-9p-pci,fsdev=fs0,mount_tag=host0)

rxe_vm_log "booting ($ACCEL, ${RXE_VM_SMP:-2} cpu, ${RXE_VM_MEM:-2048} MiB, kernel $KVER, share=$SHARE), log: $LOG"
set +e
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -nodefaults -no-user-config \
  -machine "${RXE_VM_MACHINE:-pc}" "${ACC[@]}" -smp "${RXE_VM_SMP:-2}" -m "${RXE_VM_MEM:-2048}" \
  "${BIOS[@]}" -kernel "$KIMG" -initrd "$TMP/initrd.cpio" -append "$APPEND" \
  -display none -chardev stdio,id=con0,signal=on -serial chardev:con0 -no-reboot \
  "${NICS[@]}" "${SHAREDEV[@]}" < /dev/null 2>&1 | tr -d '\r' | tee "$TMP/console.log"
QRC=${PIPESTATUS[0]}
set -e
cp "$TMP/console.log" "$LOG" 2>/dev/null || true
T_END=$(date +%s.%N)
RC=$(grep -a "^RXE_VM_EXIT_CODE_$NONCE=" "$TMP/console.log" | tail -n1 | cut -d= -f2 || true)
if [[ -z $RC ]]; then
  if ((QRC == 124 || QRC == 137)); then
    rxe_vm_log "TIMEOUT after ${TIMEOUT}s (qemu killed)"; RC=124
  else
    rxe_vm_log "guest ended without an exit code (qemu rc $QRC)"; RC=125
  fi
fi
BOOT=$(grep -a 'running command' "$TMP/console.log" | sed -n '1s/^\[rxe-vm \([0-9.]*\)s\].*/\1/p' || true)
rxe_vm_log "exit code $RC; wall $(awk "BEGIN{printf \"%.1f\", $T_END-$T_START}")s; guest uptime at command start ${BOOT:-?}s"
exit "$RC"
