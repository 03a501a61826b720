#!/usr/bin/env bash
# The per-peer view finds a slow peer (docs/testing.md, "Emulated rails").
#
# A hub namespace with a bridge and N peer namespaces (4 by default), each joined to the
# bridge by a veth pair and holding its own SOUT and SUP addresses (198.18.0.1x and
# 198.18.1.1x; the hub has .1 of each, in the benchmarking range, RFC 2544, that exists only
# inside the namespaces). One peer's link is slowed in both directions: netem delay where the
# kernel has sch_netem, else a tbf rate (said so in the output). The hub
# (examples/peer_hub, one process, one `init`) connects to every peer through the plugin on
# the soft fabric, streams the same checked messages to each at once, and prints its per-NIC
# and per-peer view while every connection is open. The check: the hub's latency ranking
# (mpib_worst_peers) lists every peer, the slowed one first.
#
# Exit status: 0 when the check passed; 1 when it failed (or a run failed: wrong bytes, a
# rank's error); 2 on bad options; 77 when this host cannot run it (not root, no `ip` or `tc`,
# no network namespaces, veth, bridge or tc qdisc): one line `netem-peers: SKIPPED: <why>`.
# The namespaces are removed on every exit, including Ctrl-C and SIGTERM.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  cat <<'EOF'
Usage: ci/netem-peers.sh [options]    (as root; needs ip, tc)

  --peers N        peers, each in its own namespace (2..4)                [4]
  --slow K         the slowed peer (1..N)                                 [3]
  --delay TIME     one-way delay added each way on its link (netem)       [10ms]
  --rate RATE      its link's rate where the kernel has no sch_netem (tbf) [40mbit]
  --size BYTES     message size                                           [16384]
  --count N        messages to each peer                                  [200]
  --out DIR        the hub's and peers' output                            [target/netem-peers]
  --no-build       use the existing debug build
  -h, --help       this text

Prints the hub's view (per NIC and rail; worst peers by latency and by errors), then
`netem-peers: ok: <peer> ranked slowest of N peers by the hub` or what failed.
EOF
}

peers=4 slow=3 delay=10ms rate=40mbit size=16384 count=200 out=target/netem-peers build=1
while (($#)); do
  case $1 in
    --peers) peers=$2; shift ;;
    --slow) slow=$2; shift ;;
    --delay) delay=$2; shift ;;
    --rate) rate=$2; shift ;;
    --size) size=$2; shift ;;
    --count) count=$2; shift ;;
    --out) out=$2; shift ;;
    --no-build) build=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "netem-peers: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for v in "$peers" "$slow" "$size" "$count"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "netem-peers: --peers, --slow, --size, --count are numbers >= 1" >&2; exit 2; }
done
# The hub's view lists the 8 worst (peer, rail) pairs: 4 peers of 2 rails each at most.
((peers >= 2 && peers <= 4 && slow <= peers)) || { echo "netem-peers: 2 <= --peers <= 4 and --slow <= --peers" >&2; exit 2; }
die() { echo "netem-peers: $*" >&2; exit 1; }
skip() { echo "netem-peers: SKIPPED: $*"; exit 77; }

[[ $(id -u) == 0 ]] || skip "needs root (network namespaces, tc)"
for c in ip tc timeout; do command -v "$c" >/dev/null || skip "needs $c"; done

tag=mpibpeers$$
hub=$tag-hub
spaces=()
# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local ns p
  # Only processes inside our own namespaces: the hub and peers this script started.
  for ns in ${spaces[@]+"${spaces[@]}"}; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$hub" 2>/dev/null || skip "cannot create a network namespace (ip netns add)"
spaces+=("$hub")
ip -n "$hub" link set lo up
ip -n "$hub" link add br0 type bridge 2>/dev/null || skip "cannot create a bridge in a namespace"
ip -n "$hub" addr add 198.18.0.1/24 dev br0
ip -n "$hub" addr add 198.18.1.1/24 dev br0
ip -n "$hub" link set br0 up
for ((i = 1; i <= peers; i++)); do
  ns=$tag-p$i
  ip netns add "$ns" || die "ip netns add $ns"
  spaces+=("$ns")
  ip -n "$ns" link set lo up
  ip link add name hp$i netns "$hub" type veth peer name eth0 netns "$ns" 2>/dev/null ||
    skip "cannot create a veth pair between namespaces"
  ip -n "$hub" link set hp$i master br0 up
  ip -n "$ns" addr add 198.18.0.$((10 + i))/24 dev eth0
  ip -n "$ns" addr add 198.18.1.$((10 + i))/24 dev eth0
  ip -n "$ns" link set eth0 up
