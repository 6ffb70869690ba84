//! The teacher's side on the device: `row_lse` (with the top-K's split of each row),
//! `merge_shift`, then `top_k` (one more pass: the entries above the split bin, the bin's
//! candidates sorted; bitonic sort) per compared slot, and `confidence_rows` on request.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::kernels::{self, BLOCK};
use super::launch::{
    check_rows, float_dtype, logits_shape, merge_shifts, note, read_f32, row_lse, top_k, Cube,
    Launcher, PlanArrays, RowLse, RowPass, Split, Streams, TopK,
};
use crate::checks::{check_tau, checked_targets};
use crate::error::KernelError;
use crate::spec::{ConfidenceStats, EntriesSpec};
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
    let tau_inv = 1.0 / spec.tau;
    let plan = PlanArrays::new(&spec.merge, &launcher);
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
    } = row_lse(&launcher, &z, (n, v, tau_inv), pass);
    let splits = splits.ok_or(KernelError::Invalid {
        what: "teacher logits",
        why: "the row pass made no split".into(),
    })?;
    let sigma = merge_shifts(&launcher, &z, &lse, &plan, (slots, v, tau_inv));
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
    top_k(&launcher, &z, &plan, to, (v, k, tau_inv));
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
            launcher.ints(&row_ids).into_array_arg(),
            launcher.ints(&targets).into_array_arg(),
            stats.clone().into_array_arg(),
            rows.len(),
            v,
            BLOCK,
            float_dtype(z),
        );
    }
    check_rows::<B, R>(
        launcher,
        (bad, row_ids.iter().map(|&r| r as u32)),
        (&stats, f32::NAN),
        "teacher",
    )?;
    let stats = read_f32::<B, R>(stats)?;
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
