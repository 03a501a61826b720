//! NCCL profiler events through the C ABI, as NCCL drives them: `init` given a profiler
//! callback (here a recorder), `isend`/`irecv` given profiler handles, on the in-process
//! fabric with a 50 % split (sizes that go over both rails and sizes that go on one).
//! Each scenario runs in a child process of this test binary (the configuration is read
//! once per process).

use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mpib::abi::{ncclNetPlugin_v10, ncclNetPlugin_v12};
use ncclnet_types::mpib::{
    MPIB_PROFILE_RECV, MPIB_PROFILE_REPLAY, MPIB_PROFILE_SEND_PART, MPIB_PROFILER_NET_MPIB_VER, MPIB_PROFILER_NET_TYPE,
    mpib_profiler_descr_v1_t,
};
use ncclnet_types::types::{ncclProfilerCallback_t, ncclResult_t};

mod common;

use common::{in_child, is_child};

#[derive(Clone, Copy, Debug)]
enum Ev {
    Start { event: usize, phandle: usize, id: i64, d: mpib_profiler_descr_v1_t },
    Stop { event: usize },
}

static EVENTS: Mutex<Vec<Ev>> = Mutex::new(Vec::new());
/// What the recorder answers (a profiler that fails must not break the data path).
static ANSWER: Mutex<ncclResult_t> = Mutex::new(0);

/// The test's profiler: records each call, gives each start a handle of its own.
unsafe extern "C" fn record(
    eh: *mut *mut c_void,
    ty: c_int,
    ph: *mut c_void,
    id: i64,
    data: *mut c_void,
) -> ncclResult_t {
    let mut ev = EVENTS.lock().unwrap();
    match ty {
        0 => {
            // SAFETY: mpib passes its descriptor (checked by the plugin id below) and an
            // event-handle slot.
            let d = unsafe { *(data as *const mpib_profiler_descr_v1_t) };
            let event = 0x1000 + ev.len();
            // SAFETY: the event-handle slot mpib passes (valid for the call).
            unsafe { *eh = event as *mut c_void };
            ev.push(Ev::Start { event, phandle: ph as usize, id, d });
        }
        // SAFETY: as above; a stop's slot holds the handle its start set.
        1 => ev.push(Ev::Stop { event: unsafe { *eh } as usize }),
        t => panic!("event type {t}"),
    }
    *ANSWER.lock().unwrap()
}

fn events() -> Vec<Ev> {
    EVENTS.lock().unwrap().clone()
}

/// Events started for profiler handle `ph` and not stopped.
fn open_for(ph: usize) -> usize {
    let ev = events();
    let started: Vec<usize> =
        ev.iter().filter(|e| matches!(e, Ev::Start { phandle, .. } if *phandle == ph)).map(start_event).collect();
    started.iter().filter(|s| !ev.iter().any(|e| matches!(e, Ev::Stop { event } if event == *s))).count()
}

fn start_event(e: &Ev) -> usize {
    match e {
        Ev::Start { event, .. } => *event,
        Ev::Stop { event } => *event,
    }
}

fn ok(rc: ncclResult_t, what: &str) {
    assert_eq!(rc, 0, "{what} failed");
}

struct Conn {
    ctx: *mut c_void,
    send: *mut c_void,
    recv: *mut c_void,
}

/// `init` with `prof`, then a send and a receive comm on device 0.
fn connect(prof: ncclProfilerCallback_t) -> Conn {
    let n = &ncclNetPlugin_v12;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the table's functions, called as NCCL calls them.
    unsafe {
        ok(n.init.unwrap()(&mut ctx, 7, std::ptr::null_mut(), None, prof), "init");
        let mut handle = [0u8; 128];
        let mut listen = std::ptr::null_mut();
        ok(n.listen.unwrap()(ctx, 0, handle.as_mut_ptr().cast(), &mut listen), "listen");
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
        let deadline = Instant::now() + Duration::from_secs(20);
        while send.is_null() || recv.is_null() {
            assert!(Instant::now() < deadline, "connect/accept did not finish");
            if send.is_null() {
                let mut dc = std::ptr::null_mut();
                ok(n.connect.unwrap()(ctx, 0, handle.as_mut_ptr().cast(), &mut send, &mut dc), "connect");
            }
            if recv.is_null() {
                let mut dc = std::ptr::null_mut();
                ok(n.accept.unwrap()(listen, &mut recv, &mut dc), "accept");
            }
        }
        ok(n.closeListen.unwrap()(listen), "closeListen");
        Conn { ctx, send, recv }
    }
}

