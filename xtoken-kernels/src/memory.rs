//! How much device memory a backend holds, for benchmarks. Host backends answer `None`: the
//! binary's counting allocator measures them instead.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;

pub trait DeviceMemory: Backend {
    /// Bytes the backend's memory pools hold on `device`. Pools grow to the largest working
    /// set and keep it, so read after a step this is the step's peak.
    fn reserved_bytes(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// Bytes of `device`'s memory free now (before a run loads its weights), where the backend
    /// can say; host backends answer `None` (the host's available memory applies).
    fn free_bytes(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// The multiple a training step pads its rows' length to. A cube backend (CUDA, wgpu)
    /// compiles, and autotunes, kernels per tensor shape, and rows change length with every
    /// micro-batch (a teacher's tokenizer splits each text its own way; packed student rows
    /// end where no chunk is cut): padded to a multiple of 128 they take a few shapes, not one
    /// per step. Host backends compile nothing and pad nothing.
    fn length_multiple() -> usize {
        1
    }
}

impl DeviceMemory for burn::backend::NdArray<f32> {}

impl DeviceMemory for burn_flex::Flex {}

impl<B: DeviceMemory, C: CheckpointStrategy> DeviceMemory for Autodiff<B, C> {
    fn reserved_bytes(device: &Self::Device) -> Option<u64> {
        B::reserved_bytes(device)
    }

    fn free_bytes(device: &Self::Device) -> Option<u64> {
        B::free_bytes(device)
    }

    fn length_multiple() -> usize {
        B::length_multiple()
    }
}

/// burn's `Wgpu` without fusion (what the alias is without burn's `fusion` feature).
#[cfg(feature = "wgpu")]
type PlainWgpu = burn_cubecl::CubeBackend<burn_wgpu::WgpuRuntime, f32, i32, u32>;

/// burn's `Cuda` without fusion.
#[cfg(feature = "cuda")]
type PlainCuda = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// wgpu reports its pools, not the adapter's free memory.
#[cfg(feature = "wgpu")]
impl DeviceMemory for PlainWgpu {
    fn reserved_bytes(device: &Self::Device) -> Option<u64> {
        use cubecl::Runtime;
        let client = burn_wgpu::WgpuRuntime::client(device);
        client.memory_usage().ok().map(|usage| usage.bytes_reserved)
    }

    fn length_multiple() -> usize {
        CUBE_LENGTH_MULTIPLE
    }
}

#[cfg(feature = "cuda")]
impl DeviceMemory for PlainCuda {
    fn reserved_bytes(device: &Self::Device) -> Option<u64> {
        use cubecl::Runtime;
        let client = cubecl::cuda::CudaRuntime::client(device);
        client.memory_usage().ok().map(|usage| usage.bytes_reserved)
    }

    fn free_bytes(device: &Self::Device) -> Option<u64> {
        crate::device::cuda_free_memory(device.index)
    }

    fn length_multiple() -> usize {
        CUBE_LENGTH_MULTIPLE
    }
}

/// Behind burn's operation fusion (the `Wgpu`/`Cuda` aliases with `fusion`) the device and its
/// pools are the inner backend's: a build with fusion serves both types.
#[cfg(feature = "fusion")]
impl<B> DeviceMemory for burn_fusion::Fusion<B>
where
    B: DeviceMemory + burn_fusion::FusionBackend,
    burn_fusion::Fusion<B>: Backend<Device = B::Device>,
{
    fn reserved_bytes(device: &Self::Device) -> Option<u64> {
        B::reserved_bytes(device)
    }

    fn free_bytes(device: &Self::Device) -> Option<u64> {
        B::free_bytes(device)
    }

    fn length_multiple() -> usize {
        B::length_multiple()
    }
}

/// A cube backend's training rows are padded to this multiple (see
/// [`DeviceMemory::length_multiple`]); defined in every build, so that a memory estimate made
/// on a machine without the GPU backends pads as the GPU will.
pub const CUBE_LENGTH_MULTIPLE: usize = 128;
