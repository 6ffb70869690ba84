//! The element-wise chains of a decoder layer as single operations with their own backward:
//! RMSNorm, the rotary position embedding and SwiGLU's gate.
//!
//! Composed of burn's ops, each is a chain of passes over its tensors (RMSNorm: square, mean,
//! add, root, divide, scale; under autodiff each with its own backward and saved tensors), and
//! on a host backend every pass is a separate loop that allocates its output. Where the backend
//! says so ([`crate::XTokenBackend::xt_blocks_native`]: burn-flex and ndarray, in f32), each is
//! one pass over its rows on every core, forward and backward ([`host`]). Elsewhere (a GPU
//! backend, whose fusion already fuses such chains, or other dtypes) the default methods are
//! the composition of burn's ops the models ran before, so those backends train exactly as
//! they did.
//!
//! Shapes: RMSNorm normalizes the last dimension of any tensor; the rotation takes
//! `[batch, len, heads, head_dim]` (the projection's layout, before the heads are moved ahead of
//! the positions) with tables `[1 or batch, len, half]`, rotating channel `i < half` with
//! `i + half` (HF's `rotate_half`) and passing channels from `2 · half` on through; SwiGLU
//! takes two tensors of one shape, `silu(gate) · up`.

pub mod host;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{activation, DType, Tensor, TensorPrimitive};

use crate::XTokenBackend;

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// `x / sqrt(mean(x²) + ε) · γ` over the last dimension of `x`, the mean in f32 (burn's and HF's
/// RMSNorm); through the backend's fused operation where it has one.
pub fn rms_norm<B: XTokenBackend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> Tensor<B, D> {
    tensor(B::xt_rms_norm(primitive(x), primitive(gamma), epsilon))
}

/// The rotary embedding of `x` `[batch, len, heads, head_dim]` by `cos`/`sin`
/// `[1 or batch, len, half]`; through the backend's fused operation where it has one.
pub fn rotary<B: XTokenBackend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
) -> Tensor<B, 4> {
    tensor(B::xt_rotary(primitive(x), primitive(cos), primitive(sin)))
}

/// `silu(gate) · up`; through the backend's fused operation where it has one.
pub fn swiglu<B: XTokenBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    tensor(B::xt_swiglu(primitive(gate), primitive(up)))
}

/// burn's `RmsNorm::forward`, op for op.
pub fn rms_norm_composed<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    epsilon: f64,
) -> FloatTensor<B> {
    let rank = burn::tensor::TensorMetadata::shape(&x).num_dims();
    let x = tensor::<B, 1>(x);
    let dims = x.shape();
    let d = dims[rank - 1];
    let rows = dims.num_elements() / d.max(1);
    // Any rank as rows × d: the mean is over the last dimension either way.
    let x = x.reshape([rows, d]);
    let dtype = x.dtype();
    let rms = (x.clone().cast(DType::F32).square().mean_dim(1) + epsilon).sqrt();
    let y = (x / rms.cast(dtype)) * tensor::<B, 1>(gamma).unsqueeze::<2>();
    B::float_reshape(primitive(y), dims)
}

/// The gradients of [`rms_norm_composed`] with respect to `x` and `γ` given the output's,
/// composed of burn's ops: with `r = sqrt(mean(x²) + ε)` per row and `g = ∂y · γ`,
/// `∂x = g / r − x · Σ(g·x) / (d · r³)` and `∂γ = Σ_rows ∂y · x / r`.
pub fn rms_norm_backward_composed<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    epsilon: f64,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let x = tensor::<B, 1>(x);
    let dims = x.shape();
    let d = dims[dims.num_dims() - 1];
    let rows = dims.num_elements() / d.max(1);
    let dtype = x.dtype();
    let as_f32 = |t: Tensor<B, 1>| t.reshape([rows, d]).cast(DType::F32);
    let (x, dy) = (as_f32(x), as_f32(tensor::<B, 1>(grad)));
    let gamma = tensor::<B, 1>(gamma);
    let gamma_dtype = gamma.dtype();
    let rms = (x.clone().square().mean_dim(1) + epsilon).sqrt();
    let g = dy.clone() * gamma.cast(DType::F32).unsqueeze::<2>();
    let dot = (g.clone() * x.clone()).sum_dim(1);
    let dx = g / rms.clone() - x.clone() * dot / (rms.clone().powi_scalar(3) * d as f64);
    let dgamma = (dy * x / rms).sum_dim(0).reshape([d]);
    (
        B::float_reshape(primitive(dx.cast(dtype)), dims),
        primitive(dgamma.cast(gamma_dtype)),
    )
}

/// The rotation of HF's `apply_rotary_pos_emb` on `[batch, len, heads, head_dim]`, composed.
pub fn rotary_composed<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    rotate_composed::<B>(x, cos, sin, false)
}

/// The gradient of [`rotary_composed`] with respect to `x`: the rotation by the opposite
/// angle, `(g₁, g₂) ↦ (g₁·cos + g₂·sin, g₂·cos − g₁·sin)`.
pub fn rotary_backward_composed<B: Backend>(
    grad: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    rotate_composed::<B>(grad, cos, sin, true)
}

