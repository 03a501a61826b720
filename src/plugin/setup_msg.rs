//! Set-up messages exchanged over the out-of-band channel: little-endian, fixed layouts,
//! every field validated. The decoder is total — any bytes give a message or a
//! [`DecodeError`], never a panic or an allocation sized by the peer (fuzzed:
//! `fuzz/fuzz_targets/setup_decode.rs`) — and tells a stranger on the set-up port
//! ([`DecodeError::Foreign`]: dropped by the listener) from an mpib peer of another version
//! ([`DecodeError::Version`]: an error on both sides).
//!
//! On the wire each message is a `u32` length, then the message (see [`Frames`]); a length
//! above [`MAX_MSG`] is refused as soon as its four bytes are in. Every message starts with
//! the same header, so every later version can tell its peers apart:
//!
//! ```text
//!  @0 magic "MPIB"   @4 version u16   @6 type u8 (1 Hello, 2 Reply, 3 Ready, 4 Refusal)   @7 0
//!  Hello   @8  fabric u8, pieces u8 (the most pieces the connector stripes a rail's
//!              share of a request over: SOUT's in bits 3:0, SUP's in bits 7:4; each
//!              1..=min(QPs, 4)), QPs per rail u16 × 2, FIFO addr u64, FIFO rkeys u32 × 2,
//!              scratch addr u64, one QpInfo (48 B) per QP
//!  Reply   @8  QPs per rail u16 × 2, records addr u64, records rkeys u32 × 2,
//!              scratch addr u64, scratch rkeys u32 × 2, one QpInfo per QP
//!  Ready   nothing more
//!  Refusal @8  why, UTF-8, at most 256 bytes (sent before a close, so the peer can say why)
//! ```
//! Version 1 had a magic per message (`MPIH`, `MPIR`, `MPIY`); such a
//! peer is recognized as version 1. Version 3 has version 2's layouts; what the
//! connection then exchanges changed: a rail's re-admission records carry the port's
//! address (`plugin/readmit.rs`), so peers of versions 2 and 3 must not connect. Version 4
//! gave the Hello's second byte the striping (until then 0) and made the control ring's
//! entries 256 bytes (re-admission records of up to 16 QPs per rail).

use std::fmt;

use crate::engine::RAILS;
use crate::engine::imm::MAX_PIECES;
use crate::error::Error;
use crate::fabric::{QP_INFO_LEN, QpInfo};

const MAGIC: [u8; 4] = *b"MPIB";
/// Bumped on any change of these layouts or of what a connection exchanges after them.
pub const VERSION: u16 = 4;
const HEADER: usize = 8;
/// Most QPs per rail (`MPIB_SOUT_QP`/`MPIB_SUP_QP` accept 1–16).
pub const MAX_QPS: u16 = 16;
const HELLO_FIXED: usize = 2 + 4 + 8 + 8 + 8;
const REPLY_FIXED: usize = 4 + 8 + 8 + 8 + 8;
/// Longest reason a Refusal carries.
pub const MAX_REFUSAL: usize = 256;
/// The largest valid set-up message (a Reply with 16 QPs per rail): anything announcing
/// more is not an mpib peer.
pub const MAX_MSG: usize = HEADER + REPLY_FIXED + 2 * MAX_QPS as usize * QP_INFO_LEN;
const _: () = assert!(HEADER + HELLO_FIXED <= HEADER + REPLY_FIXED && HEADER + MAX_REFUSAL <= MAX_MSG);

const HELLO: u8 = 1;
const REPLY: u8 = 2;
const READY: u8 = 3;
const REFUSAL: u8 = 4;

/// Connector → acceptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The connector's fabric (`setup::FabricKind`).
    pub kind: u8,
    /// Most pieces the connector stripes a rail's share of a request over (1: none).
    pub pieces: [u8; RAILS],
    pub qps: [u16; RAILS],
    pub fifo_addr: u64,
    pub fifo_rkeys: [u32; RAILS],
    /// The connector's scratch word (same registration as the FIFO): keepalive target.
    pub scratch_addr: u64,
    pub qps_info: Vec<QpInfo>,
}

/// Acceptor → connector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub qps: [u16; RAILS],
    pub records_addr: u64,
    pub records_rkeys: [u32; RAILS],
    pub scratch_addr: u64,
    pub scratch_rkeys: [u32; RAILS],
    pub qps_info: Vec<QpInfo>,
}

/// One set-up message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    Hello(Hello),
    Reply(Reply),
    /// The connector's last message: its QPs are ready.
    Ready,
    /// The sender gives up on this set-up, and says why (printable ASCII only).
    Refusal(String),
}

/// Why bytes are not a set-up message this side can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Not mpib's set-up protocol: whoever sent it is not an mpib peer.
    Foreign(Foreign),
    /// mpib's set-up protocol of another version: an mpib peer built from another release.
    Version(u16),
}

