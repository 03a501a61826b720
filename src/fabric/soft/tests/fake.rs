//! A fake device: a raw socket in this test speaking the soft fabric's wire to a real
//! device (HELLO, CONNECTs, requests and responses written by hand), for what a real peer
//! never does: malformed frames, violations, displacement attempts, silence.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::super::frame::{Frame, HDR_LEN, decode, encode};
use super::*;

/// The fake device's identity: 0, smaller than any real one, so the fake dials.
const FAKE_DEV: u64 = 0;

/// The fake's end of a link to a real device.
pub struct Fake {
    pub s: TcpStream,
}

fn info_of(end: &End) -> [u8; 48] {
    end.qp.local_info().0
}

/// A QpInfo for fake QP `qpn` (its nonce is `qpn` too) on the fake device.
pub fn fake_info(qpn: u32) -> QpInfo {
    let mut info = [0u8; 48];
    info[0] = 2;
    info[1] = 4;
    info[2..4].copy_from_slice(&1u16.to_le_bytes());
    info[4..8].copy_from_slice(&qpn.to_le_bytes());
    info[8..16].copy_from_slice(&(qpn as u64).to_le_bytes());
    info[16..20].copy_from_slice(&[127, 0, 0, 1]);
    info[32..40].copy_from_slice(&FAKE_DEV.to_le_bytes());
    QpInfo(info)
}

impl Fake {
    /// Dials `end`'s device and says HELLO.
    pub fn dial(end: &End) -> Fake {
        let info = info_of(end);
        let port = u16::from_le_bytes([info[2], info[3]]);
        let dev = u64::from_le_bytes(info[32..40].try_into().unwrap());
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&encode(&Frame::Hello { dst_dev: dev, src_dev: FAKE_DEV })).unwrap();
        Fake { s }
    }

    pub fn send(&mut self, f: &Frame) {
        self.s.write_all(&encode(f)).unwrap();
    }

    /// The next frame and its payload.
    pub fn recv(&mut self) -> (Frame, Vec<u8>) {
        let mut hdr = [0u8; HDR_LEN];
        self.s.read_exact(&mut hdr).unwrap();
        let f = decode(&hdr).unwrap();
        let mut p = vec![0; f.payload_len() as usize];
        self.s.read_exact(&mut p).unwrap();
        (f, p)
    }

    /// The next frame that is not an ACK owed.
    pub fn recv_request(&mut self) -> Frame {
        loop {
            let (f, _) = self.recv();
            if !matches!(f, Frame::Ack { .. } | Frame::Connect { .. }) {
                return f;
            }
        }
    }

    /// Connects `end`'s QP to fake QP `qpn` over this link (both CONNECTs).
    pub fn connect(&mut self, end: &mut End, qpn: u32) {
        self.connect_with(end, qpn, &PARAMS);
    }

    /// The same with the QP's own timeout and retry count.
    pub fn connect_with(&mut self, end: &mut End, qpn: u32, params: &ConnectParams) {
        end.qp.connect(&fake_info(qpn), params).unwrap();
        let info = info_of(end);
        let nonce = u64::from_le_bytes(info[8..16].try_into().unwrap());
        self.send(&Frame::Connect { dst_qpn: end.qp.qp_num(), src_qpn: qpn, dst_nonce: nonce, src_nonce: qpn as u64 });
        let t = Instant::now();
        while !end.qp.is_ready().unwrap() {
            assert!(t.elapsed() < Duration::from_secs(5), "the QP did not come up");
            std::thread::yield_now();
        }
        let (f, _) = self.recv();
        assert_eq!(
            f,
            Frame::Connect { dst_qpn: qpn, src_qpn: end.qp.qp_num(), dst_nonce: qpn as u64, src_nonce: nonce },
            "the QP's own CONNECT"
        );
    }
}

