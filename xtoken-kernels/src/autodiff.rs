//! `Autodiff<B>` for any [`XTokenBackend`]: the fused loss computes its gradient in the forward
//! pass (it is a scalar, so the upstream gradient is one number); the backward step scales the
//! stored gradient. The teacher's entries never carry a gradient. The attention keeps its
//! inputs, output and log-sum-exps, and its backward step is the backend's
//! `xt_attention_backward`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::attention::{Attended, AttentionSaved, AttentionSpec};
use crate::{
    DistillSpec, EntriesSpec, GradRequest, KernelError, LossOutput, ProjectionTensors,
    TeacherEntries, XTokenBackend,
};

/// `stored · upstream`, the upstream gradient of a scalar loss being `[1]`: f32 as the loss's
/// value is, cast to the stored gradient's dtype (that of its input).
fn scaled<B: Backend, const D: usize>(
    stored: FloatTensor<B>,
    upstream: FloatTensor<B>,
) -> FloatTensor<B> {
    let stored = Tensor::<B, D>::from_primitive(TensorPrimitive::Float(stored));
    let upstream = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(upstream))
        .cast(stored.dtype())
        .reshape([1; D]);
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

#[derive(Debug)]
struct AttentionBackward;

impl<B: XTokenBackend> Backward<B, 3> for AttentionBackward {
    type State = (AttentionSaved<B>, AttentionSpec);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [q, k, v] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let (saved, spec) = ops.state;
        // The forward checked the shapes; what is left to fail is a read of the device.
        let found = B::xt_attention_backward(saved, upstream, &spec)
            .unwrap_or_else(|e| panic!("the attention's backward failed: {e}"));
        for (node, grad) in [(q, found.q), (k, found.k), (v, found.v)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// RMSNorm's backward: the backend's, from the saved input and weights.
#[derive(Debug)]
struct RmsNormBackward;

impl<B: XTokenBackend> Backward<B, 2> for RmsNormBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node, gamma_node] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let (x, gamma, epsilon) = ops.state;
        let (dx, dgamma) = B::xt_rms_norm_backward(x, gamma, epsilon, upstream);
        if let Some(node) = x_node {
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = gamma_node {
            grads.register::<B>(node.id, dgamma);
        }
    }
}

/// The rotation's backward: the rotation by the opposite angle (the tables are constants).
#[derive(Debug)]
struct RotaryBackward;

impl<B: XTokenBackend> Backward<B, 1> for RotaryBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let (cos, sin) = ops.state;
        if let Some(node) = x_node {
            grads.register::<B>(node.id, B::xt_rotary_backward(upstream, cos, sin));
        }
    }
}

/// SwiGLU's backward, from the saved gate and up projections.
#[derive(Debug)]
struct SwigluBackward;

impl<B: XTokenBackend> Backward<B, 2> for SwigluBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [gate_node, up_node] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        let (dgate, dup) = B::xt_swiglu_backward(gate, up, upstream);
        if let Some(node) = gate_node {
            grads.register::<B>(node.id, dgate);
        }
        if let Some(node) = up_node {
            grads.register::<B>(node.id, dup);
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

/// A loss whose only tracked input is the logits: evaluated with their gradient when the graph
/// wants it, which the backward step then scales.
fn logits_only<B: Backend, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    want_logits: bool,
    eval: impl FnOnce(FloatTensor<B>, bool) -> Result<LossOutput<B>, KernelError>,
) -> Result<LossOutput<Autodiff<B, C>>, KernelError> {
    match LogitsBackward
        .prepare::<C>([logits.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = eval(logits.primitive, true)?;
            Ok(LossOutput {
                value: prep.finish(out.grad_logits, out.value),
                grad_logits: None,
                grad_weights: None,
            })
        }
        OpsKind::UnTracked(_) => Ok(untracked(eval(logits.primitive, want_logits)?)),
    }
}

