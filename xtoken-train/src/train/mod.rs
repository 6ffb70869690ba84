//! A training run, read top to bottom in the order one run goes:
//!
//! 1. [`launch`]: the run on the devices it names (one worker, data-parallel workers, or one
//!    process of several) with [`options`] from the command line;
//! 2. [`preflight`] and [`memory`]: everything the run reads checked before a weight loads, and
//!    the estimate of one device's memory; [`lock`] keeps a second process out of the directory;
//! 3. [`inputs`]: the models' configurations, tokenizers, aligners, shards and each teacher's W;
//! 4. [`run`]: the run in named stages (open, step, log, evaluate, checkpoint, export);
//! 5. [`step`]: one optimizer step (after [`on_policy`]: the student writing the step's on-policy
//!    sequences): the [`teachers`]' targets, the student's forward and
//!    backward under the distillation losses, the exchange between workers, clipping and
//!    [`optim`]'s AdamW at the [`schedule`]'s rate; [`readout`] reads its scalars once;
//! 6. [`heldout`] and [`benchmarks`]: held-out text and the paper's benchmarks scored every
//!    `eval.every` steps;
//! 7. [`checkpoint`], [`resume`] (what a resumed run may change) and [`export`] (the student as a
//!    Hugging Face directory);
//! 8. [`teach`]: the teachers' targets stored once (`xtoken teach`) for runs that read them
//!    instead of running the teachers.
//!
//! It stands on every other floor: the ground (`config`, `backend`, `machine`, `paths`),
//! `data`, `cluster`, `harness` and `observe`; nothing below imports it.

pub mod benchmarks;
pub mod checkpoint;
pub mod export;
pub mod heldout;
pub mod inputs;
pub mod launch;
pub mod lock;
pub mod memory;
pub mod on_policy;
pub mod optim;
pub mod options;
pub mod preflight;
pub mod readout;
pub mod resume;
pub mod run;
pub mod schedule;
pub mod serve;
pub mod step;
pub mod teach;
pub mod teachers;
