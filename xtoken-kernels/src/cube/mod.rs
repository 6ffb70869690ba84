//! [`XTokenBackend`] for burn's `CubeBackend` (wgpu, CUDA, any cubecl runtime): the teacher's
//! top-K extraction and the student side of every objective run in cubecl kernels
//! ([`kernels`]), on the logits where they lie, in their own float type.
//!
//! The teacher's entries: `row_lse`, `merge_shift`, then `top_k` (radix select, compaction,
//! bitonic sort) per compared slot, and `confidence_rows` on request.
//!
//! One distillation evaluation is a fixed sequence of launches, all deterministic:
//!
//! 1. `row_lse`: each logit row's log-sum-exp, reading the row once (online max and sum);
//! 2. `merge_shift`: the chunk merge, `σ_c` per slot from its continuation terms;
//! 3. KL: `kl_slots` (the fused log-softmax + top-K KL, one cube per compared slot), then the
//!    gradient rows (`predicting_grad`, `kl_grad_sparse`);
//!    P-KL, per chunk of `row_chunk` slots: `pkl_entries` (the sparse projection `Wᵀp̂` at the
//!    teacher's kept ids, through W's transposed layout), `slot_sums`, `predicting_grad` (the
//!    projection's backward to `p̂`, a gather through W's rows), `pkl_grad_weights` (to W's
//!    values), `clear_scattered`;
//!    ULD / GOLD / H-KL: `top_k` over the student's uncommon ids, `hybrid_slots`, then
//!    `predicting_grad` and `hybrid_grad_sparse`;
//! 4. `continuation_grad` and `zero_rows`: the merge's backward and the rows no slot reads;
//! 5. `scaled_sum`: the loss.
//!
//! The host does what is O(slots), O(|W|) or O(V): it checks the plan, lays it out as arrays,
//! transposes W's indices (a counting sort) and uploads the common set's tables; it reads back
//! per-row flags and the loss value to report non-finite rows by name.

mod kernels;

use std::sync::Arc;

use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensorOps};
use burn::tensor::{DType, FloatDType, Int, IntDType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::error::KernelError;
use crate::host::{check_tau, checked_targets, checked_teacher, Columns};
use crate::spec::{Confidence, GradRequest, LossSpec, MergePlan, Objective, TeacherSpec};
use crate::{host, LossOutput, ProjectionTensors, TeacherEntries, XTokenBackend};

pub use kernels::BLOCK;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> XTokenBackend
    for CubeBackend<R, F, I, BT>
{
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &TeacherSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        teacher_entries::<Self, R>(logits, spec)
    }

    fn xt_loss(
        logits: FloatTensor<Self>,
        projection: Option<ProjectionTensors<Self>>,
        teacher: Option<TeacherEntries<Self>>,
        spec: &LossSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        match &spec.objective {
            Objective::CrossEntropy { targets } => {
                cross_entropy::<Self, R>(logits, targets, want.logits)
            }
            Objective::Kl | Objective::Projected { .. } | Objective::Hybrid { .. } => {
                distill::<Self, R>(logits, projection, teacher, spec, want)
            }
        }
    }
}

/// The backend ops the launcher needs, on any `CubeBackend` (its float and int tensors are
/// both `CubeTensor<R>`).
trait Cube<R: CubeRuntime>:
    XTokenBackend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>
    + FloatTensorOps<Self>
    + IntTensorOps<Self>
{
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> Cube<R>
    for CubeBackend<R, F, I, BT>
{
}

/// Where the launches go, and the small host-built arrays they read.
struct Launcher<R: CubeRuntime> {
    client: ComputeClient<R>,
    device: R::Device,
    /// The kernels' address width, for the largest buffer of the evaluation.
    address: AddressType,
}

impl<R: CubeRuntime> Launcher<R> {
    /// For an evaluation on `t` whose buffers hold at most `largest` elements.
    fn of(t: &CubeTensor<R>, largest: usize) -> Self {
        Self {
            client: t.client.clone(),
            device: t.device.clone(),
            address: AddressType::from_len(largest.max(t.meta.num_elements())),
        }
    }

    /// An i32 array on the device (one element at least, so that an empty list still binds).
    fn ints(&self, data: &[i32]) -> CubeTensor<R> {
        let data: &[i32] = if data.is_empty() { &[0] } else { data };
        let handle = self.client.create_from_slice(bytemuck::cast_slice(data));
        CubeTensor::new_contiguous(
            self.client.clone(),
            self.device.clone(),
            Shape::new([data.len()]),
            handle,
            DType::I32,
        )
    }

    fn zeros(&self, len: usize, dtype: DType) -> CubeTensor<R> {
        zeros_client(
            self.client.clone(),
            self.device.clone(),
            Shape::new([len.max(1)]),
            dtype,
        )
    }

    fn empty(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        empty_device_contiguous_dtype(self.client.clone(), self.device.clone(), shape, dtype)
    }

    /// Launch geometry for one unit per element.
    fn elementwise(&self, n: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new(&self.client, n.max(1));
        (
            calculate_cube_count_elemwise(&self.client, n.max(1), dim),
            dim,
        )
    }

    /// Launch geometry for one cube of [`BLOCK`] units per item.
    fn per_item(&self, n: usize) -> (CubeCount, CubeDim) {
        (
            cubecl::server::CubeCountSelection::new(&self.client, n.max(1) as u32).cube_count(),
            CubeDim::new_1d(BLOCK as u32),
        )
    }
}

fn float_dtype(t: &CubeTensor<impl CubeRuntime>) -> StorageType {
    t.dtype.into()
}

/// The tensor as contiguous f32 (a no-op when it already is).
fn as_f32<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = if t.dtype == DType::F32 {
        t
    } else {
        B::float_cast(t, FloatDType::F32)
    };
    into_contiguous(t)
}

