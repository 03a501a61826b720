//! The plugin for one fabric provider: its devices and every object NCCL holds a handle
//! to. All of it is generic over the provider's `Device`; `mod.rs` picks the provider once.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::comm::{RecvComm, SendComm};
use super::context::Context;
use super::devices::Devices;
use super::discover::FoundPair;
use super::handles::{CommHandle, ContextHandle, Handle, Kind, ListenHandle, MemHandle, RequestHandle, Table};
use super::instance_state::InstanceState;
use super::listen::ListenComm;
use super::listen_handle;
use super::mr::{MrHandle, MrInfo, MrMemo};
use super::nic_pair::NicPair;
use super::oob::OobListener;
use super::setup::{Connecting, FabricKind, Params};
use super::{AbiVersion, BufArg, HANDLE_BYTES, MAX_RECVS};
use crate::config::{Config, RailAddr};
use crate::engine::{RAILS, RailCounts, RecvBuf, cold};
use crate::error::{Error, Result};
use crate::fabric::{Device, MemTypes, netif};

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
    pub devices: Devices<D>,
    cfg: &'static Config,
    objs: Table<Obj<D>>,
    /// Bumped whenever a registration is released: comms' [`MrMemo`]s older than it are
    /// looked up again.
    mr_epoch: AtomicU64,
    /// The v11+ contexts NCCL holds (one per communicator, `init` to `finalize`): set-up
    /// only, never the data path.
    contexts: Mutex<BTreeMap<u64, Arc<Context<D>>>>,
    /// The context of ABIs before v11, which have none: every connection of the process.
    default_ctx: OnceLock<Arc<Context<D>>>,
    /// What the instance's contexts share (resource counts, statistics, in-process listeners).
    pub state: &'static InstanceState,
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
    pub fn new(
        kind: FabricKind,
        pairs: Vec<FoundPair<D>>,
        cfg: &'static Config,
        state: &'static InstanceState,
    ) -> Self {
        let devices = Devices::new(pairs, cfg.nccl_devices);
        Plugin {
            kind,
            devices,
            cfg,
            objs: Table::new(),
            mr_epoch: AtomicU64::new(1),
            contexts: Mutex::new(BTreeMap::new()),
            default_ctx: OnceLock::new(),
            state,
        }
    }

    /// A v11+ context for communicator `comm_id` under handle value `id`.
    pub fn new_context(&self, id: u64, comm_id: u64, traffic_class: Option<i32>) {
        let c = Arc::new(Context::new(id, comm_id, traffic_class, self.cfg.srq_depth, self.state));
        self.contexts.lock().insert(id, c);
    }

    /// Where the events of the connections made in context `ctx` from now on go (NCCL's
    /// profiler callback of the `init` that made it; v10: of the default context).
    pub fn set_profiler(&self, ctx: Option<ContextHandle>, sink: Option<super::profile::Sink>) -> Result<()> {
        self.context(ctx)?.set_profiler(sink);
        Ok(())
    }

    /// The context of a call: NCCL's (v11+), or the default one (older ABIs pass none).
    pub fn context(&self, ctx: Option<ContextHandle>) -> Result<Arc<Context<D>>> {
        let Some(h) = ctx else {
            return Ok(self
                .default_ctx
                .get_or_init(|| Arc::new(Context::new(0, 0, None, self.cfg.srq_depth, self.state)))
                .clone());
        };
        self.contexts.lock().get(&h.0).cloned().ok_or_else(|| {
            Error::invalid_argument(format!("unknown plugin context {:#x} (not from init, or finalized)", h.0))
        })
    }

    /// `finalize(ctx)`: NCCL is done with the context. Its queues stay as long as
    /// connections use them (they may be closed after this).
    pub fn finalize_context(&self, h: ContextHandle) -> Result<()> {
        match self.contexts.lock().remove(&h.0) {
            Some(_) => Ok(()),
            None => Err(Error::invalid_argument(format!("finalize: unknown plugin context {:#x}", h.0))),
        }
    }

    fn pair(&self, abi: AbiVersion, dev: i32) -> Result<Arc<NicPair<D>>> {
        self.devices.get(abi, dev)
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

    fn params(&self, abi: AbiVersion, tc: Option<i32>) -> Params {
        Params::new(self.cfg, self.kind, abi, tc)
    }

    pub fn listen(
        &self,
        abi: AbiVersion,
        ctx: Option<ContextHandle>,
        dev: i32,
        handle: &mut [u8; HANDLE_BYTES],
    ) -> Result<ListenHandle> {
        let pair = self.pair(abi, dev)?;
        let ctx = self.context(ctx)?;
        let (listener, addr) = match self.kind {
            FabricKind::Inproc => OobListener::inproc(&self.state.inproc),
            _ => OobListener::tcp(self.listen_ip()?)?,
        };
        listen_handle::write_handle(handle, self.kind, addr);
        let p = self.params(abi, None);
        let listen = ListenComm::new(listener, pair, ctx, p);
        self.objs.insert(Kind::Listen, Obj::Listen(Box::new(listen))).map(ListenHandle)
    }

    /// `connect`; `tc`: the traffic class of v10's `connect` config (v11+: the context's).
    pub fn connect(
        &self,
        abi: AbiVersion,
        ctx: Option<ContextHandle>,
        dev: i32,
        handle: &mut [u8; HANDLE_BYTES],
        tc: Option<i32>,
    ) -> Result<Option<CommHandle>> {
        let mut token = listen_handle::handle_token(handle);
        if token == 0 {
            let addr = listen_handle::read_handle(handle, self.kind)?;
            let ctx = self.context(ctx)?;
            let p = self.params(abi, tc.or(ctx.traffic_class));
            let c = Connecting::start(self.pair(abi, dev)?, p, addr, &ctx)?;
            token = self.objs.insert(Kind::Pending, Obj::Connecting(Box::new(c)))?;
            listen_handle::set_handle_token(handle, token);
        }
        let step = {
            let (_, mut g) = self.objs.get(token, Kind::Pending)?;
            match &mut *g {
                Obj::Connecting(c) => c.step(std::time::Instant::now()),
                _ => Err(Error::internal("pending connection entry holds something else")),
            }
        };
        match step {
            Ok(None) => Ok(None),
            Ok(Some(comm)) => {
                let _ = self.objs.remove(token, Kind::Pending);
                listen_handle::set_handle_token(handle, 0);
                self.objs.insert(Kind::Send, Obj::Send(Box::new(comm))).map(|h| Some(CommHandle(h)))
            }
            Err(e) => {
                let _ = self.objs.remove(token, Kind::Pending);
                listen_handle::set_handle_token(handle, 0);
                Err(e)
            }
        }
    }

    pub fn accept(&self, listen: ListenHandle) -> Result<Option<CommHandle>> {
        let r = {
            let (_, mut g) = self.objs.get(listen.0, Kind::Listen)?;
            match &mut *g {
                Obj::Listen(l) => l.accept(std::time::Instant::now())?,
                _ => return Err(Error::internal("listen entry holds something else")),
            }
        };
        match r {
            None => Ok(None),
            Some(comm) => self.objs.insert(Kind::Recv, Obj::Recv(Box::new(comm))).map(|h| Some(CommHandle(h))),
        }
    }

    fn comm_pair(&self, comm: CommHandle) -> Result<Arc<NicPair<D>>> {
        let (_, g) = self.objs.get_any(comm.0, &[Kind::Send, Kind::Recv])?;
        match &*g {
            Obj::Send(c) => Ok(c.core.dev.clone()),
            Obj::Recv(c) => Ok(c.core.dev.clone()),
            _ => Err(Error::internal("comm entry holds something else")),
        }
    }

    pub fn reg_mr(&self, comm: CommHandle, addr: u64, size: usize, mem: MemTypes) -> Result<MemHandle> {
        // The comm lock is held only to find its devices: registering can take long.
        let pair = self.comm_pair(comm)?;
        let mh = pair.reg_mr(addr, size as u64, mem)?;
        self.objs.insert(Kind::Mr, Obj::Mr(mh)).map(MemHandle)
    }

    pub fn reg_mr_dmabuf(
        &self,
        comm: CommHandle,
        addr: u64,
        size: usize,
        mem: MemTypes,
        offset: u64,
        fd: i32,
    ) -> Result<MemHandle> {
        let pair = self.comm_pair(comm)?;
        if mem != MemTypes::CUDA && mem != MemTypes::DMABUF {
            return Err(Error::invalid_argument(format!("regMrDmaBuf of {mem:?} memory (CUDA or DMA-BUF expected)")));
        }
        let mh = pair.reg_dmabuf(addr, size as u64, offset, fd)?;
        self.objs.insert(Kind::Mr, Obj::Mr(mh)).map(MemHandle)
    }

    pub fn dereg_mr(&self, comm: CommHandle, mh: MemHandle) -> Result<()> {
        // The registration belongs to its handle, not to the comm: it can be released after
        // the comm was closed (the comm handle must still be one NCCL got from us).
        if !Handle::decode(comm.0).is_some_and(|h| matches!(h.kind, Kind::Send | Kind::Recv)) {
            return Err(Error::invalid_argument(format!(
                "deregMr: {:#x} is not a send or receive comm handle",
                comm.0
            )));
        }
        let obj = self.objs.remove(mh.0, Kind::Mr)?;
        // After the removal: a memo taken before this sees the new epoch and looks again.
        self.mr_epoch.fetch_add(1, Ordering::Release);
        match obj {
            Obj::Mr(m) => m.release(),
            _ => Err(Error::internal("memory handle entry holds something else")),
        }
    }

    /// A memory handle's data, copied out. Called with the comm's entry locked: locks are
    /// only ever taken comm first, registration second.
    fn mr_info(&self, mh: MemHandle) -> Result<MrInfo> {
        let (_, g) = self.objs.get(mh.0, Kind::Mr)?;
        match &*g {
            Obj::Mr(m) => Ok(m.info),
            _ => Err(Error::internal("memory handle entry holds something else")),
        }
    }

    /// [`Self::mr_info`] through the comm's memo of the registration it used last.
    #[inline]
    fn mr_memo(&self, memo: &mut MrMemo, mh: MemHandle) -> Result<MrInfo> {
        let (v, epoch) = (mh.0, self.mr_epoch.load(Ordering::Acquire));
        if let Some(info) = memo.get(v, epoch) {
            return Ok(info);
        }
        let info = self.mr_info(mh)?;
        memo.set(v, epoch, info);
        Ok(info)
    }

    /// Data path (as `irecv` and `test`): inlined into the ABI shim, its one caller.
    #[inline(always)]
    pub fn isend(
        &self,
        comm: CommHandle,
        addr: u64,
        size: usize,
        tag: i32,
        mh: MemHandle,
        phandle: usize,
    ) -> Result<Option<RequestHandle>> {
        let size = size_ok(size)?;
        let (h, mut g) = self.objs.get(comm.0, Kind::Send)?;
        let Obj::Send(c) = &mut *g else { return Err(Error::internal("send entry holds something else")) };
        let info = self.mr_memo(&mut c.core.mr_memo, mh)?;
        let r = c.isend(addr, size, tag as u32, &info)?;
        c.profile_isend(r, phandle);
        match r {
            None => Ok(None),
            Some(id) => Ok(Some(RequestHandle(h.request(id, c.core.seqs.bump(id))))),
        }
    }

    #[inline(always)]
    pub fn irecv(
        &self,
        comm: CommHandle,
        n: usize,
        arg: &impl Fn(usize) -> Result<BufArg>,
        phandle: &impl Fn(usize) -> usize,
    ) -> Result<Option<RequestHandle>> {
        if n > MAX_RECVS {
            return Err(cold(|| {
                Error::invalid_argument(format!("{n} receives in one irecv (1..{MAX_RECVS} allowed)"))
            }));
        }
        let (h, mut g) = self.objs.get(comm.0, Kind::Recv)?;
        let Obj::Recv(c) = &mut *g else { return Err(Error::internal("receive entry holds something else")) };
        // One buffer (NCCL's usual irecv) is built where it is used; the array only for
        // grouped receives (zeroing it cost ~20 instructions per irecv).
        let posted = if n == 1 {
            let b = self.recv_buf(&mut c.core.mr_memo, 0, arg)?;
            let r = c.irecv(std::slice::from_ref(&b))?;
            c.profile_irecv(r, std::slice::from_ref(&b), phandle);
            r
        } else {
            let mut bufs = [RecvBuf::default(); MAX_RECVS];
            for (i, b) in bufs.iter_mut().enumerate().take(n) {
                *b = self.recv_buf(&mut c.core.mr_memo, i, arg)?;
            }
            let r = c.irecv(&bufs[..n])?;
            c.profile_irecv(r, &bufs[..n], phandle);
            r
        };
        match posted {
            None => Ok(None),
            Some(id) => Ok(Some(RequestHandle(h.request(id, c.core.seqs.bump(id))))),
        }
    }

    /// Receive buffer `i` of an irecv, checked against its registration.
    #[inline(always)]
    fn recv_buf(&self, memo: &mut MrMemo, i: usize, arg: &impl Fn(usize) -> Result<BufArg>) -> Result<RecvBuf> {
        let a = arg(i)?;
        let (addr, size) = (a.addr, size_ok(a.size)?);
        let rkeys = match a.mh {
            None if size > 0 => {
                return Err(cold(|| Error::invalid_argument(format!("irecv buffer {i} has no memory handle"))));
            }
            None => [0; RAILS],
            Some(mh) => {
                let mh = self.mr_memo(memo, mh)?;
                if !mh.covers(addr, size) {
                    return Err(cold(|| {
                        Error::invalid_argument(format!(
                            "irecv buffer {i} ({size} bytes at {addr:#x}) lies outside its registration [{:#x}, +{})",
                            mh.addr, mh.len
                        ))
                    }));
                }
                [mh.keys[0].rkey, mh.keys[1].rkey]
            }
        };
        Ok(RecvBuf { addr, size, tag: a.tag as u32, rkeys })
    }

    pub fn iflush(&self, comm: CommHandle, args: &[BufArg]) -> Result<Option<RequestHandle>> {
        // net_ib flushes after the last non-empty buffer; nothing to do without one.
        let Some((a, mh)) = args.iter().rev().find_map(|a| a.mh.filter(|_| a.size > 0).map(|mh| (a, mh))) else {
            self.comm_pair(comm)?;
            return Ok(None);
        };
        let info = self.mr_info(mh)?;
        let (h, mut g) = self.objs.get(comm.0, Kind::Recv)?;
        let Obj::Recv(c) = &mut *g else { return Err(Error::internal("receive entry holds something else")) };
        match c.iflush(Some((a.addr, info)))? {
            None => Ok(None),
            Some(id) => Ok(Some(RequestHandle(h.request(id, c.core.seqs.bump(id))))),
        }
    }

    /// `test`: whether the request is done; once it is, `put` is given its sizes (none for
    /// a flush), under the comm's lock, read where the engine keeps them.
    #[inline(always)]
    pub fn test(&self, request: RequestHandle, put: impl FnOnce(&[u64]) -> Result<()>) -> Result<bool> {
        let v = request.0;
        let Some((comm, kind, id, seq)) = Handle::split_request(v) else {
            return Err(cold(|| Error::invalid_argument(format!("{v:#x} is not a request handle"))));
        };
        let (_, mut g) = self.objs.get(comm, kind)?;
        let stale =
            || cold(|| Error::invalid_argument(format!("request {v:#x} is not in flight (already completed?)")));
        let one: [u64; 1];
        // (`put` called at one place: inlined.)
        let sizes: &[u64] = match &mut *g {
            Obj::Send(c) => {
                if !c.core.seqs.matches(id, seq) || !c.engine.is_live(id) {
                    return Err(stale());
                }
                let Some(size) = c.test(id)? else { return Ok(false) };
                one = [size];
                &one
            }
            Obj::Recv(c) => {
                if !c.core.seqs.matches(id, seq) || !c.engine.is_live(id) {
                    return Err(stale());
                }
                let Some(n) = c.test(id)? else { return Ok(false) };
                c.profile_done(id);
                c.engine.done_sizes(id, n)
            }
            _ => return Err(Error::internal("request's comm entry holds something else")),
        };
        put(sizes)?;
        Ok(true)
    }

    /// Every live connection's state, as a hang report shows it (`hang.rs`): a header line,
    /// then each connection's place and state.
    pub fn dump_state(&self) -> String {
        use std::fmt::Write;
        let now = super::comm::now_ns();
        let (mut text, mut n, mut busy) = (String::new(), 0, 0);
        self.objs.for_each_live(std::time::Duration::from_millis(100), |o| match o {
            Some(Obj::Send(c)) => {
                n += 1;
                let _ = writeln!(text, "{}", super::hang::describe(&c.core.fo.place, c.engine.state_report(now)));
            }
            Some(Obj::Recv(c)) => {
                n += 1;
                let _ = writeln!(text, "{}", super::hang::describe(&c.core.fo.place, c.engine.state_report(now)));
            }
            Some(_) => {}
            None => busy += 1,
        });
        let busy =
            if busy > 0 { format!(" ({busy} objects busy in another thread, not shown)") } else { String::new() };
        format!("mpib state: {n} connections{busy}\n{text}")
    }

    pub fn close(&self, handle: u64, kind: Kind) -> Result<()> {
        match self.objs.remove(handle, kind)? {
            Obj::Send(mut c) => {
                c.closing();
                log::info!("closing a send comm: {}", counters_line(&c.counters()))
            }
            Obj::Recv(mut c) => {
                c.closing();
                log::info!("closing a receive comm: {}", counters_line(&c.counters()))
            }
            _ => return Ok(()),
        }
        // The closed comm's figures are folded into the totals: write them out now.
        self.state.flush_stats();
        Ok(())
    }

    /// Calls `f` with the QPs of each rail (SOUT, SUP) of a send or receive comm (not the
    /// flush QPs): for tools and device tests that check what the QPs were made with.
    pub fn with_qps<R>(&self, comm: CommHandle, f: impl FnOnce([&[D::Qp]; RAILS]) -> R) -> Result<R> {
        let (_, g) = self.objs.get_any(comm.0, &[Kind::Send, Kind::Recv])?;
        let rails = match &*g {
            Obj::Send(c) => &c.core.rails,
            Obj::Recv(c) => &c.core.rails,
            _ => return Err(Error::internal("comm entry holds something else")),
        };
        Ok(f([&rails[0].qps, &rails[1].qps]))
    }

    /// Per-rail counters of a send or receive comm.
    pub fn counters(&self, comm: CommHandle) -> Result<[RailCounts; 2]> {
        let (_, g) = self.objs.get_any(comm.0, &[Kind::Send, Kind::Recv])?;
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
