//! The bytes each kernel launch reads and writes, as its launch plan declares them.
//!
//! A loss on the full vocabulary is bound by memory: its floor is one read of the logits and one
//! write of their gradient. Each cube launch of the losses, the cross-entropy and the teacher's
//! top-K declares what it moves ([`note`]), in three streams: the operation's logits (the
//! student's for a loss, the teacher's for the top-K), their gradient, and everything else
//! (per-row statistics, the teacher's entries, W, scratch buffers). A buffer region the launch
//! reads many times while it stays in cache (W's row sums, read once per row) counts once; a
//! gather through a buffer counts the region it spans. [`recording`] collects them on this
//! thread, so that a benchmark or a test sets what a structure moves against the floor without
//! a profiler. The host path declares nothing.

use std::cell::RefCell;

/// Bytes of one launch in each stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streams {
    /// The operation's logits.
    pub logits: u64,
    /// The logits' gradient.
    pub gradient: u64,
    /// Everything else.
    pub other: u64,
}

impl Streams {
    /// Bytes of the logits stream alone.
    pub fn logits(bytes: usize) -> Self {
        Self {
            logits: bytes as u64,
            ..Self::default()
        }
    }

    /// Bytes of the gradient stream alone.
    pub fn gradient(bytes: usize) -> Self {
        Self {
            gradient: bytes as u64,
            ..Self::default()
        }
    }

    /// Bytes of the other stream alone.
    pub fn other(bytes: usize) -> Self {
        Self {
            other: bytes as u64,
            ..Self::default()
        }
    }

    /// All three streams together.
    pub fn total(&self) -> u64 {
        self.logits + self.gradient + self.other
    }
}

impl std::ops::Add for Streams {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            logits: self.logits + o.logits,
            gradient: self.gradient + o.gradient,
            other: self.other + o.other,
        }
    }
}

/// One launch: the kernel's name and what it reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub kernel: &'static str,
    pub read: Streams,
    pub written: Streams,
}

/// The launches of one kernel summed: how many, and their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTraffic {
    pub kernel: &'static str,
    pub launches: usize,
    pub read: Streams,
    pub written: Streams,
}

std::thread_local! {
    static RECORD: RefCell<Option<Vec<Launch>>> = const { RefCell::new(None) };
}

/// Declares one launch (kept only inside [`recording`]).
pub fn note(kernel: &'static str, read: Streams, written: Streams) {
    RECORD.with(|r| {
        if let Some(list) = r.borrow_mut().as_mut() {
            list.push(Launch {
                kernel,
                read,
                written,
            });
        }
    });
}

/// Runs `f` and returns the launches it declared on this thread, in launch order. Recordings
/// do not nest: an inner one takes the launches it saw, and the outer one goes on after it.
pub fn recording<T>(f: impl FnOnce() -> T) -> (T, Vec<Launch>) {
    let outer = RECORD.with(|r| r.borrow_mut().replace(Vec::new()));
    let value = f();
    let launches = RECORD.with(|r| std::mem::replace(&mut *r.borrow_mut(), outer));
    (value, launches.unwrap_or_default())
}

/// The launches summed per kernel, in the order each kernel first ran.
pub fn by_kernel(launches: &[Launch]) -> Vec<KernelTraffic> {
    let mut out: Vec<KernelTraffic> = Vec::new();
    for l in launches {
        match out.iter_mut().find(|k| k.kernel == l.kernel) {
            Some(k) => {
                k.launches += 1;
                k.read = k.read + l.read;
                k.written = k.written + l.written;
            }
            None => out.push(KernelTraffic {
                kernel: l.kernel,
                launches: 1,
                read: l.read,
                written: l.written,
            }),
        }
    }
    out
}

/// What all the launches read and wrote.
pub fn total(launches: &[Launch]) -> (Streams, Streams) {
    launches
        .iter()
        .fold((Streams::default(), Streams::default()), |(r, w), l| {
            (r + l.read, w + l.written)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_collects_this_threads_launches_and_sums_them_per_kernel() {
        note("outside", Streams::logits(1), Streams::default());
        let ((), launches) = recording(|| {
            note("a", Streams::logits(10), Streams::gradient(5));
            let ((), inner) = recording(|| note("b", Streams::other(3), Streams::default()));
            assert_eq!(inner.len(), 1);
            note("a", Streams::logits(10), Streams::other(1));
            std::thread::spawn(|| note("c", Streams::other(7), Streams::default()))
                .join()
                .unwrap();
        });
        let kernels: Vec<_> = launches.iter().map(|l| l.kernel).collect();
        assert_eq!(kernels, ["a", "a"]);
        let summed = by_kernel(&launches);
        assert_eq!(summed.len(), 1);
        assert_eq!(summed[0].launches, 2);
        assert_eq!(summed[0].read.logits, 20);
        let (read, written) = total(&launches);
        assert_eq!((read.total(), written.total()), (20, 6));
    }
}
