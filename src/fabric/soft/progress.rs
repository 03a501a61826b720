//! The progress policy of a TCP soft device: when links are stepped, by whom, and when the
//! helper thread sleeps, wakes and sweeps. Sans-IO: every rule here takes the time as an
//! argument (ns of `CLOCK_MONOTONIC`, or an `Instant`) and never reads a clock, makes no
//! system call and touches no socket; it says what to do, and its callers (the CQ's poll,
//! a post, a link's step, the helper thread: `cq.rs`, `station.rs`, `link.rs`, `port.rs`,
//! `helper.rs`, `clock.rs`) do it. Each rule is a unit test with made-up times below.
//!
//! - **The sweep schedule** ([`SweepSchedule`]): the helper sweeps its links every
//!   period while no caller polls; callers' polls put the sweep off, never past the next
//!   whole [`MAX_DEFER`] after the last one.
//! - **The helper's looks** (`progress/helper.rs`): which links an event or a sweep makes
//!   the helper look at, whether it waits [`ASK_AGAIN`] to see callers serve them, and
//!   whether it serves them itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a link's callers must have been quiet before the helper steps in; also the
/// helper's period for sweeps and pending accepts while no caller polls. Measured with
/// `examples/soft_progress` on 2 cores, both processes busy-polling: at 1 ms the helpers'
/// ~2000 wake-ups/s cost ~2.5% of a core and triple the p99 round trip of 8-byte WRITEs
/// (~33 µs against ~11 µs); at 10 ms they cost ~0.2%. A quiet process's first request then
/// waits up to 10 ms, later ones are served at once.
pub const IDLE: Duration = Duration::from_millis(10);

/// The longest callers' polls keep the helper from sweeping (see [`SweepSchedule`]).
pub const MAX_DEFER: Duration = Duration::from_millis(100);

/// The shortest period of the helper's clock (an idle time of 0 serves events at once, but
/// sweeps still come a period apart).
const MIN_PERIOD: Duration = Duration::from_millis(1);

/// The first whole multiple of `step` (ns) after `t`.
fn next_multiple(t: u64, step: u64) -> u64 {
    (t / step + 1) * step
}

/// When the helper sweeps next: the rules of the helper's clock (`clock.rs` arms a timer
/// at what this says). Shared by the helper and the device's callers (atomics: several
/// threads poll the device's CQs while the helper sweeps).
///
/// - **Callers that poll keep it away.** A caller's poll moves the deadline to a period
///   after now (one move per quarter period at most), so while callers poll, the helper
///   does not wake at all: its sweeps are due only once callers have been quiet for a
///   period, which is the bound it keeps. On 2 cores with two busy-polling processes each
///   helper's wake-up was a context switch of ~20 µs on the CPU of a caller, 100 a second
///   per device: ~400 stalls a second of the 8-byte round trip between them, most of its
///   1 % tail.
/// - **But not for ever.** The helper still sweeps at least every [`MAX_DEFER`]: links no
///   caller steps (a dial to retry, a silent peer, a link that never carried a QP) are
///   looked at while other links of the device are busy. Those sweeps fall on whole
///   multiples of `MAX_DEFER` of `CLOCK_MONOTONIC` (one clock for every process of the
///   host), and the sweeps of helpers with no caller on the whole multiples of the period:
///   the helpers of all processes wake at the same instants, a CPU takes one interrupt for
///   them, and a round trip between two processes is crossed by one such instant, not by
///   each helper's at its own phase.
pub struct SweepSchedule {
    /// The device's idle time (ns; see [`IDLE`]).
    idle_ns: AtomicU64,
    /// When the timer fires (ns), 0 while it is stopped.
    deadline: AtomicU64,
    /// When a caller's poll next moves the deadline (ns).
    next_push: AtomicU64,
    /// When the helper last swept (ns).
    swept: AtomicU64,
}

impl SweepSchedule {
    pub fn new(idle: Duration) -> SweepSchedule {
        let z = || AtomicU64::new(0);
        SweepSchedule { idle_ns: AtomicU64::new(idle.as_nanos() as u64), deadline: z(), next_push: z(), swept: z() }
    }

