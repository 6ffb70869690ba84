//! `xtoken demo`: the paper's setting in miniature, on a CPU, with nothing downloaded.
//!
//! Everything is made here, seeded (`corpus`): a small world whose text is uncertain (each
//! person's house is stated in most documents, an old address in the rest), many documents for
//! the teachers and few for the students, and held-out questions scored against the most
//! likely answer. Byte-level BPE tokenizers are trained on the text with the `tokenizers` crate
//! and random tiny Llamas made for them (`models`): the student's tokenizer keeps up to three
//! digits together (like Llama-3), one teacher's splits every digit (like Qwen3: the
//! digit-splitting regime), another keeps numerals as the student does but cuts words
//! differently (like Phi-4-mini: the numeral-keeping regime). Each teacher learns the odds on
//! cross-entropy; the student gets a short cross-entropy warm-up on its few documents, and from
//! there one student per method (CE only, GOLD, ULD, P-KL, H-KL) is distilled with
//! `xtoken train`'s library on the same batches for the same steps (`runs`). `xtoken audit`
//! names its pick per regime; every model is scored on held-out problems (`score`) and the
//! results are written as Markdown, JSON and SVG (`report`).

pub(crate) mod corpus;
mod models;
mod report;
pub(crate) mod runs;
mod score;
mod setup;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use xtoken_train::output::{claim_work_dir, Inputs};

use corpus::Problem;
use models::Numerals;
use report::{MethodResult, Points};
use runs::{Job, Run};
pub use setup::DemoArgs;
pub(crate) use setup::{Regime, ALPHA, LR_DISTILL};
use setup::{
    LR_WARM_UP, METHODS, SERVED_METHOD, STORED_METHOD, STUDENT_SHAPE, STUDENT_VOCAB, TEACHER_SHAPE,
};
use xtoken_core::audit::{self, AuditOptions};
use xtoken_core::projection::SparseProjection;
use xtoken_core::vocab::Vocabulary;

/// Runs the demo.
pub fn run(mut args: DemoArgs) -> Result<()> {
    args.check()?;
    args.regimes.dedup();
    claim_work_dir(&Inputs::new(), &args.out, "xtoken demo")?;
    let start = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut results = Vec::new();
    let mut curves = Vec::new();
    for seed in args.seed..args.seed + args.seeds {
        let (rows, seed_curves) = one_seed(&args, seed, threads)?;
        results.extend(rows);
        if curves.is_empty() {
            curves = seed_curves;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    report::write(&args, &results, &curves, seconds)
}

/// What one seed's runs have in common.
struct Seeded<'a> {
    args: &'a DemoArgs,
    seed: u64,
    dir: PathBuf,
    /// The students' documents and the teachers'.
    data: PathBuf,
    teacher_data: PathBuf,
    held_out: Vec<Problem>,
}

/// The whole demo for one seed: its rows (teachers first) and the CE curves of the first
/// regime's students.
fn one_seed(
    args: &DemoArgs,
    seed: u64,
    threads: usize,
) -> Result<(Vec<MethodResult>, Vec<report::Curve>)> {
    let dir = args.seed_dir(seed);
    if dir.join("runs").exists() {
        std::fs::remove_dir_all(dir.join("runs"))?;
    }
    std::fs::create_dir_all(&dir)?;
    let say = |text: &str| eprintln!("\n== seed {seed}: {text}");

    say("corpus: questions about 48 people's house numbers");
    let data = dir.join("train.jsonl");
    let teacher_data = dir.join("teacher-train.jsonl");
    let sizes = (args.teacher_problems, args.problems, args.held_out);
    let (texts, held_out) = corpus::write(seed, sizes, (&teacher_data, &data))?;
    eprintln!(
        "{} documents for the teachers, {} for the students, {} held-out problems, e.g. {:?}",
        args.teacher_problems, args.problems, args.held_out, texts[0]
    );
    let s = Seeded {
        args,
        seed,
        dir,
        data,
        teacher_data,
        held_out,
    };

    say("tokenizers and random models");
    s.tokenizers_and_models(&texts)?;
    let picks = s.audit()?;

    say("teachers (cross-entropy) and the student's shared warm-up, side by side");
    let mut first: Vec<Job<'_, Option<MethodResult>>> = args
        .regimes
        .iter()
        .map(|&regime| -> Job<'_, Option<MethodResult>> {
            let s = &s;
            Box::new(move || s.teacher(regime).map(Some))
        })
        .collect();
    first.push(Box::new(|| s.warm_up().map(|()| None)));
    let mut rows: Vec<MethodResult> = runs::pool(threads, first)?.into_iter().flatten().collect();

    say("students: one per method and teacher, side by side");
    let jobs: Vec<Job<'_, (MethodResult, Points)>> = args
        .regimes
        .iter()
        .flat_map(|&regime| METHODS.iter().map(move |&m| (regime, m)))
        .map(|(regime, method)| -> Job<'_, (MethodResult, Points)> {
            let s = &s;
            Box::new(move || s.student(regime, method))
        })
        .collect();
    let mut curves = Vec::new();
    // (asked for, what it is, whether from the store rather than a server)
    let extra = [
        (
            args.stored,
            "the audit's pick from its teacher's stored targets (top-64, compact)",
            true,
        ),
        (
            args.served,
            "the audit's pick from its teacher served by `xtoken serve` (top-20)",
            false,
        ),
    ];
    for (_, what, stored) in extra.into_iter().filter(|e| e.0) {
        say(what);
        let runs: Vec<Job<'_, (MethodResult, Points)>> = picks
            .iter()
            .map(|&(regime, pick)| -> Job<'_, (MethodResult, Points)> {
                let s = &s;
                Box::new(move || match stored {
                    true => s.stored_student(regime, pick),
                    false => s.served_student(regime, pick),
                })
            })
            .collect();
        for (row, _) in runs::pool(threads, runs)? {
            rows.push(row);
        }
    }
    for (mut row, curve) in runs::pool(threads, jobs)? {
        row.audit_pick = picks.contains(&(row.regime, row.method.as_str()));
        if row.regime == args.regimes[0] {
            curves.push((row.method.clone(), curve));
        }
        rows.push(row);
    }
    Ok((rows, curves))
}

