//! On-policy prompts: which sequences of a step the student writes (a seeded draw per sequence,
//! GKD's λ), and what it is prompted with.
//!
//! The draw and each sequence's sampling seed are functions of the run's seed, the step and the
//! sequence's place in the step's global batch: every worker makes the same draws, a resumed
//! run makes them again, and two workers never sample with one seed.

use super::reader::Fields;
use super::rng::{mix, unit};
use crate::config::RunConfig;

/// The fields a run reads from each record: `data.text_field`, and the prompt's where on-policy
/// sequences are prompted by a field.
pub fn fields(config: &RunConfig) -> Fields {
    Fields {
        text: config.data.text_field.clone(),
        prompt: config
            .on_policy_active()
            .and_then(|o| o.prompt_field.clone()),
    }
}

/// Where a prompt comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptSource {
    /// A document's first this many student tokens.
    FirstTokens(usize),
    /// The record's prompt field (`on_policy.prompt_field`).
    Field,
}

/// Tags that keep the draw's and the samples' keys apart from each other and from the data
/// order's.
const DRAW: u64 = 0x6F6E_2D70_6F6C_6963;
const SAMPLE: u64 = 0x7361_6D70_6C65_7321;

/// The on-policy draw of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnPolicyDraw {
    /// λ: the probability that a sequence is on-policy.
    pub fraction: f64,
    /// The run's seed.
    pub seed: u64,
    /// Where prompts come from.
    pub source: PromptSource,
}

impl OnPolicyDraw {
    /// The draw `config` asks for; `None` when no sequence is on-policy.
    pub fn of(config: &RunConfig) -> Option<Self> {
        let on = config.on_policy_active()?;
        Some(OnPolicyDraw {
            fraction: on.fraction,
            seed: config.seed,
            source: match on.prompt_field {
                Some(_) => PromptSource::Field,
                None => PromptSource::FirstTokens(on.prompt_tokens),
            },
        })
    }

    /// Whether sequence `row` of step `step`'s global batch (steps count from 1) is on-policy.
    pub fn on_policy(&self, step: u64, row: usize) -> bool {
        unit(mix(&[self.seed, DRAW, step, row as u64])) < self.fraction
    }

    /// The seed of that sequence's sampling.
    pub fn sampling_seed(&self, step: u64, row: usize) -> u64 {
        mix(&[self.seed, SAMPLE, step, row as u64])
    }
}

/// One sequence the student writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The prompt's student ids.
    pub ids: Vec<u32>,
    /// The seed of its sampling.
    pub seed: u64,
}

/// The prompts of one on-policy micro-batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptBatch {
    /// In the order of the global batch.
    pub prompts: Vec<Prompt>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// λ of the sequences are drawn on-policy, the draw is the same every time, and the
    /// sampling seeds differ between sequences and steps.
    #[test]
    fn the_draw_takes_its_fraction_and_seeds_differ() {
        let draw = |fraction| OnPolicyDraw {
            fraction,
            seed: 5,
            source: PromptSource::FirstTokens(4),
        };
        let count = |d: &OnPolicyDraw| {
            (1..=100u64)
                .flat_map(|step| (0..100).map(move |row| (step, row)))
                .filter(|&(s, r)| d.on_policy(s, r))
                .count()
        };
        assert_eq!(count(&draw(0.0)), 0);
        assert_eq!(count(&draw(1.0)), 10_000);
        let half = count(&draw(0.5));
        assert!((4_800..5_200).contains(&half), "{half}");
        assert_eq!(half, count(&draw(0.5)));
        let d = draw(0.5);
        let mut seeds: Vec<u64> = (1..=20u64)
            .flat_map(|s| (0..20).map(move |r| d.sampling_seed(s, r)))
            .collect();
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 400);
    }
}
