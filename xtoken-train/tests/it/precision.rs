//! 16-bit floats in training, on burn-flex (the CPU backend with bf16).

use crate::fixture::*;

/// A bf16 student used to end step 1 with an infinite loss on a GPU (KD 2.28e-41: a loss
/// value in the logits' 16 bits, read where an f32 was expected); on burn-flex the same step
/// panicked on the dtypes. Now every step's KD is a plain number like the f32 student's.
#[test]
fn a_bf16_student_trains_on_flex() {
    let f = fixture("bf16-student");
    let config = config(&f, "bf16", "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replacen("[student]\n", "[student]\ndtype = \"bf16\"\n", 1),
    )
    .unwrap();
    let log = ok(train(&config, &["--device", "flex"]));
    assert!(
        log.contains("parameters, BF16, computing in BF16)"),
        "{log}"
    );
    let rows = columns(&f.dir.0.join("bf16"), &["loss", "ce", "kd"]);
    assert_eq!(rows.len(), 6);
    for row in rows {
        let [loss, ce, kd] = row[..] else { panic!() };
        assert!(loss.is_finite() && ce > 1.0 && ce < 10.0, "{row:?}");
        assert!(kd > 1e-3 && kd < 100.0, "KD {kd}");
    }
}

/// The largest |logit| of the model in `dir` with every token of its vocabulary as input.
fn max_logit(dir: &std::path::Path) -> f64 {
    use burn::backend::NdArray;
    use burn::tensor::{Int, Tensor, TensorData};
    let model = xtoken_models::Transformer::<NdArray>::load(dir, &Default::default()).unwrap();
    let vocab = model.architecture.vocab_size;
    let ids = TensorData::new((0..vocab as i64).collect::<Vec<_>>(), [1, vocab]);
    let ids = Tensor::<NdArray, 2, Int>::from_data(ids, &Default::default());
    let logits = xtoken_models::CausalLm::forward(&model, ids, None).unwrap();
    let values = logits
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap();
    xtoken_testkit::max_abs("logits", &values)
}

/// Mixed precision: the student's f32 weights computing in bf16 follow the f32 computation's
/// cross-entropy for 30 steps of real learning (lr 3e-3: it falls by about 0.6 nats).
///
/// The bound: CE is a mean of `lse(z) − z_y`, which moves by at most `2 max|Δz|`. Between the
/// embedding and a logit lie 19 matmuls, each rounding its two operands and its result to
/// bf16: 57 roundings, each moving a logit by at most `u · max|z|` to first order (the models'
/// tests derive this count). All of one sign they give `57 u max|z|`; rounding to nearest is
/// unbiased, so errors of independent sign add as `√57 u max|z|`, the scale used here, with
/// `max|z|` the largest logit of the student before and after either run. So
/// `|ΔCE| ≤ 2 √57 u max|z|` (and the same for KD) at every step, while the weights of the two
/// runs drift apart — which the bound leaves no room for if the bf16 run stops learning.
#[test]
fn bf16_compute_follows_the_f32_loss() {
    let f = fixture("bf16-compute");
    let mut curves = Vec::new();
    let mut max_z = max_logit(&f.student);
    for compute in ["f32", "bf16"] {
        let config = config(&f, compute, "");
        let text = std::fs::read_to_string(&config).unwrap();
        let text = text.replacen(
            "steps = 6\n",
            &format!("steps = 30\nlr = 3e-3\ncompute_dtype = \"{compute}\"\n"),
            1,
        );
        std::fs::write(&config, text).unwrap();
        let log = ok(train(&config, &["--device", "flex"]));
        let computing = format!("computing in {}", compute.to_uppercase());
        assert!(log.contains(&computing), "{log}");
        let run = f.dir.0.join(compute);
        max_z = max_z.max(max_logit(&run.join("student")));
        curves.push(columns(&run, &["ce", "kd"]));
    }
    let bound = 2.0 * 57f64.sqrt() * xtoken_testkit::BF16_UNIT_ROUNDOFF * max_z;
    let (exact, mixed) = (&curves[0], &curves[1]);
    assert_eq!((exact.len(), mixed.len()), (30, 30));
    let learned = exact[0][0] - exact[29][0];
    assert!(learned > 0.3, "the f32 run learned {learned:.3} nats of CE");
    assert!(
        learned > 4.0 * bound,
        "bound {bound:.3} against {learned:.3} learned"
    );
    let moved = exact
        .iter()
        .zip(mixed)
        .map(|(e, m)| (m[0] - e[0]).abs())
        .fold(0.0, f64::max);
    eprintln!(
        "largest |Δ CE| {moved:.2e}, bound {bound:.2e} (max|z| {max_z:.3}), learned {learned:.3}"
    );
    for (step, (e, m)) in exact.iter().zip(mixed).enumerate() {
        let (ce, kd) = ((m[0] - e[0]).abs(), (m[1] - e[1]).abs());
        assert!(
            ce <= bound && kd <= bound && m[1].is_finite(),
            "step {}: CE {:.5} / {:.5}, KD {:.5} / {:.5} (bf16 / f32), bound {bound:.4}",
            step + 1,
            m[0],
            e[0],
            m[1],
            e[1]
        );
    }
    assert!(
        exact.iter().zip(mixed).any(|(e, m)| e[0] != m[0]),
        "the bf16 run computed in f32"
    );
}
