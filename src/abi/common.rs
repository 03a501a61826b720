//! Entry points whose C signature is the same in several ABI versions, plus the helpers
//! every shim uses. Each one only converts C arguments and calls the single
//! implementation in `crate::plugin`, inside [`guard::run`].

use super::PROCESS;
use std::ffi::{c_int, c_void};

use ncclnet_types::types::*;

use super::args::{handle_buf, int_size, mem_type, non_null, out, ptr, raw, recv_count};
use super::guard::run;
use crate::error::{Error, Result};
use crate::plugin::{self, AbiVersion, BufArg, CommHandle, ContextHandle, ListenHandle, MemHandle, RequestHandle};

/// Shared body of every `listen`.
/// Shared body of every `listen`; `ctx`: v11+'s context (older ABIs have none).
pub fn listen_impl(
    abi: AbiVersion,
    ctx: Option<ContextHandle>,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: NCCL passes an out-pointer for the comm and a 128-byte handle buffer.
    let (comm_out, buf) = unsafe { (out(listen_comm, "listenComm")?, handle_buf(handle)?) };
    *comm_out = std::ptr::null_mut();
    *comm_out = ptr(Some(PROCESS.listen(abi, ctx, dev, buf)?.0));
    Ok(())
}

/// Shared body of every `connect`. `*send_comm` stays NULL until the connection is ready.
pub fn connect_impl(
    abi: AbiVersion,
    ctx: Option<ContextHandle>,
    dev: c_int,
    traffic_class: Option<c_int>,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut ncclNetDeviceHandle_v7_t,
) -> Result<()> {
    // SAFETY: NCCL passes an out-pointer for the comm and a 128-byte handle buffer.
    let (comm_out, buf) = unsafe { (out(send_comm, "sendComm")?, handle_buf(handle)?) };
    // SAFETY: a host-side plugin never gives NCCL a device handle; NULL is valid.
    if let Some(d) = unsafe { dev_comm.as_mut() } {
        *d = std::ptr::null_mut();
    }
    *comm_out = std::ptr::null_mut();
    *comm_out = ptr(PROCESS.connect(abi, ctx, dev, buf, traffic_class)?.map(|c| c.0));
    Ok(())
}

/// `accept(listenComm, recvComm)` (v6).
pub unsafe extern "C" fn accept_v6(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> ncclResult_t {
    // SAFETY: same contract as the v7+ form without a device handle.
    unsafe { accept(listen_comm, recv_comm, std::ptr::null_mut()) }
}

/// `accept(listenComm, recvComm, recvDevComm)` (v7+).
pub unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    dev_comm: *mut *mut ncclNetDeviceHandle_v7_t,
) -> ncclResult_t {
    run("accept", || {
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        let comm_out = unsafe { out(recv_comm, "recvComm") }?;
        // SAFETY: NULL or a valid out-pointer for the (never created) device handle.
        if let Some(d) = unsafe { dev_comm.as_mut() } {
            *d = std::ptr::null_mut();
        }
        *comm_out = std::ptr::null_mut();
        *comm_out = ptr(PROCESS.accept(ListenHandle(raw(listen_comm)))?.map(|c| c.0));
        Ok(())
    })
}

/// Shared body of every `regMr`.
pub fn reg_mr_impl(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
    let mh = unsafe { out(mhandle, "mhandle") }?;
    *mh = std::ptr::null_mut();
    *mh = ptr(Some(PROCESS.reg_mr(CommHandle(raw(comm)), raw(data), size, mem_type(ptr_type)?)?.0));
    Ok(())
}

/// `regMr` with a `size_t` size (v8+).
pub unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    run("regMr", || reg_mr_impl(comm, data, size, ptr_type, mhandle))
}

/// `regMr` with an `int` size (v6, v7).
pub unsafe extern "C" fn reg_mr_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    run("regMr", || reg_mr_impl(comm, data, int_size(size, "size")?, ptr_type, mhandle))
}

