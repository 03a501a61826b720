//! The helper thread's looks (the rules of `helper.rs`'s loop, sans-IO): which links a
//! wake-up makes it look at, whether it waits [`ASK_AGAIN`] to see callers serve them, and
//! who serves each then. The thread reads the clocks and the epochs, sleeps, steps and
//! re-arms sockets; [`Looks`] decides.
//!
//! - **Sleeping.** The helper's clock runs while there is anything to look at again
//!   (watched links, accepts pending, links to sweep): after each sweep it is set a period
//!   on (callers that poll move it further: [`super::SweepSchedule`]); else the helper
//!   sleeps until an event. Should the clock fail to be set, the wait times out after a
//!   period instead.
//! - **What it looks at.** The links whose events woke it; at a sweep, too, every watched
//!   link due within half an idle time (one wake-up serves them all, however many links
//!   the device has).
//! - **Served at once.** A link the helper served at its last look, neither its callers'
//!   epoch nor the device's readiness epoch moved since: callers are not serving it, and it
//!   is served at once. (Waiting `ASK_AGAIN` on every event of a link the helper serves made
//!   a quiet responder's 8-byte round trip ~200 µs instead of ~25, and cost ~15 % of its
//!   8 MiB bandwidth: `soft_progress`, `soft_vs_tcp`'s "soft idle".)
//! - **Else it asks again.** It sleeps `ASK_AGAIN`, then leaves a link to callers only if
//!   they are seen serving it now: stepping it, or asking the readiness set (whose edges
//!   they take and serve), within `ASK_AGAIN`; it looks at it again after the idle time.
//!   Not on what they did since the last look: a caller that stepped it once (a queued
//!   step) or asked the set before its bytes came, and is hot on its own link now, serves
//!   it no more; a request on a link whose CQ nobody polls (an idle communicator's probe)
//!   then waited for the sweeps, ~200 ms while a busy caller put them off. Callers that ask
//!   the set but did not step this link: the event that woke the helper may not have been
//!   one they serve (room to write), and its socket is re-armed so its next one wakes the
//!   helper again (a link looked at by a sweep stays disarmed: re-armed, each of its events
//!   would wake the helper while callers serve it).
//! - **Otherwise the helper serves it**, and re-arms its socket; a link a caller holds
//!   (its lock busy) is looked at again after a period.
//!
//! An idle time of 0 makes the helper impatient: it never asks, it serves every event.

use std::collections::HashMap;
use std::time::Duration;

/// How long the helper watches whether callers serve a link it looks at: a caller that
/// polls steps its link, or asks the readiness set, every few µs. The helper sleeps
/// meanwhile: one wake-up more when a link's event woke it, or a sweep found links due.
pub const ASK_AGAIN: Duration = Duration::from_micros(100);

/// What the helper does with its clock before it waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockAction {
    /// Set it for the next sweep (it swept, or the clock is stopped and there is something
    /// to look at again).
    Set,
    /// Stop it: nothing to look at again, the helper sleeps until an event.
    Stop,
    /// Leave it as it is.
    Keep,
}

/// Who serves a link the helper looked at and asked again about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its callers: the helper looks again after the idle time (`rearm`: its socket is
    /// re-armed for the helper now).
    Callers { rearm: bool },
    /// The helper: it steps the link now.
    Helper,
}

/// The helper thread's state of mind (see the module documentation). Times are ns of the
/// caller's clock, passed in.
#[derive(Default)]
pub struct Looks {
    /// Links to look at again (token), and when.
    watch: Vec<(usize, u64)>,
    /// The links the helper served at its last look of each, with the link's caller epoch
    /// and the device's readiness epoch it saw then.
    serving: HashMap<usize, (u64, u64)>,
    /// The links to look at in this wake-up (sorted, once [`Looks::woke`] ran).
    due: Vec<usize>,
    /// The links whose events woke the helper this time (sorted).
    evented: Vec<usize>,
    /// The readiness epoch at the last sweep.
    seen_epoll: u64,
    /// A sweep since the clock was last set.
    swept: bool,
    /// Anything to look at again: the clock runs.
    looks: bool,
    /// The clock could not be set the last time.
    clock_failed: bool,
    /// Connections wait to be accepted (or their HELLO to be read).
    pub accepting: bool,
}

impl Looks {
    /// `epoll`: the device's readiness epoch now.
    pub fn new(epoll: u64) -> Looks {
        Looks { seen_epoll: epoll, ..Looks::default() }
    }

    /// Before the helper waits: what it does with its clock (`links`: the device has links;
    /// `running`: the clock runs).
    pub fn before_wait(&mut self, links: bool, running: bool) -> ClockAction {
        self.looks = !self.watch.is_empty() || self.accepting || links;
        let a = if self.looks && (self.swept || !running) {
            ClockAction::Set
        } else if !self.looks && running {
            ClockAction::Stop
        } else {
            ClockAction::Keep
        };
        self.swept = false;
        a
    }