/// The tensor as contiguous i32.
fn as_i32<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = if t.dtype == DType::I32 {
        t
    } else {
        B::int_cast(t, IntDType::I32)
    };
    into_contiguous(t)
}

fn read_f32<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>) -> Result<Vec<f32>, KernelError> {
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| KernelError::Read {
            what: "loss",
            message: format!("{e:?}"),
        })
}

fn read_i64<B: Cube<R>, R: CubeRuntime>(
    t: CubeTensor<R>,
    what: &'static str,
) -> Result<Vec<i64>, KernelError> {
    Tensor::<B, 1, Int>::from_primitive(t)
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| KernelError::Read {
            what,
            message: format!("{e:?}"),
        })
}

/// `[min, max]` of an int tensor, read back as two numbers (not the tensor).
fn int_range<B: Cube<R>, R: CubeRuntime>(
    t: &CubeTensor<R>,
    what: &'static str,
) -> Result<(i64, i64), KernelError> {
    let flat = B::int_reshape(t.clone(), Shape::new([t.meta.num_elements()]));
    let both = B::int_cat(vec![B::int_min(flat.clone()), B::int_max(flat)], 0);
    let range = read_i64::<B, R>(both, what)?;
    Ok((range[0], range[1]))
}

fn shape_of(t: &CubeTensor<impl CubeRuntime>) -> Vec<usize> {
    t.meta.shape().to_vec()
}

/// `[B, T, V]` of a logits tensor.
fn logits_shape(
    z: &CubeTensor<impl CubeRuntime>,
    what: &'static str,
) -> Result<[usize; 3], KernelError> {
    let shape = shape_of(z);
    match shape.as_slice() {
        &[b, t, v] => Ok([b, t, v]),
        _ => Err(KernelError::Shape {
            what,
            expected: "[B, T, V]".into(),
            found: format!("{shape:?}"),
        }),
    }
}

/// The merge plan as CSR arrays: continuation terms by slot (for `σ`) and by row (for their
/// gradient), the compared slots, and the rows nothing reads.
struct PlanArrays<R: CubeRuntime> {
    slot_start: CubeTensor<R>,
    term_row: CubeTensor<R>,
    term_token: CubeTensor<R>,
    valid_slot: CubeTensor<R>,
    valid_row: CubeTensor<R>,
    valid: usize,
    continuation_rows: CubeTensor<R>,
    row_start: CubeTensor<R>,
    row_token: CubeTensor<R>,
    row_slot: CubeTensor<R>,
    continuation_count: usize,
    idle_rows: CubeTensor<R>,
    idle_count: usize,
}

