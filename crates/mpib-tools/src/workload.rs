//! One phase of a workload, driven as NCCL's proxy drives a connection: up to a window of
//! requests in flight per direction, posting until the plugin answers NULL ("retry later"),
//! then one `test` of the oldest request per progress step. The sender fills each buffer
//! with its pattern just before posting; the receiver puts canaries around what it expects,
//! checks each completed buffer byte for byte and the sizes `test` reported, and both sides
//! checksum the delivered bytes.

use std::collections::VecDeque;
use std::io::Write;
use std::time::Duration;

use super::mem::Arena;
use super::net::{MAX_RECVS, Mr, RailCounters, RecvComm, Request, SendComm, Sizes};
use super::pattern;
use super::report::{PhaseReport, SideStats, counters_delta, mono_ns};
use super::spec::{Kill, Phase, Side, Workload, tag};
use super::timeline::Timeline;
use super::{Error, Result};

mod receiver;
pub use receiver::Receiver;

/// Where a phase is: which workload, which phase, and the phase as run.
#[derive(Clone, Copy)]
pub struct At<'w> {
    pub w: &'w Workload,
    pub index: usize,
    /// `w.phases[index]`, its warm-up, or it with the count a time budget chose.
    pub phase: &'w Phase,
    /// The warm-up of phase `index`: patterns of its own, so that no warm-up byte can pass
    /// for one of the phase's.
    pub warmup: bool,
    /// [`mono_ns`] when the phase started: the zero of its timeline.
    pub start_ns: u64,
    /// Which of the workload's connections ([`Workload::comms`]): each has patterns of its
    /// own, so a byte delivered to the wrong connection is caught.
    pub comm: u32,
}

/// Mixed into the pattern seed of warm-ups.
const WARMUP_SEED: u64 = 0x7761_726d_7570;

impl<'w> At<'w> {
    /// Phase `index` as the workload writes it, starting now.
    pub fn of(w: &'w Workload, index: usize) -> At<'w> {
        At { w, index, phase: &w.phases[index], warmup: false, start_ns: mono_ns(), comm: 0 }
    }
    fn phase(&self) -> &'w Phase {
        self.phase
    }
    fn key(&self, g: u64, j: usize) -> u64 {
        let seed = if self.warmup { self.w.seed ^ WARMUP_SEED } else { self.w.seed };
        // Connection 0 keeps the one-connection patterns.
        let seed = seed ^ (self.comm as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        pattern::key(seed, self.index as u32, g, j as u32)
    }
}

/// The order in which the sender posts the `n` buffers of group `g` (a seeded shuffle:
/// tags, not posting order, must pick the buffer).
fn send_order(seed: u64, phase: usize, g: u64, n: usize) -> [u8; MAX_RECVS] {
    let mut o = [0u8; MAX_RECVS];
    for (i, x) in o.iter_mut().enumerate() {
        *x = i as u8;
    }
    let mut r = pattern::key(seed ^ 0x5eed, phase as u32, g, 99);
    for i in (1..n).rev() {
        r = r.rotate_left(17).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        o.swap(i, (r % (i as u64 + 1)) as usize);
    }
    o
}

/// Kills this process the way a crashed or killed rank dies: SIGKILL, nothing cleaned up.
/// The line before it gives the parent the moment of death.
fn die(side: Side, after: u64) -> ! {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "NCCLNET-DRIVER-KILLED side={} after={after} at_ns={}", side.name(), mono_ns());
    let _ = out.flush();
    // SAFETY: sending a signal to this very process; it does not return.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned");
}

/// Adds phase context to an error from a plugin call.
fn ctx(e: Error, what: impl std::fmt::Display) -> Error {
    Error { msg: format!("{what}: {}", e.msg), ..e }
}

struct InFlight<'c> {
    req: Request<'c>,
    /// Send index (sender) or group (receiver).
    id: u64,
    /// Buffer (tag index) of the group (sender).
    buf: usize,
    posted_ns: u64,
    /// Checksum of the bytes this send delivers.
    sum: u64,
}

