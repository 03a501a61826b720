//! Completion queues: a plain CQ polled in batches with `ibv_poll_cq`, or an extended CQ
//! (`ibv_create_cq_ex`) when completions should carry device timestamps, polled in batches
//! of `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` (see [`PollBatches`]).

use std::sync::Arc;

use rdma_mummy_sys as ibv;

use super::ctx::{Ctx, PollBatches};
use super::sys::{self, strerror};
use crate::error::Result;
use crate::fabric::{Completion, CompletionQueue, WcOpcode, WcStatus};

/// Completions fetched per `ibv_poll_cq` call.
const WC_BATCH: usize = 32;

/// `Other(UNEXPECTED_OPCODE | opcode)`: a successful completion of a kind mpib never asks
/// for (a peer's SEND landing in the SRQ, …). The peer broke the protocol.
pub const UNEXPECTED_OPCODE: u32 = 0x1_0000;

/// How a CQ's completion timestamps become nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsClock {
    None,
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`: already ns of the real-time clock.
    Wallclock,
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: ticks of the device's free-running clock
    /// (`hca_core_clock` kHz, never 0).
    Raw {
        khz: u64,
    },
}

impl TsClock {
    pub fn raw(khz: u64) -> TsClock {
        TsClock::Raw { khz: khz.max(1) }
    }

    /// Device ticks (or wallclock ns) to ns.
    pub fn to_ns(self, ts: u64) -> u64 {
        match self {
            TsClock::None => 0,
            TsClock::Wallclock => ts,
            // Exact (u128): one division per completion, only on timestamped CQs.
            TsClock::Raw { khz } => (ts as u128 * 1_000_000 / khz as u128) as u64,
        }
    }

    /// The `wc_flags` bit that asks for this clock.
    pub fn wc_flag(self) -> u64 {
        use ibv::ibv_create_cq_wc_flags as f;
        match self {
            TsClock::None => 0,
            TsClock::Wallclock => f::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK.0 as u64,
            TsClock::Raw { .. } => f::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64,
        }
    }

    pub fn describe(self) -> String {
        match self {
            TsClock::None => "none (plain CQ)".to_string(),
            TsClock::Wallclock => "wallclock ns (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)".to_string(),
            TsClock::Raw { khz } => format!("device clock at {khz} kHz (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)"),
        }
    }
}

/// The `wc_flags` every extended CQ asks for: what [`Completion`] carries.
pub fn standard_wc_flags() -> u64 {
    use ibv::ibv_create_cq_wc_flags as f;
    (f::IBV_WC_EX_WITH_BYTE_LEN.0 | f::IBV_WC_EX_WITH_IMM.0 | f::IBV_WC_EX_WITH_QP_NUM.0) as u64
}

/// Maps an `ibv_wc_status` onto the statuses mpib tells apart; others keep their code.
pub fn map_status(code: u32) -> WcStatus {
    use ibv::ibv_wc_status as s;
    match code {
        s::IBV_WC_SUCCESS => WcStatus::Success,
        s::IBV_WC_LOC_LEN_ERR | s::IBV_WC_LOC_PROT_ERR | s::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalError,
        s::IBV_WC_REM_ACCESS_ERR | s::IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::RemoteAccessError,
        s::IBV_WC_REM_OP_ERR | s::IBV_WC_REM_INV_REQ_ERR | s::IBV_WC_REM_ABORT_ERR => WcStatus::RemoteOpError,
        s::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
        s::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        s::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        s::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpError,
        other => WcStatus::Other(other),
    }
}

/// The `ibv_wc_status` behind a [`WcStatus`] (the representative code of a group).
pub fn status_code(status: WcStatus) -> u32 {
    use ibv::ibv_wc_status as s;
    match status {
        WcStatus::Success => s::IBV_WC_SUCCESS,
        WcStatus::LocalError => s::IBV_WC_LOC_PROT_ERR,
        WcStatus::RemoteAccessError => s::IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOpError => s::IBV_WC_REM_OP_ERR,
        WcStatus::RetryExceeded => s::IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExceeded => s::IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::Flushed => s::IBV_WC_WR_FLUSH_ERR,
        WcStatus::LocalQpError => s::IBV_WC_LOC_QP_OP_ERR,
        WcStatus::Other(c) => c,
    }
}

/// libibverbs' text for a completion status (`ibv_wc_status_str`), for error logs.
pub fn wc_status_str(status: WcStatus) -> &'static str {
    if let WcStatus::Other(c) = status
        && c & UNEXPECTED_OPCODE != 0
    {
        return "unexpected completion opcode (not an operation mpib posts: protocol violation by the peer)";
    }
    // SAFETY: ibv_wc_status_str returns NULL (library missing) or a static string, for any code.
    unsafe { sys::c_str(ibv::ibv_wc_status_str(status_code(status)), "unknown completion status") }
}

/// A completion from its parts (shared by the plain and the extended poll).
/// A failed one carries `vendor_err` where the immediate data would be
/// ([`Completion::vendor_err`]).
fn completion(
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    imm_be: Option<u32>,
    qp_num: u32,
    vendor_err: impl FnOnce() -> u32,
) -> Completion {
    use ibv::ibv_wc_opcode as o;
    let mut status = map_status(status);
    // The opcode of a failed completion is undefined; the wr_id says what failed.
    let opcode = match opcode {
        o::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        o::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        o::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        other => {
            if status == WcStatus::Success {
                status = WcStatus::Other(UNEXPECTED_OPCODE | other);
            }
            WcOpcode::RdmaWrite
        }
    };
    let imm = if status == WcStatus::Success { imm_be.map_or(0, u32::from_be) } else { vendor_err() };
    Completion { wr_id, status, opcode, byte_len, imm, qp_num, timestamp_ns: 0 }
}

/// Converts a polled `ibv_wc` (immediate data arrives big-endian).
pub fn from_wc(wc: &ibv::ibv_wc) -> Completion {
    let with_imm = wc.wc_flags & ibv::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    // SAFETY: both union members are plain u32s; which one is meaningful is told by wc_flags.
    let imm = with_imm.then_some(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
    completion(wc.wr_id, wc.status, wc.opcode, wc.byte_len, imm, wc.qp_num, || wc.vendor_err)
}

/// The CQ object; destroyed when the last handle (the CQ or a QP using it) goes.
pub struct CqInner {
    pub(super) cq: *mut ibv::ibv_cq,
    /// Non-NULL for an extended CQ (then `cq` is its `ibv_cq` view).
    ex: *mut ibv::ibv_cq_ex,
    clock: TsClock,
    ctx: Arc<Ctx>,
}

// SAFETY: a CQ handle may be used from any thread; libibverbs CQ calls are thread-safe and
// the plain pointers carry no thread affinity. Polling is serialized by `&mut VerbsCq`.
unsafe impl Send for CqInner {}
// SAFETY: shared references only reach `cq` for ibv_create_qp/destroy, which are thread-safe.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: the CQ was created on ctx, which outlives it (Arc), and no QP uses it any
        // more (each QP holds an Arc of this object).
        let ret = unsafe { ibv::ibv_destroy_cq(self.cq) };
        if ret != 0 {
            log::warn!("ibv_destroy_cq on {}: {}", self.ctx.label(), strerror(sys::ret_errno(ret)));
        }
    }
}

/// A completion queue (see [`crate::fabric::CompletionQueue`]).
pub struct VerbsCq {
    pub(super) inner: Arc<CqInner>,
    /// Preallocated poll buffer of the plain CQ.
    wcs: Box<[ibv::ibv_wc]>,
}

impl VerbsCq {
    /// A plain CQ of at least `depth` entries.
    pub(super) fn create_plain(ctx: &Arc<Ctx>, depth: u32) -> Result<VerbsCq> {
        let cqe = depth.max(1).min(i32::MAX as u32) as i32;
        // SAFETY: ctx.raw is an open context; no channel, vector 0.
        let cq = unsafe { ibv::ibv_create_cq(ctx.raw, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            let errno = sys::errno();
            return Err(ctx.failed(&format!("ibv_create_cq({cqe} entries)"), errno));
        }
        let inner = CqInner { cq, ex: std::ptr::null_mut(), clock: TsClock::None, ctx: ctx.clone() };
        Ok(VerbsCq { inner: Arc::new(inner), wcs: zeroed_wcs() })
    }

    /// An extended CQ with the standard fields and, unless `clock` is `None`, timestamps.
    pub(super) fn create_ex(ctx: &Arc<Ctx>, depth: u32, clock: TsClock) -> Result<VerbsCq> {
        let ex = create_cq_ex_raw(ctx, depth, standard_wc_flags() | clock.wc_flag())?;
        // SAFETY: ex is a live extended CQ; only reading its function table.
        let complete = unsafe {
            let e = &*ex;
            e.start_poll.is_some()
                && e.end_poll.is_some()
                && (e.next_poll.is_some() || ctx.poll_batches == PollBatches::One)
                && e.read_opcode.is_some()
                && e.read_byte_len.is_some()
                && e.read_imm_data.is_some()
                && e.read_qp_num.is_some()
                && e.read_wc_flags.is_some()
                && match clock {
                    TsClock::None => true,
                    TsClock::Wallclock => e.read_completion_wallclock_ns.is_some(),
                    TsClock::Raw { .. } => e.read_completion_ts.is_some(),
                }
        };
        // SAFETY: an ibv_cq_ex starts with the ibv_cq fields (ibv_cq_ex_to_cq is a cast).
        let cq = unsafe { ibv::ibv_cq_ex_to_cq(ex) };
        let inner = Arc::new(CqInner { cq, ex, clock, ctx: ctx.clone() });
        if !complete {
            return Err(ctx.failed("ibv_create_cq_ex (the provider left a poll function out)", libc::EOPNOTSUPP));
        }
        Ok(VerbsCq { inner, wcs: zeroed_wcs() })
    }

    pub fn clock(&self) -> TsClock {
        self.inner.clock
    }

    pub fn is_extended(&self) -> bool {
        !self.inner.ex.is_null()
    }

    fn poll_plain(&mut self, out: &mut [Completion]) -> Result<usize> {
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(WC_BATCH);
            // SAFETY: the CQ is live; wcs has WC_BATCH ≥ want entries.
            let got = unsafe { ibv::ibv_poll_cq(self.inner.cq, want as i32, self.wcs.as_mut_ptr()) };
            if got < 0 {
                let e = match sys::errno() {
                    0 => libc::EIO,
                    e => e,
                };
                return Err(self.inner.ctx.failed("ibv_poll_cq", e));
            }
            for (o, wc) in out[n..].iter_mut().zip(&self.wcs[..got as usize]) {
                *o = from_wc(wc);
            }
            n += got as usize;
            if (got as usize) < want {
                break;
            }
        }
        Ok(n)
    }

    fn poll_ex(&mut self, out: &mut [Completion]) -> Result<usize> {
        let (ex, clock, batches) = (self.inner.ex, self.inner.clock, self.inner.ctx.poll_batches);
        // SAFETY: a live extended CQ whose poll functions were checked at creation, polled
        // by this one thread (`&mut self`).
        unsafe { poll_ex(ex, clock, batches, out) }.map_err(|(call, e)| self.inner.ctx.failed(call, e))
    }
}

/// Polls up to `out.len()` completions of `ex` (see [`PollBatches`]); the failed call and
/// its errno on error (the batch it was in is ended first).
///
/// # Safety
/// `ex` is a live extended CQ whose `start_poll`, `next_poll` (with [`PollBatches::Many`]),
/// `end_poll` and the read functions `clock` needs are set, polled by no other thread.
pub(super) unsafe fn poll_ex(
    ex: *mut ibv::ibv_cq_ex,
    clock: TsClock,
    batches: PollBatches,
    out: &mut [Completion],
) -> std::result::Result<usize, (&'static str, i32)> {
    let mut n = 0;
    while n < out.len() {
        let mut attr = ibv::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: the caller's contract.
        match unsafe { ibv::ibv_start_poll(ex, &mut attr) } {
            0 => {}
            libc::ENOENT => break,
            e => return Err(("ibv_start_poll", e)),
        }
        // SAFETY: between start_poll and end_poll the current completion's fields may be
        // read (the caller's contract); end_poll is called once per successful start_poll.
        unsafe {
            out[n] = read_ex(ex, clock);
            n += 1;
            if batches == PollBatches::One {
                ibv::ibv_end_poll(ex);
                continue;
            }
            while n < out.len() {
                match ibv::ibv_next_poll(ex) {
                    0 => {
                        out[n] = read_ex(ex, clock);
                        n += 1;
                    }
                    libc::ENOENT => {
                        ibv::ibv_end_poll(ex);
                        return Ok(n);
                    }
                    e => {
                        ibv::ibv_end_poll(ex);
                        return Err(("ibv_next_poll", e));
                    }
                }
            }
            ibv::ibv_end_poll(ex);
        }
    }
    Ok(n)
}

/// The current completion of an extended CQ.
///
/// # Safety
/// Between a successful `ibv_start_poll`/`ibv_next_poll` of `ex` and its `ibv_end_poll`;
/// the read functions `clock` needs are set.
unsafe fn read_ex(ex: *mut ibv::ibv_cq_ex, clock: TsClock) -> Completion {
    // SAFETY: the caller's contract.
    unsafe {
        let e = &*ex;
        let with_imm = ibv::ibv_wc_read_wc_flags(ex) & ibv::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        let mut c = completion(
            e.wr_id,
            e.status,
            ibv::ibv_wc_read_opcode(ex),
            ibv::ibv_wc_read_byte_len(ex),
            with_imm.then(|| ibv::ibv_wc_read_imm_data(ex)),
            ibv::ibv_wc_read_qp_num(ex),
            // (The caller's contract; `read_vendor_err` is set on every extended CQ.)
            || ibv::ibv_wc_read_vendor_err(ex),
        );
        c.timestamp_ns = match clock {
            TsClock::None => 0,
            TsClock::Wallclock => ibv::ibv_wc_read_completion_wallclock_ns(ex),
            TsClock::Raw { .. } => clock.to_ns(ibv::ibv_wc_read_completion_ts(ex)),
        };
        c
    }
}

impl CompletionQueue for VerbsCq {
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        if self.inner.ex.is_null() { self.poll_plain(out) } else { self.poll_ex(out) }
    }

    fn resize(&mut self, depth: u32) -> Result<()> {
        let cqe = depth.max(1).min(i32::MAX as u32) as i32;
        // SAFETY: a live CQ (an extended one through its ibv_cq view); `&mut self` keeps
        // every poll of it out while the provider swaps its buffer.
        let ret = unsafe { ibv::ibv_resize_cq(self.inner.cq, cqe) };
        if ret != 0 {
            return Err(self.inner.ctx.failed(&format!("ibv_resize_cq({cqe} entries)"), sys::ret_errno(ret)));
        }
        Ok(())
    }
}

fn zeroed_wcs() -> Box<[ibv::ibv_wc]> {
    // SAFETY: all-zero is a valid ibv_wc (integers and a u32 union).
    (0..WC_BATCH).map(|_| unsafe { std::mem::zeroed::<ibv::ibv_wc>() }).collect()
}

/// `ibv_create_cq_ex` with the given `wc_flags`.
pub(super) fn create_cq_ex_raw(ctx: &Ctx, depth: u32, wc_flags: u64) -> Result<*mut ibv::ibv_cq_ex> {
    // SAFETY: all-zero is a valid ibv_cq_init_attr_ex (integers and NULL pointers).
    let mut attr: ibv::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.cqe = depth.max(1);
    attr.wc_flags = wc_flags;
    // SAFETY: ctx.raw is an open context; attr is fully initialised.
    let ex = unsafe { ibv::ibv_create_cq_ex(ctx.raw, &mut attr) };
    if ex.is_null() {
        let errno = sys::errno();
        return Err(ctx.failed(&format!("ibv_create_cq_ex(wc_flags {wc_flags:#x})"), errno));
    }
    Ok(ex)
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VerbsCq({}, extended: {}, clock: {:?})",
            self.inner.ctx.label(),
            self.is_extended(),
            self.inner.clock
        )
    }
}

#[cfg(test)]
#[path = "cq_tests.rs"]
mod tests;
