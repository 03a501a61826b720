//! How a QP reaches its peer: the address vector of its RTR transition, as net_ib builds
//! it (`ncclIbQpRtr`).
//!
//! - RoCE: always a GRH; the GID is the address.
//! - InfiniBand: the peer's LID; a GRH when the two ports are in different subnets (the low
//!   16 bits of their GIDs' subnet prefixes differ) or the local port requires one
//!   (`IBV_QPF_GRH_REQUIRED`, e.g. a virtual function). Across subnets (routed IB) the
//!   destination LID is the peer's FLID, bits 16..31 of its GID's subnet prefix; a peer in
//!   another subnet without one is addressed by its LID, with a WARN.

use super::qp_info::{PortInfo, RemoteQp};

/// The GRH of an address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// What the RTR transition's `ah_attr` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    /// InfiniBand's destination LID (0 on RoCE).
    pub dlid: u16,
    pub grh: Option<Grh>,
}

/// The local subnet part of a GID's subnet prefix (its low 16 bits).
fn local_subnet(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// The FLID of a GID: bits 16..31 of its subnet prefix (0: none).
pub fn flid(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// The address vector from `local` to `remote` with traffic class `tc`; the warning to log,
/// if any.
pub fn address_vector(local: &PortInfo, remote: &RemoteQp, tc: u8) -> (AddressVector, Option<String>) {
    let grh = Grh { dgid: remote.gid, sgid_index: local.gid_index, hop_limit: 255, traffic_class: tc };
    if local.is_roce() {
        return (AddressVector { dlid: 0, grh: Some(grh) }, None);
    }
    let same_subnet = local_subnet(&local.gid) == local_subnet(&remote.gid);
    let mut av = AddressVector { dlid: remote.lid, grh: None };
    let mut warning = None;
    if !same_subnet {
        match flid(&remote.gid) {
            0 => {
                warning = Some(format!(
                    "the peer (LID {:#x}) is in another subnet but its GID has no FLID: addressed by its LID",
                    remote.lid
                ))
            }
            f => av.dlid = f,
        }
    }
    if !same_subnet || local.grh_required {
        av.grh = Some(grh);
    }
    (av, warning)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::verbs::sys::{LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND};

    fn ib_gid(subnet: u16, flid: u16, guid: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xfe, 0x80]);
        g[4..6].copy_from_slice(&flid.to_be_bytes());
        g[6..8].copy_from_slice(&subnet.to_be_bytes());
        g[15] = guid;
        g
    }

    fn local(link_layer: u8, gid: [u8; 16], grh_required: bool) -> PortInfo {
        PortInfo {
            link_layer,
            port: 1,
            lid: 0x11,
            mtu: 5,
            gid,
            gid_index: 1,
            rd_atomic_responder: 16,
            rd_atomic_initiator: 16,
            grh_required,
            pkey_index: 0,
        }
    }

    fn remote(link_layer: u8, gid: [u8; 16], lid: u16) -> RemoteQp {
        RemoteQp { link_layer, port: 1, qpn: 7, psn: 1, lid, mtu: 5, rd_atomic_granted: 16, gid, gid_index: 1 }
    }

    #[test]
    fn roce_always_routes_by_gid() {
        let g = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2];
        let (av, w) = address_vector(&local(LINK_LAYER_ETHERNET, g, false), &remote(LINK_LAYER_ETHERNET, g, 0), 106);
        let grh = Grh { dgid: g, sgid_index: 1, hop_limit: 255, traffic_class: 106 };
        assert_eq!((av, w), (AddressVector { dlid: 0, grh: Some(grh) }, None));
    }

    #[test]
    fn infiniband_in_one_subnet_uses_the_lid_alone_unless_the_port_requires_a_grh() {
        let (a, b) = (ib_gid(0x0001, 0, 1), ib_gid(0x0001, 0, 2));
        let (av, w) =
            address_vector(&local(LINK_LAYER_INFINIBAND, a, false), &remote(LINK_LAYER_INFINIBAND, b, 0x22), 0);
        assert_eq!((av, w), (AddressVector { dlid: 0x22, grh: None }, None));
        // A virtual function's port (IBV_QPF_GRH_REQUIRED): the same LID, with a GRH.
        let (av, _) =
            address_vector(&local(LINK_LAYER_INFINIBAND, a, true), &remote(LINK_LAYER_INFINIBAND, b, 0x22), 0);
        assert_eq!(av.dlid, 0x22);
        assert_eq!(av.grh.map(|g| (g.dgid, g.sgid_index)), Some((b, 1)));
    }

    #[test]
    fn routed_infiniband_goes_to_the_peers_flid_with_a_grh() {
        // Different local subnets (low 16 bits of the prefix); the FLID bits alone differing
        // is the same subnet.
        let a = ib_gid(0x0001, 0x0a00, 1);
        let b = ib_gid(0x0002, 0x0b00, 2);
        let (av, w) =
            address_vector(&local(LINK_LAYER_INFINIBAND, a, false), &remote(LINK_LAYER_INFINIBAND, b, 0x22), 0);
        assert_eq!(av.dlid, 0x0b00, "the peer's FLID");
        assert!(av.grh.is_some() && w.is_none());
        let same = ib_gid(0x0001, 0x0b00, 2);
        let (av, _) =
            address_vector(&local(LINK_LAYER_INFINIBAND, a, false), &remote(LINK_LAYER_INFINIBAND, same, 0x22), 0);
        assert_eq!(av, AddressVector { dlid: 0x22, grh: None }, "one subnet: the LID, no GRH");
        // Another subnet and no FLID: the LID, said in a WARN.
        let nof = ib_gid(0x0002, 0, 2);
        let (av, w) =
            address_vector(&local(LINK_LAYER_INFINIBAND, a, false), &remote(LINK_LAYER_INFINIBAND, nof, 0x22), 0);
        assert_eq!(av.dlid, 0x22);
        assert!(av.grh.is_some());
        assert!(w.is_some_and(|w| w.contains("no FLID")));
    }
}
