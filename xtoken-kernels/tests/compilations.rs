//! cubecl's kernel compilations counted on wgpu (Mesa lavapipe on the CPU): its own test binary,
//! because counting must start before any device of the process is used.
#![cfg(feature = "wgpu")]

use burn::tensor::Tensor;
use burn_wgpu::Wgpu;
use xtoken_kernels::compilations;

/// A new operation compiles kernels and is counted; the same operation again compiles none.
#[test]
fn compilations_are_counted_once_per_kernel() {
    let log = std::env::temp_dir().join(format!("xtoken-compilations-{}.log", std::process::id()));
    assert_eq!(
        compilations::count(),
        None,
        "nothing is counted before watch"
    );
    assert!(compilations::watch(&log), "watch before any device is used");
    assert!(!compilations::watch(&log), "one watch per process");
    let device = Default::default();
    let run = || {
        let x = Tensor::<Wgpu, 2>::ones([64, 96], &device);
        let y = (x.clone() * 3.0 + x).exp().sum_dim(1);
        y.into_data()
    };
    let before = compilations::count().expect("counting");
    run();
    let first = compilations::count().expect("counting");
    assert!(
        first > before,
        "the first run compiled nothing ({before} → {first})"
    );
    run();
    let second = compilations::count().expect("counting");
    assert_eq!(second, first, "the same operation compiled again");
    std::fs::remove_file(&log).ok();
}
