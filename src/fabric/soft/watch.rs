//! The epoll set of a TCP soft device's helper thread (see `helper.rs`): the listener, an
//! eventfd that wakes the thread, and every established connection's socket with the token
//! that names it. Generic over what is watched, so the connections (which arm and forget
//! their own sockets) and the helper (which serves them) both sit above it.
//!
//! Sockets are added with `EPOLLONESHOT`: an event wakes the helper once and the socket
//! stays quiet until it is re-armed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// The token of the eventfd.
pub const T_WAKE: u64 = u64::MAX;
/// The token of the listener.
pub const T_LISTENER: u64 = u64::MAX - 1;

struct Watched<T> {
    item: Weak<T>,
    fd: i32,
    /// What the helper last saw of the item's caller epoch.
    seen_epoch: u64,
}

/// The epoll set (see the module documentation).
pub struct Watcher<T> {
    epfd: OwnedFd,
    evfd: OwnedFd,
    slab: Mutex<Vec<Option<Watched<T>>>>,
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

impl<T> Watcher<T> {
    /// An epoll set with the wake-up eventfd and `listener_fd` in it.
    pub fn new(listener_fd: i32) -> Result<Watcher<T>> {
        // SAFETY: plain syscalls; each result is checked before it is owned.
        let (ep, ev) = unsafe {
            (libc::epoll_create1(libc::EPOLL_CLOEXEC), libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK))
        };
        if ep < 0 || ev < 0 {
            return Err(Error::io("soft fabric: epoll/eventfd", &std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (epfd, evfd) = unsafe { (OwnedFd::from_raw_fd(ep), OwnedFd::from_raw_fd(ev)) };
        let w = Watcher { epfd, evfd, slab: Mutex::new(Vec::new()) };
        let e = ctl(ep, libc::EPOLL_CTL_ADD, ev, libc::EPOLLIN as u32, T_WAKE)
            .and_then(|_| ctl(ep, libc::EPOLL_CTL_ADD, listener_fd, libc::EPOLLIN as u32, T_LISTENER));
        e.map_err(|e| Error::io("soft fabric: epoll_ctl", &e))?;
        Ok(w)
    }

    /// Adds an established connection's socket (`epoch`: its caller epoch now); returns its
    /// token, and the error if epoll refused it (it is then served by its callers only).
    pub fn add(&self, item: &Arc<T>, epoch: u64, fd: i32, write: bool) -> (usize, std::io::Result<()>) {
        let mut slab = self.slab.lock();
        let entry = Watched { item: Arc::downgrade(item), fd, seen_epoch: epoch };
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
        (token, ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, interest(write), token as u64))
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

    /// Re-arms a socket (`EPOLLOUT` too when `write`).
    pub fn rearm(&self, fd: i32, token: usize, write: bool) {
        let _ = ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, interest(write), token as u64);
    }

    /// The item of `token` (if it is still alive) and the caller epoch last seen of it.
    pub fn get(&self, token: usize) -> Option<(Arc<T>, u64)> {
        let slab = self.slab.lock();
        let e = slab.get(token)?.as_ref()?;
        Some((e.item.upgrade()?, e.seen_epoch))
    }

    /// Records the caller epoch seen of `token`'s item.
    pub fn set_seen(&self, token: usize, epoch: u64) {
        if let Some(Some(e)) = self.slab.lock().get_mut(token) {
            e.seen_epoch = epoch;
        }
    }

    /// Waits for events (`timeout` ms, -1: forever); returns how many were filled in.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout: i32) -> usize {
        // SAFETY: `events` is a live array of the length passed.
        let n = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
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
        let mut buf = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd.
        unsafe { libc::read(self.evfd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
    }
}
