//! A link: the one TCP connection between a soft device (a rail) and a device of a peer,
//! carrying the frames of every QP pair between them, as a NIC's port carries all its QPs
//! (issue 18: a thousand connections no longer need two thousand sockets).
//!
//! - **Receive.** Headers are read in batches into a staging buffer; a payload segment goes
//!   from the socket straight into its target region (`readv` with the region first and the
//!   staging buffer after it, so the next headers come in the same call). The QP a frame
//!   names ([`Station`]) decides, on the header, where its payload goes ([`Recv`]); the link
//!   places it, pinned, and hands back the held-back final word ([`Placed`]). Nothing a QP
//!   decides stops the link: a request that cannot run now is refused with RNR and sent
//!   again later (see `rx.rs`), so other QPs' frames keep flowing.
//! - **Send.** QPs with something to send wait in a ready list; each turn takes one QP's
//!   responses and at most one payload segment ([`Filler`]), then the next QP's (round
//!   robin), so a large WRITE on one QP and small frames of others interleave a segment at a
//!   time. Many frames leave in one `sendmsg`. Payloads are referenced in registered memory
//!   (pinned for the call) or copied (inline data) into the link's arena.
//! - **Faults.** A malformed header, a HELLO after the first frame, EOF, a reset or a silent
//!   peer break the link: every QP on it is told ([`Station::link_down`]). A QP's own fault
//!   is the QP's business.
//!
//! The link's owner (`port.rs`) dials, accepts, registers the socket for readiness and tears
//! the link down; this file is what runs on an established socket. Generic over the QP type
//! `S`, which sits above (`conn.rs`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::frame::{Frame, HDR_LEN, decode};
use super::liveness::Liveness;
use super::mr::MrTable;
use super::transport::{IovBuf, ZEROS, readv, writev};
use crate::fabric::{Access, MAX_SGE};

const STAGING: usize = 64 * 1024;
/// Bytes one step reads at most, so a busy stream cannot keep a caller forever.
const RX_BUDGET: u64 = 16 << 20;
/// A payload read straight into its region reads at most this much of what follows into
/// the staging buffer when more than this remains (the next header, not the next payload).
const RX_PEEK: u64 = 4096;
/// Frames committed to the stream at once, and their payload bytes.
const TX_FRAMES: usize = 64;
const TX_BYTES: u64 = 1 << 20;
/// Inline bytes the arena holds before it is compacted.
const ARENA: usize = 256 << 10;

/// Which link: the remote device's identity, and whether this side dialed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinkKey {
    pub remote: u64,
    pub dials: bool,
}

