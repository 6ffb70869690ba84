//! The host implementation of the fused operations. Logit rows come from a [`RowSource`]: the
//! portable [`TensorRows`] copies one row chunk at a time with `into_data` (any backend),
//! [`SliceRows`] borrows logits already in host memory (ndarray). Rows are evaluated on all
//! cores and the gradient is uploaded as one tensor.
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

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use rayon::prelude::*;

use crate::error::KernelError;
use crate::spec::{
    CommonPairs, Confidence, GradRequest, LossSpec, MergePlan, Objective, TeacherSpec,
};
use crate::{LossOutput, ProjectionTensors, TeacherEntries};

fn float3<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn float<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn read_err(what: &'static str) -> impl Fn(burn::tensor::DataError) -> KernelError {
    move |e| KernelError::Read {
        what,
        message: format!("{e:?}"),
    }
}

/// Where the host kernels read rows of `[B, T, V]` logits from (row `r` = sequence `r / T`,
/// position `r % T`).
pub trait RowSource: Sync {
    /// `B · T`.
    fn rows(&self) -> usize;
    /// `V`.
    fn vocab(&self) -> usize;
    /// The given rows, in order.
    fn read(&self, rows: &[u32], what: &'static str) -> Result<Block<'_>, KernelError>;
}

/// Rows handed out by a [`RowSource`].
pub enum Block<'a> {
    /// The whole `[B·T, V]` tensor, borrowed: index by row.
    Whole(&'a [f32]),
    /// The requested rows, copied: index by position in the request.
    Copied(Vec<f32>),
}

impl Block<'_> {
    fn row(&self, i: usize, row: u32, v: usize) -> &[f32] {
        match self {
            Block::Whole(data) => &data[row as usize * v..(row as usize + 1) * v],
            Block::Copied(data) => &data[i * v..(i + 1) * v],
        }
    }
}

/// Any backend: row chunks are copied with `into_data`, one slice per run of consecutive
/// positions, so no full-size copy is made.
pub struct TensorRows<B: Backend> {
    logits: Tensor<B, 3>,
}

impl<B: Backend> TensorRows<B> {
    /// Wraps `[B, T, V]` logits.
    pub fn new(logits: FloatTensor<B>) -> Self {
        Self {
            logits: float3::<B>(logits),
        }
    }
}

impl<B: Backend> RowSource for TensorRows<B> {
    fn rows(&self) -> usize {
        let [b, t, _] = self.logits.dims();
        b * t
    }

    fn vocab(&self) -> usize {
        self.logits.dims()[2]
    }

    fn read(&self, rows: &[u32], what: &'static str) -> Result<Block<'_>, KernelError> {
        let [_, t, v] = self.logits.dims();
        let mut out: Vec<f32> = Vec::with_capacity(rows.len() * v);
        let mut i = 0;
        while i < rows.len() {
            let first = rows[i] as usize;
            let (b, p) = (first / t, first % t);
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 && rows[j] as usize / t == b {
                j += 1;
            }
            let part = self.logits.clone().slice([b..b + 1, p..p + (j - i), 0..v]);
            let data = part.into_data().convert::<f32>();
            if i == 0 && j == rows.len() {
                return Ok(Block::Copied(
                    data.into_vec::<f32>().map_err(read_err(what))?,
                ));
            }
            out.extend_from_slice(data.as_slice::<f32>().map_err(read_err(what))?);
            i = j;
        }
        Ok(Block::Copied(out))
    }
}

/// Logits already in host memory as one contiguous `[B, T, V]` f32 slice (ndarray): read in
/// place, without any copy.
pub struct SliceRows<'a> {
    data: &'a [f32],
    shape: [usize; 3],
}

impl<'a> SliceRows<'a> {
    /// Borrows `[B, T, V]` data; `None` when the shape does not match.
    pub fn new(data: &'a [f32], shape: &[usize]) -> Option<Self> {
        let &[b, t, v] = shape else { return None };
        (data.len() == b * t * v).then_some(Self {
            data,
            shape: [b, t, v],
        })
    }

    /// `[B, T, V]`.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }
}

