//! `mpib-perf --list`: what the plugin would use, as NCCL would see it. Every NIC with its
//! pairing, link layer, speed and address (GID, LID or TCP address), from the rail pairs
//! (the devices of ABI v6 – v8 are the pairs); the devices each ABI version shows NCCL
//! (`devices`, `getProperties`, and the rails of each from `mpib_device_rails`); and the
//! devices NCCL would use once it has fused what it fuses, numbered as `--dev` takes them.

use std::fmt::Write as _;

use mpib_tools::Props;
use mpib_tools::net::{Net, Plugin, RailInfo};

use super::Fail;
use super::results::speed_text;

/// One device as one ABI version shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Dev {
    pub index: i32,
    pub props: Props,
    /// `None`: the library has no `mpib_device_rails`.
    pub rails: Option<[RailInfo; 2]>,
}

/// What one ABI version shows NCCL.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub version: u32,
    pub devices: Vec<Dev>,
}

/// The first and last NCCL release that use ABI `v` (as include/mpib.h's tables say).
fn nccl_releases(v: u32) -> (&'static str, &'static str) {
    match v {
        6 => ("2.14", "2.18"),
        7 => ("2.19", "2.19"),
        8 => ("2.20", "2.23"),
        9 => ("2.24", "2.25"),
        10 => ("2.26", "2.27"),
        11 => ("2.28", "2.29"),
        _ => ("2.30", "2.30"),
    }
}

/// Every device of `net` as its version shows it.
fn view(net: &Net) -> Result<View, Fail> {
    let p = net.plugin();
    let n = net.devices().map_err(|e| Fail::new(e.msg))?;
    let devices = (0..n)
        .map(|d| {
            let props = net.properties(d).map_err(|e| Fail::new(e.msg))?;
            let rails = p.device_rails(p.version(), d).map_err(|e| Fail::new(e.msg))?;
            Ok(Dev { index: d, props, rails })
        })
        .collect::<Result<_, Fail>>()?;
    Ok(View { version: p.version(), devices })
}

/// `mpib-perf --list` of the library `lib` (already loaded as `plugin`): the text to print.
pub fn list(lib: &str, plugin: &Plugin) -> Result<String, Fail> {
    // Every version's table, each initialised (kept so until the end: a v11/v12 context's
    // finalize would make the plugin forget the devices NCCL fused).
    let mut nets = Vec::new();
    for v in plugin.exported_versions().into_iter().rev() {
        let p = Plugin::open(lib, Some(v)).map_err(|e| Fail::new(e.msg))?;
        nets.push(p.init().map_err(|e| Fail::init(e.msg))?);
    }
    let views: Vec<View> = nets.iter().map(view).collect::<Result<_, _>>()?;
    // The devices NCCL would use through the version driven (--abi, else the newest): after
    // fusing what NCCL fuses (this makes devices through makeVDevice: after the views).
    let used_net = nets.iter().find(|n| n.plugin().version() == plugin.version()).unwrap_or(&nets[0]);
    let used = used_net.nccl_devices().map_err(|e| Fail::new(e.msg))?;
    let used_view = view(used_net)?;
    let used: Vec<&Dev> = used.iter().filter_map(|&d| used_view.devices.iter().find(|x| x.index == d)).collect();
    // What the plugin asked NCCL to fuse (it sets the variable at init where the user has not).
    let merge = std::env::var("NCCL_NET_FORCE_MERGE").ok().filter(|_| plugin.version() >= 9);
    Ok(render(lib, &views, plugin.version(), &used, merge.as_deref()))
}

/// The versions whose devices read the same, grouped: `[6, 7, 8]`, `[9, 10, 11, 12]`.
fn groups(views: &[View]) -> Vec<Vec<&View>> {
    let mut out: Vec<Vec<&View>> = Vec::new();
    for v in views {
        match out.last_mut() {
            Some(g) if device_lines(&g[0].devices) == device_lines(&v.devices) => g.push(v),
            _ => out.push(vec![v]),
        }
    }
    out
}

