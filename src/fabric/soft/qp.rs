//! Soft queue pairs: connection info, connection set-up (a link to the peer's device, or
//! an in-process peer), posting.
//!
//! `QpInfo` (48 bytes): `[0]` version 2, `[1]` mode (4 = TCP/IPv4, 6 = TCP/IPv6,
//! 0 = in-process), `[2..4]` listener port (LE), `[4..8]` QP number, `[8..16]` nonce (a
//! random u64 that names the QP: the peer's CONNECT must quote it, and in-process QPs are
//! found by it), `[16..32]` IP address (IPv4 in the first 4 bytes), `[32..40]` the device's
//! identity (random per opening: the key of the link between two devices), `[40..48]` 0.
//!
//! TCP: QPs of one device to QPs of one peer device share one link (`link.rs`), dialed by
//! the device with the smaller identity; each QP sends a CONNECT on it and is ready when
//! its peer's arrives (`station.rs`). Neither call blocks: `is_ready` finishes the work and
//! fails after the device's connect timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::conn::{Conn, ConnState, Phase, Remote, Wire};
use super::liveness::silent_peer_bound;
use super::port::Port;
use super::transport::DirectEnd;
use crate::error::{Error, Result};
use crate::fabric::{ConnectParams, FaultKind, QP_INFO_LEN, QpInfo, QueuePair, SendWr};

const VERSION: u8 = 2;
const MODE_INPROC: u8 = 0;

static INPROC: Mutex<Option<std::collections::HashMap<u64, Weak<Conn>>>> = Mutex::new(None);

pub fn inproc_register(c: &Arc<Conn>) {
    INPROC.lock().get_or_insert_with(Default::default).insert(c.nonce, Arc::downgrade(c));
}

fn inproc_find(nonce: u64) -> Option<Arc<Conn>> {
    INPROC.lock().as_ref()?.get(&nonce)?.upgrade()
}

/// A soft RC queue pair. One pointer: the plugin keeps QPs in arrays it indexes on every
/// post, and a larger handle costs instructions there (everything else a QP needs, its
/// connection holds).
pub struct SoftQp {
    conn: Arc<Conn>,
}

