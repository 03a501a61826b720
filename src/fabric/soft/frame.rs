//! The soft fabric's wire format. One TCP connection (a *link*) joins two devices (rails)
//! and carries the frames of every QP pair between them; each frame names the QP it is for.
//! A frame is a fixed 32-byte header, followed by `payload_len()` bytes for the frames that
//! carry data. A payload longer than [`SEGMENT`] is cut into segments: the request (WRITE,
//! WRITE_IMM) or the READ response carries the first, DATA frames the rest, so the frames of
//! other QPs interleave with a large transfer and never wait behind all of it.
//!
//! ```text
//! offset size field
//!  0     1    magic 0xB8 (wire version 2)
//!  1     1    kind: 1 WRITE, 2 WRITE_IMM, 3 READ_REQ, 4 READ_RESP, 5 ACK, 6 NAK, 7 HELLO,
//!             8 RNR, 9 DATA, 10 CONNECT, 11 CLOSE
//!  2     1    status (READ_RESP, NAK: the refusal; CLOSE: 1 = the QP failed; 0 elsewhere)
//!  3     1    flags: bit 0 ACK_REQ (WRITE, WRITE_IMM only: acknowledge at once); 0 elsewhere
//!  4     4    dst_qpn   the receiving QP (HELLO: 0)
//!  8     4    seq       request sequence number (CONNECT, CLOSE: the sending QP's number;
//!                       HELLO: the wire version, 2)
//! 12     4    len       WRITE, READ_REQ, READ_RESP: the whole transfer (≤ MAX_MSG);
//!                       DATA: this segment (1 ..= SEGMENT)
//! 16     8    addr      remote address (CONNECT: the receiving QP's nonce; HELLO: the
//!                       receiving device's identity)
//! 24     4    rkey      (CONNECT, HELLO: low half of the sender's nonce / identity)
//! 28     4    imm       big-endian immediate (CONNECT, HELLO: the high half)
//! ```
//! Integers are little-endian except `imm`, which is big-endian as on an RDMA wire.
//!
//! - HELLO opens a link: the dialing device names itself and the device it dialed.
//! - CONNECT: a QP names itself to its peer QP (the QP-level handshake); CLOSE: it is gone
//!   (destroyed, or failed: status 1).
//! - ACK `seq`: every request up to `seq` was executed. NAK `seq`: the ones before it were,
//!   `seq` was refused, later ones were discarded. RNR `seq`: the ones before it were
//!   executed, `seq` found the receiver not ready (no SRQ WQE, or no room for its
//!   completion) and was not executed, later ones were discarded: the requester sends them
//!   again from `seq`, after a delay.
//!
//! [`decode`] accepts exactly the headers [`encode`] can produce; anything else is an error,
//! never a panic (property-tested and fuzzed).

/// Size of every frame header.
pub const HDR_LEN: usize = 32;
/// First byte of every header (wire version 2; version 1 used 0xB7).
pub const MAGIC: u8 = 0xB8;
/// The wire version a HELLO carries.
pub const WIRE_VERSION: u32 = 2;
/// Largest message (as verbs' usual `max_msg_sz`, 2 GiB).
pub const MAX_MSG: u32 = 1 << 31;
/// Payload bytes of one segment: a request or READ response carries at most this much,
/// DATA frames the rest, `SEGMENT` bytes each but the last.
pub const SEGMENT: u32 = 256 << 10;

const K_WRITE: u8 = 1;
const K_WRITE_IMM: u8 = 2;
const K_READ_REQ: u8 = 3;
const K_READ_RESP: u8 = 4;
const K_ACK: u8 = 5;
const K_NAK: u8 = 6;
const K_HELLO: u8 = 7;
const K_RNR: u8 = 8;
const K_DATA: u8 = 9;
const K_CONNECT: u8 = 10;
const K_CLOSE: u8 = 11;

const F_ACK_REQ: u8 = 1;

/// Why a responder refused a request (status byte of NAK and READ_RESP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    /// Unknown rkey, range outside the region, or missing access rights.
    RemoteAccess = 1,
    /// The request cannot be executed (WRITE_IMM on a QP without an SRQ).
    InvalidRequest = 2,
}

