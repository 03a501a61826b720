//! The plugin as one process sees it: the provider opened at the first `init`, the `init`
//! references not yet finalized, and every call NCCL makes, dispatched to the
//! [`Plugin`] of that provider. One instance serves the process (the ABI edge holds it);
//! a test may make its own, with its own configuration.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::banner::{self, PairDesc};
use super::describe::{self, Describe, RailDesc};
use super::handles::{CommHandle, ContextHandle, Kind, ListenHandle, MemHandle, RequestHandle};
use super::instance::Plugin;
use super::instance_state::InstanceState;
use super::resources::{Counts, Resources};
use super::setup::{self, FabricKind};
use super::{AbiVersion, BufArg, HANDLE_BYTES, MAX_RECVS, NcclEnv, Properties, discover, memlock, profile};
use crate::config::{Config, FabricChoice, RelaxedOrdering};
use crate::engine::RailCounts;
use crate::error::{Error, Result};
use crate::fabric::MemTypes;
use crate::fabric::soft::SoftDevice;
use crate::fabric::verbs::{self, Availability, VerbsDevice};
use crate::telemetry::Registry;

/// The plugin over the provider chosen at the first successful `init`. Devices stay open
/// for the process lifetime (NCCL holds pointers into their properties), as net_ib's do.
enum Active {
    Soft(Plugin<SoftDevice>),
    Verbs(Plugin<VerbsDevice>),
}

/// Runs `$body` with `$p` bound to the active `Plugin<D>`, whatever its provider.
macro_rules! dispatch {
    ($self:ident, $p:ident => $body:expr) => {{
        match $self.active()? {
            Active::Soft($p) => $body,
            Active::Verbs($p) => $body,
        }
    }};
}

/// One process's plugin (see the module comment).
pub struct Process {
    /// `init` calls not yet matched by `finalize`. An atomic, not under `global`: every
    /// data-path call reads it, and a read-only shared word costs nothing where a shared
    /// lock would.
    refs: AtomicUsize,
    /// Serializes `init`s (the first opens the devices).
    global: Mutex<()>,
    next_context: AtomicU64,
    /// The configuration, loaded at the first `init` (bad: its per-variable lines).
    config: OnceLock<std::result::Result<Config, Vec<String>>>,
    active: OnceLock<Active>,
    /// What its contexts and connections share: resource counts (`mpib_resource_stats`),
    /// statistics registry and files (`mpib_rail_stats`), in-process listeners.
    state: InstanceState,
}

impl Default for Process {
    fn default() -> Self {
        Process::new()
    }
}

impl Process {
    pub const fn new() -> Process {
        Process {
            refs: AtomicUsize::new(0),
            global: Mutex::new(()),
            next_context: AtomicU64::new(1),
            config: OnceLock::new(),
            active: OnceLock::new(),
            state: InstanceState::new(),
        }
    }

    /// What this instance holds now: comms, contexts, fabric objects (`mpib_resource_stats`).
    pub fn resources(&self) -> Resources {
        self.state.counts.snapshot()
    }

