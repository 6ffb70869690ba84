//! The compact layout of a stored position's entries. Each entry's value is its depth
//! `d = m − v` below the position's largest value `m` (kept exactly), rounded to a bucket: the
//! head, within [`HEAD_DEPTH`] nats of `m` (where the mass is), on a uniform scale of
//! [`HEAD_BITS`] bits (error ≤ 0.0005); the tail in [`VALUE_BITS`]-bit codes on a square-law
//! scale from there to the position's smallest value, dense near the head and sparse in the far
//! tail, where a coarse value moves little mass.
//!
//! The entries are stored bucket by bucket in the order training reads them — the head, the
//! tail's codes from the shallowest, then −∞ — and within a bucket by id, the ids' gaps
//! Rice-coded. A bucket of `k` ids spread evenly over `V` costs about `log₂(V/k) + 1.5` bits an
//! id and its code costs only its count, so the layout is no larger than ids sorted once with a
//! code an entry; and a reader writes each entry straight to its place as it decodes it, with no
//! sort, and stops once it has the entries it needs. Where a vocabulary's ids follow its tokens'
//! frequency (BPE merges are numbered in the order they were learned), a teacher's kept ids are
//! denser among the small ones; a block then scales each gap's Rice parameter with the previous
//! id's bit length, and such ids cost fewer bits than spread evenly.
//!
//! A block: `m f32 · range f32 · shift f16 · flags u8 · bits`, where `range` is `m` minus the
//! smallest finite value, `shift` is added to every tail value so that the decoded kept mass is
//! the exact one (rounding then moves no mass, only its spread), and the flags' low 5 bits are
//! `s`, the bit length of the largest id, bits 5–6 `δ + 2`, the Rice parameters' correction,
//! and bit 7 "some values are −∞" (then the top bucket holds them). The bits, least significant
//! first: whether the parameters are scaled; the counts of every bucket but the top one
//! (Elias-gamma codes of count + 1; the top bucket holds the rest of `K`); then each bucket's id
//! gaps, Rice-coded with parameter `s − bitlen(count) + δ` (the order of the mean gap of ids
//! spread below `2^s`) or, scaled, that for a bucket's first id and `bitlen(previous id + 1) −
//! bitlen(count) + bitlen(s − bitlen(first id)) − 2 + δ` for the others, the head's followed by
//! their fine codes. In a store whose ids are packed ([`IdCode::Packed`]), a bucket's gaps come
//! in groups of [`GROUP`] first — each its width `w` in 6 bits, then from the next byte its
//! gaps in `w` bits apiece — and only its last fewer than [`GROUP`] are Rice-coded.

use burn::tensor::f16;

/// Bits of a tail value's code.
pub const VALUE_BITS: u32 = 5;
/// The largest code.
const TOP: u32 = (1 << VALUE_BITS) - 1;
/// Buckets of a block: the head, the tail's codes, the top one −∞ where a value is.
const BUCKETS: usize = TOP as usize + 1;
/// Bits of a head value's fine code.
pub const HEAD_BITS: u32 = 12;
const FINE: u32 = (1 << HEAD_BITS) - 1;
/// How far below the largest value the head reaches, in nats (`e⁻⁴ ≈ 1.8 %` of its mass).
pub const HEAD_DEPTH: f32 = 4.0;
/// The smallest log-probability in a head: `ln(1/256)`.
pub const HEAD_FLOOR: f32 = -5.545_177;
/// Bytes of a block before its bits.
pub const BLOCK_HEADER: usize = 11;
const NEG_INF: u8 = 0x80;
/// The order key the encoder gives a −∞ (past every head fine code and tail code).
const INFINITE_KEY: u32 = FINE + 1 + TOP;
/// The largest Rice parameter.
const MAX_RICE: i32 = 24;
/// Gaps a packed group holds.
pub const GROUP: usize = 32;

/// How a block codes the ids of a bucket (a store's choice, `teach.dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdCode {
    /// Every gap Rice-coded: the fewest bits.
    #[default]
    Rice,
    /// A bucket's gaps in groups of [`GROUP`], each bit-packed at the width of its largest (the
    /// last fewer than [`GROUP`] Rice-coded): about 1.2 bits an id more than Rice where buckets
    /// hold hundreds of ids, but a reader finds every gap of a group at a fixed offset, with no
    /// gap waiting on the one before it to know where it starts, and reads ~3× faster.
    Packed,
}

impl IdCode {
    /// How many of a bucket's `count` gaps are packed.
    fn grouped(self, count: usize) -> usize {
        match self {
            Self::Rice => 0,
            Self::Packed => count / GROUP * GROUP,
        }
    }
}

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

    /// The order key of depth `d` (the head's fine code, or past them `FINE +` the tail's code).
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

/// An entry as one word that sorts it into the stored order: its bucket, its id, and for a head
/// entry its fine code.
fn word(key: u32, id: u32) -> u64 {
    let (bucket, fine) = match key {
        k if k <= FINE => (0, k),
        k if k >= INFINITE_KEY => (TOP, 0),
        k => (k - FINE, 0),
    };
    (u64::from(bucket) << 58) | (u64::from(id) << 26) | u64::from(fine)
}

