//! The backends a run trains on, and the dispatch from a device name to one of them: `cpu` and
//! `flex` (burn-flex: `auto` dtypes f32 and bf16), `ndarray` (burn's ndarray), `cuda` and
//! `wgpu` (burn's `CubeBackend`, with the cubecl kernels; cargo features `cuda` and `wgpu`).

use burn::tensor::backend::AutodiffBackend;
use xtoken_core::loss::XTokenBackend;
use xtoken_kernels::memory::DeviceMemory;

use crate::config::{DeviceKind, DtypeChoice};
use crate::error::{Error, Result};
use xtoken_kernels::nccl::NcclBackend;

/// What training needs of a backend: autodiff for the student, the X-Token kernels both there
/// and on the inner backend the teachers run on, and the inner backend's answer to NCCL (CUDA
/// sums its gradients there; the others say they cannot).
pub trait TrainBackend:
    AutodiffBackend<InnerBackend: XTokenBackend + NcclBackend> + XTokenBackend + DeviceMemory
{
}

impl<B> TrainBackend for B
where
    B: AutodiffBackend + XTokenBackend + DeviceMemory,
    B::InnerBackend: XTokenBackend + NcclBackend,
{
}

/// Work generic over the training backend, which [`on_backend`] picks by name.
pub trait OnBackend {
    /// What the work returns.
    type Output;
    /// Runs on backend `B` with one device per data-parallel worker (at least one).
    fn run<B: TrainBackend + DeviceMemory>(self, devices: Vec<B::Device>) -> Result<Self::Output>;
}

/// Runs `work` on the backend of `kind`, with the devices `indices` names (none: the default
/// device). A backend this build lacks is an error naming the cargo feature.
pub fn on_backend<W: OnBackend>(kind: DeviceKind, indices: &[usize], work: W) -> Result<W::Output> {
    let one_each = |n: usize| n.max(1);
    match kind {
        DeviceKind::Ndarray => work.run::<burn::backend::Autodiff<burn::backend::NdArray>>(
            (0..one_each(indices.len()))
                .map(|_| Default::default())
                .collect(),
        ),
        DeviceKind::Cpu | DeviceKind::Flex => work.run::<burn::backend::Autodiff<burn_flex::Flex>>(
            (0..one_each(indices.len()))
                .map(|_| Default::default())
                .collect(),
        ),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            let indices = if indices.is_empty() {
                &[0][..]
            } else {
                indices
            };
            let devices: Vec<_> = indices
                .iter()
                .map(|&i| burn::backend::cuda::CudaDevice::new(i))
                .collect();
            start::<burn::backend::Cuda>(kind, &devices)?;
            work.run::<burn::backend::Autodiff<burn::backend::Cuda>>(devices)
        }
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => {
            let devices = match indices {
                [] | [_] => vec![Default::default()],
                many => many
                    .iter()
                    .map(|&i| burn::backend::wgpu::WgpuDevice::DiscreteGpu(i))
                    .collect(),
            };
            start::<burn::backend::Wgpu>(kind, &devices)?;
            work.run::<burn::backend::Autodiff<burn::backend::Wgpu>>(devices)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(missing("cuda")),
        #[cfg(not(feature = "wgpu"))]
        DeviceKind::Wgpu => Err(missing("wgpu")),
    }
}

/// Whether this build has the backend `kind` (and, for CUDA, a driver): the error `train`
/// would meet when it starts the device, named without starting it.
pub fn check_available(kind: DeviceKind) -> Result<()> {
    match kind {
        DeviceKind::Cpu | DeviceKind::Flex | DeviceKind::Ndarray => Ok(()),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => match xtoken_kernels::device::missing_cuda_driver() {
            Some(missing) => Err(Error::Config(format!("device = \"cuda\": {missing}"))),
            None => Ok(()),
        },
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => Ok(()),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(missing("cuda")),
        #[cfg(not(feature = "wgpu"))]
        DeviceKind::Wgpu => Err(missing("wgpu")),
    }
}

/// Refuses a run of `config` on the device family `kind` whose backend this build or machine
/// lacks, or whose dtypes that backend cannot hold or should not compute in: the one check
/// `train` makes before it writes anything and `train --check` makes the same way. Every
/// failure is listed.
pub fn check_device(config: &crate::RunConfig, kind: DeviceKind) -> Result<()> {
    let mut failures = crate::error::Failures::default();
    failures.note(check_available(kind));
    failures.note(check_dtype(kind, config.student_dtype(), "student.dtype"));
    let compute = "training.compute_dtype";
    failures.note(check_dtype(kind, config.compute_dtype(), compute));
    failures.note(check_compute_on_cpu(kind, config.compute_dtype()));
    if let Ok(settings) = config.teacher_settings() {
        for (i, s) in settings.iter().enumerate() {
            let key = format!("teachers[{i}].dtype");
            failures.note(check_dtype(kind, Ok(s.dtype), &key));
        }
    }
    failures.or_value(())
}

