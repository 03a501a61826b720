//! What the scenarios share: setting up a connection pair with a peer over a control
//! channel, the plan of a stream (groups of sends matched to multi-receives), and the two
//! loops that carry it as NCCL's proxy does (a NULL request is "again later", the oldest
//! request is tested, every received byte and size is checked).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::Rng;
use crate::link::Link;
use crate::mem::Arena;
use crate::net::{HANDLE_BYTES, MAX_RECVS, Mr, Net, RecvBuf, RecvComm, Request, SendComm};
use crate::pattern::{self, CANARY};
use crate::{Error, Result};

/// How long a control-channel message may take (a peer may be busy setting up others).
pub const CONTROL_WITHIN: Duration = Duration::from_secs(120);

/// Listens on `listen_dev`, trades handles with the peer over `link`, connects to the peer's
/// listener from `connect_dev` and accepts the peer's connection, calling `connect` and
/// `accept` in turn from this one thread (NCCL's service thread does the same), then closes
/// the listen comm. `pause` runs between calls (random delays).
pub fn connect_pair<'n>(
    net: &'n Net,
    link: &mut Link,
    listen_dev: i32,
    connect_dev: i32,
    within: Duration,
    mut pause: impl FnMut(),
) -> Result<(SendComm<'n>, RecvComm<'n>)> {
    let mut lc = net.listen(listen_dev)?;
    link.send("handle", lc.handle())?;
    let theirs = link.expect("handle", CONTROL_WITHIN)?;
    let handle: [u8; HANDLE_BYTES] =
        theirs.try_into().map_err(|_| Error::io("control channel: a handle of the wrong size"))?;
    let mut connector = net.connector(connect_dev, &handle);
    let (mut send, mut recv) = (None, None);
    let end = Instant::now() + within;
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = connector.poll().map_err(|e| context(e, "connect"))?;
        }
        if recv.is_none() {
            recv = lc.accept().map_err(|e| context(e, "accept"))?;
        }
        if Instant::now() > end {
            return Err(Error::timeout(format!(
                "connect/accept not done in {within:?} (connected {}, accepted {})",
                send.is_some(),
                recv.is_some()
            )));
        }
        pause();
    }
    lc.close()?;
    Ok((send.expect("connected"), recv.expect("accepted")))
}

/// `e` with what the scenario was doing.
pub fn context(mut e: Error, what: &str) -> Error {
    e.msg = format!("{what}: {}", e.msg);
    e
}

/// One buffer of a group: the bytes sent, the receive posted for them, the tag.
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    pub size: usize,
    pub recv_len: usize,
    pub tag: i32,
}

/// A stream: groups of sends, each matched to one multi-receive of as many buffers.
#[derive(Clone, Debug)]
pub struct Plan {
    pub groups: Vec<Vec<Buf>>,
    /// Order in which the sender posts each group's buffers (a permutation per group).
    pub send_order: Vec<Vec<usize>>,
    /// The pattern seed of the stream.
    pub seed: u64,
    /// Largest receive buffer: the arenas' stride.
    pub stride: usize,
}

impl Plan {
    /// `groups` groups of 1 … `max_n` buffers of 0 … `max_size` bytes (mixed sizes and
    /// distinct tags within a group), receives up to `slack` bytes larger than the send.
    /// Both ends build it from the same `rng`.
    pub fn random(rng: &mut Rng, groups: usize, max_n: usize, max_size: usize, slack: usize) -> Plan {
        let max_n = max_n.clamp(1, MAX_RECVS);
        let mut plan = Plan { groups: Vec::new(), send_order: Vec::new(), seed: rng.next_u64(), stride: 1 };
        for _ in 0..groups {
            let n = rng.range(1, max_n as u64) as usize;
            let first_tag = rng.range(0, 1 << 20) as i32;
            let mut g: Vec<Buf> = (0..n)
                .map(|i| {
                    // Sizes spread over orders of magnitude: empty, tiny, medium, large.
                    let size = match rng.range(0, 3) {
                        0 => rng.range(0, 16),
                        1 => rng.range(0, 4096),
                        _ => rng.range(0, max_size as u64),
                    } as usize;
                    let size = size.min(max_size);
                    let recv_len = size + rng.range(0, slack as u64) as usize;
                    Buf { size, recv_len, tag: first_tag + 3 * i as i32 }
                })
                .collect();
            // A group's tags in random order on the receive side too.
            for i in (1..g.len()).rev() {
                g.swap(i, rng.range(0, i as u64) as usize);
            }
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.range(0, i as u64) as usize);
            }
            plan.stride = plan.stride.max(g.iter().map(|b| b.recv_len).max().unwrap_or(1));
            plan.groups.push(g);
            plan.send_order.push(order);
        }
        plan
    }

    pub fn sends(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    fn key(&self, g: usize, i: usize) -> u64 {
        pattern::key(self.seed, 1, g as u64, i as u32)
    }

    /// Arena bytes for `window` groups in flight.
    pub fn arena_len(&self, window: usize) -> usize {
        window * MAX_RECVS * self.stride.max(1)
    }

    fn offset(&self, window: usize, g: usize, i: usize) -> usize {
        ((g % window) * MAX_RECVS + i) * self.stride.max(1)
    }
}

