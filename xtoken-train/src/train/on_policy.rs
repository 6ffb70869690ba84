//! On-policy distillation's writing: before a step, the student continues the step's on-policy
//! prompts by sampling through its key/value cache (no graph), and what it wrote becomes a
//! micro-batch ([`mod@crate::data::written`]) that the step trains on beside the packed rows.
//!
//! Each sequence samples from a generator seeded by the run's seed, the step and its place in
//! the global batch ([`crate::data::prompts`]), so its text does not depend on which worker
//! writes it or what else shares the batch, and a resumed run writes it again bit for bit.

use std::sync::Arc;
use std::time::Instant;

use xtoken_core::align::Workspace;
use xtoken_core::plan::MergeVariant;
use xtoken_kernels::XTokenBackend;
use xtoken_models::{Decoding, Sampling, Transformer};

use crate::config::RunConfig;
use crate::data::rng::{unit, SplitMix64};
use crate::data::written::{on_policy_batch, stop_ids, written};
use crate::data::{Pipeline, Prompt, StepBatch};
use crate::error::{Context, Result};

/// What the student wrote for one step on this worker.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Generation {
    /// Sequences written.
    pub rows: usize,
    /// Tokens written and kept (after the cuts to whole characters and at special tokens).
    pub tokens: usize,
    /// Seconds spent writing and aligning.
    pub seconds: f64,
}

/// The student's writing of a run's on-policy sequences.
pub struct OnPolicy {
    decoding: Decoding,
    sampling: Sampling,
    pipeline: Arc<Pipeline>,
    variant: MergeVariant,
    length_multiple: usize,
    /// Per student id: whether it ends a continuation (the special tokens).
    stops: Vec<bool>,
    /// Sequences written at once.
    generation_batch: usize,
    workspace: Workspace,
}

impl OnPolicy {
    /// The writer `config` asks for, `None` when no sequence is on-policy; `length_multiple`
    /// pads its rows as the loader pads the others.
    pub fn of(
        config: &RunConfig,
        pipeline: Arc<Pipeline>,
        length_multiple: usize,
    ) -> Result<Option<Self>> {
        let Some(on) = config.on_policy_active() else {
            return Ok(None);
        };
        let sampling = Sampling {
            temperature: on.temperature,
            top_p: on.top_p,
            vocab: pipeline.student.tokenizer_size(),
        };
        sampling.validate()?;
        Ok(Some(OnPolicy {
            decoding: Decoding {
                max_new_tokens: on.max_new_tokens,
                use_cache: true,
            },
            sampling,
            stops: stop_ids(&pipeline.student),
            pipeline,
            variant: config.merge_variant()?,
            length_multiple,
            generation_batch: on.generation_batch,
            workspace: Workspace::default(),
        }))
    }

    /// Writes the continuations of `batch`'s prompts with `student`, `generation_batch` at a
    /// time, and appends them to its micro-batches (each of the loader's groups one).
    pub fn write<B: XTokenBackend>(
        &mut self,
        student: &Transformer<B>,
        batch: &mut StepBatch,
    ) -> Result<Generation> {
        let started = Instant::now();
        let groups = std::mem::take(&mut batch.prompts);
        let prompts: Vec<&Prompt> = groups.iter().flat_map(|g| &g.prompts).collect();
        let mut continuations = Vec::with_capacity(prompts.len());
        for some in prompts.chunks(self.generation_batch) {
            continuations.extend(self.sample(student, some)?);
        }
        let mut continuations = continuations.into_iter();
        let mut generation = Generation::default();
        for group in &groups {
            let mut rows = Vec::with_capacity(group.prompts.len());
            for (prompt, continuation) in group.prompts.iter().zip(continuations.by_ref()) {
                let row = written(
                    &self.pipeline,
                    &mut self.workspace,
                    &prompt.ids,
                    &continuation,
                )?;
                generation.tokens += row.generated;
                rows.push(row);
            }
            let micro = on_policy_batch(rows, self.variant, self.length_multiple)?;
            generation.rows += micro.rows;
            batch.micro.push(micro);
        }
        generation.seconds = started.elapsed().as_secs_f64();
        Ok(generation)
    }

