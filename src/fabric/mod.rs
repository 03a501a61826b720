//! The transport the dual-rail protocol runs on: a small RDMA verbs model with capability
//! attributes (seed 002's transport-layer idea), in the spirit of smoltcp's `phy::Device`.
//!
//! Objects, as in verbs: a [`Device`] (an opened NIC port with its protection domain;
//! memory registration), [`CompletionQueue`]s, [`SharedRecvQueue`]s and reliable-connected
//! [`QueuePair`]s. How they are shared (the plugin: one CQ and one SRQ per NIC and NCCL
//! communicator, for all its connections) is not the fabric's business. QP connection info
//! ([`QpInfo`]) is exchanged out of band by the plugin.
//!
//! The hot path (`post_send`, `post_recv`, `poll`) takes plain data (slices of [`SendWr`],
//! a count, a slice of [`Completion`]), never allocates, and is dispatched statically:
//! the plugin is generic over [`Device`], and picks the provider once at `init`.
//!
//! Providers:
//! - `soft`: a software RDMA NIC over TCP with RC semantics (runs anywhere);
//! - `verbs`: real NICs through libibverbs, loaded at run time.

use std::fmt;

use bitflags::bitflags;

pub use status::WcStatus;

use crate::error::Result;

pub mod clock;
#[cfg(test)]
mod layout;
pub mod mem;
pub mod netif;
pub mod soft;
pub mod status;
pub mod verbs;

bitflags! {
    /// Access rights of a memory registration (as `ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub struct Access: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 2;
        const REMOTE_READ = 4;
        /// PCIe relaxed ordering where the device supports it and it is enabled (verbs:
        /// `MPIB_PCI_RELAXED_ORDERING`); ignored otherwise. Only for data buffers: without
        /// it a registration is strictly ordered, as memory whose write order the protocol
        /// relies on must be (see [`QueuePair::post_send`]).
        const RELAXED_ORDERING = 8;
    }
}

bitflags! {
    /// Kinds of memory a device can register.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct MemTypes: u32 {
        const HOST = 1;
        /// GPU memory through peer memory (nv_peermem).
        const CUDA = 2;
        /// GPU memory through DMA-BUF file descriptors.
        const DMABUF = 4;
    }
}

/// Link layer of a device's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    /// The soft fabric: TCP sockets.
    Tcp,
}

/// Where a device's progress comes from (as smoltcp's `DeviceCapabilities` tell the stack
/// what the hardware does for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The NIC moves data and answers the peer by itself: a CQ needs polling only while
    /// this side has completions to collect.
    Autonomous,
    /// Polling a CQ is what moves data (the soft NIC over TCP runs in the caller's thread):
    /// poll every CQ on every call, even one with nothing of this side's outstanding, or
    /// the peer's writes (a CTS) wait for the helper thread.
    OnPoll,
}

/// What a device is and can do. Filled once when the device is opened.
#[derive(Clone, Debug)]
pub struct DeviceAttrs {
    /// Device name as users write it in `MPIB_HCA_*` (e.g. `mlx5_0`, `rxe0`, `soft0`).
    pub name: String,
    pub port: u8,
    pub link_layer: LinkLayer,
    /// Link speed in Mbit/s.
    pub speed_mbps: u32,
    /// Whether the device reported `speed_mbps` (false: a nominal figure, as for loopback,
    /// which has no line rate to compare a throughput with).
    pub speed_known: bool,
    /// Active MTU in bytes.
    pub mtu: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_srq_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    pub max_inline: u32,
    pub mem_types: MemTypes,
    /// Completions carry device timestamps ([`Completion::timestamp_ns`]).
    pub completion_timestamps: bool,
    /// Where progress comes from: which CQs the caller must poll.
    pub progress: Progress,
    /// sysfs PCI path of the NIC (NCCL's `pciPath`), if it has one.
    pub pci_path: Option<String>,
    /// Stable identifier of the port (NCCL's `guid`).
    pub guid: u64,
}

/// Keys of a registered region: `lkey` for local SGEs, `rkey` for the peer's WRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// One scatter/gather element of a local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// The most SGEs a [`SendWr`] carries. The protocol uses at most one.
pub const MAX_SGE: usize = 2;

/// Operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WrOpcode {
    #[default]
    Write,
    /// RDMA WRITE with 32-bit immediate data: consumes one receive WQE at the peer.
    WriteImm,
    /// RDMA READ from the peer's memory into the local SGEs.
    Read,
}