impl RowSource for SliceRows<'_> {
    fn rows(&self) -> usize {
        self.shape[0] * self.shape[1]
    }

    fn vocab(&self) -> usize {
        self.shape[2]
    }

    fn read(&self, _: &[u32], _: &'static str) -> Result<Block<'_>, KernelError> {
        Ok(Block::Whole(self.data))
    }
}

fn read_ints<B: Backend>(t: IntTensor<B>, what: &'static str) -> Result<Vec<i64>, KernelError> {
    Tensor::<B, 2, Int>::from_primitive(t)
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(read_err(what))
}

fn read_floats<B: Backend>(t: FloatTensor<B>, what: &'static str) -> Result<Vec<f32>, KernelError> {
    float::<B>(t)
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(read_err(what))
}

fn dims<B: Backend>(t: &FloatTensor<B>) -> [usize; 2] {
    float::<B>(t.clone()).dims()
}

fn int_dims<B: Backend>(t: &IntTensor<B>) -> [usize; 2] {
    Tensor::<B, 2, Int>::from_primitive(t.clone()).dims()
}

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
fn softmax_into(z: &[f32], t: f32, p: &mut [f32]) -> f32 {
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

/// Runs `f(scratch, item)` over `items` split into one group per thread, each group with its
/// own scratch from `scratches` (grown with `make` as needed and kept for the next call, so
/// vocabulary-sized buffers are allocated once per pass, not once per chunk).
fn par_items<I, S, T, M, F>(items: &mut [I], scratches: &mut Vec<S>, make: M, f: F) -> Vec<T>
where
    I: Send,
    S: Send,
    T: Send,
    M: Fn() -> S,
    F: Fn(&mut S, &mut I) -> T + Sync,
{
    if items.is_empty() {
        return Vec::new();
    }
    let groups = rayon::current_num_threads().clamp(1, items.len());
    let per = items.len().div_ceil(groups);
    let groups = items.len().div_ceil(per);
    while scratches.len() < groups {
        scratches.push(make());
    }
    let parts: Vec<Vec<T>> = items
        .par_chunks_mut(per)
        .zip(scratches.par_iter_mut())
        .map(|(part, scratch)| part.iter_mut().map(|item| f(scratch, item)).collect())
        .collect();
    parts.into_iter().flatten().collect()
}

/// One row of a pass: its position in the request, its row, and its gradient row if wanted.
struct Item<'g> {
    index: usize,
    row: u32,
    grad: Option<&'g mut [f32]>,
}

/// The gradient's rows, lent out to one pass at a time.
struct GradRows<'g> {
    rows: Vec<Option<&'g mut [f32]>>,
}

impl<'g> GradRows<'g> {
    fn new(grad: &'g mut [f32], v: usize) -> Self {
        Self {
            rows: grad.chunks_mut(v.max(1)).map(Some).collect(),
        }
    }

    /// Items for `rows` (which must be distinct), each with its gradient row when there is one.
    fn lend(&mut self, rows: &[u32]) -> Vec<Item<'g>> {
        rows.iter()
            .enumerate()
            .map(|(index, &row)| Item {
                index,
                row,
                grad: self.rows.get_mut(row as usize).and_then(Option::take),
            })
            .collect()
    }

    fn give_back(&mut self, items: Vec<Item<'g>>) {
        for item in items {
            if let Some(g) = item.grad {
                self.rows[item.row as usize] = Some(g);
            }
        }
    }
}

/// The continuation rows of one side, grouped by row.
struct Continuations {
    rows: Vec<u32>,
    /// Per row (same order): the `(token, slot)` terms it serves.
    terms: Vec<Vec<(u32, u32)>>,
}

