//! Gradient buckets: a step's gradients gathered into flat tensors of about `bucket_bytes` each,
//! in the order the backward produces them (W's first, at the loss, then the student's from its
//! head down to its embedding), each of one dtype (bf16 gradients travel as bf16), and each
//! handed to the all-reduce as soon as it is gathered: on NCCL its sum runs on a stream of its
//! own while the device gathers the next. The step's metric values ride in the last f32 bucket
//! (or one of their own). After the last bucket the sums are cut back into each module's
//! gradients. Backend-generic: on the CPU the same buckets drive xtoken-collective's ring.

use std::collections::HashMap;
use std::ops::Range;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use xtoken_core::loss::pkl::LearnableProjection;

use crate::error::{Error, Result};
use xtoken_models::Transformer;

/// What the workers sum after each step: the student's gradients, each learnable W's, and the
/// step's metric sums.
pub struct Exchange<'a, B: AutodiffBackend> {
    /// Gives the parameters' order, the same on every worker.
    pub student: &'a Transformer<B>,
    /// The student's gradients, summed over this worker's micro-batches.
    pub student_grads: GradientsParams,
    /// Per teacher: its learnable W and W's gradients.
    pub projections: Vec<Option<(&'a LearnableProjection<B>, GradientsParams)>>,
    /// The step's metric sums.
    pub values: Vec<f64>,
}

/// The summed result of an [`Exchange`].
pub struct Summed {
    /// The student's gradients.
    pub student_grads: GradientsParams,
    /// Per teacher, W's gradients.
    pub projection_grads: Vec<Option<GradientsParams>>,
    /// The metric sums.
    pub values: Vec<f64>,
}

/// One gradient taken out of its module: its parameter, dtype and values flattened.
struct Taken<B: Backend> {
    id: ParamId,
    dtype: DType,
    flat: Tensor<B, 1>,
}

/// Where one gradient sits in its bucket.
struct Slot {
    id: ParamId,
    range: Range<usize>,
}

/// Moves every gradient of `module` out of `grads`, flattened, in visit order.
fn take<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: GradientsParams,
) -> Vec<Taken<B::InnerBackend>> {
    struct Take<B: AutodiffBackend> {
        grads: GradientsParams,
        taken: Vec<Taken<B::InnerBackend>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Take<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let count = g.dims().iter().product::<usize>();
                self.taken.push(Taken {
                    id: param.id,
                    dtype: g.dtype(),
                    flat: g.reshape([count]),
                });
            }
        }
    }
    let mut visitor = Take::<B> {
        grads,
        taken: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.taken
}

/// Consecutive runs of `items` (dtype, bytes) that make the buckets: a new bucket starts where
/// the dtype changes or the bytes would pass `limit`; a gradient larger than `limit` is a
/// bucket of its own.
pub fn plan(items: &[(DType, usize)], limit: usize) -> Vec<Range<usize>> {
    let mut buckets: Vec<Range<usize>> = Vec::new();
    let mut bytes = 0usize;
    for (i, &(dtype, size)) in items.iter().enumerate() {
        match buckets.last_mut() {
            Some(last) if items[last.start].0 == dtype && bytes + size <= limit => {
                last.end = i + 1;
                bytes += size;
            }
            _ => {
                buckets.push(i..i + 1);
                bytes = size;
            }
        }
    }
    buckets
}