fn tcp_end_on(dev: &Arc<SoftDevice>) -> End {
    End::new(dev.clone(), 4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
}

/// An end on `dev` connected to fake QP 4242 over a fake link that reads with a 5 s timeout.
fn end_and_fake(dev: &Arc<SoftDevice>) -> (End, Fake) {
    let mut a = tcp_end_on(dev);
    let mut fake = Fake::dial(&a);
    fake.connect(&mut a, 4242);
    fake.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (a, fake)
}

/// A WRITE frame's sequence number and ACK_REQ flag.
fn write_seq(f: Frame) -> (u32, bool) {
    match f {
        Frame::Write { seq, ack_req, .. } => (seq, ack_req),
        f => panic!("{f:?}"),
    }
}

/// A malformed header breaks the stream: every QP on that link fails (the oldest WR waiting
/// on the peer `RetryExceeded`, the rest flushed); a QP on another link does not notice.
#[test]
fn a_malformed_header_fails_every_qp_on_its_link_only() {
    let p = devices(Mode::Tcp);
    let (mut a, mut b) = (tcp_end_on(&p.0), tcp_end_on(&p.0));
    let mut fake = Fake::dial(&a);
    fake.connect(&mut a, 4242);
    fake.connect(&mut b, 4243);
    assert_eq!(p.0.links(), 1, "two QPs to one device share one link");
    let (mut by, mut by_peer) = (tcp_end_on(&p.0), tcp_end_on(&p.1));
    connect(&mut by, &mut by_peer);
    a.qp.post_send(&[write(1, a.sge(0, 8), 0, 0, true), write(2, a.sge(0, 8), 0, 0, true)]).unwrap();
    assert!(matches!(fake.recv_request(), Frame::Write { seq: 0, .. }));
    fake.s.write_all(&[0xFFu8; HDR_LEN]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(statuses(&c), [(1, WcStatus::RetryExceeded), (2, WcStatus::Flushed)]);
    let t = Instant::now();
    while b.qp.is_ready().is_ok() {
        assert!(t.elapsed() < Duration::from_secs(5), "the other QP on the broken link did not fail");
        b.cq.poll(&mut []).unwrap();
    }
    let mut rest = Vec::new();
    fake.s.read_to_end(&mut rest).unwrap(); // the link was closed
    let wr = write(7, by.sge(0, 16), by_peer.addr(), by_peer.key(), true);
    by.qp.post_send(&[wr]).unwrap();
    let c = poll_n(&mut by.cq, &mut by_peer.cq, 1);
    assert_eq!(statuses(&c), [(7, WcStatus::Success)], "a QP on another link");
}

/// A violation of one QP's protocol (an ACK of a request never sent) fails that QP only:
/// the peer QP hears of it (CLOSE with the error bit) and another QP on the same link goes on.
#[test]
fn a_qp_protocol_violation_fails_that_qp_only() {
    let p = devices(Mode::Tcp);
    let (mut a, mut b) = (tcp_end_on(&p.0), tcp_end_on(&p.0));
    let mut fake = Fake::dial(&a);
    fake.connect(&mut a, 4242);
    fake.connect(&mut b, 4243);
    a.qp.post_send(&[write(1, a.sge(0, 8), 0, 0, true), write(2, a.sge(0, 8), 0, 0, true)]).unwrap();
    assert!(matches!(fake.recv_request(), Frame::Write { seq: 0, .. }));
    assert!(matches!(fake.recv_request(), Frame::Write { seq: 1, .. }));
    fake.send(&Frame::Ack { dst_qpn: a.qp.qp_num(), seq: 5 }); // never sent
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(statuses(&c), [(1, WcStatus::Flushed), (2, WcStatus::Flushed)]);
    assert_eq!(
        fake.recv_request(),
        Frame::Close { dst_qpn: 4242, src_qpn: a.qp.qp_num(), error: true },
        "the peer QP is told"
    );
    // The other QP on the link still works: its WRITE goes out and the fake's ACK completes it.
    b.qp.post_send(&[write(9, b.sge(0, 8), 0, 0, true)]).unwrap();
    let f = fake.recv_request();
    assert!(matches!(f, Frame::Write { dst_qpn: 4243, seq: 0, ack_req: true, .. }), "{f:?}");
    fake.send(&Frame::Ack { dst_qpn: b.qp.qp_num(), seq: 0 });
    let c = poll_n(&mut b.cq, &mut a.cq, 1);
    assert_eq!(statuses(&c), [(9, WcStatus::Success)]);
}

/// Frames for a QP that is not on the link (closed, or never there) are dropped, with
/// their payload: the stream goes on.
#[test]
fn frames_for_qps_not_on_the_link_are_dropped() {
    let p = devices(Mode::Tcp);
    let (mut a, mut fake) = end_and_fake(&p.0);
    fake.send(&Frame::Ack { dst_qpn: a.qp.qp_num() ^ 1, seq: 0 });
    let w = Frame::Write {
        dst_qpn: a.qp.qp_num() ^ 1,
        seq: 0,
        addr: a.addr(),
        rkey: a.key(),
        len: 16,
        imm: None,
        ack_req: true,
    };
    fake.send(&w);
    fake.s.write_all(&[0xEE; 16]).unwrap();
    a.qp.post_send(&[write(1, a.sge(0, 8), 0, 0, true)]).unwrap();
    assert!(matches!(fake.recv_request(), Frame::Write { seq: 0, .. }));
    fake.send(&Frame::Ack { dst_qpn: a.qp.qp_num(), seq: 0 });
    let c = poll_n(&mut a.cq, &mut SoftCq::new(1, false), 1);
    assert_eq!(statuses(&c), [(1, WcStatus::Success)]);
    assert!(a.region()[..16].iter().all(|b| *b != 0xEE), "nothing was placed for another QP");
}

#[test]
fn silent_peer_times_out_within_the_bound() {
    let p = devices(Mode::Tcp);
    let mut e = tcp_end_on(&p.0);
    let mut other = tcp_end_on(&p.1);
    let mut fake = Fake::dial(&e);
    fake.connect_with(&mut e, 4242, &SILENT_PEER_PARAMS); // accepts bytes, never answers
    e.qp.post_send(&[write(1, e.sge(0, 8), 0, 0, true)]).unwrap();
    let t = Instant::now();
    let c = poll_n(&mut e.cq, &mut other.cq, 1);
    let bound = silent_peer_bound(&SILENT_PEER_PARAMS);
    assert_eq!(c.first().map(|c| c.status), Some(WcStatus::RetryExceeded));
    // Never before the bound; after it, within a margin a busy machine cannot exhaust.
    let took = t.elapsed();
    assert!(took >= bound && took < bound + Duration::from_secs(2), "{took:?} for a bound of {bound:?}");
}

/// Polls `end`'s CQ until its region's first 8 bytes read `want` (the WRITE was placed).
fn poll_until_placed(end: &mut End, want: [u8; 8]) {
    let t = Instant::now();
    while end.region()[..8] != want {
        assert!(t.elapsed() < Duration::from_secs(5), "the WRITE was not placed");
        end.cq.poll(&mut []).unwrap();
    }
}

/// The acknowledgement of a request that asks for one (ACK_REQ) is held by the poll that
/// placed the data, and goes with the caller's next frames (ahead of them, in one stream):
/// the requester never sees the request before the ACK it carries.
#[test]
fn a_held_ack_goes_ahead_of_the_next_post() {
    let p = devices(Mode::Tcp);
    let (mut a, mut fake) = end_and_fake(&p.0);
    let (qpn, addr, rkey) = (a.qp.qp_num(), a.addr(), a.key());
    let w = |seq| Frame::Write { dst_qpn: qpn, seq, addr, rkey, len: 8, imm: None, ack_req: true };
    fake.send(&w(0));
    fake.s.write_all(&[7; 8]).unwrap();
    poll_until_placed(&mut a, [7; 8]);
    a.qp.post_send(&[write(1, a.sge(0, 8), 0, 0, true)]).unwrap();
    assert_eq!(fake.recv().0, Frame::Ack { dst_qpn: 4242, seq: 0 });
    assert!(matches!(fake.recv().0, Frame::Write { dst_qpn: 4242, seq: 0, ack_req: true, .. }));
}

/// A held acknowledgement goes at a later poll when nothing is posted (once held for
/// `ACK_HOLD`), and by the helper when the caller stops calling right after the poll that
/// placed the data: the requester's completion never waits on a caller that went away.
#[test]
fn a_held_ack_goes_at_the_next_poll_or_by_the_helper() {
    let p = devices(Mode::Tcp);
    let (mut a, mut fake) = end_and_fake(&p.0);
    let (qpn, addr, rkey) = (a.qp.qp_num(), a.addr(), a.key());
    let w = |seq| Frame::Write { dst_qpn: qpn, seq, addr, rkey, len: 8, imm: None, ack_req: true };
    // Polled on with nothing posted: a poll once it was held for ACK_HOLD sends it.
    fake.send(&w(0));
    fake.s.write_all(&[1; 8]).unwrap();
    poll_until_placed(&mut a, [1; 8]);
    std::thread::sleep(super::super::progress::ACK_HOLD);
    a.cq.poll(&mut []).unwrap();
    assert_eq!(fake.recv().0, Frame::Ack { dst_qpn: 4242, seq: 0 });
    // Nobody polls after the placing poll: the helper sends it (its look at the link's
    // event, or its sweep). When is the progress policy's (`progress::AckHold`,
    // `sweep_steps`, `Looks`: unit tests with a made-up clock); this checks that the live
    // thread does it, with no other thread calling. The bound is the fake's read timeout,
    // 5 s: it takes at most two helper periods (20 ms), and a loaded 2-core machine may
    // keep the helper off a CPU for a while; a helper that never sends it fails the read.
    fake.send(&w(1));
    fake.s.write_all(&[2; 8]).unwrap();
    poll_until_placed(&mut a, [2; 8]);
    assert_eq!(fake.recv().0, Frame::Ack { dst_qpn: 4242, seq: 1 });
}

/// A post with no signalled WR (a CTS: nobody here waits for it) rings no doorbell: it goes
/// with the next post's frames, ahead of them, or at the caller's next poll, or by the
/// helper when the caller makes no other call.
#[test]
fn an_unsignalled_post_goes_with_the_next_post_or_poll_or_by_the_helper() {
    let p = devices(Mode::Tcp);
    let (mut a, mut fake) = end_and_fake(&p.0);
    a.qp.post_send(&[write(1, a.sge(0, 8), 0, 0, false)]).unwrap();
    a.qp.post_send(&[write(2, a.sge(0, 8), 0, 0, true)]).unwrap();
    assert_eq!(write_seq(fake.recv().0), (0, false));
    assert_eq!(write_seq(fake.recv().0), (1, true));
    a.qp.post_send(&[write(3, a.sge(0, 8), 0, 0, false)]).unwrap();
    a.cq.poll(&mut []).unwrap();
    assert_eq!(write_seq(fake.recv().0), (2, false));
    // No other call: the helper sends it. The rules are `progress::doorbell` and
    // `sweep_steps` (unit tests); the bound of the live thread is the fake's 5 s read
    // timeout, as above.
    a.qp.post_send(&[write(4, a.sge(0, 8), 0, 0, false)]).unwrap();
    assert_eq!(write_seq(fake.recv().0), (3, false));
}

/// A signalled but deferrable post (a CTS signalled only to retire send-queue slots) is
/// held as an unsignalled one is: it goes ahead of the next post's frames, or at the next
/// poll; its completion comes once the peer acknowledged it.
#[test]
fn a_deferrable_signalled_post_goes_with_the_next_post_or_poll() {
    let p = devices(Mode::Tcp);
    let (mut a, mut fake) = end_and_fake(&p.0);
    let sge = a.sge(0, 8);
    let deferrable = |id| SendWr { deferrable: true, ..write(id, sge, 0, 0, true) };
    a.qp.post_send(&[deferrable(1)]).unwrap();
    a.qp.post_send(&[write(2, a.sge(0, 8), 0, 0, true)]).unwrap();
    assert_eq!(write_seq(fake.recv().0), (0, true), "held, then ahead of the next post (still asking for its ACK)");
    assert_eq!(write_seq(fake.recv().0), (1, true));
    a.qp.post_send(&[deferrable(3)]).unwrap();
    a.cq.poll(&mut []).unwrap();
    assert_eq!(write_seq(fake.recv().0), (2, true), "or at the next poll");
    fake.send(&Frame::Ack { dst_qpn: a.qp.qp_num(), seq: 2 });
    let mut wc = [Completion::default(); 4];
    let t = Instant::now();
    let mut got = Vec::new();
    while got.len() < 3 {
        assert!(t.elapsed() < Duration::from_secs(5), "completions {got:?}");
        let n = a.cq.poll(&mut wc).unwrap();
        got.extend(wc[..n].iter().map(|c| (c.wr_id, c.status)));
    }
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
}

/// A segment that began before its QP was fenced (rail failover): the rest of it does not
/// land, whatever it is (here zeros, as a frame its sender purged mid-way goes on): the
/// failover replays those bytes on the other rail, and a late tail landing after the replay
/// corrupted it (`failover` tests under load: zeros at a segment's end).
#[test]
fn the_rest_of_a_segment_begun_before_a_fence_does_not_land() {
    let p = devices(Mode::Tcp);
    let (mut a, mut fake) = end_and_fake(&p.0);
    let (qpn, addr, rkey) = (a.qp.qp_num(), a.addr(), a.key());
    fake.send(&Frame::Write { dst_qpn: qpn, seq: 0, addr, rkey, len: 4096, imm: None, ack_req: false });
    fake.s.write_all(&[7; 1024]).unwrap();
    let t = Instant::now();
    while a.region()[1016..1024] != [7; 8] {
        assert!(t.elapsed() < Duration::from_secs(5), "the first part was not placed");
        a.cq.poll(&mut []).unwrap();
    }
    a.qp.to_error().unwrap();
    fake.s.write_all(&[0; 3072]).unwrap();
    // Polled well past the time the rest takes to arrive and be read.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(100) {
        a.cq.poll(&mut []).unwrap();
    }
    assert!(a.region()[..1024].iter().all(|x| *x == 7), "what landed before the fence stays");
    assert!(a.region()[1024..].iter().all(|x| *x == 0xAA), "nothing of the rest landed");
}

/// A WRITE whose frames are on the wire when its QP fails: the frame begun goes on to its
/// end with the WRITE's own bytes (the ones not begun are dropped), then the CLOSE. Zeros
/// in its place let the peer complete a WRITE with a zero tail as if it were whole (a rail
/// failover then did not replay it).
#[test]
fn a_frame_begun_when_its_qp_fails_ends_with_its_own_bytes() {
    let p = devices(Mode::Tcp);
    let len = 32 << 20;
    let mut a = End::new(p.0.clone(), len, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    fill(a.region(), 5);
    let mut fake = Fake::dial(&a);
    fake.connect(&mut a, 4242);
    fake.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // More than the socket takes: the link stops inside a frame until the fake reads.
    a.qp.post_send(&[write(1, a.sge(0, len), 0x1000, 77, true)]).unwrap();
    a.qp.to_error().unwrap();
    let mut got = Vec::new();
    loop {
        let (f, payload) = fake.recv();
        match f {
            Frame::Write { dst_qpn: 4242, .. } | Frame::Data { dst_qpn: 4242, .. } => got.extend(payload),
            Frame::Close { dst_qpn: 4242, error: true, .. } => break,
            Frame::Ack { .. } | Frame::Connect { .. } => {}
            f => panic!("unexpected {f:?}"),
        }
        // The caller's polls (and the helper) move the rest as the fake reads.
        a.cq.poll(&mut []).unwrap();
    }
    assert!(!got.is_empty() && got.len() < len, "{} bytes: the QP failed inside the WRITE", got.len());
    let want = &a.region()[..got.len()];
    let bad = got.iter().zip(want).position(|(g, w)| g != w);
    assert_eq!(bad, None, "byte {bad:?} of {} differs (zeros: {})", got.len(), got[bad.unwrap_or(0)] == 0);
}
