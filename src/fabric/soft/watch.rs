//! The readiness sets of a TCP soft device: which links have bytes to read or room to
//! write. Generic over what is watched (the links), so the links' owner (`port.rs`) and the
//! helper thread that serves them both sit above it.
//!
//! Two epoll sets hold every link's socket under the same token:
//! - the helper's (`epfd`), with `EPOLLONESHOT`: an event wakes the helper thread once and
//!   the socket stays quiet until the helper re-arms it. The listener and an eventfd that
//!   wakes the thread are in it too;
//! - the callers' (`cfd`), edge-triggered: a caller polling a CQ whose QPs use several links
//!   asks it with one non-blocking `epoll_wait` which links moved, instead of trying a read
//!   on each (the cost of a poll does not grow with the links or the QPs on them).
//!
//! Tokens index a slot table with a free list: adding and forgetting are O(1).
//!
//! The helper's set also holds its clock (`clock.rs`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::clock::{HelperClock, drain_counter, owned_fd};
use crate::error::{Error, Result};

/// The token of the eventfd.
pub const T_WAKE: u64 = u64::MAX;
/// The token of the listener.
pub const T_LISTENER: u64 = u64::MAX - 1;
/// The token of the helper's clock (see the module documentation).
pub const T_TICK: u64 = u64::MAX - 2;

struct Slots<T> {
    /// The watched items by token (weak: the item's owners decide how long it lives).
    slots: Vec<Option<Weak<T>>>,
    free: Vec<usize>,
}

/// The readiness sets (see the module documentation).
pub struct Watcher<T> {
    epfd: OwnedFd,
    cfd: OwnedFd,
    evfd: OwnedFd,
    /// The helper's clock, in the helper's set under [`T_TICK`].
    pub clock: HelperClock,
    listener: i32,
    slab: Mutex<Slots<T>>,
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

const CALLER_INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

fn epoll() -> Result<OwnedFd> {
    // SAFETY: plain syscall; `owned_fd` checks the result.
    owned_fd("epoll_create1", unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })
}

impl<T> Watcher<T> {
    /// The sets, with the wake-up eventfd and `listener_fd` in the helper's.
    pub fn new(listener_fd: i32) -> Result<Watcher<T>> {
        let (epfd, cfd) = (epoll()?, epoll()?);
        // SAFETY: plain syscall; `owned_fd` checks the result.
        let evfd = owned_fd("eventfd", unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        let ev = evfd.as_raw_fd();
        let clock = HelperClock::new()?;
        let t = clock.fd();
        let slab = Mutex::new(Slots { slots: vec![], free: vec![] });
        let w = Watcher { epfd, cfd, evfd, clock, listener: listener_fd, slab };
        let ep = w.epfd.as_raw_fd();
        let e = ctl(ep, libc::EPOLL_CTL_ADD, ev, libc::EPOLLIN as u32, T_WAKE)
            .and_then(|_| ctl(ep, libc::EPOLL_CTL_ADD, t, libc::EPOLLIN as u32, T_TICK))
            .and_then(|_| ctl(ep, libc::EPOLL_CTL_ADD, listener_fd, libc::EPOLLIN as u32, T_LISTENER));
        e.map_err(|e| Error::io("soft fabric: epoll_ctl", &e))?;
        Ok(w)
    }

    /// Adds a socket to both sets, armed for the helper (`EPOLLOUT` too when `write`);
    /// returns its token, and the error if epoll refused it (it is then served by its
    /// callers only).
    pub fn add(&self, item: &Arc<T>, fd: i32, write: bool) -> (usize, std::io::Result<()>) {
        let mut s = self.slab.lock();
        let entry = Arc::downgrade(item);
        let token = match s.free.pop() {
            Some(i) => {
                s.slots[i] = Some(entry);
                i
            }
            None => {
                s.slots.push(Some(entry));
                s.slots.len() - 1
            }
        };
        drop(s);
        let r = ctl(self.cfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, CALLER_INTEREST, token as u64)
            .and_then(|_| ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, interest(write), token as u64));
        (token, r)
    }

    /// Drops socket `fd` of `token` from both sets (before it is closed).
    pub fn forget(&self, token: usize, fd: i32) {
        let _ = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
        let _ = ctl(self.cfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0);
        let mut s = self.slab.lock();
        if let Some(slot) = s.slots.get_mut(token)
            && slot.take().is_some()
        {
            s.free.push(token);
        }
    }