/// What a link asks of the QPs on it (implemented by the connection, `conn.rs`).
pub trait Station: Send + Sync + Sized + 'static {
    /// The QP's number.
    fn qpn(&self) -> u32;
    /// The frame `f` is for this QP: where its payload (if any) goes.
    fn on_frame(self: &Arc<Self>, f: &Frame, io: &mut Io<'_, Self>) -> Recv;
    /// The payload segment placed for [`Recv::Place`] is in.
    fn on_segment(self: &Arc<Self>, placed: Placed, io: &mut Io<'_, Self>);
    /// Queues this QP's frames: its responses, at most one payload segment. Returns whether
    /// it has more to send now (it stays in the ready list).
    fn fill(self: &Arc<Self>, out: &mut Filler<'_, Self>) -> bool;
    /// Only the acknowledgement this QP owes (sent along with other frames).
    fn fill_ack(self: &Arc<Self>, out: &mut Filler<'_, Self>);
    /// The frame pushed with `note` left in full.
    fn sent(self: &Arc<Self>, note: u64);
    /// The memory of the frame pushed with `note` is not registered any more (`started`:
    /// part of it left). A replacement header (with no payload) to send instead, or the QP
    /// fails (and purges the frame).
    fn source_lost(self: &Arc<Self>, note: u64, started: bool, io: &mut Io<'_, Self>) -> Option<[u8; HDR_LEN]>;
    /// The link broke (`why`).
    fn link_down(self: &Arc<Self>, why: &str, io: &mut Io<'_, Self>);
    /// A timer this QP set is due.
    fn timer(self: &Arc<Self>, now: Instant, io: &mut Io<'_, Self>);
}

/// Where a frame's payload goes.
pub enum Recv {
    /// Dropped (or there is none).
    Skip,
    Place(Dest),
}

/// The target of one payload segment: bytes `[off, off + len)` of a transfer laid out over
/// `segs` (key, address, length), those from `body_end` on held back (the final word).
#[derive(Clone, Copy)]
pub struct Dest {
    pub segs: [(u32, u64, u64); MAX_SGE],
    pub nseg: usize,
    pub need: Access,
    pub off: u64,
    pub body_end: u64,
}

/// A placed segment: whether every byte landed (a region can go away under it), and the
/// bytes `tail[lo..hi]` of the transfer's final word that were in it.
pub struct Placed {
    pub ok: bool,
    pub tail: [u8; 8],
    pub lo: usize,
    pub hi: usize,
}

/// Where a queued frame's payload comes from.
#[derive(Clone, Copy)]
pub enum Src {
    None,
    /// Bytes in the link's arena.
    Arena(usize),
    /// Bytes `[base, base + payload)` of a transfer laid out over `segs`, pinned for `need`.
    Mem {
        segs: [(u32, u64, u64); MAX_SGE],
        nseg: usize,
        base: u64,
        need: Access,
    },
    /// Zero bytes (the rest of a segment begun when its QP failed).
    Zeros,
}

/// A frame committed to the stream.
struct TxFrame<S> {
    hdr: [u8; HDR_LEN],
    src: Src,
    payload: u64,
    /// Bytes written, header included.
    off: u64,
    owner: Arc<S>,
    note: u64,
    request: bool,
}

/// The QPs waiting for a turn, owing an acknowledgement, or with a timer; and how many wait
/// on the peer (the silent-peer check runs only then).
struct Sched<S> {
    ready: VecDeque<Arc<S>>,
    owed: Vec<Arc<S>>,
    timers: Vec<(Instant, Arc<S>)>,
    waiting: isize,
}

/// The frame payload being received.
struct InSeg<S> {
    qp: Option<Arc<S>>,
    dest: Dest,
    len: u64,
    done: u64,
    placed: Placed,
}

/// The QPs of a device by number, for a CONNECT to a QP not yet on any link.
pub struct QpTable<S> {
    map: Mutex<HashMap<u32, Weak<S>>>,
}

impl<S> QpTable<S> {
    pub fn new() -> QpTable<S> {
        QpTable { map: Mutex::new(HashMap::new()) }
    }
    pub fn insert(&self, qpn: u32, s: &Arc<S>) {
        self.map.lock().insert(qpn, Arc::downgrade(s));
    }
    pub fn remove(&self, qpn: u32) {
        self.map.lock().remove(&qpn);
    }
    pub fn get(&self, qpn: u32) -> Option<Arc<S>> {
        self.map.lock().get(&qpn)?.upgrade()
    }
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}

/// Where a link is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// This side dials: a non-blocking connect is under way (or waits to be retried).
    Dialing {
        retry_at: Option<Instant>,
    },
    /// The peer dials: waiting for its socket.
    Awaiting,
    Up,
    Down,
}

/// A link (see the module documentation).
pub struct Link<S: Station> {
    pub key: LinkKey,
    /// The remote device's listener.
    pub remote_addr: std::net::SocketAddr,
    mrs: Arc<MrTable>,
    table: Arc<QpTable<S>>,
    st: Mutex<LinkState<S>>,
    /// Bumped by every step a caller makes on this link: the helper steps in only when it
    /// stops moving.
    pub caller_epoch: AtomicU64,
    /// Set while the link is in its device's list of links to step again.
    pub queued: AtomicBool,
    /// The caller epoch the helper's last sweep saw.
    pub swept: AtomicU64,
}

/// The state of a link, under its lock.
pub struct LinkState<S> {
    pub phase: Phase,
    pub fd: Option<OwnedFd>,
    /// The socket's token in the device's readiness sets.
    pub token: Option<usize>,
    /// `EPOLLOUT` is armed for the helper.
    pub out_armed: bool,
    /// The QPs on this link, by number.
    pub qps: HashMap<u32, Arc<S>>,
    /// CONNECTs parked on QPs not yet connected that name this link.
    pub parked: usize,
    /// A QP was on it once (an accepted link that never had one is an orphan).
    pub used: bool,
    pub since: Instant,
    /// The most a QP on it gives a silent peer.
    pub bound: Duration,
    hello: Option<([u8; HDR_LEN], usize)>,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    seg: Option<InSeg<S>>,
    frames: VecDeque<TxFrame<S>>,
    tx_payload: u64,
    arena: Vec<u8>,
    sched: Sched<S>,
    live: Liveness,
}

/// What one step of a link did.
#[derive(Default)]
pub struct Step {
    pub moved: bool,
    /// The link broke.
    pub down: Option<String>,
    /// Work is left that no socket event announces (a read budget spent, a timer).
    pub again: bool,
}

/// What a QP's callbacks may do to its link.
pub struct Io<'a, S: Station> {
    pub link: &'a Arc<Link<S>>,
    pub qps: &'a mut HashMap<u32, Arc<S>>,
    pub parked: &'a mut usize,
    sched: &'a mut Sched<S>,
    frames: &'a mut VecDeque<TxFrame<S>>,
}

impl<S: Station> Io<'_, S> {
    /// `s` has frames to send (it keeps a flag so it is listed once).
    pub fn ready(&mut self, s: &Arc<S>) {
        self.sched.ready.push_back(s.clone());
    }
    /// `s` owes an acknowledgement that may wait for other frames (listed once, as above).
    pub fn owe(&mut self, s: &Arc<S>) {
        self.sched.owed.push(s.clone());
    }
    /// Calls `s`'s [`Station::timer`] at `at` (listed once, as above).
    pub fn timer(&mut self, s: &Arc<S>, at: Instant) {
        self.sched.timers.push((at, s.clone()));
    }
    /// QPs waiting on the peer: `delta` more.
    pub fn waiting(&mut self, delta: isize) {
        self.sched.waiting += delta;
    }
    /// Drops QP `qpn`'s frames not yet begun (its requests only, with `requests_only`); a
    /// frame begun sends zeros for the rest (`!requests_only`: its memory is not read again).
    pub fn purge(&mut self, qpn: u32, requests_only: bool) {
        self.frames.retain_mut(|f| {
            if f.owner.qpn() != qpn || (requests_only && !f.request) {
                return true;
            }
            if f.off == 0 {
                return false;
            }
            if !requests_only {
                f.src = Src::Zeros;
                f.note = 0;
            }
            true
        });
    }
}

/// What a QP's [`Station::fill`] pushes frames into.
pub struct Filler<'a, S: Station> {
    pub io: Io<'a, S>,
    arena: &'a mut Vec<u8>,
    payload: &'a mut u64,
}

impl<S: Station> Filler<'_, S> {
    /// Whether a payload segment may be queued now.
    pub fn room(&self) -> bool {
        self.io.frames.len() < TX_FRAMES && *self.payload < TX_BYTES
    }

    /// Queues a frame (`payload` bytes from `src`); `note` comes back to [`Station::sent`].
    pub fn push(&mut self, owner: &Arc<S>, hdr: [u8; HDR_LEN], src: Src, payload: u64, note: u64, request: bool) {
        *self.payload += payload;
        self.io.frames.push_back(TxFrame { hdr, src, payload, off: 0, owner: owner.clone(), note, request });
    }

    /// Queues a frame whose payload is `bytes`, copied now.
    pub fn push_bytes(&mut self, owner: &Arc<S>, hdr: [u8; HDR_LEN], bytes: &[u8], note: u64, request: bool) {
        if self.arena.len() + bytes.len() > ARENA {
            compact(self.arena, self.io.frames);
        }
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        self.push(owner, hdr, Src::Arena(at), bytes.len() as u64, note, request);
    }
}

/// Drops the arena bytes no queued frame refers to.
fn compact<S>(arena: &mut Vec<u8>, frames: &mut VecDeque<TxFrame<S>>) {
    let first = frames.iter().find_map(|f| if let Src::Arena(at) = f.src { Some(at) } else { None });
    let cut = first.unwrap_or(arena.len());
    arena.drain(..cut);
    for f in frames.iter_mut() {
        if let Src::Arena(at) = &mut f.src {
            *at -= cut;
        }
    }
}

impl<S: Station> Link<S> {
    pub fn new(key: LinkKey, remote_addr: std::net::SocketAddr, mrs: Arc<MrTable>, table: Arc<QpTable<S>>) -> Self {
        let phase = if key.dials { Phase::Dialing { retry_at: None } } else { Phase::Awaiting };
        let st = LinkState {
            phase,
            fd: None,
            token: None,
            out_armed: false,
            qps: HashMap::new(),
            parked: 0,
            used: false,
            since: Instant::now(),
            bound: Duration::ZERO,
            hello: None,
            buf: vec![0; STAGING].into_boxed_slice(),
            start: 0,
            end: 0,
            seg: None,
            frames: VecDeque::with_capacity(TX_FRAMES),
            tx_payload: 0,
            arena: Vec::new(),
            sched: Sched { ready: VecDeque::new(), owed: Vec::new(), timers: Vec::new(), waiting: 0 },
            live: Liveness::new(),
        };
        Link {
            key,
            remote_addr,
            mrs,
            table,
            st: Mutex::new(st),
            caller_epoch: AtomicU64::new(0),
            queued: AtomicBool::new(false),
            swept: AtomicU64::new(u64::MAX),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, LinkState<S>> {
        self.st.lock()
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, LinkState<S>>> {
        self.st.try_lock()
    }
}

impl<S: Station> LinkState<S> {
    /// The QP callbacks' view of this link.
    pub fn io<'a>(&'a mut self, link: &'a Arc<Link<S>>) -> Io<'a, S> {
        Io { link, qps: &mut self.qps, parked: &mut self.parked, sched: &mut self.sched, frames: &mut self.frames }
    }

    /// Frames go out first: the dialer's HELLO.
    pub fn set_hello(&mut self, hdr: [u8; HDR_LEN]) {
        self.hello = Some((hdr, 0));
    }

    /// Nothing uses the link any more: no QP on it, no CONNECT parked for one.
    pub fn unused(&self) -> bool {
        self.qps.is_empty() && self.parked == 0
    }

    /// Bytes (or QPs' frames) wait for room in the socket.
    pub fn wants_write(&self) -> bool {
        self.hello.is_some() || !self.frames.is_empty() || !self.sched.ready.is_empty()
    }

    /// A QP joins: its silent-peer bound counts for the link.
    pub fn attach(&mut self, qpn: u32, s: &Arc<S>, bound: Duration) {
        self.qps.insert(qpn, s.clone());
        self.used = true;
        self.bound = self.bound.max(bound);
        self.live.set_bound(self.bound);
    }

    /// One step on an established link: read and dispatch, run due timers, send, check for
    /// a silent peer.
    pub fn step(&mut self, link: &Arc<Link<S>>) -> Step {
        let mut s = Step::default();
        if self.phase != Phase::Up {
            return s;
        }
        let (rx_moved, spent) = match self.pump(link) {
            Ok(r) => r,
            Err(why) => {
                s.down = Some(why);
                return s;
            }
        };
        s.again = spent;
        if !self.sched.timers.is_empty() {
            self.run_timers(link, Instant::now());
            s.again = true;
        }
        match self.flush(link) {
            Ok(m) => s.moved = m,
            Err(why) => {
                s.down = Some(why);
                return s;
            }
        }
        s.moved |= rx_moved;
        if rx_moved {
            self.live.moved();
        } else if self.sched.waiting > 0
            && let Some(why) = self.live.idle()
        {
            s.down = Some(why);
        }
        s
    }

    /// Sends what is queued (a post's doorbell), nothing else.
    pub fn send(&mut self, link: &Arc<Link<S>>) -> Step {
        let mut s = Step::default();
        if self.phase == Phase::Up {
            match self.flush(link) {
                Ok(m) => s.moved = m,
                Err(why) => s.down = Some(why),
            }
        }
        s
    }

    /// The silent-peer check alone (the helper's sweep of links no caller steps).
    pub fn silent(&mut self) -> Option<String> {
        if self.phase == Phase::Up && self.sched.waiting > 0 { self.live.idle() } else { None }
    }

    fn run_timers(&mut self, link: &Arc<Link<S>>, now: Instant) {
        let due: Vec<Arc<S>> = {
            let t = &mut self.sched.timers;
            let mut due = Vec::new();
            t.retain(|(at, s)| {
                if *at <= now {
                    due.push(s.clone());
                    false
                } else {
                    true
                }
            });
            due
        };
        for s in due {
            s.timer(now, &mut self.io(link));
        }
    }

    /// The link broke: every QP on it is told, the queues are emptied. Returns the socket
    /// (the owner takes it out of the readiness sets before it is closed).
    pub fn down(&mut self, link: &Arc<Link<S>>, why: &str) -> Option<OwnedFd> {
        self.phase = Phase::Down;
        let qps: Vec<Arc<S>> = self.qps.values().cloned().collect();
        for s in qps {
            s.link_down(why, &mut self.io(link));
        }
        self.frames.clear();
        self.seg = None;
        self.hello = None;
        self.sched.ready.clear();
        self.sched.owed.clear();
        self.sched.timers.clear();
        self.fd.take()
    }

    // ---- receive ------------------------------------------------------------------------

    /// Reads and dispatches what arrived. Returns whether anything moved and whether the
    /// read budget ran out; `Err`: the link broke. A read that returns less than it asked
    /// for drained the socket: the step reads no more (a read that would find nothing costs
    /// a system call; new bytes are seen at the next step, or their readiness event).
    fn pump(&mut self, link: &Arc<Link<S>>) -> Result<(bool, bool), String> {
        let mut budget = RX_BUDGET;
        let (mut moved, mut drained) = (false, false);
        loop {
            if self.seg.is_some() {
                match self.payload(link, &mut budget, drained)? {
                    Some(short) => {
                        drained |= short;
                        moved = true;
                        continue;
                    }
                    None => return Ok((moved, false)),
                }
            }
            if budget == 0 {
                return Ok((moved, true));
            }
            if self.end - self.start >= HDR_LEN {
                let hdr: [u8; HDR_LEN] = self.buf[self.start..self.start + HDR_LEN].try_into().expect("HDR_LEN");
                self.start += HDR_LEN;
                self.on_header(link, &hdr)?;
                moved = true;
                continue;
            }
            if drained {
                return Ok((moved, false));
            }
            match self.read_staging(usize::MAX)? {
                Some((n, short)) => {
                    budget = budget.saturating_sub(n as u64);
                    drained = short;
                    moved = true;
                }
                None => return Ok((moved, false)),
            }
        }
    }

    fn fd(&self) -> i32 {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// Reads up to `max` more bytes into the staging buffer; `None` when nothing came, else
    /// how many and whether fewer than asked (the socket is drained).
    fn read_staging(&mut self, max: usize) -> Result<Option<(usize, bool)>, String> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < HDR_LEN {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let free = &mut self.buf[self.end..];
        let n = free.len().min(max);
        let iov = [libc::iovec { iov_base: free.as_mut_ptr().cast(), iov_len: n }];
        let got = after_read(readv(self.fd(), &iov))?;
        if let Some(k) = got {
            self.end += k;
        }
        Ok(got.map(|k| (k, k < n)))
    }

    fn on_header(&mut self, link: &Arc<Link<S>>, hdr: &[u8; HDR_LEN]) -> Result<(), String> {
        let f = decode(hdr).map_err(|e| format!("malformed frame from the peer: {e}"))?;
        if let Frame::Hello { .. } = f {
            return Err("HELLO on an established link".into());
        }
        let qpn = f.dst_qpn();
        let mut target = self.qps.get(&qpn).cloned();
        if target.is_none() && matches!(f, Frame::Connect { .. }) {
            target = link.table.get(qpn);
        }
        let recv = match &target {
            Some(s) => s.on_frame(&f, &mut self.io(link)),
            None => {
                log::debug!("soft fabric: frame for QP {qpn}, not on this link (closed?): {f:?}; dropped");
                Recv::Skip
            }
        };
        let len = f.payload_len() as u64;
        if len > 0 {
            let (qp, dest) = match recv {
                Recv::Place(d) => (target, d),
                Recv::Skip => {
                    (None, Dest { segs: [(0, 0, 0); MAX_SGE], nseg: 0, need: Access::empty(), off: 0, body_end: 0 })
                }
            };
            let placed = Placed { ok: qp.is_some(), tail: [0; 8], lo: 8, hi: 0 };
            self.seg = Some(InSeg { qp, dest, len, done: 0, placed });
        }
        Ok(())
    }

    /// Moves payload bytes of the current segment: from the staging buffer first, else
    /// straight from the socket (unless it is `drained`). `None`: nothing more can move
    /// now; else whether a read drained the socket.
    fn payload(&mut self, link: &Arc<Link<S>>, budget: &mut u64, drained: bool) -> Result<Option<bool>, String> {
        let mut short = false;
        let avail = (self.end - self.start) as u64;
        let seg = self.seg.as_mut().expect("segment in progress");
        let (from, rest) = (seg.done, seg.len - seg.done);
        if avail > 0 {
            let n = rest.min(avail);
            let mut buf = IovBuf::new();
            if seg.placed.ok && !dest_iovs(&link.mrs, seg, from, from + n, &mut buf) {
                seg.placed.ok = false;
            }
            if seg.placed.ok {
                let mut src = self.start;
                for v in buf.iovs() {
                    // SAFETY: each iovec is a pinned, bounds-checked range of a registration
                    // (or this segment's tail buffer); the source lies in the staging buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(src), v.iov_base as *mut u8, v.iov_len)
                    };
                    src += v.iov_len;
                }
            }
            drop(buf);
            self.start += n as usize;
            seg.done += n;
            *budget = budget.saturating_sub(n);
        } else if drained {
            return Ok(None);
        } else if !seg.placed.ok {
            // Dropped bytes: read them into the staging buffer and skip them there.
            return Ok(self.read_staging(rest.min(STAGING as u64) as usize)?.map(|(_, short)| short));
        } else {
            let mut buf = IovBuf::new();
            if !dest_iovs(&link.mrs, seg, from, seg.len, &mut buf) {
                seg.placed.ok = false;
                return Ok(Some(false));
            }
            let dest = buf.bytes();
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            }
            let free = &mut self.buf[self.end..];
            let peek = if rest > RX_PEEK { HDR_LEN.min(free.len()) } else { free.len() };
            if peek > 0 {
                buf.push(free.as_mut_ptr(), peek);
            }
            let asked = buf.bytes();
            let r = readv(self.fd.as_ref().map_or(-1, |f| f.as_raw_fd()), buf.iovs());
            drop(buf);
            let Some(got) = after_read(r)? else { return Ok(None) };
            short = got < asked;
            let into_dest = got.min(dest);
            seg.done += into_dest as u64;
            self.end += got - into_dest;
            *budget = budget.saturating_sub(got as u64);
        }
        if seg.done == seg.len {
            let seg = self.seg.take().expect("segment in progress");
            if let Some(qp) = seg.qp {
                qp.on_segment(seg.placed, &mut self.io(link));
            }
        }
        Ok(Some(short))
    }

    // ---- send ---------------------------------------------------------------------------

    /// Commits the frames of ready QPs, a turn each, while the batch has room; then, if
    /// anything goes, the acknowledgements owed.
    fn fill(&mut self, link: &Arc<Link<S>>) {
        let LinkState { qps, parked, sched, frames, arena, tx_payload, .. } = self;
        if frames.is_empty() {
            arena.clear();
        }
        while frames.len() < TX_FRAMES && *tx_payload < TX_BYTES {
            let Some(s) = sched.ready.pop_front() else { break };
            let before = frames.len();
            let mut out = Filler {
                io: Io { link, qps: &mut *qps, parked: &mut *parked, sched: &mut *sched, frames: &mut *frames },
                arena: &mut *arena,
                payload: &mut *tx_payload,
            };
            let more = s.fill(&mut out);
            if more {
                sched.ready.push_back(s);
                if frames.len() == before {
                    break;
                }
            }
        }
        if !frames.is_empty() && !sched.owed.is_empty() {
            let owed = std::mem::take(&mut sched.owed);
            for s in owed {
                let mut out = Filler {
                    io: Io { link, qps: &mut *qps, parked: &mut *parked, sched: &mut *sched, frames: &mut *frames },
                    arena: &mut *arena,
                    payload: &mut *tx_payload,
                };
                s.fill_ack(&mut out);
            }
        }
    }

    /// Writes what is queued until the socket is full. Returns whether anything moved;
    /// `Err`: the link broke.
    fn flush(&mut self, link: &Arc<Link<S>>) -> Result<bool, String> {
        let mut moved = false;
        loop {
            self.fill(link);
            if self.hello.is_none() && self.frames.is_empty() {
                return Ok(moved);
            }
            let mut buf = IovBuf::new();
            let mut bad = None;
            if let Some((h, off)) = &self.hello {
                buf.push(h[*off..].as_ptr(), HDR_LEN - off);
            }
            for (i, f) in self.frames.iter().enumerate() {
                if buf.room() < 2 + MAX_SGE {
                    break;
                }
                if f.off < HDR_LEN as u64 {
                    let h = &f.hdr[f.off as usize..];
                    buf.push(h.as_ptr(), h.len());
                }
                let (from, to) = (f.off.saturating_sub(HDR_LEN as u64), f.payload);
                if from == to {
                    continue;
                }
                match f.src {
                    Src::None => {}
                    Src::Arena(at) => buf.push(self.arena[at + from as usize..].as_ptr(), (to - from) as usize),
                    Src::Zeros => buf.push(ZEROS.as_ptr(), ((to - from) as usize).min(ZEROS.len())),
                    Src::Mem { segs, nseg, base, need } => {
                        if !buf.push_segments(&link.mrs, segs[..nseg].iter().copied(), base + from, base + to, need) {
                            bad = Some(i);
                            break;
                        }
                    }
                }
                if matches!(f.src, Src::Zeros) && to - from > ZEROS.len() as u64 {
                    break; // one chunk of zeros per call
                }
            }
            let bytes = buf.bytes();
            if let Some(i) = bad {
                drop(buf);
                self.source_lost(link, i);
                continue;
            }
            let r = writev(self.fd(), buf.iovs());
            drop(buf);
            match r {
                Ok(w) => {
                    moved = true;
                    self.advance(w as u64);
                    if w < bytes {
                        return Ok(moved);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("send failed: {e}")),
            }
        }
    }

    /// Frame `i`'s memory is not registered any more: its QP decides.
    fn source_lost(&mut self, link: &Arc<Link<S>>, i: usize) {
        let (owner, note, started) = {
            let f = &self.frames[i];
            (f.owner.clone(), f.note, f.off > 0)
        };
        match owner.source_lost(note, started, &mut self.io(link)) {
            Some(hdr) if !started => {
                let f = &mut self.frames[i];
                (f.hdr, f.src, f.payload, f.note) = (hdr, Src::None, 0, 0);
            }
            _ => {
                // The QP failed and purged its frames; a frame begun sends zeros. Anything
                // left pointing at that memory goes too (a QP that would not let go).
                if let Some(f) = self.frames.get_mut(i)
                    && Arc::ptr_eq(&f.owner, &owner)
                    && matches!(f.src, Src::Mem { .. })
                {
                    if f.off == 0 {
                        self.frames.remove(i);
                    } else {
                        f.src = Src::Zeros;
                    }
                }
            }
        }
    }

    fn advance(&mut self, mut w: u64) {
        if let Some((_, off)) = &mut self.hello {
            let take = w.min((HDR_LEN - *off) as u64);
            *off += take as usize;
            w -= take;
            if *off == HDR_LEN {
                self.hello = None;
            }
        }
        while w > 0 {
            let f = self.frames.front_mut().expect("written bytes belong to queued frames");
            let total = HDR_LEN as u64 + f.payload;
            let take = w.min(total - f.off);
            f.off += take;
            w -= take;
            if f.off == total {
                let f = self.frames.pop_front().expect("front");
                self.tx_payload -= f.payload;
                if f.note != 0 {
                    f.owner.sent(f.note);
                }
            }
        }
    }
}

/// Adds the destinations of bytes `[from, to)` of segment `seg` (segment offsets), pinning
/// each region touched; the held-back final word goes to the segment's tail buffer.
fn dest_iovs<'a, S>(mrs: &'a MrTable, seg: &mut InSeg<S>, from: u64, to: u64, buf: &mut IovBuf<'a>) -> bool {
    let d = &seg.dest;
    let (from, to) = (d.off + from, d.off + to);
    let body_to = to.min(d.body_end);
    if from < body_to && !buf.push_segments(mrs, d.segs[..d.nseg].iter().copied(), from, body_to, d.need) {
        return false;
    }
    if to > d.body_end {
        let (lo, hi) = ((from.max(d.body_end) - d.body_end) as usize, (to - d.body_end) as usize);
        let p = &mut seg.placed;
        // The staging copy and readv write the held-back bytes here, not into the region.
        buf.push(p.tail[lo..].as_mut_ptr(), hi - lo);
        p.lo = p.lo.min(lo);
        p.hi = p.hi.max(hi);
    }
    true
}

/// A read's result: EOF and errors break the link; `None`: nothing yet.
fn after_read(r: std::io::Result<usize>) -> Result<Option<usize>, String> {
    match r {
        Ok(0) => Err("the peer closed the connection".into()),
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(format!("receive failed: {e}")),
    }
}
