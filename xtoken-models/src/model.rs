//! The decoder-only transformer the families share, as small burn modules whose field
//! names mirror HF's tensor names (`model.layers.3.self_attn.q_proj.weight` ↔
//! `layers[3].self_attn.q_proj.weight`). Family differences are switches on [`Architecture`].
//!
//! Linear weights are stored contiguous in burn's `[in, out]` layout (transposed once while
//! loading and back while saving): a transposed view would be copied on every matmul by
//! burn-ndarray.
//!
//! Mixed precision works as PyTorch's autocast does: with a compute dtype below the parameters'
//! (f32 master weights, bf16 compute), every projection, the attention and the output head run
//! in the compute dtype — their inputs and weights cast on the way in — while the embedding,
//! RMSNorm, RoPE and the residual stream stay in the parameters' dtype. burn's casts are
//! differentiable, so the gradients reach the master weights in their own dtype.

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::module::{attention, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::attention::AttentionSpec;
use xtoken_kernels::host::transpose;
use xtoken_kernels::{blocks, XTokenBackend};

use crate::config::{Activation, Architecture};
use crate::error::{ModelError, Result};
use crate::masking::{AttentionKernel, Masking};
use crate::rope::RopeTables;
use crate::tokens::Tokens;

/// How a tensor starts when it is not read from a checkpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Init {
    Normal(f32),
    Ones,
    Zeros,
}

/// Where a model's tensors come from: a checkpoint or a seeded random initialisation. Values
/// are f32, row-major in HF's shape.
pub(crate) trait TensorSource {
    fn values(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>>;
}

/// Turns HF-named values into burn parameters of the requested dtype on one device.
pub(crate) struct Builder<'a, B: Backend, S: TensorSource> {
    pub source: &'a mut S,
    pub device: B::Device,
    pub dtype: DType,
    pub init_std: f32,
}

impl<B: Backend, S: TensorSource> Builder<'_, B, S> {
    fn tensor<const D: usize>(&self, values: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(values, shape), (&self.device, self.dtype))
    }

    fn vector(&mut self, name: &str, len: usize, init: Init) -> Result<Param<Tensor<B, 1>>> {
        let values = self.source.values(name, &[len], init)?;
        Ok(Param::from_tensor(self.tensor(values, [len])))
    }

    fn linear(&mut self, prefix: &str, d_in: usize, d_out: usize, bias: bool) -> Result<Linear<B>> {
        let init = Init::Normal(self.init_std);
        let hf = self
            .source
            .values(&format!("{prefix}.weight"), &[d_out, d_in], init)?;
        let weight = Param::from_tensor(self.tensor(transpose(&hf, d_out, d_in), [d_in, d_out]));
        let bias = if bias {
            Some(self.vector(&format!("{prefix}.bias"), d_out, Init::Zeros)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// An RMSNorm of `arch`'s kind: unit gains, or Gemma's zero offsets from 1.
    fn norm(&mut self, name: &str, len: usize, arch: &Architecture) -> Result<RmsNorm<B>> {
        let init = match arch.gemma {
            Some(_) => Init::Zeros,
            None => Init::Ones,
        };
        Ok(RmsNorm {
            gamma: self.vector(&format!("{name}.weight"), len, init)?,
            epsilon: arch.rms_norm_eps,
        })
    }
}

/// `norm` on `x` (its last dimension) through the backend's fused RMSNorm where it has one,
/// burn's `RmsNorm` ops where it has not. `offset`: Gemma's norm, whose weight `w` is stored as
/// an offset from 1 (the gain is `1 + w`).
pub(crate) fn rms<B: XTokenBackend, const D: usize>(
    norm: &RmsNorm<B>,
    x: Tensor<B, D>,
    offset: bool,
) -> Tensor<B, D> {
    let gamma = match offset {
        true => norm.gamma.val().add_scalar(1.0),
        false => norm.gamma.val(),
    };
    blocks::rms_norm(x, gamma, norm.epsilon)
}

/// `c · tanh(x / c)` where `cap` (`c`) is set.
pub(crate) fn soft_cap<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    cap: Option<f64>,
) -> Tensor<B, D> {
    match cap {
        Some(c) => x.div_scalar(c).tanh().mul_scalar(c),
        None => x,
    }
}

/// `x · W + b` in `dtype`: the input, the weight and the bias are cast first (a no-op for a
/// tensor already in it), so the matmul runs in the compute dtype whatever the parameters'.
fn project<B: Backend, const D: usize>(
    layer: &Linear<B>,
    x: Tensor<B, D>,
    dtype: DType,
) -> Tensor<B, D> {
    linear(
        x.cast(dtype),
        layer.weight.val().cast(dtype),
        layer.bias.as_ref().map(|b| b.val().cast(dtype)),
    )
}

#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Option<Linear<B>>,
    pub k_proj: Option<Linear<B>>,
    pub v_proj: Option<Linear<B>>,
    /// Phi-3: q, k and v in one projection, in that order.
    pub qkv_proj: Option<Linear<B>>,
    pub o_proj: Linear<B>,
    /// Qwen3, Gemma-3: RMSNorm over each head's channels, before RoPE.
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The scores' scale (`head_dim^(-1/2)`, Gemma's `query_pre_attn_scalar^(-1/2)`).
    #[module(skip)]
    pub scale: f32,
    /// Gemma-2's soft-cap of the scores.
    #[module(skip)]
    pub softcap: Option<f32>,
    /// Gemma's `1 + w` norms.
    #[module(skip)]
    pub norm_offset: bool,
}

