#!/usr/bin/env bash
# Proof of the auto split on emulated rails (docs/testing.md, "Emulated rails").
#
# Two network namespaces (receiver, sender) joined by two veth pairs, one per rail, with
# addresses in 198.18.0.0/15 (the benchmarking range, RFC 2544) that exist only inside them.
# Each rail is shaped in both directions with tc: netem delay + rate where the kernel has
# sch_netem, else tbf rate alone (said so in the output). mpib-perf runs a receiver (rank 0)
# and a sender (rank 1) through the plugin on the soft fabric, each rail bound to its veth
# address, and measures: each rail alone (--split sout / sup), auto, static 50/50, in
# --rounds interleaved rounds (median); then an auto --timeline run during which one rail's
# rate is cut (halved by default). examples/netem_report prints the figures, draws the timeline (SVG) and ends
# with the line `auto_vs_sum: <ratio> static_vs_sum: <ratio> settle_ms: <ms>`, which is also
# this script's last line. Then (unless --outage none) the outage drill: a second auto
# --timeline run during which one rail's veth is taken down (both ends) at --outage-at and
# up again --outage-for later, --outages times; the report prints each outage's failover and
# re-admission times from the timeline and the sender's failover counters, and draws it
# (outage.svg). Its goals are printed, not fatal; a wrong byte or a rank's error is.
#
# Exit status: 0 when every run delivered its bytes intact and the report was made (a missed
# goal is printed, not fatal, unless --strict: then 3); 1 on any error; 2 on bad options. A
# timeline whose stream ended before the change could be measured is run again (3 tries).
# The namespaces are removed on every exit, including Ctrl-C and SIGTERM.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  cat <<'EOF'
Usage: ci/netem-rails.sh [options]    (as root; needs ip, tc, python3)

  --sout-rate RATE     SOUT rate, tc syntax (kbit/mbit/gbit)          [4gbit]
  --sup-rate RATE      SUP rate                                       [2gbit]
  --sout-delay TIME    SOUT one-way delay (netem only)                [50us]
  --sup-delay TIME     SUP one-way delay (netem only)                 [20us]
  --change RAIL        rail whose rate is cut mid-run: sout|sup       [sout]
  --change-factor N    the rate is divided by N (2: halved; 10: a tenth) [2]
  --size SIZE          message size of every run (mpib-perf --sizes)  [256K]
  --duration SECS      each throughput run                            [2]
  --rounds N           interleaved rounds of the four throughput runs [3]
  --timeline SECS      the timeline run                               [3]
  --change-at SECS     when the rate changes, after TIMELINE-START    [1.5]
  --outage RAIL        rail whose veth goes down and up: sout|sup|both|none [sup]
  --outage-at SECS     first outage, after TIMELINE-START             [1]
  --outage-for SECS    how long the link stays down                   [1.5]
  --outages N          outages in the drill run                       [1]
  --outage-every SECS  from one outage to the next                    [outage-for + 2.5]
  --outage-expect WHAT ok: the outage run must deliver everything; error: it must fail
                       with an error naming both rails (an outage past the grace)  [ok]
  --env NAME=VALUE     set for both ranks (repeatable), e.g. MPIB_TIMEOUT=14
  --out DIR            results, timeline JSON, picture, logs          [target/netem]
  --no-build           use the existing release build
  --strict             exit 3 when a goal (auto >= 0.95 x sum, settle <= 10 ms) is missed
  -h, --help           this text

Prints each mode's throughput per round and its median, the ratios, the timeline's shares
and settling time, the picture's path, and last: auto_vs_sum: R static_vs_sum: R settle_ms: MS
EOF
}

