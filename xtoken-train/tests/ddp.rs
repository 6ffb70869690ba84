//! Data-parallel training through burn-collective, two workers on CPU (feature `collective`).
#![cfg(feature = "collective")]

mod fixture;

use burn::backend::NdArray;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use fixture::*;
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

#[test]
fn two_workers_match_one_worker_on_the_combined_batch() {
    let f = fixture("ddp");
    let setup = |name: &str| {
        let path = config(&f, name, "save_dtype = \"f32\"");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("micro_batch = 2", "micro_batch = 1")
            .replace("steps = 6", "steps = 4")
            .replace("warmup = 0.2", "warmup = 0.2\nlr = 1e-3");
        std::fs::write(&path, text).unwrap();
        path
    };
    let single = setup("single");
    ok(train(&single, &[]));
    let parallel = setup("parallel");
    let log = ok(train(&parallel, &["--devices", "0,1"]));
    assert!(log.contains("ended with identical parameters"), "{log}");

    let a = parameters(&f.dir.0.join("single/student"));
    let b = parameters(&f.dir.0.join("parallel/student"));
    assert_eq!(a.len(), b.len());
    let worst = xtoken_testkit::max_abs_diff("single vs parallel parameters", &a, &b);
    assert!(worst < 1e-5, "largest difference {worst}");
    // The weights moved: the comparison is not between two untouched models.
    let start = parameters(&f.student);
    let moved = xtoken_testkit::max_abs_diff("trained vs initial parameters", &a, &start);
    assert!(moved > 1e-4, "{moved}");

    // Both wrote the same metrics (the parallel run's averaged over its workers).
    let rows = |name: &str| -> Vec<Vec<f64>> {
        std::fs::read_to_string(f.dir.0.join(name).join("metrics.csv"))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split(',').take(9).map(|v| v.parse().unwrap()).collect())
            .collect()
    };
    let (single_rows, parallel_rows) = (rows("single"), rows("parallel"));
    assert_eq!(single_rows.len(), 4, "one metrics row per step");
    assert_eq!(parallel_rows.len(), single_rows.len());
    for (x, y) in single_rows.iter().zip(parallel_rows) {
        assert_eq!(x.len(), 9, "{x:?}");
        assert_eq!(y.len(), x.len(), "{y:?}");
        for (u, v) in x.iter().zip(&y) {
            assert!((u - v).abs() <= 1e-5 * u.abs().max(1.0), "{x:?} vs {y:?}");
        }
    }
}
