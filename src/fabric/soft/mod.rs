//! The soft fabric: a software RDMA NIC over TCP with RC verbs semantics. It runs the
//! dual-rail protocol on hosts without RDMA hardware (tests, the benchmark tool, TCP-only
//! clusters), and it can drive two TCP NICs as the two rails.
//!
//! # Layout
//!
//! Each file imports only files listed below it (no circles); read top-down:
//!
//! ```text
//! port_tests  the port's unit tests (of `port`)
//! device      SoftDevice, SoftMr: the Device trait; opens the port, starts the helper
//! qp          SoftQp: one interface over the two kinds of connection; QpInfo
//! cq          SoftCq (its poll steps links, or in-process connections), SoftSrq
//! helper      the helper thread: serves links whose callers are quiet, sweeps them
//! conn_inproc InprocConn, InprocNet: an in-process QP; connect by nonce on its network, post, steps
//! station     a TCP connection on its link: what the link asks of a QP, CONNECT and CLOSE
//! conn_tcp    TcpConn: a QP on a link; connect, is_ready, post, fence, fault hooks, destroy
//! conn        what both kinds share (Core): phase, peer, requester, responder, the error state
//! qp_recv     a QP's receive side on its link: checks, placement decisions, RNR
//! qp_send direct  a QP's send side on its link; in-process execution of WRs
//! hook        fault hooks on a QP's wire: an IMM or an ACK lost, requests held past a fence
//! requester   the send queue: posting checks, WRs in flight, completions in order
//! responder   request order, refusals, RNR counting
//! placement   how a WRITE lands: final word last; in-process, control writes word by word
//! port        what a device's QPs share: QP table, listener, HELLOs, the links
//! link        one TCP connection per device pair: the frames of all its QPs
//! transport   vectored socket I/O, a dial's result, draining a socket; an in-process peer's end
//! endpoint    one side of a connection: QP number, registrations, CQ ring, SRQ
//! fault       why a QP goes to the error state
//! loom_models the model checker's tests of ring, mr and spin (built under `--cfg loom`)
//! addr frame liveness logs mr ring watch
//!             leaves: interface facts and random names, the wire format, the silent-peer
//!             timer, rate-limited warnings, the key table, the CQ ring, the readiness sets
//! spin clock  the spin lock of a connection's state and of a CQ ring's producers; the
//!             helper's clock (the timer that wakes it with no event)
//! progress    the progress policy, sans-IO (times passed in): when the helper sleeps,
//!             wakes and sweeps, who serves a link, when an ACK is held or a post's
//!             frames wait, a CQ's poll pace
//! ```
//!
//! `port`, `link`, `endpoint` (a CQ's attachments) and `watch` hold connections (or links)
//! without knowing their type (a type parameter, `TcpConn` or `InprocConn` above; a link asks
//! its QPs through the `Station` trait): what a connection is, only the `conn` files and
//! those above them know.
//!
//! # Semantics (what the engine may rely on)
//!
//! - **RC completions.** A signalled WRITE completes at the requester only after the
//!   responder placed every byte and acknowledged it, so post → completion is a true round
//!   trip. A READ completes when its data is in the local SGEs. Per QP, WRs execute at the
//!   responder in posting order and complete at the requester in posting order. Unsignalled
//!   WRs produce no completion unless they fail. A READ may observe a later WRITE of the
//!   same QP to the same bytes (as verbs without `IBV_SEND_FENCE`).
//! - **WRITE_WITH_IMM** takes exactly one SRQ WQE at the responder and produces one
//!   `RecvRdmaWithImm` completion (`imm`, `byte_len`, the responder QP's `qp_num`, `wr_id`
//!   0) on the responder QP's CQ, after the data is placed. With the SRQ empty the request
//!   waits (RNR with infinite retry): `rnr_events` counts it once, nothing behind it on that
//!   QP is executed or dropped, and it resumes when WQEs are posted. While it waits the
//!   responder sends RNR frames, so the requester does not take it for a silent peer.
//!   A 0-byte WRITE (with or without IMM) checks no rkey, as in verbs.
//! - **Placement order.** For a WRITE of at least 8 bytes whose end (`remote_addr + len`)
//!   is 8-aligned, the final 8 bytes are stored last, by one `AtomicU64` store with Release
//!   ordering, after every other byte of that WRITE. A thread that Acquire-loads that word
//!   and sees the new value sees the whole WRITE (what net_ib's CTS FIFO relies on from a
//!   NIC's in-order placement). No other intra-WRITE order is promised. In-process, a WRITE
//!   of at most 256 bytes stores every byte atomically, so a control word read while it is
//!   written reads whole (`placement.rs`).
//! - **Checks.** An incoming WRITE/READ is checked against the registration before any
//!   byte moves: unknown rkey, a range outside the region, or a missing `REMOTE_WRITE` /
//!   `REMOTE_READ` → the requester's WR completes with `RemoteAccessError`, not one byte is
//!   written, the requester QP goes to the error state (later WRs `Flushed`) and the
//!   responder drops every later request of that connection. A WRITE_WITH_IMM to a QP
//!   without an SRQ → `RemoteOpError`. Local SGEs must lie in a registration (lkey), inline
//!   ones too (they are copied at post time); else `LocalError`.
//! - **Faults.** A malformed frame, a frame for another QP, a request out of sequence or a
//!   peer that closes/resets → the QP goes to the error state: the oldest WR waiting on the
//!   peer completes with `RetryExceeded` (peer lost) and every other outstanding WR with
//!   `Flushed`; a WQE consumed by a half-received WRITE_WITH_IMM completes `Flushed`. Other
//!   QPs are not affected. A peer that goes silent without closing (host down, process
//!   stopped) is detected when requests wait on it and no byte moved for
//!   `4.096 µs × 2^timeout × (retry_cnt + 1)` (from `ConnectParams`, at least 100 ms; the
//!   defaults `MPIB_TIMEOUT=20`, `MPIB_RETRY_CNT=7` give 34.4 s); `TCP_USER_TIMEOUT` is set
//!   to the same bound.
//! - **Deregistration.** `dereg_mr` returns only when no placement into (or send from) the
//!   region is running; after it no byte lands there (see `mr.rs`).
//! - **Connection set-up.** `connect` never blocks; `is_ready` finishes the TCP connect or
//!   the accept, and fails when the peer QP has not connected within
//!   `SoftOptions::connect_timeout` (the plugin: the set-up deadline if one is set, else
//!   2 minutes; it runs only once both sides have made and exchanged their QPs).
//!
//! # Progress
//!
//! The NIC runs in the caller's thread: `post_send` sends what it can at once, and
//! `CompletionQueue::poll` makes one progress step on every QP attached to that CQ (read,
//! check, place, acknowledge, send, retire) before returning completions. A process that
//! makes no calls is still served, as a NIC would serve it, by one helper thread per TCP
//! device that sleeps in `epoll_wait` and steps in only for connections whose callers were
//! quiet for 10 ms (see `helper.rs`); while callers poll, it does not wake at all (`clock.rs`).
//!
//! In-process mode has no sockets, no threads and no stream: both ends are in this process,
//! so `post_send` executes each WR at once against the peer's registration, with the same
//! checks, placement order and completion semantics (see `direct.rs`); a WR that must wait
//! (empty SRQ, full CQ) is retried when either end polls a CQ of the connection.
//!
//! # Limits
//!
//! 65536 QPs and 1 Mi registrations per device, 32768 send WRs per QP, SRQ and CQ depth up
//! to 1 Mi, 2 SGEs, 1024 inline bytes, 2 GiB per WR, 16 READs in flight per TCP QP (more wait
//! in the send queue), host memory only.

