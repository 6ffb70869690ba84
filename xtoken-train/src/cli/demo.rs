//! `xtoken demo`: the paper's central finding in miniature, on a CPU, with nothing downloaded.
//!
//! Everything is made here, seeded: arithmetic word problems where the numerals carry the
//! answer; two byte-level BPE tokenizers trained on them with the `tokenizers` crate, one that
//! splits numbers into single digits (the teacher's, like Qwen3) and one that keeps up to three
//! digits together (the student's, like Llama-3); a tiny teacher trained first on plain
//! cross-entropy; then tiny students, all from the same initial weights on the same batches,
//! distilled from it with CE only, GOLD, ULD, P-KL and H-KL through `xtoken train` itself. Each
//! is evaluated on held-out problems: the answer by greedy decoding, and the accuracy of
//! next-token prediction where the next token is a numeral.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use burn::backend::NdArray;
use burn::tensor::{DType, Int, Tensor, TensorData};
use clap::Args;
use serde::Serialize;
use xtoken_core::vocab::Vocabulary;
use xtoken_models::{Architecture, CausalLm, SaveDtype, Transformer};

use xtoken_train::launch::{train_on, Devices};
use xtoken_train::metrics::line_chart;
use xtoken_train::{RunConfig, RunOptions};

/// Options of `xtoken demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Where the corpus, tokenizers, models, runs and results go.
    #[arg(long, default_value = "xtoken-demo")]
    out: PathBuf,
    /// Print `{"results": [...], "seconds": ...}` on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Training problems.
    #[arg(long, default_value_t = 6000)]
    problems: usize,
    /// Held-out problems.
    #[arg(long, default_value_t = 300)]
    held_out: usize,
    /// Optimizer steps of the teacher.
    #[arg(long, default_value_t = 800)]
    teacher_steps: u64,
    /// Optimizer steps of each student.
    #[arg(long, default_value_t = 250)]
    student_steps: u64,
    /// Seeds the corpus, the tokenizers' data and every model's initial weights.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// One student's (or the teacher's) evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct MethodResult {
    pub method: String,
    pub answer_accuracy: f64,
    pub numeral_accuracy: f64,
    /// The training cross-entropy at the end (mean of the last 10 % of steps): the one loss
    /// every method shares.
    pub final_loss: f64,
}

/// A problem: its prompt (ending in "A:") and its answer.
type Problem = (String, String);

/// A named curve of `(step, value)` points.
type Curve = (String, Vec<(f64, f64)>);

/// xorshift64*: the corpus generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// An arithmetic word problem: the prompt (ending in "A:") and the answer. Three kinds, from
/// copying a numeral (learnable in minutes) to the successor of a 1–3 digit number (digit-wise
/// easy, but a 1-of-1000 choice for a tokenizer with one token per number).
fn problem(rng: &mut Rng) -> Problem {
    let name = rng.pick(&["Ann", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana"]);
    let thing = rng.pick(&["apples", "coins", "books", "stamps", "shells", "cards"]);
    let (question, answer) = match rng.below(3) {
        0 => {
            let a = rng.below(1000);
            (
                format!("{name} has {a} {thing} in a box. How many {thing} are in the box?"),
                a,
            )
        }
        1 => {
            let (a, b) = (rng.below(20), rng.below(20));
            (
                format!("{name} has {a} {thing} and gets {b} more. How many {thing} now?"),
                a + b,
            )
        }
        _ => {
            let a = rng.below(999);
            (
                format!("{name} has {a} {thing} and finds one more. How many {thing} now?"),
                a + 1,
            )
        }
    };
    (format!("Q: {question} A:"), format!(" {answer}"))
}

fn tokenizer_config(pre_tokenizer: &str) -> String {
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[{{"id":0,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}],
        "normalizer":null,"pre_tokenizer":{pre_tokenizer},"post_processor":null,
        "decoder":{{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}},
        "model":{{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
          "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{{}},"merges":[]}}}}"#
    )
}

/// Trains a byte-level BPE tokenizer on `texts` and writes `dir/tokenizer.json`.
fn train_tokenizer(dir: &Path, split_digits: bool, vocab: usize, texts: &[String]) -> Result<()> {
    use tokenizers::models::bpe::BpeTrainer;
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};
    let byte_level =
        r#"{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}"#;
    let pre = if split_digits {
        // Every digit alone, as Qwen3's pre-tokenizer does.
        format!(
            r#"{{"type":"Sequence","pretokenizers":[{{"type":"Digits","individual_digits":true}},{byte_level}]}}"#
        )
    } else {
        // Runs of up to three digits, as Llama-3's pre-tokenizer does.
        format!(
            r#"{{"type":"Sequence","pretokenizers":[{{"type":"Split","pattern":{{"Regex":"\\p{{N}}{{1,3}}"}},"behavior":"Isolated","invert":false}},{byte_level}]}}"#
        )
    };
    let mut tokenizer: Tokenizer = tokenizer_config(&pre)
        .parse()
        .map_err(|e| anyhow!("building the tokenizer: {e}"))?;
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainer::builder()
            .vocab_size(vocab)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
            .build(),
    );
    tokenizer
        .train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    std::fs::create_dir_all(dir)?;
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| anyhow!("saving the tokenizer: {e}"))?;
    Ok(())
}

/// A random tiny Llama for a tokenizer directory, saved beside it.
fn init_model(dir: &Path, hidden: usize, layers: usize, seed: u64) -> Result<()> {
    let vocab = Vocabulary::load(dir)?.size();
    let arch = Architecture::llama(vocab, hidden, hidden * 3, layers, 4, 2);
    Transformer::<NdArray>::random(&arch, seed, DType::F32, &Default::default())?
        .save(dir, SaveDtype::F32)?;
    Ok(())
}

/// One training run of the demo.
struct Run<'a> {
    out: &'a Path,
    student: &'a Path,
    teacher: &'a Path,
    loss: &'a str,
    alpha: f64,
    steps: u64,
}