impl Continuations {
    fn new(merge: &MergePlan) -> Self {
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
fn merge_shifts<S: RowSource>(
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

/// The teacher's targets on the host: ids and merged log-probabilities `[slots, k]`.
pub struct HostEntries {
    /// Token ids, best first.
    pub ids: Vec<i64>,
    /// Merged, tempered log-probabilities (−∞ on skipped slots).
    pub logp: Vec<f32>,
    /// Entries per slot.
    pub k: usize,
    /// The confidence statistics, when asked for.
    pub confidence: Option<Confidence>,
}

/// The teacher's targets from any backend's logits `[B, T, V_T]`.
pub fn teacher_entries<B: Backend>(
    logits: FloatTensor<B>,
    spec: &TeacherSpec,
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
    }
}

/// The teacher's targets from a row source.
pub fn teacher_entries_from<S: RowSource>(
    src: &S,
    spec: &TeacherSpec,
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
            |order, &mut (i, row)| {
                let z = block.row(i, row, vt);
                let lse = log_sum_exp(z, tau_inv);
                order.clear();
                order.extend(0..vt as u32);
                let better =
                    |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b));
                if k < vt {
                    order.select_nth_unstable_by(k - 1, better);
                }
                order[..k].sort_unstable_by(better);
                (lse, order[..k].to_vec())
            },
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

/// `Ok` when a row's log-sum-exp is finite; otherwise the error naming the row.
fn finite(lse: f32, side: &'static str, row: u32) -> Result<(), KernelError> {
    if lse.is_finite() {
        Ok(())
    } else {
        Err(KernelError::NonFinite {
            side,
            row: row as usize,
        })
    }
}

/// The `(row, target)` pairs of a per-row target array (`-1`: no target), checked against the
/// logits' shape.
fn target_rows<S: RowSource>(
    src: &S,
    targets: &[i32],
    what: &'static str,
) -> Result<Vec<(u32, u32)>, KernelError> {
    checked_targets(targets, src.rows(), src.vocab(), what)
}

/// The `(row, target)` pairs of a per-row target array (`-1`: no target), checked against
/// `rows × vocab` logits.
pub(crate) fn checked_targets(
    targets: &[i32],
    n: usize,
    v: usize,
    what: &'static str,
) -> Result<Vec<(u32, u32)>, KernelError> {
    if targets.len() != n {
        return Err(KernelError::Shape {
            what,
            expected: format!("{n} entries"),
            found: format!("{}", targets.len()),
        });
    }
    let rows: Vec<(u32, u32)> = targets
        .iter()
        .enumerate()
        .filter(|(_, &y)| y >= 0)
        .map(|(r, &y)| (r as u32, y as u32))
        .collect();
    match rows.iter().find(|(_, y)| *y as usize >= v) {
        Some(&(_, y)) => Err(KernelError::IndexOutOfRange {
            what,
            field: "token",
            index: y as i64,
            size: v,
        }),
        None => Ok(rows),
    }
}

/// The teacher's entries a distillation objective needs, with the `[slots, k]` shapes of their
/// ids and log-probabilities checked.
pub(crate) fn checked_teacher<B: Backend>(
    teacher: Option<TeacherEntries<B>>,
    slots: usize,
) -> Result<TeacherEntries<B>, KernelError> {
    let teacher = teacher.ok_or(KernelError::Invalid {
        what: "loss",
        why: "a distillation objective needs the teacher's entries".into(),
    })?;
    let expected = [slots, teacher.k];
    for (what, found) in [
        ("teacher ids", int_dims::<B>(&teacher.ids)),
        ("teacher log-probabilities", dims::<B>(&teacher.logp)),
    ] {
        if found != expected {
            return Err(KernelError::Shape {
                what,
                expected: format!("{expected:?}"),
                found: format!("{found:?}"),
            });
        }
    }
    Ok(teacher)
}

/// Batch means of `log p[y]`, `Σ p log p` and `max p` over rows with a next token.
fn confidence<S: RowSource>(
    src: &S,
    next: &[i32],
    row_chunk: usize,
) -> Result<Confidence, KernelError> {
    let v = src.vocab();
    let rows = target_rows(src, next, "teacher next tokens")?;
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
            |p, &mut (i, row)| {
                let z = block.row(i, row, v);
                let lse = softmax_into(z, 1.0, p);
                let mut max = 0.0f32;
                let mut plogp = 0.0f64;
                for (&x, &pj) in z.iter().zip(p.iter()) {
                    max = max.max(pj);
                    if pj > 0.0 {
                        plogp += pj as f64 * (x - lse) as f64;
                    }
                }
                let y = chunk[i].1 as usize;
                (lse, (z[y] - lse) as f64, plogp, max as f64)
            },
        );
        for (i, (lse, lpy, plogp, maxp)) in stats.into_iter().enumerate() {
            finite(lse, "teacher", chunk[i].0)?;
            sums.0 += lpy;
            sums.1 += plogp;
            sums.2 += maxp;
        }
    }
    let count = rows.len().max(1) as f64;
    Ok(Confidence {
        neg_cross_entropy: sums.0 / count,
        neg_entropy: sums.1 / count,
        max_prob: sums.2 / count,
        positions: rows.len(),
    })
}

