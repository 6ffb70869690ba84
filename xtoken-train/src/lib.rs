//! X-Token distillation runs on burn: the run configuration, the data pipeline, the training
//! step and loop, checkpoints with exact resumption, metrics, and data parallelism over the
//! devices of one machine and across processes. The `xtoken` command-line tool is a thin layer
//! over this crate.
//!
//! The floor plan, from the ground up; a module uses only those on its own floor or below
//! (`tests/it/floor_plan.rs` holds the files to it, and to no circle of imports):
//!
//! - the ground: [`error`], [`config`] ([`RunConfig`], one TOML file whose defaults are the
//!   paper's, and the choices it parses), [`backend`] (the burn backend by name), [`machine`]
//!   (the host's memory), [`paths`] (files compared by identity), [`output`] (the one rule every
//!   output follows: it never replaces or removes an input or a file of the user's);
//! - [`data`]: documents read, tokenized and aligned, packed into rows, laid out as
//!   micro-batches with their chunk plans, on a background loader;
//! - [`cluster`]: workers and processes: the gradient exchange ([`cluster::parallel`]), where a
//!   process sits (torchrun's or srun's variables) and the session that joins and watches them;
//! - [`harness`]: the paper's benchmarks (MMLU, GSM8k, MATH, WinoGrande, HellaSwag) scored as
//!   lm-evaluation-harness scores them; [`targets`]: stored teacher targets (`xtoken teach`),
//!   which a run reads instead of running a teacher;
//! - [`observe`]: what a run shows of itself: `metrics.csv`, TensorBoard, the plots, a step's
//!   profile;
//! - [`train`](mod@train): a run, from its inputs through one optimizer step to checkpoints and the
//!   exported student ([`train::run`] in named stages, [`train::step`], [`train::launch`] on
//!   the devices a run names).
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
//! use xtoken_train::{config::RunConfig, Run, RunOptions, Worker};
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
pub mod cluster;
pub mod config;
pub mod data;
pub mod error;
pub mod harness;
pub mod machine;
pub mod observe;
pub mod output;
pub mod paths;
pub mod targets;
pub mod train;

pub use backend::TrainBackend;
pub use cluster::parallel::Worker;
pub use config::RunConfig;
pub use error::{Error, Result};
pub use train::launch;
pub use train::options::RunOptions;
pub use train::run::{train, Run, RunSummary};
