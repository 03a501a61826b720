//! The connected comms, memory registrations and requests: the data-path half of the API.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;

use super::{MAX_NET_SIZE_V8, MAX_RECVS, Net, OPTIONAL_RECV, RailCounters, SIZE_UNSET, call};
use crate::ffi::{Table, table_field};
use crate::mem::Arena;
use crate::{Error, Result, check};
use ncclnet_types::types::*;

/// What `close_raw` closes.
#[derive(Clone, Copy)]
pub(super) enum Closing {
    Send,
    Recv,
    Listen,
}

pub(super) fn close_raw(net: &Net, raw: *mut c_void, what: Closing) -> Result<()> {
    let t = net.table();
    let (name, f) = match what {
        Closing::Send => ("closeSend", table_field!(t, t => t.closeSend)),
        Closing::Recv => ("closeRecv", table_field!(t, t => t.closeRecv)),
        Closing::Listen => ("closeListen", table_field!(t, t => t.closeListen)),
    };
    // SAFETY: a comm handle of the right kind, closed once (or a deliberately bad handle
    // from `from_raw`).
    let rc = unsafe { call(f, name)?(raw) };
    check(name, rc)
}

fn counters_raw(net: &Net, raw: *mut c_void) -> Result<Option<[RailCounters; 2]>> {
    let Some(f) = net.plugin.counters else { return Ok(None) };
    let mut out = [RailCounters::default(); 2];
    // SAFETY: room for two entries, as include/mpib.h asks.
    let rc = unsafe { f(raw, out.as_mut_ptr()) };
    check("mpib_comm_counters", rc)?;
    Ok(Some(out))
}

/// `regMr` of `[off, off + len)` of `arena` on `comm`.
fn reg_raw<'c>(net: &'c Net, comm: *mut c_void, arena: &'c Arena, off: usize, len: usize) -> Result<Mr<'c>> {
    if !arena.contains(off, len) {
        return Err(Error::usage(format!("regMr of [{off}, +{len}) outside the {}-byte arena", arena.len())));
    }
    let data = arena.addr(off).cast::<c_void>();
    let int_len = || c_int::try_from(len).map_err(|_| Error::usage(format!("regMr of {len} bytes: v6/v7 take an int")));
    let ty = consts::NCCL_PTR_HOST;
    let mut mh: *mut c_void = std::ptr::null_mut();
    // SAFETY: mapped memory that outlives the registration (the arena is borrowed for
    // 'c), a comm handle, a valid out-pointer.
    let rc = unsafe {
        match net.table() {
            Table::V6(t) => call(t.regMr, "regMr")?(comm, data, int_len()?, ty, &mut mh),
            Table::V7(t) => call(t.regMr, "regMr")?(comm, data, int_len()?, ty, &mut mh),
            Table::V8(t) => call(t.regMr, "regMr")?(comm, data, len, ty, &mut mh),
            Table::V9(t) => call(t.regMr, "regMr")?(comm, data, len, ty, &mut mh),
            Table::V10(t) => call(t.regMr, "regMr")?(comm, data, len, ty, &mut mh),
            Table::V11(t) => call(t.regMr, "regMr")?(comm, data, len, ty, &mut mh),
            Table::V12(t) => call(t.regMr, "regMr")?(comm, data, len, ty, &mut mh),
        }
    };
    check("regMr", rc)?;
    Ok(Mr { net, comm, raw: mh, arena, off, len, done: false })
}