impl NakCode {
    fn from_u8(b: u8) -> Option<NakCode> {
        match b {
            1 => Some(NakCode::RemoteAccess),
            2 => Some(NakCode::InvalidRequest),
            _ => None,
        }
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// RDMA WRITE (`imm: None`) or WRITE_WITH_IMM of `len` bytes; the first segment follows.
    /// `ack_req`: the requester waits for this one (signalled): acknowledge it at once.
    Write { dst_qpn: u32, seq: u32, addr: u64, rkey: u32, len: u32, imm: Option<u32>, ack_req: bool },
    /// RDMA READ request of `len` bytes at `addr`/`rkey`.
    ReadReq { dst_qpn: u32, seq: u32, addr: u64, rkey: u32, len: u32 },
    /// READ response: `Ok` with `len` bytes in all (the first segment follows), or refused.
    ReadResp { dst_qpn: u32, seq: u32, result: Result<u32, NakCode> },
    /// A further segment of request (or READ response) `seq`: `len` bytes follow.
    Data { dst_qpn: u32, seq: u32, len: u32 },
    /// Every request up to and including `seq` was executed.
    Ack { dst_qpn: u32, seq: u32 },
    /// Requests before `seq` were executed; `seq` was refused; later ones were discarded.
    Nak { dst_qpn: u32, seq: u32, code: NakCode },
    /// Receiver not ready: requests before `seq` were executed, `seq` and later ones were
    /// not (send them again from `seq`).
    Rnr { dst_qpn: u32, seq: u32 },
    /// First frame of a link, from the dialing device.
    Hello { dst_dev: u64, src_dev: u64 },
    /// QP `src_qpn` (nonce `src_nonce`) is connected to QP `dst_qpn` (`dst_nonce`).
    Connect { dst_qpn: u32, src_qpn: u32, dst_nonce: u64, src_nonce: u64 },
    /// QP `src_qpn`, the peer of `dst_qpn`, is gone: destroyed, or failed (`error`).
    Close { dst_qpn: u32, src_qpn: u32, error: bool },
}

/// A header that is not one [`encode`] produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic(u8),
    UnknownKind(u8),
    /// A field that must be 0 for this kind is not.
    NonZero(&'static str),
    BadStatus(u8),
    TooLong(u32),
    /// A DATA frame of 0 bytes or more than a segment.
    BadSegment(u32),
    /// A HELLO of another wire version.
    Version(u32),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::BadMagic(b) => write!(f, "bad magic byte {b:#04x} (not soft-fabric wire version 2)"),
            DecodeError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            DecodeError::NonZero(field) => write!(f, "field {field} must be 0 for this frame kind"),
            DecodeError::BadStatus(s) => write!(f, "bad status byte {s}"),
            DecodeError::TooLong(l) => write!(f, "length {l} above the {MAX_MSG}-byte maximum"),
            DecodeError::BadSegment(l) => write!(f, "DATA segment of {l} bytes (1 ..= {SEGMENT})"),
            DecodeError::Version(v) => write!(f, "HELLO of wire version {v} (this is {WIRE_VERSION})"),
        }
    }
}

impl Frame {
    /// Payload bytes that follow the header.
    pub fn payload_len(&self) -> u32 {
        match *self {
            Frame::Write { len, .. } | Frame::ReadResp { result: Ok(len), .. } => len.min(SEGMENT),
            Frame::Data { len, .. } => len,
            _ => 0,
        }
    }

    /// The QP the frame is addressed to (HELLO: 0).
    pub fn dst_qpn(&self) -> u32 {
        match *self {
            Frame::Write { dst_qpn, .. }
            | Frame::ReadReq { dst_qpn, .. }
            | Frame::ReadResp { dst_qpn, .. }
            | Frame::Data { dst_qpn, .. }
            | Frame::Ack { dst_qpn, .. }
            | Frame::Nak { dst_qpn, .. }
            | Frame::Rnr { dst_qpn, .. }
            | Frame::Connect { dst_qpn, .. }
            | Frame::Close { dst_qpn, .. } => dst_qpn,
            Frame::Hello { .. } => 0,
        }
    }
}

struct Raw {
    kind: u8,
    status: u8,
    flags: u8,
    dst_qpn: u32,
    seq: u32,
    len: u32,
    addr: u64,
    rkey: u32,
    imm: u32,
}

