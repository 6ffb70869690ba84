//! The kernels on the plain `CubeBackend<WgpuRuntime>`, which the X-Token kernels extend.

/// burn's `Wgpu` without fusion, named so that the `fusion` feature does not change it.
pub type Wgpu<F = f32> = burn_wgpu::CubeBackend<burn_wgpu::WgpuRuntime, F, i32, u32>;

mod compilations;
mod cube;
mod wgpu;
mod wgpu_attention;

#[test]
fn this_module_tests_the_plain_backend() {
    assert!(!std::any::type_name::<Wgpu>().contains("Fusion"));
}
