//! The control channel between two ranks: a TCP connection carrying small framed messages
//! (`kind`, body). It carries the workload (both ranks check they run the same), the listen
//! handles, a barrier before closing, and the reports. Nothing on the data path uses it.
//!
//! Locally the parent starts rank 0 with `listen 127.0.0.1:0`, reads the bound address
//! from rank 0's first line of output and starts rank 1 with `connect ADDR`; between two
//! hosts the same happens with an address the user gives (`mpib-perf --rendezvous`).

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{Error, Result};

/// Largest message accepted (reports of long sweeps included: a timeline's 4,000 samples a
/// second take ~17 MB for the 86 s of a 20-outage drill).
const MAX_BODY: usize = 128 << 20;

/// One end of the control channel.
pub struct Link {
    stream: TcpStream,
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::io(format!("control channel: {what}: {e}"))
}

/// Binds the rendezvous listener (`HOST:PORT`, port 0 = any free port).
pub fn bind(addr: &str) -> Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr).map_err(|e| io(&format!("bind {addr}"), e))?;
    let a = l.local_addr().map_err(|e| io("local_addr", e))?;
    Ok((l, a))
}

impl Link {
    /// Waits up to `timeout` for the peer to connect to `l`.
    pub fn accept(l: &TcpListener, timeout: Duration) -> Result<Link> {
        l.set_nonblocking(true).map_err(|e| io("set_nonblocking", e))?;
        let end = Instant::now() + timeout;
        loop {
            match l.accept() {
                Ok((s, _)) => return Link::new(s),
                Err(e) if e.kind() == IoKind::WouldBlock && Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) if e.kind() == IoKind::WouldBlock => {
                    return Err(Error::timeout(format!("no peer connected to the rendezvous within {timeout:?}")));
                }
                Err(e) => return Err(io("accept", e)),
            }
        }
    }

    /// Connects to `addr`, retrying (the peer may not listen yet) for up to `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Link> {
        let end = Instant::now() + timeout;
        loop {
            let r = addr
                .to_socket_addrs()
                .map_err(|e| io(&format!("resolve {addr}"), e))?
                .next()
                .ok_or_else(|| Error::io(format!("control channel: {addr} resolves to nothing")))
                .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).map_err(|e| io("connect", e)));
            match r {
                Ok(s) => return Link::new(s),
                Err(e) if Instant::now() >= end => {
                    return Err(Error::io(format!("rendezvous {addr} unreachable for {timeout:?}: {}", e.msg)));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Connects to the first of `addrs` that answers, trying each in turn (the peer may not
    /// listen yet, and only some of its addresses may be reachable from here) for up to
    /// `timeout`.
    pub fn connect_any(addrs: &[SocketAddr], timeout: Duration) -> Result<Link> {
        if addrs.is_empty() {
            return Err(Error::usage("control channel: no address to connect to"));
        }
        let end = Instant::now() + timeout;
        loop {
            let mut errors = Vec::new();
            for a in addrs {
                let left = end.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(a, left.clamp(Duration::from_millis(10), Duration::from_secs(1))) {
                    Ok(s) => return Link::new(s),
                    Err(e) => errors.push(format!("{a}: {e}")),
                }
            }
            if Instant::now() >= end {
                return Err(Error::io(format!(
                    "no address of the peer answered within {timeout:?} ({})",
                    errors.join("; ")
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn new(stream: TcpStream) -> Result<Link> {
        stream.set_nonblocking(false).map_err(|e| io("set_nonblocking", e))?;
        stream.set_nodelay(true).map_err(|e| io("set_nodelay", e))?;
        Ok(Link { stream })
    }

    /// Sends one message.
    pub fn send(&mut self, kind: &str, body: &[u8]) -> Result<()> {
        assert!(kind.len() < 256, "message kinds are short names");
        if body.len() > MAX_BODY {
            return Err(Error::io(format!(
                "control channel: a {}-byte {kind} message (at most {MAX_BODY})",
                body.len()
            )));
        }
        let mut frame = Vec::with_capacity(5 + kind.len() + body.len());
        frame.push(kind.len() as u8);
        frame.extend_from_slice(kind.as_bytes());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(body);
        self.stream.write_all(&frame).map_err(|e| io(&format!("send {kind}"), e))
    }

    /// Receives one message within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<(String, Vec<u8>)> {
        self.stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).map_err(|e| io("timeout", e))?;
        let mut klen = [0u8; 1];
        self.read(&mut klen, timeout)?;
        let mut kind = vec![0u8; klen[0] as usize];
        self.read(&mut kind, timeout)?;
        let mut blen = [0u8; 4];
        self.read(&mut blen, timeout)?;
        let n = u32::from_be_bytes(blen) as usize;
        if n > MAX_BODY {
            return Err(Error::io(format!("control channel: a {n}-byte message (at most {MAX_BODY})")));
        }
        let mut body = vec![0u8; n];
        self.read(&mut body, timeout)?;
        Ok((String::from_utf8_lossy(&kind).into_owned(), body))
    }

    /// Receives one message, which must be of `kind`.
    pub fn expect(&mut self, kind: &str, timeout: Duration) -> Result<Vec<u8>> {
        let (k, body) = self.recv(timeout)?;
        if k != kind {
            return Err(Error::io(format!(
                "control channel: expected {kind}, the peer sent {k}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        Ok(body)
    }

    fn read(&mut self, buf: &mut [u8], timeout: Duration) -> Result<()> {
        match self.stream.read_exact(buf) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => {
                Err(Error::timeout(format!("control channel: the peer sent nothing for {timeout:?}")))
            }
            Err(e) if e.kind() == IoKind::UnexpectedEof => {
                Err(Error::io("control channel: the peer closed the connection (it exited or was killed)"))
            }
            Err(e) => Err(io("recv", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_and_eof_and_silence_are_errors() {
        let (l, addr) = bind("127.0.0.1:0").unwrap();
        let t = std::thread::spawn(move || {
            let mut c = Link::connect(&addr.to_string(), Duration::from_secs(5)).unwrap();
            c.send("hello", b"workload line").unwrap();
            let b = c.expect("handle", Duration::from_secs(5)).unwrap();
            assert_eq!(b.len(), 128);
        });
        let mut s = Link::accept(&l, Duration::from_secs(5)).unwrap();
        assert_eq!(s.recv(Duration::from_secs(5)).unwrap(), ("hello".to_string(), b"workload line".to_vec()));
        let e = s.recv(Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind, super::super::ErrorKind::Timeout, "{e}");
        s.send("handle", &[7u8; 128]).unwrap();
        t.join().unwrap();
        let e = s.recv(Duration::from_secs(5)).unwrap_err();
        assert!(e.msg.contains("closed"), "{e}");
    }

    #[test]
    fn connect_any_skips_dead_addresses_and_names_them_when_none_answers() {
        let (l, good) = bind("127.0.0.1:0").unwrap();
        // A port that was just free: nothing listens there.
        let dead = bind("127.0.0.1:0").unwrap().1;
        let t = std::thread::spawn(move || Link::accept(&l, Duration::from_secs(5)).map(|_| ()));
        Link::connect_any(&[dead, good], Duration::from_secs(5)).unwrap();
        t.join().unwrap().unwrap();
        let e = Link::connect_any(&[dead], Duration::from_millis(100)).err().unwrap();
        assert!(e.msg.contains(&dead.to_string()), "{e}");
        assert!(Link::connect_any(&[], Duration::from_millis(100)).is_err());
    }
}
