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
//! - **The ACK hold** ([`AckHold`]): an acknowledgement a requester waits for is held by
//!   a caller's step for the frames of its next steps, for [`ACK_HOLD`] at most.
//! - **Deferred posts** ([`doorbell`]): a post nobody here waits for (a CTS) rings no
//!   doorbell; its frames go with the link's next ones.
//! - **Stepping again** ([`step_again`], [`sweep_steps`]): which links a poll steps again
//!   without a socket event, and which a sweep steps.
//! - **A CQ's poll** ([`CqPace`]): how often it tells the sweep schedule callers poll, and
//!   when its one link is cold (asked for in the readiness set before it is read).
//! - **The helper's looks** (`progress/helper.rs`): which links an event or a sweep makes
//!   the helper look at, whether it waits [`ASK_AGAIN`] to see callers serve them, and
//!   whether it serves them itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fabric::SendWr;

mod helper;

pub use helper::{ASK_AGAIN, ClockAction, Looks, Verdict};

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

/// The longest a caller's steps hold an acknowledgement a requester waits for, waiting for
/// frames to carry it (see [`AckHold`]). Longer than a busy caller takes to post the reply
/// or CTS that follows a completion (a few µs), short against the round trip of an idle
/// link's ACK it saves.
pub const ACK_HOLD: Duration = Duration::from_micros(20);

/// Whether a link's owed acknowledgements go now (a link's, under its lock: `link.rs`).
///
/// Acknowledgements owed go with the link's other frames. One a requester waits for
/// (ACK_REQ: "urgent") and left owed after a flush (nothing else went) is held by a caller's
/// step for the frames of its next steps on the link (the reply or CTS a caller posts after
/// a completion carries it), for [`ACK_HOLD`] at most: then its next step sends it alone (a
/// caller that keeps polling with nothing to send); the helper's next sweep sends it should
/// the callers stop (`port.rs`). The helper's own step sends it at once. The clock is read
/// only while one is held (the `now` arguments are called then, never otherwise).
#[derive(Default, Debug, PartialEq, Eq)]
pub struct AckHold {
    /// An owed acknowledgement is one a requester waits for.
    urgent: bool,
    /// Since when a caller's step holds it.
    held_at: Option<Instant>,
    /// It is due: the next flush sends it, frames or not.
    ripe: bool,
}

impl AckHold {
    /// An acknowledgement owed is one a requester waits for.
    pub fn owe_urgent(&mut self) {
        self.urgent = true;
    }

    /// Whether one a requester waits for is owed (the link is stepped again for it).
    #[inline]
    pub fn owed(&self) -> bool {
        self.urgent
    }

    /// Before a step: one held for [`ACK_HOLD`] is due.
    #[inline]
    pub fn ripen(&mut self, now: impl FnOnce() -> Instant) {
        if self.urgent
            && !self.ripe
            && let Some(t) = self.held_at
            && now().saturating_duration_since(t) >= ACK_HOLD
        {
            self.ripe = true;
        }
    }

    /// After a flush (`by_caller`: a caller's step): whether to flush again, the urgent
    /// acknowledgement left owed going alone now.
    #[inline]
    pub fn after_flush(&mut self, by_caller: bool, now: impl FnOnce() -> Instant) -> bool {
        if !self.urgent {
            return false;
        }
        if by_caller {
            self.held_at.get_or_insert_with(now);
            return false;
        }
        self.ripe = true;
        true
    }

    /// Whether the acknowledgements owed go with this batch (`frames`: other frames go).
    #[inline]
    pub fn goes(&self, frames: bool) -> bool {
        frames || self.ripe
    }

    /// They went (or the link broke): nothing is held.
    pub fn sent(&mut self) {
        *self = AckHold::default();
    }
}

