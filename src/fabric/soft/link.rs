//! The byte stream under one QP connection: a non-blocking TCP socket, or (in-process
//! mode) a pair of bounded in-memory rings. Both move bytes with vectored calls on raw
//! `iovec`s, so the TCP path reads and writes registered memory directly (the only copy is
//! the kernel's), and the stream never holds a Rust reference to memory a peer may write.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;

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

/// A byte ring of fixed capacity; `closed` once either end is dropped.
pub struct MemRing {
    inner: Mutex<RingBuf>,
}

struct RingBuf {
    buf: Box<[u8]>,
    head: usize,
    len: usize,
    closed: bool,
}

impl MemRing {
    pub fn new(capacity: usize) -> Arc<MemRing> {
        Arc::new(MemRing {
            inner: Mutex::new(RingBuf { buf: vec![0; capacity].into_boxed_slice(), head: 0, len: 0, closed: false }),
        })
    }

    fn close(&self) {
        self.inner.lock().closed = true;
    }
}

/// One end of an in-process connection.
pub struct MemEnd {
    pub rx: Arc<MemRing>,
    pub tx: Arc<MemRing>,
}

impl MemEnd {
    /// Two connected ends, each direction buffering `capacity` bytes.
    pub fn pair(capacity: usize) -> (MemEnd, MemEnd) {
        let (a, b) = (MemRing::new(capacity), MemRing::new(capacity));
        (MemEnd { rx: a.clone(), tx: b.clone() }, MemEnd { rx: b, tx: a })
    }
}

impl Drop for MemEnd {
    fn drop(&mut self) {
        self.rx.close();
        self.tx.close();
    }
}

/// The stream of one connection.
pub enum Link {
    Tcp(OwnedFd),
    Mem(MemEnd),
}

fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
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
            Link::Mem(end) => {
                let mut r = end.rx.inner.lock();
                if r.len == 0 {
                    return if r.closed { Ok(0) } else { Err(would_block()) };
                }
                let mut done = 0;
                for v in iov {
                    let mut off = 0;
                    while off < v.iov_len && r.len > 0 {
                        let cap = r.buf.len();
                        let run = (cap - r.head).min(r.len).min(v.iov_len - off);
                        // SAFETY: the caller guarantees `v` is writable for `iov_len` bytes;
                        // the source run lies inside the ring buffer.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                r.buf.as_ptr().add(r.head),
                                (v.iov_base as *mut u8).add(off),
                                run,
                            )
                        };
                        r.head = (r.head + run) % cap;
                        r.len -= run;
                        off += run;
                        done += run;
                    }
                    if r.len == 0 {
                        break;
                    }
                }
                Ok(done)
            }
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
            Link::Mem(end) => {
                let mut w = end.tx.inner.lock();
                if w.closed {
                    return Err(io::Error::from(io::ErrorKind::BrokenPipe));
                }
                let cap = w.buf.len();
                if w.len == cap {
                    return Err(would_block());
                }
                let mut done = 0;
                for v in iov {
                    let mut off = 0;
                    while off < v.iov_len && w.len < cap {
                        let tail = (w.head + w.len) % cap;
                        let run = (cap - tail).min(cap - w.len).min(v.iov_len - off);
                        // SAFETY: the caller guarantees `v` is readable for `iov_len` bytes;
                        // the destination run lies inside the ring buffer.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                (v.iov_base as *const u8).add(off),
                                w.buf.as_mut_ptr().add(tail),
                                run,
                            )
                        };
                        w.len += run;
                        off += run;
                        done += run;
                    }
                    if w.len == cap {
                        break;
                    }
                }
                Ok(done)
            }
        }
    }

    /// Tells the peer this end is gone (TCP: FIN; memory: closed).
    pub fn shutdown(&self) {
        match self {
            Link::Tcp(fd) => {
                // SAFETY: plain syscall on a descriptor this Link owns.
                unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
            }
            Link::Mem(end) => {
                end.rx.close();
                end.tx.close();
            }
        }
    }

    /// The socket, for the helper's epoll set (memory links have none).
    pub fn fd(&self) -> Option<i32> {
        match self {
            Link::Tcp(fd) => Some(fd.as_raw_fd()),
            Link::Mem(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(b: &mut [u8]) -> libc::iovec {
        libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }
    }

    #[test]
    fn mem_link_wraps_blocks_and_closes() {
        let (a, b) = MemEnd::pair(8);
        let (a, b) = (Link::Mem(a), Link::Mem(b));
        let mut src = *b"0123456789";
        assert_eq!(a.writev(&[iov(&mut src[..6])]).unwrap(), 6);
        let mut dst = [0u8; 4];
        assert_eq!(b.readv(&[iov(&mut dst)]).unwrap(), 4);
        assert_eq!(&dst, b"0123");
        assert_eq!(a.writev(&[iov(&mut src[6..]), iov(&mut src[..4])]).unwrap(), 6, "only 6 bytes of room");
        assert_eq!(a.writev(&[iov(&mut src)]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let (mut x, mut y) = ([0u8; 3], [0u8; 9]);
        assert_eq!(b.readv(&[iov(&mut x), iov(&mut y)]).unwrap(), 8);
        assert_eq!(&x, b"456");
        assert_eq!(&y[..5], b"78901");
        assert_eq!(b.readv(&[iov(&mut x)]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop(a);
        assert_eq!(b.readv(&[iov(&mut x)]).unwrap(), 0);
        assert_eq!(b.writev(&[iov(&mut x)]).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    }
}
