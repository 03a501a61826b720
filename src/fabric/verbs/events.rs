//! Asynchronous events of a device (port down/up, GID table change, QP fatal, device fatal):
//! one thread per opened device sleeps in `poll(2)` on the context's async fd and an eventfd
//! that stops it; it wakes only when the kernel has an event, logs it, records port/device
//! health and acknowledges it. It never spins.
//!
//! A DEVICE_FATAL counts as the port going down for good (the device must be reopened,
//! which mpib does not do): every rail on the device fails at once, and re-admission waits
//! for a port that never comes back. A GID_CHANGE or PORT_ACTIVE on the port marks its GID
//! for re-reading before the next QP is made (`device.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use rdma_mummy_sys as ibv;

use super::sys::{self, RawAsyncEvent};

/// What the event thread learnt, readable from any thread without a lock.
#[derive(Debug)]
pub struct Health {
    pub port_active: AtomicBool,
    /// PORT_ERR events on this port so far.
    pub port_downs: AtomicU64,
    pub device_fatal: AtomicBool,
    /// GID_CHANGE and PORT_ACTIVE events on this port so far: the GID table may differ from
    /// what was read before the last one.
    pub gid_events: AtomicU64,
    /// Events seen so far (all kinds).
    pub events: AtomicU64,
    /// QP errors (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR) seen so far.
    pub qp_errors: AtomicU64,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` events seen so far.
    pub last_wqe_events: AtomicU64,
    /// A fence waited for a `LAST_WQE_REACHED` that did not come: the device does not raise
    /// it (Soft-RoCE on Linux 6.1 does not), so later fences do not wait for it.
    pub last_wqe_missing: AtomicBool,
    /// QPs whose fence waits for their `LAST_WQE_REACHED` (QP number → seen): only those a
    /// fence is waiting on, so the map stays as small as the failovers in progress.
    last_wqe: Mutex<HashMap<u32, Arc<AtomicBool>>>,
}

impl Health {
    pub fn new() -> Health {
        Health {
            port_active: AtomicBool::new(true),
            port_downs: AtomicU64::new(0),
            device_fatal: AtomicBool::new(false),
            gid_events: AtomicU64::new(0),
            events: AtomicU64::new(0),
            qp_errors: AtomicU64::new(0),
            last_wqe_events: AtomicU64::new(0),
            last_wqe_missing: AtomicBool::new(false),
            last_wqe: Mutex::new(HashMap::new()),
        }
    }

    /// Registers QP `qpn` as waiting for its `LAST_WQE_REACHED` (before it is moved to the
    /// error state, so the event cannot come first); the flag turns true when it arrives.
    pub fn expect_last_wqe(&self, qpn: u32) -> Arc<AtomicBool> {
        let seen = Arc::new(AtomicBool::new(false));
        self.last_wqe.lock().insert(qpn, seen.clone());
        seen
    }

    /// QP `qpn` waits no more.
    pub fn forget_last_wqe(&self, qpn: u32) {
        self.last_wqe.lock().remove(&qpn);
    }

    /// Whether the port is down: a PORT_ERR not followed by PORT_ACTIVE, or DEVICE_FATAL.
    pub fn port_down(&self) -> bool {
        !self.port_active.load(Ordering::Acquire) || self.device_fatal.load(Ordering::Acquire)
    }

    fn on_last_wqe(&self, qpn: u32) {
        self.last_wqe_events.fetch_add(1, Ordering::Relaxed);
        if let Some(seen) = self.last_wqe.lock().get(&qpn) {
            seen.store(true, Ordering::Release);
        }
    }
}

/// The running thread; stopped and joined on drop.
pub struct EventThread {
    stop_fd: i32,
    handle: Option<JoinHandle<()>>,
}

/// The context pointer, handed to the thread. The context outlives the thread: `Ctx`
/// drops (stops and joins) the thread before it closes the device.
struct SendCtx(*mut ibv::ibv_context);
// SAFETY: ibv_get_async_event/ibv_ack_async_event may be called from any thread.
unsafe impl Send for SendCtx {}

impl EventThread {
    /// Starts the thread for `ctx` (port `port` of device `label`).
    pub fn start(
        ctx: *mut ibv::ibv_context,
        label: String,
        port: u8,
        health: Arc<Health>,
    ) -> std::io::Result<EventThread> {
        // SAFETY: plain syscall; the fd is owned by the EventThread and closed in Drop.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop_fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: ctx is open; async_fd is its event fd. Non-blocking lets the thread drain
        // every queued event after one wake-up (ibv_get_async_event then fails with EAGAIN).
        let async_fd = unsafe { (*ctx).async_fd };
        // SAFETY: fcntl on a valid fd.
        unsafe {
            let fl = libc::fcntl(async_fd, libc::F_GETFL);
            libc::fcntl(async_fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let sctx = SendCtx(ctx);
        let spawned = std::thread::Builder::new().name("mpib-ibv-async".into()).spawn(move || {
            let sctx = sctx;
            run(sctx.0, async_fd, stop_fd, &label, port, &health)
        });
        match spawned {
            Ok(h) => Ok(EventThread { stop_fd, handle: Some(h) }),
            Err(e) => {
                // SAFETY: closing the fd created above, once.
                unsafe { libc::close(stop_fd) };
                Err(e)
            }
        }
    }
}

impl Drop for EventThread {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our own eventfd.
        unsafe { libc::write(self.stop_fd, (&one as *const u64).cast(), 8) };
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        // SAFETY: the thread has exited; the fd is closed once.
        unsafe { libc::close(self.stop_fd) };
    }
}

fn run(ctx: *mut ibv::ibv_context, async_fd: i32, stop_fd: i32, label: &str, port: u8, health: &Health) {
    loop {
        let mut fds = [
            libc::pollfd { fd: async_fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop_fd, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two valid pollfds; sleeps in the kernel until one is ready.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            log::warn!("{label}: async event thread stops: poll: {}", sys::strerror(sys::errno()));
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            // Would wake at once forever: stop instead of spinning.
            log::warn!("{label}: async event fd reports an error ({:#x}); no more async events", fds[0].revents);
            return;
        }
        loop {
            let mut ev = RawAsyncEvent { element: 0, event_type: 0 };
            // SAFETY: RawAsyncEvent has ibv_async_event's layout; ctx is open.
            let ret = unsafe { ibv::ibv_get_async_event(ctx, (&mut ev as *mut RawAsyncEvent).cast()) };
            if ret != 0 {
                break; // EAGAIN: drained
            }
            report(&ev, label, port, health);
            // SAFETY: acknowledging the event just read, once.
            unsafe { ibv::ibv_ack_async_event((&mut ev as *mut RawAsyncEvent).cast()) };
        }
    }
}

/// `ibv_event_type_str` for known event numbers.
fn event_name(t: u32) -> String {
    if t <= ibv::ibv_event_type::IBV_EVENT_DEVICE_SPEED_CHANGE as u32 {
        // SAFETY: t is in the range of the enum's declared values, so the transmute yields a
        // valid variant; the function returns a static string or NULL.
        let name =
            unsafe { sys::c_str(ibv::ibv_event_type_str(std::mem::transmute::<u32, ibv::ibv_event_type>(t)), "") };
        if !name.is_empty() {
            return name.to_string();
        }
    }
    format!("event {t}")
}

fn report(ev: &RawAsyncEvent, label: &str, port: u8, health: &Health) {
    use ibv::ibv_event_type as e;
    health.events.fetch_add(1, Ordering::Relaxed);
    let name = event_name(ev.event_type);
    let t = ev.event_type;
    let qp_num = || {
        // SAFETY: for QP events the element is the ibv_qp, valid until the event is acked.
        if ev.element == 0 { 0 } else { unsafe { (*(ev.element as *const ibv::ibv_qp)).qp_num } }
    };
    let event_port = ev.element as u32 as i32; // element.port_num for port events
    if t == e::IBV_EVENT_PORT_ERR as u32 {
        if event_port == port as i32 {
            health.port_active.store(false, Ordering::Release);
            health.port_downs.fetch_add(1, Ordering::Release);
        }
        log::warn!("{label}: async event {name} on port {event_port}: the link is down");
    } else if t == e::IBV_EVENT_PORT_ACTIVE as u32 {
        if event_port == port as i32 {
            // The GID table may have been rebuilt while the link was down (mlx5 re-adds its
            // RoCE GIDs, sometimes at other indexes).
            health.gid_events.fetch_add(1, Ordering::Release);
            health.port_active.store(true, Ordering::Release);
        }
        log::info!("{label}: async event {name} on port {event_port}: the link is up");
    } else if t == e::IBV_EVENT_GID_CHANGE as u32 {
        if event_port == port as i32 {
            health.gid_events.fetch_add(1, Ordering::Release);
        }
        log::info!(
            "{label}: async event {name} on port {event_port}: the GID table changed; re-read before the next QP"
        );
    } else if t == e::IBV_EVENT_QP_FATAL as u32
        || t == e::IBV_EVENT_QP_REQ_ERR as u32
        || t == e::IBV_EVENT_QP_ACCESS_ERR as u32
    {
        health.qp_errors.fetch_add(1, Ordering::Relaxed);
        log::warn!("{label}: async event {name} on QP {}: the QP is in the error state", qp_num());
    } else if t == e::IBV_EVENT_QP_LAST_WQE_REACHED as u32 {
        // Every SRQ-attached QP raises it once in the error state: a fence waits for it
        // (`qp.rs`), a closing QP's is routine (not worth a line per connection).
        health.on_last_wqe(qp_num());
        log::debug!("{label}: async event {name} on QP {}", qp_num());
    } else if t == e::IBV_EVENT_DEVICE_FATAL as u32 {
        // Before the down count: a reader that sees the count move sees the port down.
        health.device_fatal.store(true, Ordering::Release);
        health.port_downs.fetch_add(1, Ordering::Release);
        log::warn!("{label}: async event {name}: the device must be reopened; every rail on it fails now");
    } else if t == e::IBV_EVENT_CQ_ERR as u32 || t == e::IBV_EVENT_SRQ_ERR as u32 {
        log::warn!("{label}: async event {name}");
    } else {
        log::info!("{label}: async event {name}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibv::ibv_event_type as e;

    fn ev(t: ibv::ibv_event_type, port: usize) -> RawAsyncEvent {
        RawAsyncEvent { element: port, event_type: t as u32 }
    }

    #[test]
    fn device_fatal_is_the_port_down_for_good() {
        let h = Health::new();
        report(&ev(e::IBV_EVENT_DEVICE_FATAL, 0), "mlx5_0:1", 1, &h);
        assert_eq!(h.port_downs.load(Ordering::Acquire), 1, "the rails on it see a port-down at once");
        assert!(h.port_down());
        // A PORT_ACTIVE after it does not bring the device back: it must be reopened.
        report(&ev(e::IBV_EVENT_PORT_ACTIVE, 1), "mlx5_0:1", 1, &h);
        assert!(h.port_down());
    }

    #[test]
    fn port_events_of_this_port_move_the_health_and_the_gid_generation() {
        let h = Health::new();
        assert!(!h.port_down());
        report(&ev(e::IBV_EVENT_PORT_ERR, 2), "mlx5_0:1", 1, &h);
        assert_eq!((h.port_downs.load(Ordering::Acquire), h.port_down()), (0, false), "another port's event");
        report(&ev(e::IBV_EVENT_PORT_ERR, 1), "mlx5_0:1", 1, &h);
        assert_eq!((h.port_downs.load(Ordering::Acquire), h.port_down()), (1, true));
        report(&ev(e::IBV_EVENT_PORT_ACTIVE, 1), "mlx5_0:1", 1, &h);
        assert!(!h.port_down());
        assert_eq!(h.gid_events.load(Ordering::Acquire), 1, "PORT_ACTIVE: the GID is read again");
        report(&ev(e::IBV_EVENT_GID_CHANGE, 1), "mlx5_0:1", 1, &h);
        report(&ev(e::IBV_EVENT_GID_CHANGE, 2), "mlx5_0:1", 1, &h);
        assert_eq!(h.gid_events.load(Ordering::Acquire), 2, "GID_CHANGE of this port only");
        assert_eq!(h.events.load(Ordering::Relaxed), 5);
    }
}
