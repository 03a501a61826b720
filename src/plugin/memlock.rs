//! The locked-memory check at `init` on the verbs fabric (see `fabric/verbs/memlock.rs` for
//! what the kernel charges): a WARN, with the `ulimit -l` advice, when `RLIMIT_MEMLOCK`
//! applies and is below what the queues and control memory of one communicator's
//! connections pin on the opened NICs, the least a job needs (NCCL's own buffers come on
//! top). The figure is an estimate at a NIC's usual layout: 64 bytes per CQ entry, SRQ
//! WQE and send-queue WQE.

use super::nic_queues::FIRST_CQ_DEPTH;
use super::rail::{CTS_QP_DEPTH, CTS_QP_DEPTH_FAILOVER, send_qp_depth};
use super::region::{RECV_REGION_BYTES, SEND_REGION_BYTES};
use crate::config::Config;
use crate::fabric::verbs::memlock::{ADVICE, LockedMemory, bytes};

/// Bytes a NIC's queue entry takes (mlx5: a CQE, a send WQE's basic block; an SRQ WQE with
/// its one SGE is 32, rounded up here).
const ENTRY_BYTES: u64 = 64;
const PAGE: u64 = 4096;

/// What one communicator pins on each NIC for one send and one receive connection: the
/// NIC's shared CQ (its first size) and SRQ (`MPIB_SRQ_DEPTH`), the connections' send
/// queues, and their control regions; times `nics`.
pub fn need(cfg: &Config, nics: usize) -> u64 {
    let nqps = cfg.rails[0].qps.max(cfg.rails[1].qps) as u64;
    let pieces = if cfg.rails.iter().any(|r| r.stripe) { 2 } else { 1 };
    let send_qps = nqps * send_qp_depth(nqps as u16, pieces, cfg.failover) as u64;
    let cts = if cfg.failover { CTS_QP_DEPTH_FAILOVER } else { CTS_QP_DEPTH } as u64;
    let recv_qps = cts + (nqps - 1);
    let entries = FIRST_CQ_DEPTH as u64 + cfg.srq_depth as u64 + send_qps + recv_qps;
    let regions = (SEND_REGION_BYTES as u64).next_multiple_of(PAGE) + (RECV_REGION_BYTES as u64).next_multiple_of(PAGE);
    nics as u64 * (entries * ENTRY_BYTES + regions)
}

/// The WARN for `m` when the limit applies and is below `need` (on `nics` NICs).
pub fn warning(m: &LockedMemory, need: u64, nics: usize, srq_depth: u32) -> Option<String> {
    let limit = m.applies()?;
    (limit < need).then(|| {
        format!(
            "locked memory (RLIMIT_MEMLOCK) is {m}, below the {} that the queues and control memory of one \
             communicator pin on {nics} NIC(s) (MPIB_SRQ_DEPTH={srq_depth} WQEs per NIC), before NCCL's own buffers: \
             connections will fail with ENOMEM; {ADVICE} (or run with CAP_IPC_LOCK)",
            bytes(need)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_limit_is_warned_unless_it_does_not_apply() {
        let cfg = Config::default();
        let need = need(&cfg, 2);
        // The default SRQ (16384 WQEs) alone is 1 MiB per NIC.
        assert!(need > 2 << 20 && need < 4 << 20, "{}", bytes(need));
        let small = LockedMemory { limit: Some(64 << 10), cap_ipc_lock: false };
        let w = warning(&small, need, 2, cfg.srq_depth).expect("64 KiB is too little");
        assert!(w.contains("is 64 KiB (ulimit -l 64)") && w.contains("ulimit -l unlimited"), "{w}");
        assert!(w.contains("on 2 NIC(s)") && w.contains("MPIB_SRQ_DEPTH=16384"), "{w}");
        let root = LockedMemory { cap_ipc_lock: true, ..small };
        assert_eq!(warning(&root, need, 2, cfg.srq_depth), None, "CAP_IPC_LOCK: the limit does not apply");
        let unlimited = LockedMemory { limit: None, cap_ipc_lock: false };
        assert_eq!(warning(&unlimited, need, 2, cfg.srq_depth), None);
        let enough = LockedMemory { limit: Some(8 << 20), cap_ipc_lock: false };
        assert_eq!(warning(&enough, need, 2, cfg.srq_depth), None, "8 MiB: enough for the queues");
        // A smaller SRQ needs less.
        let lean = Config { srq_depth: 256, ..Config::default() };
        assert!(super::need(&lean, 2) < need / 4);
    }
}
