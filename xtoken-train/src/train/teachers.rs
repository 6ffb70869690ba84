//! The teachers of a run: each one's model (run without a graph, in its own dtype), its loss
//! (`auto` resolved by the coverage audit) and the tables that loss reads: the common set for
//! GOLD and H-KL, the learnable W for P-KL. Per micro-batch a teacher turns into its top-K
//! targets.

use std::path::Path;
use std::sync::Arc;

use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use xtoken_core::audit::{self, AuditOptions};
use xtoken_core::common::{CommonSet, CommonTables};
use xtoken_core::loss::multi::Weighting;
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_core::loss::{hkl, Loss, LossKind, LossParams, TeacherTargets, TopK};
use xtoken_core::projection::SparseProjection;
use xtoken_core::vocab::Vocabulary;
use xtoken_models::{LoadOptions, ModelError, Tokens, Transformer};

use crate::backend::TrainBackend;
use crate::config::{DtypeChoice, RunConfig, TeacherSettings};
use crate::data::{fingerprint, TeacherBatch};
use crate::error::{Context, Error, Result};
use crate::observe::profile;
use crate::targets::served::ServedTeacher;
use crate::targets::store::Store;
use crate::train::inputs::{projection_for, RunInputs};

/// A teacher with everything its loss needs.
pub struct Teacher<B: AutodiffBackend> {
    /// Its settings.
    pub settings: TeacherSettings,
    /// Its loss (`auto` resolved).
    pub kind: LossKind,
    /// The model, on the inner backend: it never enters the graph (`None`: stored targets).
    pub model: Option<Transformer<B::InnerBackend>>,
    /// Its stored targets (`teachers[].targets`), whose entries the loader merges.
    pub store: Option<Arc<Store>>,
    /// Its server (`teachers[].server`), whose answers the loader merges.
    pub served: Option<Arc<ServedTeacher>>,
    /// Its vocabulary size (the width of its logits).
    pub vocab: usize,
    /// GOLD, H-KL: the common set's tables.
    pub tables: Option<CommonTables>,
    /// P-KL: W, learnable unless `projection.learnable = false`.
    pub projection: Option<LearnableProjection<B>>,
}

impl<B: TrainBackend> Teacher<B> {
    /// Teacher `m` of the run: its loss, W and tables, and its model on `device`. `lead` prints
    /// what was chosen.
    pub fn load(
        config: &RunConfig,
        inputs: &RunInputs,
        m: usize,
        device: &B::Device,
        (lead, allow_data_change): (bool, bool),
    ) -> Result<Self> {
        let settings = &inputs.settings[m];
        let (student, teacher) = (&inputs.pipeline.student, &inputs.pipeline.teachers[m]);
        let widths = (
            inputs.student_config.architecture.vocab_size,
            inputs.teacher_configs[m].architecture.vocab_size,
        );
        let (kind, w) = match settings.loss {
            Some(kind) if !kind.needs_projection() => (kind, None),
            Some(kind) => (
                kind,
                Some(projection_for(config, settings, student, teacher)?),
            ),
            None => {
                let w = projection_for(config, settings, student, teacher)?;
                (audit_choice(settings, student, teacher, &w, lead), Some(w))
            }
        };
        check_kl(m, kind, student, teacher)?;
        let tables = common_tables(kind, student, teacher, w.as_ref(), widths)?;
        let projection = match (kind, &w) {
            (LossKind::Pkl, Some(w)) => {
                let module = LearnableProjection::<B>::new(w, widths.0, device)?;
                Some(if config.projection.learnable {
                    module
                } else {
                    module.no_grad()
                })
            }
            _ => None,
        };
        let (model, store) = match &settings.targets {
            None if settings.server.is_some() => {
                let (served, said) = connect_served(config, inputs, m)?;
                if lead {
                    tracing::info!(
                        "teacher {}: {said}, {}, α = {}",
                        settings.name,
                        kind.name(),
                        settings.alpha
                    );
                }
                return Ok(Self {
                    settings: settings.clone(),
                    kind,
                    model: None,
                    store: None,
                    served: Some(Arc::new(served)),
                    vocab: widths.1,
                    tables,
                    projection,
                });
            }
            Some(dir) => {
                let store = open_store(config, inputs, m, dir, allow_data_change)?;
                if lead {
                    tracing::info!(
                        "teacher {}: stored targets {} ({} documents, top-{} {}), {}, α = {}",
                        settings.name,
                        dir.display(),
                        store.documents(),
                        store.manifest.top_k,
                        store.manifest.dtype.name(),
                        kind.name(),
                        settings.alpha
                    );
                }
                (None, Some(Arc::new(store)))
            }
            None => (Some(load_model::<B>(settings, kind, device, lead)?), None),
        };
        Ok(Self {
            settings: settings.clone(),
            kind,
            model,
            store,
            served: None,
            vocab: widths.1,
            tables,
            projection,
        })
    }

