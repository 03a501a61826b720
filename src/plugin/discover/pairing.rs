//! Which ports become the SOUT and SUP rails of each NCCL device.
//!
//! Explicit: `MPIB_HCA_SOUT[i]` with `MPIB_HCA_SUP[i]` (`device[:port]`; without a port, the
//! device's first active port). A pair with a port that is down is skipped with a WARN.
//!
//! Automatic: the active ports, ordered by PCI path (devices without one, such as rxe,
//! after those with one), then by name and port. Walking that order, each unpaired port takes
//! as partner the unpaired port nearest to it in the PCI tree (longest common sysfs path
//! prefix; the earlier one on a tie), so the two ports of one NIC, or two NICs under one
//! PCIe switch, end up together; the earlier port of a pair is SOUT. An odd port out is
//! paired with itself (both rails on one port).

use crate::config::HcaSpec;
use crate::fabric::verbs::HostPort;

/// Candidates in the automatic order (see the module doc).
fn auto_order(ports: &[HostPort]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..ports.len()).filter(|&i| ports[i].active).collect();
    idx.sort_by(|&a, &b| {
        let (pa, pb) = (&ports[a], &ports[b]);
        (pa.pci_path.is_none(), &pa.pci_path, &pa.device, pa.port).cmp(&(
            pb.pci_path.is_none(),
            &pb.pci_path,
            &pb.device,
            pb.port,
        ))
    });
    idx
}

/// Length of the common prefix of two PCI paths, in whole path components.
fn pci_affinity(a: &Option<String>, b: &Option<String>) -> usize {
    match (a, b) {
        (Some(a), Some(b)) => a.split('/').zip(b.split('/')).take_while(|(x, y)| x == y).count(),
        _ => 0,
    }
}

/// Automatic pairs, as indices into `ports` (SOUT, SUP). Down ports are left out.
pub fn pair_auto(ports: &[HostPort]) -> Vec<(usize, usize)> {
    let order = auto_order(ports);
    let mut taken = vec![false; order.len()];
    let mut pairs = Vec::new();
    for i in 0..order.len() {
        if taken[i] {
            continue;
        }
        taken[i] = true;
        let a = order[i];
        let best = (i + 1..order.len())
            .filter(|&j| !taken[j])
            .max_by_key(|&j| (pci_affinity(&ports[a].pci_path, &ports[order[j]].pci_path), std::cmp::Reverse(j)));
        match best {
            Some(j) => {
                taken[j] = true;
                pairs.push((a, order[j]));
            }
            None => pairs.push((a, a)),
        }
    }
    pairs
}

/// Outcome of resolving one `device[:port]` spec against the host's ports.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolved {
    Port(usize),
    /// The device exists but the port (or, without a port, every port) is not active.
    Down(String),
    /// No such device or port; the message lists what exists.
    Missing(String),
}

