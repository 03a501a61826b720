//! The helper thread of a TCP soft device: the part of the NIC that serves a peer while
//! this process makes no calls (a responder sitting in a GPU kernel, a test child waiting
//! on its stdin). It sleeps in `epoll_wait` and never spins:
//!
//! - every link's socket is in its epoll set with `EPOLLONESHOT`, so an event wakes the
//!   helper once and the socket stays quiet until the helper re-arms it;
//! - on an event the helper watches for `ASK_AGAIN` (100 µs, asleep) whether callers serve
//!   the link now: a caller steps it (the link's `caller_epoch` moves) or asks the
//!   readiness set, whose edges it takes and serves (the device's `epoll_epoch` moves).
//!   If so, the helper leaves the socket disarmed and looks again at its next sweep (links
//!   due within half a period are looked at together, the same way). A busy NCCL proxy
//!   therefore costs the helper one wake-up per `MAX_DEFER` per device (see below), not one
//!   per message, link or connection;
//! - else (callers quiet, or busy on other links only) the helper makes the progress step
//!   itself (read, place, acknowledge, send) and re-arms the socket (`EPOLLOUT` too while
//!   bytes wait for room), so from then on it serves at full speed: the link's next event
//!   is served at once, without watching again, while neither epoch moved since;
//! - while the device has links, every `IDLE` it sweeps them (`Port::sweep`): a link no
//!   caller stepped is stepped (RNR retries, sends left over), a silent peer is detected,
//!   a dial refused is tried again, a link that never carried a QP expires. The sweeps
//!   come from the helper's clock (`clock.rs`), which callers' polls put off: while
//!   callers poll the device the helper sweeps only every `MAX_DEFER` (100 ms), and not
//!   at all between, so it takes no CPU from them; once they stop, within `IDLE`.
//!
//! Those rules are the progress policy's (`progress.rs`: [`Looks`] for the looks,
//! `SweepSchedule` for the clock), given the times and epochs this thread reads; this file
//! waits, sleeps, steps and re-arms as they say.
//!
//! The listener is in the set too: the helper accepts connections and reads their HELLO
//! so a dialer is attached even while the accepting side is busy elsewhere. The set itself
//! is `watch.rs`; the listener and the links are the device's `Port`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use super::conn_tcp::TcpConn;
use super::link::{Link, LinkState, Phase};
use super::port::Port;
use super::progress::{ASK_AGAIN, ClockAction, Looks, Verdict};
use super::watch::{T_LISTENER, T_TICK, T_WAKE};
use crate::error::{Error, Result};
use crate::fabric::clock::monotonic_ns;

/// The running helper thread of a TCP device; stopped and joined by [`Helper::shutdown`].
pub struct Helper {
    port: Arc<Port<TcpConn>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    /// Starts the thread of the TCP device whose port is `port`.
    pub fn start(port: &Arc<Port<TcpConn>>, name: &str) -> Result<Helper> {
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (port.clone(), stop.clone());
        let t = std::thread::Builder::new()
            .name(format!("mpib-{name}"))
            .spawn(move || run(&p, &s))
            .map_err(|e| Error::io("soft fabric: starting the helper thread", &e))?;
        Ok(Helper { port: port.clone(), stop, thread: Some(t) })
    }

