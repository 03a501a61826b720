//! `abort`: a connection closed with requests in flight, as `ncclCommAbort` closes it, while
//! a second connection between the same two ranks carries a checked stream throughout.
//!
//! Connection X carries traffic both ways, many requests in flight; at a random moment
//! (`abort_max_ms`) a rank deregisters its buffers and closes both comms without testing
//! what is outstanding (`who=both`: each rank at its own moment; `who=0` or `who=1`: only
//! that rank, the other drives X until it sees an error, which must come within
//! `stall_ms`). After its abort a rank fills the deregistered receive memory with a canary
//! and checks, after a while, that nothing wrote into it. Connection Y's stream, in rounds,
//! goes on until both ranks are past their abort and one round more: every byte checked,
//! no error. At the end the plugin must hold nothing (resource counters at zero).
//!
//! Closing X must return promptly (`close_within_ms`, 1000), as NCCL's abort waits for it.
//!
//! Parameters: who (both), abort_max_ms (50), max_size (262144), window (8), groups (8, per
//! Y round), seed, stall_ms (20000), after_ms (300: the canary's watch), close_within_ms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::conn::{CONTROL_WITHIN, Plan, Receiver, Sender, connect_pair, context, drive};
use super::mesh::Mesh;
use super::{Rng, Scenario};
use crate::mem::Arena;
use crate::net::{Net, Plugin};
use crate::pattern::{CANARY, canary_broken};
use crate::{Error, ErrorKind, Result};

struct Params {
    who: Option<usize>,
    abort_max_ms: u64,
    max_size: usize,
    window: usize,
    groups: usize,
    seed: u64,
    stall: Duration,
    after: Duration,
    close_within: Duration,
}

pub fn run(plugin: &Plugin, mesh: &Mesh, s: &Scenario) -> Result<String> {
    if mesh.ranks() != 2 {
        return Err(Error::usage("abort runs between 2 ranks"));
    }
    let p = Params {
        who: match s.word("who", "both") {
            "both" => None,
            w => Some(w.parse().map_err(|_| Error::usage(format!("abort: who={w} (both, 0, 1)")))?),
        },
        abort_max_ms: s.num("abort_max_ms", 50)?,
        max_size: s.num("max_size", 262_144)? as usize,
        window: (s.num("window", 8)? as usize).clamp(1, plugin.max_requests()),
        groups: s.num("groups", 8)? as usize,
        seed: s.num("seed", 1)?,
        stall: Duration::from_millis(s.num("stall_ms", 20_000)?),
        after: Duration::from_millis(s.num("after_ms", 300)?),
        close_within: Duration::from_millis(s.num("close_within_ms", 1000)?),
    };
    let net = plugin.init()?;
    let x_done = AtomicBool::new(false);
    let (x, y) = std::thread::scope(|sc| {
        let y = sc.spawn(|| survivor(&net, mesh, &p, &x_done).map_err(|e| context(e, "connection Y")));
        let x = aborted(&net, mesh, &p).map_err(|e| context(e, "connection X"));
        x_done.store(true, Ordering::Release);
        (x, y.join().unwrap_or_else(|_| Err(Error::io("connection Y's thread panicked"))))
    });
    let (x, y) = (x?, y?);
    net.finalize()?;
    let left = resources_left(plugin)?;
    if !left.is_empty() {
        return Err(Error::data(format!("after the abort, every close and finalize the plugin still holds {left}")));
    }
    Ok(format!("X: {x}; Y: {y}"))
}

