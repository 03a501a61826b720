#!/usr/bin/env bash
# ci/rxe-test.sh — real verbs on Soft-RoCE: boots a Debian kernel under qemu with two rxe
# devices (rxe0, rxe1: two rails; see ci/rxe-vm/README.md) and runs the suites below in it.
#
#   ci/rxe-test.sh [SUITE...]     (default: all suites, in the order listed below)
#
# On a fresh machine it first installs the host packages and unpacks the kernel and the
# initramfs into the cache ($RXE_VM_CACHE, default ~/.cache/mpib-rxe-vm); later runs reuse
# them. It builds the test binaries on the host (cargo, debug profile: shared with
# ci/test.sh), shares them into the guest, runs every suite there under a time limit, and
# exits non-zero when anything failed. The last line it prints is `N passed, N failed`
# (libtest suites count their tests; other suites count as one test).
#
# Env: RXE_TEST_SUITE_TIMEOUT (s per suite, 600), RXE_TEST_VM_TIMEOUT (s for the VM, 1500),
#      RXE_MANY_COMMS (connections each way of the many-connections suite, 64),
#      RXE_LIFECYCLE_SEEDS (percent of the host's seeds the lifecycle suite runs, 20),
#      and ci/rxe-vm/run-in-rxe-vm.sh's variables (RXE_VM_CACHE, RXE_VM_MEM, RXE_VM_SMP, ...).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export RXE_VM_CACHE=${RXE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpib-rxe-vm}
SUITE_TIMEOUT=${RXE_TEST_SUITE_TIMEOUT:-600}
VM_TIMEOUT=${RXE_TEST_VM_TIMEOUT:-1500}
log() { echo "[rxe-test] $*" >&2; }

# ---- suites ------------------------------------------------------------------------------
# A suite is a name, a host step `build_<name> DIR` that puts what it needs into DIR (the
# guest sees DIR as its working directory), and a guest command (busybox sh, root; the
# guest's variables RXE_DEV0/1, RXE_GID_IDX0/1, RXE_NETDEV0/1, RXE_IP0/1 are set).
# Suites run in this order; one that breaks the guest's network for good must come last.
SUITES=()
declare -A SUITE_CMD
suite() { SUITES+=("$1"); SUITE_CMD[$1]=$2; }

# Copies the executable of cargo test target $1 into DIR $2 as $1. Its path comes from
# cargo's own report (ci/cargo_artifacts.py): CARGO_TARGET_DIR and the workspace's layout
# move it, and cargo also builds the package's binaries for an integration test.
cargo_test_binary() {
  local exe
  exe=$(ci/cargo_artifacts.py "test:$1" -- test -q --workspace --test "$1" --no-run) || { log "cannot build test target $1"; return 1; }
  cp "$exe" "$2/$1"
}

# Copies mpib-rank, the rank program of the two-process tests (crates/mpib-tools/tests/common
# finds it beside the test binary), into DIR $1.
cargo_rank_program() {
  local rank
  rank=$(ci/cargo_artifacts.py bin:mpib-rank -- build -q -p mpib-tools --bin mpib-rank) || { log "cannot build mpib-rank"; return 1; }
  cp "$rank" "$1/mpib-rank"
}

# Copies the plugin library (debug) into DIR $1 as libmpib.so: the file `cargo build` just
# reported (cargo test rebuilds the copy in deps/, cargo build the one it names).
cargo_plugin_library() {
  local lib
  lib=$(ci/cargo_artifacts.py cdylib:mpib -- build -q -p mpib --lib) || { log "cannot build the plugin library"; return 1; }
  cp "$lib" "$1/libmpib.so"
}

