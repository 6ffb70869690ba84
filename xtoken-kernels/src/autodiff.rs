//! `Autodiff<B>` for any [`XTokenBackend`]: the fused loss computes its gradient in the forward
//! pass (it is a scalar, so the upstream gradient is one number); the backward step scales the
//! stored gradient. The teacher's entries never carry a gradient.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::{
    GradRequest, KernelError, LossOutput, LossSpec, ProjectionTensors, TeacherEntries, TeacherSpec,
    XTokenBackend,
};

/// `stored · upstream`, the upstream gradient of a scalar loss being `[1]`.
fn scaled<B: Backend, const D: usize>(
    stored: FloatTensor<B>,
    upstream: FloatTensor<B>,
) -> FloatTensor<B> {
    let stored = Tensor::<B, D>::from_primitive(TensorPrimitive::Float(stored));
    let upstream = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(upstream)).reshape([1; D]);
    (stored * upstream).into_primitive().tensor()
}

#[derive(Debug)]
struct LogitsBackward;

impl<B: Backend> Backward<B, 1> for LogitsBackward {
    type State = Option<FloatTensor<B>>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [logits] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        if let (Some(node), Some(stored)) = (logits, ops.state) {
            grads.register::<B>(node.id, scaled::<B, 3>(stored, upstream));
        }
    }
}

#[derive(Debug)]
struct LogitsWeightsBackward;

impl<B: Backend> Backward<B, 2> for LogitsWeightsBackward {
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [logits, weights] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let (grad_logits, grad_weights) = ops.state;
        if let (Some(node), Some(stored)) = (weights, grad_weights) {
            grads.register::<B>(node.id, scaled::<B, 2>(stored, upstream.clone()));
        }
        if let (Some(node), Some(stored)) = (logits, grad_logits) {
            grads.register::<B>(node.id, scaled::<B, 3>(stored, upstream));
        }
    }
}

fn inner_entries<B: Backend, C: CheckpointStrategy>(
    entries: TeacherEntries<Autodiff<B, C>>,
) -> TeacherEntries<B> {
    entries.map_tensors(|ids| ids, |logp| logp.primitive)
}

fn untracked<B: Backend, C: CheckpointStrategy>(
    output: LossOutput<B>,
) -> LossOutput<Autodiff<B, C>> {
    LossOutput {
        value: <Autodiff<B, C> as AutodiffBackend>::from_inner(output.value),
        grad_logits: output
            .grad_logits
            .map(<Autodiff<B, C> as AutodiffBackend>::from_inner),
        grad_weights: output
            .grad_weights
            .map(<Autodiff<B, C> as AutodiffBackend>::from_inner),
    }
}

impl<B: XTokenBackend, C: CheckpointStrategy> XTokenBackend for Autodiff<B, C> {
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &TeacherSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        let entries = B::xt_teacher_entries(logits.primitive, spec)?;
        Ok(entries.map_tensors(|ids| ids, <Self as AutodiffBackend>::from_inner))
    }

    fn xt_loss(
        logits: FloatTensor<Self>,
        projection: Option<ProjectionTensors<Self>>,
        teacher: Option<TeacherEntries<Self>>,
        spec: &LossSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let teacher = teacher.map(inner_entries::<B, C>);
        let Some(projection) = projection else {
            return match LogitsBackward
                .prepare::<C>([logits.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let request = GradRequest {
                        logits: true,
                        weights: false,
                    };
                    let out = B::xt_loss(logits.primitive, None, teacher, spec, request)?;
                    Ok(LossOutput {
                        value: prep.finish(out.grad_logits, out.value),
                        grad_logits: None,
                        grad_weights: None,
                    })
                }
                OpsKind::UnTracked(_) => Ok(untracked(B::xt_loss(
                    logits.primitive,
                    None,
                    teacher,
                    spec,
                    want,
                )?)),
            };
        };
        let weights = projection.weights;
        let request = GradRequest {
            logits: !logits.node.requirement.is_none(),
            weights: !weights.node.requirement.is_none(),
        };
        let inner = ProjectionTensors {
            indices: projection.indices,
            weights: weights.primitive.clone(),
        };
        match LogitsWeightsBackward
            .prepare::<C>([logits.node.clone(), weights.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::xt_loss(logits.primitive, Some(inner), teacher, spec, request)?;
                Ok(LossOutput {
                    value: prep.finish((out.grad_logits, out.grad_weights), out.value),
                    grad_logits: None,
                    grad_weights: None,
                })
            }
            OpsKind::UnTracked(_) => Ok(untracked(B::xt_loss(
                logits.primitive,
                Some(inner),
                teacher,
                spec,
                want,
            )?)),
        }
    }
}
