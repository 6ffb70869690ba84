//! The seeded generator behind everything random a run makes (the data order, the on-policy
//! draws and samples) and the benchmarks' generated corpora: SplitMix64, the same sequence on
//! every machine.

/// SplitMix64; the state is the seed.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Mixes a list of numbers into one seed: the key of a seeded choice at a position (a stream's
/// window order, a sequence's on-policy draw and its sampling).
pub fn mix(parts: &[u64]) -> u64 {
    parts.iter().fold(0x51_7CC1_B727_220A, |h, &p| {
        SplitMix64(h ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
    })
}

/// A uniform number in `[0, 1)` from 64 random bits (their top 53).
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
