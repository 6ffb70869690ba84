//! Held-out evaluation during training (`[eval]`): rows of held-out text packed once, as the
//! training data is, and evaluated without a gradient every `eval.every` steps and after the
//! last step: the student's cross-entropy and each teacher's `L_m`. The values go to
//! `eval.csv`, the TensorBoard file and `loss.svg`.

use crate::config::{DataConfig, RunConfig};
use crate::data::{micro_batch, sources, AlignedStream, DocumentStream, Feed, MicroBatch, Packer};
use crate::error::{Context, Error, Result};
use crate::train::inputs::RunInputs;

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
