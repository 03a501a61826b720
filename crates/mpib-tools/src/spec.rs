//! What two ranks do: a [`Workload`] of [`Phase`]s, each a run of (multi-)receives with the
//! sends that fill them. Both ranks derive every size, tag and byte from the workload and
//! its seed, so nothing but the workload's one-line text form crosses between them.

use super::kv::{Fields, Writer};
use super::net::MAX_RECVS;
use super::{Error, Result};

/// Which end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Send,
    Recv,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Send => "send",
            Side::Recv => "recv",
        }
    }
}

/// The size of each posted receive buffer, relative to the send that fills it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvSize {
    /// As large as the send.
    Same,
    /// Larger than the send by this many bytes (the real size must be reported).
    Plus(u64),
    /// Smaller by this many bytes (at least 0): the send is truncated, as net_ib does.
    Minus(u64),
    /// Always this many bytes.
    Fixed(u64),
}

impl RecvSize {
    pub fn of(self, send: u64) -> u64 {
        match self {
            RecvSize::Same => send,
            RecvSize::Plus(k) => send + k,
            RecvSize::Minus(k) => send.saturating_sub(k),
            RecvSize::Fixed(x) => x,
        }
    }

    fn text(self) -> String {
        match self {
            RecvSize::Same => "same".into(),
            RecvSize::Plus(k) => format!("plus:{k}"),
            RecvSize::Minus(k) => format!("minus:{k}"),
            RecvSize::Fixed(x) => format!("fixed:{x}"),
        }
    }

    fn parse(s: &str) -> Result<RecvSize> {
        let num = |v: &str| v.parse::<u64>().map_err(|_| Error::usage(format!("recv size {s:?}: bad number")));
        Ok(match s.split_once(':') {
            None if s == "same" => RecvSize::Same,
            Some(("plus", v)) => RecvSize::Plus(num(v)?),
            Some(("minus", v)) => RecvSize::Minus(num(v)?),
            Some(("fixed", v)) => RecvSize::Fixed(num(v)?),
            _ => return Err(Error::usage(format!("recv size {s:?}: same, plus:N, minus:N or fixed:N"))),
        })
    }
}

/// A side that kills its own process (SIGKILL) in the middle of a phase, after this many
/// of its requests completed, with its window still full: the peer must fail, not hang.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    pub side: Side,
    pub after: u64,
}

/// A run of `count` receives (of `nrecv` buffers each) and the sends that fill them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// Send sizes, used in turn: buffer `j` of group `g` sends `sizes[(g·nrecv + j) % len]`.
    pub sizes: Vec<u64>,
    /// Receive requests (groups).
    pub count: u64,
    /// Buffers per receive request, each for a different tag (1 … 8).
    pub nrecv: usize,
    pub recv: RecvSize,
    /// Receive requests in flight; the sender keeps up to `inflight × nrecv` sends in flight.
    pub inflight: usize,
    /// `iflush` each completed receive with data, and test the flush request.
    pub flush: bool,
    pub kill: Option<Kill>,
    /// Debug: the sender flips one byte in the middle of send #k (after checksumming it),
    /// so the receiver must report exactly one wrong byte: proof that the check can fail.
    pub corrupt: Option<u64>,
    /// Groups run (and checked, with their own patterns) before the phase, reported apart
    /// (the report's `PhaseReport::warmup`): connection and page warm-up, and the
    /// measurement `budget_ms` sizes the phase from.
    pub warmup: u64,
    /// 0: the phase runs `count` groups. Else `count` is a maximum: after the warm-up,
    /// rank 0 picks the count that makes the phase last about this long and tells rank 1.
    pub budget_ms: u64,
    /// 0: off. Else the sender samples its comm's per-rail byte counters every this many
    /// µs during the phase (the report's `SideStats::timeline`).
    pub timeline_us: u64,
}

impl Default for Phase {
    fn default() -> Self {
        Phase {
            sizes: vec![8],
            count: 1,
            nrecv: 1,
            recv: RecvSize::Same,
            inflight: 1,
            flush: false,
            kill: None,
            corrupt: None,
            warmup: 0,
            budget_ms: 0,
            timeline_us: 0,
        }
    }
}

/// Bytes after each buffer's posted size that must stay untouched.
pub const GUARD: usize = 64;

impl Phase {
    /// Size of send `j` of group `g`.
    #[inline]
    pub fn send_size(&self, g: u64, j: usize) -> u64 {
        self.sizes[((g * self.nrecv as u64 + j as u64) % self.sizes.len() as u64) as usize]
    }

    /// Posted size of receive buffer `j` of group `g`.
    #[inline]
    pub fn recv_size(&self, g: u64, j: usize) -> u64 {
        self.recv.of(self.send_size(g, j))
    }

    /// Bytes that land in buffer `j` of group `g` (what `test` must report on both sides).
    #[inline]
    pub fn expected(&self, g: u64, j: usize) -> u64 {
        self.send_size(g, j).min(self.recv_size(g, j))
    }