impl<R: CubeRuntime> PlanArrays<R> {
    fn new(merge: &MergePlan, launcher: &Launcher<R>) -> Self {
        let slots = merge.slots();
        let mut by_slot = merge.continuation.clone();
        by_slot.sort_unstable_by_key(|&(row, token, slot)| (slot, row, token));
        let mut slot_start = vec![0i32; slots + 1];
        for &(_, _, slot) in &by_slot {
            slot_start[slot as usize + 1] += 1;
        }
        for s in 0..slots {
            slot_start[s + 1] += slot_start[s];
        }
        let term_row: Vec<i32> = by_slot.iter().map(|t| t.0 as i32).collect();
        let term_token: Vec<i32> = by_slot.iter().map(|t| t.1 as i32).collect();

        let mut by_row = merge.continuation.clone();
        by_row.sort_unstable();
        let mut continuation_rows: Vec<i32> = Vec::new();
        let mut row_start = vec![0i32];
        for &(row, _, _) in &by_row {
            if continuation_rows.last() != Some(&(row as i32)) {
                continuation_rows.push(row as i32);
                row_start.push(*row_start.last().unwrap_or(&0));
            }
            if let Some(end) = row_start.last_mut() {
                *end += 1;
            }
        }
        let row_token: Vec<i32> = by_row.iter().map(|t| t.1 as i32).collect();
        let row_slot: Vec<i32> = by_row.iter().map(|t| t.2 as i32).collect();

        let (valid_slot, valid_row): (Vec<i32>, Vec<i32>) = merge
            .predicting()
            .map(|(slot, row)| (slot as i32, row as i32))
            .unzip();
        let mut read = vec![false; merge.rows];
        for &row in &valid_row {
            read[row as usize] = true;
        }
        let idle_rows: Vec<i32> = (0..merge.rows as i32)
            .filter(|&r| !read[r as usize])
            .collect();
        Self {
            slot_start: launcher.ints(&slot_start),
            term_row: launcher.ints(&term_row),
            term_token: launcher.ints(&term_token),
            valid: valid_slot.len(),
            valid_slot: launcher.ints(&valid_slot),
            valid_row: launcher.ints(&valid_row),
            continuation_count: continuation_rows.len(),
            continuation_rows: launcher.ints(&continuation_rows),
            row_start: launcher.ints(&row_start),
            row_token: launcher.ints(&row_token),
            row_slot: launcher.ints(&row_slot),
            idle_count: idle_rows.len(),
            idle_rows: launcher.ints(&idle_rows),
        }
    }
}

/// Row log-sum-exps of `[rows, v]` logits, tempered by `t`, with each row's non-finite flag.
struct RowLse<R: CubeRuntime> {
    lse: CubeTensor<R>,
    bad: CubeTensor<R>,
}

fn row_lse<R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    rows: usize,
    v: usize,
    t: f32,
) -> RowLse<R> {
    let lse = launcher.zeros(rows, DType::F32);
    let bad = launcher.zeros(rows, DType::U32);
    let (count, dim) = launcher.per_item(rows);
    unsafe {
        kernels::row_lse::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            bad.clone().into_array_arg(),
            rows,
            v,
            t,
            BLOCK,
            float_dtype(z),
        );
    }
    RowLse { lse, bad }
}

/// The loss value as a `[1]` tensor of the logits' dtype: `scale · Σ terms`.
fn scaled_sum<R: CubeRuntime>(
    launcher: &Launcher<R>,
    terms: &CubeTensor<R>,
    n: usize,
    scale: f32,
    dtype: DType,
) -> CubeTensor<R> {
    let value = launcher.zeros(1, dtype);
    unsafe {
        kernels::scaled_sum::launch_unchecked::<R>(
            &launcher.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(BLOCK as u32),
            launcher.address,
            terms.clone().into_array_arg(),
            value.clone().into_array_arg(),
            n,
            scale,
            BLOCK,
            dtype.into(),
        );
    }
    value
}

/// Reads the rows' flags (one small read): a row that holds NaN, +∞ or only −∞ among those
/// listed is an error naming it.
fn check_rows<B: Cube<R>, R: CubeRuntime>(
    bad: CubeTensor<R>,
    rows: impl Iterator<Item = u32>,
    side: &'static str,
) -> Result<(), KernelError> {
    let flags = read_i64::<B, R>(bad, "row flags")?;
    for row in rows {
        if flags.get(row as usize).is_some_and(|&f| f != 0) {
            return Err(KernelError::NonFinite {
                side,
                row: row as usize,
            });
        }
    }
    Ok(())
}

/// Checks the rows the loss read, then that the loss is finite (two small reads).
fn finish<B: Cube<R>, R: CubeRuntime>(
    output: LossOutput<B>,
    bad: CubeTensor<R>,
    rows: impl Iterator<Item = u32>,
    objective: &'static str,
) -> Result<LossOutput<B>, KernelError> {
    check_rows::<B, R>(bad, rows, "student")?;
    let value = read_f32::<B, R>(output.value.clone())?[0];
    if value.is_finite() {
        Ok(output)
    } else {
        Err(KernelError::NonFiniteLoss {
            objective,
            value: value as f64,
        })
    }
}

/// The chunk merge: `σ` per slot.
fn merge_shifts<R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    plan: &PlanArrays<R>,
    (slots, v, tau_inv): (usize, usize, f32),
) -> CubeTensor<R> {
    let sigma = launcher.zeros(slots, DType::F32);
    let (count, dim) = launcher.elementwise(slots);
    unsafe {
        kernels::merge_shift::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            plan.slot_start.clone().into_array_arg(),
            plan.term_row.clone().into_array_arg(),
            plan.term_token.clone().into_array_arg(),
            sigma.clone().into_array_arg(),
            slots,
            v,
            tau_inv,
            float_dtype(z),
        );
    }
    sigma
}

