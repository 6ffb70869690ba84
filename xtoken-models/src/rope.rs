//! Rotary position embedding in Hugging Face's convention: `rotate_half` pairs element `i` with
//! `i + d/2` (burn's `RotaryEncoding` pairs adjacent elements, which HF weights do not expect), and
//! only the first `rotary_dim` channels of a head rotate (Phi-3's `partial_rotary_factor`).
//!
//! The tables are computed as HF computes them, in f32: the inverse frequencies, their product
//! with the position, then `cos`/`sin` times the scaling's attention factor.

use burn::tensor::{backend::Backend, Tensor, TensorData};

/// How the rotary frequencies are rescaled for long context (`rope_scaling` in `config.json`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama-3.1+: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Phi-3 / Phi-4-mini: per-frequency factors, `short_factor` while the sequence fits the
    /// pretraining length and `long_factor` beyond it, as HF chooses them per forward pass.
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    /// Channels of each head that rotate; even, at most `head_dim`.
    pub rotary_dim: usize,
    pub scaling: RopeScaling,
}

/// `cos` and `sin` for positions `0..len`, each `[len, rotary_dim / 2]` (the two halves of HF's
/// table are equal, so one half is kept).
#[derive(Clone, Debug)]
pub struct RopeTables<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
}

/// Llama-3's rescaling of one inverse frequency, in transformers' order of f32 operations:
/// long wavelengths divided by `factor`, short ones kept, a linear ramp between.
struct Llama3Ramp {
    factor: f32,
    low_freq_factor: f32,
    ramp_width: f32,
    old_context: f32,
    low_freq_wavelen: f32,
    high_freq_wavelen: f32,
}

impl Llama3Ramp {
    fn scale(&self, f: f32) -> f32 {
        let wavelen = (2.0 * std::f64::consts::PI) as f32 / f;
        if wavelen > self.low_freq_wavelen {
            f / self.factor
        } else if wavelen < self.high_freq_wavelen {
            f
        } else {
            let smooth = (self.old_context / wavelen - self.low_freq_factor) / self.ramp_width;
            (1.0 - smooth) * f / self.factor + smooth * f
        }
    }
}

impl Rope {
    /// Inverse frequencies for a forward pass over `len` positions, and the factor HF multiplies
    /// `cos`/`sin` by. Every step is an f32 operation, as transformers computes them (a value of
    /// the configuration enters as an f32): at positions in the thousands the angle `position ·
    /// f` amplifies a frequency's last bit, so an f64 table would differ from HF's in the logits.
    pub fn inverse_frequencies(&self, len: usize) -> (Vec<f32>, f32) {
        let powers = self.powers();
        match &self.scaling {
            RopeScaling::None => (powers.iter().map(|p| 1.0 / p).collect(), 1.0),
            RopeScaling::Linear { factor } => {
                let factor = *factor as f32;
                (powers.iter().map(|p| 1.0 / p / factor).collect(), 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old_context = *original_max_position_embeddings as f64;
                let ramp = Llama3Ramp {
                    factor: *factor as f32,
                    low_freq_factor: *low_freq_factor as f32,
                    ramp_width: (high_freq_factor - low_freq_factor) as f32,
                    old_context: old_context as f32,
                    low_freq_wavelen: (old_context / low_freq_factor) as f32,
                    high_freq_wavelen: (old_context / high_freq_factor) as f32,
                };
                (powers.iter().map(|p| ramp.scale(1.0 / p)).collect(), 1.0)
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                let factors = if len > *original_max_position_embeddings {
                    long_factor
                } else {
                    short_factor
                };
                let scaled = powers
                    .iter()
                    .zip(factors)
                    .map(|(p, f)| 1.0 / (*f as f32 * p))
                    .collect();
                (scaled, *attention_factor as f32)
            }
        }
    }

    /// `theta ^ (2i / rotary_dim)` for each frequency `i`: the exponent an f32 quotient, the
    /// power of the f32 base rounded once to f32.
    fn powers(&self) -> Vec<f32> {
        let dim = self.rotary_dim;
        let base = self.theta as f32 as f64;
        (0..dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / dim as f32;
                base.powf(exponent as f64) as f32
            })
            .collect()
    }