/// The sending loop of one stream: posts the plan's sends in order (a group's buffers in
/// the plan's order), at most `window` groups in flight, tests the oldest.
pub struct Sender<'c, 'p> {
    comm: &'c SendComm<'c>,
    mr: Mr<'c>,
    plan: &'p Plan,
    window: usize,
    /// The next send: group and position in its order.
    next: (usize, usize),
    inflight: VecDeque<(Request<'c>, usize, usize)>,
    /// Sends of each group not yet tested done.
    left: Vec<usize>,
    /// Sends numbered from this one on are not tested until [`Sender::release`].
    hold_from: usize,
    posted: usize,
    pub completed: usize,
}

impl<'c, 'p> Sender<'c, 'p> {
    pub fn new(comm: &'c SendComm<'c>, arena: &'c Arena, plan: &'p Plan, window: usize) -> Result<Self> {
        let mr = comm.reg_mr(arena).map_err(|e| context(e, "regMr (send)"))?;
        let left = plan.groups.iter().map(Vec::len).collect();
        Ok(Sender {
            comm,
            mr,
            plan,
            window,
            next: (0, 0),
            inflight: VecDeque::new(),
            left,
            hold_from: usize::MAX,
            posted: 0,
            completed: 0,
        })
    }

    /// The last `n` sends are not tested until [`Sender::release`] (their peer may close first).
    pub fn hold_last(&mut self, n: usize) {
        self.hold_from = self.plan.sends().saturating_sub(n);
    }

    pub fn release(&mut self) {
        self.hold_from = usize::MAX;
    }

    pub fn posted_all(&self) -> bool {
        self.next.0 >= self.plan.groups.len()
    }

    /// Every send posted and tested done, but those held.
    pub fn done_but_held(&self) -> bool {
        self.posted_all() && (self.inflight.is_empty() || self.completed >= self.hold_from)
    }

    pub fn done(&self) -> bool {
        self.posted_all() && self.inflight.is_empty()
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Posts what it can and tests the oldest send. `Ok(true)`: something moved.
    pub fn step(&mut self) -> Result<bool> {
        let mut moved = false;
        let (g, k) = self.next;
        if g < self.plan.groups.len() && (g < self.window || self.left[g - self.window] == 0) {
            let i = self.plan.send_order[g][k];
            let b = self.plan.groups[g][i];
            let off = self.plan.offset(self.window, g, i);
            // SAFETY: the range belongs to group `g`'s buffer `i`, whose previous user (group
            // g - window) was tested done: no request is in flight on it.
            let bytes = unsafe { self.mr.arena().bytes_mut(off, b.size) };
            pattern::fill(bytes, self.plan.key(g, i), b.size);
            if let Some(r) = self.comm.isend(&self.mr, off, b.size, b.tag).map_err(|e| context(e, "isend"))? {
                self.inflight.push_back((r, g, i));
                self.posted += 1;
                self.next = if k + 1 == self.plan.groups[g].len() { (g + 1, 0) } else { (g, k + 1) };
                moved = true;
            }
        }
        // Sends complete in order of posting: the oldest is number `completed`.
        if self.completed < self.hold_from
            && let Some((r, g, i)) = self.inflight.front_mut()
        {
            let (g, i) = (*g, *i);
            if let Some(sizes) = r.test().map_err(|e| context(e, &format!("test of send {g}.{i}")))? {
                let want = self.plan.groups[g][i].size;
                if sizes.as_slice() != [want as i32] {
                    return Err(Error::data(format!("send {g}.{i}: test reported {sizes:?}, sent {want}")));
                }
                self.inflight.pop_front();
                self.left[g] -= 1;
                self.completed += 1;
                moved = true;
            }
        }
        Ok(moved)
    }

    /// Deregisters the send memory (requests may still be in flight: an abort).
    pub fn dereg(self) -> Result<()> {
        self.mr.dereg()
    }
}

/// The receiving loop of one stream: posts the plan's multi-receives in order, at most
/// `window` in flight, tests the oldest and checks its sizes, bytes and canaries.
pub struct Receiver<'c, 'p> {
    comm: &'c RecvComm<'c>,
    mr: Mr<'c>,
    plan: &'p Plan,
    window: usize,
    next: usize,
    inflight: VecDeque<(Request<'c>, usize)>,
    pub completed: usize,
    pub bytes: u64,
}

impl<'c, 'p> Receiver<'c, 'p> {
    pub fn new(comm: &'c RecvComm<'c>, arena: &'c Arena, plan: &'p Plan, window: usize) -> Result<Self> {
        let mr = comm.reg_mr(arena).map_err(|e| context(e, "regMr (recv)"))?;
        Ok(Receiver { comm, mr, plan, window, next: 0, inflight: VecDeque::new(), completed: 0, bytes: 0 })
    }

