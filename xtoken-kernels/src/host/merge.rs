//! The chunk merge on the host: row softmaxes, and per slot `σ_c`, the summed log-probabilities
//! of its continuation terms.

use super::rows::{par_items, LogitRows};
use crate::error::KernelError;
use crate::spec::MergePlan;

/// `log Σ exp(z·t)`, summed in f64 blocks. NaN or +∞ anywhere (or only −∞) gives a
/// non-finite result: `f32::max` skips NaN, but `exp(NaN)` and `exp(∞ − ∞)` poison the sum.
pub fn log_sum_exp(z: &[f32], t: f32) -> f32 {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x * t));
    let sum: f64 = z
        .chunks(512)
        .map(|block| block.iter().map(|&x| (x * t - max).exp()).sum::<f32>() as f64)
        .sum();
    max + sum.ln() as f32
}

/// Writes `softmax(z·t)` into `p` with one `exp` per entry; returns `log Σ exp(z·t)`.
pub(crate) fn softmax_into(z: &[f32], t: f32, p: &mut [f32]) -> f32 {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x * t));
    let mut sum = 0.0f64;
    for (zb, pb) in z.chunks(512).zip(p.chunks_mut(512)) {
        let mut block = 0.0f32;
        for (&x, e) in zb.iter().zip(pb.iter_mut()) {
            *e = (x * t - max).exp();
            block += *e;
        }
        sum += block as f64;
    }
    let inv = (1.0 / sum) as f32;
    for e in p.iter_mut() {
        *e *= inv;
    }
    max + sum.ln() as f32
}

/// `Ok` when a row's log-sum-exp is finite; otherwise the error naming the row.
pub(crate) fn finite(lse: f32, side: &'static str, row: u32) -> Result<(), KernelError> {
    if lse.is_finite() {
        Ok(())
    } else {
        Err(KernelError::NonFinite {
            side,
            row: row as usize,
        })
    }
}

/// The continuation rows of one side, grouped by row.
pub(crate) struct Continuations {
    pub(crate) rows: Vec<u32>,
    /// Per row (same order): the `(token, slot)` terms it serves.
    pub(crate) terms: Vec<Vec<(u32, u32)>>,
}

impl Continuations {
    pub(crate) fn new(merge: &MergePlan) -> Self {
        let mut sorted = merge.continuation.clone();
        sorted.sort_unstable();
        let mut rows: Vec<u32> = Vec::new();
        let mut terms: Vec<Vec<(u32, u32)>> = Vec::new();
        for (row, token, slot) in sorted {
            if rows.last() != Some(&row) {
                rows.push(row);
                terms.push(Vec::new());
            }
            if let Some(last) = terms.last_mut() {
                last.push((token, slot));
            }
        }
        Self { rows, terms }
    }
}

/// Sums the continuation log-probabilities of every slot: `σ_c`.
pub(crate) fn merge_shifts<S: LogitRows>(
    src: &S,
    merge: &MergePlan,
    cont: &Continuations,
    tau_inv: f32,
    row_chunk: usize,
    side: &'static str,
) -> Result<Vec<f64>, KernelError> {
    let v = src.vocab();
    let mut sigma = vec![0.0f64; merge.slots()];
    for (chunk_index, rows) in cont.rows.chunks(row_chunk).enumerate() {
        let base = chunk_index * row_chunk;
        let block = src.read(rows, side)?;
        let mut items: Vec<(usize, u32)> = rows.iter().copied().enumerate().collect();
        let lse = par_items(
            &mut items,
            &mut Vec::new(),
            || (),
            |_, &mut (i, row)| log_sum_exp(block.row(i, row, v), tau_inv),
        );
        for (i, &l) in lse.iter().enumerate() {
            finite(l, side, rows[i])?;
            let z = block.row(i, rows[i], v);
            for &(token, slot) in &cont.terms[base + i] {
                sigma[slot as usize] += (z[token as usize] * tau_inv - l) as f64;
            }
        }
    }
    Ok(sigma)
}
