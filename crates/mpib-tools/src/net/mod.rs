//! One safe API over the seven `ncclNet` versions: [`Plugin`] (a loaded table), [`Net`] (an
//! initialised plugin; a v11/v12 context), the comms, memory registrations and requests.
//!
//! Lifetimes carry NCCL's ordering rules: a comm cannot outlive its `Net` (finalize comes
//! last), a registration cannot outlive its comm or its memory, a request cannot outlive
//! its comm or the registration it uses. Handles are opaque and never forged, except
//! through the `unsafe fn from_raw` constructors that the negative tests use on purpose.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ffi::{Library, Table, VERSIONS, table_field};
use super::props::Props;
use super::{Error, Result, check};
use ncclnet_types::mpib::mpib_rail_counters_t;
use ncclnet_types::mpib::mpib_rail_stats_t;
use ncclnet_types::mpib::mpib_resource_stats_t;
use ncclnet_types::types::*;

mod comm;
mod fusion;
pub(crate) mod rails;
mod views;

use comm::{Closing, close_raw};
pub use comm::{Mr, RecvBuf, RecvComm, ReqKind, Request, SendComm, Sizes};
pub use rails::RailInfo;
pub use views::{NicStats, PeerStats, WorstBy};

/// `NCCL_NET_HANDLE_MAXSIZE`.
pub const HANDLE_BYTES: usize = consts::NCCL_NET_HANDLE_MAXSIZE;
/// `maxRecvs` NCCL can use (`NCCL_PROXY_MAX_SUBS` is larger; 8 is net_ib's and mpib's).
pub const MAX_RECVS: usize = 8;
/// NCCL rejects sends and receives above 1 GiB for v6 … v8 plugins (`MAX_NET_SIZE`).
pub const MAX_NET_SIZE_V8: usize = 1 << 30;
/// What the driver pre-fills `test`'s sizes with, to see which entries the plugin wrote.
pub(super) const SIZE_UNSET: c_int = i32::MIN + 0x5a5a;
/// `NCCL_NET_OPTIONAL_RECV_COMPLETION` as a `*request` value.
pub(super) const OPTIONAL_RECV: *mut c_void = consts::NCCL_NET_OPTIONAL_RECV_COMPLETION as *mut c_void;

type CountersFn = unsafe extern "C" fn(*mut c_void, *mut mpib_rail_counters_t) -> c_int;
type StatsFn = unsafe extern "C" fn(*mut mpib_rail_stats_t, usize) -> c_int;
type ResourcesFn = unsafe extern "C" fn(*mut mpib_resource_stats_t, usize) -> c_int;

/// Per-rail counters of a comm (`mpib_comm_counters`): index 0 SOUT, 1 SUP.
pub type RailCounters = mpib_rail_counters_t;
/// Per-rail statistics of the whole process (`mpib_rail_stats`): index 0 SOUT, 1 SUP.
pub type RailStats = mpib_rail_stats_t;
/// What the plugin holds now, process-wide (`mpib_resource_stats`).
pub type Resources = mpib_resource_stats_t;

/// A plugin library and the table of the ABI version chosen.
#[derive(Clone)]
pub struct Plugin {
    lib: Arc<Library>,
    table: Table,
    counters: Option<CountersFn>,
    stats: Option<StatsFn>,
}

impl Plugin {
    /// Loads `lib` (named as `NCCL_NET_PLUGIN` names it) and picks `version`, or the newest
    /// version it exports (as NCCL does).
    pub fn open(lib: &str, version: Option<u32>) -> Result<Plugin> {
        Plugin::from_library(Library::open_nccl_style(lib)?, version)
    }

