//! The student as a Hugging Face directory: `config.json`, `model.safetensors` (HF names and
//! layout, `checkpoint.save_dtype`) and the files that travel with a model (tokenizer, chat
//! template, generation configuration), written at the end of a run, into every checkpoint with
//! `checkpoint.hf`, or from any checkpoint afterwards (`xtoken export`).

use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use xtoken_models::{LoadOptions, SaveDtype, Transformer};

use crate::checkpoint;
use crate::config::{DtypeChoice, RunConfig};
use crate::error::{Context, Error, Result};
use crate::teachers::dtype_of;

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

/// The trained student (of an autodiff backend) into `out`, through `out.tmp` renamed into
/// place; what was at `out` is replaced only once the new directory is whole.
pub fn export_trained<B: AutodiffBackend>(
    config: &RunConfig,
    student: &Transformer<B>,
    out: &Path,
) -> Result<PathBuf> {
    replace_dir(out, |tmp| write_student(config, &student.valid(), tmp))
}

/// The student of the checkpoint `dir` (its manifest verified) of the run `config` describes,
/// as a Hugging Face directory `out`, on `device`.
pub fn export_checkpoint<B: Backend>(
    config: &RunConfig,
    dir: &Path,
    out: &Path,
    device: &B::Device,
) -> Result<(PathBuf, u64)> {
    let dtype = dtype_of::<B>(config.student_dtype()?, device);
    let (student, step) = checkpoint_student::<B>(config, dir, dtype, device)?;
    let written = replace_dir(out, |tmp| write_student(config, &student, tmp))?;
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

/// Writes a directory through `<out>.tmp` renamed into place.
fn replace_dir(out: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let tmp = out.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).ok();
    }
    let written = write(&tmp);
    if written.is_err() {
        std::fs::remove_dir_all(&tmp).ok();
    }
    written?;
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("{}", out.display()))?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(out.to_path_buf())
}

/// Copies the files that travel with a model (tokenizer files, chat template, generation and
/// special-token configurations, a README) from `model` to `dir`: every file but `config.json`
/// and the weights (`model*`, `pytorch_model*`).
pub fn copy_companions(model: &Path, dir: &Path) -> Result<Vec<String>> {
    let mut copied = Vec::new();
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
            std::fs::copy(&path, dir.join(&name))
                .with_context(|| format!("copying {}", path.display()))?;
            copied.push(name);
        }
    }
    copied.sort();
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
