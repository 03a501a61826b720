//! The plugin for one fabric provider: its devices and every object NCCL holds a handle
//! to. All of it is generic over the provider's `Device`; `mod.rs` picks the provider once.

use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::comm::{RecvComm, SendComm};
use super::devices::DevPair;
use super::handles::{Handle, Kind, Table};
use super::mr::{MrHandle, MrInfo, MrMemo};
use super::oob::OobListener;
use super::setup::{self, Connecting, FabricKind, ListenComm, Params};
use super::{AbiVersion, MAX_RECVS};
use crate::config::{Config, RailAddr};
use crate::engine::{RAILS, RailCounts, RecvBuf, cold};
use crate::error::{Error, Result};
use crate::fabric::{Device, RailPair, netif};

/// Everything NCCL holds a handle to.
pub enum Obj<D: Device> {
    Listen(Box<ListenComm<D>>),
    Connecting(Box<Connecting<D>>),
    Send(Box<SendComm<D>>),
    Recv(Box<RecvComm<D>>),
    Mr(MrHandle),
}

/// The plugin over one provider.
pub struct Plugin<D: Device> {
    pub kind: FabricKind,
    pub devs: Vec<Arc<DevPair<D>>>,
    cfg: &'static Config,
    objs: Table<Obj<D>>,
    /// Bumped whenever a registration is released: comms' [`MrMemo`]s older than it are
    /// looked up again.
    mr_epoch: AtomicU64,
}

fn as_u64(p: *mut c_void) -> u64 {
    p as usize as u64
}

fn size_ok(size: usize) -> Result<u64> {
    if size > i32::MAX as usize {
        return Err(cold(|| {
            Error::invalid_argument(format!(
                "a transfer of {size} bytes: at most {} (NCCL's test reports sizes as int)",
                i32::MAX
            ))
        }));
    }
    Ok(size as u64)
}

impl<D: Device> Plugin<D> {
    pub fn new(kind: FabricKind, pairs: Vec<RailPair<D>>, cfg: &'static Config) -> Self {
        let devs = pairs.into_iter().enumerate().map(|(i, p)| Arc::new(DevPair::new(i, p))).collect();
        Plugin { kind, devs, cfg, objs: Table::new(), mr_epoch: AtomicU64::new(1) }
    }

    fn pair(&self, dev: c_int) -> Result<&Arc<DevPair<D>>> {
        usize::try_from(dev).ok().and_then(|i| self.devs.get(i)).ok_or_else(|| {
            Error::invalid_argument(format!("device {dev} does not exist (there are {})", self.devs.len()))
        })
    }

    /// The local address of the set-up listener: the SOUT rail's address for the soft
    /// fabric, NCCL's socket interface otherwise.
    fn listen_ip(&self) -> Result<IpAddr> {
        if self.kind == FabricKind::Soft {
            match &self.cfg.soft_sout_addr {
                Some(RailAddr::Ip(ip)) => return Ok(*ip),
                Some(RailAddr::Interface(name)) => return netif::ip_of(name),
                None => {}
            }
        }
        netif::default_ip(self.cfg.socket_ifname.as_deref())
    }

    fn params(&self, abi: AbiVersion, tc: Option<c_int>) -> Params {
        Params::new(self.cfg, self.kind, abi, tc)
    }

    pub fn listen(&self, abi: AbiVersion, dev: c_int, handle: &mut [u8; 128]) -> Result<u64> {
        let pair = self.pair(dev)?.clone();
        let (listener, addr) = match self.kind {
            FabricKind::Inproc => OobListener::inproc(),
            _ => OobListener::tcp(self.listen_ip()?)?,
        };
        setup::write_handle(handle, self.kind, addr);
        let p = self.params(abi, None);
        self.objs.insert(Kind::Listen, Obj::Listen(Box::new(ListenComm { listener, pair, p, pending: None })))
    }

    pub fn connect(&self, abi: AbiVersion, dev: c_int, handle: &mut [u8; 128], tc: Option<c_int>) -> Result<u64> {
        let mut token = setup::handle_token(handle);
        if token == 0 {
            let addr = setup::read_handle(handle, self.kind)?;
            let c = Connecting::start(self.pair(dev)?.clone(), self.params(abi, tc), addr)?;
            token = self.objs.insert(Kind::Pending, Obj::Connecting(Box::new(c)))?;
            setup::set_handle_token(handle, token);
        }
        let step = {
            let (_, mut g) = self.objs.get(token, Kind::Pending)?;
            match &mut *g {
                Obj::Connecting(c) => c.step(),
                _ => Err(Error::internal("pending connection entry holds something else")),
            }
        };
        match step {
            Ok(None) => Ok(0),
            Ok(Some(comm)) => {
                let _ = self.objs.remove(token, Kind::Pending);
                setup::set_handle_token(handle, 0);
                self.objs.insert(Kind::Send, Obj::Send(Box::new(comm)))
            }
            Err(e) => {
                let _ = self.objs.remove(token, Kind::Pending);
                setup::set_handle_token(handle, 0);
                Err(e)
            }
        }
    }