    /// `cos` and `sin` at given positions, `[rows, 1, len, rotary_dim / 2]` for `positions`
    /// laid out `[rows, len]`; the frequencies are those of a pass over `span` positions (which
    /// LongRoPE's choice of factors depends on).
    pub fn tables_at<B: Backend>(
        &self,
        positions: &[usize],
        rows: usize,
        span: usize,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (inverse, scale) = self.inverse_frequencies(span);
        let half = inverse.len();
        let len = positions.len() / rows.max(1);
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &position in positions {
            for &f in &inverse {
                let angle = (position as f32 * f) as f64;
                cos.push((angle.cos() as f32) * scale);
                sin.push((angle.sin() as f32) * scale);
            }
        }
        (
            Tensor::from_data(TensorData::new(cos, [rows, 1, len, half]), device),
            Tensor::from_data(TensorData::new(sin, [rows, 1, len, half]), device),
        )
    }

    pub fn tables<B: Backend>(&self, len: usize, device: &B::Device) -> RopeTables<B> {
        let positions: Vec<usize> = (0..len).collect();
        let (cos, sin) = self.tables_at::<B>(&positions, 1, len, device);
        let half = cos.dims()[3];
        RopeTables {
            cos: cos.reshape([len, half]),
            sin: sin.reshape([len, half]),
        }
    }
}

/// Rotates the first `2 · cos.dims()[1]` channels of `x` `[batch, heads, len, head_dim]`:
/// `(x₁, x₂) ↦ (x₁·cos − x₂·sin, x₂·cos + x₁·sin)`, the rest pass through.
pub fn apply<B: Backend>(x: Tensor<B, 4>, tables: &RopeTables<B>) -> Tensor<B, 4> {
    let cos = tables.cos.clone().unsqueeze::<4>();
    let sin = tables.sin.clone().unsqueeze::<4>();
    rotate(x, &cos, &sin)
}

/// [`apply`] with tables of any leading shape that broadcasts against `x`: `[1, 1, len, half]`
/// for positions shared by every row, `[batch, 1, len, half]` for positions of each row's own
/// (left-padded rows in a KV cache).
pub fn rotate<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, heads, len, head_dim] = x.dims();
    let half = cos.dims()[3];
    let first = x.clone().narrow(3, 0, half);
    let second = x.clone().narrow(3, half, half);
    let rotated_first = first.clone() * cos.clone() - second.clone() * sin.clone();
    let rotated_second = second * cos.clone() + first * sin.clone();
    let mut parts = vec![rotated_first, rotated_second];
    if 2 * half < head_dim {
        parts.push(x.narrow(3, 2 * half, head_dim - 2 * half));
    }
    let out = Tensor::cat(parts, 3);
    debug_assert_eq!(out.dims(), [batch, heads, len, head_dim]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama3() -> Rope {
        Rope {
            theta: 500_000.0,
            rotary_dim: 64,
            scaling: RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
        }
    }

    #[test]
    fn llama3_keeps_high_frequencies_and_divides_low_ones() {
        let plain = Rope {
            scaling: RopeScaling::None,
            ..llama3()
        };
        let (base, _) = plain.inverse_frequencies(16);
        let (scaled, scale) = llama3().inverse_frequencies(16);
        assert_eq!(scale, 1.0);
        // Wavelength 2π/f below 8192/4: untouched; above 8192: divided by 32.
        assert_eq!(scaled[0], base[0]);
        let last = base.len() - 1;
        assert!((scaled[last] as f64 - base[last] as f64 / 32.0).abs() < 1e-12);
        // The ramp is monotone between the two regimes.
        for i in 0..last {
            assert!(scaled[i] >= scaled[i + 1]);
        }
    }

    #[test]
    fn longrope_switches_factors_past_the_pretraining_length() {
        let rope = Rope {
            theta: 10_000.0,
            rotary_dim: 4,
            scaling: RopeScaling::LongRope {
                short_factor: vec![1.0, 2.0],
                long_factor: vec![4.0, 8.0],
                original_max_position_embeddings: 8,
                attention_factor: 1.25,
            },
        };
        let (short, scale) = rope.inverse_frequencies(8);
        let (long, _) = rope.inverse_frequencies(9);
        assert_eq!(scale, 1.25);
        assert_eq!(short, vec![1.0, 0.005]);
        assert_eq!(long, vec![0.25, 0.00125]);
    }
}
