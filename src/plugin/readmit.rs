//! Re-admission of a failed rail in the plugin (DESIGN.md "Rail failover (issue 19)",
//! Re-admission): the engines decide and exchange the new QPs' records over the surviving
//! rail's control ring; this file performs their actions on the fabric.
//!
//! - [`Action::RebuildQps`]: the old QPs of the rail (in the error state since the fence)
//!   detached and destroyed (`NicQueues::detach`: marker-drained, routes removed; the
//!   rail's receive reservation kept), then its QPs made again as they were first made (same
//!   specs, the NIC's same shared CQ and SRQ, routes to the same inbox). So a rail that
//!   flaps for hours holds one set of QPs, not one per re-admission.
//! - [`Action::ConnectQps`]: each new QP connected to the peer's new one: the peer's info
//!   from set-up with the varying bytes of its record ([`QpInfo::record`]; port facts such
//!   as GID and LID stay). Readiness is polled in later rounds ([`Event::QpsConnected`]).
//! - The drill (`MPIB_FAULT_RAIL=rail:N:MS`): a dropped rail refuses to be rebuilt for MS
//!   (for good without MS), as a link that stays down would.

use std::time::{Duration, Instant};

use super::comm::Rail;
use super::failover::FoSide;
use crate::engine::failover::QP_RECORD_WORDS;
use crate::engine::{Event, QpRecords, RAIL_NAMES, RAILS, RailMask};
use crate::error::{Error, Result};
use crate::fabric::{Device, QueuePair};

/// QPs per rail whose records fit one control entry (two words each): re-admission is off
/// for a connection with more on a rail (`MPIB_SOUT_QP`/`MPIB_SUP_QP` > 2).
pub const READMIT_MAX_QPS: u16 = (QP_RECORD_WORDS / 2) as u16;

/// How long a dropped rail (the drill) refuses to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refuse {
    No,
    Until(Instant),
    Forever,
}

impl<D: Device> Rail<D> {
    /// New QPs for rail `idx` (see the module doc); the records of the connectable ones.
    fn rebuild(&mut self, idx: usize) -> Result<QpRecords> {
        if self.qps.len() > READMIT_MAX_QPS as usize {
            return Err(Error::invalid_usage(format!(
                "{} QPs on the rail: re-admission describes at most {READMIT_MAX_QPS}",
                self.qps.len()
            )));
        }
        // The old QPs go first: in the error state since the fence, whose drain fed the
        // engine everything they had completed; their routes go with them, and the NIC's
        // send-queue sum makes room for the new ones (same specs, so `sq`, the rail's
        // resource figures and the receive reservation stay as they are).
        let had_flush = self.flush_qp.is_some();
        let mut old = std::mem::take(&mut self.qps);
        old.extend(self.flush_qp.take());
        self.nic.detach(self.owner, old, self.sq, 0);
        let mut qps = self.nic.attach(self.owner, idx, &self.inbox, &self.specs, 0)?;
        self.flush_qp = if had_flush { qps.pop() } else { None };
        self.qps = qps;
        self.first_qp = self.qps.first().map_or(0, |q| q.qp_num());
        let mut r = QpRecords { n: (2 * self.qps.len()) as u8, ..QpRecords::default() };
        for (i, q) in self.qps.iter().enumerate() {
            let [a, b] = q.local_info().record();
            (r.words[2 * i], r.words[2 * i + 1]) = (a, b);
        }
        Ok(r)
    }

    /// Connects the new QPs to the peer's new ones (`rec`), the flush QP to itself.
    fn connect_new(&mut self, rec: &QpRecords) -> Result<()> {
        let p = self.connect.ok_or_else(|| Error::internal("re-admission of a rail never connected"))?;
        if rec.n as usize != 2 * self.qps.len() || self.peer.len() != self.qps.len() {
            return Err(Error::remote(format!(
                "the peer rebuilt {} QPs of the rail, this side has {}",
                rec.n / 2,
                self.qps.len()
            )));
        }
        for (i, q) in self.qps.iter_mut().enumerate() {
            let info = self.peer[i].with_record([rec.words[2 * i], rec.words[2 * i + 1]]);
            q.connect(&info, &p)?;
            self.peer[i] = info;
        }
        if let Some(f) = self.flush_qp.as_mut() {
            let me = f.local_info();
            f.connect(&me, &p)?;
        }
        Ok(())
    }

