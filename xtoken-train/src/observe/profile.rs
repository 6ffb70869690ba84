//! Where a training step's time goes: the wall time of each phase (data wait, each teacher's
//! forward and top-K, the student's pass 1, forward, head, each loss, backward with
//! recomputation, the gradient exchange, clipping + AdamW, W's AdamW), the memory each phase
//! reaches and, on a cubecl backend whose compilations are counted
//! ([`xtoken_kernels::compilations`]), the kernels each phase compiles.
//!
//! A GPU runs ahead of the host, so a phase is only timed truly with the device synchronized at
//! its boundary; those synchronizations stall the pipeline, so they happen only while a
//! profile is being recorded on the thread ([`record`]). Otherwise a phase boundary is one
//! thread-local check and nothing more.

use std::cell::RefCell;
use std::time::Instant;

use burn::tensor::backend::Backend;
use serde::Serialize;
use xtoken_kernels::memory::DeviceMemory;

/// How the memory of a host backend is read (a counting allocator, say): its high-water mark
/// since the last reset. Device backends report their pools instead.
#[derive(Debug, Clone, Copy)]
pub struct HostMemory {
    /// Starts a new high-water mark at the current level.
    pub reset_peak: fn(),
    /// Bytes in use at the highest since the last reset.
    pub peak_bytes: fn() -> u64,
}

/// One phase of a step.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Phase {
    /// What ran, e.g. `teacher qwen: forward`.
    pub name: String,
    /// Wall seconds, summed over the step's micro-batches.
    pub seconds: f64,
    /// Times the phase ran in the step (once per micro-batch, say).
    pub count: u32,
    /// Memory at the phase's highest (host: the heap's high-water mark; device: the bytes its
    /// pools hold, which they keep once reserved), the largest over its runs.
    pub memory_bytes: u64,
    /// Kernels compiled in the phase (summed over its runs); `None` where nothing counts them
    /// (the CPU backends, or cubecl's configuration read before counting began).
    pub compilations: Option<u64>,
    /// The names of the kernels compiled in the phase, in order (with `compilations`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<String>,
}

/// The phases of one step, in the order they first ran.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StepProfile {
    /// The phases; their seconds add up to the step from its start to its last boundary.
    pub phases: Vec<Phase>,
}

impl StepProfile {
    /// The phases' seconds summed.
    pub fn seconds(&self) -> f64 {
        self.phases.iter().map(|p| p.seconds).sum()
    }

    /// The phase named `name`, if it ran.
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// Adds `phase` to the phase of its name (seconds and runs summed, memory the largest), or
    /// appends it.
    pub fn absorb(&mut self, phase: &Phase) {
        match self.phases.iter_mut().find(|p| p.name == phase.name) {
            Some(p) => {
                p.seconds += phase.seconds;
                p.count += phase.count;
                p.memory_bytes = p.memory_bytes.max(phase.memory_bytes);
                p.compilations = match (p.compilations, phase.compilations) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                p.kernels.extend_from_slice(&phase.kernels);
            }
            None => self.phases.push(phase.clone()),
        }
    }
}

/// What is recorded on a thread while profiling.
struct Recorder {
    host: Option<HostMemory>,
    since: Instant,
    /// Kernels compiled before the current phase began.
    compiled: Option<u64>,
    current: StepProfile,
    steps: Vec<StepProfile>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Starts recording the phases of the steps this thread runs; `host` reads a host backend's
/// memory (device backends report their pools).
pub fn record(host: Option<HostMemory>) {
    RECORDER.with(|r| {
        *r.borrow_mut() = Some(Recorder {
            host,
            since: Instant::now(),
            compiled: xtoken_kernels::compilations::count(),
            current: StepProfile::default(),
            steps: Vec::new(),
        })
    });
}

/// Stops recording and returns one profile per step recorded.
pub fn finish() -> Vec<StepProfile> {
    RECORDER.with(|r| r.borrow_mut().take().map(|r| r.steps).unwrap_or_default())
}

/// Whether this thread records.
pub fn recording() -> bool {
    RECORDER.with(|r| r.borrow().is_some())
}

/// Marks the start of a step: the clock of its first phase starts now.
pub(crate) fn start_step() {
    RECORDER.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            r.current = StepProfile::default();
            r.since = Instant::now();
            r.compiled = xtoken_kernels::compilations::count();
            if let Some(host) = r.host {
                (host.reset_peak)();
            }
        }
    });
}

/// Ends the phase that ran since the previous boundary, naming it: the device is synchronized
/// first, so that the work queued in the phase is counted in it. Nothing happens (no
/// synchronization) unless this thread records.
pub(crate) fn boundary<B: Backend + DeviceMemory>(
    device: &B::Device,
    name: impl FnOnce() -> String,
) {
    if !recording() {
        return;
    }
    // A failed synchronization is the next operation's error to report, not the profile's.
    let _ = B::sync(device);
    RECORDER.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            let seconds = r.since.elapsed().as_secs_f64();
            let memory = match (B::reserved_bytes(device), r.host) {
                (Some(bytes), _) => bytes,
                (None, Some(host)) => (host.peak_bytes)(),
                (None, None) => 0,
            };
            let kernels = xtoken_kernels::compilations::kernels();
            let compiled = kernels.as_ref().map(|k| k.len() as u64);
            let compilations = compiled.zip(r.compiled).map(|(now, then)| now - then);
            let new = match (&kernels, r.compiled) {
                (Some(k), Some(then)) => k.get(then as usize..).unwrap_or_default().to_vec(),
                _ => Vec::new(),
            };
            r.compiled = compiled;
            r.current.absorb(&Phase {
                name: name(),
                seconds,
                count: 1,
                memory_bytes: memory,
                compilations,
                kernels: new,
            });
            if let Some(host) = r.host {
                (host.reset_peak)();
            }
            r.since = Instant::now();
        }
    });
}

/// Marks the end of a step: its profile joins those [`finish`] returns.
pub(crate) fn end_step() {
    RECORDER.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            let step = std::mem::take(&mut r.current);
            r.steps.push(step);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    /// Phases of the same name add up (seconds, runs) and keep their first order; nothing is
    /// recorded on a thread that does not record.
    #[test]
    fn phases_of_one_name_add_up_in_first_order() {
        let device = Default::default();
        start_step();
        boundary::<NdArray>(&device, || "ignored".into());
        end_step();
        assert!(finish().is_empty());

        record(None);
        start_step();
        for _ in 0..2 {
            boundary::<NdArray>(&device, || "a".into());
            std::thread::sleep(std::time::Duration::from_millis(5));
            boundary::<NdArray>(&device, || "b".into());
        }
        end_step();
        let steps = finish();
        assert_eq!(steps.len(), 1);
        let names: Vec<_> = steps[0]
            .phases
            .iter()
            .map(|p| (&p.name[..], p.count))
            .collect();
        assert_eq!(names, [("a", 2), ("b", 2)]);
        assert!(steps[0].phases[1].seconds >= 0.010);
        assert!(!recording());
    }
}