    pub fn accept(&self, listen: *mut c_void) -> Result<u64> {
        let r = {
            let (_, mut g) = self.objs.get(as_u64(listen), Kind::Listen)?;
            match &mut *g {
                Obj::Listen(l) => l.accept()?,
                _ => return Err(Error::internal("listen entry holds something else")),
            }
        };
        match r {
            None => Ok(0),
            Some(comm) => self.objs.insert(Kind::Recv, Obj::Recv(Box::new(comm))),
        }
    }

    fn comm_pair(&self, comm: *mut c_void) -> Result<Arc<DevPair<D>>> {
        let (_, g) = self.objs.get_any(as_u64(comm), &[Kind::Send, Kind::Recv])?;
        match &*g {
            Obj::Send(c) => Ok(c.dev.clone()),
            Obj::Recv(c) => Ok(c.dev.clone()),
            _ => Err(Error::internal("comm entry holds something else")),
        }
    }

    pub fn reg_mr(&self, comm: *mut c_void, data: *mut c_void, size: usize, ptr_type: c_int) -> Result<u64> {
        // The comm lock is held only to find its devices: registering can take long.
        let pair = self.comm_pair(comm)?;
        let mh = pair.reg_mr(as_u64(data), size as u64, ptr_type)?;
        self.objs.insert(Kind::Mr, Obj::Mr(mh))
    }

    pub fn reg_mr_dmabuf(
        &self,
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        ptr_type: c_int,
        offset: u64,
        fd: c_int,
    ) -> Result<u64> {
        let pair = self.comm_pair(comm)?;
        if ptr_type != crate::abi::types::consts::NCCL_PTR_CUDA
            && ptr_type != crate::abi::types::consts::NCCL_PTR_DMABUF
        {
            return Err(Error::invalid_argument(format!("regMrDmaBuf of memory type {ptr_type}")));
        }
        let mh = pair.reg_dmabuf(as_u64(data), size as u64, offset, fd)?;
        self.objs.insert(Kind::Mr, Obj::Mr(mh))
    }

    pub fn dereg_mr(&self, comm: *mut c_void, mh: *mut c_void) -> Result<()> {
        // The registration belongs to its handle, not to the comm: it can be released after
        // the comm was closed (the comm handle must still be one NCCL got from us).
        if !Handle::decode(as_u64(comm)).is_some_and(|h| matches!(h.kind, Kind::Send | Kind::Recv)) {
            return Err(Error::invalid_argument(format!("deregMr: {comm:p} is not a send or receive comm handle")));
        }
        let obj = self.objs.remove(as_u64(mh), Kind::Mr)?;
        // After the removal: a memo taken before this sees the new epoch and looks again.
        self.mr_epoch.fetch_add(1, Ordering::Release);
        match obj {
            Obj::Mr(m) => m.release(),
            _ => Err(Error::internal("memory handle entry holds something else")),
        }
    }

    /// A memory handle's data, copied out. Called with the comm's entry locked: locks are
    /// only ever taken comm first, registration second.
    fn mr_info(&self, mh: *mut c_void) -> Result<MrInfo> {
        let (_, g) = self.objs.get(as_u64(mh), Kind::Mr)?;
        match &*g {
            Obj::Mr(m) => Ok(m.info),
            _ => Err(Error::internal("memory handle entry holds something else")),
        }
    }

    /// [`Self::mr_info`] through the comm's memo of the registration it used last.
    #[inline]
    fn mr_memo(&self, memo: &mut MrMemo, mh: *mut c_void) -> Result<MrInfo> {
        let (v, epoch) = (as_u64(mh), self.mr_epoch.load(Ordering::Acquire));
        if let Some(info) = memo.get(v, epoch) {
            return Ok(info);
        }
        let info = self.mr_info(mh)?;
        memo.set(v, epoch, info);
        Ok(info)
    }

    /// Data path (as `irecv` and `test`): inlined into the ABI shim, its one caller.
    #[inline(always)]
    pub fn isend(&self, comm: *mut c_void, data: *mut c_void, size: usize, tag: c_int, mh: *mut c_void) -> Result<u64> {
        let size = size_ok(size)?;
        let (h, mut g) = self.objs.get(as_u64(comm), Kind::Send)?;
        let Obj::Send(c) = &mut *g else { return Err(Error::internal("send entry holds something else")) };
        let info = self.mr_memo(&mut c.mr_memo, mh)?;
        match c.isend(as_u64(data), size, tag as u32, &info)? {
            None => Ok(0),
            Some(id) => Ok(h.request(id, c.seqs.bump(id))),
        }
    }

