//! One rank of a two-rank run: agree on the workload over the control channel, `init`,
//! exchange listen handles, connect and accept (non-blocking, interleaved), feed bad
//! handles if asked, run every phase, barrier, close, finalize. Rank 0 receives and rank 1
//! sends (both do both when the workload is bidirectional).

use std::ffi::c_void;
use std::time::Duration;

use super::link::Link;
use super::mem::Arena;
use super::net::{HANDLE_BYTES, ListenComm, Mr, Net, Plugin, RecvBuf, RecvComm, ReqKind, Request, SendComm};
use super::report::{Failure, PhaseReport, RankReport, RoundReport, Snapshot, mono_ns};
use super::spec::{Phase, Workload};
use super::stats_view::StatsView;
use super::workload::{At, Leftovers, run_phase};
use super::{Error, ErrorKind, Result};

/// A rank's progress, for tools that show it: phase `index` (its warm-up when `warmup`)
/// starts at `at_ns` ([`mono_ns`]) with `count` groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseStart {
    pub index: usize,
    pub warmup: bool,
    pub count: u64,
    pub at_ns: u64,
}

/// What a rank set up before [`run_on`]: mpib-perf's `--listen` creates its listen comm
/// first and hands the handle to the peer in its token.
#[derive(Default)]
pub struct Preset<'n> {
    /// This rank's listen comm; its handle already reached the peer (not sent again).
    pub listen: Option<ListenComm<'n>>,
    /// The peer's listen handle, received out of band (not expected on the link).
    pub peer_handle: Option<[u8; HANDLE_BYTES]>,
}

/// Runs this rank; returns its report (with the first error, if any) and, when the run got
/// as far as the final barrier, the peer's report.
pub fn run(plugin: &Plugin, link: &mut Link, rank: u32, w: &Workload) -> (RankReport, Option<RankReport>) {
    run_observed(plugin, link, rank, w, &mut |_| {})
}

/// [`run`], telling `obs` when each phase starts.
pub fn run_observed(
    plugin: &Plugin,
    link: &mut Link,
    rank: u32,
    w: &Workload,
    obs: &mut dyn FnMut(&PhaseStart),
) -> (RankReport, Option<RankReport>) {
    let mut rep = RankReport { rank, abi: plugin.version(), plugin: plugin.name(), ..RankReport::default() };
    let r = (|| {
        agree(link, w)?;
        let net = plugin.init()?;
        let peer = session(&net, Preset::default(), link, rank, w, &mut rep, obs)?;
        net.finalize()?;
        Ok(peer)
    })();
    finish(rep, r)
}

/// [`run_observed`] on a plugin this rank already initialised (and perhaps listened on);
/// the caller finalizes `net` afterwards.
pub fn run_on<'n>(
    net: &'n Net,
    preset: Preset<'n>,
    link: &mut Link,
    rank: u32,
    w: &Workload,
    obs: &mut dyn FnMut(&PhaseStart),
) -> (RankReport, Option<RankReport>) {
    let plugin = net.plugin();
    let mut rep = RankReport { rank, abi: plugin.version(), plugin: plugin.name(), ..RankReport::default() };
    let r = agree(link, w).and_then(|()| session(net, preset, link, rank, w, &mut rep, obs));
    finish(rep, r)
}

fn finish(mut rep: RankReport, r: Result<RankReport>) -> (RankReport, Option<RankReport>) {
    match r {
        Ok(peer) => (rep, Some(peer)),
        Err(error) => {
            rep.failure = Some(Failure { error, at_ns: mono_ns() });
            (rep, None)
        }
    }
}

/// Both ranks must run the same workload.
fn agree(link: &mut Link, w: &Workload) -> Result<()> {
    let ours = w.to_line();
    link.send("workload", ours.as_bytes())?;
    let theirs = String::from_utf8_lossy(&link.expect("workload", Duration::from_millis(w.stall_ms))?).into_owned();
    if theirs != ours {
        return Err(Error::usage(format!(
            "the two ranks' workloads differ:\n  this rank: {ours}\n  peer:      {theirs}"
        )));
    }
    w.check()
}