    /// Stops and joins the thread.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.port.net.as_ref().expect("TCP device").watcher.wake();
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

fn run(port: &Port<TcpConn>, stop: &AtomicBool) {
    let net = port.net.as_ref().expect("TCP device");
    let w = &net.watcher;
    let schedule = &w.clock.schedule;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut woken: Vec<(usize, u64, Arc<Link<TcpConn>>)> = Vec::with_capacity(64);
    let mut looks = Looks::new(net.epoll_epoch.load(Ordering::Relaxed));
    while !stop.load(Ordering::Acquire) {
        match looks.before_wait(!net.links().is_empty(), w.clock.running()) {
            ClockAction::Set => {
                let r = w.clock.swept(monotonic_ns());
                if looks.clock_set(r.is_ok())
                    && let Err(e) = r
                {
                    log::warn!("soft fabric {}: the helper's clock: {e}; it looks every period", port.name);
                }
            }
            ClockAction::Stop => {
                let _ = w.clock.stop();
            }
            ClockAction::Keep => {}
        }
        let timeout = looks.wait_timeout(schedule.period()).map_or(-1, |d| d.as_millis() as i32);
        let n = w.wait(&mut events, timeout);
        if stop.load(Ordering::Acquire) {
            break;
        }
        // A signal this thread handled: nothing happened, nothing is due.
        let Some(n) = n else { continue };
        looks.begin();
        // (No event: the period ran out, the fallback when the clock could not be set.)
        let mut tick = n == 0;
        for ev in &events[..n] {
            match ev.u64 {
                T_WAKE => w.drain_wake(),
                T_TICK => {
                    w.clock.drain();
                    tick = true;
                }
                T_LISTENER => looks.accepting = true,
                t => looks.event(t as usize),
            }
        }
        if looks.accepting {
            looks.accepting = port.drive_accept();
        }
        let (idle, period) = (schedule.idle(), schedule.period());
        let now = monotonic_ns();
        if let Some(callers_poll) = looks.woke(tick, now, net.epoll_epoch.load(Ordering::Relaxed), idle) {
            net.helper_sweeps.fetch_add(1, Ordering::Relaxed);
            port.sweep(Instant::now(), callers_poll, |l| {
                let e = l.caller_epoch.load(Ordering::Relaxed);
                e == l.swept.swap(e, Ordering::Relaxed)
            });
        }
        let due = looks.due().iter();
        woken.extend(due.filter_map(|&t| w.get(t).map(|l| (t, l.caller_epoch.load(Ordering::Relaxed), l))));
        let asked_before = net.epoll_epoch.load(Ordering::Relaxed);
        woken.retain(|(t, epoch, link)| {
            if !looks.serve_at_once(*t, *epoch, asked_before) {
                return true;
            }
            let busy = !serve(port, link, *t);
            looks.served(*t, busy, (*epoch, asked_before), now, idle, period);
            false
        });
        if Looks::asks(idle, !woken.is_empty()) {
            net.helper_asks.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(ASK_AGAIN);
        }
        let asked_after = net.epoll_epoch.load(Ordering::Relaxed);
        let asked = asked_after != asked_before;
        for (t, epoch, link) in woken.drain(..) {
            let stepped = link.caller_epoch.load(Ordering::Relaxed) != epoch;
            match looks.verdict(t, now, idle, stepped, asked) {
                Verdict::Callers { rearm } => {
                    if rearm {
                        arm(port, &link, t);
                    }
                }
                Verdict::Helper => {
                    let busy = !serve(port, &link, t);
                    looks.served(t, busy, (epoch, asked_after), now, idle, period);
                }
            }
        }
    }
    let _ = w.clock.stop();
}

/// The helper steps a link and re-arms its socket; `false`: a caller is on the link.
fn serve(port: &Port<TcpConn>, link: &Arc<Link<TcpConn>>, t: usize) -> bool {
    let Some(mut st) = link.try_lock() else { return false };
    let _ = port.step_locked(link, &mut st, false);
    rearm(port, &mut st, t);
    true
}

/// Re-arms link `t`'s socket for the helper, unless a caller is on the link (it serves it).
fn arm(port: &Port<TcpConn>, link: &Arc<Link<TcpConn>>, t: usize) {
    if let Some(mut st) = link.try_lock() {
        rearm(port, &mut st, t);
    }
}

/// Re-arms a locked link's socket (`EPOLLOUT` too while bytes wait for room or a dial is
/// under way); a link down has none.
fn rearm(port: &Port<TcpConn>, st: &mut LinkState<TcpConn>, t: usize) {
    let Some(fd) = st.fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd) else { return };
    if matches!(st.phase, Phase::Down) {
        return;
    }
    let wants = st.wants_write() || matches!(st.phase, Phase::Dialing { .. });
    st.out_armed = wants;
    port.net.as_ref().expect("TCP device").watcher.rearm(fd, t, wants);
}
