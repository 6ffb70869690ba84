//! Checkpoints: the student, both of its optimizer groups, each teacher's W and W's optimizer
//! (burn records in full precision), and `state.json` (step, loader position, tokens, time).
//! A checkpoint is written to `step-N.tmp-PID/` and renamed into place, so a run killed while
//! saving leaves only the temporary directory, which [`latest`] removes.
//!
//! With `checkpoint.hf`, the student is also written as a Hugging Face directory `hf/` inside
//! the checkpoint (see [`crate::train::export`]).
//!
//! The last file written before the rename is `manifest.json`: every other file's size and
//! xxh3-64 checksum (`hf/`'s files included). [`latest`] verifies it and never loads a checkpoint whose bytes differ
//! (a flipped bit, a truncated or missing file, no manifest): it names the file at fault and
//! falls back to the newest older checkpoint that is intact.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use serde::{Deserialize, Serialize};

use xtoken_core::temporary::Temporary;

use crate::backend::TrainBackend;
use crate::data::LoaderState;
use crate::error::{Context, Error, Result};
use crate::train::optim::Trainable;
use crate::train::teachers::Teacher;

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
    /// Where the learning rate's decay restarted when the run was extended with
    /// `--extend-steps decay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_from: Option<crate::train::schedule::DecayAnchor>,
    /// The training data's shards as they were when the run started (or last accepted a
    /// change), compared on `--resume`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<crate::data::fingerprint::ShardPrint>,
    /// The last step's α and `γ`, which `scaling_scope = "previous-step"` applies next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<crate::train::step::Scaling>,
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::<FullPrecisionSettings>::new()
}

/// The file a checkpoint ends with.
const MANIFEST: &str = "manifest.json";

/// One file of a checkpoint as it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileSum {
    bytes: u64,
    /// xxh3-64 of the bytes, in hex.
    xxh3: String,
}

/// Size and checksum of a file, read in 8 MiB pieces.
fn file_sum(path: &Path) -> Result<FileSum> {
    let mut file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buffer = vec![0u8; 8 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("{}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    Ok(FileSum {
        bytes,
        xxh3: format!("{:016x}", hasher.digest()),
    })
}

/// Every file of `dir` but the manifest, by its path under `dir` (`hf/config.json`).
fn files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    collect_files(dir, "", &mut names)?;
    names.retain(|n| n != MANIFEST);
    names.sort();
    Ok(names)
}

fn collect_files(dir: &Path, prefix: &str, names: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let entry = entry?;
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if entry.file_type()?.is_dir() {
            collect_files(&entry.path(), &format!("{name}/"), names)?;
        } else {
            names.push(name);
        }
    }
    Ok(())
}

/// Writes `dir`'s manifest: the size and checksum of every other file.
fn write_manifest(dir: &Path) -> Result<()> {
    let mut manifest = BTreeMap::new();
    for name in files(dir)? {
        manifest.insert(name.clone(), file_sum(&dir.join(&name))?);
    }
    std::fs::write(dir.join(MANIFEST), serde_json::to_string_pretty(&manifest)?)
        .with_context(|| format!("{}: writing {MANIFEST}", dir.display()))
}

/// Checks `dir` against its manifest; the error names the first file at fault.
fn verify(dir: &Path) -> std::result::Result<(), String> {
    let text = std::fs::read_to_string(dir.join(MANIFEST))
        .map_err(|_| format!("no {MANIFEST} (a save that did not finish, or damaged)"))?;
    let manifest: BTreeMap<String, FileSum> =
        serde_json::from_str(&text).map_err(|e| format!("{MANIFEST} is not valid: {e}"))?;
    for (name, want) in &manifest {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(format!(
                "{name} is missing ({} is not there)",
                path.display()
            ));
        }
        let got = file_sum(&path).map_err(|e| format!("{name}: {e}"))?;
        if got.bytes != want.bytes {
            return Err(format!(
                "{name} holds {} bytes, {} were written",
                got.bytes, want.bytes
            ));
        }
        if got.xxh3 != want.xxh3 {
            return Err(format!(
                "{name} does not match its checksum (xxh3 {} where {} was written): the file is damaged",
                got.xxh3, want.xxh3
            ));
        }
    }
    let listed: Vec<&String> = manifest.keys().collect();
    match files(dir)
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|f| !listed.contains(&f))
    {
        Some(extra) => Err(format!("{extra} is not in {MANIFEST}")),
        None => Ok(()),
    }
}

/// Whether `dir` holds any finished checkpoint (without verifying it).
pub fn any(dir: &Path) -> Result<bool> {
    Ok(!candidates(dir)?.is_empty())
}