/// Settings shared by every run of the demo (tiny models trained from scratch take a larger
/// learning rate than the paper's fine-tuning of a pretrained 1B).
fn run_toml(run: &Run<'_>, data: &Path, seed: u64) -> String {
    let Run {
        out,
        student,
        teacher,
        loss,
        alpha,
        steps,
    } = *run;
    format!(
        r#"
output_dir = {out:?}
seed = {seed}
[student]
model = {student:?}
[[teachers]]
name = "teacher"
model = {teacher:?}
loss = "{loss}"
alpha = {alpha}
[data]
path = {data:?}
[training]
steps = {steps}
batch_size = 16
micro_batch = 16
context_length = 96
lr = 3e-3
warmup = 0.05
log_every = {steps}
activation_checkpointing = false
[loss]
top_k = 0
[checkpoint]
every = {steps}
keep = 1
save_dtype = "f32"
"#,
        out = out.display().to_string(),
        student = student.display().to_string(),
        teacher = teacher.display().to_string(),
        data = data.display().to_string(),
    )
}

/// Trains one run of the demo on the device its configuration names (the CPU).
fn train(text: &str) -> Result<()> {
    let config = RunConfig::parse(text)?;
    let devices = Devices::of(&config)?;
    train_on(config, &RunOptions::default(), &devices)?;
    Ok(())
}

/// Mean training CE over the last 10 % of a run's steps, and the CE curve.
fn ce_curve(run: &Path) -> Result<(f64, Vec<(f64, f64)>)> {
    let text = std::fs::read_to_string(run.join("metrics.csv"))
        .with_context(|| format!("{}", run.display()))?;
    let points: Vec<(f64, f64)> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let v: Vec<f64> = l.split(',').filter_map(|x| x.parse().ok()).collect();
            (v.len() > 3).then(|| (v[0], v[3]))
        })
        .collect();
    let tail = (points.len() / 10).max(1);
    let last = &points[points.len().saturating_sub(tail)..];
    let mean = last.iter().map(|p| p.1).sum::<f64>() / last.len().max(1) as f64;
    Ok((mean, points))
}

/// A model directory with its tokenizer, for evaluation on the CPU.
struct Evaluated {
    model: Transformer<NdArray>,
    tokenizer: tokenizers::Tokenizer,
    /// Per token id: whether it is a numeral (digits after an optional space).
    is_numeral: Vec<bool>,
}