    /// The counts this instance's objects hold amounts of.
    pub fn counts(&'static self) -> &'static Counts {
        &self.state.counts
    }

    /// This instance's rail statistics (`mpib_rail_stats`, the statistics files).
    pub fn stats(&'static self) -> &'static Registry {
        &self.state.stats
    }

    fn active(&self) -> Result<&Active> {
        match self.active.get() {
            Some(a) if self.refs.load(Ordering::Relaxed) > 0 => Ok(a),
            _ => Err(Error::invalid_usage(
                "the plugin is not initialized (init did not succeed, or finalize was called)",
            )),
        }
    }

    /// Validates the configuration, opens the devices (first time) and takes one reference.
    /// Fails with one clear line when the configuration is bad or no device is usable, so that
    /// NCCL falls back to its own transports. Returns what NCCL should be told through its
    /// environment: for ABI v9+ with rail pairs shown as NICs, `NCCL_NET_FORCE_MERGE` naming
    /// the pairs (`devices.rs`).
    /// The configuration comes from `load`, called at the first `init` only (the ABI edge
    /// reads the environment; a test passes its own).
    pub fn init(
        &'static self,
        abi: AbiVersion,
        load: impl FnOnce() -> std::result::Result<Config, Vec<String>>,
    ) -> Result<Option<NcclEnv>> {
        let cfg = match self.config.get_or_init(load) {
            Ok(c) => c,
            Err(lines) => {
                for line in lines {
                    log::warn!(target: "mpib::config", "{line}");
                }
                return Err(Error::invalid_argument(format!(
                    "bad configuration ({} variable(s), see the lines above); the plugin is disabled",
                    lines.len()
                )));
            }
        };
        let _g = self.global.lock(); // one init at a time opens the devices
        if self.active.get().is_none() {
            if let Some(w) = cfg.unknown_warning() {
                log::warn!(target: "mpib::config", "{w}");
            }
            for w in &cfg.ignored {
                log::warn!(target: "mpib::config", "{w}");
            }
            for i in &cfg.not_applicable {
                log::info!(target: "mpib::config", "{i}");
            }
            log::info!(target: "mpib::config", "configuration: {cfg}");
            let grace = std::time::Duration::from_millis(if cfg.failover { cfg.outage_grace_ms() } else { 0 });
            let bound = |kind| setup::silent_peer_bound(&setup::Params::new(cfg, kind, abi, None).send[0]) + grace;
            log::info!(
                target: "mpib::config",
                "a peer that stops answering (frozen, host down) is reported within {:.1?} on verbs, {:.1?} on the soft fabric (timeout {} from {}, at least 16 on the soft fabric; retry count {} from {}; then the outage grace, {:.1?}); a killed one as soon as its set-up channel closes (verbs: once RC gives up, {:.1?}), on the soft fabric at once",
                bound(FabricKind::Verbs),
                bound(FabricKind::Soft),
                cfg.timeout,
                cfg.origin("MPIB_TIMEOUT", 2),
                cfg.retry_cnt,
                cfg.origin("MPIB_RETRY_CNT", 2),
                grace,
                bound(FabricKind::Verbs) - grace,
            );
            let a = open(cfg, &self.state)?;
            let _ = self.active.set(a);
            if let Err(e) = self.state.start_export(cfg) {
                log::warn!("{e}");
            }
            for line in banner_lines(self.active.get().expect("set"), abi, cfg) {
                log::info!(target: "mpib::abi", "{line}");
            }
        }
        if self.refs.fetch_add(1, Ordering::Relaxed) == 0 {
            // First init since the last finalize (or ever): NCCL's view of the devices starts
            // afresh (`Devices::forget_made`).
            dispatch!(self, p => p.devices.forget_made());
        }
        let merge = dispatch!(self, p => p.devices.force_merge());
        Ok(merge.filter(|_| abi >= AbiVersion::V9).map(|value| NcclEnv { name: "NCCL_NET_FORCE_MERGE", value }))
    }

    /// The rails (SOUT, SUP) of device `dev` as `abi` sees it: a rail pair's two NICs, or one
    /// NIC twice for a NIC device NCCL uses as it is (`devices.rs`).
    pub fn device_rails(&self, abi: AbiVersion, dev: i32) -> Result<[RailDesc; 2]> {
        dispatch!(self, p => p.devices.get(abi, dev).map(|d| d.nics().each_ref().map(describe::rail)))
    }

    /// A v11/v12 context for one communicator (see `context.rs`).
    pub fn new_context(&self, comm_id: u64, traffic_class: Option<i32>) -> Result<ContextHandle> {
        let id = self.next_context.fetch_add(1, Ordering::Relaxed);
        let tc = traffic_class.filter(|&t| t >= 0);
        dispatch!(self, p => p.new_context(id, comm_id, tc));
        Ok(ContextHandle(id))
    }

    /// Where the profiler events of connections made in context `ctx` (`None`: the default
    /// context of ABIs before v11) go from now on: NCCL's callback, made a sink by the ABI edge.
    pub fn set_profiler(&self, ctx: Option<ContextHandle>, sink: Option<profile::Sink>) -> Result<()> {
        dispatch!(self, p => p.set_profiler(ctx, sink))
    }

    /// Checks a v11/v12 context; returns its traffic class.
    pub fn check_context(&self, ctx: ContextHandle) -> Result<Option<i32>> {
        dispatch!(self, p => p.context(Some(ctx)).map(|c| c.traffic_class))
    }

    /// Releases one `init` reference (v11/v12 `finalize(ctx)`). The context's queues stay with
    /// the connections that still use them.
    pub fn finalize(&self, ctx: ContextHandle) -> Result<()> {
        {
            let _g = self.global.lock();
            dispatch!(self, p => p.finalize_context(ctx))?;
            let _ = self.refs.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1));
        }
        self.state.flush_stats();
        Ok(())
    }

