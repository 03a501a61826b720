//! The fault drill (`MPIB_FAULT_RAIL`, soft fabric): when a send comm drops the chosen rails
//! as a lost link would. The engine keeps the schedule (isends counted, or the time from the
//! comm's first isend) and emits [`Action::Drop`] at its next timeout; the plugin injects
//! the fault on the rails' QPs and refuses their re-admission for the drill's time.

use super::SendEngine;
use crate::config::{FaultAt, FaultDrill};
use crate::engine::actions::Output;
use crate::engine::{Action, RAILS, RailMask, RailState};

/// A drill's progress.
#[derive(Debug)]
pub(super) struct Drill {
    cfg: FaultDrill,
    isends: u64,
    /// A timed drill: when the next drop is due (ns; set at the first isend).
    next_ns: u64,
    drops: u64,
    /// A drop fired and waits for the next timeout to become an action.
    pub(super) due: bool,
}

impl Drill {
    pub(super) fn new(cfg: FaultDrill) -> Drill {
        Drill { cfg, isends: 0, next_ns: 0, drops: 0, due: false }
    }

    /// One more isend, at `now`: whether a drop fires. A timed drill's times count from
    /// the first isend; a repeated one keeps its cadence.
    fn on_isend(&mut self, now: u64) -> bool {
        self.isends += 1;
        match self.cfg.at {
            FaultAt::Isend(n) => self.isends == n,
            FaultAt::Ms(at) => {
                if self.isends == 1 {
                    self.next_ns = now + at * 1_000_000;
                }
                let due = self.next_ns != u64::MAX && now >= self.next_ns;
                if due {
                    self.drops += 1;
                    let more = self.cfg.count.is_none_or(|c| self.drops < c);
                    self.next_ns = match self.cfg.every_ms {
                        Some(e) if more => {
                            let e = e * 1_000_000;
                            self.next_ns + ((now - self.next_ns) / e + 1) * e
                        }
                        _ => u64::MAX,
                    };
                }
                due
            }
        }
    }
}

impl SendEngine {
    /// An isend with a drill configured: counts it; a drop that fires is emitted at once
    /// (the plugin's next look at [`Self::poll_timeout`]).
    #[cold]
    #[inline(never)]
    pub(super) fn drill_isend(&mut self, now_ns: u64) {
        let Some(d) = self.drill.as_mut() else { return };
        if d.on_isend(now_ns) {
            d.due = true;
            self.fo.timer_ns = 0;
        }
    }

    /// The drop that fired: the rails that are Up get the fault; every chosen rail refuses
    /// re-admission (one still down or coming back only has its refusal renewed: dropping
    /// an attempt's new QPs would test the drill, not the rail).
    pub(super) fn drill_drop(&mut self, out: &mut Output) {
        let Some(d) = self.drill.as_mut() else { return };
        d.due = false;
        let refuse = RailMask::from_fn(|r| r < RAILS && d.cfg.mask & (1 << r) != 0);
        let states = self.fo.state;
        let inject = RailMask::from_fn(|r| refuse.contains(r) && states[r] == RailState::Up);
        out.actions.push(Action::Drop { inject, refuse, kind: d.cfg.kind, refuse_ms: d.cfg.for_ms, isend: d.isends });
    }
}
