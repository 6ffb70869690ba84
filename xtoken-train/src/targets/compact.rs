//! The compact layout of a stored position's entries: the kept ids sorted and their gaps
//! Rice-coded (a set of `K` ids out of `V` costs about `log₂(V/K) + 1.5` bits an id instead of
//! 32), and each id's value as its depth `d = m − v` below the position's largest value `m`
//! (kept exactly): an exact head and a coarser tail. The head, within [`HEAD_DEPTH`] nats of
//! `m` (where the mass is), takes [`HEAD_BITS`] more bits on a uniform scale (error ≤ 0.0005);
//! the tail a [`VALUE_BITS`]-bit code on a square-law scale from there to the position's
//! smallest value, dense near the head and sparse in the far tail, where a coarse value moves
//! little mass.
//!
//! A block: `m f32 · range f32 · shift f16 · flags u8 · bits`, where `range` is `m` minus the
//! smallest finite value, `shift` is added to every tail value so that the decoded kept mass is
//! the exact one (rounding then moves no mass, only its spread), the flags' low 5 bits are the
//! Rice parameter and bit 7 "some values are −∞" (then the top code stands for −∞), and the
//! bits, least significant first, hold the `K` gaps and then the `K` values in id order: a code
//! `c`, and after a `c = 0` (the head) its fine code.

use burn::tensor::f16;

/// Bits of a value's code.
pub const VALUE_BITS: u32 = 5;
/// The largest code.
const TOP: u32 = (1 << VALUE_BITS) - 1;
/// Bits a head value adds.
pub const HEAD_BITS: u32 = 12;
const FINE: u32 = (1 << HEAD_BITS) - 1;
/// How far below the largest value the head reaches, in nats (`e⁻⁴ ≈ 1.8 %` of its mass).
pub const HEAD_DEPTH: f32 = 4.0;
/// The smallest log-probability in a head: `ln(1/256)`.
pub const HEAD_FLOOR: f32 = -5.545_177;
/// Bytes of a block before its bits.
pub const BLOCK_HEADER: usize = 11;
const NEG_INF: u8 = 0x80;
/// Past every order key (the head's fine codes, then `FINE +` the tail's codes): `KEYS − 1` is a
/// decoded −∞'s key, `KEYS` marks one for the encoder.
const KEYS: usize = (FINE + 1 + TOP) as usize + 1;

/// The scale of a position whose finite values lie within `range` below the largest: the head
/// `[0, h]` and the tail `(h, range]` in `top` codes.
#[derive(Clone, Copy)]
struct Scale {
    head: f32,
    range: f32,
    top: u32,
}

impl Scale {
    /// The scale of a position whose largest value is `largest`: its head ends
    /// [`HEAD_DEPTH`] below it, or where the probabilities drop under [`HEAD_FLOOR`] if that
    /// comes first (a flat distribution's many small entries need no more than the tail's
    /// precision).
    fn new(largest: f32, range: f32, infinite: bool) -> Self {
        let top = if infinite { TOP - 1 } else { TOP };
        let floor = (largest - HEAD_FLOOR).max(0.0);
        Self {
            head: HEAD_DEPTH.min(range).min(floor),
            range,
            top,
        }
    }

    /// The depth of tail code `c ≥ 1`.
    fn tail(self, c: u32) -> f32 {
        let t = c as f32 / self.top as f32;
        self.head + (self.range - self.head) * t * t
    }

    /// The order key of depth `d` (the head's fine code, or past them the tail's code).
    fn key(self, d: f32) -> u32 {
        if d <= self.head || self.range <= self.head || d < self.tail(1) * 0.5 + self.head * 0.5 {
            let fine = if self.head > 0.0 {
                (d / self.head * FINE as f32)
                    .round()
                    .clamp(0.0, FINE as f32)
            } else {
                0.0
            };
            return fine as u32;
        }
        let t = ((d - self.head) / (self.range - self.head)).sqrt() * self.top as f32;
        let below = t.floor().clamp(1.0, self.top as f32) as u32;
        let above = (below + 1).min(self.top);
        let c = if (self.tail(above) - d).abs() < (d - self.tail(below)).abs() {
            above
        } else {
            below
        };
        FINE + c
    }

    /// The depth of order key `key`.
    fn depth(self, key: u32) -> f32 {
        if key <= FINE {
            return self.head * key as f32 / FINE as f32;
        }
        self.tail(key - FINE)
    }
}