sout_rate=4gbit sup_rate=2gbit sout_delay=50us sup_delay=20us change=sout change_factor=2 size=256K
duration=2 rounds=3 tl_secs=3 change_at=1.5 out=target/netem build=1 strict=()
outage=sup outage_at=1 outage_for=1.5 outages=1 outage_every='' outage_expect=ok extra_env=()
while (($#)); do
  case $1 in
    --sout-rate) sout_rate=$2; shift ;;
    --sup-rate) sup_rate=$2; shift ;;
    --sout-delay) sout_delay=$2; shift ;;
    --sup-delay) sup_delay=$2; shift ;;
    --change) change=$2; shift ;;
    --change-factor) change_factor=$2; shift ;;
    --size) size=$2; shift ;;
    --duration) duration=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --timeline) tl_secs=$2; shift ;;
    --change-at) change_at=$2; shift ;;
    --outage) outage=$2; shift ;;
    --outage-at) outage_at=$2; shift ;;
    --outage-for) outage_for=$2; shift ;;
    --outages) outages=$2; shift ;;
    --outage-every) outage_every=$2; shift ;;
    --outage-expect) outage_expect=$2; shift ;;
    --env) extra_env+=("$2"); shift ;;
    --out) out=$2; shift ;;
    --no-build) build=0 ;;
    --strict) strict=(--strict) ;;
    -h|--help) usage; exit 0 ;;
    *) echo "netem-rails: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
die() { echo "netem-rails: $*" >&2; exit 1; }
[[ $change == sout || $change == sup ]] || { echo "netem-rails: --change sout|sup" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "netem-rails: --rounds N (N >= 1)" >&2; exit 2; }
[[ $change_factor =~ ^[1-9][0-9]*$ ]] || { echo "netem-rails: --change-factor N (N >= 1)" >&2; exit 2; }
[[ $outage =~ ^(sout|sup|both|none)$ ]] || { echo "netem-rails: --outage sout|sup|both|none" >&2; exit 2; }
[[ $outage_expect =~ ^(ok|error)$ ]] || { echo "netem-rails: --outage-expect ok|error" >&2; exit 2; }
for v in ${extra_env[@]+"${extra_env[@]}"}; do
  [[ $v =~ ^[A-Z_][A-Z0-9_]*= ]] || { echo "netem-rails: --env NAME=VALUE ($v)" >&2; exit 2; }
done
[[ $outages =~ ^[1-9][0-9]*$ ]] || { echo "netem-rails: --outages N (N >= 1)" >&2; exit 2; }
for v in "$outage_at" "$outage_for" ${outage_every:+"$outage_every"}; do
  [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "netem-rails: outage times are seconds (e.g. 1.5)" >&2; exit 2; }
done
outage_every=${outage_every:-$(awk -v f="$outage_for" 'BEGIN { print f + 2.5 }')}

# A tc rate as kbit/s (integer): 4gbit -> 4000000.
kbit() {
  local n=${1%%[a-zA-Z]*} u=${1##*[0-9.]}
  case $u in
    gbit) awk -v n="$n" 'BEGIN { printf "%d", n * 1000000 }' ;;
    mbit) awk -v n="$n" 'BEGIN { printf "%d", n * 1000 }' ;;
    kbit) awk -v n="$n" 'BEGIN { printf "%d", n }' ;;
    *) echo "netem-rails: rate $1: use kbit, mbit or gbit" >&2; exit 2 ;;
  esac
}
gbps() { awk -v k="$1" 'BEGIN { printf "%g", k / 1e6 }'; }
sout_kbit=$(kbit "$sout_rate") sup_kbit=$(kbit "$sup_rate")

[[ $(id -u) == 0 ]] || die "needs root (network namespaces, tc)"
for c in ip tc python3 timeout; do command -v "$c" >/dev/null || die "needs $c"; done

# The release mpib-perf, the plugin it loads and the report's example: where cargo's own
# report of the build says they are (ci/cargo_artifacts.py), or with --no-build where cargo
# puts them (CARGO_TARGET_DIR, else target/).
if ((build)); then
  built=$(ci/cargo_artifacts.py bin:mpib-perf cdylib:mpib -- build --release --workspace --bin mpib-perf --lib) ||
    die "the release build failed"
  { read -r perf; read -r lib; } <<<"$built"
  report=$(ci/cargo_artifacts.py example:netem_report -- build --workspace --example netem_report) ||
    die "building examples/netem_report failed"
