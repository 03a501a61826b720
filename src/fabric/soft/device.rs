//! A soft device: one rail. Its protection domain is the key table, its port (`port.rs`)
//! a TCP listener bound to the rail's local address (none in in-process mode), and its
//! helper thread serves the peers of its QPs while this process makes no calls.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::addr::random_u64;
use super::conn_inproc::{InprocConn, InprocNet};
use super::conn_tcp::TcpConn;
use super::cq::{Conns, SoftCq, SoftSrq};
use super::endpoint::Endpoint;
use super::helper::Helper;
use super::mr::{MAX_MRS, MrTable};
use super::port::{Net, Port};
use super::qp::{self, SoftQp};
use crate::error::{Error, Result};
use crate::fabric::{Access, Device, DeviceAttrs, MrKeys, QpCaps, Timestamps};

/// A rail of the soft fabric (see the module documentation).
pub struct SoftDevice {
    attrs: DeviceAttrs,
    mrs: Arc<MrTable>,
    kind: Kind,
}

/// A TCP device, or an in-process one.
enum Kind {
    /// The port, and the helper thread (stopped when the device is dropped).
    Tcp(Arc<Port<TcpConn>>, Helper),
    /// The port, and the network its QPs are on.
    Inproc(Arc<Port<InprocConn>>, Arc<InprocNet>),
}

/// Where [`SoftDevice::open`] puts the device: TCP on an address (and interface to bind
/// its sockets to), or an in-process network.
pub(super) enum OpenOn {
    Tcp(IpAddr, Option<String>),
    Inproc(Arc<InprocNet>),
}

/// A registered region of a [`SoftDevice`]; deregistered by `dereg_mr` or on drop.
pub struct SoftMr {
    mrs: Arc<MrTable>,
    key: u32,
    live: bool,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        if self.live {
            let _ = self.mrs.dereg(self.key);
        }
    }
}

impl SoftDevice {
    /// Opens a device: over TCP from an address and interface, or on an in-process network.
    pub(super) fn open(attrs: DeviceAttrs, on: OpenOn, connect_timeout: Duration) -> Result<SoftDevice> {
        let first_qpn = (random_u64() as u32 & 0xFFFF) + 1;
        let mrs = Arc::new(MrTable::default());
        let (name, dev_id) = (attrs.name.clone(), random_u64());
        let kind = match on {
            OpenOn::Inproc(net) => {
                Kind::Inproc(Arc::new(Port::new(name, dev_id, connect_timeout, first_qpn, mrs.clone(), None)), net)
            }
            OpenOn::Tcp(ip, bind_iface) => {
                let net = Net::listen(&attrs.name, ip, bind_iface)?;
                let port = Arc::new(Port::new(name, dev_id, connect_timeout, first_qpn, mrs.clone(), Some(net)));
                let helper = Helper::start(&port, &attrs.name)?;
                Kind::Tcp(port, helper)
            }
        };
        Ok(SoftDevice { attrs, mrs, kind })
    }

    /// TCP: the device's network side.
    fn net(&self) -> Option<&Net<TcpConn>> {
        match &self.kind {
            Kind::Tcp(port, _) => port.net.as_ref(),
            Kind::Inproc(..) => None,
        }
    }