/// The teacher's targets on the device: per compared slot its top-K ids (best first) and merged
/// log-probabilities, and on request the confidence statistics.
fn teacher_entries<B: Cube<R>, R: CubeRuntime>(
    logits: CubeTensor<R>,
    spec: &TeacherSpec,
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
    let RowLse { lse, bad } = row_lse(&launcher, &z, n, v, tau_inv);
    let sigma = merge_shifts(&launcher, &z, &lse, &plan, (slots, v, tau_inv));
    let ids = zeros_client(
        launcher.client.clone(),
        launcher.device.clone(),
        Shape::new([slots, k]),
        DType::I32,
    );
    let logp = launcher.empty(Shape::new([slots, k]), DType::F32);
    let (count, dim) = launcher.elementwise(slots * k);
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
    let (count, dim) = launcher.per_item(plan.valid);
    unsafe {
        kernels::top_k::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            sigma.clone().into_array_arg(),
            plan.valid_slot.clone().into_array_arg(),
            plan.valid_row.clone().into_array_arg(),
            launcher.ints(&[]).into_array_arg(),
            ids.clone().into_array_arg(),
            logp.clone().into_array_arg(),
            plan.valid,
            v,
            k,
            k.next_power_of_two(),
            tau_inv,
            BLOCK,
            false,
            float_dtype(&z),
        );
    }
    let mut read: Vec<u32> = spec.merge.predict_row.iter().flatten().copied().collect();
    read.extend(spec.merge.continuation.iter().map(|&(row, _, _)| row));
    check_rows::<B, R>(bad, read.into_iter(), "teacher")?;
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
    })
}

/// Batch means of `log p[y]`, `Σ p log p` and `max p` (untempered) over the `(row, y)` pairs.
fn confidence<B: Cube<R>, R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    rows: &[(u32, u32)],
    (n, v): (usize, usize),
) -> Result<Confidence, KernelError> {
    if rows.is_empty() {
        return Ok(Confidence::default());
    }
    let RowLse { lse, bad } = row_lse(launcher, z, n, v, 1.0);
    let (row_ids, targets): (Vec<i32>, Vec<i32>) =
        rows.iter().map(|&(r, y)| (r as i32, y as i32)).unzip();
    let stats = launcher.zeros(3 * rows.len(), DType::F32);
    let (count, dim) = launcher.per_item(rows.len());
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
    check_rows::<B, R>(bad, row_ids.iter().map(|&r| r as u32), "teacher")?;
    let stats = read_f32::<B, R>(stats)?;
    let mut sums = [0.0f64; 3];
    for row in stats.chunks_exact(3) {
        for (sum, &x) in sums.iter_mut().zip(row) {
            *sum += x as f64;
        }
    }
    let count = rows.len() as f64;
    Ok(Confidence {
        neg_cross_entropy: sums[0] / count,
        neg_entropy: sums[1] / count,
        max_prob: sums[2] / count,
        positions: rows.len(),
    })
}

/// Mean next-token cross-entropy.
fn cross_entropy<B: Cube<R>, R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: &Arc<[i32]>,
    want_grad: bool,
) -> Result<LossOutput<B>, KernelError> {
    let z = into_contiguous(logits);
    let [b, t, v] = logits_shape(&z, "student logits")?;
    let n = b * t;
    let compared = checked_targets(targets, n, v, "cross-entropy targets")?;
    let launcher = Launcher::of(&z, n * v);
    let counted = compared.len();
    let inv = if counted > 0 {
        1.0 / counted as f32
    } else {
        0.0
    };
    let target_array = launcher.ints(targets);
    let RowLse { lse, bad } = row_lse(&launcher, &z, n, v, 1.0);
    let terms = launcher.zeros(n, DType::F32);
    let (count, dim) = launcher.elementwise(n);
    unsafe {
        kernels::cross_entropy_terms::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            target_array.clone().into_array_arg(),
            terms.clone().into_array_arg(),
            n,
            v,
            float_dtype(&z),
        );
    }
    let grad_logits = want_grad.then(|| {
        let grad = launcher.empty(Shape::new([b, t, v]), z.dtype);
        let (count, dim) = launcher.elementwise(n * v);
        unsafe {
            kernels::cross_entropy_grad::launch_unchecked::<R>(
                &launcher.client,
                count,
                dim,
                launcher.address,
                z.clone().into_array_arg(),
                lse.clone().into_array_arg(),
                target_array.clone().into_array_arg(),
                grad.clone().into_array_arg(),
                n,
                v,
                inv,
                float_dtype(&z),
            );
        }
        grad
    });
    let value = scaled_sum(&launcher, &terms, n, inv, z.dtype);
    let output = LossOutput {
        value,
        grad_logits,
        grad_weights: None,
    };
    let rows = compared.iter().map(|&(row, _)| row);
    finish::<B, R>(output, bad, rows, "cross-entropy")
}

