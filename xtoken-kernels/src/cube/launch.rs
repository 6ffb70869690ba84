//! What every launch of an evaluation shares: the backend ops it needs, the launcher (client,
//! device, address width, small host arrays), the merge plan laid out as arrays, the row
//! log-sum-exps and merge shifts, the loss's final sum and the checks that read back flags.

use burn::tensor::ops::{FloatTensorOps, IntTensorOps};
use burn::tensor::{DType, FloatDType, Int, IntDType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use super::kernels::{self, BLOCK};
use crate::checks::finite_loss;
use crate::deferred::{check_later, deferring};
use crate::error::KernelError;
use crate::spec::MergePlan;
pub(super) use crate::traffic::{note, Streams};
use crate::{LossOutput, XTokenBackend};

/// The backend ops the launcher needs, on any `CubeBackend` (its float and int tensors are
/// both `CubeTensor<R>`).
pub(super) trait Cube<R: CubeRuntime>:
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
pub(super) struct Launcher<R: CubeRuntime> {
    pub(super) client: ComputeClient<R>,
    pub(super) device: R::Device,
    /// The kernels' address width, for the largest buffer of the evaluation.
    pub(super) address: AddressType,
}

impl<R: CubeRuntime> Launcher<R> {
    /// For an evaluation on `t` whose buffers hold at most `largest` elements.
    pub(super) fn of(t: &CubeTensor<R>, largest: usize) -> Self {
        Self {
            client: t.client.clone(),
            device: t.device.clone(),
            address: AddressType::from_len(largest.max(t.meta.num_elements())),
        }
    }

    /// An i32 array on the device (one element at least, so that an empty list still binds).
    pub(super) fn ints(&self, data: &[i32]) -> CubeTensor<R> {
        self.upload(data, DType::I32)
    }

    /// An f32 array on the device (one element at least).
    pub(super) fn floats(&self, data: &[f32]) -> CubeTensor<R> {
        self.upload(data, DType::F32)
    }

    fn upload<T: bytemuck::Pod + Default>(&self, data: &[T], dtype: DType) -> CubeTensor<R> {
        let one = [T::default()];
        let data: &[T] = if data.is_empty() { &one } else { data };
        let handle = self.client.create_from_slice(bytemuck::cast_slice(data));
        CubeTensor::new_contiguous(
            self.client.clone(),
            self.device.clone(),
            Shape::new([data.len()]),
            handle,
            dtype,
        )
    }

    pub(super) fn zeros(&self, len: usize, dtype: DType) -> CubeTensor<R> {
        self.zeros_of(Shape::new([len.max(1)]), dtype)
    }

    /// A contiguous tensor of zeros, set by one kernel of fixed geometry (compiled once per
    /// dtype, whatever the shape).
    pub(super) fn zeros_of(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        let n = shape.num_elements();
        let out = self.empty(shape, dtype);
        note("zero", Streams::default(), Streams::other(n * dtype.size()));
        let (count, dim) = self.elementwise(n);
        unsafe {
            kernels::zero::launch_unchecked::<R>(
                &self.client,
                count,
                dim,
                self.address,
                out.clone().into_array_arg(),
                n,
                dtype.into(),
            );
        }
        out
    }

    pub(super) fn empty(&self, shape: Shape, dtype: DType) -> CubeTensor<R> {
        empty_device_contiguous_dtype(self.client.clone(), self.device.clone(), shape, dtype)
    }

    /// Launch geometry for one unit per element: cubes of a fixed [`BLOCK`] units, whatever
    /// `n` (the cube size is part of a kernel's compile key: one sized by `n` compiles again
    /// for each small `n` the data brings).
    pub(super) fn elementwise(&self, n: usize) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_1d(BLOCK as u32);
        (
            calculate_cube_count_elemwise(&self.client, n.max(1), dim),
            dim,
        )
    }

    /// Launch geometry for one cube of [`BLOCK`] units per item.
    pub(super) fn per_item(&self, n: usize) -> (CubeCount, CubeDim) {
        (
            cubecl::server::CubeCountSelection::new(&self.client, n.max(1) as u32).cube_count(),
            CubeDim::new_1d(BLOCK as u32),
        )
    }
}

pub(super) fn float_dtype(t: &CubeTensor<impl CubeRuntime>) -> StorageType {
    t.dtype.into()
}

/// The tensor as contiguous f32 (a no-op when it already is).
pub(super) fn as_f32<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = if t.dtype == DType::F32 {
        t
    } else {
        B::float_cast(t, FloatDType::F32)
    };
    into_contiguous(t)
}

