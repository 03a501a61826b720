//! What every context and connection of one plugin instance (`process.rs`) shares: its
//! resource counts, its statistics registry and the writers of its statistics files, its
//! in-process set-up listeners and network, and the identities of its connections. The instance owns it
//! and passes `&'static` to it down (contexts, set-up), so two instances in one process
//! (tests) share none of it; the process's instance is the ABI edge's static.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::oob::InprocListeners;
use super::resources::Counts;
use crate::config::Config;
use crate::error::Result;
use crate::fabric::soft::InprocNet;
use crate::telemetry::{Registry, StatsExport};

pub struct InstanceState {
    /// What the instance holds now (`mpib_resource_stats`).
    pub counts: Counts,
    /// Its connections' rail statistics (`mpib_rail_stats`, the statistics files). The
    /// data path writes its own blocks through their handles, never through this.
    pub stats: Registry,
    /// The writers of the statistics files, started at the first `init`.
    export: OnceLock<StatsExport>,
    /// Its in-process listeners (`MPIB_FABRIC=inproc`): a handle names one of these only.
    pub inproc: InprocListeners,
    /// The in-process network its devices are on (`MPIB_FABRIC=inproc`): their QPs reach
    /// the QPs of this instance only, as its handles name its own listeners.
    inproc_net: OnceLock<Arc<InprocNet>>,
    next_owner: AtomicU64,
}

impl Default for InstanceState {
    fn default() -> Self {
        InstanceState::new()
    }
}

impl InstanceState {
    pub const fn new() -> InstanceState {
        InstanceState {
            counts: Counts::new(),
            stats: Registry::new(),
            export: OnceLock::new(),
            inproc: InprocListeners::new(),
            inproc_net: OnceLock::new(),
            next_owner: AtomicU64::new(1),
        }
    }

    /// The in-process network of this instance's devices.
    pub fn inproc_net(&self) -> &Arc<InprocNet> {
        self.inproc_net.get_or_init(InprocNet::new)
    }

    /// A fresh connection identity (the routes of a NIC's shared queues name their owner
    /// by it).
    pub fn new_owner(&self) -> u64 {
        self.next_owner.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts the statistics files `cfg` asks for, of this instance's registry (the first
    /// call decides; later ones do nothing). An error names a file that cannot be written.
    pub fn start_export(&'static self, cfg: &Config) -> Result<()> {
        let mut failed = None;
        self.export.get_or_init(|| {
            let (export, e) = StatsExport::start(cfg, &self.stats);
            failed = e;
            export
        });
        failed.map_or(Ok(()), Err)
    }

    /// Writes the statistics files now (a comm closed, `finalize`), those configured.
    pub fn flush_stats(&self) {
        if let Some(e) = self.export.get() {
            e.flush_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::config::Config;
    use crate::plugin::{AbiVersion, CommHandle, HANDLE_BYTES, Process};

    const ABI: AbiVersion = AbiVersion::V8;

    /// A plugin instance of its own on the in-process fabric, initialized.
    fn instance() -> &'static Process {
        let p: &'static Process = Box::leak(Box::new(Process::new()));
        p.init(ABI, || Config::from_vars([("MPIB_FABRIC", "inproc")])).expect("init");
        p
    }

    /// A send and a receive comm of `p`, through a listen handle of its own.
    fn connect(p: &'static Process) -> (CommHandle, CommHandle) {
        let mut handle = [0u8; HANDLE_BYTES];
        let listen = p.listen(ABI, None, 0, &mut handle).expect("listen");
        let (mut send, mut recv) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while send.is_none() || recv.is_none() {
            assert!(Instant::now() < deadline, "connect/accept did not finish");
            if send.is_none() {
                send = p.connect(ABI, None, 0, &mut handle, None).expect("connect");
            }
            if recv.is_none() {
                recv = p.accept(listen).expect("accept");
            }
        }
        p.close_listen(listen).unwrap();
        (send.unwrap(), recv.unwrap())
    }

    #[test]
    fn instances_in_one_process_keep_their_own_statistics_counts_and_set_up_listeners() {
        let (a, b) = (instance(), instance());
        // A listen handle of `a` names a listener `b` does not have.
        let mut handle = [0u8; HANDLE_BYTES];
        let listen = a.listen(ABI, None, 0, &mut handle).expect("listen");
        let e = b.connect(ABI, None, 0, &mut handle.clone(), None).expect_err("another instance's listener");
        assert!(e.msg().contains("does not exist"), "{e}");
        assert_eq!(a.accept(listen).unwrap(), None, "nothing reached a's listener");
        a.close_listen(listen).unwrap();
        // A connection of `a` is in a's registry and counts only.
        let (send, recv) = connect(a);
        let (ta, tb) = (a.stats().totals(), b.stats().totals());
        assert_eq!((ta[0].live, ta[1].live), (2, 2), "both comms' rails, in a's registry");
        assert_eq!((tb[0].live, tb[1].live), (0, 0), "b's registry saw none of them");
        assert!(b.stats().nic_totals().is_empty() && b.stats().peer_totals().is_empty());
        let (ra, rb) = (a.resources(), b.resources());
        assert_eq!((ra.send_comms, ra.recv_comms), (1, 1));
        assert!(ra.qps > 0);
        assert_eq!((rb.send_comms, rb.recv_comms, rb.qps), (0, 0, 0), "b holds nothing of a's connection");
        a.close_send(send).unwrap();
        a.close_recv(recv).unwrap();
        assert_eq!(a.stats().totals()[0].live, 0, "closed: folded into a's totals");
        assert_eq!(a.resources().qps, 0);
        // `b` makes its own connection, in its own registry.
        let (send, recv) = connect(b);
        assert_eq!(b.stats().totals()[0].live, 2);
        assert_eq!(a.stats().totals()[0].live, 0, "a's registry saw none of b's");
        b.close_send(send).unwrap();
        b.close_recv(recv).unwrap();
    }
}
