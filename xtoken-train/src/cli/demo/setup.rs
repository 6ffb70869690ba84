//! What the demo runs: its options, the two regimes, the students' methods, and the fixed
//! settings (learning rates, sizes) every run shares.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::models::Numerals;

/// Options of `xtoken demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Where the corpus, tokenizers, models, runs and results go.
    #[arg(long, default_value = "xtoken-demo")]
    pub(super) out: PathBuf,
    /// Print `{"results": [...], "seconds": ...}` on stdout instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Documents the students train on (their budget).
    #[arg(long, default_value_t = 192)]
    pub(super) problems: usize,
    /// Documents the teachers train on: many more, so that they learn the odds.
    #[arg(long, default_value_t = 6000)]
    pub(super) teacher_problems: usize,
    /// Held-out problems.
    #[arg(long, default_value_t = 300)]
    pub(super) held_out: usize,
    /// Optimizer steps of each teacher.
    #[arg(long, default_value_t = 400)]
    pub(super) teacher_steps: u64,
    /// Optimizer steps of the student's cross-entropy warm-up, shared by every method.
    #[arg(long, default_value_t = 200)]
    pub(super) warmup_steps: u64,
    /// Optimizer steps of each student after the warm-up.
    #[arg(long, default_value_t = 120)]
    pub(super) student_steps: u64,
    /// The first seed: it seeds the corpus, the tokenizers' data, every model's initial
    /// weights and the batches.
    #[arg(long, default_value_t = 7)]
    pub(super) seed: u64,
    /// Runs seeds `seed`, `seed + 1`, … and reports each method's mean ± standard deviation.
    #[arg(long, default_value_t = 1)]
    pub(super) seeds: u64,
    /// The teachers to distill from (comma-separated): `digit-splitting`, `numeral-keeping`,
    /// or both (the default).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "digit-splitting,numeral-keeping"
    )]
    pub(super) regimes: Vec<Regime>,
    /// The CPU backend that trains: `cpu` (burn-flex in f32), `flex` (burn-flex, which computes
    /// in bf16 by `training.compute_dtype`'s default) or `ndarray` (burn's ndarray).
    #[arg(long, default_value = "cpu")]
    pub(super) device: String,
    /// Also distill the audit's pick from its teacher's stored targets (`xtoken teach`) at
    /// top-64 in 8 bits, beside the online run that keeps the whole vocabulary.
    #[arg(long)]
    pub(super) stored: bool,
    /// Also distill the audit's pick from its teacher served by `xtoken serve` (in this
    /// process, over HTTP on 127.0.0.1) at top-20, vLLM's default.
    #[arg(long)]
    pub(super) served: bool,
}

/// Which teacher the students are distilled from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Regime {
    /// The teacher's tokenizer writes every digit as its own token (Qwen3-like): no student
    /// numeral of two or three digits has an exact match.
    DigitSplitting,
    /// The teacher's tokenizer keeps numerals as the student's does (Phi-4-mini-like): the
    /// partition is sound on numerals.
    NumeralKeeping,
}

impl Regime {
    /// The name in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Regime::DigitSplitting => "digit-splitting",
            Regime::NumeralKeeping => "numeral-keeping",
        }
    }

    pub(super) fn numerals(self) -> Numerals {
        match self {
            Regime::DigitSplitting => Numerals::Digits,
            Regime::NumeralKeeping => Numerals::UpToThreeShortWords,
        }
    }

    /// The teacher's tokenizer size: digits and words for one, every numeral for the other.
    pub(super) fn teacher_vocab(self) -> usize {
        match self {
            Regime::DigitSplitting => 400,
            Regime::NumeralKeeping => 1600,
        }
    }

    /// The teacher's learning rate. The digit-splitting teacher trains best at 3e-3. The
    /// numeral-keeping teacher answers with single tokens, as the student does, and needs the
    /// student warm-up's 1e-2 to leave the plateau where it answers with the numerals'
    /// frequencies.
    pub(super) fn teacher_lr(self) -> f64 {
        match self {
            Regime::DigitSplitting => 3e-3,
            Regime::NumeralKeeping => 1e-2,
        }
    }

    /// The teacher's initial weights and tokenizer, under the demo's directory.
    pub(super) fn init_dir(self) -> &'static str {
        match self {
            Regime::DigitSplitting => "teacher-init",
            Regime::NumeralKeeping => "teacher-numerals-init",
        }
    }
}

/// The teacher's weight α of every distilled student: the objective is `L_CE + α L_KD`
/// (dynamic scaling off, see `runs`), and 2 lets the teacher's odds outweigh the few labels a
/// student reads.
pub(crate) const ALPHA: f64 = 2.0;

/// The students: name, loss and α (`CE only` is the floor: the same run with α = 0).
/// The row of the audit's pick distilled from stored targets (`--stored`).
pub(super) const STORED_METHOD: &str = "audit's pick, stored top-64 compact";
/// The row of the audit's pick distilled from a served teacher (`--served`).
pub(super) const SERVED_METHOD: &str = "audit's pick, served top-20";

pub(super) const METHODS: [(&str, &str, f64); 5] = [
    ("CE only", "uld", 0.0),
    ("GOLD", "gold", ALPHA),
    ("ULD", "uld", ALPHA),
    ("P-KL", "pkl", ALPHA),
    ("H-KL", "hkl", ALPHA),
];

/// Learning rates. The student's warm-up trains from scratch at a rate that gets it past the
/// plateau where it answers with the numerals' frequencies (at 3e-3 it stays there for 400
/// steps); distillation continues from there at 3e-3.
pub(super) const LR_WARM_UP: f64 = 1e-2;
pub(crate) const LR_DISTILL: f64 = 3e-3;

/// The student's tokenizer size (it keeps every numeral of the corpus) and the models' shapes
/// (hidden size, layers).
pub(super) const STUDENT_VOCAB: usize = 1600;
pub(super) const STUDENT_SHAPE: (usize, usize) = (64, 2);
pub(super) const TEACHER_SHAPE: (usize, usize) = (96, 3);

impl DemoArgs {
    pub(super) fn check(&self) -> Result<()> {
        let positive = [
            ("--problems", self.problems as u64),
            ("--teacher-problems", self.teacher_problems as u64),
            ("--held-out", self.held_out as u64),
            ("--teacher-steps", self.teacher_steps),
            ("--student-steps", self.student_steps),
            ("--seeds", self.seeds),
        ];
        for (name, value) in positive {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if self.regimes.is_empty() {
            bail!("--regimes names no regime");
        }
        if !["cpu", "flex", "ndarray"].contains(&self.device.as_str()) {
            bail!(
                "--device {:?}: the demo trains on the CPU, with `cpu`, `flex` or `ndarray`",
                self.device
            );
        }
        Ok(())
    }

    /// The directory of one seed: `out` itself for a single seed.
    pub(super) fn seed_dir(&self, seed: u64) -> PathBuf {
        if self.seeds == 1 {
            self.out.clone()
        } else {
            self.out.join(format!("seed-{seed}"))
        }
    }
}