else
  target=${CARGO_TARGET_DIR:-target}
  perf=$target/release/mpib-perf lib=$target/release/libmpib.so report=$target/debug/examples/netem_report
fi
[[ -x $perf && -f $lib && -x $report ]] ||
  die "build first: cargo build --release --workspace --bin mpib-perf --lib && cargo build --workspace --example netem_report"
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log "$out"/stats-*.txt

# --- namespaces: rx (rank 0, receives) and tx (rank 1, sends) ---------------------------
tag=mpibnetem$$
rx=$tag-rx tx=$tag-tx
# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local ns p
  # The rate-change helper, if it is still waiting.
  [[ -n ${changer_pid:-} ]] && { kill -TERM "$changer_pid" 2>/dev/null || true; }
  # Only processes inside our own namespaces: the mpib-perf ranks this script started.
  for ns in "$rx" "$tx"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
  done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [[ -z $(ip netns pids "$rx" 2>/dev/null; ip netns pids "$tx" 2>/dev/null) ]] && break
    sleep 0.2
  done
  for ns in "$rx" "$tx"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$rx"
ip netns add "$tx"
ip -n "$rx" link set lo up
ip -n "$tx" link set lo up
# Rail SOUT: sout0 (rx) 198.18.0.1 <-> sout1 (tx) 198.18.0.2; rail SUP: 198.18.1.1 <-> .2.
ip link add name sout0 netns "$rx" type veth peer name sout1 netns "$tx"
ip link add name sup0 netns "$rx" type veth peer name sup1 netns "$tx"
ip -n "$rx" addr add 198.18.0.1/30 dev sout0
ip -n "$tx" addr add 198.18.0.2/30 dev sout1
ip -n "$rx" addr add 198.18.1.1/30 dev sup0
ip -n "$tx" addr add 198.18.1.2/30 dev sup1
cpus=$(printf '%x' $(((1 << $(nproc | awk '{ print ($1 > 30 ? 30 : $1) }')) - 1)))
for ns in "$rx" "$tx"; do
  for d in sout sup; do
    dev=$d$([[ $ns == "$rx" ]] && echo 0 || echo 1)
    ip -n "$ns" link set "$dev" up
    # veth queues each packet on the backlog of the CPU that hands it over; with the qdisc
    # dequeued from both CPUs (the sender's thread, tbf's timer), one TCP flow's packets land
    # on two backlogs and arrive out of order: thousands of spurious fast retransmits per run
    # and occasional 200 ms stalls. RPS keeps each flow on one CPU's backlog, in order.
    ip netns exec "$ns" sh -c "echo $cpus > /sys/class/net/$dev/queues/rx-0/rps_cpus"
  done
done

# --- shaping: both directions of each rail ----------------------------------------------
qdisc=netem
if ! tc -n "$tx" qdisc add dev sout1 root netem delay "$sout_delay" rate "$sout_rate" 2>/dev/null; then
  qdisc=tbf
  echo "# sch_netem is not in this kernel: rates shaped with tbf, no added delay"
fi
# qdisc ARGS for rail $1 at $2 kbit/s.
shape_args() {
  local delay=$sout_delay
  [[ $1 == sup ]] && delay=$sup_delay
  if [[ $qdisc == netem ]]; then
    echo "netem delay $delay rate ${2}kbit limit 10000"
  else
    # burst: ~0.25 ms at 4 Gbit/s and above one 64 KiB GSO packet; limit: far above what TCP
    # small queues let a socket keep in a qdisc, so nothing is dropped.
    echo "tbf rate ${2}kbit burst 128k limit 8m"
  fi
}
for ns in "$rx" "$tx"; do
  for d in sout sup; do
    dev=$d$([[ $ns == "$rx" ]] && echo 0 || echo 1)
    k=$sout_kbit
    [[ $d == sup ]] && k=$sup_kbit
    # shellcheck disable=SC2046
    tc -n "$ns" qdisc replace dev "$dev" root $(shape_args $d "$k")
  done
