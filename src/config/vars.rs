//! The documented list of every variable mpib reads: README's configuration table
//! (`cargo run --example config_table`) and the unknown-name WARN come from it.

/// One known variable: its name, default (as shown to users) and what it accepts.
pub struct VarDoc {
    pub name: &'static str,
    pub default: &'static str,
    pub accepted: &'static str,
    pub meaning: &'static str,
}

/// Every variable mpib reads. README's table is this list.
pub const VARS: &[VarDoc] = &[
    VarDoc {
        name: "MPIB_FABRIC",
        default: "auto",
        accepted: "auto, verbs, soft, inproc",
        meaning: "fabric provider; auto = verbs when RDMA devices exist, else soft; inproc = soft with both ends in one process (tests)",
    },
    VarDoc {
        name: "MPIB_HCA",
        default: "(NCCL_IB_HCA, else every active port)",
        accepted: "[^][=]device[:port[:rail[:plane]]], comma list (NCCL_IB_HCA syntax)",
        meaning: "the ports automatic pairing may use: ^ excludes, = exact names, else name prefixes",
    },
    VarDoc {
        name: "MPIB_HCA_SOUT",
        default: "(auto)",
        accepted: "device[:port[:rail[:plane]]], comma list",
        meaning: "scale-out rail devices; pair i = (SOUT[i], SUP[i])",
    },
    VarDoc {
        name: "MPIB_HCA_SUP",
        default: "(auto)",
        accepted: "device[:port[:rail[:plane]]], comma list, as long as MPIB_HCA_SOUT",
        meaning: "scale-up rail devices",
    },
    VarDoc {
        name: "MPIB_NCCL_DEVICES",
        default: "auto",
        accepted: "auto, pairs, nics",
        meaning: "what NCCL's devices are: pairs = one per rail pair; nics = the NICs, fused into pairs by NCCL (ABI v9+); auto = nics for pairs of two PCI NICs on one NUMA node",
    },
    VarDoc {
        name: "MPIB_PCI_RELAXED_ORDERING",
        default: "2",
        accepted: "0, 1, 2",
        meaning: "PCI relaxed ordering of registrations (verbs): 0 off, 1 on, 2 on where libibverbs has ibv_reg_mr_iova2",
    },
    VarDoc {
        name: "MPIB_SPLIT",
        default: "auto",
        accepted: "auto, sout, sup, or 0-100 (% of bytes on SOUT)",
        meaning: "how each send is divided between the rails",
    },
    VarDoc {
        name: "MPIB_SPLIT_MIN_BYTES",
        default: "65536",
        accepted: "0-1073741824",
        meaning: "auto split: smaller sends go whole to the rail that finishes them first",
    },
    VarDoc {
        name: "MPIB_SOUT_QP",
        default: "1",
        accepted: "1-16",
        meaning: "data QPs per connection on SOUT (round-robin per request)",
    },
    VarDoc { name: "MPIB_SUP_QP", default: "1", accepted: "1-16", meaning: "data QPs per connection on SUP" },
    VarDoc {
        name: "MPIB_SRQ_DEPTH",
        default: "16384",
        accepted: "64-1048576",
        meaning: "WQEs of the shared receive queue each NIC has per NCCL communicator (at most the device's max_srq_wr); receives beyond it wait (RNR retry)",
    },
    VarDoc {
        name: "MPIB_GID_INDEX",
        default: "-1 (auto)",
        accepted: "-1, 0-255",
        meaning: "RoCE GID index; auto prefers RoCE v2 IPv4-mapped",
    },
    VarDoc { name: "MPIB_TC", default: "(comm's, else 0)", accepted: "0-255", meaning: "traffic class of the QPs" },
    VarDoc { name: "MPIB_SL", default: "0", accepted: "0-15", meaning: "InfiniBand service level" },
    VarDoc {
        name: "MPIB_TIMEOUT",
        default: "14",
        accepted: "1-31",
        meaning: "QP ACK timeout exponent (4.096 us * 2^n); 14 with RETRY_CNT 6: a silent link errors in ~0.47 s",
    },
    VarDoc {
        name: "MPIB_RETRY_CNT",
        default: "6",
        accepted: "0-7",
        meaning: "QP transport retry count (7: rxe retries forever)",
    },
    VarDoc {
        name: "MPIB_FAILOVER",
        default: "1",
        accepted: "0, 1",
        meaning: "1: a rail failure is survived on the other rail (only missing parts resent); 0: it fails the connection",
    },
    VarDoc {
        name: "MPIB_STALL_MS",
        default: "5000",
        accepted: "0-600000 (0 = off)",
        meaning: "a rail with work outstanding and no completion for this long (+32 ns per byte of its oldest part) has failed",
    },
    VarDoc {
        name: "MPIB_READMIT_MS",
        default: "100",
        accepted: "10-60000",
        meaning: "first back-off before a failed rail is tried again (doubles per failed attempt)",
    },
    VarDoc {
        name: "MPIB_READMIT_MAX_MS",
        default: "5000",
        accepted: "100-600000",
        meaning: "cap of the re-admission back-off",
    },
    VarDoc {
        name: "MPIB_FAULT_RAIL",
        default: "(none)",
        accepted: "sout:N, sup:N, both:N (N >= 1), optionally :MS; or RAIL:@AT[:MS[:EVERY[:COUNT]]] (ms)",
        meaning: "fault drill, soft fabric: each send comm's N-th isend drops that rail's QP connections (both ways); \
                  with :MS the rail refuses re-admission for MS ms, then comes back (without: stays down). \
                  @AT: at the first isend AT ms after the comm's first isend instead, again every EVERY ms \
                  (COUNT times in all; mpib-perf --fail-rail sets it)",
    },
    VarDoc { name: "MPIB_RTT_ALPHA", default: "0.125", accepted: "0 < a <= 1", meaning: "SRTT gain (RFC 6298 alpha)" },
    VarDoc { name: "MPIB_RTT_BETA", default: "0.25", accepted: "0 < b <= 1", meaning: "RTTVAR gain (RFC 6298 beta)" },
    VarDoc {
        name: "MPIB_PROBE_INTERVAL_US",
        default: "1000",
        accepted: "0-10000000 (0 = off)",
        meaning: "probe a rail idle for this long; one the split keeps idle while clearly slower than the other is probed ever less often, down to every 16 intervals",
    },
    VarDoc {
        name: "MPIB_PROBE_RATE",
        default: "10000",
        accepted: "0-10000000 (0 = no cap)",
        meaning: "idle probes per second per NIC, all of the process's connections on it together (bursts of 10 ms's worth); a connection refused probes an interval later; keepalives are not capped",
    },
    VarDoc {
        name: "MPIB_STATS_FILE",
        default: "(off)",
        accepted: "a path; %p = pid",
        meaning: "write per-rail statistics to this file",
    },
    VarDoc {
        name: "MPIB_STATS_INTERVAL_MS",
        default: "1000",
        accepted: "10-3600000",
        meaning: "how often the statistics file is rewritten",
    },
    VarDoc {
        name: "MPIB_SOFT_SOUT_ADDR",
        default: "(NCCL_SOCKET_IFNAME, else first up non-loopback, else loopback)",
        accepted: "IP address or interface name",
        meaning: "soft fabric: local address of the SOUT rail",
    },
    VarDoc {
        name: "MPIB_SOFT_SUP_ADDR",
        default: "(as MPIB_SOFT_SOUT_ADDR)",
        accepted: "IP address or interface name",
        meaning: "soft fabric: local address of the SUP rail",
    },
    VarDoc {
        name: "MPIB_CONNECT_TIMEOUT_MS",
        default: "0",
        accepted: "0 or 100-3600000",
        meaning: "a deadline for connect/accept from the first call (0: none, wait while NCCL calls, as NCCL's own transports)",
    },
];
