//! What a soft device's interface says about it: speed, MTU, PCI path (sysfs), and a
//! stable identity; and the random numbers that name QPs.

/// Link speed reported when sysfs has none (loopback, some virtual NICs), in Mbit/s:
/// the value NCCL's socket transport reports in that case.
pub const NOMINAL_SPEED_MBPS: u32 = 10_000;

fn sysfs(iface: &str, what: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/{what}")).ok().map(|s| s.trim().to_string())
}

/// Link speed of an interface in Mbit/s, `None` when sysfs has none (then the device
/// reports [`NOMINAL_SPEED_MBPS`]).
pub fn speed_mbps(iface: Option<&str>) -> Option<u32> {
    iface
        .and_then(|i| sysfs(i, "speed"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|s| *s > 0)
        .map(|s| s.min(u32::MAX as i64) as u32)
}

/// MTU of an interface (1500 when unknown).
pub fn mtu(iface: Option<&str>) -> u32 {
    iface.and_then(|i| sysfs(i, "mtu")).and_then(|s| s.parse().ok()).unwrap_or(1500)
}

/// sysfs path of the interface's PCI device, when it has one.
pub fn pci_path(iface: Option<&str>) -> Option<String> {
    let p = std::fs::canonicalize(format!("/sys/class/net/{}/device", iface?)).ok()?;
    let s = p.to_string_lossy().into_owned();
    s.contains("/pci").then_some(s)
}

/// A stable 64-bit id (FNV-1a) of the rail's identity.
pub fn guid(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// A random u64 from the kernel (falls back to time and address bits).
pub fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into a live u64.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n != 8 {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        v = t ^ (&v as *const u64 as u64).rotate_left(17) ^ (std::process::id() as u64) << 40;
    }
    v | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_nominal_speed_and_identities_are_stable() {
        assert_eq!(speed_mbps(Some("lo")), None);
        assert_eq!(speed_mbps(None), None);
        assert_eq!(pci_path(Some("lo")), None);
        assert_eq!(guid(&["a", "b"]), guid(&["a", "b"]));
        assert_ne!(guid(&["ab", ""]), guid(&["a", "b"]));
    }
}