mod addr;
mod clock;
mod conn;
mod conn_inproc;
mod conn_tcp;
mod cq;
mod device;
mod direct;
mod endpoint;
mod fault;
pub mod frame;
mod helper;
mod hook;
mod link;
mod liveness;
mod logs;
#[cfg(all(test, loom))]
mod loom_models;
mod mr;
mod placement;
mod port;
mod progress;
mod qp;
mod qp_recv;
mod qp_send;
mod requester;
mod responder;
mod ring;
mod spin;
mod station;
mod transport;
mod watch;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use addr::NOMINAL_SPEED_MBPS;
pub use conn_inproc::InprocNet;
pub use cq::{SoftCq, SoftSrq};
use device::OpenOn;
pub use device::{SoftDevice, SoftMr};
pub use liveness::silent_peer_bound;
pub use progress::IDLE as HELPER_IDLE;
pub use qp::SoftQp;

use crate::error::Result;
use crate::fabric::{Device, DeviceAttrs, LinkLayer, MemTypes, Progress};

/// How to open one soft device: what [`open`] takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftOptions {
    /// The device's name, as logs and NCCL show it (`soft-sout`, `inproc-sup`).
    pub name: String,
    /// What its connections run over.
    pub link: SoftLink,
    /// How long a connection may take to come up.
    pub connect_timeout: Duration,
}