/// Everything after `init`: connect, the phases, the barrier (which carries the reports),
/// close. Returns the peer's report.
fn session<'n>(
    net: &'n Net,
    preset: Preset<'n>,
    link: &mut Link,
    rank: u32,
    w: &Workload,
    rep: &mut RankReport,
    obs: &mut dyn FnMut(&PhaseStart),
) -> Result<RankReport> {
    let t0 = mono_ns();
    let wait = Duration::from_millis(w.stall_ms);
    let plugin = net.plugin();
    // The workload's device is the w.dev-th of the devices NCCL would use (after fusing what
    // NCCL fuses: `net::fusion`).
    let dev = net.nccl_device(w.dev)?;
    let props = net.properties(dev)?;
    rep.device = props.name.clone();
    if let Some(rails) = plugin.device_rails(plugin.version(), dev)? {
        rep.line_mbps = rails.each_ref().map(|r| r.line_mbps());
    }
    for (i, p) in w.phases.iter().enumerate() {
        if p.nrecv > props.max_recvs.max(1) as usize {
            return Err(Error::usage(format!(
                "phase {i}: nrecv {} above the device's maxRecvs {}",
                p.nrecv, props.max_recvs
            )));
        }
        if p.inflight > plugin.max_requests() {
            return Err(Error::usage(format!(
                "phase {i}: {} receives in flight; NCCL keeps at most {} per comm with ABI v{}",
                p.inflight,
                plugin.max_requests(),
                plugin.version()
            )));
        }
    }
    rep.base = Snapshot::now(plugin.resource_stats()?);
    let mut preset = Some(preset);
    for round in 0..w.rounds {
        let last = round + 1 == w.rounds;
        let t_round = mono_ns();
        let (tx, rx) = connect(net, preset.take().unwrap_or_default(), link, rank, w, dev)?;
        let setup_ns = mono_ns() - t_round;
        if round == 0 {
            rep.setup_ns = mono_ns() - t0;
        }
        let open = Snapshot::now(plugin.resource_stats()?);
        if w.bad_handles && round == 0 {
            probe_bad_handles(net, dev, tx.first(), rx.first(), &mut rep.bad_handles);
        }
        let mut left = Leftovers::default();
        for index in 0..w.phases.len() {
            let (pr, l) = run_one(At::of(w, index), link, rank, &tx, &rx, obs)?;
            rep.phases.push(pr);
            left = l;
        }
        if w.bad_handles && last {
            probe_stale_requests(net, &left, &mut rep.bad_handles);
        }
        let used = Snapshot::now(plugin.resource_stats()?);
        // Nobody closes while the peer may still need the connections (NCCL destroys
        // communicators after a barrier too); the last barrier carries the reports so far.
        let mut peer = None;
        if last {
            rep.rails = plugin.rail_stats()?;
            rep.view = StatsView::take(plugin)?;
            // (The peer's copy lacks this round: it is only done once the comms are closed.)
            link.send("done", rep.to_line().as_bytes())?;
            let line = link.expect("done", wait.max(Duration::from_secs(60)))?;
            peer = Some(RankReport::from_line(&String::from_utf8_lossy(&line))?);
        } else {
            link.send("round", b"")?;
            link.expect("round", wait.max(Duration::from_secs(60)))?;
        }
        let stale: [Option<*mut c_void>; 2] = [tx.first().map(SendComm::raw), rx.first().map(RecvComm::raw)];
        for c in tx {
            c.close()?;
        }
        for c in rx {
            c.close()?;
        }
        let closed = Snapshot::now(plugin.resource_stats()?);
        rep.rounds.push(RoundReport { setup_ns, open, used, closed });
        if w.bad_handles && last {
            // SAFETY: deliberately closed handles; mpib checks every handle it is given.
            unsafe {
                if let Some(h) = stale[0] {
                    probe(&mut rep.bad_handles, "closeSend(closed comm)", SendComm::from_raw(net, h).close());
                }
                if let Some(h) = stale[1] {
                    probe(&mut rep.bad_handles, "closeRecv(closed comm)", RecvComm::from_raw(net, h).close());
                }
            }
        }
        if let Some(peer) = peer {
            return Ok(peer);
        }
    }
    unreachable!("rounds >= 1 (Workload::check)")
}