/// The largest error of a decoded finite value `d` below a position's `largest` value, whose
/// finite values span `range`: in the head, half a fine step (`h/8190`); in the tail, half the
/// widest step of its scale, `(range − 4)·(2t − 1)/(2t²)` with `t` its codes (30 where a −∞
/// takes the top one), twice over (the mass's shift is a mean of those errors); plus f32
/// rounding.
pub fn error_bound(largest: f32, range: f32, d: f32) -> f32 {
    let head = Scale::new(largest, range, false).head;
    let rounding = range.abs().max(1.0) * f32::EPSILON * 16.0;
    let t = (TOP - 1) as f32;
    let first = (range - head) / (t * t);
    if d <= head + first * 0.5 {
        return (head / (2.0 * FINE as f32)).max(first * 0.5) + rounding;
    }
    (range - head) * (2.0 * t - 1.0) / (t * t) + rounding * 2.0
}

/// Appends the block of one position's entries (`ids` and their `values`, in any order);
/// `order` is scratch.
pub fn encode(ids: &[u32], values: &[f32], order: &mut Vec<u64>, out: &mut Vec<u8>) {
    // By id, as plain words: the id in the high half, the entry's index in the low half.
    order.clear();
    order.extend(
        ids.iter()
            .enumerate()
            .map(|(i, &id)| (u64::from(id) << 32) | i as u64),
    );
    order.sort_unstable();
    let value = |w: u64| values[w as u32 as usize];
    let finite = || values.iter().copied().filter(|v| v.is_finite());
    let largest = finite().fold(f32::NEG_INFINITY, f32::max);
    let smallest = finite().fold(f32::INFINITY, f32::min);
    let (largest, range) = if largest.is_finite() {
        (largest, largest - smallest)
    } else {
        (0.0, 0.0)
    };
    let gaps = || {
        order.iter().scan(-1i64, |last, &w| {
            let id = (w >> 32) as i64;
            let gap = (id - *last - 1) as u64;
            *last = id;
            Some(gap)
        })
    };
    let rice = rice_parameter(gaps(), ids.len());
    let infinite = values.iter().any(|v| !v.is_finite());
    let scale = Scale::new(largest, range, infinite);
    let keys: Vec<u32> = order
        .iter()
        .map(|&w| match value(w) {
            v if v.is_finite() => scale.key(largest - v),
            _ => KEYS as u32,
        })
        .collect();
    let shift = tail_shift(&keys, values, largest, scale);
    out.extend_from_slice(&largest.to_le_bytes());
    out.extend_from_slice(&range.to_le_bytes());
    out.extend_from_slice(&f16::from_f32(shift).to_le_bytes());
    out.push(rice as u8 | if infinite { NEG_INF } else { 0 });
    let mut bits = BitWriter::new(out);
    for gap in gaps() {
        bits.rice(gap, rice);
    }
    for &key in &keys {
        match key {
            k if k >= KEYS as u32 => bits.put(TOP as u64, VALUE_BITS),
            k if k <= FINE => {
                bits.put(0, VALUE_BITS);
                bits.put(k as u64, HEAD_BITS);
            }
            k => bits.put((k - FINE) as u64, VALUE_BITS),
        }
    }
    bits.finish();
}

/// The shift of every tail value that makes the decoded kept mass the exact one: the log of
/// the exact mass less the decoded head's over the decoded tail's (0 without a tail). The
/// tail's decoded mass is summed per code (one `exp` a code, not an entry).
fn tail_shift(keys: &[u32], values: &[f32], largest: f32, scale: Scale) -> f32 {
    let exact: f64 = values
        .iter()
        .filter(|v| v.is_finite())
        .map(|&v| (v - largest).exp() as f64)
        .sum();
    let mut head = 0.0f64;
    let mut per_code = [0u32; (TOP + 1) as usize];
    for &key in keys.iter().filter(|&&key| key < KEYS as u32) {
        match key <= FINE {
            true => head += (-(scale.depth(key) as f64)).exp(),
            false => per_code[(key - FINE) as usize] += 1,
        }
    }
    let tail: f64 = (1..=scale.top)
        .filter(|&c| per_code[c as usize] > 0)
        .map(|c| per_code[c as usize] as f64 * (-(scale.tail(c) as f64)).exp())
        .sum();
    if tail <= 0.0 || exact <= head {
        return 0.0;
    }
    let shift = ((exact - head) / tail).ln() as f32;
    // As f16 holds it, so the encoder's and the decoder's shift agree.
    f16::from_f32(shift).to_f32()
}

