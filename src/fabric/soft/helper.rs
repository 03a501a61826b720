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
//! The listener is in the set too: the helper accepts connections and reads their HELLO
//! so a dialer is attached even while the accepting side is busy elsewhere. The set itself
//! is `watch.rs`; the listener and the links are the device's `Port`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::link::{Link, LinkState, Phase};
use super::port::Port;
use super::watch::{T_LISTENER, T_TICK, T_WAKE};
use crate::error::{Error, Result};

/// The running helper thread of a TCP device; stopped and joined by [`Helper::shutdown`].
pub struct Helper {
    port: Arc<Port<Conn>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    /// Starts the thread of the TCP device whose port is `port`.
    pub fn start(port: &Arc<Port<Conn>>, name: &str) -> Result<Helper> {
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

fn run(port: &Port<Conn>, stop: &AtomicBool) {
    let net = port.net.as_ref().expect("TCP device");
    let w = &net.watcher;
    let (idle, period) = (|| w.clock.schedule.idle(), || w.clock.schedule.period());
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut watch: Vec<(usize, Instant)> = Vec::with_capacity(64);
    let mut due: Vec<usize> = Vec::with_capacity(64);
    let mut evented: Vec<usize> = Vec::with_capacity(64);
    let mut woken: Vec<(usize, u64, Arc<Link<Conn>>)> = Vec::with_capacity(64);
    // The links the helper served at its last look of each, with the link's `caller_epoch`
    // and the device's `epoll_epoch` it saw then.
    let mut serving: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut accepting = false;
    let mut seen_epoll = net.epoll_epoch.load(Ordering::Relaxed);
    let (mut swept, mut clock_ok) = (false, true);
    while !stop.load(Ordering::Acquire) {
        // The clock runs while there is anything to look at again (watched links, accepts
        // pending, links to sweep): after each sweep it is set a period on (callers that
        // poll move it further: `clock.rs`); else the helper sleeps until an event.
        let looks = !watch.is_empty() || accepting || !net.links().is_empty();
        if looks && (swept || !w.clock.running()) {
            match w.clock.swept(crate::fabric::clock::monotonic_ns()) {
                Ok(()) => clock_ok = true,
                Err(e) if clock_ok => {
                    log::warn!("soft fabric {}: the helper's clock: {e}; it looks every period", port.name);
                    clock_ok = false;
                }
                Err(_) => {}
            }
        } else if !looks && w.clock.running() {
            let _ = w.clock.stop();
        }
        swept = false;
        let timeout = if looks && !clock_ok { period().as_millis() as i32 } else { -1 };
        let n = w.wait(&mut events, timeout);
        if stop.load(Ordering::Acquire) {
            break;
        }
        // A signal this thread handled: nothing happened, nothing is due.
        let Some(n) = n else { continue };
        due.clear();
        // (No event: the period ran out, the fallback when the clock could not be set.)
        let mut tick = n == 0;
        for ev in &events[..n] {
            match ev.u64 {
                T_WAKE => w.drain_wake(),
                T_TICK => {
                    w.clock.drain();
                    tick = true;
                }
                T_LISTENER => accepting = true,
                t => due.push(t as usize),
            }
        }
        if accepting {
            accepting = port.drive_accept();
        }
        let now = Instant::now();
        // Callers that ask the readiness set serve every link of the device.
        let epoll = net.epoll_epoch.load(Ordering::Relaxed);
        let callers_poll = epoll != seen_epoll && !idle().is_zero();
        evented.clear();
        evented.extend_from_slice(&due);
        evented.sort_unstable();
        if tick {
            swept = true;
            seen_epoll = epoll;
            port.sweep(now, callers_poll, |l| {
                let e = l.caller_epoch.load(Ordering::Relaxed);
                e == l.swept.swap(e, Ordering::Relaxed)
            });
            // Visit every watched link due within half a period: one wake-up serves them
            // all, however many links the device has.
            let horizon = now + idle() / 2;
            watch.retain(|&(t, at)| {
                let ready = at <= horizon;
                if ready {
                    due.push(t);
                }
                !ready
            });
        }
        due.sort_unstable();
        due.dedup();
        // A link is left to callers only if they are seen serving it now: stepping it, or
        // asking the readiness set (whose edges they take and serve), within ASK_AGAIN.
        // Not on what they did since the last look: a caller that stepped it once (a
        // queued step) or asked the set before its bytes came, and is hot on its own link
        // now, serves it no more; a request on a link whose CQ nobody polls (an idle
        // communicator's probe) then waited for the sweeps, ~200 ms while a busy caller put
        // them off.
        woken.extend(due.iter().filter_map(|&t| w.get(t).map(|l| (t, l.caller_epoch.load(Ordering::Relaxed), l))));
        let patient = !idle().is_zero();
        let asked_before = net.epoll_epoch.load(Ordering::Relaxed);
        // A link the helper served at its last look, neither epoch moved since: callers
        // are not serving it, and it is served at once. (Waiting ASK_AGAIN on every event
        // of a link the helper serves made a quiet responder's 8-byte round trip ~200 µs
        // instead of ~25, and cost ~15 % of its 8 MiB bandwidth: `soft_progress`,
        // `soft_vs_tcp`'s "soft idle".)
        woken.retain(|(t, epoch, link)| {
            if serving.get(t) != Some(&(*epoch, asked_before)) {
                return true;
            }
            if let Some(again) = serve(port, link, *t) {
                serving.remove(t);
                watch.push((*t, now + again));
            }
            false
        });
        if patient && !woken.is_empty() {
            net.helper_asks.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(ASK_AGAIN);
        }
        let asked_after = net.epoll_epoch.load(Ordering::Relaxed);
        let asked = asked_after != asked_before;
        for (t, epoch, link) in woken.drain(..) {
            let stepped = link.caller_epoch.load(Ordering::Relaxed) != epoch;
            serving.remove(&t);
            let again = if patient && stepped {
                Some(idle())
            } else if patient && asked {
                // Callers ask the set but did not step this link: the event that woke the
                // helper may not have been one they serve (room to write); its next one
                // wakes the helper again. (A link looked at by a sweep stays disarmed:
                // re-armed, each of its events would wake the helper while callers serve it.)
                if evented.binary_search(&t).is_ok() {
                    arm(port, &link, t);
                }
                Some(idle())
            } else {
                let again = serve(port, &link, t);
                if again.is_none() && patient {
                    serving.insert(t, (epoch, asked_after));
                }
                again
            };
            if let Some(again) = again {
                watch.push((t, now + again));
            }
        }
    }
    let _ = w.clock.stop();
}

/// How long the helper watches whether callers serve a link it looks at (`run`): a caller
/// that polls steps its link, or asks the readiness set, every few µs. The helper sleeps
/// meanwhile: one wake-up more when a link's event woke it, or a sweep found links due.
const ASK_AGAIN: Duration = Duration::from_micros(100);

fn serve(port: &Port<Conn>, link: &Arc<Link<Conn>>, t: usize) -> Option<Duration> {
    let Some(mut st) = link.try_lock() else {
        return Some(port.net.as_ref().expect("TCP device").watcher.clock.schedule.period());
    };
    let _ = port.step_locked(link, &mut st, false);
    rearm(port, &mut st, t);
    None
}

/// Re-arms link `t`'s socket for the helper, unless a caller is on the link (it serves it).
fn arm(port: &Port<Conn>, link: &Arc<Link<Conn>>, t: usize) {
    if let Some(mut st) = link.try_lock() {
        rearm(port, &mut st, t);
    }
}

/// Re-arms a locked link's socket (`EPOLLOUT` too while bytes wait for room or a dial is
/// under way); a link down has none.
fn rearm(port: &Port<Conn>, st: &mut LinkState<Conn>, t: usize) {
    let Some(fd) = st.fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd) else { return };
    if matches!(st.phase, Phase::Down) {
        return;
    }
    let wants = st.wants_write() || matches!(st.phase, Phase::Dialing { .. });
    st.out_armed = wants;
    port.net.as_ref().expect("TCP device").watcher.rearm(fd, t, wants);
}
