//! A link's send side: ready QPs' frames committed a turn each, written with one `sendmsg`
//! per batch from registered memory or the arena (see `link.rs`).

use super::*;

impl<S: Station> LinkState<S> {
    /// Commits the frames of ready QPs, a turn each, while the batch has room; then, if
    /// anything goes, the acknowledgements owed.
    pub(super) fn fill(&mut self, link: &Arc<Link<S>>) {
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
        if sched.ack.goes(!frames.is_empty()) && !sched.owed.is_empty() {
            sched.ack.sent();
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
    pub(super) fn flush(&mut self, link: &Arc<Link<S>>) -> Result<bool, String> {
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
    pub(super) fn source_lost(&mut self, link: &Arc<Link<S>>, i: usize) {
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
                // The QP failed and purged its frames not begun; this one, begun, has lost
                // its memory and goes on as zeros (the stream stays framed). Anything left
                // pointing at that memory goes too (a QP that would not let go).
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

    pub(super) fn advance(&mut self, mut w: u64) {
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