/// `mlx5_0:1 + mlx5_1:1`, or one NIC `mlx5_0:1 (both rails)`.
fn rails_text(rails: &Option<[RailInfo; 2]>) -> String {
    match rails {
        Some([a, b]) if a.label() == b.label() => format!("{} (both rails)", a.label()),
        Some([a, b]) => format!("SOUT {} + SUP {}", a.label(), b.label()),
        None => "rails unknown (not an mpib library)".to_string(),
    }
}

fn device_line(d: &Dev) -> String {
    let p = &d.props;
    let mut s = format!("[{}] {}  {}", d.index, p.name, speed_text(p.speed_mbps.max(0) as u32));
    let _ = write!(s, "  {}", rails_text(&d.rails));
    if let Some(v) = p.vdevs.as_ref().filter(|v| v.as_slice() != [d.index]) {
        let _ = write!(s, "  fused from {v:?}");
    }
    let id = |x: Option<i16>| x.filter(|&x| x >= 0);
    let (rail, plane) = (id(p.rail_id), id(p.plane_id));
    if rail.is_some() || plane.is_some() {
        let text = |x: Option<i16>| x.map_or("-".to_string(), |x| x.to_string());
        let _ = write!(s, "  railId {} planeId {}", text(rail), text(plane));
    }
    s
}

fn device_lines(devs: &[Dev]) -> Vec<String> {
    devs.iter().map(device_line).collect()
}

/// One NIC: where the plugin uses it.
struct NicRow<'a> {
    rail: &'a RailInfo,
    roles: Vec<String>,
}