/// The tensor as contiguous i32.
pub(super) fn as_i32<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = if t.dtype == DType::I32 {
        t
    } else {
        B::int_cast(t, IntDType::I32)
    };
    into_contiguous(t)
}

std::thread_local! {
    static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The reads to the host the cube kernels have made on this thread (flags, loss values, id
/// ranges, W's indices): each waits for the device's queue.
pub fn reads() -> u64 {
    READS.with(std::cell::Cell::get)
}

fn note_read() {
    READS.with(|r| r.set(r.get() + 1));
}

pub(super) fn read_f32<B: Cube<R>, R: CubeRuntime>(
    t: CubeTensor<R>,
) -> Result<Vec<f32>, KernelError> {
    note_read();
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| KernelError::Read {
            what: "loss",
            message: format!("{e:?}"),
        })
}

pub(super) fn read_i64<B: Cube<R>, R: CubeRuntime>(
    t: CubeTensor<R>,
    what: &'static str,
) -> Result<Vec<i64>, KernelError> {
    note_read();
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
pub(super) fn int_range<B: Cube<R>, R: CubeRuntime>(
    t: &CubeTensor<R>,
    what: &'static str,
) -> Result<(i64, i64), KernelError> {
    let flat = B::int_reshape(t.clone(), Shape::new([t.meta.num_elements()]));
    let both = B::int_cat(vec![B::int_min(flat.clone()), B::int_max(flat)], 0);
    let range = read_i64::<B, R>(both, what)?;
    Ok((range[0], range[1]))
}

pub(super) fn shape_of(t: &CubeTensor<impl CubeRuntime>) -> Vec<usize> {
    t.meta.shape().to_vec()
}

/// `[B, T, V]` of a logits tensor.
pub(super) fn logits_shape(
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
pub(super) struct PlanArrays<R: CubeRuntime> {
    pub(super) slot_start: CubeTensor<R>,
    pub(super) term_row: CubeTensor<R>,
    pub(super) term_token: CubeTensor<R>,
    pub(super) valid_slot: CubeTensor<R>,
    pub(super) valid_row: CubeTensor<R>,
    pub(super) valid: usize,
    /// Continuation terms (`term_row`'s length).
    pub(super) terms: usize,
    pub(super) continuation_rows: CubeTensor<R>,
    pub(super) row_start: CubeTensor<R>,
    pub(super) row_token: CubeTensor<R>,
    pub(super) row_slot: CubeTensor<R>,
    pub(super) continuation_count: usize,
    pub(super) idle_rows: CubeTensor<R>,
    pub(super) idle_count: usize,
}

impl<R: CubeRuntime> PlanArrays<R> {
    pub(super) fn new(merge: &MergePlan, launcher: &Launcher<R>) -> Self {
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
            terms: by_slot.len(),
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

/// Row log-sum-exps of `[rows, v]` logits, tempered by `t`, with each row's non-finite flag
/// and, when asked, its weighted probability mass and its top-K split.
pub(super) struct RowLse<R: CubeRuntime> {
    pub(super) lse: CubeTensor<R>,
    pub(super) bad: CubeTensor<R>,
    /// `Σ_s weights[s] p[row, s]` per row, when the pass was given weights.
    pub(super) mass: Option<CubeTensor<R>>,
    /// Per row, the histogram bin of the K-th largest key, the entries above it and in it
    /// (`[rows, 3]`, u32), when the pass was given a [`Split`].
    pub(super) splits: Option<CubeTensor<R>>,
}

/// What a top-K will select from each row: `keep` entries, with `excluded` (a `[v]` partner
/// table: ids `>= 0` are never selected while others remain) or without.
pub(super) struct Split<'a, R: CubeRuntime> {
    pub(super) keep: usize,
    pub(super) excluded: Option<&'a CubeTensor<R>>,
}

// By hand: a derive would ask `R: Copy`.
impl<R: CubeRuntime> Clone for Split<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R: CubeRuntime> Copy for Split<'_, R> {}

/// What the row pass computes besides the log-sum-exp.
pub(super) struct RowPass<'a, R: CubeRuntime> {
    /// The `[v]` f32 weights of the row mass.
    pub(super) weights: Option<&'a CubeTensor<R>>,
    /// The top-K's split.
    pub(super) split: Option<Split<'a, R>>,
}

impl<R: CubeRuntime> RowPass<'_, R> {
    /// The log-sum-exp and the flag alone.
    pub(super) fn plain() -> Self {
        Self {
            weights: None,
            split: None,
        }
    }
}

/// One pass over each row: its log-sum-exp, its flag and what `pass` asks for.
pub(super) fn row_lse<R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    (rows, v, t): (usize, usize, f32),
    pass: RowPass<'_, R>,
) -> RowLse<R> {
    let lse = launcher.zeros(rows, DType::F32);
    let bad = launcher.zeros(rows, DType::U32);
    let mass = pass.weights.map(|_| launcher.zeros(rows, DType::F32));
    let splits = pass.split.map(|_| launcher.zeros(rows * 3, DType::U32));
    let excluded = pass.split.and_then(|s| s.excluded);
    let tables = [pass.weights.is_some(), excluded.is_some()];
    let outputs = rows * (8 + 4 * usize::from(mass.is_some()) + 12 * usize::from(splits.is_some()));
    note(
        "row_lse",
        Streams::logits(rows * v * z.dtype.size())
            + Streams::other(v * 4 * tables.iter().filter(|&&t| t).count()),
        Streams::other(outputs),
    );
    // Placeholders bind the arrays a pass does not touch (never read: left unset).
    let floats = || launcher.empty(Shape::new([1]), DType::F32);
    let unsigned = || launcher.empty(Shape::new([1]), DType::U32);
    let (count, dim) = launcher.per_item(rows);
    unsafe {
        kernels::row_lse::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            pass.weights
                .cloned()
                .unwrap_or_else(floats)
                .into_array_arg(),
            excluded
                .cloned()
                .unwrap_or_else(|| launcher.ints(&[]))
                .into_array_arg(),
            lse.clone().into_array_arg(),
            bad.clone().into_array_arg(),
            mass.clone().unwrap_or_else(floats).into_array_arg(),
            splits.clone().unwrap_or_else(unsigned).into_array_arg(),
            rows,
            v,
            t,
            pass.split.map_or(0, |s| s.keep as u32),
            BLOCK,
            pass.weights.is_some(),
            pass.split.is_some(),
            excluded.is_some(),
            float_dtype(z),
        );
    }
    RowLse {
        lse,
        bad,
        mass,
        splits,
    }
}