    /// Re-arms a socket for the helper (`EPOLLOUT` too when `write`).
    pub fn rearm(&self, fd: i32, token: usize, write: bool) {
        let _ = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, interest(write), token as u64);
    }

    /// Turns the listener's events on or off (off while accepting must back off).
    pub fn listen(&self, on: bool) {
        let ev = if on { libc::EPOLLIN as u32 } else { 0 };
        let _ = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, self.listener, ev, T_LISTENER);
    }

    /// The item of `token` (if it is still alive).
    pub fn get(&self, token: usize) -> Option<Arc<T>> {
        let s = self.slab.lock();
        s.slots.get(token)?.as_ref()?.upgrade()
    }

    /// The helper: waits for events (`timeout` ms, -1: forever); returns how many (0: the
    /// timeout ran out), `None` when the wait ended without either (a signal handled by
    /// this thread: `EINTR`), which is neither an event nor the period's end.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout: i32) -> Option<usize> {
        // SAFETY: `events` is a live array of the length passed.
        let n = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
        usize::try_from(n).ok()
    }

    /// A caller: the links whose sockets moved since the last call (never waits).
    pub fn moved(&self, events: &mut [libc::epoll_event]) -> usize {
        // SAFETY: `events` is a live array of the length passed.
        let n = unsafe { libc::epoll_wait(self.cfd.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, 0) };
        n.max(0) as usize
    }

    /// Wakes the thread in [`Self::wait`].
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.evfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Consumes a wake-up (after a `T_WAKE` event).
    pub fn drain_wake(&self) {
        drain_counter(&self.evfd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forgetting frees exactly its own slot, and the next add takes it again.
    #[test]
    fn tokens_are_reused_and_forgetting_touches_only_its_own() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let w: Watcher<u32> = Watcher::new(a.as_raw_fd()).unwrap();
        let items: Vec<Arc<u32>> = (0..3).map(Arc::new).collect();
        let socks: Vec<_> = (0..3).map(|_| std::os::unix::net::UnixStream::pair().unwrap()).collect();
        let toks: Vec<usize> = items.iter().zip(&socks).map(|(i, s)| w.add(i, s.0.as_raw_fd(), false).0).collect();
        assert_eq!(toks, [0, 1, 2]);
        w.forget(toks[1], socks[1].0.as_raw_fd());
        assert!(w.get(toks[1]).is_none());
        assert_eq!(*w.get(toks[0]).unwrap(), 0);
        assert_eq!(*w.get(toks[2]).unwrap(), 2);
        let again = w.add(&items[1], socks[1].0.as_raw_fd(), false).0;
        assert_eq!(again, 1, "the freed slot is taken again");
        // The callers' set reports a socket with bytes to read.
        use std::io::Write;
        (&socks[2].1).write_all(b"x").unwrap();
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 8];
        let n = w.moved(&mut ev);
        assert!(ev[..n].iter().any(|e| e.u64 == 2 && e.events & libc::EPOLLIN as u32 != 0));
        drop(b);
    }

    extern "C" fn on_signal(_: libc::c_int) {}

    /// A signal handled by the waiting thread ends its wait as neither an event nor a
    /// timeout (before: as a timeout, so the helper swept at every signal).
    #[test]
    fn a_signal_is_neither_an_event_nor_the_timeout() {
        // SAFETY: installs a handler that does nothing for SIGURG (by default ignored, and
        // then it would not interrupt a wait); no SA_RESTART (epoll_wait never restarts).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut()), 0);
        }
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let w: Arc<Watcher<u32>> = Arc::new(Watcher::new(a.as_raw_fd()).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            // SAFETY: the calling thread's own id.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 8];
            w2.wait(&mut ev, 10_000)
        });
        let id = rx.recv().unwrap();
        let start = std::time::Instant::now();
        // Signals until the thread is seen to have left its wait (the first may come
        // before it entered it).
        while !t.is_finished() {
            // SAFETY: `id` is a live thread's (it has not been joined).
            assert_eq!(unsafe { libc::pthread_kill(id, libc::SIGURG) }, 0);
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert!(start.elapsed() < std::time::Duration::from_secs(5), "the signal did not end the wait");
        }
        assert_eq!(t.join().unwrap(), None);
        // And the timeout is still told apart: 0 events.
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 8];
        assert_eq!(w.wait(&mut ev, 1), Some(0));
    }
}
