//! Where a connection is, for the engine's log lines: its NICs, addresses, QP numbers and
//! communicator are the plugin's to know (the engine names rails by index only). The
//! plugin hands each engine a [`Place`] at set-up; a line about a rail ends with that rail's
//! place (` [mlx5_3:1 GID … QP 418 -> …]`), written only when the line is; the errors the
//! engine reports end with the connection's (`error_state.rs`).

use std::fmt;
use std::sync::Arc;

use crate::error::Error;

/// Describes the rails of one connection. Implemented by the plugin.
pub trait Place: Send + Sync {
    /// Writes where `rail` of the connection is (no brackets).
    fn rail(&self, rail: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// Writes where the whole connection is: each rail, and its communicator.
    fn conn(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

/// An engine's place, if the plugin gave one (tests' engines have none).
#[derive(Clone, Default)]
pub struct PlaceRef(Option<Arc<dyn Place>>);

impl PlaceRef {
    pub fn new(place: Arc<dyn Place>) -> PlaceRef {
        PlaceRef(Some(place))
    }

    /// `e` with the connection's place after its message ([`Error::at`]); `e` itself
    /// without a place. Only on the failure path.
    #[cold]
    #[inline(never)]
    pub fn placed(&self, e: Error) -> Error {
        match &self.0 {
            Some(p) => e.at(Conn(p.as_ref())),
            None => e,
        }
    }

    /// ` [the place of rail]` for the end of a log line; nothing without a place.
    pub fn at(&self, rail: usize) -> At<'_> {
        At { place: self.0.as_deref(), rail }
    }
}

/// The place of a connection, for [`Error::at`].
struct Conn<'a>(&'a dyn Place);

impl fmt::Display for Conn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.conn(f)
    }
}

/// The place of one rail, displayed as ` [...]` (or nothing).
pub struct At<'a> {
    place: Option<&'a dyn Place>,
    rail: usize,
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.place {
            Some(p) => {
                f.write_str(" [")?;
                p.rail(self.rail, f)?;
                f.write_str("]")
            }
            None => Ok(()),
        }
    }
}