    /// Hints from v11/v12 `setNetAttr`: accepted and logged at TRACE, like net_ib.
    pub fn set_net_attr(&self, ctx: ContextHandle, max_peers: i32, op: u32, algo: u32, proto: u32) -> Result<()> {
        self.check_context(ctx)?;
        log::trace!("setNetAttr: maxConcurrentPeers={max_peers} op={op} algo={algo} proto={proto} (hints only)");
        Ok(())
    }

    /// Number of devices `abi` sees (`devices.rs`).
    pub fn device_count(&self, abi: AbiVersion) -> Result<usize> {
        Ok(device_count_of(self.active()?, abi))
    }

    /// Properties of device `dev` as `abi` sees it.
    pub fn properties(&self, abi: AbiVersion, dev: i32) -> Result<Properties> {
        dispatch!(self, p => p.devices.get(abi, dev).map(|d| d.props))
    }

    /// `makeVDevice` (ABI v9+): fuses base devices `devs` into a new device, its index.
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<i32> {
        dispatch!(self, p => p.devices.make_vdevice(devs))
    }

    /// `listen` in context `ctx` (v11+; `None`: the default context of older ABIs).
    pub fn listen(
        &self,
        abi: AbiVersion,
        ctx: Option<ContextHandle>,
        dev: i32,
        handle: &mut [u8; HANDLE_BYTES],
    ) -> Result<ListenHandle> {
        dispatch!(self, p => p.listen(abi, ctx, dev, handle))
    }

    /// `connect` in context `ctx` (as `listen`): `None` until the connection is up (NCCL calls
    /// again with the same handle). `tc`: v10's per-connect traffic class.
    pub fn connect(
        &self,
        abi: AbiVersion,
        ctx: Option<ContextHandle>,
        dev: i32,
        handle: &mut [u8; HANDLE_BYTES],
        tc: Option<i32>,
    ) -> Result<Option<CommHandle>> {
        dispatch!(self, p => p.connect(abi, ctx, dev, handle, tc))
    }

    /// `accept`: `None` until a peer's connection is up.
    pub fn accept(&self, listen: ListenHandle) -> Result<Option<CommHandle>> {
        dispatch!(self, p => p.accept(listen))
    }

    /// `regMr` of `size` bytes at `addr`, of one memory type (host or CUDA).
    pub fn reg_mr(&self, comm: CommHandle, addr: u64, size: usize, mem: MemTypes) -> Result<MemHandle> {
        dispatch!(self, p => p.reg_mr(comm, addr, size, mem))
    }

    /// `regMrDmaBuf`: `size` bytes at `addr`, backed by `fd` at `offset`.
    pub fn reg_mr_dmabuf(
        &self,
        comm: CommHandle,
        addr: u64,
        size: usize,
        mem: MemTypes,
        offset: u64,
        fd: i32,
    ) -> Result<MemHandle> {
        dispatch!(self, p => p.reg_mr_dmabuf(comm, addr, size, mem, offset, fd))
    }

    /// `deregMr`; `None` (NCCL's NULL) is a no-op, as in net_ib.
    pub fn dereg_mr(&self, comm: CommHandle, mh: Option<MemHandle>) -> Result<()> {
        let Some(mh) = mh else { return Ok(()) };
        dispatch!(self, p => p.dereg_mr(comm, mh))
    }

    // The data-path calls below are inlined into the ABI shims (one frame per NCCL call).
    /// `isend`: `None` means "not now" (no matching receive posted yet; NCCL retries).
    #[inline(always)]
    pub fn isend(
        &self,
        comm: CommHandle,
        addr: u64,
        size: usize,
        tag: i32,
        mh: MemHandle,
    ) -> Result<Option<RequestHandle>> {
        self.isend_profiled(comm, addr, size, tag, mh, 0)
    }

    /// [`isend`] with NCCL's profiler handle for it (`phandle`, 0: none).
    #[inline(always)]
    pub fn isend_profiled(
        &self,
        comm: CommHandle,
        addr: u64,
        size: usize,
        tag: i32,
        mh: MemHandle,
        phandle: usize,
    ) -> Result<Option<RequestHandle>> {
        dispatch!(self, p => p.isend(comm, addr, size, tag, mh, phandle))
    }