# The rig itself: both ports active, and rdma-core's own RC ping-pong from rxe1 to rxe0
# over the virtual wire. If this fails, the failures below are the rig's, not mpib's.
build_rig() { :; }
# shellcheck disable=SC2016 # expands in the guest
suite rig 'for d in $RXE_DEV0 $RXE_DEV1; do grep -q ACTIVE /sys/class/infiniband/$d/ports/1/state || { echo "$d not ACTIVE"; exit 1; }; done
ibv_rc_pingpong -d $RXE_DEV0 -g $RXE_GID_IDX0 -n 200 > /tmp/pp-server.log 2>&1 &
sleep 1
ibv_rc_pingpong -d $RXE_DEV1 -g $RXE_GID_IDX1 -n 200 $RXE_IP0; rc=$?
wait $! || rc=1
cat /tmp/pp-server.log; exit $rc'

# The verbs provider's device tests (tests/verbs_device.rs), rxe0 and rxe1 as the two ports
# (peer_child and auto_child are child processes of two of them, started by those tests).
build_verbs-device() { cargo_test_binary verbs_device "$1"; }
suite verbs-device './verbs_device --ignored --test-threads=1 --skip peer_child --skip auto_child --skip port_down_is_seen_and_skipped --skip a_small_memlock_limit_is_warned_and_named_in_errors'

# Locked memory (tests/verbs_device.rs): the plugin run as nobody under `ulimit -l 64` (busybox
# su; the guest runs as root, and root has CAP_IPC_LOCK): init WARNs with the ulimit advice, and
# the registration the limit refuses fails with an error naming RLIMIT_MEMLOCK, not a crash.
build_memlock() { cargo_test_binary verbs_device "$1"; }
# shellcheck disable=SC2016 # expands in the guest
suite memlock 'cp verbs_device /tmp/verbs_device && cd /tmp && su -p -s /bin/sh nobody -c "ulimit -l 64 && MPIB_TEST_MEMLOCK=1 MPIB_FABRIC=verbs MPIB_HCA_SOUT=$RXE_DEV0 MPIB_HCA_SUP=$RXE_DEV1 ./verbs_device --ignored --exact a_small_memlock_limit_is_warned_and_named_in_errors --test-threads=1 --nocapture"'

# The protocol conformance suite (tests/conformance.rs: two processes driving the built
# library through the C ABI) on real verbs: rxe0 = SOUT, rxe1 = SUP, RoCE v2 GID chosen
# automatically. Sizes 0 B .. >512 MiB, n = 1..8, 32 in flight, forced and auto splits,
# checksums, counters (1 WR per active rail, nothing on an inactive one), every ABI version,
# bad handles, killed peers. A killed peer is only noticed by RC's retry budget (the kernel
# drops packets for a destroyed QP without a NAK), and rxe reads retry_cnt 7 as "retry
# forever" (rxe_comp.c; real NICs retry 7 times): MPIB_TIMEOUT=16 MPIB_RETRY_CNT=6 bound it
# at 4.096 us * 2^16 * 7 = 1.9 s, inside the suite's 30 s no-progress limit. Under qemu the
# 512 MiB message takes ~30 s with no completion before its end: CONFORMANCE_STALL_MS, and
# MPIB_STALL_MS=0 (the failover stall bound would take that rail for stalled); and
# 100,000 small messages took over the default 180 s per run on a busy host while making
# steady progress: CONFORMANCE_TIMEOUT_S (the parent's last resort against a rank hung in a call).
build_conformance() {
  cargo_test_binary conformance "$1" || return 1
  cargo_rank_program "$1" || return 1
  cargo_plugin_library "$1"
}
# shellcheck disable=SC2016 # expands in the guest
VERBS_ENV='MPIB_FABRIC=verbs MPIB_HCA_SOUT=$RXE_DEV0 MPIB_HCA_SUP=$RXE_DEV1 MPIB_TIMEOUT=16 MPIB_RETRY_CNT=6 MPIB_STALL_MS=0'
suite conformance "CONFORMANCE_STALL_MS=120000 CONFORMANCE_TIMEOUT_S=900 NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./conformance --test-threads=1"

