//! NCCL between processes: the library found where NCCL's users keep it, a unique id made on one
//! process and carried to the others by the caller (a communicator joins ranks of any process
//! that hold the same id), and a communicator per GPU that sums device buffers on a stream of
//! its own, polled for NCCL's asynchronous errors while it is awaited, so that a failed peer
//! ends the wait with an error instead of a hang.
//!
//! `libnccl.so.2` is loaded at run time (nothing of CUDA is needed to build, nor to make a
//! unique id); the functions are NCCL 2's stable C interface. Creating a communicator needs a
//! CUDA device, and this build's CUDA backend (feature `cuda`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// What went wrong with NCCL, naming the library, the call or the device.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NcclError {
    /// No `libnccl.so.2` where NCCL's users keep it.
    #[error(
        "NCCL (libnccl.so.2) was not found; looked in: {}. Install it (`pip install \
         nvidia-nccl-cu12`, the libnccl2 package, or NVIDIA's archive) and name it with \
         XTOKEN_NCCL=FILE-OR-DIR or NCCL_HOME, or put its directory on LD_LIBRARY_PATH",
        looked.join("; ")
    )]
    NotFound {
        /// Each place tried, with why it failed.
        looked: Vec<String>,
    },
    /// An NCCL or CUDA call failed.
    #[error("{call} on {device}: {message}")]
    Call {
        /// The call.
        call: &'static str,
        /// The device (`cuda:N`, rank r of w) or `host`.
        device: String,
        /// NCCL's words for the failure.
        message: String,
    },
    /// The wait for an all-reduce was ended from outside (another rank failed).
    #[error("NCCL all-reduce on {device} ended: {why}")]
    Stopped {
        /// The device.
        device: String,
        /// Why.
        why: String,
    },
    /// The backend holds no CUDA buffers.
    #[error("NCCL sums CUDA buffers: the {0} backend has none (use the ring exchange)")]
    NotCuda(&'static str),
}

/// NCCL's C interface (`nccl.h`, NCCL 2): the functions xtoken calls, by pointer.
struct Library {
    path: PathBuf,
    version: c_int,
    /// Keeps the functions below loaded.
    _lib: libloading::Library,
    get_unique_id: unsafe extern "C" fn(*mut RawId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, RawId, c_int) -> c_int,
    all_reduce: AllReduce,
    async_error: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    abort: unsafe extern "C" fn(Comm) -> c_int,
    destroy: unsafe extern "C" fn(Comm) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    last_error: unsafe extern "C" fn(Comm) -> *const c_char,
}

type Comm = *mut c_void;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawId {
    internal: [c_char; 128],
}

/// `ncclInProgress`: a non-blocking call not finished yet.
const IN_PROGRESS: c_int = 7;
/// `ncclSum`.
const SUM: c_int = 0;

/// The loaded library, or why it could not be.
static LIBRARY: OnceLock<Result<Library, NcclError>> = OnceLock::new();

fn library() -> Result<&'static Library, NcclError> {
    LIBRARY.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Where `libnccl.so.2` is looked for, in order: `XTOKEN_NCCL` (the file, or its directory),
/// `NCCL_HOME/lib`, the dynamic loader's own search (`LD_LIBRARY_PATH`, the system's library
/// directories), then a PyTorch install's copy (`nvidia/nccl/lib` in the site-packages of an
/// active virtual environment or conda, of each `…/bin` on `PATH`, of `~/.local` and of
/// `/usr/local`).
pub fn candidates() -> Vec<PathBuf> {
    let name = "libnccl.so.2";
    let mut found = Vec::new();
    let mut in_dir = |dir: &Path| {
        found.push(if dir.is_file() {
            dir.to_path_buf()
        } else {
            dir.join(name)
        })
    };
    if let Some(x) = std::env::var_os("XTOKEN_NCCL") {
        in_dir(Path::new(&x));
    }
    if let Some(home) = std::env::var_os("NCCL_HOME") {
        in_dir(&Path::new(&home).join("lib"));
    }
    found.push(PathBuf::from(name));
    for prefix in python_prefixes() {
        for lib in ["lib", "lib64"] {
            let pattern = prefix.join(lib).join("python3*/*-packages/nvidia/nccl/lib");
            let Some(pattern) = pattern.to_str() else {
                continue;
            };
            for dir in glob::glob(pattern).into_iter().flatten().flatten() {
                found.push(dir.join(name));
            }
        }
    }
    found.dedup();
    found
}

