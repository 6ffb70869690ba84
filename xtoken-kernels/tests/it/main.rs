//! xtoken-kernels' integration tests: one binary, so that the stack links once; a module per
//! concern. The cubecl kernels run on burn's wgpu backend (feature `wgpu`; Mesa lavapipe on the
//! CPU in CI): as the plain `CubeBackend` in `on_wgpu`, and behind burn's operation fusion in
//! `on_wgpu_fusion` (feature `fusion`), in the same build. `on_cuda` (feature `cuda`) runs
//! where no NVIDIA driver is, and `cuda_sources` writes every kernel's CUDA source without one.

mod adamw;
mod attention;
mod blocks;
mod embedding;
mod portable;
mod support;

#[cfg(feature = "cuda")]
mod cuda_sources;
#[cfg(feature = "cuda")]
mod on_cuda;
#[cfg(feature = "wgpu")]
mod on_wgpu;
#[cfg(all(feature = "wgpu", feature = "fusion"))]
mod on_wgpu_fusion;
