//! `xtoken teach`: each teacher of a run configuration read over the run's data once, its
//! targets stored for any number of later runs (see [`crate::targets`]).
//!
//! Work is split by data shard: process `rank` of `world` (torchrun's or srun's variables)
//! takes the shards `i ≡ rank (mod world)`, each written as pieces of `teach.shard_documents`
//! documents. A piece is written whole under a temporary name and renamed into place, so a
//! killed pass keeps every finished piece and a second pass with the same configuration skips
//! them; a store written with other settings is refused, never mixed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use xtoken_core::loss::XTokenBackend;
use xtoken_core::vocab::Vocabulary;
use xtoken_kernels::host::PositionTargets;
use xtoken_models::{HfConfig, LoadOptions, Transformer};

use crate::backend::{on_backend, OnBackend, TrainBackend};
use crate::cluster::Placement;
use crate::config::{RunConfig, TeacherSettings};
use crate::data::{encode_text, fingerprint, sources, DocumentReader, Shard};
use crate::error::{Context, Error, Result};
use crate::output::{claim_work_dir, Inputs};
use crate::targets::served::ServedTeacher;
use crate::targets::shard::{ShardReader, ShardWriter};
use crate::targets::store::{shard_files, shard_name};
use crate::targets::{Manifest, FORMAT, MANIFEST};
use crate::train::teachers::{dtype_of, tokens};

/// What one teacher's pass wrote.
#[derive(Debug, Clone)]
pub struct Taught {
    /// The teacher's name.
    pub name: String,
    /// Its store.
    pub dir: PathBuf,
    /// Documents read by this process (skipped pieces not counted).
    pub documents: u64,
    /// Teacher tokens read by this process.
    pub tokens: u64,
    /// Seconds this process spent.
    pub seconds: f64,
    /// Seconds of those in the teacher's forward passes (the rest: reading the data,
    /// tokenizing, the top-K and writing).
    pub forward_seconds: f64,
    /// Pieces already in place and skipped.
    pub skipped: usize,
}

/// Runs every teacher of `config` that has a model over the run's data, into `out/<name>/`, on
/// backend `B` (the teachers run without a graph, as in training). `out` is a work directory
/// of the command's own: new, empty, or one it made (an earlier pass, continued).
pub fn teach<B: XTokenBackend>(
    config: &RunConfig,
    out: &Path,
    device: &B::Device,
) -> Result<Vec<Taught>> {
    let settings = config.teacher_settings()?;
    let place = Placement::from_env()?.map_or((0, 1), |p| (p.rank, p.world));
    let shards: Vec<Shard> = sources::sources(&config.data)
        .context("data.path")?
        .into_iter()
        .flat_map(|s| s.shards)
        .collect();
    claim_work_dir(&inputs(config, &settings), out, "xtoken teach")?;
    let mut taught = Vec::new();
    for (m, s) in settings.iter().enumerate() {
        if s.targets.is_some() {
            tracing::info!("teacher {}: already stored targets, skipped", s.name);
            continue;
        }
        let dir = out.join(&s.name);
        let pass = TeacherPass::<B>::prepare(config, m, s, &shards, &dir, device)?;
        taught.push(pass.run(config, &shards, place)?);
    }
    if taught.is_empty() {
        return Err(Error::Config(
            "teachers: none has a `model` to run or a `server` to ask; `xtoken teach` writes the \
             targets of teachers given by their model directory or their server"
                .into(),
        ));
    }
    Ok(taught)
}

/// Everything the command reads (the teachers' models and tokenizers and the data) and the
/// run's other inputs, which its targets serve (the student's model directory).
fn inputs(config: &RunConfig, settings: &[TeacherSettings]) -> Inputs {
    let mut inputs = Inputs::new()
        .with("the run's student model directory", &config.student.model)
        .with("the run's student tokenizer", config.student_tokenizer());
    for s in settings {
        inputs.add(format!("teacher {}'s model directory", s.name), &s.model);
        inputs.add(format!("teacher {}'s tokenizer", s.name), &s.tokenizer);
    }
    for entry in config.data.path.entries() {
        inputs.add("the training data", entry);
    }
    inputs.add("the run's output directory", &config.output_dir);
    inputs
}

