//! The teacher's side on the host: per compared slot, its top-K tokens and their merged
//! log-probabilities, and on request the confidence statistics of adaptive weighting.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};

use super::merge::{finite, log_sum_exp, merge_shifts, Continuations};
use super::rows::{float3, par_items, LogitRows, TensorRows};
use crate::checks::{check_tau, checked_targets};
use crate::error::KernelError;
use crate::spec::{ConfidenceStats, EntriesSpec};
use crate::TeacherEntries;

/// The teacher's entries on the host: ids and merged log-probabilities `[slots, k]`.
#[derive(Debug, Clone)]
pub struct HostEntries {
    /// Token ids, best first.
    pub ids: Vec<u32>,
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
    Ok(entries_to_device::<B>(&host, src.vocab(), &device))
}

/// Uploads host entries as the [`TeacherEntries`] tensors: the ids go straight from `u32` into
/// the backend's own integer type (one pass, no wider copy on the way).
pub fn entries_to_device<B: Backend>(
    host: &HostEntries,
    vocab: usize,
    device: &B::Device,
) -> TeacherEntries<B> {
    let slots = host.ids.len() / host.k.max(1);
    let shape = [slots, host.k];
    let own: Vec<B::IntElem> = host.ids.iter().map(|&t| (t as i64).elem()).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(own, shape), device);
    let logp = Tensor::<B, 2>::from_data(TensorData::new(host.logp.clone(), shape), device);
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

    let mut ids = vec![0u32; slots * k];
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
            || Vec::<u64>::with_capacity(vt),
            |order, &mut (i, row)| top_k_of(block.row(i, row, vt), tau_inv, k, order),
        );
        for (i, (lse, best)) in top.into_iter().enumerate() {
            let (slot, row) = chunk[i];
            finite(lse, "teacher", row)?;
            let z = block.row(i, row, vt);
            let shift = sigma[slot];
            for (j, &t) in best.iter().enumerate() {
                ids[slot * k + j] = t;
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
fn top_k_of(z: &[f32], tau_inv: f32, k: usize, order: &mut Vec<u64>) -> (f32, Vec<u32>) {
    let lse = log_sum_exp(z, tau_inv);
    select_top(z, k, None, order);
    (lse, ids_of(order))
}

/// The key that sorts `(x, id)` best first, ties to the smaller id, as a plain `u64`: the high
/// half is `x`'s `total_cmp` order reversed, the low half the id. Sorting keys needs no look-up
/// into the row per comparison.
fn best_first_key(x: f32, id: u32) -> u64 {
    let signed = x.to_bits() as i32;
    let ordered = signed ^ ((((signed >> 31) as u32) >> 1) as i32);
    let ascending = (ordered as u32) ^ 0x8000_0000;
    (u64::from(!ascending) << 32) | u64::from(id)
}

/// The `k` largest ids of `z` as keys in `order` (the id is a key's low half), best first (ties:
/// the smaller id), in one pass over the row: a candidate joins while it beats the `k`-th best
/// found so far, and the candidates are cut back to `k` whenever they fill `4k`. With `y`, also
/// the rank of `z[y]` (1 + how many entries are larger; 0 without `y`), counted in the same
/// pass.
fn select_top(z: &[f32], k: usize, y: Option<usize>, order: &mut Vec<u64>) -> u32 {
    let k = k.min(z.len());
    // Keeps the best `k`; returns the `k`-th best value.
    let cut = |order: &mut Vec<u64>| {
        if order.len() <= k {
            return None;
        }
        order.select_nth_unstable(k - 1);
        order.truncate(k);
        Some(z[order[k - 1] as u32 as usize])
    };
    order.clear();
    let cap = (4 * k).max(64);
    let zy = y.and_then(|y| z.get(y)).copied();
    let mut larger = 0u32;
    // Until the first cut every entry joins; after it only those strictly above the k-th (an
    // equal value later in the row loses its tie to the smaller id already kept).
    let mut floor: Option<f32> = None;
    for (i, &x) in z.iter().enumerate() {
        if zy.is_some_and(|zy| x > zy) {
            larger += 1;
        }
        if floor.is_some_and(|f| x.total_cmp(&f).is_le()) || k == 0 {
            continue;
        }
        order.push(best_first_key(x, i as u32));
        if order.len() == cap {
            floor = cut(order);
        }
    }
    cut(order);
    order.sort_unstable();
    zy.map_or(0, |_| 1 + larger)
}

/// The ids of [`select_top`]'s keys.
fn ids_of(order: &[u64]) -> Vec<u32> {
    order.iter().map(|&key| key as u32).collect()
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
            || (),
            |_, &mut (i, row)| position_confidence(block.row(i, row, v), chunk[i].1 as i32),
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

/// One row's place in [`PositionTargets`]: its ids and values.
type RowOut<'a> = (&'a mut [u32], &'a mut [f32]);

/// Rows of logits a stored or served teacher's pass reads at a time (on a backend whose
/// logits are not host memory, each chunk is one copy to the host).
pub const ROW_CHUNK: usize = 64;

/// [`PositionTargets`] of every row of `src`; `next[r]` is row `r`'s observed next token
/// (`-1`: none). Without `confidence`, the confidence terms are neither computed nor kept
/// (their vectors stay empty): a row is then read once for its top-K and the observed token's
/// rank, and once for its log-sum-exp.
pub fn position_targets_from<S: LogitRows>(
    src: &S,
    next: &[i32],
    top_k: usize,
    tau: f32,
    row_chunk: usize,
    confidence: bool,
) -> Result<PositionTargets, KernelError> {
    let (n, vt) = (src.rows(), src.vocab());
    check_tau(tau)?;
    checked_targets(next, n, vt, "teacher next tokens")?;
    let tau_inv = 1.0 / tau;
    let k = top_k.min(vt).max(1);
    let mut out = PositionTargets {
        k,
        ids: vec![0; n * k],
        logp: vec![f32::NEG_INFINITY; n * k],
        ..Default::default()
    };
    // Each row's entries are written in place, on every core.
    let mut outputs: Vec<RowOut<'_>> = out.ids.chunks_mut(k).zip(out.logp.chunks_mut(k)).collect();
    let mut scratches = Vec::new();
    let row_chunk = row_chunk.max(1);
    for (c, chunk) in outputs.chunks_mut(row_chunk).enumerate() {
        let rows: Vec<u32> = (0..chunk.len())
            .map(|i| (c * row_chunk + i) as u32)
            .collect();
        let block = src.read(&rows, "teacher")?;
        let mut items: Vec<(usize, u32, &mut RowOut<'_>)> = chunk
            .iter_mut()
            .enumerate()
            .map(|(i, o)| (i, rows[i], o))
            .collect();
        let parts = par_items(
            &mut items,
            &mut scratches,
            || Vec::<u64>::with_capacity(vt),
            |order, (i, row, (ids, logp))| {
                let z = block.row(*i, *row, vt);
                let y = next[*row as usize];
                let rank = select_top(z, k, usize::try_from(y).ok(), order);
                let stats = confidence.then(|| position_confidence(z, y));
                // At τ = 1 the confidence pass's log-sum-exp is the tempered one, bit for bit.
                let lse = match stats {
                    Some((lse, ..)) if tau_inv == 1.0 => lse,
                    _ => log_sum_exp(z, tau_inv),
                };
                for ((id, l), &key) in ids.iter_mut().zip(logp.iter_mut()).zip(order.iter()) {
                    *id = key as u32;
                    *l = z[*id as usize] * tau_inv - lse;
                }
                let observed = if y >= 0 {
                    z[y as usize] * tau_inv - lse
                } else {
                    0.0
                };
                (lse, observed, stats, rank)
            },
        );
        for (i, (lse, observed, stats, rank)) in parts.into_iter().enumerate() {
            finite(lse, "teacher", rows[i])?;
            out.observed.push(observed);
            if let Some((_, neg_ce, plogp, maxp)) = stats {
                out.neg_ce.push(neg_ce);
                out.neg_entropy.push(plogp);
                out.max_prob.push(maxp);
            }
            out.observed_rank.push(rank);
        }
    }
    Ok(out)
}

/// [`PositionTargets`] of `[1, T, V]` logits on any backend.
pub fn position_targets<B: Backend>(
    logits: FloatTensor<B>,
    next: &[i32],
    top_k: usize,
    tau: f32,
    row_chunk: usize,
    confidence: bool,
) -> Result<PositionTargets, KernelError> {
    let rows = TensorRows::<B>::new(logits);
    position_targets_from(&rows, next, top_k, tau, row_chunk, confidence)
}

/// One row's log-sum-exp, `log p[y]` (0 without `y`), `Σ p log p` and `max p` at τ = 1, as
/// [`confidence`] sums them, in one pass after the row's max: with `e = exp(z − max)` and
/// `S = Σ e` (summed as [`log_sum_exp`] sums, so the log-sum-exp is its very bits),
/// `Σ p log p = Σ e·(z − max) / S − ln S` and `max p = 1/S`.
fn position_confidence(z: &[f32], y: i32) -> (f32, f32, f64, f32) {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let (mut sum, mut tilt) = (0.0f64, 0.0f64);
    for block in z.chunks(512) {
        let (mut s, mut t) = (0.0f32, 0.0f32);
        for &x in block {
            let d = x - max;
            let e = d.exp();
            s += e;
            t += if e > 0.0 { e * d } else { 0.0 };
        }
        sum += s as f64;
        tilt += t as f64;
    }
    let lse = max + sum.ln() as f32;
    let plogp = tilt / sum - sum.ln();
    let neg_ce = if y >= 0 { z[y as usize] - lse } else { 0.0 };
    (lse, neg_ce, plogp, (1.0 / sum) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Values with many ties, both zeros and −∞.
    fn value() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => (-8i32..8).prop_map(|q| q as f32 * 0.5),
            2 => -10.0f32..10.0,
            1 => Just(-0.0f32),
            1 => Just(f32::NEG_INFINITY),
        ]
    }

    proptest! {
        /// The one-pass selection equals a full sort by value (descending, `total_cmp`) then
        /// id, and the rank counts the strictly larger entries.
        #[test]
        fn select_top_equals_a_full_sort(
            z in prop::collection::vec(value(), 1..700),
            k in 1usize..300,
            y in 0usize..700,
        ) {
            let y = y % z.len();
            let mut order = Vec::new();
            let rank = select_top(&z, k, Some(y), &mut order);
            let mut all: Vec<u32> = (0..z.len() as u32).collect();
            all.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
            all.truncate(k.min(z.len()));
            prop_assert_eq!(ids_of(&order), all);
            let larger = z.iter().filter(|&&x| x > z[y]).count() as u32;
            prop_assert_eq!(rank, 1 + larger);
        }
    }
}
