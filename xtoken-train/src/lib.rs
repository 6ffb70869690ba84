//! X-Token distillation runs on burn: the run configuration, the data pipeline, the training
//! step and loop, checkpoints with exact resumption, metrics, and data parallelism over the
//! devices of one machine and across processes. The `xtoken` command-line tool is a thin layer
//! over this crate.
//!
//! The layers, from a TOML file to a trained student:
//!
//! - [`config`]: [`RunConfig`], one TOML file whose defaults are the paper's;
//! - [`data`]: documents read, tokenized and aligned into the alignment cache, packed into
//!   rows, laid out as micro-batches with their chunk plans, on a background loader;
//! - [`teachers`]: each teacher's model, loss (`auto` resolved by the coverage audit) and the
//!   tables the loss reads;
//! - [`step`]: one optimizer step (teacher targets, student forward + backward under the
//!   distillation losses, accumulation, averaging over workers, clipping, AdamW);
//! - [`run`]: a run in named stages ([`Run::open`], [`Run::step`], [`Run::log`],
//!   [`Run::checkpoint`], [`Run::export`]), and [`train`] to run them all;
//! - [`harness`]: the paper's benchmarks (MMLU, GSM8k, MATH, WinoGrande, HellaSwag) scored as
//!   lm-evaluation-harness scores them;
//! - [`checkpoint`], [`metrics`], [`optim`], [`schedule`], [`parallel`];
//! - [`launch`]: a run on the devices it names, one worker or data-parallel ones, in one
//!   process or as one of several ([`cluster`]: placement from torchrun's or srun's variables,
//!   the session that joins and watches the processes); [`backend`] picks the burn backend by
//!   name.
//!
//! A run from a configuration file, on the device the file names:
//!
//! ```no_run
//! use xtoken_train::{config::RunConfig, launch, RunOptions};
//!
//! let config = RunConfig::load("run.toml".as_ref())?;
//! let devices = launch::Devices::of(&config)?;
//! let summary = launch::train_on(config, &RunOptions::default(), &devices)?;
//! println!("{} steps", summary.steps);
//! # Ok::<(), xtoken_train::Error>(())
//! ```
//!
//! The same run step by step on a backend of your choice, for a loop of your own:
//!
//! ```no_run
//! use burn::backend::{Autodiff, NdArray};
//! use xtoken_train::{config::RunConfig, parallel::Worker, Run, RunOptions};
//!
//! let config = RunConfig::load("examples/configs/demo-cpu.toml".as_ref())?;
//! let options = RunOptions::default(); // or `resume: true`, `stop_after: Some(step)`
//! let device = Default::default();
//! let mut run = Run::<Autodiff<NdArray>>::open(config, &options, device, Worker::alone())?;
//! while !run.done() {
//!     let metrics = run.step()?; // one optimizer step: loader, teachers, student, AdamW
//!     run.log(metrics)?; // metrics.csv and the progress
//!     if run.checkpoint_due() {
//!         run.checkpoint()?; // atomic; `resume` continues from it bit for bit
//!     }
//! }
//! run.export()?; // the student as a Hugging Face directory
//! # Ok::<(), xtoken_train::Error>(())
//! ```

#![warn(missing_docs)]

pub mod backend;
pub mod checkpoint;
pub mod cluster;
pub mod config;
pub mod data;
pub mod error;
pub mod eval;
pub mod export;
pub mod harness;
pub mod inputs;
pub mod launch;
pub mod lock;
pub mod machine;
pub mod memory;
pub mod metrics;
pub mod optim;
pub mod parallel;
pub mod paths;
pub mod preflight;
pub mod profile;
pub mod readout;
pub mod resume;
pub mod rng;
pub mod run;
pub mod schedule;
pub mod step;
pub mod teachers;
pub mod tensorboard;

pub use backend::TrainBackend;
pub use config::RunConfig;
pub use error::{Error, Result};
pub use run::{train, Run, RunOptions, RunSummary};
