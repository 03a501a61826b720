//! The data chains in flight on a rail, oldest first, in a fixed ring (no allocation).
//!
//! The split needs to know how far the rail has got with what it holds. Bytes in flight
//! alone drop a whole chain at a time, at its completion: between two completions the
//! rail looks up to one chain fuller than it is, and with chains of hundreds of KiB that
//! staircase is worth a large part of a send. Knowing the oldest chain (the one on the
//! wire on a FIFO rail) bounds how much progress since the last completion is plausible.

/// More chains than NCCL keeps in flight on one connection (at most 32 requests).
const CAPACITY: usize = 64;

/// What a chain found on its rail when it was posted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Occupancy {
    /// Behind other chains: its RTT includes a queue.
    #[default]
    Queued,
    /// Posted on an idle rail: its RTT is latency and its own serialization only (a
    /// base-latency sample).
    Alone,
}

/// One chain in flight, with what was expected of it when it was posted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub posted_ns: u64,
    pub bytes: u64,
    /// Expected wait (ns) before the rail would start on it: the queue it joined.
    pub wait_ns: u64,
    pub occupancy: Occupancy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InflightChains {
    ring: [Chain; CAPACITY],
    head: usize,
    len: usize,
}

impl Default for InflightChains {
    fn default() -> Self {
        InflightChains { ring: [Chain::default(); CAPACITY], head: 0, len: 0 }
    }
}

impl InflightChains {
    /// A chain was posted. Beyond the capacity it is not tracked (the oldest ones are,
    /// and those are what [`oldest_bytes`](Self::oldest_bytes) reports).
    #[inline]
    pub fn push(&mut self, chain: Chain) {
        if self.len < CAPACITY {
            self.ring[(self.head + self.len) % CAPACITY] = chain;
            self.len += 1;
        }
    }

    /// The chain posted at `posted_ns` carrying `bytes` completed (or was abandoned):
    /// usually the oldest; otherwise (completions out of order across QPs) found and
    /// removed where it is.
    #[inline]
    pub fn remove(&mut self, posted_ns: u64, bytes: u64) -> Option<Chain> {
        self.remove_where(|c| c.posted_ns == posted_ns && c.bytes == bytes)
    }

    /// Removes the oldest chain of `bytes` (an abandoned chain, known by its size only).
    pub fn remove_bytes(&mut self, bytes: u64) -> Option<Chain> {
        self.remove_where(|c| c.bytes == bytes)
    }

    fn remove_where(&mut self, matches: impl Fn(&Chain) -> bool) -> Option<Chain> {
        let i = (0..self.len).find(|&i| matches(&self.ring[(self.head + i) % CAPACITY]))?;
        let found = self.ring[(self.head + i) % CAPACITY];
        if i == 0 {
            self.head = (self.head + 1) % CAPACITY;
        } else {
            for j in i..self.len - 1 {
                self.ring[(self.head + j) % CAPACITY] = self.ring[(self.head + j + 1) % CAPACITY];
            }
        }
        self.len -= 1;
        Some(found)
    }

    /// Bytes of the oldest chain in flight, 0 when none.
    #[inline]
    pub fn oldest_bytes(&self) -> u64 {
        if self.len == 0 { 0 } else { self.ring[self.head].bytes }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(posted_ns: u64, bytes: u64) -> Chain {
        let occupancy = if posted_ns == 0 { Occupancy::Alone } else { Occupancy::Queued };
        Chain { posted_ns, bytes, wait_ns: posted_ns / 2, occupancy }
    }

    #[test]
    fn fifo_completions_pop_the_oldest() {
        let mut f = InflightChains::default();
        assert_eq!(f.oldest_bytes(), 0);
        for i in 0..5 {
            f.push(chain(i * 10, 100 + i));
        }
        assert_eq!(f.remove(0, 100), Some(chain(0, 100)));
        assert_eq!((f.oldest_bytes(), f.len()), (101, 4));
        // Out of order: the third completes first.
        assert_eq!(f.remove(30, 103).map(|c| c.wait_ns), Some(15));
        assert_eq!((f.oldest_bytes(), f.len()), (101, 3));
        f.remove(10, 101);
        f.remove(20, 102);
        assert_eq!(f.oldest_bytes(), 104);
        f.remove_bytes(104);
        assert_eq!((f.oldest_bytes(), f.len()), (0, 0));
        assert_eq!(f.remove(99, 99), None, "unknown: ignored");
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn wraps_around_and_ignores_overflow() {
        let mut f = InflightChains::default();
        for round in 0..3u64 {
            for i in 0..CAPACITY as u64 + 5 {
                f.push(chain(round * 1000 + i, i + 1));
            }
            assert_eq!(f.len(), CAPACITY);
            for i in 0..CAPACITY as u64 {
                assert_eq!(f.oldest_bytes(), i + 1);
                f.remove(round * 1000 + i, i + 1);
            }
            assert_eq!(f.len(), 0);
        }
    }
}
