//! Cost per message through the C ABI: N 8-byte messages between a send comm and a receive
//! comm in ONE process on the in-process fabric (`MPIB_FABRIC=inproc`: no threads, no
//! sockets), each checked on arrival. The plugin is `dlopen`ed and set up through the
//! driver (same-thread listen → connect → accept, `regMr`, as NCCL's GDR check does); the
//! message loop then calls `ncclNetPlugin_v12`'s `irecv` / `isend` / `test` function
//! pointers directly, as NCCL's proxy does, so the figure is the plugin's own cost per
//! isend + irecv + test round, both sides together, plus a loop of a few dozen instructions.
//!
//! ```text
//! cargo run --release --example inproc_msgs -- [N=200000] [WINDOW=1]
//! ```
//! The last line is `ns_per_msg: <x>`. Instructions per message (the goal is ≤ 3,000):
//! ```text
//! cargo build --release --example inproc_msgs
//! valgrind --tool=callgrind --callgrind-out-file=cg.20k target/release/examples/inproc_msgs 20000
//! valgrind --tool=callgrind --callgrind-out-file=cg.40k target/release/examples/inproc_msgs 40000
//! # (Ir of cg.40k - Ir of cg.20k) / 20000, Ir from the "summary:" line of each file
//! ```

use std::ffi::{c_int, c_void};
use std::process::ExitCode;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use mpib_tools::ffi::{Library, Table};
use mpib_tools::{Arena, Error, Plugin, Result, default_plugin};
use ncclnet_types::types::ncclResult_t;

/// The 8 bytes of message `i`.
#[inline]
fn payload(i: u64) -> u64 {
    (i ^ 0x6d70_6962_0000_0000).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

type IsendFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    usize,
    c_int,
    *mut c_void,
    *mut c_void,
    *mut *mut c_void,
) -> ncclResult_t;
type IrecvFn = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    *mut *mut c_void,
    *mut usize,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> ncclResult_t;
type TestFn = unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> ncclResult_t;

/// The data-path entries of the v12 table, as NCCL's proxy calls them.
struct DataPath {
    isend: IsendFn,
    irecv: IrecvFn,
    test: TestFn,
}

/// A call's outcome as the loop sees it: the value, or the `ncclResult_t` it failed with.
/// Two registers wide, so the loop's own cost stays a few dozen instructions per message
/// next to the plugin's; the driver's error is built only on failure.
type Rc<T> = std::result::Result<T, ncclResult_t>;

impl DataPath {
    fn of(lib: &str) -> Result<DataPath> {
        let lib = Library::open_nccl_style(lib)?;
        let Some(Table::V12(t)) = Table::find(&lib, 12) else {
            return Err(Error::load(format!("{lib:?} exports no ncclNetPlugin_v12")));
        };
        let missing = |f: &str| Error::contract("table", format!("NULL {f} in ncclNetPlugin_v12"));
        Ok(DataPath {
            isend: t.isend.ok_or_else(|| missing("isend"))?,
            irecv: t.irecv.ok_or_else(|| missing("irecv"))?,
            test: t.test.ok_or_else(|| missing("test"))?,
        })
    }

    /// `irecv` of 8 bytes at `data` with tag 1; NULL = retry later.
    #[inline]
    fn irecv(&self, comm: *mut c_void, mut data: *mut c_void, mut mh: *mut c_void) -> Rc<*mut c_void> {
        let (mut size, mut tag, mut ph, mut req) = (8usize, 1 as c_int, null_mut(), null_mut());
        // SAFETY: one receive: arrays of one element each, a live comm and registration
        // covering `data`, a valid out-pointer.
        let rc = unsafe { (self.irecv)(comm, 1, &mut data, &mut size, &mut tag, &mut mh, &mut ph, &mut req) };
        if rc == 0 { Ok(req) } else { Err(rc) }
    }

    /// `isend` of 8 bytes at `data` with tag 1; NULL = retry later.
    #[inline]
    fn isend(&self, comm: *mut c_void, data: *mut c_void, mh: *mut c_void) -> Rc<*mut c_void> {
        let mut req = null_mut();
        // SAFETY: a live comm and registration covering `data`, a valid out-pointer.
        let rc = unsafe { (self.isend)(comm, data, 8, 1, mh, null_mut(), &mut req) };
        if rc == 0 { Ok(req) } else { Err(rc) }
    }

    /// `test`: the size once done.
    #[inline]
    fn test(&self, req: *mut c_void) -> Rc<Option<c_int>> {
        let (mut done, mut size) = (0 as c_int, -1 as c_int);
        // SAFETY: a request in flight, valid out-pointers (one size: one buffer).
        let rc = unsafe { (self.test)(req, &mut done, &mut size) };
        if rc == 0 { Ok((done != 0).then_some(size)) } else { Err(rc) }
    }
}

