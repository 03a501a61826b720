//! What moves bytes under a connection:
//!
//! - TCP: [`IovBuf`], the `iovec`s of one vectored call on a link's non-blocking socket, so
//!   the TCP path reads and writes registered memory directly (the only copy is the
//!   kernel's) and never holds a Rust reference to memory a peer may write; [`readv`] and
//!   [`writev`] on a raw socket.
//! - In-process: no stream ([`DirectEnd`]). Both ends share a small state word (ready,
//!   closed) and each end holds the peer's [`Endpoint`], against which its WRs execute
//!   directly (`direct.rs`). When either end goes away or fails, the other sees it at its
//!   next step as the TCP path sees EOF.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use super::endpoint::{CqShared, Endpoint};
use super::mr::{MrTable, Pinned};
use crate::fabric::Access;

/// Most `iovec`s one call takes.
pub const MAX_IOV: usize = 64;

/// Zero bytes to send in place of memory that must not be read any more (the rest of a
/// segment already begun when its QP failed).
pub static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Reads into `iov` in order. `Ok(0)`: the peer closed. `WouldBlock`: nothing yet.
///
/// The iovecs must point to memory that stays valid and writable for the call.
pub fn readv(fd: i32, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: the caller guarantees every iovec is valid, writable memory for this call;
    // the count is at most the slice length (≤ MAX_IOV ≤ IOV_MAX).
    let n = unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as i32) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// Writes `iov` in order; returns how many bytes were taken. `WouldBlock`: no room.
///
/// The iovecs must point to memory that stays valid and readable for the call.
pub fn writev(fd: i32, iov: &[libc::iovec]) -> io::Result<usize> {
    let msg = libc::msghdr {
        msg_name: std::ptr::null_mut(),
        msg_namelen: 0,
        msg_iov: iov.as_ptr() as *mut libc::iovec,
        msg_iovlen: iov.len(),
        msg_control: std::ptr::null_mut(),
        msg_controllen: 0,
        msg_flags: 0,
    };
    // SAFETY: the caller guarantees every iovec is valid, readable memory for this call;
    // `msg` points at them. MSG_NOSIGNAL: a closed peer is EPIPE, not a SIGPIPE that kills
    // the process.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// The iovecs of one vectored call; the registrations they point into stay pinned until
/// this drops (after the call).
pub struct IovBuf<'a> {
    iov: [libc::iovec; MAX_IOV],
    n: usize,
    pins: [Option<Pinned<'a>>; MAX_IOV],
    np: usize,
}

impl<'a> IovBuf<'a> {
    pub fn new() -> IovBuf<'a> {
        IovBuf {
            iov: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOV],
            n: 0,
            pins: std::array::from_fn(|_| None),
            np: 0,
        }
    }

    pub fn room(&self) -> usize {
        MAX_IOV - self.n
    }

    pub fn iovs(&self) -> &[libc::iovec] {
        &self.iov[..self.n]
    }

    pub fn bytes(&self) -> usize {
        self.iovs().iter().map(|v| v.iov_len).sum()
    }

    /// Adds memory this side owns (a header, an inline slot, the staging buffer).
    pub fn push(&mut self, ptr: *const u8, len: usize) {
        self.iov[self.n] = libc::iovec { iov_base: ptr as *mut libc::c_void, iov_len: len };
        self.n += 1;
    }

    /// Adds bytes `[from, to)` of a payload laid out over `segs` (key, address, length),
    /// pinning each registration touched for `need`. `false`: a registration is gone or
    /// does not allow it (nothing of that segment was added).
    pub fn push_segments(
        &mut self,
        mrs: &'a MrTable,
        segs: impl Iterator<Item = (u32, u64, u64)>,
        from: u64,
        to: u64,
        need: Access,
    ) -> bool {
        let mut seg_off = 0u64;
        for (key, addr, len) in segs {
            let (lo, hi) = (from.max(seg_off), to.min(seg_off + len));
            if lo < hi {
                let at = addr + (lo - seg_off);
                let Some(pin) = mrs.pin_range(key, at, hi - lo, need) else { return false };
                self.pins[self.np] = Some(pin);
                self.np += 1;
                self.push(at as *const u8, (hi - lo) as usize);
            }
            seg_off += len;
        }
        true
    }
}

/// Both ends are connected.
pub const READY: u8 = 1;
/// An end went away.
pub const CLOSED: u8 = 2;

/// One end's view of an in-process connection: what it needs of its peer (the responder
/// of its WRs) to execute them.
pub struct DirectEnd {
    /// What both ends share: [`READY`] once both ends are connected (WRs may execute),
    /// `| CLOSED` once an end went away (dropped, or its QP went to the error state). One
    /// word, so a post checks both with one load.
    state: Arc<AtomicU8>,
    peer: Endpoint,
    /// Both `work` flags, this end's first: closing or becoming ready wakes both.
    work: [Arc<AtomicBool>; 2],
    /// This end's CQ: its polls, and the peer's CQ's, step the two connections.
    own_cq: Arc<CqShared>,
}

impl DirectEnd {
    /// The two ends of a connection between `a` and `b` (`a`'s first), each an endpoint
    /// with its connection's `work` flag.
    pub fn pair(a: (&Endpoint, &Arc<AtomicBool>), b: (&Endpoint, &Arc<AtomicBool>)) -> (DirectEnd, DirectEnd) {
        let state = Arc::new(AtomicU8::new(0));
        let end = |me: (&Endpoint, &Arc<AtomicBool>), peer: (&Endpoint, &Arc<AtomicBool>)| DirectEnd {
            state: state.clone(),
            peer: peer.0.clone(),
            work: [me.1.clone(), peer.1.clone()],
            own_cq: me.0.cq.clone(),
        };
        (end(a, b), end(b, a))
    }

    /// The peer: the responder of this end's WRs.
    #[inline(always)]
    pub fn peer(&self) -> &Endpoint {
        &self.peer
    }

    /// The shared state word ([`READY`], [`CLOSED`]), Acquire: what the peer did before
    /// it set a bit is visible.
    #[inline(always)]
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// Both ends are connected: queued WRs run at the next step of either side.
    pub fn set_ready(&self) {
        self.state.fetch_or(READY, Ordering::Release);
        self.wake();
    }

    /// This end is gone: the peer fails at its next step.
    pub fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::Release);
        self.wake();
    }

    /// Raises both `work` flags and both CQs' (the polls of either side step the two).
    fn wake(&self) {
        for w in &self.work {
            w.store(true, Ordering::Release);
        }
        for cq in [&self.own_cq, &self.peer.cq] {
            cq.raise_work();
        }
    }
}

impl Drop for DirectEnd {
    fn drop(&mut self) {
        self.close();
    }
}

/// Whether a non-blocking connect on `fd` finished: `Ok(false)` still under way, `Err` it
/// failed (or `fd` is not a connecting socket).
pub fn dial_result(fd: i32) -> std::io::Result<bool> {
    let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one live pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n == 0 {
        return Ok(false);
    }
    if p.revents & libc::POLLNVAL != 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: `fd` is open (poll did not say POLLNVAL) and the caller's for this call.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    match socket2::SockRef::from(&fd).take_error()? {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// Reads and drops what the socket holds now (non-blocking), at most 1 MiB.
pub fn discard_unread(fd: i32) {
    let mut buf = [0u8; 16 << 10];
    for _ in 0..64 {
        // SAFETY: reads into a local buffer of the length given, from a descriptor the
        // caller owns; MSG_DONTWAIT: never blocks.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            return;
        }
    }
}
