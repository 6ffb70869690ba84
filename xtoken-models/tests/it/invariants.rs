//! Properties any causal LM here must have, on random tiny models of each family: causality,
//! right padding that leaves the real positions alone, and batch rows that do not interact.

use crate::support::fixture;
use burn::backend::NdArray;
use burn::tensor::{DType, Int, Tensor, TensorData};
use proptest::prelude::*;
use xtoken_models::{CausalLm, HfConfig, Transformer};

type B = NdArray;

fn model(case: &str, seed: u64) -> Transformer<B> {
    let architecture = HfConfig::read(&fixture(case)).unwrap().architecture;
    Transformer::random(&architecture, seed, DType::F32, &Default::default()).unwrap()
}

fn logits(model: &Transformer<B>, rows: &[Vec<i64>], padding: Option<Vec<bool>>) -> Vec<f32> {
    let device = Default::default();
    let (batch, len) = (rows.len(), rows[0].len());
    let ids = TensorData::new(rows.concat(), [batch, len]);
    let ids = Tensor::<B, 2, Int>::from_data(ids, &device);
    let padding = padding.map(|p| Tensor::from_data(TensorData::new(p, [batch, len]), &device));
    model
        .forward(ids, padding)
        .unwrap()
        .into_data()
        .into_vec::<f32>()
        .unwrap()
}

/// f32 logits of the same positions computed in two batch layouts: the sums run in a different
/// order, so they differ by rounding (a few ulp of values of order 1), never by more than 1e-4.
fn assert_close(what: &str, a: &[f32], b: &[f32]) {
    xtoken_testkit::assert_close(what, a, b, 1e-4, 0.0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn future_tokens_do_not_change_past_logits(
        case in prop::sample::select(vec!["llama3", "qwen3", "phi3"]),
        seed in 0u64..1_000,
        ids in prop::collection::vec(0i64..128, 2..40),
        at in any::<prop::sample::Index>(),
        replacement in 0i64..128,
    ) {
        let model = model(case, seed);
        let at = at.index(ids.len());
        let mut changed = ids.clone();
        changed[at] = replacement;
        let vocab = 128;
        let before = logits(&model, std::slice::from_ref(&ids), None);
        let after = logits(&model, &[changed], None);
        assert_close("logits before the change", &before[..at * vocab], &after[..at * vocab]);
    }

    #[test]
    fn right_padding_and_batching_leave_real_positions_alone(
        case in prop::sample::select(vec!["llama3", "qwen3", "phi3"]),
        seed in 0u64..1_000,
        // At most Phi-3's pretraining length of 32: past it, LongRoPE switches to its long
        // factors for the whole batch (as HF does), and a short row alone would not.
        long in prop::collection::vec(0i64..128, 4..=32),
        short_len in 1usize..4,
        filler in 0i64..128,
    ) {
        let model = model(case, seed);
        let vocab = 128;
        let short: Vec<i64> = long.iter().rev().take(short_len).copied().collect();
        let mut padded = short.clone();
        padded.resize(long.len(), filler);
        let mut mask = vec![false; long.len()];
        mask.extend((0..long.len()).map(|i| i >= short_len));
        let together = logits(&model, &[long.clone(), padded], Some(mask));
        let alone_long = logits(&model, std::slice::from_ref(&long), None);
        let alone_short = logits(&model, &[short], None);
        let row = long.len() * vocab;
        assert_close("long row", &together[..row], &alone_long);
        assert_close("short row", &together[row..row + short_len * vocab], &alone_short);
    }
}
