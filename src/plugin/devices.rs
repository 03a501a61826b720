//! Which devices NCCL sees, per ABI version, and NIC fusion (`makeVDevice`).
//!
//! NCCL builds its topology from each device's `pciPath` (`src/graph/topo.cc`:
//! `ncclTopoPopulateNics` → `ncclTopoFillNet`): a device is one NIC at one PCI position,
//! with that NIC's PCIe link. A rail pair shown as one device therefore sits at SOUT's
//! position with SOUT's link, and NCCL never learns where SUP is. From ABI v9 (NCCL 2.24) a
//! plugin may instead show its NICs and let NCCL fuse them (`ncclTopoMakeVNics` calls
//! `makeVDevice`); NCCL then places the fused device at the NICs' common PCI parent, with
//! their links added up (`ncclTopoGetVNicParent`), and hides the NICs it fused
//! (`ncclTopoUpdateVNics`). So:
//!
//! - **pair view** (ABI v6–v8, where there is no `makeVDevice`, and `MPIB_NCCL_DEVICES=
//!   pairs`): device k is rail pair k.
//! - **NCCL view** (ABI v9+): first the base devices: the two NICs of every pair that NCCL
//!   can fuse (two PCI devices on one NUMA node: NCCL refuses to fuse across NUMA nodes and
//!   cannot place NICs without a PCI device), and every other pair as one device; then the
//!   devices `makeVDevice` made. A base NIC device NCCL uses as it is carries both rails.
//!
//! NCCL fuses only NICs within `NCCL_NET_MERGE_LEVEL` (default `PORT`: ports of one NIC)
//! unless `NCCL_NET_FORCE_MERGE` names groups, so `init` publishes the pairs there (see
//! [`Devices::force_merge`]); DESIGN.md has the code references. `makeVDevice` accepts
//! exactly the configured pairs (either order) and lone devices (NCCL 2.24–2.27 "fuse" each
//! device left over into a virtual device of its own); anything else is refused.

use std::sync::Arc;

use parking_lot::RwLock;

use super::AbiVersion;
use super::discover::FoundPair;
use super::discover::topology::pci_device;
use super::nic_pair::{Nic, NicPair, Shape};
use crate::config::NcclDevices;
use crate::engine::RAILS;
use crate::error::{Error, Result};
use crate::fabric::Device;

/// Most devices the NCCL view may grow to (`makeVDevice` appends one per call; NCCL calls
/// it once per group it fuses, once per process).
const MAX_DEVICES: usize = 256;

/// A pair NCCL may fuse: its NICs' base device indices (SOUT, SUP) and the pair's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fusable {
    devs: [i32; RAILS],
    pair: usize,
}

/// The plugin's devices: its NICs, its rail pairs, and the two views of them.
pub struct Devices<D: Device> {
    pub nics: Vec<Arc<Nic<D>>>,
    /// Rail pairs, as NIC indices (SOUT, SUP).
    pub pairs: Vec<[usize; RAILS]>,
    /// One device per rail pair.
    pair_view: Vec<Arc<NicPair<D>>>,
    /// Base devices, then the ones `makeVDevice` made.
    nccl_view: RwLock<Vec<Arc<NicPair<D>>>>,
    base: usize,
    fusable: Vec<Fusable>,
    /// How the NCCL view shows each rail pair.
    seen: Vec<Seen>,
}

/// How NCCL's view shows a rail pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// As one device (its index).
    Device(usize),
    /// As two NIC devices (SOUT's, SUP's) for NCCL to fuse.
    Fused(usize, usize),
}

/// Whether NCCL can fuse the two NICs of a pair (see the module doc).
fn can_fuse<D: Device>(a: &Nic<D>, b: &Nic<D>, mode: NcclDevices) -> bool {
    match mode {
        NcclDevices::Pairs => false,
        NcclDevices::Nics => true,
        NcclDevices::Auto => match (&a.meta.pci_path, &b.meta.pci_path) {
            // Two functions of one PCI device are one card: shown as one device, the pair
            // already sits at its true position.
            (Some(x), Some(y)) => pci_device(x) != pci_device(y) && a.meta.numa == b.meta.numa,
            _ => false,
        },
    }
}