impl Evaluated {
    fn load(model_dir: &Path) -> Result<Self> {
        let model = Transformer::<NdArray>::load(model_dir, &Default::default())?;
        let vocab = Vocabulary::load(model_dir)?;
        let is_numeral = vocab
            .tokens()
            .iter()
            .map(|t| {
                let digits = t.bytes.strip_prefix(b" ").unwrap_or(&t.bytes);
                !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
            })
            .collect();
        Ok(Self {
            model,
            tokenizer: vocab.tokenizer().clone(),
            is_numeral,
        })
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|e| anyhow!("{e}"))?
            .get_ids()
            .to_vec())
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| anyhow!("{e}"))
    }

    /// The most probable next token at every position.
    fn argmax(&self, ids: &[u32]) -> Result<Vec<u32>> {
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let n = ids.len();
        let input =
            Tensor::<NdArray, 2, Int>::from_data(TensorData::new(ids, [1, n]), &Default::default());
        let logits = self.model.forward(input, None)?;
        let argmax = logits.argmax(2).into_data().convert::<i64>();
        Ok(argmax
            .to_vec::<i64>()
            .map_err(|e| anyhow!("{e:?}"))?
            .into_iter()
            .map(|i| i as u32)
            .collect())
    }

    /// Teacher-forced: `(right, total)` over the numeral tokens of the answer (the question's
    /// numerals are random, so nothing can predict them).
    fn numerals(&self, prompt: &str, answer: &str) -> Result<(usize, usize)> {
        let ids = self.encode(&format!("{prompt}{answer}\n"))?;
        let prompt_len = self.encode(prompt)?.len();
        let predicted = self.argmax(&ids)?;
        let (mut right, mut total) = (0, 0);
        for p in prompt_len.saturating_sub(1)..ids.len() - 1 {
            if self
                .is_numeral
                .get(ids[p + 1] as usize)
                .copied()
                .unwrap_or(false)
            {
                total += 1;
                right += usize::from(predicted[p] == ids[p + 1]);
            }
        }
        Ok((right, total))
    }

    /// Whether greedy decoding after the prompt gives the answer.
    fn answers(&self, prompt: &str, answer: &str) -> Result<bool> {
        let mut ids = self.encode(prompt)?;
        let start = ids.len();
        for _ in 0..6 {
            let next = *self.argmax(&ids)?.last().unwrap_or(&0);
            ids.push(next);
            let text = self.decode(&ids[start..])?;
            if text.contains('\n') || text.trim().len() > answer.trim().len() {
                break;
            }
        }
        let text = self.decode(&ids[start..])?;
        let given: String = text
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Ok(given == answer.trim())
    }
}

/// Greedy answers and numeral next-token accuracy of a model on held-out problems.
fn evaluate(model_dir: &Path, held_out: &[Problem]) -> Result<(f64, f64)> {
    let model = Evaluated::load(model_dir)?;
    let (mut right_answers, mut numeral_total, mut numeral_right) = (0usize, 0usize, 0usize);
    for (prompt, answer) in held_out {
        let (right, total) = model.numerals(prompt, answer)?;
        numeral_right += right;
        numeral_total += total;
        right_answers += usize::from(model.answers(prompt, answer)?);
    }
    Ok((
        right_answers as f64 / held_out.len().max(1) as f64,
        numeral_right as f64 / numeral_total.max(1) as f64,
    ))
}

/// The corpus: training problems written as JSON lines (returned as texts) and held-out ones.
fn corpus(args: &DemoArgs, data: &Path) -> Result<(Vec<String>, Vec<Problem>)> {
    let mut rng = Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let train_set: Vec<Problem> = (0..args.problems).map(|_| problem(&mut rng)).collect();
    let held_out: Vec<Problem> = (0..args.held_out).map(|_| problem(&mut rng)).collect();
    let texts: Vec<String> = train_set.iter().map(|(q, a)| format!("{q}{a}\n")).collect();
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(data, lines.join("\n") + "\n")?;
    eprintln!(
        "{} training and {} held-out problems, e.g. {:?}",
        train_set.len(),
        held_out.len(),
        texts[0]
    );
    Ok((texts, held_out))
}

/// The two tokenizers, trained on the corpus, and a random tiny Llama for each.
fn tokenizers_and_models(args: &DemoArgs, texts: &[String]) -> Result<(PathBuf, PathBuf)> {
    let (teacher_init, student_init) =
        (args.out.join("teacher-init"), args.out.join("student-init"));
    train_tokenizer(&teacher_init, true, 400, texts)?;
    train_tokenizer(&student_init, false, 1600, texts)?;
    for (name, dir) in [("teacher", &teacher_init), ("student", &student_init)] {
        let vocab = Vocabulary::load(dir)?;
        let ids = vocab.encode(" 742 + 58")?;
        let pieces: Vec<String> = ids
            .iter()
            .filter_map(|&i| vocab.token(i).map(|t| t.display()))
            .collect();
        eprintln!(
            "{name}: {} tokens; \" 742 + 58\" → {}",
            vocab.size(),
            pieces.join(" ")
        );
    }
    init_model(&teacher_init, 96, 3, args.seed)?;
    init_model(&student_init, 64, 2, args.seed + 1)?;
    Ok((teacher_init, student_init))
}

