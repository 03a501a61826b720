//! A connection's error state, shared by the send and receive engines: clear until the
//! first failure, then that failure for good (RC gives no way back). Every later call that
//! needs the peer reports it, and so does the `test` of a request it left incomplete; a
//! request that had completed stays completed. The failure is kept whole, its typed cause
//! included: failover reads it, and it says whether completions polled after it may still
//! be believed. What it hands the caller to report is placed (`[SOUT …; SUP …; … comm]`,
//! the plugin's [`PlaceRef`]), in the failure path only: the data path pays nothing for it.

use super::{PlaceRef, StrayCompletion};
use crate::error::{Cause, Error, Result};

/// The first failure of a connection, if any, and where the connection is.
#[derive(Default)]
pub(crate) struct ErrorState {
    first: Option<Error>,
    /// Where the connection is: its engine's log lines and the errors it reports name it.
    pub(crate) place: PlaceRef,
}

impl ErrorState {
    /// The error that broke the connection, if any.
    pub(crate) fn get(&self) -> Option<&Error> {
        self.first.as_ref()
    }

    /// Whether the connection has failed.
    pub(crate) fn is_set(&self) -> bool {
        self.first.is_some()
    }

    /// Whether a successful completion polled after the failure still means what it says:
    /// yes when the transport failed (a rail, both rails, a fabric call: RC delivered what
    /// it acknowledged before), no when the peer broke the protocol or a completion made no
    /// sense (nothing it says is believed any more).
    pub(crate) fn trusts_completions(&self) -> bool {
        match self.first.as_ref().map(|e| &e.root().cause) {
            None => true,
            Some(Cause::Violation(_) | Cause::StrayCompletion(_)) => false,
            Some(_) => true,
        }
    }

    /// `Ok` while the connection is healthy; afterwards, the error that broke it.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.first {
            None => Ok(()),
            Some(e) => Err(failed_earlier(e, &self.place)),
        }
    }

    /// Records `e` as the connection's failure unless an earlier one is recorded; returns
    /// `e`, placed, for the caller to report.
    pub(crate) fn fail(&mut self, e: Error) -> Error {
        if self.first.is_none() {
            self.first = Some(e.clone());
        }
        self.place.placed(e)
    }

    /// Records and returns the error for a completion whose `wr_id` mpib never made.
    #[cold]
    #[inline(never)]
    pub(crate) fn unknown_wr_id(&mut self, rail: usize, wr_id: u64) -> Error {
        self.fail(StrayCompletion::UnknownWrId { rail, wr_id }.into())
    }
}

/// The error every call reports once the connection failed with `e`: of its class,
/// [`Cause::FailedEarlier`] with `e` inside.
#[cold]
#[inline(never)]
fn failed_earlier(e: &Error, place: &PlaceRef) -> Error {
    place.placed(Error::from_cause(e.kind, Cause::FailedEarlier(e.clone())))
}
