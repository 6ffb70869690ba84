//! cubecl's kernel compilations counted and cached on wgpu (Mesa lavapipe on the CPU): the only
//! test of a process of its own, because cubecl's configuration must be written before any
//! device of the process is used and the count is the process's; a kernel launched over
//! lengths the data decides compiles once; the autotune results land in the kernel cache's
//! directory.
#![cfg(feature = "wgpu")]

use super::Wgpu;
use burn::tensor::{Tensor, TensorPrimitive};
use xtoken_kernels::adamw::{AdamWStep, Moments};
use xtoken_kernels::compilations::{self, Configured, KernelCache};
use xtoken_kernels::XTokenBackend;

/// A new operation compiles kernels and is counted; the same operation again compiles none.
#[test]
fn compilations_are_counted_once_per_kernel() {
    xtoken_testkit::process::alone(
        module_path!(),
        "compilations_are_counted_once_per_kernel",
        counted_once_per_kernel,
    );
}

fn counted_once_per_kernel() {
    let log = std::env::temp_dir().join(format!("xtoken-compilations-{}.log", std::process::id()));
    assert_eq!(
        compilations::count(),
        None,
        "nothing is counted before watch"
    );
    let cache = std::env::temp_dir().join(format!("xtoken-kernels-{}", std::process::id()));
    let configured = compilations::configure(&KernelCache::Dir(cache.clone()), Some(&log));
    let both = Configured {
        cache: true,
        counting: true,
    };
    assert_eq!(configured, both, "configured before any device is used");
    assert_eq!(
        compilations::configure(&KernelCache::Dir(cache.clone()), Some(&log)),
        Configured::default(),
        "one configuration per process"
    );
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
    autotune_results_are_kept_in_the_cache(&device, &cache);
    std::fs::remove_file(&log).ok();
    std::fs::remove_dir_all(&cache).ok();
}

/// A matmul is autotuned; its result is written under the kernel cache's directory.
fn autotune_results_are_kept_in_the_cache(device: &burn_wgpu::WgpuDevice, cache: &std::path::Path) {
    let a = Tensor::<Wgpu, 2>::ones([64, 48], device);
    let b = Tensor::<Wgpu, 2>::ones([48, 32], device);
    a.matmul(b).into_data();
    let mut files = Vec::new();
    let mut dirs = vec![cache.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)
            .expect("the cache directory")
            .flatten()
        {
            let path = entry.path();
            match path.is_dir() {
                true => dirs.push(path),
                false => files.push(path),
            }
        }
    }
    assert!(
        files.iter().any(|f| f.to_string_lossy().contains("matmul")),
        "no matmul autotune result in {}: {files:?}",
        cache.display()
    );
}

/// An element-wise kernel launched over lengths the data decides (here the fused AdamW) compiles
/// once: its cube size does not follow the length, and the first update (no moments yet) is the
/// same kernel as the later ones.
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
    let fresh = <Wgpu as XTokenBackend>::xt_adamw(
        inputs[2].clone().into_primitive().tensor(),
        inputs[2].clone().into_primitive().tensor(),
        None,
        &step,
    );
    Tensor::<Wgpu, 1>::from_primitive(TensorPrimitive::Float(fresh.param)).into_data();
    assert_eq!(
        compilations::count().expect("counting"),
        first,
        "the update compiled again for a new length"
    );
}