done
echo "# rails: SOUT $(gbps "$sout_kbit") Gbit/s, SUP $(gbps "$sup_kbit") Gbit/s ($qdisc$([[ $qdisc == netem ]] && echo ", delay SOUT $sout_delay SUP $sup_delay")), each direction; $size sends, 8 in flight; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# --- runs ---------------------------------------------------------------------------------
port=7400
# The rails stand for two NICs: the silent-rail check gets a NIC's floor (50 ms), not the
# soft fabric's longer one (--env MPIB_SILENT_MS=... overrides it: later wins).
env_rx=(MPIB_FABRIC=soft MPIB_SOFT_SOUT_ADDR=198.18.0.1 MPIB_SOFT_SUP_ADDR=198.18.1.1 MPIB_SILENT_MS=50 ${extra_env[@]+"${extra_env[@]}"})
env_tx=(MPIB_FABRIC=soft MPIB_SOFT_SOUT_ADDR=198.18.0.2 MPIB_SOFT_SUP_ADDR=198.18.1.2 MPIB_SILENT_MS=50 ${extra_env[@]+"${extra_env[@]}"})
# pair NAME SECS [mpib-perf options…]: starts both ranks in the background; sets rx_pid, tx_pid.
pair() {
  local name=$1 secs=$2
  shift 2
  port=$((port + 1))
  # PAIR_ITERS: a fixed count instead of the time budget (whose count comes from the warm-up).
  local len=(--duration "$secs")
  [[ -n ${PAIR_ITERS:-} ]] && len=(--iters "$PAIR_ITERS")
  local common=(--plugin "$lib" --rendezvous "198.18.0.1:$port" --timeout 20 --sizes "$size" "${len[@]}" --quiet "$@")
  ip netns exec "$rx" env "${env_rx[@]}" MPIB_STATS_FILE="$out/stats-$name-rx.txt" \
    timeout -k 5 $((secs * 4 + 40)) "$perf" --rank 0 "${common[@]}" >"$out/$name-rx.log" 2>&1 &
  rx_pid=$!
  ip netns exec "$tx" env "${env_tx[@]}" MPIB_STATS_FILE="$out/stats-$name-tx.txt" \
    timeout -k 5 $((secs * 4 + 40)) "$perf" --rank 1 "${common[@]}" >"$out/$name-tx.log" 2>&1 &
  tx_pid=$!
}
# finish NAME: waits for both ranks; on failure shows their output and stops.
finish() {
  local rc=0
  wait "$tx_pid" || rc=$?
  wait "$rx_pid" || rc=$((rc ? rc : $?))
  if ((rc)); then
    tail -n 20 "$out/$1-tx.log" "$out/$1-rx.log" >&2 || true
    die "run $1 failed (exit $rc; logs in $out)"
  fi
}

declare -A files=([sout]="" [sup]="" [auto]="" [static]="")
split_of() { case $1 in static) echo 50 ;; *) echo "$1" ;; esac; }
for ((r = 1; r <= rounds; r++)); do
  for m in sout sup auto static; do
    name=$m-$r
    pair "$name" "$duration" --split "$(split_of $m)" --json "$out/$name.json"
    finish "$name"
    files[$m]+=${files[$m]:+,}$out/$name.json
    echo "# round $r $m: $(sed -n 's/.*"gbps": *\([0-9.e-]*\).*/\1/p' "$out/$name.json" | awk 'NR == 1 { printf "%.2f Gbit/s", $1 * 8 }')"
  done
done