# The same protocol with the GID given explicitly (MPIB_GID_INDEX), on a subset. The same
# stall bound as the conformance suite: under qemu (tcg) on a loaded host a rank took more
# than the default 20 s to connect (multi_receives, with another VM on the same 2 cores).
build_conformance-gid() { build_conformance "$1"; }
# shellcheck disable=SC2016 # expands in the guest
suite conformance-gid '[ "$RXE_GID_IDX0" = "$RXE_GID_IDX1" ] || { echo "rxe0 and rxe1 have different RoCE v2 GID indexes"; exit 1; }
CONFORMANCE_STALL_MS=120000 CONFORMANCE_TIMEOUT_S=900 NCCL_NET_PLUGIN=$PWD/libmpib.so CONFORMANCE_ENV="'"$VERBS_ENV"' MPIB_GID_INDEX=$RXE_GID_IDX0" ./conformance --test-threads=1 sizes_from split_50 multi_receives'

# Many connections on one communicator (crates/mpib-tools/tests/many_connections.rs) on real
# verbs: RXE_MANY_COMMS (64) send and 64 receive comms per rank over one init, checksummed
# traffic on all at once, closed and reopened twice, one CQ and one SRQ per rail NIC, nothing
# left behind. rxe's CQs hold at most 32,767 entries (max_cqe): one CQ per NIC and
# communicator must hold every send-queue WR and SRQ WQE of its connections, ~386 per
# connection each way, so about 84 each way fit; beyond, connect fails with that reason.
build_many-connections() {
  cargo_test_binary many_connections "$1" || return 1
  cargo_rank_program "$1" || return 1
  cargo_plugin_library "$1"
}
suite many-connections "MANY_COMMS=${RXE_MANY_COMMS:-64} NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./many_connections --test-threads=1"

# The life cycle as NCCL drives it (crates/mpib-tools/tests/lifecycle.rs) on real verbs:
# connections set up and closed from 4 threads at once (one context, one per thread, one per
# round; ABI v8), ranks that leave independently (a receiver that closes before its sender
# tested its last sends; a ring of 4), aborts with requests in flight, oversized sends.
# Every byte checked, the resource counters back to zero. Fewer seeds than on the host
# (LIFECYCLE_SEEDS percent): under qemu every set-up is slow. The rank program
# (mpib-lifecycle) runs from the shared directory.
build_lifecycle() {
  local rank
  cargo_test_binary lifecycle "$1" || return 1
  rank=$(ci/cargo_artifacts.py bin:mpib-lifecycle -- build -q -p mpib-tools --bin mpib-lifecycle) || return 1
  cp "$rank" "$1/mpib-lifecycle"
  cargo_plugin_library "$1"
}
suite lifecycle "LIFECYCLE_SEEDS=${RXE_LIFECYCLE_SEEDS:-20} CONFORMANCE_TIMEOUT_S=300 LIFECYCLE_RANK=\$PWD/mpib-lifecycle NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./lifecycle --test-threads=1"

# mpib-perf on real verbs: the table users run first (every byte checked; exits non-zero
# on a wrong byte or an error).
build_perf() {
  local perf
  perf=$(ci/cargo_artifacts.py bin:mpib-perf -- build -q --workspace --bin mpib-perf) || return 1
  cp "$perf" "$1/mpib-perf"
  cargo_plugin_library "$1"
}
# shellcheck disable=SC2016 # expands in the guest
suite perf 'MPIB_HCA_SOUT=$RXE_DEV0 MPIB_HCA_SUP=$RXE_DEV1 ./mpib-perf --fabric verbs --plugin $PWD/libmpib.so --sizes 8:1M --duration 5'

# mpib-perf --list on real verbs: both rxe NICs with their pairing, link layer (RoCE), GID
# and speed, and the devices NCCL is shown per ABI version (mpib_device_rails).
build_perf-list() { build_perf "$1"; }
# shellcheck disable=SC2016 # expands in the guest
suite perf-list 'MPIB_HCA_SOUT=$RXE_DEV0 MPIB_HCA_SUP=$RXE_DEV1 ./mpib-perf --list --fabric verbs --plugin $PWD/libmpib.so > list.txt; rc=$?
cat list.txt; [ $rc = 0 ] || exit 1
for want in "$RXE_DEV0:1 *pair 0 SOUT *RoCE .*GID $RXE_GID_IDX0 " "$RXE_DEV1:1 *pair 0 SUP *RoCE .*GID $RXE_GID_IDX1 " "--dev 0: .*SOUT $RXE_DEV0:1 + SUP $RXE_DEV1:1"; do
  grep -q -e "$want" list.txt || { echo "perf-list: no line matching: $want"; exit 1; }
