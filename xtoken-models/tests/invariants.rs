//! Properties any causal LM here must have, on random tiny models of each family: causality,
//! right padding that leaves the real positions alone, and batch rows that do not interact.

mod support;

use burn::backend::NdArray;
use burn::tensor::{DType, Int, Tensor, TensorData};
use proptest::prelude::*;
use support::fixture;
use xtoken_models::{CausalLm, HfConfig, Transformer};

type B = NdArray;

fn model(case: &str) -> Transformer<B> {
    let architecture = HfConfig::read(&fixture(case)).unwrap().architecture;
    Transformer::random(&architecture, 5, DType::F32, &Default::default()).unwrap()
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

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn future_tokens_do_not_change_past_logits(
        case in prop::sample::select(vec!["llama3", "qwen3", "phi3"]),
        ids in prop::collection::vec(0i64..128, 2..40),
        at in any::<prop::sample::Index>(),
        replacement in 0i64..128,
    ) {
        let model = model(case);
        let at = at.index(ids.len());
        let mut changed = ids.clone();
        changed[at] = replacement;
        let vocab = 128;
        let before = logits(&model, std::slice::from_ref(&ids), None);
        let after = logits(&model, &[changed], None);
        prop_assert!(close(&before[..at * vocab], &after[..at * vocab]));
    }

    #[test]
    fn right_padding_and_batching_leave_real_positions_alone(
        case in prop::sample::select(vec!["llama3", "qwen3", "phi3"]),
        // At most Phi-3's pretraining length of 32: past it, LongRoPE switches to its long
        // factors for the whole batch (as HF does), and a short row alone would not.
        long in prop::collection::vec(0i64..128, 4..=32),
        short_len in 1usize..4,
        filler in 0i64..128,
    ) {
        let model = model(case);
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
        prop_assert!(close(&together[..row], &alone_long));
        prop_assert!(close(&together[row..row + short_len * vocab], &alone_short));
    }
}
