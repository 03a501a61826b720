//! The thin edge to libibverbs (through rdma-mummy-sys, which dlopens it): errno and error
//! messages, the device list, whether the library could be loaded at all, and the few
//! constants and structs the crate does not bind in a form that is safe to read.

use std::ffi::{CStr, c_int};

use rdma_mummy_sys as ibv;

use crate::error::Error;

/// `IBV_LINK_LAYER_*` (an anonymous enum in verbs.h that bindgen does not emit); 0 is
/// "unspecified", which old InfiniBand drivers report.
pub const LINK_LAYER_INFINIBAND: u8 = 1;
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// `struct ibv_async_event` with the event type as a plain integer: the crate's version
/// uses a Rust enum, and an event number newer than its headers would be undefined
/// behaviour to read into one. Same layout: a pointer-sized union, then a 4-byte enum.
#[repr(C)]
pub struct RawAsyncEvent {
    /// `element.cq / qp / srq / wq` (a pointer) or `element.port_num` (an int in the low bytes).
    pub element: usize,
    pub event_type: u32,
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The errno a verbs call that returns an int reported: libibverbs returns the errno value
/// itself from most calls (`ibv_modify_qp`, `ibv_post_send`), -1 with `errno` from others.
pub fn ret_errno(ret: c_int) -> i32 {
    if ret > 0 {
        ret
    } else {
        match errno() {
            0 => -ret,
            e => e,
        }
    }
}

/// `strerror(code)`, as std formats it ("Cannot allocate memory (os error 12)").
pub fn strerror(code: i32) -> String {
    std::io::Error::from_raw_os_error(code).to_string()
}

/// The error for a failed verbs call: the call, the device and port, `strerror(errno)`;
/// for ENOMEM, the locked-memory limit and whether it can be the cause (`memlock.rs`).
pub fn call_failed(call: &str, dev: &str, port: u8, code: i32) -> Error {
    if code == libc::ENOMEM {
        let hint = super::memlock::enomem_hint(&super::memlock::locked_memory());
        return Error::system(format!("{call} on {dev}:{port} failed: {}; {hint}", strerror(code)));
    }
    Error::system(format!("{call} on {dev}:{port} failed: {}", strerror(code)))
}

/// A C string from libibverbs (device names, `*_str` tables), or `fallback` for NULL.
///
/// # Safety
/// `p` is NULL or points at a NUL-terminated string that lives for `'static`
/// (libibverbs' string tables) or at least as long as the returned value is used.
pub unsafe fn c_str(p: *const std::ffi::c_char, fallback: &str) -> &str {
    if p.is_null() {
        return fallback;
    }
    // SAFETY: non-NULL and NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or(fallback)
}

/// Why `libibverbs.so.1` cannot be loaded, or `None` when it can. rdma-mummy-sys' stub
/// loads it silently in a constructor; loading it again only bumps a reference count and
/// gives `dlerror()`'s text when it fails.
pub fn libibverbs_load_error() -> Option<String> {
    // SAFETY: dlopen with a valid C string; the handle is closed right after.
    let h = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a thread-local string valid until the next dl* call.
        let why = unsafe { c_str(libc::dlerror(), "unknown dlopen error") }.to_string();
        return Some(why);
    }
    // SAFETY: h came from the dlopen above and is closed once.
    unsafe { libc::dlclose(h) };
    None
}

/// Whether the host's libibverbs defines `symbol` (a verb newer than some rdma-core
/// releases, e.g. `ibv_reg_mr_iova2` from IBVERBS_1.8): what net_ib checks before using one.
/// rdma-mummy-sys' stub hides the answer (it returns EOPNOTSUPP from the call), so the
/// library is asked directly.
pub fn libibverbs_has(symbol: &CStr) -> bool {
    // SAFETY: dlopen with a valid C string; RTLD_NOLOAD only finds the copy the stub loaded.
    let h = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return false;
    }
    // SAFETY: a live handle and a valid C string; the handle is closed once, right after.
    let found = unsafe { !libc::dlsym(h, symbol.as_ptr()).is_null() };
    // SAFETY: h came from the dlopen above.
    unsafe { libc::dlclose(h) };
    found
}

/// The result of `ibv_get_device_list`, freed on drop.
pub struct DeviceList {
    list: *mut *mut ibv::ibv_device,
    n: usize,
}

