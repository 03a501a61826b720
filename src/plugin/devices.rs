//! The NCCL devices: each a pair of rails (SOUT, SUP) with their registration caches and
//! the properties NCCL sees (speed = sum of the rails, `pciPath` and `guid` of the SOUT
//! NIC, host memory always, CUDA / DMA-BUF only when both rails can register it).

use std::ffi::CString;
use std::sync::Arc;

use super::discover::RailPair;
use super::mr::{MrCache, MrHandle, MrInfo};
use super::{MAX_RECVS, Properties};
use crate::engine::RAILS;
use crate::error::{Error, Result};
use crate::fabric::{Device, MemTypes, MrKeys};

/// Largest single send or receive NCCL may hand the plugin (1 GiB, NCCL_MAX_NET_SIZE);
/// `test` reports sizes as `int`, so nothing above `i32::MAX` can be accepted anyway.
pub const MAX_P2P_BYTES: usize = 1 << 30;

/// One NCCL device: two rails.
pub struct DevPair<D: Device> {
    pub rails: [Arc<D>; RAILS],
    caches: [MrCache<D>; RAILS],
    pub props: Properties,
}

impl<D: Device> DevPair<D> {
    pub fn new(index: usize, pair: RailPair<D>) -> Self {
        let rails = [pair.sout.clone(), pair.sup.clone()];
        let props = properties(index, &rails);
        let caches = [MrCache::new(pair.sout), MrCache::new(pair.sup)];
        DevPair { rails, caches, props }
    }

    /// Registers `[addr, addr+len)` on both rails; `mem` is its one memory type.
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
        if addr == 0 && len > 0 {
            return Err(Error::invalid_argument("regMr of a NULL buffer"));
        }
        let (k0, s0, e0) = self.caches[0].acquire(addr, len)?;
        let (k1, s1, e1) = match self.caches[1].acquire(addr, len) {
            Ok(r) => r,
            Err(e) => {
                let _ = self.caches[0].release(s0, e0);
                return Err(e);
            }
        };
        let me = self.clone();
        let release = Box::new(move || {
            let a = me.caches[0].release(s0, e0);
            let b = me.caches[1].release(s1, e1);
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
        let access = super::mr::ACCESS;
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

    /// Registrations cached on each rail.
    pub fn cached_registrations(&self) -> [usize; RAILS] {
        [self.caches[0].len(), self.caches[1].len()]
    }
}

/// NCCL's view of a rail pair.
fn properties<D: Device>(index: usize, rails: &[Arc<D>; RAILS]) -> Properties {
    let (a, b) = (rails[0].attrs(), rails[1].attrs());
    // Host memory always; GPU memory only where both rails can register it.
    let mem_types = MemTypes::HOST | (a.mem_types & b.mem_types);
    let leak = |s: String| -> &'static std::ffi::CStr {
        // Kept for the process lifetime: NCCL holds these pointers.
        Box::leak(CString::new(s.replace('\0', "?")).unwrap_or_default().into_boxed_c_str())
    };
    Properties {
        dev: index as i32,
        name: leak(format!("{}+{}", a.name, b.name)),
        pci_path: a.pci_path.clone().map(leak),
        guid: a.guid,
        mem_types,
        reg_is_global: true,
        force_flush: false,
        speed_mbps: (a.speed_mbps as u64 + b.speed_mbps as u64).min(i32::MAX as u64) as i32,
        port: a.port as i32,
        latency_us: 0.0,
        max_comms: (a.max_qp.min(b.max_qp) / 4).clamp(1, 65536) as i32,
        max_recvs: MAX_RECVS as i32,
        max_p2p_bytes: MAX_P2P_BYTES,
        max_coll_bytes: MAX_P2P_BYTES,
        max_multi_request_size: 1,
    }
}