    /// `irecv` of `n` (1 … [`MAX_RECVS`]) buffers, `buf(i)` the i-th: `None` means "not now".
    /// The buffers come through a function, not a slice, so that the ABI edge converts each
    /// straight into the receive it becomes (no array of them in between on the data path).
    #[inline(always)]
    pub fn irecv(
        &self,
        comm: CommHandle,
        n: usize,
        buf: impl Fn(usize) -> Result<BufArg>,
    ) -> Result<Option<RequestHandle>> {
        self.irecv_profiled(comm, n, buf, |_| 0)
    }

    /// [`irecv`] with NCCL's profiler handle for buffer `i` given by `phandle(i)` (0: none;
    /// asked only when the connection reports profiler events).
    #[inline(always)]
    pub fn irecv_profiled(
        &self,
        comm: CommHandle,
        n: usize,
        buf: impl Fn(usize) -> Result<BufArg>,
        phandle: impl Fn(usize) -> usize,
    ) -> Result<Option<RequestHandle>> {
        dispatch!(self, p => p.irecv(comm, n, &buf, &phandle))
    }

    /// `iflush` of the buffers of a completed receive: `None` when nothing needs flushing.
    pub fn iflush(&self, comm: CommHandle, bufs: &[BufArg]) -> Result<Option<RequestHandle>> {
        dispatch!(self, p => p.iflush(comm, bufs))
    }

    /// `test`: whether the request is done; once it is, `put` is given its sizes (one for a
    /// send, one per buffer for a receive, none for a flush).
    #[inline(always)]
    pub fn test_with(&self, request: RequestHandle, put: impl FnOnce(&[u64]) -> Result<()>) -> Result<bool> {
        dispatch!(self, p => p.test(request, put))
    }

    /// [`test_with`] into an array: once the request is done, its sizes are in `sizes` and
    /// their number is returned (tools and tests).
    pub fn test(&self, request: RequestHandle, sizes: &mut [u64; MAX_RECVS]) -> Result<Option<usize>> {
        let mut n = 0;
        let done = self.test_with(request, |got| {
            sizes[..got.len()].copy_from_slice(got);
            n = got.len();
            Ok(())
        })?;
        Ok(done.then_some(n))
    }

    pub fn close_send(&self, comm: CommHandle) -> Result<()> {
        dispatch!(self, p => p.close(comm.0, Kind::Send))
    }

    pub fn close_recv(&self, comm: CommHandle) -> Result<()> {
        dispatch!(self, p => p.close(comm.0, Kind::Recv))
    }

    pub fn close_listen(&self, comm: ListenHandle) -> Result<()> {
        dispatch!(self, p => p.close(comm.0, Kind::Listen))
    }

    /// Every live connection's state in words (`mpib_dump_state`).
    pub fn dump_state(&self) -> Result<String> {
        dispatch!(self, p => Ok(p.dump_state()))
    }

    /// Per-rail counters of a send or receive comm (for tools and tests).
    pub fn comm_counters(&self, comm: CommHandle) -> Result<[RailCounts; 2]> {
        dispatch!(self, p => p.counters(comm))
    }
}

/// Opens the configured fabric's rail pairs.
fn open(cfg: &'static Config, state: &'static InstanceState) -> Result<Active> {
    let soft = |kind: FabricKind| -> Result<Active> {
        let pairs = discover::soft_pairs(cfg, state.inproc_net()).map_err(|e| e.context("no usable network device"))?;
        Ok(Active::Soft(Plugin::new(kind, pairs, cfg, state)))
    };
    let verbs = || -> Result<Active> {
        let pairs = discover::verbs_pairs(cfg).map_err(|e| e.context("no usable network device"))?;
        check_locked_memory(cfg, &pairs);
        Ok(Active::Verbs(Plugin::new(FabricKind::Verbs, pairs, cfg, state)))
    };
    match cfg.fabric {
        FabricChoice::Soft => soft(FabricKind::Soft),
        FabricChoice::Inproc => soft(FabricKind::Inproc),
        FabricChoice::Verbs => {
            verbs::fork_init();
            verbs()
        }
        FabricChoice::Auto => {
            // Before any other verb, as net_ib (registrations made before it stay unsafe).
            verbs::fork_init();
            auto_open(
                verbs::availability(),
                verbs,
                || soft(FabricKind::Soft),
                &mut |level, line| log::log!(target: "mpib::abi", level, "{line}"),
            )
        }
    }
}

