//! A cubecl runtime that compiles every launch to CUDA C++ and keeps the source instead of
//! running it: cubecl-cuda's compiler and device properties, host memory, no driver.
//!
//! Its device is a CUDA architecture (`RecordDevice { arch: 90 }` for the H100/H200, `80` for
//! the A100): the device properties are those cubecl-cuda registers for that architecture, so
//! that a kernel's definition takes the same branches as on the GPU, and the compilation options
//! are the ones cubecl-cuda passes to its compiler. Buffers are host memory, so uploads and reads work; a launch compiles its kernel once per
//! `KernelId` and records it, and writes nothing: every value a kernel would compute reads as
//! zero (or as whatever was uploaded).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use cubecl::client::ComputeClient;
use cubecl::device::{DeviceId, ServerUtilitiesHandle};
use cubecl::future::DynFut;
use cubecl::ir::features::{AtomicUsage, Plane, Tma, TypeUsage};
use cubecl::ir::{
    BarrierLevel, ContiguousElements, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MatrixLayout, MemoryDeviceProperties, MmaProperties, OpaqueType, SemanticType, StorageType,
    TargetProperties, Type, VectorSize,
};
use cubecl::prelude::CubeCount;
use cubecl::profile::{ProfileDuration, TimingMethod};
use cubecl::server::{
    Binding, ComputeServer, CopyDescriptor, IoError, KernelArguments, ProfileError, ProfilingToken,
    ServerCommunication, ServerError, ServerUtilities,
};
use cubecl::stream_id::StreamId;
use cubecl::zspace::striding::has_contiguous_row_major_strides;
use cubecl::zspace::{Shape, Strides};
use cubecl::{bytes::Bytes, ExecutionMode, MemoryConfiguration, MemoryUsage, Runtime};
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::{contiguous_elements_cuda, CudaWmmaCompiler};
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::shared::{
    register_mma_features, register_scaled_mma_features, register_wmma_features,
    CompilationOptions, CppSupportedFeatures,
};
use cubecl_cpp::{register_supported_types, DialectWmmaCompiler};
use cubecl_runtime::allocator::ContiguousMemoryLayoutPolicy;
use cubecl_runtime::compiler::CubeTask;
use cubecl_runtime::id::KernelId;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryManagement, MemoryManagementOptions,
};
use cubecl_runtime::storage::{
    ComputeStorage, ManagedResource, StorageHandle, StorageId, StorageUtilization,
};
use cubecl_runtime::timestamp_profiler::TimestampProfiler;

use super::Recorded;

/// The compiler cubecl-cuda compiles with (CUDA C++ for NVRTC).
pub type CudaCompiler = cubecl::cuda::CudaCompiler;

/// What the recording devices compiled, in the order of first launch.
static RECORDED: Mutex<Vec<Recorded>> = Mutex::new(Vec::new());

/// What the kernels launched now are for (set by the workload between synchronized steps).
static CONTEXT: Mutex<String> = Mutex::new(String::new());

/// Labels the kernels compiled from now on (the caller synchronizes the device before, so that
/// earlier launches keep their label).
pub(super) fn set_context(what: &str) {
    *CONTEXT.lock().unwrap_or_else(|p| p.into_inner()) = what.to_string();
}

/// Every kernel compiled for architecture `arch` so far in the process (a device compiles a
/// kernel once: a second run of the same workload adds nothing).
pub(super) fn recorded(arch: u32) -> Vec<Recorded> {
    let all = RECORDED.lock().unwrap_or_else(|p| p.into_inner());
    all.iter().filter(|r| r.arch == arch).cloned().collect()
}

/// The runtime: cubecl-cuda's compiler on a recording server.
#[derive(Debug, Clone)]
pub struct RecordRuntime;

/// A recording device: one CUDA architecture (`90`: sm_90, H100/H200; `80`: sm_80, A100).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordDevice {
    /// Compute capability × 10.
    pub arch: u16,
}

impl Default for RecordDevice {
    fn default() -> Self {
        Self { arch: 90 }
    }
}