/// The row pass's results a top-K reads, and where it writes.
pub(super) struct TopK<'a, R: CubeRuntime> {
    pub(super) lse: &'a CubeTensor<R>,
    pub(super) sigma: &'a CubeTensor<R>,
    pub(super) splits: &'a CubeTensor<R>,
    pub(super) excluded: Option<&'a CubeTensor<R>>,
    /// `[slots, k]` outputs.
    pub(super) ids: &'a CubeTensor<R>,
    pub(super) values: &'a CubeTensor<R>,
}

/// `top_k` over the compared slots of `plan`: `k` entries of each predicting row of `z`
/// (`[rows, v]`), best first, as merged log-probabilities.
pub(super) fn top_k<R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    plan: &PlanArrays<R>,
    to: TopK<'_, R>,
    (v, k, t): (usize, usize, f32),
) {
    let cap = k.next_power_of_two();
    let scratch_ids = launcher.empty(Shape::new([(plan.valid * cap).max(1)]), DType::I32);
    let scratch_values = launcher.empty(Shape::new([(plan.valid * cap).max(1)]), DType::F32);
    note_top_k(plan.valid, (v, k, z.dtype.size()), to.excluded.is_some());
    let (count, dim) = launcher.per_item(plan.valid);
    unsafe {
        kernels::top_k::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            to.lse.clone().into_array_arg(),
            to.sigma.clone().into_array_arg(),
            plan.valid_slot.clone().into_array_arg(),
            plan.valid_row.clone().into_array_arg(),
            to.excluded
                .cloned()
                .unwrap_or_else(|| launcher.ints(&[]))
                .into_array_arg(),
            to.splits.clone().into_array_arg(),
            to.ids.clone().into_array_arg(),
            to.values.clone().into_array_arg(),
            scratch_ids.into_array_arg(),
            scratch_values.into_array_arg(),
            plan.valid,
            v,
            k,
            cap,
            t,
            BLOCK,
            to.excluded.is_some(),
            float_dtype(z),
        );
    }
}

