//! Soft queue pairs: connection info, connection set-up (TCP or in-process), posting.
//!
//! `QpInfo` (48 bytes): `[0]` version 1, `[1]` mode (4 = TCP/IPv4, 6 = TCP/IPv6,
//! 0 = in-process), `[2..4]` listener port (LE), `[4..8]` QP number, `[8..16]` nonce (a
//! random u64 that names the QP: the HELLO must quote it, and in-process QPs are found by
//! it), `[16..32]` IP address (IPv4 in the first 4 bytes), `[32..40]` device guid.
//!
//! One TCP connection carries one QP pair. Of the two QPs, the one with the smaller nonce
//! dials (from its rail's address, to the peer's listener) and sends a HELLO; the other
//! waits for it. Neither call blocks: `is_ready` finishes the work and fails after the
//! device's connect timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::conn::{Conn, ConnState, Phase, Remote};
use super::frame::Frame;
use super::liveness::silent_peer_bound;
use super::port::Port;
use super::transport::{DirectEnd, Link, TcpLink};
use crate::error::{Error, Result};
use crate::fabric::{ConnectParams, QP_INFO_LEN, QpInfo, QueuePair, SendWr};

const VERSION: u8 = 1;
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
    b[32..40].copy_from_slice(&port.guid.to_le_bytes());
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
    if b[0] != VERSION {
        return Err(bad("not a soft-fabric QP (version byte)"));
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
    })
}

impl SoftQp {
    /// The QP of connection `conn`.
    pub(super) fn new(conn: Arc<Conn>) -> SoftQp {
        SoftQp { conn }
    }

    fn dials(&self, remote: &Remote) -> bool {
        (self.conn.nonce, self.conn.qp_num()) < (remote.nonce, remote.qpn)
    }

    /// Starts a non-blocking TCP connect from the rail's address to the peer's listener.
    fn dial(&self, to: SocketAddr, bound: Duration) -> Result<Link> {
        let net = self.conn.port.net.as_ref().expect("TCP device");
        let what =
            |e: std::io::Error| Error::io(&format!("soft fabric QP {}: connecting to {to}", self.conn.qp_num()), &e);
        let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP)).map_err(what)?;
        s.set_nonblocking(true).map_err(what)?;
        s.set_tcp_nodelay(true).map_err(what)?;
        s.set_tcp_user_timeout(Some(bound)).map_err(what)?;
        if let Some(iface) = &net.bind_iface
            && let Err(e) = s.bind_device(Some(iface.as_bytes()))
        {
            log::debug!("soft fabric: SO_BINDTODEVICE {iface}: {e} (source address binding only)");
        }
        s.bind(&SockAddr::from(SocketAddr::new(net.local.ip(), 0))).map_err(what)?;
        match s.connect(&SockAddr::from(to)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(what(e)),
        }
        Ok(Link::Tcp(TcpLink::new(OwnedFd::from(s))))
    }

    /// Dialer: whether the TCP connect finished (re-dials after a refusal).
    fn check_dial(&self, st: &mut ConnState, deadline: Instant, retry_at: Option<Instant>) -> Result<bool> {
        let now = Instant::now();
        let remote = st.remote.expect("dialing has a remote");
        let to = remote.addr.expect("TCP remote");
        if let Some(at) = retry_at {
            if now < at {
                return self.timed_out(st, deadline, now);
            }
            st.link = Some(self.dial(to, st.bound())?);
            st.phase = Phase::Dialing { deadline, retry_at: None };
        }
        let fd = st.link.as_ref().and_then(|l| l.fd()).expect("dialing socket");
        let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one live pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n <= 0 {
            return self.timed_out(st, deadline, now);
        }
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_ERROR writes one c_int into `err`; `len` says so.
        unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&mut err as *mut libc::c_int).cast(), &mut len)
        };
        if err != 0 {
            log::debug!(
                "soft fabric QP {}: connect to {to}: {}",
                self.conn.qp_num(),
                std::io::Error::from_raw_os_error(err)
            );
            st.link = None;
            st.phase = Phase::Dialing { deadline, retry_at: Some(now + Duration::from_millis(20)) };
            return self.timed_out(st, deadline, now);
        }
        let link = st.link.take().expect("dialing socket");
        let hello = Frame::Hello {
            dst_qpn: remote.qpn,
            src_qpn: self.conn.qp_num(),
            dst_nonce: remote.nonce,
            src_nonce: self.conn.nonce,
        };
        st.queue_hello(hello);
        self.conn.attach(st, link);
        step_locked(&self.conn, st);
        Ok(true)
    }

    fn timed_out(&self, st: &mut ConnState, deadline: Instant, now: Instant) -> Result<bool> {
        if now < deadline {
            return Ok(false);
        }
        let msg = format!(
            "soft fabric QP {}: the peer did not connect within {:?}",
            self.conn.qp_num(),
            self.conn.port.connect_timeout
        );
        self.conn.fail(st, None, &msg);
        Err(Error::remote(msg))
    }

    /// In-process dialer: builds the link pair and hands the peer its end.
    fn connect_inproc(&self, st: &mut ConnState, remote: Remote) -> Result<()> {
        let peer = inproc_find(remote.nonce).ok_or_else(|| {
            Error::invalid_argument(format!("soft fabric (in-process): no QP {} in this process", remote.qpn))
        })?;
        let (mine, theirs) = DirectEnd::pair((&self.conn.ep, &self.conn.work), (&peer.ep, &peer.work));
        {
            let mut ps = peer.st.lock();
            let me = Some(Remote { qpn: self.conn.qp_num(), nonce: self.conn.nonce, addr: None });
            match ps.phase {
                Phase::Created => ps.parked = Some((Link::Direct(theirs), self.conn.qp_num(), self.conn.nonce)),
                Phase::Waiting { .. } if ps.remote == me => {
                    theirs.set_ready();
                    ps.link = Some(Link::Direct(theirs));
                    ps.phase = Phase::Ready;
                }
                _ => crate::bail!(InvalidUsage, "soft fabric (in-process): QP {} is connected elsewhere", remote.qpn),
            }
        }
        let _ = peer.inproc_peer.set((Arc::downgrade(&self.conn), self.conn.work.clone()));
        let _ = self.conn.inproc_peer.set((Arc::downgrade(&peer), peer.work.clone()));
        st.link = Some(Link::Direct(mine));
        st.phase = Phase::Ready;
        Ok(())
    }
}

