//! A connected pair of soft devices over loopback for the examples: requester A with a
//! source buffer, responder B with a destination region, B's CQ polled (or not) by a thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpib::fabric::soft::{self, SoftCq, SoftDevice, SoftMr, SoftOptions, SoftQp};
use mpib::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, QpCaps, QueuePair, SendWr, Sge, Timestamps, WcStatus,
    WrOpcode,
};

pub struct Link {
    pub acq: SoftCq,
    pub aqp: SoftQp,
    _bqp: SoftQp,
    bcq: Option<SoftCq>,
    pub src: Vec<u8>,
    pub dst: Vec<u8>,
    mrs: (SoftMr, SoftMr),
    _devs: (Arc<SoftDevice>, Arc<SoftDevice>),
}

/// Two connected soft devices; `size`-byte buffers; `helper_idle`: how long callers must
/// be quiet before the devices' helper threads step in (`soft::HELPER_IDLE` by default).
pub fn link(size: usize, helper_idle: std::time::Duration) -> Link {
    let loopback = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let a = Arc::new(soft::open(&SoftOptions::tcp("a", loopback)).unwrap());
    let b = Arc::new(soft::open(&SoftOptions::tcp("b", loopback)).unwrap());
    a.set_helper_idle(helper_idle);
    b.set_helper_idle(helper_idle);
    let params = ConnectParams { traffic_class: 0, service_level: 0, timeout: 20, retry_cnt: 7 };
    let caps = QpCaps { max_send_wr: 64, max_inline: 0 };
    let (acq, bcq) = (a.create_cq(256, Timestamps::Off).unwrap(), b.create_cq(256, Timestamps::Off).unwrap());
    let mut aqp = a.create_qp(&acq, None, caps).unwrap();
    let mut bqp = b.create_qp(&bcq, None, caps).unwrap();
    let (mut src, mut dst) = (vec![1u8; size], vec![0u8; size]);
    let amr = a.reg_mr(src.as_mut_ptr(), size, Access::LOCAL_WRITE).unwrap();
    let bmr = b.reg_mr(dst.as_mut_ptr(), size, Access::REMOTE_WRITE).unwrap();
    let (ia, ib) = (aqp.local_info(), bqp.local_info());
    aqp.connect(&ib, &params).unwrap();
    bqp.connect(&ia, &params).unwrap();
    while !(aqp.is_ready().unwrap() & bqp.is_ready().unwrap()) {}
    Link { acq, aqp, _bqp: bqp, bcq: Some(bcq), src, dst, mrs: (amr, bmr), _devs: (a, b) }
}

impl Link {
    pub fn wr(&self, len: usize) -> SendWr {
        let mut sge = [Sge::default(); 2];
        sge[0] = Sge { addr: self.src.as_ptr() as u64, len: len as u32, lkey: SoftDevice::mr_keys(&self.mrs.0).lkey };
        SendWr {
            opcode: WrOpcode::Write,
            signaled: true,
            num_sge: 1,
            sge,
            remote_addr: self.dst.as_ptr() as u64,
            rkey: SoftDevice::mr_keys(&self.mrs.1).rkey,
            ..SendWr::default()
        }
    }

    /// Runs `f` while another thread polls the responder's CQ (if `poll`).
    pub fn with_responder<T>(&mut self, poll: bool, f: impl FnOnce(&mut Link) -> T) -> T {
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, mut cq) = (stop.clone(), self.bcq.take().unwrap());
        let t = std::thread::spawn(move || {
            let mut wc = [Completion::default(); 16];
            while !s2.load(Ordering::Relaxed) {
                if poll {
                    cq.poll(&mut wc).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            cq
        });
        let r = f(self);
        stop.store(true, Ordering::Relaxed);
        self.bcq = Some(t.join().unwrap());
        r
    }
}

/// GB/s of `src`-sized signalled WRITEs, 4 outstanding, for `run`.
pub fn bandwidth(l: &mut Link, run: Duration) -> f64 {
    let wr = l.wr(l.src.len());
    let mut wc = [Completion::default(); 16];
    let (mut posted, mut done) = (0usize, 0usize);
    let t = Instant::now();
    while t.elapsed() < run || done < posted {
        while posted - done < 4 && t.elapsed() < run {
            l.aqp.post_send(&[wr]).unwrap();
            posted += 1;
        }
        let n = l.acq.poll(&mut wc).unwrap();
        assert!(wc[..n].iter().all(|c| c.status == WcStatus::Success));
        done += n;
    }
    (done * l.src.len()) as f64 / t.elapsed().as_secs_f64() / 1e9
}