impl cubecl::device::Device for RecordDevice {
    fn from_id(device_id: DeviceId) -> Self {
        Self {
            arch: device_id.index_id,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: 0,
            index_id: self.arch,
        }
    }
}

impl burn::tensor::backend::DeviceOps for RecordDevice {}

/// Host memory: one zeroed vector per allocation.
#[derive(Debug, Default)]
pub struct HostStorage {
    buffers: HashMap<StorageId, Arc<Mutex<Vec<u8>>>>,
}

/// A slice of one allocation.
#[derive(Debug)]
pub struct HostResource {
    buffer: Arc<Mutex<Vec<u8>>>,
    offset: usize,
    size: usize,
}

impl HostResource {
    fn read(&self) -> Vec<u8> {
        let buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        buffer[self.offset..self.offset + self.size].to_vec()
    }

    fn zero(&self) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        buffer[self.offset..self.offset + self.size].fill(0);
    }

    fn write(&self, data: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        let n = data.len().min(self.size);
        buffer[self.offset..self.offset + n].copy_from_slice(&data[..n]);
    }
}

impl ComputeStorage for HostStorage {
    type Resource = HostResource;

    fn alignment(&self) -> usize {
        4
    }

    fn get(&mut self, handle: &StorageHandle) -> HostResource {
        HostResource {
            buffer: self.buffers[&handle.id].clone(),
            offset: handle.offset() as usize,
            size: handle.size() as usize,
        }
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        let buffer = Arc::new(Mutex::new(vec![0u8; size as usize]));
        self.buffers.insert(id, buffer);
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        self.buffers.remove(&id);
    }

    fn flush(&mut self) {}
}

/// The server: host memory, and the compiled kernels by id.
#[derive(Debug)]
pub struct RecordServer {
    arch: u32,
    memory: MemoryManagement<HostStorage>,
    utilities: Arc<ServerUtilities<RecordServer>>,
    options: CompilationOptions,
    compiled: HashSet<KernelId>,
    timestamps: TimestampProfiler,
}

/// The hardware an architecture's flagship has, as the driver reports it (per block: the
/// opt-in shared memory cubecl-cuda reads).
fn hardware(arch: u32) -> HardwareProperties {
    let (max_shared_memory_size, sms) = match arch {
        90.. => (227 * 1024, 132),
        80..=89 => (163 * 1024, 108),
        _ => (48 * 1024, 80),
    };
    HardwareProperties {
        load_width: 128,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: cubecl::cuda::CUDA_MAX_BINDINGS,
        max_shared_memory_size,
        max_cube_count: (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(sms),
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: Some(8),
        num_cpu_cores: None,
        max_vector_size: VectorSize::MAX,
    }
}

/// The device properties and compilation options cubecl-cuda 0.10 registers for `arch`
/// (its `DeviceService::init`, for the architectures from 80 on).
fn properties(arch: u32) -> (DeviceProperties, CompilationOptions) {
    let memory = MemoryDeviceProperties {
        max_page_size: 1 << 30,
        alignment: 512,
    };
    let mut props = DeviceProperties::new(
        Default::default(),
        memory,
        hardware(arch),
        TimingMethod::System,
    );
    let mut options = CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            fast_math: true,
            grid_constants: true,
            fast_tanh: cudarc::driver::sys::CUDA_VERSION >= 12080,
            ..Default::default()
        },
    };
    register_supported_types(&mut props);
    props.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);
    let atomic =
        |kind, size| Type::new(StorageType::Atomic(ElemType::Float(kind))).with_vector_size(size);
    props.register_atomic_type_usage(
        atomic(FloatKind::F64, 1),
        AtomicUsage::Add | AtomicUsage::LoadStore,
    );
    props.register_atomic_type_usage(
        atomic(FloatKind::F16, 1),
        AtomicUsage::Add | AtomicUsage::LoadStore,
    );
    props.register_atomic_type_usage(
        atomic(FloatKind::F16, 2),
        AtomicUsage::Add | AtomicUsage::LoadStore,
    );
    props.register_semantic_type(SemanticType::Pipeline);
    props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
    props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
    props.features.plane.insert(Plane::Sync);
    for kind in [FloatKind::F16, FloatKind::BF16] {
        props
            .features
            .matmul
            .ldmatrix
            .insert(ElemType::Float(kind).into());
    }
    props.features.copy_async = true;
    if arch >= 89 {
        for kind in [FloatKind::E4M3, FloatKind::E5M2] {
            props.register_type_usage(
                ElemType::Float(kind),
                TypeUsage::Conversion | TypeUsage::Buffer,
            );
        }
    }
    if arch >= 90 {
        props.features.tma.insert(Tma::Base);
        props.register_semantic_type(SemanticType::TensorMap);
        props.features.cube_cluster = true;
        options.supports_features.clusters = true;
        options.supports_features.elect_sync = true;
        for kind in [FloatKind::F16, FloatKind::BF16] {
            props
                .features
                .matmul
                .stmatrix
                .insert(ElemType::Float(kind).into());
        }
        for size in [2, 4] {
            props.register_atomic_type_usage(
                atomic(FloatKind::F32, size),
                AtomicUsage::LoadStore | AtomicUsage::Add,
            );
        }
    }
    props.features.memory_reinterpret = true;
    props.features.alignment = true;
    props.features.plane.insert(Plane::Ops);
    props.features.plane.insert(Plane::NonUniformControlFlow);
    let cuda = CudaArchitecture { version: arch };
    type Wmma = CudaWmmaCompiler;
    type D = CudaDialect<Wmma>;
    register_wmma_features(
        <Wmma as DialectWmmaCompiler<D>>::supported_wmma_combinations(&cuda),
        &mut props,
    );
    register_mma_features(
        <Wmma as DialectWmmaCompiler<D>>::supported_mma_combinations(&cuda),
        &mut props,
    );
    register_scaled_mma_features(
        <Wmma as DialectWmmaCompiler<D>>::supported_scaled_mma_combinations(&cuda),
        &mut props,
    );
    (props, options)
}