/// One progress step with the state already locked (then the in-process peer's).
fn step_locked(c: &Conn, st: &mut ConnState) {
    c.progress(st, true);
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
        let mut st = self.conn.st.lock();
        if !matches!(st.phase, Phase::Created) {
            crate::bail!(InvalidUsage, "soft fabric QP {}: connect called twice", self.conn.qp_num());
        }
        st.remote = Some(r);
        st.set_bound(silent_peer_bound(params));
        let deadline = Instant::now() + self.conn.port.connect_timeout;
        if self.dials(&r) {
            match r.addr {
                Some(to) => {
                    st.link = Some(self.dial(to, st.bound())?);
                    st.phase = Phase::Dialing { deadline, retry_at: None };
                }
                None => self.connect_inproc(&mut st, r)?,
            }
            return Ok(());
        }
        match st.parked.take() {
            Some((link, qpn, nonce)) if qpn == r.qpn && nonce == r.nonce => self.conn.attach(&mut st, link),
            _ => st.phase = Phase::Waiting { deadline },
        }
        Ok(())
    }

    fn is_ready(&mut self) -> Result<bool> {
        let mut st = self.conn.st.lock();
        match st.phase {
            Phase::Ready => Ok(true),
            Phase::Error => Err(Error::remote(format!("soft fabric QP {}: in the error state", self.conn.qp_num()))),
            Phase::Created => {
                Err(Error::invalid_usage(format!("soft fabric QP {}: is_ready before connect", self.conn.qp_num())))
            }
            Phase::Dialing { deadline, retry_at } => self.check_dial(&mut st, deadline, retry_at),
            Phase::Waiting { deadline } => {
                drop(st);
                self.conn.port.drive_accept();
                let mut st = self.conn.st.lock();
                match st.phase {
                    Phase::Ready => Ok(true),
                    _ => self.timed_out(&mut st, deadline, Instant::now()),
                }
            }
        }
    }

    fn post_send(&mut self, chain: &[SendWr]) -> Result<()> {
        let mut st = self.conn.st.lock();
        if self.conn.inproc {
            // Executed at once (see `direct.rs`).
            return self.conn.post_inproc(&mut st, chain);
        }
        self.conn.post(&mut st, chain)?;
        // Send what fits now.
        step_locked(&self.conn, &mut st);
        Ok(())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.conn.attached.detach(&self.conn);
        self.conn.port.forget_qp(self.conn.qp_num());
        if self.conn.port.net.is_none()
            && let Some(m) = INPROC.lock().as_mut()
        {
            m.remove(&self.conn.nonce);
        }
        let mut st = self.conn.st.lock();
        st.phase = Phase::Error;
        st.parked = None;
        self.conn.close_link(&mut st);
    }
}
