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
//! so a dialer is attached even while the accepting side is busy elsewhere.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::conn::{Conn, Phase};
use super::device::DevShared;
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

const T_WAKE: u64 = u64::MAX;
const T_LISTENER: u64 = u64::MAX - 1;

struct Entry {
    conn: Weak<Conn>,
    fd: i32,
    seen_epoch: u64,
}

pub struct Helper {
    epfd: OwnedFd,
    evfd: OwnedFd,
    slab: Mutex<Vec<Option<Entry>>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn ctl(epfd: i32, op: i32, fd: i32, events: u32, token: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: plain syscall; `ev` outlives it.
    if unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn interest(write: bool) -> u32 {
    let mut e = libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT;
    if write {
        e |= libc::EPOLLOUT;
    }
    e as u32
}

impl Helper {
    pub fn new(listener_fd: i32) -> Result<Helper> {
        // SAFETY: plain syscalls; each result is checked before it is owned.
        let (ep, ev) = unsafe {
            (libc::epoll_create1(libc::EPOLL_CLOEXEC), libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK))
        };
        if ep < 0 || ev < 0 {
            return Err(Error::io("soft fabric: epoll/eventfd", &std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (epfd, evfd) = unsafe { (OwnedFd::from_raw_fd(ep), OwnedFd::from_raw_fd(ev)) };
        let h =
            Helper { epfd, evfd, slab: Mutex::new(Vec::new()), stop: AtomicBool::new(false), thread: Mutex::new(None) };
        let e = (ctl)(ep, libc::EPOLL_CTL_ADD, ev, libc::EPOLLIN as u32, T_WAKE)
            .and_then(|_| ctl(ep, libc::EPOLL_CTL_ADD, listener_fd, libc::EPOLLIN as u32, T_LISTENER));
        e.map_err(|e| Error::io("soft fabric: epoll_ctl", &e))?;
        Ok(h)
    }

    pub fn start(dev: &Arc<DevShared>, name: &str) -> Result<()> {
        let d = dev.clone();
        let t = std::thread::Builder::new()
            .name(format!("mpib-{name}"))
            .spawn(move || run(&d))
            .map_err(|e| Error::io("soft fabric: starting the helper thread", &e))?;
        *dev.net.as_ref().expect("TCP device").helper.thread.lock() = Some(t);
        Ok(())
    }

    /// Stops and joins the thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.evfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }

    /// Adds an established connection's socket; returns its token.
    pub fn add(&self, conn: &Arc<Conn>, fd: i32, write: bool) -> usize {
        let mut slab = self.slab.lock();
        let entry = Entry { conn: Arc::downgrade(conn), fd, seen_epoch: conn.caller_epoch.load(Ordering::Relaxed) };
        let token = match slab.iter().position(|e| e.is_none()) {
            Some(i) => {
                slab[i] = Some(entry);
                i
            }
            None => {
                slab.push(Some(entry));
                slab.len() - 1
            }
        };
        if let Err(e) = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, interest(write), token as u64) {
            log::warn!("soft fabric: QP {}: epoll_ctl ADD failed ({e}); served by its callers only", conn.qp_num);
        }
        token
    }

    /// Drops a socket from the set (before it is closed).
    pub fn forget(&self, fd: i32) {
        let _ = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
        for e in self.slab.lock().iter_mut() {
            if e.as_ref().is_some_and(|e| e.fd == fd) {
                *e = None;
            }
        }
    }

    pub fn rearm(&self, fd: i32, token: usize, write: bool) {
        let _ = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, interest(write), token as u64);
    }
}

fn run(dev: &Arc<DevShared>) {
    let h = &dev.net.as_ref().expect("TCP device").helper;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut watch: Vec<(usize, Instant)> = Vec::with_capacity(64);
    let mut due: Vec<usize> = Vec::with_capacity(64);
    let mut accepting = false;
    while !h.stop.load(Ordering::Acquire) {
        let timeout = if watch.is_empty() && !accepting { -1 } else { idle().as_millis().max(1) as i32 };
        // SAFETY: `events` is a live array of the length passed.
        let n = unsafe { libc::epoll_wait(h.epfd.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
        if h.stop.load(Ordering::Acquire) {
            break;
        }
        due.clear();
        for ev in &events[..n.max(0) as usize] {
            match ev.u64 {
                T_WAKE => {
                    let mut buf = 0u64;
                    // SAFETY: reads 8 bytes into a live u64 from our eventfd.
                    unsafe { libc::read(h.evfd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
                }
                T_LISTENER => accepting = true,
                t => due.push(t as usize),
            }
        }
        if accepting {
            accepting = dev.drive_accept();
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
            if let Some(again) = visit(h, t) {
                watch.push((t, now + again));
            }
        }
    }
}

/// Serves connection `t` if its callers are quiet. Returns when to look again, if needed.
fn visit(h: &Helper, t: usize) -> Option<Duration> {
    let (conn, seen) = {
        let slab = h.slab.lock();
        let e = slab.get(t)?.as_ref()?;
        (e.conn.upgrade()?, e.seen_epoch)
    };
    let epoch = conn.caller_epoch.load(Ordering::Relaxed);
    let idle = idle();
    if epoch != seen && !idle.is_zero() {
        if let Some(Some(e)) = h.slab.lock().get_mut(t) {
            e.seen_epoch = epoch;
        }
        return Some(idle);
    }
    let Some(mut st) = conn.st.try_lock() else { return Some(idle.max(Duration::from_millis(1))) };
    conn.progress(&mut st, false);
    if !matches!(st.phase, Phase::Ready) {
        return None;
    }
    let fd = st.link.as_ref()?.fd()?;
    st.out_armed = Conn::wants_write(&st);
    h.rearm(fd, t, st.out_armed);
    Conn::needs_timer(&st).then_some(idle.max(Duration::from_millis(1)))
}