impl cubecl::device::DeviceService for RecordServer {
    fn init(device_id: DeviceId) -> Self {
        let arch = u32::from(device_id.index_id);
        let (props, options) = properties(arch);
        let logger = Arc::new(ServerLogger::default());
        let memory = MemoryManagement::from_configuration(
            HostStorage::default(),
            &props.memory,
            MemoryConfiguration::ExclusivePages,
            logger.clone(),
            MemoryManagementOptions::new("recording"),
        );
        let policy = ContiguousMemoryLayoutPolicy::new(props.memory.alignment as usize);
        let utilities = ServerUtilities::new(props, logger, (), policy);
        Self {
            arch,
            memory,
            utilities: Arc::new(utilities),
            options,
            compiled: HashSet::new(),
            timestamps: TimestampProfiler::default(),
        }
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        self.utilities.clone() as ServerUtilitiesHandle
    }
}

impl RecordServer {
    /// Compiles `kernel` as cubecl-cuda would and records it, once per kernel id.
    fn record(&mut self, kernel: &dyn CubeTask<CudaCompiler>, mode: ExecutionMode) {
        let id = kernel.id();
        if !self.compiled.insert(id.clone()) {
            return;
        }
        let name = kernel.name().to_string();
        let context = CONTEXT.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let compiled = kernel.compile(
            &mut Default::default(),
            &self.options,
            mode,
            kernel.address_type(),
        );
        let recorded = match compiled {
            Ok(k) => Recorded {
                arch: self.arch,
                name,
                context,
                entrypoint: k.entrypoint_name,
                cube_dim: (k.cube_dim.x, k.cube_dim.y, k.cube_dim.z),
                shared_bytes: k.repr.as_ref().map_or(0, |r| r.shared_memory_size()),
                source: Ok(k.source),
            },
            Err(e) => Recorded {
                arch: self.arch,
                name,
                context,
                entrypoint: String::new(),
                cube_dim: (0, 0, 0),
                shared_bytes: 0,
                source: Err(format!("{e}")),
            },
        };
        RECORDED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(recorded);
    }