/// A connected comm type and what send and receive comms share: the handle, `regMr`, the
/// counters, `close*` (also on drop), and `from_raw` for the negative tests.
macro_rules! comm {
    ($(#[$doc:meta])* $name:ident, $closing:expr, $close:literal) => {
        $(#[$doc])*
        pub struct $name<'n> {
            net: &'n Net,
            raw: *mut c_void,
            closed: bool,
        }

        impl<'n> $name<'n> {
            pub fn raw(&self) -> *mut c_void {
                self.raw
            }

            pub fn net(&self) -> &'n Net {
                self.net
            }

            /// `regMr` of the whole arena.
            pub fn reg_mr<'c>(&'c self, arena: &'c Arena) -> Result<Mr<'c>> {
                reg_raw(self.net, self.raw, arena, 0, arena.len())
            }

            /// `regMr` of `[off, off + len)` of the arena.
            pub fn reg_mr_range<'c>(&'c self, arena: &'c Arena, off: usize, len: usize) -> Result<Mr<'c>> {
                reg_raw(self.net, self.raw, arena, off, len)
            }

            /// The plugin's per-rail counters of this comm (`None`: not an mpib library).
            pub fn counters(&self) -> Result<Option<[RailCounters; 2]>> {
                counters_raw(self.net, self.raw)
            }

            #[doc = concat!("`", $close, "`.")]
            pub fn close(mut self) -> Result<()> {
                self.closed = true;
                close_raw(self.net, self.raw, $closing)
            }

            pub(super) fn new(net: &'n Net, raw: *mut c_void) -> $name<'n> {
                $name { net, raw, closed: false }
            }

            /// A comm from any handle value (negative tests).
            ///
            /// # Safety
            #[doc = concat!("As [`ListenComm::from_raw`]; dropping the result calls `", $close, "`.")]
            pub unsafe fn from_raw(net: &'n Net, raw: *mut c_void) -> $name<'n> {
                $name { net, raw, closed: false }
            }
        }

        impl Drop for $name<'_> {
            fn drop(&mut self) {
                if !self.closed {
                    let _ = close_raw(self.net, self.raw, $closing);
                }
            }
        }
    };
}

comm!(
    /// A connected send comm.
    SendComm,
    Closing::Send,
    "closeSend"
);

impl<'n> SendComm<'n> {
    /// `isend` of `len` bytes at `off` of `mr`'s memory with `tag`. `None` = the plugin
    /// cannot start it now (no matching receive yet): call again later.
    pub fn isend<'c>(&'c self, mr: &Mr<'c>, off: usize, len: usize, tag: i32) -> Result<Option<Request<'c>>> {
        let data = mr.addr_of(off, len)?.cast::<c_void>();
        let v = self.net.plugin.version();
        if v <= 8 && len > MAX_NET_SIZE_V8 {
            return Err(Error::usage(format!("isend of {len} bytes: NCCL refuses more than 1 GiB for v{v} plugins")));
        }
        let mut req: *mut c_void = std::ptr::null_mut();
        let (c, m) = (self.raw, mr.raw);
        let n = len as c_int;
        // SAFETY: memory inside a live registration (checked), the comm, a valid
        // out-pointer; the profiler handle is NULL as when NCCL's profiler is off.
        let rc = unsafe {
            match self.net.table() {
                Table::V6(t) => call(t.isend, "isend")?(c, data, n, tag, m, &mut req),
                Table::V7(t) => call(t.isend, "isend")?(c, data, n, tag, m, &mut req),
                Table::V8(t) => call(t.isend, "isend")?(c, data, n, tag, m, &mut req),
                Table::V9(t) => call(t.isend, "isend")?(c, data, len, tag, m, &mut req),
                Table::V10(t) => call(t.isend, "isend")?(c, data, len, tag, m, std::ptr::null_mut(), &mut req),
                Table::V11(t) => call(t.isend, "isend")?(c, data, len, tag, m, std::ptr::null_mut(), &mut req),
                Table::V12(t) => call(t.isend, "isend")?(c, data, len, tag, m, std::ptr::null_mut(), &mut req),
            }
        };
        check("isend", rc)?;
        Ok((!req.is_null()).then(|| Request::new(self.net, req, ReqKind::Send)))
    }
}

/// One buffer of a (multi-)receive: `len` bytes at `off` of `mr`, for the send with `tag`.
#[derive(Clone, Copy)]
pub struct RecvBuf<'a, 'c> {
    pub mr: &'a Mr<'c>,
    pub off: usize,
    pub len: usize,
    pub tag: i32,
}

comm!(
    /// A connected receive comm.
    RecvComm,
    Closing::Recv,
    "closeRecv"
);

impl<'n> RecvComm<'n> {
    /// `irecv` of 1 … 8 buffers completed by one request. `None` = call again later.
    /// For v9+ `*request` is pre-set to `NCCL_NET_OPTIONAL_RECV_COMPLETION`, as NCCL does,
    /// and a plugin that leaves it there breaks the contract.
    pub fn irecv<'c>(&'c self, bufs: &[RecvBuf<'_, 'c>]) -> Result<Option<Request<'c>>> {
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::usage(format!("irecv of {n} buffers: 1 … {MAX_RECVS}")));
        }
        let v = self.net.plugin.version();
        let mut data = [std::ptr::null_mut::<c_void>(); MAX_RECVS];
        let mut sizes = [0usize; MAX_RECVS];
        let mut isizes = [0 as c_int; MAX_RECVS];
        let mut tags = [0 as c_int; MAX_RECVS];
        let mut mhs = [std::ptr::null_mut::<c_void>(); MAX_RECVS];
        let mut phandles = [std::ptr::null_mut::<c_void>(); MAX_RECVS];
        for (i, b) in bufs.iter().enumerate() {
            data[i] = b.mr.addr_of(b.off, b.len)?.cast();
            if v <= 8 && b.len > MAX_NET_SIZE_V8 {
                return Err(Error::usage(format!("irecv of {} bytes: NCCL refuses more than 1 GiB for v{v}", b.len)));
            }
            sizes[i] = b.len;
            isizes[i] = b.len as c_int;
            tags[i] = b.tag;
            mhs[i] = b.mr.raw;
        }
        let mut req: *mut c_void = if v >= 9 { OPTIONAL_RECV } else { std::ptr::null_mut() };
        let (c, ni, d, tg, mh) = (self.raw, n as c_int, data.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr());
        let (s, si, ph) = (sizes.as_mut_ptr(), isizes.as_mut_ptr(), phandles.as_mut_ptr());
        // SAFETY: arrays of `n` valid entries (memory inside live registrations, checked),
        // the comm, a valid out-pointer; profiler handles NULL.
        let rc = unsafe {
            match self.net.table() {
                Table::V6(t) => call(t.irecv, "irecv")?(c, ni, d, si, tg, mh, &mut req),
                Table::V7(t) => call(t.irecv, "irecv")?(c, ni, d, si, tg, mh, &mut req),
                Table::V8(t) => call(t.irecv, "irecv")?(c, ni, d, si, tg, mh, &mut req),
                Table::V9(t) => call(t.irecv, "irecv")?(c, ni, d, s, tg, mh, &mut req),
                Table::V10(t) => call(t.irecv, "irecv")?(c, ni, d, s, tg, mh, ph, &mut req),
                Table::V11(t) => call(t.irecv, "irecv")?(c, ni, d, s, tg, mh, ph, &mut req),
                Table::V12(t) => call(t.irecv, "irecv")?(c, ni, d, s, tg, mh, ph, &mut req),
            }
        };
        check("irecv", rc)?;
        if req == OPTIONAL_RECV {
            return Err(Error::contract(
                "irecv",
                "left NCCL_NET_OPTIONAL_RECV_COMPLETION in *request (it must store a request or NULL)",
            ));
        }
        Ok((!req.is_null()).then(|| Request::new(self.net, req, ReqKind::Recv(n as u8))))
    }

    /// `iflush` of received buffers (sizes as `test` reported them). `None`: nothing to
    /// flush (host memory), as net_ib answers.
    pub fn iflush<'c>(&'c self, bufs: &[(&Mr<'c>, usize, usize)]) -> Result<Option<Request<'c>>> {
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::usage(format!("iflush of {n} buffers: 1 … {MAX_RECVS}")));
        }
        let mut data = [std::ptr::null_mut::<c_void>(); MAX_RECVS];
        let mut sizes = [0 as c_int; MAX_RECVS];
        let mut mhs = [std::ptr::null_mut::<c_void>(); MAX_RECVS];
        for (i, &(mr, off, len)) in bufs.iter().enumerate() {
            data[i] = mr.addr_of(off, len)?.cast();
            sizes[i] = c_int::try_from(len).map_err(|_| Error::usage("iflush sizes are int"))?;
            mhs[i] = mr.raw;
        }
        let mut req: *mut c_void = std::ptr::null_mut();
        let f = call(table_field!(self.net.table(), t => t.iflush), "iflush")?;
        // SAFETY: arrays of `n` valid entries, the comm, a valid out-pointer.
        let rc = unsafe { f(self.raw, n as c_int, data.as_mut_ptr(), sizes.as_mut_ptr(), mhs.as_mut_ptr(), &mut req) };
        check("iflush", rc)?;
        Ok((!req.is_null()).then(|| Request::new(self.net, req, ReqKind::Flush)))
    }
}

