//! Locked memory. The kernel charges what RDMA pins (every registered region, and on most
//! NICs the queues' buffers: mlx5's CQs, SRQs and QPs) to the process's `RLIMIT_MEMLOCK`
//! unless it has `CAP_IPC_LOCK`; beyond it a create or register call fails with ENOMEM, a
//! bare "Cannot allocate memory". Jobs run as root never see it; jobs under a scheduler or
//! in a container often run with 64 KiB or 8 MiB. Both facts come from `/proc/self`.

use std::fmt;

/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// The process's locked-memory limit and whether it applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockedMemory {
    /// `RLIMIT_MEMLOCK` (soft) in bytes; `None`: unlimited, or unknown.
    pub limit: Option<u64>,
    /// The process has `CAP_IPC_LOCK` in its effective set: the limit does not apply.
    pub cap_ipc_lock: bool,
}

impl LockedMemory {
    /// The limit that applies to pinned memory, `None` when none does.
    pub fn applies(&self) -> Option<u64> {
        if self.cap_ipc_lock { None } else { self.limit }
    }
}

impl fmt::Display for LockedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.limit, self.cap_ipc_lock) {
            (_, true) => f.write_str("not limited (CAP_IPC_LOCK)"),
            (None, false) => f.write_str("unlimited"),
            (Some(l), false) => write!(f, "{} (ulimit -l {})", bytes(l), l / 1024),
        }
    }
}

/// `n` bytes, in the largest unit that keeps it whole-ish.
pub fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// This process's, read now.
pub fn locked_memory() -> LockedMemory {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    LockedMemory { limit: parse_limit(&limits), cap_ipc_lock: parse_cap_ipc_lock(&status) }
}

/// The soft `Max locked memory` of `/proc/self/limits` (`None`: unlimited or absent).
pub fn parse_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max locked memory"))?;
    line["Max locked memory".len()..].split_whitespace().next()?.parse().ok()
}

/// Whether `CapEff` of `/proc/self/status` has `CAP_IPC_LOCK`.
pub fn parse_cap_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// What to do about a locked-memory limit that is too small.
pub const ADVICE: &str = "raise it: `ulimit -l unlimited` before the job, `memlock` in /etc/security/limits.conf, \
     LimitMEMLOCK=infinity for a systemd service, `--ulimit memlock=-1` for a container";

/// What an ENOMEM of a verbs call adds to its error: whether the locked-memory limit can
/// be the cause.
pub fn enomem_hint(m: &LockedMemory) -> String {
    match m.applies() {
        Some(_) => format!("locked memory (RLIMIT_MEMLOCK) is {m} and RDMA pins memory against it: {ADVICE}"),
        None => format!("locked memory (RLIMIT_MEMLOCK) is {m}: not that limit; the host or the NIC is out of memory"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
        Max processes             127573               127573               processes \n\
        Max locked memory         65536                65536                bytes     \n\
        Max address space         unlimited            unlimited            bytes     \n";

    #[test]
    fn limits_and_capabilities_from_proc() {
        assert_eq!(parse_limit(LIMITS), Some(65536));
        assert_eq!(parse_limit(&LIMITS.replace("65536                65536", "unlimited unlimited")), None);
        assert_eq!(parse_limit(""), None);
        // Root: every capability; a user: none; root with CAP_IPC_LOCK dropped.
        assert!(parse_cap_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!parse_cap_ipc_lock("CapEff:\t0000000000000000\n"));
        assert!(!parse_cap_ipc_lock("CapEff:\t000001ffffffbfff\n"));
        assert!(!parse_cap_ipc_lock(""));
        // This process: whatever it is, consistent.
        let m = locked_memory();
        assert_eq!(m.applies().is_some(), !m.cap_ipc_lock && m.limit.is_some());
    }

    #[test]
    fn an_enomem_names_memlock_and_says_whether_it_is_the_cause() {
        let small = LockedMemory { limit: Some(64 << 10), cap_ipc_lock: false };
        let h = enomem_hint(&small);
        assert!(h.contains("RLIMIT_MEMLOCK) is 64 KiB (ulimit -l 64)") && h.contains("ulimit -l unlimited"), "{h}");
        let root = LockedMemory { limit: Some(64 << 10), cap_ipc_lock: true };
        assert!(enomem_hint(&root).contains("not limited (CAP_IPC_LOCK): not that limit"), "{}", enomem_hint(&root));
        let unlimited = LockedMemory { limit: None, cap_ipc_lock: false };
        assert!(enomem_hint(&unlimited).contains("unlimited: not that limit"));
        assert_eq!(bytes(8 << 20), "8.0 MiB");
        assert_eq!(bytes(100), "100 bytes");
    }
}
