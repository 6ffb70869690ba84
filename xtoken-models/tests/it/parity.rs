//! Logits parity with HF transformers on the tiny checkpoints `tests/fixtures/make_parity.py`
//! wrote (llama3 rope scaling, bf16 file + tied head, Qwen3 q/k norm, Phi-3 partial rotary +
//! LongRoPE short and long + sliding window, shards + transformers 5 config, right padding; and
//! Llama-3.2's rope at 1100 positions with large weights, where the rotary angles' rounding
//! would show); Qwen2's q/k/v biases and its sliding layers, Mistral's window, Gemma-2's
//! (1 + w) norms, GeGLU, scaled embeddings, query scale and soft-caps, Gemma-3's q/k norms and its
//! local and global RoPEs, each at 24 positions past its window of 8, on both attentions the
//! CPU backends run (X-Token's tiled one and burn's) and on burn-flex.

use crate::support::{fixture, worst_difference};
use burn::backend::NdArray;
use burn_flex::Flex;
use xtoken_models::{AttentionKernel, Transformer};

type B = NdArray;

fn check(case: &str) {
    let model = Transformer::<B>::load(&fixture(case), &Default::default()).unwrap();
    let worst = worst_difference(&model, case);
    assert!(worst <= 1e-4, "{case}: max |Δ| {worst:.2e} > 1e-4");
}

/// The newer families on ndarray and burn-flex, through X-Token's tiled attention and burn's.
fn check_everywhere(case: &str) {
    for kernel in [AttentionKernel::Tiled, AttentionKernel::Burn] {
        let on_ndarray = Transformer::<B>::load(&fixture(case), &Default::default())
            .unwrap()
            .with_attention(kernel);
        let on_flex = Transformer::<Flex>::load(&fixture(case), &Default::default())
            .unwrap()
            .with_attention(kernel);
        for (backend, worst) in [
            ("ndarray", worst_difference(&on_ndarray, case)),
            ("flex", worst_difference(&on_flex, case)),
        ] {
            assert!(
                worst <= 1e-4,
                "{case} on {backend} ({kernel:?}): max |Δ| {worst:.2e} > 1e-4"
            );
        }
    }
}

#[test]
fn llama3_rope_scaling_gqa_untied() {
    check("llama3");
}

#[test]
fn llama3_tied_from_bf16_file() {
    check("llama3-tied-bf16");
}

#[test]
fn qwen3_qk_norm_head_dim() {
    check("qwen3");
}

#[test]
fn qwen3_sharded_transformers5_config() {
    check("qwen3-sharded");
}

#[test]
fn phi3_partial_rotary_longrope_short_and_long_sliding_window() {
    check("phi3");
}

#[test]
fn llama3_rope_past_a_thousand_positions_with_large_weights() {
    check("llama3-long");
}

#[test]
fn qwen2_qkv_biases_and_sliding_layers_from_max_window_layers() {
    check_everywhere("qwen2");
}

#[test]
fn qwen3_with_use_sliding_window() {
    check_everywhere("qwen3-window");
}

#[test]
fn mistral_sliding_window_in_every_layer() {
    check_everywhere("mistral");
}

#[test]
fn gemma2_offset_norms_geglu_query_scale_and_soft_caps() {
    check_everywhere("gemma2");
}

#[test]
fn gemma3_qk_norms_local_and_global_rope() {
    check_everywhere("gemma3");
}

#[test]
fn gemma3_in_transformers_own_save_layout() {
    check_everywhere("gemma3-saved");
}
