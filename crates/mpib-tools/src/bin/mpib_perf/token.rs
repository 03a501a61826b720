//! The `--listen` token: one line (URL-safe base64) carrying what `--connect` needs: the
//! addresses and port of the listener's control channel, a nonce naming this run (so a
//! token of an earlier run, or a stranger on the port, is refused), and the plugin's listen
//! handle (so the connecting rank can `connect` as soon as the options agree).
//!
//! ```text
//! "MPT1" | nonce u64 | port u16 | n u8 | n × (4|6, 4|16 address bytes) | len u8 | handle[len]
//! ```
//! The handle's trailing zero bytes are left out (it is NCCL_NET_HANDLE_MAXSIZE = 128 bytes,
//! mostly unused).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use mpib_tools::net::HANDLE_BYTES;

const MAGIC: &[u8; 4] = b"MPT1";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub nonce: u64,
    /// The listener's control-channel addresses, most likely reachable first.
    pub addrs: Vec<SocketAddr>,
    pub handle: [u8; HANDLE_BYTES],
}

impl Token {
    pub fn encode(&self) -> String {
        let mut b = Vec::with_capacity(64 + HANDLE_BYTES);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.nonce.to_be_bytes());
        let port = self.addrs.first().map_or(0, SocketAddr::port);
        b.extend_from_slice(&port.to_be_bytes());
        let addrs: Vec<&SocketAddr> = self.addrs.iter().take(255).collect();
        b.push(addrs.len() as u8);
        for a in addrs {
            match a.ip() {
                IpAddr::V4(v4) => {
                    b.push(4);
                    b.extend_from_slice(&v4.octets());
                }
                IpAddr::V6(v6) => {
                    b.push(6);
                    b.extend_from_slice(&v6.octets());
                }
            }
        }
        let len = self.handle.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
        b.push(len as u8);
        b.extend_from_slice(&self.handle[..len]);
        URL_SAFE_NO_PAD.encode(b)
    }

    pub fn decode(text: &str) -> Result<Token, String> {
        let bad = |why: &str| format!("not a token printed by mpib-perf --listen ({why})");
        let b = URL_SAFE_NO_PAD.decode(text.trim()).map_err(|_| bad("not base64"))?;
        let mut r = Reader(&b);
        if r.take(4)? != MAGIC {
            return Err(bad("wrong magic"));
        }
        let nonce = u64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let port = u16::from_be_bytes(r.take(2)?.try_into().expect("2 bytes"));
        let n = r.take(1)?[0];
        let mut addrs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let ip = match r.take(1)?[0] {
                4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(r.take(4)?).expect("4 bytes"))),
                6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(r.take(16)?).expect("16 bytes"))),
                _ => return Err(bad("unknown address family")),
            };
            addrs.push(SocketAddr::new(ip, port));
        }
        let len = r.take(1)?[0] as usize;
        if len > HANDLE_BYTES {
            return Err(bad("handle too long"));
        }
        let mut handle = [0u8; HANDLE_BYTES];
        handle[..len].copy_from_slice(r.take(len)?);
        if !r.0.is_empty() {
            return Err(bad("trailing bytes"));
        }
        if addrs.is_empty() {
            return Err(bad("no address"));
        }
        Ok(Token { nonce, addrs, handle })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("not a token printed by mpib-perf --listen (truncated)".into());
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }
}

/// The addresses to advertise for a control channel bound to `bound`: itself when it names
/// one address; for a wildcard bind, this host's up addresses, the one NCCL's socket
/// transport would pick first (it is where the rails are too) and loopback last.
pub fn advertised(bound: SocketAddr) -> Vec<SocketAddr> {
    if !bound.ip().is_unspecified() {
        return vec![bound];
    }
    let ifs = netif::interfaces();
    let first = netif::default_addr(&ifs, std::env::var("NCCL_SOCKET_IFNAME").ok().as_deref());
    let mut ips: Vec<IpAddr> = first.iter().map(|a| a.ip).collect();
    let want_v6 = bound.is_ipv6();
    for a in &ifs {
        if !ips.contains(&a.ip) && (want_v6 || a.ip.is_ipv4()) && !a.ip.is_loopback() {
            ips.push(a.ip);
        }
    }
    ips.sort_by_key(|ip| ip.is_loopback());
    ips.push(if want_v6 { IpAddr::V6(Ipv6Addr::LOCALHOST) } else { IpAddr::V4(Ipv4Addr::LOCALHOST) });
    ips.dedup();
    ips.into_iter().map(|ip| SocketAddr::new(ip, bound.port())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let mut handle = [0u8; HANDLE_BYTES];
        handle[..5].copy_from_slice(b"hello");
        handle[40] = 9;
        let t = Token {
            nonce: 0x0123_4567_89ab_cdef,
            addrs: vec!["10.1.2.3:5000".parse().unwrap(), "[fd00::1]:5000".parse().unwrap()],
            handle,
        };
        let s = t.encode();
        assert!(s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{s}");
        assert_eq!(Token::decode(&s).unwrap(), t);
        assert_eq!(Token::decode(&format!("  {s}\n")).unwrap(), t);
        assert!(Token::decode(&s[..s.len() - 4]).is_err());
        assert!(Token::decode("bm90IGEgdG9rZW4").unwrap_err().contains("not a token"));
        assert!(Token::decode("!!!").is_err());
    }

    #[test]
    fn wildcard_binds_advertise_every_address_loopback_last() {
        let a = advertised("0.0.0.0:4242".parse().unwrap());
        assert!(a.iter().all(|s| s.port() == 4242 && s.is_ipv4()));
        assert_eq!(a.last().unwrap().ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(a.iter().filter(|s| s.ip().is_loopback()).count(), 1, "{a:?}");
        let one: SocketAddr = "192.0.2.7:1".parse().unwrap();
        assert_eq!(advertised(one), vec![one]);
    }
}