fn bucket_of(word: u64) -> usize {
    (word >> 58) as usize
}

fn id_of(word: u64) -> u32 {
    (word >> 26) as u32
}

fn fine_of(word: u64) -> u32 {
    word as u32 & FINE
}

/// How a block's Rice parameters follow its ids, chosen per block for the fewer bits.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Rice {
    /// `false`: flat, one parameter a bucket (ids spread evenly below `2^span`); `true`:
    /// scaled, the parameter growing with the bit length of the previous id (ids denser among
    /// the small ones, as where a vocabulary's ids follow its tokens' frequency).
    scaled: bool,
    /// The correction, `−2..=1`.
    delta: i32,
}

impl Rice {
    /// Every choice an encoder weighs.
    fn all() -> impl Iterator<Item = Self> {
        [false, true]
            .into_iter()
            .flat_map(|scaled| (-2..=1).map(move |delta| Self { scaled, delta }))
    }

    /// The parameter of a gap in a bucket of `count` ids below `2^span`, whose id is at least
    /// `next` (the previous id + 1; 0 for the bucket's first, which is coded flat), after the
    /// bucket's `first` id. Scaled: `count` ids drawn by a Zipf(1) prior over `[first, 2^span)`
    /// have gaps near `x` of about `x·ln(2^span/first)/count`, whose best Rice parameter is about
    /// `bitlen(x) − bitlen(count) + log₂ ln(2^span/first) − 0.5`; `bitlen(span − bitlen(first))
    /// − 2` follows that last term within half a bit.
    #[inline(always)]
    fn parameter(self, span: u32, count: usize, first: u64, next: u64) -> u32 {
        let bits = |x: u64| (u64::BITS - x.leading_zeros()) as i32;
        let base = if self.scaled && next > 0 {
            let spread = (span as i32 - bits(first)).max(0) as u64;
            bits(next) + bits(spread) - 2
        } else {
            span as i32
        };
        (base - bits(count as u64) + self.delta).clamp(0, MAX_RICE) as u32
    }

    /// [`Self::parameter`] at `next`, and the smallest id from which it may change (a scaled
    /// parameter changes only where the bit length of `next` does).
    #[inline(always)]
    fn parameter_until(self, span: u32, count: usize, first: u64, next: u64) -> (u32, u64) {
        let r = self.parameter(span, count, first, next);
        if self.scaled && next > 0 {
            let bits = u64::BITS - next.leading_zeros();
            (r, 1u64.checked_shl(bits).unwrap_or(u64::MAX))
        } else {
            (r, u64::MAX)
        }
    }
}

/// One stored entry's id, as the encoder codes it.
#[derive(Clone, Copy)]
struct Gap {
    bucket: usize,
    /// Its place in its bucket.
    index: usize,
    /// The id less `next`.
    gap: u64,
    /// The smallest id it could have had: the previous id + 1 (0 for a bucket's first).
    next: u64,
    /// Its bucket's first id.
    first: u64,
}

/// Each stored entry's gap, `order` sorted.
fn gaps(order: &[u64]) -> impl Iterator<Item = Gap> + '_ {
    let start = Gap {
        bucket: usize::MAX,
        index: 0,
        gap: 0,
        next: 0,
        first: 0,
    };
    order.iter().scan(start, move |state, &w| {
        let id = u64::from(id_of(w));
        if bucket_of(w) == state.bucket {
            state.index += 1;
        } else {
            *state = Gap {
                bucket: bucket_of(w),
                first: id,
                ..start
            };
        }
        let gap = Gap {
            gap: id.saturating_sub(state.next),
            ..*state
        };
        state.next = id + 1;
        Some(gap)
    })
}

/// The bits of the gaps of `order` (sorted) that `code` leaves to Rice, coded as `rice` says.
fn rice_bits(order: &[u64], span: u32, counts: &[usize; BUCKETS], rice: Rice, code: IdCode) -> u64 {
    gaps(order)
        .filter(|g| g.index >= code.grouped(counts[g.bucket]))
        .map(|g| {
            let r = rice.parameter(span, counts[g.bucket], g.first, g.next);
            (g.gap >> r) + 1 + u64::from(r)
        })
        .sum()
}

/// The Rice parameters that code the gaps in the fewest bits.
fn rice_choice(order: &[u64], span: u32, counts: &[usize; BUCKETS], code: IdCode) -> Rice {
    let cost = |rice: Rice| rice_bits(order, span, counts, rice, code);
    Rice::all().min_by_key(|&r| cost(r)).unwrap_or(Rice {
        scaled: false,
        delta: 0,
    })
}

/// Appends the block of one position's entries (`ids` and their `values`, in any order), its
/// ids coded as `code` says; `order` is scratch.
pub fn encode(ids: &[u32], values: &[f32], code: IdCode, order: &mut Vec<u64>, out: &mut Vec<u8>) {
    encode_as(ids, values, code, order, out, None);
}

