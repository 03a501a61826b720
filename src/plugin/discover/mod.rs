//! Which NCCL devices the plugin shows, and which NICs are the two rails of each: the
//! configuration (`MPIB_FABRIC`, `MPIB_HCA_SOUT`/`MPIB_HCA_SUP`, `MPIB_SOFT_*_ADDR`,
//! `NCCL_SOCKET_IFNAME`, the rails' GID settings, `MPIB_PKEY`) turned into providers'
//! options, and the devices opened with them. The fabric providers know nothing of rails
//! or the environment: they list what the host has and open what they are asked to.
//!
//! - Soft fabric: one pair, SOUT on `MPIB_SOFT_SOUT_ADDR` and SUP on `MPIB_SOFT_SUP_ADDR`
//!   (default: the address NCCL's socket transport would pick, see `netif`); in-process
//!   mode (`MPIB_FABRIC=inproc`): two devices without sockets.
//! - Verbs: explicit pairs from `MPIB_HCA_SOUT[i]` + `MPIB_HCA_SUP[i]`, or pairs chosen by PCI
//!   locality to the GPUs among the ports `MPIB_HCA` (else `NCCL_IB_HCA`) selects
//!   (`pairing.rs`, `topology.rs`); each port opened once per GID rule it is used with (a
//!   port in several pairs, or both rails on one port, share one device).

mod pairing;
pub mod topology;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, FabricChoice, HcaSpec, RailAddr, RelaxedOrdering, Selection};
use crate::error::{Error, Result};
use crate::fabric::Device;
use crate::fabric::netif::{default_addr, first_matching, interfaces};
use crate::fabric::soft::{self, InprocNet, SoftBind, SoftDevice, SoftLink, SoftOptions};
use crate::fabric::verbs::{self, GidRule, HostPort, VerbsDevice, VerbsOptions};
use pairing::Resolved;
pub use topology::Sysfs;

/// What the plugin knows of a rail's NIC beyond the device itself: where it sits (for
/// NCCL's topology and for fusing pairs) and the ids the user gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicMeta {
    /// sysfs PCI path (`None`: a virtual NIC, or the soft fabric).
    pub pci_path: Option<String>,
    /// NUMA node of the PCI device, when known.
    pub numa: Option<i32>,
    /// NCCL's `railId` and `planeId` (v12), from `MPIB_HCA*` / `NCCL_IB_HCA` entries.
    pub rail: Option<i16>,
    pub plane: Option<i16>,
}

/// The two rails of one NCCL device: SOUT (index 0) and SUP (index 1). Both may be the
/// same NIC (two rails over one port, e.g. for loopback tests).
pub struct FoundPair<D: Device> {
    pub sout: Arc<D>,
    pub sup: Arc<D>,
    /// Per rail (SOUT, SUP).
    pub meta: [NicMeta; 2],
}

impl<D: Device> FoundPair<D> {
    /// A pair with nothing known of its NICs beyond the devices.
    pub fn new(sout: Arc<D>, sup: Arc<D>) -> Self {
        FoundPair { sout, sup, meta: Default::default() }
    }

    /// The rail's device by index (0 = SOUT, 1 = SUP).
    pub fn rail(&self, i: usize) -> &Arc<D> {
        if i == 0 { &self.sout } else { &self.sup }
    }
}

impl<D: Device> Clone for FoundPair<D> {
    fn clone(&self) -> Self {
        FoundPair { sout: self.sout.clone(), sup: self.sup.clone(), meta: self.meta.clone() }
    }
}

/// How long a soft QP waits for its peer QP's CONNECT when no set-up deadline is set.
pub const SOFT_QP_CONNECT_WITHIN: Duration = Duration::from_secs(120);

