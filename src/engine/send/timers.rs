//! What the sender does on its own schedule, behind [`SendEngine::poll_timeout`]: idle-rail
//! probes and keepalives, and, with failover, the stall check, fences, reports, replays, the
//! receiver's control messages, re-admission steps and the fault drill. The plugin calls
//! [`SendEngine::handle_timeout`] when the time it names has come (one compare per call)
//! or when the receiver wrote a control message ([`SendEngine::control_waiting`]).

use super::SendEngine;
use crate::engine::actions::Output;
use crate::engine::layout::SendMemory;
use crate::engine::{CtlMemory, QpRef, RAILS, RailMask, WrKind};
use crate::error::Result;
use crate::fabric::{SendWr, Sge, WrOpcode};

/// Whether the caller waits on the connection (a send without its CTS, or not yet
/// complete): then an idle rail that carries its transfers gets keepalives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallerWaits {
    Yes,
    No,
}

impl SendEngine {
    /// The earliest time (ns) at which [`Self::handle_timeout`] has work: a probe or a
    /// keepalive, a failover step, a stall check, a re-admission attempt, the drill. A lower
    /// bound (calling earlier does nothing); 0: at once; `u64::MAX`: nothing scheduled.
    #[inline(always)]
    pub fn poll_timeout(&self) -> u64 {
        self.probe_check_ns.min(self.fo.timer_ns)
    }

    /// Runs what is due at `now_ns` (see the module doc). Its chains and actions go into
    /// `out`: the plugin posts the chains in order, performs the actions and answers each
    /// with [`Self::handle_event`], then calls again while [`Self::poll_timeout`] says so.
    /// After the connection failed nothing more is posted, and nothing is reported here:
    /// the calls that need the peer report the failure.
    pub fn handle_timeout(
        &mut self,
        now_ns: u64,
        mem: &mut (impl CtlMemory + SendMemory),
        out: &mut Output,
    ) -> Result<()> {
        if self.error.is_set() {
            (self.probe_check_ns, self.fo.timer_ns) = (u64::MAX, u64::MAX);
            return Ok(());
        }
        let waits = if self.pending > 0 || self.no_cts { CallerWaits::Yes } else { CallerWaits::No };
        self.poll_probes(now_ns, waits, out);
        if self.drill.as_ref().is_some_and(|d| d.due) {
            self.drill_drop(out);
        }
        let r = self.poll_failover(now_ns, mem, out);
        self.watch_hang(now_ns, out);
        self.fo.timer_ns = self.failover_timer_ns().min(self.hang.next_ns);
        r
    }

    /// Whether the receiver wrote a control message not yet read (one load, one compare):
    /// the plugin checks it where a call waits, and then calls [`Self::handle_timeout`].
    /// Failover off: never.
    #[inline]
    pub fn control_waiting(&self, mem: &impl CtlMemory) -> bool {
        self.fo.cfg.enabled && self.fo.ctl.waiting(mem)
    }

    /// Whether a control message that came out of band waits (the plugin runs a round
    /// after the one that read it; tests ask).
    pub fn oob_waiting(&self) -> bool {
        self.fo.ctl.has_oob()
    }

    /// Emits a probe on each healthy rail idle for the probe interval.
    ///
    /// [`CallerWaits::Yes`]: the caller waits on this connection (a send without its CTS, or
    /// not yet complete), so even with probes off an idle rail gets a keepalive every
    /// [`KEEPALIVE_NS`](crate::engine::KEEPALIVE_NS): a dead receiver is then noticed.
    pub(crate) fn poll_probes(&mut self, now_ns: u64, waiting: CallerWaits, out: &mut Output) {
        if now_ns < self.probe_check_ns || self.error.is_set() {
            return;
        }
        crate::telemetry::refresh_probe_backoff(&mut self.tel);
        for rail in 0..RAILS {
            // Not while a signalled WR is out (an empty transfer's carries 0 bytes, so the
            // telemetry's bytes in flight does not see it).
            if self.outstanding[rail] > 0 {
                continue;
            }
            let t = &self.tel[rail];
            // A keepalive goes on a rail that carries this connection's transfers (SOUT
            // before any): one live rail tells a dead receiver, and a rail that carries no
            // bytes sends nothing at all (MPIB_SPLIT=sout leaves SUP silent). It is not
            // budgeted; an idle probe is, against every connection's on the rail's NIC.
            let keepalive =
                waiting == CallerWaits::Yes && self.carries(rail) && t.probe_due(now_ns, crate::engine::KEEPALIVE_NS);
            if !keepalive {
                let interval = self.cfg.probe_interval_ns;
                if interval == 0 || !t.idle_probe_due(now_ns, interval) {
                    continue;
                }
                if !self.cfg.probe_budgets[rail].take(now_ns) {
                    self.tel[rail].on_probe_refused(now_ns, interval);
                    continue;
                }
            }
            out.push(rail, QpRef::Data(0)).add(SendWr {
                wr_id: WrKind::Probe.id(rail, 0),
                opcode: WrOpcode::Write,
                signaled: true,
                inline: true,
                num_sge: 1,
                sge: [Sge { addr: self.cfg.sizes_addr, len: 8, lkey: self.cfg.sizes_lkeys[rail] }, Sge::default()],
                remote_addr: self.cfg.scratch_addr,
                rkey: self.cfg.scratch_rkeys[rail],
                ..SendWr::default()
            });
            // A probe is a WR and a doorbell, and counts in `probes` (not as data).
            self.tel[rail].on_probe_post(now_ns);
            self.tel[rail].stats().count_post(1, 0, 0, 0);
        }
        // The next check: the earliest time a rail can owe a probe or a keepalive. A rail
        // that gets neither (probes off, and it carries nothing) sets no time; a rail that
        // starts to carry resets the check (`post.rs`). A rail whose probes backed off is
        // looked at again an interval from now (its backoff may end: the other rails' RTTs
        // move), not at every call.
        let probe_ns = if self.cfg.probe_interval_ns > 0 { self.cfg.probe_interval_ns } else { u64::MAX };
        self.probe_check_ns = (0..RAILS)
            .map(|rail| {
                let t = &self.tel[rail];
                let keepalive_ns = if self.carries(rail) { crate::engine::KEEPALIVE_NS } else { u64::MAX };
                let recheck = t.idle_since_ns().max(now_ns).saturating_add(probe_ns);
                t.idle_probe_at(probe_ns).min(recheck).min(t.idle_since_ns().saturating_add(keepalive_ns))
            })
            .min()
            .unwrap_or(0);
    }

    /// Whether `rail` carries this connection's transfers (SOUT before any), for keepalives.
    /// A failed rail carries nothing (failover: the connection goes on without it); when
    /// every rail that carried has failed, the first healthy one does, so a sender whose
    /// last rail dies silently still hears of it. Out of line: it runs only when a probe or
    /// keepalive may be due, and inlined it cost the data path ~15 instructions a message.
    #[inline(never)]
    fn carries(&self, rail: usize) -> bool {
        let failed = self.failed_rails();
        let live = RailMask::from_fn(|r| self.carried.contains(r) && !failed.contains(r));
        if live.is_empty() {
            RailMask::from_fn(|r| !failed.contains(r)).first() == Some(rail)
        } else {
            live.contains(rail)
        }
    }
}