    #[inline(always)]
    pub fn irecv(
        &self,
        comm: *mut c_void,
        data: &[*mut c_void],
        sizes: &[usize],
        tags: &[c_int],
        mhs: &[*mut c_void],
    ) -> Result<u64> {
        let n = data.len();
        let (h, mut g) = self.objs.get(as_u64(comm), Kind::Recv)?;
        let Obj::Recv(c) = &mut *g else { return Err(Error::internal("receive entry holds something else")) };
        let mut bufs = [RecvBuf::default(); MAX_RECVS];
        for i in 0..n {
            let (addr, size) = (as_u64(data[i]), size_ok(sizes[i])?);
            let rkeys = if mhs[i].is_null() {
                if size > 0 {
                    return Err(cold(|| Error::invalid_argument(format!("irecv buffer {i} has no memory handle"))));
                }
                [0; RAILS]
            } else {
                let mh = self.mr_memo(&mut c.mr_memo, mhs[i])?;
                if !mh.covers(addr, size) {
                    return Err(cold(|| {
                        Error::invalid_argument(format!(
                            "irecv buffer {i} ({size} bytes at {addr:#x}) lies outside its registration [{:#x}, +{})",
                            mh.addr, mh.len
                        ))
                    }));
                }
                [mh.keys[0].rkey, mh.keys[1].rkey]
            };
            bufs[i] = RecvBuf { addr, size, tag: tags[i] as u32, rkeys };
        }
        match c.irecv(&bufs[..n])? {
            None => Ok(0),
            Some(id) => Ok(h.request(id, c.seqs.bump(id))),
        }
    }

    pub fn iflush(&self, comm: *mut c_void, data: &[*mut c_void], sizes: &[usize], mhs: &[*mut c_void]) -> Result<u64> {
        // net_ib flushes after the last non-empty buffer; nothing to do without one.
        let Some(i) = (0..data.len()).rev().find(|&i| sizes[i] > 0 && !mhs[i].is_null()) else {
            self.comm_pair(comm)?;
            return Ok(0);
        };
        let info = self.mr_info(mhs[i])?;
        let (h, mut g) = self.objs.get(as_u64(comm), Kind::Recv)?;
        let Obj::Recv(c) = &mut *g else { return Err(Error::internal("receive entry holds something else")) };
        match c.iflush(Some((as_u64(data[i]), info)))? {
            None => Ok(0),
            Some(id) => Ok(h.request(id, c.seqs.bump(id))),
        }
    }

    /// `test`: once the request is done, its sizes are in `sizes` and their number is
    /// returned (0 for a flush).
    #[inline(always)]
    pub fn test(&self, request: *mut c_void, sizes: &mut [u64; MAX_RECVS]) -> Result<Option<usize>> {
        let v = as_u64(request);
        let Some((comm, kind, id, seq)) = Handle::split_request(v) else {
            return Err(cold(|| Error::invalid_argument(format!("{v:#x} is not a request handle"))));
        };
        let (_, mut g) = self.objs.get(comm, kind)?;
        let stale =
            || cold(|| Error::invalid_argument(format!("request {v:#x} is not in flight (already completed?)")));
        match &mut *g {
            Obj::Send(c) => {
                if !c.seqs.matches(id, seq) || !c.engine.is_live(id) {
                    return Err(stale());
                }
                Ok(c.test(id)?.map(|size| {
                    sizes[0] = size;
                    1
                }))
            }
            Obj::Recv(c) => {
                if !c.seqs.matches(id, seq) || !c.engine.is_live(id) {
                    return Err(stale());
                }
                c.test(id, sizes)
            }
            _ => Err(Error::internal("request's comm entry holds something else")),
        }
    }

    pub fn close(&self, comm: *mut c_void, kind: Kind) -> Result<()> {
        match self.objs.remove(as_u64(comm), kind)? {
            Obj::Send(c) => log::info!("closing a send comm: {}", counters_line(&c.counters())),
            Obj::Recv(c) => log::info!("closing a receive comm: {}", counters_line(&c.counters())),
            _ => return Ok(()),
        }
        // The closed comm's figures are folded into the totals: write them out now.
        crate::telemetry::stats_flush_now();
        Ok(())
    }

    /// Per-rail counters of a send or receive comm.
    pub fn counters(&self, comm: *mut c_void) -> Result<[RailCounts; 2]> {
        let (_, g) = self.objs.get_any(as_u64(comm), &[Kind::Send, Kind::Recv])?;
        match &*g {
            Obj::Send(c) => Ok(c.counters()),
            Obj::Recv(c) => Ok(c.counters()),
            _ => Err(Error::internal("comm entry holds something else")),
        }
    }
}

fn counters_line(c: &[RailCounts; 2]) -> String {
    let r = |x: &RailCounts| {
        format!(
            "wr={} doorbells={} bytes={} imm={} cqe={} rnr={}",
            x.wr_posted, x.doorbells, x.bytes, x.imm_sent, x.cqe, x.rnr
        )
    };
    format!("SOUT[{}] SUP[{}]", r(&c[0]), r(&c[1]))
}