/// Read-only inputs of the per-row student kernels.
struct RowCtx<'a> {
    objective: &'a Objective,
    tau_inv: f32,
    /// τ² / valid chunks.
    scale: f64,
    k: usize,
    teacher_ids: &'a [i64],
    teacher_logp: &'a [f32],
    projection: Option<(&'a [i64], &'a [f32], usize)>,
    /// W's columns, when there is a projection.
    columns: Option<&'a Columns>,
    want: GradRequest,
}

/// W transposed: per teacher id, the flat slots `s · K_w + k` that point to it.
pub(crate) struct Columns {
    pub(crate) start: Vec<u32>,
    pub(crate) slots: Vec<u32>,
}

impl Columns {
    /// A counting sort of the slots by teacher id.
    pub(crate) fn new(indices: &[i64], teacher_vocab: usize) -> Self {
        let mut start = vec![0u32; teacher_vocab + 1];
        for &t in indices.iter().filter(|&&t| t >= 0) {
            start[t as usize + 1] += 1;
        }
        for t in 0..teacher_vocab {
            start[t + 1] += start[t];
        }
        let mut fill = start.clone();
        let mut slots = vec![0u32; start[teacher_vocab] as usize];
        for (slot, &t) in indices.iter().enumerate() {
            if t >= 0 {
                slots[fill[t as usize] as usize] = slot as u32;
                fill[t as usize] += 1;
            }
        }
        Self { start, slots }
    }

    fn of(&self, t: usize) -> &[u32] {
        &self.slots[self.start[t] as usize..self.start[t + 1] as usize]
    }
}

/// Per-thread buffers of the student kernels.
struct Scratch {
    p: Vec<f32>,
    h: Vec<f32>,
    uncommon: Vec<(f32, u32)>,
    teacher_rest: Vec<f32>,
    grad_weights: Vec<f64>,
}

impl Scratch {
    fn new(ctx: &RowCtx<'_>, v: usize) -> Self {
        let grad_weights = match ctx.projection {
            Some((_, _, kw)) if ctx.want.weights => vec![0.0; v * kw],
            _ => Vec::new(),
        };
        Self {
            p: vec![0.0; v],
            h: vec![0.0; v],
            uncommon: Vec::new(),
            teacher_rest: Vec::new(),
            grad_weights,
        }
    }
}

