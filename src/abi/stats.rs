//! `mpib_rail_stats`, `mpib_nic_stats` and `mpib_worst_peers`: the process's per-rail,
//! per-NIC and per-peer statistics (what the statistics file shows, `telemetry`'s
//! registry) for tools such as `mpib-perf`, without a file.
#![allow(non_camel_case_types)]

use super::PROCESS;
use std::mem::size_of;

use super::guard::run;
use crate::error::{Error, Result};
use crate::telemetry::{NicTotals, PeerTotals, RailTotals};
use ncclnet_types::mpib::*;
use ncclnet_types::types::ncclResult_t;

impl From<&RailTotals> for mpib_rail_stats_t {
    fn from(t: &RailTotals) -> Self {
        let (c, l) = (&t.counts, &t.latency);
        mpib_rail_stats_t {
            counters: c.into(),
            errors: c.errors,
            rtt_samples: c.rtt_samples,
            congestion_events: c.congestion_events,
            latency_samples: l.samples,
            latency_min_ns: l.min_ns,
            latency_avg_ns: l.avg_ns,
            latency_median_ns: l.median_ns,
            latency_p95_ns: l.p95_ns,
            latency_p99_ns: l.p99_ns,
            latency_max_ns: l.max_ns,
            srtt_ns: t.srtt_ns,
            rttvar_ns: t.rttvar_ns,
            base_latency_ns: t.base_ns,
            bw_bytes_per_s: t.bw_bytes_per_s,
            live_connections: t.live,
            share: t.share,
            failovers: c.failovers,
            replayed_bytes: c.replayed_bytes,
            failed_connections: t.failed,
            readmissions: c.readmissions,
            suspects: c.suspects,
        }
    }
}

/// Writes the process's statistics of SOUT to `out[0]` and of SUP to `out[1]`.
///
/// `size` is `sizeof(mpib_rail_stats_t)` as the caller was compiled: it is the stride of
/// `out`, and only the first `size` bytes of each entry are written, so a caller built
/// against an older (shorter) header stays safe with a newer library. Returns ncclSuccess,
/// or ncclInvalidArgument for a NULL `out` or a `size` below 8.
///
/// # Safety
/// `out` must be NULL or point to `2 * size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_rail_stats(out: *mut mpib_rail_stats_t, size: usize) -> ncclResult_t {
    super::logger::install();
    run("mpib_rail_stats", || {
        let n = prefix_len::<mpib_rail_stats_t>(out.is_null(), size, "mpib_rail_stats_t")?;
        for (i, t) in PROCESS.stats().totals().iter().enumerate() {
            // SAFETY: the caller gives 2 × `size` writable bytes at `out`, so
            // `[i·size, i·size + n)` (n ≤ size) lies inside them.
            unsafe { write_prefix(&mpib_rail_stats_t::from(t), out.cast::<u8>().add(i * size), n) };
        }
        Ok(())
    })
}

impl From<&NicTotals> for mpib_nic_stats_t {
    fn from(n: &NicTotals) -> Self {
        let mut out = mpib_nic_stats_t { rail: n.rail as u32, stats: (&n.totals).into(), ..Default::default() };
        c_string(&mut out.nic, &n.nic);
        out
    }
}

impl From<&PeerTotals> for mpib_peer_stats_t {
    fn from(p: &PeerTotals) -> Self {
        let (c, l) = (&p.counts, &p.latency);
        let mut out = mpib_peer_stats_t {
            rail: p.rail as u32,
            live_connections: p.live,
            latency_samples: l.samples,
            latency_median_ns: l.median_ns,
            latency_p99_ns: l.p99_ns,
            latency_max_ns: l.max_ns,
            srtt_ns: p.srtt_ns,
            bytes: c.bytes,
            errors: c.errors,
            failovers: c.failovers,
            suspects: c.suspects,
            ..Default::default()
        };
        c_string(&mut out.peer, &p.peer);
        c_string(&mut out.nic, &p.nic);
        out
    }
}

