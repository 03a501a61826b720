//! A recording fake NIC for the plugin's tests: the soft fabric's in-process device
//! underneath, with every registration recorded (address, length, access, DMA-BUF or not),
//! the memory types it claims chosen by the test, a DMA-BUF registration made as a host
//! registration of the range at its `iova` (the test passes host memory), and port-down
//! news (`Device::port_downs`) driven by the test, as a verbs device's async events drive
//! them. A QP connected to itself (the flush QP; the soft fabric has no loopback QPs) is
//! ready at once and records what is posted on it, executing nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::Result;
use crate::fabric::soft::{self, InprocNet, SoftCq, SoftDevice, SoftMr, SoftOptions, SoftQp, SoftSrq};
use crate::fabric::{
    Access, ConnectParams, Device, DeviceAttrs, FaultKind, MemTypes, MrKeys, QpCaps, QpInfo, QueuePair, SendWr,
    Timestamps,
};

/// One registration the plugin asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg {
    pub addr: u64,
    pub len: usize,
    pub access: Access,
    pub dmabuf: bool,
}

/// A fake NIC (see the module doc).
pub struct Recording {
    inner: SoftDevice,
    attrs: DeviceAttrs,
    regs: Mutex<Vec<Reg>>,
    loopback_posts: Arc<Mutex<Vec<(u32, SendWr)>>>,
    downs: AtomicU64,
    down: AtomicBool,
    fatal: AtomicBool,
}

/// A QP of a [`Recording`] device.
pub struct FakeQp {
    inner: SoftQp,
    loopback: bool,
    posts: Arc<Mutex<Vec<(u32, SendWr)>>>,
}

impl Recording {
    /// An in-process device `name` on `net` that claims to register `mem_types`.
    pub fn open(name: &str, net: &Arc<InprocNet>, mem_types: MemTypes) -> Arc<Recording> {
        let inner = soft::open(&SoftOptions::inproc(name, net)).expect("in-process soft device");
        let mut attrs = inner.attrs().clone();
        attrs.mem_types = mem_types;
        Arc::new(Recording {
            inner,
            attrs,
            regs: Mutex::new(Vec::new()),
            loopback_posts: Arc::new(Mutex::new(Vec::new())),
            downs: AtomicU64::new(0),
            down: AtomicBool::new(false),
            fatal: AtomicBool::new(false),
        })
    }

    /// Every registration so far, oldest first.
    pub fn regs(&self) -> Vec<Reg> {
        self.regs.lock().clone()
    }

    /// What was posted on QPs connected to themselves: (QP number, WR), oldest first.
    pub fn loopback_posts(&self) -> Vec<(u32, SendWr)> {
        self.loopback_posts.lock().clone()
    }

    /// The port goes down, as a verbs device's PORT_ERR event says (the fake's QPs work on:
    /// the port came back before RC gave up).
    pub fn port_down(&self) {
        self.down.store(true, Ordering::Release);
        self.downs.fetch_add(1, Ordering::Release);
    }

    /// `IBV_EVENT_DEVICE_FATAL`: the port down for good, the device gone.
    pub fn device_fatal(&self) {
        self.fatal.store(true, Ordering::Release);
        self.port_down();
    }
}

impl Device for Recording {
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = FakeQp;

    fn attrs(&self) -> &DeviceAttrs {
        &self.attrs
    }

    fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<SoftMr> {
        self.regs.lock().push(Reg { addr: addr as u64, len, access, dmabuf: false });
        self.inner.reg_mr(addr, len, access)
    }

    fn reg_dmabuf_mr(&self, _fd: i32, _offset: u64, len: usize, iova: u64, access: Access) -> Result<SoftMr> {
        self.regs.lock().push(Reg { addr: iova, len, access, dmabuf: true });
        self.inner.reg_mr(iova as *mut u8, len, access)
    }

    fn mr_keys(mr: &SoftMr) -> MrKeys {
        SoftDevice::mr_keys(mr)
    }

    fn dereg_mr(&self, mr: SoftMr) -> Result<()> {
        self.inner.dereg_mr(mr)
    }

    fn create_cq(&self, depth: u32, timestamps: Timestamps) -> Result<SoftCq> {
        self.inner.create_cq(depth, timestamps)
    }

    fn create_srq(&self, depth: u32) -> Result<SoftSrq> {
        self.inner.create_srq(depth)
    }

    fn create_qp(&self, cq: &SoftCq, srq: Option<&SoftSrq>, caps: QpCaps) -> Result<FakeQp> {
        let inner = self.inner.create_qp(cq, srq, caps)?;
        Ok(FakeQp { inner, loopback: false, posts: self.loopback_posts.clone() })
    }

    fn port_downs(&self) -> (u64, bool) {
        (self.downs.load(Ordering::Acquire), self.down.load(Ordering::Acquire))
    }

    fn fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }
}

impl QueuePair for FakeQp {
    fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }

    fn local_info(&self) -> QpInfo {
        self.inner.local_info()
    }

    fn connect(&mut self, remote: &QpInfo, params: &ConnectParams) -> Result<()> {
        if *remote == self.inner.local_info() {
            self.loopback = true;
            return Ok(());
        }
        self.inner.connect(remote, params)
    }

    fn is_ready(&mut self) -> Result<bool> {
        if self.loopback {
            return Ok(true);
        }
        self.inner.is_ready()
    }

    fn post_send(&mut self, chain: &[SendWr]) -> Result<()> {
        if self.loopback {
            let qpn = self.inner.qp_num();
            self.posts.lock().extend(chain.iter().map(|w| (qpn, *w)));
            return Ok(());
        }
        self.inner.post_send(chain)
    }

    fn to_error(&mut self) -> Result<()> {
        self.inner.to_error()
    }

    fn inject_fault(&mut self, kind: FaultKind) -> Result<bool> {
        self.inner.inject_fault(kind)
    }
}
