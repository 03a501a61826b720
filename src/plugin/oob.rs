//! The out-of-band channel of connection set-up: where the listen handle points, and
//! length-prefixed messages over it ([`Frames`]: a length above the largest set-up message
//! is refused before its body is read). TCP (non-blocking: connect/accept are state
//! machines that NCCL calls again and again) or, with the in-process fabric, queues in
//! memory.

use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use socket2::{Domain, Socket, Type};

use super::setup_msg::{DecodeError, Frames};
use crate::error::{Error, Result};

/// Where a listener can be reached, as written into the 128-byte handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OobAddr {
    Tcp(SocketAddr),
    Inproc(u64),
}

impl OobAddr {
    /// Serialized form: kind (1 byte), port (2, BE), address (16).
    pub fn write(&self, out: &mut [u8; 19]) {
        match self {
            OobAddr::Tcp(sa) => {
                out[0] = 1;
                out[1..3].copy_from_slice(&sa.port().to_be_bytes());
                let v6 = match sa.ip() {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                out[3..19].copy_from_slice(&v6.octets());
            }
            OobAddr::Inproc(id) => {
                out[0] = 2;
                out[1..3].fill(0);
                out[3..11].copy_from_slice(&id.to_le_bytes());
                out[11..19].fill(0);
            }
        }
    }

    pub fn read(b: &[u8; 19]) -> Result<OobAddr> {
        match b[0] {
            1 => {
                let port = u16::from_be_bytes([b[1], b[2]]);
                let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(&b[3..19]).expect("16 bytes"));
                let ip = v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6));
                Ok(OobAddr::Tcp(SocketAddr::new(ip, port)))
            }
            2 => Ok(OobAddr::Inproc(u64::from_le_bytes(b[3..11].try_into().expect("8 bytes")))),
            k => Err(Error::invalid_argument(format!("listen handle has an unknown address kind {k}"))),
        }
    }
}

/// A listener waiting for connecting peers.
pub enum OobListener {
    Tcp(TcpListener),
    /// Listener `id` of a plugin instance's table.
    Inproc {
        id: u64,
        table: &'static InprocListeners,
    },
}

type Pipe = Arc<Mutex<VecDeque<Vec<u8>>>>;

/// A plugin instance's in-process listeners (`MPIB_FABRIC=inproc`): id → connections
/// waiting to be accepted. Each instance has its own, so an address reaches only
/// listeners of the instance that connects.
pub struct InprocListeners {
    waiting: Mutex<BTreeMap<u64, VecDeque<InprocConn>>>,
    next: AtomicU64,
}

impl Default for InprocListeners {
    fn default() -> Self {
        InprocListeners::new()
    }
}

impl InprocListeners {
    pub const fn new() -> InprocListeners {
        InprocListeners { waiting: Mutex::new(BTreeMap::new()), next: AtomicU64::new(1) }
    }
}

impl OobListener {
    /// A TCP listener on `ip` (port chosen by the kernel).
    pub fn tcp(ip: IpAddr) -> Result<(OobListener, OobAddr)> {
        let l = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(&format!("bind a listener on {ip}"), &e))?;
        l.set_nonblocking(true).map_err(|e| Error::io("set the listener non-blocking", &e))?;
        let addr = l.local_addr().map_err(|e| Error::io("listener address", &e))?;
        Ok((OobListener::Tcp(l), OobAddr::Tcp(addr)))
    }

    /// An in-process listener in `table`.
    pub fn inproc(table: &'static InprocListeners) -> (OobListener, OobAddr) {
        let id = table.next.fetch_add(1, Ordering::Relaxed);
        table.waiting.lock().insert(id, VecDeque::new());
        (OobListener::Inproc { id, table }, OobAddr::Inproc(id))
    }

    /// The address a TCP listener is bound to (for log lines).
    pub fn local(&self) -> String {
        match self {
            OobListener::Tcp(l) => l.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string()),
            OobListener::Inproc { id, .. } => format!("in-process {id}"),
        }
    }

    /// A connection that arrived, if any (never blocks). Errors are the OS's, for the
    /// caller to tell a connection that failed (reset before it was taken, out of file
    /// descriptors) from a broken listener.
    pub fn accept(&self) -> std::io::Result<Option<OobConn>> {
        match self {
            OobListener::Tcp(l) => match l.accept() {
                Ok((s, peer)) => Ok(Some(OobConn::tcp_connected(s, peer)?)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e),
            },
            OobListener::Inproc { id, table } => {
                Ok(table.waiting.lock().get_mut(id).and_then(|q| q.pop_front()).map(OobConn::Inproc))
            }
        }
    }
}