impl DeviceList {
    /// All verbs devices. The error (errno, text) says why there is no list at all
    /// (libibverbs missing, no uverbs in the kernel); an empty list is `Ok` with no devices.
    pub fn get() -> Result<DeviceList, (i32, String)> {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out pointer; the list is freed in Drop.
        let list = unsafe { ibv::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = errno();
            return Err((
                e,
                match e {
                    libc::ENOSYS => format!(
                        "ibv_get_device_list failed: {} (the kernel has no RDMA support: load ib_uverbs and a NIC driver)",
                        strerror(e)
                    ),
                    libc::EOPNOTSUPP if libibverbs_load_error().is_some() => format!(
                        "libibverbs.so.1 cannot be loaded: {} (install rdma-core's libibverbs1)",
                        libibverbs_load_error().unwrap_or_default()
                    ),
                    _ => format!("ibv_get_device_list failed: {}", strerror(e)),
                },
            ));
        }
        Ok(DeviceList { list, n: n.max(0) as usize })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The i-th device (i < len).
    pub fn device(&self, i: usize) -> *mut ibv::ibv_device {
        assert!(i < self.n);
        // SAFETY: the list holds n valid device pointers (checked above).
        unsafe { *self.list.add(i) }
    }

    /// The i-th device's name.
    pub fn name(&self, i: usize) -> String {
        // SAFETY: a device pointer from the list; the name lives as long as the list.
        unsafe { c_str(ibv::ibv_get_device_name(self.device(i)), "?") }.to_string()
    }

    /// Every device name, in the list's order.
    pub fn names(&self) -> Vec<String> {
        (0..self.n).map(|i| self.name(i)).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: list came from ibv_get_device_list and is freed once; devices opened from
        // it stay valid (libibverbs keeps a reference for each open context).
        unsafe { ibv::ibv_free_device_list(self.list) };
    }
}

/// An opened device context, closed on drop (used while probing ports).
pub struct OpenContext(pub *mut ibv::ibv_context);

impl OpenContext {
    pub fn open(dev: *mut ibv::ibv_device, name: &str) -> crate::Result<OpenContext> {
        // SAFETY: dev is a device from a live DeviceList.
        let ctx = unsafe { ibv::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(Error::system(format!("ibv_open_device({name}) failed: {}", strerror(errno()))));
        }
        Ok(OpenContext(ctx))
    }

    /// Gives the context up without closing it.
    pub fn into_raw(self) -> *mut ibv::ibv_context {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for OpenContext {
    fn drop(&mut self) {
        // SAFETY: an open context, closed once.
        unsafe { ibv::ibv_close_device(self.0) };
    }
}

/// `ibv_query_device_ex` (falls back to `ibv_query_device` inside the crate).
pub fn query_device(ctx: *mut ibv::ibv_context, name: &str) -> crate::Result<ibv::ibv_device_attr_ex> {
    // SAFETY: all-zero is a valid ibv_device_attr_ex (integers and plain structs).
    let mut attr: ibv::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open; NULL input is allowed; attr is a valid out buffer of its size.
    let ret = unsafe { ibv::ibv_query_device_ex(ctx, std::ptr::null(), &mut attr) };
    if ret != 0 {
        return Err(Error::system(format!("ibv_query_device on {name} failed: {}", strerror(ret_errno(ret)))));
    }
    Ok(attr)
}

/// `ibv_query_port`.
pub fn query_port(ctx: *mut ibv::ibv_context, name: &str, port: u8) -> crate::Result<ibv::ibv_port_attr> {
    // SAFETY: all-zero is a valid ibv_port_attr; the compat path fills only a prefix of it.
    let mut attr: ibv::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open; attr is a valid out buffer.
    let ret = unsafe { ibv::ibv_query_port(ctx, port, &mut attr) };
    if ret != 0 {
        return Err(call_failed("ibv_query_port", name, port, ret_errno(ret)));
    }
    Ok(attr)
}

/// The name libibverbs gives a port state ("PORT_ACTIVE", "PORT_DOWN", …).
pub fn port_state_str(state: u32) -> &'static str {
    match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

/// `IBV_PORT_ACTIVE`.
pub const PORT_ACTIVE: u32 = ibv::ibv_port_state::IBV_PORT_ACTIVE;

/// Whether registrations can ask for PCI relaxed ordering: libibverbs has
/// `ibv_reg_mr_iova2` (IBVERBS_1.8, rdma-core ≥ 29), which takes the access flag that
/// `ibv_reg_mr` cannot pass. The same test as net_ib's `ncclIbRelaxedOrderingCapable`. The
/// flag is an optional one: a device without relaxed ordering ignores it.
pub fn relaxed_ordering_available() -> bool {
    libibverbs_has(c"ibv_reg_mr_iova2")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enomem_names_the_locked_memory_limit() {
        let e = call_failed("ibv_create_srq(max_wr 16384)", "mlx5_0", 1, libc::ENOMEM);
        let m = e.msg();
        assert!(m.starts_with("ibv_create_srq(max_wr 16384) on mlx5_0:1 failed: Cannot allocate memory"), "{m}");
        assert!(m.contains("locked memory (RLIMIT_MEMLOCK) is"), "{m}");
        let e = call_failed("ibv_create_srq(max_wr 16384)", "mlx5_0", 1, libc::EINVAL);
        assert!(!e.msg().contains("RLIMIT_MEMLOCK"), "{e}");
    }
}
