//! The host's PCI topology as sysfs shows it: where each RDMA device and each NVIDIA GPU
//! sits in the PCI tree, and on which NUMA node. Everything is read under a root directory
//! (`/` on a host, a synthetic tree in tests), so pairing is tested on made-up machines.
//!
//! PCI paths are sysfs paths as NCCL's `pciPath` is: `/sys/devices/pci0000:00/0000:00:01.0/
//! 0000:01:00.0/…/0000:03:00.0`, one component per bridge on the way from the root complex
//! (`pci0000:00`) to the device. Two devices whose paths share the root complex and at least
//! one bridge after it are under one PCIe root port or switch (NCCL's PIX/PXB); sharing only
//! the root complex is NCCL's PHB.

use std::path::{Path, PathBuf};

/// sysfs under a root directory.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

/// PCI vendor id of NVIDIA.
const NVIDIA: &str = "0x10de";

impl Sysfs {
    /// The host's own sysfs.
    pub fn host() -> Sysfs {
        Sysfs { root: PathBuf::from("/") }
    }

    /// sysfs as found under `root` (`root/sys/...`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// `path` resolved (symlinks followed) and given as seen from the root: `/sys/...`.
    fn resolve(&self, path: &Path) -> Option<String> {
        let real = std::fs::canonicalize(path).ok()?;
        let root = std::fs::canonicalize(&self.root).ok()?;
        let rel = real.strip_prefix(&root).ok()?;
        Some(format!("/{}", rel.to_string_lossy()))
    }

    fn read(&self, pci_path: &str, file: &str) -> Option<String> {
        let p = self.root.join(pci_path.trim_start_matches('/')).join(file);
        std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
    }

    /// The PCI path of RDMA device `dev` (the realpath of `/sys/class/infiniband/<dev>/
    /// device`), `None` for virtual devices (rxe, siw) or a path that is not a PCI device.
    pub fn nic_pci_path(&self, dev: &str) -> Option<String> {
        let p = self.resolve(&self.root.join("sys/class/infiniband").join(dev).join("device"))?;
        p.starts_with("/sys/devices/pci").then_some(p)
    }