/// Where Python packages may live: virtual environments, conda, each `…/bin` on `PATH`.
fn python_prefixes() -> Vec<PathBuf> {
    let env = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let mut prefixes: Vec<PathBuf> = [env("VIRTUAL_ENV"), env("CONDA_PREFIX")]
        .into_iter()
        .flatten()
        .collect();
    if let Some(path) = std::env::var_os("PATH") {
        let bins = std::env::split_paths(&path);
        prefixes.extend(bins.filter_map(|b| b.parent().map(Path::to_path_buf)));
    }
    if let Some(home) = env("HOME") {
        prefixes.push(home.join(".local"));
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    prefixes
}

fn load() -> Result<Library, NcclError> {
    load_from(candidates())
}

/// The first of `paths` that loads as NCCL, or every path with why it did not.
fn load_from(paths: Vec<PathBuf>) -> Result<Library, NcclError> {
    let mut looked = Vec::new();
    for path in paths {
        // SAFETY: loading NCCL runs its initializers, which touch nothing of this process.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => return bind(lib, path),
            Err(e) => looked.push(format!("{} ({})", path.display(), first_line(&e))),
        }
    }
    Err(NcclError::NotFound { looked })
}

fn first_line(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let text = text.rsplit(": ").next().unwrap_or(&text).to_string();
    text.lines().next().unwrap_or_default().to_string()
}

/// The functions of a loaded library.
fn bind(lib: libloading::Library, path: PathBuf) -> Result<Library, NcclError> {
    let missing = |symbol: &str, e: libloading::Error| NcclError::Call {
        call: "loading NCCL",
        device: "host".into(),
        message: format!("{} lacks {symbol}: {e}", path.display()),
    };
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the symbol's type is its declaration in nccl.h (NCCL 2).
            *unsafe { lib.get($name.as_bytes()) }.map_err(|e| missing($name, e))?
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = symbol!("ncclGetVersion");
    let mut version = 0;
    // SAFETY: writes one int.
    unsafe { get_version(&mut version) };
    Ok(Library {
        version,
        get_unique_id: symbol!("ncclGetUniqueId"),
        comm_init_rank: symbol!("ncclCommInitRank"),
        all_reduce: symbol!("ncclAllReduce"),
        async_error: symbol!("ncclCommGetAsyncError"),
        abort: symbol!("ncclCommAbort"),
        destroy: symbol!("ncclCommDestroy"),
        error_string: symbol!("ncclGetErrorString"),
        last_error: symbol!("ncclGetLastError"),
        path,
        _lib: lib,
    })
}

impl Library {
    /// NCCL's words for `code`, with its last error's detail.
    fn explain(&self, code: c_int, comm: Comm) -> String {
        let text = |p: *const c_char| match p.is_null() {
            true => String::new(),
            // SAFETY: NCCL returns NUL-terminated static or per-thread strings.
            false => unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
        };
        // SAFETY: both accept any code and a null or live communicator.
        let (what, detail) = unsafe {
            (
                text((self.error_string)(code)),
                text((self.last_error)(comm)),
            )
        };
        match detail.is_empty() {
            true => format!("{what} (NCCL error {code})"),
            false => format!("{what} (NCCL error {code}): {detail}"),
        }
    }
}

/// The NCCL library this process loads: its path and version (`2.32.3`).
pub fn found() -> Result<(PathBuf, String), NcclError> {
    let lib = library()?;
    let v = lib.version;
    let version = match v >= 10000 {
        true => format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100),
        false => format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100),
    };
    Ok((lib.path.clone(), version))
}

/// Checks, before any worker joins a communicator, that NCCL loads and that the CUDA devices
/// `indices` exist: a worker that failed to join would leave the others waiting in NCCL's
/// initialization, which cannot be interrupted.
pub fn check_devices(indices: &[usize]) -> Result<(), NcclError> {
    library()?;
    let first = indices.first().copied().unwrap_or(0);
    let refused = |device: usize, message: String| NcclError::Call {
        call: "NCCL's devices",
        device: format!("cuda:{device}"),
        message,
    };
    #[cfg(feature = "cuda")]
    {
        if let Some(missing) = crate::device::missing_cuda_driver() {
            return Err(refused(first, missing));
        }
        let count = cudarc::driver::CudaContext::device_count()
            .map_err(|e| refused(first, format!("counting the CUDA devices: {e:?}")))?;
        match indices.iter().find(|&&i| i >= count.max(0) as usize) {
            Some(&missing) => Err(refused(
                missing,
                format!("this machine shows {count} CUDA device(s) (CUDA_VISIBLE_DEVICES applies)"),
            )),
            None => Ok(()),
        }
    }
    #[cfg(not(feature = "cuda"))]
    Err(refused(
        first,
        "this build has no CUDA backend (feature `cuda`)".into(),
    ))
}

