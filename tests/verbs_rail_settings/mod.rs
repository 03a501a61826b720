//! The rails' settings, applied: each rail's QPs take the attributes its `MPIB_*`/`NCCL_IB_*`
//! settings name (service level, traffic class, P_Key, GID rules), checked on the QPs a
//! plugin over the two ports builds. Part of `tests/verbs_device.rs` (same guest, same ports).

use std::sync::Arc;
use std::time::Instant;

use mpib::config::Config;
use mpib::fabric::verbs::{GidType, QpAttrs, VerbsDevice};
use mpib::fabric::{Device, LinkLayer};
use mpib::plugin::instance::Plugin;
use mpib::plugin::setup::FabricKind;
use mpib::plugin::{AbiVersion, CommHandle, HANDLE_BYTES, discover};

use super::{checks, config, open, port_spec};

/// A plugin over the guest's two ports as one rail pair (SOUT = port 0, SUP = port 1),
/// configured by `vars`.
fn plugin_with(vars: &[(&str, &str)]) -> Plugin<VerbsDevice> {
    mpib::abi::logger::install();
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let all = [&[("MPIB_HCA_SOUT", d0.as_str()), ("MPIB_HCA_SUP", d1.as_str())][..], vars].concat();
    let cfg: &'static Config = Box::leak(Box::new(config(&all)));
    let pairs = discover::verbs_pairs(cfg).expect("verbs_pairs");
    Plugin::new(FabricKind::Verbs, pairs, cfg, Box::leak(Box::new(mpib::plugin::instance_state::InstanceState::new())))
}

/// A send and a receive comm connected to each other through `p` (both ends here), the
/// send comm's communicator of traffic class `comm_tc` (v10's `connect` argument).
fn connected(p: &Plugin<VerbsDevice>, comm_tc: Option<i32>) -> (CommHandle, CommHandle) {
    let abi = AbiVersion::V10;
    let mut handle = [0u8; HANDLE_BYTES];
    let listen = p.listen(abi, None, 0, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let t0 = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(t0.elapsed() < checks::WAIT, "set-up did not complete");
        if send.is_none() {
            send = p.connect(abi, None, 0, &mut handle, comm_tc).expect("connect");
        }
        if recv.is_none() {
            recv = p.accept(listen).expect("accept");
        }
    }
    (send.unwrap(), recv.unwrap())
}

/// What each rail's QPs of `comm` hold, as the device reports them.
fn qp_attrs(p: &Plugin<VerbsDevice>, comm: CommHandle) -> [Vec<QpAttrs>; 2] {
    p.with_qps(comm, |rails| rails.map(|qps| qps.iter().map(|q| q.query().expect("ibv_query_qp")).collect()))
        .expect("comm")
}