impl<B: Backend> Attention<B> {
    fn build<S: TensorSource>(
        b: &mut Builder<B, S>,
        prefix: &str,
        arch: &Architecture,
    ) -> Result<Self> {
        let hidden = arch.hidden_size;
        let q_width = arch.num_attention_heads * arch.head_dim;
        let kv_width = arch.num_key_value_heads * arch.head_dim;
        let bias = arch.attention_bias || arch.qkv_bias;
        let (q_proj, k_proj, v_proj, qkv_proj) = if arch.fused_projections {
            let fused = b.linear(
                &format!("{prefix}.qkv_proj"),
                hidden,
                q_width + 2 * kv_width,
                bias,
            )?;
            (None, None, None, Some(fused))
        } else {
            (
                Some(b.linear(&format!("{prefix}.q_proj"), hidden, q_width, bias)?),
                Some(b.linear(&format!("{prefix}.k_proj"), hidden, kv_width, bias)?),
                Some(b.linear(&format!("{prefix}.v_proj"), hidden, kv_width, bias)?),
                None,
            )
        };
        let (q_norm, k_norm) = if arch.qk_norm {
            (
                Some(b.norm(&format!("{prefix}.q_norm"), arch.head_dim, arch)?),
                Some(b.norm(&format!("{prefix}.k_norm"), arch.head_dim, arch)?),
            )
        } else {
            (None, None)
        };
        Ok(Attention {
            q_proj,
            k_proj,
            v_proj,
            qkv_proj,
            o_proj: b.linear(
                &format!("{prefix}.o_proj"),
                q_width,
                hidden,
                arch.attention_bias,
            )?,
            q_norm,
            k_norm,
            num_heads: arch.num_attention_heads,
            num_kv_heads: arch.num_key_value_heads,
            head_dim: arch.head_dim,
            scale: arch.attention_scale() as f32,
            softcap: arch
                .gemma
                .as_ref()
                .and_then(|g| g.attn_logit_softcapping)
                .map(|c| c as f32),
            norm_offset: arch.gemma.is_some(),
        })
    }
}

