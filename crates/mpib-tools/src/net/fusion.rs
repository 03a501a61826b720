//! NCCL's NIC fusion, as its topology step does it once per process and plugin
//! (`src/graph/topo.cc`: `ncclTopoProcessNet` → `ncclTopoMakeVNics` → `ncclTopoForceMerge`
//! → `makeVDevice`), so that the tools use the devices NCCL would: through ABI v9+, the
//! groups `NCCL_NET_FORCE_MERGE` names (`;` between groups, `,` between devices, each
//! `name[:port]` matched exactly) are fused with `makeVDevice`, and NCCL then uses the
//! devices it made plus those left unfused. mpib publishes that variable at `init` when it
//! shows a rail pair's two NICs as devices (`MPIB_NCCL_DEVICES`); without it nothing is
//! fused and every device is used as it is (NCCL's default merge level fuses only ports of
//! one NIC, which mpib never shows apart).

use std::ffi::c_int;
use std::sync::Mutex;

use ncclnet_types::types::*;

use super::{Net, call};
use crate::ffi::Table;
use crate::{Error, Result, check};

/// One `name[:port]` of a group.
fn entry(e: &str) -> (String, Option<i32>) {
    match e.split_once(':') {
        Some((n, p)) => (n.to_string(), p.parse().ok()),
        None => (e.to_string(), None),
    }
}

/// The devices NCCL would use, per library (its name) and ABI version: NCCL fuses once per
/// process and plugin, and so do the tools (a process-wide memo, not a field of `Plugin`, which
/// the measured loops of the examples copy around).
static FUSED: Mutex<Vec<(Key, Vec<i32>)>> = Mutex::new(Vec::new());

/// A plugin: its library's name and the ABI version in use.
type Key = (String, u32);

impl Net {
    /// The devices NCCL would use, in order: those `makeVDevice` made, then every device
    /// not fused into one (see the module doc). Fusion runs once per process; later calls
    /// (other ranks of an in-process run, other `Net`s) get the same list.
    pub fn nccl_devices(&self) -> Result<Vec<i32>> {
        let key = (self.plugin.library().to_string(), self.plugin.version());
        let mut memo = FUSED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, l)) = memo.iter().find(|(k, _)| *k == key) {
            return Ok(l.clone());
        }
        let n = self.devices()?;
        let merge = std::env::var("NCCL_NET_FORCE_MERGE").ok().filter(|_| self.plugin.version() >= 9);
        let Some(merge) = merge else {
            memo.push((key, (0..n).collect()));
            return Ok((0..n).collect());
        };
        let props: Vec<(String, i32)> =
            (0..n).map(|d| self.properties(d).map(|p| (p.name, p.port))).collect::<Result<_>>()?;
        let mut made = Vec::new();
        let mut fused = vec![false; n.max(0) as usize];
        for group in merge.split(';').filter(|g| !g.is_empty()) {
            let want: Vec<(String, Option<i32>)> = group.split(',').map(entry).collect();
            let devs: Vec<i32> = (0..n)
                .filter(|&d| {
                    let (name, port) = &props[d as usize];
                    want.iter().any(|(w, p)| w == name && p.is_none_or(|p| p == *port))
                })
                .collect();
            if devs.len() != want.len() {
                // NCCL: "TOPO/NET : Only matched %d devices, %d requested" and ncclInvalidUsage.
                return Err(Error::usage(format!(
                    "NCCL_NET_FORCE_MERGE group {group}: matched {} device(s), {} requested",
                    devs.len(),
                    want.len()
                )));
            }
            made.push(self.make_vdevice(&devs)?);
            for &d in &devs {
                fused[d as usize] = true;
            }
        }
        let mut list = made;
        list.extend((0..n).filter(|&d| !fused[d as usize]));
        memo.push((key, list.clone()));
        Ok(list)
    }

    /// The plugin's index of the `i`-th device NCCL would use ([`Net::nccl_devices`]).
    pub fn nccl_device(&self, i: i32) -> Result<i32> {
        let devs = self.nccl_devices()?;
        usize::try_from(i).ok().and_then(|k| devs.get(k).copied()).ok_or_else(|| {
            Error::usage(format!("device {i} does not exist ({} devices NCCL would use: {devs:?})", devs.len()))
        })
    }

    /// `makeVDevice` over `devs` (v9+): the new device's index.
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<i32> {
        let mut d: c_int = -1;
        let n = devs.len() as c_int;
        let mut v9 = ncclNetVDeviceProps_v9_t { ndevs: n, devs: [0; 4] };
        let mut v12 = ncclNetVDeviceProps_v12_t { ndevs: n, devs: [0; 8] };
        if devs.len() > v9.devs.len() {
            return Err(Error::usage(format!("makeVDevice of {} devices (at most 4)", devs.len())));
        }
        v9.devs[..devs.len()].copy_from_slice(devs);
        v12.devs[..devs.len()].copy_from_slice(devs);
        // SAFETY: a valid out-pointer and vProps of the version's type, as NCCL passes.
        let rc = unsafe {
            match self.plugin.table {
                Table::V9(t) => call(t.makeVDevice, "makeVDevice")?(&mut d, &mut v9),
                Table::V10(t) => call(t.makeVDevice, "makeVDevice")?(&mut d, &mut v9),
                Table::V11(t) => call(t.makeVDevice, "makeVDevice")?(&mut d, &mut v9),
                Table::V12(t) => call(t.makeVDevice, "makeVDevice")?(&mut d, &mut v12),
                _ => return Err(Error::usage("makeVDevice exists from ABI v9 on")),
            }
        };
        check("makeVDevice", rc)?;
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_names_with_optional_ports() {
        assert_eq!(entry("mlx5_0:1"), ("mlx5_0".to_string(), Some(1)));
        assert_eq!(entry("soft-sup"), ("soft-sup".to_string(), None));
    }
}