impl<B: XTokenBackend, C: CheckpointStrategy> XTokenBackend for Autodiff<B, C> {
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        let entries = B::xt_teacher_entries(logits.primitive, spec)?;
        Ok(entries.map_tensors(|ids| ids, <Self as AutodiffBackend>::from_inner))
    }

    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let teacher = inner_entries::<B, C>(teacher);
        let Some(projection) = projection else {
            // Without W there is no weights' gradient to ask for.
            return logits_only(logits, want.logits, |z, grad| {
                let request = GradRequest {
                    logits: grad,
                    weights: false,
                };
                B::xt_distill(z, teacher, None, spec, request)
            });
        };
        let weights = projection.weights;
        let request = GradRequest {
            logits: !logits.node.requirement.is_none(),
            weights: !weights.node.requirement.is_none(),
        };
        let inner = ProjectionTensors {
            indices: projection.indices,
            weights: weights.primitive.clone(),
            layout: projection.layout,
        };
        match LogitsWeightsBackward
            .prepare::<C>([logits.node.clone(), weights.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::xt_distill(logits.primitive, teacher, Some(inner), spec, request)?;
                Ok(LossOutput {
                    value: prep.finish((out.grad_logits, out.grad_weights), out.value),
                    grad_logits: None,
                    grad_weights: None,
                })
            }
            OpsKind::UnTracked(_) => Ok(untracked(B::xt_distill(
                logits.primitive,
                teacher,
                Some(inner),
                spec,
                want,
            )?)),
        }
    }

    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        logits_only(logits, want_grad, |z, grad| {
            B::xt_cross_entropy(z, targets, row_chunk, grad)
        })
    }

    fn xt_attention_native() -> bool {
        B::xt_attention_native()
    }

    fn burn_attention_fused() -> bool {
        B::burn_attention_fused()
    }

    fn xt_blocks_native() -> bool {
        B::xt_blocks_native()
    }

    /// The inner backend's fused RMSNorm with its backward where it has one; burn's ops,
    /// recorded by autodiff as before, where it has not.
    fn xt_rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        if !B::xt_blocks_native() {
            return crate::blocks::rms_norm_composed::<Self>(x, gamma, epsilon);
        }
        let parents = [x.node.clone(), gamma.node.clone()];
        match RmsNormBackward
            .prepare::<C>(parents)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::xt_rms_norm(x.primitive.clone(), gamma.primitive.clone(), epsilon);
                prep.finish((x.primitive, gamma.primitive, epsilon), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::xt_rms_norm(x.primitive, gamma.primitive, epsilon))
            }
        }
    }

    /// The inner backend's fused rotation where it has one (its backward the opposite
    /// rotation); burn's ops, recorded by autodiff, where it has not.
    fn xt_rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if !B::xt_blocks_native() {
            return crate::blocks::rotary_composed::<Self>(x, cos, sin);
        }
        let (cos, sin) = (cos.primitive, sin.primitive);
        match RotaryBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::xt_rotary(x.primitive, cos.clone(), sin.clone());
                prep.finish((cos, sin), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::xt_rotary(x.primitive, cos, sin)),
        }
    }

    /// The inner backend's fused SwiGLU with its backward where it has one; burn's ops,
    /// recorded by autodiff, where it has not.
    fn xt_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        if !B::xt_blocks_native() {
            return crate::blocks::swiglu_composed::<Self>(gate, up);
        }
        let parents = [gate.node.clone(), up.node.clone()];
        match SwigluBackward
            .prepare::<C>(parents)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::xt_swiglu(gate.primitive.clone(), up.primitive.clone());
                prep.finish((gate.primitive, up.primitive), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::xt_swiglu(gate.primitive, up.primitive)),
        }
    }

    /// The inner backend's attention; when the graph wants its gradients, the inputs, output
    /// and log-sum-exps are kept for [`XTokenBackend::xt_attention_backward`] (no scores).
    fn xt_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> Result<Attended<Self>, KernelError> {
        let lse = <Self as AutodiffBackend>::from_inner;
        let parents = [q.node.clone(), k.node.clone(), v.node.clone()];
        let (q, k, v) = (q.primitive, k.primitive, v.primitive);
        match AttentionBackward
            .prepare::<C>(parents)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let found = B::xt_attention(q.clone(), k.clone(), v.clone(), spec)?;
                let saved = AttentionSaved {
                    q,
                    k,
                    v,
                    output: found.output.clone(),
                    lse: found.lse.clone(),
                };
                Ok(Attended {
                    output: prep.finish((saved, spec.clone()), found.output),
                    lse: lse(found.lse),
                })
            }
            OpsKind::UnTracked(prep) => {
                let found = B::xt_attention(q, k, v, spec)?;
                Ok(Attended {
                    output: prep.finish(found.output),
                    lse: lse(found.lse),
                })
            }
        }
    }
}