/// `regMrDmaBuf`, every version.
pub unsafe extern "C" fn reg_mr_dmabuf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    run("regMrDmaBuf", || {
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        let mh = unsafe { out(mhandle, "mhandle") }?;
        *mh = std::ptr::null_mut();
        let mem = mem_type(ptr_type)?;
        *mh = ptr(Some(PROCESS.reg_mr_dmabuf(CommHandle(raw(comm)), raw(data), size, mem, offset, fd)?.0));
        Ok(())
    })
}

/// `deregMr`, every version. `deregMr(comm, NULL)` is a no-op, as in net_ib.
pub unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    run("deregMr", || PROCESS.dereg_mr(CommHandle(raw(comm)), mem_handle(mhandle)))
}

/// Shared body of every `isend`. Always writes `*request` (NULL = retry later). Inlined
/// into each version's shim, as is the plugin call below it: one frame per NCCL call.
#[inline(always)]
pub fn isend_impl(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
    let req = unsafe { out(request, "request") }?;
    *req = std::ptr::null_mut();
    let (comm, mh) = (CommHandle(raw(comm)), MemHandle(raw(mhandle)));
    *req = ptr(PROCESS.isend_profiled(comm, raw(data), size, tag, mh, phandle as usize)?.map(|r| r.0));
    Ok(())
}

/// `isend` with an `int` size (v6 … v8).
pub unsafe extern "C" fn isend_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("isend", || isend_impl(comm, data, int_size(size, "size")?, tag, mhandle, std::ptr::null_mut(), request))
}

/// `isend` with a `size_t` size and a profiler handle (v10+), which profiler events of the
/// send carry (`profiler.rs`).
pub unsafe extern "C" fn isend_prof(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("isend", || isend_impl(comm, data, size, tag, mhandle, phandle, request))
}

/// Receive sizes of one `irecv`, converted from NCCL's `int*` or `size_t*`.
pub enum RecvSizes {
    Int(*const c_int),
    SizeT(*const usize),
}

/// Shared body of every `irecv`. Always overwrites `*request`: NULL (retry later) or the
/// request, never NCCL's `NCCL_NET_OPTIONAL_RECV_COMPLETION` marker. Inlined into each
/// version's shim: the `RecvSizes` kind then folds away.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn irecv_impl(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: RecvSizes,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
    let req = unsafe { out(request, "request") }?;
    *req = std::ptr::null_mut();
    let n = recv_count(n)?;
    let (data, tags, mhandles) = (non_null(data, "data")?, non_null(tags, "tags")?, non_null(mhandles, "mhandles")?);
    let sizes = match sizes {
        RecvSizes::Int(p) => RecvSizes::Int(non_null(p, "sizes")?),
        RecvSizes::SizeT(p) => RecvSizes::SizeT(non_null(p, "sizes")?),
    };
    // SAFETY: NCCL passes arrays of `n` elements (checked non-null above); the plugin asks
    // for `i < n` only.
    let buf = |i: usize| unsafe {
        Ok(BufArg {
            addr: raw(*data.add(i)),
            size: match sizes {
                RecvSizes::Int(p) => int_size(*p.add(i), "sizes[i]")?,
                RecvSizes::SizeT(p) => *p.add(i),
            },
            tag: *tags.add(i),
            mh: mem_handle(*mhandles.add(i)),
        })
    };
    // Read only where the connection reports profiler events. (A copy of the pointer: a
    // closure capturing it by reference keeps it in memory on every irecv.)
    let phandle = move |i: usize| {
        if phandles.is_null() {
            return 0;
        }
        // SAFETY: NCCL's v10+ irecv passes NULL or an array of `n` profiler handles; the
        // plugin asks for `i < n` only.
        unsafe { *phandles.add(i) as usize }
    };
    *req = ptr(PROCESS.irecv_profiled(CommHandle(raw(comm)), n, buf, phandle)?.map(|r| r.0));
    Ok(())
}