/// KL or P-KL on the device.
fn distill<B: Cube<R>, R: CubeRuntime>(
    logits: CubeTensor<R>,
    projection: Option<ProjectionTensors<B>>,
    teacher: Option<TeacherEntries<B>>,
    spec: &LossSpec,
    want: GradRequest,
) -> Result<LossOutput<B>, KernelError> {
    check_tau(spec.tau)?;
    let z = into_contiguous(logits);
    let [b, t, v] = logits_shape(&z, "student logits")?;
    let n = b * t;
    spec.merge.check("student", n, v)?;
    let slots = spec.merge.slots();
    let teacher = checked_teacher(teacher, slots)?;
    let k = teacher.k;
    let id_limit = match spec.objective {
        Objective::Kl => v,
        _ => teacher.vocab,
    };
    if slots * k > 0 {
        let (low, high) = int_range::<B, R>(&teacher.ids, "teacher ids")?;
        if low < 0 || high >= id_limit as i64 {
            return Err(KernelError::IndexOutOfRange {
                what: "teacher ids",
                field: "token",
                index: if low < 0 { low } else { high },
                size: id_limit,
            });
        }
    }
    let valid = spec.merge.valid();
    // P-KL's scattered buffer is `[chunk, V_T]`.
    let chunk = spec.row_chunk.max(1).min(valid.max(1));
    let launcher = Launcher::of(&z, (slots * k).max(chunk * teacher.vocab));
    let tau_inv = 1.0 / spec.tau;
    let scale = if valid > 0 {
        spec.tau * spec.tau / valid as f32
    } else {
        0.0
    };
    let c = scale * tau_inv;
    let plan = PlanArrays::new(&spec.merge, &launcher);
    let teacher_ids = as_i32::<B, R>(teacher.ids);
    let teacher_logp = as_f32::<B, R>(teacher.logp);
    let dtype = float_dtype(&z);

    let RowLse { lse, bad } = row_lse(&launcher, &z, n, v, tau_inv);
    let sigma = merge_shifts(&launcher, &z, &lse, &plan, (slots, v, tau_inv));
    let loss = launcher.zeros(plan.valid, DType::F32);
    let dsigma = launcher.zeros(slots, DType::F32);
    let grad = want
        .logits
        .then(|| launcher.empty(Shape::new([b, t, v]), z.dtype));
    let mut grad_weights = None;
    if let Some(grad) = &grad {
        if plan.idle_count > 0 {
            let (count, dim) = launcher.elementwise(plan.idle_count * v);
            unsafe {
                kernels::zero_rows::launch_unchecked::<R>(
                    &launcher.client,
                    count,
                    dim,
                    launcher.address,
                    grad.clone().into_array_arg(),
                    plan.idle_rows.clone().into_array_arg(),
                    plan.idle_count,
                    v,
                    dtype,
                );
            }
        }
    }

    let predicting = grad.as_ref().map(|grad| Predicting {
        z: &z,
        lse: &lse,
        sigma: &sigma,
        dsigma: &dsigma,
        plan: &plan,
        grad,
        v,
        tau_inv,
        c,
    });

    match (&spec.objective, projection) {
        (Objective::Kl, _) => {
            let (count, dim) = launcher.per_item(plan.valid);
            unsafe {
                kernels::kl_slots::launch_unchecked::<R>(
                    &launcher.client,
                    count,
                    dim,
                    launcher.address,
                    z.clone().into_array_arg(),
                    lse.clone().into_array_arg(),
                    sigma.clone().into_array_arg(),
                    plan.valid_slot.clone().into_array_arg(),
                    plan.valid_row.clone().into_array_arg(),
                    teacher_ids.clone().into_array_arg(),
                    teacher_logp.clone().into_array_arg(),
                    loss.clone().into_array_arg(),
                    dsigma.clone().into_array_arg(),
                    plan.valid,
                    k,
                    v,
                    tau_inv,
                    BLOCK,
                    dtype,
                );
            }
            if let (Some(grad), Some(rows)) = (&grad, &predicting) {
                predicting_grad(&launcher, rows, (0, plan.valid), GradMode::Kl);
                let (count, dim) = launcher.elementwise(plan.valid * k);
                unsafe {
                    kernels::kl_grad_sparse::launch_unchecked::<R>(
                        &launcher.client,
                        count,
                        dim,
                        launcher.address,
                        grad.clone().into_array_arg(),
                        plan.valid_slot.clone().into_array_arg(),
                        plan.valid_row.clone().into_array_arg(),
                        teacher_ids.clone().into_array_arg(),
                        teacher_logp.clone().into_array_arg(),
                        plan.valid,
                        k,
                        v,
                        c,
                        dtype,
                    );
                }
            }
        }
        (Objective::Projected { eps }, Some(w)) => {
            let vt = teacher.vocab;
            let index_shape = shape_of(&w.indices);
            let weight_shape = shape_of(&w.weights);
            if index_shape.len() != 2 || index_shape[0] != v || weight_shape != index_shape {
                return Err(KernelError::Shape {
                    what: "projection",
                    expected: format!("indices and weights [{v}, K]"),
                    found: format!("indices {index_shape:?}, weights {weight_shape:?}"),
                });
            }
            let kw = index_shape[1];
            let indices = as_i32::<B, R>(w.indices);
            let host_indices = read_i64::<B, R>(
                B::int_reshape(indices.clone(), Shape::new([v * kw])),
                "projection indices",
            )?;
            if let Some(&bad) = host_indices.iter().find(|&&i| i < -1 || i >= vt as i64) {
                return Err(KernelError::IndexOutOfRange {
                    what: "projection indices",
                    field: "teacher id",
                    index: bad,
                    size: vt,
                });
            }
            let weights_dtype = w.weights.dtype;
            let weights = as_f32::<B, R>(w.weights);
            let columns = Columns::new(&host_indices, vt);
            let signed = |v: &[u32]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
            let column_start = launcher.ints(&signed(&columns.start));
            let column_entries = launcher.ints(&signed(&columns.slots));
            let scattered = launcher.zeros(chunk * vt, DType::F32);
            let terms = launcher.zeros(chunk * k, DType::F32);
            let sigma_terms = launcher.zeros(chunk * k, DType::F32);
            let gw = want.weights.then(|| launcher.zeros(v * kw, DType::F32));
            let mut first = 0;
            while first < plan.valid {
                let count_rows = chunk.min(plan.valid - first);
                let (count, dim) = launcher.elementwise(count_rows * k);
                unsafe {
                    kernels::pkl_entries::launch_unchecked::<R>(
                        &launcher.client,
                        count,
                        dim,
                        launcher.address,
                        z.clone().into_array_arg(),
                        lse.clone().into_array_arg(),
                        sigma.clone().into_array_arg(),
                        plan.valid_slot.clone().into_array_arg(),
                        plan.valid_row.clone().into_array_arg(),
                        teacher_ids.clone().into_array_arg(),
                        teacher_logp.clone().into_array_arg(),
                        column_start.clone().into_array_arg(),
                        column_entries.clone().into_array_arg(),
                        weights.clone().into_array_arg(),
                        terms.clone().into_array_arg(),
                        sigma_terms.clone().into_array_arg(),
                        scattered.clone().into_array_arg(),
                        first,
                        count_rows,
                        k,
                        kw,
                        v,
                        vt,
                        tau_inv,
                        *eps,
                        dtype,
                    );
                }
                let (count, dim) = launcher.per_item(count_rows);
                unsafe {
                    kernels::slot_sums::launch_unchecked::<R>(
                        &launcher.client,
                        count,
                        dim,
                        launcher.address,
                        terms.clone().into_array_arg(),
                        sigma_terms.clone().into_array_arg(),
                        plan.valid_slot.clone().into_array_arg(),
                        loss.clone().into_array_arg(),
                        dsigma.clone().into_array_arg(),
                        first,
                        count_rows,
                        k,
                        BLOCK,
                    );
                }
                if let Some(rows) = &predicting {
                    predicting_grad(
                        &launcher,
                        rows,
                        (first, count_rows),
                        GradMode::Projected {
                            indices: &indices,
                            weights: &weights,
                            scattered: &scattered,
                            kw,
                            vt,
                        },
                    );
                }
                if let Some(gw) = &gw {
                    let (count, dim) = launcher.elementwise(v * kw);
                    unsafe {
                        kernels::pkl_grad_weights::launch_unchecked::<R>(
                            &launcher.client,
                            count,
                            dim,
                            launcher.address,
                            z.clone().into_array_arg(),
                            lse.clone().into_array_arg(),
                            sigma.clone().into_array_arg(),
                            plan.valid_slot.clone().into_array_arg(),
                            plan.valid_row.clone().into_array_arg(),
                            indices.clone().into_array_arg(),
                            scattered.clone().into_array_arg(),
                            gw.clone().into_array_arg(),
                            first,
                            count_rows,
                            v * kw,
                            kw,
                            v,
                            vt,
                            tau_inv,
                            scale,
                            dtype,
                        );
                    }
                }
                let (count, dim) = launcher.elementwise(count_rows * k);
                unsafe {
                    kernels::clear_scattered::launch_unchecked::<R>(
                        &launcher.client,
                        count,
                        dim,
                        launcher.address,
                        scattered.clone().into_array_arg(),
                        plan.valid_slot.clone().into_array_arg(),
                        teacher_ids.clone().into_array_arg(),
                        first,
                        count_rows,
                        k,
                        vt,
                    );
                }
                first += count_rows;
            }
            grad_weights = gw.map(|gw| {
                let gw = B::float_reshape(gw, Shape::new([v, kw]));
                match weights_dtype {
                    DType::F32 => gw,
                    other => B::float_cast(gw, other.into()),
                }
            });
        }
        (Objective::Projected { .. }, None) => {
            return Err(KernelError::Invalid {
                what: "loss",
                why: "the projected KL needs the projection W".into(),
            })
        }
        (
            Objective::Hybrid {
                common,
                lambda_kl,
                lambda_uld,
            },
            _,
        ) => {
            common.check(v, teacher.vocab)?;
            let uncommon = common.student_partner.iter().filter(|&&p| p < 0).count();
            let selected = k.min(uncommon);
            let student_partner = launcher.ints(&common.student_partner);
            let teacher_partner = launcher.ints(&common.teacher_partner);
            // The student's largest uncommon probabilities, best first.
            let selected_ids = launcher.zeros(slots * selected, DType::I32);
            let selected_logp = launcher.zeros(slots * selected, DType::F32);
            if selected > 0 {
                let (count, dim) = launcher.per_item(plan.valid);
                unsafe {
                    kernels::top_k::launch_unchecked::<R>(
                        &launcher.client,
                        count,
                        dim,
                        launcher.address,
                        z.clone().into_array_arg(),
                        lse.clone().into_array_arg(),
                        sigma.clone().into_array_arg(),
                        plan.valid_slot.clone().into_array_arg(),
                        plan.valid_row.clone().into_array_arg(),
                        student_partner.clone().into_array_arg(),
                        selected_ids.clone().into_array_arg(),
                        selected_logp.clone().into_array_arg(),
                        plan.valid,
                        v,
                        selected,
                        selected.next_power_of_two(),
                        tau_inv,
                        BLOCK,
                        true,
                        dtype,
                    );
                }
            }
            let rest = launcher.zeros(slots * k, DType::F32);
            let corrections = launcher.zeros(slots * selected, DType::F32);
            let (count, dim) = launcher.per_item(plan.valid);
            unsafe {
                kernels::hybrid_slots::launch_unchecked::<R>(
                    &launcher.client,
                    count,
                    dim,
                    launcher.address,
                    z.clone().into_array_arg(),
                    lse.clone().into_array_arg(),
                    sigma.clone().into_array_arg(),
                    plan.valid_slot.clone().into_array_arg(),
                    plan.valid_row.clone().into_array_arg(),
                    teacher_ids.clone().into_array_arg(),
                    teacher_logp.clone().into_array_arg(),
                    teacher_partner.clone().into_array_arg(),
                    student_partner.clone().into_array_arg(),
                    selected_logp.clone().into_array_arg(),
                    rest.clone().into_array_arg(),
                    corrections.clone().into_array_arg(),
                    loss.clone().into_array_arg(),
                    dsigma.clone().into_array_arg(),
                    plan.valid,
                    k,
                    selected,
                    uncommon,
                    v,
                    tau_inv,
                    *lambda_kl,
                    *lambda_uld,
                    BLOCK,
                    dtype,
                );
            }
            if let (Some(grad), Some(rows)) = (&grad, &predicting) {
                predicting_grad(
                    &launcher,
                    rows,
                    (0, plan.valid),
                    GradMode::Hybrid {
                        student_partner: &student_partner,
                        lambda_uld: *lambda_uld,
                    },
                );
                let (count, dim) = launcher.elementwise(plan.valid * (k + selected));
                unsafe {
                    kernels::hybrid_grad_sparse::launch_unchecked::<R>(
                        &launcher.client,
                        count,
                        dim,
                        launcher.address,
                        grad.clone().into_array_arg(),
                        plan.valid_slot.clone().into_array_arg(),
                        plan.valid_row.clone().into_array_arg(),
                        teacher_ids.clone().into_array_arg(),
                        teacher_logp.clone().into_array_arg(),
                        teacher_partner.clone().into_array_arg(),
                        selected_ids.clone().into_array_arg(),
                        corrections.clone().into_array_arg(),
                        plan.valid,
                        k,
                        selected,
                        v,
                        c,
                        *lambda_kl,
                        *lambda_uld,
                        dtype,
                    );
                }
            }
        }
        (Objective::CrossEntropy { .. }, _) => {
            unreachable!("cross-entropy has its own path")
        }
    }

    if let Some(grad) = &grad {
        if plan.continuation_count > 0 {
            let (count, dim) = launcher.elementwise(plan.continuation_count * v);
            unsafe {
                kernels::continuation_grad::launch_unchecked::<R>(
                    &launcher.client,
                    count,
                    dim,
                    launcher.address,
                    z.clone().into_array_arg(),
                    lse.clone().into_array_arg(),
                    dsigma.clone().into_array_arg(),
                    plan.continuation_rows.clone().into_array_arg(),
                    plan.row_start.clone().into_array_arg(),
                    plan.row_token.clone().into_array_arg(),
                    plan.row_slot.clone().into_array_arg(),
                    grad.clone().into_array_arg(),
                    plan.continuation_count,
                    v,
                    tau_inv,
                    c,
                    dtype,
                );
            }
        }
    }
    let value = scaled_sum(&launcher, &loss, plan.valid, scale, z.dtype);
    let output = LossOutput {
        value,
        grad_logits: grad,
        grad_weights,
    };
    let mut rows: Vec<u32> = spec.merge.predict_row.iter().flatten().copied().collect();
    rows.extend(spec.merge.continuation.iter().map(|&(row, _, _)| row));
    let name = match spec.objective {
        Objective::Kl => "KL",
        Objective::Projected { .. } => "projected KL",
        _ => "hybrid",
    };
    finish::<B, R>(output, bad, rows.into_iter(), name)
}

