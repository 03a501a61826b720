//! Hostile input on the set-up port: whatever connects to the port a
//! listen handle names — a port scanner, a health check, garbage, a peer of another
//! version — NCCL's `accept` still returns the real peer's comm, and never an error for a
//! connection that is not an mpib peer. Each scenario runs in a child process (soft fabric
//! on loopback) that drives the plugin through its exported C table: `listen`, then the
//! strays connect to the set-up port, then `connect` and `accept` in one thread as NCCL's
//! proxy would call them.

mod hostile_common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hostile_common::abi::{Handle, Net};
use hostile_common::{in_child, is_child};
use mpib::plugin::listen_handle::{read_handle, write_handle};
use mpib::plugin::oob::OobAddr;
use mpib::plugin::setup::FabricKind;
use ncclnet_types::result::REMOTE_ERROR;

/// Longest wait for the real peer's set-up. `MPIB_CONNECT_TIMEOUT_MS` is set far above it:
/// a stray that holds the real peer off until a set-up timeout fails the test.
const SETUP_WAIT: Duration = Duration::from_secs(60);
const CHILD_ENV: &[(&str, &str)] = &[("MPIB_CONNECT_TIMEOUT_MS", "600000")];

fn setup_addr(handle: &[u8; 128]) -> SocketAddr {
    match read_handle(handle, FabricKind::Soft).expect("an mpib handle") {
        OobAddr::Tcp(sa) => sa,
        a => panic!("not a TCP set-up address: {a:?}"),
    }
}

/// What one stray does on the set-up port.
#[derive(Clone, Copy, Debug)]
enum Stray {
    /// Connects and says nothing (a port scanner's half-open check, a stuck client).
    Idle,
    /// Connects and closes at once (a health check).
    Closes,
    /// Speaks another protocol.
    Http,
    /// Announces a 4,294,967,280-byte set-up message and sends nothing more.
    HugeLength,
    /// A plausible length, then bytes that are not a set-up message.
    BadMagic,
}

fn stray(addr: SocketAddr, kind: Stray) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).expect("connect to the set-up port");
    match kind {
        Stray::Idle => {}
        Stray::Closes => return None,
        Stray::Http => s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").unwrap(),
        Stray::HugeLength => s.write_all(&4_294_967_280u32.to_le_bytes()).unwrap(),
        Stray::BadMagic => {
            s.write_all(&24u32.to_le_bytes()).unwrap();
            s.write_all(&[0x5a; 24]).unwrap();
        }
    }
    Some(s)
}

/// Connects and accepts the real peer on device 0, calling both in turn; panics if
/// `accept` (or `connect`) fails or nothing comes within [`SETUP_WAIT`].
fn real_set_up(net: &Net, handle: &mut [u8; 128], listen: Handle) -> (Handle, Handle) {
    let (mut send, mut recv) = (None, None);
    let t0 = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(t0.elapsed() < SETUP_WAIT, "the real peer was not accepted within {SETUP_WAIT:?}");
        if send.is_none() {
            send = net.connect(0, handle).unwrap_or_else(|c| panic!("connect failed: ncclResult_t {c}"));
        }
        if recv.is_none() {
            recv = net.accept(listen).unwrap_or_else(|c| panic!("accept failed because of a stray: ncclResult_t {c}"));
        }
    }
    (send.unwrap(), recv.unwrap())
}

/// The server closed a stray it dropped: reading gives EOF (or a reset).
fn assert_dropped(mut s: TcpStream, kind: Stray) {
    s.set_read_timeout(Some(SETUP_WAIT)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        r => panic!("{kind:?}: the set-up port did not drop it: {r:?}"),
    }
}

/// The scenario: `strays` connect (in this order) before the real peer does.
fn strays_then_real_peer(strays: &[Stray]) {
    let net = Net::init();
    let (mut handle, listen) = net.listen(0);
    let addr = setup_addr(&handle);
    let held: Vec<(Stray, Option<TcpStream>)> = strays.iter().map(|&k| (k, stray(addr, k))).collect();
    let (send, recv) = real_set_up(&net, &mut handle, listen);
    // The ones that said something wrong were dropped (the idle ones may still be waiting
    // out their deadline: not waited for).
    for (kind, s) in held {
        if let (Stray::Http | Stray::HugeLength | Stray::BadMagic, Some(s)) = (kind, s) {
            assert_dropped(s, kind);
        }
    }
    net.close_send(send);
    net.close_recv(recv);
    net.close_listen(listen);
}

/// Runs `name` in a child; returns the child's WARN lines about dropped set-up connections.
fn drops_logged(name: &str) -> Vec<String> {
    let out = in_child(name, CHILD_ENV);
    out.lines().filter(|l| l.contains("WARN") && l.contains("not an mpib peer")).map(str::to_string).collect()
}

#[test]
fn an_idle_connection_does_not_hold_off_the_real_peer() {
    if !is_child() {
        drops_logged("an_idle_connection_does_not_hold_off_the_real_peer");
        return;
    }
    strays_then_real_peer(&[Stray::Idle]);
}