/// What both directions keep: the requests in flight (oldest first, as NCCL's proxy), the
/// statistics, post-to-completion latencies, and the kill, if this side is the victim.
struct Window<'c> {
    side: Side,
    cap: usize,
    inflight: VecDeque<InFlight<'c>>,
    stats: SideStats,
    lat: Vec<u64>,
    first_post: Option<u64>,
    last_done: u64,
    kill: Option<Kill>,
    /// Handle of the last completed request (for the stale-handle probe).
    last_req: Option<*mut std::ffi::c_void>,
}

impl<'c> Window<'c> {
    fn new(side: Side, cap: usize, completions: u64, kill: Option<Kill>) -> Self {
        Window {
            side,
            cap,
            inflight: VecDeque::with_capacity(cap),
            stats: SideStats::default(),
            lat: Vec::with_capacity(completions.min(1 << 24) as usize),
            first_post: None,
            last_done: 0,
            kill: kill.filter(|k| k.side == side),
            last_req: None,
        }
    }

    fn has_room(&self) -> bool {
        self.inflight.len() < self.cap
    }

    /// Records what `isend`/`irecv` answered; whether a request was posted.
    fn posted(&mut self, r: Option<Request<'c>>, id: u64, buf: usize, sum: u64) -> bool {
        let Some(req) = r else {
            self.stats.null_requests += 1;
            return false;
        };
        let now = mono_ns();
        self.first_post.get_or_insert(now);
        self.inflight.push_back(InFlight { req, id, buf, posted_ns: now, sum });
        true
    }

    /// One `test` of the oldest request; the request and its sizes once done.
    fn test_oldest(&mut self, index: usize) -> Result<Option<(InFlight<'c>, Sizes)>> {
        let Some(f) = self.inflight.front_mut() else { return Ok(None) };
        self.stats.test_calls += 1;
        let what = |e| ctx(e, format!("phase {index} test of {} #{}", self.side.name(), f.id));
        let Some(sizes) = f.req.test().map_err(what)? else { return Ok(None) };
        let f = self.inflight.pop_front().expect("front");
        let now = mono_ns();
        self.lat.push(now - f.posted_ns);
        self.last_done = now;
        self.last_req = Some(f.req.raw());
        Ok(Some((f, sizes)))
    }

    /// Counts a completed request; dies here if this side is the victim.
    fn completed(&mut self) {
        self.stats.requests += 1;
        if let Some(k) = self.kill
            && self.stats.requests == k.after
        {
            die(self.side, k.after);
        }
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if self.stats.first_wrong.is_empty() {
            self.stats.first_wrong = what();
        }
    }

    fn describe(&self, posted: u64, total: u64) -> String {
        let (who, what) = if self.side == Side::Send { ("sender", "send") } else { ("receiver", "receive") };
        format!(
            "{who} posted {posted}/{total} {what}s, {} in flight{}",
            self.inflight.len(),
            self.inflight.front().map(|f| format!(" (oldest: {what} #{})", f.id)).unwrap_or_default()
        )
    }

    fn finish(mut self) -> SideStats {
        let mut s = self.stats;
        s.elapsed_ns = self.last_done.saturating_sub(self.first_post.unwrap_or(self.last_done));
        self.lat.sort_unstable();
        if let Some(&max) = self.lat.last() {
            let at = |q: usize| self.lat[(self.lat.len() * q / 100).min(self.lat.len() - 1)];
            (s.lat_p50_ns, s.lat_p99_ns, s.lat_max_ns) = (at(50), at(99), max);
        }
        s
    }
}

/// The sending side of one phase.
pub struct Sender<'c> {
    at: At<'c>,
    comm: &'c SendComm<'c>,
    mr: &'c Mr<'c>,
    slot: usize,
    total: u64,
    next: u64,
    /// The send whose buffer is filled (it may be posted after NULL answers), its checksum.
    prepared: Option<(u64, u64)>,
    order: [u8; MAX_RECVS],
    win: Window<'c>,
    timeline: Option<Timeline>,
}

