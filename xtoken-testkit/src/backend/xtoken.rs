//! The X-Token kernels and the device's memory on `Counted<I>`: `I`'s own implementations, with
//! their values moved between the two backends (whose tensors are the same types).

use burn_backend::tensor::FloatTensor;
use xtoken_kernels::adamw::{AdamWStep, AdamWUpdate, Moments};
use xtoken_kernels::attention::{Attended, AttentionGrads, AttentionSaved, AttentionSpec};
use xtoken_kernels::blocks;
use xtoken_kernels::memory::DeviceMemory;
use xtoken_kernels::{
    DistillSpec, EntriesSpec, GradRequest, KernelError, LossOutput, ProjectionTensors,
    TeacherEntries, XTokenBackend,
};

use super::Counted;

impl<I: XTokenBackend> XTokenBackend for Counted<I> {
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        let entries = I::xt_teacher_entries(logits, spec)?;
        Ok(entries.map_tensors(|ids| ids, |logp| logp))
    }

    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let teacher = teacher.map_tensors(|ids| ids, |logp| logp);
        let projection = projection.map(|p| ProjectionTensors {
            indices: p.indices,
            weights: p.weights,
            layout: p.layout,
        });
        I::xt_distill(logits, teacher, projection, spec, want).map(loss)
    }

    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        I::xt_cross_entropy(logits, targets, row_chunk, want_grad).map(loss)
    }

    fn xt_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> Result<Attended<Self>, KernelError> {
        let attended = I::xt_attention(q, k, v, spec)?;
        Ok(Attended {
            output: attended.output,
            lse: attended.lse,
        })
    }

    fn xt_attention_native() -> bool {
        I::xt_attention_native()
    }

    fn burn_attention_fused() -> bool {
        I::burn_attention_fused()
    }

    fn xt_attention_backward(
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> Result<AttentionGrads<Self>, KernelError> {
        let saved = AttentionSaved {
            q: saved.q,
            k: saved.k,
            v: saved.v,
            output: saved.output,
            lse: saved.lse,
        };
        let grads = I::xt_attention_backward(saved, grad_output, spec)?;
        Ok(AttentionGrads {
            q: grads.q,
            k: grads.k,
            v: grads.v,
        })
    }

    fn xt_blocks_native() -> bool {
        I::xt_blocks_native()
    }

    // The blocks: `I`'s fused passes where it has them, else burn's ops on this backend, so
    // that they are counted as before.
    fn xt_rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        match I::xt_blocks_native() {
            true => I::xt_rms_norm(x, gamma, epsilon),
            false => blocks::rms_norm_composed::<Self>(x, gamma, epsilon),
        }
    }

    fn xt_rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        I::xt_rms_norm_backward(x, gamma, epsilon, grad)
    }

    fn xt_rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match I::xt_blocks_native() {
            true => I::xt_rotary(x, cos, sin),
            false => blocks::rotary_composed::<Self>(x, cos, sin),
        }
    }

    fn xt_rotary_backward(
        grad: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        I::xt_rotary_backward(grad, cos, sin)
    }

    fn xt_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match I::xt_blocks_native() {
            true => I::xt_swiglu(gate, up),
            false => blocks::swiglu_composed::<Self>(gate, up),
        }
    }

    fn xt_swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        I::xt_swiglu_backward(gate, up, grad)
    }

    fn xt_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<Moments<Self>>,
        step: &AdamWStep,
    ) -> AdamWUpdate<Self> {
        let moments = moments.map(|m| Moments {
            first: m.first,
            second: m.second,
        });
        let update = I::xt_adamw(param, grad, moments, step);
        AdamWUpdate {
            param: update.param,
            moments: Moments {
                first: update.moments.first,
                second: update.moments.second,
            },
        }
    }
}

fn loss<I: XTokenBackend>(out: LossOutput<I>) -> LossOutput<Counted<I>> {
    LossOutput {
        value: out.value,
        grad_logits: out.grad_logits,
        grad_weights: out.grad_weights,
    }
}

impl<I: DeviceMemory> DeviceMemory for Counted<I> {
    fn reserved_bytes(device: &Self::Device) -> Option<u64> {
        I::reserved_bytes(device)
    }

    fn free_bytes(device: &Self::Device) -> Option<u64> {
        I::free_bytes(device)
    }

    fn length_multiple() -> usize {
        I::length_multiple()
    }
}

/// The counted backends run on the host: NCCL answers that it cannot sum their tensors.
impl<I: xtoken_kernels::nccl::NcclBackend> xtoken_kernels::nccl::NcclBackend for Counted<I> {
    fn name_static() -> &'static str {
        I::name_static()
    }
}