/// Serializes a header.
pub fn encode(f: &Frame) -> [u8; HDR_LEN] {
    let z = |kind| Raw { kind, status: 0, flags: 0, dst_qpn: f.dst_qpn(), seq: 0, len: 0, addr: 0, rkey: 0, imm: 0 };
    let split = |v: u64| (v as u32, (v >> 32) as u32);
    let r = match *f {
        Frame::Write { seq, addr, rkey, len, imm, ack_req, .. } => Raw {
            seq,
            addr,
            rkey,
            len,
            imm: imm.unwrap_or(0),
            flags: if ack_req { F_ACK_REQ } else { 0 },
            ..z(if imm.is_some() { K_WRITE_IMM } else { K_WRITE })
        },
        Frame::ReadReq { seq, addr, rkey, len, .. } => Raw { seq, addr, rkey, len, ..z(K_READ_REQ) },
        Frame::ReadResp { seq, result, .. } => match result {
            Ok(len) => Raw { seq, len, ..z(K_READ_RESP) },
            Err(code) => Raw { seq, status: code as u8, ..z(K_READ_RESP) },
        },
        Frame::Data { seq, len, .. } => Raw { seq, len, ..z(K_DATA) },
        Frame::Ack { seq, .. } => Raw { seq, ..z(K_ACK) },
        Frame::Nak { seq, code, .. } => Raw { seq, status: code as u8, ..z(K_NAK) },
        Frame::Rnr { seq, .. } => Raw { seq, ..z(K_RNR) },
        Frame::Hello { dst_dev, src_dev } => {
            let (rkey, imm) = split(src_dev);
            Raw { seq: WIRE_VERSION, addr: dst_dev, rkey, imm, ..z(K_HELLO) }
        }
        Frame::Connect { src_qpn, dst_nonce, src_nonce, .. } => {
            let (rkey, imm) = split(src_nonce);
            Raw { seq: src_qpn, addr: dst_nonce, rkey, imm, ..z(K_CONNECT) }
        }
        Frame::Close { src_qpn, error, .. } => Raw { seq: src_qpn, status: error as u8, ..z(K_CLOSE) },
    };
    let mut b = [0u8; HDR_LEN];
    b[0] = MAGIC;
    b[1] = r.kind;
    b[2] = r.status;
    b[3] = r.flags;
    b[4..8].copy_from_slice(&r.dst_qpn.to_le_bytes());
    b[8..12].copy_from_slice(&r.seq.to_le_bytes());
    b[12..16].copy_from_slice(&r.len.to_le_bytes());
    b[16..24].copy_from_slice(&r.addr.to_le_bytes());
    b[24..28].copy_from_slice(&r.rkey.to_le_bytes());
    b[28..32].copy_from_slice(&r.imm.to_be_bytes());
    b
}