/// `irecv` with `int` sizes (v6 … v8).
pub unsafe extern "C" fn irecv_int(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("irecv", || irecv_impl(comm, n, data, RecvSizes::Int(sizes), tags, mhandles, std::ptr::null_mut(), request))
}

/// `irecv` with `size_t` sizes (v9).
pub unsafe extern "C" fn irecv_sizet(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("irecv", || irecv_impl(comm, n, data, RecvSizes::SizeT(sizes), tags, mhandles, std::ptr::null_mut(), request))
}

/// `irecv` with `size_t` sizes and profiler handles (v10+), which the profiler events of
/// each buffer carry (`profiler.rs`).
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn irecv_prof(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("irecv", || irecv_impl(comm, n, data, RecvSizes::SizeT(sizes), tags, mhandles, phandles, request))
}

/// `iflush`, every version (sizes stay `int*`).
pub unsafe extern "C" fn iflush(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    run("iflush", || {
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        let req = unsafe { out(request, "request") }?;
        *req = std::ptr::null_mut();
        let n = recv_count(n)?;
        let (data, sizes, mhandles) =
            (non_null(data, "data")?, non_null(sizes, "sizes")?, non_null(mhandles, "mhandles")?);
        let mut bufs = [BufArg::default(); plugin::MAX_RECVS];
        for (i, b) in bufs.iter_mut().enumerate().take(n) {
            // SAFETY: NCCL passes arrays of `n` elements (checked non-null above); `i < n`.
            *b = unsafe {
                BufArg {
                    addr: raw(*data.add(i)),
                    size: int_size(*sizes.add(i), "sizes[i]")?,
                    tag: 0,
                    mh: mem_handle(*mhandles.add(i)),
                }
            };
        }
        *req = ptr(PROCESS.iflush(CommHandle(raw(comm)), &bufs[..n])?.map(|r| r.0));
        Ok(())
    })
}

/// `test(request, done, sizes)`, every version. `sizes` may be NULL (flush requests).
pub unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t {
    run("test", || {
        // SAFETY: NCCL passes a valid out-pointer (NULL rejected).
        let done = unsafe { out(done, "done") }?;
        *done = 0;
        // (Given in place: an attribute may mark it inline only there.)
        let done_now = PROCESS.test_with(
            RequestHandle(raw(request)),
            #[inline(always)]
            |sz: &[u64]| {
                if !sizes.is_null() {
                    for (i, &s) in sz.iter().enumerate() {
                        let v = c_int::try_from(s)
                            .map_err(|_| Error::internal(format!("completed size {s} does not fit NCCL's int")))?;
                        // SAFETY: NCCL's array holds one int per buffer of the request
                        // (`sz.len()`: the request's receives, 1 for a send).
                        unsafe { *sizes.add(i) = v };
                    }
                }
                Ok(())
            },
        )?;
        if done_now {
            *done = 1;
        }
        Ok(())
    })
}

/// `closeSend`, every version.
pub unsafe extern "C" fn close_send(comm: *mut c_void) -> ncclResult_t {
    run("closeSend", || PROCESS.close_send(CommHandle(raw(comm))))
}

/// `closeRecv`, every version.
pub unsafe extern "C" fn close_recv(comm: *mut c_void) -> ncclResult_t {
    run("closeRecv", || PROCESS.close_recv(CommHandle(raw(comm))))
}

/// `closeListen`, every version.
pub unsafe extern "C" fn close_listen(comm: *mut c_void) -> ncclResult_t {
    run("closeListen", || PROCESS.close_listen(ListenHandle(raw(comm))))
}

/// A memory handle argument; NULL is "none" (allowed for empty buffers and `deregMr`).
#[inline(always)]
fn mem_handle(p: *mut c_void) -> Option<MemHandle> {
    if p.is_null() { None } else { Some(MemHandle(raw(p))) }
}
