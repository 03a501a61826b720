#!/usr/bin/env bash
# Proof with NCCL itself: two ranks on ONE host and ONE GPU through the mpib plugin, checked
# against NCCL's own socket transport. `ci/nccl-two-ranks.sh --help` explains everything.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=ci/nccl-two-ranks.sh
USAGE="usage: $PROG [--fabric soft|verbs|auto] [--lib PATH] [--out DIR] [--gpu N] [--min-bytes S] [--max-bytes S] [--ops LIST] [--iters N] [--lifecycle N] [--abort] [--timeout SECONDS] [--nccl-version X.Y.Z] [--no-baseline] [--no-torch] [--check-lib-only] [--dry-run] [-h|--help]"

show_help() {
  cat <<EOF
$USAGE

Runs two ranks on ONE host and ONE GPU through the mpib plugin and proves from NCCL's own log
that NCCL used it, that the collectives are exact, and how fast they are next to NCCL's socket
transport. Needs: a CUDA GPU, PyTorch with NCCL (for the collectives), cargo if the plugin is
not built yet. Every file goes to --out (default target/nccl-proof/<date-time>).

Steps
  1. Plugin library: --lib, else libnccl-net-mpib.so in cargo's release folder
     (\$CARGO_TARGET_DIR/release, else target/release; built with ci/build-plugin.sh when
     missing). ci/elf_check.py then checks it loads here as it is: NEEDED libraries
     (libibverbs must not be one), the highest GLIBC version it needs and the host's glibc,
     the machine, ldd, the exported ncclNetPlugin_v<N> symbols.
  2. PyTorch through the plugin: ci/torch_collectives.py spawns 2 ranks (torch.distributed,
     env:// on 127.0.0.1, both on --gpu) running all_reduce, all_gather, reduce_scatter,
     all_to_all and send/recv over 1 KiB ... 256 MiB, compares every element, and times them.
     Environment:
       NCCL_NET_PLUGIN=<library>  NCCL_NET=MPIB  MPIB_FABRIC=<--fabric>
       NCCL_DEBUG=INFO  NCCL_DEBUG_SUBSYS=INIT,NET,ENV
       NCCL_P2P_DISABLE=1  NCCL_SHM_DISABLE=1   (never P2P/SHM between the two ranks)
       NCCL_MULTI_RANK_GPU_ENABLE=1             (NCCL 2.30: two ranks may share one GPU)
     and per rank:
       NCCL_HOSTID=mpib-proof-rank<N>           (each rank its own "host": NCCL uses the network)
       NCCL_DEBUG_FILE=<out>/plugin.rank<N>.nccl.log   MPIB_STATS_FILE=<out>/plugin.rank<N>.stats
     Each rank's NCCL log must then contain (any NCCL version's form of):
       "NET/Plugin: Loaded net plugin MPIB (v<N>)", "Using network MPIB",
       "Channel .. [send] via NET/MPIB/<dev>"
     else the script fails naming the missing line. The per-rail statistics are printed.
  3. Baseline: the same program with NCCL_NET=Socket and no plugin (NCCL_NET_PLUGIN=none on
     NCCL >= 2.28, unset before); its logs must show "Using network Socket" and no MPIB.
  4. The combined table: busbw through mpib, busbw through Socket, and the ratio.
  5. nccl-tests, when NCCL_TESTS_DIR names a built nccl-tests (binaries in \$NCCL_TESTS_DIR/build
     or \$NCCL_TESTS_DIR): sendrecv_perf, all_reduce_perf, alltoall_perf with -c 1 through the
     plugin, two processes. nccl-tests needs MPI for two processes (without MPI one process
     holds all ranks, which cannot share one GPU), so it must be built with
     "make MPI=1 MPI_HOME=..." and mpirun must exist; each rank goes through
     ci/nccl-rank-env.sh (its own NCCL_HOSTID, log and stats file) with NCCL_TESTS_DEVICE=--gpu.
     Fails on any #wrong that is not 0, "Out of bounds values" not 0, or missing proof lines.
     NCCL_TESTS_ARGS (default "-b 1K -e 256M -f 2 -g 1 -n 20 -w 5"; -c 1 is always added),
     MPIRUN (default mpirun) and MPIRUN_ARGS (extra mpirun options) adjust it.

Options
  --fabric soft|verbs|auto  MPIB_FABRIC for the plugin runs (default soft: a software RDMA NIC
                            over TCP, needs no RDMA hardware; verbs: needs devices listed by
                            ibv_devices; auto: verbs when ibv_devices lists any, else soft)
  --lib PATH                plugin library to load (default: step 1)
  --out DIR                 where logs, statistics, JSON results and the table go
  --gpu N                   CUDA device both ranks use (default 0)
  --min-bytes S, --max-bytes S   sizes for PyTorch (default 1K and 256M; K/M/G = 2^10/2^20/2^30)
  --ops LIST                collectives (default all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv)
  --iters N                 timed iterations per size (default: auto, 5..50)
  --lifecycle N             after the collectives through mpib, N rounds of a second
                            communicator beside the default one, both checked and destroyed,
                            the default one set up again (NCCL unloads and reloads the plugin)
                            (default 0). NCCL 2.27 to 2.29 forget NCCL_NET_PLUGIN when they
                            unload a plugin, so for those versions the rounds run with
                            NCCL_NET_PLUGIN_REF_COUNT=1 (the plugin stays loaded; said so)
  --abort                   after the collectives through mpib, abort a second communicator
                            while a receive on it is in flight, then check the default one
  --timeout SECONDS         limit for each run (default 1800)
  --nccl-version X.Y.Z      NCCL version for the baseline's NCCL_NET_PLUGIN choice (default:
                            asked from PyTorch)
  --no-baseline             skip the socket baseline (no ratio column)
  --no-torch                skip PyTorch (nccl-tests only)
  --check-lib-only          only step 1 (no GPU needed)
  --dry-run                 print the environments and commands, run nothing (no GPU needed)
  -h, --help                this text