impl<B: XTokenBackend> Attention<B> {
    fn project(
        &self,
        x: Tensor<B, 3>,
        compute: DType,
    ) -> (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>) {
        let q_width = self.num_heads * self.head_dim;
        let kv_width = self.num_kv_heads * self.head_dim;
        match (&self.qkv_proj, &self.q_proj, &self.k_proj, &self.v_proj) {
            (Some(fused), ..) => {
                let qkv = project(fused, x, compute);
                (
                    qkv.clone().narrow(2, 0, q_width),
                    qkv.clone().narrow(2, q_width, kv_width),
                    qkv.narrow(2, q_width + kv_width, kv_width),
                )
            }
            (None, Some(q), Some(k), Some(v)) => (
                project(q, x.clone(), compute),
                project(k, x.clone(), compute),
                project(v, x, compute),
            ),
            _ => unreachable!("Attention is built with either qkv_proj or q/k/v_proj"),
        }
    }

    /// `[batch, len, width]` → `[batch, len, heads, head_dim]`, normed per head when asked.
    fn heads(&self, x: Tensor<B, 3>, heads: usize, norm: Option<&RmsNorm<B>>) -> Tensor<B, 4> {
        let [batch, len, _] = x.dims();
        let x = x.reshape([batch, len, heads, self.head_dim]);
        match norm {
            Some(norm) => rms(norm, x, self.norm_offset),
            None => x,
        }
    }

    /// The attention block's output, in `compute` (the caller adds it to the residual stream).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        tables: &RopeTables<B>,
        masking: &Masking<B>,
        compute: DType,
    ) -> Result<Tensor<B, 3>> {
        let (cos, sin) = (
            tables.cos.clone().unsqueeze(),
            tables.sin.clone().unsqueeze(),
        );
        let (q, k, v) = self.rotated(x, &cos, &sin, compute);
        self.attend(q, k, v, masking, compute)
    }

    /// Queries `[batch, heads, len, head_dim]`, keys and values `[batch, kv_heads, len,
    /// head_dim]`, rotated by `cos`/`sin` (`[1 or batch, 1, len, rotary_dim / 2]`), in
    /// `compute`. The per-head norms and the rotation run in `x`'s dtype (the residual
    /// stream's), as the tables are.
    pub(crate) fn rotated(
        &self,
        x: Tensor<B, 3>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
        compute: DType,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let stream = x.dtype();
        let (q, k, v) = self.project(x, compute);
        let q = self.heads(q.cast(stream), self.num_heads, self.q_norm.as_ref());
        let k = self.heads(k.cast(stream), self.num_kv_heads, self.k_norm.as_ref());
        // The rotation runs on the projection's layout, `[batch, len, heads, head_dim]` (one
        // angle per position for every head), before the heads move ahead of the positions.
        let (cos, sin) = (
            cos.clone().squeeze_dim::<3>(1),
            sin.clone().squeeze_dim::<3>(1),
        );
        let rotated = |x: Tensor<B, 4>| {
            blocks::rotary(x, cos.clone(), sin.clone())
                .swap_dims(1, 2)
                .cast(compute)
        };
        (
            rotated(q),
            rotated(k),
            self.heads(v, self.num_kv_heads, None).swap_dims(1, 2),
        )
    }

    /// Attention of `q` over `k`/`v` (which may hold more positions than `q`, from a cache)
    /// as `masking` says, then the output projection, in `compute`.
    pub(crate) fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        masking: &Masking<B>,
        compute: DType,
    ) -> Result<Tensor<B, 3>> {
        let [batch, _, len, _] = q.dims();
        let out = match masking {
            Masking::Tiled(spec) => {
                let spec = AttentionSpec {
                    scale: self.scale,
                    softcap: self.softcap,
                    ..spec.clone()
                };
                let found = B::xt_attention(
                    q.into_primitive().tensor(),
                    k.into_primitive().tensor(),
                    v.into_primitive().tensor(),
                    &spec,
                )?;
                Tensor::from_primitive(TensorPrimitive::Float(found.output))
            }
            Masking::Burn { mask, causal } => {
                let keys = k.dims()[2];
                let (k, v) = (self.repeat_kv(k), self.repeat_kv(v));
                let default_scale = (self.head_dim as f32).powf(-0.5);
                let options = AttentionModuleOptions {
                    scale: (self.scale != default_scale).then_some(self.scale as f64),
                    softcap: self.softcap.map(f64::from),
                    is_causal: *causal && mask.is_none(),
                };
                let mask = mask
                    .as_ref()
                    .map(|m| m.clone().expand([batch, self.num_heads, len, keys]));
                attention(q, k, v, mask, None, options)
            }
        };
        let out = out
            .swap_dims(1, 2)
            .reshape([batch, len, self.num_heads * self.head_dim]);
        Ok(project(&self.o_proj, out, compute))
    }

    /// GQA: each key/value head serves `num_heads / num_kv_heads` consecutive query heads.
    fn repeat_kv(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let repeat = self.num_heads / self.num_kv_heads;
        if repeat == 1 {
            return x;
        }
        let [batch, kv_heads, len, head_dim] = x.dims();
        x.unsqueeze_dim::<5>(2)
            .expand([batch, kv_heads, repeat, len, head_dim])
            .reshape([batch, kv_heads * repeat, len, head_dim])
    }
}

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Option<Linear<B>>,
    pub up_proj: Option<Linear<B>>,
    /// Phi-3: gate and up in one projection, gate first.
    pub gate_up_proj: Option<Linear<B>>,
    pub down_proj: Linear<B>,
    pub intermediate_size: usize,
    #[module(skip)]
    pub activation: Activation,
}