/// What made a message foreign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// A length prefix above [`MAX_MSG`].
    TooLong(u32),
    /// Does not start with "MPIB".
    BadMagic,
    UnknownType(u8),
    /// A byte this version keeps 0 is not.
    Reserved(&'static str),
    Truncated(&'static str),
    Trailing(&'static str, usize),
    /// QP counts outside 1..=16 (no mpib peer asks for them).
    BadQps([u16; RAILS]),
    /// Striping over more pieces than QPs (or 4), or over none.
    BadPieces([u8; RAILS], [u16; RAILS]),
}

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Foreign::TooLong(n) => write!(f, "announced a {n}-byte message (set-up messages are at most {MAX_MSG})"),
            Foreign::BadMagic => f.write_str("sent bytes that are not an mpib set-up message (bad magic)"),
            Foreign::UnknownType(t) => write!(f, "sent a set-up message of unknown type {t}"),
            Foreign::Reserved(what) => write!(f, "sent a {what} with a reserved byte set"),
            Foreign::Truncated(what) => write!(f, "sent a truncated {what}"),
            Foreign::Trailing(what, n) => write!(f, "sent a {what} with {n} trailing bytes"),
            Foreign::BadQps(q) => write!(f, "asked for {q:?} QPs per rail (1..={MAX_QPS} allowed)"),
            Foreign::BadPieces(p, q) => {
                write!(f, "announced striping over {p:?} pieces per rail with {q:?} QPs (1..=min(QPs, {MAX_PIECES}))")
            }
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Foreign(why) => write!(f, "the peer is not an mpib peer: it {why}"),
            DecodeError::Version(v) => write!(
                f,
                "the peer speaks mpib set-up version {v}, this plugin version {VERSION}: run the same mpib on every rank"
            ),
        }
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Error {
        Error::remote(e.to_string())
    }
}

struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Foreign(Foreign::Truncated(self.what)));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn pair32(&mut self) -> Result<[u32; RAILS], DecodeError> {
        Ok([self.u32()?, self.u32()?])
    }
    fn qps(&mut self) -> Result<[u16; RAILS], DecodeError> {
        let q = [self.u16()?, self.u16()?];
        if q.iter().any(|&n| n == 0 || n > MAX_QPS) {
            return Err(DecodeError::Foreign(Foreign::BadQps(q)));
        }
        Ok(q)
    }
    /// The QP infos of `qps`, which must be all that is left.
    fn infos(&mut self, qps: [u16; RAILS]) -> Result<Vec<QpInfo>, DecodeError> {
        let n = (qps[0] + qps[1]) as usize;
        if self.b.len() != n * QP_INFO_LEN {
            return Err(DecodeError::Foreign(if self.b.len() < n * QP_INFO_LEN {
                Foreign::Truncated(self.what)
            } else {
                Foreign::Trailing(self.what, self.b.len() - n * QP_INFO_LEN)
            }));
        }
        // Bounded: n ≤ 32 (checked by `qps`).
        let v = self.b.chunks_exact(QP_INFO_LEN).map(|c| QpInfo(c.try_into().expect("48-byte chunk"))).collect();
        self.b = &[];
        Ok(v)
    }
    fn end(&self) -> Result<(), DecodeError> {
        match self.b.len() {
            0 => Ok(()),
            n => Err(DecodeError::Foreign(Foreign::Trailing(self.what, n))),
        }
    }
}

