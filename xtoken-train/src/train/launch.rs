//! Starting a run on the devices it names: one worker on one device, or data-parallel workers
//! (feature `collective`), whose shared files are prepared once before they start and whose
//! parameters must agree at the end; in one process, or in each process of a run that torchrun
//! or srun started ([`Placement`]), joined through a [`Session`].

use std::hash::Hasher;

use crate::backend::{on_backend, OnBackend, TrainBackend};
use crate::cluster::parallel::{ExchangeSettings, Nodes, Worker, DATA_PARALLEL};
use crate::cluster::{join_as_node, run_workers, Placement, Plan, Session, Timeouts};
use crate::config::RunConfig;
use crate::config::{DeviceKind, ExchangeKind};
use crate::error::{Error, Result};
use crate::train::inputs::prepare_shared_files;
use crate::train::options::RunOptions;
use crate::train::resume::resolved_text;
use crate::train::run::{train, RunSummary};
use xtoken_kernels::memory::DeviceMemory;

/// The devices of a run: a family, and the indices of its devices (one data-parallel worker
/// each; none or one: a single worker); and this process's place among several.
#[derive(Debug, Clone)]
pub struct Devices {
    /// `cpu`, `cuda` or `wgpu`.
    pub kind: DeviceKind,
    /// Device indices (`--devices 0,1,…`).
    pub indices: Vec<usize>,
    /// This process among the processes of the run, or `None` for a run of one process.
    pub placement: Option<Placement>,
}

impl Devices {
    /// The device the configuration names (`device`), one worker, placed as the environment
    /// says ([`Placement::from_env`]).
    pub fn of(config: &RunConfig) -> Result<Self> {
        Self::placed(config.device.parse()?, Vec::new())
    }

