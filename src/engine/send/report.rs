//! The sender's state in words, for a hang report (`engine/hang.rs`) and `mpib_dump_state`:
//! what each request waits for, each rail's work in flight and last completion, failover.

use std::fmt;

use super::SendEngine;
use crate::engine::RAIL_NAMES;
use crate::engine::actions::Output;
use crate::engine::hang::{Age, HangWatch, Rails};
use crate::engine::layout::SLOTS;

/// The key of a wait for the receiver's CTS (not a request of a slot's).
const CTS_WAIT: u64 = 1 << 62;

impl SendEngine {
    /// A request older than `ns` (NCCL's, or a wait for the receiver's CTS) makes a hang
    /// report (0: never; the plugin sets `MPIB_HANG_REPORT_MS`).
    pub fn set_hang_report_ns(&mut self, ns: u64) {
        self.hang = HangWatch::new(ns);
    }

    /// What waits, as the hang watch keys it: each posted slot with a part not completed
    /// (`seq + 1`), the slot being matched, the CTS awaited.
    fn waiting(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let head = (self.fifo_head % SLOTS as u64) as usize;
        let posted = (0..SLOTS)
            .filter(|&s| !(self.slots[s].pending | self.fo.replays[s].replay).is_empty())
            .map(|s| (s, self.slots[s].seq + 1));
        let matching = (self.matching && self.cur.matched > 0).then_some((head, self.fifo_head + 1));
        let cts = (self.no_cts && !self.matching && self.slots[head].pending.is_empty())
            .then_some((head, (self.fifo_head + 1) | CTS_WAIT));
        posted.chain(matching).chain(cts)
    }

    /// The hang watch's look at `now_ns` (from `handle_timeout`).
    pub(super) fn watch_hang(&mut self, now_ns: u64, out: &mut Output) {
        let mut hang = std::mem::replace(&mut self.hang, HangWatch::new(0));
        hang.check(now_ns, self.waiting(), out);
        self.hang = hang;
    }

    /// The connection's state at `now_ns`, in words (lines without a trailing newline).
    pub fn state_report(&self, now_ns: u64) -> impl fmt::Display + '_ {
        SendReport { e: self, now_ns }
    }
}

struct SendReport<'a> {
    e: &'a SendEngine,
    now_ns: u64,
}

impl fmt::Display for SendReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (e, now) = (self.e, self.now_ns);
        if let Some(err) = e.error.get() {
            write!(f, "\n  failed: {err}")?;
        }
        let pending = e.reqs.iter().filter(|r| r.state == super::ReqState::Pending).count();
        write!(f, "\n  {pending} sends NCCL waits on; {} CTS slots taken", e.fifo_head)?;
        let head = (e.fifo_head % SLOTS as u64) as usize;
        if e.no_cts && !e.matching {
            if e.slots[head].pending.is_empty() {
                write!(f, "; waiting for the receiver's CTS of slot {head}")?;
            } else {
                write!(f, "; slot {head}'s next CTS waits for its previous use's completions")?;
            }
            if let Some(age) = e.hang.age_ns(now, head, (e.fifo_head + 1) | CTS_WAIT) {
                write!(f, " (for {})", Age(age))?;
            }
        }
        if e.matching {
            write!(
                f,
                "\n  slot {head}: {} of {} sends matched, the rest not posted by NCCL yet",
                e.cur.matched, e.cur.n
            )?;
        }
        for s in 0..SLOTS {
            let (p, rp) = (&e.slots[s], &e.fo.replays[s]);
            if (p.pending | rp.replay).is_empty() {
                continue;
            }
            let bytes: u64 = p.bytes.iter().sum();
            write!(f, "\n  slot {s} (CTS {}): {} sends, {bytes} bytes", p.seq, p.n)?;
            for (r, name) in RAIL_NAMES.iter().enumerate() {
                if p.bytes[r] > 0 || p.pending.contains(r) {
                    write!(f, ", {name} {} B", p.bytes[r])?;
                }
            }
            write!(f, "; waiting for the completion on {}", Rails(p.pending))?;
            for r in p.pending.iter() {
                write!(f, " ({} {} ago)", RAIL_NAMES[r], Age(now.saturating_sub(p.posted_ns[r])))?;
            }
            if !rp.replay.is_empty() {
                write!(f, "; replay of {} part(s) not completed", Rails(rp.replay))?;
            }
            if !rp.replay_wait.is_empty() {
                write!(f, " (waiting to post)")?;
            }
            if let Some(age) = e.hang.age_ns(now, s, p.seq + 1) {
                write!(f, "; seen waiting for {}", Age(age))?;
            }
        }
        for (r, name) in RAIL_NAMES.iter().enumerate() {
            let heard = e.fo.heard_ns[r];
            write!(
                f,
                "\n  {name} rail: {:?}{}, {} chains in flight, last completion {}{}",
                e.fo.state[r],
                if e.fo.suspect.contains(r) { " (suspect)" } else { "" },
                e.outstanding[r],
                if heard == 0 { "never".to_string() } else { format!("{} ago", Age(now.saturating_sub(heard))) },
                e.at(r)
            )?;
        }
        let c = e.fo.counts();
        write!(
            f,
            "\n  failover {}: {} failovers, {} parts replayed, {} re-admissions",
            if e.fo.cfg.enabled { "on" } else { "off" },
            c.failovers,
            c.replayed_parts,
            c.readmissions
        )
    }
}