done

# The slowed peer: both directions of its link, the peer's end and the hub's bridge port.
slow_ns=$tag-p$slow
if tc -n "$slow_ns" qdisc add dev eth0 root netem delay "$delay" limit 10000 2>/dev/null; then
  tc -n "$hub" qdisc add dev "hp$slow" root netem delay "$delay" limit 10000
  how="netem delay $delay each way"
elif tc -n "$slow_ns" qdisc add dev eth0 root tbf rate "$rate" burst 32k limit 4m 2>/dev/null; then
  tc -n "$hub" qdisc add dev "hp$slow" root tbf rate "$rate" burst 32k limit 4m
  how="tbf rate $rate each way (sch_netem is not in this kernel: no added delay)"
else
  skip "neither sch_netem nor sch_tbf can shape a link here"
fi

# The example and the plugin it loads: where cargo's own report of the build says they are
# (ci/cargo_artifacts.py), or with --no-build where cargo puts them.
if ((build)); then
  built=$(ci/cargo_artifacts.py example:peer_hub cdylib:mpib -- build --workspace --example peer_hub --lib) ||
    die "building examples/peer_hub failed"
  { read -r hub_bin; read -r lib; } <<<"$built"
else
  target=${CARGO_TARGET_DIR:-target}
  hub_bin=$target/debug/examples/peer_hub lib=$target/debug/libmpib.so
fi
[[ -x $hub_bin && -f $lib ]] || die "build first: cargo build --workspace --example peer_hub --lib"
mkdir -p "$out"
rm -f "$out"/*.log
echo "# $peers peers on a bridge; peer $slow (198.18.0.$((10 + slow)), 198.18.1.$((10 + slow))) slowed: $how; $count x $size B to each; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

port=7500
env_of() { echo "MPIB_FABRIC=soft MPIB_SOFT_SOUT_ADDR=198.18.0.$1 MPIB_SOFT_SUP_ADDR=198.18.1.$1"; }
common=(--plugin "$lib" --size "$size" --count "$count")
t0=$(date +%s%N)
# shellcheck disable=SC2046 # env_of prints NAME=VALUE words
ip netns exec "$hub" env $(env_of 1) timeout -k 5 120 "$hub_bin" hub --listen "198.18.0.1:$port" --peers "$peers" \
  "${common[@]}" >"$out/hub.log" 2>&1 &
hub_pid=$!
peer_pids=()
for ((i = 1; i <= peers; i++)); do
  # shellcheck disable=SC2046
  ip netns exec "$tag-p$i" env $(env_of $((10 + i))) timeout -k 5 120 "$hub_bin" peer --connect "198.18.0.1:$port" \
    "${common[@]}" >"$out/peer$i.log" 2>&1 &
  peer_pids+=($!)
done
rc=0
for i in "${!peer_pids[@]}"; do
  wait "${peer_pids[$i]}" || { rc=$?; tail -n 20 "$out/peer$((i + 1)).log" >&2 || true; }
done
wait "$hub_pid" || rc=$?
t1=$(date +%s%N)
hub_out=$(<"$out/hub.log")
((rc == 0)) || { printf '%s\n' "$hub_out" >&2; die "a run failed (exit $rc; logs in $out)"; }
grep -v '^HUB-' <<<"$hub_out" || true
echo "# the hub and $peers peers ran in $(((t1 - t0) / 1000000)) ms"

# The hub's latency ranking, worst first: `HUB-SLOW <i> <peer IP:port> <nic> <rail> <p99 ns>`.
mapfile -t ranked < <(awk '$1 == "HUB-SLOW" { print $3 }' <<<"$hub_out")
((${#ranked[@]} > 0)) || die "the hub's view ranks no peer by latency"
# Each peer by its number (its addresses end in 1x), in the order first ranked.
order=()
for p in "${ranked[@]}"; do
  ip=${p%:*}
  [[ $ip =~ ^198\.18\.[01]\.([0-9]+)$ ]] || die "the hub ranked an unknown peer $p"
  k=$((BASH_REMATCH[1] - 10))
  [[ " ${order[*]} " == *" $k "* ]] || order+=("$k")
done
((${#order[@]} == peers)) || die "the hub's latency ranking lists peers ${order[*]}, not all $peers"
[[ ${order[0]} == "$slow" ]] ||
  die "the hub's latency ranking puts peer ${order[0]} first, not the slowed peer $slow (order: ${order[*]})"
echo "netem-peers: ok: peer $slow (${ranked[0]}) ranked slowest of $peers peers by the hub (order: ${order[*]})"