Environment: PYTHON (default python3: the one with torch), NCCL_TESTS_DIR, NCCL_TESTS_ARGS,
MPIRUN, MPIRUN_ARGS. Other NCCL_* and MPIB_* variables you set are passed through
(docs/configuration.md).
Exit status: 0 everything proven, 1 something failed (listed at the end), 2 usage error.
EOF
}

die_usage() { echo "$PROG: $*" >&2; echo "$USAGE" >&2; exit 2; }
die() { echo "$PROG: $*" >&2; exit 1; }

FABRIC=soft LIB='' OUT='' GPU=0 MIN=1K MAX=256M OPS='' ITERS='' LIFECYCLE=0 ABORT=0 TIMEOUT=1800 NCCL_VER=''
BASELINE=1 TORCH=1 LIB_ONLY=0 DRY=0
split=()
for a in "$@"; do
  case $a in --*=*) split+=("${a%%=*}" "${a#*=}") ;; *) split+=("$a") ;; esac
done
set -- ${split[@]+"${split[@]}"}
need() { [[ $# -ge 2 && -n $2 ]] || die_usage "$1 needs a value"; }
while (($#)); do
  case $1 in
    -h | --help) show_help; exit 0 ;;
    --fabric) need "$@"; FABRIC=$2; shift 2 ;;
    --lib) need "$@"; LIB=$2; shift 2 ;;
    --out) need "$@"; OUT=$2; shift 2 ;;
    --gpu) need "$@"; GPU=$2; shift 2 ;;
    --min-bytes) need "$@"; MIN=$2; shift 2 ;;
    --max-bytes) need "$@"; MAX=$2; shift 2 ;;
    --ops) need "$@"; OPS=$2; shift 2 ;;
    --iters) need "$@"; ITERS=$2; shift 2 ;;
    --lifecycle) need "$@"; LIFECYCLE=$2; shift 2 ;;
    --abort) ABORT=1; shift ;;
    --timeout) need "$@"; TIMEOUT=$2; shift 2 ;;
    --nccl-version) need "$@"; NCCL_VER=$2; shift 2 ;;
    --no-baseline) BASELINE=0; shift ;;
    --no-torch) TORCH=0; shift ;;
    --check-lib-only) LIB_ONLY=1; shift ;;
    --dry-run) DRY=1; shift ;;
    *) die_usage "unknown option: $1" ;;
  esac