impl<B: Backend> Mlp<B> {
    fn build<S: TensorSource>(
        b: &mut Builder<B, S>,
        prefix: &str,
        arch: &Architecture,
    ) -> Result<Self> {
        let (hidden, inner, bias) = (arch.hidden_size, arch.intermediate_size, arch.mlp_bias);
        let (gate_proj, up_proj, gate_up_proj) = if arch.fused_projections {
            let fused = b.linear(&format!("{prefix}.gate_up_proj"), hidden, 2 * inner, bias)?;
            (None, None, Some(fused))
        } else {
            (
                Some(b.linear(&format!("{prefix}.gate_proj"), hidden, inner, bias)?),
                Some(b.linear(&format!("{prefix}.up_proj"), hidden, inner, bias)?),
                None,
            )
        };
        Ok(Mlp {
            gate_proj,
            up_proj,
            gate_up_proj,
            down_proj: b.linear(&format!("{prefix}.down_proj"), inner, hidden, bias)?,
            intermediate_size: inner,
            activation: arch.activation,
        })
    }
}

impl<B: XTokenBackend> Mlp<B> {
    /// The MLP's output, in `compute`.
    pub fn forward(&self, x: Tensor<B, 3>, compute: DType) -> Tensor<B, 3> {
        let (gate, up) = match (&self.gate_up_proj, &self.gate_proj, &self.up_proj) {
            (Some(fused), ..) => {
                let both = project(fused, x, compute);
                let inner = self.intermediate_size;
                (
                    both.clone().narrow(2, 0, inner),
                    both.narrow(2, inner, inner),
                )
            }
            (None, Some(gate), Some(up)) => {
                (project(gate, x.clone(), compute), project(up, x, compute))
            }
            _ => unreachable!("Mlp is built with either gate_up_proj or gate/up_proj"),
        };
        let gated = match self.activation {
            Activation::Silu => blocks::swiglu(gate, up),
            Activation::GeluTanh => burn::tensor::activation::gelu_approximate(gate) * up,
        };
        project(&self.down_proj, gated, compute)
    }
}

#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub self_attn: Attention<B>,
    pub mlp: Mlp<B>,
    pub input_layernorm: RmsNorm<B>,
    /// Before the MLP; Gemma: on the attention's output, before the residual sum.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Gemma: before the MLP, and on its output before the residual sum.
    pub pre_feedforward_layernorm: Option<RmsNorm<B>>,
    pub post_feedforward_layernorm: Option<RmsNorm<B>>,
    /// Gemma's `1 + w` norms.
    #[module(skip)]
    pub norm_offset: bool,
}