/// Loss and `Σh` of one predicting row; adds its gradient into `out` when given.
fn predicting_row(
    ctx: &RowCtx<'_>,
    s: &mut Scratch,
    (slot, row): (usize, u32),
    sigma: f64,
    z: &[f32],
    out: Option<&mut [f32]>,
) -> Result<(f64, f64), KernelError> {
    let lse = softmax_into(z, ctx.tau_inv, &mut s.p);
    finite(lse, "student", row)?;
    s.h.fill(0.0);
    let ids = &ctx.teacher_ids[slot * ctx.k..(slot + 1) * ctx.k];
    let logp = &ctx.teacher_logp[slot * ctx.k..(slot + 1) * ctx.k];
    let log_student = |id: usize| (z[id] * ctx.tau_inv - lse) as f64 + sigma;
    let mut loss = 0.0f64;
    match ctx.objective {
        Objective::Kl => {
            for (&t, &lq) in ids.iter().zip(logp) {
                if lq == f32::NEG_INFINITY {
                    continue;
                }
                let q = (lq as f64).exp();
                loss += q * (lq as f64 - log_student(t as usize));
                s.h[t as usize] -= q as f32;
            }
        }
        Objective::Projected { eps } => {
            let (_, w, kw) = ctx.projection.expect("checked by loss()");
            let columns = ctx.columns.expect("built with the projection");
            // Only the kept teacher entries need `Wᵀp̂`: walk W's columns for them, and send
            // `g_t = ∂loss/∂p̃_t` back along the same entries into `h` (used as an accumulator).
            let es = sigma.exp();
            let want_w = ctx.want.weights;
            for (&t, &lq) in ids.iter().zip(logp) {
                if lq == f32::NEG_INFINITY {
                    continue;
                }
                let column = columns.of(t as usize);
                let projected: f64 = column
                    .iter()
                    .map(|&e| w[e as usize] as f64 * s.p[e as usize / kw] as f64)
                    .sum();
                let q = (lq as f64).exp();
                let pt = es * projected + *eps as f64;
                loss += q * (lq as f64 - pt.ln());
                let g = -q / pt;
                for &e in column {
                    let row = e as usize / kw;
                    s.h[row] += (w[e as usize] as f64 * g) as f32;
                    if want_w {
                        s.grad_weights[e as usize] += ctx.scale * es * s.p[row] as f64 * g;
                    }
                }
            }
            let es = es as f32;
            for (h, &p) in s.h.iter_mut().zip(&s.p) {
                *h *= es * p;
            }
        }
        Objective::Hybrid {
            common,
            lambda_kl,
            lambda_uld,
        } => {
            loss = hybrid_row(
                ctx,
                s,
                common,
                (*lambda_kl, *lambda_uld),
                (ids, logp),
                sigma,
                z,
                lse,
            );
        }
        Objective::CrossEntropy { .. } => unreachable!("cross-entropy has its own kernel"),
    }
    let dsigma: f64 = s.h.iter().map(|&h| h as f64).sum();
    if let Some(out) = out {
        let c = (ctx.scale * ctx.tau_inv as f64) as f32;
        let d = dsigma as f32;
        for ((g, &h), &p) in out.iter_mut().zip(&s.h).zip(&s.p) {
            *g += c * (h - p * d);
        }
    }
    Ok((loss, dsigma))
}

/// GOLD / H-KL / ULD on one predicting row; fills `s.h` and returns the loss.
#[allow(clippy::too_many_arguments)]
fn hybrid_row(
    ctx: &RowCtx<'_>,
    s: &mut Scratch,
    common: &CommonPairs,
    (lambda_kl, lambda_uld): (f32, f32),
    (ids, logp): (&[i64], &[f32]),
    sigma: f64,
    z: &[f32],
    lse: f32,
) -> f64 {
    let mut loss = 0.0f64;
    let mut common_kl = 0.0f64;
    s.teacher_rest.clear();
    for (&t, &lq) in ids.iter().zip(logp) {
        let q = (lq as f64).exp();
        let partner = common.teacher_partner[t as usize];
        if partner >= 0 {
            if q > 0.0 {
                let lps = (z[partner as usize] * ctx.tau_inv - lse) as f64 + sigma;
                common_kl += q * (lq as f64 - lps);
                s.h[partner as usize] -= lambda_kl * q as f32;
            }
        } else {
            s.teacher_rest.push(q as f32);
        }
    }
    loss += lambda_kl as f64 * common_kl;
    if lambda_uld == 0.0 {
        return loss;
    }
    let es = sigma.exp() as f32;
    s.uncommon.clear();
    for (id, &p) in s.p.iter().enumerate() {
        if common.student_partner[id] < 0 {
            s.uncommon.push((es * p, id as u32));
        }
    }
    let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    s.teacher_rest.sort_unstable_by(|a, b| b.total_cmp(a));
    let (na, nb) = (s.uncommon.len(), s.teacher_rest.len());
    let m = na.min(nb);
    if m > 0 && m < na {
        s.uncommon.select_nth_unstable_by(m - 1, desc);
    }
    s.uncommon[..m].sort_unstable_by(desc);
    let mut uld = 0.0f64;
    for (i, &(a, id)) in s.uncommon.iter().enumerate() {
        let d = if i < m {
            let b = s.teacher_rest[i];
            uld += (a as f64 - b as f64).abs();
            if a > b {
                1.0
            } else if a < b {
                -1.0
            } else {
                0.0
            }
        } else {
            uld += a as f64;
            1.0
        };
        s.h[id as usize] += lambda_uld * d * a;
    }
    uld += s.teacher_rest[m..].iter().map(|&b| b as f64).sum::<f64>();
    loss + lambda_uld as f64 * uld
}

