//! What a soft device's QPs share: the QP table (numbers, the `max_qp` limit, HELLO
//! dispatch) and, on TCP, the rail's "port": a listener bound to the rail's local address,
//! the dialers whose HELLO has not fully arrived, and the helper thread's epoll set. Every
//! connection holds its device's port, as a verbs QP holds its device.
//!
//! Generic over the connection type `C`: the port keeps connections (by QP number) and
//! hands a dialer's socket to the one its HELLO names ([`Accept`]); what a connection does
//! with it is the connection's business (`conn.rs`), which sits above.

use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::frame::{Frame, HDR_LEN, decode};
use super::transport::{Link, TcpLink};
use super::watch::Watcher;
use crate::error::{Error, Result};

/// What the port asks of the connection a dialer's HELLO names.
pub trait Accept {
    /// The random number that names the QP (the HELLO must quote it).
    fn nonce(&self) -> u64;
    /// The dialer (QP `src_qpn`, nonce `src_nonce`) connected on `link`. `false`: this QP
    /// does not expect it (the link is closed).
    fn accept(self: &Arc<Self>, link: Link, src_qpn: u32, src_nonce: u64) -> bool;
}

/// The shared part of a device (see the module documentation).
pub struct Port<C> {
    /// The device's name, for messages.
    pub name: String,
    pub guid: u64,
    pub connect_timeout: Duration,
    qps: Mutex<HashMap<u32, Weak<C>>>,
    next_qpn: AtomicU32,
    /// `None`: in-process mode.
    pub net: Option<Net<C>>,
}

/// The TCP side of a device.
pub struct Net<C> {
    /// The rail's local address, with the listener's port.
    pub local: SocketAddr,
    /// Interface to bind outgoing sockets to (`SO_BINDTODEVICE`), when the rail was named
    /// by interface.
    pub bind_iface: Option<String>,
    acceptor: Mutex<Acceptor>,
    /// The helper thread's epoll set (the listener is in it).
    pub watcher: Watcher<C>,
}

struct Acceptor {
    listener: TcpListener,
    pending: Vec<Pending>,
}

/// An accepted socket whose HELLO has not fully arrived.
struct Pending {
    sock: TcpStream,
    hdr: [u8; HDR_LEN],
    got: usize,
    since: Instant,
}

impl<C> Net<C> {
    /// Listens on `ip` (any port) for the device `name`.
    pub fn listen(name: &str, ip: IpAddr, bind_iface: Option<String>) -> Result<Net<C>> {
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| Error::io(&format!("soft fabric {name}: listening on {ip}"), &e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("soft fabric: listener", &e))?;
        let local = listener.local_addr().map_err(|e| Error::io("soft fabric: listener address", &e))?;
        let watcher = Watcher::new(listener.as_raw_fd())?;
        Ok(Net { local, bind_iface, acceptor: Mutex::new(Acceptor { listener, pending: Vec::new() }), watcher })
    }
}

impl<C: Accept> Port<C> {
    /// `first_qpn`: the first QP number handed out.
    pub fn new(name: String, guid: u64, connect_timeout: Duration, first_qpn: u32, net: Option<Net<C>>) -> Port<C> {
        Port { name, guid, connect_timeout, qps: Mutex::new(HashMap::new()), next_qpn: AtomicU32::new(first_qpn), net }
    }

    /// QPs alive now.
    pub fn qp_count(&self) -> usize {
        self.qps.lock().len()
    }

    /// A new QP number.
    pub fn next_qpn(&self) -> u32 {
        self.next_qpn.fetch_add(1, Ordering::Relaxed)
    }

    pub fn register_qp(&self, qpn: u32, c: &Arc<C>) {
        self.qps.lock().insert(qpn, Arc::downgrade(c));
    }

    pub fn forget_qp(&self, qpn: u32) {
        self.qps.lock().remove(&qpn);
    }

    /// Accepts dialers and reads their HELLOs; attaches (or parks) each at its QP.
    /// Returns whether HELLOs are still incomplete.
    pub fn drive_accept(&self) -> bool {
        let Some(net) = &self.net else { return false };
        let mut a = net.acceptor.lock();
        loop {
            match a.listener.accept() {
                Ok((sock, _)) => {
                    if sock.set_nonblocking(true).is_err() || sock.set_nodelay(true).is_err() {
                        continue;
                    }
                    a.pending.push(Pending { sock, hdr: [0; HDR_LEN], got: 0, since: Instant::now() });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("soft fabric {}: accept failed: {e}", self.name);
                    break;
                }
            }
        }
        let mut i = 0;
        while i < a.pending.len() {
            let p = &mut a.pending[i];
            let r = (&p.sock).read(&mut p.hdr[p.got..]);
            let keep = match r {
                Ok(0) => false,
                Ok(n) => {
                    p.got += n;
                    true
                }
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            };
            if keep && p.got < HDR_LEN && p.since.elapsed() < self.connect_timeout {
                i += 1;
                continue;
            }
            let p = a.pending.swap_remove(i);
            if p.got == HDR_LEN {
                self.dispatch(p.sock, &p.hdr);
            }
        }
        !a.pending.is_empty()
    }

    fn dispatch(&self, sock: TcpStream, hdr: &[u8; HDR_LEN]) {
        let Ok(Frame::Hello { dst_qpn, src_qpn, dst_nonce, src_nonce }) = decode(hdr) else {
            log::warn!("soft fabric {}: a connection did not start with a HELLO; closed", self.name);
            return;
        };
        let conn = self.qps.lock().get(&dst_qpn).and_then(|w| w.upgrade());
        let Some(conn) = conn.filter(|c| c.nonce() == dst_nonce) else {
            log::warn!("soft fabric {}: HELLO for unknown QP {dst_qpn}; closed", self.name);
            return;
        };
        let link = Link::Tcp(TcpLink::new(OwnedFd::from(sock)));
        if !conn.accept(link, src_qpn, src_nonce) {
            log::warn!("soft fabric {}: unexpected HELLO for QP {dst_qpn} from QP {src_qpn}; closed", self.name);
        }
    }
}
