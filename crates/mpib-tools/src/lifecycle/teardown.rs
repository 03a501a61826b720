//! `teardown`: ranks that leave independently, as every NCCL job ends (`ncclCommDestroy`
//! does not synchronize the ranks). A ring: each rank sends a stream of grouped sends to the
//! next rank and receives one from the previous, from one thread, as NCCL's proxy does. A
//! rank deregisters and closes its receive comm as soon as its last receive is checked;
//! its upstream peer does not test its last `hold` sends until it heard of that close, then
//! waits `wait_ms` more (idle-rail probes and keepalives fire meanwhile), and then every one
//! of those tests must report the send done with its size: a request that completed stays
//! completed, whatever its peer did next.
//!
//! Parameters: groups (24), max_n (8), max_size (131072), window (8), hold (0 = random
//! 1 … 8), wait_ms (0 = random 0 … 40), seed, stall_ms (30000).

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
    // The connection from rank s to rank s + 1 uses channel s on both ends.
    let mut out_link = mesh.link(next, me as u32)?;
    let mut in_link = mesh.link(prev, prev as u32)?;
    let net = plugin.init()?;
    let (send, recv) = {
        let mut lc = net.listen(0)?;
        in_link.send("handle", lc.handle())?;
        let h: [u8; HANDLE_BYTES] = out_link
            .expect("handle", CONTROL_WITHIN)?
            .try_into()
            .map_err(|_| Error::io("control channel: a handle of the wrong size"))?;
        let mut connector = net.connector(0, &h);
        let (mut send, mut recv) = (None, None);
        drive(Duration::from_secs(120), "connect/accept", || {
            if send.is_none() {
                send = connector.poll().map_err(|e| context(e, "connect"))?;
            }
            if recv.is_none() {
                recv = lc.accept().map_err(|e| context(e, "accept"))?;
            }
            Ok((false, send.is_some() && recv.is_some()))
        })?;
        lc.close()?;
        (send.expect("connected"), recv.expect("accepted"))
    };
    let stream = |sender: usize| Rng::derive(seed ^ 0x7ea5, sender as u64, 0);
    let groups = s.num("groups", 24)? as usize;
    let (max_n, max_size) = (s.num("max_n", 8)? as usize, s.num("max_size", 131_072)? as usize);
    let out_plan = Plan::random(&mut stream(me), groups, max_n, max_size, 32);
    let in_plan = Plan::random(&mut stream(prev), groups, max_n, max_size, 32);
    let send_arena = Arena::new(out_plan.arena_len(window))?;
    let recv_arena = Arena::new(in_plan.arena_len(window))?;
    let mut sender = Sender::new(&send, &send_arena, &out_plan, window)?;
    sender.hold_last(hold);
    let received;
    {
        let mut r = Receiver::new(&recv, &recv_arena, &in_plan, window)?;
        drive(stall, "the streams", || {
            let a = sender.step()?;
            let b = r.step()?;
            Ok((a || b, r.done()))
        })?;
        received = (r.completed, r.bytes);
        r.dereg()?;
    }
    // The last receive is checked: this rank leaves the connection at once.
    recv.close()?;
    in_link.send("closed", &[])?;
    drive(stall, "the sends not held", || Ok((sender.step()?, sender.done_but_held())))?;
    let held = sender.in_flight();
    out_link.expect("closed", CONTROL_WITHIN)?;
    std::thread::sleep(wait);
    sender.release();
    drive(stall, "the held sends after the peer closed", || Ok((sender.step()?, sender.done())))?;
    sender.dereg()?;
    send.close()?;
    // Both neighbours are done with this rank's comms before it finalizes.
    out_link.send("bye", &[])?;
    in_link.expect("bye", CONTROL_WITHIN)?;
    net.finalize()?;
    let left = super::abort::resources_left(plugin)?;
    if !left.is_empty() {
        return Err(Error::data(format!("after every close and finalize the plugin still holds {left}")));
    }
    Ok(format!(
        "{} receives ({} bytes) checked; {} sends done, {held} of them tested after the peer closed (+{wait:?})",
        received.0,
        received.1,
        out_plan.sends()
    ))
}
