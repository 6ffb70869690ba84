//! What a run reads before its first step: the models' configurations, the tokenizers (sized
//! like the models' embedding tables), the aligners, the data's shards (or its alignment cache,
//! when configured), and each teacher's projection matrix W (built and stored on first use).

use std::sync::Arc;

use xtoken_core::align::Aligner;
use xtoken_core::cache::AlignCache;
use xtoken_core::projection::SparseProjection;
use xtoken_core::projection_cache::{self, ProjectionCache};
use xtoken_core::vocab::Vocabulary;
use xtoken_models::HfConfig;

use crate::config::{RunConfig, TeacherSettings};
use crate::data::{open_or_build_cache, sources, Pipeline, Source};
use crate::error::{Context, Error, Failures, Result};

/// The tokenizers, model configurations and training data of a run.
pub struct RunInputs {
    /// The student's `config.json`.
    pub student_config: HfConfig,
    /// The teachers, every default filled in.
    pub settings: Vec<TeacherSettings>,
    /// Each teacher's `config.json`.
    pub teacher_configs: Vec<HfConfig>,
    /// The tokenizers and one aligner per teacher.
    pub pipeline: Arc<Pipeline>,
    /// The training data's sources, every shard found.
    pub sources: Vec<Source>,
    /// The aligned training data, when `data.cache` asks for a cache.
    pub cache: Option<Arc<AlignCache>>,
    /// The resident memory reading them took (the tokenizers and aligners, mostly); 0 where
    /// the system does not say. The memory estimate counts it.
    pub resident_bytes: u64,
}

impl RunInputs {
    /// Loads the tokenizers (sized like the models' embedding tables) and finds the data's
    /// shards; with `data.cache`, opens the alignment cache, building it first when absent
    /// (`progress` draws its progress bar).
    pub fn load(config: &RunConfig, progress: bool) -> Result<Self> {
        let mut inputs = Self::read(config)?;
        if config.cache_path().is_some() {
            let cache = open_or_build_cache(config, &inputs.pipeline, progress)?;
            inputs.cache = Some(Arc::new(cache));
        }
        Ok(inputs)
    }

    /// What [`load`](Self::load) reads, without opening or building the alignment cache.
    pub fn read(config: &RunConfig) -> Result<Self> {
        let before = crate::machine::resident();
        // Every input is read, so that a run missing several learns of each at once.
        let mut failures = Failures::default();
        let student_config = failures.note(student_config(config));
        let settings = config.teacher_settings()?;
        let teacher_configs: Vec<Option<HfConfig>> = settings
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let read = HfConfig::read(&s.model);
                failures.note(read.with_context(|| format!("teachers[{i}].model ({})", s.name)))
            })
            .collect();
        let student_vocab = student_config.as_ref().and_then(|c| {
            let padded = Some(c.architecture.vocab_size);
            let vocab = Vocabulary::load_padded(config.student_tokenizer(), padded);
            failures.note(vocab.context("the student's tokenizer"))
        });
        let teacher_vocabs: Vec<Option<Vocabulary>> = settings
            .iter()
            .zip(&teacher_configs)
            .map(|(s, c)| {
                let padded = Some(c.as_ref()?.architecture.vocab_size);
                let vocab = Vocabulary::load_padded(&s.tokenizer, padded);
                failures.note(vocab.with_context(|| format!("teacher {}: its tokenizer", s.name)))
            })
            .collect();
        let sources = failures.note(sources::sources(&config.data).context("data.path"));
        let (Some(student_config), Some(student_vocab), Some(sources)) =
            (student_config, student_vocab, sources)
        else {
            return Err(failures.into_error());
        };
        let (Some(teacher_configs), Some(teacher_vocabs)) = (
            teacher_configs.into_iter().collect::<Option<Vec<_>>>(),
            teacher_vocabs.into_iter().collect::<Option<Vec<_>>>(),
        ) else {
            return Err(failures.into_error());
        };
        let aligners = teacher_vocabs
            .iter()
            .map(|t| Aligner::new(&student_vocab, t, config.align_params()))
            .collect::<Result<Vec<_>, _>>()?;
        let pipeline = Pipeline {
            student: student_vocab,
            teachers: teacher_vocabs,
            aligners,
        };
        failures.or_value(Self {
            student_config,
            settings,
            teacher_configs,
            pipeline: Arc::new(pipeline),
            sources,
            cache: None,
            resident_bytes: match (before, crate::machine::resident()) {
                (Some(before), Some(after)) => after.saturating_sub(before),
                _ => 0,
            },
        })
    }
}

/// The student's `config.json`, and its positions enough for `training.context_length`.
fn student_config(config: &RunConfig) -> Result<HfConfig> {
    let student_config = HfConfig::read(&config.student.model).context("student.model")?;
    let limit = student_config.architecture.max_position_embeddings;
    if config.training.context_length > limit {
        return Err(Error::Config(format!(
            "training.context_length = {}: more than the student's max_position_embeddings = \
             {limit} ({}/config.json)",
            config.training.context_length,
            config.student.model.display()
        )));
    }
    Ok(student_config)
}

/// Builds what the workers of a run share on disk (every W, and the alignment cache when one is
/// configured) once, before they start.
pub fn prepare_shared_files(config: &RunConfig) -> Result<()> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let inputs = RunInputs::load(config, progress)?;
    for (m, settings) in inputs.settings.iter().enumerate() {
        if settings.loss.is_none_or(|kind| kind.needs_projection()) {
            projection_for(
                config,
                settings,
                &inputs.pipeline.student,
                &inputs.pipeline.teachers[m],
            )?;
        }
    }
    Ok(())
}

/// Loads W for a teacher; when the run has none yet, takes it from the user's projection cache
/// (built there once per tokenizer pair, [`ProjectionCache`]) and stores it in the run.
pub fn projection_for(
    config: &RunConfig,
    settings: &TeacherSettings,
    student: &Vocabulary,
    teacher: &Vocabulary,
) -> Result<SparseProjection> {
    let path = &settings.projection;
    if path.exists() {
        return SparseProjection::load_verified(path, student, teacher)
            .with_context(|| format!("teacher {}: W", settings.name));
    }
    let (w, source) =
        ProjectionCache::from_env().get_or_build(student, teacher, config.projection_params())?;
    match &source {
        projection_cache::Source::Cached(entry) => tracing::info!(
            "teacher {}: W of this tokenizer pair from the cache, {}",
            settings.name,
            entry.display()
        ),
        projection_cache::Source::Built(Some(entry)) => {
            tracing::info!("teacher {}: W cached at {}", settings.name, entry.display())
        }
        projection_cache::Source::Built(None) => {}
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let partial = xtoken_core::temporary::Temporary::beside(path, "partial");
    w.save(partial.path())?;
    let at = partial.path().display().to_string();
    partial
        .persist(path)
        .with_context(|| format!("renaming {at} into place"))?;
    tracing::info!(
        "teacher {}: W ({} × {}, top-{}) into {}",
        settings.name,
        w.student_vocab_size(),
        w.teacher_vocab_size(),
        w.top_k(),
        path.display()
    );
    Ok(w)
}
