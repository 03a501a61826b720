//! An opened verbs port: its context, the one protection domain all comms share, what it
//! can do (probed once), memory registration, and the factories of CQs, SRQs and QPs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use rdma_mummy_sys as ibv;

use super::cq::{TsClock, VerbsCq};
use super::ctx::{Ctx, PollBatches};
use super::events::{EventThread, Health};
use super::gid::{self, GidEntry, GidRule, GidType};
use super::pkey;
use super::props;
use super::qp::{self, VerbsQp};
use super::qp_info::PortInfo;
use super::route;
use super::srq::VerbsSrq;
use super::sys::{self, DeviceList, LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND, OpenContext, PORT_ACTIVE};
use crate::error::{Error, Result};
use crate::fabric::{Access, Device, DeviceAttrs, LinkLayer, MemTypes, MrKeys, Progress, QpCaps, Timestamps};

/// The vendor id Soft-RoCE (rxe) reports.
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// How to open one port: what [`VerbsDevice::open`] takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsOptions {
    /// The device's name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// The port; `None`: the device's first active port.
    pub port: Option<u8>,
    /// Which RoCE GID to use: an index, or preferences (`gid.rs`).
    pub gid: GidRule,
    /// The P_Key table index of the QPs (`pkey.rs`).
    pub pkey_index: u16,
    /// Registrations that ask for PCI relaxed ordering ([`Access::RELAXED_ORDERING`]: data
    /// buffers) get it where libibverbs can ([`sys::relaxed_ordering_available`]).
    pub relaxed_ordering: bool,
    /// Offer DMA-BUF registration where the kernel and driver have it (`MPIB_DMABUF`);
    /// off: not even probed.
    pub dmabuf: bool,
}

/// A registered memory region; deregistered by [`Device::dereg_mr`] or when dropped.
pub struct VerbsMr {
    mr: *mut ibv::ibv_mr,
    keys: MrKeys,
    ctx: Arc<Ctx>,
}

// SAFETY: an MR handle is plain data to the holder; ibv_dereg_mr is thread-safe.
unsafe impl Send for VerbsMr {}
// SAFETY: shared references only read the cached keys.
unsafe impl Sync for VerbsMr {}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        if self.mr.is_null() {
            return;
        }
        // SAFETY: a live MR of ctx's PD, deregistered once.
        let ret = unsafe { ibv::ibv_dereg_mr(self.mr) };
        if ret != 0 {
            log::warn!("ibv_dereg_mr on {}: {}", self.ctx.label(), sys::strerror(sys::ret_errno(ret)));
        }
    }
}

/// An opened verbs port (see [`crate::fabric::Device`]).
pub struct VerbsDevice {
    ctx: Arc<Ctx>,
    attrs: DeviceAttrs,
    /// The port's facts QPs are made with; its GID checked before each QP ([`Self::port_now`]).
    addr: Mutex<PortAddr>,
    /// Which GID the port uses (`MPIB_GID_INDEX` and the preferences).
    rule: GidRule,
    clock: TsClock,
    /// Registrations that ask for PCI relaxed ordering get it (wanted and available).
    relaxed_ordering: bool,
}

/// The port's facts as last read, with what the GID choice needs to find its GID again.
struct PortAddr {
    info: PortInfo,
    /// The RoCE version of the GID in use (`None`: InfiniBand, or unknown; a GID value is in
    /// a RoCE table once per version).
    kind: Option<GidType>,
    /// `Health::gid_events` when the GID was last read.
    gid_events: u64,
}

/// `ibv_access_flags` for an [`Access`], without relaxed ordering (see [`reg_flags`]).
/// Verbs refuses REMOTE_WRITE without LOCAL_WRITE, so LOCAL_WRITE is added to it.
fn access_flags(access: Access) -> u32 {
    use ibv::ibv_access_flags as a;
    let mut f = 0;
    if access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE) {
        f |= a::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= a::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= a::IBV_ACCESS_REMOTE_READ.0;
    }
    f
}

/// The `ibv_access_flags` of one registration, and whether they ask for PCI relaxed
/// ordering (then only `ibv_reg_mr_iova2` can pass them). Relaxed ordering only where the
/// caller asks for it ([`Access::RELAXED_ORDERING`]: data buffers) and the device allows it
/// (`device_relaxed`: wanted by the configuration and available in libibverbs). The plugin
/// never asks for it on its control region (CTS FIFO, completion records, control ring):
/// the protocol reads a WRITE's last 8 bytes as the sign that the rest landed, which a
/// host honouring relaxed ordering does not keep (net_ib registers its FIFO strictly
/// ordered too).
fn reg_flags(access: Access, device_relaxed: bool) -> (u32, bool) {
    let relaxed = device_relaxed && access.contains(Access::RELAXED_ORDERING);
    let ro = if relaxed { ibv::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0 } else { 0 };
    (access_flags(access) | ro, relaxed)
}

