//! Checkpoints: the student, both of its optimizer groups, each teacher's W and W's optimizer
//! (burn records in full precision), and `state.json` (step, loader position, tokens, time).
//! A checkpoint is written to `step-N.tmp-PID/` and renamed into place, so a run killed while
//! saving leaves only the temporary directory, which [`latest`] removes.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::data::LoaderState;
use crate::error::{Context, Result};
use crate::optim::Trainable;
use crate::teachers::Teacher;

/// What a checkpoint records besides the tensors.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Steps completed.
    pub step: u64,
    /// Where the loader stands for the next step.
    pub loader: LoaderState,
    /// Student tokens trained on so far.
    pub tokens: u64,
    /// Training time so far, in seconds.
    pub seconds: f64,
    /// The teachers' names, in order.
    pub teachers: Vec<String>,
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::<FullPrecisionSettings>::new()
}

/// The newest complete checkpoint under `dir`, removing interrupted saves.
pub fn latest(dir: &Path) -> Result<Option<(PathBuf, CheckpointState)>> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut best: Option<(PathBuf, CheckpointState)> = None;
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains(".tmp") {
            eprintln!("removing {} (a save that did not finish)", path.display());
            std::fs::remove_dir_all(&path).ok();
            continue;
        }
        if !name.starts_with("step-") {
            continue;
        }
        let state = std::fs::read_to_string(path.join("state.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<CheckpointState>(&t).ok());
        let Some(state) = state else {
            eprintln!("skipping {}: no readable state.json", path.display());
            continue;
        };
        if best.as_ref().is_none_or(|(_, b)| state.step > b.step) {
            best = Some((path, state));
        }
    }
    Ok(best)
}

/// Saves a checkpoint of step `state.step` under `dir` and keeps only the newest `keep`.
pub fn save<B: AutodiffBackend>(
    dir: &Path,
    state: &CheckpointState,
    trainable: &Trainable<B>,
    teachers: &[Teacher<B>],
    keep: usize,
) -> Result<PathBuf> {
    let final_dir = dir.join(format!("step-{:08}", state.step));
    let tmp = dir.join(format!("step-{:08}.tmp-{}", state.step, std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("{}", tmp.display()))?;
    write_records(&tmp, trainable, teachers)?;
    std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(state)?)
        .with_context(|| format!("{}: writing state.json", tmp.display()))?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).ok();
    }
    std::fs::rename(&tmp, &final_dir)
        .with_context(|| format!("renaming {} into place", tmp.display()))?;
    prune(dir, keep)?;
    Ok(final_dir)
}

/// Writes the tensors' records into `dir`.
fn write_records<B: AutodiffBackend>(
    dir: &Path,
    trainable: &Trainable<B>,
    teachers: &[Teacher<B>],
) -> Result<()> {
    let rec = recorder();
    let err = |what: &str| format!("{}: writing {what}", dir.display());
    rec.record(trainable.student.clone().into_record(), dir.join("student"))
        .with_context(|| err("the student"))?;
    rec.record(trainable.decay.to_record(), dir.join("optim-decay"))
        .with_context(|| err("the optimizer"))?;
    rec.record(trainable.no_decay.to_record(), dir.join("optim-no-decay"))
        .with_context(|| err("the optimizer"))?;
    for (t, optim) in teachers.iter().zip(&trainable.projections) {
        let name = &t.settings.name;
        if let Some(w) = &t.projection {
            rec.record(w.clone().into_record(), dir.join(format!("w-{name}")))
                .with_context(|| err("W"))?;
        }
        if let Some(optim) = optim {
            rec.record(optim.to_record(), dir.join(format!("w-optim-{name}")))
                .with_context(|| err("W's optimizer"))?;
        }
    }
    Ok(())
}

/// Deletes all but the newest `keep` checkpoints.
fn prune(dir: &Path, keep: usize) -> Result<()> {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy().starts_with("step-") && !n.to_string_lossy().contains(".tmp")
            })
        })
        .collect();
    steps.sort();
    while steps.len() > keep {
        let old = steps.remove(0);
        std::fs::remove_dir_all(&old).ok();
    }
    Ok(())
}

/// Loads the checkpoint in `dir` into the student, its optimizers and each teacher's W.
pub fn restore<B: AutodiffBackend>(
    dir: &Path,
    trainable: &mut Trainable<B>,
    teachers: &mut [Teacher<B>],
    device: &B::Device,
) -> Result<()> {
    let rec = recorder();
    let err = |what: &str| format!("{}: reading {what}", dir.display());
    let student = rec
        .load(dir.join("student"), device)
        .with_context(|| err("the student"))?;
    trainable.set_student(trainable.student.clone().load_record(student));
    let optim = rec
        .load(dir.join("optim-decay"), device)
        .with_context(|| err("the optimizer"))?;
    trainable.decay = trainable.decay.clone().load_record(optim);
    let optim = rec
        .load(dir.join("optim-no-decay"), device)
        .with_context(|| err("the optimizer"))?;
    trainable.no_decay = trainable.no_decay.clone().load_record(optim);
    for (t, optim) in teachers.iter_mut().zip(trainable.projections.iter_mut()) {
        let name = &t.settings.name;
        if let Some(w) = t.projection.take() {
            let record = rec
                .load(dir.join(format!("w-{name}")), device)
                .with_context(|| err("W"))?;
            t.projection = Some(w.load_record(record));
        }
        if let Some(o) = optim.take() {
            let record = rec
                .load(dir.join(format!("w-optim-{name}")), device)
                .with_context(|| err("W's optimizer"))?;
            *optim = Some(o.load_record(record));
        }
    }
    Ok(())
}
