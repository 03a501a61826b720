//! What a soft device's QPs share: the QP table and, on TCP, the rail's "port": a listener
//! bound to the rail's local address, the links to peer devices (one per device pair,
//! shared by every QP between them: `link.rs`), the connections that have not said who
//! they are yet, and the readiness sets (`watch.rs`). Every connection holds its device's
//! port, as a verbs QP holds its device.
//!
//! - **Links.** The device with the smaller identity dials (a device's links to itself: one
//!   end each way); the dialer sends HELLO first. A link lives while a QP is on it or a
//!   CONNECT for one is parked, and closes when the last one goes. The peer dialing again
//!   replaces the old link (the dialer only dials when it has none).
//! - **Hostile input.** At most [`MAX_PENDING`] accepted connections may be
//!   waiting for their HELLO (a new one closes the oldest), each for at most
//!   [`HELLO_TIMEOUT`]; at most [`MAX_ORPHANS`] links may carry no QP, each for at most the
//!   connect timeout. `accept` failing (descriptors exhausted) pauses accepting, from
//!   [`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`], instead of spinning. Every warning a
//!   peer can provoke is rate-limited (`logs.rs`).
//!
//! Generic over the connection type `C`, which sits above (`conn_tcp.rs`; an in-process
//! device uses only the QP table and the names). The accepting side (listener, HELLOs, the
//! bounds on strangers) is in `port/accept.rs`.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::frame::{Frame, HDR_LEN, decode, encode};
use super::link::{Link, LinkKey, LinkState, Phase, QpTable, Station, Step};
use super::logs::Warnings;
use super::mr::MrTable;
use super::progress::{step_again, sweep_steps};
use super::transport::{dial_result, discard_unread};
use super::watch::Watcher;
use crate::error::{Error, Result};

mod accept;

/// Accepted connections waiting for their HELLO, at most.
pub const MAX_PENDING: usize = 64;
/// How long an accepted connection may take to send its HELLO (or the connect timeout, if
/// shorter).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Accepted links that carry no QP yet, at most.
pub const MAX_ORPHANS: usize = 64;
pub const BACKOFF_FIRST: Duration = Duration::from_millis(50);
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A dial refused is tried again after this long.
const REDIAL: Duration = Duration::from_millis(20);
/// How long a link nobody uses any more may take to send what its last QPs left (their
/// ACK, their CLOSEs) before it closes anyway.
pub const LINGER: Duration = Duration::from_secs(2);
/// How long a link the peer replaced (it dialed again) may take to deliver what the peer
/// sent on it before it gave it up: its FIN is on its way, behind its last frames.
const SUPERSEDED_WAIT: Duration = Duration::from_secs(1);

/// The shared part of a device (see the module documentation).
pub struct Port<C> {
    /// The device's name, for messages.
    pub name: String,
    /// This opening of the device: a random identity, the key of its peers' links to it.
    pub dev_id: u64,
    pub connect_timeout: Duration,
    pub mrs: Arc<MrTable>,
    pub qps: Arc<QpTable<C>>,
    next_qpn: AtomicU32,
    /// `None`: in-process mode.
    pub net: Option<Net<C>>,
    pub warn: Warnings,
}

/// The TCP side of a device.
pub struct Net<C> {
    /// The rail's local address, with the listener's port.
    pub local: SocketAddr,
    /// Interface to bind outgoing sockets to (`SO_BINDTODEVICE`), when the rail was named
    /// by interface.
    pub bind_iface: Option<String>,
    acceptor: Mutex<Acceptor<C>>,
    links: Mutex<HashMap<LinkKey, Arc<Link<C>>>>,
    /// The readiness sets (the listener is in the helper's).
    pub watcher: Watcher<Link<C>>,
    /// Links to step again without a socket event (a read budget spent, a timer, a lock
    /// that was busy when their event came, an acknowledgement held: `link.rs`), at the
    /// start of the next poll.
    again: Mutex<Vec<Arc<Link<C>>>>,
    any_again: AtomicBool,
    /// Links the peer replaced by dialing again, out of the table, each until its FIN or
    /// its deadline ([`Port::supersede`]).
    superseded: Mutex<Vec<(Arc<Link<C>>, Instant)>>,
    /// Bumped by every poll that asks the callers' readiness set: callers serve all links.
    pub epoll_epoch: AtomicU64,
    /// How many times the helper waited (`ASK_AGAIN`, `helper.rs`) to see whether callers
    /// serve the links it looked at.
    pub helper_asks: AtomicU64,
    /// How many times the helper swept the device's links.
    pub helper_sweeps: AtomicU64,
}