    /// The PCI paths of the host's NVIDIA GPUs (vendor 0x10de, class 0x0300 VGA or 0x0302
    /// 3D controller), sorted.
    pub fn gpus(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.root.join("sys/bus/pci/devices")) else { return Vec::new() };
        let mut out: Vec<String> = dir
            .filter_map(|e| self.resolve(&e.ok()?.path()))
            .filter(|p| {
                let class = self.read(p, "class").unwrap_or_default();
                self.read(p, "vendor").is_some_and(|v| v.eq_ignore_ascii_case(NVIDIA))
                    && (class.starts_with("0x0300") || class.starts_with("0x0302"))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The NUMA node of the PCI device at `pci_path` (`None`: unknown, or -1).
    pub fn numa_node(&self, pci_path: &str) -> Option<i32> {
        self.read(pci_path, "numa_node")?.parse().ok().filter(|n: &i32| *n >= 0)
    }
}

/// The components of a PCI path after `/sys/devices`: the root complex, then each bridge
/// and the device.
fn components(path: &str) -> impl Iterator<Item = &str> {
    path.trim_start_matches("/sys/devices").split('/').filter(|c| !c.is_empty())
}

/// How many leading components two PCI paths share (0 when either is unknown).
pub fn affinity(a: Option<&str>, b: Option<&str>) -> usize {
    match (a, b) {
        (Some(a), Some(b)) => components(a).zip(components(b)).take_while(|(x, y)| x == y).count(),
        _ => 0,
    }
}

/// Shared components that put two devices under one PCIe root port or switch: the root
/// complex and at least one bridge below it.
pub const UNDER_ONE_SWITCH: usize = 2;

/// The PCI device a path names, without its function: `0000:3b:00` of `…/0000:3b:00.1`.
/// Two ports of one NIC (functions of one device) have the same.
pub fn pci_device(path: &str) -> Option<&str> {
    let last = components(path).last()?;
    Some(last.rsplit_once('.').map_or(last, |(d, _)| d))
}

/// The GPU nearest to a device at `pci_path`: the one sharing the most of its PCI path, if
/// they are under one root port or switch (ties: the first GPU).
pub fn nearest_gpu(pci_path: Option<&str>, gpus: &[String]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, g) in gpus.iter().enumerate() {
        let a = affinity(pci_path, Some(g));
        if a >= UNDER_ONE_SWITCH && best.is_none_or(|(_, b)| a > b) {
            best = Some((i, a));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
pub mod fake {
    //! Synthetic sysfs trees for tests.

    use std::path::{Path, PathBuf};

    /// A temporary sysfs tree, removed on drop.
    pub struct FakeSys {
        pub root: PathBuf,
    }

    impl FakeSys {
        pub fn new(tag: &str) -> FakeSys {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let root = std::env::temp_dir().join(format!("mpib-sysfs-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("sys/class/infiniband")).unwrap();
            std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
            FakeSys { root }
        }

        /// Adds a PCI device at `path` (`pci0000:00/0000:00:01.0/…`, below
        /// `/sys/devices`) with its class, vendor and NUMA node.
        pub fn pci(&self, path: &str, class: &str, vendor: &str, numa: i32) -> &Self {
            let dir = self.root.join("sys/devices").join(path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
            std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
            let bdf = path.rsplit('/').next().unwrap();
            link(&self.root.join("sys/bus/pci/devices").join(bdf), &format!("../../../devices/{path}"));
            self
        }

        /// An NVIDIA GPU (3D controller) at `path`.
        pub fn gpu(&self, path: &str, numa: i32) -> &Self {
            self.pci(path, "0x030200", "0x10de", numa)
        }

        /// A Mellanox NIC at `path` whose RDMA device is `dev`.
        pub fn nic(&self, dev: &str, path: &str, numa: i32) -> &Self {
            self.pci(path, "0x020700", "0x15b3", numa);
            let d = self.root.join("sys/class/infiniband").join(dev);
            std::fs::create_dir_all(&d).unwrap();
            link(&d.join("device"), &format!("../../../devices/{path}"));
            self
        }

        /// A virtual RDMA device (rxe): no `device` link.
        pub fn virtual_nic(&self, dev: &str) -> &Self {
            std::fs::create_dir_all(self.root.join("sys/class/infiniband").join(dev)).unwrap();
            self
        }

        pub fn sysfs(&self) -> super::Sysfs {
            super::Sysfs::at(&self.root)
        }
    }

    fn link(at: &Path, target: &str) {
        let _ = std::fs::remove_file(at);
        std::os::unix::fs::symlink(target, at).unwrap();
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSys;
    use super::*;

    #[test]
    fn nics_gpus_and_numa_nodes_from_a_synthetic_tree() {
        let f = FakeSys::new("read");
        f.nic("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", 0)
            .nic("mlx5_1", "pci0000:80/0000:80:01.0/0000:81:00.1", -1)
            .gpu("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0", 0)
            .pci("pci0000:00/0000:00:02.0/0000:05:00.0", "0x030000", "0x1a03", 0) // a BMC's VGA
            .pci("pci0000:00/0000:00:03.0", "0x030000", "0x10de", 0) // an NVIDIA VGA GPU
            .virtual_nic("rxe0");
        let s = f.sysfs();
        let a = s.nic_pci_path("mlx5_0").unwrap();
        assert_eq!(a, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0");
        assert_eq!(s.nic_pci_path("rxe0"), None, "virtual: no device link");
        assert_eq!(s.nic_pci_path("nosuch"), None);
        assert_eq!(
            s.gpus(),
            vec![
                "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0".to_string(),
                "/sys/devices/pci0000:00/0000:00:03.0".to_string(),
            ]
        );
        assert_eq!(s.numa_node(&a), Some(0));
        assert_eq!(s.numa_node(&s.nic_pci_path("mlx5_1").unwrap()), None, "-1 is unknown");
        assert_eq!(nearest_gpu(Some(&a), &s.gpus()), Some(0), "under one root port");
        assert_eq!(pci_device(&s.nic_pci_path("mlx5_1").unwrap()), Some("0000:81:00"));
    }

    #[test]
    fn affinity_counts_shared_bridges() {
        let a = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
        let b = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0";
        let c = "/sys/devices/pci0000:00/0000:00:02.0";
        assert_eq!(affinity(Some(a), Some(b)), 3);
        assert_eq!(affinity(Some(a), Some(c)), 1, "the root complex only (PHB)");
        assert_eq!(affinity(None, Some(c)), 0);
        assert_eq!(nearest_gpu(Some(a), &[c.to_string()]), None, "a GPU on another root port is not near");
        assert_eq!(nearest_gpu(Some(a), &[c.to_string(), b.to_string()]), Some(1));
    }
}