/// One phase: its warm-up first if it has one (after which, with a time budget, rank 0
/// picks the phase's count), then the phase.
fn run_one(
    at: At<'_>,
    link: &mut Link,
    rank: u32,
    tx: &[SendComm<'_>],
    rx: &[RecvComm<'_>],
    obs: &mut dyn FnMut(&PhaseStart),
) -> Result<(PhaseReport, Leftovers)> {
    let (p, index) = (at.phase, at.index);
    let mut count = p.count;
    let mut warm_report = None;
    if p.warmup > 0 {
        let warm = p.warmup_phase();
        let at = At { phase: &warm, warmup: true, start_ns: mono_ns(), ..at };
        obs(&PhaseStart { index, warmup: true, count: warm.count, at_ns: at.start_ns });
        let (r, _) = run_phase(at, tx, rx)?;
        if p.budget_ms > 0 {
            count = budget_count(link, rank, p, &r, Duration::from_millis(at.w.stall_ms))?;
        }
        warm_report = Some(Box::new(r));
    }
    let phase = p.with_count(count);
    let at = At { phase: &phase, start_ns: mono_ns(), ..at };
    obs(&PhaseStart { index, warmup: false, count, at_ns: at.start_ns });
    let (mut r, left) = run_phase(at, tx, rx)?;
    r.start_ns = at.start_ns;
    r.warmup = warm_report;
    Ok((r, left))
}

/// The count that makes `p` last about `p.budget_ms` (at most `p.count`), from the time
/// per group of its warm-up `warm`: rank 0 decides and tells rank 1, so both run the same.
fn budget_count(link: &mut Link, rank: u32, p: &Phase, warm: &PhaseReport, wait: Duration) -> Result<u64> {
    if rank != 0 {
        let body = link.expect("count", wait)?;
        let text = String::from_utf8_lossy(&body);
        return text.parse().map_err(|_| Error::io(format!("control channel: count {text:?} is not a number")));
    }
    let elapsed = warm.tx.iter().chain(warm.rx.iter()).map(|s| s.elapsed_ns).max().unwrap_or(0);
    let per_group = (elapsed / p.warmup.max(1)).max(1);
    let count = (p.budget_ms * 1_000_000 / per_group).clamp(1, p.count.max(1));
    link.send("count", count.to_string().as_bytes())?;
    Ok(count)
}

/// Listen (if this rank receives) once per connection, exchange the handles, then call
/// `connect` and `accept` in turn until every comm exists, as NCCL's proxy does; each
/// listen comm is closed right after its `accept` succeeds. Receive comm `i` is the peer's
/// send comm `i` (it connected with handle `i`). A [`Preset`] listen comm's handle and the
/// peer's handle it carries do not cross the link (one connection only). `dev`: the
/// plugin's device index.
fn connect<'n>(
    net: &'n Net,
    preset: Preset<'n>,
    link: &mut Link,
    rank: u32,
    w: &Workload,
    dev: i32,
) -> Result<(Vec<SendComm<'n>>, Vec<RecvComm<'n>>)> {
    let wait = Duration::from_millis(w.stall_ms);
    let n = w.comms as usize;
    let receives = w.bidir || rank == 0;
    let sends = w.bidir || rank == 1;
    let preset_listen = preset.listen.is_some();
    if n > 1 && (preset_listen || preset.peer_handle.is_some()) {
        return Err(Error::usage("a preset listen comm or handle serves one connection, not several"));
    }
    let mut listens: Vec<Option<ListenComm<'n>>> = match preset.listen {
        Some(l) if receives => vec![Some(l)],
        Some(_) => return Err(Error::usage(format!("rank {rank} only sends: it has no use for a listen comm"))),
        None if receives => (0..n).map(|_| net.listen(dev).map(Some)).collect::<Result<_>>()?,
        None => Vec::new(),
    };
    if receives && !preset_listen {
        let handles: Vec<u8> = listens.iter().flatten().flat_map(|l| l.handle().iter().copied()).collect();
        link.send("handles", &handles)?;
    }
    let mut conns = match (sends, preset.peer_handle) {
        (false, _) => Vec::new(),
        (true, Some(h)) => vec![net.connector(dev, &h)],
        (true, None) => {
            let h = link.expect("handles", wait)?;
            if h.len() != n * HANDLE_BYTES {
                return Err(Error::io(format!("the peer sent {} bytes of handles for {n} connections", h.len())));
            }
            h.chunks(HANDLE_BYTES).map(|c| net.connector(dev, c.try_into().expect("128 bytes"))).collect()
        }
    };
    let mut tx: Vec<Option<SendComm<'n>>> = (0..conns.len()).map(|_| None).collect();
    let mut rx: Vec<Option<RecvComm<'n>>> = (0..listens.len()).map(|_| None).collect();
    let mut last_progress = mono_ns();
    loop {
        let mut progressed = false;
        for (c, t) in conns.iter_mut().zip(tx.iter_mut()).filter(|(_, t)| t.is_none()) {
            *t = c.poll()?;
            progressed |= t.is_some();
        }
        for (l, r) in listens.iter_mut().zip(rx.iter_mut()).filter(|(_, r)| r.is_none()) {
            *r = l.as_mut().expect("listening until accepted").accept()?;
            if r.is_some() {
                l.take().expect("listening").close()?;
                progressed = true;
            }
        }
        let (up_tx, up_rx) = (tx.iter().flatten().count(), rx.iter().flatten().count());
        if up_tx == tx.len() && up_rx == rx.len() {
            return Ok((tx.into_iter().flatten().collect(), rx.into_iter().flatten().collect()));
        }
        if progressed {
            last_progress = mono_ns();
        } else if mono_ns() - last_progress > wait.as_nanos() as u64 {
            let state = |up: usize, of: usize, needed: bool| {
                if !needed { "not needed".to_string() } else { format!("{up} of {of} up") }
            };
            return Err(Error::timeout(format!(
                "connection set-up made no progress for {} ms (send comms: {}, receive comms: {})",
                w.stall_ms,
                state(up_tx, tx.len(), sends),
                state(up_rx, rx.len(), receives),
            )));
        }
        std::thread::yield_now();
    }
}