/// A communicator's unique id: rank 0 makes it, and every rank that creates a communicator
/// with it joins the same one, in whichever process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}…)", &self.to_hex()[..16])
    }
}

impl UniqueId {
    /// A new id (`ncclGetUniqueId`: needs the library, not a GPU).
    pub fn new() -> Result<Self, NcclError> {
        let lib = library()?;
        let mut raw = RawId { internal: [0; 128] };
        // SAFETY: writes the 128 bytes of `raw`.
        let code = unsafe { (lib.get_unique_id)(&mut raw) };
        if code != 0 {
            return Err(NcclError::Call {
                call: "ncclGetUniqueId",
                device: "host".into(),
                message: lib.explain(code, std::ptr::null_mut()),
            });
        }
        Ok(Self(raw.internal.map(|b| b as u8)))
    }

    /// The id as 256 hexadecimal digits, to travel as text.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The id from [`UniqueId::to_hex`]'s text.
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 256 || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 128];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(bytes))
    }

    fn raw(&self) -> RawId {
        RawId {
            internal: self.0.map(|b| b as c_char),
        }
    }
}

/// The element type of a buffer NCCL sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat16`: summed in f16, each addition rounded.
    F16,
    /// `ncclBfloat16`: summed in bf16, each addition rounded (8 bits of mantissa).
    Bf16,
}

impl Element {
    fn code(self) -> c_int {
        match self {
            Element::F16 => 6,
            Element::F32 => 7,
            Element::Bf16 => 9,
        }
    }
}

