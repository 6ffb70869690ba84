//! Activation checkpointing per decoder layer gives the gradients of the plain backward pass.

use crate::support::{assert_same_step, fixture, training_step, Train};
use xtoken_models::Transformer;

fn compare(case: &str, padded: bool, window: Option<usize>) {
    let mut model = Transformer::<Train>::load(&fixture(case), &Default::default()).unwrap();
    if window.is_some() {
        model.architecture.sliding_window = window;
    }
    let plain = training_step(&model, padded, false);
    let checkpointed = training_step(&model, padded, true);
    assert_same_step(case, &plain, &checkpointed, 1e-4);
}

#[test]
fn llama_untied_with_padding() {
    compare("llama3", true, None);
}

#[test]
fn qwen3_tied_head_and_embedding_gradients_add_up() {
    compare("qwen3", false, None);
}

#[test]
fn phi3_fused_projections_and_sliding_window() {
    // The fixture's window (20) is longer than the batch: 5 makes it cut.
    compare("phi3", true, Some(5));
}
