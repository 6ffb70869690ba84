//! One parameter tensor's AdamW update with its gradient's clipping scale, as one operation.
//!
//! Composed of tensor ops, an AdamW step with global-norm clipping is about twenty element-wise
//! passes per parameter tensor (scale the gradient, two moments, their bias corrections, the
//! square root, the decay, the update), each reading and writing the whole tensor: ~156 bytes per
//! f32 parameter. Fused, it reads the parameter, its gradient and both moments once and writes
//! the three results once: 28 bytes. [`XTokenBackend::xt_adamw`] is that operation; its default
//! ([`composed`]) is the composition, in the order burn's `AdamW` computes it, so that a backend
//! without a kernel (and burn's fusion, which fuses it) trains exactly as before.
//!
//! [`XTokenBackend::xt_adamw`]: crate::XTokenBackend::xt_adamw

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

/// The constants of one AdamW update (decoupled weight decay, bias-corrected moments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// The learning rate.
    pub lr: f64,
    /// The first moment's decay β₁.
    pub beta_1: f32,
    /// The second moment's decay β₂.
    pub beta_2: f32,
    /// The denominator's ε.
    pub epsilon: f32,
    /// The decoupled weight decay λ (the parameter is scaled by `1 − lr·λ`).
    pub weight_decay: f32,
    /// This update's number, from 1: the bias corrections are `1 − βᵗ`.
    pub time: usize,
    /// The gradient's scale before the update: the global-norm clipping's factor, 1 without.
    pub grad_scale: f64,
}

impl AdamWStep {
    /// `1 − β₁ᵗ` and `1 − β₂ᵗ`, in f32 as burn's `AdamW` computes them.
    pub fn bias_corrections(&self) -> (f32, f32) {
        let t = i32::try_from(self.time).unwrap_or(i32::MAX);
        (1f32 - self.beta_1.powi(t), 1f32 - self.beta_2.powi(t))
    }

    /// The factor the parameter is scaled by before the update, `1 − lr·λ`.
    pub fn keep(&self) -> f64 {
        1.0 - self.lr * f64::from(self.weight_decay)
    }

    /// The constants of a fused update in f32, as the composed ops apply them.
    pub fn constants(&self) -> FusedConstants {
        let (bias_1, bias_2) = self.bias_corrections();
        FusedConstants {
            grad_scale: self.grad_scale as f32,
            beta_1: self.beta_1,
            factor_1: 1.0 - self.beta_1,
            beta_2: self.beta_2,
            factor_2: 1.0 - self.beta_2,
            bias_1,
            bias_2,
            epsilon: self.epsilon,
            keep: self.keep() as f32,
            lr: self.lr as f32,
        }
    }
}

/// [`AdamWStep`] as a fused update applies it: every constant in f32, computed as the composed
/// ops compute them (`1 − β` in f32, the f64 scalars rounded once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedConstants {
    /// The gradient's scale.
    pub grad_scale: f32,
    /// β₁.
    pub beta_1: f32,
    /// `1 − β₁`.
    pub factor_1: f32,
    /// β₂.
    pub beta_2: f32,
    /// `1 − β₂`.
    pub factor_2: f32,
    /// `1 − β₁ᵗ`.
    pub bias_1: f32,
    /// `1 − β₂ᵗ`.
    pub bias_2: f32,
    /// ε.
    pub epsilon: f32,
    /// `1 − lr·λ`.
    pub keep: f32,
    /// The learning rate.
    pub lr: f32,
}

impl FusedConstants {
    /// One element's update: the new parameter and moments from the old ones (`None` at the
    /// first update: moments of zero, not read), each f32 operation that of [`composed`].
    #[inline]
    pub fn apply(&self, param: f32, grad: f32, moments: Option<(f32, f32)>) -> [f32; 3] {
        let g = grad * self.grad_scale;
        let mut m = g * self.factor_1;
        let mut v = g * g * self.factor_2;
        if let Some((first, second)) = moments {
            m += first * self.beta_1;
            v += second * self.beta_2;
        }
        let delta = (m / self.bias_1) / ((v / self.bias_2).sqrt() + self.epsilon);
        [param * self.keep - delta * self.lr, m, v]
    }
}

