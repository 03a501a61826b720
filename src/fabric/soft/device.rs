//! A soft device: one rail. Its protection domain is the key table, its port (`port.rs`)
//! a TCP listener bound to the rail's local address (none in in-process mode), and its
//! helper thread serves the peers of its QPs while this process makes no calls.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::addr::random_u64;
use super::conn::Conn;
use super::cq::{SoftCq, SoftSrq};
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
    port: Arc<Port<Conn>>,
    /// TCP: the helper thread, stopped when the device is dropped.
    helper: Option<Helper>,
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
    /// Opens a device; `net` is `None` for in-process mode.
    pub(super) fn open(
        attrs: DeviceAttrs,
        net: Option<(IpAddr, Option<String>)>,
        connect_timeout: Duration,
    ) -> Result<SoftDevice> {
        let net = match net {
            None => None,
            Some((ip, bind_iface)) => Some(Net::listen(&attrs.name, ip, bind_iface)?),
        };
        let first_qpn = (random_u64() as u32 & 0xFFFF) + 1;
        let mrs = Arc::new(MrTable::default());
        let name = attrs.name.clone();
        let port = Arc::new(Port::new(name, random_u64(), connect_timeout, first_qpn, mrs.clone(), net));
        let helper = match port.net {
            Some(_) => Some(Helper::start(&port, &attrs.name)?),
            None => None,
        };
        Ok(SoftDevice { attrs, mrs, port, helper })
    }

    /// The TCP address peers dial (`None` in in-process mode).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.port.net.as_ref().map(|n| n.local)
    }

    /// TCP: the links open now (to peer devices: one each, shared by their QPs).
    pub fn links(&self) -> usize {
        self.port.net.as_ref().map_or(0, |n| n.links().len())
    }

    /// Warnings a peer provoked, as logged (each kind at most once per 5 s).
    #[doc(hidden)]
    pub fn warnings_logged(&self) -> u64 {
        let w = &self.port.warn;
        [&w.accept, &w.hello, &w.stray, &w.qp, &w.link].iter().map(|l| l.written()).sum()
    }

    /// TCP: changes how long callers must be quiet before the helper thread steps in
    /// (`HELPER_IDLE` by default; 0: it serves every event at once). For the
    /// `soft_progress` measurements.
    #[doc(hidden)]
    pub fn set_helper_idle(&self, d: Duration) {
        if let Some(n) = &self.port.net {
            n.watcher.clock.schedule.set_idle(d);
        }
    }

    /// TCP: how many times the helper thread waited to see whether callers serve the links
    /// it looked at (each wait is `ASK_AGAIN`, 100 µs).
    #[doc(hidden)]
    pub fn helper_asks(&self) -> u64 {
        self.port.net.as_ref().map_or(0, |n| n.helper_asks.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl SoftDevice {
    /// TCP: how many times the helper thread swept the device's links.
    #[doc(hidden)]
    pub fn helper_sweeps(&self) -> u64 {
        self.port.net.as_ref().map_or(0, |n| n.helper_sweeps.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        if let Some(h) = &mut self.helper {
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
        Ok(SoftCq::new(depth))
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
        if self.port.qp_count() >= a.max_qp as usize {
            crate::bail!(System, "soft fabric {}: more than {} QPs", a.name, a.max_qp);
        }
        let qp_num = self.port.next_qpn();
        let ep = Endpoint { qp_num, mrs: self.mrs.clone(), cq: cq.shared.clone(), srq: srq.map(|s| s.shared.clone()) };
        let conn = Arc::new(Conn::new(ep, random_u64(), self.port.clone(), cq.attached.clone(), caps));
        self.port.qps.insert(qp_num, &conn);
        if self.port.net.is_none() {
            qp::inproc_register(&conn);
        }
        cq.attached.attach(conn.clone());
        Ok(SoftQp::new(conn))
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
