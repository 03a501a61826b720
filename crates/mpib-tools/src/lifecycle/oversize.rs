//! `oversize`: sends larger than the receive posted for them, NCCL's "collective mismatch"
//! (a user's error). Rank 1 sends to rank 0. Rank 0 posts one receive of `size` bytes; rank
//! 1 tries `count` sends of `size + 1 …` bytes: each must fail (its own call reports an
//! error), and none may take the receive. Then a send of `size` bytes completes it, checked:
//! the connection goes on. How many WARN lines that cost is for the parent to count.
//!
//! Parameters: count (1000), size (4096), seed.

use std::time::Duration;

use super::conn::{CONTROL_WITHIN, Plan, Receiver, Sender, connect_pair, context, drive};
use super::mesh::Mesh;
use super::{Rng, Scenario};
use crate::mem::Arena;
use crate::net::{Plugin, RecvBuf};
use crate::{Error, ErrorKind, Result};

pub fn run(plugin: &Plugin, mesh: &Mesh, s: &Scenario) -> Result<String> {
    if mesh.ranks() != 2 {
        return Err(Error::usage("oversize runs between 2 ranks"));
    }
    let count = s.num("count", 1000)? as usize;
    let size = s.num("size", 4096)? as usize;
    let seed = s.num("seed", 1)?;
    let net = plugin.init()?;
    let mut link = mesh.link(1 - mesh.rank(), 0)?;
    let (send, recv) = connect_pair(&net, &mut link, 0, 0, Duration::from_secs(120), || {})?;
    let stall = Duration::from_secs(30);
    let summary = if mesh.rank() == 0 {
        let arena = Arena::new(2 * size + 4096)?;
        let mr = recv.reg_mr(&arena)?;
        let mut req = None;
        drive(stall, "irecv", || {
            req = recv.irecv(&[RecvBuf { mr: &mr, off: 0, len: size, tag: 7 }])?;
            Ok((false, req.is_some()))
        })?;
        let mut req = req.expect("posted");
        let mut sizes = None;
        drive(stall, "the receive", || {
            sizes = req.test().map_err(|e| context(e, "test of the receive"))?;
            Ok((false, sizes.is_some()))
        })?;
        let got = sizes.expect("done");
        if got.as_slice() != [size as i32] {
            return Err(Error::data(format!("the receive reported {:?}, the right send had {size}", got.as_slice())));
        }
        // SAFETY: the receive is done.
        let c = crate::pattern::verify(unsafe { arena.bytes(0, size) }, crate::pattern::key(seed, 9, 0, 0));
        if c.wrong != 0 {
            return Err(Error::data(format!("{} wrong bytes in the receive", c.wrong)));
        }
        mr.dereg()?;
        format!("the receive of {size} bytes got the right send, checked")
    } else {
        let arena = Arena::new(2 * size + 4096)?;
        let mr = send.reg_mr(&arena)?;
        // SAFETY: no request uses the arena yet.
        crate::pattern::fill(unsafe { arena.bytes_mut(0, size) }, crate::pattern::key(seed, 9, 0, 0), size);
        let mut refused = 0;
        let mut rng = Rng::new(seed);
        while refused < count {
            let len = size + rng.range(1, size as u64) as usize;
            match send.isend(&mr, 0, len, 7) {
                Ok(None) => std::hint::spin_loop(),
                Ok(Some(_)) => return Err(Error::data(format!("an isend of {len} bytes took a {size}-byte receive"))),
                Err(e) if e.kind == ErrorKind::Call && e.code == crate::code::INVALID_USAGE => refused += 1,
                Err(e) => return Err(context(e, "an oversized isend failed otherwise than with ncclInvalidUsage")),
            }
        }
        let mut req = None;
        drive(stall, "the right isend", || {
            req = send.isend(&mr, 0, size, 7)?;
            Ok((false, req.is_some()))
        })?;
        let mut req = req.expect("posted");
        let mut sizes = None;
        drive(stall, "the right send", || {
            sizes = req.test()?;
            Ok((false, sizes.is_some()))
        })?;
        mr.dereg()?;
        format!("{refused} oversized sends refused with ncclInvalidUsage, then the right one done")
    };
    // A short stream both ways: the connection is healthy.
    let stream = |sender: usize| Rng::derive(seed, sender as u64, 3);
    let out_plan = Plan::random(&mut stream(mesh.rank()), 8, 4, 8192, 0);
    let in_plan = Plan::random(&mut stream(1 - mesh.rank()), 8, 4, 8192, 0);
    let (sa, ra) = (Arena::new(out_plan.arena_len(4))?, Arena::new(in_plan.arena_len(4))?);
    {
        let mut sd = Sender::new(&send, &sa, &out_plan, 4)?;
        let mut rv = Receiver::new(&recv, &ra, &in_plan, 4)?;
        drive(stall, "the stream after", || {
            let a = if sd.done() { false } else { sd.step()? };
            let b = if rv.done() { false } else { rv.step()? };
            Ok((a || b, sd.done() && rv.done()))
        })?;
        sd.dereg()?;
        rv.dereg()?;
    }
    link.send("bye", &[])?;
    link.expect("bye", CONTROL_WITHIN)?;
    send.close()?;
    recv.close()?;
    net.finalize()?;
    Ok(summary)
}