/// As [`connect`] through the v10 table (no context: the callback goes to the default one).
/// (Its data-path entries are the v12 table's, which `exchange` calls.)
fn connect_v10(prof: ncclProfilerCallback_t) -> Conn {
    let n = &ncclNetPlugin_v10;
    // SAFETY: the table's functions, called as NCCL calls them.
    unsafe {
        ok(n.init.unwrap()(None, prof), "init");
        let mut handle = [0u8; 128];
        let mut listen = std::ptr::null_mut();
        ok(n.listen.unwrap()(0, handle.as_mut_ptr().cast(), &mut listen), "listen");
        let (mut send, mut recv): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
        let deadline = Instant::now() + Duration::from_secs(20);
        while send.is_null() || recv.is_null() {
            assert!(Instant::now() < deadline, "connect/accept did not finish");
            if send.is_null() {
                let mut dc = std::ptr::null_mut();
                let h = handle.as_mut_ptr().cast();
                ok(n.connect.unwrap()(0, std::ptr::null_mut(), h, &mut send, &mut dc), "connect");
            }
            if recv.is_null() {
                let mut dc = std::ptr::null_mut();
                ok(n.accept.unwrap()(listen, &mut recv, &mut dc), "accept");
            }
        }
        ok(n.closeListen.unwrap()(listen), "closeListen");
        Conn { ctx: std::ptr::null_mut(), send, recv }
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed * 31 + i * 7) as u8).collect()
}

/// The profiler handles the test gives message `i` (fake addresses: the plugin only passes
/// them back).
fn send_ph(i: usize) -> usize {
    0x5000_0000 + i * 16
}
fn recv_ph(i: usize) -> usize {
    0x7000_0000 + i * 16
}

/// Sends `sizes` one message at a time (each byte checked); checks that when `test` says
/// a request is done, none of its events is still open.
fn exchange(c: &Conn, sizes: &[usize]) {
    let n = &ncclNetPlugin_v12;
    let max = sizes.iter().copied().max().unwrap_or(1).max(1);
    let mut sbuf = vec![0u8; max];
    let mut rbuf = vec![0u8; max];
    // SAFETY: as NCCL calls them; the buffers outlive their registrations and requests.
    unsafe {
        let (mut smh, mut rmh) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(n.regMr.unwrap()(c.send, sbuf.as_mut_ptr().cast(), max, 1, &mut smh), "regMr");
        ok(n.regMr.unwrap()(c.recv, rbuf.as_mut_ptr().cast(), max, 1, &mut rmh), "regMr");
        for (i, &len) in sizes.iter().enumerate() {
            let data = pattern(i, len);
            sbuf[..len].copy_from_slice(&data);
            rbuf.fill(0xee);
            let mut rdata = [rbuf.as_mut_ptr().cast::<c_void>()];
            let mut rsize = [max];
            let mut tag = [1];
            let mut mhs = [rmh];
            let mut phs = [recv_ph(i) as *mut c_void];
            let mut rreq = std::ptr::null_mut();
            ok(
                n.irecv.unwrap()(
                    c.recv,
                    1,
                    rdata.as_mut_ptr(),
                    rsize.as_mut_ptr(),
                    tag.as_mut_ptr(),
                    mhs.as_mut_ptr(),
                    phs.as_mut_ptr(),
                    &mut rreq,
                ),
                "irecv",
            );
            assert!(!rreq.is_null());
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut sreq: *mut c_void = std::ptr::null_mut();
            let (mut sd, mut rd) = (0, 0);
            let (mut ssz, mut rsz) = (-1, -1);
            while sreq.is_null() {
                assert!(Instant::now() < deadline, "isend never found the CTS");
                let ph = send_ph(i) as *mut c_void;
                ok(n.isend.unwrap()(c.send, sbuf.as_mut_ptr().cast(), len, 1, smh, ph, &mut sreq), "isend");
                // (The receiver's calls also carry its failover work: a CTS lost with a rail.)
                if rd == 0 && sreq.is_null() {
                    ok(n.test.unwrap()(rreq, &mut rd, &mut rsz), "test recv");
                    if rd != 0 {
                        assert_eq!(open_for(recv_ph(i)), 0, "receive {i} done with an event still open");
                    }
                }
            }
            while sd == 0 || rd == 0 {
                assert!(Instant::now() < deadline, "message {i} ({len} bytes) did not complete");
                if sd == 0 {
                    ok(n.test.unwrap()(sreq, &mut sd, &mut ssz), "test send");
                    if sd != 0 {
                        assert_eq!(open_for(send_ph(i)), 0, "send {i} done with an event still open");
                    }
                }
                if rd == 0 {
                    ok(n.test.unwrap()(rreq, &mut rd, &mut rsz), "test recv");
                    if rd != 0 {
                        assert_eq!(open_for(recv_ph(i)), 0, "receive {i} done with an event still open");
                    }
                }
            }
            assert_eq!((ssz, rsz), (len as c_int, len as c_int), "sizes of message {i}");
            assert_eq!(&rbuf[..len], &data[..], "payload of message {i} ({len} bytes)");
        }
        ok(n.deregMr.unwrap()(c.send, smh), "deregMr");
        ok(n.deregMr.unwrap()(c.recv, rmh), "deregMr");
    }
}

