//! cubecl's kernel compilations counted on wgpu (Mesa lavapipe on the CPU): its own test binary,
//! because counting must start before any device of the process is used; a kernel launched over
//! lengths the data decides compiles once.
#![cfg(feature = "wgpu")]

use burn::tensor::{Tensor, TensorPrimitive};
use burn_wgpu::Wgpu;
use xtoken_kernels::adamw::{AdamWStep, Moments};
use xtoken_kernels::{compilations, XTokenBackend};

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
    element_wise_kernels_compile_once_for_any_length(&device);
    std::fs::remove_file(&log).ok();
}

/// An element-wise kernel launched over lengths the data decides (here the fused AdamW) compiles
/// once: its cube size does not follow the length.
fn element_wise_kernels_compile_once_for_any_length(device: &burn_wgpu::WgpuDevice) {
    let step = AdamWStep {
        lr: 1e-3,
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 1e-8,
        weight_decay: 0.0,
        time: 2,
        grad_scale: 1.0,
    };
    // burn's own fill kernel sizes its cubes by the length: the inputs are made first.
    let inputs: Vec<_> = [3, 1, 17, 100, 257, 1000, 5000]
        .into_iter()
        .map(|n| {
            let t = Tensor::<Wgpu, 1>::ones([n], device);
            t.to_data();
            t
        })
        .collect();
    let update = |t: &Tensor<Wgpu, 1>| {
        let t = || t.clone().into_primitive().tensor();
        let moments = Moments::<Wgpu> {
            first: t(),
            second: t(),
        };
        let done = Wgpu::xt_adamw(t(), t(), Some(moments), &step);
        Tensor::<Wgpu, 1>::from_primitive(TensorPrimitive::Float(done.param)).into_data();
    };
    update(&inputs[0]);
    let first = compilations::count().expect("counting");
    for t in &inputs[1..] {
        update(t);
    }
    assert_eq!(
        compilations::count().expect("counting"),
        first,
        "the update compiled again for a new length"
    );
}