impl Seeded<'_> {
    fn tokenizers_and_models(&self, texts: &[String]) -> Result<()> {
        let student = self.dir.join("student-init");
        models::train_tokenizer(&student, Numerals::UpToThree, STUDENT_VOCAB, texts)?;
        let example = &self.held_out[0].1;
        eprintln!("student: {}", models::pieces(&student, example)?);
        models::init_model(&student, STUDENT_SHAPE, self.seed + 1)?;
        for &regime in &self.args.regimes {
            let teacher = self.dir.join(regime.init_dir());
            let vocab = regime.teacher_vocab();
            models::train_tokenizer(&teacher, regime.numerals(), vocab, texts)?;
            eprintln!(
                "{} teacher: {}",
                regime.name(),
                models::pieces(&teacher, example)?
            );
            models::init_model(&teacher, TEACHER_SHAPE, self.seed)?;
        }
        Ok(())
    }

    /// `xtoken audit` of the student against each regime's teacher: the method it recommends
    /// (P-KL or H-KL) per regime.
    fn audit(&self) -> Result<Vec<(Regime, &'static str)>> {
        let student = Vocabulary::load(self.dir.join("student-init"))?;
        let mut picks = Vec::new();
        for &regime in &self.args.regimes {
            let teacher = Vocabulary::load(self.dir.join(regime.init_dir()))?;
            let (w, _) = SparseProjection::build(&student, &teacher, Default::default())?;
            let report = audit::audit(&student, &teacher, &w, &AuditOptions::default());
            eprintln!(
                "audit, {} teacher: {} ({})",
                regime.name(),
                report.recommendation.name(),
                report.reason
            );
            picks.push((regime, report.recommendation.name()));
        }
        Ok(picks)
    }

    fn runs(&self) -> PathBuf {
        self.dir.join("runs")
    }

    /// A cross-entropy run of `model` (its own teacher, at α = 0).
    fn ce_run<'a>(&'a self, out: &'a Path, model: &'a Path, steps: u64, lr: f64) -> Run<'a> {
        Run {
            out,
            student: model,
            teacher: model,
            loss: "kl",
            alpha: 0.0,
            steps,
            lr,
            data: &self.data,
            seed: self.seed,
            device: &self.args.device,
            stored: None,
            served: None,
        }
    }

    /// Trains and scores a regime's teacher (on cross-entropy: the run's teacher is itself,
    /// at α = 0).
    fn teacher(&self, regime: Regime) -> Result<MethodResult> {
        let init = self.dir.join(regime.init_dir());
        let out = self.runs().join(regime.name()).join("teacher");
        Run {
            data: &self.teacher_data,
            ..self.ce_run(&out, &init, self.args.teacher_steps, regime.teacher_lr())
        }
        .train()?;
        let (final_loss, _) = runs::ce_curve(&out)?;
        self.score(regime, "teacher", &out, final_loss)
    }

    /// The student's cross-entropy warm-up every method continues from.
    fn warm_up(&self) -> Result<()> {
        if self.args.warmup_steps == 0 {
            return Ok(());
        }
        let init = self.dir.join("student-init");
        let out = self.runs().join("warm-up");
        self.ce_run(&out, &init, self.args.warmup_steps, LR_WARM_UP)
            .train()
    }

    /// The student every method starts from: the warm-up's, or the random one.
    fn student_start(&self) -> PathBuf {
        if self.args.warmup_steps == 0 {
            self.dir.join("student-init")
        } else {
            self.runs().join("warm-up").join("student")
        }
    }

    /// Distills and scores one method's student from a regime's teacher.
    fn student(
        &self,
        regime: Regime,
        (method, loss, alpha): (&str, &str, f64),
    ) -> Result<(MethodResult, Points)> {
        let out = self
            .runs()
            .join(regime.name())
            .join(method.replace(' ', "-").to_lowercase());
        let start = self.student_start();
        let teacher = self
            .runs()
            .join(regime.name())
            .join("teacher")
            .join("student");
        Run {
            teacher: &teacher,
            loss,
            alpha,
            ..self.ce_run(&out, &start, self.args.student_steps, LR_DISTILL)
        }
        .train()?;
        let (final_loss, curve) = runs::ce_curve(&out)?;
        Ok((self.score(regime, method, &out, final_loss)?, curve))
    }

    /// `--stored`: the regime's teacher stored at top-64, compact (`xtoken teach`), and the
    /// audit's pick `pick` distilled from the store.
    fn stored_student(&self, regime: Regime, pick: &str) -> Result<(MethodResult, Points)> {
        let (_, loss, alpha) = METHODS
            .iter()
            .find(|m| m.0 == pick)
            .copied()
            .ok_or_else(|| anyhow::anyhow!("the audit's pick {pick} is no method of the demo"))?;
        let dir = self.runs().join(regime.name());
        let (out, store) = (dir.join("stored-pick"), dir.join("stored-targets"));
        let (start, teacher) = (self.student_start(), dir.join("teacher").join("student"));
        let online = Run {
            teacher: &teacher,
            loss,
            alpha,
            ..self.ce_run(&out, &start, self.args.student_steps, LR_DISTILL)
        };
        let teach = format!(
            "{}\n[teach]\ntop_k = 64\ndtype = \"compact\"\n",
            online.toml()
        );
        xtoken_train::train::teach::teach_on_device(
            &xtoken_train::RunConfig::parse(&teach)?,
            &store,
        )?;
        let targets = store.join("teacher");
        Run {
            stored: Some((&targets, 64)),
            ..online
        }
        .train()?;
        let (final_loss, curve) = runs::ce_curve(&out)?;
        Ok((self.score(regime, STORED_METHOD, &out, final_loss)?, curve))
    }

    /// `--served`: the regime's teacher served by `xtoken serve` (a thread of this process,
    /// on the demo's device, in f32), and the audit's pick `pick` distilled from its top-20.
    fn served_student(&self, regime: Regime, pick: &str) -> Result<(MethodResult, Points)> {
        let (_, loss, alpha) = METHODS
            .iter()
            .find(|m| m.0 == pick)
            .copied()
            .ok_or_else(|| anyhow::anyhow!("the audit's pick {pick} is no method of the demo"))?;
        let dir = self.runs().join(regime.name());
        let (start, teacher) = (self.student_start(), dir.join("teacher").join("student"));
        let mut options = xtoken_train::train::serve::ServeOptions::new(teacher.clone());
        options.name = Some("teacher".into());
        options.port = 0;
        options.device = self.args.device.clone();
        options.dtype = xtoken_train::config::DtypeChoice::F32;
        let address = xtoken_train::train::serve::serve_in_background(options)?;
        let url = format!("http://{address}/v1");
        let out = dir.join("served-pick");
        Run {
            teacher: &teacher,
            loss,
            alpha,
            served: Some((&url, 20)),
            ..self.ce_run(&out, &start, self.args.student_steps, LR_DISTILL)
        }
        .train()?;
        let (final_loss, curve) = runs::ce_curve(&out)?;
        Ok((self.score(regime, SERVED_METHOD, &out, final_loss)?, curve))
    }

    fn score(
        &self,
        regime: Regime,
        method: &str,
        run: &Path,
        final_loss: f64,
    ) -> Result<MethodResult> {
        let score = score::evaluate(&run.join("student"), &self.held_out)?;
        eprintln!(
            "{} / {method}: answers {:.1} %, numeral tokens {:.1} %",
            regime.name(),
            100.0 * score.answer_accuracy,
            100.0 * score.numeral_accuracy
        );
        Ok(MethodResult {
            regime,
            method: method.into(),
            seed: self.seed,
            answer_accuracy: score.answer_accuracy,
            numeral_accuracy: score.numeral_accuracy,
            final_loss,
            audit_pick: false,
        })
    }
}
