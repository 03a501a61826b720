//! A plugin context: what the connections of one NCCL communicator share. ABI v11+ makes one
//! per `init(ctx)` (one per communicator) and hands it to `listen`/`connect`; older ABIs have
//! no context, and every connection of the process uses the plugin's default one.
//!
//! A context owns, per rail NIC its connections use, one [`NicQueues`]: the shared CQ, SRQ
//! and routes (`nic_queues.rs`). It keeps them weakly: each connection holds its NICs' queues, so
//! they go with the last connection using them, whether before or after `finalize` (NCCL
//! may close comms after finalizing their communicator, and a listen comm or a pending
//! connection keeps its context alive until it is done with it).
//!
//! Why per communicator: NCCL drives one communicator's connections from one proxy thread
//! (its progress thread; set-up and registration come from its service thread), so the
//! NIC's poll lock is contended only by set-up, and a poll serves only connections that
//! thread drives anyway. With a pre-v11 ABI every communicator of the process shares the
//! default context, and several progress threads may meet at a NIC's poll lock: `try_lock`
//! keeps each of them from ever waiting (the holder queues the others' completions in their
//! inboxes), see `nic_queues.rs`.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::instance_state::InstanceState;
use super::nic_queues::NicQueues;
use super::profile::Sink;
use super::resources::{Held, Res};
use crate::error::Result;
use crate::fabric::Device;

pub struct Context<D: Device> {
    pub id: u64,
    /// NCCL's communicator id (v11+), 0 for the default context.
    pub comm_id: u64,
    /// The communicator's traffic class, when NCCL gave one (v11+ `init` config).
    pub traffic_class: Option<i32>,
    srq_depth: u32,
    /// What its plugin instance's contexts share: the resource counts this context's
    /// objects hold amounts of, the statistics registry, the in-process listeners.
    pub state: &'static InstanceState,
    /// The queues of each NIC in use, by the NIC's identity (its device's address: devices
    /// stay open for the process lifetime).
    nics: Mutex<Vec<(usize, Weak<NicQueues<D>>)>>,
    /// NCCL's profiler callback given to `init` (`profile.rs`): read at set-up only.
    profiler: Mutex<Option<Sink>>,
    _held: Held,
}

impl<D: Device> Context<D> {
    pub fn new(
        id: u64,
        comm_id: u64,
        traffic_class: Option<i32>,
        srq_depth: u32,
        state: &'static InstanceState,
    ) -> Context<D> {
        Context {
            id,
            comm_id,
            traffic_class,
            srq_depth,
            state,
            nics: Mutex::new(Vec::new()),
            profiler: Mutex::new(None),
            _held: state.counts.hold(Res::Contexts, 1),
        }
    }

    /// The queues of `dev` for this context, made on first use. Set-up only: the lock here
    /// is never taken on the data path.
    pub fn queues(&self, dev: &Arc<D>) -> Result<Arc<NicQueues<D>>> {
        let key = Arc::as_ptr(dev) as usize;
        let mut nics = self.nics.lock();
        nics.retain(|(_, w)| w.strong_count() > 0);
        if let Some(q) = nics.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
            return Ok(q);
        }
        let q = Arc::new(NicQueues::new(dev.clone(), self.srq_depth, &self.state.counts)?);
        nics.push((key, Arc::downgrade(&q)));
        Ok(q)
    }

    /// Where the events of this context's connections go (`None`: no profiler).
    pub fn profiler(&self) -> Option<Sink> {
        self.profiler.lock().clone()
    }

    pub fn set_profiler(&self, sink: Option<Sink>) {
        *self.profiler.lock() = sink;
    }

    /// NICs whose queues are alive (tests).
    pub fn live_nics(&self) -> usize {
        self.nics.lock().iter().filter(|(_, w)| w.strong_count() > 0).count()
    }
}
