//! NCCL's own variables, as a cluster tuned for NCCL's IB transport (net_ib) sets them.
//!
//! Those whose meaning carries over are the defaults of the matching `MPIB_*` settings
//! (`vars.rs` names each one's NCCL variable, `layers.rs` resolves them). Every other
//! `NCCL_IB_*` variable that is set is named at `init`, never dropped in silence:
//!
//! - a WARN when it asks for something mpib does not do ([`NOT_FOLLOWED`]): the operator's
//!   intent is not met, and the WARN says what mpib does instead. A value that asks for
//!   exactly what mpib does anyway (`NCCL_IB_ADAPTIVE_ROUTING=0`) is not warned about;
//! - an INFO when it only concerns NCCL's own IB transport ([`NOT_APPLICABLE`]): switching
//!   it on or off, its internal bookkeeping, its own device merging or port failover; mpib
//!   running says nothing about it, and the value harms nothing;
//! - a WARN for a name mpib does not know (another NCCL version's, or a typo).
//!
//! Values are read as NCCL reads them (`ncclLoadParam`: `strtoll(value, NULL, 0)`, so `0x`
//! hex and leading-`0` octal too; empty is unset), except that a value mpib would use must be
//! a whole number in mpib's range: NCCL would silently read `abc` as 0.
//!
//! NCCL copies `NCCL_CONF_FILE`, `~/.nccl.conf` and `/etc/nccl.conf` into the environment
//! (without overriding it) before it loads a network plugin, so their settings are seen
//! here too.

/// An `NCCL_IB_*` variable mpib does not follow: what mpib does instead, and the one value
/// (if any) that asks for exactly that.
pub struct NotFollowed {
    pub name: &'static str,
    /// The value that matches mpib's behaviour (no WARN), if one does.
    pub matches: Option<i64>,
    pub instead: &'static str,
}

/// The `NCCL_IB_*` variables mpib does not follow (WARN when set, unless the value matches).
pub const NOT_FOLLOWED: &[NotFollowed] = &[
    NotFollowed {
        name: "NCCL_IB_ADAPTIVE_ROUTING",
        matches: Some(0),
        instead: "mpib writes each rail's share and its immediate data in one WRITE_WITH_IMM, as net_ib does with adaptive routing off",
    },
    NotFollowed {
        name: "NCCL_IB_AR_THRESHOLD",
        matches: None,
        instead: "it applies only with NCCL_IB_ADAPTIVE_ROUTING, which mpib does not follow",
    },
    NotFollowed {
        name: "NCCL_IB_ECE_ENABLE",
        matches: Some(0),
        instead: "mpib does not negotiate ECE (enhanced connection establishment) on its QPs",
    },
    NotFollowed {
        name: "NCCL_IB_OOO_RQ",
        matches: Some(0),
        instead: "mpib does not create mlx5 out-of-order receive queues",
    },
    NotFollowed { name: "NCCL_IB_DATA_DIRECT", matches: Some(0), instead: "mpib does not use mlx5 Data Direct DMA" },
    NotFollowed {
        name: "NCCL_IB_SUBNET_AWARE_ROUTING",
        matches: Some(0),
        instead: "mpib does not pick NICs by the peer's subnet (name the rails with MPIB_HCA_SOUT/MPIB_HCA_SUP)",
    },
    NotFollowed {
        name: "NCCL_IB_SUBNET_PREFIX_LEN",
        matches: None,
        instead: "it applies only with NCCL_IB_SUBNET_AWARE_ROUTING, which mpib does not follow",
    },
    NotFollowed {
        name: "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
        matches: Some(1),
        instead: "mpib looks for an InfiniBand port's routable FLID at GID index 1, net_ib's default",
    },
    NotFollowed {
        name: "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
        matches: None,
        instead: "mpib's receives come from one shared receive queue per NIC and communicator (MPIB_SRQ_DEPTH)",
    },
    NotFollowed {
        name: "NCCL_IB_MQP_RETRY_ALL",
        matches: Some(0),
        instead: "mpib does not retry a failed ibv_modify_qp",
    },
    NotFollowed { name: "NCCL_IB_MQP_RETRY_CNT", matches: None, instead: "mpib does not retry a failed ibv_modify_qp" },
    NotFollowed {
        name: "NCCL_IB_MQP_RETRY_SLEEP_MSEC",
        matches: None,
        instead: "mpib does not retry a failed ibv_modify_qp",
    },
    NotFollowed {
        name: "NCCL_IB_MTU",
        matches: None,
        instead: "an older NCCL's variable: mpib uses the smaller active MTU of the two ports, as NCCL's IB transport does now",
    },
    NotFollowed {
        name: "NCCL_IB_CUDA_SUPPORT",
        matches: None,
        instead: "an older NCCL's variable: NCCL_NET_GDR_LEVEL (NCCL's) and MPIB_DMABUF decide GPU memory",
    },
];