    /// The loss bound to this teacher's tables.
    pub fn loss(&self) -> Result<Loss<'_, B>> {
        Ok(Loss::new(
            self.kind,
            self.tables.as_ref(),
            self.projection.as_ref(),
        )?)
    }

    /// Runs the teacher on its side of a micro-batch of `rows` rows (no graph) and keeps its
    /// top-K merged log-probabilities per chunk; with adaptive weighting, its confidence too.
    /// A stored teacher's entries were merged by the loader: they are uploaded.
    pub fn targets(
        &self,
        batch: &TeacherBatch,
        rows: usize,
        params: &LossParams,
        weighting: Weighting,
        device: &B::Device,
    ) -> Result<TeacherTargets<B>> {
        let Some(model) = &self.model else {
            let entries = batch.stored.as_ref().ok_or_else(|| {
                Error::Run(format!(
                    "teacher {}: a micro-batch came without its stored entries",
                    self.settings.name
                ))
            })?;
            let built = TeacherTargets::from_host(entries, self.vocab, &batch.plan, params, device);
            return built.with_context(|| format!("teacher {}", self.settings.name));
        };
        // Rows are padded on the right and attention is causal: no real position sees a padded
        // one, and the plan reads real rows only. So the teacher runs without a padding mask,
        // which would build a `[rows, 1, len, len]` mask on the host and leave the causal kernel.
        let forward = |name: &str| format!("teacher {name}: forward");
        let tokens = tokens::<B::InnerBackend>(&batch.ids, &None, [rows, batch.len], device)
            .with_context(|| forward(&self.settings.name))?;
        let logits = match model.forward_of(&tokens) {
            Ok(logits) => logits,
            // The model's own check of its positions, said in the run's terms.
            Err(ModelError::TooLong { len, limit }) => {
                return Err(Error::Config(format!(
                    "teacher {}: a packed row holds {len} of its tokens, more than its \
                     max_position_embeddings = {limit} ({}/config.json); lower \
                     training.context_length",
                    self.settings.name,
                    self.settings.model.display()
                )))
            }
            Err(e) => return Err(e).with_context(|| forward(&self.settings.name)),
        };
        profile::boundary::<B>(device, || forward(&self.settings.name));
        let logits = Tensor::<B, 3>::from_inner(logits);
        let built = if matches!(weighting, Weighting::Adaptive(_)) {
            TeacherTargets::with_confidence(logits, &batch.plan, params)
        } else {
            TeacherTargets::new(logits, &batch.plan, params)
        };
        let built = built.with_context(|| format!("teacher {}", self.settings.name))?;
        profile::boundary::<B>(device, || format!("teacher {}: top-K", self.settings.name));
        Ok(built)
    }
}

/// Loads teacher `settings`' model in its dtype on `device`.
fn load_model<B: TrainBackend>(
    settings: &TeacherSettings,
    kind: LossKind,
    device: &B::Device,
    lead: bool,
) -> Result<Transformer<B::InnerBackend>> {
    let dtype = dtype_of::<B::InnerBackend>(settings.dtype, device);
    let model =
        Transformer::<B::InnerBackend>::load_with(&settings.model, LoadOptions { dtype }, device)
            .with_context(|| format!("teacher {}", settings.name))?;
    if lead {
        tracing::info!(
            "teacher {}: {} ({} parameters, {dtype:?}), {}, α = {}",
            settings.name,
            settings.model.display(),
            model.architecture.num_parameters(),
            kind.name(),
            settings.alpha
        );
    }
    Ok(model)
}

/// The text a served teacher is probed with: its answer's token texts are compared with the
/// run's teacher tokenizer.
pub const PROBE: &str = "The quick brown fox jumps over the lazy dog: 12 cups of tea, 3.5 km, \
                     and a naïve café's crème brûlée. Grüße! 你好，世界。";

/// Connects teacher `m`'s server: it must list the served model, give the run's top-K, and its
/// token texts must be the teacher tokenizer's on a probe. Returns the teacher and what it is,
/// said in one line.
pub fn connect_served(
    config: &RunConfig,
    inputs: &RunInputs,
    m: usize,
) -> Result<(ServedTeacher, String)> {
    let settings = &inputs.settings[m];
    let at = || format!("teachers[{m}].server");
    let served = settings
        .server
        .clone()
        .ok_or_else(|| Error::Config(format!("{}: not a served teacher", at())))?;
    let vocab = inputs.teacher_configs[m].architecture.vocab_size;
    let k = match config.loss_params().top_k {
        TopK::K(k) => k.min(vocab),
        TopK::All => vocab,
    };
    let (url, model) = (served.server.clone(), served.model.clone());
    let (teacher, info) = ServedTeacher::connect(served, k, vocab).with_context(at)?;
    if let Some(max) = info.max_logprobs.filter(|&max| max < k) {
        return Err(Error::Served(format!(
            "teacher {}: {url} gives at most {max} log-probabilities per position, the run's \
             loss.top_k asks for {k}; lower loss.top_k or serve with a larger --max-logprobs",
            settings.name
        )));
    }
    let (positions, compared) = teacher
        .probe(&inputs.pipeline.teachers[m], PROBE)
        .with_context(at)?;
    let said = format!(
        "served by {url} (model {model}, top-{k} per position, {} answers; its token texts \
         agree with {} on {compared} entries of a {positions}-token probe)",
        if teacher.binary() { "binary" } else { "JSON" },
        inputs.pipeline.teachers[m].path().display()
    );
    Ok((teacher, said))
}