impl<D: Device> Devices<D> {
    pub fn new(pairs: Vec<FoundPair<D>>, mode: NcclDevices) -> Self {
        let mut nics: Vec<Arc<Nic<D>>> = Vec::new();
        let mut nic_of = |dev: &Arc<D>, meta: &super::discover::NicMeta| -> usize {
            if let Some(i) = nics.iter().position(|n| Arc::ptr_eq(&n.dev, dev)) {
                return i;
            }
            nics.push(Arc::new(Nic::new(dev.clone(), meta.clone())));
            nics.len() - 1
        };
        let pairs: Vec<[usize; RAILS]> =
            pairs.iter().map(|p| [nic_of(&p.sout, &p.meta[0]), nic_of(&p.sup, &p.meta[1])]).collect();
        let pair_view: Vec<Arc<NicPair<D>>> = pairs
            .iter()
            .enumerate()
            .map(|(k, &[a, b])| Arc::new(NicPair::new(k, [nics[a].clone(), nics[b].clone()], Shape::Pair, &[k as i32])))
            .collect();
        let mut fuse: Vec<bool> = pairs.iter().map(|&[a, b]| a != b && can_fuse(&nics[a], &nics[b], mode)).collect();
        // NCCL keys its topology by device name: two NIC devices of one name (two ports of
        // one device in different pairs) would be one node to it. Such pairs stay pairs.
        let name = |i: usize| nics[i].dev.attrs().name.clone();
        let shown: Vec<usize> = pairs.iter().zip(&fuse).filter(|(_, f)| **f).flat_map(|(p, _)| *p).collect();
        for (k, p) in pairs.iter().enumerate() {
            let clash = |i: usize| shown.iter().any(|&j| j != i && name(j) == name(i));
            if fuse[k] && (clash(p[0]) || clash(p[1])) {
                fuse[k] = false;
            }
        }
        let mut view: Vec<Arc<NicPair<D>>> = Vec::new();
        let mut nic_dev: Vec<Option<i32>> = vec![None; nics.len()];
        let mut fusable = Vec::new();
        let mut seen = Vec::new();
        for (k, &[a, b]) in pairs.iter().enumerate() {
            if !fuse[k] {
                let i = view.len();
                view.push(Arc::new(NicPair::new(i, [nics[a].clone(), nics[b].clone()], Shape::Pair, &[i as i32])));
                seen.push(Seen::Device(i));
                continue;
            }
            let mut devs = [0; RAILS];
            for (r, n) in [a, b].into_iter().enumerate() {
                devs[r] = *nic_dev[n].get_or_insert_with(|| {
                    let i = view.len();
                    view.push(Arc::new(NicPair::new(i, [nics[n].clone(), nics[n].clone()], Shape::Nic, &[i as i32])));
                    i as i32
                });
            }
            fusable.push(Fusable { devs, pair: k });
            seen.push(Seen::Fused(devs[0] as usize, devs[1] as usize));
        }
        let base = view.len();
        Devices { nics, pairs, pair_view, nccl_view: RwLock::new(view), base, fusable, seen }
    }

    /// How `abi` sees rail pair `k`.
    pub fn seen(&self, abi: AbiVersion, k: usize) -> Seen {
        if Self::nccl_view(abi) { self.seen[k] } else { Seen::Device(k) }
    }

    /// Whether calls through `abi` see the NCCL view (else the pair view).
    fn nccl_view(abi: AbiVersion) -> bool {
        abi >= AbiVersion::V9
    }

    /// Number of devices `abi` sees.
    pub fn len(&self, abi: AbiVersion) -> usize {
        if Self::nccl_view(abi) { self.nccl_view.read().len() } else { self.pair_view.len() }
    }

    /// Number of base devices of the NCCL view (the ones NCCL may fuse).
    pub fn base_len(&self) -> usize {
        self.base
    }

    /// Device `dev` as `abi` sees it.
    pub fn get(&self, abi: AbiVersion, dev: i32) -> Result<Arc<NicPair<D>>> {
        let found = |v: &[Arc<NicPair<D>>]| usize::try_from(dev).ok().and_then(|i| v.get(i).cloned());
        let (got, n) = if Self::nccl_view(abi) {
            let v = self.nccl_view.read();
            (found(&v), v.len())
        } else {
            (found(&self.pair_view), self.pair_view.len())
        };
        got.ok_or_else(|| Error::invalid_argument(format!("device {dev} does not exist (there are {n})")))
    }

