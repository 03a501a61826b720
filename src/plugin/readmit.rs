//! Re-admission of a failed rail in the plugin (DESIGN.md, "Rail failover"): the engines
//! decide and exchange the new QPs' records over the surviving rail's control ring; this
//! file performs their actions on the fabric.
//!
//! - [`Action::RebuildQps`]: the old QPs of the rail (in the error state since the fence)
//!   detached and destroyed (`NicQueues::detach`: marker-drained, routes removed; the
//!   rail's receive reservation kept), then its QPs made again as they were first made (same
//!   specs, the NIC's same shared CQ and SRQ, routes to the same inbox). So a rail that
//!   flaps for hours holds one set of QPs, not one per re-admission.
//! - [`Action::ConnectQps`]: each new QP connected to the peer's new one: the peer's info
//!   from set-up with the varying bytes of its new QP and its port's address now (verbs:
//!   its GID, which may have changed since set-up: a RoCE GID table rebuilt after a port
//!   flap, an address changed). The records of a rail ([`encode_records`]) are each QP's
//!   varying bytes, then the port's address once. Readiness is polled in later rounds
//!   ([`Event::QpsConnected`]).
//! - A verbs device checks its GID before it makes a QP (`fabric/verbs/device.rs`): the
//!   rebuilt QPs use the port's GID as it is now, and the records carry it to the peer.
//! - The drill (`MPIB_FAULT_RAIL=rail:N:MS`): a dropped rail refuses to be rebuilt for MS
//!   (for good without MS), as a link that stays down would.

use std::time::{Duration, Instant};

use super::rail::Rail;
use crate::config::MAX_QPS_PER_RAIL;
use crate::engine::failover::QP_RECORD_WORDS;
use crate::engine::{Event, QpRecords, RAIL_NAMES, RAILS, RailMask};
use crate::error::{Error, Result};
use crate::fabric::{Device, QP_VARYING_LEN, QpInfo, QueuePair};

/// QPs per rail whose records one control entry carries (each QP's varying bytes, then the
/// port's 16-byte address): every count the configuration accepts.
pub const READMIT_MAX_QPS: u16 = MAX_QPS_PER_RAIL as u16;
const _: () = assert!(
    READMIT_MAX_QPS as usize * QP_VARYING_LEN + 16 <= QP_RECORD_WORDS * 8,
    "the records of a rail with the most QPs the configuration accepts must fit one control entry"
);
// A receive comm's rails have as many QPs as the peer's Hello says: set-up's bound.
const _: () = assert!(super::setup_msg::MAX_QPS <= READMIT_MAX_QPS);

/// The records of a rail's new QPs (at most [`READMIT_MAX_QPS`]): each one's varying bytes,
/// then the port's address (the first QP's: one port), packed little-endian into words.
pub fn encode_records(infos: &[QpInfo]) -> QpRecords {
    let mut bytes = [0u8; QP_RECORD_WORDS * 8];
    let mut at = 0;
    for info in infos {
        bytes[at..at + QP_VARYING_LEN].copy_from_slice(&info.varying());
        at += QP_VARYING_LEN;
    }
    if let Some(first) = infos.first() {
        bytes[at..at + 16].copy_from_slice(&first.address());
        at += 16;
    }
    let mut r = QpRecords { n: at.div_ceil(8) as u8, ..QpRecords::default() };
    for (w, chunk) in r.words.iter_mut().zip(bytes.chunks(8)) {
        *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    r
}

/// The peer's records of `nqps` new QPs: each one's varying bytes and its port's address;
/// an error when they do not describe that many.
pub fn decode_records(rec: &QpRecords, nqps: usize) -> Result<(Vec<[u8; QP_VARYING_LEN]>, [u8; 16])> {
    let len = nqps * QP_VARYING_LEN + 16;
    if nqps == 0 || len > QP_RECORD_WORDS * 8 || len.div_ceil(8) != rec.n as usize {
        return Err(Error::remote(format!(
            "the peer's re-admission records hold {} words; {nqps} QPs need {}",
            rec.n,
            len.div_ceil(8)
        )));
    }
    let bytes: Vec<u8> = rec.words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let varying =
        (0..nqps).map(|i| bytes[i * QP_VARYING_LEN..(i + 1) * QP_VARYING_LEN].try_into().expect("12 bytes")).collect();
    let address = bytes[len - 16..len].try_into().expect("16 bytes");
    Ok((varying, address))
}

/// How long a dropped rail (the drill) refuses to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refuse {
    No,
    Until(Instant),
    Forever,
}

