//! P-KL on the device. Before the row pass, W's row sums `r_s` (`pkl_row_mass`), which
//! `row_lse` weighs into each row's `ρ`, the re-normalization's denominator, while it reads the
//! row for its log-sum-exp. Then per chunk of `row_chunk` compared slots: `pkl_entries` (the
//! re-normalized projection at the teacher's kept ids, through W's transposed layout),
//! `slot_sums`, `pkl_grad` (one pass over the chunk's logits: their gradient, the projection's
//! backward through W's rows, and W's gradient) and `clear_scattered`. The student logits are
//! read twice in full (`row_lse`, `pkl_grad`) and their gradient written once.

use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::distill::{Evaluation, Widths};
use super::kernels::{self, BLOCK};
use super::launch::{as_f32, as_i32, note, read_i64, shape_of, Cube, Launcher, Streams};
use crate::checks::projection_width;
use crate::error::KernelError;
use crate::layout::ProjectionLayout;
use crate::{LossOutput, ProjectionTensors};

/// W on the device with its transposed layout, and the per-chunk buffers.
pub(super) struct Projection<R: CubeRuntime> {
    indices: CubeTensor<R>,
    weights: CubeTensor<R>,
    weights_dtype: DType,
    kw: usize,
    column_start: CubeTensor<R>,
    column_entries: CubeTensor<R>,
    /// `r_s`, W's row sums `[V_S]`.
    pub(super) row_mass: CubeTensor<R>,
    /// `g` of the chunk's kept entries, scattered over `[chunk, V_T]` (zero elsewhere).
    scattered: CubeTensor<R>,
    /// The chunk's loss terms and `σ` terms per kept entry.
    terms: CubeTensor<R>,
    sigma_terms: CubeTensor<R>,
}

impl<R: CubeRuntime> Projection<R> {
    /// Checks W against the logits' widths, lays out its columns (from the layout W was made
    /// with, or from its indices: one read) and sums its rows.
    pub(super) fn new<B: Cube<R>>(
        launcher: &Launcher<R>,
        widths: Widths,
        w: Option<ProjectionTensors<B>>,
    ) -> Result<Self, KernelError> {
        let w = w.ok_or(KernelError::Invalid {
            what: "loss",
            why: "P-KL needs the projection W".into(),
        })?;
        let Widths { v, vt, chunk, k } = widths;
        let shapes = (shape_of(&w.indices), shape_of(&w.weights));
        let indices = as_i32::<B, R>(w.indices);
        let (kw, layout) = match w.layout {
            Some(layout) => (layout.fits((&shapes.0, &shapes.1), v, vt)?, layout),
            None => {
                let kw = projection_width(&shapes.0, &shapes.1, v)?;
                let host_indices = read_i64::<B, R>(
                    B::int_reshape(indices.clone(), Shape::new([v * kw])),
                    "projection indices",
                )?;
                (kw, ProjectionLayout::new(host_indices, [v, kw], vt)?)
            }
        };
        let weights_dtype = w.weights.dtype;
        let weights = as_f32::<B, R>(w.weights);
        let signed = |v: &[u32]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let projection = Self {
            indices,
            weights,
            weights_dtype,
            kw,
            column_start: launcher.ints(&signed(&layout.columns.start_for(vt))),
            column_entries: launcher.ints(&signed(&layout.columns.slots)),
            row_mass: launcher.zeros(v, DType::F32),
            scattered: launcher.zeros(chunk * vt, DType::F32),
            terms: launcher.zeros(chunk * k, DType::F32),
            sigma_terms: launcher.zeros(chunk * k, DType::F32),
        };
        projection.sum_rows(launcher, v);
        Ok(projection)
    }