/// rxe keeps no service level in a QP's address vector (`rxe_av_from_attr` copies the GRH
/// and the port only): `ibv_query_qp` reads 0 whatever was set.
fn keeps_sl(p: &Plugin<VerbsDevice>, rail: usize) -> bool {
    let pair = p.devices.pairs[0];
    !p.devices.nics[pair[rail]].dev.attrs().name.starts_with("rxe")
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn qp_attributes_follow_each_rails_settings() {
    let (gid0, gid1) = (open(0).gid_index(), open(1).gid_index());
    let ip1 = (open(1).attrs().link_layer == LinkLayer::Ethernet).then(|| {
        let g = open(1).gid();
        format!("{}.{}.{}.{}/32", g[12], g[13], g[14], g[15])
    });
    let gid0s = gid0.to_string();
    // SOUT from NCCL's variables where mpib's are not set, SUP from mpib's per-rail ones;
    // timeout from NCCL's, retry count from mpib's over NCCL's; 2 QPs a rail from NCCL's.
    let mut vars = vec![
        ("NCCL_IB_TC", "106"),
        ("NCCL_IB_FIFO_TC", "208"),
        ("MPIB_SOUT_SL", "3"),
        ("NCCL_IB_SL", "5"),
        ("MPIB_SUP_TC", "41"),
        ("MPIB_SUP_CTS_TC", "96"),
        ("MPIB_SOUT_GID_INDEX", gid0s.as_str()),
        ("NCCL_IB_TIMEOUT", "17"),
        ("NCCL_IB_RETRY_CNT", "7"),
        ("MPIB_RETRY_CNT", "5"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ];
    if let Some(r) = ip1.as_deref() {
        vars.push(("MPIB_SUP_ADDR_RANGE", r)); // rxe1's own address: its IPv4 GID
    }
    let p = plugin_with(&vars);
    let roce = open(0).attrs().link_layer == LinkLayer::Ethernet;
    let (send, recv) = connected(&p, Some(72));
    // (rail, traffic class of the send comm's QPs, of the receive comm's, service level, GID)
    let want = [(0, 106, 208, 3, gid0), (1, 41, 96, 5, gid1)];
    for (rail, tc, cts_tc, sl, gid) in want {
        for (comm, tc, what) in [(send, tc, "send"), (recv, cts_tc, "receive")] {
            let attrs = qp_attrs(&p, comm);
            assert_eq!(attrs[rail].len(), 2, "{what} comm, rail {rail}: NCCL_IB_QPS_PER_CONNECTION=2");
            for (i, a) in attrs[rail].iter().enumerate() {
                let at = format!("{what} comm, rail {rail}, QP {i}: {a:?}");
                assert_eq!(a.state, 3, "RTS: {at}");
                assert_eq!((a.timeout, a.retry_cnt), (17, 5), "{at}");
                assert!(a.is_global || !roce, "RoCE addresses by GID: {at}");
                if a.is_global {
                    assert_eq!((a.traffic_class, a.sgid_index), (tc, gid), "{at}");
                }
                if keeps_sl(&p, rail) {
                    assert_eq!(a.service_level, sl, "{at}");
                }
            }
        }
    }
    // No class set anywhere: the communicator's (v10 connect's), as net_ib; the receive comm's
    // context has none: 0.
    let p = plugin_with(&[("MPIB_SL", "1")]);
    let (send, recv) = connected(&p, Some(72));
    let (sa, ra) = (qp_attrs(&p, send), qp_attrs(&p, recv));
    assert_eq!(sa.iter().chain(&ra).map(|r| r.len()).collect::<Vec<_>>(), [1, 1, 1, 1], "one QP a rail by default");
    for a in sa.iter().flatten().filter(|a| a.is_global) {
        assert_eq!(a.traffic_class, 72, "{a:?}");
    }
    for a in ra.iter().flatten().filter(|a| a.is_global) {
        assert_eq!(a.traffic_class, 0, "{a:?}");
    }
}

/// The partition reaches every QP of both comms: `ibv_query_qp` shows the P_Key index
/// `MPIB_PKEY` names (Soft-RoCE has one entry, the default partition 0xffff at index 0; on
/// an InfiniBand host `MPIB_TEST_PKEY_INDEX` names another index its ports have), and an
/// index a port's table does not have fails when the device opens, naming the table.
#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn pkey_index_as_configured() {
    let index = std::env::var("MPIB_TEST_PKEY_INDEX").unwrap_or_else(|_| "0".to_string());
    let want: u16 = index.parse().expect("MPIB_TEST_PKEY_INDEX");
    let p = plugin_with(&[("MPIB_PKEY", index.as_str())]);
    let (send, recv) = connected(&p, None);
    for comm in [send, recv] {
        let attrs = qp_attrs(&p, comm);
        for a in attrs.iter().flatten() {
            assert_eq!((a.state, a.pkey_index), (3, want), "RTS, with the configured P_Key index: {a:?}");
        }
        assert_eq!(attrs.iter().flatten().count(), 2, "a QP on each rail");
    }
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1), ("NCCL_IB_PKEY", "65535")]);
    let e = discover::verbs_pairs(&cfg).err().expect("an index beyond every table");
    let msg = e.msg();
    assert!(
        msg.contains("P_Key index 65535 (MPIB_PKEY, else NCCL_IB_PKEY)") && msg.contains("has no P_Key there"),
        "{e}"
    );
    assert!(msg.contains("0=0x"), "the table is named: {e}");
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn gid_rules_per_rail_choose_or_refuse() {
    if open(0).attrs().link_layer != LinkLayer::Ethernet {
        eprintln!("not RoCE: skipped");
        return;
    }
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let g1 = open(1).gid();
    let in_range = format!("{}.{}.{}.{}/32", g1[12], g1[13], g1[14], g1[15]);
    // The range picks SUP's GID; SOUT keeps the automatic one.
    let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1), ("MPIB_SUP_ADDR_RANGE", &in_range)]);
    let pairs = discover::verbs_pairs(&cfg).expect("verbs_pairs");
    assert_eq!((pairs[0].sout.gid_index(), pairs[0].sup.gid_index()), (open(0).gid_index(), open(1).gid_index()));
    assert_eq!(pairs[0].sup.gid_type(), Some(GidType::RoceV2));
    // RoCE v1 asked for where the device has none (rxe: v2 only): still a usable GID.
    let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1), ("NCCL_IB_ROCE_VERSION_NUM", "1")]);
    let pairs = discover::verbs_pairs(&cfg).expect("a preference, not a filter");
    assert!(pairs[0].sout.gid()[0] != 0xfe, "never link-local");
    // A range no GID of the SUP port is in: set-up refuses, naming the variable and the port.
    let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1), ("NCCL_IB_ADDR_RANGE", "198.51.100.0/24")]);
    let e = discover::verbs_pairs(&cfg).err().expect("no GID in the range");
    assert!(e.msg().contains("NCCL_IB_ADDR_RANGE=198.51.100.0/24") && e.msg().contains("no usable RoCE GID"), "{e}");
    // One port as both rails with different rules: SOUT's (said in a WARN).
    let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d0), ("MPIB_SUP_GID_INDEX", "0")]);
    let pairs = discover::verbs_pairs(&cfg).expect("verbs_pairs");
    assert!(Arc::ptr_eq(&pairs[0].sout, &pairs[0].sup) && pairs[0].sout.gid_index() == open(0).gid_index());
}
