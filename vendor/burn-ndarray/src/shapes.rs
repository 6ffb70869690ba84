//! xtoken patch: records the shape of every tensor this backend makes (an operation's result,
//! a view, uploaded data) while a [`Recording`] lives, from any thread. A test asserts with it
//! what a computation never builds, such as the `[batch, heads, T, T]` scores of an attention
//! that should not have them. Off, it costs one atomic load per tensor. Without `std` nothing
//! is recorded.

#[cfg(feature = "std")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "std")]
use std::sync::Mutex;

#[cfg(feature = "std")]
static ON: AtomicBool = AtomicBool::new(false);
#[cfg(feature = "std")]
static SHAPES: Mutex<alloc::vec::Vec<alloc::vec::Vec<usize>>> = Mutex::new(alloc::vec::Vec::new());

/// Records `shape`, if a [`Recording`] lives.
#[inline]
pub(crate) fn note(shape: &[usize]) {
    #[cfg(feature = "std")]
    if ON.load(Ordering::Relaxed) {
        if let Ok(mut shapes) = SHAPES.lock() {
            shapes.push(shape.to_vec());
        }
    }
    #[cfg(not(feature = "std"))]
    let _ = shape;
}

/// While a value of this type lives, every tensor's shape is recorded (process-wide: record in
/// a test binary of its own, or the tests running beside it are recorded too).
#[must_use = "recording stops when the guard is dropped"]
pub struct Recording(());

impl Recording {
    /// Starts recording, with nothing recorded yet.
    pub fn start() -> Self {
        #[cfg(feature = "std")]
        {
            if let Ok(mut shapes) = SHAPES.lock() {
                shapes.clear();
            }
            ON.store(true, Ordering::SeqCst);
        }
        Recording(())
    }

    /// Stops recording and returns the shapes recorded, in order.
    pub fn finish(self) -> alloc::vec::Vec<alloc::vec::Vec<usize>> {
        #[cfg(feature = "std")]
        {
            ON.store(false, Ordering::SeqCst);
            return SHAPES
                .lock()
                .map(|mut shapes| core::mem::take(&mut *shapes))
                .unwrap_or_default();
        }
        #[cfg(not(feature = "std"))]
        alloc::vec::Vec::new()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        #[cfg(feature = "std")]
        ON.store(false, Ordering::SeqCst);
    }
}