fn close(c: Conn) {
    let n = &ncclNetPlugin_v12;
    // SAFETY: handles from `connect`.
    unsafe {
        ok(n.closeSend.unwrap()(c.send), "closeSend");
        ok(n.closeRecv.unwrap()(c.recv), "closeRecv");
        if !c.ctx.is_null() {
            ok(n.finalize.unwrap()(c.ctx), "finalize");
        }
    }
}

/// Every start has exactly one stop, and every stop names a started event.
fn assert_balanced(ev: &[Ev]) {
    let starts: Vec<usize> = ev.iter().filter(|e| matches!(e, Ev::Start { .. })).map(start_event).collect();
    let stops: Vec<usize> = ev.iter().filter(|e| matches!(e, Ev::Stop { .. })).map(start_event).collect();
    for s in &starts {
        assert_eq!(stops.iter().filter(|x| *x == s).count(), 1, "event {s:#x}: one stop\n{ev:#?}");
    }
    for s in &stops {
        assert!(starts.contains(s), "stop of {s:#x}, never started");
    }
}

/// The starts of the events of profiler handle `ph`.
fn starts_of(ev: &[Ev], ph: usize) -> Vec<mpib_profiler_descr_v1_t> {
    ev.iter()
        .filter_map(|e| match e {
            Ev::Start { phandle, d, .. } if *phandle == ph => Some(*d),
            _ => None,
        })
        .collect()
}

const SIZES: &[usize] = &[0, 100, 128, 4096, 65536, 1 << 20, (1 << 20) + 3, 1000];

