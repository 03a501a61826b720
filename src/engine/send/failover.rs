//! The sender's calls into its failover sub-state machine (`engine/failover/`, DESIGN.md
//! "Rail failover"): events from the plugin, the failover part of a round, failed and
//! failover completions. Each lends failover the hot path's state ([`SendPath`]) for the
//! step; what stays here is what only the engine can do: post a slot held through an
//! outage.

use super::SendEngine;
use crate::engine::failover::{Failover, FailoverCounts};
use crate::engine::layout::SendMemory;
use crate::engine::send_path::SendPath;
use crate::engine::{CtlMemory, Event, Output, Posts, RAILS, RailState, WrKind};
use crate::error::Result;
use crate::fabric::Completion;

impl SendEngine {
    #[cfg(test)]
    pub(crate) fn failover_config_mut(&mut self) -> &mut crate::engine::FailoverConfig {
        self.fo.timer_ns = 0;
        &mut self.fo.cfg
    }

    /// Each rail's failover state.
    pub fn rail_states(&self) -> [RailState; RAILS] {
        self.fo.state
    }

    pub fn failover_counts(&self) -> FailoverCounts {
        self.fo.counts()
    }

    /// Failover and the hot-path state it works on, borrowed apart.
    fn failover_parts(&mut self) -> (&mut Failover, SendPath<'_>) {
        let path = SendPath {
            cfg: &self.cfg,
            slots: &mut self.slots,
            outstanding: &mut self.outstanding,
            tel: &mut self.tel,
            error: &mut self.error,
            probe_check_ns: &mut self.probe_check_ns,
            reqs: &mut self.reqs,
            pending: &mut self.pending,
            rr: &mut self.rr,
        };
        (&mut self.fo, path)
    }

    /// Whether [`Self::poll_failover`] has something to emit now (it must also be called
    /// while any rail is not [`RailState::Up`], to read the control ring).
    pub(crate) fn failover_due(&self) -> bool {
        self.fo.rail_work_due() || self.fo.replays_waiting != 0 || self.held() || self.fo.outage_ns != 0
    }

    /// When the sender's next failover round is due, even for a caller whose requests are
    /// all done: the next stall check, a re-admission attempt to start, a drill's drop;
    /// while an attempt is in progress (Rebuilding, Probing) or rail work is due, at once —
    /// its steps come from the peer (the `Rebuilt` in the control ring) and the fabric (the
    /// new QPs connected), which only a round looks at, so waiting for a timer would add it
    /// to every step. `u64::MAX`: none.
    pub(crate) fn failover_timer_ns(&self) -> u64 {
        if self.failover_due() || self.drill.as_ref().is_some_and(|d| d.due) {
            return 0;
        }
        self.fo.sender_timer_ns()
    }

    /// What the plugin saw (a port down) or did (an action performed), at `now_ns`. What
    /// follows from it is emitted by the next [`Self::handle_timeout`] (due at once).
    pub fn handle_event(&mut self, now_ns: u64, ev: Event) -> Result<()> {
        self.error.check()?;
        let (fo, mut path) = self.failover_parts();
        fo.on_sender_event(&mut path, now_ns, ev)
    }

    /// The failover work of one call: an outage's grace, a slot held through it posted
    /// once a rail is back, then the rest of the round (`Failover::sender_round`).
    pub(crate) fn poll_failover(
        &mut self,
        now_ns: u64,
        mem: &mut (impl CtlMemory + SendMemory),
        out: &mut Output,
    ) -> Result<()> {
        self.error.check()?;
        if !self.fo.cfg.enabled {
            return Ok(());
        }
        self.fo.now_ns = now_ns;
        self.fo.stamp_outage(now_ns);
        if self.fo.outage_ns != 0 {
            let (fo, mut path) = self.failover_parts();
            fo.sender_outage_round(&mut path, now_ns, mem, out)?;
        } else if self.held() {
            self.post_held(now_ns, mem, out)?;
        }
        let (fo, mut path) = self.failover_parts();
        fo.sender_round(&mut path, now_ns, mem, out)
    }

    /// A failed completion on `rail` (failover on): the rail has failed; the connection
    /// goes on unless it was the last rail.
    #[cold]
    #[inline(never)]
    pub(super) fn on_rail_error(&mut self, rail: usize, kind: WrKind, slot: usize, c: &Completion) -> Result<()> {
        let (fo, mut path) = self.failover_parts();
        fo.on_sender_error(&mut path, rail, kind, slot, c)
    }

    /// A replay's signal, a control WRITE or a re-admission probe completed (on `rail`'s CQ;
    /// `part`: the part a replay delivered).
    #[cold]
    #[inline(never)]
    pub(super) fn on_failover_completion(&mut self, rail: usize, kind: WrKind, part: usize, slot: usize) -> Result<()> {
        let (fo, mut path) = self.failover_parts();
        fo.on_sender_completion(&mut path, rail, kind, part, slot)
    }

    /// A slot fully matched while no rail worked, waiting to be posted.
    #[inline]
    pub(super) fn held(&self) -> bool {
        self.matching && self.cur.n > 0 && self.cur.matched == self.cur.n
    }

    /// After an outage: the slot held meanwhile goes out on the rail that is back.
    #[cold]
    #[inline(never)]
    fn post_held(&mut self, now_ns: u64, mem: &mut impl SendMemory, out: &mut Output) -> Result<()> {
        let mut posts = Posts::default();
        self.matching = false;
        self.post_slot(now_ns, mem, &mut posts)?;
        out.chains.extend_from_slice(posts.chains());
        Ok(())
    }
}