/// A decoded block (its entries sorted by id: ids, values and order keys, 0 for the largest
/// and smaller for larger), and the scratch that orders it; kept between blocks so that
/// reading one allocates nothing.
#[derive(Debug)]
pub struct Decoded {
    /// Ids, ascending.
    pub ids: Vec<u32>,
    /// Each id's value.
    pub values: Vec<f32>,
    /// Each id's order key.
    pub keys: Vec<u16>,
    /// The head's entries (their places above), in id order.
    head: Vec<u32>,
    /// Entries per tail code (`−∞`'s last).
    counts: [usize; (TOP + 2) as usize],
}

impl Default for Decoded {
    fn default() -> Self {
        Self {
            ids: Vec::new(),
            values: Vec::new(),
            keys: Vec::new(),
            head: Vec::new(),
            counts: [0; (TOP + 2) as usize],
        }
    }
}

impl Decoded {
    /// Decodes the `n` entries of `block` in place of what this held.
    pub fn read(&mut self, block: &[u8], n: usize) {
        self.ids.clear();
        self.values.clear();
        self.keys.clear();
        self.head.clear();
        self.counts = [0; (TOP + 2) as usize];
        if block.len() < BLOCK_HEADER {
            return;
        }
        let word = |at: usize| {
            f32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
        };
        let (largest, range) = (word(0), word(4));
        let shift = f16::from_le_bytes([block[8], block[9]]).to_f32();
        let flags = block[10];
        let rice = (flags & 0x1f) as u32;
        let scale = Scale::new(largest, range, flags & NEG_INF != 0);
        let mut bits = BitReader::new(&block[BLOCK_HEADER..]);
        self.ids.resize(n, 0);
        self.values.resize(n, f32::NEG_INFINITY);
        self.keys.resize(n, (KEYS - 1) as u16);
        let mut last = -1i64;
        for id in &mut self.ids {
            last += bits.rice(rice) as i64 + 1;
            *id = last.clamp(0, u32::MAX as i64) as u32;
        }
        // Every code's value, once a block: the head's first (the largest, exact), the tail's
        // square law with the shift.
        let mut tail = [f32::NEG_INFINITY; (TOP + 1) as usize];
        for c in 1..=scale.top {
            tail[c as usize] = largest - scale.depth(FINE + c) + shift;
        }
        let entries = self.values.iter_mut().zip(&mut self.keys);
        for (j, (value, key)) in entries.enumerate() {
            match bits.take(VALUE_BITS) as u32 {
                0 => {
                    let fine = bits.take(HEAD_BITS) as u32;
                    *key = fine as u16;
                    *value = match fine {
                        0 => largest,
                        f => largest - scale.depth(f),
                    };
                    self.head.push(j as u32);
                }
                c if c > scale.top => self.counts[TOP as usize + 1] += 1,
                c => {
                    *key = (FINE + c) as u16;
                    *value = tail[c as usize];
                    self.counts[c as usize] += 1;
                }
            }
        }
    }

    /// The best `ids.len()` entries (at most all), best first (ties: the smaller id), into
    /// `ids` and `values`: the head (few entries) sorted by its fine codes, then the tail by a
    /// counting sort on its codes (counted as it was read). Slots past the block's entries are
    /// left as they are.
    pub fn best_first(&mut self, ids: &mut [u32], values: &mut [f32]) {
        let k = ids.len().min(values.len()).min(self.keys.len());
        let keys = &self.keys;
        // Stable: equal codes keep the ids' order.
        self.head.sort_by_key(|&j| keys[j as usize]);
        for (at, &j) in self.head.iter().take(k).enumerate() {
            ids[at] = self.ids[j as usize];
            values[at] = self.values[j as usize];
        }
        if self.head.len() >= k {
            return;
        }
        let mut start = [0usize; (TOP + 2) as usize];
        let mut sum = self.head.len();
        for (s, &count) in start.iter_mut().zip(&self.counts).skip(1) {
            *s = sum;
            sum += count;
        }
        let entries = keys.iter().zip(&self.ids).zip(&self.values);
        for ((&c, &id), &v) in entries.filter(|e| *e.0 .0 as u32 > FINE) {
            let at = &mut start[(c as u32 - FINE) as usize];
            if *at < k {
                ids[*at] = id;
                values[*at] = v;
            }
            *at += 1;
        }
    }
}