/// What the host evaluation returns.
pub struct HostLoss {
    /// The loss.
    pub value: f64,
    /// `[B·T·V]`, when requested.
    pub grad_logits: Option<Vec<f32>>,
    /// `[V_S·K_w]`, when requested.
    pub grad_weights: Option<Vec<f32>>,
}

/// The fused student-side evaluation on any backend (see [`crate::XTokenBackend::xt_loss`]).
pub fn loss<B: Backend>(
    logits: FloatTensor<B>,
    projection: Option<ProjectionTensors<B>>,
    teacher: Option<TeacherEntries<B>>,
    spec: &LossSpec,
    want: GradRequest,
) -> Result<LossOutput<B>, KernelError> {
    let tensor = float3::<B>(logits.clone());
    let src = TensorRows::<B>::new(logits);
    let host = loss_from(&src, projection, teacher, spec, want)?;
    Ok(loss_to_device(
        host,
        tensor.dims(),
        tensor.dtype(),
        &tensor.device(),
    ))
}

/// Uploads a host result as the [`LossOutput`] tensors.
pub fn loss_to_device<B: Backend>(
    host: HostLoss,
    shape: [usize; 3],
    dtype: DType,
    device: &B::Device,
) -> LossOutput<B> {
    let convert = |data: TensorData| {
        if dtype == DType::F32 {
            data
        } else {
            data.convert_dtype(dtype)
        }
    };
    let value = Tensor::<B, 1>::from_data(
        convert(TensorData::new(vec![host.value as f32], [1])),
        device,
    );
    let [_, _, v] = shape;
    LossOutput {
        value: value.into_primitive().tensor(),
        grad_logits: host.grad_logits.map(|g| {
            Tensor::<B, 3>::from_data(convert(TensorData::new(g, shape)), device)
                .into_primitive()
                .tensor()
        }),
        grad_weights: host.grad_weights.map(|g| {
            let kw = g.len() / v.max(1);
            Tensor::<B, 2>::from_data(convert(TensorData::new(g, [v, kw])), device)
                .into_primitive()
                .tensor()
        }),
    }
}