/// Opens the soft rail pair: over TCP (`Soft`, and `Auto` on a host without RDMA
/// devices), or in-process (`Inproc`). The chosen addresses are logged at INFO.
pub fn soft_pairs(cfg: &Config, inproc: &Arc<InprocNet>) -> Result<Vec<FoundPair<SoftDevice>>> {
    // A QP's own bound on its peer QP's CONNECT. It runs only once both sides exchanged
    // their QPs (both are there), so it catches a rail address the peer cannot reach, not
    // a late rank: the set-up's deadline, if any, or a generous one.
    let connect_timeout = match cfg.connect_timeout_ms {
        0 => SOFT_QP_CONNECT_WITHIN,
        ms => Duration::from_millis(ms),
    };
    if cfg.fabric == FabricChoice::Inproc {
        let open = |rail: &str| {
            soft::open(&SoftOptions { connect_timeout, ..SoftOptions::inproc(&format!("inproc-{rail}"), inproc) })
        };
        let pair = FoundPair::new(Arc::new(open("sout")?), Arc::new(open("sup")?));
        log::info!("soft fabric: in-process rails inproc-sout and inproc-sup");
        return Ok(vec![pair]);
    }
    let ifname = cfg.socket_ifname.as_deref();
    let open = |rail: &str, addr: Option<&RailAddr>, var: &str| -> Result<SoftDevice> {
        let (ip, iface) = resolve(addr, ifname, var)?;
        let bind_iface = match addr {
            Some(RailAddr::Interface(name)) => Some(name.clone()),
            _ => None,
        };
        let link = SoftLink::Tcp(SoftBind { ip, iface, bind_iface });
        soft::open(&SoftOptions { name: format!("soft-{rail}"), link, connect_timeout })
    };
    let sout = open("sout", cfg.soft_sout_addr.as_ref(), "MPIB_SOFT_SOUT_ADDR")?;
    let sup = open("sup", cfg.soft_sup_addr.as_ref(), "MPIB_SOFT_SUP_ADDR")?;
    Ok(vec![FoundPair::new(Arc::new(sout), Arc::new(sup))])
}

/// A soft rail's local address (from `MPIB_SOFT_*_ADDR`, named `var`) and the interface it
/// belongs to (if any is known). Default: what NCCL's socket transport picks, else loopback.
fn resolve(addr: Option<&RailAddr>, socket_ifname: Option<&str>, var: &str) -> Result<(IpAddr, Option<String>)> {
    let ifs = interfaces();
    match addr {
        Some(RailAddr::Ip(ip)) => Ok((*ip, ifs.iter().find(|i| i.ip == *ip).map(|i| i.name.clone()))),
        Some(RailAddr::Interface(name)) => {
            first_matching(&ifs, &format!("={name}")).map(|i| (i.ip, Some(i.name))).ok_or_else(|| {
                Error::invalid_argument(format!("{var}={name}: no up interface of that name with an address"))
            })
        }
        None => Ok(default_addr(&ifs, socket_ifname)
            .map(|i| (i.ip, Some(i.name)))
            .unwrap_or((IpAddr::V4(Ipv4Addr::LOCALHOST), None))),
    }
}

fn spec_text(s: &HcaSpec) -> String {
    s.to_string()
}

/// The verbs rail pairs NCCL's devices are made of, from `MPIB_HCA_SOUT`/`MPIB_HCA_SUP` or
/// paired automatically (see `pairing`). A rail's ports use the GID its rule says
/// (`MPIB_SOUT_GID_INDEX`, … `MPIB_GID_INDEX`, …); a port is opened once per rule it is
/// used with (a port in several pairs of one role shares one device), and a port carrying
/// both rails of a pair uses SOUT's rule. `MPIB_PKEY` (a P_Key index) applies to every port.
///
/// Errors: verbs unavailable ([`verbs::unavailable_reason`]'s text), a named device or port
/// that does not exist, a port that cannot be opened, or no pair left after down ports were
/// skipped (each skip is a WARN).
pub fn verbs_pairs(cfg: &Config) -> Result<Vec<FoundPair<VerbsDevice>>> {
    verbs_pairs_in(cfg, &Sysfs::host())
}

