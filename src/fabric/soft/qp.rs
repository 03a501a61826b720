//! Soft queue pairs: the handle the engine holds, one interface over the two kinds of
//! connection (TCP, `conn_tcp.rs`; in-process, `conn_inproc.rs`), and the connection info.
//!
//! `QpInfo` (48 bytes): `[0]` version 2, `[1]` mode (4 = TCP/IPv4, 6 = TCP/IPv6,
//! 0 = in-process), `[2..4]` listener port (LE), `[4..8]` QP number, `[8..16]` nonce (a
//! random u64 that names the QP: the peer's CONNECT must quote it, and in-process QPs are
//! found by it), `[16..32]` IP address (IPv4 in the first 4 bytes), `[32..40]` the device's
//! identity (random per opening: the key of the link between two devices), `[40..48]` 0.
//!
//! TCP: QPs of one device to QPs of one peer device share one link (`link.rs`), dialed by
//! the device with the smaller identity; each QP sends a CONNECT on it and is ready when
//! its peer's arrives (`station.rs`); in-process QPs find each other by nonce
//! (`conn_inproc.rs`). Neither call blocks: `is_ready` finishes the work and
//! fails after the device's connect timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use super::conn::Remote;
use super::conn_inproc::InprocConn;
use super::conn_tcp::TcpConn;
use super::liveness::silent_peer_bound;
use crate::error::{Error, Result};
use crate::fabric::{ConnectParams, FaultKind, QP_INFO_LEN, QpInfo, QueuePair, SendWr};

const VERSION: u8 = 2;
const MODE_INPROC: u8 = 0;

/// A soft RC queue pair: its connection, of the device's kind. The plugin keeps QPs in
/// arrays it indexes on every post; the tag sits beside the pointer, so telling the kinds
/// apart costs no load through it.
pub enum SoftQp {
    Tcp(Arc<TcpConn>),
    Inproc(Arc<InprocConn>),
}

/// `$body` on the QP's connection, whichever its kind, named `$c` (the same source
/// compiled for each kind).
macro_rules! on_conn {
    ($qp:expr, $c:ident => $body:expr) => {
        match $qp {
            SoftQp::Tcp($c) => $body,
            SoftQp::Inproc($c) => $body,
        }
    };
}

/// What `QpInfo` says of this side: QP number, nonce, device identity, TCP address.
fn encode_info(qpn: u32, nonce: u64, dev_id: u64, addr: Option<SocketAddr>) -> QpInfo {
    let mut b = [0u8; QP_INFO_LEN];
    b[0] = VERSION;
    b[4..8].copy_from_slice(&qpn.to_le_bytes());
    b[8..16].copy_from_slice(&nonce.to_le_bytes());
    b[32..40].copy_from_slice(&dev_id.to_le_bytes());
    match addr {
        None => b[1] = MODE_INPROC,
        Some(SocketAddr::V4(a)) => {
            b[1] = 4;
            b[2..4].copy_from_slice(&a.port().to_le_bytes());
            b[16..20].copy_from_slice(&a.ip().octets());
        }
        Some(SocketAddr::V6(a)) => {
            b[1] = 6;
            b[2..4].copy_from_slice(&a.port().to_le_bytes());
            b[16..32].copy_from_slice(&a.ip().octets());
        }
    }
    QpInfo(b)
}

fn decode_info(info: &QpInfo) -> Result<Remote> {
    let b = &info.0;
    let bad = |why: &str| Error::invalid_argument(format!("soft fabric: peer QpInfo {info:?}: {why}"));
    match b[0] {
        VERSION => {}
        1 => return Err(bad("a soft fabric of wire version 1 (this is 2): both sides need the same mpib")),
        _ => return Err(bad("not a soft-fabric QP (version byte)")),
    }
    let port = u16::from_le_bytes([b[2], b[3]]);
    let addr = match b[1] {
        MODE_INPROC => None,
        4 => Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[16..20]).expect("4"))), port)),
        6 => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[16..32]).expect("16"))), port)),
        _ => return Err(bad("unknown mode")),
    };
    Ok(Remote {
        qpn: u32::from_le_bytes(b[4..8].try_into().expect("4")),
        nonce: u64::from_le_bytes(b[8..16].try_into().expect("8")),
        addr,
        dev: u64::from_le_bytes(b[32..40].try_into().expect("8")),
    })
}

/// Where a QP's info says it is, for logs: `IP:port` of its device's TCP port, or the
/// in-process device.
pub(super) fn describe_info(info: &QpInfo) -> String {
    match decode_info(info) {
        Ok(Remote { addr: Some(a), .. }) => a.to_string(),
        Ok(Remote { dev, .. }) => format!("in-process device {dev:#x}"),
        Err(_) => "an unreadable QP info".to_string(),
    }
}

impl SoftQp {
    /// Frames for this QP its responder dropped in the error state (TCP): what proves that
    /// requests held past a fence (`FaultKind::HoldPastFence`) reached it and were refused.
    pub fn dropped_late(&self) -> u64 {
        match self {
            SoftQp::Tcp(c) => c.st.lock().dropped_late,
            SoftQp::Inproc(_) => 0,
        }
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        on_conn!(self, c => c.ep.qp_num)
    }

    fn local_info(&self) -> QpInfo {
        match self {
            SoftQp::Tcp(c) => encode_info(c.ep.qp_num, c.nonce, c.port.dev_id, c.port.net.as_ref().map(|n| n.local)),
            SoftQp::Inproc(c) => encode_info(c.ep.qp_num, c.nonce, c.port.dev_id, None),
        }
    }

    fn connect(&mut self, remote: &QpInfo, params: &ConnectParams) -> Result<()> {
        let r = decode_info(remote)?;
        let bound = silent_peer_bound(params);
        match self {
            SoftQp::Tcp(c) if r.addr.is_some() => c.connect(r, bound),
            SoftQp::Inproc(c) if r.addr.is_none() => c.connect(r, bound),
            _ => crate::bail!(
                InvalidArgument,
                "soft fabric QP {}: peer is {} mode, this QP is not",
                self.qp_num(),
                if r.addr.is_some() { "TCP" } else { "in-process" }
            ),
        }
    }

    fn is_ready(&mut self) -> Result<bool> {
        on_conn!(self, c => c.is_ready())
    }

    #[inline]
    fn post_send(&mut self, chain: &[SendWr]) -> Result<()> {
        match self {
            // Executed at once (see `direct.rs`).
            SoftQp::Inproc(c) => c.post(&mut c.st.lock(), chain),
            SoftQp::Tcp(c) => c.post(chain),
        }
    }

    fn to_error(&mut self) -> Result<()> {
        const FENCED: &str = "fenced (rail failover)";
        on_conn!(self, c => c.to_error(false, FENCED));
        Ok(())
    }

    fn inject_fault(&mut self, kind: FaultKind) -> Result<bool> {
        const LOST: &str = "link lost (fault drill, MPIB_FAULT_RAIL)";
        if kind == FaultKind::LinkLoss {
            on_conn!(self, c => c.to_error(true, LOST));
            return Ok(true);
        }
        Ok(match self {
            SoftQp::Tcp(c) => c.arm(kind),
            // No wire to lose a frame on.
            SoftQp::Inproc(_) => false,
        })
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        on_conn!(self, c => c.destroy())
    }
}