done
case $FABRIC in soft | verbs | auto) ;; *) die_usage "--fabric must be soft, verbs or auto, not '$FABRIC'" ;; esac
[[ $GPU =~ ^[0-9]+$ ]] || die_usage "--gpu must be a CUDA device number, not '$GPU'"
[[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -gt 0 ]] || die_usage "--timeout must be a positive number of seconds, not '$TIMEOUT'"
[[ -z $ITERS || $ITERS =~ ^[0-9]+$ ]] || die_usage "--iters must be a number, not '$ITERS'"
[[ $LIFECYCLE =~ ^[0-9]+$ ]] || die_usage "--lifecycle must be a number of rounds, not '$LIFECYCLE'"
[[ -z $NCCL_VER || $NCCL_VER =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die_usage "--nccl-version must look like 2.21.5, not '$NCCL_VER'"
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || die "$PY not found (set PYTHON)"
OUT=${OUT:-$ROOT/target/nccl-proof/$(date +%Y%m%d-%H%M%S)}

FAILS=() PASSES=()
fail() { FAILS+=("$*"); echo "FAIL: $*" >&2; }
pass() { PASSES+=("$*"); echo "PASS: $*"; }
step() { printf '\n== %s\n' "$*"; }
show_cmd() { local w; printf '  $'; for w in "$@"; do printf ' %q' "$w"; done; printf '\n'; }

# RDMA devices ibv_devices lists (names after its "------" line), else those in sysfs.
rdma_devices() {
  if command -v ibv_devices >/dev/null 2>&1; then
    { ibv_devices 2>/dev/null || true; } | awk 'seen && NF {print $1} /^[[:space:]]*-+[[:space:]]/ {seen=1}'
  elif [[ -d /sys/class/infiniband ]]; then
    ls /sys/class/infiniband
  fi
}

# version_ge A B: A >= B for dotted versions.
# (sed reads all of sort's output: a reader that stops early fails the pipeline under pipefail.)
version_ge() { [[ $(printf '%s\n%s\n' "$1" "$2" | sort -V | sed -n 1p) == "$2" ]]; }

# ---- 1. the library ----------------------------------------------------------------------
step "plugin library"
if [[ -z $LIB ]]; then
  # Where ci/build-plugin.sh puts it: cargo's target folder (CARGO_TARGET_DIR, relative to the
  # root where the scripts run cargo, else target/).
  target=${CARGO_TARGET_DIR:-target}
  [[ $target == /* ]] || target=$ROOT/$target
  LIB=$target/release/libnccl-net-mpib.so
  if [[ ! -e $LIB ]]; then
    if ((DRY)); then
      echo "  (would build it: ci/build-plugin.sh)"
    else
      command -v cargo >/dev/null || die "$LIB is not built and cargo is missing: build it elsewhere and pass --lib"
      # Its last line names the link it made, next to the library cargo reported.
      built=$("$ROOT/ci/build-plugin.sh") || die "building the plugin failed (ci/build-plugin.sh)"
      echo "$built"
      LIB=${built##*plugin: }
    fi
  fi
fi
[[ -e $LIB || $DRY == 1 ]] || die "--lib $LIB: no such file"
[[ -d $(dirname "$LIB") ]] && LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
mkdir -p "$OUT"
if [[ -e $LIB ]]; then
  if "$PY" "$ROOT/ci/elf_check.py" "$LIB" | tee "$OUT/elf-check.txt"; then
    floor=$(sed -n 's/^ *glibc floor: *\([^ ]*\).*/\1/p' "$OUT/elf-check.txt")
    pass "library loads on this host as it is (host floor ${floor:-none})"
  else
    fail "library check (see $OUT/elf-check.txt)"
    ((DRY)) || { echo "$PROG: the library would not load; stopping" >&2; exit 1; }
  fi
fi
((LIB_ONLY)) && { ((${#FAILS[@]} == 0)) && exit 0 || exit 1; }

# ---- fabric and environments -------------------------------------------------------------
mapfile -t DEVICES < <(rdma_devices)
case $FABRIC in
  verbs) ((${#DEVICES[@]})) || die "--fabric verbs: ibv_devices lists no RDMA device (use --fabric soft)" ;;
  auto) if ((${#DEVICES[@]})); then FABRIC=verbs; else FABRIC=soft; fi ;;
esac
echo "fabric: $FABRIC (RDMA devices: ${DEVICES[*]:-none})"

if ((TORCH)) && [[ -z $NCCL_VER ]] && ((!DRY)); then
  NCCL_VER=$("$PY" - <<'PYEOF' 2>/dev/null || true
import torch, torch.distributed as d
assert torch.cuda.is_available() and d.is_nccl_available()
v = torch.cuda.nccl.version()
print(".".join(map(str, v)) if isinstance(v, tuple) else f"{v // 1000}.{v % 1000 // 100}.{v % 100}")
PYEOF
)
  [[ -n $NCCL_VER ]] || die "$PY has no PyTorch with CUDA and NCCL (set PYTHON, or --no-torch for nccl-tests only)"
fi
((TORCH)) && echo "NCCL (PyTorch's): ${NCCL_VER:-unknown}"

COMMON_ENV=(NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=INIT,NET,ENV" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_MULTI_RANK_GPU_ENABLE=1)
PLUGIN_ENV=("${COMMON_ENV[@]}" "NCCL_NET_PLUGIN=$LIB" NCCL_NET=MPIB "MPIB_FABRIC=$FABRIC")
BASE_ENV=(-u MPIB_STATS_FILE "${COMMON_ENV[@]}" NCCL_NET=Socket)
# NCCL 2.27.3 to 2.29.x clear the plugin's name when they unload it after the last
# communicator, so a communicator created after that cannot find a plugin NCCL_NET_PLUGIN names.
if ((LIFECYCLE)) && [[ -n $NCCL_VER ]] && version_ge "$NCCL_VER" 2.27 && ! version_ge "$NCCL_VER" 2.30 \
  && [[ -z ${NCCL_NET_PLUGIN_REF_COUNT:-} ]]; then
  echo "NCCL $NCCL_VER forgets NCCL_NET_PLUGIN once it unloads the plugin: the lifecycle rounds run with NCCL_NET_PLUGIN_REF_COUNT=1"
  PLUGIN_ENV+=(NCCL_NET_PLUGIN_REF_COUNT=1)
fi
if [[ -n $NCCL_VER ]] && version_ge "$NCCL_VER" 2.28; then
  BASE_ENV=("${BASE_ENV[@]}" NCCL_NET_PLUGIN=none)
else
  BASE_ENV=(-u NCCL_NET_PLUGIN "${BASE_ENV[@]}")
fi
TORCH_ARGS=(--out-dir "$OUT" --gpu "$GPU" --min-bytes "$MIN" --max-bytes "$MAX" --timeout "$TIMEOUT")
[[ -n $OPS ]] && TORCH_ARGS+=(--ops "$OPS")
[[ -n $ITERS ]] && TORCH_ARGS+=(--iters "$ITERS")

# rank_logs LABEL: each rank's NCCL log (its NCCL_DEBUG_FILE, else its console output).
rank_logs() {
  local r f
  for r in 0 1; do
    f=$OUT/$1.rank$r.nccl.log
    [[ -s $f ]] || f=$OUT/$1.rank$r.out
    echo "$f"
  done
}

# run_torch LABEL ENV...: the PyTorch program under `env ENV...`.
run_torch() {
  local label=$1 extra=()
  shift
  if [[ $label == plugin ]]; then
    extra=(--stats --lifecycle "$LIFECYCLE")
    ((ABORT)) && extra+=(--abort)
  fi
  local cmd=(env "$@" "$PY" "$ROOT/ci/torch_collectives.py" run --label "$label" "${TORCH_ARGS[@]}" "${extra[@]}")
  if ((DRY)); then
    show_cmd "${cmd[@]}"
    local r
    for r in 0 1; do
      echo "  rank $r: $("$PY" "$ROOT/ci/torch_collectives.py" rank-env --rank "$r" --label "$label" \
        --out-dir "$OUT" "${extra[@]:0:1}" | tr '\n' ' ')"
    done
    return 0
  fi
  "${cmd[@]}"
}

# proven LABEL WHAT PROOF... : the pass/fail of `nccl_logs.py PROOF... <each rank's log>`.
proven() {
  local label=$1 what=$2 logs
  shift 2
  mapfile -t logs < <(rank_logs "$label")
  if "$PY" "$ROOT/ci/nccl_logs.py" "$@" "${logs[@]}"; then
    pass "$what: NCCL logs of both ranks prove it"
  else
    fail "$what: NCCL logs do not prove it (see above)"
  fi
}

# torch_phase LABEL WHAT ENV... : the PyTorch program, then the proof lines in its logs.
torch_phase() {
  local label=$1 what=$2
  shift 2
  if run_torch "$label" "$@"; then
    ((DRY)) || pass "PyTorch collectives, $what: exact"
  else
    fail "PyTorch collectives, $what (exit $?; logs $OUT/$label.rank*.out)"
  fi
}

# ---- 2.-4. PyTorch through the plugin and the baseline -----------------------------------
if ((TORCH)); then
  step "PyTorch collectives through mpib (MPIB_FABRIC=$FABRIC)"
  torch_phase plugin "through mpib" "${PLUGIN_ENV[@]}"
  ((DRY)) || proven plugin "NCCL used the plugin" proof --net MPIB
  if ((BASELINE)); then
    step "PyTorch collectives through NCCL's socket transport (baseline)"
    torch_phase baseline "through Socket" "${BASE_ENV[@]}"
    ((DRY)) || proven baseline "baseline used NCCL's socket transport, no plugin" baseline --net Socket --absent MPIB
  fi
  if ((!DRY)) && [[ -s $OUT/plugin.json ]]; then
    step "table: mpib vs Socket"
    base=()
    [[ -s $OUT/baseline.json ]] && base=(--baseline "$OUT/baseline.json")
    "$PY" "$ROOT/ci/torch_collectives.py" table "$OUT/plugin.json" "${base[@]}" | tee "$OUT/table.txt" || true
  fi
fi

# ---- 5. nccl-tests -----------------------------------------------------------------------
run_nccl_tests() {
  local dir=$NCCL_TESTS_DIR bindir t mpirun=${MPIRUN:-mpirun}
  if [[ -x $dir/build/sendrecv_perf ]]; then bindir=$dir/build; elif [[ -x $dir/sendrecv_perf ]]; then bindir=$dir; else
    fail "NCCL_TESTS_DIR=$dir: no sendrecv_perf in $dir/build or $dir (build: make MPI=1 MPI_HOME=... CUDA_HOME=... NCCL_HOME=...)"
    return
  fi
  for t in sendrecv_perf all_reduce_perf alltoall_perf; do
    [[ -x $bindir/$t ]] || { fail "nccl-tests: $bindir/$t is missing"; return; }
  done
  # Captured first: piping ldd into an early-exiting grep failed at random under pipefail
  # (grep leaves at the first match, ldd then dies of SIGPIPE) and reported "no MPI".
  local linked mpirun_version
  linked=$(ldd "$bindir/sendrecv_perf" 2>/dev/null || true)
  if ! grep -q 'libmpi' <<<"$linked"; then
    fail "nccl-tests in $bindir was built without MPI: two ranks on one GPU need two processes; rebuild with: make MPI=1 MPI_HOME=<mpi prefix>"
    return
  fi
  command -v "$mpirun" >/dev/null || { fail "nccl-tests: $mpirun not found (set MPIRUN)"; return; }
  local mpi=(-np 2)
  mpirun_version=$("$mpirun" --version 2>&1 || true)
  if grep -qi 'open mpi\|open-rte\|openrte' <<<"$mpirun_version"; then
    mpi+=(--bind-to none)
    [[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
  fi
  # shellcheck disable=SC2206 # word splitting of the user's option strings is intended
  mpi+=(${MPIRUN_ARGS:-})
  # shellcheck disable=SC2206
  local targs=(${NCCL_TESTS_ARGS:--b 1K -e 256M -f 2 -g 1 -n 20 -w 5} -c 1)
  for t in sendrecv_perf all_reduce_perf alltoall_perf; do
    local tag=nccltests-$t
    local cmd=(env "${PLUGIN_ENV[@]}" "NCCL_TESTS_DEVICE=$GPU" "PROOF_OUT=$OUT" "PROOF_TAG=$tag"
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      timeout "$TIMEOUT" "$mpirun" "${mpi[@]}" "$ROOT/ci/nccl-rank-env.sh" "$bindir/$t" "${targs[@]}")
    if ((DRY)); then show_cmd "${cmd[@]}"; continue; fi
    echo "-- $t"
    "${cmd[@]}" >"$OUT/$tag.out" 2>&1 || fail "$t exited with $? (output $OUT/$tag.out)"
    grep -v ' NCCL INFO ' "$OUT/$tag.out" | grep -E '^#|^ +[0-9]' || true
    if "$PY" "$ROOT/ci/nccl_logs.py" nccl-tests "$OUT/$tag.out"; then
      pass "$t -c 1: every #wrong is 0"
    else
      fail "$t: data errors or an unfinished run (see above)"
    fi
    proven "$tag" "$t: NCCL used the plugin" proof --net MPIB
    "$PY" "$ROOT/ci/torch_collectives.py" stats "$OUT/$tag.rank0.stats" "$OUT/$tag.rank1.stats" || true
  done
}
if [[ -n ${NCCL_TESTS_DIR:-} ]]; then
  step "nccl-tests through mpib ($NCCL_TESTS_DIR)"
  run_nccl_tests
fi

# ---- summary -----------------------------------------------------------------------------
step "summary ($OUT)"
((DRY)) && echo "dry run: nothing was run"
for p in ${PASSES[@]+"${PASSES[@]}"}; do echo "  PASS  $p"; done
for f in ${FAILS[@]+"${FAILS[@]}"}; do echo "  FAIL  $f"; done
((${#FAILS[@]} == 0)) || exit 1
