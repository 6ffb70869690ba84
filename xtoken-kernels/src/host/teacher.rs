//! The teacher's side on the host: per compared slot, its top-K tokens and their merged
//! log-probabilities, and on request the confidence statistics of adaptive weighting.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Int, Tensor, TensorData};

use super::merge::{finite, log_sum_exp, merge_shifts, softmax_into, Continuations};
use super::rows::{float3, par_items, LogitRows, TensorRows};
use crate::checks::{check_tau, checked_targets};
use crate::error::KernelError;
use crate::spec::{ConfidenceStats, EntriesSpec};
use crate::TeacherEntries;

/// The teacher's entries on the host: ids and merged log-probabilities `[slots, k]`.
#[derive(Debug, Clone)]
pub struct HostEntries {
    /// Token ids, best first.
    pub ids: Vec<i64>,
    /// Merged, tempered log-probabilities (−∞ on skipped slots).
    pub logp: Vec<f32>,
    /// Entries per slot.
    pub k: usize,
    /// The confidence statistics, when asked for.
    pub confidence: Option<ConfidenceStats>,
}

/// The teacher's entries from any backend's logits `[B, T, V_T]`.
pub fn teacher_entries<B: Backend>(
    logits: FloatTensor<B>,
    spec: &EntriesSpec,
) -> Result<TeacherEntries<B>, KernelError> {
    let device = float3::<B>(logits.clone()).device();
    let src = TensorRows::<B>::new(logits);
    let host = teacher_entries_from(&src, spec)?;
    Ok(entries_to_device::<B>(host, src.vocab(), &device))
}

/// Uploads host entries as the [`TeacherEntries`] tensors.
pub fn entries_to_device<B: Backend>(
    host: HostEntries,
    vocab: usize,
    device: &B::Device,
) -> TeacherEntries<B> {
    let slots = host.ids.len() / host.k.max(1);
    let shape = [slots, host.k];
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(host.ids, shape), device);
    let logp = Tensor::<B, 2>::from_data(TensorData::new(host.logp, shape), device);
    TeacherEntries {
        ids: ids.into_primitive(),
        logp: logp.into_primitive().tensor(),
        k: host.k,
        vocab,
        confidence: host.confidence,
        ids_in_vocab: true,
    }
}

/// The teacher's entries from rows of its logits.
pub fn teacher_entries_from<S: LogitRows>(
    src: &S,
    spec: &EntriesSpec,
) -> Result<HostEntries, KernelError> {
    let (n, vt) = (src.rows(), src.vocab());
    spec.merge.check("teacher", n, vt)?;
    check_tau(spec.tau)?;
    let tau_inv = 1.0 / spec.tau;
    let row_chunk = spec.row_chunk.max(1);
    let k = spec.top_k.min(vt).max(1);
    let slots = spec.merge.slots();
    let cont = Continuations::new(&spec.merge);
    let sigma = merge_shifts(src, &spec.merge, &cont, tau_inv, row_chunk, "teacher")?;

    let mut ids = vec![0i64; slots * k];
    let mut logp = vec![f32::NEG_INFINITY; slots * k];
    let valid: Vec<(usize, u32)> = spec.merge.predicting().collect();
    let mut orders = Vec::new();
    for chunk in valid.chunks(row_chunk) {
        let rows: Vec<u32> = chunk.iter().map(|&(_, r)| r).collect();
        let block = src.read(&rows, "teacher")?;
        let mut items: Vec<(usize, u32)> = rows.iter().copied().enumerate().collect();
        let top = par_items(
            &mut items,
            &mut orders,
            || Vec::<u32>::with_capacity(vt),
            |order, &mut (i, row)| top_k_of(block.row(i, row, vt), tau_inv, k, order),
        );
        for (i, (lse, best)) in top.into_iter().enumerate() {
            let (slot, row) = chunk[i];
            finite(lse, "teacher", row)?;
            let z = block.row(i, row, vt);
            let shift = sigma[slot];
            for (j, &t) in best.iter().enumerate() {
                ids[slot * k + j] = t as i64;
                logp[slot * k + j] = ((z[t as usize] * tau_inv - lse) as f64 + shift) as f32;
            }
        }
    }
    let confidence = match &spec.next_token {
        Some(next) => Some(confidence(src, next, row_chunk)?),
        None => None,
    };
    Ok(HostEntries {
        ids,
        logp,
        k,
        confidence,
    })
}

