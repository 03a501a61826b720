//! The one implementation behind every ABI version: global state (reference-counted
//! `init`/`finalize`), devices and their properties, and the ncclNet calls.
//!
//! Handles given to NCCL are opaque values checked on every call (see `handles.rs`), so a
//! bad or stale handle is a clear error, never a crash.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::config::{self, Config, FabricChoice};
use crate::engine::RailCounts;
use crate::error::{Error, Result};

pub mod comm;
pub mod devices;
pub mod handles;
pub mod instance;
pub mod mr;
pub mod oob;
pub mod setup;
pub mod wire;

use crate::fabric::soft::{self, SoftDevice};
use crate::fabric::verbs::{self, VerbsDevice};
use handles::Kind;
use instance::Plugin;
use setup::FabricKind;

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

struct Global {
    contexts: BTreeMap<u64, Context>,
}

/// `init` calls not yet matched by `finalize`. An atomic, not under `GLOBAL`: every data-path
/// call reads it, and a read-only shared word costs nothing where a shared lock would.
static REFS: AtomicUsize = AtomicUsize::new(0);

/// What a v11/v12 `init(ctx, commId, config)` gives `listen`/`connect`.
struct Context {
    #[allow(dead_code)]
    comm_id: u64,
    traffic_class: Option<c_int>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global { contexts: BTreeMap::new() });
static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// The plugin over the provider chosen at the first successful `init`. Devices stay open
/// for the process lifetime (NCCL holds pointers into their properties), as net_ib's do.
enum Active {
    Soft(Plugin<SoftDevice>),
    Verbs(Plugin<VerbsDevice>),
}

static ACTIVE: OnceLock<Active> = OnceLock::new();

/// Runs `$body` with `$p` bound to the active `Plugin<D>`, whatever its provider.
macro_rules! dispatch {
    ($p:ident => $body:expr) => {{
        match active()? {
            Active::Soft($p) => $body,
            Active::Verbs($p) => $body,
        }
    }};
}

fn active() -> Result<&'static Active> {
    match ACTIVE.get() {
        Some(a) if REFS.load(Ordering::Relaxed) > 0 => Ok(a),
        _ => Err(Error::invalid_usage("the plugin is not initialized (init did not succeed, or finalize was called)")),
    }
}

/// Validates the configuration, opens the devices (first time) and takes one reference.
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
    let _g = GLOBAL.lock(); // one init at a time opens the devices
    if ACTIVE.get().is_none() {
        if let Some(w) = cfg.unknown_warning() {
            log::warn!(target: "mpib::config", "{w}");
        }
        log::info!(target: "mpib::config", "configuration: {cfg}");
        let a = open(cfg)?;
        let _ = ACTIVE.set(a);
        if let Err(e) = crate::telemetry::start_stats_export(cfg) {
            log::warn!("statistics file: {e}");
        }
        log::info!(target: "mpib::abi", "initialized through ABI v{}: {} device(s)", abi as u32, device_count_of(ACTIVE.get().expect("set")));
    }
    REFS.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Opens the configured fabric's rail pairs.
fn open(cfg: &'static Config) -> Result<Active> {
    let soft = |kind: FabricKind| -> Result<Active> {
        let pairs = soft::open_rail_pairs(cfg).map_err(|e| e.context("no usable network device"))?;
        Ok(Active::Soft(Plugin::new(kind, pairs, cfg)))
    };
    let verbs = || -> Result<Active> {
        let pairs =
            verbs::open_rail_pairs(cfg).map_err(|e| e.context("no usable network device (MPIB_FABRIC=verbs)"))?;
        Ok(Active::Verbs(Plugin::new(FabricKind::Verbs, pairs, cfg)))
    };
    match cfg.fabric {
        FabricChoice::Soft => soft(FabricKind::Soft),
        FabricChoice::Inproc => soft(FabricKind::Inproc),
        FabricChoice::Verbs => verbs(),
        FabricChoice::Auto => match verbs::unavailable_reason() {
            None => verbs(),
            Some(why) => {
                log::info!(target: "mpib::abi", "RDMA verbs unavailable ({why}); using the soft fabric (TCP)");
                soft(FabricKind::Soft)
            }
        },
    }
}