    pub fn from_library(lib: Library, version: Option<u32>) -> Result<Plugin> {
        let table = match version {
            Some(v) if !VERSIONS.contains(&v) => {
                return Err(Error::usage(format!("ABI version v{v} is not one of v6 … v12")));
            }
            Some(v) => Table::find(&lib, v).ok_or_else(|| {
                Error::load(format!(
                    "{} does not export ncclNetPlugin_v{v} (it exports {:?})",
                    lib.name,
                    exported(&lib)
                ))
            })?,
            None => VERSIONS.iter().find_map(|&v| Table::find(&lib, v)).ok_or_else(|| {
                Error::load(format!("{} exports no ncclNetPlugin_v6 … ncclNetPlugin_v12 symbol", lib.name))
            })?,
        };
        let counters = lib.symbol(c"mpib_comm_counters").map(|p| {
            // SAFETY: mpib declares `mpib_comm_counters` with exactly this signature in
            // include/mpib.h; a symbol of that name in another library is assumed to match.
            unsafe { std::mem::transmute::<*mut c_void, CountersFn>(p) }
        });
        let stats = lib.symbol(c"mpib_rail_stats").map(|p| {
            // SAFETY: as above, `mpib_rail_stats` as include/mpib.h declares it.
            unsafe { std::mem::transmute::<*mut c_void, StatsFn>(p) }
        });
        Ok(Plugin { lib: Arc::new(lib), table, counters, stats })
    }

    /// The ABI version in use (6 … 12).
    pub fn version(&self) -> u32 {
        self.table.version()
    }

    /// The table's `name` (`"MPIB"`).
    pub fn name(&self) -> String {
        self.table.name()
    }

    /// The name the library was opened by.
    pub fn library(&self) -> &str {
        &self.lib.name
    }

    /// The versions the library exports, newest first.
    pub fn exported_versions(&self) -> Vec<u32> {
        exported(&self.lib)
    }

    /// `NCCL_NET_MAX_REQUESTS` of the NCCL releases that use this version: requests in
    /// flight per comm (a sender may have this many times `maxRecvs`).
    pub fn max_requests(&self) -> usize {
        if self.version() == 6 { 8 } else { 32 }
    }

    /// Whether the library exports `mpib_comm_counters`.
    pub fn has_counters(&self) -> bool {
        self.counters.is_some()
    }

    /// The process's per-rail statistics (`mpib_rail_stats`; `None`: the library does not
    /// export it). Process-wide: every connection of every `Net`, live or closed.
    pub fn rail_stats(&self) -> Result<Option<[RailStats; 2]>> {
        let Some(f) = self.stats else { return Ok(None) };
        let mut out = [RailStats::default(); 2];
        // SAFETY: two entries of the size we pass, as include/mpib.h asks.
        let rc = unsafe { f(out.as_mut_ptr(), std::mem::size_of::<RailStats>()) };
        check("mpib_rail_stats", rc)?;
        Ok(Some(out))
    }

    /// What the plugin holds now (`mpib_resource_stats`; `None`: the library does not
    /// export it). Process-wide.
    pub fn resource_stats(&self) -> Result<Option<Resources>> {
        // Looked up per call (it is not the data path), not kept in `Plugin`: a field more
        // there changes the code of inproc_msgs' measured loop (`net::fusion` likewise).
        let Some(p) = self.lib.symbol(c"mpib_resource_stats") else { return Ok(None) };
        // SAFETY: `mpib_resource_stats` as include/mpib.h declares it.
        let f = unsafe { std::mem::transmute::<*mut c_void, ResourcesFn>(p) };
        let mut out = Resources::default();
        // SAFETY: one entry of the size we pass, as include/mpib.h asks.
        let rc = unsafe { f(&mut out, std::mem::size_of::<Resources>()) };
        check("mpib_resource_stats", rc)?;
        Ok(Some(out))
    }

