//! How a run is started, beside its configuration: the command line's choices (resume, stop
//! early, extend the schedule), which the configuration file does not hold.

use std::path::PathBuf;

use crate::train::resume::Extension;

/// How a run starts and how far it goes.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the newest complete checkpoint in the run directory.
    pub resume: bool,
    /// Stop (with a checkpoint) after this step instead of `training.steps`.
    pub stop_after: Option<u64>,
    /// On `resume`: `training.steps` changed, and the schedule continues this way.
    pub extend: Option<Extension>,
    /// On `resume`: train on although the data's shards changed since the checkpoint (else
    /// that is an error naming them).
    pub allow_data_change: bool,
    /// The file the configuration was read from: never overwritten by the run.
    pub config_file: Option<PathBuf>,
    /// Start although the memory estimate exceeds the device's (or the cap's) limit:
    /// `xtoken bench train` measures what it is asked to run, and shows the estimate beside.
    pub skip_memory_check: bool,
}
