//! [`XTokenBackend`] for burn's `Fusion<B>`, which is what `Wgpu` and `Cuda` are when burn's
//! `fusion` feature is on (its default). The operations are not fused: their inputs are resolved
//! to the inner backend's tensors (this drains the fusion stream, on the device), `B` runs its
//! kernels, and the results are registered back as fusion tensors. Errors surface at the call,
//! as on `B`. The attention is delegated the same way, forward and backward.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::TensorMetadata;
use burn_fusion::client::GlobalFusionClient;
use burn_fusion::stream::OperationStreams;
use burn_fusion::{Fusion, FusionBackend, NoOp};
use burn_ir::{InitOperationIr, OperationIr, OperationOutput};

use crate::adamw::{AdamWStep, AdamWUpdate, Moments};
use crate::attention::{Attended, AttentionGrads, AttentionSaved, AttentionSpec};
use crate::{
    DistillSpec, EntriesSpec, GradRequest, KernelError, LossOutput, ProjectionTensors,
    TeacherEntries, XTokenBackend,
};

type Client<B> = GlobalFusionClient<<B as FusionBackend>::FusionRuntime>;

fn inner_float<B: FusionBackend>(t: FloatTensor<Fusion<B>>) -> FloatTensor<B> {
    t.client.clone().resolve_tensor_float::<B>(t)
}

fn inner_int<B: FusionBackend>(t: IntTensor<Fusion<B>>) -> IntTensor<B> {
    t.client.clone().resolve_tensor_int::<B>(t)
}

/// Registers an inner tensor with the fusion client, as `float_from_data` does.
fn outer<B: FusionBackend>(
    client: &Client<B>,
    shape: burn::tensor::Shape,
    dtype: burn::tensor::DType,
    handle: B::Handle,
) -> burn_fusion::FusionTensor<B::FusionRuntime> {
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(
            OperationStreams::default(),
            OperationIr::Init(desc),
            NoOp::<B>::new(),
        )
        .output()
}

pub(crate) fn outer_float<B: FusionBackend>(
    client: &Client<B>,
    t: FloatTensor<B>,
) -> FloatTensor<Fusion<B>> {
    let (shape, dtype) = (t.shape(), t.dtype());
    outer::<B>(client, shape, dtype, B::float_tensor_handle(t))
}

fn outer_int<B: FusionBackend>(client: &Client<B>, t: IntTensor<B>) -> IntTensor<Fusion<B>> {
    let (shape, dtype) = (t.shape(), t.dtype());
    outer::<B>(client, shape, dtype, B::int_tensor_handle(t))
}

fn inner_entries<B: FusionBackend>(e: TeacherEntries<Fusion<B>>) -> TeacherEntries<B> {
    e.map_tensors(inner_int::<B>, inner_float::<B>)
}

/// Registers a result of the inner backend with the fusion client.
fn outer_output<B: FusionBackend>(client: &Client<B>, out: LossOutput<B>) -> LossOutput<Fusion<B>> {
    LossOutput {
        value: outer_float::<B>(client, out.value),
        grad_logits: out.grad_logits.map(|g| outer_float::<B>(client, g)),
        grad_weights: out.grad_weights.map(|g| outer_float::<B>(client, g)),
    }
}

impl<B: FusionBackend + XTokenBackend> XTokenBackend for Fusion<B> {
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        let client = logits.client.clone();
        let found = B::xt_teacher_entries(inner_float::<B>(logits), spec)?;
        Ok(found.map_tensors(
            |ids| outer_int::<B>(&client, ids),
            |logp| outer_float::<B>(&client, logp),
        ))
    }

    fn xt_position_targets(
        logits: FloatTensor<Self>,
        next: &[i32],
        top_k: usize,
        tau: f32,
        confidence: bool,
    ) -> Result<crate::host::PositionTargets, KernelError> {
        B::xt_position_targets(inner_float::<B>(logits), next, top_k, tau, confidence)
    }

    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let client = logits.client.clone();
        let projection = projection.map(|w| ProjectionTensors {
            indices: inner_int::<B>(w.indices),
            weights: inner_float::<B>(w.weights),
            layout: w.layout,
        });
        let teacher = inner_entries::<B>(teacher);
        let out = B::xt_distill(inner_float::<B>(logits), teacher, projection, spec, want)?;
        Ok(outer_output::<B>(&client, out))
    }

    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        let client = logits.client.clone();
        let out = B::xt_cross_entropy(inner_float::<B>(logits), targets, row_chunk, want_grad)?;
        Ok(outer_output::<B>(&client, out))
    }

    fn xt_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> Result<Attended<Self>, KernelError> {
        let client = q.client.clone();
        let found = B::xt_attention(
            inner_float::<B>(q),
            inner_float::<B>(k),
            inner_float::<B>(v),
            spec,
        )?;
        Ok(Attended {
            output: outer_float::<B>(&client, found.output),
            lse: outer_float::<B>(&client, found.lse),
        })
    }

    fn xt_attention_native() -> bool {
        B::xt_attention_native()
    }

    fn burn_attention_fused() -> bool {
        B::burn_attention_fused()
    }

    fn xt_attention_backward(
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> Result<AttentionGrads<Self>, KernelError> {
        let client = grad_output.client.clone();
        let saved = AttentionSaved {
            q: inner_float::<B>(saved.q),
            k: inner_float::<B>(saved.k),
            v: inner_float::<B>(saved.v),
            output: inner_float::<B>(saved.output),
            lse: inner_float::<B>(saved.lse),
        };
        let found = B::xt_attention_backward(saved, inner_float::<B>(grad_output), spec)?;
        Ok(AttentionGrads {
            q: outer_float::<B>(&client, found.q),
            k: outer_float::<B>(&client, found.k),
            v: outer_float::<B>(&client, found.v),
        })
    }

    /// The inner backend's update (one kernel), not burn's fusion of the composed ops: its
    /// traffic is known, 28 bytes per f32 parameter.
    fn xt_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<Moments<Self>>,
        step: &AdamWStep,
    ) -> AdamWUpdate<Self> {
        let client = param.client.clone();
        let moments = moments.map(|m| Moments {
            first: inner_float::<B>(m.first),
            second: inner_float::<B>(m.second),
        });
        let out = B::xt_adamw(
            inner_float::<B>(param),
            inner_float::<B>(grad),
            moments,
            step,
        );
        AdamWUpdate {
            param: outer_float::<B>(&client, out.param),
            moments: Moments {
                first: outer_float::<B>(&client, out.moments.first),
                second: outer_float::<B>(&client, out.moments.second),
            },
        }
    }
}
