//! Port and device properties computed from what libibverbs and sysfs report: link speed,
//! MTU, the NIC's PCI path, and which kinds of GPU memory can be registered.

use std::path::Path;

/// Link speed in Mbit/s from `ibv_port_attr`'s `active_width`, `active_speed` and
/// `active_speed_ex` (the same per-lane figures as net_ib; RoCE NICs report their Ethernet
/// speed in these fields too). Unknown codes count as 1 lane / SDR.
pub fn speed_mbps(active_width: u8, active_speed: u8, active_speed_ex: u32) -> u32 {
    let lanes = match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    let code = if active_speed_ex != 0 { active_speed_ex } else { active_speed as u32 };
    let per_lane = match code {
        1 => 2_500,     // SDR
        2 => 5_000,     // DDR
        4 => 10_000,    // QDR
        8 => 10_000,    // FDR10
        16 => 14_000,   // FDR
        32 => 25_000,   // EDR
        64 => 50_000,   // HDR
        128 => 100_000, // NDR
        256 => 200_000, // XDR
        _ => 2_500,
    };
    lanes * per_lane
}

/// Bytes of an `enum ibv_mtu` value (1 = 256 … 5 = 4096); 0 for an unknown value.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// The sysfs PCI path of a device: the realpath of `/sys/class/infiniband/<dev>/device`;
/// `None` for virtual devices (rxe, siw) that have no such link.
pub fn pci_path(dev: &str) -> Option<String> {
    pci_path_under(Path::new("/sys/class/infiniband"), dev)
}

fn pci_path_under(class_dir: &Path, dev: &str) -> Option<String> {
    std::fs::canonicalize(class_dir.join(dev).join("device")).ok().map(|p| p.to_string_lossy().into_owned())
}

/// The files whose presence means GPU peer memory (nv_peermem / the MLNX OFED peer-memory
/// client) is loaded, as net_ib checks them.
pub const PEER_MEMORY_FILES: &[&str] = &[
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/module/nvidia_peermem/version",
];

/// Whether CUDA memory can be registered with plain `ibv_reg_mr`.
pub fn peer_memory_loaded() -> bool {
    PEER_MEMORY_FILES.iter().any(|f| Path::new(f).exists())
}

/// Reads the result of the DMA-BUF probe (`ibv_reg_dmabuf_mr` with fd -1): the kernel and
/// library support DMA-BUF when the call got as far as rejecting the fd, i.e. failed with
/// something other than "not supported".
pub fn dmabuf_supported_from_errno(errno: i32) -> bool {
    errno != libc::EOPNOTSUPP && errno != libc::EPROTONOSUPPORT && errno != libc::ENOSYS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_match_the_ib_tables() {
        assert_eq!(speed_mbps(1, 1, 0), 2_500, "rxe under qemu: 1X SDR");
        assert_eq!(speed_mbps(2, 32, 0), 100_000, "4X EDR = 100 Gb/s");
        assert_eq!(speed_mbps(2, 64, 0), 200_000, "4X HDR");
        assert_eq!(speed_mbps(2, 128, 0), 400_000, "4X NDR");
        assert_eq!(speed_mbps(2, 0, 256), 800_000, "4X XDR via active_speed_ex");
        assert_eq!(speed_mbps(16, 64, 0), 100_000, "2X HDR");
        assert_eq!(speed_mbps(8, 16, 0), 168_000, "12X FDR");
        assert_eq!(speed_mbps(99, 99, 0), 2_500, "unknown codes: 1X SDR");
    }

    #[test]
    fn mtu_enum_to_bytes() {
        assert_eq!([1, 2, 3, 4, 5].map(mtu_bytes), [256, 512, 1024, 2048, 4096]);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(6), 0);
    }

    #[test]
    fn pci_path_is_the_realpath_of_the_device_link() {
        let root = std::env::temp_dir().join(format!("mpib-pci-{}", std::process::id()));
        let pci = root.join("devices/pci0000:00/0000:00:02.0/0000:3b:00.1");
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::create_dir_all(root.join("class/mlx5_1")).unwrap();
        std::fs::create_dir_all(root.join("class/rxe0")).unwrap();
        let _ = std::fs::remove_file(root.join("class/mlx5_1/device"));
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:02.0/0000:3b:00.1",
            root.join("class/mlx5_1/device"),
        )
        .unwrap();
        let got = pci_path_under(&root.join("class"), "mlx5_1").unwrap();
        assert!(got.ends_with("/devices/pci0000:00/0000:00:02.0/0000:3b:00.1"), "{got}");
        assert!(!got.contains(".."), "{got}");
        assert_eq!(pci_path_under(&root.join("class"), "rxe0"), None, "virtual device: no link");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn dmabuf_probe_reading() {
        assert!(!dmabuf_supported_from_errno(libc::EOPNOTSUPP), "old kernel or libibverbs");
        assert!(!dmabuf_supported_from_errno(libc::EPROTONOSUPPORT));
        assert!(dmabuf_supported_from_errno(libc::EBADF), "the fd -1 itself was rejected");
        assert!(dmabuf_supported_from_errno(libc::EINVAL));
    }
}
