//! `straggler`: a rank that comes late to set-up, as a slow node or a late data loader makes
//! one. Both ranks listen and trade handles at once (NCCL's bootstrap); rank 0 then calls
//! neither `connect` nor `accept` for `late_ms`, while rank 1 calls `connect` (and `accept`)
//! all along, as NCCL does until done or aborted. The set-up must complete on both sides
//! and carry a checked stream each way.
//!
//! Parameters: late_ms (3000), seed.

use std::time::{Duration, Instant};

use super::conn::{CONTROL_WITHIN, Plan, Receiver, Sender, context, drive};
use super::mesh::Mesh;
use super::{Rng, Scenario};
use crate::mem::Arena;
use crate::net::{HANDLE_BYTES, Plugin};
use crate::{Error, Result};

pub fn run(plugin: &Plugin, mesh: &Mesh, s: &Scenario) -> Result<String> {
    if mesh.ranks() != 2 {
        return Err(Error::usage("straggler runs between 2 ranks"));
    }
    let late = Duration::from_millis(s.num("late_ms", 3000)?);
    let seed = s.num("seed", 1)?;
    let (me, peer) = (mesh.rank(), 1 - mesh.rank());
    let net = plugin.init()?;
    let mut link = mesh.link(peer, 0)?;
    let mut lc = net.listen(0)?;
    link.send("handle", lc.handle())?;
    let h: [u8; HANDLE_BYTES] = link
        .expect("handle", CONTROL_WITHIN)?
        .try_into()
        .map_err(|_| Error::io("control channel: a handle of the wrong size"))?;
    if me == 0 {
        std::thread::sleep(late);
    }
    let start = Instant::now();
    let mut connector = net.connector(0, &h);
    let (mut send, mut recv, mut calls) = (None, None, 0u64);
    drive(late + Duration::from_secs(120), "connect/accept", || {
        calls += 1;
        if send.is_none() {
            send = connector.poll().map_err(|e| context(e, "connect"))?;
        }
        if recv.is_none() {
            recv = lc.accept().map_err(|e| context(e, "accept"))?;
        }
        if send.is_none() || recv.is_none() {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok((false, send.is_some() && recv.is_some()))
    })?;
    lc.close()?;
    let waited = start.elapsed();
    let (send, recv) = (send.expect("connected"), recv.expect("accepted"));
    let stream = |sender: usize| Rng::derive(seed ^ 0x57a9, sender as u64, 0);
    let out_plan = Plan::random(&mut stream(me), 8, 4, 65536, 0);
    let in_plan = Plan::random(&mut stream(peer), 8, 4, 65536, 0);
    let (sa, ra) = (Arena::new(out_plan.arena_len(4))?, Arena::new(in_plan.arena_len(4))?);
    let bytes;
    {
        let mut sd = Sender::new(&send, &sa, &out_plan, 4)?;
        let mut rv = Receiver::new(&recv, &ra, &in_plan, 4)?;
        drive(Duration::from_secs(30), "the stream", || {
            let a = if sd.done() { false } else { sd.step()? };
            let b = if rv.done() { false } else { rv.step()? };
            Ok((a || b, sd.done() && rv.done()))
        })?;
        bytes = rv.bytes;
        sd.dereg()?;
        rv.dereg()?;
    }
    link.send("bye", &[])?;
    link.expect("bye", CONTROL_WITHIN)?;
    send.close()?;
    recv.close()?;
    net.finalize()?;
    let role = if me == 0 { format!("late by {late:?}") } else { "on time".into() };
    Ok(format!("{role}: set-up done after {waited:?} and {calls} calls; {bytes} bytes checked"))
}