/// What a post does with the frames it queued on its link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doorbell {
    /// Send them now, as far as the socket takes them.
    Ring,
    /// Hold them for the link's next step: the caller's next post (typically the data or
    /// the reply a CTS comes before) or poll of any of the device's CQs, at the latest the
    /// helper's next sweep ([`sweep_steps`]): one `sendmsg` for both instead of one each.
    Hold,
}

/// A post of `chain` on a link (`up`: established): a chain whose signalled WRs are all
/// deferrable (nobody here waits for it: a CTS; see [`SendWr::deferrable`]) is held, unless
/// the link is not up (its step is needed now: a dial to finish).
#[inline]
pub fn doorbell(chain: &[SendWr], up: bool) -> Doorbell {
    if !up || chain.iter().any(|w| w.signaled && !w.deferrable) { Doorbell::Ring } else { Doorbell::Hold }
}

/// After a link's step: whether the link is stepped again at the next poll of any of the
/// device's CQs, whether or not its socket moves. `work_left`: work no socket event
/// announces (a read budget spent, a timer); `held`: an urgent acknowledgement or frames
/// of a post are held ([`AckHold`], [`Doorbell::Hold`]).
#[inline]
pub fn step_again(work_left: bool, held: bool) -> bool {
    work_left || held
}

/// Whether the helper's sweep steps an established link: one no caller stepped since the
/// last sweep (`quiet`) while callers do not ask the readiness set (`callers_poll`: they
/// serve every link of the device), or one holding an acknowledgement or frames since a
/// caller's step (`held`: they go now, whether or not callers still poll; they may have
/// stopped since).
#[inline]
pub fn sweep_steps(quiet: bool, callers_poll: bool, held: bool) -> bool {
    (quiet && !callers_poll) || held
}

/// Steps of a CQ's one link in a row that move nothing before the link counts as cold:
/// from then on a poll asks the callers' readiness set whether its socket moved (no socket
/// lock, ~150 ns here) and steps it only then, instead of a `readv` that finds nothing
/// (~480 ns, and the socket lock the peer's sender needs to deliver). The first step that
/// moves makes it hot again. An 8-byte ping-pong's link waits ~7 polls per message and
/// stays hot; the rail that carries nothing (SUP under small sends) goes cold: its polls
/// were a third of the waiting loop. 8, 32 and 128 measured the same; 2 (the busy link
/// cold too: two system calls per arrival) slower than none.
pub const COLD_STEPS: u32 = 16;

/// How many TCP steps of a CQ make one report to the sweep schedule ([`SweepSchedule::polled`]):
/// a clock read each costs ~3 % of a busy-polling loop's 8-byte round trip; one in 8 keeps
/// the helper asleep as long as polls come faster than every 300 µs.
pub const CLOCK_POLLS: u32 = 8;

/// The pace of one CQ's TCP steps (the poller's own: `cq.rs`).
#[derive(Default, Debug)]
pub struct CqPace {
    /// TCP steps so far.
    steps: u32,
    /// Steps of the one link in a row that moved nothing.
    cold: u32,
}

impl CqPace {
    /// A TCP step begins: whether it tells the sweep schedule callers poll (every
    /// [`CLOCK_POLLS`]th).
    #[inline]
    pub fn report_poll(&mut self) -> bool {
        self.steps = self.steps.wrapping_add(1);
        self.steps.is_multiple_of(CLOCK_POLLS)
    }

    /// Whether the CQ's one link is cold: the poll asks the readiness set first.
    #[inline]
    pub fn cold(&self) -> bool {
        self.cold >= COLD_STEPS
    }