fn rotate_composed<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
    inverse: bool,
) -> FloatTensor<B> {
    let x = tensor::<B, 4>(x);
    let [_, _, _, head_dim] = x.dims();
    // [rows, len, half] → [rows, len, 1, half]: one angle per position for every head.
    let (cos, sin) = (
        tensor::<B, 3>(cos).unsqueeze_dim::<4>(2),
        tensor::<B, 3>(sin).unsqueeze_dim::<4>(2),
    );
    let half = cos.dims()[3];
    let first = x.clone().narrow(3, 0, half);
    let second = x.clone().narrow(3, half, half);
    let (a, b) = if inverse {
        (
            first.clone() * cos.clone() + second.clone() * sin.clone(),
            second * cos - first * sin,
        )
    } else {
        (
            first.clone() * cos.clone() - second.clone() * sin.clone(),
            second * cos + first * sin,
        )
    };
    let mut parts = vec![a, b];
    if 2 * half < head_dim {
        parts.push(x.narrow(3, 2 * half, head_dim - 2 * half));
    }
    primitive(Tensor::cat(parts, 3))
}

/// `silu(gate) · up`, composed.
pub fn swiglu_composed<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
    primitive(activation::silu(tensor::<B, 1>(gate)) * tensor::<B, 1>(up))
}

/// The gradients of [`swiglu_composed`] given the output's: with `s = σ(gate)`,
/// `∂gate = ∂h · up · s · (1 + gate · (1 − s))` and `∂up = ∂h · gate · s`.
pub fn swiglu_backward_composed<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (gate, up, grad) = (
        tensor::<B, 1>(gate),
        tensor::<B, 1>(up),
        tensor::<B, 1>(grad),
    );
    let s = activation::sigmoid(gate.clone());
    let silu = gate.clone() * s.clone();
    let dgate = grad.clone() * up * s.clone() * (s.neg().add_scalar(1.0) * gate).add_scalar(1.0);
    (primitive(dgate), primitive(grad * silu))
}

/// A backend whose f32 tensors live in host memory: the blocks run there on their values.
pub(crate) trait HostF32: Backend {
    /// The tensor's values in row-major order when it is f32 (borrowed where contiguous).
    fn values(t: &FloatTensor<Self>) -> Option<std::borrow::Cow<'_, [f32]>>;
    /// An f32 tensor of `shape` holding `values`.
    fn from_values(values: Vec<f32>, shape: burn::tensor::Shape) -> FloatTensor<Self>;
    /// The tensor with `update` applied to its values (row-major) in place, the buffer copied
    /// first only where it is shared or strided; the tensor back, untouched, when it is not
    /// f32.
    fn update_values(
        t: FloatTensor<Self>,
        update: impl FnOnce(&mut [f32]),
    ) -> Result<FloatTensor<Self>, FloatTensor<Self>>;
}

/// The blocks on a [`HostF32`] backend: the host passes where every input is f32, the
/// composition otherwise.
pub(crate) mod on_host {
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::TensorMetadata;

    use super::{host, HostF32};

    pub fn rms_norm<B: HostF32>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        epsilon: f64,
    ) -> FloatTensor<B> {
        let found = match (B::values(&x), B::values(&gamma)) {
            (Some(xs), Some(gs)) => Some(host::rms_norm(&xs, &gs, epsilon)),
            _ => None,
        };
        match found {
            Some(y) => B::from_values(y, x.shape()),
            None => super::rms_norm_composed::<B>(x, gamma, epsilon),
        }
    }

    pub fn rms_norm_backward<B: HostF32>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        epsilon: f64,
        grad: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let found = match (B::values(&x), B::values(&gamma), B::values(&grad)) {
            (Some(xs), Some(gs), Some(dy)) => Some(host::rms_norm_backward(&xs, &gs, epsilon, &dy)),
            _ => None,
        };
        match found {
            Some((dx, dgamma)) => (
                B::from_values(dx, x.shape()),
                B::from_values(dgamma, gamma.shape()),
            ),
            None => super::rms_norm_backward_composed::<B>(x, gamma, epsilon, grad),
        }
    }

    fn rotary_shape<B: HostF32>(x: &FloatTensor<B>, cos: &FloatTensor<B>) -> host::RotaryShape {
        let (x, c) = (x.shape(), cos.shape());
        host::RotaryShape {
            batch: x[0],
            len: x[1],
            heads: x[2],
            head_dim: x[3],
            half: c[2],
            table_rows: c[0],
        }
    }

    pub fn rotary<B: HostF32>(
        x: FloatTensor<B>,
        cos: FloatTensor<B>,
        sin: FloatTensor<B>,
        inverse: bool,
    ) -> FloatTensor<B> {
        let shape = rotary_shape::<B>(&x, &cos);
        let found = match (B::values(&x), B::values(&cos), B::values(&sin)) {
            (Some(xs), Some(c), Some(s)) => Some(host::rotary(&xs, &c, &s, shape, inverse)),
            _ => None,
        };
        match (found, inverse) {
            (Some(y), _) => B::from_values(y, x.shape()),
            (None, false) => super::rotary_composed::<B>(x, cos, sin),
            (None, true) => super::rotary_backward_composed::<B>(x, cos, sin),
        }
    }

    pub fn swiglu<B: HostF32>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
        let found = match (B::values(&gate), B::values(&up)) {
            (Some(g), Some(u)) => Some(host::swiglu(&g, &u)),
            _ => None,
        };
        match found {
            Some(h) => B::from_values(h, gate.shape()),
            None => super::swiglu_composed::<B>(gate, up),
        }
    }

    pub fn swiglu_backward<B: HostF32>(
        gate: FloatTensor<B>,
        up: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let found = match (B::values(&gate), B::values(&up), B::values(&grad)) {
            (Some(g), Some(u), Some(d)) => Some(host::swiglu_backward(&g, &u, &d)),
            _ => None,
        };
        match found {
            Some((dgate, dup)) => (
                B::from_values(dgate, gate.shape()),
                B::from_values(dup, up.shape()),
            ),
            None => super::swiglu_backward_composed::<B>(gate, up, grad),
        }
    }
}
