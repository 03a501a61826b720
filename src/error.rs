//! One error type for every layer. Each error carries the `ncclResult_t` class NCCL gets
//! and a message that says precisely what went wrong; the ABI edge logs the message once
//! (WARN) and returns the code.

use std::borrow::Cow;
use std::fmt;

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

/// An error with its class and message. Boxed: a `Result<T>` of the data path is then
/// `T` plus one pointer, returned in registers, instead of 32 bytes copied through memory
/// at every `?` of every call (the error path allocates anyway: its message is formatted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(Box<ErrorInner>);

/// What an [`Error`] holds; its fields are read through `Deref` (`e.kind`, `e.msg`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorInner {
    pub kind: ErrorKind,
    pub msg: Cow<'static, str>,
}

impl std::ops::Deref for Error {
    type Target = ErrorInner;
    fn deref(&self) -> &ErrorInner {
        &self.0
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, msg: impl Into<Cow<'static, str>>) -> Self {
        Error(Box::new(ErrorInner { kind, msg: msg.into() }))
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
    /// The same error with `context: ` in front of its message.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error::new(self.kind, format!("{context}: {}", self.msg))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
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