impl<B: Backend> DecoderLayer<B> {
    fn build<S: TensorSource>(
        b: &mut Builder<B, S>,
        prefix: &str,
        arch: &Architecture,
    ) -> Result<Self> {
        let hidden = arch.hidden_size;
        let mut norm = |name: &str| b.norm(&format!("{prefix}.{name}"), hidden, arch);
        let input_layernorm = norm("input_layernorm")?;
        let post_attention_layernorm = norm("post_attention_layernorm")?;
        let (pre_feedforward_layernorm, post_feedforward_layernorm) = match arch.gemma {
            Some(_) => (
                Some(norm("pre_feedforward_layernorm")?),
                Some(norm("post_feedforward_layernorm")?),
            ),
            None => (None, None),
        };
        Ok(DecoderLayer {
            self_attn: Attention::build(b, &format!("{prefix}.self_attn"), arch)?,
            mlp: Mlp::build(b, &format!("{prefix}.mlp"), arch)?,
            input_layernorm,
            post_attention_layernorm,
            pre_feedforward_layernorm,
            post_feedforward_layernorm,
            norm_offset: arch.gemma.is_some(),
        })
    }
}

impl<B: XTokenBackend> DecoderLayer<B> {
    /// One layer on the residual stream `x`, whose dtype it keeps; the blocks run in `compute`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        tables: &RopeTables<B>,
        masking: &Masking<B>,
        compute: DType,
    ) -> Result<Tensor<B, 3>> {
        let attended =
            self.self_attn
                .forward(self.input_norm(x.clone()), tables, masking, compute)?;
        Ok(self.after_attention(x, attended, compute))
    }

    /// The attention block's input norm on the residual stream `x`.
    pub(crate) fn input_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        rms(&self.input_layernorm, x, self.norm_offset)
    }

    /// The rest of the layer once attention has run: its output `attended` added to the
    /// residual stream `x` (in `x`'s dtype), then the MLP block the same way.
    pub(crate) fn after_attention(
        &self,
        x: Tensor<B, 3>,
        attended: Tensor<B, 3>,
        compute: DType,
    ) -> Tensor<B, 3> {
        let stream = x.dtype();
        let offset = self.norm_offset;
        match (
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm,
        ) {
            (Some(pre), Some(post)) => {
                let attended = rms(
                    &self.post_attention_layernorm,
                    attended.cast(stream),
                    offset,
                );
                let x = x + attended;
                let mlp = self.mlp.forward(rms(pre, x.clone(), offset), compute);
                x + rms(post, mlp.cast(stream), offset)
            }
            _ => {
                let x = x + attended.cast(stream);
                let mlp = self.mlp.forward(
                    rms(&self.post_attention_layernorm, x.clone(), offset),
                    compute,
                );
                x + mlp.cast(stream)
            }
        }
    }
}

/// A causal language model of any family [`Architecture`] describes.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `None` when the head is tied to `embed_tokens`.
    pub lm_head: Option<Linear<B>>,
    #[module(skip)]
    pub architecture: Architecture,
    /// The `config.json` the model was loaded from, written back (with every field we do not
    /// interpret) when it is saved.
    #[module(skip)]
    pub hf_config: Option<serde_json::Value>,
    /// The dtype the matmuls, the attention and the head run in; `None`: the parameters'.
    #[module(skip)]
    pub compute: Option<DType>,
    /// The attention its passes run.
    #[module(skip)]
    pub attention: AttentionKernel,
}