    /// `init`: once per communicator for v11/v12 (a new context each time); the other
    /// versions get the same call NCCL's shim makes once per process. The logger is NULL:
    /// stable Rust cannot define a C-variadic function, so the plugin logs to stderr.
    pub fn init(&self) -> Result<Net> {
        static COMM_ID: AtomicU64 = AtomicU64::new(1);
        let comm_id = (std::process::id() as u64) << 32 | COMM_ID.fetch_add(1, Ordering::Relaxed);
        let mut cfg = ncclNetCommConfig_v11_t { trafficClass: consts::NCCL_NET_TRAFFIC_CLASS_UNDEF };
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: every argument is what NCCL passes: valid out-pointers, a config that
        // lives for the call, NULL logger and profiler callbacks.
        let rc = unsafe {
            match self.table {
                Table::V6(t) => call(t.init, "init")?(None),
                Table::V7(t) => call(t.init, "init")?(None),
                Table::V8(t) => call(t.init, "init")?(None),
                Table::V9(t) => call(t.init, "init")?(None),
                Table::V10(t) => call(t.init, "init")?(None, None),
                Table::V11(t) => call(t.init, "init")?(&mut ctx, comm_id, &mut cfg, None, None),
                Table::V12(t) => call(t.init, "init")?(&mut ctx, comm_id, &mut cfg, None, None),
            }
        };
        check("init", rc)?;
        Ok(Net { plugin: self.clone(), ctx, finalized: false })
    }
}

fn exported(lib: &Library) -> Vec<u32> {
    VERSIONS.iter().copied().filter(|&v| Table::find(lib, v).is_some()).collect()
}

/// A mandatory table slot, or a contract error when the plugin left it NULL.
fn call<F>(f: Option<F>, name: &'static str) -> Result<F> {
    f.ok_or_else(|| Error::contract(name, "the plugin's table has a NULL pointer in this mandatory slot"))
}

/// An initialised plugin: what NCCL's `ncclNet` is for one communicator.
pub struct Net {
    plugin: Plugin,
    /// The v11/v12 context (NULL for older versions).
    ctx: *mut c_void,
    finalized: bool,
}

// SAFETY: NCCL calls a plugin from several threads at once (set-up from its service
// thread, data from its progress threads, several communicators' proxies), so an `init`
// context may be used from any thread by the ncclNet contract; `Net` holds only the table
// (static function pointers), the library (Send + Sync) and the context pointer.
unsafe impl Send for Net {}
// SAFETY: as above: every call takes `&self` and the plugin serializes what it must.
unsafe impl Sync for Net {}

impl Net {
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    fn table(&self) -> Table {
        self.plugin.table
    }

    /// `devices`.
    pub fn devices(&self) -> Result<i32> {
        let mut n: c_int = -1;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { call(table_field!(self.table(), t => t.devices), "devices")?(&mut n) };
        check("devices", rc)?;
        Ok(n)
    }

    /// `getProperties` through this version's struct.
    pub fn properties(&self, dev: i32) -> Result<Props> {
        macro_rules! get {
            ($t:expr, $ty:ty) => {{
                // SAFETY: all-zero bytes are a valid value of these plain C structs
                // (NULL pointers, zero numbers).
                let mut p: $ty = unsafe { std::mem::zeroed() };
                // SAFETY: a valid, writable struct of the version's type.
                let rc = unsafe { call($t.getProperties, "getProperties")?(dev, &mut p) };
                check("getProperties", rc)?;
                Props::from(&p)
            }};
        }
        Ok(match self.table() {
            Table::V6(t) => get!(t, ncclNetProperties_v6_t),
            Table::V7(t) => get!(t, ncclNetProperties_v7_t),
            Table::V8(t) => get!(t, ncclNetProperties_v8_t),
            Table::V9(t) => get!(t, ncclNetProperties_v9_t),
            Table::V10(t) => get!(t, ncclNetProperties_v10_t),
            Table::V11(t) => get!(t, ncclNetProperties_v11_t),
            Table::V12(t) => get!(t, ncclNetProperties_v12_t),
        })
    }

