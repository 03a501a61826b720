//! The plugin through its exported `ncclNetPlugin_v8` table: the entry points NCCL calls,
//! with their C types (`size_t` sizes, `void*` handles), so the tests reach the plugin the
//! way a hostile NCCL argument would.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use ncclnet_types::ncclNet_v8_t;

pub const NCCL_PTR_HOST: c_int = 0x1;

/// `ncclResult_t` of a failed call.
pub type Code = i32;

/// A handle the plugin returned (comm, memory handle or request).
pub type Handle = *mut c_void;

pub struct Net {
    t: &'static ncclNet_v8_t,
}

impl Net {
    /// `init` with no NCCL logger (the plugin then logs to stderr).
    pub fn init() -> Net {
        let t = &mpib::abi::ncclNetPlugin_v8;
        // SAFETY: the plugin's own exported table; a NULL logger is allowed (the tools pass it).
        let rc = unsafe { (t.init.unwrap())(None) };
        assert_eq!(rc, 0, "init");
        Net { t }
    }

    /// `listen` on device `dev`: the 128-byte handle and the listen comm.
    pub fn listen(&self, dev: c_int) -> ([u8; 128], Handle) {
        let mut handle = [0u8; 128];
        let mut l = null_mut();
        // SAFETY: a 128-byte handle buffer (NCCL_NET_HANDLE_MAXSIZE) and an out pointer.
        let rc = unsafe { (self.t.listen.unwrap())(dev, handle.as_mut_ptr().cast(), &mut l) };
        assert_eq!(rc, 0, "listen");
        (handle, l)
    }

    /// One `connect` call: `Ok(None)` until the send comm is up.
    pub fn connect(&self, dev: c_int, handle: &mut [u8; 128]) -> Result<Option<Handle>, Code> {
        let mut c = null_mut();
        // SAFETY: the handle buffer NCCL would pass again and again; out pointers.
        let rc = unsafe { (self.t.connect.unwrap())(dev, handle.as_mut_ptr().cast(), &mut c, null_mut()) };
        if rc != 0 { Err(rc) } else { Ok((!c.is_null()).then_some(c)) }
    }

    /// One `accept` call: `Ok(None)` until a receive comm is up.
    pub fn accept(&self, listen: Handle) -> Result<Option<Handle>, Code> {
        let mut c = null_mut();
        // SAFETY: a listen comm from `listen`; out pointers.
        let rc = unsafe { (self.t.accept.unwrap())(listen, &mut c, null_mut()) };
        if rc != 0 { Err(rc) } else { Ok((!c.is_null()).then_some(c)) }
    }

    pub fn close_listen(&self, listen: Handle) {
        // SAFETY: a listen comm from `listen`.
        assert_eq!(unsafe { (self.t.closeListen.unwrap())(listen) }, 0, "closeListen");
    }

    pub fn close_send(&self, c: Handle) {
        // SAFETY: a send comm from `connect`.
        assert_eq!(unsafe { (self.t.closeSend.unwrap())(c) }, 0, "closeSend");
    }

    pub fn close_recv(&self, c: Handle) {
        // SAFETY: a receive comm from `accept`.
        assert_eq!(unsafe { (self.t.closeRecv.unwrap())(c) }, 0, "closeRecv");
    }

    /// `regMr(comm, data, size, NCCL_PTR_HOST)`; `data` any address at all.
    pub fn reg_mr(&self, comm: Handle, data: u64, size: usize) -> Result<Handle, Code> {
        let mut mh = null_mut();
        // SAFETY: the plugin must not touch `data` at registration in a way that can fault
        // (that is what these tests check); out pointer.
        let rc = unsafe { (self.t.regMr.unwrap())(comm, data as *mut c_void, size, NCCL_PTR_HOST, &mut mh) };
        if rc != 0 { Err(rc) } else { Ok(mh) }
    }

    pub fn dereg_mr(&self, comm: Handle, mh: Handle) -> Result<(), Code> {
        // SAFETY: a comm and a memory handle the plugin returned.
        let rc = unsafe { (self.t.deregMr.unwrap())(comm, mh) };
        if rc != 0 { Err(rc) } else { Ok(()) }
    }

    /// `irecv` of one buffer.
    pub fn irecv(&self, comm: Handle, data: u64, size: c_int, tag: c_int, mh: Handle) -> Result<Option<Handle>, Code> {
        let (mut d, mut s, mut t, mut m) = (data as *mut c_void, size, tag, mh);
        let mut req = null_mut();
        // SAFETY: arrays of one element each, as NCCL passes them; out pointer.
        let rc = unsafe { (self.t.irecv.unwrap())(comm, 1, &mut d, &mut s, &mut t, &mut m, &mut req) };
        if rc != 0 { Err(rc) } else { Ok((!req.is_null()).then_some(req)) }
    }

    /// `isend` of one buffer.
    pub fn isend(&self, comm: Handle, data: u64, size: c_int, tag: c_int, mh: Handle) -> Result<Option<Handle>, Code> {
        let mut req = null_mut();
        // SAFETY: a comm and memory handle the plugin returned; out pointer.
        let rc = unsafe { (self.t.isend.unwrap())(comm, data as *mut c_void, size, tag, mh, &mut req) };
        if rc != 0 { Err(rc) } else { Ok((!req.is_null()).then_some(req)) }
    }

    /// `test`: `Ok(Some(size))` once done.
    pub fn test(&self, req: Handle) -> Result<Option<c_int>, Code> {
        let (mut done, mut size) = (0, -1);
        // SAFETY: a request the plugin returned; out pointers.
        let rc = unsafe { (self.t.test.unwrap())(req, &mut done, &mut size) };
        if rc != 0 { Err(rc) } else { Ok((done != 0).then_some(size)) }
    }
}