    /// The clock was set (`ok`) or could not be: returns whether to warn (the first failure
    /// after a success).
    pub fn clock_set(&mut self, ok: bool) -> bool {
        let warn = !ok && !self.clock_failed;
        self.clock_failed = !ok;
        warn
    }

    /// How long the wait may last (`None`: until an event): a period, when the clock could
    /// not be set and there is something to look at again.
    pub fn wait_timeout(&self, period: Duration) -> Option<Duration> {
        (self.looks && self.clock_failed).then_some(period)
    }

    /// The wait ended with events: the wake-up's lists start empty.
    pub fn begin(&mut self) {
        self.due.clear();
    }

    /// Link `token`'s socket event woke the helper.
    pub fn event(&mut self, token: usize) {
        self.due.push(token);
    }

    /// After the wake-up's events, at `now`: `tick`: the clock fired (or the wait's timeout
    /// ran out); `epoll`: the device's readiness epoch now. `Some(callers_poll)` when the
    /// helper sweeps now, `callers_poll` saying whether callers asked the readiness set
    /// since the last sweep (`super::sweep_steps`).
    pub fn woke(&mut self, tick: bool, now: u64, epoll: u64, idle: Duration) -> Option<bool> {
        let callers_poll = epoll != self.seen_epoll && !idle.is_zero();
        self.evented.clear();
        self.evented.extend_from_slice(&self.due);
        self.evented.sort_unstable();
        let sweep = tick.then(|| {
            self.swept = true;
            self.seen_epoll = epoll;
            let horizon = now + idle.as_nanos() as u64 / 2;
            let due = &mut self.due;
            self.watch.retain(|&(t, at)| {
                let ready = at <= horizon;
                if ready {
                    due.push(t);
                }
                !ready
            });
            callers_poll
        });
        self.due.sort_unstable();
        self.due.dedup();
        sweep
    }

    /// The links to look at in this wake-up (tokens, sorted, each once).
    pub fn due(&self) -> &[usize] {
        &self.due
    }

    /// Whether link `t` is served at once: the helper served it at its last look, and
    /// neither its callers' epoch (`epoch`) nor the device's readiness epoch (`asked`) moved
    /// since.
    pub fn serve_at_once(&self, t: usize, epoch: u64, asked: u64) -> bool {
        self.serving.get(&t) == Some(&(epoch, asked))
    }

    /// Whether the helper waits [`ASK_AGAIN`] before it decides on the links left (`left`:
    /// there are some).
    pub fn asks(idle: Duration, left: bool) -> bool {
        !idle.is_zero() && left
    }

    /// After [`ASK_AGAIN`], at `now` (the wake-up's time): who serves link `t`. `stepped`:
    /// a caller stepped it meanwhile; `asked`: callers asked the readiness set meanwhile.
    pub fn verdict(&mut self, t: usize, now: u64, idle: Duration, stepped: bool, asked: bool) -> Verdict {
        self.serving.remove(&t);
        if idle.is_zero() || !(stepped || asked) {
            return Verdict::Helper;
        }
        self.watch.push((t, now + idle.as_nanos() as u64));
        Verdict::Callers { rearm: !stepped && self.evented.binary_search(&t).is_ok() }
    }

