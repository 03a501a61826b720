//! The documented list of every variable mpib reads: README's configuration table
//! (`cargo run --example config_table`) and the unknown-name WARN come from it.

/// One known variable: its name, default (as shown to users) and what it accepts.
pub struct VarDoc {
    pub name: &'static str,
    pub default: &'static str,
    pub accepted: &'static str,
    pub meaning: &'static str,
    /// The NCCL variable whose value is this one's default when this one is not set ("":
    /// none).
    pub nccl: &'static str,
    /// A setting of each rail: the SOUT and SUP variables, each of which wins over this one
    /// for its rail (`MPIB_SOUT_TC` over `MPIB_TC`).
    pub rails: Option<[&'static str; 2]>,
}

/// Every variable mpib reads. README's table is this list.
pub const VARS: &[VarDoc] = &[
    VarDoc {
        name: "MPIB_FABRIC",
        default: "auto",
        accepted: "auto, verbs, soft, inproc",
        meaning: "fabric provider; auto = verbs when the host has RDMA devices (init fails when they cannot be used, so that NCCL uses its own transports), soft when it has none; inproc = soft with both ends in one process (tests)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_HCA",
        default: "(every active port)",
        accepted: "[^][=]device[:port[:rail[:plane]]], comma list (NCCL_IB_HCA syntax)",
        meaning: "the ports automatic pairing may use: ^ excludes, = exact names, else name prefixes",
        nccl: "NCCL_IB_HCA",
        rails: None,
    },
    VarDoc {
        name: "MPIB_HCA_SOUT",
        default: "(auto)",
        accepted: "device[:port[:rail[:plane]]], comma list",
        meaning: "scale-out rail devices; pair i = (SOUT[i], SUP[i])",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_HCA_SUP",
        default: "(auto)",
        accepted: "device[:port[:rail[:plane]]], comma list, as long as MPIB_HCA_SOUT",
        meaning: "scale-up rail devices",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_NCCL_DEVICES",
        default: "auto",
        accepted: "auto, pairs, nics",
        meaning: "what NCCL's devices are: pairs = one per rail pair; nics = the NICs, fused into pairs by NCCL (ABI v9+); auto = nics for pairs of two PCI NICs on one NUMA node",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_PCI_RELAXED_ORDERING",
        default: "2",
        accepted: "0, 1, 2",
        meaning: "PCI relaxed ordering of registrations (verbs): 0 off, 1 on, 2 on where libibverbs has ibv_reg_mr_iova2",
        nccl: "NCCL_IB_PCI_RELAXED_ORDERING",
        rails: None,
    },
    VarDoc {
        name: "MPIB_SPLIT",
        default: "auto",
        accepted: "auto, sout, sup, or 0-100 (% of bytes on SOUT)",
        meaning: "how each send is divided between the rails",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_SPLIT_MIN_BYTES",
        default: "65536",
        accepted: "0-1073741824",
        meaning: "auto split: smaller sends go whole to the rail that finishes them first",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_QP",
        default: "1",
        accepted: "1-16",
        meaning: "data QPs per connection on a rail; each request goes on one QP per rail, round-robin, unless MPIB_QP_STRIPE",
        nccl: "NCCL_IB_QPS_PER_CONNECTION",
        rails: Some(["MPIB_SOUT_QP", "MPIB_SUP_QP"]),
    },
    VarDoc {
        name: "MPIB_QP_STRIPE",
        default: "0",
        accepted: "0, 1",
        meaning: "1: a rail's share of each request is striped over up to 4 of the rail's QPs, in 128-byte-aligned pieces (more paths for ECMP on RoCE)",
        nccl: "NCCL_IB_SPLIT_DATA_ON_QPS",
        rails: Some(["MPIB_SOUT_QP_STRIPE", "MPIB_SUP_QP_STRIPE"]),
    },
    VarDoc {
        name: "MPIB_SRQ_DEPTH",
        default: "16384",
        accepted: "64-1048576",
        meaning: "WQEs of the shared receive queue each NIC has per NCCL communicator (at most the device's max_srq_wr); receives beyond it wait (RNR retry)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_GID_INDEX",
        default: "-1 (auto)",
        accepted: "-1, 0-255",
        meaning: "RoCE GID index; auto: the best GID by MPIB_ADDR_FAMILY, then MPIB_ROCE_VERSION, in MPIB_ADDR_RANGE",
        nccl: "NCCL_IB_GID_INDEX",
        rails: Some(["MPIB_SOUT_GID_INDEX", "MPIB_SUP_GID_INDEX"]),
    },
    VarDoc {
        name: "MPIB_TC",
        default: "-1 (the communicator's, else 0)",
        accepted: "-1, 0-255",
        meaning: "traffic class of the QPs (RoCE: the DSCP and ECN bits)",
        nccl: "NCCL_IB_TC",
        rails: Some(["MPIB_SOUT_TC", "MPIB_SUP_TC"]),
    },
    VarDoc {
        name: "MPIB_CTS_TC",
        default: "-1 (as MPIB_TC)",
        accepted: "-1, 0-255",
        meaning: "traffic class of a receive comm's QPs: its CTS and control writes, and the ACKs of the data it receives",
        nccl: "NCCL_IB_FIFO_TC",
        rails: Some(["MPIB_SOUT_CTS_TC", "MPIB_SUP_CTS_TC"]),
    },
    VarDoc {
        name: "MPIB_ROCE_VERSION",
        default: "2",
        accepted: "1, 2",
        meaning: "RoCE version of the GID chosen automatically (preferred, after the family)",
        nccl: "NCCL_IB_ROCE_VERSION_NUM",
        rails: Some(["MPIB_SOUT_ROCE_VERSION", "MPIB_SUP_ROCE_VERSION"]),
    },
    VarDoc {
        name: "MPIB_ADDR_FAMILY",
        default: "AF_INET",
        accepted: "AF_INET, AF_INET6",
        meaning: "address family of the GID chosen automatically (preferred)",
        nccl: "NCCL_IB_ADDR_FAMILY",
        rails: Some(["MPIB_SOUT_ADDR_FAMILY", "MPIB_SUP_ADDR_FAMILY"]),
    },
    VarDoc {
        name: "MPIB_ADDR_RANGE",
        default: "(any)",
        accepted: "address/prefix of MPIB_ADDR_FAMILY",
        meaning: "the GID chosen automatically is in this range",
        nccl: "NCCL_IB_ADDR_RANGE",
        rails: Some(["MPIB_SOUT_ADDR_RANGE", "MPIB_SUP_ADDR_RANGE"]),
    },
    VarDoc {
        name: "MPIB_SL",
        default: "-1 (the communicator's traffic class if 0-15, else 0)",
        accepted: "-1, 0-15",
        meaning: "InfiniBand service level",
        nccl: "NCCL_IB_SL",
        rails: Some(["MPIB_SOUT_SL", "MPIB_SUP_SL"]),
    },
    VarDoc {
        name: "MPIB_TIMEOUT",
        default: "20",
        accepted: "1-31",
        meaning: "QP ACK timeout exponent (4.096 us * 2^n); with RETRY_CNT 7, NCCL's defaults: both rails may be silent ~34 s before the connection errors (one silent rail is left within ~50 ms)",
        nccl: "NCCL_IB_TIMEOUT",
        rails: None,
    },
    VarDoc {
        name: "MPIB_RETRY_CNT",
        default: "7",
        accepted: "0-7",
        meaning: "QP transport retry count (7: rxe retries forever)",
        nccl: "NCCL_IB_RETRY_CNT",
        rails: None,
    },
    VarDoc {
        name: "MPIB_DMABUF",
        default: "1",
        accepted: "0, 1",
        meaning: "verbs: 1 offers NCCL DMA-BUF registration of GPU memory (regMrDmaBuf) where the kernel and NIC driver have it; 0 never",
        nccl: "NCCL_DMABUF_ENABLE",
        rails: None,
    },
    VarDoc {
        name: "MPIB_PKEY",
        default: "0",
        accepted: "0-65535",
        meaning: "verbs: the P_Key table index of the QPs (the partition), checked against each port's table at init",
        nccl: "NCCL_IB_PKEY",
        rails: None,
    },
    VarDoc {
        name: "MPIB_FAILOVER",
        default: "1",
        accepted: "0, 1",
        meaning: "1: a rail failure is survived on the other rail (only missing parts resent); 0: it fails the connection",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_STALL_MS",
        default: "0",
        accepted: "0-600000 (0 = off)",
        meaning: "a rail with work outstanding and no completion for this long (+32 ns per byte of its oldest part) has failed, whatever the other rail does (a silent rail beside a working one is left within ~50 ms without it)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_READMIT_MS",
        default: "100",
        accepted: "10-60000",
        meaning: "first back-off before a failed rail is tried again (doubles per failed attempt)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_READMIT_MAX_MS",
        default: "1000",
        accepted: "100-600000",
        meaning: "cap of the re-admission back-off",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_OUTAGE_GRACE_MS",
        default: "auto (RC's retry budget: 35000 with the defaults)",
        accepted: "auto, 0-3600000",
        meaning: "how long a connection whose rails have all failed waits for one to come back (rebuilt through the set-up channel) before it fails; 0: it fails at once",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_SILENT_MS",
        default: "auto (50 on verbs, 1000 on the soft fabric)",
        accepted: "auto, 0-600000",
        meaning: "the silent-rail check: a rail that completes nothing for this long (or 6 round-trip spreads, if longer) beyond its work's transfer time while the other rail completes has failed over; suspect (no new sends) at 2/5 of it; 0: off (RC's retry budget alone decides)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_FAULT_RAIL",
        default: "(none)",
        accepted: "sout:N, sup:N, both:N (N >= 1), optionally :MS; or RAIL:@AT[:MS[:EVERY[:COUNT]]] (ms); \
                   either then optionally :drop-imm, :drop-ack or :hold",
        meaning: "fault drill, soft fabric: each send comm's N-th isend drops that rail's QP connections (both ways); \
                  with :MS the rail refuses re-admission for MS ms, then comes back (without: stays down). \
                  @AT: at the first isend AT ms after the comm's first isend instead, again every EVERY ms \
                  (COUNT times in all; mpib-perf --fail-rail sets it). The last field (TCP soft fabric) arms a \
                  fault on the rail's QPs instead, firing on the next WR it matches: drop-imm (a WRITE_WITH_IMM's \
                  bytes land without the IMM, then the link dies), drop-ack (a WRITE_WITH_IMM delivered, its ACK \
                  lost, the link dies), hold (requests held until the QP pair's error state, then sent to be dropped)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_RTT_ALPHA",
        default: "0.125",
        accepted: "0 < a <= 1",
        meaning: "SRTT gain (RFC 6298 alpha)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_RTT_BETA",
        default: "0.25",
        accepted: "0 < b <= 1",
        meaning: "RTTVAR gain (RFC 6298 beta)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_PROBE_INTERVAL_US",
        default: "1000",
        accepted: "0-10000000 (0 = off)",
        meaning: "probe a rail idle for this long; one the split keeps idle while clearly slower than the other is probed ever less often, down to every 16 intervals",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_PROBE_RATE",
        default: "10000",
        accepted: "0-10000000 (0 = no cap)",
        meaning: "idle probes per second per NIC, all of the process's connections on it together (bursts of 10 ms's worth); a connection refused probes an interval later; keepalives are not capped",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_STATS_FILE",
        default: "(off)",
        accepted: "a path; %p = pid",
        meaning: "write per-rail, per-NIC and per-peer statistics to this file",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_PROM_FILE",
        default: "(off)",
        accepted: "a path; %p = pid",
        meaning: "write per-NIC and per-peer statistics to this file in Prometheus' text format (node-exporter textfile collector)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_STATS_INTERVAL_MS",
        default: "1000",
        accepted: "10-3600000",
        meaning: "how often the statistics file and the Prometheus file are rewritten",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_SOFT_SOUT_ADDR",
        default: "(NCCL_SOCKET_IFNAME, else first up non-loopback, else loopback)",
        accepted: "IP address or interface name",
        meaning: "soft fabric: local address of the SOUT rail",
        nccl: "NCCL_SOCKET_IFNAME",
        rails: None,
    },
    VarDoc {
        name: "MPIB_SOFT_SUP_ADDR",
        default: "(as MPIB_SOFT_SOUT_ADDR)",
        accepted: "IP address or interface name",
        meaning: "soft fabric: local address of the SUP rail",
        nccl: "NCCL_SOCKET_IFNAME",
        rails: None,
    },
    VarDoc {
        name: "MPIB_CONNECT_TIMEOUT_MS",
        default: "0",
        accepted: "0 or 100-3600000",
        meaning: "a deadline for connect/accept from the first call (0: none, wait while NCCL calls, as NCCL's own transports)",
        nccl: "",
        rails: None,
    },
    VarDoc {
        name: "MPIB_HANG_REPORT_MS",
        default: "10000",
        accepted: "0 or 100-3600000 (0 = off)",
        meaning: "a connection whose oldest request NCCL posted has waited this long logs once what it waits for (requests, rails, failover state); again only after that request completed",
        nccl: "",
        rails: None,
    },
];

impl VarDoc {
    /// This variable's names: its own, then its rails' (SOUT, SUP).
    pub fn names(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.name).chain(self.rails.into_iter().flatten())
    }
}

/// Every name mpib knows, per-rail ones included.
pub fn known_names() -> impl Iterator<Item = &'static str> {
    VARS.iter().flat_map(|v| v.names())
}

/// The variable documented as `name` (not a per-rail name).
pub fn doc(name: &str) -> &'static VarDoc {
    VARS.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("{name} is not in VARS"))
}

/// README's configuration table (Markdown), one row per setting.
pub fn markdown_table() -> String {
    let mut s = String::from("| Variable | Follows NCCL's | Default | Accepted | Meaning |\n|---|---|---|---|---|\n");
    for v in VARS {
        let rails = match v.rails {
            Some([a, b]) => format!(" (per rail: `{a}`, `{b}`)"),
            None => String::new(),
        };
        let nccl = if v.nccl.is_empty() { String::new() } else { format!("`{}`", v.nccl) };
        s.push_str(&format!("| `{}`{rails} | {nccl} | {} | {} | {} |\n", v.name, v.default, v.accepted, v.meaning));
    }
    s
}
