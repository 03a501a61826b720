//! The one implementation behind every ABI version: global state (reference-counted
//! `init`/`finalize`), devices and their properties, and the ncclNet calls.
//!
//! Handles given to NCCL are opaque values checked on every call (see `handles.rs`), so a
//! bad or stale handle is a clear error, never a crash.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::config;
use crate::error::{Error, Result};

/// Most receives grouped in one `irecv` (`maxRecvs`).
pub const MAX_RECVS: usize = 8;

/// The ABI version a call came through. It decides the caller's limits (v6: 8 requests
/// in flight per comm, v7+: 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AbiVersion {
    V6 = 6,
    V7 = 7,
    V8 = 8,
    V9 = 9,
    V10 = 10,
    V11 = 11,
    V12 = 12,
}

impl AbiVersion {
    /// `NCCL_NET_MAX_REQUESTS` of the NCCL releases that use this version.
    pub fn max_requests(self) -> usize {
        if self == AbiVersion::V6 { 8 } else { 32 }
    }
}

/// A device's properties, one model for every version's struct.
#[derive(Clone, Copy, Debug)]
pub struct Properties {
    pub dev: c_int,
    pub name: &'static CStr,
    pub pci_path: Option<&'static CStr>,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: bool,
    pub force_flush: bool,
    pub speed_mbps: c_int,
    pub port: c_int,
    pub latency_us: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// Sizes reported by a completed `test`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completed {
    pub n: usize,
    pub sizes: [usize; MAX_RECVS],
}

struct Global {
    /// `init` calls not yet matched by `finalize`.
    refs: usize,
    /// Devices found by the first successful `init`; kept for the process lifetime so the
    /// name and PCI-path pointers NCCL holds stay valid.
    devices: Option<Vec<Properties>>,
    contexts: BTreeMap<u64, Context>,
}

/// What a v11/v12 `init(ctx, commId, config)` gives `listen`/`connect`.
struct Context {
    #[allow(dead_code)]
    comm_id: u64,
    traffic_class: Option<c_int>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global { refs: 0, devices: None, contexts: BTreeMap::new() });
static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// Validates the configuration, finds the devices (first time) and takes one reference.
/// Fails with one clear line when the configuration is bad or no device is usable, so that
/// NCCL falls back to its own transports.
pub fn init(abi: AbiVersion) -> Result<()> {
    let cfg = match config::get() {
        Ok(c) => c,
        Err(_) => {
            for line in config::errors() {
                log::warn!(target: "mpib::config", "{line}");
            }
            return Err(Error::invalid_argument(format!(
                "bad MPIB_* environment ({} variable(s), see the lines above); the plugin is disabled",
                config::errors().len()
            )));
        }
    };
    let mut g = GLOBAL.lock();
    if g.devices.is_none() {
        if let Some(w) = cfg.unknown_warning() {
            log::warn!(target: "mpib::config", "{w}");
        }
        log::info!(target: "mpib::config", "configuration: {cfg}");
        let devs = discover(cfg)?;
        log::info!(target: "mpib::abi", "initialized through ABI v{}: {} device(s)", abi as u32, devs.len());
        g.devices = Some(devs);
    }
    g.refs += 1;
    Ok(())
}

/// Finds the rail pairs of the configured fabric.
fn discover(cfg: &config::Config) -> Result<Vec<Properties>> {
    Err(Error::system(format!(
        "no usable network device: no fabric provider is built into this version of the plugin \
         (MPIB_FABRIC={:?}); NCCL will use its own transports",
        cfg.fabric
    )))
}

/// A v11/v12 context for one communicator.
pub fn new_context(comm_id: u64, traffic_class: Option<c_int>) -> *mut c_void {
    let id = NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed);
    let tc = traffic_class.filter(|&t| t >= 0);
    GLOBAL.lock().contexts.insert(id, Context { comm_id, traffic_class: tc });
    id as usize as *mut c_void
}

/// Checks a v11/v12 context; returns its traffic class.
pub fn check_context(ctx: *mut c_void) -> Result<Option<c_int>> {
    let g = GLOBAL.lock();
    g.contexts
        .get(&(ctx as usize as u64))
        .map(|c| c.traffic_class)
        .ok_or_else(|| Error::invalid_argument(format!("unknown plugin context {ctx:p} (not from init, or finalized)")))
}

