//! Device operations of X-Token behind one burn backend extension: cubecl kernels for CUDA and
//! wgpu, and a portable tensor-op fallback for every other burn backend.
//!
//! The sparse projection, chunk merge and fused softmax–KL kernels land here (issue 6). The
//! `cuda` and `wgpu` features already pull in the pinned burn 0.21.0 backends, so the pins are
//! checked by `cargo check --features cuda` long before the kernels exist.