/// The tensors every mode of `predicting_grad` reads.
struct Predicting<'a, R: CubeRuntime> {
    z: &'a CubeTensor<R>,
    lse: &'a CubeTensor<R>,
    sigma: &'a CubeTensor<R>,
    dsigma: &'a CubeTensor<R>,
    plan: &'a PlanArrays<R>,
    grad: &'a CubeTensor<R>,
    /// `V_S`.
    v: usize,
    tau_inv: f32,
    /// The gradient's scale, `τ² / valid · 1/τ`.
    c: f32,
}

/// Which dense term `h` the predicting rows' gradient kernel adds, and what it reads for it.
enum GradMode<'a, R: CubeRuntime> {
    /// None (KL adds its sparse term afterwards).
    Kl,
    /// P-KL's gather through W (`[V_S, kw]`) of the chunk's scattered `[chunk, V_T]` `g`.
    Projected {
        indices: &'a CubeTensor<R>,
        weights: &'a CubeTensor<R>,
        scattered: &'a CubeTensor<R>,
        kw: usize,
        vt: usize,
    },
    /// `λ_ULD · a` on the ids without a partner in the common set.
    Hybrid {
        student_partner: &'a CubeTensor<R>,
        lambda_uld: f32,
    },
}

/// Writes the predicting rows `first..first + count` of the gradient.
fn predicting_grad<R: CubeRuntime>(
    launcher: &Launcher<R>,
    args: &Predicting<'_, R>,
    (first, count): (usize, usize),
    mode: GradMode<'_, R>,
) {
    if count == 0 {
        return;
    }
    // Placeholders bind the arrays a mode does not read.
    let no_floats = launcher.zeros(1, DType::F32);
    let no_ids = launcher.ints(&[]);
    let (indices, weights, scattered, kw, vt, lambda) = match &mode {
        GradMode::Kl => (&no_ids, &no_floats, &no_floats, 1, 1, 0.0),
        GradMode::Projected {
            indices,
            weights,
            scattered,
            kw,
            vt,
        } => (*indices, *weights, *scattered, *kw, *vt, 0.0),
        GradMode::Hybrid {
            student_partner,
            lambda_uld,
        } => (*student_partner, &no_floats, &no_floats, 1, 1, *lambda_uld),
    };
    let (cubes, dim) = launcher.elementwise(count * args.v);
    unsafe {
        kernels::predicting_grad::launch_unchecked::<R>(
            &launcher.client,
            cubes,
            dim,
            launcher.address,
            args.z.clone().into_array_arg(),
            args.lse.clone().into_array_arg(),
            args.sigma.clone().into_array_arg(),
            args.dsigma.clone().into_array_arg(),
            args.plan.valid_slot.clone().into_array_arg(),
            args.plan.valid_row.clone().into_array_arg(),
            indices.clone().into_array_arg(),
            weights.clone().into_array_arg(),
            scattered.clone().into_array_arg(),
            args.grad.clone().into_array_arg(),
            first,
            count,
            kw,
            args.v,
            vt,
            args.tau_inv,
            args.c,
            lambda,
            matches!(mode, GradMode::Projected { .. }),
            matches!(mode, GradMode::Hybrid { .. }),
            float_dtype(args.z),
        );
    }
}
