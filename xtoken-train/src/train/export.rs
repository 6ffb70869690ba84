//! The student as a Hugging Face directory: `config.json`, `model.safetensors` (HF names and
//! layout, `checkpoint.save_dtype`) and the files that travel with a model (tokenizer, chat
//! template, generation configuration), written at the end of a run, into every checkpoint with
//! `checkpoint.hf`, or from any checkpoint afterwards (`xtoken export`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use xtoken_models::checkpoint::SINGLE_FILE;
use xtoken_models::{LoadOptions, SaveDtype, Transformer};

use crate::config::{DtypeChoice, RunConfig};
use crate::error::{Context, Error, Result};
use crate::harness::model::Loaded;
use crate::output::{write_dir, written_by_xtoken, Inputs, Names, Own};
use crate::train::checkpoint;
use crate::train::teachers::dtype_of;

/// Writes `student` into the new directory `dir` with the student's companion files.
pub fn write_student<B: Backend>(
    config: &RunConfig,
    student: &Transformer<B>,
    dir: &Path,
) -> Result<()> {
    student
        .save(dir, save_dtype(config.save_dtype()?))
        .context("saving the student")?;
    copy_companions(&config.student.model, dir)?;
    let tokenizer = xtoken_core::vocab::resolve_tokenizer_json(&config.student_tokenizer())?;
    std::fs::copy(&tokenizer, dir.join("tokenizer.json"))
        .with_context(|| format!("copying {}", tokenizer.display()))?;
    Ok(())
}

/// The trained student (of an autodiff backend) into `out` (see [`write_export`]).
pub fn export_trained<B: AutodiffBackend>(
    config: &RunConfig,
    student: &Transformer<B>,
    out: &Path,
) -> Result<PathBuf> {
    check_target(config, out)?;
    write_export(out, |tmp| write_student(config, &student.valid(), tmp))
}

/// The student of the checkpoint `dir` (its manifest verified) of the run `config` describes,
/// as a Hugging Face directory `out`, on `device`. `out` may not be, hold or lie inside an
/// input: the checkpoint, the run directory, the student's model directory or tokenizer.
pub fn export_checkpoint<B: Backend>(
    config: &RunConfig,
    dir: &Path,
    out: &Path,
    device: &B::Device,
) -> Result<(PathBuf, u64)> {
    let run = dir.parent().and_then(Path::parent).unwrap_or(dir);
    let inputs = export_inputs(config)
        .with("the checkpoint", dir)
        .with("the run directory", run)
        .with("the run directory", config.output_dir.as_path());
    inputs.check(out, &export_own(config)?)?;
    let dtype = dtype_of::<B>(config.student_dtype()?, device);
    let (student, step) = checkpoint_student::<B>(config, dir, dtype, device)?;
    let written = write_export(out, |tmp| write_student(config, &student, tmp))?;
    Ok((written, step))
}

/// The student of the checkpoint `dir` (its manifest verified) of the run `config` describes,
/// with parameters of `dtype` on `device`, and the checkpoint's step.
pub fn checkpoint_student<B: Backend>(
    config: &RunConfig,
    dir: &Path,
    dtype: burn::tensor::DType,
    device: &B::Device,
) -> Result<(Transformer<B>, u64)> {
    let state = checkpoint::verified(dir)?;
    let student = Transformer::<B>::load_with(&config.student.model, LoadOptions { dtype }, device)
        .context("the student's architecture")?;
    Ok((checkpoint::load_student(dir, student, device)?, state.step))
}

/// The names of the files an export of `config`'s student writes: the model's, the tokenizer,
/// and the companions of the student's model directory.
pub fn exported_names(config: &RunConfig) -> Result<BTreeSet<String>> {
    let mut names = model_names(&config.student.model)?;
    names.insert("tokenizer.json".into());
    Ok(names)
}

/// The names of the files a model directory written from `model` holds: `config.json`, the
/// weights, and `model`'s companions ([`copy_companions`]).
pub fn model_names(model: &Path) -> Result<BTreeSet<String>> {
    let mut names: BTreeSet<String> = [SINGLE_FILE, "config.json"]
        .into_iter()
        .map(String::from)
        .collect();
    names.extend(companions(model)?);
    Ok(names)
}

/// Checks that `out` may take an export of `config`'s student before anything is written: it is
/// not, holds no and lies in no model directory, tokenizer or data the run reads, and, when it
/// exists, it is an earlier export (only files an export writes, `config.json` among them), which
/// is replaced ([`crate::output`]).
pub fn check_target(config: &RunConfig, out: &Path) -> Result<()> {
    export_inputs(config).check(out, &export_own(config)?)
}