fn encode_info(c: &Conn, port: &Port<Conn>) -> QpInfo {
    let mut b = [0u8; QP_INFO_LEN];
    b[0] = VERSION;
    b[4..8].copy_from_slice(&c.qp_num().to_le_bytes());
    b[8..16].copy_from_slice(&c.nonce.to_le_bytes());
    b[32..40].copy_from_slice(&port.dev_id.to_le_bytes());
    match port.net.as_ref().map(|n| n.local) {
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
    /// The QP of connection `conn`.
    pub(super) fn new(conn: Arc<Conn>) -> SoftQp {
        SoftQp { conn }
    }

    /// Frames for this QP its responder dropped in the error state (TCP): what proves that
    /// requests held past a fence (`FaultKind::HoldPastFence`) reached it and were refused.
    pub fn dropped_late(&self) -> u64 {
        self.conn.st.lock().dropped_late
    }

    fn dials(&self, remote: &Remote) -> bool {
        (self.conn.nonce, self.conn.qp_num()) < (remote.nonce, remote.qpn)
    }

    /// In-process dialer: builds the link pair and hands the peer its end.
    fn connect_inproc(&self, st: &mut ConnState, remote: Remote) -> Result<()> {
        let peer = inproc_find(remote.nonce).ok_or_else(|| {
            Error::invalid_argument(format!("soft fabric (in-process): no QP {} in this process", remote.qpn))
        })?;
        let (mine, theirs) = DirectEnd::pair((&self.conn.ep, &self.conn.work), (&peer.ep, &peer.work));
        {
            let mut ps = peer.st.lock();
            let me = Some(Remote { qpn: self.conn.qp_num(), nonce: self.conn.nonce, addr: None, dev: remote.dev });
            match ps.phase {
                Phase::Created => ps.direct_parked = Some((theirs, self.conn.qp_num(), self.conn.nonce)),
                Phase::Waiting { .. } if ps.remote.map(|r| (r.qpn, r.nonce)) == me.map(|r| (r.qpn, r.nonce)) => {
                    peer.attach_direct(&mut ps, theirs);
                }
                _ => crate::bail!(InvalidUsage, "soft fabric (in-process): QP {} is connected elsewhere", remote.qpn),
            }
        }
        let _ = peer.inproc_peer.set((Arc::downgrade(&self.conn), self.conn.work.clone()));
        let _ = self.conn.inproc_peer.set((Arc::downgrade(&peer), peer.work.clone()));
        // Ready on this side; WRs execute once the peer connects too (its end sets READY).
        st.wire = Some(Wire::Direct(mine));
        st.phase = Phase::Ready;
        Ok(())
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.conn.qp_num()
    }

    fn local_info(&self) -> QpInfo {
        encode_info(&self.conn, &self.conn.port)
    }

    fn connect(&mut self, remote: &QpInfo, params: &ConnectParams) -> Result<()> {
        let r = decode_info(remote)?;
        if r.addr.is_some() != self.conn.port.net.is_some() {
            crate::bail!(
                InvalidArgument,
                "soft fabric QP {}: peer is {} mode, this QP is not",
                self.conn.qp_num(),
                if r.addr.is_some() { "TCP" } else { "in-process" }
            );
        }
        let bound = silent_peer_bound(params);
        if r.addr.is_some() {
            return self.conn.connect_tcp(r, bound);
        }
        let mut st = self.conn.st.lock();
        if !matches!(st.phase, Phase::Created) {
            crate::bail!(InvalidUsage, "soft fabric QP {}: connect called twice", self.conn.qp_num());
        }
        st.remote = Some(r);
        st.bound = bound;
        if self.dials(&r) {
            return self.connect_inproc(&mut st, r);
        }
        match st.direct_parked.take() {
            Some((end, qpn, nonce)) if qpn == r.qpn && nonce == r.nonce => self.conn.attach_direct(&mut st, end),
            _ => st.phase = Phase::Waiting { deadline: Instant::now() + self.conn.port.connect_timeout },
        }
        Ok(())
    }

    fn is_ready(&mut self) -> Result<bool> {
        if !self.conn.inproc {
            return self.conn.is_ready_tcp();
        }
        let mut st = self.conn.st.lock();
        match st.phase {
            Phase::Ready => Ok(true),
            Phase::Error => Err(Error::remote(format!("soft fabric QP {}: in the error state", self.conn.qp_num()))),
            Phase::Created => {
                Err(Error::invalid_usage(format!("soft fabric QP {}: is_ready before connect", self.conn.qp_num())))
            }
            Phase::Waiting { deadline } if Instant::now() < deadline => Ok(false),
            Phase::Waiting { .. } => {
                let why = format!("the peer did not connect within {:?}", self.conn.port.connect_timeout);
                self.conn.fail(&mut st, None, &why, true);
                Err(Error::remote(format!("soft fabric QP {}: {why}", self.conn.qp_num())))
            }
        }
    }

    fn post_send(&mut self, chain: &[SendWr]) -> Result<()> {
        if self.conn.inproc {
            // Executed at once (see `direct.rs`).
            return self.conn.post_inproc(&mut self.conn.st.lock(), chain);
        }
        self.conn.post_tcp(chain)
    }

    fn to_error(&mut self) -> Result<()> {
        self.conn.to_error(false, "fenced (rail failover)");
        Ok(())
    }

    fn inject_fault(&mut self, kind: FaultKind) -> Result<bool> {
        if kind == FaultKind::LinkLoss {
            self.conn.to_error(true, "link lost (fault drill, MPIB_FAULT_RAIL)");
            return Ok(true);
        }
        Ok(self.conn.arm(kind))
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let late = self.conn.st.lock().dropped_late;
        if late > 0 {
            // What a drill's hold (`MPIB_FAULT_RAIL=..:hold`) shows through the C ABI.
            log::info!("soft fabric: QP {}: {late} frames came after its error state, dropped", self.conn.qp_num());
        }
        self.conn.attached.detach(&self.conn);
        self.conn.port.qps.remove(self.conn.qp_num());
        if !self.conn.inproc {
            self.conn.destroy_tcp();
            return;
        }
        if let Some(m) = INPROC.lock().as_mut() {
            m.remove(&self.conn.nonce);
        }
        let mut st = self.conn.st.lock();
        st.phase = Phase::Error;
        st.direct_parked = None;
        st.wire = None;
    }
}
