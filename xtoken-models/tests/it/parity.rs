//! Logits parity with HF transformers on the tiny checkpoints `tests/fixtures/make_parity.py`
//! wrote (llama3 rope scaling, bf16 file + tied head, Qwen3 q/k norm, Phi-3 partial rotary +
//! LongRoPE short and long + sliding window, shards + transformers 5 config, right padding; and
//! Llama-3.2's rope at 1100 positions with large weights, where the rotary angles' rounding
//! would show).

use crate::support::{fixture, worst_difference};
use burn::backend::NdArray;
use xtoken_models::Transformer;

type B = NdArray;

fn check(case: &str) {
    let model = Transformer::<B>::load(&fixture(case), &Default::default()).unwrap();
    let worst = worst_difference(&model, case);
    assert!(worst <= 1e-4, "{case}: max |Δ| {worst:.2e} > 1e-4");
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
