//! Whether a device can start: the checks run before a backend first touches it, because the
//! backends' initialization panics (a missing driver library, no adapter) instead of returning
//! an error.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// Where the CUDA driver library (`libcuda.so`) cannot be loaded, what is missing; `None` where
/// it can. Without the `cuda` feature there is nothing to load: `None`.
pub fn missing_cuda_driver() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: opens and closes the library by the names the binding itself would try.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        if !present {
            return Some(
                "the CUDA driver library (libcuda.so / nvcuda.dll) cannot be loaded: no NVIDIA \
                 driver on this machine, or it is not on LD_LIBRARY_PATH"
                    .into(),
            );
        }
    }
    None
}

/// The free memory of CUDA device `ordinal` in bytes (`cuMemGetInfo` in its primary context);
/// `None` without the `cuda` feature, a driver or such a device.
pub fn cuda_free_memory(ordinal: usize) -> Option<u64> {
    #[cfg(feature = "cuda")]
    {
        if missing_cuda_driver().is_some() {
            return None;
        }
        let context = cudarc::driver::CudaContext::new(ordinal).ok()?;
        let (free, _total) = context.mem_get_info().ok()?;
        Some(free as u64)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        None
    }
}

/// Runs one tiny operation on `device` (a zero uploaded and read back) on this thread; a panic
/// of the backend's initialization comes back as its message, and is not printed.
pub fn probe<B: Backend>(device: &B::Device) -> Result<(), String> {
    quietly(|| {
        let zero = Tensor::<B, 1>::zeros([1], device);
        let _ = zero.into_data();
    })
}

/// Runs `work`, turning a panic into its message without printing it. A backend may start its
/// device on a thread of its own and panic there first: the first panic message of any thread
/// while `work` runs is the cause reported.
pub fn quietly(work: impl FnOnce()) -> Result<(), String> {
    let first: Arc<Mutex<Option<String>>> = Arc::default();
    let hook = panic::take_hook();
    let seen = first.clone();
    panic::set_hook(Box::new(move |info| {
        let mut slot = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.get_or_insert_with(|| message(info.payload()));
    }));
    let outcome = panic::catch_unwind(AssertUnwindSafe(work));
    panic::set_hook(hook);
    let cause = first.lock().map(|slot| slot.clone()).unwrap_or(None);
    outcome.map_err(|payload| cause.unwrap_or_else(|| message(payload.as_ref())))
}

fn message(payload: &(dyn Any + Send)) -> String {
    panic_text(payload)
        .unwrap_or("the backend panicked without a message")
        .to_string()
}

/// The text a panic's payload carries (`panic!` with a literal or a formatted message).
pub fn panic_text(payload: &(dyn Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_comes_back_as_its_message() {
        assert_eq!(quietly(|| {}), Ok(()));
        let err = quietly(|| panic!("no adapter for {}", "vulkan")).unwrap_err();
        assert_eq!(err, "no adapter for vulkan");
        // A panic on the backend's own thread is the cause, not the caller's broken channel.
        let err = quietly(|| {
            let (send, receive) = std::sync::mpsc::channel::<()>();
            std::thread::spawn(move || {
                let _send = send;
                panic!("no possible adapter");
            });
            receive.recv().unwrap();
        })
        .unwrap_err();
        assert_eq!(err, "no possible adapter");
        assert!(quietly(|| std::panic::panic_any(7u8)).is_err());
        // The host backend starts.
        probe::<burn::backend::NdArray>(&Default::default()).unwrap();
        #[cfg(not(feature = "cuda"))]
        assert_eq!(missing_cuda_driver(), None);
    }
}
