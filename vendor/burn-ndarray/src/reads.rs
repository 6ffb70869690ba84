//! xtoken patch: counts the reads of tensor data to the host (`into_data` of a float, int,
//! bool or quantized tensor; a transaction counts once) made on the current thread. On this
//! backend a read costs a copy at most; on a GPU backend the same call waits for the device to
//! finish its queue, so a test can count here how often a program would stall there.
//! Code that reads as part of computing (a host kernel) pauses the count with [`Paused`].
//! Without `std` (no threads to count on) nothing is counted.

#[cfg(feature = "std")]
use std::cell::Cell;

#[cfg(feature = "std")]
std::thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
    static PAUSED: Cell<u32> = const { Cell::new(0) };
}

/// The reads this thread has made so far (outside [`Paused`] sections).
pub fn count() -> u64 {
    #[cfg(feature = "std")]
    return READS.with(Cell::get);
    #[cfg(not(feature = "std"))]
    0
}

/// Counts one read, unless paused.
pub(crate) fn note() {
    #[cfg(feature = "std")]
    if PAUSED.with(Cell::get) == 0 {
        READS.with(|r| r.set(r.get() + 1));
    }
}

/// While a value of this type lives, this thread's reads are not counted.
#[must_use = "the count resumes when the guard is dropped"]
pub struct Paused(());

impl Paused {
    /// Pauses the count until the guard is dropped.
    pub fn new() -> Self {
        #[cfg(feature = "std")]
        PAUSED.with(|p| p.set(p.get() + 1));
        Paused(())
    }
}

impl Default for Paused {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        #[cfg(feature = "std")]
        PAUSED.with(|p| p.set(p.get() - 1));
    }
}
