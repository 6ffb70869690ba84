//! A counting global allocator, so `xtoken bench loss` can report the peak heap of one
//! evaluation. It counts only once a benchmark calls [`enable`]: the counters are shared by
//! every thread, and their cache line bouncing between cores halved the throughput of the
//! alignment threads when every command counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// The system allocator, counting live bytes and their high-water mark once enabled.
pub struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Net bytes allocated since counting began (negative after freeing older blocks).
static CURRENT: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Starts counting, for the rest of the process.
pub fn enable() {
    COUNTING.store(true, Ordering::Relaxed);
}

fn grew(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        let now = CURRENT.fetch_add(bytes as isize, Ordering::Relaxed) + bytes as isize;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

fn shrank(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        CURRENT.fetch_sub(bytes as isize, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let out = unsafe { System.realloc(ptr, layout, new_size) };
        if !out.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        out
    }
}

/// Net bytes allocated since counting began; differences of two readings are what counts.
pub fn current() -> isize {
    CURRENT.load(Ordering::Relaxed)
}

/// Starts a new high-water mark at the current level.
pub fn reset_peak() {
    PEAK.store(current(), Ordering::Relaxed);
}

/// The high-water mark since the last [`reset_peak`].
pub fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

/// Bytes the heap grew by at its highest since [`reset_peak`] was called at `base`.
pub fn peak_above(base: isize) -> usize {
    (peak() - base).max(0) as usize
}
