//! The helper's clock: when the helper thread of a TCP device wakes without a socket event
//! (to sweep its links, to look again at links whose callers were busy, to send what a
//! caller held and then stopped calling for).
//!
//! A timerfd in the helper's epoll set, armed one-shot at an absolute `CLOCK_MONOTONIC`
//! time, is the clock. When it fires is the progress policy's ([`SweepSchedule`],
//! `progress.rs`: callers that poll keep it away, but not for ever); this file reads the
//! clock and sets the timer.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::progress::{IDLE, SweepSchedule};
use crate::error::{Error, Result};
use crate::fabric::clock::monotonic_ns;

/// The helper's clock (see the module documentation).
pub struct HelperClock {
    tfd: OwnedFd,
    /// When it fires.
    pub schedule: SweepSchedule,
}

/// The descriptor `fd` a call named `what` returned, owned; its error if it failed.
pub fn owned_fd(what: &str, fd: i32) -> Result<OwnedFd> {
    if fd < 0 {
        return Err(Error::io(&format!("soft fabric: {what}"), &std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just returned by a call that creates one: owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Consumes what an eventfd or a timerfd counted (after its event): one 8-byte read.
pub fn drain_counter(fd: &OwnedFd) {
    let mut buf = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from a descriptor the caller owns.
    unsafe { libc::read(fd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
}

impl HelperClock {
    pub fn new() -> Result<HelperClock> {
        // SAFETY: plain syscall; `owned_fd` checks the result.
        let t = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) };
        Ok(HelperClock { tfd: owned_fd("timerfd_create", t)?, schedule: SweepSchedule::new(IDLE) })
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
        self.schedule.armed(at);
        Ok(())
    }

    /// The helper swept at `now` (ns): the timer is set for its next sweep.
    pub fn swept(&self, now: u64) -> Result<()> {
        self.arm(self.schedule.swept(now))
    }

    /// The helper has nothing to look at again: the clock stops until an event.
    pub fn stop(&self) -> Result<()> {
        self.arm(0)
    }

    /// Whether the clock runs.
    pub fn running(&self) -> bool {
        self.schedule.running()
    }

    /// Consumes the timer's expiry (after its event).
    pub fn drain(&self) {
        drain_counter(&self.tfd);
    }

    /// A caller polled the device: one clock read (`fabric::clock`, the timerfd's clock);
    /// the timer moves when the schedule says (a `timerfd_settime` at most every quarter
    /// period).
    #[inline]
    pub fn caller_polled(&self) {
        if let Some(at) = self.schedule.polled(monotonic_ns()) {
            self.push(at);
        }
    }

    #[inline(never)]
    fn push(&self, at: u64) {
        if let Err(e) = self.arm(at) {
            log::debug!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
