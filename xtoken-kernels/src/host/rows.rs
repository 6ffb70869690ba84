//! Reading logit rows: where they come from ([`LogitRows`]), and how a pass hands them (and the
//! gradient's rows) to the threads that evaluate them.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorPrimitive};
use rayon::prelude::*;

use crate::error::KernelError;

pub(crate) fn float3<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn read_err(what: &'static str) -> impl Fn(burn::tensor::DataError) -> KernelError {
    move |e| KernelError::Read {
        what,
        message: format!("{e:?}"),
    }
}

/// A small int tensor's values, on the host.
pub(crate) fn read_ints<B: Backend>(
    t: IntTensor<B>,
    what: &'static str,
) -> Result<Vec<i64>, KernelError> {
    Tensor::<B, 2, Int>::from_primitive(t)
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(read_err(what))
}

/// A small float tensor's values, on the host.
pub(crate) fn read_floats<B: Backend>(
    t: FloatTensor<B>,
    what: &'static str,
) -> Result<Vec<f32>, KernelError> {
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(read_err(what))
}

/// Where the host evaluation reads rows of `[B, T, V]` logits from (row `r` = sequence `r / T`,
/// position `r % T`).
pub trait LogitRows: Sync {
    /// `B · T`.
    fn rows(&self) -> usize;
    /// `V`.
    fn vocab(&self) -> usize;
    /// The given rows, in order.
    fn read(&self, rows: &[u32], what: &'static str) -> Result<Block<'_>, KernelError>;
}

/// Rows handed out by a [`LogitRows`].
pub enum Block<'a> {
    /// The whole `[B·T, V]` tensor, borrowed: index by row.
    Whole(&'a [f32]),
    /// The requested rows, copied: index by position in the request.
    Copied(Vec<f32>),
}

impl Block<'_> {
    /// Row `row`, the `i`-th of the request.
    pub fn row(&self, i: usize, row: u32, v: usize) -> &[f32] {
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

impl<B: Backend> LogitRows for TensorRows<B> {
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

impl LogitRows for SliceRows<'_> {
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

/// Runs `f(scratch, item)` over `items` split into one group per thread, each group with its
/// own scratch from `scratches` (grown with `make` as needed and kept for the next call, so
/// vocabulary-sized buffers are allocated once per pass, not once per chunk).
pub(crate) fn par_items<I, S, T, M, F>(
    items: &mut [I],
    scratches: &mut Vec<S>,
    make: M,
    f: F,
) -> Vec<T>
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
pub(crate) struct Item<'g> {
    pub(crate) index: usize,
    pub(crate) row: u32,
    pub(crate) grad: Option<&'g mut [f32]>,
}

/// The gradient's rows, lent out to one pass at a time.
pub(crate) struct GradRows<'g> {
    rows: Vec<Option<&'g mut [f32]>>,
}

impl<'g> GradRows<'g> {
    pub(crate) fn new(grad: &'g mut [f32], v: usize) -> Self {
        Self {
            rows: grad.chunks_mut(v.max(1)).map(Some).collect(),
        }
    }

    /// Items for `rows` (which must be distinct), each with its gradient row when there is one.
    pub(crate) fn lend(&mut self, rows: &[u32]) -> Vec<Item<'g>> {
        rows.iter()
            .enumerate()
            .map(|(index, &row)| Item {
                index,
                row,
                grad: self.rows.get_mut(row as usize).and_then(Option::take),
            })
            .collect()
    }

    pub(crate) fn give_back(&mut self, items: Vec<Item<'g>>) {
        for item in items {
            if let Some(g) = item.grad {
                self.rows[item.row as usize] = Some(g);
            }
        }
    }
}
