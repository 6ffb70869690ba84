//! Held-out evaluation during training (`[eval]`): rows of held-out text packed once, as the
//! training data is, and evaluated without a gradient every `eval.every` steps and after the
//! last step: the student's cross-entropy and each teacher's `L_m`. The values go to
//! `eval.csv`, the TensorBoard file and `loss.svg`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::config::{DataConfig, RunConfig};
use crate::data::{micro_batch, sources, AlignedStream, DocumentStream, Feed, MicroBatch, Packer};
use crate::error::{Context, Error, Result};
use crate::inputs::RunInputs;

/// The held-out rows, as micro-batches.
pub struct HeldOut {
    /// The micro-batches, the same at every evaluation.
    pub batches: Vec<MicroBatch>,
    /// Student tokens in them.
    pub tokens: usize,
}

impl HeldOut {
    /// Packs `eval.path`'s text into rows of `context_length` until `eval.max_tokens` (or the
    /// end of the text's first pass) and lays them out in micro-batches; `None` without
    /// `eval.path`.
    pub fn build(config: &RunConfig, inputs: &RunInputs) -> Result<Option<Self>> {
        let Some((eval, path)) = config
            .eval
            .as_ref()
            .and_then(|e| e.path.as_ref().map(|p| (e, p)))
        else {
            return Ok(None);
        };
        let data = DataConfig {
            path: path.clone(),
            weights: None,
            cache: None,
            ..config.data.clone()
        };
        let sources = sources::sources(&data).context("eval.path")?;
        let stream = DocumentStream::open(sources, config.seed, &data.text_field, None)?;
        let stream =
            AlignedStream::start(inputs.pipeline.clone(), stream, config.data_threads(), 2)?;
        let t = &config.training;
        let feed = Feed::Stream(stream);
        let mut packer = Packer::new(
            feed,
            inputs.settings.len(),
            config.seed,
            t.context_length,
            Default::default(),
        )?;
        let mut rows = Vec::new();
        let mut tokens = 0usize;
        while (tokens as u64) < eval.max_tokens {
            let first_pass = packer
                .state()?
                .stream
                .is_none_or(|c| c.sources.iter().all(|s| s.epoch == 0));
            if !first_pass {
                break;
            }
            let row = packer.next_row()?;
            tokens += row.student_ids.len();
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(Error::Data("eval.path: no held-out text".into()));
        }
        let variant = config.merge_variant()?;
        let batches = rows
            .chunks(t.micro_batch)
            .map(|rows| micro_batch(rows, variant, 1))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(HeldOut { batches, tokens }))
    }
}

/// One evaluation's values.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRow {
    /// Steps trained when it was taken.
    pub step: u64,
    /// The student's held-out cross-entropy.
    pub ce: f64,
    /// Per teacher, its held-out `L_m`.
    pub teachers: Vec<f64>,
}

/// `eval.csv`: a row per evaluation; a resumed run keeps the rows up to its step.
pub struct EvalLog {
    path: PathBuf,
    teachers: Vec<String>,
    rows: Vec<EvalRow>,
}

impl EvalLog {
    /// Opens `path` for a run resumed after `start_step` steps.
    pub fn open(path: &Path, teachers: &[String], start_step: u64) -> Result<Self> {
        let mut log = EvalLog {
            path: path.to_path_buf(),
            teachers: teachers.to_vec(),
            rows: Vec::new(),
        };
        if start_step > 0 && path.exists() {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            for (i, line) in text.lines().enumerate().skip(1) {
                let row = log.parse(line).ok_or_else(|| {
                    Error::Run(format!(
                        "{}:{}: not an evaluation row",
                        path.display(),
                        i + 1
                    ))
                })?;
                if row.step <= start_step {
                    log.rows.push(row);
                }
            }
        }
        log.write()?;
        Ok(log)
    }

    fn header(&self) -> String {
        let mut h = String::from("step,ce");
        for name in &self.teachers {
            let _ = write!(h, ",loss_{name}");
        }
        h
    }

    fn parse(&self, line: &str) -> Option<EvalRow> {
        let v: Vec<f64> = line
            .split(',')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        (v.len() == 2 + self.teachers.len()).then(|| EvalRow {
            step: v[0] as u64,
            ce: v[1],
            teachers: v[2..].to_vec(),
        })
    }

    /// Appends one evaluation.
    pub fn push(&mut self, row: EvalRow) -> Result<()> {
        self.rows.push(row);
        self.write()
    }

    /// The evaluations so far.
    pub fn rows(&self) -> &[EvalRow] {
        &self.rows
    }

    fn write(&self) -> Result<()> {
        let mut file = std::fs::File::create(&self.path)
            .with_context(|| format!("{}: cannot write", self.path.display()))?;
        let mut text = self.header();
        text.push('\n');
        for r in &self.rows {
            let _ = write!(text, "{},{}", r.step, r.ce);
            for l in &r.teachers {
                let _ = write!(text, ",{l}");
            }
            text.push('\n');
        }
        file.write_all(text.as_bytes())
            .with_context(|| format!("{}: cannot write", self.path.display()))
    }
}
