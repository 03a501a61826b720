//! What the comm driver (`comm.rs`) needs of an engine, the same for the sender and the
//! receiver: completions, timeouts and events in, the connection's failure recorded, news
//! looked for. Each side's region view (`SendMem`, `RecvMem`) is chosen here, so the driver
//! holds one `HostRegion` and is generic over the engine alone.

use super::place::ConnPlace;
use super::profile::{RecvProfile, SendProfile};
use super::region::{RecvMem, SendMem};
use super::resources::Res;
use crate::engine::{Event, Output, RAILS, RailCounts, RailState, RecvEngine, SendEngine};
use crate::error::{Error, Result};
use crate::fabric::Completion;
use crate::fabric::mem::HostRegion;

/// A connection's engine as the comm driver drives it.
pub trait Driven {
    /// The NCCL profiler events this side keeps (`profile.rs`).
    type Profile;
    /// What a comm of this side counts as (`mpib_resource_stats`).
    const RESOURCE: Res;
    /// Whether the NIC's receive-not-ready count is this side's to record (the receiver's:
    /// its shared receive queue is the one that ran dry).
    const COUNTS_RNR: bool;
    /// A completion polled from `rail`'s CQ (or taken from its inbox) at `now`.
    fn on_completion(&mut self, now: u64, rail: usize, c: &Completion, region: &HostRegion) -> Result<()>;
    /// The engine's own work due at `now`; its chains and actions go into `out`.
    fn on_timeout(&mut self, now: u64, region: &HostRegion, out: &mut Output) -> Result<()>;
    /// The answer to an action, or news from the fabric (a port gone down).
    fn on_event(&mut self, now: u64, ev: Event) -> Result<()>;
    /// Whether the peer wrote a control message not yet read (one load, one compare).
    fn control_waiting(&self, region: &HostRegion) -> bool;
    /// Whether failover work is owed: a fence, a report, a message to write.
    fn failover_due(&self) -> bool;
    /// A fabric call failed: the connection is broken. Returns `e` placed.
    fn fail(&mut self, e: Error) -> Error;
    /// Logs the hang report `Action::HangReport` asks for.
    fn hang_report(&self, now: u64, place: &ConnPlace, slot: usize, age_ns: u64);
    /// Each rail's state.
    fn rail_states(&self) -> [RailState; RAILS];
    /// Each rail's counters, now.
    fn counters(&self) -> [RailCounts; RAILS];
    /// `n` receive-not-ready events on `rail` (only called where [`Self::COUNTS_RNR`]).
    fn count_rnr(&self, _rail: usize, _n: u64) {}
}

impl Driven for SendEngine {
    type Profile = SendProfile;
    const RESOURCE: Res = Res::SendComms;
    const COUNTS_RNR: bool = false;
    #[inline(always)]
    fn on_completion(&mut self, now: u64, rail: usize, c: &Completion, _region: &HostRegion) -> Result<()> {
        self.handle_completion(now, rail, c)
    }
    fn on_timeout(&mut self, now: u64, region: &HostRegion, out: &mut Output) -> Result<()> {
        self.handle_timeout(now, &mut SendMem(region), out)
    }
    fn on_event(&mut self, now: u64, ev: Event) -> Result<()> {
        self.handle_event(now, ev)
    }
    #[inline(always)]
    fn control_waiting(&self, region: &HostRegion) -> bool {
        SendEngine::control_waiting(self, &SendMem(region))
    }
    fn failover_due(&self) -> bool {
        SendEngine::failover_due(self)
    }
    fn fail(&mut self, e: Error) -> Error {
        SendEngine::fail(self, e)
    }
    fn hang_report(&self, now: u64, place: &ConnPlace, slot: usize, age_ns: u64) {
        super::hang::report(place, slot, age_ns, self.state_report(now));
    }
    fn rail_states(&self) -> [RailState; RAILS] {
        SendEngine::rail_states(self)
    }
    fn counters(&self) -> [RailCounts; RAILS] {
        SendEngine::counters(self)
    }
}

impl Driven for RecvEngine {
    type Profile = RecvProfile;
    const RESOURCE: Res = Res::RecvComms;
    const COUNTS_RNR: bool = true;
    #[inline(always)]
    fn on_completion(&mut self, _now: u64, rail: usize, c: &Completion, region: &HostRegion) -> Result<()> {
        self.handle_completion(rail, c, &RecvMem(region))
    }
    fn on_timeout(&mut self, now: u64, region: &HostRegion, out: &mut Output) -> Result<()> {
        self.handle_timeout(now, &mut RecvMem(region), out)
    }
    fn on_event(&mut self, _now: u64, ev: Event) -> Result<()> {
        self.handle_event(ev)
    }
    #[inline(always)]
    fn control_waiting(&self, region: &HostRegion) -> bool {
        RecvEngine::control_waiting(self, &RecvMem(region))
    }
    fn failover_due(&self) -> bool {
        RecvEngine::failover_due(self)
    }
    fn fail(&mut self, e: Error) -> Error {
        RecvEngine::fail(self, e)
    }
    fn hang_report(&self, now: u64, place: &ConnPlace, slot: usize, age_ns: u64) {
        super::hang::report(place, slot, age_ns, self.state_report(now));
    }
    fn rail_states(&self) -> [RailState; RAILS] {
        RecvEngine::rail_states(self)
    }
    fn counters(&self) -> [RailCounts; RAILS] {
        RecvEngine::counters(self)
    }
    #[inline(always)]
    fn count_rnr(&self, rail: usize, n: u64) {
        RecvEngine::count_rnr(self, rail, n)
    }
}
