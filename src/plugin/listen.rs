//! A listen comm: the set-up listener a listen handle names, and the set-ups pending on it.
//!
//! Anything on the network can connect to that port: a port scanner, a health check, a
//! client of another protocol. So `accept` takes every connection the kernel has queued,
//! keeps up to [`MAX_PENDING`] set-ups going at once and steps each of them on every call;
//! a connection that turns out not to be an mpib peer ([`AcceptFailed::Stray`],
//! [`AcceptFailed::Silent`]: closed, reset, garbage, an oversized length, nothing within
//! `HELLO_WITHIN`) is closed with a WARN, at most one line per second per cause
//! (`crate::ratelimit`), and NCCL's `accept` goes on waiting for the real peer. Beyond
//! [`MAX_PENDING`] the oldest set-up that has not sent its Hello yet makes room. A set-up
//! that fails after its Hello (an mpib peer that broke off, or of another version or
//! fabric) fails `accept`, as NCCL must hear of it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::accepting::{AcceptFailed, Accepting};
use super::comm::RecvComm;
use super::context::Context;
use super::nic_pair::NicPair;
use super::oob::OobListener;
use super::resources::{Held, Res};
use super::setup::Params;
use crate::error::{Error, Result};
use crate::fabric::Device;
use crate::ratelimit::{RateLimit, suppressed};

/// Most set-ups a listen comm has going at once.
pub const MAX_PENDING: usize = 64;

/// Connections that said something wrong, or closed, before a Hello.
static STRAY: RateLimit = RateLimit::per_second();
/// Connections that said nothing (their deadline passed, or they made room for newer ones).
static SILENT: RateLimit = RateLimit::per_second();
/// The listener itself failing to take a connection (out of file descriptors, ...).
static LISTENER: RateLimit = RateLimit::per_second();

/// A listen comm.
pub struct ListenComm<D: Device> {
    listener: OobListener,
    /// The listener's address, for log lines.
    local: String,
    pair: Arc<NicPair<D>>,
    /// The context of the communicator that listens: its receive comms' queues.
    ctx: Arc<Context<D>>,
    p: Params,
    /// Oldest first.
    pending: VecDeque<Accepting<D>>,
    _held: Held,
}

impl<D: Device> ListenComm<D> {
    pub fn new(listener: OobListener, pair: Arc<NicPair<D>>, ctx: Arc<Context<D>>, p: Params) -> Self {
        let local = listener.local();
        let _held = ctx.state.counts.hold(Res::ListenComms, 1);
        ListenComm { listener, local, pair, ctx, p, pending: VecDeque::new(), _held }
    }

    /// Set-ups pending now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// One step of `accept` at `now`: the receive comm once a connection is fully set up.
    pub fn accept(&mut self, now: Instant) -> Result<Option<RecvComm<D>>> {
        self.take_new(now)?;
        let mut i = 0;
        while i < self.pending.len() {
            let r = self.pending[i].step(now);
            match r {
                Ok(None) => i += 1,
                Ok(Some(comm)) => {
                    self.pending.remove(i);
                    return Ok(Some(comm));
                }
                Err(AcceptFailed::Peer(e)) => {
                    self.pending.remove(i);
                    return Err(e);
                }
                Err(AcceptFailed::Stray(why)) => {
                    self.pending.remove(i);
                    self.dropped(&STRAY, now, &why);
                }
                Err(AcceptFailed::Silent(why)) => {
                    self.pending.remove(i);
                    self.dropped(&SILENT, now, &why);
                }
            }
        }
        while self.pending.len() > MAX_PENDING {
            // The oldest that has not shown itself a peer; failing that (more than
            // MAX_PENDING live set-ups, which NCCL never makes on one listen comm), the oldest.
            let i = self.pending.iter().position(|a| !a.is_peer()).unwrap_or(0);
            let a = self.pending.remove(i).expect("in range");
            let why = format!("{} had sent no Hello when more than {MAX_PENDING} set-ups were pending", a.peer());
            self.dropped(&SILENT, now, &why);
        }
        Ok(None)
    }

