//! Failover state shared by both engines.

use super::*;

#[test]
fn control_words_round_trip_and_seq_is_last() {
    let mut m = CtlMsg::new(CtlKind::Fenced, 1, 0xdead_beef);
    (m.base_seq, m.bitmap, m.flags, m.payload) = (1 << 40, 0x8000_0001, 0x1234, [1, 2, 3, 4]);
    let w = m.to_words(77, 5);
    assert_eq!(w[CTL_WORDS - 1], 77, "the sequence word ends the entry");
    assert_eq!(CtlMsg::from_words(&w), Some((m, 5)));
    let mut bad = w;
    bad[0] = bad[0] & !0xff | 9;
    assert_eq!(CtlMsg::from_words(&bad), None);
    bad = w;
    bad[0] |= 2 << 8;
    assert_eq!(CtlMsg::from_words(&bad), None, "rail 2 does not exist");
    assert_eq!(CTL_RING_BYTES, 512);
}

#[test]
fn qp_records_round_trip_through_a_control_entry() {
    let r = QpRecords { n: 5, words: [1, 2, 3, u64::MAX, 0x5555_aaaa_0000_ffff] };
    let m = CtlMsg::new(CtlKind::Rebuilt, 1, 9).with_records(&r);
    let (back, _) = CtlMsg::from_words(&m.to_words(3, 2)).expect("decodes");
    assert_eq!(back.records(), r);
    let short = QpRecords { n: 2, words: [7, 8, 0, 0, 0] };
    assert_eq!(CtlMsg::new(CtlKind::Rebuild, 0, 1).with_records(&short).records(), short);
}

#[test]
fn fenced_window_rules() {
    let mut m = CtlMsg::new(CtlKind::Fenced, 0, 0);
    (m.base_seq, m.bitmap) = (100, 0b101);
    assert!(m.part_seen(99), "before the window: completed");
    assert!(m.part_seen(100) && !m.part_seen(101) && m.part_seen(102));
    assert!(!m.part_seen(131) && !m.part_seen(132), "after the window: posted after the fence");
}