impl VerbsDevice {
    /// Opens `opts.device`, port `opts.port` (default: its first active port), with the
    /// RoCE GID `opts.gid` says (see [`gid`]).
    pub fn open(opts: &VerbsOptions) -> Result<VerbsDevice> {
        let (name, port, rule) = (opts.device.as_str(), opts.port, &opts.gid);
        let list = DeviceList::get().map_err(|(_, why)| Error::system(why))?;
        let i = (0..list.len()).find(|&i| list.name(i) == name).ok_or_else(|| {
            Error::invalid_argument(format!("RDMA device {name} not found (devices: {})", list.names().join(", ")))
        })?;
        let oc = OpenContext::open(list.device(i), name)?;
        let dattr = sys::query_device(oc.0, name)?;
        let nports = dattr.orig_attr.phys_port_cnt;
        let port = match port {
            Some(p) if p == 0 || p > nports => {
                return Err(Error::invalid_argument(format!("{name} has no port {p} (ports 1-{nports})")));
            }
            Some(p) => p,
            None => (1..=nports)
                .find(|&p| sys::query_port(oc.0, name, p).is_ok_and(|a| a.state == PORT_ACTIVE))
                .ok_or_else(|| Error::system(format!("{name} has no active port")))?,
        };
        let pattr = sys::query_port(oc.0, name, port)?;
        if pattr.state != PORT_ACTIVE {
            return Err(Error::system(format!("{name}:{port} is {}, not ACTIVE", sys::port_state_str(pattr.state))));
        }
        let roce = pattr.link_layer == LINK_LAYER_ETHERNET;
        let (gid_index, gid, gid_type) = if roce {
            let table = gid::read_table(oc.0, name, port, pattr.gid_tbl_len.max(0) as usize);
            let idx = gid::select(&table, rule, name, port)?;
            let e = table.iter().find(|e| e.index == idx);
            (idx, e.map(|e| e.gid).unwrap_or_default(), e.and_then(|e| e.kind))
        } else {
            let idx = rule.index.filter(|_| rule.index_on_ib);
            let idx = idx.unwrap_or_else(|| ib_gid_index(oc.0, name, port, pattr.gid_tbl_len));
            (idx, gid::query_gid(oc.0, name, port, idx).unwrap_or_default(), None)
        };
        let pkeys = pkey::read_table(oc.0, name, port, pattr.pkey_tbl_len as usize);
        let pkey = pkey::check(&pkeys, opts.pkey_index, name, port)?;
        // SAFETY: oc.0 is an open context.
        let pd = unsafe { ibv::ibv_alloc_pd(oc.0) };
        if pd.is_null() {
            let errno = sys::errno();
            return Err(sys::call_failed("ibv_alloc_pd", name, port, errno));
        }
        let raw = oc.into_raw();
        let health = Arc::new(Health::new());
        let events = EventThread::start(raw, format!("{name}:{port}"), port, health.clone())
            .map_err(|e| {
                log::warn!("{name}:{port}: no async event thread ({e}); port and QP errors show only in completions")
            })
            .ok();
        // Soft-RoCE (its vendor id, RXE_VENDOR_ID) ends an extended CQ's poll batch in
        // ibv_next_poll before rdma-core 59; one completion per batch is right everywhere.
        let batches = if dattr.orig_attr.vendor_id == RXE_VENDOR_ID { PollBatches::One } else { PollBatches::Many };
        let ctx = Arc::new(Ctx::new(raw, pd, name, port, health, batches, events));

        let clock = probe_clock(&ctx, dattr.hca_core_clock);
        let mem_types = mem_types(props::peer_memory_loaded(), opts.dmabuf, || probe_dmabuf(&ctx));
        let d = &dattr.orig_attr;
        let attrs = DeviceAttrs {
            name: name.to_string(),
            port,
            link_layer: if roce { LinkLayer::Ethernet } else { LinkLayer::InfiniBand },
            speed_mbps: props::speed_mbps(pattr.active_width, pattr.active_speed, pattr.active_speed_ex),
            speed_known: true,
            mtu: props::mtu_bytes(pattr.active_mtu),
            max_qp: d.max_qp.max(0) as u32,
            max_qp_wr: d.max_qp_wr.max(0) as u32,
            max_srq_wr: d.max_srq_wr.max(0) as u32,
            max_cqe: d.max_cqe.max(0) as u32,
            max_sge: d.max_sge.max(0) as u32,
            max_inline: probe_inline(&ctx),
            mem_types,
            completion_timestamps: clock != TsClock::None,
            progress: Progress::Autonomous,
            pci_path: props::pci_path(name),
            guid: u64::from_be(d.sys_image_guid),
        };
        let port_info = PortInfo {
            link_layer: if roce { LINK_LAYER_ETHERNET } else { LINK_LAYER_INFINIBAND },
            port,
            lid: pattr.lid,
            mtu: pattr.active_mtu as u8,
            gid,
            gid_index,
            rd_atomic_responder: d.max_qp_rd_atom.clamp(1, 16) as u8,
            rd_atomic_initiator: d.max_qp_init_rd_atom.clamp(1, 16) as u8,
            grh_required: pattr.flags & QPF_GRH_REQUIRED != 0,
            pkey_index: opts.pkey_index,
        };
        let mut addr = if roce {
            format!("RoCE, GID index {gid_index} ({})", gid::format_gid(&gid))
        } else {
            let flid = match route::flid(&gid) {
                0 => String::new(),
                f => format!(", FLID {f:#x} (GID index {gid_index})"),
            };
            format!("InfiniBand, LID {:#x}{flid}", pattr.lid)
        };
        if port_info.grh_required && !roce {
            addr.push_str(", GRH required");
        }
        if let Some(p) = pkey.filter(|p| *p != 0xffff || opts.pkey_index != 0) {
            addr.push_str(&format!(", P_Key {p:#06x} (index {})", opts.pkey_index));
        }
        log::info!(
            "verbs device {name}:{port}: {addr}, MTU {}, {} Mbit/s, memory {:?}, max inline {}, completion timestamps: {}",
            attrs.mtu,
            attrs.speed_mbps,
            attrs.mem_types,
            attrs.max_inline,
            clock.describe()
        );
        let relaxed_ordering = opts.relaxed_ordering && sys::relaxed_ordering_available();
        let gid_events = ctx.health.gid_events.load(Ordering::Acquire);
        let addr = Mutex::new(PortAddr { info: port_info, kind: gid_type, gid_events });
        Ok(VerbsDevice { ctx, attrs, addr, rule: opts.gid, clock, relaxed_ordering })
    }