    /// Bytes of one buffer slot: the largest send or receive plus the guard, 64-aligned.
    pub fn slot_bytes(&self) -> usize {
        let max = self.sizes.iter().map(|&s| s.max(self.recv.of(s))).max().unwrap_or(0);
        (max as usize + GUARD).next_multiple_of(64)
    }

    /// Receive groups in flight at most.
    pub fn window(&self) -> usize {
        (self.inflight as u64).min(self.count.max(1)) as usize
    }

    /// The warm-up run before the phase: `warmup` groups, nothing injected, not sampled.
    pub fn warmup_phase(&self) -> Phase {
        Phase { count: self.warmup, kill: None, corrupt: None, warmup: 0, budget_ms: 0, timeline_us: 0, ..self.clone() }
    }

    /// The phase as run with `count` groups (the budget decided it).
    pub fn with_count(&self, count: u64) -> Phase {
        Phase { count, ..self.clone() }
    }

    fn check(&self, i: usize) -> Result<()> {
        let bad = |m: String| Err(Error::usage(format!("phase {i}: {m}")));
        if self.sizes.is_empty() {
            return bad("no sizes".into());
        }
        if !(1..=MAX_RECVS).contains(&self.nrecv) {
            return bad(format!("nrecv {} (1 … {MAX_RECVS})", self.nrecv));
        }
        if self.inflight == 0 {
            return bad("inflight 0".into());
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| s.max(self.recv.of(s)) > i32::MAX as u64) {
            return bad(format!("size {s}: test reports sizes as int"));
        }
        if self.budget_ms > 0 && self.warmup == 0 {
            return bad("a time budget needs a warm-up to measure".into());
        }
        Ok(())
    }
}

/// The tag of buffer `j` in every group (distinct per buffer, as NCCL's peer ranks are).
#[inline]
pub fn tag(j: usize) -> i32 {
    1 + 7 * j as i32
}

/// Everything two ranks agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Device index on both ranks.
    pub dev: i32,
    pub seed: u64,
    /// Check every received byte against the pattern (else only the reported sizes).
    pub check: bool,
    /// Both ranks send and receive (each listens and connects).
    pub bidir: bool,
    /// Before the phases, feed bad handles to test / isend / irecv / regMr / close.
    pub bad_handles: bool,
    /// A rank with requests in flight that sees no progress for this long fails.
    pub stall_ms: u64,
    /// Connections per direction, all set up through one `init` (one NCCL communicator),
    /// each with its own listen comm, as NCCL opens one per channel and peer; every phase
    /// runs on all of them at once.
    pub comms: u32,
    /// Open the connections, run the phases, close them: this many times.
    pub rounds: u32,
    pub phases: Vec<Phase>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            dev: 0,
            seed: 1,
            check: true,
            bidir: false,
            bad_handles: false,
            stall_ms: 20_000,
            comms: 1,
            rounds: 1,
            phases: vec![],
        }
    }
}

impl Workload {
    pub fn check(&self) -> Result<()> {
        if self.comms == 0 || self.rounds == 0 {
            return Err(Error::usage(format!("comms {} and rounds {}: at least 1 each", self.comms, self.rounds)));
        }
        for (i, p) in self.phases.iter().enumerate() {
            p.check(i)?;
        }
        Ok(())
    }

    /// Total send requests over every phase (what a one-way sender posts).
    pub fn messages(&self) -> u64 {
        self.phases.iter().map(|p| p.count * p.nrecv as u64).sum()
    }

    /// The one-line text form.
    pub fn to_line(&self) -> String {
        let mut w = Writer::new();
        w.put("dev", self.dev)
            .put("seed", self.seed)
            .put("check", self.check as u8)
            .put("bidir", self.bidir as u8)
            .put("bad_handles", self.bad_handles as u8)
            .put("stall_ms", self.stall_ms)
            .put("phases", self.phases.len());
        // Only when not 1: the lines of one-connection workloads stay as they were.
        for (name, v) in [("comms", self.comms), ("rounds", self.rounds)] {
            if v != 1 {
                w.put(name, v);
            }
        }
        for (i, p) in self.phases.iter().enumerate() {
            let sizes: Vec<String> = p.sizes.iter().map(u64::to_string).collect();
            w.put(&format!("p{i}.sizes"), sizes.join(","))
                .put(&format!("p{i}.count"), p.count)
                .put(&format!("p{i}.nrecv"), p.nrecv)
                .put(&format!("p{i}.recv"), p.recv.text())
                .put(&format!("p{i}.inflight"), p.inflight)
                .put(&format!("p{i}.flush"), p.flush as u8);
            if let Some(k) = p.kill {
                w.put(&format!("p{i}.kill"), format!("{}:{}", k.side.name(), k.after));
            }
            if let Some(k) = p.corrupt {
                w.put(&format!("p{i}.corrupt"), k);
            }
            for (name, v) in [("warmup", p.warmup), ("budget_ms", p.budget_ms), ("timeline_us", p.timeline_us)] {
                if v > 0 {
                    w.put(&format!("p{i}.{name}"), v);
                }
            }
        }
        w.finish()
    }