    pub fn done(&self) -> bool {
        self.completed == self.plan.groups.len()
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    pub fn step(&mut self) -> Result<bool> {
        let mut moved = false;
        let g = self.next;
        if g < self.plan.groups.len() && self.inflight.len() < self.window {
            let group = &self.plan.groups[g];
            for (i, b) in group.iter().enumerate() {
                let off = self.plan.offset(self.window, g, i);
                // SAFETY: the slot's previous receive was tested done (at most `window` in flight).
                unsafe { self.mr.arena().bytes_mut(off, b.recv_len) }.fill(CANARY);
            }
            let bufs: Vec<RecvBuf<'_, 'c>> = group
                .iter()
                .enumerate()
                .map(|(i, b)| RecvBuf {
                    mr: &self.mr,
                    off: self.plan.offset(self.window, g, i),
                    len: b.recv_len,
                    tag: b.tag,
                })
                .collect();
            if let Some(r) = self.comm.irecv(&bufs).map_err(|e| context(e, "irecv"))? {
                self.inflight.push_back((r, g));
                self.next += 1;
                moved = true;
            }
        }
        if let Some((r, g)) = self.inflight.front_mut() {
            let g = *g;
            if let Some(sizes) = r.test().map_err(|e| context(e, &format!("test of receive {g}")))? {
                self.inflight.pop_front();
                self.check(g, sizes.as_slice())?;
                self.completed += 1;
                moved = true;
            }
        }
        Ok(moved)
    }

    fn check(&mut self, g: usize, sizes: &[i32]) -> Result<()> {
        let group = &self.plan.groups[g];
        for (i, b) in group.iter().enumerate() {
            if sizes.get(i) != Some(&(b.size as i32)) {
                return Err(Error::data(format!("receive {g}: sizes {sizes:?}, sent {:?}", sizes_of(group))));
            }
            let off = self.plan.offset(self.window, g, i);
            // SAFETY: the receive was tested done: nothing writes its buffers any more.
            let got = unsafe { self.mr.arena().bytes(off, b.recv_len) };
            let c = pattern::verify(&got[..b.size], self.plan.key(g, i));
            if c.wrong != 0 {
                return Err(Error::data(format!(
                    "receive {g} buffer {i} (tag {}, {} bytes): {} wrong bytes, first at {:?}",
                    b.tag, b.size, c.wrong, c.first_wrong
                )));
            }
            if let Some(at) = pattern::canary_broken(&got[b.size..]) {
                return Err(Error::data(format!("receive {g} buffer {i}: written past its {} bytes at +{at}", b.size)));
            }
            self.bytes += b.size as u64;
        }
        Ok(())
    }

    /// Deregisters the receive memory (requests may still be in flight: an abort).
    pub fn dereg(self) -> Result<()> {
        self.mr.dereg()
    }
}

fn sizes_of(g: &[Buf]) -> Vec<usize> {
    g.iter().map(|b| b.size).collect()
}

/// Steps `f` until it says done, failing when nothing moved for `stall`.
pub fn drive(stall: Duration, what: &str, mut f: impl FnMut() -> Result<(bool, bool)>) -> Result<()> {
    let mut last = Instant::now();
    loop {
        let (moved, done) = f()?;
        if done {
            return Ok(());
        }
        if moved {
            last = Instant::now();
        } else if last.elapsed() > stall {
            return Err(Error::timeout(format!("{what}: no progress for {stall:?}")));
        } else {
            std::hint::spin_loop();
        }
    }
}
