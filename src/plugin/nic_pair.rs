//! The NCCL devices. Every device NCCL uses is a pair of rails (SOUT, SUP): over two NICs,
//! or over one NIC carrying both rails. What NCCL is *shown* depends on the ABI version
//! (see `devices.rs`): a rail pair as one device, or each NIC as a device that NCCL fuses
//! with its partner through `makeVDevice`.
//!
//! Each NIC has one registration cache, shared by every device that uses it, so a buffer
//! NCCL registers through several devices on one NIC costs one NIC registration.

use std::ffi::{CStr, CString};
use std::sync::{Arc, OnceLock};

use super::discover::NicMeta;
use super::mr::{MrCache, MrHandle, MrInfo};
use super::{MAX_RECVS, Properties};
use crate::engine::RAILS;
use crate::error::{Error, Result};
use crate::fabric::{Device, MemTypes, MrKeys};
use crate::telemetry::ProbeBudget;

/// Largest single send or receive NCCL may hand the plugin (1 GiB, NCCL_MAX_NET_SIZE);
/// `test` reports sizes as `int`, so nothing above `i32::MAX` can be accepted anyway.
pub const MAX_P2P_BYTES: usize = 1 << 30;

/// One opened NIC (a port), its registration cache, its idle-probe budget and what is known
/// of it.
pub struct Nic<D: Device> {
    pub dev: Arc<D>,
    cache: MrCache<D>,
    /// Shared by every connection of the process on this NIC (made at the first).
    probe_budget: OnceLock<Arc<ProbeBudget>>,
    pub meta: NicMeta,
}

impl<D: Device> Nic<D> {
    pub fn new(dev: Arc<D>, meta: NicMeta) -> Self {
        Nic { cache: MrCache::new(dev.clone()), dev, probe_budget: OnceLock::new(), meta }
    }

    /// The NIC's idle-probe budget, `per_second` (`MPIB_PROBE_RATE`, the same for every
    /// connection: the configuration is read once) when the first connection makes it.
    pub fn probe_budget(&self, per_second: u64) -> Arc<ProbeBudget> {
        self.probe_budget.get_or_init(|| Arc::new(ProbeBudget::per_second(per_second))).clone()
    }

    /// `device:port`.
    pub fn label(&self) -> String {
        format!("{}:{}", self.dev.attrs().name, self.dev.attrs().port)
    }

    /// Registrations cached on this NIC.
    pub fn cached_registrations(&self) -> usize {
        self.cache.len()
    }
}

/// How a device came to be, for NCCL's view of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A rail pair shown as one device (its name `sout+sup`, SOUT's PCI path).
    Pair,
    /// One NIC shown as itself; used alone it carries both rails.
    Nic,
    /// Two NICs NCCL fused (`makeVDevice`) into a rail pair.
    Fused,
}

/// One NCCL device: two rails.
pub struct NicPair<D: Device> {
    pub rails: [Arc<D>; RAILS],
    nics: [Arc<Nic<D>>; RAILS],
    pub shape: Shape,
    pub props: Properties,
}

impl<D: Device> NicPair<D> {
    /// Device `index` over `nics` (SOUT, SUP); `vdevs` the NIC devices NCCL fused into it
    /// (itself for a device shown as it is).
    pub fn new(index: usize, nics: [Arc<Nic<D>>; RAILS], shape: Shape, vdevs: &[i32]) -> Self {
        let props = properties(index, &nics, shape, vdevs);
        NicPair { rails: [nics[0].dev.clone(), nics[1].dev.clone()], nics, shape, props }
    }

    /// The same rails under another index (NCCL 2.24–2.27 asks `makeVDevice` to "fuse" each
    /// lone device into a virtual device of its own).
    pub fn alias(&self, index: usize, vdev: i32) -> Self {
        let mut props = self.props;
        props.dev = index as i32;
        props.vdevs = VDevs::one(vdev);
        NicPair { rails: self.rails.clone(), nics: self.nics.clone(), shape: self.shape, props }
    }

    /// The two rails' NICs (SOUT, SUP).
    pub fn nics(&self) -> &[Arc<Nic<D>>; RAILS] {
        &self.nics
    }

    /// Registers exactly `[addr, addr+len)` on both rails (see `mr.rs`); `mem` is its one
    /// memory type.
    pub fn reg_mr(self: &Arc<Self>, addr: u64, len: u64, mem: MemTypes) -> Result<MrHandle> {
        let gpu = if mem == MemTypes::HOST {
            false
        } else if mem == MemTypes::CUDA && self.props.mem_types.contains(MemTypes::CUDA) {
            true
        } else {
            return Err(Error::invalid_argument(format!(
                "regMr of {mem:?} memory on {}, which supports {:?}",
                self.props.name.to_string_lossy(),
                self.props.mem_types
            )));
        };
        let k0 = self.nics[0].cache.acquire(addr, len)?;
        let k1 = match self.nics[1].cache.acquire(addr, len) {
            Ok(k) => k,
            Err(e) => {
                let _ = self.nics[0].cache.release(addr, len);
                return Err(e);
            }
        };
        let me = self.clone();
        let release = Box::new(move || {
            let a = me.nics[0].cache.release(addr, len);
            let b = me.nics[1].cache.release(addr, len);
            a.and(b)
        });
        Ok(MrHandle::new(MrInfo { addr, len, gpu, keys: [k0, k1] }, release))
    }