fn run(n: u64, window: usize) -> Result<()> {
    let plugin = Plugin::open(&default_plugin(), Some(12))?;
    let net = plugin.init()?;
    // INPROC_TWO_CONTEXTS=1: the receiver's end on a second `init` (another communicator's
    // context, as the other rank of a real connection is), so the two ends share no CQ.
    let net2 = if std::env::var_os("INPROC_TWO_CONTEXTS").is_some() { Some(plugin.init()?) } else { None };
    eprintln!("{} through ncclNetPlugin_v{}, device {:?}", plugin.library(), plugin.version(), net.properties(0)?.name);

    // The same-thread loop NCCL's GDR check does: connect and accept must interleave.
    let listen = net.listen(0)?;
    let mut connector = net2.as_ref().unwrap_or(&net).connector(0, listen.handle());
    let (send, recv) = mpib_tools::net::connect_same_thread(&mut connector, listen, Duration::from_secs(10))?;

    let (sa, ra) = (Arena::new(8 * window)?, Arena::new(8 * window)?);
    let (smr, rmr) = (send.reg_mr(&sa)?, recv.reg_mr(&ra)?);
    let dp = DataPath::of(plugin.library())?;
    let (sc, rc, smh, rmh) = (send.raw(), recv.raw(), smr.raw(), rmr.raw());
    // Messages [done, sent) have both requests, [sent, posted) only their receive; each
    // message's requests and buffers live in its slot of the window. The slots' addresses
    // are computed once and the slot cursors wrap (no division): the loop's own work stays
    // a few dozen instructions next to the plugin's.
    let (sbuf, rbuf): (Vec<*mut u64>, Vec<*mut u64>) =
        (0..window).map(|k| (sa.addr(8 * k).cast(), ra.addr(8 * k).cast())).unzip();
    let (mut rreq, mut sreq) = (vec![null_mut(); window], vec![null_mut(); window]);
    let (mut posted, mut sent, mut done, mut wrong) = (0u64, 0u64, 0u64, 0u64);
    let (mut kp, mut ks, mut kd) = (0usize, 0usize, 0usize);
    let next = |k: usize| if k + 1 == window { 0 } else { k + 1 };
    let start = Instant::now();
    while done < n {
        // Post: the receive, then the sends in order (a NULL request means "retry later").
        if posted < n && posted - done < window as u64 {
            // SAFETY: this slot's previous message completed (fewer than `window` in flight).
            unsafe { sbuf[kp].write_unaligned(payload(posted)) };
            rreq[kp] = dp.irecv(rc, rbuf[kp].cast(), rmh).map_err(|rc| Error::call("irecv", rc))?;
            if !rreq[kp].is_null() {
                posted += 1;
                kp = next(kp);
            }
        }
        while sent < posted {
            sreq[ks] = dp.isend(sc, sbuf[ks].cast(), smh).map_err(|rc| Error::call("isend", rc))?;
            if sreq[ks].is_null() {
                break;
            }
            sent += 1;
            ks = next(ks);
        }
        // Test the oldest message: its send (NCCL tests one request per step; so does
        // this), then its receive.
        if done == sent || dp.test(sreq[kd]).map_err(|rc| Error::call("test", rc))?.is_none() {
            continue;
        }
        let size = loop {
            if let Some(size) = dp.test(rreq[kd]).map_err(|rc| Error::call("test", rc))? {
                break size;
            }
        };
        // SAFETY: the receive completed: the plugin no longer writes this slot.
        let got = unsafe { rbuf[kd].read_unaligned() };
        wrong += u64::from(size != 8 || got != payload(done));
        done += 1;
        kd = next(kd);
    }
    let ns = start.elapsed().as_nanos() as f64 / n.max(1) as f64;
    let c = send.counters()?;
    smr.dereg()?;
    rmr.dereg()?;
    send.close()?;
    recv.close()?;
    net.finalize()?;
    if let Some(c) = c {
        eprintln!(
            "sender rails: SOUT wr={} bytes={}  SUP wr={} bytes={}",
            c[0].wr_posted, c[0].bytes, c[1].wr_posted, c[1].bytes
        );
    }
    println!("messages: {n}  window: {window}  wrong: {wrong}");
    println!("ns_per_msg: {ns:.1}");
    if wrong > 0 {
        return Err(Error::data(format!("{wrong} of {n} messages arrived wrong")));
    }
    Ok(())
}

fn main() -> ExitCode {
    let arg = |i: usize, default: u64| std::env::args().nth(i).map_or(Ok(default), |a| a.parse::<u64>());
    let (Ok(n), Ok(window)) = (arg(1, 200_000), arg(2, 1)) else {
        eprintln!("usage: inproc_msgs [N=200000] [WINDOW=1]");
        return ExitCode::from(2);
    };
    if std::env::var_os("MPIB_FABRIC").is_none() {
        // SAFETY: nothing else runs yet (no threads), and the plugin reads its environment
        // at init, after this.
        unsafe { std::env::set_var("MPIB_FABRIC", "inproc") };
    }
    match run(n, window.clamp(1, 32) as usize) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inproc_msgs: {e}");
            ExitCode::FAILURE
        }
    }
}