/// [`encode`] with the Rice parameters `rice`, or those that take the fewest bits.
fn encode_as(
    ids: &[u32],
    values: &[f32],
    code: IdCode,
    order: &mut Vec<u64>,
    out: &mut Vec<u8>,
    rice: Option<Rice>,
) {
    let finite = || values.iter().copied().filter(|v| v.is_finite());
    let largest = finite().fold(f32::NEG_INFINITY, f32::max);
    let smallest = finite().fold(f32::INFINITY, f32::min);
    let (largest, range) = if largest.is_finite() {
        (largest, largest - smallest)
    } else {
        (0.0, 0.0)
    };
    let infinite = values.iter().any(|v| !v.is_finite());
    let scale = Scale::new(largest, range, infinite);
    // The entries in the stored order: by bucket, then id.
    order.clear();
    order.extend(ids.iter().zip(values).map(|(&id, &v)| match v {
        v if v.is_finite() => word(scale.key(largest - v), id),
        _ => word(INFINITE_KEY, id),
    }));
    order.sort_unstable();
    let mut counts = [0usize; BUCKETS];
    order.iter().for_each(|&w| counts[bucket_of(w)] += 1);
    let span = ids
        .iter()
        .max()
        .map_or(0, |&id| u32::BITS - id.leading_zeros());
    let span = span.min(31);
    let rice = rice.unwrap_or_else(|| rice_choice(order, span, &counts, code));
    let shift = tail_shift(order, values, largest, scale);
    out.extend_from_slice(&largest.to_le_bytes());
    out.extend_from_slice(&range.to_le_bytes());
    out.extend_from_slice(&f16::from_f32(shift).to_le_bytes());
    let delta = (rice.delta + 2) as u8;
    out.push(span as u8 | (delta << 5) | if infinite { NEG_INF } else { 0 });
    let mut bits = BitWriter::new(out);
    bits.put(u64::from(rice.scaled), 1);
    for &count in &counts[..BUCKETS - 1] {
        bits.gamma(count as u64 + 1);
    }
    let heads = counts[0];
    let mut group = [0u64; GROUP];
    for (at, g) in gaps(order).enumerate() {
        if g.index < code.grouped(counts[g.bucket]) {
            group[g.index % GROUP] = g.gap;
            if g.index % GROUP == GROUP - 1 {
                bits.packed(&group);
            }
        } else {
            let count = counts[g.bucket];
            bits.rice(g.gap, rice.parameter(span, count, g.first, g.next));
        }
        // The head's fine codes follow its ids.
        if at + 1 == heads {
            order[..heads]
                .iter()
                .for_each(|&w| bits.put(u64::from(fine_of(w)), HEAD_BITS));
        }
    }
    bits.finish();
}

