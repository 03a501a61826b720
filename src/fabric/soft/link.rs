//! A link: the one TCP connection between a soft device (a rail) and a device of a peer,
//! carrying the frames of every QP pair between them, as a NIC's port carries all its QPs
//! (a thousand connections need not two thousand sockets).
//!
//! - **Receive.** Headers are read in batches into a staging buffer; a payload segment goes
//!   from the socket straight into its target region (`readv` with the region first and the
//!   staging buffer after it, so the next headers come in the same call). The QP a frame
//!   names ([`Station`]) decides, on the header, where its payload goes ([`Recv`]); the link
//!   places it, pinned, and hands back the held-back final word ([`Placed`]). Nothing a QP
//!   decides stops the link: a request that cannot run now is refused with RNR and sent
//!   again later (see `qp_recv.rs`), so other QPs' frames keep flowing.
//! - **Send.** QPs with something to send wait in a ready list; each turn takes one QP's
//!   responses and at most one payload segment ([`Filler`]), then the next QP's (round
//!   robin), so a large WRITE on one QP and small frames of others interleave a segment at a
//!   time. Many frames leave in one `sendmsg`. Payloads are referenced in registered memory
//!   (pinned for the call) or copied (inline data) into the link's arena.
//! - **Faults.** A malformed header, a HELLO after the first frame, EOF, a reset or a silent
//!   peer break the link: every QP on it is told ([`Station::link_down`]). A QP's own fault
//!   is the QP's business.
//!
//! The receive side is `link/recv.rs`, the send side `link/send.rs` (methods of the same
//! `LinkState`); this file holds the types, the step and the teardown.
//!
//! The link's owner (`port.rs`) dials, accepts, registers the socket for readiness and tears
//! the link down; this file is what runs on an established socket. Generic over the QP type
//! `S`, which sits above (`conn_tcp.rs`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::frame::{Frame, HDR_LEN, decode};
use super::liveness::Liveness;
use super::mr::MrTable;
use super::progress::AckHold;
use super::transport::{IovBuf, ZEROS, readv, writev};
use crate::fabric::{Access, MAX_SGE};

mod recv;
mod send;

const STAGING: usize = 64 * 1024;
/// Bytes one step reads at most, so a busy stream cannot keep a caller forever.
const RX_BUDGET: u64 = 16 << 20;
/// A payload read straight into its region reads, of what follows, only the next header
/// into the staging buffer when the payload is longer than this (the next payload goes
/// straight to its region too), the staging buffer's worth when shorter (small frames).
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

/// What a link asks of the QPs on it (implemented by the TCP connection, `station.rs`).
pub trait Station: Send + Sync + Sized + 'static {
    /// The QP's number.
    fn qpn(&self) -> u32;
    /// The frame `f` is for this QP: where its payload (if any) goes.
    fn on_frame(self: &Arc<Self>, f: &Frame, io: &mut Io<'_, Self>) -> Recv;
    /// The payload segment placed for [`Recv::Place`] is in.
    fn on_segment(self: &Arc<Self>, placed: Placed, io: &mut Io<'_, Self>);
    /// Whether the rest of a segment begun for this QP may still be placed: not once the QP
    /// went to the error state (a fence, a failure) while the segment was on the wire.
    fn places(&self) -> bool;
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
    /// Whether the acknowledgements owed go now (`progress.rs`).
    ack: AckHold,
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
pub struct Link<S> {
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
    /// Since when nothing uses it while what its last QPs sent still goes out (`port.rs`).
    pub unused_since: Option<Instant>,
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
    /// An acknowledgement owed (see [`Self::owe`]) is one a requester waits for.
    pub fn owe_urgent(&mut self) {
        self.sched.ack.owe_urgent();
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
    /// frame begun goes on to its end, from its own memory (`!requests_only`: nothing is
    /// noted as sent), so the stream stays framed and the peer gets the bytes the header
    /// promised. Not zeros: the peer's QP, still up, would take a zero-filled last segment
    /// as the end of a good WRITE, complete its IMM and report the part as arrived, and a
    /// rail failover would then not replay it (`failover` tests under load: a 16 MiB part
    /// with its last 68 KB zero). Zeros only where that memory is gone (deregistered while
    /// the frame was on the wire, `source_lost`: a caller's error).
    pub fn purge(&mut self, qpn: u32, requests_only: bool) {
        self.frames.retain_mut(|f| {
            if f.owner.qpn() != qpn || (requests_only && !f.request) {
                return true;
            }
            if f.off == 0 {
                return false;
            }
            if !requests_only {
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
            unused_since: None,
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
            sched: Sched {
                ready: VecDeque::new(),
                owed: Vec::new(),
                ack: AckHold::default(),
                timers: Vec::new(),
                waiting: 0,
            },
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
    /// a silent peer. `hold`: a caller's step, which may hold an acknowledgement for its
    /// next one (see [`Self::after_flush`]).
    pub fn step(&mut self, link: &Arc<Link<S>>, hold: bool) -> Step {
        let mut s = Step::default();
        if self.phase != Phase::Up {
            return s;
        }
        self.sched.ack.ripen(Instant::now);
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
        match self.flush(link).and_then(|m| Ok(self.after_flush(link, hold)? | m)) {
            Ok(m) => s.moved = m,
            Err(why) => {
                s.down = Some(self.last_words(link, why));
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

    /// Sends what is queued (a post's doorbell), nothing else. `hold`: as for [`Self::step`]
    /// (a link nobody uses any more holds nothing back).
    pub fn send(&mut self, link: &Arc<Link<S>>, hold: bool) -> Step {
        let mut s = Step::default();
        if self.phase == Phase::Up {
            self.sched.ack.ripen(Instant::now);
            match self.flush(link).and_then(|m| Ok(self.after_flush(link, hold)? | m)) {
                Ok(m) => s.moved = m,
                Err(why) => s.down = Some(self.last_words(link, why)),
            }
        }
        s
    }

    /// Sending broke the link (the peer closed or reset it): what the peer wrote before it
    /// went (an ACK, a CLOSE) may still wait in the socket, and is read and dispatched
    /// before the link is declared down, so a peer's orderly close reads as one.
    fn last_words(&mut self, link: &Arc<Link<S>>, why: String) -> String {
        for _ in 0..64 {
            match self.pump(link) {
                Ok((moved, _)) if moved => {}
                _ => break,
            }
        }
        why
    }

    /// After a flush: an acknowledgement a requester waits for and still owed is held by a
    /// caller's step (`hold`), sent now by the helper's (`progress::AckHold`). Returns
    /// whether anything moved.
    fn after_flush(&mut self, link: &Arc<Link<S>>, hold: bool) -> Result<bool, String> {
        if self.sched.ack.after_flush(hold, Instant::now) { self.flush(link) } else { Ok(false) }
    }

    /// An acknowledgement a requester waits for, or frames of a post, are held for the
    /// caller's next step.
    pub fn held(&self) -> bool {
        self.sched.ack.owed() || !self.sched.ready.is_empty()
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
        self.sched.ack.sent();
        self.sched.timers.clear();
        self.fd.take()
    }

    /// The socket (-1 when there is none).
    fn fd(&self) -> i32 {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}