/// `NCCL_IB_*` variables (or prefixes, ending in `_`) that concern only NCCL's own IB
/// transport: named at INFO, with why.
pub const NOT_APPLICABLE: &[(&str, &str)] = &[
    ("NCCL_IB_DISABLE", "it switches NCCL's own IB transport, not a network plugin"),
    ("NCCL_IB_MERGE_NICS", "net_ib's own NIC merging (mpib's devices: MPIB_NCCL_DEVICES)"),
    ("NCCL_IB_MERGE_VFS", "net_ib's own merging of virtual functions"),
    ("NCCL_IB_DEVICE_PCI_ORDER", "net_ib's own device order"),
    ("NCCL_IB_WARN_RAIL_LOCAL", "a warning of net_ib's"),
    ("NCCL_IB_RETURN_ASYNC_EVENTS", "net_ib's; mpib logs every async event and fails the rail it concerns"),
    ("NCCL_IB_QUERY_PORT_SPEED", "net_ib's port speed query"),
    ("NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME", "net_ib's request matching (mpib's protocol has its own)"),
    ("NCCL_IB_USE_INLINE", "mpib always sends its CTS inline (and sends of up to 64 bytes from host memory)"),
    ("NCCL_IB_RESILIENCY_", "net_ib's own port failover (mpib's rail failover: MPIB_FAILOVER)"),
];

/// Reads an integer as NCCL does (`strtoll(value, NULL, 0)`: optional sign, `0x` hex,
/// leading-`0` octal, surrounding blanks), but the whole value must be the number.
pub fn c_int(value: &str) -> Option<i64> {
    let v = value.trim();
    let (neg, v) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let (radix, digits) = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        (16, h)
    } else if v.len() > 1 && v.starts_with('0') {
        (8, &v[1..])
    } else {
        (10, v)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let n = i64::from_str_radix(digits, radix).ok()?;
    Some(if neg { -n } else { n })
}

/// What happens to a set `NCCL_*` variable that no `MPIB_*` setting follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfollowed {
    /// Nothing to say (not an `NCCL_IB_*` variable, or its value matches what mpib does).
    Quiet,
    /// A WARN line.
    Warn(String),
    /// An INFO line.
    Info(String),
}

/// What to say about `NCCL_*` variable `name` set to `value`, when no setting follows it.
pub fn unfollowed(name: &str, value: &str) -> Unfollowed {
    if !name.starts_with("NCCL_IB_") {
        return Unfollowed::Quiet;
    }
    let shown = super::shown(value);
    if let Some(v) = NOT_FOLLOWED.iter().find(|v| v.name == name) {
        if v.matches.is_some() && c_int(value) == v.matches {
            return Unfollowed::Quiet;
        }
        return Unfollowed::Warn(format!("{name}={shown} is not followed by mpib: {}", v.instead));
    }
    let applies = |p: &&(&str, &str)| if p.0.ends_with('_') { name.starts_with(p.0) } else { name == p.0 };
    if let Some((_, why)) = NOT_APPLICABLE.iter().find(applies) {
        return Unfollowed::Info(format!("{name}={shown} does not apply to mpib: {why}"));
    }
    let name = super::cut(name);
    Unfollowed::Warn(format!(
        "{name}={shown} is not known to mpib (another NCCL version's variable, or a typo?): it has no effect on mpib"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_as_strtoll_base_0() {
        assert_eq!(c_int("106"), Some(106));
        assert_eq!(c_int(" 106 "), Some(106));
        assert_eq!(c_int("0x6a"), Some(106));
        assert_eq!(c_int("0X6A"), Some(106));
        assert_eq!(c_int("0152"), Some(106), "leading 0: octal, as strtoll reads it");
        assert_eq!(c_int("0"), Some(0));
        assert_eq!(c_int("-1"), Some(-1));
        assert_eq!(c_int("+7"), Some(7));
        for bad in ["", "abc", "10abc", "0x", "08", "1.5", "--1", "99999999999999999999"] {
            assert_eq!(c_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unfollowed_variables_are_warned_about_or_noted() {
        let warn = |n: &str, v: &str| match unfollowed(n, v) {
            Unfollowed::Warn(w) => w,
            other => panic!("{n}={v}: {other:?}"),
        };
        let w = warn("NCCL_IB_ADAPTIVE_ROUTING", "1");
        assert!(w.contains("NCCL_IB_ADAPTIVE_ROUTING=\"1\" is not followed by mpib") && w.contains("WRITE_WITH_IMM"));
        assert_eq!(unfollowed("NCCL_IB_ADAPTIVE_ROUTING", "0"), Unfollowed::Quiet, "0 is what mpib does");
        assert!(warn("NCCL_IB_ADAPTIVE_ROUTING", "yes").contains("not followed"), "unreadable: not the matching value");
        assert!(warn("NCCL_IB_AR_THRESHOLD", "0").contains("NCCL_IB_ADAPTIVE_ROUTING"), "no value matches");
        assert!(warn("NCCL_IB_MTU", "4096").contains("active MTU"));
        let w = warn("NCCL_IB_TCC", "106");
        assert!(w.contains("NCCL_IB_TCC=\"106\" is not known to mpib") && w.contains("typo"), "{w}");
        match unfollowed("NCCL_IB_DISABLE", "1") {
            Unfollowed::Info(i) => assert!(i.contains("NCCL_IB_DISABLE=\"1\" does not apply to mpib"), "{i}"),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(unfollowed("NCCL_IB_RESILIENCY_PORT_FAILOVER", "1"), Unfollowed::Info(i) if i.contains("MPIB_FAILOVER"))
        );
        assert_eq!(unfollowed("NCCL_DEBUG", "INFO"), Unfollowed::Quiet, "only NCCL_IB_* are looked at");
        // No table entry is also a followed variable or listed twice.
        let mut names: Vec<&str> =
            NOT_FOLLOWED.iter().map(|v| v.name).chain(NOT_APPLICABLE.iter().map(|p| p.0)).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a variable listed twice");
        for v in crate::config::VARS {
            assert!(!names.contains(&v.nccl), "{} is followed and listed as not followed", v.nccl);
        }
    }
}