/// The Rice parameter that codes `gaps` in the fewest bits (near `log₂` of the mean gap).
fn rice_parameter(gaps: impl Iterator<Item = u64> + Clone, n: usize) -> u32 {
    if n == 0 {
        return 0;
    }
    let mean = gaps.clone().sum::<u64>() as f64 / n as f64;
    let guess = (mean * std::f64::consts::LN_2).max(1.0).log2().floor() as i64;
    let cost = |r: u32| gaps.clone().map(|g| (g >> r) + 1 + r as u64).sum::<u64>();
    (guess - 1..=guess + 1)
        .filter(|&r| (0..=24).contains(&r))
        .map(|r| r as u32)
        .min_by_key(|&r| cost(r))
        .unwrap_or(0)
}

/// Bits appended least significant first.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    used: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        Self {
            out,
            acc: 0,
            used: 0,
        }
    }

    /// The low `n ≤ 32` bits of `v`.
    fn put(&mut self, v: u64, n: u32) {
        self.acc |= (v & ((1u64 << n) - 1)) << self.used;
        self.used += n;
        while self.used >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.used -= 8;
        }
    }

    /// `g >> r` ones, a zero, then the low `r` bits of `g`.
    fn rice(&mut self, g: u64, r: u32) {
        let mut q = g >> r;
        while q >= 32 {
            self.put(u32::MAX as u64, 32);
            q -= 32;
        }
        self.put((1u64 << q) - 1, q as u32 + 1);
        self.put(g, r);
    }

    fn finish(self) {
        if self.used > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

/// Bits read least significant first through a 64-bit buffer, topped up eight bytes at a
/// time; past the end they read as zero.
struct BitReader<'a> {
    bytes: &'a [u8],
    /// The next byte to load.
    next: usize,
    buf: u64,
    /// Bits of `buf` that are the stream's next ones (those above are its following bits or
    /// zero).
    avail: u32,
}

