//! What each ABI version's `getProperties` reports for the two kinds of device NCCL sees
//! from v9 on: a NIC shown as itself, and a rail pair NCCL fused (`plugin/devices.rs`).

use super::*;
use crate::fabric::MemTypes;
use crate::plugin::nic_pair::VDevs;

/// NIC device 1 of the NCCL view: one NIC, its PCI path, rail 3 / plane 0 given by the user.
fn nic() -> Properties {
    Properties {
        dev: 1,
        name: c"mlx5_1",
        pci_path: Some(c"/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0"),
        guid: 0x1122,
        mem_types: MemTypes::HOST | MemTypes::CUDA | MemTypes::DMABUF,
        reg_is_global: true,
        force_flush: false,
        speed_mbps: 400_000,
        port: 1,
        latency_us: 0.0,
        max_comms: 1000,
        max_recvs: 8,
        max_p2p_bytes: 1 << 30,
        max_coll_bytes: 1 << 30,
        max_multi_request_size: 1,
        vdevs: VDevs::one(1),
        rail: Some(3),
        plane: Some(0),
    }
}

/// Device 4 that NCCL fused from NIC devices 0 and 1: both speeds, no rail in common.
fn fused() -> Properties {
    Properties {
        dev: 4,
        name: c"mlx5_0+mlx5_1",
        speed_mbps: 800_000,
        vdevs: VDevs { n: 2, devs: [0, 1] },
        rail: None,
        plane: None,
        ..nic()
    }
}

fn s(p: *mut std::ffi::c_char) -> String {
    // SAFETY: the conversions point at the properties' 'static C strings.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

const HOST_CUDA_DMABUF: c_int = 0x7;

#[test]
fn v6_to_v8_report_the_device_without_fusion_fields() {
    for p in [nic(), fused()] {
        let v6 = props_v6(&p);
        assert_eq!(
            (s(v6.name), v6.speed, v6.port, v6.ptrSupport, v6.maxRecvs),
            (p.name.to_string_lossy().into_owned(), p.speed_mbps, 1, HOST_CUDA_DMABUF, 8)
        );
        assert_eq!(s(v6.pciPath), "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0");
        assert_eq!((v6.guid, v6.maxComms), (0x1122, 1000));
        let v7 = props_v7(&p);
        assert_eq!((v7.speed, v7.netDeviceType, v7.netDeviceVersion), (p.speed_mbps, 0, 0));
        let v8 = props_v8(&p);
        assert_eq!((v8.regIsGlobal, v8.speed, v8.netDeviceType), (1, p.speed_mbps, 0));
    }
}

#[test]
fn v9_to_v11_report_the_fused_nics_in_vprops() {
    let v = props_v9(&nic());
    assert_eq!((v.vProps.ndevs, v.vProps.devs), (1, [1, 0, 0, 0]), "a NIC device: itself");
    assert_eq!((v.forceFlush, v.maxP2pBytes, v.maxCollBytes), (0, 1 << 30, 1 << 30));
    let v = props_v9(&fused());
    assert_eq!((v.vProps.ndevs, v.vProps.devs), (2, [0, 1, 0, 0]), "fused: both NIC devices");
    assert_eq!((s(v.name), v.speed), ("mlx5_0+mlx5_1".into(), 800_000));
    let v = props_v11(&fused());
    assert_eq!((v.vProps.ndevs, v.vProps.devs, v.maxMultiRequestSize), (2, [0, 1, 0, 0], 1));
    let v = props_v11(&nic());
    assert_eq!((v.vProps.ndevs, v.vProps.devs[0]), (1, 1));
}

#[test]
fn v12_adds_rail_and_plane_ids() {
    let v = props_v12(&nic());
    assert_eq!((v.vProps.ndevs, v.vProps.devs), (1, [1, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!((v.railId, v.planeId), (3, 0), "the ids the user gave the NIC");
    let v = props_v12(&fused());
    assert_eq!((v.vProps.ndevs, &v.vProps.devs[..2]), (2, &[0, 1][..]));
    assert_eq!((v.railId, v.planeId), (-1, -1), "NCCL_NET_ID_UNDEF where unknown");
    assert_eq!((s(v.name), v.speed, v.maxMultiRequestSize, v.regIsGlobal), ("mlx5_0+mlx5_1".into(), 800_000, 1, 1));
}

#[test]
fn the_tables_offer_make_vdevice_from_v9() {
    assert!(ncclNetPlugin_v9.makeVDevice.is_some());
    assert!(ncclNetPlugin_v10.makeVDevice.is_some());
    assert!(ncclNetPlugin_v11.makeVDevice.is_some());
    assert!(ncclNetPlugin_v12.makeVDevice.is_some());
}
