//! The sender in an outage: every rail has failed and the connection waits for one to
//! come back (`MPIB_OUTAGE_GRACE_MS`, DESIGN.md "Rail failover"). Control messages go out
//! of band (`engine/failover/control.rs`); parts the receiver's reports say are missing wait in
//! `replay_wait` for the first rail back (`replay_ready`); a slot matched meanwhile is held
//! unposted (its sends accepted; the next isends hear "not now") and posted by the first
//! round after a rail is back. Past the grace the connection fails.

use super::SendEngine;
use crate::engine::layout::SendMemory;
use crate::engine::{CtlMemory, Output, Posts};
use crate::error::{Cause, Error, ErrorKind, Result};

impl SendEngine {
    /// A slot fully matched while no rail worked, waiting to be posted.
    #[inline]
    pub(super) fn held(&self) -> bool {
        self.matching && self.cur.n > 0 && self.cur.matched == self.cur.n
    }

    /// An outage's round: past the grace, the connection fails (`Failover::outage_round`).
    #[cold]
    #[inline(never)]
    pub(super) fn poll_outage(&mut self, now_ns: u64, mem: &impl CtlMemory, out: &mut Output) -> Result<()> {
        if self.fo.outage_round(now_ns, "send", self.error.place.at(0), mem, out) {
            return Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
        }
        Ok(())
    }

    /// After an outage: the slot held meanwhile goes out on the rail that is back.
    #[cold]
    #[inline(never)]
    pub(super) fn post_held(&mut self, now_ns: u64, mem: &mut impl SendMemory, out: &mut Output) -> Result<()> {
        let mut posts = Posts::default();
        self.matching = false;
        self.post_slot(now_ns, mem, &mut posts)?;
        out.chains.extend_from_slice(posts.chains());
        Ok(())
    }

    /// The peer's end of the set-up channel closed. In an outage that is the peer gone
    /// (killed, or closed its comm): nothing will come back, the connection fails now.
    /// Otherwise it is remembered (an outage that follows is not waited out) and news for
    /// no one: the rails say what they say.
    pub(super) fn peer_gone(&mut self) -> Result<()> {
        self.fo.peer_gone = true;
        if self.fo.outage_ns == 0 {
            return Ok(());
        }
        log::info!("send: the peer closed its end while no rail works: the connection fails{}", self.at(0));
        Err(self.error.fail(Error::remote("the peer closed the connection while both rails were down")))
    }
}
