//! The teacher's side on the device: `row_lse` (with the top-K's split of each row),
//! `merge_shift`, then `top_k` (one more pass: the entries above the split bin, the bin's
//! candidates sorted; bitonic sort) per compared slot, and `confidence_rows` on request; and
//! for a stored or served teacher, the same top-K of every row with `observed_rows` (the next
//! token's log-probability and rank).

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::kernels::{self, BLOCK};
use super::launch::{
    check_rows, float_dtype, logits_shape, merge_shifts, note, read_f32, read_i64, row_lse, top_k,
    Cube, Launcher, PlanArrays, RowLse, RowPass, Split, Streams, TopK,
};
use crate::checks::{check_tau, checked_targets};
use crate::error::KernelError;
use crate::host::PositionTargets;
use crate::spec::{ConfidenceStats, EntriesSpec, MergePlan};
use crate::{host, TeacherEntries};

/// The teacher's entries on the device: per compared slot its top-K ids (best first) and merged
/// log-probabilities, and on request the confidence statistics.
pub(super) fn teacher_entries<B: Cube<R>, R: CubeRuntime>(
    logits: CubeTensor<R>,
    spec: &EntriesSpec,
) -> Result<TeacherEntries<B>, KernelError> {
    check_tau(spec.tau)?;
    let z = into_contiguous(logits);
    let [b, t, v] = logits_shape(&z, "teacher logits")?;
    let n = b * t;
    spec.merge.check("teacher", n, v)?;
    let slots = spec.merge.slots();
    if slots == 0 || v == 0 {
        return host::teacher_entries::<B>(z, spec);
    }
    let k = spec.top_k.min(v).max(1);
    let next = match &spec.next_token {
        None => None,
        Some(next) => Some(checked_targets(next, n, v, "teacher next tokens")?),
    };
    let launcher = Launcher::of(&z, slots * k);
    let plan = PlanArrays::new(&spec.merge, &launcher);
    let top = top_entries(&launcher, &z, &plan, (slots, v, k, 1.0 / spec.tau))?;
    let (ids, logp, bad) = (top.ids, top.logp, top.bad);
    let rows = spec.merge.rows_read();
    check_rows::<B, R>(&launcher, (bad, rows), (&logp, f32::INFINITY), "teacher")?;
    let confidence = match next {
        None => None,
        Some(rows) => Some(confidence::<B, R>(&launcher, &z, &rows, (n, v))?),
    };
    Ok(TeacherEntries {
        ids,
        logp,
        k,
        vocab: v,
        confidence,
        ids_in_vocab: true,
    })
}

/// What [`top_entries`] made: `[slots, k]` ids and values, and the rows' log-sum-exps and flags.
struct Top<R: CubeRuntime> {
    ids: CubeTensor<R>,
    logp: CubeTensor<R>,
    lse: CubeTensor<R>,
    bad: CubeTensor<R>,
}

/// Per compared slot of `plan`, its `k` best entries as merged, tempered log-probabilities
/// (−∞ on skipped slots): `row_lse` with the split, `merge_shift`, `top_k`.
fn top_entries<R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    plan: &PlanArrays<R>,
    (slots, v, k, tau_inv): (usize, usize, usize, f32),
) -> Result<Top<R>, KernelError> {
    let n = z.meta.shape.num_elements() / v.max(1);
    let split = Split {
        keep: k,
        excluded: None,
    };
    let pass = RowPass {
        weights: None,
        split: Some(split),
    };
    let RowLse {
        lse, bad, splits, ..
    } = row_lse(launcher, z, (n, v, tau_inv), pass);
    let splits = splits.ok_or_else(|| KernelError::Invalid {
        what: "teacher logits",
        why: "the row pass returned no top-K split".into(),
    })?;
    let sigma = merge_shifts(launcher, z, &lse, plan, (slots, v, tau_inv));
    let ids = launcher.zeros_of(Shape::new([slots, k]), DType::I32);
    let logp = launcher.empty(Shape::new([slots, k]), DType::F32);
    let (count, dim) = launcher.elementwise(slots * k);
    note("fill", Streams::default(), Streams::other(slots * k * 4));
    unsafe {
        kernels::fill::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            logp.clone().into_array_arg(),
            f32::NEG_INFINITY,
            slots * k,
        );
    }
    let to = TopK {
        lse: &lse,
        sigma: &sigma,
        splits: &splits,
        excluded: None,
        ids: &ids,
        values: &logp,
    };
    top_k(launcher, z, plan, to, (v, k, tau_inv));
    Ok(Top {
        ids,
        logp,
        lse,
        bad,
    })
}