    /// The helper stepped link `t` at `now` (`busy`: it could not, a caller held the link),
    /// having seen `epochs` (the link's caller epoch before the step, the device's
    /// readiness epoch).
    pub fn served(&mut self, t: usize, busy: bool, epochs: (u64, u64), now: u64, idle: Duration, period: Duration) {
        if busy {
            self.serving.remove(&t);
            self.watch.push((t, now + period.as_nanos() as u64));
        } else if !idle.is_zero() {
            self.serving.insert(t, epochs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const IDLE: Duration = Duration::from_millis(10);
    const PERIOD: Duration = IDLE;

    /// The clock is set while there is anything to look at again and after each sweep,
    /// stopped when there is nothing, left alone otherwise; a clock that cannot be set
    /// warns once and makes the wait time out after a period.
    #[test]
    fn the_clock_runs_while_there_is_anything_to_look_at() {
        let mut l = Looks::new(0);
        assert_eq!(l.before_wait(false, false), ClockAction::Keep, "nothing at all: sleep until an event");
        assert_eq!(l.before_wait(false, true), ClockAction::Stop);
        assert_eq!(l.before_wait(true, false), ClockAction::Set, "a link to sweep");
        assert_eq!(l.before_wait(true, true), ClockAction::Keep, "running: callers may have put it off");
        l.accepting = true;
        assert_eq!(l.before_wait(false, false), ClockAction::Set, "accepts pending");
        l.accepting = false;
        l.begin();
        assert_eq!(l.woke(true, 0, 0, IDLE), Some(false));
        assert_eq!(l.before_wait(true, true), ClockAction::Set, "after a sweep: the next one");
        assert_eq!(l.wait_timeout(PERIOD), None);
        assert!(l.clock_set(false), "the first failure warns");
        assert_eq!(l.wait_timeout(PERIOD), Some(PERIOD));
        assert!(!l.clock_set(false), "once");
        assert!(!l.clock_set(true));
        assert_eq!(l.wait_timeout(PERIOD), None);
    }

    /// An event makes the helper look at its link; a sweep, too, at the watched links due
    /// within half an idle time, each once; the callers count as polling at a sweep when
    /// they asked the readiness set since the last one (never with an idle time of 0).
    #[test]
    fn events_and_sweeps_choose_the_links_looked_at() {
        let mut l = Looks::new(7);
        l.begin();
        l.event(3);
        l.event(1);
        assert_eq!(l.woke(false, 0, 7, IDLE), None, "no tick: no sweep");
        assert_eq!(l.due(), [1, 3]);
        // Links 1 and 3 left to callers at t = 0: watched until 10 ms; 5 busy: until 10 ms.
        assert!(matches!(l.verdict(1, 0, IDLE, true, false), Verdict::Callers { .. }));
        assert!(matches!(l.verdict(3, 0, IDLE, true, false), Verdict::Callers { .. }));
        l.served(5, true, (0, 7), 2 * MS, IDLE, PERIOD);
        l.begin();
        assert_eq!(l.woke(true, 4 * MS, 7, IDLE), Some(false), "epoch unchanged: callers not polling");
        assert_eq!(l.due(), [] as [usize; 0], "nothing due within 4 + 5 ms");
        l.begin();
        l.event(3);
        assert_eq!(l.woke(true, 5 * MS, 8, IDLE), Some(true), "callers asked the set since");
        assert_eq!(l.due(), [1, 3], "due within 5 + 5 ms, link 3 once");
        l.begin();
        assert_eq!(l.woke(true, 7 * MS, 8, IDLE), Some(false), "not since the last sweep");
        assert_eq!(l.due(), [5]);
        l.begin();
        assert_eq!(l.woke(true, 8 * MS, 9, Duration::ZERO), Some(false), "impatient: callers never count");
    }

    /// A link the helper served is served at once while neither epoch moves; a caller's
    /// step or ask ends that; a link whose lock was busy is watched for a period, not
    /// served at once.
    #[test]
    fn a_link_the_helper_serves_is_served_at_once_until_callers_move() {
        let mut l = Looks::new(0);
        assert!(!l.serve_at_once(2, 10, 20), "never served: ask first");
        assert_eq!(l.verdict(2, 0, IDLE, false, false), Verdict::Helper, "callers quiet");
        l.served(2, false, (10, 20), 0, IDLE, PERIOD);
        assert!(l.serve_at_once(2, 10, 20));
        assert!(!l.serve_at_once(2, 11, 20), "a caller stepped it");
        assert!(!l.serve_at_once(2, 10, 21), "callers asked the set");
        l.served(2, true, (10, 20), MS, IDLE, PERIOD);
        assert!(!l.serve_at_once(2, 10, 20), "busy: not served, so not at once");
        l.begin();
        l.woke(true, MS + PERIOD.as_nanos() as u64 - IDLE.as_nanos() as u64 / 2, 0, IDLE);
        assert_eq!(l.due(), [2], "looked at again a period later");
        let mut impatient = Looks::new(0);
        impatient.served(4, false, (1, 1), 0, Duration::ZERO, PERIOD);
        assert!(!impatient.serve_at_once(4, 1, 1), "an idle time of 0 asks nothing, records nothing");
    }

    /// After `ASK_AGAIN`: a link a caller stepped is left to callers; one whose callers
    /// asked the set only is left too, its socket re-armed when an event (not a sweep)
    /// brought it; one nobody served is the helper's, as is every link with an idle time
    /// of 0. Left links are looked at again after the idle time.
    #[test]
    fn after_asking_again_a_link_goes_to_who_serves_it() {
        assert!(!Looks::asks(IDLE, false) && Looks::asks(IDLE, true) && !Looks::asks(Duration::ZERO, true));
        let mut l = Looks::new(0);
        l.begin();
        l.event(6);
        l.woke(false, 0, 0, IDLE);
        assert_eq!(l.verdict(6, 0, IDLE, true, true), Verdict::Callers { rearm: false }, "stepped");
        assert_eq!(l.verdict(6, 0, IDLE, false, true), Verdict::Callers { rearm: true }, "asked, evented");
        assert_eq!(l.verdict(9, 0, IDLE, false, true), Verdict::Callers { rearm: false }, "asked, swept");
        assert_eq!(l.verdict(6, 0, IDLE, false, false), Verdict::Helper, "nobody serves it");
        assert_eq!(l.verdict(6, 0, Duration::ZERO, true, true), Verdict::Helper, "impatient");
        l.begin();
        l.woke(true, IDLE.as_nanos() as u64 / 2 - 1, 0, IDLE);
        assert_eq!(l.due(), [] as [usize; 0]);
        l.begin();
        l.woke(true, IDLE.as_nanos() as u64 / 2, 0, IDLE);
        assert_eq!(l.due(), [6, 9], "after the idle time (within the half-idle horizon)");
    }
}