    pub fn from_line(line: &str) -> Result<Workload> {
        let f = Fields::parse(line)?;
        let unknown =
            f.unknown(&["dev", "seed", "check", "bidir", "bad_handles", "stall_ms", "comms", "rounds", "phases", "p*"]);
        if !unknown.is_empty() {
            return Err(Error::usage(format!("unknown workload fields {unknown:?}")));
        }
        let flag = |k: &str| -> Result<bool> { Ok(f.get::<u8>(k)? != 0) };
        let mut w = Workload {
            dev: f.get("dev")?,
            seed: f.get("seed")?,
            check: flag("check")?,
            bidir: flag("bidir")?,
            bad_handles: flag("bad_handles")?,
            stall_ms: f.get("stall_ms")?,
            comms: f.get_or("comms", 1)?,
            rounds: f.get_or("rounds", 1)?,
            phases: Vec::new(),
        };
        for i in 0..f.get::<usize>("phases")? {
            let k = |name: &str| format!("p{i}.{name}");
            let sizes = f
                .str(&k("sizes"))?
                .split(',')
                .map(|s| s.parse::<u64>().map_err(|_| Error::usage(format!("phase {i}: size {s:?}"))))
                .collect::<Result<Vec<u64>>>()?;
            let kill = if f.has(&k("kill")) {
                let s = f.str(&k("kill"))?;
                let (side, after) = s.split_once(':').ok_or_else(|| Error::usage(format!("kill {s:?}")))?;
                let side = match side {
                    "send" => Side::Send,
                    "recv" => Side::Recv,
                    _ => return Err(Error::usage(format!("kill side {side:?}: send or recv"))),
                };
                Some(Kill { side, after: after.parse().map_err(|_| Error::usage(format!("kill {s:?}")))? })
            } else {
                None
            };
            w.phases.push(Phase {
                sizes,
                count: f.get(&k("count"))?,
                nrecv: f.get(&k("nrecv"))?,
                recv: RecvSize::parse(f.str(&k("recv"))?)?,
                inflight: f.get(&k("inflight"))?,
                flush: f.get::<u8>(&k("flush"))? != 0,
                kill,
                corrupt: if f.has(&k("corrupt")) { Some(f.get(&k("corrupt"))?) } else { None },
                warmup: f.get_or(&k("warmup"), 0)?,
                budget_ms: f.get_or(&k("budget_ms"), 0)?,
                timeline_us: f.get_or(&k("timeline_us"), 0)?,
            });
        }
        w.check()?;
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_rejects_junk() {
        let w = Workload {
            seed: 99,
            bidir: true,
            comms: 3,
            rounds: 2,
            phases: vec![
                Phase { sizes: vec![0, 1, 1 << 20], count: 5, nrecv: 3, recv: RecvSize::Plus(64), ..Phase::default() },
                Phase {
                    recv: RecvSize::Minus(3),
                    kill: Some(Kill { side: Side::Recv, after: 4 }),
                    flush: true,
                    corrupt: Some(7),
                    warmup: 3,
                    budget_ms: 250,
                    timeline_us: 1000,
                    ..Phase::default()
                },
            ],
            ..Workload::default()
        };
        let line = w.to_line();
        assert_eq!(Workload::from_line(&line).unwrap(), w, "{line}");
        assert!(Workload::from_line(&format!("{line} bogus=1")).is_err());
        assert!(Workload::from_line(&line.replace("comms=3", "comms=0")).is_err());
        assert!(!Workload::default().to_line().contains("comms"), "one connection: the line as before");
        assert!(Workload::from_line(&line.replace("p0.nrecv=3", "p0.nrecv=9")).is_err());
        assert!(Workload::from_line(&line.replace("p1.recv=minus:3", "p1.recv=less")).is_err());
        assert!(Workload::from_line(&line.replace("p1.warmup=3", "p1.warmup=0")).is_err(), "budget without warm-up");
    }

    #[test]
    fn warmup_and_budgeted_phases_derive_from_the_phase() {
        let p =
            Phase { count: 1000, corrupt: Some(0), warmup: 5, budget_ms: 100, timeline_us: 1000, ..Phase::default() };
        let w = p.warmup_phase();
        assert_eq!((w.count, w.corrupt, w.warmup, w.budget_ms, w.timeline_us), (5, None, 0, 0, 0));
        let m = p.with_count(42);
        assert_eq!((m.count, m.corrupt, m.budget_ms, m.timeline_us, m.warmup), (42, Some(0), 100, 1000, 5));
    }

    #[test]
    fn sizes_cycle_and_truncate() {
        let p = Phase { sizes: vec![10, 20, 30], nrecv: 2, recv: RecvSize::Minus(15), ..Phase::default() };
        assert_eq!((p.send_size(0, 0), p.send_size(0, 1), p.send_size(1, 0), p.send_size(1, 1)), (10, 20, 30, 10));
        assert_eq!((p.recv_size(0, 0), p.expected(0, 1)), (0, 5));
        assert_eq!(p.slot_bytes(), 128);
        assert_eq!(RecvSize::Plus(5).of(1), 6);
        assert_eq!(RecvSize::Fixed(7).of(100), 7);
    }
}