/// Whether tensors of `choice` (the value of the configuration key `key`: parameters or the
/// compute dtype) can live on the backend `kind`: burn's ndarray holds f32 only, wgpu f32 and
/// f16, CUDA and burn-flex (`cpu`, `flex`) also bf16. `auto` picks what the backend has.
pub fn check_dtype(kind: DeviceKind, choice: Result<DtypeChoice>, key: &str) -> Result<()> {
    let supported: &[DtypeChoice] = match kind {
        DeviceKind::Ndarray => &[DtypeChoice::F32],
        DeviceKind::Wgpu => &[DtypeChoice::F32, DtypeChoice::F16],
        DeviceKind::Cuda | DeviceKind::Flex | DeviceKind::Cpu => {
            &[DtypeChoice::F32, DtypeChoice::F16, DtypeChoice::Bf16]
        }
    };
    match choice? {
        DtypeChoice::Auto => Ok(()),
        c if supported.contains(&c) => Ok(()),
        c => {
            let name = |c: &DtypeChoice| format!("{c:?}").to_lowercase();
            let names: Vec<String> = supported.iter().map(name).collect();
            let (dtype, backend) = (name(&c), format!("{kind:?}").to_lowercase());
            Err(Error::Config(format!(
                "{key} = \"{dtype}\": the {backend} backend has no {dtype} tensors (it has {}); \
                 use \"auto\" or one of those",
                names.join(", ")
            )))
        }
    }
}

/// Refuses 16-bit compute on `device = "cpu"`: burn-flex runs a bf16 or f16 operation by
/// converting its inputs to f32 and its result back, so a training step takes about 1.8× the
/// time of an f32 one there (BENCHMARKS.md) and saves only activation memory. `device = "flex"`
/// keeps 16-bit compute on the CPU for checking its numerics.
pub fn check_compute_on_cpu(kind: DeviceKind, choice: Result<DtypeChoice>) -> Result<()> {
    // A value that does not parse is `check_dtype`'s to name.
    let Ok(choice) = choice else { return Ok(()) };
    match (kind, choice) {
        (DeviceKind::Cpu, c @ (DtypeChoice::Bf16 | DtypeChoice::F16)) => {
            let dtype = format!("{c:?}").to_lowercase();
            Err(Error::Config(format!(
                "training.compute_dtype = \"{dtype}\" on device = \"cpu\": the CPU backend \
                 converts {dtype} values to f32 around each operation, so a step takes about 1.8× \
                 as long as in f32 and saves only activation memory; use \"f32\" or \"auto\" \
                 (f32 here), or device = \"flex\" to run {dtype} compute on the CPU to check its \
                 numerics"
            )))
        }
        _ => Ok(()),
    }
}

/// Starts each of `devices` of backend `B` (the backend `kind` names) on this thread, before any
/// worker or benchmark touches one: a backend this build lacks, a missing driver, or a device
/// whose initialization panics (no adapter, no such device) becomes an error naming it, never a
/// panic. Before a device backend starts, cubecl is configured with the kernel cache of
/// `XTOKEN_KERNEL_CACHE` (unless a profile did so already, with its compilation log).
pub fn start<B: burn::tensor::backend::Backend>(
    kind: DeviceKind,
    devices: &[B::Device],
) -> Result<()> {
    use xtoken_kernels::compilations::{configure, KernelCache};
    check_available(kind)?;
    if kind.on_host() {
        return Ok(());
    }
    configure(&KernelCache::from_env(), None);
    let name = format!("{kind:?}").to_lowercase();
    for device in devices {
        xtoken_kernels::device::probe::<B>(device).map_err(|why| {
            Error::Config(format!(
                "device = \"{name}\": {device:?} could not be started: {why}"
            ))
        })?;
    }
    Ok(())
}

#[cfg(not(all(feature = "cuda", feature = "wgpu")))]
fn missing(feature: &str) -> Error {
    Error::Config(format!(
        "device = \"{feature}\": this xtoken was built without it; rebuild with `--features {feature}`"
    ))
}
