//! A port's accepting side: connections taken from the rail's listener, their HELLOs read,
//! each handed to its link; the bounds on what strangers may hold (see `port.rs`).

use super::*;

impl<C: Station> Port<C> {
    /// How long an accepted connection may take to say HELLO.
    fn hello_timeout(&self) -> Duration {
        self.connect_timeout.min(HELLO_TIMEOUT)
    }

    /// Accepts connections and reads their HELLOs; gives each link its socket. Returns
    /// whether work is left (HELLOs incomplete, accepting paused).
    pub fn drive_accept(&self) -> bool {
        let Some(net) = &self.net else { return false };
        let Some(mut a) = net.acceptor.try_lock() else { return true };
        let now = Instant::now();
        match a.paused_until {
            Some(t) if now < t => return true,
            Some(_) => {
                a.paused_until = None;
                net.watcher.listen(true);
            }
            None => {}
        }
        let mut evicted = 0;
        loop {
            match a.listener.accept() {
                Ok((sock, _)) => {
                    if sock.set_nonblocking(true).is_err() || sock.set_nodelay(true).is_err() {
                        continue;
                    }
                    if a.pending.len() == MAX_PENDING {
                        a.pending.pop_front();
                        evicted += 1;
                    }
                    a.pending.push_back(Pending { sock, hdr: [0; HDR_LEN], got: 0, since: now });
                    a.backoff = BACKOFF_FIRST;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ECONNABORTED)) => {}
                Err(e) => {
                    let (name, wait) = (&self.name, a.backoff);
                    self.warn
                        .accept
                        .warn(|| format!("soft fabric {name}: accept failed: {e}; not accepting for {wait:?}"));
                    a.paused_until = Some(now + wait);
                    a.backoff = (wait * 2).min(BACKOFF_MAX);
                    net.watcher.listen(false);
                    break;
                }
            }
        }
        if evicted > 0 {
            let name = &self.name;
            self.warn.hello.warn(|| {
                format!(
                    "soft fabric {name}: {MAX_PENDING} connections waited for their HELLO; closed the oldest {evicted}"
                )
            });
        }
        let (timeout, mut slow) = (self.hello_timeout(), 0);
        let mut i = 0;
        while i < a.pending.len() {
            let p = &mut a.pending[i];
            let keep = match (&p.sock).read(&mut p.hdr[p.got..]) {
                Ok(0) => false,
                Ok(n) => {
                    p.got += n;
                    true
                }
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            };
            if keep && p.got < HDR_LEN {
                if now.duration_since(p.since) < timeout {
                    i += 1;
                    continue;
                }
                slow += 1;
            }
            let p = a.pending.remove(i).expect("in range");
            if p.got == HDR_LEN {
                self.dispatch(&mut a, p.sock, &p.hdr);
            }
        }
        if slow > 0 {
            let name = &self.name;
            self.warn
                .hello
                .warn(|| format!("soft fabric {name}: {slow} connections sent no HELLO in {timeout:?}; closed"));
        }
        !a.pending.is_empty() || a.paused_until.is_some()
    }

    /// An accepted socket said HELLO: it becomes the link from that device.
    fn dispatch(&self, a: &mut Acceptor<C>, sock: TcpStream, hdr: &[u8; HDR_LEN]) {
        let name = &self.name;
        let src_dev = match decode(hdr) {
            Ok(Frame::Hello { dst_dev, src_dev }) if dst_dev == self.dev_id => src_dev,
            Ok(Frame::Hello { .. }) => {
                return self.warn.hello.warn(|| format!("soft fabric {name}: a HELLO for another device; closed"));
            }
            _ => {
                return self
                    .warn
                    .hello
                    .warn(|| format!("soft fabric {name}: a connection did not start with a HELLO; closed"));
            }
        };
        let key = LinkKey { remote: src_dev, dials: false };
        let peer = sock.peer_addr().unwrap_or(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0));
        let fd = OwnedFd::from(sock);
        // Looked up and, if missing, inserted under one lock of the table: a QP's `link_for`
        // may create the awaiting link at the same moment, and a link inserted over it would
        // leave that QP on a link no socket ever comes to (its peer's CONNECT would arrive
        // on this one: "another link than this QP's", and the QP would wait forever).
        let link = loop {
            let (l, created) = {
                let mut t = self.net().links.lock();
                match t.get(&key) {
                    Some(l) => (l.clone(), false),
                    None => {
                        let l = Arc::new(Link::new(key, peer, self.mrs.clone(), self.qps.clone()));
                        t.insert(key, l.clone());
                        (l, true)
                    }
                }
            };
            let mut st = l.lock();
            if st.phase == Phase::Awaiting {
                st.phase = Phase::Up;
                st.since = Instant::now();
                self.adopt(&l, &mut st, fd, false);
                if !created {
                    return;
                }
                drop(st);
                break l;
            }
            // The peer dialed again: it has given up on the link there was.
            self.supersede(&l, &mut st);
        };
        a.orphans.retain(|w| w.upgrade().is_some_and(|l| l.try_lock().is_none_or(|s| !s.used && s.unused())));
        a.orphans.push_back(Arc::downgrade(&link));
        if a.orphans.len() > MAX_ORPHANS
            && let Some(old) = a.orphans.pop_front().and_then(|w| w.upgrade())
        {
            self.warn.hello.warn(|| format!("soft fabric {name}: {MAX_ORPHANS} links carry no QP; closed the oldest"));
            let mut st = old.lock();
            if !st.used && st.unused() {
                self.close(&old, &mut st);
            }
        }
    }
}
