//! Models of the soft fabric's lock-free parts for the `loom` model checker, which runs each
//! one under every interleaving (and every value a load may return under the C11 memory
//! model) its threads allow: the spin lock, the CQ ring (producers, the consumer, growth,
//! reservations; the SPSC ring under it has models of its own in `sync/spsc.rs`) and the
//! key table's gate (a pin racing a deregistration, a registration racing a pin of its new
//! key). Built only with `--cfg loom`, where `crate::sync` hands the ring, spin.rs and
//! mr.rs loom's atomics and cells:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --lib loom_models
//! ```
//!
//! (`sync/model.rs` says how the ring models are built so that loom can see a bug.)
//!
//! Each model checks what a wrong ordering would break: loom fails a model when a cell is
//! accessed by two threads that no happens-before orders (a race), or when an assertion
//! fails in some interleaving.

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use super::mr::MrTable;
use super::ring::CqRing;
use super::spin::SpinMutex;
use crate::fabric::{Access, Completion};
use crate::sync::model::{model, wait_for};

/// A thread and the main one each add 1 through the lock to a counter that is not atomic:
/// both additions count, and loom sees no two accesses unordered. (Two threads: with a
/// third, loom's scheduler can pass the turn between two waiters for ever while the holder
/// never runs, and stops the model as a livelock.)
#[test]
fn loom_spin_lock_excludes() {
    model(|| {
        let m = Arc::new(SpinMutex::new(UnsafeCell::new(0u32)));
        let add = |m: &SpinMutex<UnsafeCell<u32>>| {
            let g = m.lock();
            // SAFETY: the lock is held: loom checks no other access overlaps this one.
            g.with_mut(|v| unsafe { *v += 1 });
        };
        let t = {
            let m = m.clone();
            thread::spawn(move || add(&m))
        };
        add(&m);
        t.join().unwrap();
        // SAFETY: the lock is held.
        let total = m.lock().with(|v| unsafe { *v });
        assert_eq!(total, 2);
    });
}

/// A completion whose every field is derived from `id`, so a torn copy shows.
fn completion(id: u64) -> Completion {
    Completion { wr_id: id, byte_len: id as u32 * 3, imm: !(id as u32), qp_num: id as u32 + 7, ..Completion::default() }
}

/// Pushes `ids` in order, each once, until the ring is full; returns those pushed.
fn produce(r: &CqRing, ids: &[u64]) -> Vec<u64> {
    ids.iter().copied().take_while(|&id| r.lock().push(completion(id))).collect()
}

/// Pops what is there into `got`, checking each completion is whole.
fn pop(r: &CqRing, got: &mut Vec<u64>) {
    let mut out = [Completion::default(); 4];
    // SAFETY: the calling thread is the ring's only consumer.
    let n = unsafe { r.pop_into(&mut out) };
    for c in &out[..n] {
        assert_eq!(*c, completion(c.wr_id), "a torn completion");
        got.push(c.wr_id);
    }
}

/// Pops until the ring is empty (the producers are done).
fn drain(r: &CqRing, got: &mut Vec<u64>) {
    loop {
        let before = got.len();
        pop(r, got);
        if got.len() == before {
            return;
        }
    }
}

/// One producer pushes into a ring of depth 1 while the consumer pops, grows it to 4 and
/// pops again: every completion pushed comes out once, whole, in order, and none that was
/// not pushed; the grown ring holds 4.
#[test]
fn loom_ring_producer_consumer_and_growth() {
    model(|| {
        let r = Arc::new(CqRing::new(1));
        let pushed = Arc::new(AtomicUsize::new(0));
        let p = {
            let (r, pushed) = (r.clone(), pushed.clone());
            thread::spawn(move || {
                let mut done = produce(&r, &[1]);
                pushed.store(1, Ordering::Relaxed);
                done.extend(produce(&r, &[2, 3]));
                pushed.store(2, Ordering::Relaxed);
                done
            })
        };
        let mut got = Vec::new();
        pop(&r, &mut got);
        wait_for(&pushed, 1);
        // SAFETY: this thread is the only consumer, not inside `pop_into`.
        unsafe { r.grow(4) };
        pop(&r, &mut got);
        wait_for(&pushed, 2);
        pop(&r, &mut got);
        let pushed = p.join().unwrap();
        drain(&r, &mut got);
        assert_eq!(got, pushed);
        assert_eq!(produce(&r, &[4, 5, 6, 7, 8]), [4, 5, 6, 7], "room for 4 after growing");
    });
}

