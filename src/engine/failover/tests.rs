//! Failover state shared by both engines.

use super::*;

#[test]
fn control_words_round_trip_and_seq_is_last() {
    let mut m = CtlMsg::new(CtlKind::Fenced, 1, 0xdead_beef);
    (m.base_seq, m.bitmap, m.flags) = (1 << 40, 0x8000_0001, 0x1234);
    m.payload = std::array::from_fn(|i| i as u64 + 1);
    let w = m.to_words(77, 5);
    assert_eq!(w[CTL_WORDS - 1], 77, "the sequence word ends the entry");
    assert_eq!(w[CTL_WORDS - 2], CTL_PAYLOAD_WORDS as u64, "the payload's last word just before it");
    assert_eq!(CtlMsg::from_words(&w), Some((m, 5)));
    let mut bad = w;
    bad[0] = bad[0] & !0xff | 9;
    assert_eq!(CtlMsg::from_words(&bad), None);
    bad = w;
    bad[0] &= !0xff;
    assert_eq!(CtlMsg::from_words(&bad), None, "kind 0 is none of mpib's");
    bad = w;
    bad[0] |= 2 << 8;
    assert_eq!(CtlMsg::from_words(&bad), None, "rail 2 does not exist");
    assert_eq!((CTL_ENTRY_BYTES, CTL_WORDS, CTL_PAYLOAD_WORDS), (256, 32, 28));
    assert_eq!(CTL_RING_BYTES, 2048);
}

#[test]
fn qp_records_of_sixteen_qps_round_trip_through_a_control_entry() {
    // 16 QPs: 16 x 12 varying bytes + the port's 16-byte address = 208 bytes, 26 words.
    let mut r = QpRecords { n: 26, ..QpRecords::default() };
    for (i, w) in r.words[..26].iter_mut().enumerate() {
        *w = 0x5555_aaaa_0000_0000 | (i as u64) << 8 | 0xff;
    }
    r.words[25] = u64::MAX;
    for kind in [CtlKind::Rebuild, CtlKind::Rebuilt] {
        let m = CtlMsg::new(kind, 1, 9).with_records(&r);
        let w = m.to_words(3, 2);
        assert_eq!(w[CTL_WORDS - 1], 3, "the sequence word still ends the entry");
        let (back, ack) = CtlMsg::from_words(&w).expect("decodes");
        assert_eq!((back.kind, back.rail, back.epoch, ack), (kind, 1, 9, 2));
        assert_eq!(back.records(), r, "every record word, the 26th too");
    }
    let short = QpRecords { n: 2, words: std::array::from_fn(|i| if i < 2 { 7 + i as u64 } else { 0 }) };
    assert_eq!(CtlMsg::new(CtlKind::Rebuild, 0, 1).with_records(&short).records(), short);
    // The whole payload is records; a count beyond it is none mpib writes.
    let full = QpRecords { n: QP_RECORD_WORDS as u8, words: [u64::MAX; QP_RECORD_WORDS] };
    let w = CtlMsg::new(CtlKind::Rebuilt, 0, 1).with_records(&full).to_words(1, 0);
    assert_eq!(CtlMsg::from_words(&w).map(|(m, _)| m.records()), Some(full));
    let mut over = w;
    over[0] += 1 << 16;
    assert_eq!(CtlMsg::from_words(&over), None, "29 record words do not fit a 28-word payload");
}

#[test]
fn fenced_window_rules() {
    let mut m = CtlMsg::new(CtlKind::Fenced, 0, 0);
    (m.base_seq, m.bitmap) = (100, 0b101);
    assert!(m.part_seen(99), "before the window: completed");
    assert!(m.part_seen(100) && !m.part_seen(101) && m.part_seen(102));
    assert!(!m.part_seen(131) && !m.part_seen(132), "after the window: posted after the fence");
}