/// The fused student-side evaluation from a row source; the small inputs (teacher entries,
/// projection) are read from their tensors.
pub fn loss_from<S: RowSource, B: Backend>(
    src: &S,
    projection: Option<ProjectionTensors<B>>,
    teacher: Option<TeacherEntries<B>>,
    spec: &LossSpec,
    want: GradRequest,
) -> Result<HostLoss, KernelError> {
    let (n, v) = (src.rows(), src.vocab());
    let row_chunk = spec.row_chunk.max(1);
    let mut grad = if want.logits {
        vec![0.0f32; n * v]
    } else {
        Vec::new()
    };
    let mut grad_weights: Option<Vec<f64>> = None;
    let value = match &spec.objective {
        Objective::CrossEntropy { targets } => cross_entropy(
            src,
            targets,
            row_chunk,
            want.logits.then_some(&mut grad[..]),
        )?,
        objective => {
            check_tau(spec.tau)?;
            spec.merge.check("student", n, v)?;
            let teacher = checked_teacher(teacher, spec.merge.slots())?;
            let k = teacher.k;
            let teacher_ids = read_ints::<B>(teacher.ids, "teacher ids")?;
            let teacher_logp = read_floats::<B>(teacher.logp, "teacher log-probabilities")?;
            let id_limit = match objective {
                Objective::Kl => v,
                _ => teacher.vocab,
            };
            check_ids(&teacher_ids, id_limit, "teacher ids", "token")?;
            let projection = match (objective, projection) {
                (Objective::Projected { .. }, Some(w)) => {
                    let shape = int_dims::<B>(&w.indices);
                    let wshape = dims::<B>(&w.weights);
                    if shape[0] != v || wshape != shape {
                        return Err(KernelError::Shape {
                            what: "projection",
                            expected: format!("indices and weights [{v}, K]"),
                            found: format!("indices {shape:?}, weights {wshape:?}"),
                        });
                    }
                    let indices = read_ints::<B>(w.indices, "projection indices")?;
                    check_ids(&indices, teacher.vocab, "projection indices", "teacher id")?;
                    let weights = read_floats::<B>(w.weights, "projection weights")?;
                    Some((indices, weights, shape[1]))
                }
                (Objective::Projected { .. }, None) => {
                    return Err(KernelError::Invalid {
                        what: "loss",
                        why: "the projected KL needs the projection W".into(),
                    })
                }
                _ => None,
            };
            if let Objective::Hybrid { common, .. } = objective {
                common.check(v, teacher.vocab)?;
            }
            let valid = spec.merge.valid();
            let tau = spec.tau as f64;
            let columns = projection
                .as_ref()
                .map(|(indices, _, _)| Columns::new(indices, teacher.vocab));
            let ctx = RowCtx {
                objective,
                tau_inv: 1.0 / spec.tau,
                scale: if valid > 0 {
                    tau * tau / valid as f64
                } else {
                    0.0
                },
                k,
                teacher_ids: &teacher_ids,
                teacher_logp: &teacher_logp,
                projection: projection.as_ref().map(|(i, w, kw)| (&i[..], &w[..], *kw)),
                columns: columns.as_ref(),
                want: GradRequest {
                    logits: want.logits,
                    weights: want.weights && projection.is_some(),
                },
            };
            let (value, gw) = distill(src, spec, &ctx, row_chunk, &mut grad)?;
            grad_weights = gw;
            value
        }
    };
    if !value.is_finite() {
        return Err(KernelError::NonFiniteLoss {
            objective: objective_name(&spec.objective),
            value,
        });
    }
    Ok(HostLoss {
        value,
        grad_logits: want.logits.then_some(grad),
        grad_weights: grad_weights.map(|g| g.into_iter().map(|x| x as f32).collect()),
    })
}

fn objective_name(objective: &Objective) -> &'static str {
    match objective {
        Objective::Kl => "KL",
        Objective::Projected { .. } => "projected KL",
        Objective::Hybrid { .. } => "hybrid",
        Objective::CrossEntropy { .. } => "cross-entropy",
    }
}

fn check_ids(
    ids: &[i64],
    limit: usize,
    what: &'static str,
    field: &'static str,
) -> Result<(), KernelError> {
    match ids.iter().find(|&&t| t >= limit as i64) {
        Some(&t) => Err(KernelError::IndexOutOfRange {
            what,
            field,
            index: t,
            size: limit,
        }),
        None => Ok(()),
    }
}