    /// Registers a DMA-BUF range on both rails (not cached: the fd is the caller's).
    pub fn reg_dmabuf(self: &Arc<Self>, addr: u64, len: u64, offset: u64, fd: i32) -> Result<MrHandle> {
        if !self.props.mem_types.contains(MemTypes::DMABUF) {
            return Err(Error::invalid_usage(format!(
                "regMrDmaBuf on {}, which does not support DMA-BUF",
                self.props.name.to_string_lossy()
            )));
        }
        super::mr::check_range(addr, len)?;
        if len == 0 {
            // As `reg_mr`: an empty registration registers nothing, carries no keys.
            return Ok(MrHandle::new(MrInfo { addr, len, gpu: true, keys: Default::default() }, Box::new(|| Ok(()))));
        }
        let access = super::mr::DATA_ACCESS;
        let m0 = self.rails[0].reg_dmabuf_mr(fd, offset, len as usize, addr, access)?;
        let m1 = match self.rails[1].reg_dmabuf_mr(fd, offset, len as usize, addr, access) {
            Ok(m) => m,
            Err(e) => {
                let _ = self.rails[0].dereg_mr(m0);
                return Err(e);
            }
        };
        let keys: [MrKeys; RAILS] = [D::mr_keys(&m0), D::mr_keys(&m1)];
        let me = self.clone();
        let release = Box::new(move || {
            let a = me.rails[0].dereg_mr(m0);
            let b = me.rails[1].dereg_mr(m1);
            a.and(b)
        });
        Ok(MrHandle::new(MrInfo { addr, len, gpu: true, keys }, release))
    }

    /// Registrations cached on each rail's NIC.
    pub fn cached_registrations(&self) -> [usize; RAILS] {
        [self.nics[0].cached_registrations(), self.nics[1].cached_registrations()]
    }
}

/// The NIC devices fused into a device (NCCL's `vProps`): at most two for mpib.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VDevs {
    pub n: usize,
    pub devs: [i32; RAILS],
}

impl VDevs {
    pub fn one(d: i32) -> VDevs {
        VDevs { n: 1, devs: [d, 0] }
    }

    pub fn as_slice(&self) -> &[i32] {
        &self.devs[..self.n]
    }
}

/// A string NCCL may keep a pointer to: leaked (kept for the process lifetime), as NCCL
/// holds `name` and `pciPath` after `getProperties` returns.
fn leak(s: String) -> &'static CStr {
    Box::leak(CString::new(s.replace('\0', "?")).unwrap_or_default().into_boxed_c_str())
}

/// NCCL's view of a device over `nics` (SOUT, SUP).
fn properties<D: Device>(index: usize, nics: &[Arc<Nic<D>>; RAILS], shape: Shape, vdevs: &[i32]) -> Properties {
    let (a, b) = (nics[0].dev.attrs(), nics[1].dev.attrs());
    let one_nic = Arc::ptr_eq(&nics[0], &nics[1]);
    // Host memory always; GPU memory only where both rails can register it.
    let mem_types = MemTypes::HOST | (a.mem_types & b.mem_types);
    let name = match shape {
        Shape::Nic => a.name.clone(),
        Shape::Pair | Shape::Fused => format!("{}+{}", a.name, b.name),
    };
    // Both rails on one NIC move no more than that NIC does.
    let speed = if one_nic { a.speed_mbps as u64 } else { a.speed_mbps as u64 + b.speed_mbps as u64 };
    let same = |x: Option<i16>, y: Option<i16>| if x == y { x } else { None };
    let (ma, mb) = (&nics[0].meta, &nics[1].meta);
    let mut v = VDevs { n: vdevs.len().min(RAILS), devs: [0; RAILS] };
    v.devs[..v.n].copy_from_slice(&vdevs[..v.n]);
    Properties {
        dev: index as i32,
        name: leak(name),
        // SOUT's: for a pair shown as one device NCCL places it there; for a fused one
        // NCCL places it itself, at the two NICs' common parent (net_ib reports its first
        // NIC's path there too).
        pci_path: ma.pci_path.clone().or_else(|| a.pci_path.clone()).map(leak),
        guid: a.guid,
        mem_types,
        reg_is_global: true,
        force_flush: false,
        speed_mbps: speed.min(i32::MAX as u64) as i32,
        port: a.port as i32,
        latency_us: 0.0,
        max_comms: (a.max_qp.min(b.max_qp) / 4).clamp(1, 65536) as i32,
        max_recvs: MAX_RECVS as i32,
        max_p2p_bytes: MAX_P2P_BYTES,
        max_coll_bytes: MAX_P2P_BYTES,
        max_multi_request_size: 1,
        vdevs: v,
        // A fused device's rail (or plane) is defined only where both NICs agree (net_ib's
        // rule for fused devices).
        rail: same(ma.rail, mb.rail),
        plane: same(ma.plane, mb.plane),
    }
}