    /// The student's continuation of each prompt, each drawn with its own seeded generator.
    fn sample<B: XTokenBackend>(
        &self,
        student: &Transformer<B>,
        prompts: &[&Prompt],
    ) -> Result<Vec<Vec<u32>>> {
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
        let mut generators: Vec<SplitMix64> = prompts.iter().map(|p| SplitMix64(p.seed)).collect();
        let stops = &self.stops;
        let written = student
            .generate_sampled(
                &ids,
                self.decoding,
                self.sampling,
                |row| unit(generators[row].next_u64()),
                |_, written| {
                    written
                        .last()
                        .is_none_or(|&id| stops.get(id as usize).copied().unwrap_or(true))
                },
            )
            .context("the student writing its on-policy sequences")?;
        Ok(written)
    }
}

/// A teacher's grade of what the student writes after some prompts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Grade {
    /// The teacher's log-likelihood of the written text, per byte of it (nats; higher: the
    /// teacher finds the student's writing likelier).
    pub nats_per_byte: f64,
    /// Student tokens written per prompt, the mean.
    pub tokens: f64,
    /// Bytes of text graded per prompt, the mean.
    pub bytes: f64,
}

/// Samples the student's continuation of every prompt (each seeded by its prompt's seed, as the
/// run's on-policy sequences are) and grades it by `teacher` (the pipeline's teacher `m`): the
/// teacher's log-probability of its own tokens of the written text, given the prompt's text
/// before them, summed over the tokens whose chunks lie in the continuation (those the loss
/// would compare), per byte they spell.
#[allow(clippy::too_many_arguments)]
pub fn grade<S: XTokenBackend, T: XTokenBackend>(
    student: &Transformer<S>,
    teacher: &Transformer<T>,
    pipeline: &Pipeline,
    m: usize,
    prompts: &[Prompt],
    decoding: Decoding,
    sampling: Sampling,
) -> Result<Grade> {
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let mut generators: Vec<SplitMix64> = prompts.iter().map(|p| SplitMix64(p.seed)).collect();
    let stops = stop_ids(&pipeline.student);
    let continuations = student.generate_sampled(
        &ids,
        decoding,
        sampling,
        |row| unit(generators[row].next_u64()),
        |_, w| {
            w.last()
                .is_none_or(|&id| stops.get(id as usize).copied().unwrap_or(true))
        },
    )?;
    let mut ws = Workspace::default();
    let vocab = &pipeline.teachers[m];
    let (mut nats, mut bytes, mut tokens) = (0.0, 0.0, 0.0);
    for (prompt, continuation) in ids.iter().zip(&continuations) {
        let row = written(pipeline, &mut ws, prompt, continuation)?;
        tokens += row.generated as f64;
        let prompt_len = row.prompt_len as u32;
        let (teacher_ids, alignment) = &row.row.teachers[m];
        let graded: Vec<usize> = alignment
            .aligned()
            .filter(|c| c.student.start >= prompt_len && c.teacher.start > 0)
            .flat_map(|c| c.teacher.range())
            .collect();
        if graded.is_empty() {
            continue;
        }
        let log_probs = teacher_log_probs(teacher, teacher_ids)?;
        for i in graded {
            nats += log_probs[i];
            bytes += vocab.token(teacher_ids[i]).map_or(0, |t| t.bytes.len()) as f64;
        }
    }
    let n = prompts.len().max(1) as f64;
    Ok(Grade {
        nats_per_byte: nats / bytes.max(1.0),
        tokens: tokens / n,
        bytes: bytes / n,
    })
}

/// `log p(ids[i] | ids[..i])` under `model` for every position `i ≥ 1` (position 0: 0).
fn teacher_log_probs<T: XTokenBackend>(model: &Transformer<T>, ids: &[u32]) -> Result<Vec<f64>> {
    use burn::tensor::{Int, Tensor, TensorData};
    use xtoken_models::CausalLm;
    if ids.len() < 2 {
        return Ok(vec![0.0; ids.len()]);
    }
    let device = model.embed_tokens.weight.device();
    let input: Vec<i64> = ids.iter().map(|&id| id as i64).collect();
    let input = Tensor::<T, 2, Int>::from_data(TensorData::new(input, [1, ids.len()]), &device);
    let logits = model.forward(input, None)?;
    let [_, len, vocab] = logits.dims();
    let predicting = logits.reshape([len, vocab]).slice([0..len - 1, 0..vocab]);
    let scores = xtoken_models::token_log_probs(predicting, &ids[1..])?;
    Ok(std::iter::once(0.0).chain(scores.log_probs).collect())
}