/// The update of f32 values on the host in one pass, in place, on every core: each element
/// read once and written once (28 bytes per parameter, against the composition's ~156), with
/// the composition's f32 arithmetic, so bitwise its result on a host backend. `fresh` (the
/// first update) takes the moments as zero without reading them.
pub fn update_in_place(
    param: &mut [f32],
    grad: &[f32],
    first: &mut [f32],
    second: &mut [f32],
    fresh: bool,
    step: &AdamWStep,
) {
    use rayon::prelude::*;
    /// Elements per task: large enough that a task's overhead is noise, small enough that
    /// every core gets several.
    const CHUNK: usize = 1 << 16;
    let c = step.constants();
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(first.par_chunks_mut(CHUNK))
        .zip(second.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| update_chunk(p, g, m, v, fresh, &c));
}

wide! {
    /// One chunk of [`update_in_place`]. One loop per case, over zipped slices: without a
    /// branch or a bounds check per element the compiler vectorizes the divisions and the
    /// square root, which bound the pass otherwise.
    fn update_chunk(
        p: &mut [f32],
        g: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        fresh: bool,
        c: &FusedConstants,
    ) {
        let elements = p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut()));
        match fresh {
            true => elements.for_each(|((p, &g), (m, v))| {
                [*p, *m, *v] = c.apply(*p, g, None);
            }),
            false => elements.for_each(|((p, &g), (m, v))| {
                [*p, *m, *v] = c.apply(*p, g, Some((*m, *v)));
            }),
        }
    }
}

/// AdamW's first and second moments of one parameter tensor (its shape, f32).
#[derive(Debug, Clone)]
pub struct Moments<B: Backend> {
    /// The first moment `m`.
    pub first: FloatTensor<B>,
    /// The second moment `v`.
    pub second: FloatTensor<B>,
}

/// The updated parameter and its moments.
#[derive(Debug, Clone)]
pub struct AdamWUpdate<B: Backend> {
    /// The parameter after the update.
    pub param: FloatTensor<B>,
    /// The moments after the update.
    pub moments: Moments<B>,
}

/// The update as a composition of burn tensor ops, in burn's `AdamW` order (bitwise its
/// results on a backend that runs each op as written). `moments` is `None` at the first update.
pub fn composed<B: Backend>(
    param: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<Moments<B>>,
    step: &AdamWStep,
) -> AdamWUpdate<B> {
    let shape = param.shape();
    let flat = |t: FloatTensor<B>| {
        let n = t.shape().num_elements();
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t)).reshape([n])
    };
    let back = |t: Tensor<B, 1>| B::float_reshape(t.into_primitive().tensor(), shape.clone());
    let (param, mut grad) = (flat(param), flat(grad));
    if step.grad_scale != 1.0 {
        grad = grad.mul_scalar(step.grad_scale);
    }
    let (factor_1, factor_2) = (1.0 - step.beta_1, 1.0 - step.beta_2);
    let (first, second) = match moments {
        Some(m) => (
            flat(m.first)
                .mul_scalar(step.beta_1)
                .add(grad.clone().mul_scalar(factor_1)),
            flat(m.second)
                .mul_scalar(step.beta_2)
                .add(grad.square().mul_scalar(factor_2)),
        ),
        None => (
            grad.clone().mul_scalar(factor_1),
            grad.square().mul_scalar(factor_2),
        ),
    };
    let (bias_1, bias_2) = step.bias_corrections();
    let delta = first.clone().div_scalar(bias_1).div(
        second
            .clone()
            .div_scalar(bias_2)
            .sqrt()
            .add_scalar(step.epsilon),
    );
    let decayed = match step.lr * f64::from(step.weight_decay) {
        0.0 => param,
        _ => param.mul_scalar(step.keep()),
    };
    AdamWUpdate {
        param: back(decayed - delta.mul_scalar(step.lr)),
        moments: Moments {
            first: back(first),
            second: back(second),
        },
    }
}