    /// Whether every new QP carries WRs now.
    fn new_ready(&mut self) -> Result<bool> {
        for q in self.qps.iter_mut().chain(self.flush_qp.as_mut()) {
            if !q.is_ready()? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl FoSide {
    /// [`crate::engine::Action::RebuildQps`] on `rail` (index `idx`): the event to feed back.
    pub(super) fn rebuild<D: Device>(&mut self, rail: &mut Rail<D>, idx: usize) -> Event {
        let refused = match self.refuse[idx] {
            Refuse::No => false,
            Refuse::Until(t) => Instant::now() < t,
            Refuse::Forever => true,
        };
        if refused {
            log::info!("MPIB_FAULT_RAIL: the {} rail stays down (re-admission refused)", RAIL_NAMES[idx]);
            return Event::ReadmitFailed { rail: idx };
        }
        // A port that is down (verbs: PORT_ERR seen, PORT_ACTIVE not yet) would give QPs
        // whose probes fail only after their retry budget: the attempt waits for the port.
        if rail.dev.port_downs().1 {
            if !self.port_wait.contains(idx) {
                log::info!("re-admission of the {} rail waits for its port to be active", RAIL_NAMES[idx]);
            }
            self.port_wait = self.port_wait.with(idx);
            return Event::PortDown { rail: idx };
        }
        if self.port_wait.contains(idx) {
            self.port_wait = self.port_wait.without(idx);
            log::info!("the {} rail's port is active again: re-admission goes on", RAIL_NAMES[idx]);
        }
        match rail.rebuild(idx) {
            Ok(records) => Event::QpsBuilt { rail: idx, records },
            Err(e) => {
                log::warn!("re-admission of the {} rail: new QPs: {e}", RAIL_NAMES[idx]);
                Event::ReadmitFailed { rail: idx }
            }
        }
    }

    /// [`crate::engine::Action::ConnectQps`]: `None` when connecting (readiness follows in
    /// [`Self::poll_connecting`]), else the failure to feed back.
    pub(super) fn connect<D: Device>(&mut self, rail: &mut Rail<D>, idx: usize, rec: &QpRecords) -> Option<Event> {
        match rail.connect_new(rec) {
            Ok(()) => {
                self.connecting = self.connecting.with(idx);
                None
            }
            Err(e) => {
                log::warn!("re-admission of the {} rail: connecting the new QPs: {e}", RAIL_NAMES[idx]);
                Some(Event::ReadmitFailed { rail: idx })
            }
        }
    }

    /// A fence of `idx` ends any connect in progress on it.
    pub(super) fn fenced(&mut self, idx: usize) {
        self.connecting = self.connecting.without(idx);
    }

    /// Polls the rails being connected; `on` gets [`Event::QpsConnected`] or
    /// [`Event::ReadmitFailed`] for each that is done.
    pub(super) fn poll_connecting<D: Device>(
        &mut self,
        rails: &mut [Rail<D>; RAILS],
        mut on: impl FnMut(Event) -> Result<()>,
    ) -> Result<()> {
        for idx in self.connecting.iter() {
            let ev = match rails[idx].new_ready() {
                Ok(false) => continue,
                Ok(true) => Event::QpsConnected { rail: idx },
                Err(e) => {
                    log::warn!("re-admission of the {} rail: the new QPs did not connect: {e}", RAIL_NAMES[idx]);
                    Event::ReadmitFailed { rail: idx }
                }
            };
            self.connecting = self.connecting.without(idx);
            on(ev)?;
        }
        Ok(())
    }

    /// The drill dropped the rails of `mask`: they refuse to come back for `ms` (for good
    /// without).
    pub(super) fn refuse_for(&mut self, mask: RailMask, ms: Option<u64>) {
        for r in mask.iter() {
            self.refuse[r] = ms.map_or(Refuse::Forever, |ms| Refuse::Until(Instant::now() + Duration::from_millis(ms)));
        }
    }
}