/// A memory registration on a comm. Dropping it calls `deregMr`.
pub struct Mr<'c> {
    net: &'c Net,
    comm: *mut c_void,
    raw: *mut c_void,
    arena: &'c Arena,
    off: usize,
    len: usize,
    done: bool,
}

impl<'c> Mr<'c> {
    pub fn raw(&self) -> *mut c_void {
        self.raw
    }

    pub fn arena(&self) -> &'c Arena {
        self.arena
    }

    /// The address of `[off, off + len)` of the arena, if the registration covers it.
    fn addr_of(&self, off: usize, len: usize) -> Result<*mut u8> {
        let end = off.checked_add(len);
        if off < self.off || end.is_none_or(|e| e > self.off + self.len) {
            return Err(Error::usage(format!(
                "[{off}, +{len}) lies outside the registration [{}, +{})",
                self.off, self.len
            )));
        }
        Ok(self.arena.addr(off))
    }

    /// `deregMr`.
    pub fn dereg(mut self) -> Result<()> {
        self.done = true;
        self.do_dereg()
    }

    fn do_dereg(&self) -> Result<()> {
        let f = call(table_field!(self.net.table(), t => t.deregMr), "deregMr")?;
        // SAFETY: the comm and memory handle regMr returned, deregistered once.
        check("deregMr", unsafe { f(self.comm, self.raw) })
    }

    /// A registration from any handle values (negative tests).
    ///
    /// # Safety
    /// As [`ListenComm::from_raw`]; a plugin may write into `arena` through a forged
    /// handle that happens to be valid. Dropping the result calls `deregMr`.
    pub unsafe fn from_raw(net: &'c Net, comm: *mut c_void, raw: *mut c_void, arena: &'c Arena) -> Mr<'c> {
        Mr { net, comm, raw, arena, off: 0, len: arena.len(), done: false }
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.do_dereg();
        }
    }
}

