//! P-KL on the device: W's row sums once (`pkl_row_mass`), then per chunk of `row_chunk`
//! compared slots: `pkl_mass` (the re-normalization's denominator `ρ` per slot),
//! `pkl_entries` (the re-normalized projection at the teacher's kept ids, through W's
//! transposed layout), `slot_sums`, the predicting rows' gradient (the projection's backward to
//! `p̂`, a gather through W's rows), `pkl_grad_weights` (to W's values) and `clear_scattered`.

use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::distill::{Evaluation, GradMode};
use super::kernels::{self, BLOCK};
use super::launch::{as_f32, as_i32, read_i64, shape_of, Cube};
use crate::checks::projection_width;
use crate::error::KernelError;
use crate::layout::ProjectionLayout;
use crate::{LossOutput, ProjectionTensors};

/// W on the device with its transposed layout, and the per-chunk buffers.
struct Projection<R: CubeRuntime> {
    indices: CubeTensor<R>,
    weights: CubeTensor<R>,
    weights_dtype: DType,
    kw: usize,
    column_start: CubeTensor<R>,
    column_entries: CubeTensor<R>,
    /// `r_s`, W's row sums `[V_S]`.
    row_mass: CubeTensor<R>,
    /// The chunk's `ρ` per compared slot.
    mass: CubeTensor<R>,
    /// `g` of the chunk's kept entries, scattered over `[chunk, V_T]` (zero elsewhere).
    scattered: CubeTensor<R>,
    /// The chunk's loss terms and `σ` terms per kept entry.
    terms: CubeTensor<R>,
    sigma_terms: CubeTensor<R>,
}

impl<R: CubeRuntime> Projection<R> {
    /// Checks W against the logits' widths and lays out its columns: from the layout W was
    /// made with, or from its indices (one read).
    fn new<B: Cube<R>>(
        e: &Evaluation<'_, R>,
        w: ProjectionTensors<B>,
    ) -> Result<Self, KernelError> {
        let (v, vt, launcher) = (e.v, e.teacher_vocab, &e.launcher);
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
        Ok(Self {
            indices,
            weights,
            weights_dtype,
            kw,
            column_start: launcher.ints(&signed(&layout.columns.start_for(vt))),
            column_entries: launcher.ints(&signed(&layout.columns.slots)),
            row_mass: launcher.zeros(v, DType::F32),
            mass: launcher.zeros(e.chunk, DType::F32),
            scattered: launcher.zeros(e.chunk * vt, DType::F32),
            terms: launcher.zeros(e.chunk * e.k, DType::F32),
            sigma_terms: launcher.zeros(e.chunk * e.k, DType::F32),
        })
    }
}

/// P-KL; W's gradient too when `want_weights`.
pub(super) fn evaluate<B: Cube<R>, R: CubeRuntime>(
    e: Evaluation<'_, R>,
    w: ProjectionTensors<B>,
    want_weights: bool,
) -> Result<LossOutput<B>, KernelError> {
    let p = Projection::new::<B>(&e, w)?;
    let gw = want_weights.then(|| e.launcher.zeros(e.v * p.kw, DType::F32));
    row_mass(&e, &p);
    let mut first = 0;
    while first < e.plan.valid {
        let count = e.chunk.min(e.plan.valid - first);
        mass(&e, &p, (first, count));
        entries(&e, &p, (first, count));
        slot_sums(&e, &p, (first, count));
        e.predicting_grad(
            (first, count),
            GradMode::Projected {
                indices: &p.indices,
                weights: &p.weights,
                scattered: &p.scattered,
                mass: &p.mass,
                kw: p.kw,
            },
        );
        if let Some(gw) = &gw {
            grad_weights(&e, &p, gw, (first, count));
        }
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

/// `pkl_row_mass`: W's row sums.
fn row_mass<R: CubeRuntime>(e: &Evaluation<'_, R>, p: &Projection<R>) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.elementwise(e.v);
    unsafe {
        kernels::pkl_row_mass::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            p.indices.clone().into_array_arg(),
            p.weights.clone().into_array_arg(),
            p.row_mass.clone().into_array_arg(),
            e.v,
            p.kw,
        );
    }
}

/// `pkl_mass`: `ρ` of each compared slot of the chunk.
fn mass<R: CubeRuntime>(e: &Evaluation<'_, R>, p: &Projection<R>, (first, n): (usize, usize)) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.per_item(n);
    unsafe {
        kernels::pkl_mass::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            e.z.clone().into_array_arg(),
            e.lse.clone().into_array_arg(),
            e.plan.valid_row.clone().into_array_arg(),
            p.row_mass.clone().into_array_arg(),
            p.mass.clone().into_array_arg(),
            first,
            n,
            e.v,
            e.tau_inv,
            BLOCK,
            e.dtype,
        );
    }
}

/// `pkl_entries`: per kept entry of the chunk, its loss term, `σ` term and scattered `g`.
fn entries<R: CubeRuntime>(e: &Evaluation<'_, R>, p: &Projection<R>, (first, n): (usize, usize)) {
    let (launcher, plan) = (&e.launcher, &e.plan);
    let (count, dim) = launcher.elementwise(n * e.k);
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
            p.mass.clone().into_array_arg(),
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
}

/// `slot_sums`: each slot's loss and `Σh` from its entries' terms.
fn slot_sums<R: CubeRuntime>(e: &Evaluation<'_, R>, p: &Projection<R>, (first, n): (usize, usize)) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.per_item(n);
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

/// `pkl_grad_weights`: the chunk's share of W's gradient, a gather per row of W.
fn grad_weights<R: CubeRuntime>(
    e: &Evaluation<'_, R>,
    p: &Projection<R>,
    gw: &CubeTensor<R>,
    (first, n): (usize, usize),
) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.elementwise(e.v);
    unsafe {
        kernels::pkl_grad_weights::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            e.z.clone().into_array_arg(),
            e.lse.clone().into_array_arg(),
            e.sigma.clone().into_array_arg(),
            e.dsigma.clone().into_array_arg(),
            e.plan.valid_slot.clone().into_array_arg(),
            e.plan.valid_row.clone().into_array_arg(),
            p.indices.clone().into_array_arg(),
            p.scattered.clone().into_array_arg(),
            p.mass.clone().into_array_arg(),
            gw.clone().into_array_arg(),
            first,
            n,
            p.kw,
            e.v,
            e.teacher_vocab,
            e.tau_inv,
            e.scale,
            e.dtype,
        );
    }
}

/// `clear_scattered`: zeroes the chunk's scattered entries for the next chunk.
fn clear_scattered<R: CubeRuntime>(
    e: &Evaluation<'_, R>,
    p: &Projection<R>,
    (first, n): (usize, usize),
) {
    let launcher = &e.launcher;
    let (count, dim) = launcher.elementwise(n * e.k);
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
