use proptest::prelude::*;

use super::*;

fn info(b: u8) -> QpInfo {
    QpInfo([b; QP_INFO_LEN])
}

fn hello(qps: [u16; 2]) -> Hello {
    Hello {
        kind: 1,
        pieces: [qps[0].min(4) as u8, 1],
        qps,
        fifo_addr: 0x1000,
        fifo_rkeys: [5, 6],
        scratch_addr: 0x9000,
        qps_info: (0..qps[0] + qps[1]).map(|i| info(i as u8)).collect(),
    }
}

fn reply(qps: [u16; 2]) -> Reply {
    Reply {
        qps,
        records_addr: 7,
        records_rkeys: [8, 9],
        scratch_addr: 10,
        scratch_rkeys: [11, 12],
        qps_info: (0..qps[0] + qps[1]).map(|i| info(100 + i as u8)).collect(),
    }
}

fn foreign(b: &[u8]) -> Foreign {
    match decode(b) {
        Err(DecodeError::Foreign(f)) => f,
        r => panic!("not foreign: {r:?}"),
    }
}

#[test]
fn every_message_round_trips() {
    let h = hello([2, 1]);
    assert_eq!(decode(&h.encode()).unwrap(), Msg::Hello(h));
    let r = reply([1, 3]);
    assert_eq!(decode(&r.encode()).unwrap(), Msg::Reply(r));
    assert_eq!(decode(&ready()).unwrap(), Msg::Ready);
    assert_eq!(decode(&refusal("fabric 2, this side 1")).unwrap(), Msg::Refusal("fabric 2, this side 1".into()));
}

#[test]
fn the_largest_message_is_the_bound() {
    let big = reply([MAX_QPS, MAX_QPS]).encode();
    assert_eq!(big.len(), MAX_MSG);
    assert!(hello([MAX_QPS, MAX_QPS]).encode().len() <= MAX_MSG);
    let mut f = Frames::default();
    let mut wire = Vec::new();
    Frames::put(&mut wire, &big);
    f.push(&wire);
    assert_eq!(f.next_msg().unwrap().unwrap(), big);
    assert_eq!(f.buffered(), 0);
}

#[test]
fn malformed_messages_are_foreign() {
    let good = hello([1, 1]).encode();
    for n in 0..good.len() {
        assert!(matches!(decode(&good[..n]), Err(DecodeError::Foreign(_))), "truncated to {n}");
    }
    let mut long = good.clone();
    long.push(0);
    assert_eq!(foreign(&long), Foreign::Trailing("Hello", 1));
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(foreign(&bad), Foreign::BadMagic);
    let mut t = good.clone();
    t[6] = 9;
    assert_eq!(foreign(&t), Foreign::UnknownType(9));
    let mut r = good.clone();
    r[7] = 1;
    assert_eq!(foreign(&r), Foreign::Reserved("set-up message header"));
    // The striping byte: each rail's pieces in 1..=min(QPs, 4).
    assert_eq!(good[9], 0x11);
    for (byte, pieces) in [(0x00, [0, 0]), (0x10, [0, 1]), (0x12, [2, 1]), (0x21, [1, 2])] {
        let mut r = good.clone();
        r[9] = byte;
        assert_eq!(foreign(&r), Foreign::BadPieces(pieces, [1, 1]), "{byte:#x}");
    }
    let four = hello([4, 16]);
    assert_eq!(four.pieces, [4, 1]);
    let mut e = four.encode();
    assert_eq!(decode(&e), Ok(Msg::Hello(four.clone())));
    e[9] = 0x45;
    assert_eq!(foreign(&e), Foreign::BadPieces([5, 4], [4, 16]), "at most 4 pieces");
    e[9] = 0x44;
    assert!(matches!(decode(&e), Ok(Msg::Hello(h)) if h.pieces == [4, 4]));
    let mut qps = good.clone();
    qps[10] = 0;
    assert_eq!(foreign(&qps), Foreign::BadQps([0, 1]));
    let mut ready_long = ready();
    ready_long.push(1);
    assert_eq!(foreign(&ready_long), Foreign::Trailing("Ready", 1));
    assert!(foreign(b"GET / HTTP/1.0\r\n").to_string().contains("bad magic"));
}

