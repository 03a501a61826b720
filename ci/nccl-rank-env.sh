#!/usr/bin/env bash
# Per-rank environment for a rank started by mpirun/srun, then runs the command:
#   NCCL_HOSTID=${PROOF_HOSTID_PREFIX:-mpib-proof}-rank<N>   each rank its own "host", so
#       NCCL connects ranks of ONE machine through the network (PROOF_FAKE_HOSTS=0: keep
#       NCCL_HOSTID as it is, for real multi-node runs)
#   NCCL_DEBUG_FILE=$PROOF_OUT/$PROOF_TAG.rank<N>.nccl.log     (when PROOF_OUT is set)
#   MPIB_STATS_FILE=$PROOF_OUT/$PROOF_TAG.rank<N>.stats
# The names match ci/torch_collectives.py's rank_env(). The rank comes from
# OMPI_COMM_WORLD_RANK (Open MPI), PMIX_RANK, PMI_RANK (MPICH/Hydra) or SLURM_PROCID (srun).
# Usage: mpirun -np 2 ci/nccl-rank-env.sh ./build/sendrecv_perf -b 1K -e 256M -f 2 -g 1 -c 1
set -euo pipefail
if [[ $# == 0 || $1 == -h || $1 == --help ]]; then
  sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  [[ $# == 0 ]] && exit 2 || exit 0
fi
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}}
if [[ -z $rank ]]; then
  echo "nccl-rank-env.sh: no rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID): start it with mpirun or srun" >&2
  exit 2
fi
if [[ ${PROOF_FAKE_HOSTS:-1} != 0 ]]; then
  export NCCL_HOSTID="${PROOF_HOSTID_PREFIX:-mpib-proof}-rank$rank"
fi
if [[ -n ${PROOF_OUT:-} ]]; then
  tag=${PROOF_TAG:-run}
  export NCCL_DEBUG_FILE="$PROOF_OUT/$tag.rank$rank.nccl.log"
  export MPIB_STATS_FILE="$PROOF_OUT/$tag.rank$rank.stats"
fi
exec "$@"
