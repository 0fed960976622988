//! A small seeded random number generator, so that a random test replays from its seed.

use std::time::Duration;

use crate::clock::realtime_ns;

/// A small seeded random number generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator that replays the same sequence for the same seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator seeded from the wall clock, for jitter that need not replay.
    pub fn from_clock() -> Rng {
        Rng::new(realtime_ns() as u64)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    /// Uniform in `[lo, hi)` (`lo` itself when `hi <= lo`).
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = u64::try_from(hi.saturating_sub(lo).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        lo + Duration::from_nanos(self.next_u64() % span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_bounds_hold() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        for _ in 0..100 {
            let r = a.range(3, 9);
            assert!((3..9).contains(&r));
            let d = a.duration(Duration::from_millis(2), Duration::from_millis(6));
            assert!(d >= Duration::from_millis(2) && d < Duration::from_millis(6));
        }
        let _ = Rng::from_clock().next_u64();
    }
}