/// Records the `ncclResult_t` a bad call returned (0 = it was accepted, -1 = the driver
/// caught a contract violation instead).
fn probe<T>(out: &mut Vec<(String, i32)>, what: &str, r: Result<T>) {
    let code = match r {
        Ok(_) => 0,
        Err(e) if e.kind == ErrorKind::Call => e.code,
        Err(_) => -1,
    };
    out.push((what.to_string(), code));
}

const GARBAGE: usize = 0xdead_beef_0bad_f00d;

/// Bad handles and arguments NCCL users hit: each must give an error code, not a crash,
/// and leave the real connection working (the phases run afterwards).
fn probe_bad_handles(
    net: &Net,
    dev: i32,
    tx: Option<&SendComm<'_>>,
    rx: Option<&RecvComm<'_>>,
    out: &mut Vec<(String, i32)>,
) {
    let garbage = GARBAGE as *mut c_void;
    let arena = match Arena::new(4096) {
        Ok(a) => a,
        Err(e) => return probe::<()>(out, "arena for the probes", Err(e)),
    };
    // SAFETY: every handle below is deliberately bad; mpib checks each handle it is given,
    // and comms built on real handles are forgotten, never closed.
    unsafe {
        probe(out, "test(NULL)", Request::from_raw(net, std::ptr::null_mut(), ReqKind::Send).test());
        probe(out, "test(garbage)", Request::from_raw(net, garbage, ReqKind::Recv(1)).test());
        probe(out, "getProperties(dev 1000)", net.properties(1000));
        probe(out, "connect(zeroed handle)", net.connector(dev, &[0; HANDLE_BYTES]).poll());
        probe(out, "closeListen(garbage)", ListenComm::from_raw(net, garbage).close());
        let fake_rx = RecvComm::from_raw(net, garbage);
        probe(out, "regMr(garbage comm)", fake_rx.reg_mr(&arena));
        probe(out, "closeRecv(garbage)", fake_rx.close());
        if let Some(tx) = tx {
            probe(out, "test(send comm handle)", Request::from_raw(net, tx.raw(), ReqKind::Send).test());
            let fake_mr = Mr::from_raw(net, tx.raw(), garbage, &arena);
            probe(out, "isend(garbage mhandle)", tx.isend(&fake_mr, 0, 8, 1));
            std::mem::forget(fake_mr);
            if let Ok(mr) = tx.reg_mr(&arena) {
                let fake = SendComm::from_raw(net, garbage);
                probe(out, "isend(garbage comm)", fake.isend(&mr, 0, 8, 1));
                if net.plugin().has_counters() {
                    probe(out, "mpib_comm_counters(garbage)", fake.counters());
                }
                probe(out, "closeSend(garbage)", fake.close());
                let as_recv = std::mem::ManuallyDrop::new(RecvComm::from_raw(net, tx.raw()));
                let b = [RecvBuf { mr: &mr, off: 0, len: 8, tag: 1 }];
                probe(out, "irecv(send comm)", as_recv.irecv(&b));
                probe(out, "deregMr(garbage mhandle)", Mr::from_raw(net, tx.raw(), garbage, &arena).dereg());
                let _ = mr.dereg();
            }
        }
        if let Some(rx) = rx {
            probe(out, "test(receive comm handle)", Request::from_raw(net, rx.raw(), ReqKind::Recv(1)).test());
            let fake_mr = Mr::from_raw(net, rx.raw(), garbage, &arena);
            probe(out, "irecv(garbage mhandle)", rx.irecv(&[RecvBuf { mr: &fake_mr, off: 0, len: 8, tag: 1 }]));
            std::mem::forget(fake_mr);
            if let Ok(mr) = rx.reg_mr(&arena) {
                let b = [RecvBuf { mr: &mr, off: 0, len: 8, tag: 1 }];
                let fake = RecvComm::from_raw(net, garbage);
                probe(out, "irecv(garbage comm)", fake.irecv(&b));
                std::mem::forget(fake);
                let as_send = std::mem::ManuallyDrop::new(SendComm::from_raw(net, rx.raw()));
                probe(out, "isend(receive comm)", as_send.isend(&mr, 0, 8, 1));
                let _ = mr.dereg();
            }
        }
    }
}

/// `test` of requests that already completed: NCCL never does it, but a stale handle
/// must be an error, not a crash or a second completion.
fn probe_stale_requests(net: &Net, left: &Leftovers, out: &mut Vec<(String, i32)>) {
    // SAFETY: handles the plugin issued and declared done; mpib checks request handles.
    unsafe {
        if let Some(r) = left.send_req {
            probe(out, "test(completed send request)", Request::from_raw(net, r, ReqKind::Send).test());
        }
        if let Some(r) = left.recv_req {
            probe(out, "test(completed receive request)", Request::from_raw(net, r, ReqKind::Recv(1)).test());
        }
    }
}