/// The text of `--list`.
pub fn render(lib: &str, views: &[View], used_version: u32, used: &[&Dev], merge: Option<&str>) -> String {
    let mut t = String::new();
    let versions: Vec<String> = views.iter().map(|v| format!("v{}", v.version)).collect();
    let _ = writeln!(t, "# mpib-perf --list: {lib} (ncclNet {})", versions.join(" "));
    // The pairs: the devices of a version before v9 (one per rail pair).
    let pairs = views.iter().find(|v| v.version < 9);
    let mut nics: Vec<NicRow> = Vec::new();
    for d in pairs.map_or(&[][..], |v| &v.devices[..]) {
        for (rail, role) in d.rails.iter().flatten().zip(["SOUT", "SUP"]) {
            let role = format!("pair {} {role}", d.index);
            match nics.iter_mut().find(|n| n.rail.label() == rail.label()) {
                Some(n) => n.roles.push(role),
                None => nics.push(NicRow { rail, roles: vec![role] }),
            }
        }
    }
    if nics.is_empty() {
        t.push_str("# NICs: unknown (the library does not export mpib_device_rails or ncclNet v6-v8)\n");
    } else {
        let _ = writeln!(t, "# NICs mpib uses ({}):", nics.len());
        let _ = writeln!(t, "#   {:<16} {:<14} {:<5} {:<18} {:<32} PCI", "NIC", "used as", "link", "speed", "address");
        for n in &nics {
            let r = n.rail;
            let speed = if r.speed_known { speed_text(r.speed_mbps) } else { speed_text(r.speed_mbps) + " (nominal)" };
            let _ = writeln!(
                t,
                "    {:<16} {:<14} {:<5} {:<18} {:<32} {}",
                r.label(),
                n.roles.join(", "),
                r.link,
                speed,
                r.address,
                r.pci_path.as_deref().unwrap_or("-")
            );
        }
    }
    t.push_str("# devices NCCL is shown, per ABI version:\n");
    for g in groups(views) {
        let first = g[0].version;
        let last = g[g.len() - 1].version;
        let range = if first == last { format!("v{first}") } else { format!("v{first}-v{last}") };
        let (from, to) = (nccl_releases(first).0, nccl_releases(last).1);
        let releases = if from == to { from.to_string() } else { format!("{from}-{to}") };
        let _ = writeln!(t, "#   ABI {range} (NCCL {releases}): {} device(s)", g[0].devices.len());
        for l in device_lines(&g[0].devices) {
            let _ = writeln!(t, "      {l}");
        }
    }
    if let Some(m) = merge {
        let _ = writeln!(t, "# NCCL fuses each pair's two NICs (the plugin sets NCCL_NET_FORCE_MERGE={m})");
    }
    let _ = writeln!(t, "# devices NCCL would use through ABI v{used_version}, after fusing (mpib-perf --dev N):");
    for (n, d) in used.iter().enumerate() {
        let _ = writeln!(t, "    --dev {n}: {}", device_line(d));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(name: &str, speed: u32) -> RailInfo {
        RailInfo {
            name: name.into(),
            port: 1,
            link: "RoCE",
            speed_mbps: speed,
            speed_known: true,
            gid: Some((3, [0; 16])),
            lid: None,
            address: format!("GID 3 ::ffff:10.0.0.{}", name.len()),
            pci_path: None,
        }
    }

    fn dev(index: i32, name: &str, rails: [&str; 2], vdevs: Option<Vec<i32>>) -> Dev {
        let props = Props {
            name: name.into(),
            pci_path: None,
            guid: 0,
            ptr_support: 1,
            speed_mbps: 400_000,
            port: 1,
            latency_us: 0.0,
            max_comms: 1,
            max_recvs: 8,
            net_device_type: None,
            net_device_version: None,
            reg_is_global: None,
            force_flush: None,
            vdevs,
            max_p2p_bytes: None,
            max_coll_bytes: None,
            max_multi_request_size: None,
            rail_id: None,
            plane_id: None,
        };
        Dev { index, props, rails: Some([rail(rails[0], 200_000), rail(rails[1], 200_000)]) }
    }

    #[test]
    fn versions_that_show_the_same_devices_are_one_group_and_nics_list_their_pairs() {
        let pair = |v| View { version: v, devices: vec![dev(0, "mlx5_0+mlx5_1", ["mlx5_0", "mlx5_1"], None)] };
        let nics = |v| View {
            version: v,
            devices: vec![
                dev(0, "mlx5_0", ["mlx5_0", "mlx5_0"], Some(vec![0])),
                dev(1, "mlx5_1", ["mlx5_1", "mlx5_1"], Some(vec![1])),
            ],
        };
        let views = [pair(6), pair(7), pair(8), nics(9), nics(12)];
        assert_eq!(groups(&views).iter().map(|g| g.len()).collect::<Vec<_>>(), [3, 2]);
        let fused = dev(2, "mlx5_0+mlx5_1", ["mlx5_0", "mlx5_1"], Some(vec![0, 1]));
        let text = render("lib.so", &views, 12, &[&fused], Some("mlx5_0:1,mlx5_1:1"));
        assert!(text.contains("# NICs mpib uses (2):"), "{text}");
        assert!(text.lines().any(|l| l.contains("mlx5_0:1") && l.contains("pair 0 SOUT") && l.contains("200 Gb/s")));
        assert!(text.contains("#   ABI v6-v8 (NCCL 2.14-2.23): 1 device(s)"), "{text}");
        assert!(text.contains("#   ABI v9-v12 (NCCL 2.24-2.30): 2 device(s)"), "{text}");
        assert!(text.contains("[1] mlx5_1  400 Gb/s  mlx5_1:1 (both rails)"), "{text}");
        assert!(text.contains("(the plugin sets NCCL_NET_FORCE_MERGE=mlx5_0:1,mlx5_1:1)"), "{text}");
        assert!(
            text.contains("--dev 0: [2] mlx5_0+mlx5_1  400 Gb/s  SOUT mlx5_0:1 + SUP mlx5_1:1  fused from [0, 1]"),
            "{text}"
        );
    }
}
