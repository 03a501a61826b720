//! The helper's clock: when the helper thread of a TCP device wakes without a socket event
//! (to sweep its links, to look again at links whose callers were busy, to send what a
//! caller held and then stopped calling for).
//!
//! A timerfd in the helper's epoll set, armed one-shot at an absolute `CLOCK_MONOTONIC`
//! time, is the clock. Two rules set it:
//!
//! - **Callers that poll keep it away.** A caller's poll of the device's CQs moves the
//!   deadline to [`IDLE`] after now (a clock read every 8th TCP step of a CQ, `cq.rs`, and
//!   one `timerfd_settime` per quarter period at most), so while callers poll, the helper does
//!   not wake at all: its sweeps are due only once callers have been quiet for a period,
//!   which is the bound it keeps. On 2 cores with two busy-polling processes each helper's
//!   wake-up was a context switch of ~20 µs on the CPU of a caller, 100 a second per
//!   device: ~400 stalls a second of the 8-byte round trip between them, most of its 1 %
//!   tail.
//! - **But not for ever.** The helper still sweeps at least every [`MAX_DEFER`]: links no
//!   caller steps (a dial to retry, a silent peer, a link that never carried a QP) are
//!   looked at while other links of the device are busy. Those sweeps fall on whole
//!   multiples of `MAX_DEFER` of `CLOCK_MONOTONIC` (one clock for every process of the
//!   host), and the sweeps of helpers with no caller on the whole multiples of `IDLE`: the
//!   helpers of all processes wake at the same instants, a CPU takes one interrupt for them,
//!   and a round trip between two processes is crossed by one such instant, not by each
//!   helper's at its own phase.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fabric::clock::monotonic_ns;

/// How long a link's callers must have been quiet before the helper steps in; also the
/// helper's period for sweeps and pending accepts while no caller polls. Measured with
/// `examples/soft_progress` on 2 cores, both processes busy-polling: at 1 ms the helpers'
/// ~2000 wake-ups/s cost ~2.5% of a core and triple the p99 round trip of 8-byte WRITEs
/// (~33 µs against ~11 µs); at 10 ms they cost ~0.2%. A quiet process's first request then
/// waits up to 10 ms, later ones are served at once.
pub const IDLE: Duration = Duration::from_millis(10);

/// The longest callers' polls keep the helper from sweeping (see the module documentation).
pub const MAX_DEFER: Duration = Duration::from_millis(100);

/// The shortest period of the clock (an `IDLE` of 0 serves events at once, but sweeps
/// still come a period apart).
const MIN_PERIOD: Duration = Duration::from_millis(1);

static IDLE_MS: AtomicU64 = AtomicU64::new(IDLE.as_millis() as u64);

/// Changes [`IDLE`] for the whole process (whole milliseconds; 0 = the helper serves every
/// event at once, even while callers poll). For the `soft_progress` measurements only.
#[doc(hidden)]
pub fn set_idle(d: Duration) {
    IDLE_MS.store(d.as_millis() as u64, Ordering::Relaxed);
}

pub fn idle() -> Duration {
    Duration::from_millis(IDLE_MS.load(Ordering::Relaxed))
}

/// The clock's period: [`idle`], at least [`MIN_PERIOD`].
pub fn period() -> Duration {
    idle().max(MIN_PERIOD)
}

/// The first whole multiple of `step` (ns) after `t`.
fn next_multiple(t: u64, step: u64) -> u64 {
    (t / step + 1) * step
}

/// The helper's clock (see the module documentation).
pub struct HelperClock {
    tfd: OwnedFd,
    /// When the timer fires (ns), 0 while it is stopped.
    deadline: AtomicU64,
    /// When a caller's poll next moves the deadline (ns).
    next_push: AtomicU64,
    /// When the helper last swept (ns).
    swept: AtomicU64,
}