    /// Takes the connections the kernel has queued (at most `MAX_PENDING` per call, so a
    /// flood is taken in steps and the pending ones still get theirs).
    fn take_new(&mut self, now: Instant) -> Result<()> {
        for _ in 0..MAX_PENDING {
            match self.listener.accept() {
                Ok(Some(conn)) => self.pending.push_back(Accepting::new(
                    self.pair.clone(),
                    self.ctx.clone(),
                    self.p.clone(),
                    conn,
                    now,
                )),
                Ok(None) => return Ok(()),
                // The listener itself is unusable: NCCL must hear of it.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK)) => {
                    return Err(Error::io(&format!("set-up listener {}: accept", self.local), &e));
                }
                // One connection failed (reset before it was taken), or the process is out of
                // file descriptors or memory for now: try again at the next call.
                Err(e) => {
                    if let Some(held) = LISTENER.admit(now) {
                        log::warn!(
                            target: "mpib::plugin::setup",
                            "set-up listener {}: cannot take a connection: {e}{}",
                            self.local,
                            suppressed(held)
                        );
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn dropped(&self, limit: &RateLimit, now: Instant, why: &str) {
        if let Some(held) = limit.admit(now) {
            log::warn!(
                target: "mpib::plugin::setup",
                "set-up listener {}: dropped a connection that is not an mpib peer: {why}{}",
                self.local,
                suppressed(held)
            );
        }
    }
}

impl<D: Device> Drop for ListenComm<D> {
    /// Says how many drops the rate limit held back, so none goes unreported.
    fn drop(&mut self) {
        let held = STRAY.take_held() + SILENT.take_held();
        if held > 0 {
            log::warn!(
                target: "mpib::plugin::setup",
                "set-up listener {}: {held} more connection(s) that were not mpib peers were dropped (rate-limited lines)",
                self.local
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::fabric::soft::{self, SoftDevice, SoftOptions};
    use crate::plugin::AbiVersion;
    use crate::plugin::accepting::HELLO_WITHIN;
    use crate::plugin::discover::NicMeta;
    use crate::plugin::instance_state::InstanceState;
    use crate::plugin::nic_pair::{Nic, Shape};
    use crate::plugin::oob::OobAddr;
    use crate::plugin::setup::{Connecting, FabricKind};
    use crate::plugin::setup_msg::{self, Hello, Msg};

    /// A listen comm over in-process soft devices, its set-up listener on loopback TCP.
    fn listen_comm() -> (ListenComm<SoftDevice>, SocketAddr) {
        let (l, sa, ..) = listen_comm_with(Config::default());
        (l, sa)
    }

    /// The same with configuration `cfg`, and what a connector on the same devices needs.
    fn listen_comm_with(cfg: Config) -> (ListenComm<SoftDevice>, SocketAddr, Arc<NicPair<SoftDevice>>, Params) {
        let d = Arc::new(soft::open(&SoftOptions::inproc("l", &soft::InprocNet::new())).unwrap());
        let nic = Arc::new(Nic::new(d, NicMeta::default()));
        let pair = Arc::new(NicPair::new(0, [nic.clone(), nic], Shape::Pair, &[0]));
        let cfg: &'static Config = Box::leak(Box::new(cfg));
        let p = Params::new(cfg, FabricKind::Inproc, AbiVersion::V8, None);
        let (l, addr) = OobListener::tcp("127.0.0.1".parse().unwrap()).unwrap();
        let OobAddr::Tcp(sa) = addr else { panic!() };
        let ctx = Arc::new(Context::new(1, 0, None, cfg.srq_depth, Box::leak(Box::new(InstanceState::new()))));
        (ListenComm::new(l, pair.clone(), ctx, p.clone()), sa, pair, p)
    }

    /// A connector to `addr` on `pair`'s devices (its own context).
    fn connecting(pair: &Arc<NicPair<SoftDevice>>, p: &Params, addr: SocketAddr) -> Connecting<SoftDevice> {
        let ctx = Context::new(2, 0, None, p.cfg.srq_depth, Box::leak(Box::new(InstanceState::new())));
        Connecting::start(pair.clone(), p.clone(), OobAddr::Tcp(addr), &ctx).unwrap()
    }

    #[test]
    fn a_peer_that_accepts_45_s_late_is_waited_for_and_then_connects() {
        let (mut l, addr, pair, p) = listen_comm_with(Config::default());
        assert_eq!(p.timeout, None, "no set-up deadline by default");
        let mut c = connecting(&pair, &p, addr);
        let t0 = Instant::now();
        // The listening rank is late: its `accept` is first called 45 s (simulated) after the
        // connector's first `connect`, which NCCL keeps calling meanwhile.
        for s in [0, 1, 10, 29, 31, 44, 45] {
            assert!(c.step(t0 + Duration::from_secs(s)).unwrap().is_none(), "at {s} s");
        }
        let late = t0 + Duration::from_secs(45);
        let (mut send, mut recv) = (None, None);
        let t = Instant::now();
        while send.is_none() || recv.is_none() {
            if recv.is_none() {
                recv = l.accept(late).unwrap();
            }
            if send.is_none() {
                send = c.step(late + t.elapsed()).unwrap();
            }
            assert!(t.elapsed() < Duration::from_secs(20), "set-up did not finish after the late accept");
        }
    }

    #[test]
    fn a_set_up_deadline_holds_when_one_is_configured() {
        let cfg = Config { connect_timeout_ms: 1000, ..Config::default() };
        let (_l, addr, pair, p) = listen_comm_with(cfg);
        let mut c = connecting(&pair, &p, addr);
        let t0 = Instant::now();
        assert!(c.step(t0 + Duration::from_millis(900)).unwrap().is_none());
        let e = c.step(t0 + Duration::from_millis(1100)).err().expect("past the deadline");
        assert!(e.msg().contains("MPIB_CONNECT_TIMEOUT_MS"), "{e}");
    }

    #[test]
    fn a_peer_that_is_gone_fails_the_set_up_at_once() {
        let (l, addr, pair, p) = listen_comm_with(Config::default());
        let mut c = connecting(&pair, &p, addr);
        // The listening process is gone: its listener and the connection queued on it close.
        drop(l);
        let t0 = Instant::now();
        let e = loop {
            match c.step(t0) {
                Err(e) => break e,
                Ok(None) => assert!(t0.elapsed() < Duration::from_secs(20), "a gone peer was waited for"),
                Ok(Some(_)) => panic!("connected to nobody"),
            }
        };
        assert!(!e.msg().contains("MPIB_CONNECT_TIMEOUT_MS"), "not a deadline: {e}");
    }

    /// Calls `accept(now)` until `n` set-ups are pending (the kernel queues a connection a
    /// moment after the client's connect returns); none may finish or fail.
    fn until_pending(l: &mut ListenComm<SoftDevice>, now: Instant, n: usize) {
        let t = Instant::now();
        while l.pending() < n {
            assert!(l.accept(now).unwrap().is_none());
            assert!(t.elapsed() < Duration::from_secs(20), "{} of {n} connections taken", l.pending());
        }
    }

    fn closed(s: &mut TcpStream) -> bool {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 256];
        match s.read(&mut b) {
            Ok(0) => true,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_silent_connection_is_dropped_at_its_deadline_not_before() {
        let (mut l, addr) = listen_comm();
        let mut s = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        until_pending(&mut l, t0, 1);
        assert!(l.accept(t0 + HELLO_WITHIN - Duration::from_millis(1)).unwrap().is_none());
        assert_eq!(l.pending(), 1, "still within its deadline");
        assert!(!closed(&mut s));
        assert!(l.accept(t0 + HELLO_WITHIN + Duration::from_millis(1)).unwrap().is_none(), "no error for a stray");
        assert_eq!(l.pending(), 0);
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        assert!(matches!(s.read(&mut [0u8; 8]), Ok(0)), "closed");
    }

    #[test]
    fn garbage_and_closes_are_dropped_not_errors() {
        let (mut l, addr) = listen_comm();
        let mut g = TcpStream::connect(addr).unwrap();
        g.write_all(b"\x10\x00\x00\x00GET / HTTP/1.0\r\n").unwrap();
        drop(TcpStream::connect(addr).unwrap());
        let t0 = Instant::now();
        let t = Instant::now();
        // Both are taken and dropped; accept never fails.
        while !closed(&mut g) || l.pending() > 0 {
            assert!(l.accept(t0).unwrap().is_none());
            assert!(t.elapsed() < Duration::from_secs(20), "not dropped");
        }
    }

    #[test]
    fn beyond_max_pending_the_oldest_silent_ones_make_room() {
        let (mut l, addr) = listen_comm();
        let mut ss: Vec<TcpStream> = (0..MAX_PENDING + 6).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let t0 = Instant::now();
        let t = Instant::now();
        while !closed(&mut ss[5]) {
            assert!(l.accept(t0).unwrap().is_none());
            assert!(l.pending() <= MAX_PENDING);
            assert!(t.elapsed() < Duration::from_secs(20), "the oldest were not dropped");
        }
        assert!(ss[..6].iter_mut().all(closed), "the six oldest made room");
        assert!(!ss[6..].iter_mut().any(closed), "the newer ones wait for their deadline");
        assert_eq!(l.pending(), MAX_PENDING);
    }

    /// A Hello that waited in the socket past the deadline is still read (NCCL may call
    /// `accept` late); one of another fabric fails `accept`, and the peer is told why.
    #[test]
    fn a_late_hello_is_read_and_a_mismatched_one_fails_accept_on_both_sides() {
        let (mut l, addr) = listen_comm();
        let mut s = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        until_pending(&mut l, t0, 1);
        let hello = Hello {
            kind: FabricKind::Soft as u8,
            pieces: [1, 1],
            qps: [1, 1],
            fifo_addr: 0,
            fifo_rkeys: [0; 2],
            scratch_addr: 0,
            qps_info: vec![Default::default(); 2],
        };
        let mut framed = Vec::new();
        setup_msg::Frames::put(&mut framed, &hello.encode());
        s.write_all(&framed).unwrap();
        let late = t0 + 10 * HELLO_WITHIN;
        let t = Instant::now();
        let e = loop {
            match l.accept(late) {
                Err(e) => break e,
                Ok(None) => assert!(t.elapsed() < Duration::from_secs(20), "the Hello was not read"),
                Ok(Some(_)) => panic!("a comm for a peer of another fabric"),
            }
        };
        assert!(e.msg().contains("MPIB_FABRIC"), "{e}");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        let mut f = setup_msg::Frames::default();
        f.push(&got);
        let m = f.next_msg().unwrap().expect("a whole message");
        assert!(matches!(setup_msg::decode(&m), Ok(Msg::Refusal(t)) if t.contains("MPIB_FABRIC")), "{got:?}");
    }
}