/// Decodes one message (the bytes after its length prefix).
pub fn decode(b: &[u8]) -> Result<Msg, DecodeError> {
    if b.len() < HEADER {
        return Err(legacy(b).unwrap_or(DecodeError::Foreign(Foreign::Truncated("set-up message header"))));
    }
    if b[..4] != MAGIC {
        return Err(legacy(b).unwrap_or(DecodeError::Foreign(Foreign::BadMagic)));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    if b[7] != 0 {
        return Err(DecodeError::Foreign(Foreign::Reserved("set-up message header")));
    }
    let body = &b[HEADER..];
    match b[6] {
        HELLO => {
            let mut r = Reader { b: body, what: "Hello" };
            let b = r.take(2)?;
            let (kind, p) = (b[0], b[1]);
            let qps = r.qps()?;
            let pieces = [p & 0xf, p >> 4];
            if (0..RAILS).any(|i| pieces[i] == 0 || pieces[i] as u16 > qps[i].min(MAX_PIECES as u16)) {
                return Err(DecodeError::Foreign(Foreign::BadPieces(pieces, qps)));
            }
            let fifo_addr = r.u64()?;
            let fifo_rkeys = r.pair32()?;
            let scratch_addr = r.u64()?;
            let qps_info = r.infos(qps)?;
            Ok(Msg::Hello(Hello { kind, pieces, qps, fifo_addr, fifo_rkeys, scratch_addr, qps_info }))
        }
        REPLY => {
            let mut r = Reader { b: body, what: "Reply" };
            let qps = r.qps()?;
            let records_addr = r.u64()?;
            let records_rkeys = r.pair32()?;
            let scratch_addr = r.u64()?;
            let scratch_rkeys = r.pair32()?;
            let qps_info = r.infos(qps)?;
            Ok(Msg::Reply(Reply { qps, records_addr, records_rkeys, scratch_addr, scratch_rkeys, qps_info }))
        }
        READY => Reader { b: body, what: "Ready" }.end().map(|()| Msg::Ready),
        REFUSAL if body.len() > MAX_REFUSAL => Err(DecodeError::Foreign(Foreign::Trailing("Refusal", body.len()))),
        REFUSAL => Ok(Msg::Refusal(printable(body))),
        t => Err(DecodeError::Foreign(Foreign::UnknownType(t))),
    }
}

/// A version 1 message (its own magic per type, then the version), if `b` is one.
fn legacy(b: &[u8]) -> Option<DecodeError> {
    if b == b"MPIY" {
        return Some(DecodeError::Version(1));
    }
    let magic = b.get(..4)?;
    let v = b.get(4..6)?;
    (magic == b"MPIH" || magic == b"MPIR").then(|| DecodeError::Version(u16::from_le_bytes([v[0], v[1]])))
}

/// A peer's text as it may appear in a log line: printable ASCII, anything else `?`.
fn printable(b: &[u8]) -> String {
    b.iter().map(|&c| if (b' '..=b'~').contains(&c) { c as char } else { '?' }).collect()
}

fn header(t: u8, body: usize) -> Vec<u8> {
    let mut o = Vec::with_capacity(HEADER + body);
    o.extend_from_slice(&MAGIC);
    o.extend_from_slice(&VERSION.to_le_bytes());
    o.extend_from_slice(&[t, 0]);
    o
}

fn put_infos(out: &mut Vec<u8>, infos: &[QpInfo]) {
    for i in infos {
        out.extend_from_slice(&i.0);
    }
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = header(HELLO, HELLO_FIXED + self.qps_info.len() * QP_INFO_LEN);
        o.extend_from_slice(&[self.kind, self.pieces[0] | self.pieces[1] << 4]);
        for q in self.qps {
            o.extend_from_slice(&q.to_le_bytes());
        }
        o.extend_from_slice(&self.fifo_addr.to_le_bytes());
        for k in self.fifo_rkeys {
            o.extend_from_slice(&k.to_le_bytes());
        }
        o.extend_from_slice(&self.scratch_addr.to_le_bytes());
        put_infos(&mut o, &self.qps_info);
        o
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = header(REPLY, REPLY_FIXED + self.qps_info.len() * QP_INFO_LEN);
        for q in self.qps {
            o.extend_from_slice(&q.to_le_bytes());
        }
        o.extend_from_slice(&self.records_addr.to_le_bytes());
        for k in self.records_rkeys {
            o.extend_from_slice(&k.to_le_bytes());
        }
        o.extend_from_slice(&self.scratch_addr.to_le_bytes());
        for k in self.scratch_rkeys {
            o.extend_from_slice(&k.to_le_bytes());
        }
        put_infos(&mut o, &self.qps_info);
        o
    }
}

/// The Ready message.
pub fn ready() -> Vec<u8> {
    header(READY, 0)
}

/// A Refusal saying `why` (cut to [`MAX_REFUSAL`] bytes).
pub fn refusal(why: &str) -> Vec<u8> {
    let mut cut = why.len().min(MAX_REFUSAL);
    while !why.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut o = header(REFUSAL, cut);
    o.extend_from_slice(&why.as_bytes()[..cut]);
    o
}

/// Reassembles length-prefixed messages from a byte stream: the TCP set-up channel pushes
/// what it reads and takes whole messages out. Nothing the peer announces is allocated: a
/// length above [`MAX_MSG`] is an error as soon as its four bytes are in.
#[derive(Default)]
pub struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// `msg` with its length prefix, appended to `out`.
    pub fn put(out: &mut Vec<u8>, msg: &[u8]) {
        out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        out.extend_from_slice(msg);
    }

    /// Appends received bytes.
    pub fn push(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// The next whole message, if one is in.
    pub fn next_msg(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        let Some(prefix) = self.buf.first_chunk::<4>() else { return Ok(None) };
        let len = u32::from_le_bytes(*prefix);
        if len as usize > MAX_MSG {
            return Err(DecodeError::Foreign(Foreign::TooLong(len)));
        }
        let end = 4 + len as usize;
        if self.buf.len() < end {
            return Ok(None);
        }
        let m = self.buf[4..end].to_vec();
        self.buf.drain(..end);
        Ok(Some(m))
    }

    /// Bytes buffered (at most a message and one read beyond it).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
#[path = "setup_msg_tests.rs"]
mod tests;