/// Writes up to `max` rows to `out` (stride `size`, a prefix of each as `prefix_len` says)
/// and their number in all to `*count` (when not NULL). `out` may be NULL when `max` is 0.
///
/// # Safety
/// `out` must be NULL or point to `max * size` writable bytes; `count` NULL or writable.
unsafe fn write_rows<T: Copy>(
    rows: &[T],
    out: *mut T,
    size: usize,
    max: usize,
    count: *mut usize,
    name: &str,
) -> Result<()> {
    let n = if max == 0 { 0 } else { prefix_len::<T>(out.is_null(), size, name)? };
    for (i, row) in rows.iter().take(max).enumerate() {
        // SAFETY: the caller gives `max × size` writable bytes at `out`; i < max and n ≤ size.
        unsafe { write_prefix(row, out.cast::<u8>().add(i * size), n) };
    }
    if !count.is_null() {
        // SAFETY: the caller gives a writable `size_t` at `count` when it is not NULL.
        unsafe { count.write(rows.len()) };
    }
    Ok(())
}

/// The per-NIC view: writes the process's figures of each NIC on each rail (summed over live
/// and closed connections, ordered by NIC name then rail) to `out[0 .. max]`, and the number
/// of rows there are to `*count` (NULL: not wanted). Call it with `max` 0 and `out` NULL to
/// learn the count.
///
/// `size` is `sizeof(mpib_nic_stats_t)` as the caller was compiled: it is the stride of
/// `out`, and only the first `size` bytes of each entry are written. Returns ncclSuccess, or
/// ncclInvalidArgument for a NULL `out` with `max` > 0 or a `size` below 8.
///
/// # Safety
/// `out` must be NULL or point to `max * size` writable bytes; `count` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_nic_stats(
    out: *mut mpib_nic_stats_t,
    size: usize,
    max: usize,
    count: *mut usize,
) -> ncclResult_t {
    super::logger::install();
    run("mpib_nic_stats", || {
        let rows: Vec<mpib_nic_stats_t> = PROCESS.stats().nic_totals().iter().map(Into::into).collect();
        // SAFETY: the caller's promise, passed on.
        unsafe { write_rows(&rows, out, size, max, count, "mpib_nic_stats_t") }
    })
}

/// The per-peer view: writes the `max` worst peers (a peer is the remote address one local
/// NIC reaches on one rail), worst first, to `out`, and how many were written to `*count`
/// (NULL: not wanted). `by` is `MPIB_WORST_BY_LATENCY` (p99 latency of the live
/// connections' data chains, then SRTT; peers without samples are not ranked) or
/// `MPIB_WORST_BY_ERRORS` (errors + failovers + suspicions over the run; peers without any
/// are not ranked).
///
/// `size` is `sizeof(mpib_peer_stats_t)` as the caller was compiled (stride of `out`; only
/// that prefix of each entry is written). Returns ncclSuccess, or ncclInvalidArgument for
/// an unknown `by`, a NULL `out` with `max` > 0, or a `size` below 8.
///
/// # Safety
/// `out` must be NULL or point to `max * size` writable bytes; `count` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_worst_peers(
    by: i32,
    out: *mut mpib_peer_stats_t,
    size: usize,
    max: usize,
    count: *mut usize,
) -> ncclResult_t {
    super::logger::install();
    run("mpib_worst_peers", || {
        let worst = PROCESS.stats().worst_peers(max);
        let ranked = match by {
            MPIB_WORST_BY_LATENCY => worst.by_latency,
            MPIB_WORST_BY_ERRORS => worst.by_errors,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "by {by}: MPIB_WORST_BY_LATENCY (0) or MPIB_WORST_BY_ERRORS (1)"
                )));
            }
        };
        let rows: Vec<mpib_peer_stats_t> = ranked.iter().map(Into::into).collect();
        // SAFETY: the caller's promise, passed on.
        unsafe { write_rows(&rows, out, size, max, count, "mpib_peer_stats_t") }
    })
}

