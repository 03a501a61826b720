//! Memory registration: one handle holds the keys of both rails. Host and CUDA
//! registrations go through a page-range, reference-counted cache per device (like
//! net_ib's), so NCCL registering the same buffer for several comms or channels costs one
//! NIC registration. DMA-BUF registrations are not cached (the fd is only valid during
//! the call).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::engine::{CpuAccess, RAILS, SendBuf};
use crate::error::{Error, Result};
use crate::fabric::{Access, Device, MrKeys};

const PAGE: u64 = 4096;

/// Access rights of every registration: peers write into receive buffers and read
/// from them (the flush READ), send buffers are read locally.
pub const ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

struct Entry<D: Device> {
    start: u64,
    end: u64,
    refs: usize,
    keys: MrKeys,
    mr: Option<D::Mr>,
}

/// The registration cache of one device.
pub struct MrCache<D: Device> {
    dev: Arc<D>,
    entries: Mutex<Vec<Entry<D>>>,
}

impl<D: Device> MrCache<D> {
    pub fn new(dev: Arc<D>) -> Self {
        MrCache { dev, entries: Mutex::new(Vec::new()) }
    }

    /// Registers the pages under `[addr, addr+len)` (or reuses a registration covering
    /// them); returns the keys and the page range to release.
    pub fn acquire(&self, addr: u64, len: u64) -> Result<(MrKeys, u64, u64)> {
        let start = addr / PAGE * PAGE;
        let end = (addr + len.max(1)).div_ceil(PAGE) * PAGE;
        let mut es = self.entries.lock();
        if let Some(e) = es.iter_mut().find(|e| e.start <= start && e.end >= end) {
            e.refs += 1;
            return Ok((e.keys, e.start, e.end));
        }
        let mr = self
            .dev
            .reg_mr(start as *mut u8, (end - start) as usize, ACCESS)
            .map_err(|e| e.context(format!("registering {} bytes at {addr:#x} on {}", len, self.dev.attrs().name)))?;
        let keys = D::mr_keys(&mr);
        es.push(Entry { start, end, refs: 1, keys, mr: Some(mr) });
        Ok((keys, start, end))
    }

    /// Drops one reference to the registration `[start, end)`; deregisters it at zero.
    pub fn release(&self, start: u64, end: u64) -> Result<()> {
        let mr = {
            let mut es = self.entries.lock();
            let Some(i) = es.iter().position(|e| e.start == start && e.end == end) else {
                return Err(Error::internal(format!("no cached registration [{start:#x}, {end:#x})")));
            };
            es[i].refs -= 1;
            if es[i].refs > 0 {
                return Ok(());
            }
            es.swap_remove(i).mr
        };
        match mr {
            Some(mr) => self.dev.dereg_mr(mr),
            None => Ok(()),
        }
    }

    /// Registrations currently cached (for tests and statistics).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the data path needs of a registration: plain data, copied out of the handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrInfo {
    pub addr: u64,
    pub len: u64,
    /// GPU memory (CUDA or DMA-BUF): receives into it need a flush.
    pub gpu: bool,
    pub keys: [MrKeys; RAILS],
}

impl MrInfo {
    /// The engine's view of a send from this registration: its lkeys, and whether the CPU
    /// may read it (only host memory may be posted inline; GPU memory never is).
    #[inline]
    pub fn send_buf(&self, addr: u64, size: u64, tag: u32) -> SendBuf {
        let cpu = if self.gpu { CpuAccess::NicOnly } else { CpuAccess::Readable };
        SendBuf { addr, size, tag, lkeys: [self.keys[0].lkey, self.keys[1].lkey], cpu }
    }

    /// Whether `[addr, addr+len)` lies inside the registered range.
    #[inline]
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        len == 0 || (addr >= self.addr && addr.checked_add(len).is_some_and(|e| e <= self.addr + self.len))
    }
}

/// The registration a comm used last, valid while no registration has been released since
/// (the plugin's release `epoch` is unchanged): the data path then neither looks the
/// handle up nor locks its entry, which comms sharing a registration would all take.
#[derive(Clone, Copy, Debug, Default)]
pub struct MrMemo {
    handle: u64,
    epoch: u64,
    info: MrInfo,
}

impl MrMemo {
    /// The remembered registration of `handle`, if still valid at `epoch`.
    #[inline]
    pub fn get(&self, handle: u64, epoch: u64) -> Option<MrInfo> {
        (self.handle == handle && self.epoch == epoch && handle != 0).then_some(self.info)
    }

    #[inline]
    pub fn set(&mut self, handle: u64, epoch: u64, info: MrInfo) {
        *self = MrMemo { handle, epoch, info };
    }
}

/// What `regMr` returns to NCCL (behind a handle).
pub struct MrHandle {
    pub info: MrInfo,
    release: Option<Box<dyn FnOnce() -> Result<()> + Send>>,
}

impl MrHandle {
    pub fn new(info: MrInfo, release: Box<dyn FnOnce() -> Result<()> + Send>) -> Self {
        MrHandle { info, release: Some(release) }
    }

    /// Releases the registrations now (deregMr), reporting failures.
    pub fn release(mut self) -> Result<()> {
        self.release.take().map_or(Ok(()), |f| f())
    }
}

impl Drop for MrHandle {
    fn drop(&mut self) {
        if let Some(f) = self.release.take()
            && let Err(e) = f()
        {
            log::warn!("releasing a memory registration: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_registration_gives_sends_the_cpu_may_not_read() {
        let keys = [MrKeys { lkey: 1, rkey: 2 }, MrKeys { lkey: 3, rkey: 4 }];
        let host = MrInfo { addr: 0x1000, len: 64, gpu: false, keys };
        let gpu = MrInfo { gpu: true, ..host };
        assert_eq!(host.send_buf(0x1000, 8, 5).cpu, CpuAccess::Readable);
        assert_eq!(gpu.send_buf(0x1000, 8, 5).cpu, CpuAccess::NicOnly, "never inline from GPU memory");
        assert_eq!(
            gpu.send_buf(0x1008, 8, 5),
            SendBuf { addr: 0x1008, size: 8, tag: 5, lkeys: [1, 3], cpu: CpuAccess::NicOnly }
        );
    }
}