impl<'c> Sender<'c> {
    /// `mr`'s arena must hold [`Sender::arena_bytes`].
    pub fn new(at: At<'c>, comm: &'c SendComm<'c>, mr: &'c Mr<'c>) -> Sender<'c> {
        let p = at.phase();
        let total = p.count * p.nrecv as u64;
        let win = Window::new(Side::Send, p.window() * p.nrecv, total, p.kill);
        let timeline = Timeline::for_phase(p, at.start_ns);
        let order = [0; MAX_RECVS];
        Sender { at, comm, mr, slot: p.slot_bytes(), total, next: 0, prepared: None, order, win, timeline }
    }

    /// Samples the comm's per-rail bytes if the timeline is due (or now, when `force`).
    fn sample(&mut self, force: bool) -> Result<()> {
        if let Some(tl) = self.timeline.as_mut()
            && !tl.sample(self.comm, force, self.next)?
        {
            self.timeline = None; // not an mpib library: nothing to sample
        }
        Ok(())
    }

    pub fn arena_bytes(p: &Phase) -> usize {
        p.window() * p.nrecv * p.slot_bytes()
    }

    pub fn finished(&self) -> bool {
        self.next == self.total && self.win.inflight.is_empty()
    }

    fn buffer_of(&mut self, k: u64) -> (u64, usize) {
        let n = self.at.phase().nrecv;
        let (g, pos) = (k / n as u64, (k % n as u64) as usize);
        if pos == 0 {
            self.order = send_order(self.at.w.seed, self.at.index, g, n);
        }
        (g, self.order[pos] as usize)
    }

    /// Fills send `k`'s buffer (once, however often NULL answers make it wait); its checksum.
    fn prepare(&mut self, k: u64, off: usize, g: u64, j: usize) -> u64 {
        if let Some((pk, sum)) = self.prepared
            && pk == k
        {
            return sum;
        }
        let p = self.at.phase();
        let mut sum = 0;
        if self.at.w.check {
            // SAFETY: the slot's previous send (k - window) completed: fewer than `window`
            // are in flight and they complete in order.
            let buf = unsafe { self.mr.arena().bytes_mut(off, p.send_size(g, j) as usize) };
            let want = p.expected(g, j) as usize;
            sum = pattern::fill(buf, self.at.key(g, j), want);
            if p.corrupt == Some(k) && want > 0 {
                buf[want / 2] ^= 0x40;
            }
        }
        self.prepared = Some((k, sum));
        sum
    }

    /// One progress step: post until the window is full or the plugin says "later", then
    /// test the oldest send. Whether anything happened.
    pub fn step(&mut self) -> Result<bool> {
        let p = self.at.phase();
        let mut progressed = false;
        self.sample(false)?;
        while self.next < self.total && self.win.has_room() {
            let k = self.next;
            let off = (k % self.win.cap as u64) as usize * self.slot;
            let (g, j) = self.buffer_of(k);
            let sum = self.prepare(k, off, g, j);
            let size = p.send_size(g, j) as usize;
            let what =
                |e| ctx(e, format!("phase {} send #{k} (group {g}, tag {}, {size} bytes)", self.at.index, tag(j)));
            let r = self.comm.isend(self.mr, off, size, tag(j)).map_err(what)?;
            if !self.win.posted(r, k, j, sum) {
                break;
            }
            self.next += 1;
            progressed = true;
        }
        if let Some((f, sizes)) = self.win.test_oldest(self.at.index)? {
            let (k, j) = (f.id, f.buf);
            let g = k / p.nrecv as u64;
            let want = p.expected(g, j);
            if sizes.sizes[0] as u64 != want {
                self.win.stats.wrong_sizes += 1;
                let got = sizes.sizes[0];
                self.win.note(|| {
                    format!("send #{k} (group {g}, tag {}): test reported {got} bytes, expected {want}", tag(j))
                });
            }
            let s = &mut self.win.stats;
            s.checksum = s.checksum.wrapping_add(f.sum);
            s.bytes += want;
            s.messages += 1;
            if let Some(tl) = self.timeline.as_mut() {
                tl.completed(s.messages);
            }
            self.win.completed();
            progressed = true;
            if self.finished() {
                self.sample(true)?;
            }
        }
        Ok(progressed)
    }

    pub fn describe(&self) -> String {
        self.win.describe(self.next, self.total)
    }

    pub fn last_done(&self) -> Option<*mut std::ffi::c_void> {
        self.win.last_req
    }

    pub fn finish(self) -> SideStats {
        let mut s = self.win.finish();
        let r = self.timeline.map(Timeline::into_recorded).unwrap_or_default();
        (s.timeline, s.failover_events, s.recoveries) = (r.samples, r.events, r.recoveries);
        s
    }
}

/// Stale request handles left by a phase, for the bad-handle probes.
#[derive(Default)]
pub struct Leftovers {
    pub send_req: Option<*mut std::ffi::c_void>,
    pub recv_req: Option<*mut std::ffi::c_void>,
}

/// Runs phase `at.index` on this rank's comms (either list may be empty in one-way runs):
/// all of them at once, one progress step of each in turn. The report sums them.
pub fn run_phase(at: At<'_>, tx: &[SendComm<'_>], rx: &[RecvComm<'_>]) -> Result<(PhaseReport, Leftovers)> {
    let p = at.phase();
    let tx_arenas = tx.iter().map(|_| Arena::new(Sender::arena_bytes(p))).collect::<Result<Vec<_>>>()?;
    let rx_arenas = rx.iter().map(|_| Arena::new(Receiver::arena_bytes(p))).collect::<Result<Vec<_>>>()?;
    let tx_mrs = tx
        .iter()
        .zip(&tx_arenas)
        .map(|(c, a)| c.reg_mr(a).map_err(|e| ctx(e, format!("phase {} send buffers", at.index))))
        .collect::<Result<Vec<_>>>()?;
    let rx_mrs = rx
        .iter()
        .zip(&rx_arenas)
        .map(|(c, a)| c.reg_mr(a).map_err(|e| ctx(e, format!("phase {} receive buffers", at.index))))
        .collect::<Result<Vec<_>>>()?;
    let counters = |c: Result<Option<[RailCounters; 2]>>| c;
    let tx_before = tx.iter().map(|c| counters(c.counters())).collect::<Result<Vec<_>>>()?;
    let rx_before = rx.iter().map(|c| counters(c.counters())).collect::<Result<Vec<_>>>()?;
    let at_comm = |i: usize| At { comm: i as u32, ..at };
    let mut senders: Vec<Sender<'_>> =
        tx.iter().zip(&tx_mrs).enumerate().map(|(i, (c, m))| Sender::new(at_comm(i), c, m)).collect();
    let mut receivers: Vec<Receiver<'_>> =
        rx.iter().zip(&rx_mrs).enumerate().map(|(i, (c, m))| Receiver::new(at_comm(i), c, m)).collect();
    let stall = Duration::from_millis(at.w.stall_ms).as_nanos() as u64;
    let mut last_progress = mono_ns();
    loop {
        let mut progressed = false;
        for s in senders.iter_mut().filter(|s| !s.finished()) {
            progressed |= s.step()?;
        }
        for r in receivers.iter_mut().filter(|r| !r.finished()) {
            progressed |= r.step()?;
        }
        if senders.iter().all(Sender::finished) && receivers.iter().all(Receiver::finished) {
            break;
        }
        if progressed {
            last_progress = mono_ns();
        } else {
            if mono_ns() - last_progress > stall {
                let unfinished = |d: String| if d.is_empty() { None } else { Some(d) };
                let d: Vec<String> = senders
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.finished())
                    .map(|(i, s)| format!("send comm {i}: {}", s.describe()))
                    .chain(
                        receivers
                            .iter()
                            .enumerate()
                            .filter(|(_, r)| !r.finished())
                            .map(|(i, r)| format!("receive comm {i}: {}", r.describe())),
                    )
                    .filter_map(unfinished)
                    .take(8)
                    .collect();
                return Err(Error::timeout(format!(
                    "phase {}: no progress for {} ms: {}",
                    at.index,
                    at.w.stall_ms,
                    d.join("; ")
                )));
            }
            std::thread::yield_now();
        }
    }
    let mut left = Leftovers::default();
    let mut report = PhaseReport::default();
    if !senders.is_empty() {
        left.send_req = senders[0].last_done();
        let mut sum = SideStats::default();
        for (i, s) in senders.into_iter().enumerate() {
            let mut st = s.finish();
            if let (Some(b), Some(a)) = (tx_before[i], tx[i].counters()?) {
                st.counters = Some(counters_delta(&a, &b));
            }
            add_stats(&mut sum, st, i == 0);
        }
        report.tx = Some(sum);
    }
    if !receivers.is_empty() {
        left.recv_req = receivers[0].last_done();
        let mut sum = SideStats::default();
        for (i, r) in receivers.into_iter().enumerate() {
            let mut st = r.finish();
            if let (Some(b), Some(a)) = (rx_before[i], rx[i].counters()?) {
                st.counters = Some(counters_delta(&a, &b));
            }
            add_stats(&mut sum, st, i == 0);
        }
        report.rx = Some(sum);
    }
    for m in tx_mrs.into_iter().chain(rx_mrs) {
        m.dereg()?;
    }
    Ok((report, left))
}