impl HelperClock {
    pub fn new() -> Result<HelperClock> {
        // SAFETY: plain syscall; the result is checked before it is owned.
        let t = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) };
        if t < 0 {
            return Err(Error::io("soft fabric: timerfd_create", &std::io::Error::last_os_error()));
        }
        // SAFETY: just created, owned by nobody else.
        let tfd = unsafe { OwnedFd::from_raw_fd(t) };
        let z = || AtomicU64::new(0);
        Ok(HelperClock { tfd, deadline: z(), next_push: z(), swept: z() })
    }

    /// The descriptor the helper's epoll set watches.
    pub fn fd(&self) -> i32 {
        self.tfd.as_raw_fd()
    }

    /// Sets the timer to fire at `at` (ns of `CLOCK_MONOTONIC`; 0 stops it).
    fn arm(&self, at: u64) -> Result<()> {
        let ts = |ns: u64| libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
        let spec = libc::itimerspec { it_interval: ts(0), it_value: ts(at) };
        // SAFETY: plain syscall on our timerfd; `spec` outlives it, no old value asked.
        let r = unsafe {
            libc::timerfd_settime(self.tfd.as_raw_fd(), libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        if r < 0 {
            return Err(Error::io("soft fabric: timerfd_settime", &std::io::Error::last_os_error()));
        }
        self.deadline.store(at, Ordering::Relaxed);
        Ok(())
    }

    /// The helper swept at `now` (ns): its next sweep is due on the next whole multiple of
    /// the period (should no caller poll meanwhile).
    pub fn swept(&self, now: u64) -> Result<()> {
        self.swept.store(now, Ordering::Relaxed);
        self.arm(next_multiple(now, period().as_nanos() as u64))
    }

    /// The helper has nothing to look at again: the clock stops until an event.
    pub fn stop(&self) -> Result<()> {
        self.arm(0)
    }

    /// Whether the clock runs.
    pub fn running(&self) -> bool {
        self.deadline.load(Ordering::Relaxed) != 0
    }

    /// Consumes the timer's expiry (after its event).
    pub fn drain(&self) {
        let mut buf = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our timerfd.
        unsafe { libc::read(self.tfd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
    }

    /// A caller polled the device: the helper's next sweep moves to a period from now,
    /// within [`MAX_DEFER`] of its last (see the module documentation). One clock read
    /// (`fabric::clock`, the timerfd's clock); a `timerfd_settime` at most every quarter
    /// period. With the helper serving every event
    /// at once (`IDLE` 0) callers keep nothing away.
    #[inline]
    pub fn caller_polled(&self) {
        self.polled_at(monotonic_ns());
    }

    /// [`Self::caller_polled`] at `now` (ns).
    #[inline]
    fn polled_at(&self, now: u64) {
        let due = self.next_push.load(Ordering::Relaxed);
        if now < due || idle().is_zero() || !self.running() {
            return;
        }
        self.push(now, due);
    }

    #[inline(never)]
    fn push(&self, now: u64, due: u64) {
        let p = period().as_nanos() as u64;
        // One caller moves it (several threads may poll the device's CQs).
        if self.next_push.compare_exchange(due, now + p / 4, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return;
        }
        let cap = next_multiple(self.swept.load(Ordering::Relaxed), MAX_DEFER.as_nanos() as u64);
        let at = (now + p).min(cap);
        if at > self.deadline.load(Ordering::Relaxed)
            && let Err(e) = self.arm(at)
        {
            log::debug!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline(c: &HelperClock) -> u64 {
        c.deadline.load(Ordering::Relaxed)
    }

    /// A caller's poll moves the helper's next sweep a period on (not more often than every
    /// quarter period), never past the next whole `MAX_DEFER` after the helper's last sweep,
    /// and not at all while the clock is stopped. (Times made up: the timer may fire at
    /// once, nobody waits on it.)
    #[test]
    fn callers_put_the_sweep_off_within_the_cap() {
        let c = HelperClock::new().unwrap();
        let (p, cap_step) = (period().as_nanos() as u64, MAX_DEFER.as_nanos() as u64);
        let t0 = 1_000 * cap_step + 1;
        c.polled_at(t0);
        assert_eq!(deadline(&c), 0, "a stopped clock stays stopped");
        c.swept(t0).unwrap();
        assert_eq!(deadline(&c), 1_000 * cap_step + p, "the next whole period");
        c.polled_at(t0 + p / 2);
        assert_eq!(deadline(&c), t0 + p / 2 + p, "put off a period from the poll");
        c.polled_at(t0 + p / 2 + p / 8);
        assert_eq!(deadline(&c), t0 + p / 2 + p, "at most every quarter period");
        let mut now = t0 + p / 2;
        while now + p < 1_001 * cap_step {
            now += p / 4;
            c.polled_at(now);
        }
        assert_eq!(deadline(&c), 1_001 * cap_step, "callers poll on: the sweep comes at the cap");
        c.polled_at(now + p / 4);
        assert_eq!(deadline(&c), 1_001 * cap_step, "never past it");
        c.stop().unwrap();
        assert!(!c.running());
    }

    /// The timer fires at its deadline: the helper's epoll set sees it.
    #[test]
    fn the_clock_fires() {
        let c = HelperClock::new().unwrap();
        c.arm(monotonic_ns() + 1_000_000).unwrap();
        let mut fds = libc::pollfd { fd: c.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut fds, 1, 5_000) };
        assert_eq!(n, 1, "the timer fired within 5 s");
        c.drain();
    }
}