/// The loss value as an f32 `[1]` tensor, whatever the logits' dtype: `scale · Σ terms`. A
/// 16-bit value would meet the other f32 values of the loss and be read as f32 there.
pub(super) fn scaled_sum<R: CubeRuntime>(
    launcher: &Launcher<R>,
    terms: &CubeTensor<R>,
    n: usize,
    scale: f32,
) -> CubeTensor<R> {
    let dtype = DType::F32;
    let value = launcher.zeros(1, dtype);
    note("scaled_sum", Streams::other(n * 4), Streams::other(4));
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
/// listed is an error naming it. Under [`crate::deferred`] the read waits; a flagged row
/// then sets every value of `poisoned` (f32) to the given marker on the device, so that the
/// loss its reader sees is not finite (a GPU's `max` drops NaN: the loss alone may not show it).
pub(super) fn check_rows<B: Cube<R>, R: CubeRuntime>(
    launcher: &Launcher<R>,
    (bad, rows): (CubeTensor<R>, impl Iterator<Item = u32>),
    poisoned: (&CubeTensor<R>, f32),
    side: &'static str,
) -> Result<(), KernelError> {
    let rows: Vec<u32> = rows.collect();
    if deferring() {
        poison_if_flagged(launcher, &bad, &rows, poisoned);
    }
    check_later(move || {
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
    })
}

/// `marker` over all of `out` (f32) when any of `rows` is flagged in `bad`: two launches, no
/// read.
fn poison_if_flagged<R: CubeRuntime>(
    launcher: &Launcher<R>,
    bad: &CubeTensor<R>,
    rows: &[u32],
    (out, marker): (&CubeTensor<R>, f32),
) {
    if rows.is_empty() {
        return;
    }
    let listed: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    let flag = launcher.zeros(1, DType::U32);
    note(
        "any_flagged",
        Streams::other(listed.len() * 8),
        Streams::other(4),
    );
    unsafe {
        kernels::any_flagged::launch_unchecked::<R>(
            &launcher.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(BLOCK as u32),
            launcher.address,
            bad.clone().into_array_arg(),
            launcher.ints(&listed).into_array_arg(),
            flag.clone().into_array_arg(),
            listed.len(),
            BLOCK,
        );
    }
    let n = out.meta.shape.num_elements();
    note("poison", Streams::other(4), Streams::other(n * 4));
    let (count, dim) = launcher.elementwise(n);
    unsafe {
        kernels::poison::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            flag.into_array_arg(),
            out.clone().into_array_arg(),
            marker,
            n,
        );
    }
}

/// Checks the rows the loss read, then that the loss is finite (two small reads, or kept for
/// later: a bad row makes the loss NaN on the device, which its reader sees).
pub(super) fn finish<B: Cube<R>, R: CubeRuntime>(
    launcher: &Launcher<R>,
    output: LossOutput<B>,
    (bad, rows): (CubeTensor<R>, impl Iterator<Item = u32>),
    loss: &'static str,
) -> Result<LossOutput<B>, KernelError> {
    check_rows::<B, R>(launcher, (bad, rows), (&output.value, f32::NAN), "student")?;
    let value = output.value.clone();
    check_later(move || {
        let value = read_f32::<B, R>(value)?[0];
        finite_loss(value as f64, loss).map(|_| ())
    })?;
    Ok(output)
}

/// The chunk merge: `σ` per slot.
pub(super) fn merge_shifts<R: CubeRuntime>(
    launcher: &Launcher<R>,
    z: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    plan: &PlanArrays<R>,
    (slots, v, tau_inv): (usize, usize, f32),
) -> CubeTensor<R> {
    let sigma = launcher.zeros(slots, DType::F32);
    // Each continuation term gathers one logit and its row's log-sum-exp.
    note(
        "merge_shift",
        Streams::logits(plan.terms * z.dtype.size()) + Streams::other(plan.terms * 12 + slots * 4),
        Streams::other(slots * 4),
    );
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

/// Declares one `top_k` launch over `valid` rows of `v` logits of `element` bytes, keeping `k`
/// entries each (with `masked`, through a `[v]` exclusion table): one pass over the row (a row
/// whose split bin overflows the scratch list takes one more, or ten where the second level
/// overflows too: data decides, not counted here), the
/// candidates' scratch list and the entries written, and the in-place sorts' lists (a few KiB
/// per cube, cache-resident: counted once).
pub(super) fn note_top_k(valid: usize, (v, k, element): (usize, usize, usize), masked: bool) {
    let table = if masked { v * 4 } else { 0 };
    let cap = k.next_power_of_two();
    note(
        "top_k",
        Streams::logits(valid * v * element)
            + Streams::other(table + valid * (k * 12 + cap * 8 + 20)),
        Streams::other(valid * (k * 20 + cap * 8)),
    );
}
