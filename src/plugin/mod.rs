//! The one implementation behind every ABI version: global state (reference-counted
//! `init`/`finalize`), devices and their properties, and the ncclNet calls.
//!
//! Handles given to NCCL are opaque values checked on every call (see `handles.rs`), so a
//! bad or stale handle is a clear error, never a crash.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::config::{self, Config, FabricChoice};
use crate::engine::RailCounts;
use crate::error::{Error, Result};
use crate::fabric::MemTypes;

pub mod comm;
pub mod devices;
pub mod discover;
pub mod handles;
pub mod instance;
pub mod mr;
pub mod oob;
pub mod setup;
pub mod wire;

use crate::fabric::soft::SoftDevice;
use crate::fabric::verbs::{self, VerbsDevice};
use handles::Kind;
pub use handles::{CommHandle, ContextHandle, ListenHandle, MemHandle, RequestHandle};
use instance::Plugin;
use setup::FabricKind;

/// Most receives grouped in one `irecv` (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Size of the connection handle NCCL carries between the ranks (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_BYTES: usize = 128;

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
    pub dev: i32,
    pub name: &'static CStr,
    pub pci_path: Option<&'static CStr>,
    pub guid: u64,
    /// Memory NCCL may register (the ABI edge turns it into `ptrSupport`).
    pub mem_types: MemTypes,
    pub reg_is_global: bool,
    pub force_flush: bool,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: i32,
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
    traffic_class: Option<i32>,
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
        let pairs = discover::soft_pairs(cfg).map_err(|e| e.context("no usable network device"))?;
        Ok(Active::Soft(Plugin::new(kind, pairs, cfg)))
    };
    let verbs = || -> Result<Active> {
        let pairs =
            discover::verbs_pairs(cfg).map_err(|e| e.context("no usable network device (MPIB_FABRIC=verbs)"))?;
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
pub fn new_context(comm_id: u64, traffic_class: Option<i32>) -> ContextHandle {
    let id = NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed);
    let tc = traffic_class.filter(|&t| t >= 0);
    GLOBAL.lock().contexts.insert(id, Context { comm_id, traffic_class: tc });
    ContextHandle(id)
}

/// Checks a v11/v12 context; returns its traffic class.
pub fn check_context(ctx: ContextHandle) -> Result<Option<i32>> {
    let g = GLOBAL.lock();
    g.contexts.get(&ctx.0).map(|c| c.traffic_class).ok_or_else(|| {
        Error::invalid_argument(format!("unknown plugin context {:#x} (not from init, or finalized)", ctx.0))
    })
}

/// Releases one `init` reference (v11/v12 `finalize(ctx)`).
pub fn finalize(ctx: ContextHandle) -> Result<()> {
    let mut g = GLOBAL.lock();
    if g.contexts.remove(&ctx.0).is_none() {
        return Err(Error::invalid_argument(format!("finalize: unknown plugin context {:#x}", ctx.0)));
    }
    let _ = REFS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1));
    drop(g);
    crate::telemetry::stats_flush_now();
    Ok(())
}

/// Hints from v11/v12 `setNetAttr`: accepted and logged at TRACE, like net_ib.
pub fn set_net_attr(ctx: ContextHandle, max_peers: i32, op: u32, algo: u32, proto: u32) -> Result<()> {
    check_context(ctx)?;
    log::trace!("setNetAttr: maxConcurrentPeers={max_peers} op={op} algo={algo} proto={proto} (hints only)");
    Ok(())
}

/// Number of devices (rail pairs).
pub fn device_count() -> Result<usize> {
    Ok(device_count_of(active()?))
}

/// Properties of device `dev`.
pub fn properties(dev: i32) -> Result<Properties> {
    dispatch!(p => {
        usize::try_from(dev)
            .ok()
            .and_then(|i| p.devs.get(i))
            .map(|d| d.props)
            .ok_or_else(|| Error::invalid_argument(format!("device {dev} does not exist (there are {})", p.devs.len())))
    })
}

pub fn listen(abi: AbiVersion, dev: i32, handle: &mut [u8; HANDLE_BYTES]) -> Result<ListenHandle> {
    dispatch!(p => p.listen(abi, dev, handle))
}