/// [`verbs_pairs`] with the PCI topology read from `sysfs`.
pub fn verbs_pairs_in(cfg: &Config, sysfs: &Sysfs) -> Result<Vec<FoundPair<VerbsDevice>>> {
    if let Some(why) = verbs::unavailable_reason() {
        return Err(Error::system(format!("the verbs fabric cannot be used: {why}")));
    }
    let mut ports = verbs::ports().map_err(Error::system)?;
    let relaxed_ordering = match cfg.relaxed_ordering {
        RelaxedOrdering::Off => false,
        RelaxedOrdering::On | RelaxedOrdering::Auto => {
            let ok = verbs::relaxed_ordering_available();
            if !ok && cfg.relaxed_ordering == RelaxedOrdering::On {
                log::warn!(
                    "MPIB_PCI_RELAXED_ORDERING=1, but this libibverbs has no ibv_reg_mr_iova2 (rdma-core < 29): registrations without relaxed ordering"
                );
            }
            ok
        }
    };
    let rules = [cfg.rails[0].gid, cfg.rails[1].gid];
    let mut opened: HashMap<(usize, GidRule), Arc<VerbsDevice>> = HashMap::new();
    let open = |p: &HostPort, rail: usize| -> Result<Arc<VerbsDevice>> {
        let gid = rules[rail];
        let opts = VerbsOptions {
            device: p.device.clone(),
            port: Some(p.port),
            gid,
            pkey_index: cfg.pkey_index,
            relaxed_ordering,
            dmabuf: cfg.dmabuf,
        };
        VerbsDevice::open(&opts).map(Arc::new).map_err(|e| match gid_context(cfg, rail) {
            Some(c) => e.context(c),
            None => e,
        })
    };
    let (pairs, ids) = if cfg.hca_sout.is_empty() {
        // A port's rail is known only once the ports are paired: each is tried with SOUT's
        // GID rule (then SUP's, where they differ) to see that it opens at all.
        plan_auto(cfg, &mut ports, sysfs, &mut |p: &HostPort, i: usize| {
            let mut last = None;
            for rail in if rules[0] == rules[1] { &[0][..] } else { &[0, 1][..] } {
                match open(p, *rail) {
                    Ok(d) => {
                        opened.insert((i, rules[*rail]), d);
                        return true;
                    }
                    Err(e) => last = Some(e),
                }
            }
            log::warn!("verbs: {} not used: {}", p.label(), last.expect("tried"));
            false
        })
    } else {
        plan_explicit(cfg, &ports)?
    };
    let auto = cfg.hca_sout.is_empty();
    let meta = |i: usize| {
        let pci_path = sysfs.nic_pci_path(&ports[i].device);
        let numa = pci_path.as_deref().and_then(|p| sysfs.numa_node(p));
        NicMeta { pci_path, numa, rail: ids[i].0, plane: ids[i].1 }
    };
    let mut out = Vec::with_capacity(pairs.len());
    for (a, b) in pairs {
        // One port carrying both rails is one device: SOUT's rule.
        let sup_rail = if a == b { 0 } else { 1 };
        if a == b && rules[0] != rules[1] {
            log::warn!("verbs: {} carries both rails of a pair: it uses SOUT's GID settings", ports[a].label());
        }
        let mut dev = |i: usize, rail: usize| -> Result<Arc<VerbsDevice>> {
            match opened.entry((i, rules[rail])) {
                Entry::Occupied(d) => Ok(d.get().clone()),
                Entry::Vacant(slot) => Ok(slot.insert(open(&ports[i], rail)?).clone()),
            }
        };
        let (sout, sup) = match dev(a, 0).and_then(|s| Ok((s, dev(b, sup_rail)?))) {
            Ok(d) => d,
            Err(e) if auto => {
                log::warn!("verbs: rail pair {} + {} not used: {e}", ports[a].label(), ports[b].label());
                continue;
            }
            Err(e) => return Err(e),
        };
        log::info!("verbs: rail pair {} = SOUT {} + SUP {}", out.len(), ports[a].label(), ports[b].label());
        out.push(FoundPair { sout, sup, meta: [meta(a), meta(b)] });
    }
    if out.is_empty() {
        let seen: Vec<String> = ports.iter().map(|p| format!("{} {}", p.label(), p.state)).collect();
        let filter = match &cfg.hca_filter {
            Some(f) if cfg.hca_sout.is_empty() => format!("; {}={f}", cfg.hca_filter_var),
            _ => String::new(),
        };
        return Err(Error::system(format!("verbs: no usable rail pair (ports: {}{filter})", seen.join(", "))));
    }
    Ok(out)
}

/// The variables behind rail `rail`'s GID rule where they decide alone (an index, or a
/// range), for an error opening a port with it.
fn gid_context(cfg: &Config, rail: usize) -> Option<String> {
    let rule = &cfg.rails[rail].gid;
    let from = |s| cfg.origin(s, rail);
    if let Some(i) = rule.index {
        return Some(format!("{}={i}", from("MPIB_GID_INDEX")));
    }
    rule.range.map(|r| format!("{}={r}", from("MPIB_ADDR_RANGE")))
}

/// Per port: NCCL's rail and plane ids, when the user gave them.
type Ids = Vec<(Option<i16>, Option<i16>)>;

