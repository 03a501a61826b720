//! The bytes of every message: a deterministic pattern from (seed, phase, group, buffer)
//! and the byte offset, so the receiver can check each byte without the sender telling it
//! anything, and a shifted, truncated, reordered or stale message cannot pass. Plus a
//! checksum of the delivered bytes, computed independently on both sides and compared by
//! the parent (an end-to-end check that does not trust the verifier alone).

/// splitmix64's finaliser: a fast 64-bit mixer with full avalanche.
#[inline]
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The pattern key of buffer `buf` of group `group` in phase `phase`.
pub fn key(seed: u64, phase: u32, group: u64, buf: u32) -> u64 {
    mix(seed ^ mix((phase as u64) << 56 ^ group << 4 ^ buf as u64 ^ 0x6d70_6962))
}

/// Word `i` (bytes `8i … 8i+7`, little-endian) of the pattern `key`. Cheap (two multiplies;
/// the loops also run in debug builds, over 600 MiB): `key` is already well mixed, so two
/// messages' sequences would only coincide at an offset of about `key difference / K`
/// words, and the odd multiplier keeps every word of one message distinct.
#[inline(always)]
fn word(key: u64, i: u64) -> u64 {
    let x = key.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^ (x >> 32)
}

/// Running checksum of delivered bytes (FNV-1a over 64-bit words, then the tail).
#[derive(Clone, Copy, Debug)]
struct Sum(u64);

impl Sum {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    fn new(len: usize) -> Sum {
        Sum(0xcbf2_9ce4_8422_2325 ^ len as u64)
    }
    #[inline(always)]
    fn add(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(Self::PRIME);
    }
}

/// Fills `buf` with the pattern `key`; returns the checksum of its first `sum_len` bytes
/// (what the receiver will get when the send is truncated to `sum_len`).
// `as_chunks` (Rust 1.88, which the crate needs anyway for let chains) and a plain counter
// instead of `enumerate` keep these loops fast in debug builds too: 0.6 s instead of 2.8 s
// to fill 512 MiB.
#[allow(clippy::incompatible_msrv, clippy::explicit_counter_loop)]
pub fn fill(buf: &mut [u8], key: u64, sum_len: usize) -> u64 {
    let len = buf.len();
    let sum_len = sum_len.min(len);
    let mut sum = Sum::new(sum_len);
    let full = sum_len / 8;
    let (words, tail) = buf.as_chunks_mut::<8>();
    let (summed, rest) = words.split_at_mut(full.min(words.len()));
    let mut i = 0u64;
    for c in summed {
        let w = word(key, i);
        *c = w.to_le_bytes();
        sum.add(w);
        i += 1;
    }
    for c in rest {
        *c = word(key, i).to_le_bytes();
        i += 1;
    }
    if !tail.is_empty() {
        let w = word(key, (len / 8) as u64).to_le_bytes();
        let n = tail.len();
        tail.copy_from_slice(&w[..n]);
    }
    sum.add(tail_word(&buf[full * 8..sum_len]));
    sum.0
}

fn tail_word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(w)
}

/// What [`verify`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Bytes that differ from the pattern.
    pub wrong: u64,
    /// Offset of the first wrong byte.
    pub first_wrong: Option<usize>,
    /// Offset of the last wrong byte.
    pub last_wrong: Option<usize>,
    /// Wrong 8-byte words that read all zeros (a frame sent as zeros) or all [`CANARY`]
    /// (where the driver put it: not written): what kind of wrong it is.
    pub zero_words: u64,
    pub canary_words: u64,
    /// Checksum of the bytes as received.
    pub sum: u64,
}