/// Two producers share a ring (the producers' lock): every completion comes once, whole,
/// each producer's in its order.
#[test]
fn loom_ring_two_producers() {
    model(|| {
        let r = Arc::new(CqRing::new(4));
        let pushed = Arc::new(AtomicUsize::new(0));
        let ps: Vec<_> = [[10, 11], [20, 21]]
            .into_iter()
            .map(|ids| {
                let (r, pushed) = (r.clone(), pushed.clone());
                thread::spawn(move || {
                    assert_eq!(produce(&r, &ids), ids, "room for all");
                    pushed.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        let mut got = Vec::new();
        pop(&r, &mut got);
        wait_for(&pushed, 1);
        pop(&r, &mut got);
        for p in ps {
            p.join().unwrap();
        }
        drain(&r, &mut got);
        for base in [10, 20] {
            let mine: Vec<u64> = got.iter().copied().filter(|id| id / 10 == base / 10).collect();
            assert_eq!(mine, [base, base + 1], "all of {base}'s, in order: {got:?}");
        }
    });
}

/// A reserved slot is room for its completion whatever the consumer does meanwhile, and
/// is not room for another.
#[test]
fn loom_ring_reserved_slot() {
    model(|| {
        let r = Arc::new(CqRing::new(2));
        let p = {
            let r = r.clone();
            thread::spawn(move || {
                assert!(r.lock().reserve());
                let pushed = produce(&r, &[1, 2]);
                r.lock().push_reserved(completion(3));
                pushed
            })
        };
        let mut got = Vec::new();
        pop(&r, &mut got);
        let mut pushed = p.join().unwrap();
        assert!(!pushed.is_empty(), "room for one besides the reserved slot");
        drain(&r, &mut got);
        pushed.push(3);
        assert_eq!(got, pushed);
    });
}

/// A producer holds a reserved slot while the consumer grows the ring from 2 to 4: the
/// reservation stays one across the growth (the limit grows by the slots added), so the
/// reserved completion always finds its slot, and every completion comes out once, in
/// order; afterwards the ring holds 4.
#[test]
fn loom_ring_reservation_races_growth() {
    model(|| {
        let r = Arc::new(CqRing::new(2));
        let p = {
            let r = r.clone();
            thread::spawn(move || {
                assert!(r.lock().reserve());
                let pushed = produce(&r, &[1, 2, 3, 4]);
                r.lock().push_reserved(completion(9));
                pushed
            })
        };
        // SAFETY: this thread is the only consumer, not inside `pop_into`.
        unsafe { r.grow(4) };
        let mut got = Vec::new();
        pop(&r, &mut got);
        let mut pushed = p.join().unwrap();
        assert!(!pushed.is_empty(), "room for one besides the reserved slot");
        drain(&r, &mut got);
        pushed.push(9);
        assert_eq!(got, pushed);
        assert_eq!(produce(&r, &[5, 6, 7, 8, 10]), [5, 6, 7, 8], "room for 4, none reserved");
    });
}

const ADDR: u64 = 0x1000;
const LEN: u64 = 64;

/// A peer pins the region and writes into it (the cell) while its owner deregisters it and
/// then frees it (writes the cell): the write under a pin always happens before the free
/// (loom fails on a race otherwise), and a pin that starts after `dereg` returned fails.
#[test]
fn loom_mr_pin_races_dereg() {
    model(|| {
        let t = Arc::new(MrTable::default());
        let key = t.reg(ADDR, LEN, Access::REMOTE_WRITE).unwrap();
        let region = Arc::new(UnsafeCell::new(0u64));
        let deregistered = Arc::new(AtomicBool::new(false));
        let peer = {
            let (t, region, deregistered) = (t.clone(), region.clone(), deregistered.clone());
            thread::spawn(move || {
                let after = deregistered.load(Ordering::Acquire);
                let Some(pin) = t.pin_range(key, ADDR, 8, Access::REMOTE_WRITE) else { return };
                assert!(!after, "a pin succeeded after dereg returned");
                assert_eq!((pin.addr(), pin.size()), (ADDR, LEN));
                // SAFETY: pinned: dereg has not returned (loom checks it).
                region.with_mut(|m| unsafe { *m += 1 });
            })
        };
        t.dereg(key).unwrap();
        deregistered.store(true, Ordering::Release);
        // The region is freed: any access under a pin must be over.
        // SAFETY: loom checks no access under a pin overlaps this one.
        region.with_mut(|m| unsafe { *m = u64::MAX });
        assert!(t.pin(key).is_none());
        peer.join().unwrap();
        assert!(t.pin(key).is_none());
    });
}

/// A peer pins the key a registration is about to return: a pin that sees the key sees
/// the region's address and length.
#[test]
fn loom_mr_reg_races_pin() {
    model(|| {
        let t = Arc::new(MrTable::default());
        // The first registration of a table: slot 1, generation 1.
        let key = MrTable::first_key();
        let peer = {
            let t = t.clone();
            thread::spawn(move || {
                if let Some(pin) = t.pin(key) {
                    assert_eq!((pin.addr(), pin.size()), (ADDR, LEN), "a key pinned before its region was set");
                }
            })
        };
        assert_eq!(t.reg(ADDR, LEN, Access::REMOTE_WRITE).unwrap(), key);
        peer.join().unwrap();
        assert!(t.pin(key).is_some());
    });
}
