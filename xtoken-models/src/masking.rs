//! Which keys each query of a pass sees, and which attention computes it: X-Token's tiled
//! attention (`xtoken_kernels::attention`: the mask described, never a `[batch, heads, T, T]`
//! tensor, with its own backward) or burn's `attention` with a mask tensor. Under autodiff
//! burn's runs naively and keeps several `T × T` buffers per layer for its backward, so a
//! training pass takes the tiled one wherever the backend runs it in place; so does inference,
//! unless the backend's own forward is fused.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor, TensorData};
use xtoken_kernels::attention::AttentionSpec;
use xtoken_kernels::XTokenBackend;

/// The attention a model's passes run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The tiled attention wherever the backend runs it in place (the host version on the CPU
    /// backends, cubecl kernels on CUDA and wgpu), except for inference where burn's forward is
    /// fused (burn-flex's, and the GPU backends' flash kernel: they keep no `T × T` scores
    /// either).
    #[default]
    Auto,
    /// The tiled attention on every backend, inference included.
    Tiled,
    /// burn's `attention`, with a mask tensor where plain causal masking does not suffice.
    Burn,
}

impl AttentionKernel {
    /// Whether a pass on `B` runs the tiled attention.
    pub fn tiled_on<B: XTokenBackend>(self, device: &B::Device) -> bool {
        match self {
            AttentionKernel::Auto => {
                B::xt_attention_native() && (B::ad_enabled(device) || !B::burn_attention_fused())
            }
            AttentionKernel::Tiled => true,
            AttentionKernel::Burn => false,
        }
    }
}

/// How one pass's queries see its keys.
#[derive(Clone, Debug)]
pub enum Masking<B: Backend> {
    /// The tiled attention, with the mask it describes.
    Tiled(AttentionSpec),
    /// burn's attention: `mask` `[batch, 1, queries, keys]` is `true` where a query may not see
    /// a key; without it, `causal` says whether query `i` sees keys `0..=i` only (else every key).
    Burn {
        mask: Option<Tensor<B, 4, Bool>>,
        causal: bool,
    },
}

impl<B: Backend> Masking<B> {
    /// A causal pass over `len` positions of `batch` rows: padded keys (`padded[row · len +
    /// position]`) and keys at or beyond `window` positions back are hidden, for the attention
    /// `tiled` asks for.
    pub fn causal(
        tiled: bool,
        (batch, len): (usize, usize),
        head_dim: usize,
        padded: Option<&[bool]>,
        window: Option<usize>,
        device: &B::Device,
    ) -> Self {
        let window = window.filter(|&w| w < len);
        if tiled {
            return Masking::Tiled(AttentionSpec {
                window,
                key_padding: padded.map(Arc::from),
                ..AttentionSpec::causal(head_dim)
            });
        }
        if padded.is_none() && window.is_none() {
            // Plain causal masking lets the backend pick its causal (flash) kernel.
            return Masking::Burn {
                mask: None,
                causal: true,
            };
        }
        let hidden = |row: usize, key: usize| padded.is_some_and(|p| p[row * len + key]);
        Self::burn_mask(batch, (len, len), window, hidden, device)
    }

    /// burn's mask for `queries` positions that are the last of `keys`: `[rows, 1, queries,
    /// keys]`, `true` where a query may not see a key — the future, the keys `hidden(row, key)`
    /// names, and keys at or beyond `window` positions back.
    pub(crate) fn burn_mask(
        rows: usize,
        (queries, keys): (usize, usize),
        window: Option<usize>,
        hidden: impl Fn(usize, usize) -> bool,
        device: &B::Device,
    ) -> Self {
        let mut masked = Vec::with_capacity(rows * queries * keys);
        for row in 0..rows {
            for i in 0..queries {
                let query = keys - queries + i;
                for key in 0..keys {
                    let outside_window = window.is_some_and(|w| key + w <= query);
                    masked.push(key > query || hidden(row, key) || outside_window);
                }
            }
        }
        Masking::Burn {
            mask: Some(Tensor::from_data(
                TensorData::new(masked, [rows, 1, queries, keys]),
                device,
            )),
            causal: false,
        }
    }
}
