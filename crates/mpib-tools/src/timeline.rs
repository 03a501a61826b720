//! The sender's timeline ([`super::spec::Phase::timeline_us`]): its comm's per-rail byte
//! counters sampled every interval from its own progress loop, as `[ns since the phase
//! started, bytes posted on SOUT, on SUP]` (cumulative). One clock read per progress step;
//! the counters only once per interval.
//!
//! With them, where the library exports `mpib_rail_stats`, the process's rail-failover
//! counters (failovers, re-admissions, replayed bytes, both rails summed) whenever they
//! changed, and for each failover the time every send posted before it was seen had
//! completed: what `mpib-perf`'s failure drill and the emulated-rails report measure.

use super::Result;
use super::net::SendComm;
use super::report::mono_ns;
use super::spec::Phase;

pub struct Timeline {
    start_ns: u64,
    every_ns: u64,
    next_ns: u64,
    /// The counters when sampling started.
    base: Option<[u64; 2]>,
    samples: Vec<[u64; 3]>,
    /// The failover counters when sampling started (None: not exported, or not read yet).
    fo_base: Option<[u64; 4]>,
    fo_last: [u64; 4],
    events: Vec<[u64; 5]>,
    /// A failover seen after sends `0..0` were posted (`.1`: the sample before): it is
    /// recovered when they all completed.
    watch: Option<(u64, u64)>,
    recoveries: Vec<[u64; 2]>,
}

/// What a timeline recorded.
#[derive(Default)]
pub struct Recorded {
    pub samples: Vec<[u64; 3]>,
    /// `[ns, failovers, readmissions, replayed bytes]` since the phase started, at every
    /// sample where one changed.
    pub events: Vec<[u64; 5]>,
    /// `[ns of the last sample before a failover showed, ns when every send posted before
    /// it showed completed]`.
    pub recoveries: Vec<[u64; 2]>,
}

impl Timeline {
    /// The timeline of phase `p`, started at `start_ns` (None: `p` samples nothing).
    pub fn for_phase(p: &Phase, start_ns: u64) -> Option<Timeline> {
        (p.timeline_us > 0).then(|| {
            let every_ns = p.timeline_us * 1000;
            let expected = (p.budget_ms.max(1000) * 1_000_000 / every_ns).min(1 << 20) as usize;
            Timeline {
                start_ns,
                every_ns,
                next_ns: 0,
                base: None,
                samples: Vec::with_capacity(expected),
                fo_base: None,
                fo_last: [0; 4],
                events: Vec::new(),
                watch: None,
                recoveries: Vec::new(),
            }
        })
    }

    /// Samples `comm` when an interval has passed, or now when `force`; `posted`: the sends
    /// posted so far. `false`: the comm has no counters (not an mpib library).
    pub fn sample(&mut self, comm: &SendComm<'_>, force: bool, posted: u64) -> Result<bool> {
        let now = mono_ns();
        if !force && now < self.next_ns {
            return Ok(true);
        }
        let Some(c) = comm.counters()? else { return Ok(false) };
        let b = [c[0].bytes, c[1].bytes];
        let base = *self.base.get_or_insert(b);
        let t = now.saturating_sub(self.start_ns);
        self.samples.push([t, b[0] - base[0], b[1] - base[1]]);
        self.failover_counters(comm, t, posted)?;
        // Keep the cadence; after a long step, start again from now.
        self.next_ns = if self.next_ns == 0 || now >= self.next_ns + self.every_ns {
            now + self.every_ns
        } else {
            self.next_ns + self.every_ns
        };
        Ok(true)
    }

    /// The process's failover counters, recorded when they changed.
    fn failover_counters(&mut self, comm: &SendComm<'_>, t: u64, posted: u64) -> Result<()> {
        let Some(s) = comm.net().plugin().rail_stats()? else { return Ok(()) };
        let sum = |f: fn(&super::net::RailStats) -> u64| f(&s[0]) + f(&s[1]);
        let now = [sum(|r| r.failovers), sum(|r| r.readmissions), sum(|r| r.replayed_bytes), sum(|r| r.suspects)];
        let base = *self.fo_base.get_or_insert(now);
        let rel = std::array::from_fn(|i| now[i] - base[i]);
        if rel != self.fo_last || self.events.is_empty() {
            if rel[0] > self.fo_last[0] && self.watch.is_none() {
                // From the sample before, which did not show it yet: the failover happened
                // after that, so the recovery measured from there is an upper bound.
                let before = self.samples.len().checked_sub(2).map_or(t, |i| self.samples[i][0]);
                self.watch = Some((posted, before));
            }
            self.fo_last = rel;
            self.events.push([t, rel[0], rel[1], rel[2], rel[3]]);
        }
        Ok(())
    }

    /// `done` sends have completed (in order): closes a recovery being watched.
    #[inline]
    pub fn completed(&mut self, done: u64) {
        if let Some((posted, at)) = self.watch
            && done >= posted
        {
            self.recoveries.push([at, mono_ns().saturating_sub(self.start_ns)]);
            self.watch = None;
        }
    }

    pub fn into_recorded(self) -> Recorded {
        Recorded { samples: self.samples, events: self.events, recoveries: self.recoveries }
    }
}