    /// The GID index QPs use as source (RoCE: the chosen one; IB: for GRH only), as last read.
    pub fn gid_index(&self) -> u8 {
        self.addr.lock().info.gid_index
    }

    /// The RoCE version of the GID at [`Self::gid_index`] (`None` on InfiniBand), as last read.
    pub fn gid_type(&self) -> Option<GidType> {
        self.addr.lock().kind
    }

    /// The port's GID at [`Self::gid_index`] (network order), as last read.
    pub fn gid(&self) -> [u8; 16] {
        self.addr.lock().info.gid
    }

    /// The port's LID (InfiniBand; 0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.addr.lock().info.lid
    }

    /// The P_Key table index QPs use.
    pub fn pkey_index(&self) -> u16 {
        self.addr.lock().info.pkey_index
    }

    /// The port's facts a new QP is made with, its RoCE GID checked first: read again when
    /// a GID_CHANGE or PORT_ACTIVE event came since it was last read, or when the entry in
    /// use no longer holds it (an event may be missed or late); then the same GID found
    /// again (perhaps at another index), else one chosen anew (`gid::reselect`). An error
    /// when the port has no usable GID now (its address removed): the QP is not made, and
    /// a rail's re-admission tries again later.
    pub fn port_now(&self) -> Result<PortInfo> {
        let mut a = self.addr.lock();
        if !a.info.is_roce() {
            return Ok(a.info);
        }
        let (name, port) = (self.attrs.name.as_str(), a.info.port);
        // Loaded before the table is read: an event during the read makes the next call read again.
        let events = self.ctx.health.gid_events.load(Ordering::Acquire);
        let same = events == a.gid_events
            && gid::query_gid(self.ctx.raw, name, port, a.info.gid_index).is_ok_and(|g| g == a.info.gid);
        if same {
            return Ok(a.info);
        }
        let len = sys::query_port(self.ctx.raw, name, port)?.gid_tbl_len.max(0) as usize;
        let table = gid::read_table(self.ctx.raw, name, port, len);
        let current = GidEntry { index: a.info.gid_index, gid: a.info.gid, kind: a.kind };
        let idx =
            gid::reselect(&table, &current, &self.rule, name, port).map_err(|e| e.context("the GID table changed"))?;
        let e = table.iter().find(|e| e.index == idx).copied().unwrap_or(current);
        if (e.index, e.gid) != (current.index, current.gid) {
            log::info!(
                "{name}:{port}: RoCE GID now index {} ({}), was index {} ({}); new QPs use it",
                e.index,
                gid::format_gid(&e.gid),
                current.index,
                gid::format_gid(&current.gid)
            );
        }
        (a.info.gid_index, a.info.gid, a.kind, a.gid_events) = (e.index, e.gid, e.kind, events);
        Ok(a.info)
    }

    /// How completion timestamps are taken on this device.
    pub fn clock(&self) -> TsClock {
        self.clock
    }

    /// Whether registrations that ask for PCI relaxed ordering get it.
    pub fn relaxed_ordering(&self) -> bool {
        self.relaxed_ordering
    }

    /// False after an async PORT_ERR event on this port (until PORT_ACTIVE).
    pub fn port_active(&self) -> bool {
        self.ctx.health.port_active.load(Ordering::Acquire)
    }

    /// Async events read on this device so far (all kinds).
    pub fn async_events(&self) -> u64 {
        self.ctx.health.events.load(Ordering::Relaxed)
    }

    /// `IBV_EVENT_QP_LAST_WQE_REACHED` events read on this device so far (a fence of an
    /// SRQ-attached QP waits for its own).
    pub fn last_wqe_events(&self) -> u64 {
        self.ctx.health.last_wqe_events.load(Ordering::Relaxed)
    }

    /// Whether a fence found this device raising no `IBV_EVENT_QP_LAST_WQE_REACHED` (its
    /// fences no longer wait for it).
    pub fn last_wqe_missing(&self) -> bool {
        self.ctx.health.last_wqe_missing.load(Ordering::Relaxed)
    }

    /// An extended CQ (`ibv_create_cq_ex`), with timestamps when the device has them; for
    /// tests of the extended poll path on devices without timestamps.
    pub fn create_cq_extended(&self, depth: u32) -> Result<VerbsCq> {
        VerbsCq::create_ex(&self.ctx, depth, self.clock)
    }
}