/// Where a pass's targets come from: the teacher's model, or its server.
enum Source<B: XTokenBackend> {
    Model(Box<Transformer<B>>),
    Served(ServedTeacher),
}

/// One teacher, loaded (or its server connected), with its store's directory and manifest in
/// place.
struct TeacherPass<B: XTokenBackend> {
    name: String,
    dir: PathBuf,
    manifest: Manifest,
    vocab: Vocabulary,
    source: Source<B>,
    device: B::Device,
}

impl<B: XTokenBackend> TeacherPass<B> {
    fn prepare(
        config: &RunConfig,
        m: usize,
        s: &TeacherSettings,
        shards: &[Shard],
        dir: &Path,
        device: &B::Device,
    ) -> Result<Self> {
        let hf = HfConfig::read(&s.model).with_context(|| format!("teachers[{m}].model"))?;
        let vocab_size = hf.architecture.vocab_size;
        let vocab = Vocabulary::load_padded(&s.tokenizer, Some(vocab_size))
            .with_context(|| format!("teacher {}: its tokenizer", s.name))?;
        let dtype = dtype_of::<B>(s.dtype, device);
        let mut window = window_for(config.teach.window, &hf, &s.name);
        if s.server.is_some() && window >= hf.architecture.max_position_embeddings {
            // A served window is asked with the token after it.
            window = window.saturating_sub(1).max(1);
        }
        let (model, weights, compute) = match &s.server {
            // A served teacher's weights are the server's: its address and model stand for them.
            Some(served) => (
                format!("{} ({})", served.server, served.model),
                "served".to_string(),
                "served".to_string(),
            ),
            None => (
                s.model.display().to_string(),
                weights_sha256(&s.model)?,
                format!("{dtype:?}"),
            ),
        };
        let manifest = Manifest {
            format: FORMAT,
            teacher: s.name.clone(),
            model,
            config_sha256: file_sha256(&s.model.join("config.json"))?,
            weights_sha256: weights,
            tokenizer_sha256: vocab.sha256().to_string(),
            vocab_size,
            compute_dtype: compute,
            top_k: config.teach.top_k.min(vocab_size),
            dtype: config.teach_dtype()?,
            error_bound: config.teach_dtype()?.bound_text().into(),
            confidence: config.teach.confidence || config.teach_dtype()?.id_code().is_none(),
            temperature: config.loss.temperature,
            window,
            shard_documents: config.teach.shard_documents,
            text_field: config.data.text_field.clone(),
            data: shards
                .iter()
                .map(|sh| fingerprint::of_file_with_content(&sh.path))
                .collect::<Result<_>>()?,
        };
        claim_store(dir, &manifest)?;
        std::fs::copy(s.model.join("config.json"), dir.join("config.json"))
            .with_context(|| format!("copying {}/config.json", s.model.display()))?;
        std::fs::copy(vocab.path(), dir.join("tokenizer.json"))
            .with_context(|| format!("copying {}", vocab.path().display()))?;
        manifest.write(dir)?;
        let (source, what) = match &s.server {
            Some(served) => {
                let (teacher, _) =
                    ServedTeacher::connect(served.clone(), manifest.top_k, vocab_size)
                        .with_context(|| format!("teachers[{m}].server"))?;
                let (_, compared) = teacher
                    .probe(&vocab, crate::train::teachers::PROBE)
                    .with_context(|| format!("teachers[{m}].server"))?;
                let what = format!(
                    "served by {} (model {}; token texts agree on {compared} probe entries)",
                    served.server, served.model
                );
                (Source::Served(teacher), what)
            }
            None => {
                let model = Transformer::<B>::load_with(&s.model, LoadOptions { dtype }, device)
                    .with_context(|| format!("teacher {}", s.name))?;
                let what = format!(
                    "{} ({} parameters, {dtype:?})",
                    s.model.display(),
                    model.architecture.num_parameters()
                );
                (Source::Model(Box::new(model)), what)
            }
        };
        tracing::info!(
            "teacher {}: {what} → {} (top-{} {}, window {})",
            s.name,
            dir.display(),
            manifest.top_k,
            manifest.dtype.name(),
            manifest.window
        );
        Ok(Self {
            name: s.name.clone(),
            dir: dir.to_path_buf(),
            manifest,
            vocab,
            source,
            device: device.clone(),
        })
    }

