//! Where a connection is, as an operator looks for it: per rail the NIC and port
//! (`mlx5_3:1`, `soft-sout:1`), the local and the peer address (GID on verbs, `IP:port` on
//! the soft fabric) and QP numbers, and the NCCL communicator. Built when the comm is set up,
//! refreshed when a rail's QPs are rebuilt (re-admission). The engine writes a rail's place
//! at the end of its log lines about that rail and the connection's after the errors it
//! reports ([`Place`]); the hang reports start with it.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use super::rail::Rail;
use crate::engine::{Place, RAIL_NAMES, RAILS};
use crate::fabric::{Device, QueuePair};
use crate::telemetry::StatsPlace;

/// One rail of a connection, as text made at set-up (no work when nothing is logged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct RailPlace {
    /// `name:port` of the rail's NIC.
    nic: String,
    local: String,
    peer: String,
    qps: Vec<u32>,
    peer_qps: Vec<u32>,
}

impl RailPlace {
    fn of<D: Device>(r: &Rail<D>) -> RailPlace {
        let a = r.dev.attrs();
        RailPlace {
            nic: format!("{}:{}", a.name, a.port),
            local: r.qps.first().map_or_else(|| "no QP".into(), |q| D::address_of(&q.local_info())),
            peer: r.peer.first().map_or_else(|| "no peer".into(), |i| D::address_of(i)),
            qps: r.qps.iter().map(|q| q.qp_num()).collect(),
            peer_qps: r.peer.iter().map(|i| i.qp_num()).collect(),
        }
    }
}

/// Where each rail's statistics are grouped in the per-NIC and per-peer views: the rail's
/// NIC and the peer's address on it, as the log lines name them.
pub fn stats_places<D: Device>(rails: &[Rail<D>; RAILS]) -> [StatsPlace; RAILS] {
    std::array::from_fn(|r| {
        let p = RailPlace::of(&rails[r]);
        StatsPlace::new(&p.nic, &p.peer)
    })
}

/// QP numbers as `QP 18` or `QPs 18,19` (decimal, as the fabrics' own lines and net_ib's).
struct Qps<'a>(&'a [u32]);

impl fmt::Display for Qps<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.len() == 1 { "QP " } else { "QPs " })?;
        for (i, q) in self.0.iter().enumerate() {
            write!(f, "{}{q}", if i > 0 { "," } else { "" })?;
        }
        Ok(())
    }
}

impl fmt::Display for RailPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {} -> peer {} {}", self.nic, self.local, Qps(&self.qps), self.peer, Qps(&self.peer_qps))
    }
}

/// Where one connection is: its side, its communicator and its rails.
#[derive(Debug)]
pub struct ConnPlace {
    /// `send` or `recv`.
    side: &'static str,
    /// NCCL's communicator id (ABI v11+ contexts), 0 when NCCL gave none.
    comm_id: u64,
    rails: Mutex<[RailPlace; RAILS]>,
}

impl ConnPlace {
    pub fn new<D: Device>(side: &'static str, comm_id: u64, rails: &[Rail<D>; RAILS]) -> Arc<ConnPlace> {
        Arc::new(ConnPlace { side, comm_id, rails: Mutex::new(std::array::from_fn(|r| RailPlace::of(&rails[r]))) })
    }

    /// `rail`'s QPs were rebuilt or connected anew (re-admission).
    pub fn refresh<D: Device>(&self, rail: usize, r: &Rail<D>) {
        self.rails.lock()[rail] = RailPlace::of(r);
    }

    /// ` [the place of rail]`, for the end of a log line.
    pub fn at(&self, rail: usize) -> RailAt<'_> {
        RailAt(self, rail)
    }

    fn comm(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} comm", self.side)?;
        if self.comm_id != 0 {
            write!(f, " of NCCL comm {:#x}", self.comm_id)?;
        }
        Ok(())
    }
}

impl Place for ConnPlace {
    fn rail(&self, rail: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; ", self.rails.lock()[rail])?;
        self.comm(f)
    }
    fn conn(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// ` [the place of a rail]` ([`ConnPlace::at`]).
pub struct RailAt<'a>(&'a ConnPlace, usize);

impl fmt::Display for RailAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(" [")?;
        self.0.rail(self.1, f)?;
        f.write_str("]")
    }
}

/// The whole connection: `SOUT mlx5_0:1 … -> peer …; SUP …; send comm of NCCL comm 0x…`.
impl fmt::Display for ConnPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rails = self.rails.lock().clone();
        for (r, p) in rails.iter().enumerate() {
            write!(f, "{} {p}; ", RAIL_NAMES[r])?;
        }
        self.comm(f)
    }
}