impl From<&crate::plugin::resources::Resources> for mpib_resource_stats_t {
    fn from(r: &crate::plugin::resources::Resources) -> Self {
        mpib_resource_stats_t {
            contexts: r.contexts,
            send_comms: r.send_comms,
            recv_comms: r.recv_comms,
            listen_comms: r.listen_comms,
            nic_queues: r.nic_queues,
            cqs: r.cqs,
            cq_entries: r.cq_entries,
            srqs: r.srqs,
            srq_wqes: r.srq_wqes,
            srq_posted: r.srq_posted,
            qps: r.qps,
            qp_send_wrs: r.qp_send_wrs,
            control_bytes: r.control_bytes,
            inbox_entries: r.inbox_entries,
            unrouted_completions: r.unrouted_completions,
        }
    }
}

/// Writes what the plugin holds now (comms, contexts, CQs, SRQs, QPs, registered control
/// memory; see `mpib_resource_stats_t`) to `*out`.
///
/// `size` is `sizeof(mpib_resource_stats_t)` as the caller was compiled: only that many
/// bytes are written, so a caller built against an older (shorter) header stays safe.
/// Returns ncclSuccess, or ncclInvalidArgument for a NULL `out` or a `size` below 8.
///
/// # Safety
/// `out` must be NULL or point to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_resource_stats(out: *mut mpib_resource_stats_t, size: usize) -> ncclResult_t {
    super::logger::install();
    run("mpib_resource_stats", || {
        let n = prefix_len::<mpib_resource_stats_t>(out.is_null(), size, "mpib_resource_stats_t")?;
        let s = mpib_resource_stats_t::from(&PROCESS.resources());
        // SAFETY: the caller gives `size` (≥ `n`) writable bytes at `out`.
        unsafe { write_prefix(&s, out.cast::<u8>(), n) };
        Ok(())
    })
}

/// The state of every live connection, in words: per connection its place (NICs, addresses,
/// QPs, communicator) and what it waits for (requests with their slots, bytes, rails and
/// ages, each rail's work in flight and last completion, failover), as the hang report
/// (`MPIB_HANG_REPORT_MS`) shows it. For a debugger (`call mpib_dump_state(0, 0, 0)`) or a
/// tool.
///
/// With `buf` NULL the text is logged (WARN); else its first `size - 1` bytes are copied to
/// `buf` and a NUL after them. `needed`, when not NULL, gets the text's length plus one (a
/// `size` that large holds it all). Returns ncclSuccess, or ncclInvalidUsage before `init`.
///
/// # Safety
/// `buf` must be NULL or point to `size` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_dump_state(buf: *mut std::ffi::c_char, size: usize, needed: *mut usize) -> ncclResult_t {
    super::logger::install();
    run("mpib_dump_state", || {
        let text = PROCESS.dump_state()?;
        if !needed.is_null() {
            // SAFETY: the caller gives a writable `size_t` at `needed` when it is not NULL.
            unsafe { needed.write(text.len() + 1) };
        }
        if buf.is_null() {
            log::warn!("{}", text.trim_end());
        } else if size > 0 {
            let n = text.len().min(size - 1);
            // SAFETY: the caller gives `size` (> n) writable bytes at `buf`.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        Ok(())
    })
}

/// How many bytes of a `T` to write for a caller compiled with `sizeof(T) == size` (an
/// older, shorter header gets only the fields it knows); an error for a NULL `out` or a
/// `size` below one field.
pub(super) fn prefix_len<T>(out_is_null: bool, size: usize, type_name: &str) -> Result<usize> {
    if out_is_null {
        return Err(Error::invalid_argument("out is NULL"));
    }
    if size < size_of::<u64>() {
        return Err(Error::invalid_argument(format!("size {size}: at least 8 (sizeof({type_name}))")));
    }
    Ok(size.min(size_of::<T>()))
}

/// Copies the first `n` bytes of `v` to `dst`.
///
/// # Safety
/// `n ≤ size_of::<T>()` (what [`prefix_len`] returns) and `dst` points to `n` writable
/// bytes; byte copies need no alignment.
pub(super) unsafe fn write_prefix<T: Copy>(v: &T, dst: *mut u8, n: usize) {
    // SAFETY: `v` is a plain struct of at least `n` bytes; the caller vouches for `dst`.
    unsafe { std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), dst, n) };
}