    /// This process's data shards, piece by piece, skipping pieces already in place.
    fn run(
        &self,
        config: &RunConfig,
        shards: &[Shard],
        (rank, world): (usize, usize),
    ) -> Result<Taught> {
        let mine: Vec<usize> = (0..shards.len()).filter(|i| i % world == rank).collect();
        let total: u64 = mine
            .iter()
            .map(|&i| std::fs::metadata(&shards[i].path).map_or(0, |m| m.len()))
            .sum();
        remove_abandoned(&self.dir.join("shards"), &mine)?;
        let bar = progress_bar(total, &self.name);
        let started = Instant::now();
        let mut taught = Taught {
            name: self.name.clone(),
            dir: self.dir.clone(),
            documents: 0,
            tokens: 0,
            seconds: 0.0,
            forward_seconds: 0.0,
            skipped: 0,
        };
        let fields = crate::data::prompts::fields(config);
        for &i in &mine {
            let shard = &shards[i];
            let mut reader = DocumentReader::open(&shard.path, shard.format, fields.clone())?;
            let extractor = reader.extractor();
            for piece in 0.. {
                let path = self.dir.join("shards").join(shard_name(i, piece));
                if let Some(done) = finished_piece(&path)? {
                    reader.skip(done.index.len() as u64)?;
                    taught.skipped += 1;
                    if done.last {
                        break;
                    }
                    continue;
                }
                let m = &self.manifest;
                let mut writer = ShardWriter::new(m.top_k, m.dtype, m.temperature, m.confidence);
                let mut last = false;
                while writer.documents() < self.manifest.shard_documents {
                    let Some(raw) = reader.next_doc()? else {
                        last = true;
                        break;
                    };
                    let text = extractor.text(&raw)?;
                    let ids = encode_text(&self.vocab, &text)?;
                    let targets = self.document(&ids, &mut taught.forward_seconds)?;
                    writer.push(&ids, &targets)?;
                    taught.documents += 1;
                    taught.tokens += ids.len() as u64;
                    bar.set_position(reader.done().min(total));
                    let rate = taught.tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
                    bar.set_message(format!("{} tokens, {rate:.0} tokens/s", taught.tokens));
                }
                writer.finish(&path, i, piece, last)?;
                if last {
                    break;
                }
            }
        }
        bar.finish_and_clear();
        taught.seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            "teacher {}: {} documents, {} tokens in {:.1} s ({:.0} tokens/s; {} pieces already \
             in place)",
            self.name,
            taught.documents,
            taught.tokens,
            taught.seconds,
            taught.tokens as f64 / taught.seconds.max(1e-9),
            taught.skipped
        );
        Ok(taught)
    }

    /// One document's targets, read in windows of `teach.window` tokens, each on its own.
    fn document(&self, ids: &[u32], forward_seconds: &mut f64) -> Result<PositionTargets> {
        let mut all = PositionTargets {
            k: self.manifest.top_k,
            ..Default::default()
        };
        let window = self.manifest.window;
        let model = match &self.source {
            Source::Model(model) => model,
            Source::Served(served) => return served_document(served, ids, window, all),
        };
        for (w, part) in ids.chunks(window).enumerate() {
            let start = w * window;
            let next: Vec<i32> = (0..part.len())
                .map(|j| ids.get(start + j + 1).map_or(-1, |&t| t as i32))
                .collect();
            let row: Vec<i64> = part.iter().map(|&t| t as i64).collect();
            let input = tokens::<B>(&row, &None, [1, part.len()], &self.device)?;
            let forward = Instant::now();
            let logits = model
                .forward_of(&input)
                .with_context(|| format!("teacher {}: forward", self.name))?;
            B::sync(&self.device).ok();
            *forward_seconds += forward.elapsed().as_secs_f64();
            let t = self.manifest.temperature as f32;
            let confidence = self.manifest.confidence;
            let logits = logits.into_primitive().tensor();
            let found = B::xt_position_targets(logits, &next, all.k, t, confidence)
                .map_err(|e| Error::Targets(format!("teacher {}: {e}", self.name)))?;
            // A document within one window (most are) keeps its targets as they came.
            if all.observed.is_empty() {
                all = found;
                continue;
            }
            all.ids.extend(found.ids);
            all.logp.extend(found.logp);
            all.observed.extend(found.observed);
            all.neg_ce.extend(found.neg_ce);
            all.neg_entropy.extend(found.neg_entropy);
            all.max_prob.extend(found.max_prob);
            all.observed_rank.extend(found.observed_rank);
        }
        Ok(all)
    }
}