impl<B: Backend> Transformer<B> {
    pub(crate) fn build<S: TensorSource>(
        b: &mut Builder<B, S>,
        arch: &Architecture,
    ) -> Result<Self> {
        let (vocab, hidden) = (arch.vocab_size, arch.hidden_size);
        let embedding = b.source.values(
            "model.embed_tokens.weight",
            &[vocab, hidden],
            Init::Normal(b.init_std),
        )?;
        let embed_tokens = Embedding {
            weight: Param::from_tensor(b.tensor(embedding, [vocab, hidden])),
        };
        let layers = (0..arch.num_hidden_layers)
            .map(|i| DecoderLayer::build(b, &format!("model.layers.{i}"), arch))
            .collect::<Result<Vec<_>>>()?;
        let norm = b.norm("model.norm", hidden, arch)?;
        let lm_head = if arch.tie_word_embeddings {
            None
        } else {
            Some(b.linear("lm_head", hidden, vocab, false)?)
        };
        Ok(Transformer {
            embed_tokens,
            layers,
            norm,
            lm_head,
            architecture: arch.clone(),
            hf_config: None,
            compute: None,
            attention: AttentionKernel::default(),
        })
    }

    /// The same model computing in `dtype` (mixed precision when it is narrower than the
    /// parameters, which keep their own dtype: see the module's documentation).
    pub fn with_compute_dtype(self, dtype: DType) -> Self {
        Transformer {
            compute: Some(dtype),
            ..self
        }
    }

    /// The dtype the matmuls, the attention and the head run in.
    pub fn compute_dtype(&self) -> DType {
        self.compute
            .unwrap_or_else(|| self.embed_tokens.weight.val().dtype())
    }

    /// The same model running `kernel` for its attention.
    pub fn with_attention(self, kernel: AttentionKernel) -> Self {
        Transformer {
            attention: kernel,
            ..self
        }
    }

    /// The output head on some rows' hidden states, `[rows, hidden]` → `[rows, vocab]` (the
    /// positions an evaluation scores or decodes from), in the compute dtype. A tied head is
    /// applied as `(E · hᵀ)ᵀ`, which reads the embedding `E` `[vocab, hidden]` as stored: its
    /// transpose would be copied by a backend that wants contiguous operands, every call.
    pub fn logits_of_rows(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        let compute = self.compute_dtype();
        let logits = match &self.lm_head {
            Some(head) => project(head, hidden, compute),
            None => self
                .embed_tokens
                .weight
                .val()
                .cast(compute)
                .matmul(hidden.cast(compute).transpose())
                .transpose(),
        };
        soft_cap(logits, self.final_softcap())
    }

    /// Gemma-2's soft-cap of the output logits.
    pub fn final_softcap(&self) -> Option<f64> {
        self.architecture
            .gemma
            .as_ref()
            .and_then(|g| g.final_logit_softcapping)
    }

    /// The embeddings of a lookup's output as the layers read them: Gemma scales them by
    /// `√hidden`, rounded to their dtype as transformers rounds it.
    pub(crate) fn scaled_embeddings<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self.embedding_scale() {
            Some(scale) => x.mul_scalar(scale),
            None => x,
        }
    }

    /// Gemma's `√hidden` embedding scale, in the embedding's dtype.
    pub(crate) fn embedding_scale(&self) -> Option<f64> {
        self.architecture.gemma.as_ref()?;
        let scale = (self.architecture.hidden_size as f64).sqrt();
        Some(match self.embed_tokens.weight.val().dtype() {
            DType::BF16 => burn::tensor::bf16::from_f64(scale).to_f64(),
            DType::F16 => burn::tensor::f16::from_f64(scale).to_f64(),
            _ => scale as f32 as f64,
        })
    }

    /// The output head: `[batch, len, hidden]` → logits `[batch, len, vocab]`, in the compute
    /// dtype. A tied head multiplies the rows, flattened to `[batch · len, hidden]`, by the
    /// embedding's transpose as a 2-D view: a batched product would reshape that view to
    /// `[1, hidden, vocab]`, which copies the whole embedding on a backend that reshapes only
    /// contiguous tensors (burn-flex), at every forward.
    pub fn logits_from_hidden(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let compute = self.compute_dtype();
        let logits = match &self.lm_head {
            Some(head) => project(head, hidden, compute),
            None => {
                let [batch, len, size] = hidden.dims();
                let embedding = self.embed_tokens.weight.val().cast(compute);
                let vocab = embedding.dims()[0];
                hidden
                    .cast(compute)
                    .reshape([batch * len, size])
                    .matmul(embedding.transpose())
                    .reshape([batch, len, vocab])
            }
        };
        soft_cap(logits, self.final_softcap())
    }
}