/// The locked-memory check (`memlock.rs`): a WARN when the limit is too small for the
/// opened NICs, else the limit at INFO.
fn check_locked_memory(cfg: &Config, pairs: &[discover::FoundPair<VerbsDevice>]) {
    let mut nics: Vec<*const VerbsDevice> =
        pairs.iter().flat_map(|p| [std::sync::Arc::as_ptr(&p.sout), std::sync::Arc::as_ptr(&p.sup)]).collect();
    nics.sort();
    nics.dedup();
    let m = verbs::memlock::locked_memory();
    match memlock::warning(&m, memlock::need(cfg, nics.len()), nics.len(), cfg.srq_depth) {
        Some(w) => log::warn!(target: "mpib::abi", "{w}"),
        None => log::info!(target: "mpib::abi", "locked memory (RLIMIT_MEMLOCK): {m}"),
    }
}

/// `MPIB_FABRIC=auto`: verbs on a host with RDMA devices, the soft fabric on a host without
/// any (said at INFO). A host whose RDMA devices cannot be used (none active, a device or
/// verb failing: which device, which call, errno) fails `init` instead: NCCL then uses its
/// own transports (its IB transport may well manage those devices), where RDMA over TCP
/// would have been a silent 10-100x slowdown. The soft fabric on such a host is
/// `MPIB_FABRIC=soft`.
fn auto_open<T>(
    avail: Availability,
    verbs: impl FnOnce() -> Result<T>,
    soft: impl FnOnce() -> Result<T>,
    log: &mut dyn FnMut(log::Level, String),
) -> Result<T> {
    const HOW: &str = "init fails so that NCCL uses its own transports (MPIB_FABRIC=soft runs mpib over TCP instead)";
    let e = match avail {
        Availability::Usable => match verbs() {
            Ok(v) => return Ok(v),
            Err(e) => e.context("RDMA devices are present but could not be used"),
        },
        Availability::Broken(why) => Error::system(format!("RDMA devices are present but unusable: {why}")),
        Availability::Absent(why) => {
            log(log::Level::Info, format!("RDMA verbs unavailable ({why}); using the soft fabric (TCP)"));
            return soft();
        }
    };
    log(log::Level::Warn, format!("{e}; {HOW}"));
    Err(e.context("MPIB_FABRIC=auto"))
}

/// The banner `init` prints (see `banner.rs`).
fn banner_lines(a: &Active, abi: AbiVersion, cfg: &Config) -> Vec<String> {
    let (fabric, fork, relaxed, pairs) = match a {
        Active::Soft(p) => {
            let kind = if p.kind == FabricKind::Inproc { "in-process soft" } else { "soft" };
            (kind, None, None, pair_descs(p, abi, cfg, false))
        }
        Active::Verbs(p) => {
            let relaxed = match cfg.relaxed_ordering {
                RelaxedOrdering::Off => "off (MPIB_PCI_RELAXED_ORDERING=0)",
                _ if verbs::relaxed_ordering_available() => "on (ibv_reg_mr_iova2)",
                _ => "unavailable (libibverbs has no ibv_reg_mr_iova2)",
            };
            ("verbs", Some(verbs::fork_init().to_string()), Some(relaxed), pair_descs(p, abi, cfg, true))
        }
    };
    let n = device_count_of(a, abi);
    let mut lines = vec![banner::header(abi as u32, fabric, pairs.len(), n, fork.as_deref(), relaxed)];
    lines.extend(pairs.iter().enumerate().map(|(k, p)| banner::pair_line(k, p)));
    lines
}

/// Every rail pair of `p`, described for the banner.
fn pair_descs<D: Describe>(p: &Plugin<D>, abi: AbiVersion, cfg: &Config, qos: bool) -> Vec<PairDesc> {
    let d = &p.devices;
    d.pairs
        .iter()
        .enumerate()
        .map(|(k, &[a, b])| {
            let (na, nb) = (&d.nics[a], &d.nics[b]);
            let same = |x: Option<i16>, y: Option<i16>| if x == y { x } else { None };
            PairDesc {
                rails: [describe::rail(na), describe::rail(nb)],
                qps: [banner::qp_settings(&cfg.rails[0], qos), banner::qp_settings(&cfg.rails[1], qos)],
                rail_id: same(na.meta.rail, nb.meta.rail),
                plane_id: same(na.meta.plane, nb.meta.plane),
                seen: d.seen(abi, k),
            }
        })
        .collect()
}