/// A send work request. A chain is a slice of them, posted with one call (one doorbell);
/// the WRs of one QP execute and complete in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendWr {
    /// Returned in the completion. Only signalled WRs (and failed ones) complete.
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub signaled: bool,
    /// The poster does not need this WR on the wire before its own next post or poll
    /// (nobody waits for its completion at once, even when it is signalled to retire send
    /// queue slots): a provider that sends in batches may hold it for its next frames, as
    /// it holds an unsignalled WR. The soft fabric does (one `sendmsg` for both); verbs
    /// rings the doorbell regardless.
    pub deferrable: bool,
    /// Copy the payload at post time (small WRs); the buffer may be reused at once.
    pub inline: bool,
    pub num_sge: u8,
    pub sge: [Sge; MAX_SGE],
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate data, host byte order (providers put it on the wire big-endian).
    pub imm: u32,
}

impl SendWr {
    /// Total payload bytes of the WR's SGEs.
    pub fn bytes(&self) -> u64 {
        self.sge[..self.num_sge as usize].iter().map(|s| s.len as u64).sum()
    }
}

/// Whether a CQ's completions should carry device timestamps (where the device has them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timestamps {
    Wanted,
    Off,
}

/// What completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WcOpcode {
    #[default]
    RdmaWrite,
    RdmaRead,
    /// A peer's WRITE_WITH_IMM consumed one SRQ WQE.
    RecvRdmaWithImm,
}

/// One polled completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Completion {
    /// The send WR's `wr_id`; for receives, the SRQ WQE's (mpib posts generic WQEs: 0).
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes written by the peer (receives), or read (READ).
    pub byte_len: u32,
    /// Immediate data, host byte order (successful receives only). On a failed completion
    /// (whose immediate data and opcode mean nothing) the provider's vendor error syndrome
    /// ([`Completion::vendor_err`]): kept in this word so that a completion stays 40 bytes
    /// and crosses an inbox whole.
    pub imm: u32,
    /// The local QP the completion belongs to ([`QueuePair::qp_num`]).
    pub qp_num: u32,
    /// Device completion timestamp in ns, 0 when the CQ has none.
    pub timestamp_ns: u64,
}

impl Completion {
    /// A failed completion's vendor error syndrome (verbs' `vendor_err`); 0 on success and
    /// where the provider has none (the soft fabric).
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        if self.status == WcStatus::Success { 0 } else { self.imm }
    }
}

/// Size of the serialized connection info of one QP.
pub const QP_INFO_LEN: usize = 48;

/// Connection info of one QP, exchanged out of band. Opaque to everything but its provider.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct QpInfo(pub [u8; QP_INFO_LEN]);

/// Bytes of a [`QpInfo`] that differ between two QPs of one port (rail re-admission sends
/// only these for a rebuilt QP, with the port's [`QP_INFO_ADDRESS`]; the rest is the
/// port's, as in the set-up's info). Every provider keeps its per-QP fields there: soft, QP
/// number and nonce (`[4..16]`); verbs, QP number and PSN (`[4..12]`; `[12..16]` are the
/// port's LID, MTU and READ depth).
pub const QP_INFO_VARYING: std::ops::Range<usize> = 4..16;

/// Bytes of a [`QpInfo`] that are the port's address: the same for every QP of the port,
/// but not fixed for the process's life (verbs: the GID, which a RoCE port may register
/// again under another index or, its IP address changed, another value; soft: the rail's
/// IP address). A rail's re-admission carries it anew.
pub const QP_INFO_ADDRESS: std::ops::Range<usize> = 16..32;

/// Length of [`QP_INFO_VARYING`].
pub const QP_VARYING_LEN: usize = QP_INFO_VARYING.end - QP_INFO_VARYING.start;

impl QpInfo {
    /// The varying bytes ([`QP_INFO_VARYING`]).
    pub fn varying(&self) -> [u8; QP_VARYING_LEN] {
        self.0[QP_INFO_VARYING].try_into().expect("12 bytes")
    }

    /// The QP's number: every provider keeps it in bytes `[4..8]`, little-endian.
    pub fn qp_num(&self) -> u32 {
        u32::from_le_bytes(self.0[4..8].try_into().expect("4 bytes"))
    }

    /// The port's address bytes ([`QP_INFO_ADDRESS`]).
    pub fn address(&self) -> [u8; 16] {
        self.0[QP_INFO_ADDRESS].try_into().expect("16 bytes")
    }

    /// `self` (an earlier QP of the same port) with the varying bytes of another QP and the
    /// port's address as that QP gave it.
    pub fn with_varying_and_address(&self, varying: &[u8; QP_VARYING_LEN], address: &[u8; 16]) -> QpInfo {
        let mut b = self.0;
        b[QP_INFO_VARYING].copy_from_slice(varying);
        b[QP_INFO_ADDRESS].copy_from_slice(address);
        QpInfo(b)
    }
}

impl Default for QpInfo {
    fn default() -> Self {
        QpInfo([0; QP_INFO_LEN])
    }
}

impl fmt::Debug for QpInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QpInfo(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// Capacities asked of a new QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_inline: u32,
}

