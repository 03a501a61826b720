//! The soft fabric port: a dial whose descriptor is not a connected socket.

use super::*;

/// A connect that "finished" on a descriptor that is not a socket is an error, not a
/// connection (SO_ERROR's own failure is checked).
#[test]
fn dial_result_checks_getsockopt() {
    let mut fds = [0; 2];
    // SAFETY: plain syscall filling two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let r = dial_result(fds[1]);
    assert!(r.is_err(), "a pipe's write end is not a connected socket: {r:?}");
    // SAFETY: closes the two descriptors just opened.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    assert!(dial_result(fds[1]).is_err(), "a closed descriptor");
}