/// One GPU's member of an NCCL communicator, with a stream of its own for the all-reduces.
pub struct Communicator {
    comm: Comm,
    /// `cuda:N`, rank r of w: how errors name it.
    name: String,
    #[cfg(feature = "cuda")]
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    /// Buffers enqueued and not yet awaited (kept alive until then).
    pending: std::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    aborted: std::sync::atomic::AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; its calls here
// are made by the worker that owns it, and `abort` is NCCL's documented way to end it from
// another.
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator({})", self.name)
    }
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `world`, on CUDA device `device` (made current
    /// on this thread). Blocks until every rank has joined; an error names the device.
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code, unused_variables))]
    pub fn init(
        device: usize,
        rank: usize,
        world: usize,
        id: &UniqueId,
    ) -> Result<Self, NcclError> {
        let name = format!("cuda:{device} (rank {rank} of {world})");
        let lib = library()?;
        let call = |call, message| NcclError::Call {
            call,
            device: name.clone(),
            message,
        };
        #[cfg(not(feature = "cuda"))]
        return Err(call(
            "binding the CUDA device",
            "this build has no CUDA backend (feature `cuda`)".into(),
        ));
        // Without a driver NCCL is still asked, so that its own words say what failed.
        let driver = crate::device::missing_cuda_driver();
        #[cfg(feature = "cuda")]
        let stream = match driver {
            Some(_) => None,
            None => {
                let context = cudarc::driver::CudaContext::new(device)
                    .map_err(|e| call("binding the CUDA device", format!("{e:?}")))?;
                let stream = context
                    .new_stream()
                    .map_err(|e| call("creating the exchange's stream", format!("{e:?}")))?;
                Some(stream)
            }
        };
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the communicator; the id is 128 bytes by value.
        let code =
            unsafe { (lib.comm_init_rank)(&mut comm, world as c_int, id.raw(), rank as c_int) };
        let hint = driver
            .as_deref()
            .map_or(String::new(), |d| format!(" — {d}"));
        if code != 0 {
            return Err(call("ncclCommInitRank", lib.explain(code, comm) + &hint));
        }
        #[cfg(feature = "cuda")]
        let Some(stream) = stream
        else {
            // SAFETY: the communicator was just made and is not used.
            unsafe { (lib.destroy)(comm) };
            return Err(call("binding the CUDA device", hint));
        };
        Ok(Self {
            comm,
            name,
            #[cfg(feature = "cuda")]
            stream,
            pending: Default::default(),
            aborted: Default::default(),
        })
    }

    /// How errors name this member (`cuda:N (rank r of w)`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Enqueues the in-place sum of `count` elements at device address `ptr` on the
    /// communicator's stream; `keep` is held until [`Communicator::wait`] (the buffer's owner).
    ///
    /// # Safety
    /// `ptr` must address `count` elements of `element` on this communicator's device, written
    /// before this call returns to the device's queue, and untouched until `wait` returns.
    pub unsafe fn enqueue_sum(
        &self,
        ptr: u64,
        count: usize,
        element: Element,
        keep: Box<dyn std::any::Any + Send>,
    ) -> Result<(), NcclError> {
        let lib = library()?;
        #[cfg(feature = "cuda")]
        let stream = self.stream.cu_stream() as *mut c_void;
        #[cfg(not(feature = "cuda"))]
        let stream = std::ptr::null_mut();
        let buffer = ptr as *mut c_void;
        // SAFETY: the caller's promise; the communicator is live.
        let code = unsafe {
            (lib.all_reduce)(
                buffer,
                buffer,
                count,
                element.code(),
                SUM,
                self.comm,
                stream,
            )
        };
        if code != 0 && code != IN_PROGRESS {
            return Err(self.failed("ncclAllReduce", code));
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(keep);
        Ok(())
    }

    /// Waits until every enqueued sum is done, polling NCCL's asynchronous errors and `stop`
    /// (another rank's failure) every `every`; on either the communicator is aborted, so that
    /// no rank stays in the collective.
    pub fn wait(
        &self,
        every: Duration,
        stop: &dyn Fn() -> Option<String>,
    ) -> Result<(), NcclError> {
        let lib = library()?;
        let result = loop {
            match self.stream_done() {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(message) => break Err(self.call_error("waiting for the all-reduce", message)),
            }
            let mut code = 0;
            // SAFETY: the communicator is live; writes one int.
            unsafe { (lib.async_error)(self.comm, &mut code) };
            if code != 0 && code != IN_PROGRESS {
                self.abort();
                break Err(self.failed("the all-reduce (asynchronous error)", code));
            }
            if let Some(why) = stop() {
                self.abort();
                break Err(NcclError::Stopped {
                    device: self.name.clone(),
                    why,
                });
            }
            std::thread::sleep(every);
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        result
    }

    /// Whether the stream has finished its work (`cuStreamQuery`).
    fn stream_done(&self) -> Result<bool, String> {
        #[cfg(feature = "cuda")]
        {
            use cudarc::driver::sys::{cuStreamQuery, CUresult};
            // SAFETY: the stream is live.
            return match unsafe { cuStreamQuery(self.stream.cu_stream()) } {
                CUresult::CUDA_SUCCESS => Ok(true),
                CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                other => Err(format!("{other:?}")),
            };
        }
        #[allow(unreachable_code)]
        Ok(true)
    }

    /// Ends the communicator at once (`ncclCommAbort`): the other ranks' operations fail.
    pub fn abort(&self) {
        use std::sync::atomic::Ordering;
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Ok(lib) = library() {
            // SAFETY: the communicator is live, and aborted once.
            unsafe { (lib.abort)(self.comm) };
        }
    }

    fn failed(&self, call: &'static str, code: c_int) -> NcclError {
        let message = library().map_or_else(|e| e.to_string(), |l| l.explain(code, self.comm));
        self.call_error(call, message)
    }

    fn call_error(&self, call: &'static str, message: String) -> NcclError {
        NcclError::Call {
            call,
            device: self.name.clone(),
            message,
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.aborted.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Ok(lib) = library() {
            // SAFETY: the communicator is live and its work awaited or abandoned with the run.
            unsafe { (lib.destroy)(self.comm) };
        }
    }
}

/// A backend whose tensors NCCL can sum: CUDA's (plain and behind fusion) in place on the
/// device; every other backend answers [`NcclError::NotCuda`].
pub trait NcclBackend: Backend {
    /// Enqueues the sum of `tensor` (1-D, f32, f16 or bf16) over `comm`'s ranks after the
    /// device's queued work, in place; the result may be read after [`Communicator::wait`].
    fn nccl_enqueue_sum(
        tensor: FloatTensor<Self>,
        comm: &Communicator,
    ) -> Result<FloatTensor<Self>, NcclError> {
        let _ = (tensor, comm);
        Err(NcclError::NotCuda(Self::name_static()))
    }

    /// The backend's name in errors.
    fn name_static() -> &'static str {
        "this"
    }
}

impl NcclBackend for burn::backend::NdArray<f32> {
    fn name_static() -> &'static str {
        "ndarray"
    }
}