impl<D: Device> Rail<D> {
    /// New QPs for rail `idx` (see the module doc); the records of the connectable ones.
    fn rebuild(&mut self, idx: usize) -> Result<QpRecords> {
        // The configuration allows no more (`MPIB_QP`'s range); a guard, not a path.
        debug_assert!(self.qps.len() <= READMIT_MAX_QPS as usize);
        if self.qps.len() > READMIT_MAX_QPS as usize {
            return Err(Error::internal(format!(
                "{} QPs on the rail: re-admission describes at most {READMIT_MAX_QPS}",
                self.qps.len()
            )));
        }
        // The old QPs go first: in the error state since the fence, whose drain fed the
        // engine everything they had completed; their routes go with them, and the NIC's
        // send-queue sum makes room for the new ones (same specs, so `sq`, the rail's
        // resource figures and the receive reservation stay as they are).
        let had_flush = self.flush_qp.is_some();
        let mut old = std::mem::take(&mut self.qps);
        old.extend(self.flush_qp.take());
        self.nic.detach(self.owner, old, self.sq, 0);
        let mut qps = self.nic.attach(self.owner, idx, &self.inbox, &self.specs, 0)?;
        self.flush_qp = if had_flush { qps.pop() } else { None };
        self.qps = qps;
        self.first_qp = self.qps.first().map_or(0, |q| q.qp_num());
        let infos: Vec<QpInfo> = self.qps.iter().map(|q| q.local_info()).collect();
        Ok(encode_records(&infos))
    }

    /// Connects the new QPs to the peer's new ones (`rec`), the flush QP to itself.
    fn connect_new(&mut self, rec: &QpRecords) -> Result<()> {
        let p = self.connect.ok_or_else(|| Error::internal("re-admission of a rail never connected"))?;
        if self.peer.len() != self.qps.len() {
            return Err(Error::internal(format!(
                "re-admission: {} peer QPs known for {} QPs of the rail",
                self.peer.len(),
                self.qps.len()
            )));
        }
        let (varying, address) = decode_records(rec, self.qps.len())?;
        if address != self.peer[0].address() {
            log::info!(
                "re-admission: the peer's address on the rail changed since set-up (GID or IP {} -> {})",
                hex(&self.peer[0].address()),
                hex(&address)
            );
        }
        for (i, q) in self.qps.iter_mut().enumerate() {
            let info = self.peer[i].with_varying_and_address(&varying[i], &address);
            q.connect(&info, &p)?;
            self.peer[i] = info;
        }
        if let Some(f) = self.flush_qp.as_mut() {
            let me = f.local_info();
            f.connect(&me, &p)?;
        }
        Ok(())
    }