impl Drop for OobListener {
    fn drop(&mut self) {
        if let OobListener::Inproc { id, table } = self {
            table.waiting.lock().remove(id);
        }
    }
}

/// One end of an in-process channel.
pub struct InprocConn {
    tx: Pipe,
    rx: Pipe,
}

/// A set-up connection carrying whole messages.
pub enum OobConn {
    Tcp(TcpConn),
    Inproc(InprocConn),
}

pub struct TcpConn {
    sock: Socket,
    connected: bool,
    peer: SocketAddr,
    wbuf: Vec<u8>,
    rbuf: Frames,
}

impl OobConn {
    /// Starts connecting to `addr`; never blocks. An in-process address is looked up in
    /// `inproc` (the connecting instance's listeners).
    pub fn connect(addr: OobAddr, inproc: &InprocListeners) -> Result<OobConn> {
        match addr {
            OobAddr::Tcp(sa) => {
                let sock = Socket::new(Domain::for_address(sa), Type::STREAM, None)
                    .map_err(|e| Error::io("create a set-up socket", &e))?;
                sock.set_nonblocking(true).map_err(|e| Error::io("set the socket non-blocking", &e))?;
                let _ = sock.set_tcp_nodelay(true);
                match sock.connect(&sa.into()) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(Error::io(&format!("connect to {sa}"), &e)),
                }
                Ok(OobConn::Tcp(TcpConn {
                    sock,
                    connected: false,
                    peer: sa,
                    wbuf: Vec::new(),
                    rbuf: Frames::default(),
                }))
            }
            OobAddr::Inproc(id) => {
                let (a, b): (Pipe, Pipe) = Default::default();
                let mut ls = inproc.waiting.lock();
                let q = ls.get_mut(&id).ok_or_else(|| {
                    Error::remote(format!(
                        "in-process listener {id} does not exist (closed, or of another process or plugin instance)"
                    ))
                })?;
                q.push_back(InprocConn { tx: b.clone(), rx: a.clone() });
                Ok(OobConn::Inproc(InprocConn { tx: a, rx: b }))
            }
        }
    }

    fn tcp_connected(s: TcpStream, peer: SocketAddr) -> std::io::Result<OobConn> {
        s.set_nonblocking(true)?;
        let _ = s.set_nodelay(true);
        Ok(OobConn::Tcp(TcpConn {
            sock: Socket::from(s),
            connected: true,
            peer,
            wbuf: Vec::new(),
            rbuf: Frames::default(),
        }))
    }

    /// Queues one message.
    pub fn send(&mut self, msg: &[u8]) {
        match self {
            OobConn::Tcp(c) => Frames::put(&mut c.wbuf, msg),
            OobConn::Inproc(c) => c.tx.lock().push_back(msg.to_vec()),
        }
    }

    /// Moves bytes (never blocks); returns a complete received message if there is one.
    pub fn poll(&mut self) -> Result<Option<Vec<u8>>> {
        match self {
            OobConn::Inproc(c) => Ok(c.rx.lock().pop_front()),
            OobConn::Tcp(c) => c.poll(),
        }
    }

    /// Takes the connection out of `self` (a set-up that is done hands it to its comm),
    /// leaving an end of nothing in its place.
    pub fn take(&mut self) -> OobConn {
        std::mem::replace(self, OobConn::Inproc(InprocConn { tx: Pipe::default(), rx: Pipe::default() }))
    }

    /// Where the other end is (for log lines).
    pub fn peer(&self) -> String {
        match self {
            OobConn::Tcp(c) => c.peer.to_string(),
            OobConn::Inproc(_) => "this process".to_string(),
        }
    }

    /// Hands what is queued to the kernel now if the connection is up (never blocks, reads
    /// nothing).
    pub fn flush(&mut self) -> Result<()> {
        match self {
            OobConn::Tcp(c) => c.write_out().map(|_| ()),
            OobConn::Inproc(_) => Ok(()),
        }
    }

    /// Whether everything queued has been handed to the kernel.
    pub fn flushed(&self) -> bool {
        match self {
            OobConn::Tcp(c) => c.wbuf.is_empty(),
            OobConn::Inproc(_) => true,
        }
    }
}

