//! `churn`: connections set up and closed from several threads at once, as PyTorch's process
//! groups and `ncclCommSplit` make NCCL do. Each of `threads` threads per rank, for `rounds`
//! rounds: listen, trade handles with the same thread of the peer rank, connect and accept,
//! carry a checked stream each way, then deregister and close in a random order, with random
//! delays between every step, so one thread's close meets another's set-up. The `init`
//! contexts: `contexts=shared` (one for all threads), `thread` (one per thread) or `round`
//! (a new one per thread and round, finalized at its end).
//!
//! Parameters: threads (4), rounds (4), contexts (shared), groups (6), max_n (4),
//! max_size (65536), window (4), delay_us (2000), seed, stall_ms (30000).

use std::time::Duration;

use super::conn::{CONTROL_WITHIN, Plan, Receiver, Sender, connect_pair, context, drive};
use super::mesh::Mesh;
use super::{Rng, Scenario};
use crate::mem::Arena;
use crate::net::{Net, Plugin};
use crate::{Error, Result};

struct Params {
    threads: usize,
    rounds: usize,
    contexts: Contexts,
    groups: usize,
    max_n: usize,
    max_size: usize,
    window: usize,
    delay_us: u64,
    seed: u64,
    stall: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Contexts {
    Shared,
    Thread,
    Round,
}

pub fn run(plugin: &Plugin, mesh: &Mesh, s: &Scenario) -> Result<String> {
    if mesh.ranks() != 2 {
        return Err(Error::usage("churn runs between 2 ranks"));
    }
    let p = Params {
        threads: s.num("threads", 4)? as usize,
        rounds: s.num("rounds", 4)? as usize,
        contexts: match s.word("contexts", "shared") {
            "shared" => Contexts::Shared,
            "thread" => Contexts::Thread,
            "round" => Contexts::Round,
            o => return Err(Error::usage(format!("churn: contexts={o} (shared, thread, round)"))),
        },
        groups: s.num("groups", 6)? as usize,
        max_n: s.num("max_n", 4)? as usize,
        max_size: s.num("max_size", 65536)? as usize,
        window: (s.num("window", 4)? as usize).clamp(1, plugin.max_requests()),
        delay_us: s.num("delay_us", 2000)?,
        seed: s.num("seed", 1)?,
        stall: Duration::from_millis(s.num("stall_ms", 30_000)?),
    };
    let shared = if p.contexts == Contexts::Shared { Some(plugin.init()?) } else { None };
    let results: Vec<Result<(u64, u64)>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..p.threads)
            .map(|t| {
                let (p, shared) = (&p, shared.as_ref());
                sc.spawn(move || thread(plugin, mesh, p, t, shared).map_err(|e| context(e, &format!("thread {t}"))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::io("a thread panicked")))).collect()
    });
    let (mut msgs, mut bytes) = (0, 0);
    for r in results {
        let (m, b) = r?;
        msgs += m;
        bytes += b;
    }
    if let Some(net) = shared {
        net.finalize()?;
    }
    let left = super::abort::resources_left(plugin)?;
    if !left.is_empty() {
        return Err(Error::data(format!("after every close and finalize the plugin still holds {left}")));
    }
    Ok(format!("{} connections each way, {msgs} groups received, {bytes} bytes checked", p.threads * p.rounds))
}

fn thread(plugin: &Plugin, mesh: &Mesh, p: &Params, t: usize, shared: Option<&Net>) -> Result<(u64, u64)> {
    let peer = 1 - mesh.rank();
    let mut link = mesh.link(peer, t as u32)?;
    let own = if p.contexts == Contexts::Thread { Some(plugin.init()?) } else { None };
    let mut rng = Rng::derive(p.seed, mesh.rank() as u64, t as u64);
    let (mut msgs, mut bytes) = (0, 0);
    for round in 0..p.rounds {
        let fresh = if p.contexts == Contexts::Round { Some(plugin.init()?) } else { None };
        let net = fresh.as_ref().or(own.as_ref()).or(shared).expect("a context");
        let (m, b) = one_round(net, &mut link, p, t, round, peer, &mut rng)
            .map_err(|e| context(e, &format!("round {round}")))?;
        msgs += m;
        bytes += b;
        if let Some(net) = fresh {
            rng.pause(p.delay_us);
            net.finalize()?;
        }
        rng.pause(p.delay_us);
    }
    // Both ends of the thread's channel finish together, so the peer's last close is not
    // taken for a failure of this one's (they are independent: nothing waits on the other).
    link.send("bye", &[])?;
    link.expect("bye", CONTROL_WITHIN)?;
    if let Some(net) = own {
        net.finalize()?;
    }
    Ok((msgs, bytes))
}

fn one_round(
    net: &Net,
    link: &mut crate::link::Link,
    p: &Params,
    t: usize,
    round: usize,
    peer: usize,
    rng: &mut Rng,
) -> Result<(u64, u64)> {
    let ndev = net.devices()?;
    if ndev < 1 {
        return Err(Error::io("the plugin shows no device"));
    }
    let listen_dev = rng.range(0, ndev as u64 - 1) as i32;
    let connect_dev = rng.range(0, ndev as u64 - 1) as i32;
    let delay = p.delay_us;
    let mut pause_rng = rng.clone();
    let (send, recv) =
        connect_pair(net, link, listen_dev, connect_dev, Duration::from_secs(120), || pause_rng.pause(delay / 20))?;
    rng.pause(delay);
    // The stream this rank sends and the one it receives: both ends derive each alike,
    // from the thread, the round and the sending rank.
    let stream = |sender: usize| Rng::derive(p.seed ^ 0x5e4d, (t as u64) << 20 | round as u64, sender as u64);
    let (mut out_rng, mut in_rng) = (stream(1 - peer), stream(peer));
    let out_plan = Plan::random(&mut out_rng, p.groups, p.max_n, p.max_size, 64);
    let in_plan = Plan::random(&mut in_rng, p.groups, p.max_n, p.max_size, 64);
    let send_arena = Arena::new(out_plan.arena_len(p.window))?;
    let recv_arena = Arena::new(in_plan.arena_len(p.window))?;
    let (msgs, bytes);
    {
        let mut s = Sender::new(&send, &send_arena, &out_plan, p.window)?;
        let mut r = Receiver::new(&recv, &recv_arena, &in_plan, p.window)?;
        drive(p.stall, "stream", || {
            let a = if s.done() { false } else { s.step()? };
            let b = if r.done() { false } else { r.step()? };
            Ok((a || b, s.done() && r.done()))
        })?;
        (msgs, bytes) = (r.completed as u64, r.bytes);
        // Deregistration and close in a random order, with delays: NCCL frees a
        // connection's buffers, then closes it; the two directions go independently.
        if rng.coin() {
            s.dereg()?;
            rng.pause(p.delay_us);
            r.dereg()?;
        } else {
            r.dereg()?;
            rng.pause(p.delay_us);
            s.dereg()?;
        }
    }
    rng.pause(p.delay_us);
    if rng.coin() {
        send.close()?;
        rng.pause(p.delay_us);
        recv.close()?;
    } else {
        recv.close()?;
        rng.pause(p.delay_us);
        send.close()?;
    }
    Ok((msgs, bytes))
}
