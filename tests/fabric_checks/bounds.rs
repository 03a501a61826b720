//! Registration bounds every provider keeps, through the plugin's registration cache (what
//! NCCL's `regMr` becomes): the key of a registration reaches exactly its bytes, and memory
//! that is not mapped writable is refused when it is registered.

use std::sync::Arc;

use mpib::fabric::{Device, MrKeys, QueuePair, WcStatus, WrOpcode};
use mpib::plugin::mr::{DATA_ACCESS, MrCache};

use super::{Buf, End, connect, poll_until, wr};

const PAGE: usize = 4096;
const CANARY: u8 = 0xC5;

/// One WR from a fresh end on `da` to `db` (a refused access puts a QP in the error state,
/// so every access gets its own connection); its status and the local bytes after it.
fn access<D: Device>(
    da: &Arc<D>,
    db: &Arc<D>,
    op: WrOpcode,
    remote_addr: u64,
    rkey: u32,
    len: u32,
    fill: u8,
) -> (WcStatus, Vec<u8>) {
    let (mut a, mut b) = (End::new(da, false, PAGE), End::new(db, false, PAGE));
    connect(&mut a, &mut b);
    a.buf.bytes_mut().fill(fill);
    a.qp.post_send(&[wr(op, 1, Some(a.sge(0, len)), remote_addr, rkey, 0, true)]).expect("post");
    let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[1, 0]);
    (got[0][0].status, a.buf.bytes()[..len as usize].to_vec())
}

/// A buffer of 1000 bytes, 100 bytes into the middle one of three pages of canaries, is
/// registered on `db` through the plugin's cache (and, beside it, one more registration in
/// the same pages, as NCCL's protocol buffers sit side by side). A peer on `da` with its key:
/// WRITEs and READs inside it work; one at end − 8, one before its start, one just past its
/// end complete with a remote access error, a refused READ delivers nothing, and no canary
/// changes.
pub fn registrations_are_exact<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let cache = MrCache::new(db.clone());
    let mut mem = Buf::new(3 * PAGE);
    mem.bytes_mut().fill(CANARY);
    let base = mem.bytes().as_ptr() as u64;
    let (data, size) = (base + PAGE as u64 + 100, 1000u64);
    let MrKeys { rkey, .. } = cache.acquire(data, size).expect("register the buffer");
    let neighbour = cache.acquire(data + size + 8, 64).expect("register its neighbour");
    assert_ne!(neighbour.rkey, rkey);
    let end = data + size;
    use WcStatus::{RemoteAccessError as Refused, Success};
    let seen = [
        ("64-byte WRITE at the start", access(da, db, WrOpcode::Write, data, rkey, 64, 0x3C).0, Success),
        ("8-byte WRITE at end - 8", access(da, db, WrOpcode::Write, end - 8, rkey, 8, 0x3D).0, Success),
        ("64-byte WRITE at end - 8", access(da, db, WrOpcode::Write, end - 8, rkey, 64, 0x77).0, Refused),
        ("16-byte WRITE before the start", access(da, db, WrOpcode::Write, data - 16, rkey, 16, 0x77).0, Refused),
        ("1-byte WRITE at the end", access(da, db, WrOpcode::Write, end, rkey, 1, 0x77).0, Refused),
    ];
    let (read_past, leaked) = access(da, db, WrOpcode::Read, end - 8, rkey, 64, 0x11);
    let (read_in, got) = access(da, db, WrOpcode::Read, data, rkey, 64, 0x11);
    let wrong: Vec<String> = seen
        .iter()
        .chain(&[("64-byte READ at end - 8", read_past, Refused), ("64-byte READ at the start", read_in, Success)])
        .filter(|(_, got, want)| got != want)
        .map(|(what, got, want)| format!("{what}: {got} (expected {want})"))
        .collect();
    let b = mem.bytes();
    let off = |a: u64| (a - base) as usize;
    let changed = (0..b.len()).filter(|&i| !(off(data)..off(end)).contains(&i) && b[i] != CANARY).collect::<Vec<_>>();
    assert!(wrong.is_empty() && changed.is_empty(), "{}\ncanaries changed at {changed:?}", wrong.join("\n"));
    assert!(leaked.iter().all(|&x| x == 0x11), "a refused READ delivered {leaked:02x?}");
    assert_eq!(got, [0x3C; 64], "an in-bounds READ returns the in-bounds WRITE");
    assert_eq!(&b[off(end) - 8..off(end)], &[0x3D; 8]);
    cache.release(data + size + 8, 64).unwrap();
    cache.release(data, size).unwrap();
    assert!(cache.is_empty());
}

/// `n` fresh pages mapped with `prot`.
fn map(n: usize, prot: i32) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address the kernel picks.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), n * PAGE, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// Read-only and inaccessible memory, and a range with a hole, cannot be registered with the
/// plugin's rights (peers write into every registration): an error at registration, not a
/// fault when data arrives.
pub fn unwritable_memory_is_refused<D: Device>(d: &Arc<D>) {
    let ro = map(2, libc::PROT_READ);
    let none = map(1, libc::PROT_NONE);
    let hole = map(3, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the middle page of the mapping just made; nothing else uses it.
    assert_eq!(unsafe { libc::munmap(hole.add(PAGE).cast(), PAGE) }, 0);
    for (what, p, len) in [("read-only", ro, 2 * PAGE), ("PROT_NONE", none, 64), ("with a hole", hole, 3 * PAGE)] {
        match d.reg_mr(p, len, DATA_ACCESS) {
            Err(e) => eprintln!("{what}: refused: {e}"),
            Ok(mr) => {
                let _ = d.dereg_mr(mr);
                panic!("{what} memory was registered for remote writes");
            }
        }
    }
    let mr = d.reg_mr(hole, PAGE, DATA_ACCESS).expect("the writable page registers");
    d.dereg_mr(mr).unwrap();
}
