//! `teardown`: ranks that leave independently, as every NCCL job ends (`ncclCommDestroy`
//! does not synchronize the ranks). A ring: each rank sends a stream of grouped sends to the
//! next rank and receives one from the previous, from one thread, as NCCL's proxy does. A
//! rank deregisters and closes its receive comm as soon as its last receive is checked;
//! its upstream peer does not test its last `hold` sends until it heard of that close, then
//! waits `wait_ms` more (idle-rail probes and keepalives fire meanwhile), and then every one
//! of those tests must report the send done with its size: a request that completed stays
//! completed, whatever its peer did next.
//!
//! `conns=K`: K connections to the next rank, all accepted by one listen comm (NCCL may
//! accept several connections on one); a rank closes all its receive comms once all their
//! last receives are checked.
//!
//! Parameters: conns (1), groups (24), max_n (8), max_size (131072), window (8), hold (0 =
//! random 1 … 8, per connection), wait_ms (0 = random 0 … 40), seed, stall_ms (30000).

use std::time::Duration;

use super::conn::{CONTROL_WITHIN, Plan, Receiver, Sender, context, drive};
use super::mesh::Mesh;
use super::{Rng, Scenario};
use crate::mem::Arena;
use crate::net::{HANDLE_BYTES, Plugin};
use crate::{Error, Result};

pub fn run(plugin: &Plugin, mesh: &Mesh, s: &Scenario) -> Result<String> {
    let n = mesh.ranks();
    if n < 2 {
        return Err(Error::usage("teardown needs 2 or more ranks"));
    }
    let (me, next, prev) = (mesh.rank(), (mesh.rank() + 1) % n, (mesh.rank() + n - 1) % n);
    let seed = s.num("seed", 1)?;
    let window = (s.num("window", 8)? as usize).clamp(1, plugin.max_requests());
    let stall = Duration::from_millis(s.num("stall_ms", 30_000)?);
    let mut rng = Rng::derive(seed, me as u64, 1);
    let hold = match s.num("hold", 0)? {
        0 => rng.range(1, 8) as usize,
        h => h as usize,
    };
    let wait = Duration::from_millis(match s.num("wait_ms", 0)? {
        0 => rng.range(0, 40),
        w => w,
    });
    // The connections from rank s to rank s + 1 use channel s on both ends.
    let conns = (s.num("conns", 1)? as usize).max(1);
    let mut out_link = mesh.link(next, me as u32)?;
    let mut in_link = mesh.link(prev, prev as u32)?;
    let net = plugin.init()?;
    // One listen comm accepts all `conns` connections from the previous rank.
    let (sends, recvs) = {
        let mut lc = net.listen(0)?;
        in_link.send("handle", lc.handle())?;
        let h: [u8; HANDLE_BYTES] = out_link
            .expect("handle", CONTROL_WITHIN)?
            .try_into()
            .map_err(|_| Error::io("control channel: a handle of the wrong size"))?;
        let mut connectors: Vec<_> = (0..conns).map(|_| net.connector(0, &h)).collect();
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        let mut sent: Vec<Option<_>> = (0..conns).map(|_| None).collect();
        drive(Duration::from_secs(120), "connect/accept", || {
            for (c, slot) in connectors.iter_mut().zip(sent.iter_mut()) {
                if slot.is_none() {
                    *slot = c.poll().map_err(|e| context(e, "connect"))?;
                }
            }
            if recvs.len() < conns
                && let Some(r) = lc.accept().map_err(|e| context(e, "accept"))?
            {
                recvs.push(r);
            }
            Ok((false, sent.iter().all(Option::is_some) && recvs.len() == conns))
        })?;
        lc.close()?;
        sends.extend(sent.into_iter().map(|s| s.expect("connected")));
        (sends, recvs)
    };
    let groups = s.num("groups", 24)? as usize;
    let (max_n, max_size) = (s.num("max_n", 8)? as usize, s.num("max_size", 131_072)? as usize);
    // Every connection from rank s carries the same stream: the receiver cannot tell its
    // accepted comms apart.
    let stream = |sender: usize| Rng::derive(seed ^ 0x7ea5, sender as u64, 0);
    let out_plan = Plan::random(&mut stream(me), groups, max_n, max_size, 32);
    let in_plan = Plan::random(&mut stream(prev), groups, max_n, max_size, 32);
    let send_arenas = (0..conns).map(|_| Arena::new(out_plan.arena_len(window))).collect::<Result<Vec<_>>>()?;
    let recv_arenas = (0..conns).map(|_| Arena::new(in_plan.arena_len(window))).collect::<Result<Vec<_>>>()?;
    let mut senders = sends
        .iter()
        .zip(&send_arenas)
        .map(|(c, a)| Sender::new(c, a, &out_plan, window))
        .collect::<Result<Vec<_>>>()?;
    for s in &mut senders {
        s.hold_last(hold);
    }
    let mut received = (0, 0);
    {
        let mut rs = recvs
            .iter()
            .zip(&recv_arenas)
            .map(|(c, a)| Receiver::new(c, a, &in_plan, window))
            .collect::<Result<Vec<_>>>()?;
        drive(stall, "the streams", || {
            let mut moved = false;
            for s in &mut senders {
                moved |= s.step()?;
            }
            for r in rs.iter_mut().filter(|r| !r.done()) {
                moved |= r.step()?;
            }
            Ok((moved, rs.iter().all(Receiver::done)))
        })?;
        for r in rs {
            received = (received.0 + r.completed, received.1 + r.bytes);
            r.dereg()?;
        }
    }
    // The last receives are checked: this rank leaves its receive comms at once.
    for r in recvs {
        r.close()?;
    }
    in_link.send("closed", &[])?;
    drive(stall, "the sends not held", || {
        let mut moved = false;
        for s in &mut senders {
            moved |= s.step()?;
        }
        Ok((moved, senders.iter().all(Sender::done_but_held)))
    })?;
    let held: usize = senders.iter().map(Sender::in_flight).sum();
    out_link.expect("closed", CONTROL_WITHIN)?;
    std::thread::sleep(wait);
    for s in &mut senders {
        s.release();
    }
    drive(stall, "the held sends after the peer closed", || {
        let mut moved = false;
        for s in senders.iter_mut().filter(|s| !s.done()) {
            moved |= s.step()?;
        }
        Ok((moved, senders.iter().all(Sender::done)))
    })?;
    for s in senders {
        s.dereg()?;
    }
    for s in sends {
        s.close()?;
    }
    // Both neighbours are done with this rank's comms before it finalizes.
    out_link.send("bye", &[])?;
    in_link.expect("bye", CONTROL_WITHIN)?;
    net.finalize()?;
    let left = super::abort::resources_left(plugin)?;
    if !left.is_empty() {
        return Err(Error::data(format!("after every close and finalize the plugin still holds {left}")));
    }
    Ok(format!(
        "{conns} connection(s) each way; {} receives ({} bytes) checked; {} sends done, {held} of them tested after \
         the peer closed (+{wait:?})",
        received.0,
        received.1,
        conns * out_plan.sends()
    ))
}
