//! The control channels between the ranks of a life-cycle run: one [`Link`] per (peer,
//! channel), so each thread of a rank talks to the same thread of its peer without sharing
//! a stream. Every rank listens on one address; of two ranks, the higher dials the lower and
//! names itself and the channel in its first message. Nothing on the data path uses it.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::link::Link;
use crate::{Error, Result};

/// How long a rank waits for a peer's channel (the peer may still be setting up).
const CHANNEL_WITHIN: Duration = Duration::from_secs(120);

/// Links accepted by the listening thread, by (peer rank, channel), until a thread takes them.
type Arrived = Arc<(Mutex<HashMap<(usize, u32), Link>>, Condvar)>;

/// This rank's ends of the control channels.
pub struct Mesh {
    rank: usize,
    peers: Vec<SocketAddr>,
    arrived: Arrived,
}

impl Mesh {
    /// The mesh of rank `rank` once every rank's address is known; `listener` is this rank's
    /// (its address is `peers[rank]`). A thread accepts the higher ranks' channels for the
    /// process's lifetime.
    pub fn new(rank: usize, peers: Vec<SocketAddr>, listener: TcpListener) -> Mesh {
        let arrived: Arrived = Arc::default();
        let a = arrived.clone();
        std::thread::Builder::new()
            .name("lifecycle-mesh".into())
            .spawn(move || accept_loop(listener, a))
            .expect("spawn the control channel's accept thread");
        Mesh { rank, peers, arrived }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn ranks(&self) -> usize {
        self.peers.len()
    }

    /// The channel `chan` to rank `peer` (each side asks for it once).
    pub fn link(&self, peer: usize, chan: u32) -> Result<Link> {
        if peer == self.rank || peer >= self.peers.len() {
            return Err(Error::usage(format!("rank {} has no channel to rank {peer}", self.rank)));
        }
        if peer < self.rank {
            let mut l = Link::connect_any(&self.peers[peer..=peer], CHANNEL_WITHIN)?;
            let mut hello = (self.rank as u32).to_le_bytes().to_vec();
            hello.extend_from_slice(&chan.to_le_bytes());
            l.send("mesh", &hello)?;
            return Ok(l);
        }
        let (map, cv) = &*self.arrived;
        let end = Instant::now() + CHANNEL_WITHIN;
        let mut m = map.lock().expect("mesh map");
        loop {
            if let Some(l) = m.remove(&(peer, chan)) {
                return Ok(l);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "rank {peer} did not open channel {chan} within {CHANNEL_WITHIN:?}"
                )));
            }
            m = cv.wait_timeout(m, left).expect("mesh map").0;
        }
    }
}

fn accept_loop(listener: TcpListener, arrived: Arrived) {
    loop {
        let Ok(mut l) = Link::accept(&listener, Duration::from_secs(3600)) else { continue };
        // A dialer that cannot name itself is not one of ours: drop it.
        let Ok(hello) = l.expect("mesh", Duration::from_secs(30)) else { continue };
        if hello.len() != 8 {
            continue;
        }
        let peer = u32::from_le_bytes(hello[..4].try_into().expect("4 bytes")) as usize;
        let chan = u32::from_le_bytes(hello[4..].try_into().expect("4 bytes"));
        let (map, cv) = &*arrived;
        map.lock().expect("mesh map").insert((peer, chan), l);
        cv.notify_all();
    }
}