impl SoftOptions {
    /// A TCP device on `ip` (no interface binding), with a 5 s connect timeout.
    pub fn tcp(name: &str, ip: IpAddr) -> SoftOptions {
        let link = SoftLink::Tcp(SoftBind { ip, iface: None, bind_iface: None });
        SoftOptions { name: name.to_string(), link, connect_timeout: Duration::from_secs(5) }
    }

    /// An in-process device on `net`, with a 5 s connect timeout.
    pub fn inproc(name: &str, net: &Arc<InprocNet>) -> SoftOptions {
        SoftOptions {
            name: name.to_string(),
            link: SoftLink::Inproc(net.clone()),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// What a soft device's connections run over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SoftLink {
    /// TCP, from a local address: its peers are devices of other processes (or this one)
    /// that reach that address.
    Tcp(SoftBind),
    /// In-process mode: both ends of every connection in this process, no sockets; its
    /// peers are the devices opened on the same network.
    Inproc(Arc<InprocNet>),
}

/// The local side of a TCP soft device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftBind {
    pub ip: IpAddr,
    /// The interface `ip` belongs to, if known: its sysfs entry gives the device's speed,
    /// MTU and PCI path.
    pub iface: Option<String>,
    /// Bind outgoing sockets to this interface (`SO_BINDTODEVICE`), so a rail's traffic
    /// leaves through its own NIC even where routing would pick another.
    pub bind_iface: Option<String>,
}

/// Opens a soft device. Its identity (`guid`) is derived from its name and binding, so the
/// same options give the same device in every process.
pub fn open(opts: &SoftOptions) -> Result<SoftDevice> {
    let timeout = opts.connect_timeout;
    let b = match &opts.link {
        SoftLink::Tcp(b) => b,
        SoftLink::Inproc(net) => {
            // In-process: a post executes against the peer at once; polls only collect.
            let at = attrs(&opts.name, None, &[&opts.name], Progress::Autonomous);
            return SoftDevice::open(at, OpenOn::Inproc(net.clone()), timeout);
        }
    };
    let ip_s = b.ip.to_string();
    let iface = b.iface.as_deref();
    let at = attrs(&opts.name, iface, &[&opts.name, &ip_s, iface.unwrap_or("")], Progress::OnPoll);
    let d = SoftDevice::open(at, OpenOn::Tcp(b.ip, b.bind_iface.clone()), timeout)?;
    let a = d.attrs();
    log::info!(
        "soft fabric: {} on {} (interface {}, {} Mbit/s, listening on {})",
        a.name,
        b.ip,
        iface.unwrap_or("?"),
        a.speed_mbps,
        d.local_addr().map_or("-".to_string(), |s| s.to_string())
    );
    Ok(d)
}

fn attrs(name: &str, iface: Option<&str>, id: &[&str], progress: Progress) -> DeviceAttrs {
    let speed = addr::speed_mbps(iface);
    let mut a = DeviceAttrs {
        name: name.to_string(),
        port: 1,
        link_layer: LinkLayer::Tcp,
        speed_mbps: speed.unwrap_or(NOMINAL_SPEED_MBPS),
        speed_known: speed.is_some(),
        mtu: addr::mtu(iface),
        max_qp: 0,
        max_qp_wr: 0,
        max_srq_wr: 0,
        max_cqe: 0,
        max_sge: 0,
        max_inline: 0,
        mem_types: MemTypes::HOST,
        completion_timestamps: false,
        progress,
        pci_path: addr::pci_path(iface),
        guid: addr::guid(&[&["soft"], id].concat()),
    };
    device::limits(&mut a);
    a
}

#[cfg(test)]
mod tests;