impl<B: XTokenBackend> Transformer<B> {
    /// Whether this model's passes run the tiled attention (see [`AttentionKernel`]).
    pub fn tiled_attention(&self) -> bool {
        let device = self.embed_tokens.weight.device();
        // burn's fused attention on CUDA and wgpu takes neither a soft-cap nor its own scale:
        // it would fall back to building the scores, so Gemma's layers take the tiled one.
        self.attention.tiled_on::<B>(&device)
            || (self.architecture.scores_of_their_own()
                && self.attention == AttentionKernel::Auto
                && B::xt_attention_native())
    }

    /// The hidden states after the final norm, `[batch, len, hidden]`. `padding` marks padded
    /// positions with `true`; they are hidden from every query as keys. Positions count from 0
    /// in every row, so pad on the right.
    ///
    /// The ids and padding are read back to the host once to be checked; [`Self::hidden_states_of`]
    /// takes [`Tokens`] made on the host and reads nothing.
    pub fn hidden_states(
        &self,
        ids: Tensor<B, 2, Int>,
        padding: Option<Tensor<B, 2, Bool>>,
    ) -> Result<Tensor<B, 3>> {
        self.hidden_states_of(&Tokens::from_tensors(ids, padding)?)
    }

    /// [`Self::hidden_states`] of tokens checked where they were made.
    pub fn hidden_states_of(&self, tokens: &Tokens<B>) -> Result<Tensor<B, 3>> {
        // The ids checked before the lookup reads them.
        let pass = Pass::new(&self.architecture, tokens)?;
        self.hidden_states_from(&pass, self.embed_tokens.forward(tokens.ids()))
    }

    /// The hidden states after the final norm from the embeddings `x` of a checked pass.
    pub(crate) fn hidden_states_from(
        &self,
        pass: &Pass,
        mut x: Tensor<B, 3>,
    ) -> Result<Tensor<B, 3>> {
        let tiled = self.tiled_attention();
        let context = pass.context::<B>(&self.architecture, tiled, x.dtype(), &x.device());
        let compute = self.compute_dtype();
        x = self.scaled_embeddings(x);
        for (i, layer) in self.layers.iter().enumerate() {
            let (tables, masking) = context.layer(i);
            x = layer.forward(x, tables, masking, compute)?;
        }
        Ok(self.final_norm(x))
    }

    /// The final norm on the last layer's output.
    pub(crate) fn final_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        rms(&self.norm, x, self.architecture.gemma.is_some())
    }

    /// Logits `[batch, len, vocab]` of tokens checked where they were made (no read of the
    /// device), in the compute dtype.
    pub fn forward_of(&self, tokens: &Tokens<B>) -> Result<Tensor<B, 3>> {
        Ok(self.logits_from_hidden(self.hidden_states_of(tokens)?))
    }
}

/// What one forward pass needs besides the weights, from its [`Tokens`]' host side: the shape and
/// which positions are padding.
pub(crate) struct Pass {
    pub batch: usize,
    pub len: usize,
    padded: Option<Vec<bool>>,
}

/// Something a pass builds for its layers: one for every layer, or, where the sliding-window
/// layers need their own, one for them beside the full-attention layers'.
pub(crate) struct ByWindow<T> {
    pub full: T,
    pub sliding: Option<T>,
}

impl<T> ByWindow<T> {
    /// The masking of a pass over `architecture`'s layers, from `make(slides)`: both kinds where
    /// some layers slide and others do not, else the one kind every layer has.
    pub fn masking(architecture: &Architecture, make: impl Fn(bool) -> T) -> Self {
        match architecture.mixes_windows() {
            true => ByWindow {
                full: make(false),
                sliding: Some(make(true)),
            },
            false => ByWindow {
                full: make(architecture.layer_window(0).is_some()),
                sliding: None,
            },
        }
    }