    /// The TCP address peers dial (`None` in in-process mode).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.net().map(|n| n.local)
    }

    /// TCP: the links open now (to peer devices: one each, shared by their QPs).
    pub fn links(&self) -> usize {
        self.net().map_or(0, |n| n.links().len())
    }

    /// TCP: changes how long callers must be quiet before the helper thread steps in
    /// (`HELPER_IDLE` by default; 0: it serves every event at once). For the
    /// `soft_progress` measurements.
    #[doc(hidden)]
    pub fn set_helper_idle(&self, d: Duration) {
        if let Some(n) = self.net() {
            n.watcher.clock.schedule.set_idle(d);
        }
    }

    /// TCP: how many times the helper thread waited to see whether callers serve the links
    /// it looked at (each wait is `ASK_AGAIN`, 100 µs).
    #[doc(hidden)]
    pub fn helper_asks(&self) -> u64 {
        self.net().map_or(0, |n| n.helper_asks.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// TCP: how many times the helper thread swept the device's links.
    #[doc(hidden)]
    pub fn helper_sweeps(&self) -> u64 {
        self.net().map_or(0, |n| n.helper_sweeps.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        if let Kind::Tcp(_, h) = &mut self.kind {
            h.shutdown();
        }
    }
}

impl Device for SoftDevice {
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = SoftQp;

    fn address_of(info: &crate::fabric::QpInfo) -> String {
        qp::describe_info(info)
    }

    fn attrs(&self) -> &DeviceAttrs {
        &self.attrs
    }

    fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<SoftMr> {
        // What the kernel's pinning checks for a verbs NIC: this NIC is the CPU, and a
        // peer's WRITE into a page that is not mapped writable would be a SIGSEGV.
        let write = access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        crate::fabric::mem::check_mapped(addr as u64, len as u64, write)?;
        let key = self.mrs.reg(addr as u64, len as u64, access)?;
        Ok(SoftMr { mrs: self.mrs.clone(), key, live: true })
    }

    fn reg_dmabuf_mr(&self, _fd: i32, _offset: u64, _len: usize, _iova: u64, _access: Access) -> Result<SoftMr> {
        Err(Error::invalid_usage(format!("soft fabric {}: registers host memory only (no DMA-BUF)", self.attrs.name)))
    }

    fn mr_keys(mr: &SoftMr) -> MrKeys {
        MrKeys { lkey: mr.key, rkey: mr.key }
    }

    fn dereg_mr(&self, mut mr: SoftMr) -> Result<()> {
        mr.live = false;
        self.mrs.dereg(mr.key)
    }

    fn create_cq(&self, depth: u32, _timestamps: Timestamps) -> Result<SoftCq> {
        check_depth("CQ", depth, self.attrs.max_cqe)?;
        Ok(SoftCq::new(depth, matches!(self.kind, Kind::Tcp(..))))
    }

    fn create_srq(&self, depth: u32) -> Result<SoftSrq> {
        check_depth("SRQ", depth, self.attrs.max_srq_wr)?;
        Ok(SoftSrq::new(depth))
    }

    fn create_qp(&self, cq: &SoftCq, srq: Option<&SoftSrq>, caps: QpCaps) -> Result<SoftQp> {
        let a = &self.attrs;
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
        let (count, qp_num) = match &self.kind {
            Kind::Tcp(port, _) => (port.qp_count(), port.next_qpn()),
            Kind::Inproc(port, _) => (port.qp_count(), port.next_qpn()),
        };
        if count >= a.max_qp as usize {
            crate::bail!(System, "soft fabric {}: more than {} QPs", a.name, a.max_qp);
        }
        let ep = Endpoint { qp_num, mrs: self.mrs.clone(), cq: cq.shared.clone(), srq: srq.map(|s| s.shared.clone()) };
        Ok(match (&self.kind, &cq.conns) {
            (Kind::Tcp(port, _), Conns::Tcp(poll)) => {
                let conn = Arc::new(TcpConn::new(ep, random_u64(), port.clone(), poll.attached.clone(), caps));
                port.qps.insert(qp_num, &conn);
                poll.attached.attach(conn.clone());
                SoftQp::Tcp(conn)
            }
            (Kind::Inproc(port, net), Conns::Inproc(poll)) => {
                let conn = InprocConn::new(ep, random_u64(), net, port.clone(), poll.attached.clone(), caps);
                port.qps.insert(qp_num, &conn);
                poll.attached.attach(conn.clone());
                SoftQp::Inproc(conn)
            }
            _ => crate::bail!(InvalidArgument, "soft fabric {}: the CQ is of a device of the other mode", a.name),
        })
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