/// Sums `exchange` over the workers in buckets of about `limit` bytes: `reduce` takes each
/// bucket as it is gathered (and may only enqueue its sum), `settle` waits for every sum.
pub(super) fn all_reduce<B: AutodiffBackend>(
    exchange: Exchange<'_, B>,
    limit: usize,
    device: &B::Device,
    reduce: &mut dyn FnMut(Tensor<B::InnerBackend, 1>) -> Result<Tensor<B::InnerBackend, 1>>,
    settle: &mut dyn FnMut() -> Result<()>,
) -> Result<Summed> {
    let Exchange {
        student,
        student_grads,
        projections,
        values,
    } = exchange;
    let modules: Vec<Option<&LearnableProjection<B>>> = projections
        .iter()
        .map(|p| p.as_ref().map(|(w, _)| *w))
        .collect();
    // The backward's order: W's gradients come first (at the loss), then the student's from
    // the last layer back.
    let mut taken = Vec::new();
    for (w, grads) in projections.into_iter().flatten() {
        taken.extend(take(w, grads).into_iter().rev());
    }
    taken.extend(take(student, student_grads).into_iter().rev());
    let sizes: Vec<(DType, usize)> = taken
        .iter()
        .map(|t| (t.dtype, t.flat.dims()[0] * t.dtype.size()))
        .collect();
    let ranges = plan(&sizes, limit);
    let values_join_last = !values.is_empty()
        && ranges
            .last()
            .is_some_and(|r| taken[r.start].dtype == DType::F32);
    let mut pending = taken.into_iter();
    let (mut slots, mut reduced) = (Vec::new(), Vec::new());
    for (b, range) in ranges.iter().enumerate() {
        let mut pieces = Vec::with_capacity(range.len());
        let mut offset = 0;
        for item in pending.by_ref().take(range.len()) {
            let count = item.flat.dims()[0];
            slots.push((
                b,
                Slot {
                    id: item.id,
                    range: offset..offset + count,
                },
            ));
            offset += count;
            pieces.push(item.flat);
        }
        if b + 1 == ranges.len() && values_join_last {
            pieces.push(uploaded::<B>(&values, device));
        }
        reduced.push(reduce(Tensor::cat(pieces, 0))?);
    }
    if !values_join_last && !values.is_empty() {
        reduced.push(reduce(uploaded::<B>(&values, device))?);
    }
    settle()?;
    let values = read_values(reduced.last(), values.len())?;
    let mut parts: HashMap<ParamId, Tensor<B::InnerBackend, 1>> = HashMap::new();
    for (b, slot) in slots {
        parts.insert(slot.id, reduced[b].clone().slice(slot.range));
    }
    let student_grads = put::<B, _>(student, &mut parts);
    let projection_grads = modules
        .iter()
        .map(|w| w.map(|w| put::<B, _>(w, &mut parts)))
        .collect();
    Ok(Summed {
        student_grads,
        projection_grads,
        values,
    })
}

/// The step's values as an f32 tensor.
fn uploaded<B: AutodiffBackend>(values: &[f64], device: &B::Device) -> Tensor<B::InnerBackend, 1> {
    let data = TensorData::new(values.to_vec(), [values.len()]).convert::<f32>();
    Tensor::from_data(data, device)
}

/// The last `count` values of the last bucket (the values ride at its end).
fn read_values<B: Backend>(last: Option<&Tensor<B, 1>>, count: usize) -> Result<Vec<f64>> {
    let Some(last) = last else {
        return Ok(Vec::new());
    };
    let total = last.dims()[0];
    last.clone()
        .slice(total - count..total)
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .map_err(|e| Error::Parallel(format!("reading the reduced metrics: {e:?}")))
}

/// `module`'s gradients from the summed parts, in their shapes.
fn put<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    parts: &mut HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
) -> GradientsParams {
    struct Put<'a, B: AutodiffBackend> {
        parts: &'a mut HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
        grads: GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Put<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(part) = self.parts.remove(&param.id) {
                let shape: [usize; D] = param.val().dims();
                self.grads.register(param.id, part.reshape(shape));
            }
        }
    }
    let mut visitor = Put::<B> {
        parts,
        grads: GradientsParams::new(),
    };
    module.visit(&mut visitor);
    visitor.grads
}

#[cfg(test)]
mod tests {
    use super::plan;
    use burn::tensor::DType;
    use proptest::prelude::*;

    proptest! {
        /// The buckets cover every gradient once, in order; each holds one dtype and stays
        /// within the limit unless it is a single gradient larger than it.
        #[test]
        fn buckets_cover_every_gradient_in_order_within_the_limit(
            items in prop::collection::vec((prop::bool::ANY, 1usize..5000), 0..60),
            limit in 1usize..8000,
        ) {
            let items: Vec<(DType, usize)> = items
                .into_iter()
                .map(|(bf16, n)| (if bf16 { DType::BF16 } else { DType::F32 }, n))
                .collect();
            let buckets = plan(&items, limit);
            let mut next = 0;
            for bucket in &buckets {
                prop_assert_eq!(bucket.start, next);
                prop_assert!(bucket.end > bucket.start);
                next = bucket.end;
                let part = &items[bucket.clone()];
                prop_assert!(part.iter().all(|i| i.0 == part[0].0));
                let bytes: usize = part.iter().map(|i| i.1).sum();
                prop_assert!(bytes <= limit || part.len() == 1);
            }
            prop_assert_eq!(next, items.len());
            // No two neighbours could have been one bucket.
            for pair in buckets.windows(2) {
                let (a, b) = (&items[pair[0].clone()], items[pair[1].start]);
                let bytes: usize = a.iter().map(|i| i.1).sum();
                prop_assert!(a[0].0 != b.0 || bytes + b.1 > limit);
            }
        }
    }
}