/// The newest checkpoint under `dir` whose files match their manifest, removing interrupted
/// saves. A damaged checkpoint is reported and skipped for the next older one; when there are
/// checkpoints and none is intact, that is an error naming each one's fault.
pub fn latest(dir: &Path) -> Result<Option<(PathBuf, CheckpointState)>> {
    let found = candidates(dir)?;
    if found.is_empty() {
        return Ok(None);
    }
    let mut faults = Vec::new();
    for (path, state) in found {
        let intact = verify(&path).and(state);
        match intact {
            Ok(state) => return Ok(Some((path, state))),
            Err(why) => {
                tracing::warn!(
                    "checkpoint {} is damaged: {why}; trying the previous one",
                    path.display()
                );
                faults.push(format!("{}: {why}", path.display()));
            }
        }
    }
    Err(Error::Run(format!(
        "no intact checkpoint in {}: {}",
        dir.display(),
        faults.join("; ")
    )))
}

/// A checkpoint's state, or why it cannot be read.
type StateOrFault = std::result::Result<CheckpointState, String>;

/// The finished checkpoints under `dir` (`step-N`), newest first by the step their name says,
/// each with its state or why that cannot be read, removing interrupted saves.
fn candidates(dir: &Path) -> Result<Vec<(PathBuf, StateOrFault)>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut found: Vec<(PathBuf, u64, StateOrFault)> = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains(".tmp") {
            tracing::warn!("removing {} (a save that did not finish)", path.display());
            std::fs::remove_dir_all(&path).ok();
            continue;
        }
        let Some(step) = name
            .strip_prefix("step-")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let state = match std::fs::read_to_string(path.join("state.json")) {
            Err(e) => Err(format!("state.json cannot be read ({e})")),
            Ok(text) => serde_json::from_str::<CheckpointState>(&text)
                .map_err(|e| format!("state.json is not valid ({e})")),
        };
        found.push((path, step, state));
    }
    found.sort_by_key(|(_, step, _)| std::cmp::Reverse(*step));
    Ok(found.into_iter().map(|(p, _, s)| (p, s)).collect())
}

/// Saves a checkpoint of step `state.step` under `dir` and keeps only the newest `keep`;
/// `extra` writes more files into the checkpoint's directory before its manifest (the `hf/`
/// export).
pub fn save<B: TrainBackend>(
    dir: &Path,
    state: &CheckpointState,
    trainable: &Trainable<B>,
    teachers: &[Teacher<B>],
    keep: usize,
    extra: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let final_dir = dir.join(format!("step-{:08}", state.step));
    // A failed or interrupted save (a full disk, Ctrl-C) leaves nothing half written behind.
    let tmp = Temporary::beside(&final_dir, "tmp");
    write_directory(tmp.path(), state, trainable, teachers, extra)?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).ok();
    }
    let at = tmp.path().display().to_string();
    tmp.persist(&final_dir)
        .with_context(|| format!("renaming {at} into place"))?;
    prune(dir, keep)?;
    Ok(final_dir)
}

/// Writes a checkpoint's files into the directory `tmp`, the manifest last.
fn write_directory<B: TrainBackend>(
    tmp: &Path,
    state: &CheckpointState,
    trainable: &Trainable<B>,
    teachers: &[Teacher<B>],
    extra: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    std::fs::create_dir_all(tmp).with_context(|| format!("{}", tmp.display()))?;
    write_records(tmp, trainable, teachers)?;
    extra(tmp)?;
    std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(state)?)
        .with_context(|| format!("{}: writing state.json", tmp.display()))?;
    write_manifest(tmp)
}

/// Writes the tensors' records into `dir`.
fn write_records<B: TrainBackend>(
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

/// The state of the checkpoint in `dir`, after checking every file against its manifest.
pub fn verified(dir: &Path) -> Result<CheckpointState> {
    if !dir.is_dir() {
        let what = match dir.exists() {
            true => "a file, not a checkpoint directory",
            false => "no such checkpoint (checkpoints are <output_dir>/checkpoints/step-N)",
        };
        return Err(Error::Run(format!("{}: {what}", dir.display())));
    }
    verify(dir).map_err(|why| Error::Run(format!("checkpoint {}: {why}", dir.display())))?;
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// Loads the student of the checkpoint in `dir` into `student` (of any backend).
pub fn load_student<B: burn::tensor::backend::Backend>(
    dir: &Path,
    student: xtoken_models::Transformer<B>,
    device: &B::Device,
) -> Result<xtoken_models::Transformer<B>> {
    let record = recorder()
        .load(dir.join("student"), device)
        .with_context(|| format!("{}: reading the student", dir.display()))?;
    Ok(student.load_record(record))
}

/// Loads the checkpoint in `dir` into the student, its optimizers and each teacher's W.
pub fn restore<B: TrainBackend>(
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
