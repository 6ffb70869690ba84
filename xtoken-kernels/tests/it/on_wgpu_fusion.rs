//! The tests of `on_wgpu` but compilations', behind burn's operation fusion:
//! `Fusion<CubeBackend>`, burn's default for wgpu and CUDA, which delegates the X-Token kernels.

/// burn's `Wgpu` with fusion.
pub type Wgpu<F = f32> =
    burn_fusion::Fusion<burn_wgpu::CubeBackend<burn_wgpu::WgpuRuntime, F, i32, u32>>;

// The same files as `on_wgpu`'s, compiled a second time over this module's `Wgpu`.
#[allow(clippy::duplicate_mod)]
#[path = "on_wgpu/cube.rs"]
mod cube;
#[allow(clippy::duplicate_mod)]
#[path = "on_wgpu/wgpu.rs"]
mod wgpu;
#[allow(clippy::duplicate_mod)]
#[path = "on_wgpu/wgpu_attention.rs"]
mod wgpu_attention;

#[test]
fn the_fusion_build_tests_the_fused_backend() {
    assert!(std::any::type_name::<Wgpu>().contains("Fusion"));
}
