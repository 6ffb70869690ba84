//! [`crate::attention`] on the device: the forward (`attention_forward`: output and row
//! log-sum-exps), and the backward's three launches (`attention_delta`: `Σ dO · O` per query
//! row; `attention_grad_q`: `∂q` per block of query rows; `attention_grad_kv`: `∂k`, `∂v` per
//! block of keys over the query heads of its group). The mask is the spec's scalars and one
//! padding flag per key; no launch allocates anything of size `T_q × T_k`.
//!
//! Everything runs in the queries' float type (keys, values and the output's gradient are cast
//! to it when they differ; the key and value gradients are cast back to theirs) with f32
//! accumulation. A call whose sizes are empty has nothing for a kernel to do and takes the host
//! version.

mod kernels;

use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::launch::{float_dtype, Cube, Launcher};
use crate::attention::{self, Attended, AttentionGrads, AttentionSaved, AttentionSpec, Dims};
use crate::error::KernelError;
use kernels::{LANES, ROWS};

/// The shared memory the largest of the kernels (`attention_grad_kv`) takes at `head_dim`.
pub fn shared_bytes(head_dim: usize) -> usize {
    4 * (2 * ROWS * head_dim + LANES * (head_dim + 1) + 2 * ROWS * LANES)
}

/// One call's sizes, mask scalars and launcher.
struct Call<R: CubeRuntime> {
    d: Dims,
    launcher: Launcher<R>,
    padding: CubeTensor<R>,
    spec: AttentionSpec,
}

impl<R: CubeRuntime> Call<R> {
    /// Checks the sizes, and that the device has the kernels' shared memory; `None` when a
    /// size is zero.
    fn new(
        q: &CubeTensor<R>,
        k: &CubeTensor<R>,
        v: &CubeTensor<R>,
        spec: &AttentionSpec,
    ) -> Result<Option<Self>, KernelError> {
        let d = Dims::of(&q.shape(), &k.shape(), &v.shape(), spec)?;
        if [d.batch, d.heads, d.queries, d.keys, d.head_dim].contains(&0) {
            return Ok(None);
        }
        let launcher = Launcher::of(q, q.meta.num_elements().max(k.meta.num_elements()));
        let available = launcher.client.properties().hardware.max_shared_memory_size;
        if shared_bytes(d.head_dim) > available {
            return Err(KernelError::Invalid {
                what: "attention head_dim",
                why: format!(
                    "{} needs {} bytes of shared memory per cube; the device has {available}",
                    d.head_dim,
                    shared_bytes(d.head_dim)
                ),
            });
        }
        let flags: Vec<i32> = match &spec.key_padding {
            Some(padded) => padded.iter().map(|&p| i32::from(p)).collect(),
            None => Vec::new(),
        };
        let padding = launcher.ints(&flags);
        Ok(Some(Self {
            d,
            launcher,
            padding,
            spec: spec.clone(),
        }))
    }

    /// The cubes of the query-block launches.
    fn query_cubes(&self) -> usize {
        self.d.batch * self.d.heads * self.d.queries.div_ceil(ROWS)
    }

    /// The cubes of the key-block launch.
    fn key_cubes(&self) -> usize {
        self.d.batch * self.d.kv_heads * self.d.keys.div_ceil(ROWS)
    }

    fn causal(&self) -> u32 {
        u32::from(self.spec.causal)
    }

    fn window(&self) -> usize {
        self.spec.window.unwrap_or(0)
    }

    /// The soft-cap, 0 for none.
    fn softcap(&self) -> f32 {
        self.spec.softcap.unwrap_or(0.0)
    }

    fn padded(&self) -> u32 {
        u32::from(self.spec.key_padding.is_some())
    }
}

/// `t` contiguous in `dtype`.
fn prepared<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    let t = if t.dtype == dtype {
        t
    } else {
        B::float_cast(t, FloatDType::from(dtype))
    };
    into_contiguous(t)
}

/// `t` in `dtype` (a no-op when it already is).
fn cast_to<B: Cube<R>, R: CubeRuntime>(t: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    if t.dtype == dtype {
        t
    } else {
        B::float_cast(t, FloatDType::from(dtype))
    }
}

