//! What one verbs QP tells its peer (the 48-byte [`QpInfo`]), and the local port facts it
//! is built from.
//!
//! Layout (little-endian integers):
//! ```text
//!  0  magic 'V'        1  version (1)      2  link layer (1 IB, 2 Ethernet)   3  port
//!  4  qpn (u32)        8  psn (u32, 24 bits)                                 12  lid (u16)
//! 14  path MTU (enum ibv_mtu, 1..5)       15  responder resources granted (max_dest_rd_atomic)
//! 16  GID (16 bytes, network order)       32  GID index (informational)      33..48 zero
//! ```

use crate::error::{Error, Result};
use crate::fabric::{QP_INFO_LEN, QpInfo};

use super::sys::{LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND};

const MAGIC: u8 = b'V';
const VERSION: u8 = 1;

/// The local port a QP lives on: everything the peer needs besides the QP number and PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub link_layer: u8,
    pub port: u8,
    pub lid: u16,
    /// The port's active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    pub gid: [u8; 16],
    pub gid_index: u8,
    /// RDMA READs this end lets a peer keep outstanding (`max_dest_rd_atomic`).
    pub rd_atomic_responder: u8,
    /// RDMA READs this end may keep outstanding as initiator (`max_rd_atomic`).
    pub rd_atomic_initiator: u8,
    /// The port requires a GRH on every packet (`IBV_QPF_GRH_REQUIRED`: virtual functions).
    pub grh_required: bool,
    /// The P_Key table index QPs use (`pkey.rs`).
    pub pkey_index: u16,
}

impl PortInfo {
    pub fn is_roce(&self) -> bool {
        self.link_layer == LINK_LAYER_ETHERNET
    }
}

/// The decoded connection info of a remote QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    pub link_layer: u8,
    pub port: u8,
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub mtu: u8,
    pub rd_atomic_granted: u8,
    pub gid: [u8; 16],
    pub gid_index: u8,
}

/// Serializes a local QP's info.
pub fn encode(port: &PortInfo, qpn: u32, psn: u32) -> QpInfo {
    let mut b = [0u8; QP_INFO_LEN];
    b[0] = MAGIC;
    b[1] = VERSION;
    b[2] = port.link_layer;
    b[3] = port.port;
    b[4..8].copy_from_slice(&qpn.to_le_bytes());
    b[8..12].copy_from_slice(&(psn & 0xff_ffff).to_le_bytes());
    b[12..14].copy_from_slice(&port.lid.to_le_bytes());
    b[14] = port.mtu;
    b[15] = port.rd_atomic_responder;
    b[16..32].copy_from_slice(&port.gid);
    b[32] = port.gid_index;
    QpInfo(b)
}

/// Parses a peer's info; a clear error for anything that is not a verbs QP of this version.
pub fn decode(info: &QpInfo) -> Result<RemoteQp> {
    let b = &info.0;
    let bad = |what: String| Err(Error::remote(format!("peer QP info is not valid for the verbs fabric: {what}")));
    if b[0] != MAGIC {
        return bad(format!(
            "magic {:#04x}, expected {MAGIC:#04x} (is the peer running another fabric? check MPIB_FABRIC on both sides)",
            b[0]
        ));
    }
    if b[1] != VERSION {
        return bad(format!("version {}, this mpib speaks {VERSION}", b[1]));
    }
    if b[2] != LINK_LAYER_INFINIBAND && b[2] != LINK_LAYER_ETHERNET {
        return bad(format!("link layer {}", b[2]));
    }
    if !(1..=5).contains(&b[14]) {
        return bad(format!("path MTU code {}", b[14]));
    }
    if b[33..].iter().any(|x| *x != 0) {
        return bad("reserved bytes are not zero".to_string());
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[16..32]);
    Ok(RemoteQp {
        link_layer: b[2],
        port: b[3],
        qpn: u32_at(4),
        psn: u32_at(8) & 0xff_ffff,
        lid: u16::from_le_bytes([b[12], b[13]]),
        mtu: b[14],
        rd_atomic_granted: b[15],
        gid,
        gid_index: b[32],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port() -> PortInfo {
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 192, 0, 2, 1]);
        PortInfo {
            link_layer: LINK_LAYER_ETHERNET,
            port: 1,
            lid: 0,
            mtu: 3,
            gid,
            gid_index: 1,
            rd_atomic_responder: 16,
            rd_atomic_initiator: 16,
            grh_required: false,
            pkey_index: 0,
        }
    }

    #[test]
    fn round_trip() {
        let p = port();
        let info = encode(&p, 0x00ab_cdef, 0x0012_3456);
        let r = decode(&info).unwrap();
        assert_eq!(
            r,
            RemoteQp {
                link_layer: LINK_LAYER_ETHERNET,
                port: 1,
                qpn: 0x00ab_cdef,
                psn: 0x0012_3456,
                lid: 0,
                mtu: 3,
                rd_atomic_granted: 16,
                gid: p.gid,
                gid_index: 1,
            }
        );
        let ib = PortInfo { link_layer: LINK_LAYER_INFINIBAND, lid: 0xbeef, mtu: 5, ..p };
        let r = decode(&encode(&ib, 7, 0xffff_ffff)).unwrap();
        assert_eq!(
            (r.lid, r.mtu, r.psn, r.link_layer),
            (0xbeef, 5, 0xff_ffff, LINK_LAYER_INFINIBAND),
            "PSN is 24 bits"
        );
    }

    #[test]
    fn rejects_what_is_not_a_verbs_qp() {
        let good = encode(&port(), 1, 2);
        assert!(decode(&QpInfo::default()).unwrap_err().msg().contains("MPIB_FABRIC"));
        let mutate = |i: usize, v: u8| {
            let mut q = good;
            q.0[i] = v;
            decode(&q).unwrap_err().msg().to_string()
        };
        assert!(mutate(1, 2).contains("version 2"));
        assert!(mutate(2, 3).contains("link layer 3"));
        assert!(mutate(14, 0).contains("path MTU code 0"));
        assert!(mutate(14, 6).contains("path MTU code 6"));
        assert!(mutate(47, 1).contains("reserved"));
    }
}
