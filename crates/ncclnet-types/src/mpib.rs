//! mpib's own C types, beside the ncclNet ones: what its exported `mpib_*` functions fill
//! (declared in `include/mpib.h`). Tools read them through `dlsym`, as they read the tables.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

/// Per-rail counters of one connection (index 0 = SOUT, 1 = SUP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mpib_rail_counters_t {
    /// Send work requests posted (data, signalling, CTS, probes, flushes).
    pub wr_posted: u64,
    /// Post calls (one per chain).
    pub doorbells: u64,
    /// Payload bytes posted.
    pub bytes: u64,
    /// WRITE_WITH_IMM work requests posted.
    pub imm_sent: u64,
    /// Completions polled.
    pub cqe: u64,
    /// Receiver-not-ready waits (receive side).
    pub rnr: u64,
    /// IMMs posted on a rail that carried no bytes of a non-empty transfer (always 0).
    pub zero_byte_imm: u64,
    /// Idle-rail probes posted.
    pub probes: u64,
}

/// One rail's figures over the whole process: every connection, live or closed, both
/// directions. Counters are sums; latencies are of data chains (post → signalled
/// completion); the estimates are the mean over live connections (else the last closed
/// one's). All 0 where nothing happened.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct mpib_rail_stats_t {
    /// The counters `mpib_comm_counters` gives per comm, summed over the process.
    pub counters: mpib_rail_counters_t,
    /// Completions with an error status.
    pub errors: u64,
    /// RTT samples (data chains and probes).
    pub rtt_samples: u64,
    /// Samples that marked the rail congested.
    pub congestion_events: u64,
    /// Data chains whose completion was timed, and their latency statistics (ns).
    pub latency_samples: u64,
    pub latency_min_ns: u64,
    pub latency_avg_ns: u64,
    pub latency_median_ns: u64,
    pub latency_p95_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    /// RFC 6298 smoothed RTT and its variation (ns).
    pub srtt_ns: u64,
    pub rttvar_ns: u64,
    /// RTT of an empty chain on an idle rail (ns).
    pub base_latency_ns: u64,
    /// Delivery-rate estimate.
    pub bw_bytes_per_s: u64,
    /// Connections open now with statistics on this rail.
    pub live_connections: u64,
    /// This rail's part of the payload bytes of both rails (0 … 1).
    pub share: f64,
    /// Failures of this rail survived on the other rail (rail failover), and the bytes of
    /// its parts re-sent there.
    pub failovers: u64,
    pub replayed_bytes: u64,
    /// Connection sides open now whose side of this rail is failed.
    pub failed_connections: u64,
    /// Times this rail was re-admitted after a failure (new QPs, probed, used again).
    pub readmissions: u64,
    /// Times this rail was suspected silent: it completed nothing for long while the other
    /// rail of its connection completed work, and new sends left it.
    pub suspects: u64,
}

/// One NIC on one rail over the whole process (`mpib_nic_stats`): the figures
/// `mpib_rail_stats_t` gives per rail, for the connections of this NIC on this rail (a
/// NIC both rails use has a row per rail). `stats.share` is this row's part of the payload
/// bytes of all rows. The name is NUL-terminated and cut to fit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct mpib_nic_stats_t {
    /// The NIC and port: `mlx5_0:1`, `soft-sout:1`.
    pub nic: [c_char; 64],
    /// 0 = SOUT, 1 = SUP.
    pub rail: u32,
    pub reserved: u32,
    pub stats: mpib_rail_stats_t,
}

impl Default for mpib_nic_stats_t {
    fn default() -> Self {
        mpib_nic_stats_t { nic: [0; 64], rail: 0, reserved: 0, stats: mpib_rail_stats_t::default() }
    }
}

/// `mpib_worst_peers`' ranking: by the p99 latency of data chains (then SRTT) of live
/// connections.
pub const MPIB_WORST_BY_LATENCY: i32 = 0;
/// `mpib_worst_peers`' ranking: by error completions + failovers + silent-rail suspicions
/// over the whole run (then errors).
pub const MPIB_WORST_BY_ERRORS: i32 = 1;