    /// Drops the devices `makeVDevice` made. NCCL 2.28+ unload the plugin when its last
    /// communicator is finalized and load it again for the next one (`ncclNetPluginUnload`,
    /// `src/plugin/net.cc`); this library stays loaded, and NCCL, starting afresh, reads
    /// `devices()` as the number of NICs it may fuse: it must be the base devices again.
    pub fn forget_made(&self) {
        self.nccl_view.write().truncate(self.base);
    }

    /// Every device of the NCCL view (base and made), for logs.
    pub fn nccl_devices(&self) -> Vec<Arc<NicPair<D>>> {
        self.nccl_view.read().clone()
    }

    /// The value of `NCCL_NET_FORCE_MERGE` that makes NCCL fuse each pair of NIC devices
    /// (`mlx5_0:1,mlx5_1:1;…`, NCCL's `parseStringList` syntax: exact names, ports), or
    /// `None` when no pair is shown as NICs.
    pub fn force_merge(&self) -> Option<String> {
        let v = self.nccl_view.read();
        let entry = |d: i32| {
            let a = v[d as usize].rails[0].attrs();
            format!("{}:{}", a.name, a.port)
        };
        let groups: Vec<String> =
            self.fusable.iter().map(|f| format!("{},{}", entry(f.devs[0]), entry(f.devs[1]))).collect();
        (!groups.is_empty()).then(|| groups.join(";"))
    }

    /// The pairs NCCL may fuse, in words (for errors).
    fn fusable_text(&self, v: &[Arc<NicPair<D>>]) -> String {
        if self.fusable.is_empty() {
            return "none".to_string();
        }
        let name = |d: i32| format!("[{d}] {}", v[d as usize].props.name.to_string_lossy());
        self.fusable.iter().map(|f| format!("{} + {}", name(f.devs[0]), name(f.devs[1]))).collect::<Vec<_>>().join(", ")
    }

    /// `makeVDevice`: a new device fusing base devices `devs`; returns its index. Accepts one
    /// device (an alias of it) or the two NIC devices of one rail pair, in either order.
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<i32> {
        let mut v = self.nccl_view.write();
        if v.len() >= MAX_DEVICES {
            return Err(Error::invalid_usage(format!(
                "makeVDevice: already {} devices (at most {MAX_DEVICES})",
                v.len()
            )));
        }
        if let Some(&d) = devs.iter().find(|&&d| d < 0 || d as usize >= self.base) {
            return Err(Error::invalid_argument(format!(
                "makeVDevice of device {d}: only the {} devices mpib lists first can be fused",
                self.base
            )));
        }
        let i = v.len();
        let made = match devs {
            [d] => Arc::new(v[*d as usize].alias(i, *d)),
            [x, y] => {
                let Some(f) = self.fusable.iter().find(|f| f.devs == [*x, *y] || f.devs == [*y, *x]) else {
                    let name = |d: i32| format!("[{d}] {}", v[d as usize].props.name.to_string_lossy());
                    return Err(Error::invalid_usage(format!(
                        "makeVDevice: mpib fuses only its rail pairs ({}), not {} + {} (MPIB_HCA_SOUT/MPIB_HCA_SUP set the pairs)",
                        self.fusable_text(&v),
                        name(*x),
                        name(*y)
                    )));
                };
                let [a, b] = self.pairs[f.pair];
                Arc::new(NicPair::new(i, [self.nics[a].clone(), self.nics[b].clone()], Shape::Fused, &f.devs))
            }
            _ => {
                return Err(Error::invalid_usage(format!(
                    "makeVDevice of {} devices: mpib fuses two NICs (SOUT and SUP), or takes one as it is",
                    devs.len()
                )));
            }
        };
        log::info!(
            target: "mpib::abi",
            "NCCL made device [{i}] {} from {:?}{}",
            made.props.name.to_string_lossy(),
            devs,
            if made.shape == Shape::Fused { " (a rail pair: SOUT + SUP)" } else { "" }
        );
        v.push(made);
        Ok(i as i32)
    }
}

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