    /// `pkl_row_mass`: W's row sums.
    fn sum_rows(&self, launcher: &Launcher<R>, v: usize) {
        let (count, dim) = launcher.elementwise(v);
        note(
            "pkl_row_mass",
            Streams::other(v * self.kw * 8),
            Streams::other(v * 4),
        );
        unsafe {
            kernels::pkl_row_mass::launch_unchecked::<R>(
                &launcher.client,
                count,
                dim,
                launcher.address,
                self.indices.clone().into_array_arg(),
                self.weights.clone().into_array_arg(),
                self.row_mass.clone().into_array_arg(),
                v,
                self.kw,
            );
        }
    }
}

/// P-KL; W's gradient too when `want_weights`.
pub(super) fn evaluate<B: Cube<R>, R: CubeRuntime>(
    mut e: Evaluation<'_, R>,
    want_weights: bool,
) -> Result<LossOutput<B>, KernelError> {
    let p = e.projection.take().ok_or(KernelError::Invalid {
        what: "loss",
        why: "P-KL needs the projection W".into(),
    })?;
    let gw = want_weights.then(|| e.launcher.zeros(e.v * p.kw, DType::F32));
    let mut first = 0;
    while first < e.plan.valid {
        let count = e.chunk.min(e.plan.valid - first);
        entries(&e, &p, (first, count))?;
        slot_sums(&e, &p, (first, count));
        grad(&e, &p, gw.as_ref(), (first, count))?;
        clear_scattered(&e, &p, (first, count));
        first += count;
    }
    let grad_weights = gw.map(|gw| {
        let gw = B::float_reshape(gw, Shape::new([e.v, p.kw]));
        match p.weights_dtype {
            DType::F32 => gw,
            other => B::float_cast(gw, other.into()),
        }
    });
    e.finish::<B>(grad_weights)
}

/// The rows' `ρ`, which `row_lse` summed for P-KL.
fn row_rho<'a, R: CubeRuntime>(e: &'a Evaluation<'_, R>) -> Result<&'a CubeTensor<R>, KernelError> {
    e.mass.as_ref().ok_or(KernelError::Invalid {
        what: "loss",
        why: "P-KL needs the rows' mass through W".into(),
    })
}

/// `pkl_entries`: per kept entry of the chunk, its loss term, `σ` term and scattered `g`.
fn entries<R: CubeRuntime>(
    e: &Evaluation<'_, R>,
    p: &Projection<R>,
    (first, n): (usize, usize),
) -> Result<(), KernelError> {
    let (launcher, plan) = (&e.launcher, &e.plan);
    let rho = row_rho(e)?;
    let (count, dim) = launcher.elementwise(n * e.k);
    // Each kept entry gathers W's column of its id: on average |W| / V_T entries.
    let entries = n * e.k;
    let column = (e.v * p.kw).div_ceil(e.teacher_vocab.max(1));
    note(
        "pkl_entries",
        Streams::logits(entries * column * e.z.dtype.size())
            + Streams::other(entries * (16 + column * 8)),
        Streams::other(entries * 12),
    );
    unsafe {
        kernels::pkl_entries::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            e.z.clone().into_array_arg(),
            e.lse.clone().into_array_arg(),
            e.sigma.clone().into_array_arg(),
            plan.valid_slot.clone().into_array_arg(),
            plan.valid_row.clone().into_array_arg(),
            e.teacher_ids.clone().into_array_arg(),
            e.teacher_logp.clone().into_array_arg(),
            p.column_start.clone().into_array_arg(),
            p.column_entries.clone().into_array_arg(),
            p.weights.clone().into_array_arg(),
            rho.clone().into_array_arg(),
            p.terms.clone().into_array_arg(),
            p.sigma_terms.clone().into_array_arg(),
            p.scattered.clone().into_array_arg(),
            first,
            n,
            e.k,
            p.kw,
            e.v,
            e.teacher_vocab,
            e.tau_inv,
            e.spec.eps,
            e.dtype,
        );
    }
    Ok(())
}