struct Acceptor<C> {
    listener: TcpListener,
    pending: VecDeque<Pending>,
    paused_until: Option<Instant>,
    backoff: Duration,
    orphans: VecDeque<Weak<Link<C>>>,
}

/// An accepted socket whose HELLO has not fully arrived.
struct Pending {
    sock: TcpStream,
    hdr: [u8; HDR_LEN],
    got: usize,
    since: Instant,
}

impl<C: Station> Net<C> {
    /// Listens on `ip` (any port) for the device `name`.
    pub fn listen(name: &str, ip: IpAddr, bind_iface: Option<String>) -> Result<Net<C>> {
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| Error::io(&format!("soft fabric {name}: listening on {ip}"), &e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("soft fabric: listener", &e))?;
        let local = listener.local_addr().map_err(|e| Error::io("soft fabric: listener address", &e))?;
        let watcher = Watcher::new(listener.as_raw_fd())?;
        let acceptor = Acceptor {
            listener,
            pending: VecDeque::new(),
            paused_until: None,
            backoff: BACKOFF_FIRST,
            orphans: VecDeque::new(),
        };
        Ok(Net {
            local,
            bind_iface,
            acceptor: Mutex::new(acceptor),
            links: Mutex::new(HashMap::new()),
            watcher,
            again: Mutex::new(Vec::new()),
            any_again: AtomicBool::new(false),
            superseded: Mutex::new(Vec::new()),
            epoll_epoch: AtomicU64::new(0),
            helper_asks: AtomicU64::new(0),
            helper_sweeps: AtomicU64::new(0),
        })
    }

    /// The links now (control path).
    pub fn links(&self) -> Vec<Arc<Link<C>>> {
        self.links.lock().values().cloned().collect()
    }
}

impl<C> Port<C> {
    pub fn new(
        name: String,
        dev_id: u64,
        connect_timeout: Duration,
        first_qpn: u32,
        mrs: Arc<MrTable>,
        net: Option<Net<C>>,
    ) -> Port<C> {
        Port {
            name,
            dev_id,
            connect_timeout,
            mrs,
            qps: Arc::new(QpTable::new()),
            next_qpn: AtomicU32::new(first_qpn),
            net,
            warn: Warnings::default(),
        }
    }

    /// QPs alive now.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// A new QP number.
    pub fn next_qpn(&self) -> u32 {
        self.next_qpn.fetch_add(1, Ordering::Relaxed)
    }
}

impl<C: Station> Port<C> {
    fn net(&self) -> &Net<C> {
        self.net.as_ref().expect("TCP device")
    }

    /// The link `key` to the device listening at `addr`: the one there is, else a new one
    /// (dialing, or awaiting the peer's dial).
    pub fn link_for(&self, key: LinkKey, addr: SocketAddr) -> Result<Arc<Link<C>>> {
        let net = self.net();
        let fresh = {
            let mut t = net.links.lock();
            if let Some(l) = t.get(&key) {
                return Ok(l.clone());
            }
            let l = Arc::new(Link::new(key, addr, self.mrs.clone(), self.qps.clone()));
            t.insert(key, l.clone());
            l
        };
        if key.dials {
            let mut st = fresh.lock();
            if let Err(e) = self.dial(&fresh, &mut st) {
                st.phase = Phase::Down;
                drop(st);
                self.remove(&fresh);
                return Err(e);
            }
        }
        Ok(fresh)
    }

