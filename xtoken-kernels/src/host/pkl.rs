//! P-KL on a predicting row: `Σ_{t ∈ top-K} q_t (log q_t − log(p̃_t + ε))` with
//! `p̃ = Wᵀp̂_S`, evaluated only at the teacher's kept ids by walking W's columns.

use burn::tensor::backend::Backend;

use super::distill::{RowCtx, RowLoss, Scratch};
use super::rows::{read_floats, read_ints};
use crate::checks::{check_id_range, float_dims, id_range, int_dims, projection_width};
use crate::error::KernelError;
use crate::ProjectionTensors;

/// W transposed: per teacher id, the flat slots `s · K_w + k` that point to it.
pub(crate) struct Columns {
    pub(crate) start: Vec<u32>,
    pub(crate) slots: Vec<u32>,
}

impl Columns {
    /// A counting sort of the slots by teacher id.
    pub(crate) fn new(indices: &[i64], teacher_vocab: usize) -> Self {
        let mut start = vec![0u32; teacher_vocab + 1];
        for &t in indices.iter().filter(|&&t| t >= 0) {
            start[t as usize + 1] += 1;
        }
        for t in 0..teacher_vocab {
            start[t + 1] += start[t];
        }
        let mut fill = start.clone();
        let mut slots = vec![0u32; start[teacher_vocab] as usize];
        for (slot, &t) in indices.iter().enumerate() {
            if t >= 0 {
                slots[fill[t as usize] as usize] = slot as u32;
                fill[t as usize] += 1;
            }
        }
        Self { start, slots }
    }

    fn of(&self, t: usize) -> &[u32] {
        &self.slots[self.start[t] as usize..self.start[t + 1] as usize]
    }
}

/// W on the host, with its columns.
pub(super) struct Projected {
    weights: Vec<f32>,
    kw: usize,
    columns: Columns,
    eps: f32,
    /// `V_S · K_w` when W's gradient is wanted, else 0.
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
        let shape = int_dims::<B>(&w.indices);
        let kw = projection_width(&shape, &float_dims::<B>(&w.weights), student_vocab)?;
        let indices = read_ints::<B>(w.indices, "projection indices")?;
        check_id_range(
            id_range(&indices),
            -1,
            teacher_vocab,
            "projection indices",
            "teacher id",
        )?;
        let weights = read_floats::<B>(w.weights, "projection weights")?;
        Ok(Self {
            weights,
            kw,
            columns: Columns::new(&indices, teacher_vocab),
            eps,
            weights_len: if want_weights { student_vocab * kw } else { 0 },
        })
    }
}

impl RowLoss for Projected {
    fn weights_len(&self) -> usize {
        self.weights_len
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
        // Only the kept teacher entries need `Wᵀp̂`: walk W's columns for them, and send
        // `g_t = ∂loss/∂p̃_t` back along the same entries into `h` (used as an accumulator).
        let es = sigma.exp();
        let want_w = self.weights_len > 0;
        let mut loss = 0.0f64;
        for (&t, &lq) in ids.iter().zip(logp) {
            if lq == f32::NEG_INFINITY {
                continue;
            }
            let column = self.columns.of(t as usize);
            let projected: f64 = column
                .iter()
                .map(|&e| w[e as usize] as f64 * s.p[e as usize / kw] as f64)
                .sum();
            let q = (lq as f64).exp();
            let pt = es * projected + self.eps as f64;
            loss += q * (lq as f64 - pt.ln());
            let g = -q / pt;
            for &e in column {
                let row = e as usize / kw;
                s.h[row] += (w[e as usize] as f64 * g) as f32;
                if want_w {
                    s.grad_weights[e as usize] += ctx.scale * es * s.p[row] as f64 * g;
                }
            }
        }
        let es = es as f32;
        for (h, &p) in s.h.iter_mut().zip(&s.p) {
            *h *= es * p;
        }
        loss
    }
}