#[test]
fn a_connection_closed_at_once_does_not_fail_accept() {
    if !is_child() {
        let w = drops_logged("a_connection_closed_at_once_does_not_fail_accept");
        assert!(w.iter().any(|l| l.contains("closed")), "one WARN naming why: {w:?}");
        return;
    }
    strays_then_real_peer(&[Stray::Closes]);
}

#[test]
fn garbage_does_not_fail_accept() {
    if !is_child() {
        let w = drops_logged("garbage_does_not_fail_accept");
        assert!(!w.is_empty(), "a WARN for the dropped connections");
        return;
    }
    strays_then_real_peer(&[Stray::Http, Stray::BadMagic]);
}

#[test]
fn a_huge_announced_length_is_dropped_without_allocating_it() {
    if !is_child() {
        let w = drops_logged("a_huge_announced_length_is_dropped_without_allocating_it");
        assert!(w.iter().any(|l| l.contains("4294967280")), "the WARN says what was announced: {w:?}");
        return;
    }
    strays_then_real_peer(&[Stray::HugeLength]);
}

#[test]
fn a_flood_of_strays_does_not_fail_accept() {
    if !is_child() {
        let w = drops_logged("a_flood_of_strays_does_not_fail_accept");
        // 100 strays are dropped within a second or two: rate-limited to a line per second
        // and cause (a slow machine may take several seconds: far below one line each).
        assert!(!w.is_empty() && w.len() < 40, "{} WARN lines for 100 dropped connections: {w:?}", w.len());
        return;
    }
    // More idle connections than the listener keeps pending (the oldest make room), and
    // every other kind between them. (100 in all: below the listen backlog, since they all
    // connect before the first accept call.)
    use Stray::*;
    let kinds = [Idle, Idle, Closes, Idle, Idle, Http, Idle, Idle, HugeLength, Idle, Idle, BadMagic];
    let strays: Vec<Stray> = (0..100).map(|i| kinds[i % kinds.len()]).collect();
    assert!(strays.iter().filter(|s| matches!(s, Idle)).count() > mpib::plugin::listen::MAX_PENDING);
    strays_then_real_peer(&strays);
}

/// A peer that speaks the set-up protocol of another version: `accept` fails (it is a real
/// peer, misconfigured: waiting for it would hang NCCL), and the peer is told why.
#[test]
fn a_peer_of_another_version_gets_a_clear_error_on_both_sides() {
    if !is_child() {
        let out = in_child("a_peer_of_another_version_gets_a_clear_error_on_both_sides", CHILD_ENV);
        assert!(out.contains("set-up version 99"), "the acceptor's error names both versions:\n{out}");
        return;
    }
    let net = Net::init();
    let (handle, listen) = net.listen(0);
    let mut s = TcpStream::connect(setup_addr(&handle)).unwrap();
    // Every set-up message starts with "MPIB" and the version; this one's version is 99.
    let mut hello = b"MPIB".to_vec();
    hello.extend_from_slice(&99u16.to_le_bytes());
    hello.extend_from_slice(&[1, 0, 0, 0, 0, 0]);
    s.write_all(&(hello.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&hello).unwrap();
    let t0 = Instant::now();
    let code = loop {
        assert!(t0.elapsed() < SETUP_WAIT, "accept neither failed nor returned");
        match net.accept(listen) {
            Err(c) => break c,
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => panic!("a comm for a peer of another version"),
        }
    };
    assert_eq!(code, REMOTE_ERROR);
    // The peer got a message saying why before the close.
    s.set_read_timeout(Some(SETUP_WAIT)).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("MPIB") && text.contains("version"), "the peer is told why: {text:?}");
    // The listener goes on accepting real peers.
    let (mut handle, listen2) = net.listen(0);
    let (send, recv) = real_set_up(&net, &mut handle, listen2);
    net.close_send(send);
    net.close_recv(recv);
    net.close_listen(listen);
    net.close_listen(listen2);
}

/// The other way round: a listener of another version answers this side's Hello with a
/// message of its version, and `connect` fails saying so (not a bad magic, not a hang).
#[test]
fn a_listener_of_another_version_fails_connect_clearly() {
    if !is_child() {
        let out = in_child("a_listener_of_another_version_fails_connect_clearly", CHILD_ENV);
        assert!(out.contains("set-up version 7, this plugin version"), "connect's error names both:\n{out}");
        return;
    }
    let net = Net::init();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut handle = [0u8; 128];
    write_handle(&mut handle, FabricKind::Soft, OobAddr::Tcp(l.local_addr().unwrap()));
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // Its Hello (a length, then a message of this version), answered in version 7.
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut hello = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..4], b"MPIB");
        let mut m = b"MPIB".to_vec();
        m.extend_from_slice(&7u16.to_le_bytes());
        m.extend_from_slice(&[2, 0]);
        s.write_all(&(m.len() as u32).to_le_bytes()).unwrap();
        s.write_all(&m).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest); // until the connector closes
    });
    let t0 = Instant::now();
    let code = loop {
        assert!(t0.elapsed() < SETUP_WAIT, "connect neither failed nor returned");
        match net.connect(0, &mut handle) {
            Err(c) => break c,
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => panic!("a comm to a listener of another version"),
        }
    };
    assert_eq!(code, REMOTE_ERROR);
    fake.join().unwrap();
}