    /// `listen` on device `dev`: a listen comm and the handle to give the connecting peer.
    pub fn listen(&self, dev: i32) -> Result<ListenComm<'_>> {
        let mut handle = [0u8; HANDLE_BYTES];
        let mut comm: *mut c_void = std::ptr::null_mut();
        let h = handle.as_mut_ptr().cast::<c_void>();
        // SAFETY: a 128-byte handle buffer and a valid out-pointer, as NCCL passes.
        let rc = unsafe {
            match self.table() {
                Table::V6(t) => call(t.listen, "listen")?(dev, h, &mut comm),
                Table::V7(t) => call(t.listen, "listen")?(dev, h, &mut comm),
                Table::V8(t) => call(t.listen, "listen")?(dev, h, &mut comm),
                Table::V9(t) => call(t.listen, "listen")?(dev, h, &mut comm),
                Table::V10(t) => call(t.listen, "listen")?(dev, h, &mut comm),
                Table::V11(t) => call(t.listen, "listen")?(self.ctx, dev, h, &mut comm),
                Table::V12(t) => call(t.listen, "listen")?(self.ctx, dev, h, &mut comm),
            }
        };
        check("listen", rc)?;
        if comm.is_null() {
            return Err(Error::contract("listen", "returned ncclSuccess and a NULL listen comm"));
        }
        Ok(ListenComm { net: self, raw: comm, handle, closed: false })
    }

    /// A connection to the peer whose `listen` produced `handle`; call
    /// [`Connector::poll`] until it returns the send comm.
    pub fn connector(&self, dev: i32, handle: &[u8; HANDLE_BYTES]) -> Connector<'_> {
        Connector { net: self, dev, handle: *handle, config: ncclNetCommConfig_v10_t { trafficClass: -1 } }
    }

    /// `finalize` (v11/v12; nothing for older versions, as NCCL's shim).
    pub fn finalize(mut self) -> Result<()> {
        self.finalized = true;
        self.do_finalize()
    }

    fn do_finalize(&self) -> Result<()> {
        // SAFETY: the context `init` returned, finalized once.
        let rc = unsafe {
            match self.table() {
                Table::V11(t) => call(t.finalize, "finalize")?(self.ctx),
                Table::V12(t) => call(t.finalize, "finalize")?(self.ctx),
                _ => return Ok(()),
            }
        };
        check("finalize", rc)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if !self.finalized {
            let _ = self.do_finalize();
        }
    }
}

/// A listen comm and its handle.
pub struct ListenComm<'n> {
    net: &'n Net,
    raw: *mut c_void,
    handle: [u8; HANDLE_BYTES],
    closed: bool,
}

impl<'n> ListenComm<'n> {
    /// The handle `listen` filled, for the connecting peer.
    pub fn handle(&self) -> &[u8; HANDLE_BYTES] {
        &self.handle
    }

    pub fn raw(&self) -> *mut c_void {
        self.raw
    }

    /// One `accept` call: the receive comm once the connection is up, `None` = call again.
    pub fn accept(&mut self) -> Result<Option<RecvComm<'n>>> {
        let mut comm: *mut c_void = std::ptr::null_mut();
        let mut dev: *mut ncclNetDeviceHandle_v7_t = std::ptr::null_mut();
        // SAFETY: the live listen comm and valid out-pointers, as NCCL passes.
        let rc = unsafe {
            match self.net.table() {
                Table::V6(t) => call(t.accept, "accept")?(self.raw, &mut comm),
                Table::V7(t) => call(t.accept, "accept")?(self.raw, &mut comm, &mut dev),
                Table::V8(t) => call(t.accept, "accept")?(self.raw, &mut comm, &mut dev),
                Table::V9(t) => call(t.accept, "accept")?(self.raw, &mut comm, &mut dev),
                Table::V10(t) => call(t.accept, "accept")?(self.raw, &mut comm, &mut dev),
                Table::V11(t) => call(t.accept, "accept")?(self.raw, &mut comm, &mut dev),
                Table::V12(t) => call(t.accept, "accept")?(self.raw, &mut comm, &mut dev),
            }
        };
        let got = (!comm.is_null()).then(|| RecvComm::new(self.net, comm));
        check("accept", rc)?;
        Ok(got)
    }

    /// `closeListen` (NCCL closes the listen comm right after `accept` succeeded).
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        close_raw(self.net, self.raw, Closing::Listen)
    }

    /// A listen comm from any handle value (negative tests).
    ///
    /// # Safety
    /// Passing a value the plugin did not issue is undefined behaviour for a plugin that
    /// trusts its handles; mpib checks them. Dropping the result calls `closeListen`.
    pub unsafe fn from_raw(net: &'n Net, raw: *mut c_void) -> ListenComm<'n> {
        ListenComm { net, raw, handle: [0; HANDLE_BYTES], closed: false }
    }
}

