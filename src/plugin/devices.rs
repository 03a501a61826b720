//! The NCCL devices: each a pair of rails (SOUT, SUP) with their registration caches and
//! the properties NCCL sees (speed = sum of the rails, `pciPath` and `guid` of the SOUT
//! NIC, host memory always, CUDA / DMA-BUF only when both rails can register it).

use std::ffi::{CString, c_int};
use std::sync::Arc;

use super::mr::{MrCache, MrHandle, MrInfo};
use super::{MAX_RECVS, Properties};
use crate::abi::types::consts::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};
use crate::engine::RAILS;
use crate::error::{Error, Result};
use crate::fabric::{Device, MemTypes, MrKeys, RailPair};

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

    /// Registers `[addr, addr+len)` on both rails; `ptr_type` is NCCL's `NCCL_PTR_*`.
    pub fn reg_mr(self: &Arc<Self>, addr: u64, len: u64, ptr_type: c_int) -> Result<MrHandle> {
        let gpu = match ptr_type {
            NCCL_PTR_HOST => false,
            NCCL_PTR_CUDA if self.props.ptr_support & NCCL_PTR_CUDA != 0 => true,
            t => {
                return Err(Error::invalid_argument(format!(
                    "regMr of memory type {t} on {}, which supports {:#x} (1 host, 2 CUDA, 4 DMA-BUF)",
                    self.props.name.to_string_lossy(),
                    self.props.ptr_support
                )));
            }
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
    pub fn reg_dmabuf(self: &Arc<Self>, addr: u64, len: u64, offset: u64, fd: c_int) -> Result<MrHandle> {
        if self.props.ptr_support & NCCL_PTR_DMABUF == 0 {
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
    let mut ptr = NCCL_PTR_HOST;
    let both = a.mem_types & b.mem_types;
    if both.contains(MemTypes::CUDA) {
        ptr |= NCCL_PTR_CUDA;
    }
    if both.contains(MemTypes::DMABUF) {
        ptr |= NCCL_PTR_DMABUF;
    }
    let leak = |s: String| -> &'static std::ffi::CStr {
        // Kept for the process lifetime: NCCL holds these pointers.
        Box::leak(CString::new(s.replace('\0', "?")).unwrap_or_default().into_boxed_c_str())
    };
    Properties {
        dev: index as c_int,
        name: leak(format!("{}+{}", a.name, b.name)),
        pci_path: a.pci_path.clone().map(leak),
        guid: a.guid,
        ptr_support: ptr,
        reg_is_global: true,
        force_flush: false,
        speed_mbps: (a.speed_mbps as u64 + b.speed_mbps as u64).min(i32::MAX as u64) as c_int,
        port: a.port as c_int,
        latency_us: 0.0,
        max_comms: (a.max_qp.min(b.max_qp) / 4).clamp(1, 65536) as c_int,
        max_recvs: MAX_RECVS as c_int,
        max_p2p_bytes: MAX_P2P_BYTES,
        max_coll_bytes: MAX_P2P_BYTES,
        max_multi_request_size: 1,
    }
}
