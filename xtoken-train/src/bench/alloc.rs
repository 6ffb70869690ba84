//! A counting global allocator, so `xtoken bench loss` can report the peak heap of one
//! evaluation, and a command can be held to a memory cap. It counts only once a benchmark calls
//! [`enable`] or a cap is set. The counters are shared by every thread, and their cache line
//! bouncing between cores halved the throughput of the alignment threads (whose tokenizers make
//! many small allocations): each thread therefore gathers its small changes and adds them to
//! the shared count once they reach [`BATCH_BYTES`] either way.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicUsize, Ordering};

/// The system allocator, counting live bytes and their high-water mark once enabled.
pub struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Net bytes allocated since counting began (negative after freeing older blocks).
static CURRENT: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// A thread's net change in bytes that it adds to [`CURRENT`] at once: the count lags the heap
/// by less than this per thread, and an allocation this large or larger is counted as it
/// happens.
pub const BATCH_BYTES: isize = 64 << 10;

thread_local! {
    /// This thread's net change not yet in [`CURRENT`] (a `const` cell: reading it neither
    /// allocates nor registers a destructor, as an allocator requires).
    static PENDING: Cell<isize> = const { Cell::new(0) };
}

/// `bytes` (negative: freed) added to this thread's pending change; the change to add to
/// [`CURRENT`] now, if it reached [`BATCH_BYTES`] either way.
fn batched(bytes: isize) -> Option<isize> {
    let gathered = PENDING.try_with(|pending| {
        let total = pending.get() + bytes;
        if total.abs() < BATCH_BYTES {
            pending.set(total);
            return None;
        }
        pending.set(0);
        Some(total)
    });
    // A thread past its locals' end counts at once.
    gathered.unwrap_or(Some(bytes))
}

/// The heap's cap in bytes (`usize::MAX`: none).
static CAP: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Set by the allocation that passed the cap.
static ENDING: AtomicBool = AtomicBool::new(false);

/// Bytes set aside at the start for the out-of-memory ending: once the system refuses an
/// allocation, the cleanup's own allocations (naming the document, removing the lock) would be
/// refused too, on whichever thread's heap they fall; they are served from here instead.
const RESERVE_BYTES: usize = 1 << 20;
static RESERVE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static RESERVE_USED: AtomicUsize = AtomicUsize::new(0);

/// The thread running the out-of-memory ending (`pthread_self`; 0 until one does).
static ENDING_THREAD: AtomicUsize = AtomicUsize::new(0);

/// Sets the reserve aside and installs the abort handler (once, before any work).
pub fn reserve() {
    on_abort_while_ending();
    let layout = Layout::from_size_align(RESERVE_BYTES, 4096).expect("a valid layout");
    // SAFETY: a plain allocation of a non-zero size; it lives as long as the process.
    let block = unsafe { System.alloc(layout) };
    let _ = RESERVE.compare_exchange(
        std::ptr::null_mut(),
        block,
        Ordering::AcqRel,
        Ordering::Relaxed,
    );
}

/// `layout` carved from the reserve (never given back), or null when it is spent.
fn from_reserve(layout: Layout) -> *mut u8 {
    let base = RESERVE.load(Ordering::Acquire);
    if base.is_null() {
        return base;
    }
    let align = layout.align();
    let taken = RESERVE_USED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
        let start = (base as usize + used).next_multiple_of(align) - base as usize;
        let end = start.checked_add(layout.size())?;
        (end <= RESERVE_BYTES).then_some(end)
    });
    match taken {
        Ok(used) => {
            let start = (base as usize + used).next_multiple_of(align) - base as usize;
            base.wrapping_add(start)
        }
        Err(_) => std::ptr::null_mut(),
    }
}

/// Whether `ptr` lies in the reserve (freeing it is a no-op).
fn in_reserve(ptr: *mut u8) -> bool {
    let base = RESERVE.load(Ordering::Relaxed) as usize;
    base != 0 && (base..base + RESERVE_BYTES).contains(&(ptr as usize))
}

