//! Python's `random.Random`, for the few-shot draws: lm-evaluation-harness samples each
//! document's examples with `Random(seed).sample(pool, k)`, one generator per task consumed
//! document after document, so drawing the same examples takes the same generator (the
//! Mersenne Twister MT19937, seeded by `init_by_array`) and the same sampling algorithm.

const N: usize = 624;
const M: usize = 397;

/// A Mersenne Twister seeded as CPython seeds one from a non-negative integer.
pub struct PyRandom {
    state: [u32; N],
    index: usize,
}

impl PyRandom {
    /// `random.Random(seed)`.
    pub fn new(seed: u64) -> Self {
        let key: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        let mut rng = PyRandom {
            state: [0; N],
            index: N,
        };
        rng.init_by_array(&key);
        rng
    }

    fn init_genrand(&mut self, seed: u32) {
        self.state[0] = seed;
        for i in 1..N {
            let prev = self.state[i - 1];
            self.state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.state[i - 1];
            self.state[i] = (self.state[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.state[0] = self.state[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.state[i - 1];
            self.state[i] = (self.state[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.state[0] = self.state[N - 1];
                i = 1;
            }
        }
        self.state[0] = 0x8000_0000;
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % N] & 0x7fff_ffff);
            let mut next = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    /// The next 32 random bits (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `_randbelow(n)`: uniform in `0..n` by rejection over `n.bit_length()` bits (`n ≥ 1`,
    /// below 2³²).
    fn below(&mut self, n: usize) -> usize {
        let bits = usize::BITS - n.leading_zeros();
        loop {
            let r = (self.next_u32() >> (32 - bits)) as usize;
            if r < n {
                return r;
            }
        }
    }

    /// `sample(range(n), k)`: `k` distinct indices below `n`, in selection order.
    pub fn sample(&mut self, n: usize, k: usize) -> Vec<usize> {
        assert!(k <= n, "a sample of {k} from {n}");
        let mut setsize = 21usize;
        if k > 5 {
            let exponent = ((k * 3) as f64).ln() / 4f64.ln();
            setsize += 4usize.pow(exponent.ceil() as u32);
        }
        if n <= setsize {
            let mut pool: Vec<usize> = (0..n).collect();
            (0..k)
                .map(|i| {
                    let j = self.below(n - i);
                    let picked = pool[j];
                    pool[j] = pool[n - i - 1];
                    picked
                })
                .collect()
        } else {
            let mut selected = std::collections::HashSet::new();
            (0..k)
                .map(|_| loop {
                    let j = self.below(n);
                    if selected.insert(j) {
                        break j;
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by CPython 3.11: `r = random.Random(1234); [r.getrandbits(32) for _ in
    /// range(3)]`, then `random.Random(1234).sample(range(100), 5)` and
    /// `random.Random(42).sample(range(10), 3)`.
    #[test]
    fn matches_cpython() {
        let mut r = PyRandom::new(1234);
        let bits: Vec<u32> = (0..3).map(|_| r.next_u32()).collect();
        assert_eq!(bits, PYTHON_BITS);
        assert_eq!(PyRandom::new(1234).sample(100, 5), PYTHON_SAMPLE_100);
        assert_eq!(PyRandom::new(42).sample(10, 3), PYTHON_SAMPLE_10);
    }

    const PYTHON_BITS: [u32; 3] = [4150886329, 3342196574, 1892932127];
    const PYTHON_SAMPLE_100: [usize; 5] = [99, 56, 14, 0, 11];
    const PYTHON_SAMPLE_10: [usize; 3] = [1, 0, 4];

    /// One generator over three documents, as the harness draws 3 shots from GSM8k's 7473
    /// training examples: `r = random.Random(1234); [r.sample(range(7473), 3) for _ in range(3)]`.
    #[test]
    fn consecutive_draws_match_cpython() {
        let mut r = PyRandom::new(1234);
        let draws: Vec<Vec<usize>> = (0..3).map(|_| r.sample(7473, 3)).collect();
        assert_eq!(
            draws,
            [[6374, 3610, 957], [61, 742, 7462], [6610, 4769, 286]]
        );
    }
}