    /// Whether every new QP carries WRs now.
    fn new_ready(&mut self) -> Result<bool> {
        for q in self.qps.iter_mut().chain(self.flush_qp.as_mut()) {
            if !q.is_ready()? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// At most one WARN per rail this often for failed re-admission attempts.
const READMIT_WARN_EVERY: Duration = Duration::from_secs(60);

/// A comm's re-admissions in progress on the fabric: the rails whose new QPs are
/// connecting, those waiting for their port, the drill's refusals, and the rate limit of
/// the attempts' warnings.
pub struct Readmission {
    refuse: [Refuse; RAILS],
    /// Rails whose new QPs are connecting.
    connecting: RailMask,
    /// Rails whose re-admission waits for their port to be active (logged once).
    port_wait: RailMask,
    /// A failed attempt is a WARN at most once a minute per rail (a rail may stay down for
    /// hours, tried every second), else DEBUG.
    warn: [crate::ratelimit::RateLimit; RAILS],
    /// Where the connection is, for those warnings.
    pub(super) place: Option<std::sync::Arc<super::place::ConnPlace>>,
}

impl Default for Readmission {
    fn default() -> Self {
        Readmission {
            refuse: [Refuse::No; RAILS],
            connecting: RailMask::NONE,
            port_wait: RailMask::NONE,
            warn: std::array::from_fn(|_| crate::ratelimit::RateLimit::new(READMIT_WARN_EVERY)),
            place: None,
        }
    }
}

impl Readmission {
    /// The re-admission state of the connection at `place`.
    pub(super) fn at(place: std::sync::Arc<super::place::ConnPlace>) -> Readmission {
        Readmission { place: Some(place), ..Readmission::default() }
    }

    /// [`crate::engine::Action::RebuildQps`] on `rail` (index `idx`): the event to feed back.
    pub(super) fn rebuild<D: Device>(&mut self, rail: &mut Rail<D>, idx: usize) -> Event {
        let refused = match self.refuse[idx] {
            Refuse::No => false,
            Refuse::Until(t) => Instant::now() < t,
            Refuse::Forever => true,
        };
        if refused {
            log::info!("MPIB_FAULT_RAIL: the {} rail stays down (re-admission refused)", RAIL_NAMES[idx]);
            return Event::ReadmitFailed { rail: idx };
        }
        // A port that is down (verbs: PORT_ERR seen, PORT_ACTIVE not yet) would give QPs
        // whose probes fail only after their retry budget: the attempt waits for the port.
        if rail.dev.port_downs().1 {
            if !self.port_wait.contains(idx) {
                log::info!("re-admission of the {} rail waits for its port to be active", RAIL_NAMES[idx]);
            }
            self.port_wait = self.port_wait.with(idx);
            return Event::PortDown { rail: idx };
        }
        if self.port_wait.contains(idx) {
            self.port_wait = self.port_wait.without(idx);
            log::info!("the {} rail's port is active again: re-admission goes on", RAIL_NAMES[idx]);
        }
        match rail.rebuild(idx) {
            Ok(records) => Event::QpsBuilt { rail: idx, records },
            Err(e) => {
                self.attempt_failed(idx, format_args!("new QPs: {e}"));
                Event::ReadmitFailed { rail: idx }
            }
        }
    }

    /// [`crate::engine::Action::ConnectQps`]: `None` when connecting (readiness follows in
    /// [`Self::poll_connecting`]), else the failure to feed back.
    pub(super) fn connect<D: Device>(&mut self, rail: &mut Rail<D>, idx: usize, rec: &QpRecords) -> Option<Event> {
        match rail.connect_new(rec) {
            Ok(()) => {
                self.connecting = self.connecting.with(idx);
                None
            }
            Err(e) => {
                self.attempt_failed(idx, format_args!("connecting the new QPs: {e}"));
                Some(Event::ReadmitFailed { rail: idx })
            }
        }
    }

    /// A re-admission attempt of rail `idx` failed: a WARN at most once a minute (the next
    /// says how many were held back), else DEBUG; the attempts go on with their back-off.
    fn attempt_failed(&self, idx: usize, what: std::fmt::Arguments<'_>) {
        match self.warn[idx].admit(Instant::now()) {
            Some(held) => log::warn!(
                "re-admission of the {} rail: {what}; tried again with back-off{}{}",
                RAIL_NAMES[idx],
                crate::ratelimit::suppressed(held),
                self.place.as_ref().map_or(String::new(), |p| p.at(idx).to_string())
            ),
            None => log::debug!("re-admission of the {} rail: {what}", RAIL_NAMES[idx]),
        }
    }

    /// A fence of `idx` ends any connect in progress on it.
    pub(super) fn fenced(&mut self, idx: usize) {
        self.connecting = self.connecting.without(idx);
    }

    /// Polls the rails being connected; `on` gets [`Event::QpsConnected`] or
    /// [`Event::ReadmitFailed`] for each that is done.
    pub(super) fn poll_connecting<D: Device>(
        &mut self,
        rails: &mut [Rail<D>; RAILS],
        mut on: impl FnMut(Event) -> Result<()>,
    ) -> Result<()> {
        for idx in self.connecting.iter() {
            let ev = match rails[idx].new_ready() {
                Ok(false) => continue,
                Ok(true) => Event::QpsConnected { rail: idx },
                Err(e) => {
                    self.attempt_failed(idx, format_args!("the new QPs did not connect: {e}"));
                    Event::ReadmitFailed { rail: idx }
                }
            };
            self.connecting = self.connecting.without(idx);
            on(ev)?;
        }
        Ok(())
    }

    /// The drill dropped the rails of `mask`: they refuse to come back for `ms` (for good
    /// without).
    pub(super) fn refuse_for(&mut self, mask: RailMask, ms: Option<u64>) {
        for r in mask.iter() {
            self.refuse[r] = ms.map_or(Refuse::Forever, |ms| Refuse::Until(Instant::now() + Duration::from_millis(ms)));
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::failover::{CtlKind, CtlMsg};
    use crate::fabric::QP_INFO_LEN;

    fn info(seed: u8) -> QpInfo {
        QpInfo(std::array::from_fn::<u8, QP_INFO_LEN, _>(|i| seed.wrapping_mul(31).wrapping_add(i as u8)))
    }

    #[test]
    fn records_carry_each_qps_varying_bytes_and_the_ports_address() {
        for n in 1..=READMIT_MAX_QPS as usize {
            let infos: Vec<QpInfo> = (0..n as u8).map(info).collect();
            let rec = encode_records(&infos);
            assert_eq!(rec.n as usize, (n * QP_VARYING_LEN + 16).div_ceil(8), "{n} QPs");
            assert!(rec.n as usize <= QP_RECORD_WORDS);
            // Through a control entry, as the peer reads it.
            let msg = CtlMsg::new(CtlKind::Rebuild, 1, 3).with_records(&rec);
            let (msg, _) = CtlMsg::from_words(&msg.to_words(1, 0)).expect("the entry decodes");
            let (varying, address) = decode_records(&msg.records(), n).expect("decodes");
            assert_eq!(address, infos[0].address(), "the port's address (verbs: its GID now)");
            assert_eq!(varying.len(), n);
            for (v, i) in varying.iter().zip(&infos) {
                assert_eq!(*v, i.varying());
            }
            // The peer's set-up info with the new bytes: the new QP's info, whatever the
            // address was at set-up.
            let old = QpInfo([0xee; QP_INFO_LEN]);
            let new = old.with_varying_and_address(&varying[n - 1], &address);
            assert_eq!(new.0[4..16], infos[n - 1].0[4..16], "the last QP's own bytes");
            assert_eq!(new.0[16..32], infos[0].0[16..32], "the port's address");
            assert_eq!(new.0[..4], old.0[..4], "the rest stays the set-up's");
        }
        let sixteen: Vec<QpInfo> = (0..16).map(info).collect();
        assert_eq!(encode_records(&sixteen).n, 26, "16 QPs: 16 x 12 + 16 bytes");
    }

    #[test]
    fn readmission_describes_every_qp_count_the_configuration_accepts() {
        assert_eq!(READMIT_MAX_QPS as u32, MAX_QPS_PER_RAIL);
        let doc = crate::config::VARS.iter().find(|v| v.name == "MPIB_QP").expect("MPIB_QP documented");
        assert_eq!(doc.accepted, format!("1-{MAX_QPS_PER_RAIL}"), "the documented range is the bound");
    }

    #[test]
    fn records_of_another_qp_count_are_refused_with_the_counts() {
        let rec = encode_records(&[info(1), info(2)]);
        let e = decode_records(&rec, 1).unwrap_err();
        assert!(e.msg().contains("hold 5 words; 1 QPs need 4"), "{}", e.msg());
        let e = decode_records(&rec, 4).unwrap_err();
        assert!(e.msg().contains("hold 5 words; 4 QPs need 8"), "{}", e.msg());
        let rec16 = encode_records(&(0..16).map(info).collect::<Vec<_>>());
        let e = decode_records(&rec16, 15).unwrap_err();
        assert!(e.msg().contains("hold 26 words; 15 QPs need 25"), "{}", e.msg());
        assert!(decode_records(&rec16, 0).is_err(), "no QP: nothing to connect");
        // More QPs than an entry describes: refused, not read past the records.
        let full = QpRecords { n: QP_RECORD_WORDS as u8 + 1, words: [1; QP_RECORD_WORDS] };
        assert!(decode_records(&full, 18).is_err());
        assert!(decode_records(&full, 200).is_err());
    }
}