    /// The devices `indices` of family `kind`, placed as the environment says. A process of
    /// several given no indices takes the GPU of its local rank (torchrun's and srun's custom),
    /// or the only one `CUDA_VISIBLE_DEVICES` leaves it (srun `--gpus-per-task=1`).
    pub fn placed(kind: DeviceKind, mut indices: Vec<usize>) -> Result<Self> {
        let placement = Placement::from_env()?;
        if let Some(p) = &placement {
            if indices.is_empty() && !kind.on_host() && p.world > 1 {
                let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
                let one_visible = kind == DeviceKind::Cuda && visible.split(',').count() == 1;
                indices.push(if one_visible && !visible.trim().is_empty() {
                    0
                } else {
                    p.local_rank
                });
            }
        }
        Ok(Self {
            kind,
            indices,
            placement,
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
    // Before anything is written: `--check` refuses the same.
    crate::backend::check_device(&config, devices.kind)?;
    let job = TrainJob {
        config,
        options,
        placement: devices.placement.clone().filter(|p| p.world > 1),
        kind: devices.kind,
    };
    on_backend(devices.kind, &devices.indices, job)
}

struct TrainJob<'a> {
    config: RunConfig,
    options: &'a RunOptions,
    placement: Option<Placement>,
    kind: DeviceKind,
}

impl OnBackend for TrainJob<'_> {
    type Output = RunSummary;

    fn run<B: TrainBackend + DeviceMemory>(
        self,
        mut devices: Vec<B::Device>,
    ) -> Result<RunSummary> {
        let Self {
            config,
            options,
            placement,
            kind,
        } = self;
        if let Some(placement) = placement {
            return across_processes::<B>(config, options, devices, &placement, kind);
        }
        let count = devices.len();
        let exchange = exchange_of(&config, kind, count)?;
        if count == 1 && exchange.is_none() {
            let device = devices.remove(0);
            return train::<B>(config, options, device, Worker::alone());
        }
        if !DATA_PARALLEL {
            return Err(Error::Parallel(format!(
                "{count} devices: data-parallel training needs an xtoken built with `--features collective`"
            )));
        }
        config.grad_accum(count)?;
        prepare_shared_files(&config)?;
        let settings = settings_of(&config, exchange);
        let summary = train_workers::<B>(config, options, devices, None, settings)?;
        tracing::info!(
            "{count} workers ended with identical parameters (fingerprint {:016x})",
            summary.fingerprint
        );
        Ok(summary)
    }
}

/// The exchange of `workers` workers on `kind` (`parallel.exchange` resolved); `None`: alone.
fn exchange_of(
    config: &RunConfig,
    kind: DeviceKind,
    workers: usize,
) -> Result<Option<ExchangeKind>> {
    config.exchange_choice()?.resolve(kind, workers)
}

/// The exchange's settings for the workers.
fn settings_of(config: &RunConfig, exchange: Option<ExchangeKind>) -> ExchangeSettings {
    ExchangeSettings {
        kind: exchange.unwrap_or(ExchangeKind::Ring),
        bucket_bytes: config.bucket_bytes(),
    }
}

/// Trains on this process's `devices` (with `nodes`, as one process of several) and checks
/// that its workers end with equal parameters.
fn train_workers<B: TrainBackend>(
    config: RunConfig,
    options: &RunOptions,
    devices: Vec<B::Device>,
    nodes: Option<&Nodes>,
    settings: ExchangeSettings,
) -> Result<RunSummary> {
    let summaries = run_workers::<B, _, _>(devices, nodes, settings, |worker, device| {
        train::<B>(config.clone(), options, device, worker)
    })?;
    let fingerprints: Vec<u64> = summaries.iter().map(|s| s.fingerprint).collect();
    if fingerprints.windows(2).any(|w| w[0] != w[1]) {
        return Err(Error::Parallel(format!(
            "the workers' parameters diverged (fingerprints {fingerprints:x?})"
        )));
    }
    Ok(summaries.into_iter().next().unwrap_or_default())
}

/// One process of a run over several: joins the others, prepares the shared files (rank 0
/// first, so that a shared file system builds them once), trains its workers as one
/// xtoken-collective node, and ends with every process's parameters compared.
fn across_processes<B: TrainBackend>(
    config: RunConfig,
    options: &RunOptions,
    devices: Vec<B::Device>,
    placement: &Placement,
    kind: DeviceKind,
) -> Result<RunSummary> {
    let (rank, world, local) = (placement.rank, placement.world, devices.len());
    if !DATA_PARALLEL {
        return Err(Error::Parallel(format!(
            "{} started {world} processes: training across processes needs an xtoken built with \
             `--features collective`",
            placement.launcher
        )));
    }
    config.grad_accum(local * world)?;
    let plan = Plan {
        workers: local,
        hash: plan_hash(&config, options, kind)?,
    };
    let exchange = exchange_of(&config, kind, local * world)?;
    let settings = settings_of(&config, exchange);
    let (session, nodes) = join_as_node(placement, plan, Timeouts::from_env()?, settings.kind)?;
    tracing::info!(
        "rank {rank} of {world} ({}): {local} worker(s) here, {} in all, summing over {}; \
         reached at {}",
        placement.launcher,
        local * world,
        settings.kind.name(),
        session.host
    );
    if rank == 0 {
        told(&session, prepare_shared_files(&config))?;
    }
    session.barrier("inputs")?;
    if rank != 0 {
        told(&session, prepare_shared_files(&config))?;
    }
    // Every rank starts training together, so that one all-reduce's wait is never a
    // preparation elsewhere.
    session.barrier("prepared")?;
    let options = options.clone();
    let summary = session
        .run(move || train_workers::<B>(config, &options, devices, Some(&nodes), settings))?;
    session.finish(summary.fingerprint)?;
    if rank == 0 {
        tracing::info!(
            "{world} processes × {local} workers ended with identical parameters (fingerprint \
             {:016x})",
            summary.fingerprint
        );
    }
    Ok(summary)
}

/// A hash of what every process must run alike: the configuration, the options, the device.
fn plan_hash(config: &RunConfig, options: &RunOptions, kind: DeviceKind) -> Result<u64> {
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    hash.write(resolved_text(config)?.as_bytes());
    let o = options;
    hash.write(format!("{:?} {:?} {:?} {kind:?}", o.resume, o.stop_after, o.extend).as_bytes());
    Ok(hash.finish())
}

/// `result`, told to the other processes when it is an error.
fn told<T>(session: &Session, result: Result<T>) -> Result<T> {
    if let Err(e) = &result {
        session.fail(&e.report());
    }
    result
}