/// Automatic pairs (indices into `ports`): the active ports the filter selects and `usable`
/// accepts (it opens them), paired by `pairing::pair_auto` with the PCI paths and GPUs of
/// `sysfs`. Ports left out are logged (INFO when the filter leaves them out, WARN when
/// down); `ports` gets their PCI paths from `sysfs` and `active = false` for those left out.
fn plan_auto(
    cfg: &Config,
    ports: &mut [HostPort],
    sysfs: &Sysfs,
    usable: &mut dyn FnMut(&HostPort, usize) -> bool,
) -> (Vec<(usize, usize)>, Ids) {
    let mut ids: Ids = vec![(None, None); ports.len()];
    for (i, p) in ports.iter_mut().enumerate() {
        p.pci_path = sysfs.nic_pci_path(&p.device);
        if let Some(f) = &cfg.hca_filter {
            match f.select(&p.device, p.port) {
                Selection::Out => {
                    log::info!("verbs: {} not used ({}={f})", p.label(), cfg.hca_filter_var);
                    p.active = false;
                    continue;
                }
                Selection::In(e) => ids[i] = e.map_or((None, None), |e| (e.rail, e.plane)),
            }
        }
        if !p.active {
            log::warn!("verbs: {} is {}, not used", p.label(), p.state);
            continue;
        }
        if !usable(p, i) {
            p.active = false;
        }
    }
    let gpus = sysfs.gpus();
    if !gpus.is_empty() {
        log::info!("verbs: pairing NICs by their nearest GPU ({} NVIDIA GPU(s) in sysfs)", gpus.len());
    }
    (pairing::pair_auto(ports, &gpus), ids)
}

