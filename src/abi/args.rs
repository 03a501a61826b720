//! Arguments from C, checked and converted once at the edge: NULL pointers, negative
//! `int` sizes, receive counts, the 128-byte handle buffer. The checks run on every
//! data-path call: inlined, with their messages built out of line only on failure.

use std::ffi::{c_int, c_void};

use ncclnet_types::types::consts::{NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};

use crate::error::{Error, Result};
use crate::fabric::MemTypes;
use crate::plugin;

/// The value of a handle NCCL passes as `void*` (the plugin's typed handles wrap it).
#[inline(always)]
pub(super) fn raw(p: *mut c_void) -> u64 {
    p as usize as u64
}

/// A handle value as the `void*` NCCL keeps; `None` ("not yet") is NULL.
#[inline(always)]
pub(super) fn ptr(v: Option<u64>) -> *mut c_void {
    v.unwrap_or(0) as usize as *mut c_void
}

/// The memory type of one `NCCL_PTR_*` value (`regMr`'s `type`).
pub(super) fn mem_type(ptr_type: c_int) -> Result<MemTypes> {
    match ptr_type {
        NCCL_PTR_HOST => Ok(MemTypes::HOST),
        NCCL_PTR_CUDA => Ok(MemTypes::CUDA),
        NCCL_PTR_DMABUF => Ok(MemTypes::DMABUF),
        t => Err(Error::invalid_argument(format!(
            "memory type {t} is none of NCCL_PTR_HOST (1), NCCL_PTR_CUDA (2), NCCL_PTR_DMABUF (4)"
        ))),
    }
}

/// `ptrSupport`: the `NCCL_PTR_*` bits of the memory types a device registers.
pub(super) fn ptr_support(m: MemTypes) -> c_int {
    [(MemTypes::HOST, NCCL_PTR_HOST), (MemTypes::CUDA, NCCL_PTR_CUDA), (MemTypes::DMABUF, NCCL_PTR_DMABUF)]
        .iter()
        .filter(|(t, _)| m.contains(*t))
        .fold(0, |bits, (_, b)| bits | b)
}

/// `ptr` as `&mut T`, or an `InvalidArgument` error naming `what` when it is NULL.
///
/// # Safety
/// A non-null `ptr` must point to a valid, writable `T` for the call's duration.
#[inline(always)]
pub(super) unsafe fn out<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: the caller guarantees a non-null pointer is valid and writable.
    match unsafe { ptr.as_mut() } {
        Some(r) => Ok(r),
        None => Err(null_argument(what)),
    }
}

/// Copies a 128-byte handle buffer reference out of NCCL's `void*`.
///
/// # Safety
/// A non-null `handle` must point to `NCCL_NET_HANDLE_MAXSIZE` writable bytes.
pub(super) unsafe fn handle_buf<'a>(handle: *mut c_void) -> Result<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE]> {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { out(handle.cast::<[u8; NCCL_NET_HANDLE_MAXSIZE]>(), "handle") }
}

#[inline(always)]
pub(super) fn non_null<T>(p: *const T, what: &str) -> Result<*const T> {
    if p.is_null() { Err(null_argument(what)) } else { Ok(p) }
}

#[cold]
#[inline(never)]
fn null_argument(what: &str) -> Error {
    Error::invalid_argument(format!("{what} is NULL"))
}

#[inline(always)]
pub(super) fn recv_count(n: c_int) -> Result<usize> {
    if n < 1 || n as usize > plugin::MAX_RECVS {
        return Err(bad_recv_count(n));
    }
    Ok(n as usize)
}

#[cold]
#[inline(never)]
fn bad_recv_count(n: c_int) -> Error {
    Error::invalid_argument(format!(
        "n = {n} receives in one irecv/iflush; accepted 1 to {} (maxRecvs)",
        plugin::MAX_RECVS
    ))
}

#[inline(always)]
pub(super) fn int_size(size: c_int, what: &str) -> Result<usize> {
    if size >= 0 { Ok(size as usize) } else { Err(negative_size(size, what)) }
}

#[cold]
#[inline(never)]
fn negative_size(size: c_int, what: &str) -> Error {
    Error::invalid_argument(format!("{what} = {size} is negative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_types_convert_both_ways() {
        assert_eq!(mem_type(NCCL_PTR_HOST).unwrap(), MemTypes::HOST);
        assert_eq!(mem_type(NCCL_PTR_CUDA).unwrap(), MemTypes::CUDA);
        assert_eq!(mem_type(NCCL_PTR_DMABUF).unwrap(), MemTypes::DMABUF);
        for bad in [0, 3, 8, -1] {
            assert_eq!(mem_type(bad).unwrap_err().kind, crate::ErrorKind::InvalidArgument, "{bad}");
        }
        assert_eq!(ptr_support(MemTypes::HOST), 1);
        assert_eq!(ptr_support(MemTypes::all()), 7);
        assert_eq!(ptr_support(MemTypes::HOST | MemTypes::DMABUF), 5);
    }

    #[test]
    fn null_out_pointer_is_invalid_argument() {
        // SAFETY: NULL is handled without dereferencing.
        let e = unsafe { out::<i32>(std::ptr::null_mut(), "ndev") }.unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::InvalidArgument);
        assert!(e.msg().contains("ndev is NULL"));
    }
}
