//! Data-parallel training through xtoken-collective, two workers on CPU (feature `collective`).
#![cfg(feature = "collective")]

use crate::fixture::*;
use burn::backend::NdArray;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use xtoken_models::Transformer;

fn parameters(dir: &std::path::Path) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.extend(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
    }
    let model = Transformer::<NdArray>::load(dir, &Default::default()).unwrap();
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// The metrics rows of a run: step, lr, loss, CE, KD, each teacher's loss and α, and the
/// gradient norm (the first 10 columns).
fn rows(dir: &std::path::Path) -> Vec<Vec<f64>> {
    std::fs::read_to_string(dir.join("metrics.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').take(10).map(|v| v.parse().unwrap()).collect())
        .collect()
}

/// Two workers of two micro-batches each make the step one pass over the combined batch of four
/// rows makes: the step's CE and KD are means over all four rows, and dynamic scaling's γ and
/// adaptive α are taken once from them (exchanged before the backward passes). Measuring them
/// per micro-batch instead gives another result, so the comparison can fail.
#[test]
fn two_workers_of_two_micro_batches_match_one_pass_over_the_combined_batch() {
    let f = fixture("ddp");
    let setup = |name: &str, micro_batch: usize, scope: &str| {
        let path = config(&f, name, "save_dtype = \"f32\"");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("micro_batch = 2", &format!("micro_batch = {micro_batch}"))
            .replace("steps = 6", "steps = 4")
            .replace("warmup = 0.2", "warmup = 0.2\nlr = 1e-3")
            .replace(
                "top_k = 16",
                &format!("top_k = 16\nweighting = \"neg_ce\"\nscaling_scope = \"{scope}\""),
            );
        std::fs::write(&path, text).unwrap();
        path
    };
    ok(train(&setup("combined", 4, "step"), &[]));
    let log = ok(train(&setup("parallel", 1, "step"), &["--devices", "0,1"]));
    assert!(log.contains("ended with identical parameters"), "{log}");
    ok(train(
        &setup("per-micro-batch", 1, "micro-batch"),
        &["--devices", "0,1"],
    ));

    let a = parameters(&f.dir.0.join("combined/student"));
    let b = parameters(&f.dir.0.join("parallel/student"));
    assert_eq!(a.len(), b.len());
    // The combined batch pads its rows and sums in another order, so gradients agree to float
    // noise only (the gradient norms below to about 3e-6); AdamW's first steps move each
    // weight by about ±lr whatever its gradient's size, so a weight with a near-zero gradient
    // can differ by a few percent of lr = 1e-3 (5e-5 seen).
    let worst = xtoken_testkit::max_abs_diff("combined vs parallel parameters", &a, &b);
    assert!(worst < 2e-4, "largest difference {worst}");
    // The weights moved: the comparison is not between two untouched models.
    let start = parameters(&f.student);
    let moved = xtoken_testkit::max_abs_diff("trained vs initial parameters", &a, &start);
    assert!(moved > 1e-4, "{moved}");
    // Per-micro-batch γ and α end elsewhere, by far more than the tolerance above.
    let c = parameters(&f.dir.0.join("per-micro-batch/student"));
    let apart = xtoken_testkit::max_abs_diff("combined vs per-micro-batch parameters", &a, &c);
    assert!(apart > 1e-3, "{apart}");

    // Both wrote the same metrics: the step's means over the four rows.
    let (combined, parallel) = (
        rows(&f.dir.0.join("combined")),
        rows(&f.dir.0.join("parallel")),
    );
    assert_eq!(combined.len(), 4, "one metrics row per step");
    assert_eq!(parallel.len(), combined.len());
    let per_micro = rows(&f.dir.0.join("per-micro-batch"));
    let (g, h) = (combined[0][9], per_micro[0][9]);
    assert!(
        (g - h).abs() > 1e-4 * g,
        "step 1 gradient norms {g} and {h}"
    );
    for (x, y) in combined.iter().zip(parallel) {
        assert_eq!(x.len(), 10, "{x:?}");
        assert_eq!(y.len(), x.len(), "{y:?}");
        for (i, (u, v)) in x.iter().zip(&y).enumerate() {
            // The gradient norm (column 9) sums every parameter's squared f32 gradient, summed
            // over the workers in another order: 2.3e-5 apart on an AMD EPYC.
            let tolerance = if i == 9 { 1e-4 } else { 1e-5 };
            assert!(
                (u - v).abs() <= tolerance * u.abs().max(1.0),
                "{x:?} vs {y:?}"
            );
        }
    }
}

/// A worker that fails (an error, at once or between two exchanges, or a panic) ends the run
/// of the others within seconds, and the run's error is that worker's, not the others' report
/// that a peer left. No exchange completes without it. Before, the others waited forever in
/// the all-reduce it never joined, or summed over the workers that were left.
#[test]
fn a_failing_worker_ends_every_worker_with_its_error() {
    use burn::backend::Autodiff;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use xtoken_train::cluster::run_workers;
    use xtoken_train::Error;

    type Cpu = Autodiff<NdArray>;
    // (the failing rank, the exchanges it makes first, whether it panics)
    for (failing, before, panics) in [(1, 0, false), (2, 1, false), (0, 2, true)] {
        let (tx, rx) = std::sync::mpsc::channel();
        let exchanged = Arc::new(AtomicUsize::new(0));
        let counter = exchanged.clone();
        std::thread::spawn(move || {
            let devices = vec![Default::default(); 3];
            let result =
                run_workers::<Cpu, _, _>(devices, None, Default::default(), |worker, device| {
                    for exchange in 0..4 {
                        if worker.rank == failing && exchange == before {
                            // The others are waiting in this exchange by now.
                            std::thread::sleep(std::time::Duration::from_millis(300));
                            assert!(!panics, "the test's panic");
                            return Err(Error::Memory("the test's failure".into()));
                        }
                        let flat = Tensor::<NdArray, 1>::ones([8], &device);
                        worker.sum_flat(flat)?;
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(worker.rank)
                });
            let _ = tx.send(result.map_err(|e| e.report()));
        });
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("rank {failing} failing: the other workers hang"));
        let report = result.expect_err("a worker failed");
        assert!(report.contains(&format!("worker {failing}")), "{report}");
        let cause = if panics {
            "the test's panic"
        } else {
            "the test's failure"
        };
        assert!(report.contains(cause), "{report}");
        assert_eq!(exchanged.load(Ordering::SeqCst), 3 * before, "{report}");
    }
}

/// Gradients sent in buckets of 500 bytes (dozens of all-reduces a step: small gradients share
/// one, each large one has its own) sum to what one bucket of everything sums: the same
/// parameters and metrics, bit for bit (a sum of two workers' values does not depend on how
/// they were cut).
#[test]
fn buckets_of_any_size_sum_as_one_exchange_does() {
    let f = fixture("ddp-buckets");
    let run = |name: &str, mb: &str| {
        let extra = format!("save_dtype = \"f32\"\n\n[parallel]\nbucket_mb = {mb}");
        ok(train(&config(&f, name, &extra), &["--devices", "0,1"]));
        let dir = f.dir.0.join(name);
        (parameters(&dir.join("student")), rows(&dir))
    };
    let (whole, whole_rows) = run("one-bucket", "1000");
    let (cut, cut_rows) = run("many-buckets", "0.0005");
    assert_eq!(whole.len(), cut.len());
    let differ = whole
        .iter()
        .zip(&cut)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "parameters that differ");
    assert_eq!(whole_rows, cut_rows);
    let moved = xtoken_testkit::max_abs_diff("trained vs initial", &whole, &parameters(&f.student));
    assert!(moved > 1e-4, "{moved}");
}

/// `--check` names the exchange (none for one worker, the ring and its buckets for two CPU
/// workers); NCCL off CUDA and an unknown exchange are refused by name, by `--check` and by
/// `train` alike, before anything is written.
#[test]
fn the_check_names_the_exchange_and_refuses_nccl_off_cuda() {
    let f = fixture("ddp-exchange");
    let plan = |extra: &str, args: &[&str]| {
        let path = config(&f, "planned", extra);
        let mut all = vec!["--check"];
        all.extend_from_slice(args);
        let out = train(&path, &all);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    assert!(plan("", &[]).contains("gradient exchange: none (one worker)"));
    let two = plan("[parallel]\nbucket_mb = 4", &["--devices", "0,1"]);
    assert!(
        two.contains("gradient exchange: the ring (xtoken-collective) in buckets of 4.00 MB"),
        "{two}"
    );
    for (value, expected) in [
        (
            "\"nccl\"",
            "parallel.exchange = \"nccl\" sums buffers of NVIDIA GPUs: it needs --device cuda",
        ),
        (
            "\"mpi\"",
            "parallel.exchange = \"mpi\": expected \"auto\", \"nccl\" or \"ring\"",
        ),
    ] {
        let path = config(&f, "refused", &format!("[parallel]\nexchange = {value}"));
        for args in train_and_check(path.to_str().unwrap(), &[]) {
            let out = xtoken(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?}");
            assert!(err.contains(expected), "{args:?}: {err}");
        }
        assert!(
            !f.dir.0.join("refused").exists(),
            "a refused run wrote its directory"
        );
    }
}