/// [`PositionTargets`] of `[B, T, V]` logits where they lie: each row's top-K by the training
/// step's own launches (every row its own slot, no continuation, so each value is
/// `z·τ⁻¹ − lse`), its observed token's log-probability and rank (`observed_rows`), and on
/// request the confidence terms (`confidence_rows`). What comes back to the host is
/// `O(rows · K)`, not the `[rows, V]` logits.
pub(super) fn position_targets<B: Cube<R>, R: CubeRuntime>(
    logits: CubeTensor<R>,
    next: &[i32],
    top_k: usize,
    tau: f32,
    confidence: bool,
) -> Result<PositionTargets, KernelError> {
    check_tau(tau)?;
    let z = into_contiguous(logits);
    let [b, t, v] = logits_shape(&z, "teacher logits")?;
    let n = b * t;
    checked_targets(next, n, v, "teacher next tokens")?;
    if n == 0 || v == 0 {
        return host::position_targets::<B>(z, next, top_k, tau, host::ROW_CHUNK, confidence);
    }
    let k = top_k.min(v).max(1);
    let tau_inv = 1.0 / tau;
    let launcher = Launcher::of(&z, n * k);
    let each_row = MergePlan {
        rows: n,
        predict_row: (0..n as u32).map(Some).collect(),
        continuation: Vec::new(),
    };
    let plan = PlanArrays::new(&each_row, &launcher);
    let top = top_entries(&launcher, &z, &plan, (n, v, k, tau_inv))?;
    let all_rows = 0..n as u32;
    check_rows::<B, R>(
        &launcher,
        (top.bad, all_rows),
        (&top.logp, f32::INFINITY),
        "teacher",
    )?;
    let (observed, observed_rank) = observed::<B, R>(&launcher, &z, &top.lse, next, (v, tau_inv))?;
    let flat = Shape::new([n * k]);
    let mut out = PositionTargets {
        k,
        ids: read_i64::<B, R>(B::int_reshape(top.ids, flat.clone()), "teacher ids")?
            .into_iter()
            .map(|t| t as u32)
            .collect(),
        logp: read_f32::<B, R>(B::float_reshape(top.logp, flat))?,
        observed,
        observed_rank,
        ..Default::default()
    };
    if confidence {
        // At τ = 1 the tempered log-sum-exps are the untempered ones.
        let lse = if tau_inv == 1.0 {
            top.lse
        } else {
            row_lse(&launcher, &z, (n, v, 1.0), RowPass::plain()).lse
        };
        let targets: Vec<i32> = next.iter().map(|&y| y.max(0)).collect();
        let rows: Vec<i32> = (0..n as i32).collect();
        let stats = confidence_rows::<B, R>(&launcher, &z, &lse, (&rows, &targets), v)?;
        for (row, s) in stats.chunks_exact(3).enumerate() {
            out.neg_ce.push(if next[row] >= 0 { s[0] } else { 0.0 });
            out.neg_entropy.push(s[1] as f64);
            out.max_prob.push(s[2]);
        }
    }
    Ok(out)
}

/// Per row, its next token's tempered log-probability and rank (both 0 where it has none).
fn observed<B: Cube<R>, R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    next: &[i32],
    (v, tau_inv): (usize, f32),
) -> Result<(Vec<f32>, Vec<u32>), KernelError> {
    let (rows, targets): (Vec<i32>, Vec<i32>) = next
        .iter()
        .enumerate()
        .filter(|(_, &y)| y >= 0)
        .map(|(r, &y)| (r as i32, y))
        .unzip();
    let (mut observed, mut ranks) = (vec![0.0f32; next.len()], vec![0u32; next.len()]);
    if rows.is_empty() {
        return Ok((observed, ranks));
    }
    let out = launcher.zeros(2 * rows.len(), DType::F32);
    let (count, dim) = launcher.per_item(rows.len());
    note(
        "observed_rows",
        Streams::logits(rows.len() * v * z.dtype.size()) + Streams::other(rows.len() * 12),
        Streams::other(rows.len() * 8),
    );
    unsafe {
        kernels::observed_rows::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            launcher.ints(&rows).into_array_arg(),
            launcher.ints(&targets).into_array_arg(),
            out.clone().into_array_arg(),
            rows.len(),
            v,
            tau_inv,
            BLOCK,
            float_dtype(z),
        );
    }
    let found = read_f32::<B, R>(out)?;
    for (&row, pair) in rows.iter().zip(found.chunks_exact(2)) {
        observed[row as usize] = pair[0];
        ranks[row as usize] = pair[1] as u32;
    }
    Ok((observed, ranks))
}

/// Batch means of `log p[y]`, `Σ p log p` and `max p` (untempered) over the `(row, y)` pairs.
fn confidence<B: Cube<R>, R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    rows: &[(u32, u32)],
    (n, v): (usize, usize),
) -> Result<ConfidenceStats, KernelError> {
    if rows.is_empty() {
        return Ok(ConfidenceStats::default());
    }
    let RowLse { lse, bad, .. } = row_lse(launcher, z, (n, v, 1.0), RowPass::plain());
    let (row_ids, targets): (Vec<i32>, Vec<i32>) =
        rows.iter().map(|&(r, y)| (r as i32, y as i32)).unzip();
    check_rows::<B, R>(
        launcher,
        (bad, row_ids.iter().map(|&r| r as u32)),
        (&lse, f32::NAN),
        "teacher",
    )?;
    let stats = confidence_rows::<B, R>(launcher, z, &lse, (&row_ids, &targets), v)?;
    let mut sums = [0.0f64; 3];
    for row in stats.chunks_exact(3) {
        for (sum, &x) in sums.iter_mut().zip(row) {
            *sum += x as f64;
        }
    }
    let count = rows.len() as f64;
    Ok(ConfidenceStats {
        neg_cross_entropy: sums[0] / count,
        neg_entropy: sums[1] / count,
        max_prob: sums[2] / count,
        positions: rows.len(),
    })
}

/// Per `(row, y)` pair, `(log p[y], Σ p log p, max p)` of the untempered distribution, given
/// the rows' untempered log-sum-exps.
fn confidence_rows<B: Cube<R>, R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    (rows, targets): (&[i32], &[i32]),
    v: usize,
) -> Result<Vec<f32>, KernelError> {
    let stats = launcher.zeros(3 * rows.len(), DType::F32);
    let (count, dim) = launcher.per_item(rows.len());
    note(
        "confidence_rows",
        Streams::logits(rows.len() * v * z.dtype.size()) + Streams::other(rows.len() * 12),
        Streams::other(rows.len() * 12),
    );
    unsafe {
        kernels::confidence_rows::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            launcher.ints(rows).into_array_arg(),
            launcher.ints(targets).into_array_arg(),
            stats.clone().into_array_arg(),
            rows.len(),
            v,
            BLOCK,
            float_dtype(z),
        );
    }
    read_f32::<B, R>(stats)
}