    /// The RoPE tables of a pass, from `make(rope)`: Gemma-3's local ones for its sliding layers.
    pub fn tables(architecture: &Architecture, make: impl Fn(&crate::rope::Rope) -> T) -> Self {
        let local = architecture
            .gemma
            .as_ref()
            .and_then(|g| g.local_rope.as_ref());
        ByWindow {
            full: make(&architecture.rope),
            sliding: local.map(make),
        }
    }

    /// What a layer reads: the sliding one's where it `slides` and there is one.
    pub fn get(&self, slides: bool) -> &T {
        match (&self.sliding, slides) {
            (Some(sliding), true) => sliding,
            _ => &self.full,
        }
    }
}

/// The RoPE tables and attention masking of a pass, on one backend.
pub(crate) struct Context<B: Backend> {
    pub tables: ByWindow<RopeTables<B>>,
    pub masking: ByWindow<Masking<B>>,
    /// Per layer, whether it slides.
    sliding: Vec<bool>,
}

impl<B: Backend> Context<B> {
    /// The tables and the masking layer `i` reads.
    pub fn layer(&self, i: usize) -> (&RopeTables<B>, &Masking<B>) {
        let slides = self.sliding.get(i).copied().unwrap_or(false);
        (self.tables.get(slides), self.masking.get(slides))
    }
}

/// A tensor's values read to the host as `E`; `what` and `expected` name them in the error.
pub(crate) fn host_values<E: burn::tensor::Element>(
    data: burn::tensor::TensorData,
    what: &'static str,
    expected: &str,
) -> Result<Vec<E>> {
    data.convert::<E>()
        .into_vec::<E>()
        .map_err(|e| ModelError::Shape {
            what,
            expected: expected.into(),
            found: format!("{e:?}"),
        })
}

/// Every id is in the vocabulary (an out-of-range id would index past the embedding); one small
/// host read (B·T ids) both checks and, on failure, locates the bad id.
pub(crate) fn check_ids<B: Backend>(
    architecture: &Architecture,
    ids: &Tensor<B, 2, Int>,
) -> Result<()> {
    let len = ids.dims()[1];
    let vocab = architecture.vocab_size;
    let values = host_values::<i64>(ids.clone().into_data(), "input ids", "integer values")?;
    if let Some(at) = values.iter().position(|&id| id < 0 || id >= vocab as i64) {
        return Err(ModelError::TokenId {
            sequence: at / len,
            position: at % len,
            id: values[at],
            vocab,
        });
    }
    Ok(())
}

impl Pass {
    /// Checks the tokens against the model (no more positions than it was trained for; every
    /// id in its vocabulary), on the host.
    pub fn new<B: Backend>(architecture: &Architecture, tokens: &Tokens<B>) -> Result<Self> {
        tokens.check(architecture)?;
        let [batch, len] = tokens.dims();
        Ok(Pass {
            batch,
            len,
            padded: tokens.padding().map(<[bool]>::to_vec),
        })
    }

    /// The RoPE tables in `dtype` and the masking for the attention `tiled` asks for.
    pub fn context<B: Backend>(
        &self,
        architecture: &Architecture,
        tiled: bool,
        dtype: DType,
        device: &B::Device,
    ) -> Context<B> {
        let tables = |rope: &crate::rope::Rope| {
            let tables = rope.tables::<B>(self.len, device);
            RopeTables {
                cos: tables.cos.cast(dtype),
                sin: tables.sin.cast(dtype),
            }
        };
        let masking = |slides: bool| {
            Masking::causal(
                tiled,
                (self.batch, self.len),
                architecture.head_dim,
                self.padded.as_deref(),
                architecture.sliding_window.filter(|_| slides),
                device,
            )
        };
        Context {
            tables: ByWindow::tables(architecture, tables),
            masking: ByWindow::masking(architecture, masking),
            sliding: (0..architecture.num_hidden_layers)
                .map(|i| architecture.layer_window(i).is_some())
                .collect(),
        }
    }
}