    /// Starts a non-blocking connect from the rail's address to the link's peer; the HELLO
    /// goes first once it is up.
    fn dial(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>) -> Result<()> {
        let net = self.net();
        let to = link.remote_addr;
        let what = |e: std::io::Error| Error::io(&format!("soft fabric {}: connecting to {to}", self.name), &e);
        let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP)).map_err(what)?;
        s.set_nonblocking(true).map_err(what)?;
        s.set_tcp_nodelay(true).map_err(what)?;
        if let Some(iface) = &net.bind_iface
            && let Err(e) = s.bind_device(Some(iface.as_bytes()))
        {
            log::debug!("soft fabric: SO_BINDTODEVICE {iface}: {e} (source address binding only)");
        }
        s.bind(&SockAddr::from(SocketAddr::new(net.local.ip(), 0))).map_err(what)?;
        match s.connect(&SockAddr::from(to)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(what(e)),
        }
        st.phase = Phase::Dialing { retry_at: None };
        st.set_hello(encode(&Frame::Hello { dst_dev: link.key.remote, src_dev: self.dev_id }));
        self.adopt(link, st, OwnedFd::from(s), true);
        Ok(())
    }

    /// Gives `link` its socket and puts it in the readiness sets.
    fn adopt(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>, fd: OwnedFd, write: bool) {
        let raw = fd.as_raw_fd();
        if !st.bound.is_zero() {
            let _ = socket2::SockRef::from(&fd).set_tcp_user_timeout(Some(st.bound));
        }
        st.fd = Some(fd);
        let (token, added) = self.net().watcher.add(link, raw, write);
        if let Err(e) = added {
            log::warn!("soft fabric {}: epoll_ctl ADD failed ({e}); a link served by its callers only", self.name);
        }
        st.token = Some(token);
        st.out_armed = write;
        // The helper may sleep with no timeout (it had no link when it last looked): it
        // must sweep this one (held frames, a silent peer).
        self.net().watcher.wake();
    }

    /// Takes the socket out of the readiness sets and closes it.
    fn release_fd(&self, st: &mut LinkState<C>, fd: Option<OwnedFd>) {
        if let (Some(fd), Some(token)) = (fd, st.token.take()) {
            self.net().watcher.forget(token, fd.as_raw_fd());
        }
    }

    fn remove(&self, link: &Arc<Link<C>>) {
        let mut t = self.net().links.lock();
        if t.get(&link.key).is_some_and(|l| Arc::ptr_eq(l, link)) {
            t.remove(&link.key);
        }
    }

    /// A dialing link: whether its connect finished (re-dials after a refusal).
    fn check_dial(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>) {
        let Phase::Dialing { retry_at } = st.phase else { return };
        if let Some(at) = retry_at {
            if Instant::now() < at {
                return;
            }
            if let Err(e) = self.dial(link, st) {
                log::debug!("soft fabric {}: {e}", self.name);
                st.phase = Phase::Dialing { retry_at: Some(Instant::now() + REDIAL) };
            }
            return;
        }
        let Some(fd) = st.fd.as_ref().map(|f| f.as_raw_fd()) else { return };
        match dial_result(fd) {
            Ok(false) => {}
            Ok(true) => st.phase = Phase::Up,
            Err(e) => {
                log::debug!("soft fabric {}: connect to {}: {e}", self.name, link.remote_addr);
                let fd = st.fd.take();
                self.release_fd(st, fd);
                st.phase = Phase::Dialing { retry_at: Some(Instant::now() + REDIAL) };
            }
        }
    }

    /// One step on a locked link (`by_caller`: a caller's, not the helper's), and what
    /// follows from it: a link broken or unused is closed, work left is queued.
    /// Returns whether anything moved (bytes read or sent).
    pub fn step_locked(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>, by_caller: bool) -> bool {
        if by_caller {
            link.caller_epoch.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(st.phase, Phase::Dialing { .. }) {
            self.check_dial(link, st);
        }
        let s = st.step(link, by_caller);
        let moved = s.moved;
        self.finish(link, st, s);
        moved
    }

    /// Sends what is queued on a locked link (a post's doorbell).
    pub fn step_tx(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>) {
        if matches!(st.phase, Phase::Dialing { .. }) {
            self.check_dial(link, st);
        }
        let s = st.send(link, true);
        self.finish(link, st, s);
    }

    /// Holds the frames queued on a link for its next step (`progress::Doorbell::Hold`):
    /// the next poll of any of the device's CQs makes it, if no post does first.
    pub fn hold(&self, link: &Arc<Link<C>>) {
        self.requeue(link);
    }

    /// A caller's step, unless another thread is on the link (it makes the same progress);
    /// `queue`: then the link is stepped again at the next poll (its event is consumed).
    /// Returns whether anything moved (`true` too when another thread was on the link).
    pub fn step_try(&self, link: &Arc<Link<C>>, queue: bool) -> bool {
        match link.try_lock() {
            Some(mut st) => self.step_locked(link, &mut st, true),
            None if queue => {
                self.requeue(link);
                true
            }
            None => true,
        }
    }

    fn requeue(&self, link: &Arc<Link<C>>) {
        let net = self.net();
        if !link.queued.swap(true, Ordering::AcqRel) {
            net.again.lock().push(link.clone());
            net.any_again.store(true, Ordering::Release);
        }
    }

    fn finish(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>, s: Step) {
        if let Some(why) = s.down {
            self.down(link, st, &why);
            return;
        }
        if st.used && st.unused() && st.phase != Phase::Down {
            self.retire(link, st);
            return;
        }
        st.unused_since = None;
        if step_again(s.again, st.held()) {
            self.requeue(link);
        }
        self.arm_out(st);
    }

    /// Bytes wait for room: the helper finishes sending should callers stop.
    fn arm_out(&self, st: &mut LinkState<C>) {
        if !st.out_armed
            && st.wants_write()
            && let (Some(fd), Some(token)) = (st.fd.as_ref(), st.token)
        {
            self.net().watcher.rearm(fd.as_raw_fd(), token, true);
            st.out_armed = true;
        }
    }

    /// The link broke: its QPs are told, it is closed and forgotten.
    pub fn down(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>, why: &str) {
        if st.phase == Phase::Down {
            return;
        }
        if st.qps.is_empty() {
            log::debug!("soft fabric {}: link to {} closed: {why}", self.name, link.remote_addr);
        } else {
            log::info!("soft fabric {}: link to {} ({} QPs) down: {why}", self.name, link.remote_addr, st.qps.len());
        }
        let fd = st.down(link, why);
        self.release_fd(st, fd);
        self.remove(link);
    }

    /// The peer dialed again while `link` is up here: it gave the link up (closed it when
    /// its last QP left, or lost it), and what it sent before — acknowledgements of WRITEs
    /// that landed, its QPs' CLOSEs — then its FIN, may still wait in the socket or be on
    /// the way. That is read first: a WRITE the peer executed is not failed for a link it
    /// closed after. The link leaves the table (new QPs go on the new one) and is taken
    /// down at its FIN, or after [`SUPERSEDED_WAIT`] (the sweep).
    pub fn supersede(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>) {
        for _ in 0..64 {
            if st.phase != Phase::Up || !self.step_locked(link, st, false) {
                break;
            }
        }
        if st.phase == Phase::Down {
            return;
        }
        self.remove(link);
        self.net().superseded.lock().push((link.clone(), Instant::now() + SUPERSEDED_WAIT));
    }

    /// Nothing uses the link any more (its last QP left, or the last CONNECT parked for one
    /// was let go). What those QPs still had to send — the ACK owed for what they executed,
    /// their CLOSEs — goes out before the FIN: a peer must not take a WRITE that landed for
    /// lost, nor a close for a failure. While some is left the link lingers, up, still found
    /// for new QPs (one that comes takes it up again), and is sent on at the next poll or
    /// the helper's next look, for at most [`LINGER`]; then it closes.
    fn retire(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>) {
        let now = Instant::now();
        let since = *st.unused_since.get_or_insert(now);
        if (st.wants_write() || st.held()) && now.saturating_duration_since(since) < LINGER {
            let s = st.send(link, false);
            if let Some(why) = s.down {
                self.down(link, st, &why);
                return;
            }
            if st.wants_write() || st.held() {
                self.requeue(link);
                self.arm_out(st);
                return;
            }
        }
        self.close(link, st);
    }

    /// The link closes: the peer reads to the end of what was sent (FIN), the link is
    /// forgotten. What the peer sent meanwhile is read and dropped first (no QP is left to
    /// take it): a socket closed with unread bytes resets the connection, and the peer
    /// could lose what it had not read yet.
    fn close(&self, link: &Arc<Link<C>>, st: &mut LinkState<C>) {
        log::debug!("soft fabric {}: link to {} closed: no QP uses it", self.name, link.remote_addr);
        if let Some(fd) = st.fd.as_ref() {
            // SAFETY: plain syscall on a descriptor the link owns.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
            discard_unread(fd.as_raw_fd());
        }
        let fd = st.down(link, "closed");
        self.release_fd(st, fd);
        self.remove(link);
    }

    /// A CONNECT parked on a QP for `link` is let go.
    pub fn unpark(&self, link: &Arc<Link<C>>) {
        let mut st = link.lock();
        st.parked -= 1;
        if st.used && st.unused() && st.phase != Phase::Down {
            self.retire(link, &mut st);
        }
    }

    /// A caller polled the device's CQs: the helper's next sweep moves away (`clock.rs`).
    #[inline]
    pub fn caller_polled(&self) {
        if let Some(net) = &self.net {
            net.watcher.clock.caller_polled();
        }
    }

    /// Steps the links whose sockets moved since the callers last asked, whichever CQ's
    /// they are (an edge taken from the callers' set is served by who took it): one
    /// non-blocking `epoll_wait`, no socket locked, ~150 ns here against ~480 for a `readv`
    /// that finds nothing. Callers that ask so serve every link of the device (the helper
    /// sees `epoll_epoch` move). Returns whether `mine` moved: a CQ whose one link is cold
    /// (`cq.rs`) asks for it.
    pub fn step_moved(&self, events: &mut [libc::epoll_event], mine: Option<&Arc<Link<C>>>) -> bool {
        let Some(net) = &self.net else { return false };
        net.epoll_epoch.fetch_add(1, Ordering::Relaxed);
        let n = net.watcher.moved(events);
        let mut moved = false;
        for ev in &events[..n] {
            if let Some(link) = net.watcher.get(ev.u64 as usize) {
                let m = self.step_try(&link, true);
                moved |= m && mine.is_some_and(|l| Arc::ptr_eq(&link, l));
            }
        }
        moved
    }

    /// Callers whose CQ's QPs use several links: steps the links queued to be stepped
    /// again and those whose sockets moved (one `epoll_wait`, whatever the number of links).
    pub fn poll_ready(&self, events: &mut [libc::epoll_event]) {
        let _ = self.step_again(None);
        let _ = self.step_moved(events, None);
    }

    /// Steps the links queued to be stepped again (before the links a poll steps anyway:
    /// what this poll's steps queue waits for the next poll, so an acknowledgement held at
    /// the end of a poll is not sent alone by the same poll). `skip`: a link the caller
    /// steps next anyway; returns whether it was queued (the caller must then step it).
    pub fn step_again(&self, skip: Option<&Arc<Link<C>>>) -> bool {
        let Some(net) = &self.net else { return false };
        if !net.any_again.load(Ordering::Acquire) {
            return false;
        }
        net.any_again.store(false, Ordering::Release);
        let again = std::mem::take(&mut *net.again.lock());
        let mut skipped = false;
        for l in again {
            l.queued.store(false, Ordering::Release);
            if skip.is_some_and(|s| Arc::ptr_eq(s, &l)) {
                skipped = true;
                continue;
            }
            let _ = self.step_try(&l, true);
        }
        skipped
    }

    /// The helper, every period: links that are dialing again, silent, orphaned or served
    /// by nobody (`progress::sweep_steps`). `quiet(link)`: no caller stepped it since the
    /// last sweep; `callers_poll`: callers asked the readiness set since.
    pub fn sweep(&self, now: Instant, callers_poll: bool, quiet: impl Fn(&Link<C>) -> bool) {
        let Some(net) = &self.net else { return };
        net.superseded.lock().retain(|(l, deadline)| {
            let Some(mut st) = l.try_lock() else { return true };
            match st.phase {
                Phase::Down => false,
                _ if now >= *deadline => {
                    self.down(l, &mut st, "the peer dialed again");
                    false
                }
                _ if st.unused() => {
                    self.close(l, &mut st);
                    false
                }
                _ => true,
            }
        });
        for l in net.links() {
            let Some(mut st) = l.try_lock() else { continue };
            match st.phase {
                Phase::Dialing { .. } | Phase::Awaiting if st.unused() => self.close(&l, &mut st),
                Phase::Dialing { .. } => {
                    let _ = self.step_locked(&l, &mut st, false);
                }
                Phase::Up if !st.used && st.unused() && now.duration_since(st.since) > self.connect_timeout => {
                    let (name, to) = (&self.name, l.remote_addr);
                    self.warn.hello.warn(|| format!("soft fabric {name}: a link from {to} carried no QP; closed"));
                    self.close(&l, &mut st);
                }
                Phase::Up => {
                    if let Some(why) = st.silent() {
                        self.down(&l, &mut st, &why);
                    } else if sweep_steps(quiet(&l), callers_poll, st.held()) {
                        let _ = self.step_locked(&l, &mut st, false);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
#[path = "port_tests.rs"]
mod tests;