impl Device for VerbsDevice {
    type Mr = VerbsMr;
    type Cq = VerbsCq;
    type Srq = VerbsSrq;
    type Qp = VerbsQp;

    fn address_of(info: &crate::fabric::QpInfo) -> String {
        match super::qp_info::decode(info) {
            Ok(r) if r.link_layer == LINK_LAYER_INFINIBAND => {
                format!("LID {:#x} GID {}", r.lid, gid::format_gid(&r.gid))
            }
            Ok(r) => format!("GID {}", gid::format_gid(&r.gid)),
            Err(_) => "an unreadable QP info".to_string(),
        }
    }

    fn port_downs(&self) -> (u64, bool) {
        let h = &self.ctx.health;
        (h.port_downs.load(Ordering::Acquire), h.port_down())
    }

    fn fatal(&self) -> bool {
        self.ctx.health.device_fatal.load(Ordering::Acquire)
    }

    fn attrs(&self) -> &DeviceAttrs {
        &self.attrs
    }

    fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<VerbsMr> {
        let (flags, relaxed) = reg_flags(access, self.relaxed_ordering);
        // SAFETY: the caller owns [addr, addr+len) for the registration's lifetime (the
        // trait's contract); the PD is live.
        let mut mr = unsafe {
            if relaxed {
                ibv::ibv_reg_mr_iova2(self.ctx.pd, addr.cast(), len, addr as u64, flags)
            } else {
                ibv::ibv_reg_mr(self.ctx.pd, addr.cast(), len, flags as i32)
            }
        };
        if mr.is_null() && relaxed && sys::errno() == libc::EOPNOTSUPP {
            // libibverbs older than ibv_reg_mr_iova2 (rdma-core 29): no relaxed ordering.
            // SAFETY: as above.
            mr = unsafe { ibv::ibv_reg_mr(self.ctx.pd, addr.cast(), len, access_flags(access) as i32) };
        }
        if mr.is_null() {
            let errno = sys::errno();
            let shown = if relaxed { access } else { access - Access::RELAXED_ORDERING };
            return Err(self.ctx.failed(&format!("ibv_reg_mr({len} bytes at {addr:p}, access {shown:?})"), errno));
        }
        Ok(self.wrap_mr(mr))
    }

