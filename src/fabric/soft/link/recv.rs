//! A link's receive side: headers read in batches into the staging buffer, payload
//! segments read from the socket straight into their target regions (see `link.rs`).

use super::*;

impl<S: Station> LinkState<S> {
    /// Reads and dispatches what arrived. Returns whether anything moved and whether the
    /// read budget ran out; `Err`: the link broke. A read that returns less than it asked
    /// for drained the socket: the step reads no more (a read that would find nothing costs
    /// a system call; new bytes are seen at the next step, or their readiness event).
    pub(super) fn pump(&mut self, link: &Arc<Link<S>>) -> Result<(bool, bool), String> {
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

    /// Reads up to `max` more bytes into the staging buffer; `None` when nothing came, else
    /// how many and whether fewer than asked (the socket is drained).
    pub(super) fn read_staging(&mut self, max: usize) -> Result<Option<(usize, bool)>, String> {
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

    pub(super) fn on_header(&mut self, link: &Arc<Link<S>>, hdr: &[u8; HDR_LEN]) -> Result<(), String> {
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
    pub(super) fn payload(
        &mut self,
        link: &Arc<Link<S>>,
        budget: &mut u64,
        drained: bool,
    ) -> Result<Option<bool>, String> {
        let mut short = false;
        let avail = (self.end - self.start) as u64;
        let seg = self.seg.as_mut().expect("segment in progress");
        // A QP fenced or failed since the segment began (its link lock released in between)
        // takes none of the rest: a rail failover replays these bytes on the other rail,
        // and a late zero-filled tail (a frame its sender purged) must not land on them.
        if seg.placed.ok && !seg.qp.as_ref().is_some_and(|q| q.places()) {
            seg.placed.ok = false;
        }
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
            // Past a large payload comes its next segment, most likely: only its header into
            // the staging buffer (a whole buffer's worth there would be copied out again,
            // up to 64 KiB per 256 KiB segment); past a small one, small frames to batch.
            let peek = if seg.len > RX_PEEK { HDR_LEN.min(free.len()) } else { free.len() };
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
}

/// Adds the destinations of bytes `[from, to)` of segment `seg` (segment offsets), pinning
/// each region touched; the held-back final word goes to the segment's tail buffer.
pub(super) fn dest_iovs<'a, S>(mrs: &'a MrTable, seg: &mut InSeg<S>, from: u64, to: u64, buf: &mut IovBuf<'a>) -> bool {
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
pub(super) fn after_read(r: std::io::Result<usize>) -> Result<Option<usize>, String> {
    match r {
        Ok(0) => Err("the peer closed the connection".into()),
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(format!("receive failed: {e}")),
    }
}