/// Transport parameters of a connection (verbs: applied at RTR/RTS; soft: mostly ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    pub traffic_class: u8,
    pub service_level: u8,
    /// ACK timeout exponent (4.096 µs × 2^n).
    pub timeout: u8,
    pub retry_cnt: u8,
}

/// An opened NIC port with its protection domain. Shared by every communicator that uses
/// it (`Send + Sync`); registration may happen on any thread while others post and poll.
pub trait Device: Send + Sync + Sized + 'static {
    /// A registered memory region; deregistered by [`Device::dereg_mr`].
    type Mr: Send + Sync;
    type Cq: CompletionQueue;
    type Srq: SharedRecvQueue;
    type Qp: QueuePair;

    fn attrs(&self) -> &DeviceAttrs;

    /// Registers `len` bytes at `addr` (host or, where `attrs().mem_types` says so, CUDA).
    fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<Self::Mr>;
    /// Registers a DMA-BUF range (`offset`, `len` in the buffer of `fd`) mapped at `iova`.
    /// The fd may be closed by the caller right after this returns.
    fn reg_dmabuf_mr(&self, fd: i32, offset: u64, len: usize, iova: u64, access: Access) -> Result<Self::Mr>;
    fn mr_keys(mr: &Self::Mr) -> MrKeys;
    /// Deregisters. After this returns no peer write can land in the region.
    fn dereg_mr(&self, mr: Self::Mr) -> Result<()>;

    /// A completion queue of at least `depth` entries, with device timestamps when the
    /// device has them and they are [`Timestamps::Wanted`].
    fn create_cq(&self, depth: u32, timestamps: Timestamps) -> Result<Self::Cq>;
    /// A shared receive queue of at least `depth` generic WQEs.
    fn create_srq(&self, depth: u32) -> Result<Self::Srq>;
    /// An RC QP whose send and receive completions go to `cq`, drawing its receive WQEs
    /// from `srq` when given (a QP without an SRQ never receives a WRITE_WITH_IMM).
    fn create_qp(&self, cq: &Self::Cq, srq: Option<&Self::Srq>, caps: QpCaps) -> Result<Self::Qp>;

    /// How many times the port has gone down since the device was opened (verbs: async
    /// `IBV_EVENT_PORT_ERR` events on this port, and `IBV_EVENT_DEVICE_FATAL`, after which
    /// it stays down for good), and whether it is down now. A caller that
    /// sees the count move learns of a link loss before any WR times out. Providers without
    /// port events (the soft fabric): never down.
    fn port_downs(&self) -> (u64, bool) {
        (0, false)
    }

    /// Whether the device is gone for good (verbs: `IBV_EVENT_DEVICE_FATAL`): its QPs will
    /// never complete anything again, so a rail on it fails even when it is the last one,
    /// where a port that is merely down is left to RC's retries.
    fn fatal(&self) -> bool {
        false
    }

    /// The address a QP's connection info names, as a user reads it in logs (verbs: the
    /// GID, and the LID on InfiniBand; soft: the IP address and port, or in-process).
    fn address_of(info: &QpInfo) -> String {
        let a = info.address();
        a.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send + 'static {
    /// The number completions carry in [`Completion::qp_num`].
    fn qp_num(&self) -> u32;
    /// This QP's connection info, for the peer's [`QueuePair::connect`].
    fn local_info(&self) -> QpInfo;
    /// Connects to the peer's QP (verbs: INIT → RTR → RTS). Does not block; the
    /// connection may finish later, see [`QueuePair::is_ready`].
    fn connect(&mut self, remote: &QpInfo, params: &ConnectParams) -> Result<()>;
    /// Whether WRs posted now are carried at once (connection established).
    fn is_ready(&mut self) -> Result<bool>;
    /// Posts a chain of WRs with one doorbell.
    ///
    /// On error a prefix of the chain may have been posted, and its WRs execute and complete
    /// as any others: verbs' `ibv_post_send` stops at the first WR the provider refuses
    /// (send queue full, a bad SGE) and the WRs before it are on the wire; the error says
    /// how many were posted. The soft provider checks the whole chain first: all or
    /// nothing. So a caller never posts a failed chain again; the plugin fails the
    /// connection on any failed post, and since every chain the protocol posts ends with
    /// its one WRITE_WITH_IMM (`engine/send`), a posted prefix never completes a receive at
    /// the peer.
    ///
    /// Placement order every provider keeps (the CTS FIFO relies on it, as net_ib relies on
    /// a NIC's in-order placement): for a WRITE of at least 8 bytes whose end
    /// (`remote_addr + len`) is 8-aligned, the final 8 bytes become visible at the responder
    /// last, so a thread there that Acquire-loads that word and sees its new value sees the
    /// whole WRITE. The soft provider stores that word with one Release `AtomicU64` store
    /// after every other byte.
    fn post_send(&mut self, chain: &[SendWr]) -> Result<()>;

    /// Before the QP is dropped from a CQ others keep polling: moves it to the error state
    /// and posts a signalled WR with `wr_id` `marker` that completes (flushed) after every
    /// completion of a WR posted before it, so the poller knows when the QP's last
    /// completion is in. `Ok(false)`: nothing was posted, and the provider does not need it:
    /// completions of a dropped QP may still reach its CQ, but its QP number is never used
    /// again by the device, so they can be told apart (the default; the soft fabric).
    fn drain_marker(&mut self, marker: u64) -> Result<bool> {
        let _ = marker;
        Ok(false)
    }

    /// Rail failover's fence (DESIGN.md "Rail failover"): moves the QP to the error state,
    /// so that its responder accepts nothing more (soft: every later frame for it is
    /// dropped and the peer QP is told; verbs: `ibv_modify_qp` to ERR) and every WR not yet
    /// completed flushes. Never blocks: see [`QueuePair::fence_settled`]. Idempotent.
    fn to_error(&mut self) -> Result<()>;

    /// Whether the fence begun by [`QueuePair::to_error`] is final: no receive completes on
    /// the QP any more, so what its CQ holds for it is all there will be. Verbs: a QP
    /// attached to an SRQ may still consume WQEs until `IBV_EVENT_QP_LAST_WQE_REACHED`;
    /// until it comes (bounded: a device that never raises it is waited for a short time
    /// once, then not at all) this says no. Never blocks: the caller asks again at its next
    /// call. The default (the soft fabric): at once.
    fn fence_settled(&mut self) -> bool {
        true
    }

    /// A fault drill or a test's fault (soft fabric only; `MPIB_FAULT_RAIL`, see
    /// [`FaultKind`]): armed on this QP, fires once. `Ok(false)`: the provider cannot inject
    /// it (verbs; the soft fabric's in-process mode for all but [`FaultKind::LinkLoss`]).
    fn inject_fault(&mut self, kind: FaultKind) -> Result<bool> {
        let _ = kind;
        Ok(false)
    }
}