/// A row's log-sum-exp and its `k` largest ids, best first (ties: the smaller id).
fn top_k_of(z: &[f32], tau_inv: f32, k: usize, order: &mut Vec<u32>) -> (f32, Vec<u32>) {
    let vt = z.len();
    let lse = log_sum_exp(z, tau_inv);
    order.clear();
    order.extend(0..vt as u32);
    let better = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b));
    if k < vt {
        order.select_nth_unstable_by(k - 1, better);
    }
    order[..k].sort_unstable_by(better);
    (lse, order[..k].to_vec())
}

/// Batch means of `log p[y]`, `Σ p log p` and `max p` over rows with a next token.
fn confidence<S: LogitRows>(
    src: &S,
    next: &[i32],
    row_chunk: usize,
) -> Result<ConfidenceStats, KernelError> {
    let v = src.vocab();
    let rows = checked_targets(next, src.rows(), v, "teacher next tokens")?;
    let mut sums = (0.0f64, 0.0f64, 0.0f64);
    let mut buffers = Vec::new();
    for chunk in rows.chunks(row_chunk) {
        let ids: Vec<u32> = chunk.iter().map(|&(r, _)| r).collect();
        let block = src.read(&ids, "teacher")?;
        let mut items: Vec<(usize, u32)> = ids.iter().copied().enumerate().collect();
        let stats = par_items(
            &mut items,
            &mut buffers,
            || vec![0.0f32; v],
            |p, &mut (i, row)| position_confidence(block.row(i, row, v), chunk[i].1 as i32, p),
        );
        for (i, (lse, lpy, plogp, maxp)) in stats.into_iter().enumerate() {
            finite(lse, "teacher", chunk[i].0)?;
            sums.0 += lpy as f64;
            sums.1 += plogp;
            sums.2 += maxp as f64;
        }
    }
    let count = rows.len().max(1) as f64;
    Ok(ConfidenceStats {
        neg_cross_entropy: sums.0 / count,
        neg_entropy: sums.1 / count,
        max_prob: sums.2 / count,
        positions: rows.len(),
    })
}

/// What a stored teacher pass keeps of each position of `[rows, V]` logits: its top-K tokens
/// and their tempered log-probabilities `z·τ⁻¹ − lse` (the chunk merge's terms before the
/// continuation shift), the tempered log-probability of the observed next token (the merge's
/// continuation term), and the untempered confidence terms of adaptive weighting. Every value
/// is computed by the very operations [`teacher_entries_from`] uses, so entries merged from
/// these equal the online ones bit for bit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PositionTargets {
    /// Entries per position.
    pub k: usize,
    /// Token ids `[rows, k]`, best first (ties: the smaller id).
    pub ids: Vec<u32>,
    /// Tempered log-probabilities `[rows, k]`.
    pub logp: Vec<f32>,
    /// Per row, the tempered log-probability of its next token (0 where it has none).
    pub observed: Vec<f32>,
    /// Per row, `log p[y]` at τ = 1 (0 where it has no next token).
    pub neg_ce: Vec<f32>,
    /// Per row, `Σ p log p` at τ = 1.
    pub neg_entropy: Vec<f64>,
    /// Per row, `max p` at τ = 1.
    pub max_prob: Vec<f32>,
    /// Per row, the observed next token's rank among all `V` logits: 1 + how many are larger
    /// (0 where it has none), which a served teacher's answer states beside its log-probability.
    pub observed_rank: Vec<u32>,
}