    /// The one link's step (or readiness check) moved it or not.
    #[inline]
    pub fn stepped(&mut self, moved: bool) {
        self.cold = if moved { 0 } else { self.cold.saturating_add(1) };
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

    const US: Duration = Duration::from_micros(1);

    /// A caller's step holds an urgent acknowledgement left owed (it goes with the next
    /// frames); its steps send it alone once it was held for `ACK_HOLD`, not before; the
    /// clock is read only while one is held.
    #[test]
    fn a_caller_holds_an_ack_for_ack_hold_then_sends_it_alone() {
        let t0 = Instant::now();
        let mut a = AckHold::default();
        a.ripen(|| unreachable!("no clock read with nothing held"));
        assert!(!a.after_flush(true, || unreachable!("nothing urgent owed")));
        assert!(!a.goes(false) && a.goes(true), "owed ACKs go with frames only");
        a.owe_urgent();
        assert!(a.owed());
        assert!(!a.after_flush(true, || t0), "held by a caller's step");
        assert!(!a.after_flush(true, || unreachable!("held since t0 already")));
        a.ripen(|| t0 + ACK_HOLD - US);
        assert!(!a.goes(false), "not due before ACK_HOLD");
        assert!(a.goes(true), "but goes with the next frames");
        a.ripen(|| t0 + ACK_HOLD);
        assert!(a.goes(false), "due once held for ACK_HOLD: the next flush sends it alone");
        a.ripen(|| unreachable!("due already: no clock read"));
        a.sent();
        assert_eq!(a, AckHold::default());
    }

    /// The helper's step holds nothing: an urgent acknowledgement left owed goes at once.
    #[test]
    fn the_helper_sends_an_owed_ack_at_once() {
        let mut a = AckHold::default();
        a.owe_urgent();
        assert!(a.after_flush(false, || unreachable!("no hold, no clock")));
        assert!(a.goes(false));
    }

    /// A chain with a signalled WR someone waits for rings the doorbell; one whose
    /// signalled WRs are all deferrable (or none is signalled) is held, unless the link is
    /// not up.
    #[test]
    fn only_a_post_nobody_waits_for_is_held() {
        let wr = |signaled, deferrable| SendWr { signaled, deferrable, ..SendWr::default() };
        assert_eq!(doorbell(&[wr(false, false)], true), Doorbell::Hold, "unsignalled (a CTS)");
        assert_eq!(doorbell(&[wr(true, true)], true), Doorbell::Hold, "signalled to retire slots only");
        assert_eq!(doorbell(&[wr(false, false), wr(true, false)], true), Doorbell::Ring);
        assert_eq!(doorbell(&[wr(true, false)], true), Doorbell::Ring);
        assert_eq!(doorbell(&[wr(false, false)], false), Doorbell::Ring, "a link not up is stepped now");
    }

    /// A link holding something, or with work no event announces, is stepped again; a
    /// sweep steps the links callers left alone, and the held ones even while callers poll.
    #[test]
    fn what_is_held_is_stepped_again_and_swept() {
        assert!(!step_again(false, false));
        assert!(step_again(true, false) && step_again(false, true));
        assert!(sweep_steps(true, false, false), "quiet, callers not polling: swept");
        assert!(!sweep_steps(true, true, false), "callers ask the set: they serve it");
        assert!(!sweep_steps(false, false, false), "a caller stepped it since the last sweep");
        assert!(sweep_steps(false, true, true), "held: swept whatever callers do");
    }

    /// Every `CLOCK_POLLS`th step reports; the one link goes cold after `COLD_STEPS` steps
    /// that moved nothing, and the first that moves makes it hot.
    #[test]
    fn a_cq_reports_every_eighth_poll_and_its_link_goes_cold_after_sixteen_misses() {
        let mut p = CqPace::default();
        let reports: Vec<bool> = (0..2 * CLOCK_POLLS).map(|_| p.report_poll()).collect();
        let at: Vec<usize> = (0..reports.len()).filter(|&i| reports[i]).collect();
        assert_eq!(at, [CLOCK_POLLS as usize - 1, 2 * CLOCK_POLLS as usize - 1]);
        for _ in 0..COLD_STEPS - 1 {
            p.stepped(false);
        }
        assert!(!p.cold());
        p.stepped(false);
        assert!(p.cold());
        p.stepped(true);
        assert!(!p.cold(), "one step that moves makes it hot");
    }
}