fn u32_at(b: &[u8; HDR_LEN], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parses a header; see the module doc for what is accepted.
pub fn decode(b: &[u8; HDR_LEN]) -> Result<Frame, DecodeError> {
    if b[0] != MAGIC {
        return Err(DecodeError::BadMagic(b[0]));
    }
    let (kind, status) = (b[1], b[2]);
    let (dst_qpn, seq, len, rkey) = (u32_at(b, 4), u32_at(b, 8), u32_at(b, 12), u32_at(b, 24));
    let addr = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    let imm = u32::from_be_bytes([b[28], b[29], b[30], b[31]]);
    let joined = rkey as u64 | (imm as u64) << 32;
    let nak = || NakCode::from_u8(status).ok_or(DecodeError::BadStatus(status));
    if len > MAX_MSG {
        return Err(DecodeError::TooLong(len));
    }
    // The frame the fields make, read as loosely as the kind allows ...
    let f = match kind {
        K_WRITE | K_WRITE_IMM => {
            let imm = (kind == K_WRITE_IMM).then_some(imm);
            Frame::Write { dst_qpn, seq, addr, rkey, len, imm, ack_req: b[3] & F_ACK_REQ != 0 }
        }
        K_READ_REQ => Frame::ReadReq { dst_qpn, seq, addr, rkey, len },
        K_READ_RESP => Frame::ReadResp { dst_qpn, seq, result: if status == 0 { Ok(len) } else { Err(nak()?) } },
        K_DATA if len == 0 || len > SEGMENT => return Err(DecodeError::BadSegment(len)),
        K_DATA => Frame::Data { dst_qpn, seq, len },
        K_ACK => Frame::Ack { dst_qpn, seq },
        K_NAK => Frame::Nak { dst_qpn, seq, code: nak()? },
        K_RNR => Frame::Rnr { dst_qpn, seq },
        K_HELLO if seq != WIRE_VERSION => return Err(DecodeError::Version(seq)),
        K_HELLO => Frame::Hello { dst_dev: addr, src_dev: joined },
        K_CONNECT => Frame::Connect { dst_qpn, src_qpn: seq, dst_nonce: addr, src_nonce: joined },
        K_CLOSE if status > 1 => return Err(DecodeError::BadStatus(status)),
        K_CLOSE => Frame::Close { dst_qpn, src_qpn: seq, error: status == 1 },
        k => return Err(DecodeError::UnknownKind(k)),
    };
    // ... is accepted only if it encodes back to these very bytes: every field its kind
    // does not carry is 0, and the flags hold only ACK_REQ. One rule instead of a check
    // per kind and field; the error names the first field that differs.
    let back = encode(&f);
    match (0..HDR_LEN).find(|&i| back[i] != b[i]) {
        None => Ok(f),
        Some(at) => Err(DecodeError::NonZero(FIELDS.iter().rev().find(|(o, _)| *o <= at).map_or("?", |f| f.1))),
    }
}

/// Where each header field after `kind` starts, for [`DecodeError::NonZero`].
const FIELDS: [(usize, &str); 8] =
    [(2, "status"), (3, "flags"), (4, "dst_qpn"), (8, "seq"), (12, "len"), (16, "addr"), (24, "rkey"), (28, "imm")];

/// Walks a byte stream as the receive path does (header, then its payload) and returns
/// the frames whose headers were complete, or the first decode error. A truncated last
/// frame is not an error (the rest would arrive later). For property tests and fuzzing.
pub fn decode_stream(mut bytes: &[u8], out: &mut Vec<Frame>) -> Result<(), DecodeError> {
    while let Some(hdr) = bytes.first_chunk::<HDR_LEN>() {
        let f = decode(hdr)?;
        out.push(f);
        let skip = (HDR_LEN as u64 + f.payload_len() as u64).min(bytes.len() as u64) as usize;
        bytes = &bytes[skip..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_frame() -> impl Strategy<Value = Frame> {
        let code = prop_oneof![Just(NakCode::RemoteAccess), Just(NakCode::InvalidRequest)];
        prop_oneof![
            (any::<u32>(), any::<u32>(), any::<u64>(), any::<u32>(), 0..=MAX_MSG, any::<Option<u32>>(), any::<bool>())
                .prop_map(|(dst_qpn, seq, addr, rkey, len, imm, ack_req)| Frame::Write {
                    dst_qpn,
                    seq,
                    addr,
                    rkey,
                    len,
                    imm,
                    ack_req
                }),
            (any::<u32>(), any::<u32>(), any::<u64>(), any::<u32>(), 0..=MAX_MSG)
                .prop_map(|(dst_qpn, seq, addr, rkey, len)| Frame::ReadReq { dst_qpn, seq, addr, rkey, len }),
            (any::<u32>(), any::<u32>(), 0..=MAX_MSG).prop_map(|(dst_qpn, seq, len)| Frame::ReadResp {
                dst_qpn,
                seq,
                result: Ok(len)
            }),
            (any::<u32>(), any::<u32>(), code.clone()).prop_map(|(dst_qpn, seq, c)| Frame::ReadResp {
                dst_qpn,
                seq,
                result: Err(c)
            }),
            (any::<u32>(), any::<u32>(), 1..=SEGMENT).prop_map(|(dst_qpn, seq, len)| Frame::Data { dst_qpn, seq, len }),
            (any::<u32>(), any::<u32>()).prop_map(|(dst_qpn, seq)| Frame::Ack { dst_qpn, seq }),
            (any::<u32>(), any::<u32>()).prop_map(|(dst_qpn, seq)| Frame::Rnr { dst_qpn, seq }),
            (any::<u32>(), any::<u32>(), code).prop_map(|(dst_qpn, seq, code)| Frame::Nak { dst_qpn, seq, code }),
            (any::<u64>(), any::<u64>()).prop_map(|(dst_dev, src_dev)| Frame::Hello { dst_dev, src_dev }),
            (any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
                |(dst_qpn, src_qpn, dst_nonce, src_nonce)| Frame::Connect { dst_qpn, src_qpn, dst_nonce, src_nonce }
            ),
            (any::<u32>(), any::<u32>(), any::<bool>()).prop_map(|(dst_qpn, src_qpn, error)| Frame::Close {
                dst_qpn,
                src_qpn,
                error
            }),
        ]
    }

    proptest! {
        #[test]
        fn every_frame_round_trips(f in any_frame()) {
            prop_assert_eq!(decode(&encode(&f)), Ok(f));
        }

        #[test]
        fn any_header_decodes_to_a_frame_that_encodes_back_or_is_rejected(b in any::<[u8; HDR_LEN]>()) {
            // Accepted headers are canonical: nothing the decoder accepts is lost or guessed.
            if let Ok(f) = decode(&b) {
                prop_assert_eq!(encode(&f), b);
            }
        }

        #[test]
        fn any_header_with_the_magic_decodes_or_is_rejected(mut b in any::<[u8; HDR_LEN]>(), kind in 0u8..13) {
            b[0] = MAGIC;
            b[1] = kind;
            if let Ok(f) = decode(&b) {
                prop_assert_eq!(encode(&f), b);
                prop_assert!(f.payload_len() <= SEGMENT);
            }
        }

        #[test]
        fn any_byte_stream_decodes_or_is_rejected(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut out = Vec::new();
            let _ = decode_stream(&bytes, &mut out);
            prop_assert!(out.len() <= bytes.len() / HDR_LEN);
        }

        #[test]
        fn corrupting_a_valid_header_never_panics(f in any_frame(), at in 0..HDR_LEN, x in 1u8..=255) {
            let mut b = encode(&f);
            b[at] ^= x;
            if let Ok(g) = decode(&b) {
                prop_assert_eq!(encode(&g), b);
            }
        }
    }

    #[test]
    fn rejects_what_is_not_a_frame() {
        let mut b = encode(&Frame::Ack { dst_qpn: 1, seq: 2 });
        b[0] = 0xB7;
        assert_eq!(decode(&b), Err(DecodeError::BadMagic(0xB7)), "wire version 1");
        let mut b = encode(&Frame::Ack { dst_qpn: 1, seq: 2 });
        b[1] = 99;
        assert_eq!(decode(&b), Err(DecodeError::UnknownKind(99)));
        let mut b = encode(&Frame::Ack { dst_qpn: 1, seq: 2 });
        b[12] = 1;
        assert_eq!(decode(&b), Err(DecodeError::NonZero("len")));
        let mut b = encode(&Frame::Ack { dst_qpn: 1, seq: 2 });
        b[3] = 1;
        assert_eq!(decode(&b), Err(DecodeError::NonZero("flags")), "ACK_REQ only on requests");
        let b = encode(&Frame::Write { dst_qpn: 0, seq: 0, addr: 0, rkey: 0, len: MAX_MSG, imm: None, ack_req: false });
        let mut c = b;
        c[12..16].copy_from_slice(&(MAX_MSG + 1).to_le_bytes());
        assert_eq!(decode(&c), Err(DecodeError::TooLong(MAX_MSG + 1)));
        let mut n = encode(&Frame::Nak { dst_qpn: 0, seq: 0, code: NakCode::RemoteAccess });
        n[2] = 7;
        assert_eq!(decode(&n), Err(DecodeError::BadStatus(7)));
        let mut d = encode(&Frame::Data { dst_qpn: 0, seq: 0, len: 1 });
        d[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode(&d), Err(DecodeError::BadSegment(0)));
        d[12..16].copy_from_slice(&(SEGMENT + 1).to_le_bytes());
        assert_eq!(decode(&d), Err(DecodeError::BadSegment(SEGMENT + 1)));
        let mut h = encode(&Frame::Hello { dst_dev: 1, src_dev: 2 });
        h[8] = 1;
        assert_eq!(decode(&h), Err(DecodeError::Version(1)));
    }

    #[test]
    fn imm_is_big_endian_on_the_wire() {
        let b = encode(&Frame::Write {
            dst_qpn: 0,
            seq: 0,
            addr: 0,
            rkey: 0,
            len: 0,
            imm: Some(0x0102_0304),
            ack_req: true,
        });
        assert_eq!(&b[28..32], &[1, 2, 3, 4]);
        assert_eq!(b[3], 1, "ACK_REQ");
    }

    #[test]
    fn a_stream_skips_payloads_a_segment_at_a_time() {
        let w = Frame::Write { dst_qpn: 3, seq: 0, addr: 0, rkey: 0, len: SEGMENT + 5, imm: None, ack_req: false };
        assert_eq!(w.payload_len(), SEGMENT, "the request carries the first segment");
        let mut s = encode(&w).to_vec();
        s.extend_from_slice(&vec![0xFF; SEGMENT as usize]);
        s.extend_from_slice(&encode(&Frame::Ack { dst_qpn: 4, seq: 9 }));
        s.extend_from_slice(&encode(&Frame::Data { dst_qpn: 3, seq: 0, len: 5 }));
        s.extend_from_slice(&[0xFF; 5]);
        s.extend_from_slice(&encode(&Frame::Ack { dst_qpn: 3, seq: 0 }));
        let mut out = Vec::new();
        decode_stream(&s, &mut out).unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(out[3], Frame::Ack { dst_qpn: 3, seq: 0 });
    }
}