    fn reg_dmabuf_mr(&self, fd: i32, offset: u64, len: usize, iova: u64, access: Access) -> Result<VerbsMr> {
        let (flags, _) = reg_flags(access, self.relaxed_ordering);
        // SAFETY: the PD is live; the kernel validates the fd and the range.
        let mr = unsafe { ibv::ibv_reg_dmabuf_mr(self.ctx.pd, offset, len, iova, fd, flags as i32) };
        if mr.is_null() {
            let errno = sys::errno();
            return Err(self.ctx.failed(&format!("ibv_reg_dmabuf_mr(fd {fd}, offset {offset}, {len} bytes)"), errno));
        }
        Ok(self.wrap_mr(mr))
    }

    fn mr_keys(mr: &VerbsMr) -> MrKeys {
        mr.keys
    }

    fn dereg_mr(&self, mut mr: VerbsMr) -> Result<()> {
        let p = std::mem::replace(&mut mr.mr, std::ptr::null_mut());
        // SAFETY: a live MR, deregistered once (Drop sees NULL afterwards).
        let ret = unsafe { ibv::ibv_dereg_mr(p) };
        if ret != 0 {
            return Err(self.ctx.failed("ibv_dereg_mr", sys::ret_errno(ret)));
        }
        Ok(())
    }

    fn create_cq(&self, depth: u32, timestamps: Timestamps) -> Result<VerbsCq> {
        if timestamps == Timestamps::Wanted && self.clock != TsClock::None {
            VerbsCq::create_ex(&self.ctx, depth, self.clock)
        } else {
            VerbsCq::create_plain(&self.ctx, depth)
        }
    }

    fn create_srq(&self, depth: u32) -> Result<VerbsSrq> {
        VerbsSrq::create(&self.ctx, depth)
    }

    fn create_qp(&self, cq: &VerbsCq, srq: Option<&VerbsSrq>, caps: QpCaps) -> Result<VerbsQp> {
        VerbsQp::create(&self.ctx, self.port_now()?, cq, srq, caps)
    }
}

impl VerbsDevice {
    fn wrap_mr(&self, mr: *mut ibv::ibv_mr) -> VerbsMr {
        // SAFETY: a live MR just returned by libibverbs.
        let keys = unsafe { MrKeys { lkey: (*mr).lkey, rkey: (*mr).rkey } };
        VerbsMr { mr, keys, ctx: self.ctx.clone() }
    }
}

impl std::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsDevice({}, gid index {})", self.ctx.label(), self.gid_index())
    }
}

/// Which timestamp clock the device's extended CQs can give: wallclock ns first, else the
/// raw device clock when its frequency is known, else none.
fn probe_clock(ctx: &Arc<Ctx>, hca_core_clock_khz: u64) -> TsClock {
    if VerbsCq::create_ex(ctx, 4, TsClock::Wallclock).is_ok() {
        return TsClock::Wallclock;
    }
    if hca_core_clock_khz > 0 {
        let raw = TsClock::raw(hca_core_clock_khz);
        if VerbsCq::create_ex(ctx, 4, raw).is_ok() {
            return raw;
        }
    }
    TsClock::None
}

/// What a port can register: host memory; CUDA memory where peer memory is loaded; DMA-BUF
/// where it is `wanted` and `probe` finds it works (not probed when not wanted).
fn mem_types(peer_memory: bool, wanted: bool, probe: impl FnOnce() -> bool) -> MemTypes {
    let mut m = MemTypes::HOST;
    if peer_memory {
        m |= MemTypes::CUDA;
    }
    if wanted && probe() {
        m |= MemTypes::DMABUF;
    }
    m
}

/// `IBV_QPF_GRH_REQUIRED` of `ibv_port_attr.flags` (verbs.h; not bound by the crate).
const QPF_GRH_REQUIRED: u8 = 1;

/// The GID table index of the InfiniBand GID with a routable FLID, as net_ib looks for it
/// (`NCCL_IB_ROUTABLE_FLID_GID_INDEX`, default 1).
const ROUTABLE_FLID_GID_INDEX: u8 = 1;