/// One student per method, distilled from `teacher` and evaluated; returns the results and the
/// training CE curves.
fn students(
    args: &DemoArgs,
    (student_init, teacher, data): (&Path, &Path, &Path),
    held_out: &[Problem],
) -> Result<(Vec<MethodResult>, Vec<Curve>)> {
    let methods = [
        ("CE only", "uld", 0.0),
        ("GOLD", "gold", 1.0),
        ("ULD", "uld", 1.0),
        ("P-KL", "pkl", 1.0),
        ("H-KL", "hkl", 1.0),
    ];
    let mut results = Vec::new();
    let mut curves = Vec::new();
    for (method, loss, alpha) in methods {
        eprintln!("\n== student: {method}");
        let run = args
            .out
            .join("runs")
            .join(method.replace(' ', "-").to_lowercase());
        let spec = Run {
            out: &run,
            student: student_init,
            teacher,
            loss,
            alpha,
            steps: args.student_steps,
        };
        train(&run_toml(&spec, data, args.seed))?;
        let (final_loss, curve) = ce_curve(&run)?;
        let (answer_accuracy, numeral_accuracy) = evaluate(&run.join("student"), held_out)?;
        curves.push((method.to_string(), curve));
        results.push(MethodResult {
            method: method.into(),
            answer_accuracy,
            numeral_accuracy,
            final_loss,
        });
    }
    Ok((results, curves))
}

/// The results as a Markdown table, the teacher's row first.
fn table(teacher: &MethodResult, results: &[MethodResult]) -> String {
    let mut table = String::from(
        "| method | answer accuracy | numeral-token accuracy | final training CE |\n|---|---:|---:|---:|\n",
    );
    table.push_str(&format!(
        "| teacher (digit-splitting tokenizer, CE) | {:.1} % | {:.1} % | {:.3} |\n",
        100.0 * teacher.answer_accuracy,
        100.0 * teacher.numeral_accuracy,
        teacher.final_loss
    ));
    for r in results {
        table.push_str(&format!(
            "| student, {} | {:.1} % | {:.1} % | {:.3} |\n",
            r.method,
            100.0 * r.answer_accuracy,
            100.0 * r.numeral_accuracy,
            r.final_loss
        ));
    }
    table
}

/// Runs the demo.
pub fn run(args: DemoArgs) -> Result<()> {
    let start = Instant::now();
    let out = &args.out;
    if out.join("runs").exists() {
        std::fs::remove_dir_all(out.join("runs"))?;
    }
    std::fs::create_dir_all(out)?;
    let say = |text: &str| eprintln!("\n== {text}");

    say("corpus: arithmetic word problems");
    let data = out.join("train.jsonl");
    let (texts, held_out) = corpus(&args, &data)?;

    say("tokenizers: the teacher's splits digits, the student's keeps up to three together");
    let (teacher_init, student_init) = tokenizers_and_models(&args, &texts)?;

    say("the teacher: cross-entropy only");
    let teacher_run = out.join("runs").join("teacher");
    let teacher_spec = Run {
        out: &teacher_run,
        student: &teacher_init,
        teacher: &teacher_init,
        loss: "kl",
        alpha: 0.0,
        steps: args.teacher_steps,
    };
    train(&run_toml(&teacher_spec, &data, args.seed))?;
    let teacher = teacher_run.join("student");
    let (final_loss, _) = ce_curve(&teacher_run)?;
    let (answer_accuracy, numeral_accuracy) = evaluate(&teacher, &held_out)?;
    let teacher_result = MethodResult {
        method: "teacher".into(),
        answer_accuracy,
        numeral_accuracy,
        final_loss,
    };
    let (results, curves) = students(&args, (&student_init, &teacher, &data), &held_out)?;
    let seconds = start.elapsed().as_secs_f64();
    report(
        &args,
        &table(&teacher_result, &results),
        &results,
        &curves,
        seconds,
    )
}

/// Writes `results.md` and `loss.svg`, and prints the table (or the JSON).
fn report(
    args: &DemoArgs,
    table: &str,
    results: &[MethodResult],
    curves: &[Curve],
    seconds: f64,
) -> Result<()> {
    let out = &args.out;
    let report = format!(
        "# xtoken demo\n\n{} training problems, {} held out; teacher {} steps, each student {} steps from the same initial weights on the same batches; seed {}; {:.0} s.\n\n{table}\nNumeral-token accuracy: teacher-forced next-token accuracy on the numeral tokens of the answers (1–3 digits per token for the students, one digit for the teacher). Answer accuracy: greedy decoding after \"A:\".\n",
        args.problems, args.held_out, args.teacher_steps, args.student_steps, args.seed, seconds
    );
    std::fs::write(out.join("results.md"), &report)?;
    std::fs::write(
        out.join("loss.svg"),
        line_chart(
            "xtoken demo: students' training cross-entropy",
            "step",
            curves,
        ),
    )?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "results": results, "seconds": seconds })
            )?
        );
    } else {
        println!("\n{table}");
        println!(
            "wrote {} and {} ({seconds:.0} s)",
            out.join("results.md").display(),
            out.join("loss.svg").display()
        );
    }
    Ok(())
}