impl<'a> BitReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        let mut reader = Self {
            bytes,
            next: 0,
            buf: 0,
            avail: 0,
        };
        reader.refill();
        reader
    }

    /// Tops the buffer up to 56 bits or more.
    #[inline]
    fn refill(&mut self) {
        let word = match self.bytes.get(self.next..self.next + 8) {
            Some(&[a, b, c, d, e, f, g, h]) => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
            _ => {
                let mut b = [0u8; 8];
                let rest = self.bytes.get(self.next..).unwrap_or(&[]);
                let n = rest.len().min(8);
                b[..n].copy_from_slice(&rest[..n]);
                u64::from_le_bytes(b)
            }
        };
        self.buf |= word << self.avail;
        let added = (63 - self.avail) / 8;
        self.next += added as usize;
        self.avail += 8 * added;
    }

    /// The next `n ≤ 32` bits.
    #[inline]
    fn take(&mut self, n: u32) -> u64 {
        if self.avail < n {
            self.refill();
        }
        let v = self.buf & ((1u64 << n) - 1);
        self.buf >>= n;
        self.avail -= n;
        v
    }

    /// A Rice code of parameter `r ≤ 24`: ones, a zero, then `r` bits.
    #[inline]
    fn rice(&mut self, r: u32) -> u64 {
        if self.avail < 56 {
            self.refill();
        }
        let ones = (!self.buf).trailing_zeros();
        if ones + 1 + r <= self.avail {
            self.buf >>= ones + 1;
            self.avail -= ones + 1;
            let low = self.buf & ((1u64 << r) - 1);
            self.buf >>= r;
            self.avail -= r;
            return ((ones as u64) << r) | low;
        }
        // A run of ones longer than the buffer: counted a buffer at a time.
        let mut q = 0u64;
        loop {
            let ones = (!self.buf).trailing_zeros().min(self.avail);
            q += ones as u64;
            self.buf >>= ones;
            self.avail -= ones;
            if self.avail > 0 || self.next >= self.bytes.len() {
                break;
            }
            self.refill();
        }
        self.take(1);
        (q << r) | self.take(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any set of ids and values decodes to the same ids, the largest value exactly, every
        /// finite value within its bound, −∞ as −∞, and `best_first` orders them by value.
        #[test]
        fn blocks_round_trip_within_the_bound(
            picks in proptest::collection::btree_set(0u32..200_000, 1..300),
            seed in 0u64..1000,
            infinite in proptest::bool::ANY,
        ) {
            let ids: Vec<u32> = picks.into_iter().rev().collect();
            let mut values: Vec<f32> = (0..ids.len())
                .map(|j| -0.3 - ((j as u64 * 2654435761 + seed) % 1000) as f32 * 0.017)
                .collect();
            if infinite && values.len() > 1 {
                let last = values.len() - 1;
                values[last] = f32::NEG_INFINITY;
            }
            let mut block = Vec::new();
            encode(&ids, &values, &mut Vec::new(), &mut block);
            let mut decoded = Decoded::default();
            decoded.read(&block, ids.len());
            let (got_ids, got) = (decoded.ids.clone(), decoded.values.clone());
            let finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
            let max = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = finite.iter().copied().fold(f32::INFINITY, f32::min);
            let bound = |v: f32| error_bound(max, max - min, max - v);
            let mut sorted: Vec<(u32, f32)> = ids.iter().copied().zip(values.iter().copied()).collect();
            sorted.sort_by_key(|p| p.0);
            prop_assert_eq!(&got_ids, &sorted.iter().map(|p| p.0).collect::<Vec<_>>());
            for ((_, v), g) in sorted.iter().zip(&got) {
                if v.is_finite() {
                    prop_assert!((v - g).abs() <= bound(*v), "{} vs {} (bound {})", v, g, bound(*v));
                    if *v == max { prop_assert_eq!(*g, max); }
                } else {
                    prop_assert_eq!(*g, f32::NEG_INFINITY);
                }
            }
            let k = ids.len().div_ceil(2);
            let (mut best_ids, mut best) = (vec![0u32; k], vec![0f32; k]);
            decoded.best_first(&mut best_ids, &mut best);
            prop_assert!(best.windows(2).all(|w| w[0] >= w[1]));
            prop_assert_eq!(best[0], max);
            // The first `k` by order key, ties to the smaller id, as a full sort has them.
            let mut by_key: Vec<(u16, u32)> = decoded.keys.iter().copied().zip(got_ids.iter().copied()).collect();
            by_key.sort_unstable();
            prop_assert_eq!(best_ids, by_key[..k].iter().map(|e| e.1).collect::<Vec<_>>());
        }
    }

    /// A gap whose unary part is longer than the reader's buffer (one far id after many near
    /// ones) decodes, and so do the ids after it.
    #[test]
    fn long_unary_runs_decode() {
        let mut ids: Vec<u32> = (0..200).collect();
        ids.extend([150_000, 150_001, 199_999]);
        let values: Vec<f32> = (0..ids.len()).map(|j| -1.0 - j as f32 * 0.01).collect();
        let mut block = Vec::new();
        encode(&ids, &values, &mut Vec::new(), &mut block);
        let mut decoded = Decoded::default();
        decoded.read(&block, ids.len());
        assert_eq!(decoded.ids, ids);
        let mut again = Decoded::default();
        again.read(&block[..block.len() - 1], ids.len());
        assert_eq!(
            again.ids[..200],
            ids[..200],
            "a cut block reads what it holds"
        );
    }

    /// Ids spread evenly over a vocabulary cost close to the entropy of the set.
    #[test]
    fn sorted_ids_cost_near_their_entropy() {
        let (v, k) = (151_680u32, 128usize);
        let ids: Vec<u32> = (0..k as u64)
            .map(|i| (i * 2_654_435_761 % v as u64) as u32)
            .collect();
        let values = vec![-1.0f32; k];
        let mut block = Vec::new();
        encode(&ids, &values, &mut Vec::new(), &mut block);
        let id_bits = (block.len() - BLOCK_HEADER) as f64 * 8.0
            - (k as f64 * (VALUE_BITS + HEAD_BITS) as f64);
        let per_id = id_bits / k as f64;
        let entropy = (v as f64 / k as f64).log2() + std::f64::consts::LOG2_E;
        assert!(
            per_id < entropy + 0.6,
            "{per_id} bits an id, entropy {entropy}"
        );
    }
}