/// Finds the port for one spec.
pub fn resolve(spec: &HcaSpec, ports: &[HostPort]) -> Resolved {
    let of_dev: Vec<usize> = (0..ports.len()).filter(|&i| ports[i].device == spec.device).collect();
    if of_dev.is_empty() {
        let mut names: Vec<&str> = ports.iter().map(|p| p.device.as_str()).collect();
        names.dedup();
        let have = if names.is_empty() { "none".to_string() } else { names.join(", ") };
        return Resolved::Missing(format!("device {} not found (devices: {have})", spec.device));
    }
    match spec.port {
        Some(p) => match of_dev.iter().find(|&&i| ports[i].port == p) {
            None => Resolved::Missing(format!(
                "{} has no port {p} (ports: {})",
                spec.device,
                of_dev.iter().map(|&i| ports[i].port.to_string()).collect::<Vec<_>>().join(", ")
            )),
            Some(&i) if ports[i].active => Resolved::Port(i),
            Some(&i) => Resolved::Down(format!("{} is {}", ports[i].label(), ports[i].state)),
        },
        None => match of_dev.iter().find(|&&i| ports[i].active) {
            Some(&i) => Resolved::Port(i),
            None => Resolved::Down(format!(
                "no active port on {} ({})",
                spec.device,
                of_dev
                    .iter()
                    .map(|&i| format!("{} {}", ports[i].label(), ports[i].state))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, port: u8, active: bool, pci: Option<&str>) -> HostPort {
        HostPort {
            device: device.into(),
            port,
            active,
            state: if active { "ACTIVE" } else { "DOWN" },
            pci_path: pci.map(String::from),
        }
    }
    fn names(ports: &[HostPort], pairs: &[(usize, usize)]) -> Vec<(String, String)> {
        pairs.iter().map(|&(a, b)| (ports[a].label(), ports[b].label())).collect()
    }
    fn pairs_of(ports: &[HostPort]) -> Vec<(String, String)> {
        names(ports, &pair_auto(ports))
    }
    fn p(a: &str, b: &str) -> (String, String) {
        (a.to_string(), b.to_string())
    }

    #[test]
    fn virtual_devices_pair_by_name_and_down_ports_are_left_out() {
        let ports = [port("rxe1", 1, true, None), port("rxe0", 1, true, None), port("rxe2", 1, false, None)];
        assert_eq!(pairs_of(&ports), vec![p("rxe0:1", "rxe1:1")]);
    }

    #[test]
    fn nics_pair_by_pci_locality_not_by_name() {
        // Two PCIe switches, each with two NICs; names interleave across the switches.
        let ports = [
            port(
                "mlx5_0",
                1,
                true,
                Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"),
            ),
            port(
                "mlx5_1",
                1,
                true,
                Some("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0"),
            ),
            port(
                "mlx5_2",
                1,
                true,
                Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"),
            ),
            port(
                "mlx5_3",
                1,
                true,
                Some("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:01.0/0000:84:00.0"),
            ),
        ];
        assert_eq!(pairs_of(&ports), vec![p("mlx5_0:1", "mlx5_2:1"), p("mlx5_1:1", "mlx5_3:1")]);
    }

    #[test]
    fn two_ports_of_one_nic_pair_together() {
        let nic = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0";
        let ports = [port("mlx5_0", 1, true, Some(nic)), port("mlx5_0", 2, true, Some(nic))];
        assert_eq!(pairs_of(&ports), vec![p("mlx5_0:1", "mlx5_0:2")]);
    }

    #[test]
    fn an_odd_port_out_rails_with_itself() {
        assert_eq!(pairs_of(&[port("mlx5_0", 1, true, Some("/a/b"))]), vec![p("mlx5_0:1", "mlx5_0:1")]);
        let ports = [port("a", 1, true, None), port("b", 1, true, None), port("c", 1, true, None)];
        assert_eq!(pairs_of(&ports), vec![p("a:1", "b:1"), p("c:1", "c:1")]);
        assert!(pair_auto(&[port("a", 1, false, None)]).is_empty());
        assert!(pair_auto(&[]).is_empty());
    }

    #[test]
    fn devices_with_a_pci_path_come_before_virtual_ones() {
        let ports = [port("rxe0", 1, true, None), port("mlx5_0", 1, true, Some("/x/y"))];
        assert_eq!(pairs_of(&ports), vec![p("mlx5_0:1", "rxe0:1")]);
    }

    #[test]
    fn resolving_specs() {
        let ports = [port("mlx5_0", 1, false, None), port("mlx5_0", 2, true, None), port("rxe0", 1, false, None)];
        let spec = |d: &str, p: Option<u8>| HcaSpec { port: p, ..HcaSpec::device(d) };
        assert_eq!(resolve(&spec("mlx5_0", None), &ports), Resolved::Port(1), "first active port");
        assert_eq!(resolve(&spec("mlx5_0", Some(2)), &ports), Resolved::Port(1));
        assert_eq!(resolve(&spec("mlx5_0", Some(1)), &ports), Resolved::Down("mlx5_0:1 is DOWN".into()));
        assert_eq!(resolve(&spec("rxe0", None), &ports), Resolved::Down("no active port on rxe0 (rxe0:1 DOWN)".into()));
        assert_eq!(
            resolve(&spec("mlx5_9", None), &ports),
            Resolved::Missing("device mlx5_9 not found (devices: mlx5_0, rxe0)".into())
        );
        assert_eq!(
            resolve(&spec("mlx5_0", Some(3)), &ports),
            Resolved::Missing("mlx5_0 has no port 3 (ports: 1, 2)".into())
        );
    }
}