/// One peer as one local NIC reaches it on one rail (`mpib_worst_peers`). Counters are over
/// the whole run; latencies and SRTT are of the live connections (0 without any). Strings
/// are NUL-terminated and cut to fit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mpib_peer_stats_t {
    /// The peer's address on this rail: `GID fe80::…`, `LID 0x5 GID …`, or `IP:port`.
    pub peer: [c_char; 128],
    /// The local NIC and port: `mlx5_0:1`.
    pub nic: [c_char; 64],
    /// 0 = SOUT, 1 = SUP.
    pub rail: u32,
    pub reserved: u32,
    pub live_connections: u64,
    pub latency_samples: u64,
    pub latency_median_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    pub srtt_ns: u64,
    /// Payload bytes posted.
    pub bytes: u64,
    /// Completions with an error status, failovers survived, silent-rail suspicions.
    pub errors: u64,
    pub failovers: u64,
    pub suspects: u64,
}

impl Default for mpib_peer_stats_t {
    fn default() -> Self {
        mpib_peer_stats_t {
            peer: [0; 128],
            nic: [0; 64],
            rail: 0,
            reserved: 0,
            live_connections: 0,
            latency_samples: 0,
            latency_median_ns: 0,
            latency_p99_ns: 0,
            latency_max_ns: 0,
            srtt_ns: 0,
            bytes: 0,
            errors: 0,
            failovers: 0,
            suspects: 0,
        }
    }
}

/// What the plugin holds now, process-wide (`mpib_resource_stats`): comms, contexts, fabric
/// objects and registered control memory. Every figure but `unrouted_completions` returns to
/// its earlier value when what was opened is closed again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mpib_resource_stats_t {
    /// Plugin contexts: with ABI v11+ one per NCCL communicator (`init`), else one per process.
    pub contexts: u64,
    pub send_comms: u64,
    pub recv_comms: u64,
    pub listen_comms: u64,
    /// Sets of shared queues: one per NIC a context's connections use.
    pub nic_queues: u64,
    /// Completion queues and their entries.
    pub cqs: u64,
    pub cq_entries: u64,
    /// Shared receive queues, their depth, and the WQEs posted in them now.
    pub srqs: u64,
    pub srq_wqes: u64,
    pub srq_posted: u64,
    /// Queue pairs and the sum of their send-queue depths.
    pub qps: u64,
    pub qp_send_wrs: u64,
    /// Bytes of the connections' control regions (CTS FIFO, completion records, scratch),
    /// once per NIC registration.
    pub control_bytes: u64,
    /// Capacity, in completions, of the per-connection completion inboxes.
    pub inbox_entries: u64,
    /// Completions no live connection claimed (a closed connection's late ones), so far.
    pub unrouted_completions: u64,
}

/// `mpib_rail_info_t::link_layer`: InfiniBand (verbs).
pub const MPIB_LINK_INFINIBAND: u32 = 1;
/// `mpib_rail_info_t::link_layer`: Ethernet, RDMA over Converged Ethernet (verbs).
pub const MPIB_LINK_ETHERNET: u32 = 2;
/// `mpib_rail_info_t::link_layer`: TCP sockets (the soft fabric).
pub const MPIB_LINK_TCP: u32 = 3;

/// One rail of a device (`mpib_device_rails`): the NIC port it runs on. Strings are
/// NUL-terminated and cut to fit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mpib_rail_info_t {
    /// The NIC's name as `MPIB_HCA_SOUT` / `MPIB_HCA_SUP` take it (`mlx5_0`, `soft-sout`).
    pub name: [c_char; 64],
    pub port: u32,
    /// `MPIB_LINK_INFINIBAND`, `MPIB_LINK_ETHERNET` or `MPIB_LINK_TCP`.
    pub link_layer: u32,
    /// Link speed (Mbit/s).
    pub speed_mbps: u32,
    /// 1 when the NIC reported `speed_mbps`, 0 when it is a nominal figure (an interface
    /// without a line rate, such as loopback).
    pub speed_known: u32,
    /// Verbs: the index of the GID the rail's queue pairs use; -1 otherwise.
    pub gid_index: i32,
    /// InfiniBand: the port's LID; 0 otherwise.
    pub lid: u32,
    /// Verbs: that GID (network byte order); zeros otherwise.
    pub gid: [u8; 16],
    /// The address as the plugin's INFO banner shows it: `GID 3 ::ffff:10.0.0.1`,
    /// `LID 0x5`, or a TCP address `127.0.0.1:40001`.
    pub address: [c_char; 64],
    /// The NIC's sysfs PCI path (`/sys/devices/pci0000:00/…`), empty when it has none.
    pub pci_path: [c_char; 256],
}

