//! The plugin over recording fake NICs (`fake.rs`): which registrations ask for relaxed
//! ordering, the flush QP of a NIC that registers GPU memory through DMA-BUF only, and a
//! NIC whose port goes away under a connection (a verbs device's DEVICE_FATAL).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::discover::FoundPair;
use super::fake::Recording;
use super::handles::{CommHandle, MemHandle, RequestHandle};
use super::instance::Plugin;
use super::instance_state::InstanceState;
use super::setup::FabricKind;
use super::{AbiVersion, BufArg};
use crate::config::{Config, FabricChoice};
use crate::fabric::soft::InprocNet;
use crate::fabric::{Access, MemTypes, WrOpcode};

const ABI: AbiVersion = AbiVersion::V8;

fn plugin(sout: &Arc<Recording>, sup: &Arc<Recording>) -> Plugin<Recording> {
    let cfg: &'static Config =
        Box::leak(Box::new(Config { fabric: FabricChoice::Inproc, stall_ms: 0, ..Config::default() }));
    let state = Box::leak(Box::new(InstanceState::new()));
    Plugin::new(FabricKind::Inproc, vec![FoundPair::new(sout.clone(), sup.clone())], cfg, state)
}

/// A send and a receive comm on device 0, set up from one thread as NCCL does.
fn connect(p: &Plugin<Recording>) -> (CommHandle, CommHandle) {
    let mut handle = [0u8; 128];
    let listen = p.listen(ABI, None, 0, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = p.connect(ABI, None, 0, &mut handle, None).expect("connect");
        }
        if recv.is_none() {
            recv = p.accept(listen).expect("accept");
        }
    }
    (send.unwrap(), recv.unwrap())
}

fn test_until_done(p: &Plugin<Recording>, req: RequestHandle, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.test(req, |_| Ok(())).unwrap_or_else(|e| panic!("{what}: {e}")) {
        assert!(Instant::now() < deadline, "{what} did not complete");
    }
}

/// One message of `len` bytes from `sbuf` into `rbuf`, both registered.
fn transfer(p: &Plugin<Recording>, (send, recv): (CommHandle, CommHandle), bufs: (&[u8], &[u8]), mhs: [MemHandle; 2]) {
    let (sbuf, rbuf) = bufs;
    let arg = BufArg { addr: rbuf.as_ptr() as u64, size: rbuf.len(), tag: 1, mh: Some(mhs[1]) };
    let rreq = p.irecv(recv, 1, &|_| Ok(arg), &|_| 0).expect("irecv").expect("a receive request");
    let deadline = Instant::now() + Duration::from_secs(20);
    let sreq = loop {
        if let Some(r) = p.isend(send, sbuf.as_ptr() as u64, sbuf.len(), 1, mhs[0], 0).expect("isend") {
            break r;
        }
        assert!(Instant::now() < deadline, "isend never found the CTS");
        let _ = p.test(rreq, |_| Ok(())).expect("test receive");
    };
    test_until_done(p, sreq, "the send");
    test_until_done(p, rreq, "the receive");
}

#[test]
fn control_regions_are_registered_strictly_ordered_and_data_buffers_relaxed() {
    let net = InprocNet::new();
    let (a, b) = (Recording::open("rec-sout", &net, MemTypes::HOST), Recording::open("rec-sup", &net, MemTypes::HOST));
    let p = plugin(&a, &b);
    let (send, recv) = connect(&p);
    // Set-up registered each comm's control region on each rail: strictly ordered.
    for dev in [&a, &b] {
        let regs = dev.regs();
        assert_eq!(regs.len(), 2, "one control region per comm (send and receive) per rail: {regs:?}");
        for r in &regs {
            assert!(!r.access.contains(Access::RELAXED_ORDERING), "control region relaxed: {r:?}");
            assert!(r.access.contains(Access::REMOTE_WRITE | Access::REMOTE_READ), "{r:?}");
        }
    }
    // NCCL's buffers: relaxed ordering asked for (the NIC gives it where enabled).
    let (sbuf, rbuf) = (vec![7u8; 4096], vec![0u8; 4096]);
    let smh = p.reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    let rmh = p.reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
    for dev in [&a, &b] {
        let data: Vec<_> = dev.regs().into_iter().skip(2).collect();
        assert_eq!(data.len(), 2, "the send and the receive buffer on each rail: {data:?}");
        assert!(data.iter().all(|r| r.access.contains(Access::RELAXED_ORDERING)), "{data:?}");
        assert_eq!(
            data.iter().map(|r| r.addr).collect::<Vec<_>>(),
            [sbuf.as_ptr() as u64, rbuf.as_ptr() as u64],
            "the buffers NCCL registered"
        );
    }
    // The protocol works over the strictly ordered control regions.
    transfer(&p, (send, recv), (&sbuf, &rbuf), [smh, rmh]);
    assert_eq!(rbuf, sbuf);
}