fn device_count_of(a: &Active, abi: AbiVersion) -> usize {
    match a {
        Active::Soft(p) => p.devices.len(abi),
        Active::Verbs(p) => p.devices.len(abi),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin instance of its own for a test, configured by `vars`, beside any other in
    /// this process (no child process needed for another configuration).
    fn process(
        vars: &'static [(&'static str, &'static str)],
    ) -> (&'static Process, impl FnOnce() -> std::result::Result<Config, Vec<String>>) {
        (Box::leak(Box::new(Process::new())), move || Config::from_vars(vars.iter().copied()))
    }

    #[test]
    fn instances_in_one_process_keep_their_own_configuration_and_references() {
        let (good, good_cfg) = process(&[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "sout")]);
        let (bad, bad_cfg) = process(&[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "sideways")]);
        let e = bad.init(AbiVersion::V8, bad_cfg).unwrap_err();
        assert!(e.to_string().contains("bad configuration"), "{e}");
        assert!(bad.device_count(AbiVersion::V8).is_err(), "a failed init leaves its instance unusable");
        good.init(AbiVersion::V8, good_cfg).expect("the other instance's configuration is its own");
        assert!(good.device_count(AbiVersion::V8).unwrap() >= 1);
        // The configuration is read once: a later init's loader is not called.
        good.init(AbiVersion::V8, || panic!("read again")).unwrap();
        let ctx = good.new_context(7, None).unwrap();
        assert_eq!(good.resources().contexts, 1, "the context is counted where it lives");
        assert_eq!(bad.resources().contexts, 0);
        good.finalize(ctx).unwrap();
        assert_eq!(good.resources().contexts, 0, "and given back");
        assert!(good.device_count(AbiVersion::V8).is_ok(), "one reference left");
        assert!(bad.device_count(AbiVersion::V8).is_err(), "the other instance is untouched");
    }

    /// Runs `auto_open` with verbs giving `verbs`; returns which fabric it ended on and the
    /// log lines it wrote.
    fn auto(avail: Availability, verbs: Result<&'static str>) -> (Result<&'static str>, Vec<(log::Level, String)>) {
        let mut lines = Vec::new();
        let r = auto_open(avail, || verbs, || Ok("soft"), &mut |l, s| lines.push((l, s)));
        (r, lines)
    }

    #[test]
    fn auto_uses_verbs_silently_when_they_work() {
        let (r, lines) = auto(Availability::Usable, Ok("verbs"));
        assert_eq!(r.unwrap(), "verbs");
        assert!(lines.is_empty(), "{lines:?}");
    }

    #[test]
    fn a_host_without_rdma_falls_back_at_info() {
        let (r, lines) = auto(Availability::Absent("no RDMA devices (ibv_get_device_list found none)".into()), Ok("x"));
        assert_eq!(r.unwrap(), "soft");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].0, log::Level::Info);
        assert!(lines[0].1.contains("no RDMA devices") && lines[0].1.contains("soft fabric"), "{lines:?}");
    }

    #[test]
    fn rdma_devices_that_fail_fail_init_with_device_call_and_errno_never_tcp() {
        // Devices present, none usable (availability's own words).
        let (r, lines) = auto(Availability::Broken("no active RDMA port on mlx5_0 (mlx5_0:1 DOWN)".into()), Ok("x"));
        let e = r.expect_err("no fallback to the soft fabric");
        assert!(e.msg().contains("mlx5_0:1 DOWN"), "{e}");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].0, log::Level::Warn);
        assert!(
            lines[0].1.contains("mlx5_0:1 DOWN") && lines[0].1.contains("NCCL uses its own transports"),
            "{lines:?}"
        );
        // Ports active, but opening them fails: the verbs error (device, call, errno) is in the
        // WARN and the error. (the text of the verbs provider's `call_failed`)
        let e = Error::system("ibv_alloc_pd on mlx5_0:1 failed: Cannot allocate memory (os error 12)");
        let (r, lines) = auto(Availability::Usable, Err(e));
        let e = r.expect_err("no fallback to the soft fabric");
        assert_eq!(e.kind, crate::error::ErrorKind::System, "the verbs error's kind");
        assert!(e.msg().contains("MPIB_FABRIC=auto") && e.msg().contains("ibv_alloc_pd on mlx5_0:1 failed"), "{e}");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].0, log::Level::Warn);
        let w = &lines[0].1;
        assert!(w.contains("ibv_alloc_pd on mlx5_0:1 failed: Cannot allocate memory (os error 12)"), "{w}");
        assert!(w.contains("MPIB_FABRIC=soft"), "says how to run over TCP anyway: {w}");
        assert!(!w.contains("falling back"), "{w}");
    }
}
