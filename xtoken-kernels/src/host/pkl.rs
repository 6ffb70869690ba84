//! P-KL on a predicting row: `Σ_{t ∈ top-K} q_t (log q_t − log(p̃_t + ε))` with the projection
//! re-normalized over the teacher vocabulary, `p̃ = Wᵀp̂_S · Σ_s p̂_S[s] / Σ_s r_s p̂_S[s]`
//! (`r_s`: W's row sums), so that `p̃` keeps the student chunk's own mass (1 for a single-token
//! chunk) whatever W's empty or short rows drop. It is evaluated only at the teacher's kept ids
//! by walking W's columns. A row whose student mass falls entirely on empty rows of W
//! (`Σ_s r_s p̂_S[s] = 0`) projects to `p̃ = 0`: each kept entry then costs `q (log q − log ε)`
//! and sends no gradient.

use std::sync::Arc;

use burn::tensor::backend::Backend;

use super::distill::{RowCtx, RowLoss, Scratch};
use super::rows::{read_floats, read_ints};
use crate::checks::{float_dims, int_dims, projection_width};
use crate::error::KernelError;
use crate::layout::ProjectionLayout;
use crate::ProjectionTensors;

/// W on the host, with its columns.
pub(super) struct Projected {
    weights: Vec<f32>,
    /// `r_s`: the sum of row `s`'s occupied weights.
    row_mass: Vec<f32>,
    kw: usize,
    /// W's ids and columns (with the tensors, or laid out here).
    layout: Arc<ProjectionLayout>,
    eps: f32,
    /// `V_S · (K_w + 1)` when W's gradient is wanted (the entries, then a per-row tail), else 0.
    weights_len: usize,
}

impl Projected {
    /// Reads and checks W `[V_S, K_w]` against the logits' widths.
    pub(super) fn read<B: Backend>(
        w: ProjectionTensors<B>,
        student_vocab: usize,
        teacher_vocab: usize,
        eps: f32,
        want_weights: bool,
    ) -> Result<Self, KernelError> {
        let shapes = (int_dims::<B>(&w.indices), float_dims::<B>(&w.weights));
        let (kw, layout) = match w.layout {
            Some(layout) => {
                let kw = layout.fits((&shapes.0, &shapes.1), student_vocab, teacher_vocab)?;
                (kw, layout)
            }
            None => {
                let kw = projection_width(&shapes.0, &shapes.1, student_vocab)?;
                let indices = read_ints::<B>(w.indices, "projection indices")?;
                (kw, ProjectionLayout::new(indices, shapes.0, teacher_vocab)?)
            }
        };
        let weights = read_floats::<B>(w.weights, "projection weights")?;
        let row_mass = weights
            .chunks(kw.max(1))
            .zip(layout.indices().chunks(kw.max(1)))
            .map(|(w, ids)| {
                w.iter()
                    .zip(ids)
                    .filter(|(_, &t)| t >= 0)
                    .map(|(&w, _)| w)
                    .sum()
            })
            .collect();
        Ok(Self {
            weights,
            row_mass,
            kw,
            layout,
            eps,
            weights_len: if want_weights {
                student_vocab * (kw + 1)
            } else {
                0
            },
        })
    }
}

impl RowLoss for Projected {
    fn weights_len(&self) -> usize {
        self.weights_len
    }

    fn finish_weights(&self, mut sum: Vec<f64>) -> Vec<f64> {
        let entries = self.row_mass.len() * self.kw;
        let tail = sum.split_off(entries);
        for (e, g) in sum.iter_mut().enumerate() {
            if self.layout.indices()[e] >= 0 {
                *g += tail[e / self.kw];
            }
        }
        sum
    }

    fn row(
        &self,
        ctx: &RowCtx<'_>,
        s: &mut Scratch,
        slot: usize,
        sigma: f64,
        _z: &[f32],
        _lse: f32,
    ) -> f64 {
        let (ids, logp) = ctx.teacher(slot);
        let (w, kw) = (&self.weights, self.kw);
        // `p̃_t = norm · A_t` with `A_t = Σ_s W[s, t] p_s`, `norm = e^σ / ρ`, `ρ = Σ_s r_s p_s`.
        let es = sigma.exp();
        let rho: f64 = self
            .row_mass
            .iter()
            .zip(&s.p)
            .map(|(&r, &p)| r as f64 * p as f64)
            .sum();
        if rho <= 0.0 {
            return self.unreached(ids, logp);
        }
        let norm = es / rho;
        // Only the kept teacher entries need `A_t`: walk W's columns for them, and send
        // `g_t = ∂loss/∂p̃_t` back along the same entries into `h` (used as an accumulator of
        // `Σ_t W[s, t] g_t`). `g_dot = Σ_t g_t p̃_t` is the re-normalization's share.
        let want_w = self.weights_len > 0;
        let (mut loss, mut g_dot) = (0.0f64, 0.0f64);
        for (&t, &lq) in ids.iter().zip(logp) {
            if lq == f32::NEG_INFINITY {
                continue;
            }
            let column = self.layout.columns.of(t as usize);
            let a: f64 = column
                .iter()
                .map(|&e| w[e as usize] as f64 * s.p[e as usize / kw] as f64)
                .sum();
            let projected = norm * a;
            let q = (lq as f64).exp();
            let pt = projected + self.eps as f64;
            loss += q * (lq as f64 - pt.ln());
            let g = -q / pt;
            g_dot += g * projected;
            for &e in column {
                let row = e as usize / kw;
                s.h[row] += (w[e as usize] as f64 * g) as f32;
                if want_w {
                    s.grad_weights[e as usize] += ctx.scale * norm * s.p[row] as f64 * g;
                }
            }
        }
        // `h_s = p_s (norm Σ_t W[s, t] g_t + g_dot (1 − r_s / ρ))`, so that `Σ_s h_s = g_dot`.
        for ((h, &p), &r) in s.h.iter_mut().zip(&s.p).zip(&self.row_mass) {
            let p = p as f64;
            *h = (p * (norm * *h as f64 + g_dot * (1.0 - r as f64 / rho))) as f32;
        }
        if want_w {
            // `ρ` depends on every occupied weight: `∂/∂W[s, k] −= p_s g_dot / ρ`, the same for
            // each slot of row `s`; it is summed per row in the buffer's tail and spread by
            // `finish_weights`.
            let shift = ctx.scale * g_dot / rho;
            let tail = &mut s.grad_weights[self.row_mass.len() * kw..];
            for (t, &p) in tail.iter_mut().zip(&s.p) {
                *t -= shift * p as f64;
            }
        }
        loss
    }
}

impl Projected {
    /// The loss of a row that projects to nothing: `Σ q (log q − log ε)`, no gradient.
    fn unreached(&self, ids: &[i64], logp: &[f32]) -> f64 {
        let log_eps = (self.eps as f64).ln();
        ids.iter()
            .zip(logp)
            .filter(|(_, &lq)| lq != f32::NEG_INFINITY)
            .map(|(_, &lq)| (lq as f64).exp() * (lq as f64 - log_eps))
            .sum()
    }
}
