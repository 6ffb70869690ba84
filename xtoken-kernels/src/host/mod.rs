//! The host implementation of the fused operations, split by stage: [`rows`] reads logit rows
//! (the portable [`TensorRows`] copies one row chunk at a time with `into_data`, any backend;
//! [`SliceRows`] borrows logits already in host memory, ndarray), `merge` computes the chunk
//! merge, [`teacher`] the teacher's top-K entries, `distill` runs the passes every
//! distillation loss shares, and `kl`, `pkl`, `hybrid` (GOLD, H-KL, ULD) and [`ce`] hold each
//! objective's math. Rows are evaluated on all cores and the gradient is uploaded as one
//! tensor.
//!
//! Per chunk slot `c` with predicting row `r` and merge shift `σ_c` (the summed continuation
//! log-probabilities), the student's merged log-distribution is `lp̂ = z_r/τ − lse_r + σ_c`.
//! Each objective yields the loss and `h = ∂loss/∂lp̂` over the student vocabulary; the chain
//! rule then gives, with `s = τ²/valid` the mean's scale,
//!
//! - on the predicting row: `∂/∂z_r = s/τ · (h − p_r · Σh)`;
//! - on a continuation row `i` reading token `x` for slot `c`: `∂/∂z_i = s/τ · Σh_c · (e_x − p_i)`.
//!
//! Three passes read the logits: continuation rows (for `σ`), predicting rows (loss and
//! gradient), continuation rows again (their gradient). Besides the gradient itself, at most one
//! `row_chunk × V` copy (portable source only) and one vocabulary-sized scratch per thread are
//! alive.

pub mod ce;
mod distill;
mod hybrid;
mod kl;
mod merge;
mod pkl;
pub mod rows;
pub mod teacher;
mod transpose;

pub use ce::{cross_entropy, cross_entropy_from};
pub use distill::{distill, distill_from, loss_to_device, HostLoss, OutputDtypes};
pub use merge::log_sum_exp;
pub use rows::{Block, LogitRows, SliceRows, TensorRows};
pub use teacher::{
    entries_to_device, position_targets, position_targets_from, teacher_entries,
    teacher_entries_from, HostEntries, PositionTargets, ROW_CHUNK,
};
pub use transpose::transpose;