impl NcclBackend for burn_flex::Flex {
    fn name_static() -> &'static str {
        "CPU (burn-flex)"
    }
}

impl<B: NcclBackend, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>
    NcclBackend for burn::backend::Autodiff<B, C>
{
    fn name_static() -> &'static str {
        B::name_static()
    }
}

#[cfg(feature = "wgpu")]
impl NcclBackend for burn_cubecl::CubeBackend<burn_wgpu::WgpuRuntime, f32, i32, u32> {
    fn name_static() -> &'static str {
        "wgpu"
    }
}

#[cfg(feature = "cuda")]
impl NcclBackend for burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8> {
    fn nccl_enqueue_sum(
        tensor: FloatTensor<Self>,
        comm: &Communicator,
    ) -> Result<FloatTensor<Self>, NcclError> {
        use burn::tensor::DType;
        let element = match tensor.dtype {
            DType::F32 => Element::F32,
            DType::F16 => Element::F16,
            DType::BF16 => Element::Bf16,
            other => {
                return Err(
                    comm.call_error("ncclAllReduce", format!("cannot sum {other:?} buffers"))
                )
            }
        };
        let tensor = burn_cubecl::kernel::into_contiguous(tensor);
        let count = tensor.meta.shape().num_elements();
        // The gathering kernels on the device's queue must have written the buffer.
        cubecl::future::block_on(tensor.client.sync())
            .map_err(|e| comm.call_error("the device's queue", format!("{e:?}")))?;
        let resource = tensor
            .client
            .get_resource(tensor.handle.clone())
            .map_err(|e| comm.call_error("the buffer's address", format!("{e:?}")))?;
        let ptr = resource.resource().ptr;
        // SAFETY: the buffer holds `count` elements, written (the queue was synced); the tensor
        // and its resource are kept until `wait`, and nothing reads the tensor before it.
        unsafe { comm.enqueue_sum(ptr, count, element, Box::new((tensor.clone(), resource)))? };
        Ok(tensor)
    }

    fn name_static() -> &'static str {
        "CUDA"
    }
}

#[cfg(feature = "fusion")]
impl<B> NcclBackend for burn_fusion::Fusion<B>
where
    B: NcclBackend + burn_fusion::FusionBackend,
{
    fn nccl_enqueue_sum(
        tensor: FloatTensor<Self>,
        comm: &Communicator,
    ) -> Result<FloatTensor<Self>, NcclError> {
        let client = tensor.client.clone();
        let inner = client.clone().resolve_tensor_float::<B>(tensor);
        let summed = B::nccl_enqueue_sum(inner, comm)?;
        Ok(crate::fusion::outer_float::<B>(&client, summed))
    }

    fn name_static() -> &'static str {
        B::name_static()
    }
}

#[cfg(test)]
mod tests {
    use super::{candidates, load_from, NcclError, UniqueId};
    use std::path::PathBuf;

    /// XTOKEN_NCCL first (a directory gets the library's name), then NCCL_HOME/lib, then the
    /// loader's own search by name.
    #[test]
    fn the_named_places_come_first() {
        std::env::set_var("XTOKEN_NCCL", "/opt/named-nccl");
        std::env::set_var("NCCL_HOME", "/opt/nccl-home");
        let found = candidates();
        std::env::remove_var("XTOKEN_NCCL");
        std::env::remove_var("NCCL_HOME");
        let expected: Vec<PathBuf> = [
            "/opt/named-nccl/libnccl.so.2",
            "/opt/nccl-home/lib/libnccl.so.2",
            "libnccl.so.2",
        ]
        .map(PathBuf::from)
        .into();
        assert_eq!(found[..3], expected[..]);
    }

    /// Not found: each place tried, with why, and what to do.
    #[test]
    fn a_missing_library_names_where_it_looked() {
        let e = match load_from(vec![PathBuf::from("/nowhere/libnccl.so.2")]) {
            Err(e @ NcclError::NotFound { .. }) => e.to_string(),
            Err(other) => panic!("another error: {other}"),
            Ok(_) => panic!("a library at /nowhere"),
        };
        assert!(e.contains("/nowhere/libnccl.so.2 ("), "{e}");
        assert!(e.contains("XTOKEN_NCCL"), "{e}");
    }

    #[test]
    fn an_id_travels_as_hex() {
        let id = UniqueId(std::array::from_fn(|i| (i * 7) as u8));
        assert_eq!(UniqueId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(UniqueId::from_hex("00"), None);
        assert_eq!(UniqueId::from_hex(&"zz".repeat(128)), None);
    }
}
