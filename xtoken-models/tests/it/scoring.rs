//! Token log-probabilities against an f64 reference over real vocabulary sizes: per token within
//! 2e-5, and without the one-sided bias of a row summed term after term in f32.

use burn::backend::NdArray;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_flex::Flex;
use xtoken_models::token_log_probs;
use xtoken_testkit::reference;

/// Rows of logits as trained and random models give them: a spread σ, and a peak added to one
/// token of some rows.
fn logits(rows: usize, vocab: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut state = seed;
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut values = Vec::with_capacity(rows * vocab);
    let mut tokens = Vec::with_capacity(rows);
    for row in 0..rows {
        let sigma = [0.5, 1.5, 3.0, 5.0][row % 4];
        for _ in 0..vocab {
            let (u, v) = (uniform().max(1e-300), uniform());
            let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            values.push((normal * sigma) as f32);
        }
        let token = (uniform() * vocab as f64) as usize % vocab;
        if row % 3 == 0 {
            values[row * vocab + token] += 12.0;
        }
        tokens.push(token as u32);
    }
    (values, tokens)
}

/// `(largest |error|, mean signed error)` of `scored` against the f64 log-softmax of `values`.
fn errors(values: &[f32], vocab: usize, tokens: &[u32], scored: &[f64]) -> (f64, f64) {
    let mut worst = 0.0f64;
    let mut signed = 0.0;
    for (row, (&token, &ours)) in tokens.iter().zip(scored).enumerate() {
        let z: Vec<f64> = values[row * vocab..(row + 1) * vocab]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let exact = reference::log_softmax(&z, 1.0)[token as usize];
        worst = worst.max((ours - exact).abs());
        signed += ours - exact;
    }
    (worst, signed / tokens.len() as f64)
}

fn check<B: Backend>(name: &str) {
    let device = Default::default();
    let rows = 32;
    for (vocab, seed) in [(128_256, 1), (151_936, 2), (200_064, 3), (1000, 4)] {
        let (values, tokens) = logits(rows, vocab, seed);
        let tensor =
            Tensor::<B, 2>::from_data(TensorData::new(values.clone(), [rows, vocab]), &device);
        let scores = token_log_probs(tensor.clone(), &tokens).unwrap();
        let (worst, bias) = errors(&values, vocab, &tokens, &scores.log_probs);
        // The composed log-softmax, for the record of what the blocks mend.
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, 1]), &device);
        let plain: Vec<f64> = log_softmax(tensor.clone(), 1)
            .gather(1, ids)
            .into_data()
            .convert::<f64>()
            .into_vec()
            .unwrap();
        let (plain_worst, plain_bias) = errors(&values, vocab, &tokens, &plain);
        eprintln!(
            "{name} V={vocab}: blocked max {worst:.1e} mean {bias:+.1e}; \
             log_softmax max {plain_worst:.1e} mean {plain_bias:+.1e}"
        );
        assert!(worst <= 2e-5, "{name} V={vocab}: max |error| {worst:.2e}");
        assert!(
            bias.abs() <= 1e-6,
            "{name} V={vocab}: mean error {bias:+.2e}"
        );
        // Greedy: exactly the rows whose token is the first largest logit.
        for (row, (&token, &greedy)) in tokens.iter().zip(&scores.greedy).enumerate() {
            let row_values = &values[row * vocab..(row + 1) * vocab];
            let max = row_values.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let first = row_values.iter().position(|&x| x == max).unwrap();
            assert_eq!(
                greedy,
                first == token as usize,
                "{name} V={vocab} row {row}"
            );
        }
    }
}

#[test]
fn log_probs_are_unbiased_on_ndarray() {
    check::<NdArray>("ndarray");
}

#[test]
fn log_probs_are_unbiased_on_flex() {
    check::<Flex>("flex");
}

#[test]
fn bad_tokens_are_named() {
    let device = Default::default();
    let logits = Tensor::<NdArray, 2>::zeros([2, 5], &device);
    let error = token_log_probs(logits.clone(), &[1])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("1 tokens to score against 2 rows"),
        "{error}"
    );
    let error = token_log_probs(logits, &[1, 5]).unwrap_err().to_string();
    assert!(
        error.contains("token 5 lies outside the vocabulary of 5"),
        "{error}"
    );
}