    /// Changes the device's idle time (0: the helper serves every event at once, even while
    /// callers poll).
    pub fn set_idle(&self, d: Duration) {
        self.idle_ns.store(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// How long a link's callers must have been quiet before the helper steps in.
    #[inline]
    pub fn idle(&self) -> Duration {
        Duration::from_nanos(self.idle_ns.load(Ordering::Relaxed))
    }

    /// The clock's period: [`Self::idle`], at least [`MIN_PERIOD`].
    pub fn period(&self) -> Duration {
        self.idle().max(MIN_PERIOD)
    }

    /// The helper swept at `now` (ns): returns when it sweeps next, should no caller poll
    /// meanwhile (the next whole multiple of the period).
    pub fn swept(&self, now: u64) -> u64 {
        self.swept.store(now, Ordering::Relaxed);
        next_multiple(now, self.period().as_nanos() as u64)
    }

    /// The clock was set to fire at `at` (ns; 0: stopped).
    pub fn armed(&self, at: u64) {
        self.deadline.store(at, Ordering::Relaxed);
    }

    /// Whether the clock runs.
    pub fn running(&self) -> bool {
        self.deadline.load(Ordering::Relaxed) != 0
    }

    /// When the clock fires (ns; 0: stopped).
    pub fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }

    /// A caller polled the device at `now` (ns): the time to set the clock to, when the
    /// sweep moves (see the type's documentation). The common call is one load and a
    /// compare.
    #[inline]
    pub fn polled(&self, now: u64) -> Option<u64> {
        let due = self.next_push.load(Ordering::Relaxed);
        if now < due || self.idle_ns.load(Ordering::Relaxed) == 0 || !self.running() {
            return None;
        }
        self.push(now, due)
    }

    #[inline(never)]
    fn push(&self, now: u64, due: u64) -> Option<u64> {
        let p = self.period().as_nanos() as u64;
        // One caller moves it (several threads may poll the device's CQs).
        if self.next_push.compare_exchange(due, now + p / 4, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return None;
        }
        let cap = next_multiple(self.swept.load(Ordering::Relaxed), MAX_DEFER.as_nanos() as u64);
        let at = (now + p).min(cap);
        (at > self.deadline()).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `polled`, and the clock set as it says.
    fn poll(s: &SweepSchedule, now: u64) {
        if let Some(at) = s.polled(now) {
            s.armed(at);
        }
    }

    /// The sweep after a sweep is on the next whole period; a caller's poll moves it a
    /// period on (not more often than every quarter period), never past the next whole
    /// `MAX_DEFER` after the helper's last sweep, and not at all while the clock is stopped.
    #[test]
    fn callers_put_the_sweep_off_within_the_cap() {
        let s = SweepSchedule::new(IDLE);
        let (p, cap_step) = (IDLE.as_nanos() as u64, MAX_DEFER.as_nanos() as u64);
        let t0 = 1_000 * cap_step + 1;
        assert_eq!(s.polled(t0), None, "a stopped clock stays stopped");
        s.armed(s.swept(t0));
        assert_eq!(s.deadline(), 1_000 * cap_step + p, "the next whole period");
        poll(&s, t0 + p / 2);
        assert_eq!(s.deadline(), t0 + p / 2 + p, "put off a period from the poll");
        assert_eq!(s.polled(t0 + p / 2 + p / 8), None, "at most every quarter period");
        let mut now = t0 + p / 2;
        while now + p < 1_001 * cap_step {
            now += p / 4;
            poll(&s, now);
        }
        assert_eq!(s.deadline(), 1_001 * cap_step, "callers poll on: the sweep comes at the cap");
        assert_eq!(s.polled(now + p / 4), None, "never past it");
        s.armed(0);
        assert!(!s.running());
    }

    /// With an idle time of 0 the helper serves every event at once: callers' polls keep
    /// no sweep away, and the period is the shortest one.
    #[test]
    fn an_idle_time_of_zero_keeps_nothing_away() {
        let s = SweepSchedule::new(Duration::ZERO);
        assert_eq!(s.period(), MIN_PERIOD);
        s.armed(s.swept(5));
        assert_eq!(s.deadline(), MIN_PERIOD.as_nanos() as u64);
        assert_eq!(s.polled(100), None);
        s.set_idle(IDLE);
        assert_eq!(s.idle(), IDLE);
        assert!(s.polled(100).is_some(), "set per device, seen at once");
    }
}