    fn bytes_of(&mut self, desc: &CopyDescriptor) -> Result<Vec<u8>, IoError> {
        let b = &desc.handle;
        let resource = self
            .memory
            .get_resource(b.memory.clone(), b.offset_start, b.offset_end)?;
        let mut bytes = resource.read();
        bytes.truncate(b.size_in_used() as usize);
        Ok(bytes)
    }
}

impl ComputeServer for RecordServer {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Info = ();
    type MemoryLayoutPolicy = ContiguousMemoryLayoutPolicy;
    type Storage = HostStorage;

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, size: u64, _: StreamId) {
        let reserved = self
            .memory
            .reserve(size)
            .expect("host memory for a recorded buffer");
        self.memory
            .bind(reserved, memory.clone(), 0)
            .expect("a freshly reserved buffer binds");
        // A reused slice holds an earlier buffer's bytes: what no kernel writes reads as zero.
        self.memory
            .get_resource(memory.binding(), None, None)
            .expect("a bound buffer")
            .zero();
    }

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        _: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let read: Result<Vec<Bytes>, ServerError> = descriptors
            .iter()
            .map(|d| Ok(Bytes::from_bytes_vec(self.bytes_of(d)?)))
            .collect();
        Box::pin(async move { read })
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, _: StreamId) {
        for (desc, data) in descriptors {
            let b = &desc.handle;
            let resource = self
                .memory
                .get_resource(b.memory.clone(), b.offset_start, b.offset_end)
                .expect("a written buffer exists");
            resource.write(&data);
        }
    }

    fn sync(&mut self, _: StreamId) -> DynFut<Result<(), ServerError>> {
        Box::pin(async { Ok(()) })
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        _: StreamId,
    ) -> Result<ManagedResource<<Self::Storage as ComputeStorage>::Resource>, ServerError> {
        let memory = binding.memory.clone();
        let resource =
            self.memory
                .get_resource(binding.memory, binding.offset_start, binding.offset_end)?;
        Ok(ManagedResource::new(memory, resource))
    }

    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        _: CubeCount,
        _: KernelArguments,
        mode: ExecutionMode,
        _: StreamId,
    ) {
        self.record(kernel.as_ref(), mode);
    }

    fn flush(&mut self, _: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn memory_usage(&mut self, _: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(self.memory.memory_usage())
    }

    fn memory_cleanup(&mut self, _: StreamId) {
        self.memory.cleanup(true);
    }

    fn start_profile(&mut self, _: StreamId) -> Result<ProfilingToken, ServerError> {
        Ok(self.timestamps.start())
    }

    fn end_profile(
        &mut self,
        _: StreamId,
        token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        self.timestamps.stop(token)
    }

    fn allocation_mode(&mut self, mode: MemoryAllocationMode, _: StreamId) {
        self.memory.mode(mode);
    }
}

impl ServerCommunication for RecordServer {
    const SERVER_COMM_ENABLED: bool = false;
}

impl Runtime for RecordRuntime {
    type Compiler = CudaCompiler;
    type Server = RecordServer;
    type Device = RecordDevice;

    fn client(device: &Self::Device) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }

    fn name(_: &ComputeClient<Self>) -> &'static str {
        "cuda-record"
    }

    fn require_array_lengths() -> bool {
        true
    }

    fn max_cube_count() -> (u32, u32, u32) {
        (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32)
    }

    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        has_contiguous_row_major_strides(shape, strides)
    }

    fn target_properties() -> TargetProperties {
        TargetProperties {
            mma: MmaProperties {
                register_size_bits: 32,
                const_plane_size: 32,
                register_layout_a: MatrixLayout::RowMajor,
                register_layout_b: MatrixLayout::ColMajor,
                register_layout_acc: MatrixLayout::RowMajor,
                register_duplication_a: 1,
                register_duplication_b: 1,
                register_duplication_acc: 1,
                contiguous_elements: ContiguousElements::new(contiguous_elements_cuda),
            },
        }
    }

    fn enumerate_devices(_: u16, _: &()) -> Vec<DeviceId> {
        [90, 80]
            .map(|arch| DeviceId {
                type_id: 0,
                index_id: arch,
            })
            .to_vec()
    }
}