/// `slot_sums`: each slot's loss and `Σh` from its entries' terms.
fn slot_sums<R: CubeRuntime>(e: &Evaluation<'_, R>, p: &Projection<R>, (first, n): (usize, usize)) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.per_item(n);
    note(
        "slot_sums",
        Streams::other(n * e.k * 8),
        Streams::other(n * 8),
    );
    unsafe {
        kernels::slot_sums::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            p.terms.clone().into_array_arg(),
            p.sigma_terms.clone().into_array_arg(),
            e.plan.valid_slot.clone().into_array_arg(),
            e.loss.clone().into_array_arg(),
            e.dsigma.clone().into_array_arg(),
            first,
            n,
            e.k,
            BLOCK,
        );
    }
}

/// `pkl_grad`: the chunk's logits gradient and its share of W's gradient, in one pass over
/// the chunk's logits, one unit per student id.
fn grad<R: CubeRuntime>(
    e: &Evaluation<'_, R>,
    p: &Projection<R>,
    gw: Option<&CubeTensor<R>>,
    (first, n): (usize, usize),
) -> Result<(), KernelError> {
    if e.grad.is_none() && gw.is_none() {
        return Ok(());
    }
    let (launcher, rho) = (&e.launcher, row_rho(e)?);
    let rows = n * e.v * e.z.dtype.size();
    let w_bytes = e.v * p.kw * 4;
    let (grad_read, grad_written) = match (&e.grad, gw) {
        (Some(_), Some(_)) => (w_bytes, Streams::gradient(rows) + Streams::other(w_bytes)),
        (Some(_), None) => (0, Streams::gradient(rows)),
        _ => (w_bytes, Streams::other(w_bytes)),
    };
    // W's ids and weights once, the chunk's scattered `g` (the region its gathers span).
    note(
        "pkl_grad",
        Streams::logits(rows)
            + Streams::other(2 * w_bytes + grad_read + n * (e.teacher_vocab * 4 + 8)),
        grad_written,
    );
    // Placeholders bind the outputs not asked for (never touched: left unset).
    let placeholder = |dtype| launcher.empty(Shape::new([1]), dtype);
    let (count, dim) = launcher.elementwise(e.v);
    unsafe {
        kernels::pkl_grad::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            e.z.clone().into_array_arg(),
            e.lse.clone().into_array_arg(),
            e.sigma.clone().into_array_arg(),
            e.dsigma.clone().into_array_arg(),
            rho.clone().into_array_arg(),
            e.plan.valid_slot.clone().into_array_arg(),
            e.plan.valid_row.clone().into_array_arg(),
            p.indices.clone().into_array_arg(),
            p.weights.clone().into_array_arg(),
            p.scattered.clone().into_array_arg(),
            e.grad
                .clone()
                .unwrap_or_else(|| placeholder(e.z.dtype))
                .into_array_arg(),
            gw.cloned()
                .unwrap_or_else(|| placeholder(DType::F32))
                .into_array_arg(),
            first,
            n,
            e.v,
            e.teacher_vocab,
            e.tau_inv,
            e.c,
            e.scale,
            p.kw,
            e.grad.is_some(),
            gw.is_some(),
            e.dtype,
        );
    }
    Ok(())
}

/// `clear_scattered`: zeroes the chunk's scattered entries for the next chunk.
fn clear_scattered<R: CubeRuntime>(
    e: &Evaluation<'_, R>,
    p: &Projection<R>,
    (first, n): (usize, usize),
) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.elementwise(n * e.k);
    note(
        "clear_scattered",
        Streams::other(n * e.k * 4),
        Streams::other(n * e.k * 4),
    );
    unsafe {
        kernels::clear_scattered::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            p.scattered.clone().into_array_arg(),
            e.plan.valid_slot.clone().into_array_arg(),
            e.teacher_ids.clone().into_array_arg(),
            first,
            n,
            e.k,
            e.teacher_vocab,
        );
    }
}
