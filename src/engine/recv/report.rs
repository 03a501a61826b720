//! The receiver's state in words, for a hang report (`engine/hang.rs`) and
//! `mpib_dump_state`: what each receive waits for (its CTS, the IMM of which rail), each
//! rail's state, the keepalive, failover.

use std::fmt;

use super::RecvEngine;
use crate::engine::RAIL_NAMES;
use crate::engine::actions::Output;
use crate::engine::hang::{Age, HangWatch, Rails};
use crate::engine::layout::SLOTS;
use crate::engine::slots::RecvState;

impl RecvEngine {
    /// A receive older than `ns` makes a hang report (0: never; the plugin sets
    /// `MPIB_HANG_REPORT_MS`).
    pub fn set_hang_report_ns(&mut self, ns: u64) {
        self.hang = HangWatch::new(ns);
    }

    /// The receive sequence number slot `s` holds now (the last posted into it).
    fn slot_seq(&self, s: usize) -> u64 {
        let last = self.fifo_tail.wrapping_sub(1);
        last.wrapping_sub(last.wrapping_sub(s as u64) % SLOTS as u64)
    }

    /// What waits, as the hang watch keys it: each receive whose data has not all arrived
    /// (`seq + 1`).
    fn waiting(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..SLOTS)
            .filter(|&s| self.slots[s].state == RecvState::Posted && !self.slots[s].data_done)
            .map(|s| (s, self.slot_seq(s) + 1))
    }

    /// The hang watch's look at `now_ns` (from `handle_timeout`).
    pub(super) fn watch_hang(&mut self, now_ns: u64, out: &mut Output) {
        let mut hang = std::mem::replace(&mut self.hang, HangWatch::new(0));
        hang.check(now_ns, self.waiting(), out);
        self.hang = hang;
    }

    /// The connection's state at `now_ns`, in words (lines without a trailing newline).
    pub fn state_report(&self, now_ns: u64) -> impl fmt::Display + '_ {
        RecvReport { e: self, now_ns }
    }
}

struct RecvReport<'a> {
    e: &'a RecvEngine,
    now_ns: u64,
}

impl fmt::Display for RecvReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (e, now) = (self.e, self.now_ns);
        if let Some(err) = e.error.get() {
            write!(f, "\n  failed: {err}")?;
        }
        write!(f, "\n  {} receives outstanding; {} posted so far", e.outstanding, e.fifo_tail)?;
        for s in 0..SLOTS {
            let r = &e.slots[s];
            if r.state == RecvState::Free {
                continue;
            }
            let seq = e.slot_seq(s);
            let bytes: u64 = r.posted[..r.n as usize].iter().sum();
            write!(f, "\n  slot {s} (receive {seq}): {} buffers, {bytes} bytes; ", r.n)?;
            if r.state == RecvState::Done {
                f.write_str("complete, not yet tested by NCCL")?;
            } else if r.data_done {
                f.write_str("data in, waiting for its CTS WRITE's completion")?;
            } else if r.expected.is_empty() {
                f.write_str("no data yet: waiting for the sender (its CTS was written")?;
                f.write_str(if r.cts_pending { ", its completion not in yet)" } else { ")" })?;
            } else {
                let missing = crate::engine::RailMask::from_fn(|x| r.expected.contains(x) && !r.seen.contains(x));
                write!(f, "the IMM of {} in, waiting for {}", Rails(r.seen), Rails(missing))?;
            }
            if e.fo.cts_redo & (1 << s) != 0 {
                f.write_str("; its CTS is to be written again (failover)")?;
            }
            if let Some(age) = e.hang.age_ns(now, s, seq + 1) {
                write!(f, "; seen waiting for {}", Age(age))?;
            }
        }
        for (r, name) in RAIL_NAMES.iter().enumerate() {
            write!(
                f,
                "\n  {name} rail: {:?}{}{}",
                e.fo.state[r],
                if e.keepalive == Some(r) { ", a keepalive in flight" } else { "" },
                e.at(r)
            )?;
        }
        let c = e.fo.counts();
        write!(
            f,
            "\n  failover {}: {} failovers, {} CTS re-posted, {} re-admissions",
            if e.fo.cfg.enabled { "on" } else { "off" },
            c.failovers,
            c.cts_reposts,
            c.readmissions
        )
    }
}