/// A fault [`QueuePair::inject_fault`] arms on a QP (the requester of the WRs it hits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultKind {
    /// Now: the QP fails as if its link to the peer were lost: the oldest WR not
    /// acknowledged fails with `RetryExceeded`, the rest flush, and the peer QP goes to the
    /// error state too (both directions are lost).
    #[default]
    LinkLoss,
    /// The next WRITE_WITH_IMM started: its bytes are placed at the responder but its IMM
    /// is never delivered (no WQE taken, no receive completion); once the responder
    /// acknowledged the bytes, the link dies as above with that WR failing
    /// `RetryExceeded`: a link lost between the data and the IMM.
    DropImm,
    /// The next WRITE_WITH_IMM started is executed in full at the responder (data placed,
    /// IMM delivered) but its acknowledgement is lost: the WR fails `RetryExceeded` and the
    /// QP pair goes to the error state, as if the link died before the ACK came back.
    DropAck,
    /// From now on the QP's requests are held (not sent; the peer is not taken for silent
    /// meanwhile) until either QP of the pair goes to the error state (the responder
    /// fenced, or this side fenced or failed); then they are released onto the link after
    /// the CLOSE, so they reach a responder in the error state, which must drop them.
    /// Released: each held request's header and first segment (256 KiB).
    HoldPastFence,
}

/// A completion queue, polled by one thread at a time.
pub trait CompletionQueue: Send + 'static {
    /// Fills `out` with up to `out.len()` completions; returns how many.
    /// The soft provider also makes its progress here (it is the NIC).
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;

    /// Hands up to `buf.len()` completions to `f`, oldest first; returns how many. Where the
    /// provider can, `f` reads them where they lie (no copy out: the shared CQ's poller
    /// routes each one once); otherwise they are polled into `buf` first (the default).
    #[inline(always)]
    fn poll_each(&mut self, buf: &mut [Completion], mut f: impl FnMut(&Completion)) -> Result<usize> {
        let n = self.poll(buf)?;
        for c in &buf[..n] {
            f(c);
        }
        Ok(n)
    }

    /// Makes room for at least `depth` completions (a shared CQ grows as QPs are attached),
    /// keeping the ones it holds. Never below what it holds; within the device's `max_cqe`.
    fn resize(&mut self, depth: u32) -> Result<()>;
}

/// A shared receive queue of generic (0-SGE) WQEs.
pub trait SharedRecvQueue: Send + 'static {
    /// Posts `count` generic receive WQEs with one call.
    fn post_recv(&mut self, count: u32) -> Result<()>;
    /// How many times a peer's WRITE_WITH_IMM found this SRQ empty and had to wait
    /// (receiver-not-ready), where the provider can tell; 0 otherwise.
    fn rnr_events(&self) -> u64 {
        0
    }
}