done'

# Rail failover on real verbs (crates/mpib-tools/tests/link_down.rs): rxe1's netdev taken
# down mid-stream and up 1.5 s later; the port-down event fails SUP over to SOUT; clean,
# exact, counted, through the re-admission attempts (whether SUP comes back within the
# stream is printed: on rxe not always yet). Toggles a link: after the suites that need it.
build_link-down() {
  cargo_test_binary link_down "$1" || return 1
  cargo_rank_program "$1" || return 1
  cargo_plugin_library "$1"
}
suite link-down "MPIB_TEST_LINK_TOGGLE=1 CONFORMANCE_TIMEOUT_S=600 NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./link_down --ignored --exact sup_link_down_mid_stream_loses_nothing_and_reports_nothing --test-threads=1 --nocapture"

# The same with 4 QPs per rail and every rail share striped over them (MPIB_QP=4
# MPIB_QP_STRIPE=1): each piece a WRITE_WITH_IMM on its own QP, counted by the receiver; a
# rail's pieces in flight when its link goes down are replayed whole on the other rail;
# SUP's four QPs rebuilt, their records exchanged, each probed; clean, exact, re-admitted.
build_link-down-striped() { build_link-down "$1"; }
suite link-down-striped "MPIB_TEST_LINK_TOGGLE=1 CONFORMANCE_TIMEOUT_S=600 NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./link_down --ignored --exact sup_link_down_with_4_striped_qps_per_rail_is_readmitted --test-threads=1 --nocapture"

# Both links down together (crates/mpib-tools/tests/link_down.rs): rxe0's and rxe1's
# netdevs taken down 1.5 s into the stream and up 2 s later. rxe fails both rails' WRs at
# once: an outage, ridden out (MPIB_OUTAGE_GRACE_MS=30000), its control messages over the
# set-up connection; clean, exact, both rails re-admitted. Toggles both links.
build_both-links-down() { build_link-down "$1"; }
suite both-links-down "MPIB_TEST_LINK_TOGGLE=1 CONFORMANCE_TIMEOUT_S=600 NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./link_down --ignored --exact both_links_down_2s_mid_stream_are_ridden_out --test-threads=1 --nocapture"

# The RoCE GID under a live connection (crates/mpib-tools/tests/link_down.rs): rxe1's IP
# address removed and added again (its GID back at another index), then replaced by another
# address (another GID), mid-stream; SUP fails over and is re-admitted on the GID as it is
# then, carried to the peer; clean, exact, counted. Changes rxe1's address and gives it back.
build_gid-change() { build_link-down "$1"; }
suite gid-change "MPIB_TEST_LINK_TOGGLE=1 CONFORMANCE_TIMEOUT_S=600 NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./link_down --ignored --exact sup_gid_change_mid_stream_readmits_with_the_new_gid --test-threads=1 --nocapture"

# A silent link on real verbs (crates/mpib-tools/tests/silent_link.rs): SUP on a veth pair of
# its own with an rxe device on each end (SOUT on rxe0 loops back inside it), every packet on
# it dropped for 6 s mid-stream (tc netem), no port event:
# the sender's silent-rail check fails SUP over; clean, exact, counted, re-admitted.
build_silent-link() {
  cargo_test_binary silent_link "$1" || return 1
  cargo_rank_program "$1" || return 1
  cargo_plugin_library "$1"
}
suite silent-link "MPIB_TEST_LINK_TOGGLE=1 CONFORMANCE_TIMEOUT_S=600 NCCL_NET_PLUGIN=\$PWD/libmpib.so CONFORMANCE_ENV=\"$VERBS_ENV\" ./silent_link --ignored --exact a_silent_sup_link_is_left_by_the_silent_rail_check_and_loses_nothing --test-threads=1 --nocapture"