/// One document's targets from a served teacher, window by window: each window asked with the
/// token after it (so that its last position's next token is observed, as in-process), and the
/// document's last position, which no chunk reads (nothing follows it), kept empty.
fn served_document(
    served: &ServedTeacher,
    ids: &[u32],
    window: usize,
    mut all: PositionTargets,
) -> Result<PositionTargets> {
    let k = all.k;
    let prompts: Vec<Vec<u32>> = (0..ids.len())
        .step_by(window.max(1))
        .map(|start| ids[start..(start + window + 1).min(ids.len())].to_vec())
        .collect();
    for found in served.answers(&prompts)? {
        let cut = |v: &[u32]| v[..found.observed.len() * k].to_vec();
        all.ids.extend(cut(&found.ids));
        all.logp.extend(&found.logp[..found.observed.len() * k]);
        all.observed.extend(found.observed);
        all.neg_ce.extend(found.neg_ce);
        all.neg_entropy.extend(found.neg_entropy);
        all.max_prob.extend(found.max_prob);
        all.observed_rank.extend(found.observed_rank);
    }
    if !ids.is_empty() {
        all.ids.extend(std::iter::repeat_n(0, k));
        all.logp.extend(std::iter::repeat_n(f32::NEG_INFINITY, k));
        all.observed.push(0.0);
        all.neg_ce.push(0.0);
        all.neg_entropy.push(0.0);
        all.max_prob.push(0.0);
        all.observed_rank.push(0);
    }
    Ok(all)
}

/// The window a teacher reads in: `teach.window`, cut to the positions the model has
/// (`max_position_embeddings`), which is said, since a longer window would fail at its first
/// long document.
fn window_for(window: usize, hf: &HfConfig, name: &str) -> usize {
    let limit = hf.architecture.max_position_embeddings;
    if window <= limit {
        return window;
    }
    tracing::warn!(
        "teacher {name}: teach.window = {window} is longer than the model's \
         max_position_embeddings ({limit}); it reads its documents in windows of {limit} tokens"
    );
    limit
}

/// Removes the temporary files of pieces of the data shards `mine` that an earlier process
/// left when it was killed mid-write (`NNNNN-PPPPP.xtt.xtoken-tmp-PID`): only this process
/// writes pieces of its shards, so any such file is no live writer's.
fn remove_abandoned(shards: &Path, mine: &[usize]) -> Result<()> {
    let listing =
        std::fs::read_dir(shards).with_context(|| format!("{}: listing it", shards.display()))?;
    for entry in listing.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((piece, pid)) = name.split_once(".xtt.xtoken-tmp-") else {
            continue;
        };
        let shard = piece
            .split('-')
            .next()
            .and_then(|i| i.parse::<usize>().ok());
        let ours = shard.is_some_and(|i| mine.contains(&i));
        if ours && pid != std::process::id().to_string() {
            tracing::info!("removing {}, left by a pass that was stopped", name);
            std::fs::remove_file(entry.path())
                .with_context(|| format!("{}: removing it", entry.path().display()))?;
        }
    }
    Ok(())
}