impl TcpConn {
    fn poll(&mut self) -> Result<Option<Vec<u8>>> {
        if !self.write_out()? {
            return Ok(None); // still connecting
        }
        let mut buf = [0u8; 4096];
        loop {
            if let Some(m) = self.take_message()? {
                return Ok(Some(m));
            }
            match (&self.sock).read(&mut buf) {
                Ok(0) => return Err(Error::remote(format!("peer {} closed the set-up connection", self.peer))),
                Ok(n) => self.rbuf.push(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::remote(format!("set-up connection to {}: {e}", self.peer))),
            }
        }
    }

    /// Hands what is queued to the kernel as far as it takes it; `false` while the TCP
    /// connect is still in progress.
    fn write_out(&mut self) -> Result<bool> {
        if !self.connected {
            if let Some(e) = self.sock.take_error().map_err(|e| Error::io("set-up socket", &e))? {
                return Err(Error::remote(format!("cannot connect to {}: {e}", self.peer)));
            }
            match self.sock.peer_addr() {
                Ok(_) => self.connected = true,
                Err(_) => return Ok(false),
            }
        }
        while !self.wbuf.is_empty() {
            match (&self.sock).write(&self.wbuf) {
                Ok(0) => return Err(Error::remote(format!("set-up connection to {} closed", self.peer))),
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::remote(format!("set-up connection to {}: {e}", self.peer))),
            }
        }
        Ok(true)
    }

    fn take_message(&mut self) -> Result<Option<Vec<u8>>> {
        self.rbuf.next_msg().map_err(|e| match e {
            DecodeError::Foreign(why) => Error::remote(format!("{} {why}", self.peer)),
            v => Error::from(v),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn table() -> &'static InprocListeners {
        Box::leak(Box::default())
    }

    fn exchange(addr: OobAddr, l: &OobListener, inproc: &InprocListeners) {
        let mut a = OobConn::connect(addr, inproc).unwrap();
        a.send(b"hello");
        a.send(&vec![7u8; 1_500]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut b = None;
        let mut got = Vec::new();
        while got.len() < 2 {
            assert!(Instant::now() < deadline, "set-up exchange timed out");
            assert_eq!(a.poll().unwrap(), None);
            if b.is_none() {
                b = l.accept().unwrap();
            }
            if let Some(b) = b.as_mut()
                && let Some(m) = b.poll().unwrap()
            {
                got.push(m);
            }
        }
        assert_eq!(got[0], b"hello");
        assert_eq!(got[1], vec![7u8; 1_500]);
    }

    #[test]
    fn tcp_and_inproc_carry_whole_messages() {
        let (l, addr) = OobListener::tcp("127.0.0.1".parse().unwrap()).unwrap();
        exchange(addr, &l, table());
        let inproc = table();
        let (l, addr) = OobListener::inproc(inproc);
        exchange(addr, &l, inproc);
    }

    #[test]
    fn an_inproc_listener_is_reached_only_through_its_own_table() {
        let (mine, other) = (table(), table());
        let (l, addr) = OobListener::inproc(mine);
        let e = OobConn::connect(addr, other).err().expect("not in the other table");
        assert!(e.msg().contains("does not exist"), "{}", e.msg());
        // The same id in the other table is another listener: the table tells them apart.
        let (l2, addr2) = OobListener::inproc(other);
        assert_eq!(addr, addr2);
        let _c = OobConn::connect(addr2, other).unwrap();
        assert!(l.accept().unwrap().is_none(), "nothing reached this instance's listener");
        assert!(l2.accept().unwrap().is_some(), "the other instance's did get its connection");
        drop(l);
        assert!(OobConn::connect(addr, mine).is_err(), "a closed listener leaves its table");
    }

    #[test]
    fn addresses_round_trip() {
        for a in [
            OobAddr::Tcp("10.1.2.3:4567".parse().unwrap()),
            OobAddr::Tcp("[fe80::1]:9".parse().unwrap()),
            OobAddr::Inproc(42),
        ] {
            let mut b = [0u8; 19];
            a.write(&mut b);
            assert_eq!(OobAddr::read(&b).unwrap(), a);
        }
    }

    #[test]
    fn refused_connection_is_an_error_not_a_hang() {
        let (l, addr) = OobListener::tcp("127.0.0.1".parse().unwrap()).unwrap();
        drop(l);
        let mut c = OobConn::connect(addr, table()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match c.poll() {
                Err(e) => {
                    assert!(e.msg().contains("cannot connect") || e.msg().contains("closed"), "{}", e.msg());
                    break;
                }
                Ok(_) => assert!(Instant::now() < deadline, "no error for a refused connection"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
