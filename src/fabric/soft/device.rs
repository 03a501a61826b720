//! A soft device: one rail. Its protection domain is the key table, its "port" a TCP
//! listener bound to the rail's local address (none in in-process mode), and its helper
//! thread serves the peers of its QPs while this process makes no calls.

use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::conn::{Conn, ConnState, Phase};
use super::cq::{SoftCq, SoftSrq};
use super::frame::{Frame, HDR_LEN, decode};
use super::helper::Helper;
use super::link::Link;
use super::mr::{MAX_MRS, MrTable};
use super::qp::{SoftQp, random_u64};
use crate::error::{Error, Result};
use crate::fabric::{Access, Device, DeviceAttrs, MrKeys, QpCaps, Timestamps};

/// The TCP side of a device.
pub struct Net {
    /// The rail's local address, with the listener's port.
    pub local: SocketAddr,
    /// Interface to bind outgoing sockets to (`SO_BINDTODEVICE`), when the rail was named
    /// by interface.
    pub bind_iface: Option<String>,
    acceptor: Mutex<Acceptor>,
    pub helper: Helper,
}

struct Acceptor {
    listener: TcpListener,
    pending: Vec<Pending>,
}

/// An accepted socket whose HELLO has not fully arrived.
struct Pending {
    sock: TcpStream,
    hdr: [u8; HDR_LEN],
    got: usize,
    since: Instant,
}

pub struct DevShared {
    pub attrs: DeviceAttrs,
    pub mrs: MrTable,
    /// `None`: in-process mode.
    pub net: Option<Net>,
    qps: Mutex<HashMap<u32, Weak<Conn>>>,
    next_qpn: AtomicU32,
    pub connect_timeout: Duration,
}

impl DevShared {
    pub fn helper_forget(&self, fd: i32) {
        if let Some(net) = &self.net {
            net.helper.forget(fd);
        }
    }

    pub fn forget_qp(&self, qpn: u32) {
        self.qps.lock().remove(&qpn);
    }

    /// Accepts dialers and reads their HELLOs; attaches (or parks) each at its QP.
    /// Returns whether HELLOs are still incomplete.
    pub fn drive_accept(self: &Arc<Self>) -> bool {
        let Some(net) = &self.net else { return false };
        let mut a = net.acceptor.lock();
        loop {
            match a.listener.accept() {
                Ok((sock, _)) => {
                    if sock.set_nonblocking(true).is_err() || sock.set_nodelay(true).is_err() {
                        continue;
                    }
                    a.pending.push(Pending { sock, hdr: [0; HDR_LEN], got: 0, since: Instant::now() });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("soft fabric {}: accept failed: {e}", self.attrs.name);
                    break;
                }
            }
        }
        let mut i = 0;
        while i < a.pending.len() {
            let p = &mut a.pending[i];
            let r = (&p.sock).read(&mut p.hdr[p.got..]);
            let keep = match r {
                Ok(0) => false,
                Ok(n) => {
                    p.got += n;
                    true
                }
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            };
            if keep && p.got < HDR_LEN && p.since.elapsed() < self.connect_timeout {
                i += 1;
                continue;
            }
            let p = a.pending.swap_remove(i);
            if p.got == HDR_LEN {
                self.dispatch(p.sock, &p.hdr);
            }
        }
        !a.pending.is_empty()
    }

    fn dispatch(self: &Arc<Self>, sock: TcpStream, hdr: &[u8; HDR_LEN]) {
        let Ok(Frame::Hello { dst_qpn, src_qpn, dst_nonce, src_nonce }) = decode(hdr) else {
            log::warn!("soft fabric {}: a connection did not start with a HELLO; closed", self.attrs.name);
            return;
        };
        let conn = self.qps.lock().get(&dst_qpn).and_then(|w| w.upgrade());
        let Some(conn) = conn.filter(|c| c.nonce == dst_nonce) else {
            log::warn!("soft fabric {}: HELLO for unknown QP {dst_qpn}; closed", self.attrs.name);
            return;
        };
        let link = Link::Tcp(OwnedFd::from(sock));
        let mut st = conn.st.lock();
        match st.phase {
            Phase::Created => st.parked = Some((link, src_qpn, src_nonce)),
            Phase::Waiting { .. } if st.remote.is_some_and(|r| r.qpn == src_qpn && r.nonce == src_nonce) => {
                self.attach(&conn, &mut st, link)
            }
            _ => log::warn!(
                "soft fabric {}: unexpected HELLO for QP {dst_qpn} from QP {src_qpn}; closed",
                self.attrs.name
            ),
        }
    }

    /// Arms `EPOLLOUT` for a connection whose socket is full.
    pub fn helper_want_write(&self, st: &mut ConnState) {
        if let (Some(net), Some(t), Some(fd)) = (&self.net, st.helper_token, st.link.as_ref().and_then(|l| l.fd())) {
            net.helper.rearm(fd, t, true);
            st.out_armed = true;
        }
    }

    /// The connection is established on `link`.
    pub fn attach(&self, conn: &Arc<Conn>, st: &mut ConnState, link: Link) {
        if let (Some(net), Some(fd)) = (&self.net, link.fd()) {
            if let Link::Tcp(owned) = &link {
                // The kernel gives up on unacknowledged data after the same bound as we do.
                let _ = socket2::SockRef::from(owned).set_tcp_user_timeout(Some(st.bound));
            }
            st.helper_token = Some(net.helper.add(conn, fd, true));
            st.out_armed = true;
        }
        if let Link::Direct(end) = &link {
            end.set_ready();
        }
        st.link = Some(link);
        st.phase = Phase::Ready;
    }
}