/// Releases one `init` reference (v11/v12 `finalize(ctx)`).
pub fn finalize(ctx: *mut c_void) -> Result<()> {
    let mut g = GLOBAL.lock();
    if g.contexts.remove(&(ctx as usize as u64)).is_none() {
        return Err(Error::invalid_argument(format!("finalize: unknown plugin context {ctx:p}")));
    }
    g.refs = g.refs.saturating_sub(1);
    Ok(())
}

/// Hints from v11/v12 `setNetAttr`: accepted and logged at TRACE, like net_ib.
pub fn set_net_attr(ctx: *mut c_void, max_peers: i32, op: u32, algo: u32, proto: u32) -> Result<()> {
    check_context(ctx)?;
    log::trace!("setNetAttr: maxConcurrentPeers={max_peers} op={op} algo={algo} proto={proto} (hints only)");
    Ok(())
}

fn devices_or_err() -> Result<Vec<Properties>> {
    let g = GLOBAL.lock();
    match (&g.devices, g.refs) {
        (Some(d), r) if r > 0 => Ok(d.clone()),
        _ => Err(Error::invalid_usage("the plugin is not initialized (init did not succeed, or finalize was called)")),
    }
}

/// Number of devices (rail pairs).
pub fn device_count() -> Result<c_int> {
    Ok(devices_or_err()?.len() as c_int)
}

/// Properties of device `dev`.
pub fn properties(dev: c_int) -> Result<Properties> {
    let devs = devices_or_err()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| devs.get(i).copied())
        .ok_or_else(|| Error::invalid_argument(format!("device {dev} does not exist (there are {})", devs.len())))
}

fn no_data_path(call: &str) -> Error {
    Error::invalid_usage(format!("{call}: no device is available, so no communicator exists"))
}

pub fn listen(_abi: AbiVersion, dev: c_int, _handle: &mut [u8; 128]) -> Result<*mut c_void> {
    properties(dev)?;
    Err(no_data_path("listen"))
}

pub fn connect(_abi: AbiVersion, dev: c_int, _handle: &mut [u8; 128], _tc: Option<c_int>) -> Result<*mut c_void> {
    properties(dev)?;
    Err(no_data_path("connect"))
}

pub fn accept(_listen: *mut c_void) -> Result<*mut c_void> {
    Err(no_data_path("accept"))
}

pub fn reg_mr(_comm: *mut c_void, _data: *mut c_void, _size: usize, _ptr_type: c_int) -> Result<*mut c_void> {
    Err(no_data_path("regMr"))
}

pub fn reg_mr_dmabuf(
    _comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    _ptr_type: c_int,
    _offset: u64,
    _fd: c_int,
) -> Result<*mut c_void> {
    Err(no_data_path("regMrDmaBuf"))
}

pub fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> Result<()> {
    if mhandle.is_null() {
        return Ok(());
    }
    Err(no_data_path("deregMr"))
}

pub fn isend(
    _comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    _tag: c_int,
    _mh: *mut c_void,
) -> Result<*mut c_void> {
    Err(no_data_path("isend"))
}

pub fn irecv(
    _comm: *mut c_void,
    _data: &[*mut c_void],
    _sizes: &[usize],
    _tags: &[c_int],
    _mhandles: &[*mut c_void],
) -> Result<*mut c_void> {
    Err(no_data_path("irecv"))
}

pub fn iflush(
    _comm: *mut c_void,
    _data: &[*mut c_void],
    _sizes: &[usize],
    _mhandles: &[*mut c_void],
) -> Result<*mut c_void> {
    Err(no_data_path("iflush"))
}

pub fn test(_request: *mut c_void) -> Result<Option<Completed>> {
    Err(no_data_path("test"))
}

pub fn close_send(_comm: *mut c_void) -> Result<()> {
    Err(no_data_path("closeSend"))
}

pub fn close_recv(_comm: *mut c_void) -> Result<()> {
    Err(no_data_path("closeRecv"))
}

pub fn close_listen(_comm: *mut c_void) -> Result<()> {
    Err(no_data_path("closeListen"))
}