#[test]
fn each_sends_rail_parts_and_each_receive_are_reported_start_to_stop() {
    if !is_child() {
        let env = [("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")];
        return in_child("each_sends_rail_parts_and_each_receive_are_reported_start_to_stop", &env);
    }
    let c = connect(Some(record));
    exchange(&c, SIZES);
    let ev = events();
    assert_balanced(&ev);
    let (mut both, mut one) = (0, 0);
    for (i, &len) in SIZES.iter().enumerate() {
        let sends = starts_of(&ev, send_ph(i));
        assert!(!sends.is_empty(), "send {i} ({len} bytes): no event");
        let split = sends[0].rail_bytes;
        assert_eq!(split[0] + split[1], len as u64, "send {i}: the split covers the send");
        let mut rails: Vec<u8> = sends.iter().map(|d| d.rail).collect();
        rails.sort();
        let carried: Vec<u8> = (0..2).filter(|&r| split[r as usize] > 0).collect();
        if len > 0 {
            assert_eq!(rails, carried, "send {i} ({len} bytes, split {split:?}): an event per rail that carried bytes");
        } else {
            assert_eq!(sends.len(), 1, "an empty send: one event, on its IMM's rail");
        }
        assert_eq!(sends.iter().map(|d| d.length).sum::<u64>(), len as u64, "send {i}: the parts add up");
        for d in &sends {
            assert_eq!(d.r#type, MPIB_PROFILE_SEND_PART);
            assert_eq!((d.size, d.rail_bytes, d.device), (len as u64, split, 0));
            assert_eq!(d.length, split[d.rail as usize]);
            assert_ne!(d.qp_num, 0, "the QP it was posted on");
        }
        if carried.len() == 2 {
            both += 1;
        } else if len > 0 {
            one += 1;
        }
        let recvs = starts_of(&ev, recv_ph(i));
        assert_eq!(recvs.len(), 1, "receive {i}: one event");
        assert_eq!((recvs[0].r#type, recvs[0].length), (MPIB_PROFILE_RECV, 1 << 20 | 3));
        assert!(recvs[0].rail < 2 && recvs[0].qp_num != 0, "the CTS's rail and QP: {:?}", recvs[0]);
    }
    assert!(both >= 3 && one >= 1, "sizes over both rails ({both}) and on one ({one})");
    for e in &ev {
        if let Ev::Start { id, phandle, .. } = e {
            assert_eq!(*id, MPIB_PROFILER_NET_TYPE | MPIB_PROFILER_NET_MPIB_VER);
            assert!((0..SIZES.len()).any(|i| *phandle == send_ph(i) || *phandle == recv_ph(i)), "{phandle:#x}");
        }
    }
    let n = ev.len();
    close(c);
    assert_eq!(events().len(), n, "nothing left open at close");
}

#[test]
fn without_a_callback_nothing_is_reported_and_the_data_is_the_same() {
    if !is_child() {
        let env = [("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")];
        return in_child("without_a_callback_nothing_is_reported_and_the_data_is_the_same", &env);
    }
    // A context with a profiler next to one without: only the first one's comms report.
    let with = connect(Some(record));
    let c = connect(None);
    exchange(&c, SIZES);
    close(c);
    assert!(events().is_empty(), "no callback, no events: {:?}", events());
    exchange(&with, &[4096]);
    assert!(!events().is_empty(), "the other context reports");
    close(with);
}

#[test]
fn a_callback_that_fails_breaks_nothing() {
    if !is_child() {
        let env = [("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")];
        return in_child("a_callback_that_fails_breaks_nothing", &env);
    }
    *ANSWER.lock().unwrap() = 3; // ncclInternalError
    let c = connect(Some(record));
    exchange(&c, SIZES);
    close(c);
    assert_balanced(&events());
    assert!(events().len() >= 2 * SIZES.len());
}

#[test]
fn a_part_in_flight_when_its_comm_closes_is_stopped() {
    if !is_child() {
        let env = [("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")];
        return in_child("a_part_in_flight_when_its_comm_closes_is_stopped", &env);
    }
    let c = connect(Some(record));
    let n = &ncclNetPlugin_v12;
    let len = 1 << 16;
    let mut sbuf = vec![1u8; len];
    let mut rbuf = vec![0u8; len];
    // SAFETY: as NCCL calls them.
    unsafe {
        let (mut smh, mut rmh) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(n.regMr.unwrap()(c.send, sbuf.as_mut_ptr().cast(), len, 1, &mut smh), "regMr");
        ok(n.regMr.unwrap()(c.recv, rbuf.as_mut_ptr().cast(), len, 1, &mut rmh), "regMr");
        let (mut rdata, mut rsize, mut tag, mut mhs) = ([rbuf.as_mut_ptr().cast()], [len], [1], [rmh]);
        let mut phs = [recv_ph(0) as *mut c_void];
        let mut rreq = std::ptr::null_mut();
        let irecv = n.irecv.unwrap();
        let (d, s, t, m, p) =
            (rdata.as_mut_ptr(), rsize.as_mut_ptr(), tag.as_mut_ptr(), mhs.as_mut_ptr(), phs.as_mut_ptr());
        ok(irecv(c.recv, 1, d, s, t, m, p, &mut rreq), "irecv");
        let mut sreq: *mut c_void = std::ptr::null_mut();
        let deadline = Instant::now() + Duration::from_secs(20);
        while sreq.is_null() {
            assert!(Instant::now() < deadline, "isend never found the CTS");
            let ph = send_ph(0) as *mut c_void;
            ok(n.isend.unwrap()(c.send, sbuf.as_mut_ptr().cast(), len, 1, smh, ph, &mut sreq), "isend");
        }
        // Posted on both rails, never tested: open until the comms close.
        assert_eq!(open_for(send_ph(0)), 2, "{:#?}", events());
        assert_eq!(open_for(recv_ph(0)), 1);
        ok(n.closeSend.unwrap()(c.send), "closeSend");
        assert_eq!(open_for(send_ph(0)), 0, "closing the send comm stops its parts' events");
        ok(n.closeRecv.unwrap()(c.recv), "closeRecv");
        assert_eq!(open_for(recv_ph(0)), 0, "closing the receive comm stops its receive's event");
        ok(n.finalize.unwrap()(c.ctx), "finalize");
    }
    assert_balanced(&events());
}

#[test]
fn a_part_whose_rail_fails_is_stopped_and_its_replay_reported() {
    if !is_child() {
        // drop-imm (TCP soft fabric): the first data WRITE_WITH_IMM on SUP from the third isend
        // on lands without its IMM and the link dies, so that part is replayed whatever the
        // timing (a plain drop may first hit a probe, with no part in flight).
        let env = [
            ("MPIB_FABRIC", "soft"),
            ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"),
            ("MPIB_SOFT_SUP_ADDR", "127.0.0.1"),
            ("MPIB_SPLIT", "50"),
            ("MPIB_FAULT_RAIL", "sup:3:drop-imm"),
        ];
        return in_child("a_part_whose_rail_fails_is_stopped_and_its_replay_reported", &env);
    }
    let c = connect(Some(record));
    let sizes: Vec<usize> = (0..12).map(|i| 4096 << (i % 6)).collect();
    exchange(&c, &sizes);
    let ev = events();
    assert_balanced(&ev);
    for (i, &len) in sizes.iter().enumerate() {
        let d = starts_of(&ev, send_ph(i));
        let sent: u64 = d.iter().filter(|d| d.r#type == MPIB_PROFILE_SEND_PART).map(|d| d.length).sum();
        assert_eq!(sent, len as u64, "send {i}: its parts add up");
        for r in d.iter().filter(|d| d.r#type == MPIB_PROFILE_REPLAY) {
            assert_eq!((r.rail, r.length), (0, r.rail_bytes[1]), "SUP's part replayed on SOUT");
        }
    }
    // The part that lost its IMM is replayed on SOUT.
    let replays = ev.iter().filter(|e| matches!(e, Ev::Start { d, .. } if d.r#type == MPIB_PROFILE_REPLAY)).count();
    assert!(replays >= 1, "no part was replayed\n{ev:#?}");
    close(c);
}

#[test]
fn v10_reports_through_the_callback_of_its_init() {
    if !is_child() {
        let env = [("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")];
        return in_child("v10_reports_through_the_callback_of_its_init", &env);
    }
    let c = connect_v10(Some(record));
    exchange(&c, &[4096, 100]);
    close(c);
    let ev = events();
    assert_balanced(&ev);
    assert_eq!(starts_of(&ev, send_ph(0)).len(), 2, "4096 bytes split over both rails");
    assert_eq!(starts_of(&ev, send_ph(1)).len(), 1, "100 bytes on one rail");
    assert_eq!(starts_of(&ev, recv_ph(1)).len(), 1);
}