/// A piece already in place and whole, or `None` (absent; a damaged one is an error).
fn finished_piece(path: &Path) -> Result<Option<ShardReader>> {
    if !path.exists() {
        return Ok(None);
    }
    ShardReader::open(path).map(Some)
}

/// Makes `dir` the store of `manifest`: a new or empty directory, or one holding a store with
/// the very same manifest (an interrupted pass, continued).
fn claim_store(dir: &Path, manifest: &Manifest) -> Result<()> {
    let has_entries = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
    if has_entries {
        if !dir.join(MANIFEST).is_file() {
            return Err(Error::Run(format!(
                "{}: holds files that are no stored targets; refusing to write into it, choose \
                 another --out",
                dir.display()
            )));
        }
        let found = Manifest::read(dir)?;
        let mut differ = differences(&found, manifest);
        // The data by content: a pass continued after the data was touched or moved goes on.
        let data = fingerprint::content_changes(&found.data, &manifest.data)?;
        // The error bound follows from the dtype.
        differ.retain(|field| field != "data" && field != "error_bound");
        if !data.is_empty() {
            differ.push(format!("data: {}", data.join("; ")));
        }
        if !differ.is_empty() {
            return Err(Error::Run(format!(
                "{}: holds targets written with other settings ({}); refusing to mix them, \
                 choose another --out",
                dir.display(),
                differ.join(", ")
            )));
        }
    }
    std::fs::create_dir_all(dir.join("shards"))
        .with_context(|| format!("creating {}", dir.join("shards").display()))?;
    Ok(())
}

/// The manifest fields that differ, by name.
fn differences(a: &Manifest, b: &Manifest) -> Vec<String> {
    let (a, b) = (serde_json::to_value(a), serde_json::to_value(b));
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) else {
        return vec!["the manifest".into()];
    };
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect()
}

fn progress_bar(total: u64, name: &str) -> ProgressBar {
    let visible = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if visible {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    let template =
        format!("teach {name} {{bar:30}} {{bytes}}/{{total_bytes}} · {{msg}} · ETA {{eta}}");
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// SHA-256 of a file, streamed.
fn file_sha256(path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    hash_into(&mut hasher, path)?;
    Ok(hex(&hasher.finalize()))
}

/// SHA-256 of a model directory's safetensors files, in name order, one after another.
fn weights_sha256(dir: &Path) -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: listing it", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for file in &files {
        hash_into(&mut hasher, file)?;
    }
    Ok(hex(&hasher.finalize()))
}

fn hash_into(hasher: &mut Sha256, path: &Path) -> Result<()> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("{}: hashing it", path.display()))?;
    let mut buffer = vec![0u8; 8 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("{}: hashing it", path.display()))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buffer[..n]);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// [`teach`] on the backend `config.device` names.
pub fn teach_on_device(config: &RunConfig, out: &Path) -> Result<Vec<Taught>> {
    struct Work<'a>(&'a RunConfig, &'a Path);
    impl OnBackend for Work<'_> {
        type Output = Vec<Taught>;
        fn run<B: TrainBackend>(self, devices: Vec<B::Device>) -> Result<Vec<Taught>> {
            let device = devices.into_iter().next().unwrap_or_default();
            teach::<B::InnerBackend>(self.0, self.1, &device)
        }
    }
    on_backend(config.device.parse()?, &[], Work(config, out))
}

/// Bytes of a store's shard files (their sizes, nothing read).
pub fn shard_bytes(dir: &Path) -> Result<u64> {
    let mut bytes = 0;
    for file in shard_files(dir)? {
        bytes += std::fs::metadata(&file)
            .with_context(|| format!("{}: its size", file.display()))?
            .len();
    }
    Ok(bytes)
}
