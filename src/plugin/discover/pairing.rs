//! Which ports become the SOUT and SUP rails of each NCCL device.
//!
//! Explicit: `MPIB_HCA_SOUT[i]` with `MPIB_HCA_SUP[i]` (`device[:port]`; without a port, the
//! device's first active port). A pair with a port that is down is skipped with a WARN.
//!
//! Automatic: the active ports `MPIB_HCA` (else `NCCL_IB_HCA`) selects, ordered by PCI path
//! (devices without one, such as rxe, after those with one), then by name and port.
//!
//! - GPU first: each port belongs to the NVIDIA GPU nearest to it in the PCI tree, if one
//!   shares a PCIe root port or switch with it (see `topology`). Ports pair only with ports
//!   of the same GPU, so that every pair NCCL places near a GPU is near it with both NICs.
//!   Ports near no GPU (or every port, on a host without GPUs) pair among themselves.
//! - Within each group, walking the order, each unpaired port takes as partner the unpaired
//!   port nearest to it in the PCI tree (longest common sysfs path; the earlier one on a
//!   tie), so the two ports of one NIC, or two NICs under one PCIe switch, end up together;
//!   the earlier port of a pair is SOUT.
//! - An odd port out of a group is paired with itself (both rails on one port): a GPU's
//!   last NIC is not given a partner near another GPU.

use super::topology::{affinity, nearest_gpu};
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

/// Pairs the ports `order` lists (all of one group) by PCI nearness, in order.
fn pair_group(ports: &[HostPort], order: &[usize], pairs: &mut Vec<(usize, usize)>) {
    let mut taken = vec![false; order.len()];
    for i in 0..order.len() {
        if taken[i] {
            continue;
        }
        taken[i] = true;
        let a = order[i];
        let best = (i + 1..order.len()).filter(|&j| !taken[j]).max_by_key(|&j| {
            (affinity(ports[a].pci_path.as_deref(), ports[order[j]].pci_path.as_deref()), std::cmp::Reverse(j))
        });
        match best {
            Some(j) => {
                taken[j] = true;
                pairs.push((a, order[j]));
            }
            None => pairs.push((a, a)),
        }
    }
}

/// Automatic pairs, as indices into `ports` (SOUT, SUP), given the GPUs' PCI paths. Down
/// ports are left out. Pairs come in the order of their SOUT port.
pub fn pair_auto(ports: &[HostPort], gpus: &[String]) -> Vec<(usize, usize)> {
    let order = auto_order(ports);
    let gpu_of: Vec<Option<usize>> = order.iter().map(|&i| nearest_gpu(ports[i].pci_path.as_deref(), gpus)).collect();
    let mut groups: Vec<Option<usize>> = Vec::new();
    for g in &gpu_of {
        if !groups.contains(g) {
            groups.push(*g);
        }
    }
    let mut pairs = Vec::new();
    for g in groups {
        let members: Vec<usize> = order.iter().zip(&gpu_of).filter(|(_, x)| **x == g).map(|(&i, _)| i).collect();
        pair_group(ports, &members, &mut pairs);
    }
    let rank = |i: usize| order.iter().position(|&o| o == i).unwrap_or(usize::MAX);
    pairs.sort_by_key(|&(a, _)| rank(a));
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
        names(ports, &pair_auto(ports, &[]))
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

    const SW0: &str = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    const SW1: &str = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";

    fn under(sw: &str, port: &str, dev: &str) -> String {
        format!("{sw}/{port}/{dev}")
    }

    #[test]
    fn each_gpus_nics_pair_together() {
        // Two PCIe switches, each with a GPU and two NICs; names interleave across them.
        let gpus = [under(SW0, "0000:02:00.0", "0000:03:00.0"), under(SW1, "0000:82:00.0", "0000:83:00.0")];
        let ports = [
            port("mlx5_0", 1, true, Some(&under(SW0, "0000:02:01.0", "0000:04:00.0"))),
            port("mlx5_1", 1, true, Some(&under(SW1, "0000:82:01.0", "0000:84:00.0"))),
            port("mlx5_2", 1, true, Some(&under(SW0, "0000:02:02.0", "0000:05:00.0"))),
            port("mlx5_3", 1, true, Some(&under(SW1, "0000:82:02.0", "0000:85:00.0"))),
        ];
        assert_eq!(
            names(&ports, &pair_auto(&ports, &gpus)),
            vec![p("mlx5_0:1", "mlx5_2:1"), p("mlx5_1:1", "mlx5_3:1")]
        );
    }

    #[test]
    fn nics_of_different_gpus_do_not_pair() {
        // One switch, two downstream ports, each with a GPU and a NIC: without GPUs the two
        // NICs pair (they share the switch); with them each keeps to its own GPU.
        let gpus = [under(SW0, "0000:02:00.0", "0000:03:00.0"), under(SW0, "0000:02:01.0", "0000:04:00.0")];
        let ports = [
            port("mlx5_0", 1, true, Some(&under(SW0, "0000:02:00.0", "0000:03:00.1"))),
            port("mlx5_1", 1, true, Some(&under(SW0, "0000:02:01.0", "0000:04:00.1"))),
        ];
        assert_eq!(names(&ports, &pair_auto(&ports, &[])), vec![p("mlx5_0:1", "mlx5_1:1")]);
        assert_eq!(
            names(&ports, &pair_auto(&ports, &gpus)),
            vec![p("mlx5_0:1", "mlx5_0:1"), p("mlx5_1:1", "mlx5_1:1")]
        );
    }

    #[test]
    fn nics_near_no_gpu_pair_among_themselves_and_a_gpus_odd_nic_rails_with_itself() {
        // GPU0's switch holds three NICs; two more NICs (storage, front end) hang off other
        // root ports with no GPU. The GPU's NICs never pair with those.
        let gpus = [under(SW0, "0000:02:00.0", "0000:03:00.0")];
        let ports = [
            port("mlx5_0", 1, true, Some(&under(SW0, "0000:02:01.0", "0000:04:00.0"))),
            port("mlx5_1", 1, true, Some(&under(SW0, "0000:02:02.0", "0000:05:00.0"))),
            port("mlx5_2", 1, true, Some(&under(SW0, "0000:02:03.0", "0000:06:00.0"))),
            port("mlx5_3", 1, true, Some("/sys/devices/pci0000:00/0000:00:02.0/0000:07:00.0")),
            port("mlx5_4", 1, true, Some("/sys/devices/pci0000:00/0000:00:03.0/0000:08:00.0")),
        ];
        assert_eq!(
            names(&ports, &pair_auto(&ports, &gpus)),
            vec![p("mlx5_0:1", "mlx5_1:1"), p("mlx5_2:1", "mlx5_2:1"), p("mlx5_3:1", "mlx5_4:1"),]
        );
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
        assert!(pair_auto(&[port("a", 1, false, None)], &[]).is_empty());
        assert!(pair_auto(&[], &[]).is_empty());
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