/// The three passes of a distillation objective; returns the loss and the weights' gradient.
fn distill<S: RowSource>(
    src: &S,
    spec: &LossSpec,
    ctx: &RowCtx<'_>,
    row_chunk: usize,
    grad: &mut [f32],
) -> Result<(f64, Option<Vec<f64>>), KernelError> {
    let v = src.vocab();
    let merge = &spec.merge;
    let cont = Continuations::new(merge);
    let sigma = merge_shifts(src, merge, &cont, ctx.tau_inv, row_chunk, "student")?;
    let valid: Vec<(usize, u32)> = merge.predicting().collect();
    let mut grad_rows = GradRows::new(grad, v);
    let mut total = 0.0f64;
    let mut dsigma = vec![0.0f64; merge.slots()];
    let mut scratches = Vec::new();
    for chunk in valid.chunks(row_chunk) {
        let rows: Vec<u32> = chunk.iter().map(|&(_, r)| r).collect();
        let block = src.read(&rows, "student")?;
        let mut items = grad_rows.lend(&rows);
        let results = par_items(
            &mut items,
            &mut scratches,
            || Scratch::new(ctx, v),
            |s, item| {
                let (slot, row) = chunk[item.index];
                let z = block.row(item.index, row, v);
                predicting_row(
                    ctx,
                    s,
                    (slot, row),
                    sigma[slot],
                    z,
                    item.grad.as_deref_mut(),
                )
            },
        );
        grad_rows.give_back(items);
        for (i, result) in results.into_iter().enumerate() {
            let (slot, _) = chunk[i];
            let (loss, ds) = result?;
            total += loss;
            dsigma[slot] += ds;
        }
    }
    let mut grad_weights: Option<Vec<f64>> = None;
    if ctx.want.weights {
        for s in scratches {
            match grad_weights.as_mut() {
                None => grad_weights = Some(s.grad_weights),
                Some(acc) => acc
                    .iter_mut()
                    .zip(&s.grad_weights)
                    .for_each(|(a, b)| *a += b),
            }
        }
    }
    if ctx.want.logits && !cont.rows.is_empty() {
        let c = (ctx.scale * ctx.tau_inv as f64) as f32;
        let tau_inv = ctx.tau_inv;
        let mut buffers = Vec::new();
        for (chunk_index, rows) in cont.rows.chunks(row_chunk).enumerate() {
            let base = chunk_index * row_chunk;
            let block = src.read(rows, "student")?;
            let mut items = grad_rows.lend(rows);
            let terms = &cont.terms;
            let dsigma = &dsigma;
            par_items(
                &mut items,
                &mut buffers,
                || vec![0.0f32; v],
                |p, item| {
                    let z = block.row(item.index, item.row, v);
                    softmax_into(z, tau_inv, p);
                    let row_terms = &terms[base + item.index];
                    let total: f64 = row_terms
                        .iter()
                        .map(|&(_, slot)| dsigma[slot as usize])
                        .sum();
                    let Some(out) = item.grad.as_deref_mut() else {
                        return;
                    };
                    let total = c * total as f32;
                    for (g, &pj) in out.iter_mut().zip(p.iter()) {
                        *g -= total * pj;
                    }
                    for &(token, slot) in row_terms {
                        out[token as usize] += c * dsigma[slot as usize] as f32;
                    }
                },
            );
            grad_rows.give_back(items);
        }
    }
    let ctx_weights = ctx.want.weights.then(|| {
        grad_weights.unwrap_or_else(|| vec![0.0; ctx.projection.map_or(0, |(_, _, kw)| v * kw)])
    });
    Ok((total * ctx.scale, ctx_weights))
}

/// Mean next-token cross-entropy over rows with a target; adds `(p − e_y)/count` into `grad`.
fn cross_entropy<S: RowSource>(
    src: &S,
    targets: &Arc<[i32]>,
    row_chunk: usize,
    grad: Option<&mut [f32]>,
) -> Result<f64, KernelError> {
    let v = src.vocab();
    let rows = target_rows(src, targets, "cross-entropy targets")?;
    if rows.is_empty() {
        return Ok(0.0);
    }
    let inv = 1.0 / rows.len() as f64;
    let mut empty = [];
    let mut grad_rows = GradRows::new(grad.unwrap_or(&mut empty), v);
    let mut total = 0.0f64;
    let mut buffers = Vec::new();
    for chunk in rows.chunks(row_chunk) {
        let ids: Vec<u32> = chunk.iter().map(|&(r, _)| r).collect();
        let block = src.read(&ids, "student")?;
        let mut items = grad_rows.lend(&ids);
        let losses = par_items(
            &mut items,
            &mut buffers,
            || vec![0.0f32; v],
            |p, item| {
                let z = block.row(item.index, item.row, v);
                let lse = softmax_into(z, 1.0, p);
                let y = chunk[item.index].1 as usize;
                if let Some(out) = item.grad.as_deref_mut() {
                    let inv = inv as f32;
                    for (g, &pj) in out.iter_mut().zip(p.iter()) {
                        *g += pj * inv;
                    }
                    out[y] -= inv;
                }
                (lse, (lse - z[y]) as f64)
            },
        );
        grad_rows.give_back(items);
        for (i, (lse, loss)) in losses.into_iter().enumerate() {
            finite(lse, "student", chunk[i].0)?;
            total += loss;
        }
    }
    Ok(total * inv)
}

pub(crate) fn check_tau(tau: f32) -> Result<(), KernelError> {
    if tau.is_finite() && tau > 0.0 {
        Ok(())
    } else {
        Err(KernelError::Invalid {
            what: "temperature",
            why: format!("τ = {tau}; it must be a positive finite number"),
        })
    }
}