fn device_count_of(a: &Active) -> usize {
    match a {
        Active::Soft(p) => p.devs.len(),
        Active::Verbs(p) => p.devs.len(),
    }
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
    let _ = REFS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1));
    drop(g);
    crate::telemetry::stats_flush_now();
    Ok(())
}

/// Hints from v11/v12 `setNetAttr`: accepted and logged at TRACE, like net_ib.
pub fn set_net_attr(ctx: *mut c_void, max_peers: i32, op: u32, algo: u32, proto: u32) -> Result<()> {
    check_context(ctx)?;
    log::trace!("setNetAttr: maxConcurrentPeers={max_peers} op={op} algo={algo} proto={proto} (hints only)");
    Ok(())
}

/// Number of devices (rail pairs).
pub fn device_count() -> Result<c_int> {
    Ok(device_count_of(active()?) as c_int)
}

/// Properties of device `dev`.
pub fn properties(dev: c_int) -> Result<Properties> {
    dispatch!(p => {
        usize::try_from(dev)
            .ok()
            .and_then(|i| p.devs.get(i))
            .map(|d| d.props)
            .ok_or_else(|| Error::invalid_argument(format!("device {dev} does not exist (there are {})", p.devs.len())))
    })
}

fn ptr(v: u64) -> *mut c_void {
    v as usize as *mut c_void
}

pub fn listen(abi: AbiVersion, dev: c_int, handle: &mut [u8; 128]) -> Result<*mut c_void> {
    dispatch!(p => p.listen(abi, dev, handle).map(ptr))
}

pub fn connect(abi: AbiVersion, dev: c_int, handle: &mut [u8; 128], tc: Option<c_int>) -> Result<*mut c_void> {
    dispatch!(p => p.connect(abi, dev, handle, tc).map(ptr))
}

pub fn accept(listen: *mut c_void) -> Result<*mut c_void> {
    dispatch!(p => p.accept(listen).map(ptr))
}

pub fn reg_mr(comm: *mut c_void, data: *mut c_void, size: usize, ptr_type: c_int) -> Result<*mut c_void> {
    dispatch!(p => p.reg_mr(comm, data, size, ptr_type).map(ptr))
}

pub fn reg_mr_dmabuf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
) -> Result<*mut c_void> {
    dispatch!(p => p.reg_mr_dmabuf(comm, data, size, ptr_type, offset, fd).map(ptr))
}

pub fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> Result<()> {
    if mhandle.is_null() {
        return Ok(());
    }
    dispatch!(p => p.dereg_mr(comm, mhandle))
}

// The data-path calls below are inlined into the ABI shims (one frame per NCCL call).
#[inline(always)]
pub fn isend(comm: *mut c_void, data: *mut c_void, size: usize, tag: c_int, mh: *mut c_void) -> Result<*mut c_void> {
    dispatch!(p => p.isend(comm, data, size, tag, mh).map(ptr))
}

#[inline(always)]
pub fn irecv(
    comm: *mut c_void,
    data: &[*mut c_void],
    sizes: &[usize],
    tags: &[c_int],
    mhandles: &[*mut c_void],
) -> Result<*mut c_void> {
    dispatch!(p => p.irecv(comm, data, sizes, tags, mhandles).map(ptr))
}

pub fn iflush(
    comm: *mut c_void,
    data: &[*mut c_void],
    sizes: &[usize],
    mhandles: &[*mut c_void],
) -> Result<*mut c_void> {
    dispatch!(p => p.iflush(comm, data, sizes, mhandles).map(ptr))
}

/// `test`: once the request is done, its sizes are in `sizes` and their number is returned.
#[inline(always)]
pub fn test(request: *mut c_void, sizes: &mut [u64; MAX_RECVS]) -> Result<Option<usize>> {
    dispatch!(p => p.test(request, sizes))
}

pub fn close_send(comm: *mut c_void) -> Result<()> {
    dispatch!(p => p.close(comm, Kind::Send))
}

pub fn close_recv(comm: *mut c_void) -> Result<()> {
    dispatch!(p => p.close(comm, Kind::Recv))
}

pub fn close_listen(comm: *mut c_void) -> Result<()> {
    dispatch!(p => p.close(comm, Kind::Listen))
}

/// Per-rail counters of a send or receive comm (for tools and tests).
pub fn comm_counters(comm: *mut c_void) -> Result<[RailCounts; 2]> {
    dispatch!(p => p.counters(comm))
}