/// Starts counting, for the rest of the process.
pub fn enable() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// Holds the heap allocated from now on to `bytes`: the allocation that would pass it ends the
/// process with a message naming the cap and exit status 1 (rather than the abort a failed
/// allocation is), and every other rank of a run sees this one leave.
pub fn cap(bytes: u64) {
    CAP.store(
        usize::try_from(bytes).unwrap_or(usize::MAX),
        Ordering::Relaxed,
    );
    enable();
}

fn grew(bytes: usize) {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    if let Some(change) = batched(bytes as isize) {
        let now = CURRENT.fetch_add(change, Ordering::Relaxed) + change;
        PEAK.fetch_max(now, Ordering::Relaxed);
        let past = now > 0 && now as usize > CAP.load(Ordering::Relaxed);
        // Once over, the allocations made while the process ends go through unchecked.
        if past && !ENDING.swap(true, Ordering::Relaxed) {
            over_cap(now as usize, bytes);
        }
    }
}

/// A `Write` into a fixed buffer: the message of [`over_cap`] is formatted without allocating.
struct Fixed {
    buffer: [u8; 512],
    len: usize,
}

impl Write for Fixed {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(self.buffer.len() - self.len);
        self.buffer[self.len..self.len + n].copy_from_slice(&data[..n]);
        self.len += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes with a unit a person reads (no allocation).
fn readable(bytes: usize) -> (f64, &'static str, usize) {
    match bytes {
        b if b >= 1 << 30 => (b as f64 / 1e9, "GB", 1),
        b if b >= 1 << 20 => (b as f64 / 1e6, "MB", 1),
        b if b >= 1 << 10 => (b as f64 / 1e3, "kB", 1),
        b => (b as f64, "bytes", 0),
    }
}

/// Ends the process: the heap reached `now` bytes with an allocation of `bytes`, past the cap.
fn over_cap(now: usize, bytes: usize) -> ! {
    let (size, unit, decimals) = readable(bytes);
    let gb = |b: usize| b as f64 / 1e9;
    end_out_of_memory(|message| {
        writeln!(
            message,
            "error: out of memory: an allocation of {size:.decimals$} {unit} brings the heap to \
             {:.3} GB, past the {:.3} GB cap {} sets; lower training.micro_batch or \
             training.context_length (see `xtoken train --check`)",
            gb(now),
            gb(CAP.load(Ordering::Relaxed)),
            xtoken_train::train::memory::CAP_VARIABLE
        )
    })
}

/// Ends the process: the system refused an allocation of `bytes` (the address space the
/// process may take, `ulimit -v`, or the machine's memory is used up), which would otherwise
/// abort it with its lock and temporary files left behind.
fn refused(bytes: usize) {
    if ENDING.swap(true, Ordering::Relaxed) {
        return;
    }
    let (size, unit, decimals) = readable(bytes);
    end_out_of_memory(|message| {
        writeln!(
            message,
            "error: out of memory: the system refused an allocation of {size:.decimals$} {unit} \
             (the process's address-space limit, `ulimit -v`, or the machine's memory is used \
             up); lower training.micro_batch or training.context_length (see `xtoken train \
             --check`)"
        )
    })
}

/// Writes the message `write` formats (without allocating or taking a lock), names the
/// longest document, removes what Ctrl-C removes and ends the process with status 1. The
/// allocations the cleanup makes go through unchecked (`ENDING` is set).
fn end_out_of_memory(write: impl FnOnce(&mut Fixed) -> std::io::Result<()>) -> ! {
    // SAFETY: `pthread_self` only reads this thread's own handle.
    ENDING_THREAD.store(unsafe { libc::pthread_self() } as usize, Ordering::Release);
    let mut message = Fixed {
        buffer: [0; 512],
        len: 0,
    };
    let _ = write(&mut message);
    // SAFETY: a plain write(2) of an initialized buffer to standard error (no lock, no
    // allocation).
    unsafe {
        libc::write(2, message.buffer.as_ptr().cast(), message.len);
    }
    // Allocations go through unchecked from here (`ENDING`): the longest document can be named.
    if let Some((place, bytes)) = xtoken_train::machine::longest_document() {
        eprintln!(
            "  the longest document aligned was {:.1} MB ({place}): a document is held whole once \
             aligned, so split it into smaller records or leave it out",
            bytes as f64 / 1e6
        );
    }
    // What Ctrl-C removes goes here too (a checkpoint being saved, the run's lock): `ENDING` lets
    // the allocations this makes through, and a registry locked by this very thread is skipped.
    xtoken_core::temporary::remove_all_unless_busy();
    // SAFETY: `_exit` ends the process at once, running no handler that could allocate.
    unsafe { libc::_exit(1) }
}

/// Another thread that aborts while the ending runs must not end the process before the
/// ending has removed the run's lock: std aborts a thread that cannot map its signal stack as
/// it starts, which is just what a process out of address space does. Such a thread waits
/// here for the ending's own exit; an abort outside the ending (or on the ending's own
/// thread, or one the ending does not follow within seconds) proceeds as usual.
extern "C" fn wait_for_the_ending(_signal: libc::c_int) {
    if !ENDING.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: `pthread_self` reads this thread's handle; `nanosleep` is async-signal-safe.
    let this = unsafe { libc::pthread_self() } as usize;
    if ENDING_THREAD.load(Ordering::Acquire) == this {
        return;
    }
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    for _ in 0..1000 {
        unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
    }
}

/// Installs [`wait_for_the_ending`] for `SIGABRT`.
fn on_abort_while_ending() {
    // SAFETY: a zeroed `sigaction` with a handler of the required signature and an empty mask.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = wait_for_the_ending as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGABRT, &action, std::ptr::null_mut());
    }
}

