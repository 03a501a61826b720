//! Memory registration: one handle holds the keys of both rails. Host and CUDA
//! registrations go through a reference-counted cache per NIC, so NCCL registering the same
//! buffer for several comms or channels costs one NIC registration. DMA-BUF registrations
//! are not cached (the fd is only valid during the call).
//!
//! **Exact bounds.** Each registration covers exactly `[data, data + size)` of what NCCL
//! registered, and the cache shares only registrations of exactly that range: the rkey a
//! peer receives reaches those bytes and no others (a NIC checks an rkey against its
//! registration's bytes; the soft fabric does the same). net_ib rounds registrations out to
//! whole pages and shares any that covers the range, which hands a peer up to 4,095 bytes
//! on either side of the buffer; mpib does not. The cost: one NIC registration per distinct
//! `(data, size)` instead of one per distinct page range; NCCL registers a few large
//! buffers per connection (one per protocol buffer, and user buffers), so that is a handful
//! of MRs per connection and rail, where a NIC holds millions.
//!
//! **Input.** What cannot be registered is refused here, before any NIC sees it: a NULL
//! buffer, a range whose end wraps around the address space or lies beyond `isize::MAX`
//! bytes. An empty registration (`size` 0) registers nothing and carries no keys (a 0-byte
//! transfer uses none). Whether the range is mapped, and writable (peers write into every
//! registration), is the fabric's to check: the kernel pins the pages for verbs, the soft
//! fabric reads the process's mappings.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::engine::{CpuAccess, RAILS, SendBuf};
use crate::error::{Error, Result};
use crate::fabric::{Access, Device, MrKeys};

/// Access rights of the control region (CTS FIFO, completion records, control ring):
/// peers write into it and read from it, strictly ordered: the protocol takes a WRITE's
/// last 8 bytes as the sign that the rest landed, which PCIe relaxed ordering does not keep.
pub const CONTROL_ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

/// Access rights of NCCL's buffers: peers write into receive buffers and read from them (the
/// flush READ), send buffers are read locally; PCIe relaxed ordering where the NIC has it
/// enabled (`MPIB_PCI_RELAXED_ORDERING`): nothing reads their bytes before the completion.
pub const DATA_ACCESS: Access = CONTROL_ACCESS.union(Access::RELAXED_ORDERING);

/// Checks `[addr, addr + len)` as a range a NIC could register: not NULL, no wrap, at most
/// `isize::MAX` bytes (no process has more).
pub fn check_range(addr: u64, len: u64) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    if addr == 0 {
        return Err(Error::invalid_argument(format!("regMr of {len} bytes at NULL")));
    }
    if len > isize::MAX as u64 || addr.checked_add(len).is_none() {
        return Err(Error::invalid_argument(format!(
            "regMr of {len} bytes at {addr:#x}: the range runs past the end of the address space"
        )));
    }
    Ok(())
}

struct Entry<D: Device> {
    addr: u64,
    len: u64,
    refs: usize,
    keys: MrKeys,
    mr: Option<D::Mr>,
}

/// The registration cache of one NIC.
pub struct MrCache<D: Device> {
    dev: Arc<D>,
    entries: Mutex<Vec<Entry<D>>>,
}

impl<D: Device> MrCache<D> {
    pub fn new(dev: Arc<D>) -> Self {
        MrCache { dev, entries: Mutex::new(Vec::new()) }
    }

    /// Registers exactly `[addr, addr + len)` (checked by [`check_range`]), or takes one
    /// more reference to the registration of exactly that range; its keys. Release with
    /// [`MrCache::release`] of the same range. An empty range registers nothing (keys 0).
    pub fn acquire(&self, addr: u64, len: u64) -> Result<MrKeys> {
        check_range(addr, len)?;
        if len == 0 {
            return Ok(MrKeys::default());
        }
        let mut es = self.entries.lock();
        if let Some(e) = es.iter_mut().find(|e| e.addr == addr && e.len == len) {
            e.refs += 1;
            return Ok(e.keys);
        }
        let mr = self
            .dev
            .reg_mr(addr as *mut u8, len as usize, DATA_ACCESS)
            .map_err(|e| e.context(format!("registering {len} bytes at {addr:#x} on {}", self.dev.attrs().name)))?;
        let keys = D::mr_keys(&mr);
        es.push(Entry { addr, len, refs: 1, keys, mr: Some(mr) });
        Ok(keys)
    }

    /// Drops one reference to the registration of `[addr, addr + len)`; deregisters it at
    /// zero.
    pub fn release(&self, addr: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mr = {
            let mut es = self.entries.lock();
            let Some(i) = es.iter().position(|e| e.addr == addr && e.len == len) else {
                return Err(Error::internal(format!("no cached registration of {len} bytes at {addr:#x}")));
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

    /// NIC registrations held now (for tests and statistics).
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
    use crate::fabric::soft::{self, SoftDevice, SoftOptions};

    fn cache() -> MrCache<SoftDevice> {
        MrCache::new(Arc::new(soft::open(&SoftOptions::inproc("mr", &soft::InprocNet::new())).unwrap()))
    }

    #[test]
    fn registrations_are_exact_and_shared_only_for_the_same_range() {
        let c = cache();
        let buf = vec![0u8; 3 * 4096];
        let a = buf.as_ptr() as u64 + 100;
        let k = c.acquire(a, 1000).unwrap();
        assert_eq!(c.acquire(a, 1000).unwrap(), k, "the same range: shared");
        // Inside the same pages, but not the same range: registrations of their own (a page
        // cache would have handed out `k`, whose rkey reaches all of `a`'s pages).
        let k2 = c.acquire(a + 1000, 1000).unwrap();
        let k3 = c.acquire(a, 999).unwrap();
        assert!(k2 != k && k3 != k && k2 != k3);
        assert_eq!(c.len(), 3, "one NIC registration per distinct range");
        for (addr, len) in [(a, 1000), (a, 1000), (a + 1000, 1000), (a, 999)] {
            c.release(addr, len).unwrap();
        }
        assert!(c.is_empty());
        assert!(c.release(a, 1000).is_err(), "released once too often");
    }

    #[test]
    fn ranges_that_cannot_be_registered_are_refused_before_the_nic() {
        let c = cache();
        let buf = vec![0u8; 4096];
        let a = buf.as_ptr() as u64;
        let k = c.acquire(a, 4096).unwrap();
        for (addr, len) in [(a, u64::MAX), (4096u64.wrapping_neg(), 8192), (a, 1 << 63), (0, 8)] {
            let e = c.acquire(addr, len).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument, "{addr:#x}+{len}: {e}");
        }
        assert_eq!(c.len(), 1, "no other entry, and never another entry's keys");
        assert_eq!(c.acquire(a, 0).unwrap(), MrKeys::default(), "an empty range: nothing registered");
        assert_eq!(c.len(), 1);
        c.release(a, 0).unwrap();
        c.release(a, 4096).unwrap();
        let _ = k;
    }

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