impl Default for mpib_rail_info_t {
    fn default() -> Self {
        mpib_rail_info_t {
            name: [0; 64],
            port: 0,
            link_layer: 0,
            speed_mbps: 0,
            speed_known: 0,
            gid_index: -1,
            lid: 0,
            gid: [0; 16],
            address: [0; 64],
            pci_path: [0; 256],
        }
    }
}

// ---- NCCL profiler events ------------------------------------------------------------------
//
// When NCCL (2.26+, ncclNet v10+) gives `init` a profiler callback, mpib reports each
// request's work on each rail through it, as NCCL's IB transport reports its QPs' work
// (NCCL's `profiler/net_ib_v1.h`): a start event with a descriptor, a stop event later.
// A profiler plugin sees them as `ncclProfileNetPlugin` events whose `netPlugin.id` is
// `MPIB_PROFILER_NET_TYPE | MPIB_PROFILER_NET_MPIB_VER` and whose `netPlugin.data` points
// at a `mpib_profiler_descr_v1_t` (valid during its `startEvent` only: copy it there).

/// mpib's network type in a profiler event's plugin id, in NCCL's type field (bits 16-31,
/// `NCCL_PROFILER_NET_TYPE_MASK`): `0x4D42` ("MB"), far from NCCL's own types (IB 1,
/// socket 2), which it numbers from 1.
pub const MPIB_PROFILER_NET_TYPE: i64 = 0x4D42_0000;
/// The version of the descriptor, in the plugin id's low 16 bits
/// (`NCCL_PROFILER_NET_VER_MASK`).
pub const MPIB_PROFILER_NET_MPIB_VER: i64 = 1;

/// `mpib_profiler_descr_v1_t::type`: one rail's part of a send, from the post of its chain
/// to the completion of its signalled WRITE_WITH_IMM (or until it is abandoned: a failed
/// rail, a closed connection).
pub const MPIB_PROFILE_SEND_PART: u8 = 1;
/// `mpib_profiler_descr_v1_t::type`: a part of a send re-sent on the other rail after its
/// own rail failed (rail failover), from the failover to the replay's completion.
pub const MPIB_PROFILE_REPLAY: u8 = 2;
/// `mpib_profiler_descr_v1_t::type`: one receive buffer, from its CTS posted (`rail`, `qp_num`:
/// the CTS's) to its completion. The receiver does not know the split (`rail_bytes` are 0).
pub const MPIB_PROFILE_RECV: u8 = 3;
/// `mpib_profiler_descr_v1_t::rail` when the rail is not known.
pub const MPIB_PROFILER_RAIL_UNKNOWN: u8 = 0xff;

/// The data of an mpib profiler event (version 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mpib_profiler_descr_v1_t {
    /// `MPIB_PROFILE_SEND_PART`, `MPIB_PROFILE_REPLAY` or `MPIB_PROFILE_RECV`.
    pub r#type: u8,
    /// The rail the work is on: 0 SOUT, 1 SUP (`MPIB_PROFILER_RAIL_UNKNOWN`: not known).
    pub rail: u8,
    /// The NCCL device index of the connection.
    pub device: i32,
    /// The QP the work was posted on (0 when not known: a replay's).
    pub qp_num: u32,
    /// The CTS slot of the request (sends of one slot share their chains).
    pub slot: u32,
    /// Bytes of this part (this rail's share of the request; a receive: the buffer's size).
    pub length: u64,
    /// The request's size in bytes (a receive: the buffer's size).
    pub size: u64,
    /// The split decision: the request's bytes on SOUT and on SUP (`rail_bytes[0] +
    /// rail_bytes[1] == size` for a send).
    pub rail_bytes: [u64; 2],
}