/// `connect`: `None` until the connection is up (NCCL calls again with the same handle).
pub fn connect(
    abi: AbiVersion,
    dev: i32,
    handle: &mut [u8; HANDLE_BYTES],
    tc: Option<i32>,
) -> Result<Option<CommHandle>> {
    dispatch!(p => p.connect(abi, dev, handle, tc))
}

/// `accept`: `None` until a peer's connection is up.
pub fn accept(listen: ListenHandle) -> Result<Option<CommHandle>> {
    dispatch!(p => p.accept(listen))
}

/// `regMr` of `size` bytes at `addr`, of one memory type (host or CUDA).
pub fn reg_mr(comm: CommHandle, addr: u64, size: usize, mem: MemTypes) -> Result<MemHandle> {
    dispatch!(p => p.reg_mr(comm, addr, size, mem))
}

/// `regMrDmaBuf`: `size` bytes at `addr`, backed by `fd` at `offset`.
pub fn reg_mr_dmabuf(
    comm: CommHandle,
    addr: u64,
    size: usize,
    mem: MemTypes,
    offset: u64,
    fd: i32,
) -> Result<MemHandle> {
    dispatch!(p => p.reg_mr_dmabuf(comm, addr, size, mem, offset, fd))
}

/// `deregMr`; `None` (NCCL's NULL) is a no-op, as in net_ib.
pub fn dereg_mr(comm: CommHandle, mh: Option<MemHandle>) -> Result<()> {
    let Some(mh) = mh else { return Ok(()) };
    dispatch!(p => p.dereg_mr(comm, mh))
}

/// One buffer of an `irecv` or `iflush`: where, how large, its tag, its registration
/// (`None`: NCCL passed no handle, allowed for an empty buffer).
#[derive(Clone, Copy, Debug, Default)]
pub struct BufArg {
    pub addr: u64,
    pub size: usize,
    pub tag: i32,
    pub mh: Option<MemHandle>,
}

// The data-path calls below are inlined into the ABI shims (one frame per NCCL call).
/// `isend`: `None` means "not now" (no matching receive posted yet; NCCL retries).
#[inline(always)]
pub fn isend(comm: CommHandle, addr: u64, size: usize, tag: i32, mh: MemHandle) -> Result<Option<RequestHandle>> {
    dispatch!(p => p.isend(comm, addr, size, tag, mh))
}

/// `irecv` of `n` (1 … [`MAX_RECVS`]) buffers, `buf(i)` the i-th: `None` means "not now".
/// The buffers come through a function, not a slice, so that the ABI edge converts each
/// straight into the receive it becomes (no array of them in between on the data path).
#[inline(always)]
pub fn irecv(comm: CommHandle, n: usize, buf: impl Fn(usize) -> Result<BufArg>) -> Result<Option<RequestHandle>> {
    dispatch!(p => p.irecv(comm, n, &buf))
}

/// `iflush` of the buffers of a completed receive: `None` when nothing needs flushing.
pub fn iflush(comm: CommHandle, bufs: &[BufArg]) -> Result<Option<RequestHandle>> {
    dispatch!(p => p.iflush(comm, bufs))
}

/// `test`: once the request is done, its sizes are in `sizes` and their number is returned.
#[inline(always)]
pub fn test(request: RequestHandle, sizes: &mut [u64; MAX_RECVS]) -> Result<Option<usize>> {
    dispatch!(p => p.test(request, sizes))
}

pub fn close_send(comm: CommHandle) -> Result<()> {
    dispatch!(p => p.close(comm.0, Kind::Send))
}

pub fn close_recv(comm: CommHandle) -> Result<()> {
    dispatch!(p => p.close(comm.0, Kind::Recv))
}

pub fn close_listen(comm: ListenHandle) -> Result<()> {
    dispatch!(p => p.close(comm.0, Kind::Listen))
}

/// Per-rail counters of a send or receive comm (for tools and tests).
pub fn comm_counters(comm: CommHandle) -> Result<[RailCounts; 2]> {
    dispatch!(p => p.counters(comm))
}
