//! What a run shows of itself while it trains: [`metrics`] (`metrics.csv`, `loss.svg`), [`progress`] (the
//! bar or the log line), [`evals`] (`eval.csv`), [`tensorboard`] (the event file) and [`profile`] (where
//! a step's time and memory go).
//!
//! It stands on the ground (`config`, `error`) and on `harness`'s reports; the training stage
//! writes through it, and nothing here imports `train`.

pub mod evals;
pub mod metrics;
pub mod profile;
pub mod progress;
pub mod roofline;
pub mod tensorboard;
