//! The receiving side of one phase: canaries around each buffer it posts, every completed
//! buffer checked byte for byte against the pattern and the sizes `test` reported.

use super::{At, Window, ctx};
use crate::net::{MAX_RECVS, Mr, RecvBuf, RecvComm};
use crate::pattern::{self, CANARY};
use crate::report::{SideStats, mono_ns};
use crate::spec::{GUARD, Phase, Side, tag};
use crate::{Error, Result};

/// The receiving side of one phase.
pub struct Receiver<'c> {
    at: At<'c>,
    comm: &'c RecvComm<'c>,
    mr: &'c Mr<'c>,
    slot: usize,
    next: u64,
    /// The group whose canaries are in place (it may be posted after NULL answers).
    prepared: Option<u64>,
    win: Window<'c>,
}

impl<'c> Receiver<'c> {
    /// `mr`'s arena must hold [`Receiver::arena_bytes`].
    pub fn new(at: At<'c>, comm: &'c RecvComm<'c>, mr: &'c Mr<'c>) -> Receiver<'c> {
        let p = at.phase();
        let win = Window::new(Side::Recv, p.window(), p.count, p.kill);
        Receiver { at, comm, mr, slot: p.slot_bytes(), next: 0, prepared: None, win }
    }

    pub fn arena_bytes(p: &Phase) -> usize {
        p.window() * p.nrecv * p.slot_bytes()
    }

    pub fn finished(&self) -> bool {
        self.next == self.at.phase().count && self.win.inflight.is_empty()
    }

    fn off(&self, g: u64, j: usize) -> usize {
        ((g % self.win.cap as u64) as usize * self.at.phase().nrecv + j) * self.slot
    }

    /// One progress step: post receives until the window is full or the plugin says
    /// "later", then test the oldest one. Whether anything happened.
    pub fn step(&mut self) -> Result<bool> {
        let p = self.at.phase();
        let mut progressed = false;
        while self.next < p.count && self.win.has_room() {
            let g = self.next;
            let mut bufs = [RecvBuf { mr: self.mr, off: 0, len: 0, tag: 0 }; MAX_RECVS];
            for (j, b) in bufs.iter_mut().enumerate().take(p.nrecv) {
                let (off, posted, want) = (self.off(g, j), p.recv_size(g, j) as usize, p.expected(g, j) as usize);
                if self.prepared != Some(g) && self.at.w.check {
                    // SAFETY: the slot's previous group completed (fewer than `window` in
                    // flight, completed in order); the range ends inside the slot.
                    unsafe { self.mr.arena().bytes_mut(off + want, posted - want + GUARD) }.fill(CANARY);
                }
                *b = RecvBuf { mr: self.mr, off, len: posted, tag: tag(j) };
            }
            self.prepared = Some(g);
            let what = |e| ctx(e, format!("phase {} receive #{g} ({} buffers)", self.at.index, p.nrecv));
            let r = self.comm.irecv(&bufs[..p.nrecv]).map_err(what)?;
            if !self.win.posted(r, g, 0, 0) {
                break;
            }
            self.next += 1;
            progressed = true;
        }
        if let Some((f, sizes)) = self.win.test_oldest(self.at.index)? {
            self.check(f.id, sizes.as_slice())?;
            self.win.completed();
            progressed = true;
        }
        Ok(progressed)
    }

    /// Checks a completed group: sizes, bytes, canaries; then the optional flush.
    fn check(&mut self, g: u64, sizes: &[i32]) -> Result<()> {
        let p = self.at.phase();
        let mut total = 0u64;
        for (j, &got) in sizes.iter().enumerate() {
            let (off, posted, want) = (self.off(g, j), p.recv_size(g, j) as usize, p.expected(g, j) as usize);
            if got as usize != want {
                self.win.stats.wrong_sizes += 1;
                self.win.note(|| format!("receive #{g} tag {}: test reported {got} bytes, expected {want}", tag(j)));
            }
            total += got as u64;
            self.win.stats.bytes += want as u64;
            self.win.stats.messages += 1;
            if !self.at.w.check {
                continue;
            }
            // SAFETY: the request completed: the plugin no longer writes this slot.
            let data = unsafe { self.mr.arena().bytes(off, want) };
            let c = pattern::verify(data, self.at.key(g, j));
            self.win.stats.checksum = self.win.stats.checksum.wrapping_add(c.sum);
            if c.wrong > 0 {
                self.win.stats.wrong_bytes += c.wrong;
                let (first, last) = (c.first_wrong.unwrap_or(0), c.last_wrong.unwrap_or(0));
                self.win.note(|| {
                    // What the wrong words are, when that tells something (zeros: a frame sent
                    // as zeros; the canary: bytes never written).
                    let kind = if c.zero_words + c.canary_words > 0 {
                        format!(" ({} of the wrong 8-byte words all zero, {} the canary)", c.zero_words, c.canary_words)
                    } else {
                        String::new()
                    };
                    format!(
                        "receive #{g} tag {} ({want} bytes): {} wrong bytes, first at offset {first}, last at {last}{kind}",
                        tag(j),
                        c.wrong
                    )
                });
            }
            // SAFETY: as above; the canary range ends inside the slot.
            let tail = unsafe { self.mr.arena().bytes(off + want, posted - want + GUARD) };
            if let Some(at) = pattern::canary_broken(tail) {
                self.win.stats.canary_broken += 1;
                self.win.note(|| {
                    format!(
                        "receive #{g} tag {}: byte {} written (expected {want} bytes in a {posted}-byte buffer)",
                        tag(j),
                        want + at
                    )
                });
            }
        }
        if p.flush && total > 0 {
            self.flush(g, sizes)?;
        }
        Ok(())
    }

    /// `iflush` of the group and, if it returned a request, `test` it to completion.
    fn flush(&mut self, g: u64, sizes: &[i32]) -> Result<()> {
        let mut bufs = [(self.mr, 0usize, 0usize); MAX_RECVS];
        for (j, &s) in sizes.iter().enumerate() {
            bufs[j] = (self.mr, self.off(g, j), s as usize);
        }
        let what = |e| ctx(e, format!("phase {} flush of receive #{g}", self.at.index));
        let Some(mut req) = self.comm.iflush(&bufs[..sizes.len()]).map_err(what)? else { return Ok(()) };
        self.win.stats.flushes += 1;
        let end = mono_ns() + self.at.w.stall_ms * 1_000_000;
        while req.test().map_err(what)?.is_none() {
            if mono_ns() > end {
                return Err(Error::timeout(format!("flush of receive #{g} not done in {} ms", self.at.w.stall_ms)));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    pub fn describe(&self) -> String {
        self.win.describe(self.next, self.at.phase().count)
    }

    pub fn last_done(&self) -> Option<*mut std::ffi::c_void> {
        self.win.last_req
    }

    pub fn finish(self) -> SideStats {
        self.win.finish()
    }
}
