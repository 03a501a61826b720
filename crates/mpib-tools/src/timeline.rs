//! The sender's timeline ([`super::spec::Phase::timeline_us`]): its comm's per-rail byte
//! counters sampled every interval from its own progress loop, as `[ns since the phase
//! started, bytes posted on SOUT, on SUP]` (cumulative). One clock read per progress step;
//! the counters only once per interval.

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
}

impl Timeline {
    /// The timeline of phase `p`, started at `start_ns` (None: `p` samples nothing).
    pub fn for_phase(p: &Phase, start_ns: u64) -> Option<Timeline> {
        (p.timeline_us > 0).then(|| {
            let every_ns = p.timeline_us * 1000;
            let expected = (p.budget_ms.max(1000) * 1_000_000 / every_ns).min(1 << 20) as usize;
            Timeline { start_ns, every_ns, next_ns: 0, base: None, samples: Vec::with_capacity(expected) }
        })
    }

    /// Samples `comm` when an interval has passed, or now when `force`. `false`: the comm
    /// has no counters (not an mpib library).
    pub fn sample(&mut self, comm: &SendComm<'_>, force: bool) -> Result<bool> {
        let now = mono_ns();
        if !force && now < self.next_ns {
            return Ok(true);
        }
        let Some(c) = comm.counters()? else { return Ok(false) };
        let b = [c[0].bytes, c[1].bytes];
        let base = *self.base.get_or_insert(b);
        self.samples.push([now.saturating_sub(self.start_ns), b[0] - base[0], b[1] - base[1]]);
        // Keep the cadence; after a long step, start again from now.
        self.next_ns = if self.next_ns == 0 || now >= self.next_ns + self.every_ns {
            now + self.every_ns
        } else {
            self.next_ns + self.every_ns
        };
        Ok(true)
    }

    pub fn into_samples(self) -> Vec<[u64; 3]> {
        self.samples
    }
}