/// An InfiniBand port's GID index: the one holding a routable FLID if the table has it
/// (routed IB: the subnet prefix carries it), else 0, as net_ib chooses.
fn ib_gid_index(ctx: *mut ibv::ibv_context, name: &str, port: u8, gid_tbl_len: i32) -> u8 {
    let i = ROUTABLE_FLID_GID_INDEX;
    let routable = (i as i32) < gid_tbl_len && gid::query_gid(ctx, name, port, i).is_ok_and(|g| route::flid(&g) != 0);
    if routable { i } else { 0 }
}

/// DMA-BUF registration works when `ibv_reg_dmabuf_mr(fd = -1)` fails for the fd, not for
/// lack of support (net_ib's probe).
fn probe_dmabuf(ctx: &Ctx) -> bool {
    // SAFETY: a live PD; fd -1 is never a valid DMA-BUF, so nothing gets registered.
    let mr = unsafe { ibv::ibv_reg_dmabuf_mr(ctx.pd, 0, 0, 0, -1, 0) };
    if !mr.is_null() {
        // SAFETY: deregistering what was (unexpectedly) registered.
        unsafe { ibv::ibv_dereg_mr(mr) };
        return true;
    }
    props::dmabuf_supported_from_errno(sys::errno())
}

/// The largest inline payload an RC QP accepts, among a few sizes (0 when none, with a WARN
/// saying why: small sends then go from registered memory, and a failure here, e.g. ENOMEM
/// from the locked-memory limit, will fail the first connection too).
fn probe_inline(ctx: &Arc<Ctx>) -> u32 {
    let cq = match VerbsCq::create_plain(ctx, 4) {
        Ok(cq) => cq,
        Err(e) => {
            log::warn!("{}: no inline sends: the probe's CQ: {e}", ctx.label());
            return 0;
        }
    };
    let mut last = None;
    for size in [512, 256, 128, 64, 32] {
        match qp::create_raw(ctx, cq.inner.cq, std::ptr::null_mut(), 4, size) {
            Ok(q) => {
                // SAFETY: a QP just created here, destroyed once.
                unsafe { ibv::ibv_destroy_qp(q) };
                return size;
            }
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        log::warn!("{}: no inline sends: no RC QP with 32 inline bytes or more: {e}", ctx.label());
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibv::ibv_access_flags as a;

    #[test]
    fn access_mapping_adds_local_write_to_remote_write() {
        assert_eq!(access_flags(Access::REMOTE_WRITE), a::IBV_ACCESS_LOCAL_WRITE.0 | a::IBV_ACCESS_REMOTE_WRITE.0);
        assert_eq!(access_flags(Access::REMOTE_READ), a::IBV_ACCESS_REMOTE_READ.0);
        assert_eq!(access_flags(Access::LOCAL_WRITE), a::IBV_ACCESS_LOCAL_WRITE.0);
        assert_eq!(
            access_flags(Access::all()),
            (a::IBV_ACCESS_LOCAL_WRITE | a::IBV_ACCESS_REMOTE_WRITE | a::IBV_ACCESS_REMOTE_READ).0,
            "relaxed ordering is added by reg_flags only"
        );
    }

    #[test]
    fn dmabuf_only_where_wanted_and_never_probed_otherwise() {
        let probed = std::cell::Cell::new(0);
        let probe = |ok| {
            probed.set(probed.get() + 1);
            ok
        };
        assert_eq!(mem_types(false, true, || probe(true)), MemTypes::HOST | MemTypes::DMABUF);
        assert_eq!(mem_types(true, true, || probe(false)), MemTypes::HOST | MemTypes::CUDA, "the probe says no");
        assert_eq!(probed.get(), 2);
        assert_eq!(mem_types(true, false, || probe(true)), MemTypes::HOST | MemTypes::CUDA, "MPIB_DMABUF=0");
        assert_eq!(probed.get(), 2, "not even probed");
    }

    #[test]
    fn relaxed_ordering_only_where_asked_and_allowed() {
        let ro = a::IBV_ACCESS_RELAXED_ORDERING.0;
        let rw = (a::IBV_ACCESS_LOCAL_WRITE | a::IBV_ACCESS_REMOTE_WRITE | a::IBV_ACCESS_REMOTE_READ).0;
        let control = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let data = control | Access::RELAXED_ORDERING;
        // Control memory is strictly ordered whatever the device allows.
        assert_eq!(reg_flags(control, true), (rw, false));
        assert_eq!(reg_flags(control, false), (rw, false));
        // Data buffers get it where the device allows it, through ibv_reg_mr_iova2.
        assert_eq!(reg_flags(data, true), (rw | ro, true));
        assert_eq!(reg_flags(data, false), (rw, false));
    }
}
