//! The helper thread of a TCP soft device: the part of the NIC that serves a peer while
//! this process makes no calls (a responder sitting in a GPU kernel, a test child waiting
//! on its stdin). It sleeps in `epoll_wait` and never spins:
//!
//! - every connection's socket is in the epoll set with `EPOLLONESHOT`, so an event wakes
//!   the helper once and the socket stays quiet until the helper re-arms it;
//! - on an event the helper compares the connection's `caller_epoch` with what it saw last
//!   time. If a caller (post/poll) moved it since, the caller is making progress: the helper
//!   leaves the socket disarmed and looks again after [`IDLE`] (connections due within
//!   half a period are looked at together). A busy NCCL proxy therefore costs the helper
//!   one wake-up per `IDLE` per device, not one per message or per connection;
//! - once a connection's callers have been quiet for a whole `IDLE`, the helper makes the
//!   progress step itself (read, place, acknowledge, send) and re-arms the socket
//!   (`EPOLLOUT` too while bytes wait for room), so from then on it serves at full speed;
//! - a connection waiting for an SRQ WQE or CQ room (no socket event announces those) is
//!   revisited every `IDLE`, like an RNR retry timer.
//!
//! The listener is in the set too: the helper accepts connections and reads their HELLO
//! so a dialer is attached even while the accepting side is busy elsewhere. The set itself
//! is `watch.rs`; the listener and the QP table are the device's `Port`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::conn::{Conn, Phase};
use super::port::Port;
use super::transport::Link;
use super::watch::{T_LISTENER, T_WAKE, Watcher};
use crate::error::{Error, Result};

/// How long a connection's callers must have been quiet before the helper steps in; also
/// the helper's retry period for RNR waits and pending accepts. Measured with
/// `examples/soft_progress` on 2 cores, both processes busy-polling: at 1 ms the helpers'
/// ~2000 wake-ups/s cost ~2.5% of a core and triple the p99 round trip of 8-byte WRITEs
/// (~33 µs against ~11 µs); at 10 ms they cost ~0.2% and leave the p99 alone. A quiet
/// process's first request then waits up to 10 ms, later ones are served at once.
pub const IDLE: Duration = Duration::from_millis(10);

static IDLE_MS: AtomicU64 = AtomicU64::new(IDLE.as_millis() as u64);

/// Changes [`IDLE`] for the whole process (whole milliseconds; 0 = the helper serves every
/// event at once, even while callers poll). For the `soft_progress` measurements only.
#[doc(hidden)]
pub fn set_idle(d: Duration) {
    IDLE_MS.store(d.as_millis() as u64, Ordering::Relaxed);
}

fn idle() -> Duration {
    Duration::from_millis(IDLE_MS.load(Ordering::Relaxed))
}

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
    let w = &port.net.as_ref().expect("TCP device").watcher;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut watch: Vec<(usize, Instant)> = Vec::with_capacity(64);
    let mut due: Vec<usize> = Vec::with_capacity(64);
    let mut accepting = false;
    while !stop.load(Ordering::Acquire) {
        let timeout = if watch.is_empty() && !accepting { -1 } else { idle().as_millis().max(1) as i32 };
        let n = w.wait(&mut events, timeout);
        if stop.load(Ordering::Acquire) {
            break;
        }
        due.clear();
        for ev in &events[..n] {
            match ev.u64 {
                T_WAKE => w.drain_wake(),
                T_LISTENER => accepting = true,
                t => due.push(t as usize),
            }
        }
        if accepting {
            accepting = port.drive_accept();
        }
        // Visit every watched connection due within half a period: one wake-up serves them
        // all, so a device costs one wake-up per IDLE however many connections it has.
        let now = Instant::now();
        let horizon = now + idle() / 2;
        watch.retain(|&(t, at)| {
            let ready = at <= horizon;
            if ready {
                due.push(t);
            }
            !ready
        });
        due.sort_unstable();
        due.dedup();
        for &t in &due {
            if let Some(again) = visit(w, t) {
                watch.push((t, now + again));
            }
        }
    }
}

/// Serves connection `t` if its callers are quiet. Returns when to look again, if needed.
fn visit(w: &Watcher<Conn>, t: usize) -> Option<Duration> {
    let (conn, seen) = w.get(t)?;
    let epoch = conn.caller_epoch.load(Ordering::Relaxed);
    let idle = idle();
    if epoch != seen && !idle.is_zero() {
        w.set_seen(t, epoch);
        return Some(idle);
    }
    let Some(mut st) = conn.st.try_lock() else { return Some(idle.max(Duration::from_millis(1))) };
    conn.progress(&mut st, false);
    if !matches!(st.phase, Phase::Ready) {
        return None;
    }
    let wants = st.wants_write();
    let Some(Link::Tcp(link)) = st.link.as_mut() else { return None };
    link.out_armed = wants;
    w.rearm(link.raw_fd(), t, wants);
    st.needs_timer().then_some(idle.max(Duration::from_millis(1)))
}
