//! Starting a run on the devices it names: one worker on one device, or data-parallel workers
//! (feature `collective`), whose shared files are prepared once before they start and whose
//! parameters must agree at the end.

use crate::backend::{on_backend, DeviceKind, OnBackend, TrainBackend};
use crate::config::RunConfig;
use crate::error::{Error, Result};
use crate::inputs::prepare_shared_files;
use crate::parallel::{run_workers, Worker, DATA_PARALLEL};
use crate::run::{train, RunOptions, RunSummary};
use xtoken_kernels::memory::DeviceMemory;

/// The devices of a run: a family, and the indices of its devices (one data-parallel worker
/// each; none or one: a single worker).
#[derive(Debug, Clone)]
pub struct Devices {
    /// `cpu`, `cuda` or `wgpu`.
    pub kind: DeviceKind,
    /// Device indices (`--devices 0,1,…`).
    pub indices: Vec<usize>,
}

impl Devices {
    /// The device the configuration names (`device`), one worker.
    pub fn of(config: &RunConfig) -> Result<Self> {
        Ok(Self {
            kind: config.device.parse()?,
            indices: Vec::new(),
        })
    }
}

/// Runs the training `config` describes on `devices`.
///
/// ```no_run
/// use xtoken_train::{config::RunConfig, launch, RunOptions};
///
/// let config = RunConfig::load("run.toml".as_ref())?;
/// let devices = launch::Devices::of(&config)?;
/// let summary = launch::train_on(config, &RunOptions::default(), &devices)?;
/// println!("{} steps, {} tokens", summary.steps, summary.tokens);
/// # Ok::<(), xtoken_train::Error>(())
/// ```
pub fn train_on(config: RunConfig, options: &RunOptions, devices: &Devices) -> Result<RunSummary> {
    let job = TrainJob { config, options };
    on_backend(devices.kind, &devices.indices, job)
}

struct TrainJob<'a> {
    config: RunConfig,
    options: &'a RunOptions,
}

impl OnBackend for TrainJob<'_> {
    type Output = RunSummary;

    fn run<B: TrainBackend + DeviceMemory>(
        self,
        mut devices: Vec<B::Device>,
    ) -> Result<RunSummary> {
        let Self { config, options } = self;
        if devices.len() == 1 {
            let device = devices.remove(0);
            return train::<B>(config, options, device, Worker::alone());
        }
        let count = devices.len();
        if !DATA_PARALLEL {
            return Err(Error::Parallel(format!(
                "{count} devices: data-parallel training needs an xtoken built with `--features collective`"
            )));
        }
        config.grad_accum(count)?;
        prepare_shared_files(&config)?;
        let summaries = run_workers::<B, _, _>(devices, |worker, device| {
            train::<B>(config.clone(), options, device, worker)
        })?;
        let fingerprints: Vec<u64> = summaries.iter().map(|s| s.fingerprint).collect();
        if fingerprints.windows(2).any(|w| w[0] != w[1]) {
            return Err(Error::Parallel(format!(
                "the workers' parameters diverged (fingerprints {fingerprints:x?})"
            )));
        }
        eprintln!(
            "{count} workers ended with identical parameters (fingerprint {:016x})",
            fingerprints.first().copied().unwrap_or(0)
        );
        Ok(summaries.into_iter().next().unwrap_or_default())
    }
}