/// Copies `s` into the C string field `dst`, cut to fit and NUL-terminated.
pub(super) fn c_string(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as std::ffi::c_char;
    }
    dst[n] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ncclnet_types::result;

    #[test]
    fn copies_the_process_totals_and_honours_the_callers_size() {
        let h = PROCESS.stats().register(1);
        h.count_post(2, 1, 4096, 4096);
        h.latency.record(5000);
        let mut out = [mpib_rail_stats_t::default(); 2];
        // SAFETY: room for two full entries.
        assert_eq!(unsafe { mpib_rail_stats(out.as_mut_ptr(), size_of::<mpib_rail_stats_t>()) }, result::SUCCESS);
        // Other tests of this process may add to the totals too: at least what we posted.
        let c = &out[1].counters;
        assert!(c.bytes >= 4096 && c.imm_sent >= 1 && c.doorbells >= 1, "{:?}", out[1]);
        assert!(out[1].latency_samples >= 1 && out[1].live_connections >= 1, "{:?}", out[1]);
        assert!((0.0..=1.0).contains(&out[1].share));

        // A caller that knows only the first three counters: a stride of 24 bytes, nothing
        // written past each entry's 24.
        let mut short = [u64::MAX; 7];
        // SAFETY: 2 × 24 writable bytes (and a sentinel word after them).
        assert_eq!(unsafe { mpib_rail_stats(short.as_mut_ptr().cast(), 24) }, result::SUCCESS);
        assert!(short[3 + 2] >= 4096, "SUP bytes at the second entry's third word: {short:?}");
        assert_eq!(short[6], u64::MAX, "the sentinel after 2 × 24 bytes is untouched");
    }

    fn c_str(s: &[std::ffi::c_char]) -> String {
        s.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect()
    }

    #[test]
    fn nic_rows_through_the_c_abi() {
        use crate::telemetry::StatsPlace;
        let h = PROCESS.stats().register_at(1, StatsPlace::new("abi-test-nic:7", "10.9.9.9:4000"));
        h.count_post(1, 1, 12_345, 12_345);
        h.counters.errors.add(2);
        let mut count = 0usize;
        // SAFETY: max 0 with a NULL `out` asks for the count only.
        let rc = unsafe { mpib_nic_stats(std::ptr::null_mut(), size_of::<mpib_nic_stats_t>(), 0, &mut count) };
        assert_eq!(rc, result::SUCCESS);
        assert!(count >= 1, "{count}");
        let mut rows = vec![mpib_nic_stats_t::default(); count + 4];
        let mut again = 0usize;
        // SAFETY: room for `rows.len()` whole entries.
        let rc = unsafe { mpib_nic_stats(rows.as_mut_ptr(), size_of::<mpib_nic_stats_t>(), rows.len(), &mut again) };
        assert_eq!(rc, result::SUCCESS);
        // Other tests of this process may add NICs meanwhile: the slack of 4 rows covers them.
        assert!(again >= count && again < rows.len(), "{count} then {again}");
        let ours: Vec<_> = rows[..again].iter().filter(|r| c_str(&r.nic) == "abi-test-nic:7").collect();
        assert_eq!(ours.len(), 1, "one row for the NIC on rail 1");
        assert_eq!((ours[0].rail, ours[0].stats.counters.bytes, ours[0].stats.errors), (1, 12_345, 2));
        assert_eq!(ours[0].stats.live_connections, 1);
        assert_eq!(rows[again], mpib_nic_stats_t::default(), "nothing past the rows there are");

        // A caller that knows only the name and the rail: 72 bytes each, nothing written past them.
        let mut short = vec![0xAAu8; 72 * again + 8];
        // SAFETY: `again` entries of 72 bytes, and a sentinel after them.
        let rc = unsafe { mpib_nic_stats(short.as_mut_ptr().cast(), 72, again, std::ptr::null_mut()) };
        assert_eq!(rc, result::SUCCESS);
        assert_eq!(short[72 * again..], [0xAA; 8]);

        // SAFETY: NULL with max > 0, and a tiny size, are refused before any write.
        unsafe {
            assert_eq!(mpib_nic_stats(std::ptr::null_mut(), 304, 1, &mut count), result::INVALID_ARGUMENT);
            assert_eq!(mpib_nic_stats(rows.as_mut_ptr(), 4, 1, &mut count), result::INVALID_ARGUMENT);
        }
    }

    #[test]
    fn worst_peers_through_the_c_abi() {
        use crate::telemetry::StatsPlace;
        // Worse than anything else in this test process: 1000 s chains, 10^9 errors.
        let slow = PROCESS.stats().register_at(0, StatsPlace::new("abi-test-nic:1", "GID fe80::dead"));
        slow.latency.record(1_000_000_000_000);
        let bad = PROCESS.stats().register_at(1, StatsPlace::new("abi-test-nic:2", "GID fe80::bad"));
        bad.counters.errors.add(1_000_000_000);
        let mut out = [mpib_peer_stats_t::default(); 3];
        let mut n = 0usize;
        let size = size_of::<mpib_peer_stats_t>();
        // SAFETY: room for 3 whole entries.
        unsafe {
            assert_eq!(mpib_worst_peers(MPIB_WORST_BY_LATENCY, out.as_mut_ptr(), size, 3, &mut n), result::SUCCESS);
            assert!((1..=3).contains(&n), "{n}");
            assert_eq!(
                (c_str(&out[0].peer), c_str(&out[0].nic), out[0].rail),
                ("GID fe80::dead".into(), "abi-test-nic:1".into(), 0)
            );
            assert!(out[0].latency_p99_ns > 900_000_000_000, "{:?}", out[0]);
            assert_eq!(mpib_worst_peers(MPIB_WORST_BY_ERRORS, out.as_mut_ptr(), size, 1, &mut n), result::SUCCESS);
            assert_eq!((n, c_str(&out[0].peer), out[0].errors), (1, "GID fe80::bad".into(), 1_000_000_000));
            assert_eq!(mpib_worst_peers(7, out.as_mut_ptr(), size, 1, &mut n), result::INVALID_ARGUMENT);
        }
        drop((slow, bad));
    }

    #[test]
    fn null_or_tiny_buffers_are_invalid_arguments() {
        // SAFETY: NULL is rejected before any write; a size of 4 is rejected likewise.
        unsafe {
            assert_eq!(mpib_rail_stats(std::ptr::null_mut(), 64), result::INVALID_ARGUMENT);
            let mut one = mpib_rail_stats_t::default();
            assert_eq!(mpib_rail_stats(&mut one, 4), result::INVALID_ARGUMENT);
            assert_eq!(one, mpib_rail_stats_t::default());
        }
    }

    #[test]
    fn resource_stats_are_copied_up_to_the_callers_size() {
        let held = super::super::process().counts().hold(crate::plugin::resources::Res::Qps, 7);
        let mut out = mpib_resource_stats_t::default();
        // SAFETY: a whole struct.
        assert_eq!(unsafe { mpib_resource_stats(&mut out, size_of::<mpib_resource_stats_t>()) }, result::SUCCESS);
        assert!(out.qps >= 7, "{out:?}");
        let mut short = [u64::MAX; 3];
        // SAFETY: 16 writable bytes, and a sentinel after them.
        assert_eq!(unsafe { mpib_resource_stats(short.as_mut_ptr().cast(), 16) }, result::SUCCESS);
        assert_eq!(short[2], u64::MAX, "nothing written past the caller's size");
        // SAFETY: NULL and a tiny size are refused before any write.
        unsafe {
            assert_eq!(mpib_resource_stats(std::ptr::null_mut(), 64), result::INVALID_ARGUMENT);
            assert_eq!(mpib_resource_stats(&mut out, 4), result::INVALID_ARGUMENT);
        }
        drop(held);
    }
}
