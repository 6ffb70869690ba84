//! xtoken-models' integration tests: one binary, so that the stack links once; a module per
//! concern. `on_wgpu` runs the models on burn's wgpu backend (feature `wgpu`; Mesa lavapipe on
//! the CPU in CI).

mod attention;
mod checkpoints;
mod families;
mod invariants;
#[cfg(feature = "wgpu")]
mod on_wgpu;
mod parity;
mod precision;
mod recompute;
mod scoring;
mod support;