/// Explicit pairs (indices into `ports`) from `MPIB_HCA_SOUT[i]` + `MPIB_HCA_SUP[i]`; a pair
/// with a port that is down is skipped with a WARN, a name that does not exist is an error.
fn plan_explicit(cfg: &Config, ports: &[HostPort]) -> Result<(Vec<(usize, usize)>, Ids)> {
    if cfg.hca_filter.is_some() && cfg.hca_filter_var == "MPIB_HCA" {
        log::info!("verbs: MPIB_HCA is not used: MPIB_HCA_SOUT/MPIB_HCA_SUP name the rails");
    }
    let mut ids: Ids = vec![(None, None); ports.len()];
    let mut pairs = Vec::new();
    for (k, (so, su)) in cfg.hca_sout.iter().zip(&cfg.hca_sup).enumerate() {
        let (a, b) = (pairing::resolve(so, ports), pairing::resolve(su, ports));
        for (var, spec, r) in [("MPIB_HCA_SOUT", so, &a), ("MPIB_HCA_SUP", su, &b)] {
            if let Resolved::Missing(m) = r {
                return Err(Error::invalid_argument(format!("{var} entry {k} ({}): {m}", spec_text(spec))));
            }
        }
        match (a, b) {
            (Resolved::Port(a), Resolved::Port(b)) => {
                for (i, spec) in [(a, so), (b, su)] {
                    ids[i] = (spec.rail.or(ids[i].0), spec.plane.or(ids[i].1));
                }
                pairs.push((a, b))
            }
            (a, b) => {
                let why: Vec<String> =
                    [a, b].into_iter().filter_map(|r| if let Resolved::Down(m) = r { Some(m) } else { None }).collect();
                log::warn!("verbs: rail pair {k} ({} + {}) skipped: {}", spec_text(so), spec_text(su), why.join("; "));
            }
        }
    }
    Ok((pairs, ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_rail_addresses_resolve() {
        let (ip, _) = resolve(Some(&RailAddr::Ip("127.0.0.1".parse().unwrap())), None, "X").unwrap();
        assert!(ip.is_loopback());
        let e = resolve(Some(&RailAddr::Interface("nosuch0".into())), None, "MPIB_SOFT_SUP_ADDR").unwrap_err();
        assert_eq!(e.msg(), "MPIB_SOFT_SUP_ADDR=nosuch0: no up interface of that name with an address");
    }

    use topology::fake::FakeSys;

    fn host_ports(names: &[(&str, u8)]) -> Vec<HostPort> {
        names
            .iter()
            .map(|&(d, port)| HostPort { device: d.into(), port, active: true, state: "ACTIVE", pci_path: None })
            .collect()
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().copied()).expect("valid test configuration")
    }

    fn labels(ports: &[HostPort], pairs: &[(usize, usize)]) -> Vec<String> {
        pairs.iter().map(|&(a, b)| format!("{}+{}", ports[a].label(), ports[b].label())).collect()
    }

    /// A 2-NIC-per-GPU host: two switches, each a GPU and two NICs, plus a storage NIC and a
    /// front-end NIC on root ports of their own.
    fn cluster_node() -> (FakeSys, Vec<HostPort>) {
        let f = FakeSys::new("node");
        let sw0 = "pci0000:00/0000:00:01.0/0000:01:00.0";
        let sw1 = "pci0000:80/0000:80:01.0/0000:81:00.0";
        f.gpu(&format!("{sw0}/0000:02:00.0/0000:03:00.0"), 0)
            .nic("mlx5_0", &format!("{sw0}/0000:02:01.0/0000:04:00.0"), 0)
            .nic("mlx5_1", &format!("{sw1}/0000:82:01.0/0000:84:00.0"), 1)
            .nic("mlx5_2", &format!("{sw0}/0000:02:02.0/0000:05:00.0"), 0)
            .nic("mlx5_3", &format!("{sw1}/0000:82:02.0/0000:85:00.0"), 1)
            .gpu(&format!("{sw1}/0000:82:00.0/0000:83:00.0"), 1)
            .nic("mlx5_4", "pci0000:00/0000:00:02.0/0000:06:00.0", 0)
            .nic("mlx5_5", "pci0000:80/0000:80:02.0/0000:86:00.0", 1);
        let ports =
            host_ports(&[("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1), ("mlx5_4", 1), ("mlx5_5", 1)]);
        (f, ports)
    }

    #[test]
    fn automatic_pairs_on_a_synthetic_cluster_node() {
        let (f, mut ports) = cluster_node();
        let (pairs, _) = plan_auto(&cfg(&[]), &mut ports, &f.sysfs(), &mut |_, _| true);
        assert_eq!(labels(&ports, &pairs), ["mlx5_0:1+mlx5_2:1", "mlx5_4:1+mlx5_5:1", "mlx5_1:1+mlx5_3:1"]);
        assert!(ports[0].pci_path.as_deref().unwrap().ends_with("0000:04:00.0"), "PCI paths come from sysfs");
    }

    #[test]
    fn mpib_hca_leaves_storage_and_front_end_nics_out() {
        let (f, mut ports) = cluster_node();
        let (pairs, _) = plan_auto(&cfg(&[("MPIB_HCA", "^mlx5_4,mlx5_5")]), &mut ports, &f.sysfs(), &mut |_, _| true);
        assert_eq!(labels(&ports, &pairs), ["mlx5_0:1+mlx5_2:1", "mlx5_1:1+mlx5_3:1"]);
        assert!(!ports[4].active && !ports[5].active);
        // NCCL's own variable selects the same way when MPIB_HCA is not set; MPIB_HCA wins.
        let (f, mut ports) = cluster_node();
        let c = cfg(&[("NCCL_IB_HCA", "=mlx5_0,mlx5_2:1:7:0")]);
        let (pairs, ids) = plan_auto(&c, &mut ports, &f.sysfs(), &mut |_, _| true);
        assert_eq!(labels(&ports, &pairs), ["mlx5_0:1+mlx5_2:1"]);
        assert_eq!((ids[0], ids[2]), ((None, None), (Some(7), Some(0))), "rail and plane from the entry");
        let (f, mut ports) = cluster_node();
        let c = cfg(&[("NCCL_IB_HCA", "mlx5_0"), ("MPIB_HCA", "mlx5_1,mlx5_3")]);
        let (pairs, _) = plan_auto(&c, &mut ports, &f.sysfs(), &mut |_, _| true);
        assert_eq!(labels(&ports, &pairs), ["mlx5_1:1+mlx5_3:1"]);
    }

    #[test]
    fn a_port_that_cannot_be_opened_is_left_out_of_automatic_pairs() {
        let (f, mut ports) = cluster_node();
        let (pairs, _) = plan_auto(&cfg(&[]), &mut ports, &f.sysfs(), &mut |p, _| p.device != "mlx5_2");
        assert_eq!(labels(&ports, &pairs), ["mlx5_0:1+mlx5_0:1", "mlx5_4:1+mlx5_5:1", "mlx5_1:1+mlx5_3:1"]);
    }

    #[test]
    fn explicit_pairs_carry_rail_and_plane_ids() {
        let ports = host_ports(&[("mlx5_0", 1), ("mlx5_1", 1)]);
        let c = cfg(&[("MPIB_HCA_SOUT", "mlx5_0:1:2"), ("MPIB_HCA_SUP", "mlx5_1::5:1")]);
        let (pairs, ids) = plan_explicit(&c, &ports).unwrap();
        assert_eq!(pairs, [(0, 1)]);
        assert_eq!(ids, [(Some(2), None), (Some(5), Some(1))]);
        let e = plan_explicit(&cfg(&[("MPIB_HCA_SOUT", "mlx5_9"), ("MPIB_HCA_SUP", "mlx5_1")]), &ports).unwrap_err();
        assert!(e.msg().contains("MPIB_HCA_SOUT entry 0 (mlx5_9): device mlx5_9 not found"), "{e}");
    }
}
