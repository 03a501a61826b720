//! The listen handle NCCL carries from `listen` to the peer's `connect`: mpib's magic and
//! version, the fabric, the listener's out-of-band address, and the progress token `connect`
//! keeps in the buffer's last 8 bytes while it is called again.

use super::oob::OobAddr;
use super::setup::{FabricKind, fabric_name};
use crate::error::{Error, Result};

const HANDLE_MAGIC: [u8; 4] = *b"MPIB";
const HANDLE_VERSION: u8 = 1;
/// Where `connect` keeps its progress token inside NCCL's handle buffer.
const TOKEN_OFF: usize = 120;

/// Writes a listen handle.
pub fn write_handle(handle: &mut [u8; 128], kind: FabricKind, addr: OobAddr) {
    handle.fill(0);
    handle[..4].copy_from_slice(&HANDLE_MAGIC);
    handle[4] = HANDLE_VERSION;
    handle[5] = kind as u8;
    let mut a = [0u8; 19];
    addr.write(&mut a);
    handle[8..27].copy_from_slice(&a);
}

/// Reads a listen handle written by [`write_handle`] (of a peer with the same fabric).
pub fn read_handle(handle: &[u8; 128], kind: FabricKind) -> Result<OobAddr> {
    if handle[..4] != HANDLE_MAGIC {
        return Err(Error::invalid_argument("the connect handle was not written by mpib's listen (bad magic)"));
    }
    if handle[4] != HANDLE_VERSION {
        return Err(Error::invalid_argument(format!(
            "the connect handle is version {}, this plugin speaks {HANDLE_VERSION}",
            handle[4]
        )));
    }
    if handle[5] != kind as u8 {
        return Err(Error::invalid_argument(format!(
            "the listener uses the {} fabric and this side the {} fabric: set the same MPIB_FABRIC on every rank",
            fabric_name(handle[5]),
            fabric_name(kind as u8)
        )));
    }
    OobAddr::read(handle[8..27].try_into().expect("19 bytes"))
}

/// The token `connect` left in NCCL's handle buffer (0 = first call).
pub fn handle_token(handle: &[u8; 128]) -> u64 {
    u64::from_le_bytes(handle[TOKEN_OFF..].try_into().expect("8 bytes"))
}

pub fn set_handle_token(handle: &mut [u8; 128], token: u64) {
    handle[TOKEN_OFF..].copy_from_slice(&token.to_le_bytes());
}