# The timeline: auto, one rail cut to 1/$change_factor $change_at s after the stream starts.
dev_tx=${change}1 dev_rx=${change}0
k=$sout_kbit
[[ $change == sup ]] && k=$sup_kbit
half=$((k / change_factor))
# The change comes from a helper started before the run: one `tc -batch` per namespace waits
# on stdin, and python3, told when the stream has started, writes the change to both
# $change_at s later. Nothing is forked, exec'd or torn down while the stream runs: on the
# 2-core machine a process starting or exiting near the change (python3's own exit takes
# ~90 ms of CPU) took a core from the ranks, and the stream then stalled and came in bursts
# for tens of ms whether or not the rate changed. The two CLOCK_MONOTONIC times
# bracket the data direction's request (the sender's egress): written, then confirmed by
# the output of a `show` that tc runs only after it. The reverse direction
# (acknowledgements only) follows at once, untimed. The helper exits once the ranks have
# finished (its stdin closes).
# timeline_run: one auto --timeline run during which the helper halves the rail; sets
# t_change and t_changed (CLOCK_MONOTONIC ns before and after the change).
timeline_run() {
  coproc CHANGER {
    exec python3 -c '
import subprocess, sys, time
ns_tx, ns_rx, at, change_tx, change_rx, dev_tx, dev_rx = sys.argv[1:]
def batch(ns):
    return subprocess.Popen(["tc", "-n", ns, "-batch", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def change(tc, line, dev):
    # tc runs one line at a time and stops at the first error: the show answers only
    # once the change is made.
    tc.stdin.write(line + "\nqdisc show dev " + dev + "\n")
    tc.stdin.flush()
    return tc.stdout.readline() != ""
tx, rx = batch(ns_tx), batch(ns_rx)
if sys.stdin.readline() == "":
    sys.exit(0)
time.sleep(float(at))
a = time.monotonic_ns()
ok = change(tx, change_tx, dev_tx)
b = time.monotonic_ns()
if not (ok and change(rx, change_rx, dev_rx)):
    sys.exit("tc failed: " + change_tx)
print(a, b, flush=True)
sys.stdin.read()
for tc in (tx, rx):
    tc.stdin.close()
    tc.wait()' "$tx" "$rx" "$change_at" "qdisc change dev $dev_tx root $(shape_args "$change" "$half")" \
      "qdisc change dev $dev_rx root $(shape_args "$change" "$half")" "$dev_tx" "$dev_rx"
  }
  # shellcheck disable=SC2153 # set by coproc
  changer_pid=$CHANGER_PID
  changer_in=${CHANGER[1]} changer_out=${CHANGER[0]}
  pair timeline "$tl_secs" --timeline "$out/timeline.json"
  for _ in $(seq 1 400); do
    grep -q '^TIMELINE-START' "$out/timeline-tx.log" && break
    kill -0 "$tx_pid" 2>/dev/null || break
    sleep 0.05
  done
  grep -q '^TIMELINE-START' "$out/timeline-tx.log" || { finish timeline; die "the sender never printed TIMELINE-START"; }
  echo go >&"$changer_in"
  read -r t_change t_changed <&"$changer_out" || true
  [[ -n ${t_changed:-} ]] || { finish timeline; die "the rate change failed"; }
  finish timeline
  exec {changer_in}>&-
  wait "$changer_pid" || true
  changer_pid=
  [[ -s $out/timeline.json ]] || die "no timeline written"
}

# change_inside: whether the change fell where netem_report can measure the settling: two
# 10 ms windows after the stream's start, and 4 x (10 ms window + 20 ms hold) before its end.
change_inside() {
  python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
at_ms = (int(sys.argv[2]) - t["start_mono_ns"]) / 1e6
full_ms = len(t["samples"]) - 1  # the whole milliseconds, as netem_report counts them
sys.exit(0 if 20 <= at_ms and at_ms + 120 <= full_ms else 1)' "$out/timeline.json" "$t_change"
}

# The stream's length is a count chosen from its warm-up: when the machine is busier during
# the warm-up than after it, the stream ends early (1082 ms of a planned 3000, before a change
# at 1630 ms, with both cores busy elsewhere). That is no measure, not a failed run: it is run
# again, the rail's rate restored first, up to 3 times; every run's bytes are checked.
for try in 1 2 3; do
  timeline_run
  change_inside && break
  echo "# timeline run $try of 3: the stream ended before the change at CLOCK_MONOTONIC $t_change ns could be measured"
  ((try < 3)) || break
  # shellcheck disable=SC2046 # shape_args prints the qdisc's arguments, one word each
  tc -n "$tx" qdisc change dev "$dev_tx" root $(shape_args "$change" "$k")
  # shellcheck disable=SC2046
  tc -n "$rx" qdisc change dev "$dev_rx" root $(shape_args "$change" "$k")
done
echo "# $change cut to 1/$change_factor: $(gbps "$k") -> $(gbps "$half") Gbit/s at CLOCK_MONOTONIC $t_change ns"
# The rail's rate back for the outage drill (its "other rail alone" is the single-rail runs').
# shellcheck disable=SC2046 # shape_args prints the qdisc's arguments, one word each
tc -n "$tx" qdisc change dev "$dev_tx" root $(shape_args "$change" "$k")
# shellcheck disable=SC2046
tc -n "$rx" qdisc change dev "$dev_rx" root $(shape_args "$change" "$k")
# The sender's statistics file of the timeline run (MPIB_STATS_FILE): per rail.
if [[ -s $out/stats-timeline-tx.txt ]]; then
  for r in 0 1; do
    awk -v r="rail$r" -F': ' 'index($1, r "_") == 1 { k = substr($1, length(r) + 2); v[k] = $2 }
      END { printf "# stats %s: share %s bw %.2f Gbit/s srtt %d us base %d us congestion_events %s probes %s\n",
            r, v["share"], v["bw_bytes_per_s"] * 8 / 1e9, v["srtt_ns"] / 1000, v["base_latency_ns"] / 1000,
            v["congestion_events"], v["probes"] }' "$out/stats-timeline-tx.txt"
  done
fi

# --- the outage drill: one rail's veth down, then up, during an auto timeline run ----------
# A helper started before the run takes both ends of the rail's veth down at the chosen times
# after TIMELINE-START and up again (`ip link set`), and prints CLOCK_MONOTONIC once each is
# done: "DOWN_NS:UP_NS" per outage. The link counts as down once the sender's end is (its
# peer loses carrier with it) and as up once both ends are.
outage_args=()
if [[ $outage != none ]]; then
  # The veths taken down, each side's: the rail's, or both rails'.
  o_tx=${outage}1 o_rx=${outage}0
  [[ $outage == both ]] && o_tx=sout1,sup1 o_rx=sout0,sup0
  o_secs=$(awk -v a="$outage_at" -v e="$outage_every" -v n="$outages" 'BEGIN { s = a + e * n + 1; printf "%d", (s == int(s)) ? s : int(s) + 1 }')
  coproc OUTAGER {
    exec python3 -c '
import subprocess, sys, time
ns_tx, ns_rx, dev_tx, dev_rx, at, down, every, n = sys.argv[1:]
def link(ns, devs, state):
    for dev in devs.split(","):
        subprocess.run(["ip", "-n", ns, "link", "set", "dev", dev, state], check=True)
if sys.stdin.readline() == "":
    sys.exit(0)
t0 = time.monotonic()
spans = []
for k in range(int(n)):
    time.sleep(max(0.0, t0 + float(at) + k * float(every) - time.monotonic()))
    link(ns_tx, dev_tx, "down")
    a = time.monotonic_ns()
    link(ns_rx, dev_rx, "down")
    time.sleep(max(0.0, a / 1e9 + float(down) - time.monotonic()))
    link(ns_tx, dev_tx, "up")
    link(ns_rx, dev_rx, "up")
    spans.append("%d:%d" % (a, time.monotonic_ns()))
print(",".join(spans), flush=True)' "$tx" "$rx" "$o_tx" "$o_rx" "$outage_at" "$outage_for" "$outage_every" "$outages"
  }
  # shellcheck disable=SC2153 # set by coproc
  changer_pid=$OUTAGER_PID
  o_in=${OUTAGER[1]} o_out=${OUTAGER[0]}
  # The stream must outlast the outages: a count from auto's measured rate (a time budget's
  # count comes from the warm-up, and one run ended after 5 of 20 outages), 20 % over.
  o_iters=$(python3 -c '
import json, sys
files, secs = sys.argv[1].split(","), float(sys.argv[2])
rows = sorted((json.load(open(f))["rows"][0] for f in files), key=lambda r: r["gbps"])
r = rows[len(rows) // 2]
print(max(100, int(r["gbps"] * 1e9 * secs * 1.2 / max(r["size"], 1))))' "${files[auto]}" "$o_secs")
  PAIR_ITERS=$o_iters pair outage "$((o_secs * 3))" --timeline "$out/outage.json"
  for _ in $(seq 1 400); do
    grep -q '^TIMELINE-START' "$out/outage-tx.log" && break
    kill -0 "$tx_pid" 2>/dev/null || break
    sleep 0.05
  done
  grep -q '^TIMELINE-START' "$out/outage-tx.log" || { finish outage; die "the outage run's sender never printed TIMELINE-START"; }
  echo go >&"$o_in"
  if [[ $outage_expect == error ]]; then
    # Past the grace the sender must fail: when its process ended (CLOCK_MONOTONIC), to
    # measure from the link going down.
    while [[ -e /proc/$tx_pid && $(awk '{ print $3 }' "/proc/$tx_pid/stat" 2>/dev/null) != Z ]]; do sleep 0.01; done
    t_exit=$(python3 -c 'import time; print(time.monotonic_ns())')
  fi
  read -r spans <&"$o_out" || true
  exec {o_in}>&-
  wait "$changer_pid" || true
  changer_pid=
  [[ -n ${spans:-} ]] || { finish outage; die "taking the ${outage^^} link down and up failed"; }
  echo "# outage drill: ${outage^^} veth down ${outage_for} s, $outages time(s) from ${outage_at} s, every ${outage_every} s${extra_env[*]:+ (${extra_env[*]})}; load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [[ $outage_expect == error ]]; then
    rc=0
    wait "$tx_pid" || rc=$?
    wait "$rx_pid" || rc=$((rc ? rc : $?))
    ((rc)) || die "the outage run delivered everything: expected an error past the grace"
    grep -h 'both rails' "$out/outage-tx.log" "$out/outage-rx.log" >"$out/outage-errors.txt" || true
    [[ -s $out/outage-errors.txt ]] || { tail -n 20 "$out/outage-tx.log" >&2; die "the outage run failed without naming both rails"; }
    down_ns=${spans%%:*}
    echo "# outage past the grace: the sender failed $(((t_exit - down_ns) / 1000000)) ms after both links went down; its words:"
    awk 'NR <= 3 { print "#   " $0 }' "$out/outage-errors.txt"
  else
    finish outage
    [[ -s $out/outage.json ]] || die "no outage timeline written"
    outage_args=(--outage-timeline "$out/outage.json" --outages "$spans" --outage-rail "$outage" --outage-svg "$out/outage.svg")
  fi
fi

"$report" --tput "sout=${files[sout]}" --tput "sup=${files[sup]}" --tput "auto=${files[auto]}" \
  --tput "static=${files[static]}" --timeline "$out/timeline.json" \
  --change-ns "$t_change" --change-end-ns "$t_changed" \
  --what "${change^^} $(gbps "$k") -> $(gbps "$half") Gbit/s" \
  --shaped-gbps "$(gbps "$sout_kbit"),$(gbps "$sup_kbit")" --svg "$out/timeline.svg" "${strict[@]}" "${outage_args[@]}" \
  | tee "$out/report.txt"
exit "${PIPESTATUS[0]}"
