//! The two device views and `makeVDevice`, over in-process soft devices given made-up PCI
//! positions (the fusion rules look only at the NICs' PCI paths and NUMA nodes).

use std::sync::Arc;

use super::*;
use crate::fabric::soft::{self, SoftDevice, SoftOptions};
use crate::plugin::discover::NicMeta;

fn nic(name: &str) -> Arc<SoftDevice> {
    Arc::new(soft::open(&SoftOptions::inproc(name, &soft::InprocNet::new())).expect("inproc device"))
}

fn meta(pci: Option<&str>, numa: Option<i32>) -> NicMeta {
    NicMeta { pci_path: pci.map(|p| format!("/sys/devices/pci0000:00/0000:00:01.0/{p}")), numa, ..NicMeta::default() }
}

fn pair(a: &Arc<SoftDevice>, b: &Arc<SoftDevice>, ma: NicMeta, mb: NicMeta) -> FoundPair<SoftDevice> {
    FoundPair { sout: a.clone(), sup: b.clone(), meta: [ma, mb] }
}

fn name(d: &NicPair<SoftDevice>) -> String {
    d.props.name.to_string_lossy().into_owned()
}

const V8: AbiVersion = AbiVersion::V8;
const V12: AbiVersion = AbiVersion::V12;

#[test]
fn two_pci_nics_are_two_devices_for_nccl_to_fuse_from_v9() {
    let (a, b) = (nic("mlx5_0"), nic("mlx5_1"));
    let t = Devices::new(
        vec![pair(&a, &b, meta(Some("0000:02:00.0"), Some(0)), meta(Some("0000:03:00.0"), Some(0)))],
        NcclDevices::Auto,
    );
    // v6 - v8: one device, the pair.
    assert_eq!(t.len(V8), 1);
    let p = t.get(V8, 0).unwrap();
    assert_eq!((name(&p), p.shape, p.props.vdevs.as_slice()), ("mlx5_0+mlx5_1".into(), Shape::Pair, &[0][..]));
    // v9+: the NICs, each alone carrying both rails, and NCCL told to fuse them.
    assert_eq!((t.len(V12), t.base_len()), (2, 2));
    let (d0, d1) = (t.get(V12, 0).unwrap(), t.get(V12, 1).unwrap());
    assert_eq!((name(&d0), name(&d1)), ("mlx5_0".into(), "mlx5_1".into()));
    assert!(Arc::ptr_eq(&d0.rails[0], &d0.rails[1]) && Arc::ptr_eq(&d0.rails[0], &a));
    assert_eq!((d0.shape, d0.props.vdevs.as_slice(), d1.props.vdevs.as_slice()), (Shape::Nic, &[0][..], &[1][..]));
    assert_eq!(d0.props.speed_mbps, a.attrs().speed_mbps as i32, "one NIC, both rails: one NIC's speed");
    assert!(d0.props.pci_path.unwrap().to_string_lossy().ends_with("0000:02:00.0"));
    assert_eq!(t.force_merge().as_deref(), Some("mlx5_0:1,mlx5_1:1"));
    assert_eq!(t.seen(V12, 0), Seen::Fused(0, 1));
    assert_eq!(t.seen(V8, 0), Seen::Device(0));
    // NCCL fuses them, in its order (device index order): SOUT stays SOUT.
    let f = t.make_vdevice(&[1, 0]).unwrap();
    assert_eq!((f, t.len(V12), t.len(V8)), (2, 3, 1));
    let fd = t.get(V12, 2).unwrap();
    assert_eq!((name(&fd), fd.shape, fd.props.vdevs.as_slice()), ("mlx5_0+mlx5_1".into(), Shape::Fused, &[0, 1][..]));
    assert!(Arc::ptr_eq(&fd.rails[0], &a) && Arc::ptr_eq(&fd.rails[1], &b));
    assert_eq!(fd.props.speed_mbps, (a.attrs().speed_mbps + b.attrs().speed_mbps) as i32, "two NICs: the sum");
    assert_eq!(fd.props.dev, 2);
}