/// What a run reads: its model directories (or stores), tokenizers, training and held-out data.
pub fn run_inputs(config: &RunConfig) -> Inputs {
    let mut inputs = export_inputs(config);
    if let Some(path) = config.eval.as_ref().and_then(|e| e.path.as_ref()) {
        for data in path.entries() {
            inputs.add("the held-out data", data.clone());
        }
    }
    inputs
}

/// What the run behind an export reads: its model directories, tokenizers and training data.
fn export_inputs(config: &RunConfig) -> Inputs {
    let mut inputs = Inputs::new()
        .with(
            "the student's model directory",
            config.student.model.clone(),
        )
        .with("the student's tokenizer", config.student_tokenizer());
    for t in &config.teachers {
        inputs.add("a teacher's model directory", t.dir());
        if let Some(tokenizer) = &t.tokenizer {
            inputs.add("a teacher's tokenizer", tokenizer.clone());
        }
    }
    for data in config.data.path.entries() {
        inputs.add("the training data", data.clone());
    }
    inputs
}

/// What an export writes.
fn export_own(config: &RunConfig) -> Result<Own<'static>> {
    Ok(Own::Dir {
        what: "an export",
        names: Names::of(exported_names(config)?),
        signature: "config.json",
        signed: written_by_xtoken,
    })
}

/// Writes an export through a temporary directory beside `out`, removed on failure or
/// interruption, and swapped for an earlier export in one rename ([`check_target`] comes
/// first).
pub fn write_export(out: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    write_dir(out, write)?;
    Ok(out.to_path_buf())
}

/// The file names [`copy_companions`] copies from `model`.
fn companions(model: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let entries =
        std::fs::read_dir(model).with_context(|| format!("listing {}", model.display()))?;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let weights = name.starts_with("model") || name.starts_with("pytorch_model");
        if path.is_file() && name != "config.json" && !weights {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Copies the files that travel with a model (tokenizer files, chat template, generation and
/// special-token configurations, a README) from `model` to `dir`: every file but `config.json`
/// and the weights (`model*`, `pytorch_model*`).
pub fn copy_companions(model: &Path, dir: &Path) -> Result<Vec<String>> {
    let copied = companions(model)?;
    for name in &copied {
        let path = model.join(name);
        std::fs::copy(&path, dir.join(name))
            .with_context(|| format!("copying {}", path.display()))?;
    }
    Ok(copied)
}

fn save_dtype(choice: DtypeChoice) -> SaveDtype {
    match choice {
        DtypeChoice::Bf16 | DtypeChoice::Auto => SaveDtype::BF16,
        DtypeChoice::F16 => SaveDtype::F16,
        DtypeChoice::F32 => SaveDtype::F32,
    }
}

/// The run directory's configuration of a checkpoint `…/<output_dir>/checkpoints/step-N`.
pub fn run_config_of(checkpoint: &Path) -> Result<PathBuf> {
    let run_toml = checkpoint
        .parent()
        .and_then(Path::parent)
        .map(|run| run.join("run.toml"))
        .filter(|p| p.exists());
    run_toml.ok_or_else(|| {
        Error::Config(format!(
            "{}: no run.toml two directories up (a checkpoint lies in <output_dir>/checkpoints/); \
             pass --config",
            checkpoint.display()
        ))
    })
}

/// Loads a model to score (`xtoken eval`): a Hugging Face model directory, or a training
/// checkpoint (a directory with `state.json`) with the run configuration `config` (default: the
/// run's `run.toml` two directories up), whose tokenizer and special tokens are then the run's
/// student's.
pub fn load_for_eval<B: Backend>(
    path: &Path,
    config: Option<&Path>,
    dtype: burn::tensor::DType,
    device: &B::Device,
) -> Result<Loaded<B>> {
    if !path.join("state.json").is_file() {
        return Loaded::hub(path, dtype, device);
    }
    let config_path = match config {
        Some(c) => c.to_path_buf(),
        None => run_config_of(path)?,
    };
    let run = RunConfig::load_saved(&config_path)?;
    let (model, step) = checkpoint_student::<B>(&run, path, dtype, device)?;
    let source = format!("checkpoint {} (step {step})", path.display());
    Loaded::with(model, &run.student.model, &run.student_tokenizer(), source)
}