/// Connects `connector` to `listen` from one thread, calling `connect` and `accept` in
/// turn as NCCL's same-thread set-up does (neither may block the other), then closes the
/// listen comm; a timeout error after `within`.
pub fn connect_same_thread<'n>(
    connector: &mut Connector<'n>,
    mut listen: ListenComm<'n>,
    within: std::time::Duration,
) -> Result<(SendComm<'n>, RecvComm<'n>)> {
    let (mut send, mut recv) = (None, None);
    let end = std::time::Instant::now() + within;
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = connector.poll()?;
        }
        if recv.is_none() {
            recv = listen.accept()?;
        }
        if std::time::Instant::now() > end {
            return Err(Error::timeout(format!("connect/accept did not finish in {within:?}")));
        }
    }
    listen.close()?;
    Ok((send.expect("connected"), recv.expect("accepted")))
}

impl Drop for ListenComm<'_> {
    fn drop(&mut self) {
        if !self.closed {
            let _ = close_raw(self.net, self.raw, Closing::Listen);
        }
    }
}

/// A non-blocking `connect` in progress. NCCL passes the same handle buffer on every
/// retry (plugins keep state in it), and so does this.
pub struct Connector<'n> {
    net: &'n Net,
    dev: i32,
    handle: [u8; HANDLE_BYTES],
    config: ncclNetCommConfig_v10_t,
}

impl<'n> Connector<'n> {
    /// One `connect` call: the send comm once the connection is up, `None` = call again.
    pub fn poll(&mut self) -> Result<Option<SendComm<'n>>> {
        let mut comm: *mut c_void = std::ptr::null_mut();
        let mut dev: *mut ncclNetDeviceHandle_v7_t = std::ptr::null_mut();
        let h = self.handle.as_mut_ptr().cast::<c_void>();
        let (d, ctx) = (self.dev, self.net.ctx);
        // SAFETY: the handle buffer (128 bytes, kept between calls), valid out-pointers,
        // a config that lives for the call, the v11/v12 context from init.
        let rc = unsafe {
            match self.net.table() {
                Table::V6(t) => call(t.connect, "connect")?(d, h, &mut comm),
                Table::V7(t) => call(t.connect, "connect")?(d, h, &mut comm, &mut dev),
                Table::V8(t) => call(t.connect, "connect")?(d, h, &mut comm, &mut dev),
                Table::V9(t) => call(t.connect, "connect")?(d, h, &mut comm, &mut dev),
                Table::V10(t) => call(t.connect, "connect")?(d, &mut self.config, h, &mut comm, &mut dev),
                Table::V11(t) => call(t.connect, "connect")?(ctx, d, h, &mut comm, &mut dev),
                Table::V12(t) => call(t.connect, "connect")?(ctx, d, h, &mut comm, &mut dev),
            }
        };
        // As NCCL: a failed connect that still returned a comm gets closeSend.
        let got = (!comm.is_null()).then(|| SendComm::new(self.net, comm));
        check("connect", rc)?;
        Ok(got)
    }
}
