//! [`SplitMix64`], the one seeded generator of the workspace: backoff
//! jitter ([`wrap::RetryStore`](crate::wrap::RetryStore)), fault decisions
//! ([`wrap::FaultStore`](crate::wrap::FaultStore)), and test or benchmark
//! data in the crates above. Deterministic for a seed, so a failing run
//! replays; not for secrets.

/// SplitMix64 (Steele, Lea, Flood 2014): one `u64` of state, full period,
/// good enough statistics for backoff jitter, fault rates and synthetic data.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (clamped to `[0, 1]`). Always draws, so the
    /// sequence of draws does not depend on the rates.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p.clamp(0.0, 1.0)
    }

    /// A uniform value in `[0, n]` (0 when `n` is 0).
    pub fn up_to(&mut self, n: u64) -> u64 {
        let x = self.next_u64();
        match n.checked_add(1) {
            Some(m) => x % m,
            None => x,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let mut c = SplitMix64::new(8);
        let va: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let vc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        let hits = (0..10_000).filter(|_| a.chance(0.3)).count();
        assert!((2_700..3_300).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| a.up_to(5) <= 5));
    }
}