/// The shift of every tail value that makes the decoded kept mass the exact one: the log of
/// the exact mass less the decoded head's over the decoded tail's (0 without a tail). The
/// tail's decoded mass is summed per code (one `exp` a code, not an entry).
fn tail_shift(order: &[u64], values: &[f32], largest: f32, scale: Scale) -> f32 {
    let exact: f64 = values
        .iter()
        .filter(|v| v.is_finite())
        .map(|&v| (v - largest).exp() as f64)
        .sum();
    let mut head = 0.0f64;
    let mut per_code = [0u32; BUCKETS];
    for &w in order {
        match bucket_of(w) {
            0 => head += (-(scale.depth(fine_of(w)) as f64)).exp(),
            b if b as u32 <= scale.top => per_code[b] += 1,
            _ => {}
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

/// Reads blocks; its scratch (the head, ordered by fine code) is kept between blocks so that
/// reading one allocates nothing.
#[derive(Debug, Default)]
pub struct Reader {
    /// The head's entries as `fine << 32 | id`.
    head: Vec<u64>,
    /// The head's ids, as read.
    head_ids: Vec<u32>,
}

impl Reader {
    /// The best `ids.len()` (at most `n`) of the `n` entries of `block`, its ids coded as
    /// `code` says, best first (ties: the smaller id), into `ids` and `values`, each value plus
    /// `shift` (added in f64, as the merge shifts a slot by its continuation: once a code, not
    /// an entry); how many it wrote. It decodes no further than the last bucket it needs; slots
    /// past the block's entries are left as they are.
    pub fn best_first(
        &mut self,
        block: &[u8],
        code: IdCode,
        n: usize,
        ids: &mut [u32],
        values: &mut [f32],
        shift: f64,
    ) -> usize {
        let k = ids.len().min(values.len()).min(n);
        if block.len() < BLOCK_HEADER {
            return 0;
        }
        let word = |at: usize| {
            f32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
        };
        let (largest, range) = (word(0), word(4));
        let tail_shift = f16::from_le_bytes([block[8], block[9]]).to_f32();
        let flags = block[10];
        let span = u32::from(flags & 0x1f);
        let delta = i32::from((flags >> 5) & 3) - 2;
        let scale = Scale::new(largest, range, flags & NEG_INF != 0);
        let mut bits = BitReader::new(&block[BLOCK_HEADER..]);
        let scaled = bits.take(1) == 1;
        let rice = Rice { scaled, delta };
        let mut counts = [0usize; BUCKETS];
        let mut left = n;
        for count in &mut counts[..BUCKETS - 1] {
            *count = (bits.gamma().saturating_sub(1) as usize).min(left);
            left -= *count;
        }
        counts[BUCKETS - 1] = left;
        self.head(&mut bits, (rice, code), span, counts[0]);
        let mut at = counts[0].min(k);
        for (at_head, &w) in self.head.iter().take(k).enumerate() {
            ids[at_head] = w as u32;
            let value = match (w >> 32) as u32 {
                0 => largest,
                fine => largest - scale.depth(fine),
            };
            values[at_head] = (value as f64 + shift) as f32;
        }
        for (b, &count) in counts.iter().enumerate().skip(1) {
            if at >= k {
                break;
            }
            let value = match b as u32 {
                c if c > scale.top => f32::NEG_INFINITY,
                c => largest - scale.depth(FINE + c) + tail_shift,
            };
            let value = (value as f64 + shift) as f32;
            let end = (at + count).min(k);
            values[at..end].fill(value);
            bits.bucket_ids((rice, code), span, count, &mut ids[at..end]);
            // A bucket read in part is the last one needed.
            at = end;
        }
        at
    }

    /// Reads the head's `count` ids and fine codes, ordered by code (ties: the smaller id).
    fn head(&mut self, bits: &mut BitReader<'_>, code: (Rice, IdCode), span: u32, count: usize) {
        self.head_ids.resize(count, 0);
        bits.bucket_ids(code, span, count, &mut self.head_ids);
        self.head.clear();
        self.head.extend(
            self.head_ids
                .iter()
                .map(|&id| u64::from(id) | bits.take(HEAD_BITS) << 32),
        );
        self.head.sort_unstable();
    }
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

    /// `q` ones, then a zero.
    fn unary(&mut self, mut q: u64) {
        while q >= 32 {
            self.put(u32::MAX as u64, 32);
            q -= 32;
        }
        self.put((1u64 << q) - 1, q as u32 + 1);
    }

    /// `g >> r` ones, a zero, then the low `r` bits of `g`.
    fn rice(&mut self, g: u64, r: u32) {
        self.unary(g >> r);
        self.put(g, r);
    }

    /// A packed group: the width `w` of its largest gap in 6 bits, then, from the next byte,
    /// each gap in `w` bits (`4w` bytes).
    fn packed(&mut self, gaps: &[u64; GROUP]) {
        let width = gaps.iter().map(|g| u64::BITS - g.leading_zeros()).max();
        let width = width.unwrap_or(0).min(32);
        self.put(u64::from(width), 6);
        self.align();
        gaps.iter().for_each(|&g| self.put(g, width));
    }

    /// Pads to the next byte.
    fn align(&mut self) {
        if self.used > 0 {
            self.out.push(self.acc as u8);
            (self.acc, self.used) = (0, 0);
        }
    }

    /// `x ≥ 1` as its bit length less one in unary, then its bits below the top one.
    fn gamma(&mut self, x: u64) {
        let q = 63 - x.max(1).leading_zeros();
        self.unary(u64::from(q));
        self.put(x, q);
    }

    fn finish(mut self) {
        self.align();
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

    /// A Rice code of parameter `r ≤ 24`: ones, a zero, then `r` bits. (Inlined: it is the
    /// reader's inner loop, a call an entry otherwise.)
    #[inline(always)]
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

    /// The first `ids.len()` ids of a bucket of `count`, coded as `code` says, into `ids`.
    fn bucket_ids(&mut self, code: (Rice, IdCode), span: u32, count: usize, ids: &mut [u32]) {
        let (rice, code) = code;
        let read = code.grouped(count).min(ids.len());
        if read == 0 {
            return match ids {
                [first, rest @ ..] if rice.scaled => {
                    let flat = rice.parameter(span, count, 0, 0);
                    *first = self.rice(flat).min(u64::from(u32::MAX)) as u32;
                    let first = u64::from(*first);
                    self.later_ids(rice, span, count, first, first, rest);
                }
                _ => self.later_ids(rice, span, count, 0, u64::MAX, ids),
            };
        }
        let mut last = u32::MAX;
        ids[..read]
            .chunks_mut(GROUP)
            .for_each(|group| self.packed(&mut last, group));
        let (packed, rest) = ids.split_at_mut(read);
        if !rest.is_empty() {
            let first = u64::from(packed[0]);
            self.later_ids(rice, span, count, first, u64::from(last), rest);
        }
    }

    /// A bucket's Rice-coded ids, counted on from `last` (`u64::MAX`: none yet), into `ids`;
    /// `first` is the bucket's first id, which scaled parameters follow.
    fn later_ids(
        &mut self,
        rice: Rice,
        span: u32,
        count: usize,
        first: u64,
        last: u64,
        ids: &mut [u32],
    ) {
        if !rice.scaled {
            let flat = rice.parameter(span, count, 0, 0);
            return self.ids(flat, |_| (flat, u64::MAX), last, ids);
        }
        // The parameter grows with the ids, whose bit lengths spread evenly from the first's
        // to `span`: the middle one's sets how many codes a top-up holds (a code that does not
        // fit tops the buffer up itself).
        let middle = (u64::BITS - first.leading_zeros() + span) / 2;
        let typical = rice.parameter(span, count, first, 1 << middle);
        let parameter = |next| rice.parameter_until(span, count, first, next);
        self.ids(typical, parameter, last, ids);
    }

    /// The group of packed gaps that starts here, counted on from `last` (as a `u32`:
    /// `u32::MAX` for none yet); its first `ids.len()` ids into `ids`.
    fn packed(&mut self, last: &mut u32, ids: &mut [u32]) {
        let width = (self.take(6) as usize).min(32);
        // The gaps start at the next byte.
        let pad = self.avail % 8;
        self.buf >>= pad;
        self.avail -= pad;
        let at = self.next - (self.avail / 8) as usize;
        let len = 4 * width;
        // Each gap is read as 8 bytes from its first: a group near the end is read from a copy.
        let mut padded = [0u8; 4 * 32 + 8];
        let bytes = match self.bytes.get(at..at + len + 8) {
            Some(bytes) => bytes,
            None => {
                let rest = self.bytes.get(at..).unwrap_or(&[]);
                let n = rest.len().min(len);
                padded[..n].copy_from_slice(&rest[..n]);
                &padded[..]
            }
        };
        match <&mut [u32; GROUP]>::try_from(&mut *ids) {
            Ok(all) => UNPACK[width](bytes, last, all),
            Err(_) => {
                let mut all = [0u32; GROUP];
                UNPACK[width](bytes, last, &mut all);
                ids.copy_from_slice(&all[..ids.len()]);
            }
        }
        (self.next, self.buf, self.avail) = (at + len, 0, 0);
        self.refill();
    }

    /// Ids from their Rice-coded gaps, the first counted from `last` (`u64::MAX`: −1), into
    /// `ids`; `parameter(next)` is a gap's parameter (`≤ 24`, usually near `typical`) where its
    /// id is at least `next`, and the id from which it may change: it is asked again only there,
    /// off the chain from one code to the next. The buffer is topped up once for as many codes as
    /// usually fit in its 56 bits (`r + 2` bits a code): each top-up's load lies on that chain,
    /// so a load a code made the reader half as fast.
    #[inline(always)]
    fn ids(
        &mut self,
        typical: u32,
        parameter: impl Fn(u64) -> (u32, u64) + Copy,
        last: u64,
        ids: &mut [u32],
    ) {
        match typical {
            0..=7 => self.ids_by::<6>(parameter, last, ids),
            8..=9 => self.ids_by::<5>(parameter, last, ids),
            10..=11 => self.ids_by::<4>(parameter, last, ids),
            12..=15 => self.ids_by::<3>(parameter, last, ids),
            16..=24 => self.ids_by::<2>(parameter, last, ids),
            _ => self.ids_by::<1>(parameter, last, ids),
        }
    }

    /// [`Self::ids`], `N` codes a top-up (the last top-up for the fewer left).
    #[inline(always)]
    fn ids_by<const N: usize>(
        &mut self,
        parameter: impl Fn(u64) -> (u32, u64) + Copy,
        mut last: u64,
        ids: &mut [u32],
    ) {
        let mut r = parameter(last.wrapping_add(1));
        let mut groups = ids.chunks_exact_mut(N);
        for group in &mut groups {
            self.topped_up_ids(parameter, &mut r, &mut last, group);
        }
        self.topped_up_ids(parameter, &mut r, &mut last, groups.into_remainder());
    }

    /// The ids of `ids.len()` gaps after one top-up, counted on from `last`, with parameter `r`
    /// (and the id from which it may change).
    #[inline(always)]
    fn topped_up_ids(
        &mut self,
        parameter: impl Fn(u64) -> (u32, u64),
        r: &mut (u32, u64),
        last: &mut u64,
        ids: &mut [u32],
    ) {
        self.refill();
        for id in ids {
            let next = last.wrapping_add(1);
            if next >= r.1 {
                *r = parameter(next);
            }
            *last = last.wrapping_add(self.gap(r.0) + 1);
            *id = (*last).min(u32::MAX as u64) as u32;
        }
    }

    /// A Rice code of parameter `r` from the buffer as it is, or through [`Self::rice`] where it
    /// reaches past the buffer.
    #[inline(always)]
    fn gap(&mut self, r: u32) -> u64 {
        let low_bits = (1u64 << r) - 1;
        let ones = (!self.buf).trailing_zeros();
        let len = ones + 1 + r;
        if len > self.avail {
            return self.rice_beyond(r);
        }
        let low = (self.buf >> (ones + 1)) & low_bits;
        self.buf >>= len;
        self.avail -= len;
        (u64::from(ones) << r) | low
    }

    /// [`Self::rice`] kept out of line: the rare code that does not fit the buffer.
    #[inline(never)]
    fn rice_beyond(&mut self, r: u32) -> u64 {
        self.rice(r)
    }

    /// An Elias-gamma code (as [`BitWriter::gamma`] writes it; at most 2³³ − 1).
    fn gamma(&mut self) -> u64 {
        let q = self.rice(0).min(32) as u32;
        (1u64 << q) | self.take(q)
    }
}

/// The ids of a packed group whose gaps are `W` bits wide (`bytes`: its `4W` bytes and 8 more),
/// counted on from `last`. Eight gaps fill `W` bytes, so every gap's byte and shift are
/// constants once the loop over eight is unrolled.
fn unpack<const W: usize>(bytes: &[u8], last: &mut u32, ids: &mut [u32; GROUP]) {
    let mask = (1u64 << W) - 1;
    let mut id = *last;
    for (q, eight) in ids.chunks_exact_mut(8).enumerate() {
        let b = &bytes[q * W..q * W + W + 8];
        for (i, out) in eight.iter_mut().enumerate() {
            let (byte, shift) = (i * W / 8, i * W % 8);
            let word: [u8; 8] = b[byte..byte + 8].try_into().unwrap_or_default();
            let gap = (u64::from_le_bytes(word) >> shift) & mask;
            id = id.wrapping_add(gap as u32).wrapping_add(1);
            *out = id;
        }
    }
    *last = id;
}

/// A group's reader per width.
type Unpack = fn(&[u8], &mut u32, &mut [u32; GROUP]);

/// [`unpack`] for every width, `0..=32`.
const UNPACK: [Unpack; 33] = {
    macro_rules! widths {
        ($($w:literal)*) => { [$(unpack::<$w>),*] };
    }
    widths!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `ids` and `values` encoded with ids coded as `code`, then read whole.
    fn round_trip(ids: &[u32], values: &[f32], code: IdCode) -> (Vec<u8>, Vec<u32>, Vec<f32>) {
        round_trip_as(ids, values, code, None)
    }

    /// [`round_trip`] with the Rice parameters `rice`.
    fn round_trip_as(
        ids: &[u32],
        values: &[f32],
        code: IdCode,
        rice: Option<Rice>,
    ) -> (Vec<u8>, Vec<u32>, Vec<f32>) {
        let mut block = Vec::new();
        encode_as(ids, values, code, &mut Vec::new(), &mut block, rice);
        let (mut got_ids, mut got) = (vec![0u32; ids.len()], vec![0f32; ids.len()]);
        let read =
            Reader::default().best_first(&block, code, ids.len(), &mut got_ids, &mut got, 0.0);
        assert_eq!(read, ids.len());
        (block, got_ids, got)
    }

    proptest! {
        /// Any set of ids and values, with any Rice parameters or the chosen ones and ids packed
        /// or not, decodes to the same ids, best first (by decoded value, ties to the smaller
        /// id), the largest value exactly, every finite value within its bound, −∞ as −∞;
        /// reading fewer gives the same first entries, and reading with a shift the same values
        /// shifted.
        #[test]
        fn blocks_round_trip_within_the_bound(
            picks in proptest::collection::btree_set(0u32..200_000, 1..300),
            seed in 0u64..1000,
            infinite in proptest::bool::ANY,
            scaled in proptest::option::of(proptest::bool::ANY),
            delta in -2i32..=1,
            packed in proptest::bool::ANY,
        ) {
            let code = if packed { IdCode::Packed } else { IdCode::Rice };
            let ids: Vec<u32> = picks.into_iter().rev().collect();
            let mut values: Vec<f32> = (0..ids.len())
                .map(|j| -0.3 - ((j as u64 * 2654435761 + seed) % 1000) as f32 * 0.017)
                .collect();
            if infinite && values.len() > 1 {
                let last = values.len() - 1;
                values[last] = f32::NEG_INFINITY;
            }
            let rice = scaled.map(|scaled| Rice { scaled, delta });
            let (block, got_ids, got) = round_trip_as(&ids, &values, code, rice);
            let finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
            let max = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let min = finite.iter().copied().fold(f32::INFINITY, f32::min);
            let bound = |v: f32| error_bound(max, max - min, max - v);
            let exact: std::collections::HashMap<u32, f32> =
                ids.iter().copied().zip(values.iter().copied()).collect();
            let mut sorted_ids = got_ids.clone();
            sorted_ids.sort_unstable();
            let mut want_ids = ids.clone();
            want_ids.sort_unstable();
            prop_assert_eq!(sorted_ids, want_ids);
            for (id, g) in got_ids.iter().zip(&got) {
                let v = exact[id];
                if v.is_finite() {
                    prop_assert!((v - g).abs() <= bound(v), "{} vs {} (bound {})", v, g, bound(v));
                    if v == max { prop_assert_eq!(*g, max); }
                } else {
                    prop_assert_eq!(*g, f32::NEG_INFINITY);
                }
            }
            prop_assert_eq!(got[0], max);
            let mut by_value: Vec<(f32, u32)> = got.iter().copied().zip(got_ids.iter().copied()).collect();
            by_value.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            prop_assert_eq!(&got_ids, &by_value.iter().map(|e| e.1).collect::<Vec<_>>());
            let k = ids.len().div_ceil(2);
            let (mut best_ids, mut best) = (vec![0u32; k], vec![0f32; k]);
            let read =
                Reader::default().best_first(&block, code, ids.len(), &mut best_ids, &mut best, 0.0);
            prop_assert_eq!(read, k);
            prop_assert_eq!(&best_ids[..], &got_ids[..k]);
            prop_assert_eq!(&best[..], &got[..k]);
            // A shift is added in f64 as the merge adds it to each value read.
            let shift = seed as f64 * 0.37 - 100.0;
            let (mut shifted_ids, mut shifted) = (vec![0u32; ids.len()], vec![0f32; ids.len()]);
            let n = ids.len();
            Reader::default().best_first(&block, code, n, &mut shifted_ids, &mut shifted, shift);
            prop_assert_eq!(&shifted_ids, &got_ids);
            for (s, g) in shifted.iter().zip(&got) {
                prop_assert_eq!(s.to_bits(), ((*g as f64 + shift) as f32).to_bits());
            }
        }
    }

    /// A gap whose unary part is longer than the reader's buffer (one far id after many near
    /// ones) decodes, and so do the ids after it, Rice-coded or packed; a cut block reads
    /// without a panic, and blocks cut anywhere read without one.
    #[test]
    fn long_unary_runs_decode() {
        let mut ids: Vec<u32> = (0..200).collect();
        ids.extend([150_000, 150_001, 199_999]);
        // One value an id, falling: best first is id order.
        let values: Vec<f32> = (0..ids.len()).map(|j| -1.0 - j as f32 * 0.01).collect();
        for code in [IdCode::Rice, IdCode::Packed] {
            let (block, got_ids, _) = round_trip(&ids, &values, code);
            assert_eq!(got_ids, ids);
            let (mut cut_ids, mut cut) = (vec![0u32; ids.len()], vec![0f32; ids.len()]);
            let cut_block = &block[..block.len() - 1];
            Reader::default().best_first(cut_block, code, ids.len(), &mut cut_ids, &mut cut, 0.0);
            cut_ids.sort_unstable();
            assert_eq!(
                cut_ids, ids,
                "{code:?}: the ids come before the fine codes a cut loses"
            );
            for end in 0..block.len() {
                Reader::default().best_first(
                    &block[..end],
                    code,
                    ids.len(),
                    &mut cut_ids,
                    &mut cut,
                    0.0,
                );
            }
        }
    }

    /// Blocks whose codes hold many ids (small Rice parameters, many codes a top-up of the
    /// reader's buffer) and few ids over a wide range (large ones) read back every id, best
    /// first, each value within its bound.
    #[test]
    fn dense_and_sparse_blocks_round_trip() {
        for (v, k) in [
            (151_680u64, 8192usize),
            (1_000, 900),
            (1 << 24, 3),
            (70_000, 513),
        ] {
            // Distinct: the multiplier is a prime that divides none of the widths.
            let ids: Vec<u32> = (0..k as u64)
                .map(|i| (i * 2_654_435_761 % v) as u32)
                .collect();
            let values: Vec<f32> = (0..k).map(|j| -0.1 - (j as f32).sqrt() * 0.37).collect();
            for code in [IdCode::Rice, IdCode::Packed] {
                let (_, got_ids, got) = round_trip(&ids, &values, code);
                let (max, min) = (values[0], values[k - 1]);
                let exact: std::collections::HashMap<u32, f32> =
                    ids.iter().copied().zip(values.iter().copied()).collect();
                for (id, g) in got_ids.iter().zip(&got) {
                    let want = exact[id];
                    let bound = error_bound(max, max - min, max - want);
                    assert!(
                        (want - g).abs() <= bound,
                        "V {v}, K {k}: {want} read as {g}"
                    );
                }
                let mut sorted = got_ids.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), k, "V {v}, K {k}: every id once");
                let best_first = got.windows(2).zip(got_ids.windows(2));
                for (pair, id) in best_first {
                    assert!(pair[0] > pair[1] || (pair[0] == pair[1] && id[0] < id[1]));
                }
            }
        }
    }

    /// Ids denser among the small ones (spread evenly on a log scale, as a Zipf(1) prior over a
    /// frequency-ordered vocabulary draws them) are coded with scaled parameters, in under 0.8×
    /// the bits flat ones would take; they read back.
    #[test]
    fn ids_dense_among_the_small_ones_cost_less() {
        let (v, k) = (151_680f64, 1024usize);
        let mut ids: Vec<u32> = (0..k)
            .map(|i| (v.powf((i as f64 + 0.5) / k as f64) - 1.0) as u32)
            .collect();
        ids.dedup();
        let values = vec![-1.0f32; ids.len()];
        let mut block = Vec::new();
        encode(&ids, &values, IdCode::Rice, &mut Vec::new(), &mut block);
        let (_, got_ids, _) = round_trip(&ids, &values, IdCode::Rice);
        assert_eq!(got_ids, ids);
        // Spread over every code too (values falling with the id: best first is id order).
        let falling: Vec<f32> = (0..ids.len())
            .map(|j| -0.1 - (j as f32).sqrt() * 0.37)
            .collect();
        for delta in -2..=1 {
            let rice = Some(Rice {
                scaled: true,
                delta,
            });
            assert_eq!(round_trip_as(&ids, &falling, IdCode::Rice, rice).1, ids);
        }
        let scaled = BitReader::new(&block[BLOCK_HEADER..]).take(1);
        assert_eq!(scaled, 1, "scaled parameters chosen");
        let mut order: Vec<u64> = ids.iter().map(|&id| word(0, id)).collect();
        order.sort_unstable();
        let mut counts = [0usize; BUCKETS];
        counts[0] = ids.len();
        let bits = |rice: Rice| rice_bits(&order, 18, &counts, rice, IdCode::Rice);
        let flat = (-2..=1)
            .map(|delta| {
                bits(Rice {
                    scaled: false,
                    delta,
                })
            })
            .min()
            .unwrap_or(0);
        let chosen = bits(rice_choice(&order, 18, &counts, IdCode::Rice));
        assert!(
            (chosen as f64) < 0.8 * flat as f64,
            "scaled {chosen} bits, flat {flat}"
        );
    }

    /// The gamma code round-trips its whole range.
    #[test]
    fn gamma_codes_round_trip() {
        let xs = [1u64, 2, 3, 4, 7, 8, 255, 256, 1 << 20, u32::MAX as u64 + 1];
        let mut out = Vec::new();
        let mut bits = BitWriter::new(&mut out);
        xs.iter().for_each(|&x| bits.gamma(x));
        bits.finish();
        let mut read = BitReader::new(&out);
        assert_eq!(xs.map(|_| read.gamma()), xs);
    }

    /// Ids spread evenly over a vocabulary cost close to the entropy of the set.
    #[test]
    fn sorted_ids_cost_near_their_entropy() {
        let (v, k) = (151_680u32, 128usize);
        let ids: Vec<u32> = (0..k as u64)
            .map(|i| (i * 2_654_435_761 % v as u64) as u32)
            .collect();
        // One value: every entry in the head, at fine code 0.
        let values = vec![-1.0f32; k];
        let mut block = Vec::new();
        encode(&ids, &values, IdCode::Rice, &mut Vec::new(), &mut block);
        // The mode bit; the counts: gamma(k + 1) for the head, gamma(1) for the 30 other buckets
        // before the top.
        let counts = 1 + 2 * (usize::BITS - (k + 1).leading_zeros()) as usize - 1 + (BUCKETS - 2);
        let id_bits = (block.len() - BLOCK_HEADER) as f64 * 8.0
            - (k as f64 * HEAD_BITS as f64)
            - counts as f64;
        let per_id = id_bits / k as f64;
        let entropy = (v as f64 / k as f64).log2() + std::f64::consts::LOG2_E;
        assert!(
            per_id < entropy + 0.6,
            "{per_id} bits an id, entropy {entropy}"
        );
    }

    /// Packed groups cost what their widths say: ids spread evenly over a vocabulary, K = 8192,
    /// take 1.05–1.3× the bytes of Rice codes (the width of a group's largest of 32 gaps is
    /// about 2.5 bits over the mean's, Rice's code about 1.5), and read back the same.
    #[test]
    fn packed_groups_cost_their_widths() {
        let (v, k) = (151_680u64, 8192usize);
        // Drawn (xorshift), not a lattice: a lattice's gaps are all alike, and pack tightly.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut ids = std::collections::BTreeSet::new();
        while ids.len() < k {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ids.insert((state % v) as u32);
        }
        let ids: Vec<u32> = ids.into_iter().collect();
        let values: Vec<f32> = (0..k).map(|j| -0.1 - (j as f32).sqrt() * 0.037).collect();
        let (rice, rice_ids, rice_values) = round_trip(&ids, &values, IdCode::Rice);
        let (packed, packed_ids, packed_values) = round_trip(&ids, &values, IdCode::Packed);
        assert_eq!((rice_ids, rice_values), (packed_ids, packed_values));
        let ratio = packed.len() as f64 / rice.len() as f64;
        assert!((1.05..1.3).contains(&ratio), "packed / Rice bytes: {ratio}");
    }
}
