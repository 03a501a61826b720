//! The hang watch: a request NCCL posted that has waited longer than a threshold
//! (`MPIB_HANG_REPORT_MS`) makes the engine emit [`Action::HangReport`] once; the plugin
//! logs the connection's state then (`SendEngine::state_report`, `RecvEngine::state_report`,
//! with its place). Another report comes only after the reported request completed.
//!
//! Off the data path: the receiver's reads no clock, so a request's age is counted from the
//! first timer round that saw it outstanding (`handle_timeout`, which a caller that waits
//! runs within a keepalive interval, 100 ms: the age is a lower bound that much short at
//! most; a round at least every second while the caller calls, whatever else is set). The
//! watch keeps its own stamps, written only by those rounds; its deadline is folded into
//! the engine's timer.

use super::actions::{Action, Output};
use super::layout::SLOTS;
use super::{RAIL_NAMES, RailMask};

/// The watch looks at least this often while its engine's caller calls: a request that
/// starts waiting while no other timer is set (a keepalive in flight, a report made) is
/// seen within it.
const LOOK_EVERY_NS: u64 = 1_000_000_000;

/// Per-slot stamps of what the rounds saw outstanding, and the one report made.
#[derive(Clone, Debug)]
pub(crate) struct HangWatch {
    /// 0: off.
    threshold_ns: u64,
    /// Per slot: the request's key (see [`HangWatch::check`]; 0: none) and when a round
    /// first saw it outstanding.
    seen: [(u64, u64); SLOTS],
    /// The key of the request last reported (0: none); no other report while it waits.
    reported: u64,
    /// When the next report can be due (`u64::MAX`: not before something else happens).
    pub(crate) next_ns: u64,
}

impl HangWatch {
    pub(crate) fn new(threshold_ns: u64) -> HangWatch {
        HangWatch { threshold_ns, seen: [(0, 0); SLOTS], reported: 0, next_ns: u64::MAX }
    }

    /// A round at `now_ns` saw `waiting` outstanding: `(slot, key)`, the key naming the
    /// request in the slot (its sequence number + 1, never 0). Emits a report of the oldest
    /// once it has waited the threshold, unless a report was made for one still waiting.
    pub(crate) fn check(&mut self, now_ns: u64, waiting: impl Iterator<Item = (usize, u64)>, out: &mut Output) {
        if self.threshold_ns == 0 {
            return;
        }
        let mut oldest: Option<(usize, u64)> = None; // (slot, first seen)
        let mut reported_waits = false;
        for (slot, key) in waiting {
            let s = &mut self.seen[slot];
            if s.0 != key {
                *s = (key, now_ns);
            }
            reported_waits |= key == self.reported;
            if oldest.is_none_or(|(_, t)| s.1 < t) {
                oldest = Some((slot, s.1));
            }
        }
        if !reported_waits {
            self.reported = 0;
        }
        self.next_ns = now_ns.saturating_add(LOOK_EVERY_NS.min(self.threshold_ns));
        let Some((slot, since)) = oldest else { return };
        if self.reported != 0 {
            return; // the reported request still waits: the next report after it completed
        }
        let age_ns = now_ns.saturating_sub(since);
        if age_ns >= self.threshold_ns {
            self.reported = self.seen[slot].0;
            out.actions.push(Action::HangReport { slot, age_ns });
        } else {
            self.next_ns = self.next_ns.min(since + self.threshold_ns);
        }
    }

    /// How long the request in `slot` (`key`) has been seen waiting at `now_ns`, if it was.
    pub(crate) fn age_ns(&self, now_ns: u64, slot: usize, key: u64) -> Option<u64> {
        let (k, since) = self.seen[slot];
        (k == key && key != 0).then(|| now_ns.saturating_sub(since))
    }
}

/// Milliseconds of `ns`, for reports (`12.3 s`, `850 ms`).
pub(crate) struct Age(pub u64);

impl std::fmt::Display for Age {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0 / 1_000_000;
        if ms >= 10_000 { write!(f, "{:.1} s", ms as f64 / 1000.0) } else { write!(f, "{ms} ms") }
    }
}

/// Rail names of a mask: `SOUT+SUP`, `none`.
pub(crate) struct Rails(pub RailMask);

impl std::fmt::Display for Rails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.0.iter().enumerate() {
            write!(f, "{}{}", if i > 0 { "+" } else { "" }, RAIL_NAMES[r])?;
        }
        Ok(())
    }
}