/// Compares `buf` with the pattern `key` byte for byte and checksums it.
#[allow(clippy::incompatible_msrv, clippy::explicit_counter_loop)]
pub fn verify(buf: &[u8], key: u64) -> Check {
    let mut sum = Sum::new(buf.len());
    let mut c = Check::default();
    let (words, tail) = buf.as_chunks::<8>();
    let mut i = 0u64;
    for ch in words {
        let got = u64::from_le_bytes(*ch);
        sum.add(got);
        let diff = got ^ word(key, i);
        if diff != 0 {
            c.wrong += diff.to_le_bytes().iter().filter(|&&b| b != 0).count() as u64;
            c.first_wrong.get_or_insert(i as usize * 8 + diff.trailing_zeros() as usize / 8);
            c.last_wrong = Some(i as usize * 8 + 7 - diff.leading_zeros() as usize / 8);
            c.zero_words += (got == 0) as u64;
            c.canary_words += (got == u64::from_ne_bytes([CANARY; 8])) as u64;
        }
        i += 1;
    }
    let base = buf.len() - tail.len();
    let want = word(key, (base / 8) as u64).to_le_bytes();
    for (k, (&g, &w)) in tail.iter().zip(want.iter()).enumerate() {
        if g != w {
            c.wrong += 1;
            c.first_wrong.get_or_insert(base + k);
            c.last_wrong = Some(base + k);
        }
    }
    sum.add(tail_word(tail));
    c.sum = sum.0;
    c
}

/// The byte the driver puts around and beyond the expected data of a receive; a plugin
/// that writes there (past the reported size, or past the posted buffer) is caught.
pub const CANARY: u8 = 0xa5;

/// Offset of the first byte of `buf` that is not [`CANARY`].
pub fn canary_broken(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b != CANARY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_is_clean_and_checksums_agree() {
        for len in [0usize, 1, 7, 8, 9, 127, 128, 129, 4096, 1_048_579] {
            let mut b = vec![0u8; len];
            let k = key(42, 3, 17, 5);
            let s = fill(&mut b, k, len);
            let c = verify(&b, k);
            assert_eq!(c, Check { wrong: 0, first_wrong: None, sum: s, ..Check::default() }, "len {len}");
        }
    }

    #[test]
    fn truncated_checksum_matches_the_received_prefix() {
        let mut b = vec![0u8; 1000];
        let k = key(1, 0, 0, 0);
        let s = fill(&mut b, k, 333);
        assert_eq!(verify(&b[..333], k).sum, s);
        assert_ne!(verify(&b[..334], k).sum, s);
    }

    #[test]
    fn every_kind_of_damage_is_seen() {
        let k = key(7, 0, 9, 1);
        let mut b = vec![0u8; 4099];
        fill(&mut b, k, 4099);
        let good = verify(&b, k);
        // One flipped bit, in a full word and in the tail.
        for off in [0usize, 1234, 4098] {
            let mut d = b.clone();
            d[off] ^= 0x10;
            let c = verify(&d, k);
            assert_eq!((c.wrong, c.first_wrong, c.last_wrong), (1, Some(off), Some(off)));
            assert_ne!(c.sum, good.sum);
        }
        // A run of zeros (a frame sent as zeros) and one never written (the canary): the
        // range and the kind are told.
        let mut d = b.clone();
        d[1024..2048].fill(0);
        d[3000..3016].fill(CANARY);
        let c = verify(&d, k);
        assert_eq!((c.first_wrong, c.last_wrong), (Some(1024), Some(3015)));
        assert_eq!((c.zero_words, c.canary_words), (128, 2), "two whole words each");
        // Another message's bytes (a stale or misrouted buffer), or the same shifted.
        assert!(verify(&b, key(7, 0, 9, 2)).wrong > 4000);
        assert!(verify(&b, key(7, 0, 10, 1)).wrong > 4000);
        assert!(verify(&b[8..], k).wrong > 4000);
    }

    #[test]
    fn canary_scan() {
        assert_eq!(canary_broken(&[CANARY; 10]), None);
        let mut b = [CANARY; 10];
        b[6] = 0;
        assert_eq!(canary_broken(&b), Some(6));
    }
}