# Takes rxe1's link down and up again: keep it last.
build_verbs-port-down() { cargo_test_binary verbs_device "$1"; }
suite verbs-port-down 'MPIB_TEST_LINK_TOGGLE=1 ./verbs_device --ignored --exact port_down_is_seen_and_skipped --test-threads=1'

# ---- run ---------------------------------------------------------------------------------
selected=("$@")
((${#selected[@]})) || selected=("${SUITES[@]}")
for s in "${selected[@]}"; do
  [[ -n ${SUITE_CMD[$s]+x} ]] || { log "unknown suite $s (suites: ${SUITES[*]})"; echo "0 passed, 1 failed"; exit 2; }
done

t0=$(date +%s)
ci/rxe-vm/setup-host.sh || { log "host set-up failed"; echo "0 passed, ${#selected[@]} failed"; exit 1; }
log "host set-up: $(($(date +%s) - t0))s"

DIR=$(mktemp -d /tmp/mpib-rxe-test.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
t1=$(date +%s)
for s in "${selected[@]}"; do
  "build_$s" "$DIR" || { log "building suite $s failed"; echo "0 passed, ${#selected[@]} failed"; exit 1; }
done
log "host build: $(($(date +%s) - t1))s"

for s in "${selected[@]}"; do printf '%s\n' "${SUITE_CMD[$s]}" > "$DIR/suite-$s.sh"; done
# The guest script: runs each suite, prints its output, and records
# `name status passed failed seconds` lines in results.txt.
{
  echo 'cd /mnt/host; : > results.txt'
  echo 'now() { cut -d" " -f1 /proc/uptime; }'
  for s in "${selected[@]}"; do
    cat <<EOS
echo "===== suite $s"
t=\$(now)
timeout $SUITE_TIMEOUT sh suite-$s.sh > suite-$s.log 2>&1; rc=\$?
cat suite-$s.log
p=\$(sed -n 's/^test result: .* \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed.*/\1/p' suite-$s.log | awk '{s+=\$1} END {print s+0}')
f=\$(sed -n 's/^test result: .* \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed.*/\2/p' suite-$s.log | awk '{s+=\$1} END {print s+0}')
if ! grep -q '^test result:' suite-$s.log; then if [ \$rc = 0 ]; then p=1; else f=1; fi
elif [ \$rc != 0 ] && [ \$f = 0 ]; then f=1; fi
[ \$rc = 124 ] && echo "suite $s: TIMEOUT after ${SUITE_TIMEOUT}s"
st=PASS; [ \$rc != 0 ] && st=FAIL
echo "$s \$st \$p \$f \$(awk "BEGIN{printf \"%.1f\", \$(now) - \$t}")" >> results.txt
EOS
  done
} > "$DIR/run-suites.sh"

t2=$(date +%s)
ci/rxe-vm/run-in-rxe-vm.sh -t "$VM_TIMEOUT" "$DIR" 'sh run-suites.sh'
vm_rc=$?
log "VM run: $(($(date +%s) - t2))s (exit code $vm_rc)"

passed=0 failed=0
echo "===== summary"
for s in "${selected[@]}"; do
  line=$(grep "^$s " "$DIR/results.txt" 2>/dev/null | tail -n1)
  if [[ -z $line ]]; then
    echo "SUITE $s FAIL (did not run: VM exit code $vm_rc)"
    failed=$((failed + 1))
    continue
  fi
  read -r _ st p f secs <<< "$line"
  echo "SUITE $s $st: $p passed, $f failed (${secs}s)"
  passed=$((passed + p)) failed=$((failed + f))
done
log "total: $(($(date +%s) - t0))s"
echo "$passed passed, $failed failed"
((failed == 0 && passed > 0))
