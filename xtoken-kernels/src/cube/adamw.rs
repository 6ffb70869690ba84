//! The AdamW update of one f32 parameter tensor in one launch: it reads the parameter, its
//! gradient and both moments once and writes the three results once (28 bytes per parameter),
//! with the arithmetic of [`crate::adamw::composed`] in the same order.

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::launch::{Cube, Launcher};
use crate::adamw::{composed, AdamWStep, AdamWUpdate, Moments};

/// One element per unit. With `fresh` = 1 (the first update) the moments start at zero and
/// `first`/`second` are not read. `fresh` is a runtime scalar, not a comptime one, so that the
/// first update and the later ones are one compiled kernel: a step after the first compiles
/// nothing.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn adamw_update(
    param: &Array<f32>,
    grad: &Array<f32>,
    first: &Array<f32>,
    second: &Array<f32>,
    new_param: &mut Array<f32>,
    new_first: &mut Array<f32>,
    new_second: &mut Array<f32>,
    grad_scale: f32,
    beta_1: f32,
    factor_1: f32,
    beta_2: f32,
    factor_2: f32,
    bias_1: f32,
    bias_2: f32,
    epsilon: f32,
    keep: f32,
    lr: f32,
    n: usize,
    fresh: u32,
) {
    let i = ABSOLUTE_POS;
    if i < n {
        let g = grad[i] * grad_scale;
        let mut m = g * factor_1;
        let mut v = g * g * factor_2;
        if fresh == 0 {
            m += first[i] * beta_1;
            v += second[i] * beta_2;
        }
        let delta = (m / bias_1) / ((v / bias_2).sqrt() + epsilon);
        new_param[i] = param[i] * keep - delta * lr;
        new_first[i] = m;
        new_second[i] = v;
    }
}

/// The update in one launch when every tensor is f32; other dtypes take the composed ops.
pub(super) fn update<B: Cube<R>, R: CubeRuntime>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    moments: Option<Moments<B>>,
    step: &AdamWStep,
) -> AdamWUpdate<B> {
    let all_f32 = [&param, &grad].into_iter().all(|t| t.dtype == DType::F32)
        && moments
            .as_ref()
            .is_none_or(|m| m.first.dtype == DType::F32 && m.second.dtype == DType::F32);
    if !all_f32 {
        return composed::<B>(param, grad, moments, step);
    }
    let shape = param.shape();
    let n = shape.num_elements();
    let (param, grad) = (into_contiguous(param), into_contiguous(grad));
    let launcher = Launcher::of(&param, n);
    let fresh = u32::from(moments.is_none());
    let (first, second) = match moments {
        Some(m) => (into_contiguous(m.first), into_contiguous(m.second)),
        None => (param.clone(), param.clone()),
    };
    let out = || launcher.empty(shape.clone(), DType::F32);
    let (new_param, new_first, new_second) = (out(), out(), out());
    let (count, dim) = launcher.elementwise(n);
    let c = step.constants();
    unsafe {
        adamw_update::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            param.into_array_arg(),
            grad.into_array_arg(),
            first.into_array_arg(),
            second.into_array_arg(),
            new_param.clone().into_array_arg(),
            new_first.clone().into_array_arg(),
            new_second.clone().into_array_arg(),
            c.grad_scale,
            c.beta_1,
            c.factor_1,
            c.beta_2,
            c.factor_2,
            c.bias_1,
            c.bias_2,
            c.epsilon,
            c.keep,
            c.lr,
            n,
            fresh,
        );
    }
    AdamWUpdate {
        param: new_param,
        moments: Moments {
            first: new_first,
            second: new_second,
        },
    }
}
