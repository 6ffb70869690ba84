//! KL on a predicting row: `Σ_{t ∈ top-K} q_t (log q_t − lp̂_S[t])`, the teacher's ids indexing
//! the student vocabulary.

use super::distill::{RowCtx, RowLoss, Scratch};

/// Same-tokenizer KL.
pub(super) struct Kl;

impl RowLoss for Kl {
    fn row(
        &self,
        ctx: &RowCtx<'_>,
        s: &mut Scratch,
        slot: usize,
        sigma: f64,
        z: &[f32],
        lse: f32,
    ) -> f64 {
        let (ids, logp) = ctx.teacher(slot);
        let mut loss = 0.0f64;
        for (&t, &lq) in ids.iter().zip(logp) {
            if lq == f32::NEG_INFINITY {
                continue;
            }
            let q = (lq as f64).exp();
            let log_student = (z[t as usize] * ctx.tau_inv - lse) as f64 + sigma;
            loss += q * (lq as f64 - log_student);
            s.h[t as usize] -= q as f32;
        }
        loss
    }
}