/// [`PositionTargets`] of every row of `src`; `next[r]` is row `r`'s observed next token
/// (`-1`: none).
pub fn position_targets_from<S: LogitRows>(
    src: &S,
    next: &[i32],
    top_k: usize,
    tau: f32,
    row_chunk: usize,
) -> Result<PositionTargets, KernelError> {
    let (n, vt) = (src.rows(), src.vocab());
    check_tau(tau)?;
    checked_targets(next, n, vt, "teacher next tokens")?;
    let tau_inv = 1.0 / tau;
    let k = top_k.min(vt).max(1);
    let mut out = PositionTargets {
        k,
        ids: Vec::with_capacity(n * k),
        logp: Vec::with_capacity(n * k),
        ..Default::default()
    };
    let all: Vec<u32> = (0..n as u32).collect();
    let mut scratches = Vec::new();
    for rows in all.chunks(row_chunk.max(1)) {
        let block = src.read(rows, "teacher")?;
        let mut items: Vec<(usize, u32)> = rows.iter().copied().enumerate().collect();
        let parts = par_items(
            &mut items,
            &mut scratches,
            || (Vec::<u32>::with_capacity(vt), vec![0.0f32; vt]),
            |(order, p), &mut (i, row)| {
                let z = block.row(i, row, vt);
                let (lse, best) = top_k_of(z, tau_inv, k, order);
                let y = next[row as usize];
                let observed = if y >= 0 {
                    z[y as usize] * tau_inv - lse
                } else {
                    0.0
                };
                let (_, neg_ce, plogp, maxp) = position_confidence(z, y, p);
                let rank = rank_of(z, y);
                (lse, best, observed, neg_ce, plogp, maxp, rank)
            },
        );
        for (i, (lse, best, observed, neg_ce, plogp, maxp, rank)) in parts.into_iter().enumerate() {
            finite(lse, "teacher", rows[i])?;
            let z = block.row(i, rows[i], vt);
            out.logp
                .extend(best.iter().map(|&t| z[t as usize] * tau_inv - lse));
            out.ids.extend(best);
            out.observed.push(observed);
            out.neg_ce.push(neg_ce);
            out.neg_entropy.push(plogp);
            out.max_prob.push(maxp);
            out.observed_rank.push(rank);
        }
    }
    Ok(out)
}

/// The rank of `z[y]` among `z`: 1 + how many entries are larger (0 without `y`).
fn rank_of(z: &[f32], y: i32) -> u32 {
    let Some(&zy) = usize::try_from(y).ok().and_then(|y| z.get(y)) else {
        return 0;
    };
    1 + z.iter().filter(|&&x| x > zy).count() as u32
}

/// [`PositionTargets`] of `[1, T, V]` logits on any backend.
pub fn position_targets<B: Backend>(
    logits: FloatTensor<B>,
    next: &[i32],
    top_k: usize,
    tau: f32,
    row_chunk: usize,
) -> Result<PositionTargets, KernelError> {
    position_targets_from(&TensorRows::<B>::new(logits), next, top_k, tau, row_chunk)
}

/// One row's log-sum-exp, `log p[y]` (0 without `y`), `Σ p log p` and `max p` at τ = 1, as
/// [`confidence`] sums them.
fn position_confidence(z: &[f32], y: i32, p: &mut [f32]) -> (f32, f32, f64, f32) {
    let lse = softmax_into(z, 1.0, p);
    let mut max = 0.0f32;
    let mut plogp = 0.0f64;
    for (&x, &pj) in z.iter().zip(p.iter()) {
        max = max.max(pj);
        if pj > 0.0 {
            plogp += pj as f64 * (x - lse) as f64;
        }
    }
    let neg_ce = if y >= 0 { z[y as usize] - lse } else { 0.0 };
    (lse, neg_ce, plogp, max)
}