/// Opens teacher `m`'s stored targets in `dir` and checks them against the run.
pub fn open_store(
    config: &RunConfig,
    inputs: &RunInputs,
    m: usize,
    dir: &Path,
    allow_data_change: bool,
) -> Result<Store> {
    let store = Store::open(dir).with_context(|| format!("teachers[{m}].targets"))?;
    let prints = fingerprint::of_sources(&inputs.sources)?;
    store
        .check_run(
            &inputs.pipeline.teachers[m],
            inputs.teacher_configs[m].architecture.vocab_size,
            &config.loss_params(),
            &prints,
            allow_data_change,
        )
        .with_context(|| format!("teachers[{m}].targets"))?;
    let adaptive = matches!(config.weighting()?, Weighting::Adaptive(_));
    if adaptive && !store.manifest.confidence {
        return Err(Error::Targets(format!(
            "teachers[{m}].targets: {}: written without the confidence terms that loss.weighting \
             = {:?} reads (teach.confidence = false); write them again with teach.confidence = \
             true, or weight the teachers statically",
            dir.display(),
            config.loss.weighting
        )));
    }
    Ok(store)
}

/// What `auto` resolves to: the coverage audit's recommendation, P-KL or H-KL.
fn audit_choice(
    settings: &TeacherSettings,
    student: &Vocabulary,
    teacher: &Vocabulary,
    w: &SparseProjection,
    lead: bool,
) -> LossKind {
    let report = audit::audit(student, teacher, w, &AuditOptions::default());
    if lead {
        tracing::info!(
            "teacher {}: auto → {:?}: {}",
            settings.name,
            report.recommendation,
            report.reason
        );
    }
    report.recommendation
}

/// The common set's tables GOLD (strict) and H-KL (relaxed by W) read, for logits of `widths`
/// (student, teacher).
fn common_tables(
    kind: LossKind,
    student: &Vocabulary,
    teacher: &Vocabulary,
    w: Option<&SparseProjection>,
    (student_width, teacher_width): (usize, usize),
) -> Result<Option<CommonTables>> {
    let strict = || CommonSet::strict(student, teacher);
    Ok(match (kind, w) {
        (LossKind::Gold, _) => Some(CommonTables::new(&strict(), student_width, teacher_width)?),
        (LossKind::Hkl, Some(w)) => Some(hkl::tables(&strict(), w, student_width, teacher_width)?),
        _ => None,
    })
}

/// The dtype a configured choice means on `B` (`auto`: bf16 where `B` has it).
pub fn dtype_of<B: Backend>(choice: DtypeChoice, device: &B::Device) -> DType {
    match choice {
        DtypeChoice::F32 => DType::F32,
        DtypeChoice::Bf16 => DType::BF16,
        DtypeChoice::F16 => DType::F16,
        DtypeChoice::Auto if B::supports_dtype(device, DType::BF16) => DType::BF16,
        DtypeChoice::Auto => DType::F32,
    }
}

/// KL compares distributions token by token: teacher `m` may use it only with the student's
/// tokenizer.
pub fn check_kl(
    m: usize,
    kind: LossKind,
    student: &Vocabulary,
    teacher: &Vocabulary,
) -> Result<()> {
    if kind == LossKind::Kl && student.sha256() != teacher.sha256() {
        return Err(Error::Config(format!(
            "teachers[{m}].loss = \"kl\": KL needs the student's tokenizer, but {} differs from {}; use pkl, hkl, gold or uld",
            teacher.path().display(),
            student.path().display()
        )));
    }
    Ok(())
}

/// Ids `[rows, len]` and their padding (`true`: padded), checked on the host and uploaded.
pub fn tokens<B: Backend>(
    ids: &[i64],
    padding: &Option<Vec<bool>>,
    [rows, len]: [usize; 2],
    device: &B::Device,
) -> Result<Tokens<B>> {
    Ok(Tokens::from_host(
        ids,
        padding.as_deref(),
        [rows, len],
        device,
    )?)
}