#[test]
fn make_vdevice_takes_pairs_and_lone_devices_and_refuses_the_rest() {
    let (a, b, c, d) = (nic("m0"), nic("m1"), nic("m2"), nic("m3"));
    let m = |p: &str| meta(Some(p), Some(0));
    let t = Devices::new(
        vec![pair(&a, &b, m("0000:02:00.0"), m("0000:03:00.0")), pair(&c, &d, m("0000:04:00.0"), m("0000:05:00.0"))],
        NcclDevices::Auto,
    );
    assert_eq!(t.force_merge().as_deref(), Some("m0:1,m1:1;m2:1,m3:1"));
    let e = t.make_vdevice(&[0, 2]).unwrap_err();
    assert!(
        e.msg().contains("mpib fuses only its rail pairs ([0] m0 + [1] m1, [2] m2 + [3] m3), not [0] m0 + [2] m2"),
        "{e}"
    );
    assert!(t.make_vdevice(&[0, 0]).is_err(), "a device with itself");
    assert!(t.make_vdevice(&[0, 1, 2]).unwrap_err().msg().contains("of 3 devices"));
    assert!(t.make_vdevice(&[]).is_err());
    assert!(t.make_vdevice(&[4]).unwrap_err().msg().contains("only the 4 devices mpib lists first"));
    assert!(t.make_vdevice(&[-1]).is_err());
    // NCCL 2.24 - 2.27 give every device left over a virtual device of its own.
    let alias = t.make_vdevice(&[2]).unwrap();
    let al = t.get(V12, alias).unwrap();
    assert_eq!((name(&al), al.props.dev, al.props.vdevs.as_slice()), ("m2".into(), 4, &[2][..]));
    assert_eq!(t.make_vdevice(&[2, 3]).unwrap(), 5);
    assert!(t.make_vdevice(&[4]).is_err(), "a made device is not fused again");
}

#[test]
fn pairs_nccl_cannot_fuse_stay_one_device() {
    let (a, b) = (nic("mlx5_0"), nic("mlx5_1"));
    let cases = [
        ("no PCI path (rxe, soft)", meta(None, None), meta(None, None)),
        ("different NUMA nodes", meta(Some("0000:02:00.0"), Some(0)), meta(Some("0000:82:00.0"), Some(1))),
        ("two functions of one card", meta(Some("0000:02:00.0"), Some(0)), meta(Some("0000:02:00.1"), Some(0))),
    ];
    for (why, ma, mb) in cases {
        let t = Devices::new(vec![pair(&a, &b, ma, mb)], NcclDevices::Auto);
        assert_eq!((t.len(V12), t.len(V8)), (1, 1), "{why}");
        assert_eq!(name(&t.get(V12, 0).unwrap()), "mlx5_0+mlx5_1", "{why}");
        assert_eq!(t.force_merge(), None, "{why}");
        assert_eq!(t.seen(V12, 0), Seen::Device(0), "{why}");
        assert!(t.make_vdevice(&[0]).is_ok(), "{why}: a lone device is still accepted");
    }
    // MPIB_NCCL_DEVICES=pairs: never; =nics: whatever the PCI paths.
    let t = Devices::new(
        vec![pair(&a, &b, meta(Some("0000:02:00.0"), Some(0)), meta(Some("0000:03:00.0"), Some(0)))],
        NcclDevices::Pairs,
    );
    assert_eq!((t.len(V12), t.force_merge()), (1, None));
    let t = Devices::new(vec![pair(&a, &b, meta(None, None), meta(None, None))], NcclDevices::Nics);
    assert_eq!((t.len(V12), t.force_merge().as_deref()), (2, Some("mlx5_0:1,mlx5_1:1")));
}

#[test]
fn both_rails_on_one_port_is_one_nics_device() {
    let a = nic("rxe0");
    let t = Devices::new(
        vec![pair(&a, &a, meta(Some("0000:02:00.0"), Some(0)), meta(Some("0000:02:00.0"), Some(0)))],
        NcclDevices::Nics,
    );
    assert_eq!((t.len(V12), t.force_merge()), (1, None), "nothing to fuse");
    let d = t.get(V12, 0).unwrap();
    assert_eq!((name(&d), d.props.speed_mbps), ("rxe0+rxe0".into(), a.attrs().speed_mbps as i32));
    assert_eq!(t.nics.len(), 1, "one NIC, one registration cache");
}