/// Connection X: traffic, then the abort at this rank's moment (or at the first error).
fn aborted(net: &Net, mesh: &Mesh, p: &Params) -> Result<String> {
    let (me, peer) = (mesh.rank(), 1 - mesh.rank());
    let mut link = mesh.link(peer, 1)?;
    let mut rng = Rng::derive(p.seed, me as u64, 7);
    let (send, recv) = connect_pair(net, &mut link, 0, 0, Duration::from_secs(120), || {})?;
    // Both ranks start X's traffic together, so the moments are measured from one start.
    link.send("go", &[])?;
    link.expect("go", CONTROL_WITHIN)?;
    let aborts = p.who.is_none_or(|w| w == me);
    let at = Duration::from_millis(rng.range(0, p.abort_max_ms));
    let stream = |sender: usize| Rng::derive(p.seed ^ 0xab, sender as u64, 0);
    // More than can finish before the abort.
    let out_plan = Plan::random(&mut stream(me), 100_000, 8, p.max_size, 0);
    let in_plan = Plan::random(&mut stream(peer), 100_000, 8, p.max_size, 0);
    let send_arena = Arena::new(out_plan.arena_len(p.window))?;
    let recv_arena = Arena::new(in_plan.arena_len(p.window))?;
    let start = Instant::now();
    let mut seen_error = None;
    let summary;
    {
        let mut s = Sender::new(&send, &send_arena, &out_plan, p.window)?;
        let mut r = Receiver::new(&recv, &recv_arena, &in_plan, p.window)?;
        let r_drive = drive(p.stall, "X's stream", || {
            if aborts && start.elapsed() >= at {
                return Ok((true, true));
            }
            let a = s.step()?;
            let b = r.step()?;
            Ok((a || b, false))
        });
        match r_drive {
            Ok(()) => {}
            // What a peer's abort may cause: a call's error code. A wrong byte, a broken
            // contract or a hang is a failure.
            Err(e) if e.kind == ErrorKind::Call => seen_error = Some((start.elapsed(), e)),
            Err(e) => return Err(e),
        }
        if !aborts && seen_error.is_none() {
            return Err(Error::data("the peer aborted X, yet no call here reported an error"));
        }
        summary = format!(
            "{} sends and {} receives done, {} and {} in flight at the abort after {:?}{}, closed in",
            s.completed,
            r.completed,
            s.in_flight(),
            r.in_flight(),
            start.elapsed(),
            seen_error.as_ref().map_or(String::new(), |(t, e)| format!(" (an error after {t:?}: {e})"))
        );
        // NCCL's order: buffers deregistered, then the comms closed; requests left untested.
        if rng.coin() {
            s.dereg()?;
            r.dereg()?;
        } else {
            r.dereg()?;
            s.dereg()?;
        }
    }
    // SAFETY: the receive memory is deregistered: the plugin may no longer write it.
    unsafe { recv_arena.bytes_mut(0, recv_arena.len()) }.fill(CANARY);
    let closing = Instant::now();
    if rng.coin() {
        send.close()?;
        recv.close()?;
    } else {
        recv.close()?;
        send.close()?;
    }
    let closed_in = closing.elapsed();
    if closed_in > p.close_within {
        return Err(Error::timeout(format!("closing X with requests in flight took {closed_in:?}")));
    }
    std::thread::sleep(p.after);
    // SAFETY: as above; nothing of ours writes it either.
    if let Some(at) = canary_broken(unsafe { recv_arena.bytes(0, recv_arena.len()) }) {
        return Err(Error::data(format!("byte {at} of X's receive memory was written after its deregistration")));
    }
    Ok(format!("{summary} {closed_in:?}"))
}

/// Connection Y: a checked stream in rounds until both ranks are done with X, and one more.
fn survivor(net: &Net, mesh: &Mesh, p: &Params, x_done: &AtomicBool) -> Result<String> {
    let (me, peer) = (mesh.rank(), 1 - mesh.rank());
    let mut link = mesh.link(peer, 0)?;
    let (send, recv) = connect_pair(net, &mut link, 0, 0, Duration::from_secs(120), || {})?;
    let (mut rounds, mut groups, mut bytes, mut last) = (0u64, 0u64, 0u64, false);
    loop {
        let stream = |sender: usize| Rng::derive(p.seed ^ 0x5a, sender as u64, rounds);
        let out_plan = Plan::random(&mut stream(me), p.groups, 8, p.max_size, 16);
        let in_plan = Plan::random(&mut stream(peer), p.groups, 8, p.max_size, 16);
        let send_arena = Arena::new(out_plan.arena_len(p.window))?;
        let recv_arena = Arena::new(in_plan.arena_len(p.window))?;
        let mut s = Sender::new(&send, &send_arena, &out_plan, p.window)?;
        let mut r = Receiver::new(&recv, &recv_arena, &in_plan, p.window)?;
        drive(p.stall, "Y's stream", || {
            let a = if s.done() { false } else { s.step()? };
            let b = if r.done() { false } else { r.step()? };
            Ok((a || b, s.done() && r.done()))
        })
        .map_err(|e| context(e, &format!("round {rounds}")))?;
        groups += r.completed as u64;
        bytes += r.bytes;
        s.dereg()?;
        r.dereg()?;
        rounds += 1;
        if last {
            break;
        }
        // Both ranks decide from the same two flags (the ones sent).
        let mine = x_done.load(Ordering::Acquire);
        link.send("x-done", &[mine as u8])?;
        let theirs = link.expect("x-done", CONTROL_WITHIN)?;
        last = mine && theirs.first() == Some(&1);
    }
    send.close()?;
    recv.close()?;
    Ok(format!("{rounds} rounds, {groups} receives, {bytes} bytes checked, no error"))
}

/// What the plugin still holds (`mpib_resource_stats`), in words; empty when nothing.
pub fn resources_left(plugin: &Plugin) -> Result<String> {
    let Some(r) = plugin.resource_stats()? else { return Ok(String::new()) };
    let mut left = Vec::new();
    let older_abi = plugin.version() < 11;
    for (name, v) in [
        ("contexts", if older_abi { 0 } else { r.contexts }),
        ("send comms", r.send_comms),
        ("receive comms", r.recv_comms),
        ("listen comms", r.listen_comms),
        ("NIC queue sets", r.nic_queues),
        ("CQs", r.cqs),
        ("SRQs", r.srqs),
        ("QPs", r.qps),
        ("control bytes", r.control_bytes),
        ("inbox entries", r.inbox_entries),
    ] {
        if v != 0 {
            left.push(format!("{v} {name}"));
        }
    }
    Ok(left.join(", "))
}
