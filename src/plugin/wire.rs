//! Set-up messages exchanged over the out-of-band channel (little-endian, fixed layout,
//! every field validated: a malformed or foreign message is a clear error).

use crate::engine::RAILS;
use crate::error::{Error, Result};
use crate::fabric::{QP_INFO_LEN, QpInfo};

const HELLO_MAGIC: &[u8; 4] = b"MPIH";
const REPLY_MAGIC: &[u8; 4] = b"MPIR";
/// Bumped on any change of these layouts.
const VERSION: u16 = 1;
/// The connector's last message: its QPs are ready.
pub const READY: [u8; 4] = *b"MPIY";
/// Most QPs per rail (`MPIB_SOUT_QP`/`MPIB_SUP_QP` accept 1–16).
const MAX_QPS: u16 = 16;

/// Connector → acceptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub kind: u8,
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

struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.b.len() < n {
            return Err(Error::remote(format!("set-up {} message is truncated", self.what)));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn header(&mut self, magic: &[u8; 4]) -> Result<()> {
        if self.take(4)? != magic {
            return Err(Error::remote(format!("set-up {} message has a bad magic (not an mpib peer?)", self.what)));
        }
        let v = self.u16()?;
        if v != VERSION {
            return Err(Error::remote(format!(
                "peer speaks set-up version {v}, this plugin {VERSION}: run the same mpib on every rank"
            )));
        }
        Ok(())
    }
    fn qps(&mut self) -> Result<[u16; RAILS]> {
        let q = [self.u16()?, self.u16()?];
        if q.iter().any(|&n| n == 0 || n > MAX_QPS) {
            return Err(Error::remote(format!("peer asks for {q:?} QPs per rail (1..{MAX_QPS} allowed)")));
        }
        Ok(q)
    }
    fn infos(&mut self, qps: [u16; RAILS]) -> Result<Vec<QpInfo>> {
        let n = (qps[0] + qps[1]) as usize;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(QpInfo(self.take(QP_INFO_LEN)?.try_into().expect("QP info")));
        }
        if !self.b.is_empty() {
            return Err(Error::remote(format!("set-up {} message has {} trailing bytes", self.what, self.b.len())));
        }
        Ok(v)
    }
}

fn put_infos(out: &mut Vec<u8>, infos: &[QpInfo]) {
    for i in infos {
        out.extend_from_slice(&i.0);
    }
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(32 + self.qps_info.len() * QP_INFO_LEN);
        o.extend_from_slice(HELLO_MAGIC);
        o.extend_from_slice(&VERSION.to_le_bytes());
        o.push(self.kind);
        o.push(0);
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

    /// Decodes a Hello from a peer that must use fabric `kind`.
    pub fn decode(b: &[u8], kind: u8) -> Result<Hello> {
        let mut r = Reader { b, what: "Hello" };
        r.header(HELLO_MAGIC)?;
        let k = r.take(2)?[0];
        if k != kind {
            return Err(Error::remote(format!(
                "the connecting peer uses fabric {k}, this side {kind}: set the same MPIB_FABRIC on every rank"
            )));
        }
        let qps = r.qps()?;
        let fifo_addr = r.u64()?;
        let fifo_rkeys = [r.u32()?, r.u32()?];
        let scratch_addr = r.u64()?;
        let qps_info = r.infos(qps)?;
        Ok(Hello { kind, qps, fifo_addr, fifo_rkeys, scratch_addr, qps_info })
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(48 + self.qps_info.len() * QP_INFO_LEN);
        o.extend_from_slice(REPLY_MAGIC);
        o.extend_from_slice(&VERSION.to_le_bytes());
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

    /// Decodes a Reply; the acceptor must mirror the QP counts `qps` the connector asked for.
    pub fn decode(b: &[u8], qps: [u16; RAILS]) -> Result<Reply> {
        let mut r = Reader { b, what: "Reply" };
        r.header(REPLY_MAGIC)?;
        let got = r.qps()?;
        if got != qps {
            return Err(Error::remote(format!("peer created {got:?} QPs per rail, {qps:?} were asked for")));
        }
        let records_addr = r.u64()?;
        let records_rkeys = [r.u32()?, r.u32()?];
        let scratch_addr = r.u64()?;
        let scratch_rkeys = [r.u32()?, r.u32()?];
        let qps_info = r.infos(qps)?;
        Ok(Reply { qps, records_addr, records_rkeys, scratch_addr, scratch_rkeys, qps_info })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(b: u8) -> QpInfo {
        QpInfo([b; QP_INFO_LEN])
    }

    #[test]
    fn hello_and_reply_round_trip() {
        let h = Hello {
            kind: 1,
            qps: [2, 1],
            fifo_addr: 0x1000,
            fifo_rkeys: [5, 6],
            scratch_addr: 0x9000,
            qps_info: vec![info(1), info(2), info(3)],
        };
        assert_eq!(Hello::decode(&h.encode(), 1).unwrap(), h);
        let r = Reply {
            qps: [2, 1],
            records_addr: 7,
            records_rkeys: [8, 9],
            scratch_addr: 10,
            scratch_rkeys: [11, 12],
            qps_info: vec![info(4), info(5), info(6)],
        };
        assert_eq!(Reply::decode(&r.encode(), [2, 1]).unwrap(), r);
    }

    #[test]
    fn malformed_messages_are_errors() {
        let h = Hello {
            kind: 1,
            qps: [1, 1],
            fifo_addr: 0,
            fifo_rkeys: [0, 0],
            scratch_addr: 0,
            qps_info: vec![info(1), info(2)],
        };
        let good = h.encode();
        for n in 0..good.len() {
            assert!(Hello::decode(&good[..n], 1).is_err(), "truncated to {n}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(Hello::decode(&long, 1).unwrap_err().msg().contains("trailing"));
        assert!(Hello::decode(&good, 2).unwrap_err().msg().contains("MPIB_FABRIC"));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(Hello::decode(&bad, 1).unwrap_err().msg().contains("magic"));
        let mut ver = good.clone();
        ver[4] = 9;
        assert!(Hello::decode(&ver, 1).unwrap_err().msg().contains("version"));
        let mut qps = good;
        qps[8] = 0;
        assert!(Hello::decode(&qps, 1).unwrap_err().msg().contains("QPs per rail"));
        let r = Reply {
            qps: [1, 1],
            records_addr: 0,
            records_rkeys: [0; 2],
            scratch_addr: 0,
            scratch_rkeys: [0; 2],
            qps_info: vec![info(0), info(0)],
        };
        assert!(Reply::decode(&r.encode(), [2, 1]).unwrap_err().msg().contains("were asked for"));
    }
}