fn shrank(bytes: usize) {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    if let Some(change) = batched(-(bytes as isize)) {
        CURRENT.fetch_add(change, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if ptr.is_null() {
            // Returns only while the ending runs: its allocations come from the reserve.
            refused(layout.size());
            return from_reserve(layout);
        }
        grew(layout.size());
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if ptr.is_null() {
            refused(layout.size());
            let ptr = from_reserve(layout);
            if !ptr.is_null() {
                // SAFETY: `ptr` addresses `layout.size()` bytes of the reserve, this caller's.
                unsafe { std::ptr::write_bytes(ptr, 0, layout.size()) };
            }
            return ptr;
        }
        grew(layout.size());
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_reserve(ptr) {
            return;
        }
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if in_reserve(ptr) {
            // Only the ending allocates there: a new block (the reserve's, when the system has
            // none), the old one's bytes copied, nothing freed.
            let new_layout = Layout::from_size_align(new_size, layout.align());
            let out = new_layout.map_or(std::ptr::null_mut(), |l| unsafe { self.alloc(l) });
            if !out.is_null() {
                // SAFETY: both blocks hold at least the smaller size; they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(ptr, out, layout.size().min(new_size)) };
            }
            return out;
        }
        let out = unsafe { System.realloc(ptr, layout, new_size) };
        if out.is_null() {
            refused(new_size);
            let new_layout = Layout::from_size_align(new_size, layout.align());
            let out = new_layout.map_or(std::ptr::null_mut(), from_reserve);
            if !out.is_null() {
                // SAFETY: as above; the old block stays the system's, untouched.
                unsafe { std::ptr::copy_nonoverlapping(ptr, out, layout.size().min(new_size)) };
            }
            return out;
        } else {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Small changes gather on their thread until they reach the batch either way; a large one
    /// is counted at once with what had gathered.
    #[test]
    fn small_changes_gather_and_large_ones_count_at_once() {
        std::thread::spawn(|| {
            assert_eq!(batched(100), None);
            assert_eq!(batched(-40), None);
            assert_eq!(batched(BATCH_BYTES), Some(BATCH_BYTES + 60));
            assert_eq!(batched(-(BATCH_BYTES - 1)), None);
            assert_eq!(batched(-1), Some(-BATCH_BYTES));
            assert_eq!(batched(7), None);
        })
        .join()
        .expect("the counting thread");
    }
}