#[test]
fn another_version_is_told_apart_from_a_stranger() {
    let mut v = hello([1, 1]).encode();
    v[4..6].copy_from_slice(&99u16.to_le_bytes());
    let e = decode(&v).unwrap_err();
    assert_eq!(e, DecodeError::Version(99));
    let text = e.to_string();
    assert!(text.contains("version 99") && text.contains(&format!("version {VERSION}")), "{text}");
    // The header alone is enough to say so (a later version's body is not ours to read).
    assert_eq!(decode(&v[..8]).unwrap_err(), DecodeError::Version(99));
    // Version 1 had a magic per message.
    let mut v1 = b"MPIH".to_vec();
    v1.extend_from_slice(&1u16.to_le_bytes());
    v1.extend_from_slice(&[1, 0, 1, 0, 1, 0]);
    assert_eq!(decode(&v1).unwrap_err(), DecodeError::Version(1));
    assert_eq!(decode(b"MPIY").unwrap_err(), DecodeError::Version(1));
}

#[test]
fn a_refusal_is_bounded_and_printable() {
    let long = "é".repeat(MAX_REFUSAL);
    let m = refusal(&long);
    assert!(m.len() <= HEADER + MAX_REFUSAL);
    let Msg::Refusal(t) = decode(&m).unwrap() else { panic!() };
    assert!(t.len() <= MAX_REFUSAL && t.chars().all(|c| c == '?'), "{t}");
    let mut ctl = header(REFUSAL, 3);
    ctl.extend_from_slice(b"a\nb");
    assert_eq!(decode(&ctl).unwrap(), Msg::Refusal("a?b".into()), "no line breaks into a log line");
    let mut over = header(REFUSAL, MAX_REFUSAL + 1);
    over.extend_from_slice(&[b'x'; MAX_REFUSAL + 1]);
    assert!(matches!(decode(&over), Err(DecodeError::Foreign(_))));
}

#[test]
fn frames_refuse_a_huge_length_before_its_body() {
    let mut f = Frames::default();
    f.push(&4_294_967_280u32.to_le_bytes()[..3]);
    assert_eq!(f.next_msg().unwrap(), None, "three bytes of a length");
    f.push(&[0xff]);
    assert_eq!(f.next_msg().unwrap_err(), DecodeError::Foreign(Foreign::TooLong(4_294_967_280)));
    assert!(f.buffered() <= 4, "nothing of the announced size was allocated or read");
    let mut f = Frames::default();
    let mut wire = Vec::new();
    Frames::put(&mut wire, &ready());
    Frames::put(&mut wire, b"");
    for b in &wire {
        f.push(std::slice::from_ref(b));
    }
    assert_eq!(f.next_msg().unwrap().unwrap(), ready());
    assert_eq!(f.next_msg().unwrap().unwrap(), b"");
    assert_eq!(f.next_msg().unwrap(), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes decode to a message or an error (no panic), and what decodes re-encodes to
    /// the same bytes.
    #[test]
    fn any_bytes_decode_totally(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        if let Ok(m) = decode(&bytes) {
            let again = match &m {
                Msg::Hello(h) => h.encode(),
                Msg::Reply(r) => r.encode(),
                Msg::Ready => ready(),
                Msg::Refusal(t) => refusal(t),
            };
            // A refusal's non-printable bytes become '?': only its length is kept.
            if !matches!(m, Msg::Refusal(_)) {
                prop_assert_eq!(again, bytes);
            }
        }
    }

    /// Bytes after a valid header are decoded as far as they go, never past the message.
    #[test]
    fn any_body_after_a_valid_header(t in 0u8..6, body in proptest::collection::vec(any::<u8>(), 0..1700)) {
        let mut m = header(t, body.len());
        m.extend_from_slice(&body);
        let _ = decode(&m);
        let mut f = Frames::default();
        let mut wire = Vec::new();
        Frames::put(&mut wire, &m);
        f.push(&wire);
        match f.next_msg() {
            Ok(Some(got)) => prop_assert_eq!(got, m),
            Ok(None) => prop_assert!(false, "a whole frame was not returned"),
            Err(e) => prop_assert!(m.len() > MAX_MSG, "{e}"),
        }
    }
}