/// Adds one connection's figures to the phase's: counts and checksums add up, latencies
/// and time take the worst, the first connection's timeline and first wrong thing stand
/// unless it had none.
fn add_stats(sum: &mut SideStats, s: SideStats, first: bool) {
    if first {
        *sum = s;
        return;
    }
    sum.requests += s.requests;
    sum.messages += s.messages;
    sum.bytes += s.bytes;
    sum.elapsed_ns = sum.elapsed_ns.max(s.elapsed_ns);
    sum.lat_p50_ns = sum.lat_p50_ns.max(s.lat_p50_ns);
    sum.lat_p99_ns = sum.lat_p99_ns.max(s.lat_p99_ns);
    sum.lat_max_ns = sum.lat_max_ns.max(s.lat_max_ns);
    sum.wrong_bytes += s.wrong_bytes;
    sum.wrong_sizes += s.wrong_sizes;
    sum.canary_broken += s.canary_broken;
    sum.checksum = sum.checksum.wrapping_add(s.checksum);
    if sum.first_wrong.is_empty() {
        sum.first_wrong = s.first_wrong;
    }
    sum.null_requests += s.null_requests;
    sum.test_calls += s.test_calls;
    sum.flushes += s.flushes;
    sum.counters = match (sum.counters, s.counters) {
        (Some(a), Some(b)) => Some([add_counters(&a[0], &b[0]), add_counters(&a[1], &b[1])]),
        _ => None,
    };
}

fn add_counters(a: &RailCounters, b: &RailCounters) -> RailCounters {
    RailCounters {
        wr_posted: a.wr_posted + b.wr_posted,
        doorbells: a.doorbells + b.doorbells,
        bytes: a.bytes + b.bytes,
        imm_sent: a.imm_sent + b.imm_sent,
        cqe: a.cqe + b.cqe,
        rnr: a.rnr + b.rnr,
        zero_byte_imm: a.zero_byte_imm + b.zero_byte_imm,
        probes: a.probes + b.probes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_order_is_a_seeded_permutation() {
        let mut seen_other = false;
        for g in 0..50 {
            let o = send_order(3, 0, g, 8);
            let mut s = o;
            s.sort();
            assert_eq!(s, [0, 1, 2, 3, 4, 5, 6, 7]);
            seen_other |= o != [0, 1, 2, 3, 4, 5, 6, 7];
            assert_eq!(send_order(3, 0, g, 1)[0], 0);
            assert_eq!(o, send_order(3, 0, g, 8));
        }
        assert!(seen_other);
    }
}