/// A rail of the soft fabric (see the module documentation).
pub struct SoftDevice {
    pub(super) shared: Arc<DevShared>,
}

/// A registered region of a [`SoftDevice`]; deregistered by `dereg_mr` or on drop.
pub struct SoftMr {
    dev: Arc<DevShared>,
    key: u32,
    live: bool,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        if self.live {
            let _ = self.dev.mrs.dereg(self.key);
        }
    }
}

impl SoftDevice {
    /// Opens a device; `net` is `None` for in-process mode.
    pub(super) fn open(
        attrs: DeviceAttrs,
        net: Option<(IpAddr, Option<String>)>,
        connect_timeout: Duration,
    ) -> Result<SoftDevice> {
        let net = match net {
            None => None,
            Some((ip, bind_iface)) => {
                let listener = TcpListener::bind((ip, 0))
                    .map_err(|e| Error::io(&format!("soft fabric {}: listening on {ip}", attrs.name), &e))?;
                listener.set_nonblocking(true).map_err(|e| Error::io("soft fabric: listener", &e))?;
                let local = listener.local_addr().map_err(|e| Error::io("soft fabric: listener address", &e))?;
                let helper = Helper::new(listener.as_raw_fd())?;
                Some(Net {
                    local,
                    bind_iface,
                    acceptor: Mutex::new(Acceptor { listener, pending: Vec::new() }),
                    helper,
                })
            }
        };
        let name = attrs.name.clone();
        let shared = Arc::new(DevShared {
            attrs,
            mrs: MrTable::default(),
            net,
            qps: Mutex::new(HashMap::new()),
            next_qpn: AtomicU32::new((random_u64() as u32 & 0xFFFF) + 1),
            connect_timeout,
        });
        if shared.net.is_some() {
            Helper::start(&shared, &name)?;
        }
        Ok(SoftDevice { shared })
    }

    /// The TCP address peers dial (`None` in in-process mode).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.net.as_ref().map(|n| n.local)
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        if let Some(net) = &self.shared.net {
            net.helper.shutdown();
        }
    }
}

impl Device for SoftDevice {
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = SoftQp;

    fn attrs(&self) -> &DeviceAttrs {
        &self.shared.attrs
    }

    fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<SoftMr> {
        let key = self.shared.mrs.reg(addr as u64, len as u64, access)?;
        Ok(SoftMr { dev: self.shared.clone(), key, live: true })
    }

    fn reg_dmabuf_mr(&self, _fd: i32, _offset: u64, _len: usize, _iova: u64, _access: Access) -> Result<SoftMr> {
        Err(Error::invalid_usage(format!(
            "soft fabric {}: registers host memory only (no DMA-BUF)",
            self.shared.attrs.name
        )))
    }

    fn mr_keys(mr: &SoftMr) -> MrKeys {
        MrKeys { lkey: mr.key, rkey: mr.key }
    }

    fn dereg_mr(&self, mut mr: SoftMr) -> Result<()> {
        mr.live = false;
        self.shared.mrs.dereg(mr.key)
    }

    fn create_cq(&self, depth: u32, _timestamps: Timestamps) -> Result<SoftCq> {
        check_depth("CQ", depth, self.shared.attrs.max_cqe)?;
        Ok(SoftCq::new(depth))
    }

    fn create_srq(&self, depth: u32) -> Result<SoftSrq> {
        check_depth("SRQ", depth, self.shared.attrs.max_srq_wr)?;
        Ok(SoftSrq::new(depth))
    }

    fn create_qp(&self, cq: &SoftCq, srq: Option<&SoftSrq>, caps: QpCaps) -> Result<SoftQp> {
        let a = &self.shared.attrs;
        check_depth("send queue", caps.max_send_wr, a.max_qp_wr)?;
        if caps.max_inline > a.max_inline {
            crate::bail!(
                InvalidArgument,
                "soft fabric {}: max_inline {} above {}",
                a.name,
                caps.max_inline,
                a.max_inline
            );
        }
        if self.shared.qps.lock().len() >= a.max_qp as usize {
            crate::bail!(System, "soft fabric {}: more than {} QPs", a.name, a.max_qp);
        }
        let qp_num = self.shared.next_qpn.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            qp_num,
            nonce: random_u64(),
            dev: self.shared.clone(),
            cq: cq.shared.clone(),
            srq: srq.map(|s| s.shared.clone()),
            st: Mutex::new(ConnState::new(caps.max_send_wr, caps.max_inline as usize)),
            caller_epoch: Default::default(),
            inproc: self.shared.net.is_none(),
            work: Default::default(),
            inproc_peer: OnceLock::new(),
        });
        self.shared.qps.lock().insert(qp_num, Arc::downgrade(&conn));
        if self.shared.net.is_none() {
            super::qp::inproc_register(&conn);
        }
        cq.shared.attach(conn.clone());
        Ok(SoftQp { conn })
    }
}

fn check_depth(what: &str, depth: u32, max: u32) -> Result<()> {
    if depth == 0 || depth > max {
        crate::bail!(InvalidArgument, "soft fabric: {what} depth {depth} outside 1..={max}");
    }
    Ok(())
}

/// Limits every soft device reports (documented in the module doc).
pub fn limits(attrs: &mut DeviceAttrs) {
    attrs.max_qp = 1 << 16;
    attrs.max_qp_wr = 1 << 15;
    attrs.max_srq_wr = 1 << 20;
    attrs.max_cqe = 1 << 20;
    attrs.max_sge = crate::fabric::MAX_SGE as u32;
    attrs.max_inline = 1024;
    let _ = MAX_MRS;
}