/// What a request is, for `test`'s sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqKind {
    Send,
    /// A receive of `n` buffers.
    Recv(u8),
    /// A flush: tested with `sizes = NULL`.
    Flush,
}

/// Sizes `test` reported for a completed request (`n` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub n: usize,
    pub sizes: [i32; MAX_RECVS],
}

impl Sizes {
    pub fn as_slice(&self) -> &[i32] {
        &self.sizes[..self.n]
    }
}

/// An in-flight request. Once `test` said done the plugin may recycle the handle, so the
/// driver never passes it again.
pub struct Request<'c> {
    net: &'c Net,
    raw: *mut c_void,
    kind: ReqKind,
    done: bool,
    _uses: PhantomData<&'c ()>,
}

impl<'c> Request<'c> {
    pub(super) fn new(net: &'c Net, raw: *mut c_void, kind: ReqKind) -> Self {
        Request { net, raw, kind, done: false, _uses: PhantomData }
    }

    pub fn raw(&self) -> *mut c_void {
        self.raw
    }

    pub fn kind(&self) -> ReqKind {
        self.kind
    }

    /// One `test`: `Some(sizes)` when done. Checks what NCCL relies on: `*done` is 0 or 1,
    /// a done receive wrote exactly its `n` sizes (each ≥ 0), a done send wrote `sizes[0]`
    /// only, a flush was tested with `sizes = NULL`.
    pub fn test(&mut self) -> Result<Option<Sizes>> {
        if self.done {
            return Err(Error::usage("test of a request that already completed"));
        }
        let n = match self.kind {
            ReqKind::Send => 1,
            ReqKind::Recv(n) => n as usize,
            ReqKind::Flush => 0,
        };
        let mut done: c_int = -7;
        let mut sizes = [SIZE_UNSET; MAX_RECVS];
        let sp = if self.kind == ReqKind::Flush { std::ptr::null_mut() } else { sizes.as_mut_ptr() };
        let f = call(table_field!(self.net.table(), t => t.test), "test")?;
        // SAFETY: the request handle (or a deliberately bad one from `from_raw`), valid
        // out-pointers; `sizes` has room for every buffer NCCL could ask about.
        let rc = unsafe { f(self.raw, &mut done, sp) };
        check("test", rc)?;
        match done {
            0 => Ok(None),
            1 => {
                self.done = true;
                if let Some(i) = (0..n).find(|&i| sizes[i] == SIZE_UNSET || sizes[i] < 0) {
                    return Err(Error::contract("test", format!("done, but sizes[{i}] = {} (of {n})", sizes[i])));
                }
                if let Some(i) = (n..MAX_RECVS).find(|&i| sizes[i] != SIZE_UNSET) {
                    return Err(Error::contract("test", format!("wrote sizes[{i}] of a request with {n} buffers")));
                }
                Ok(Some(Sizes { n, sizes }))
            }
            d => Err(Error::contract("test", format!("*done = {d}, expected 0 or 1"))),
        }
    }

    /// A request from any handle value (negative tests).
    ///
    /// # Safety
    /// As [`ListenComm::from_raw`].
    pub unsafe fn from_raw(net: &'c Net, raw: *mut c_void, kind: ReqKind) -> Request<'c> {
        Request::new(net, raw, kind)
    }
}