#[test]
fn a_nic_with_dma_buf_only_gets_flush_qps_and_flushes_gpu_receives() {
    let mem = MemTypes::HOST | MemTypes::DMABUF;
    let net = InprocNet::new();
    let (a, b) = (Recording::open("dmabuf-sout", &net, mem), Recording::open("dmabuf-sup", &net, mem));
    let p = plugin(&a, &b);
    let (send, recv) = connect(&p);
    let (sbuf, rbuf) = (vec![9u8; 8192], vec![0u8; 8192]);
    let smh = p.reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    // "GPU memory" through DMA-BUF (the fake registers the host range at iova).
    let rmh = p.reg_mr_dmabuf(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::DMABUF, 0, 3).expect("regMrDmaBuf");
    let dmabuf: Vec<_> = a.regs().into_iter().filter(|r| r.dmabuf).collect();
    assert_eq!(dmabuf.len(), 1);
    assert!(dmabuf[0].access.contains(Access::RELAXED_ORDERING), "a data buffer: {:?}", dmabuf[0]);
    transfer(&p, (send, recv), (&sbuf, &rbuf), [smh, rmh]);
    assert_eq!(rbuf, sbuf);
    // The flush of a receive into GPU memory: a READ of the buffer per rail, each through
    // that rail's flush QP (a QP connected to itself; the fake records, never executes it).
    assert!(a.loopback_posts().is_empty() && b.loopback_posts().is_empty());
    let arg = BufArg { addr: rbuf.as_ptr() as u64, size: rbuf.len(), tag: 1, mh: Some(rmh) };
    let req = p.iflush(recv, &[arg]).expect("iflush of DMA-BUF memory");
    assert!(req.is_some(), "a flush request");
    let rkeys: Vec<u32> = [&a, &b]
        .iter()
        .map(|d| {
            let posts = d.loopback_posts();
            assert_eq!(posts.len(), 1, "one READ per rail: {posts:?}");
            let w = posts[0].1;
            assert_eq!((w.opcode, w.remote_addr), (WrOpcode::Read, rbuf.as_ptr() as u64), "{w:?}");
            w.rkey
        })
        .collect();
    assert_ne!(rkeys[0], 0);
    // Host memory needs none: NULL request, as net_ib.
    let hmh = p.reg_mr(recv, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    let arg = BufArg { addr: sbuf.as_ptr() as u64, size: sbuf.len(), tag: 1, mh: Some(hmh) };
    assert!(p.iflush(recv, &[arg]).expect("iflush of host memory").is_none());
    assert_eq!(a.loopback_posts().len(), 1, "nothing posted for host memory");
}

#[test]
fn a_port_down_under_both_rails_fails_one_over_and_leaves_the_last_to_rc() {
    // Both rails on one NIC whose port flaps (PORT_ERR, then back before RC gives up): the
    // first rail's event fails it over to the second, the second's is left to RC, as NCCL's
    // IB transport leaves it, and traffic goes on without an error.
    let nic = Recording::open("flap", &InprocNet::new(), MemTypes::HOST);
    let p = plugin(&nic, &nic);
    let (send, recv) = connect(&p);
    let (sbuf, rbuf) = (vec![7u8; 256], vec![0u8; 256]);
    let smh = p.reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    let rmh = p.reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
    transfer(&p, (send, recv), (&sbuf, &rbuf), [smh, rmh]);
    nic.port_down();
    for _ in 0..3 {
        transfer(&p, (send, recv), (&sbuf, &rbuf), [smh, rmh]);
    }
    assert_eq!(rbuf, sbuf);
}

#[test]
fn a_nic_that_fails_fails_both_rails_it_carries_at_once() {
    // Both rails on one NIC; the device goes away (a verbs device's DEVICE_FATAL event).
    let nic = Recording::open("fatal", &InprocNet::new(), MemTypes::HOST);
    let p = plugin(&nic, &nic);
    let (send, recv) = connect(&p);
    let (sbuf, rbuf) = (vec![1u8; 256], vec![0u8; 256]);
    let smh = p.reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    let rmh = p.reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
    transfer(&p, (send, recv), (&sbuf, &rbuf), [smh, rmh]);
    let t0 = Instant::now();
    nic.device_fatal();
    // The next call that waits on each side fails: no stall bound (off here), no timeout.
    let e = loop {
        match p.isend(send, sbuf.as_ptr() as u64, sbuf.len(), 1, smh, 0) {
            Err(e) => break e,
            Ok(r) => assert!(r.is_none() && t0.elapsed() < Duration::from_secs(5), "the send went on"),
        }
    };
    assert!(e.msg().contains("both rails have failed"), "{e}");
    let arg = BufArg { addr: rbuf.as_ptr() as u64, size: rbuf.len(), tag: 1, mh: Some(rmh) };
    let e = match p.irecv(recv, 1, &|_| Ok(arg), &|_| 0) {
        Err(e) => e,
        Ok(None) => panic!("irecv: not now"),
        Ok(Some(rreq)) => loop {
            match p.test(rreq, |_| Ok(())) {
                Err(e) => break e,
                Ok(done) => assert!(!done && t0.elapsed() < Duration::from_secs(5), "the receive went on"),
            }
        },
    };
    assert!(e.msg().contains("both rails have failed"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}
