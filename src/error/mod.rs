//! One error type for every layer. Each error carries the `ncclResult_t` class NCCL gets
//! and its [`Cause`]: in words for the layers that describe what went wrong (set-up,
//! configuration, the OS, verbs, NCCL's arguments), typed for the engine's (a protocol
//! violation, a rail's failed completion, ...), so that failover tells a rail's failure from
//! a peer's violation by type and tests match variants, not text. The ABI edge logs the
//! error's `Display` once (WARN) and returns the code; a typed cause displays as the words
//! it always had.

use std::borrow::Cow;
use std::fmt;

pub mod protocol;

use protocol::{CompletionFailed, Refused, StrayCompletion, Violation};

/// The class of an error, mapped 1:1 onto the `ncclResult_t` values a plugin may return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `ncclSystemError`: the OS, the NIC or the network failed.
    System,
    /// `ncclInternalError`: NCCL misused the API (too many requests, bad handle) or a bug.
    Internal,
    /// `ncclInvalidArgument`: a bad argument or a bad environment variable.
    InvalidArgument,
    /// `ncclInvalidUsage`: a call that is not valid in this state or configuration.
    InvalidUsage,
    /// `ncclRemoteError`: the peer failed, vanished, or broke the protocol.
    Remote,
}

/// An error with its class and cause. Boxed: a `Result<T>` of the data path is then `T`
/// plus one pointer, returned in registers, instead of the whole cause copied through
/// memory at every `?` of every call (the error path allocates anyway).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(Box<ErrorInner>);

/// What an [`Error`] holds; its fields are read through `Deref` (`e.kind`, `e.cause`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorInner {
    pub kind: ErrorKind,
    pub cause: Cause,
}

/// What went wrong. Its `Display` is the error's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Described in words: set-up, configuration, the OS, verbs, NCCL's arguments.
    Message(Cow<'static, str>),
    /// The peer broke the dual-rail protocol; the connection is broken, its rails may be
    /// fine.
    Violation(Violation),
    /// A work request failed on a rail: that rail's failure.
    CompletionFailed(CompletionFailed),
    /// A completion the engine cannot account for: a bug here or in the fabric.
    StrayCompletion(StrayCompletion),
    /// A call the engine refuses (NCCL's misuse); the connection goes on.
    Refused(Refused),
    /// Every rail of the connection has failed.
    BothRailsFailed,
    /// The connection failed earlier with this error; every later call reports it.
    FailedEarlier(Error),
    /// `error`, of the connection at `place` (its NICs, addresses, QPs and communicator, as
    /// the plugin describes them): what NCCL's log shows of a failed call.
    At { error: Error, place: Box<str> },
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Message(m) => f.write_str(m),
            Cause::Violation(v) => v.fmt(f),
            Cause::CompletionFailed(c) => c.fmt(f),
            Cause::StrayCompletion(s) => s.fmt(f),
            Cause::Refused(r) => r.fmt(f),
            Cause::BothRailsFailed => f.write_str("both rails have failed"),
            Cause::FailedEarlier(e) => write!(f, "connection failed earlier: {e}"),
            Cause::At { error, place } => write!(f, "{error} [{place}]"),
        }
    }
}

impl std::ops::Deref for Error {
    type Target = ErrorInner;
    fn deref(&self) -> &ErrorInner {
        &self.0
    }
}

pub type Result<T> = std::result::Result<T, Error>;

// The data path's `Result`s stay one pointer wide, however large a cause grows.
const _: () = assert!(size_of::<Error>() == size_of::<usize>());
const _: () = assert!(size_of::<Result<()>>() == size_of::<usize>());

impl Error {
    /// An error of `kind` described by `msg`.
    pub fn new(kind: ErrorKind, msg: impl Into<Cow<'static, str>>) -> Self {
        Self::from_cause(kind, Cause::Message(msg.into()))
    }
    /// An error of `kind` with a typed `cause`.
    pub fn from_cause(kind: ErrorKind, cause: Cause) -> Self {
        Error(Box::new(ErrorInner { kind, cause }))
    }
    pub fn system(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::System, msg)
    }
    pub fn internal(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Internal, msg)
    }
    pub fn invalid_argument(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::InvalidArgument, msg)
    }
    pub fn invalid_usage(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::InvalidUsage, msg)
    }
    pub fn remote(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Remote, msg)
    }
    /// An OS error from `std::io`, with what was being done.
    pub fn io(what: &str, e: &std::io::Error) -> Self {
        Self::system(format!("{what}: {e}"))
    }
    /// The same error with `context: ` in front of its message (in words: for the
    /// set-up layers' errors, not the engine's typed ones).
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error::new(self.kind, format!("{context}: {self}"))
    }
    /// The message: the words of a [`Cause::Message`], a typed cause formatted.
    pub fn msg(&self) -> Cow<'_, str> {
        match &self.cause {
            Cause::Message(m) => Cow::Borrowed(m),
            c => Cow::Owned(c.to_string()),
        }
    }
    /// The failure behind this error: the one a [`Cause::FailedEarlier`] repeats or a
    /// [`Cause::At`] places, else the error itself.
    pub fn root(&self) -> &Error {
        match &self.cause {
            Cause::FailedEarlier(e) | Cause::At { error: e, .. } => e.root(),
            _ => self,
        }
    }

    /// The same error, placed: `[place]` after its message, its class and root kept.
    #[cold]
    #[inline(never)]
    pub fn at(self, place: impl fmt::Display) -> Self {
        let kind = self.kind;
        Error::from_cause(kind, Cause::At { error: self, place: place.to_string().into() })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.cause.fmt(f)
    }
}

impl std::error::Error for Error {}

/// `return Err(Error::<kind>(format!(...)))` in one line.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_its_text_and_context_goes_in_front() {
        let e = Error::system("link down").context("rail SUP");
        assert_eq!(
            (e.kind, e.to_string(), e.msg()),
            (ErrorKind::System, "rail SUP: link down".into(), "rail SUP: link down".into())
        );
        assert_eq!(e.root(), &e);
        let later = Error::from_cause(e.kind, Cause::FailedEarlier(e.clone()));
        let twice = Error::from_cause(e.kind, Cause::FailedEarlier(later));
        assert_eq!(twice.root(), &e, "the first failure, however often repeated");
    }
}
