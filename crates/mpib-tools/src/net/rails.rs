//! Which NICs a device uses (`mpib_device_rails`): mpib's own call, for `mpib-perf --list`
//! and the line rate of a run. Another plugin has no such call: `None`.

use std::ffi::{c_char, c_int, c_void};

use ncclnet_types::mpib::*;

use super::Plugin;
use crate::{Result, check};

type DeviceRailsFn = unsafe extern "C" fn(c_int, c_int, *mut mpib_rail_info_t, usize) -> c_int;

/// One rail of a device: the NIC port it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailInfo {
    pub name: String,
    pub port: u32,
    /// `IB`, `RoCE`, `TCP` (or `?` for a value this tool does not know).
    pub link: &'static str,
    pub speed_mbps: u32,
    /// Whether the NIC reported `speed_mbps` (false: a nominal figure, no line rate).
    pub speed_known: bool,
    /// The GID index and GID the rail's queue pairs use (verbs).
    pub gid: Option<(u32, [u8; 16])>,
    /// The port's LID (InfiniBand).
    pub lid: Option<u32>,
    /// The address as the plugin's banner shows it (`GID 3 ::ffff:10.0.0.1`, `LID 0x5`,
    /// `127.0.0.1:40001`).
    pub address: String,
    pub pci_path: Option<String>,
}

impl RailInfo {
    /// `name:port`, as `MPIB_HCA_*` and NCCL name a NIC port.
    pub fn label(&self) -> String {
        format!("{}:{}", self.name, self.port)
    }

    /// The line rate, where the NIC reported one.
    pub fn line_mbps(&self) -> Option<u32> {
        self.speed_known.then_some(self.speed_mbps)
    }
}

/// A NUL-terminated C string field as text.
pub(crate) fn c_text(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl From<&mpib_rail_info_t> for RailInfo {
    fn from(r: &mpib_rail_info_t) -> RailInfo {
        let pci = c_text(&r.pci_path);
        RailInfo {
            name: c_text(&r.name),
            port: r.port,
            link: match r.link_layer {
                MPIB_LINK_INFINIBAND => "IB",
                MPIB_LINK_ETHERNET => "RoCE",
                MPIB_LINK_TCP => "TCP",
                _ => "?",
            },
            speed_mbps: r.speed_mbps,
            speed_known: r.speed_known != 0,
            gid: u32::try_from(r.gid_index).ok().map(|i| (i, r.gid)),
            lid: (r.lid != 0).then_some(r.lid),
            address: c_text(&r.address),
            pci_path: (!pci.is_empty()).then_some(pci),
        }
    }
}

impl Plugin {
    /// The rails (SOUT, SUP) of device `dev` as NCCL sees it through ABI `version`
    /// (`mpib_device_rails`; `None`: the library does not export it). The plugin must be
    /// initialised (through any version).
    pub fn device_rails(&self, version: u32, dev: i32) -> Result<Option<[RailInfo; 2]>> {
        // Looked up per call, as `resource_stats`: not the data path.
        let Some(p) = self.lib.symbol(c"mpib_device_rails") else { return Ok(None) };
        // SAFETY: `mpib_device_rails` as include/mpib.h declares it.
        let f = unsafe { std::mem::transmute::<*mut c_void, DeviceRailsFn>(p) };
        let mut out = [mpib_rail_info_t::default(); 2];
        // SAFETY: two entries of the size we pass, as include/mpib.h asks.
        let rc = unsafe { f(version as c_int, dev, out.as_mut_ptr(), std::mem::size_of::<mpib_rail_info_t>()) };
        check("mpib_device_rails", rc)?;
        Ok(Some([RailInfo::from(&out[0]), RailInfo::from(&out[1])]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text<const N: usize>(s: &str) -> [c_char; N] {
        let mut out = [0; N];
        for (d, b) in out.iter_mut().zip(s.bytes()) {
            *d = b as c_char;
        }
        out
    }

    #[test]
    fn a_c_rail_becomes_a_rail_info() {
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        let c = mpib_rail_info_t {
            name: text("mlx5_0"),
            port: 1,
            link_layer: MPIB_LINK_ETHERNET,
            speed_mbps: 400_000,
            speed_known: 1,
            gid_index: 3,
            lid: 0,
            gid,
            address: text("GID 3 ::ffff:10.0.0.1"),
            pci_path: text("/sys/devices/pci0000:00/0000:00:01.0/0000:04:00.0"),
        };
        let r = RailInfo::from(&c);
        assert_eq!((r.label(), r.link, r.line_mbps()), ("mlx5_0:1".to_string(), "RoCE", Some(400_000)));
        assert_eq!((r.gid, r.lid), (Some((3, gid)), None));
        assert_eq!(r.address, "GID 3 ::ffff:10.0.0.1");
        assert!(r.pci_path.unwrap().ends_with("04:00.0"));
        let soft = RailInfo::from(&mpib_rail_info_t {
            name: text("soft-sup"),
            link_layer: MPIB_LINK_TCP,
            speed_mbps: 10_000,
            ..mpib_rail_info_t::default()
        });
        assert_eq!((soft.link, soft.gid, soft.line_mbps(), soft.pci_path), ("TCP", None, None, None));
    }
}