#[test]
fn nic_names_nccl_would_confuse_are_not_shown_apart() {
    // Two ports of one device in two pairs: NCCL keys its topology by name ("mlx5_0" twice).
    let (x1, x2, y, z) = (nic("mlx5_0"), nic("mlx5_0"), nic("mlx5_1"), nic("mlx5_2"));
    let m = |p: &str| meta(Some(p), Some(0));
    let t = Devices::new(
        vec![pair(&x1, &y, m("0000:02:00.0"), m("0000:03:00.0")), pair(&x2, &z, m("0000:02:00.1"), m("0000:04:00.0"))],
        NcclDevices::Auto,
    );
    assert_eq!((t.len(V12), t.force_merge()), (2, None));
}

#[test]
fn rail_and_plane_ids_survive_only_where_both_nics_agree() {
    let (a, b) = (nic("mlx5_0"), nic("mlx5_1"));
    let with = |rail, plane| NicMeta { rail, plane, ..meta(Some("0000:02:00.0"), Some(0)) };
    let mb = NicMeta { rail: Some(3), plane: Some(1), ..meta(Some("0000:03:00.0"), Some(0)) };
    let t = Devices::new(vec![pair(&a, &b, with(Some(3), Some(0)), mb)], NcclDevices::Auto);
    assert_eq!(
        (t.get(V12, 0).unwrap().props.rail, t.get(V12, 0).unwrap().props.plane),
        (Some(3), Some(0)),
        "a NIC device: its own"
    );
    let f = t.make_vdevice(&[0, 1]).unwrap();
    let p = t.get(V12, f).unwrap().props;
    assert_eq!((p.rail, p.plane), (Some(3), None), "fused: the rail both have, no plane");
}

#[test]
fn registrations_are_shared_by_every_device_on_a_nic() {
    let (a, b) = (nic("m0"), nic("m1"));
    let t = Devices::new(
        vec![pair(&a, &b, meta(Some("0000:02:00.0"), Some(0)), meta(Some("0000:03:00.0"), Some(0)))],
        NcclDevices::Auto,
    );
    let f = t.make_vdevice(&[0, 1]).unwrap();
    let (fused, alone) = (t.get(V12, f).unwrap(), t.get(V12, 0).unwrap());
    let buf = vec![0u8; 8192];
    let m1 = fused.reg_mr(buf.as_ptr() as u64, 8192, crate::fabric::MemTypes::HOST).unwrap();
    let m2 = alone.reg_mr(buf.as_ptr() as u64, 8192, crate::fabric::MemTypes::HOST).unwrap();
    assert_eq!(fused.cached_registrations(), [1, 1], "one registration per NIC");
    assert_eq!(m1.info.keys[0], m2.info.keys[0], "the same NIC registration through both devices");
    // A part of the buffer is a registration of its own (its rkey reaches that part only).
    let m3 = alone.reg_mr(buf.as_ptr() as u64, 4096, crate::fabric::MemTypes::HOST).unwrap();
    assert_eq!(fused.cached_registrations(), [2, 1]);
    assert_ne!(m3.info.keys[0], m1.info.keys[0]);
    m1.release().unwrap();
    m2.release().unwrap();
    m3.release().unwrap();
    assert_eq!(fused.cached_registrations(), [0, 0]);
}

#[test]
fn gpu_memory_is_refused_where_a_rail_cannot_register_it() {
    // The soft fabric copies with the CPU: it never advertises CUDA, so a CUDA registration
    // is refused (and none can ever reach its data path).
    let (a, b) = (nic("s0"), nic("s1"));
    let t = Devices::new(vec![pair(&a, &b, NicMeta::default(), NicMeta::default())], NcclDevices::Auto);
    let d = t.get(V12, 0).unwrap();
    assert!(!d.props.mem_types.contains(crate::fabric::MemTypes::CUDA));
    let buf = [0u8; 64];
    let Err(e) = d.reg_mr(buf.as_ptr() as u64, 64, crate::fabric::MemTypes::CUDA) else { panic!("registered") };
    assert!(e.msg().contains("regMr of") && e.msg().contains("CUDA"), "{e}");
    assert!(d.reg_dmabuf(buf.as_ptr() as u64, 64, 0, 3).is_err());
}