/// The forward.
pub(in crate::cube) fn forward<B: Cube<R>, R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    spec: &AttentionSpec,
) -> Result<Attended<B>, KernelError> {
    let Some(call) = Call::new(&q, &k, &v, spec)? else {
        return attention::forward::<B>(q, k, v, spec);
    };
    let dtype = q.dtype;
    let (q, k, v) = (
        prepared::<B, R>(q, dtype),
        prepared::<B, R>(k, dtype),
        prepared::<B, R>(v, dtype),
    );
    let d = call.d;
    let launcher = &call.launcher;
    let output = launcher.empty(q.shape(), dtype);
    let lse = launcher.empty(Shape::new([d.batch, d.heads, d.queries]), DType::F32);
    let (count, dim) = launcher.per_item(call.query_cubes());
    unsafe {
        kernels::attention_forward::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            q.clone().into_array_arg(),
            k.into_array_arg(),
            v.into_array_arg(),
            call.padding.clone().into_array_arg(),
            output.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            d.queries,
            d.keys,
            call.causal(),
            call.window(),
            call.padded(),
            d.heads,
            d.group(),
            spec.scale,
            call.softcap(),
            call.query_cubes(),
            d.queries.div_ceil(ROWS),
            d.head_dim,
            float_dtype(&q),
        );
    }
    Ok(Attended { output, lse })
}

/// The backward: `delta`, then `∂q`, then `∂k` and `∂v`.
pub(in crate::cube) fn backward<B: Cube<R>, R: CubeRuntime>(
    saved: AttentionSaved<B>,
    grad_output: CubeTensor<R>,
    spec: &AttentionSpec,
) -> Result<AttentionGrads<B>, KernelError> {
    let Some(call) = Call::new(&saved.q, &saved.k, &saved.v, spec)? else {
        return attention::backward::<B>(saved, grad_output, spec);
    };
    let dtype = saved.q.dtype;
    let (k_dtype, v_dtype) = (saved.k.dtype, saved.v.dtype);
    let q = prepared::<B, R>(saved.q, dtype);
    let k = prepared::<B, R>(saved.k, dtype);
    let v = prepared::<B, R>(saved.v, dtype);
    let output = prepared::<B, R>(saved.output, dtype);
    let grad = prepared::<B, R>(grad_output, dtype);
    let lse = prepared::<B, R>(saved.lse, DType::F32);
    let d = call.d;
    let launcher = &call.launcher;
    let rows = d.batch * d.heads * d.queries;
    let delta = launcher.empty(Shape::new([rows]), DType::F32);
    let (count, dim) = launcher.elementwise(rows);
    unsafe {
        kernels::attention_delta::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            grad.clone().into_array_arg(),
            output.into_array_arg(),
            delta.clone().into_array_arg(),
            rows,
            d.head_dim,
            float_dtype(&q),
        );
    }
    let grad_q = launcher.empty(q.shape(), dtype);
    let (count, dim) = launcher.per_item(call.query_cubes());
    unsafe {
        kernels::attention_grad_q::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            q.clone().into_array_arg(),
            k.clone().into_array_arg(),
            v.clone().into_array_arg(),
            grad.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            delta.clone().into_array_arg(),
            call.padding.clone().into_array_arg(),
            grad_q.clone().into_array_arg(),
            d.queries,
            d.keys,
            call.causal(),
            call.window(),
            call.padded(),
            d.heads,
            d.group(),
            spec.scale,
            call.softcap(),
            call.query_cubes(),
            d.queries.div_ceil(ROWS),
            d.head_dim,
            float_dtype(&q),
        );
    }
    let grad_k = launcher.empty(k.shape(), dtype);
    let grad_v = launcher.empty(v.shape(), dtype);
    let (count, dim) = launcher.per_item(call.key_cubes());
    unsafe {
        kernels::attention_grad_kv::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            q.clone().into_array_arg(),
            k.into_array_arg(),
            v.into_array_arg(),
            grad.into_array_arg(),
            lse.into_array_arg(),
            delta.into_array_arg(),
            call.padding.clone().into_array_arg(),
            grad_k.clone().into_array_arg(),
            grad_v.clone().into_array_arg(),
            d.queries,
            d.keys,
            call.causal(),
            call.window(),
            call.padded(),
            d.heads,
            d.group(),
            spec.scale,
            call.softcap(),
            call.key_cubes(),
            d.keys.div_ceil(ROWS),
            d.head_dim,
            float_dtype(&q),
        );
    }
    Ok(AttentionGrads {
        q: grad_q,
        k: cast_to::<B, R>(grad_k, k_dtype),
        v: cast_to::<B, R>(grad_v, v_dtype),
    })
}
