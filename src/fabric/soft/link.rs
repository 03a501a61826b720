//! The byte stream under one QP connection: a non-blocking TCP socket, moved with vectored
//! calls on raw `iovec`s, so the TCP path reads and writes registered memory directly (the
//! only copy is the kernel's) and never holds a Rust reference to memory a peer may write.
//! In-process connections have no stream: their link is a [`DirectEnd`].

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::direct::DirectEnd;
use super::mr::{MrTable, Pinned};
use crate::fabric::Access;

/// Most `iovec`s one call takes.
pub const MAX_IOV: usize = 64;

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

/// The stream of one connection.
pub enum Link {
    Tcp(OwnedFd),
    /// In-process mode: no stream, WRs execute directly (see `direct.rs`).
    Direct(DirectEnd),
}

/// A direct link moves no bytes through `readv`/`writev`: its WRs never reach a stream.
fn no_stream() -> io::Error {
    io::Error::from(io::ErrorKind::Unsupported)
}

impl Link {
    /// Reads into `iov` in order. `Ok(0)`: the peer closed. `WouldBlock`: nothing yet.
    ///
    /// The iovecs must point to memory that stays valid and writable for the call.
    pub fn readv(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        match self {
            Link::Tcp(fd) => {
                // SAFETY: the caller guarantees every iovec is valid, writable memory for
                // this call; the count is at most the slice length (≤ MAX_IOV ≤ IOV_MAX).
                let n = unsafe { libc::readv(fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
                if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
            }
            Link::Direct(_) => Err(no_stream()),
        }
    }

    /// Writes `iov` in order; returns how many bytes were taken. `WouldBlock`: no room.
    ///
    /// The iovecs must point to memory that stays valid and readable for the call.
    pub fn writev(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        match self {
            Link::Tcp(fd) => {
                let msg = libc::msghdr {
                    msg_name: std::ptr::null_mut(),
                    msg_namelen: 0,
                    msg_iov: iov.as_ptr() as *mut libc::iovec,
                    msg_iovlen: iov.len(),
                    msg_control: std::ptr::null_mut(),
                    msg_controllen: 0,
                    msg_flags: 0,
                };
                // SAFETY: the caller guarantees every iovec is valid, readable memory for
                // this call; `msg` points at them. MSG_NOSIGNAL: a closed peer is EPIPE,
                // not a SIGPIPE that kills the process.
                let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
                if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
            }
            Link::Direct(_) => Err(no_stream()),
        }
    }

    /// Tells the peer this end is gone (TCP: FIN; memory: closed).
    pub fn shutdown(&self) {
        match self {
            Link::Tcp(fd) => {
                // SAFETY: plain syscall on a descriptor this Link owns.
                unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
            }
            Link::Direct(end) => end.close(),
        }
    }

    /// The socket, for the helper's epoll set (memory links have none).
    pub fn fd(&self) -> Option<i32> {
        match self {
            Link::Tcp(fd) => Some(fd.as_raw_fd()),
            Link::Direct(_) => None,
        }
    }
}
