//! GPU buffers are never read by the CPU: a send from memory registered as GPU memory
//! (`CpuAccess::NicOnly`) never becomes an inline WR, whatever its size, split or shape;
//! the same send from host memory does (so these tests can tell the difference).

use super::harness::*;
use crate::engine::{CpuAccess, SendBuf};
use crate::fabric::WrOpcode;
use crate::split::{AnySplit, Fixed};

/// Sends `lens` (one receive each, or all in one multi-receive) from buffers of `cpu`
/// access with a 64-byte inline limit; returns the data WRs the sender posted.
fn data_wrs(cpu: CpuAccess, percent: u8, lens: &[usize], multi: bool) -> Vec<crate::fabric::SendWr> {
    let mut p = Pair::new(Opts { split: AnySplit::Fixed(Fixed::percent(percent)), max_inline: 64, ..Opts::default() });
    let groups: Vec<Vec<usize>> = if multi { vec![lens.to_vec()] } else { lens.iter().map(|&l| vec![l]).collect() };
    for (g, group) in groups.iter().enumerate() {
        let mut rbufs = Vec::new();
        let mut sends = Vec::new();
        for (i, &len) in group.iter().enumerate() {
            let data = pattern((g * 16 + i) as u64, len);
            let sa = p.send_buf(&data);
            let ra = p.recv_buf(len.max(1));
            rbufs.push(rbuf(ra, len.max(1) as u64, i as u32));
            sends.push((sa, len, i as u32, ra, data));
        }
        let rid = p.irecv(&rbufs).unwrap();
        p.deliver_all();
        let mut sids = Vec::new();
        for &(sa, len, tag, _, _) in &sends {
            let sb = SendBuf { cpu, ..sbuf(sa, len as u64, tag) };
            sids.push(p.isend(sb).unwrap().expect("CTS was delivered"));
        }
        p.deliver_all();
        p.test_recv(rid).unwrap().expect("receive complete");
        for sid in sids {
            p.test_send(sid).unwrap().expect("send complete");
        }
        for (_, len, _, ra, data) in &sends {
            assert_eq!(p.rs.space.read(*ra, *len), *data, "payload of {len} bytes");
        }
    }
    // Data WRs are the sender's WRs that write into the receive buffers: their SGE is the
    // send buffer (the completion-record writes come from the sizes region).
    p.log
        .iter()
        .filter(|(d, _, _, wr)| *d == Dir::ToRecv && wr.opcode != WrOpcode::Read && wr.num_sge > 0)
        .map(|(_, _, _, wr)| *wr)
        .filter(|wr| wr.sge[0].lkey == 71 || wr.sge[0].lkey == 72)
        .collect()
}

const SMALL: [usize; 6] = [1, 8, 63, 64, 100, 128];

#[test]
fn host_memory_small_sends_go_inline() {
    for percent in [0u8, 50, 100] {
        let wrs = data_wrs(CpuAccess::Readable, percent, &SMALL, false);
        assert!(!wrs.is_empty());
        for wr in &wrs {
            assert_eq!(wr.inline, wr.bytes() <= 64, "host memory, {} bytes, split {percent}%", wr.bytes());
        }
        assert!(wrs.iter().any(|w| w.inline), "some of them inline (split {percent}%)");
    }
}

#[test]
fn gpu_memory_is_never_posted_inline() {
    for percent in [0u8, 50, 100] {
        for multi in [false, true] {
            let wrs = data_wrs(CpuAccess::NicOnly, percent, &SMALL, multi);
            assert!(!wrs.is_empty(), "split {percent}% multi {multi}: data was posted");
            for wr in &wrs {
                assert!(!wr.inline, "a GPU buffer posted inline: {wr:?} (split {percent}%, multi {multi})");
            }
        }
    }
}

#[test]
fn a_send_buffer_not_known_to_be_host_memory_is_not_inlined() {
    // The safe default: a SendBuf built without saying what memory it is.
    assert_eq!(SendBuf::default().cpu, CpuAccess::NicOnly);
}
