//! burn's CUDA backend where no NVIDIA driver is installed (CI builds `cuda` on such a machine):
//! the missing driver library is named before anything touches the device, and starting a device
//! is an error, not a panic. `xtoken train --device cuda` reports that name and stops.

use xtoken_kernels::device::{missing_cuda_driver, probe};

#[test]
fn cuda_without_a_driver_is_named_and_starting_it_is_an_error() {
    let Some(missing) = missing_cuda_driver() else {
        // The driver is present: there is no missing driver to name.
        return;
    };
    assert!(
        missing.contains("the CUDA driver library") && missing.contains("libcuda.so"),
        "{missing}"
    );
    // The plain backend, and burn's `Cuda` (behind operation fusion with the feature `fusion`).
    type Plain = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    let plain = probe::<Plain>(&Default::default());
    assert!(plain.is_err(), "a CUDA device started without a driver");
    assert!(probe::<burn_cuda::Cuda>(&Default::default()).is_err());
}
