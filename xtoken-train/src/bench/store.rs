//! `xtoken bench store`: per stored layout and top-K, the bytes a teacher token takes and the
//! error of what training reads from it against the exact (f32) values — the largest
//! `|Δ log q|` of a kept entry, the KL between the decoded and the exact top-K distribution,
//! and P-KL's loss and student-logit gradient — beside DistillKit's stated schemes (ids in
//! `⌈log₂ V⌉` bits, an exact bf16 head, the tail a least-squares fit in the rank); and for our
//! layouts the time one core takes to read an entry back, against f32's in the same run.
//!
//! The teacher distributions: Zipf-shaped logits over a real vocabulary's width (151,680, as
//! Qwen3's tokenizer), peaked as language models' outputs are, with the ranked ids either spread
//! uniformly over the vocabulary, drawn by a Zipf prior over the id (BPE ids follow the merge
//! order, which follows frequency) or drawn by a real tokenizer's token frequencies in this
//! machine's English prose (`--frequencies`); and a trained model's own logits on a text
//! (`--model`, `--text`: e.g. `xtoken demo`'s teacher on its data).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::tensor::Tensor;
use clap::{Args, ValueEnum};
use xtoken_core::vocab::Vocabulary;
use xtoken_models::Transformer;
use xtoken_train::data::rng::{unit, SplitMix64};
use xtoken_train::targets::compact;
use xtoken_train::targets::shard::{self, POSITION_BYTES};
use xtoken_train::targets::ValueDtype;

#[derive(Args)]
pub struct StoreBenchArgs {
    /// Entries kept per position.
    #[arg(long, value_delimiter = ',', default_value = "50,128,1024,8192")]
    top_k: Vec<usize>,
    /// The synthetic distributions measured.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "zipf-uniform,zipf-frequency"
    )]
    synthetic: Vec<Synthetic>,
    /// Their vocabulary width.
    #[arg(long, default_value_t = 151_680)]
    vocab: usize,
    /// Positions per distribution.
    #[arg(long, default_value_t = 256)]
    positions: usize,
    /// A trained model's directory (config.json, weights, tokenizer.json) whose logits on
    /// `--text` are measured too.
    #[arg(long, requires = "text")]
    model: Option<PathBuf>,
    /// A JSONL file of `{"text": …}` documents for `--model`.
    #[arg(long, requires = "model")]
    text: Option<PathBuf>,
    /// A tokenizer (directory or tokenizer.json) whose tokens' frequencies in this machine's
    /// English prose (as `bench align` reads it) draw the ranked ids of one more distribution.
    #[arg(long)]
    frequencies: Option<PathBuf>,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// A synthetic teacher distribution.
#[derive(Clone, Copy, ValueEnum)]
enum Synthetic {
    /// Zipf-shaped values, the ranked ids a uniform draw from the vocabulary.
    ZipfUniform,
    /// Zipf-shaped values, the ranked ids drawn by a Zipf(1) prior over the id.
    ZipfFrequency,
}

/// A stored layout measured.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Ours(ValueDtype),
    /// DistillKit's scheme: `exact` head values in bf16, the tail fitted by `terms`.
    DistillKit {
        exact: usize,
        terms: &'static [Term],
    },
}

/// A term of DistillKit's tail fit, in the tail's rank `t ∈ [0, 1]`.
#[derive(Clone, Copy, PartialEq)]
enum Term {
    Power(i32),
    Sqrt,
}

/// DistillKit's recommended scheme (k = 128) and its budget one (k = 50).
const RECOMMENDED: Layout = Layout::DistillKit {
    exact: 16,
    terms: &[
        Term::Power(0),
        Term::Power(1),
        Term::Power(2),
        Term::Power(3),
        Term::Power(4),
        Term::Sqrt,
    ],
};
const BUDGET: Layout = Layout::DistillKit {
    exact: 1,
    terms: &[Term::Power(0), Term::Power(1), Term::Sqrt],
};

impl Layout {
    fn name(self) -> String {
        match self {
            Layout::Ours(d) => d.name().into(),
            Layout::DistillKit { exact, terms } => {
                format!("DistillKit ({exact} exact, {} terms)", terms.len())
            }
        }
    }
}

/// One teacher position: its logits over the vocabulary and a student's.
struct Position {
    teacher: Vec<f32>,
    student: Vec<f32>,
}

/// What every layout and K of a position shares: the teacher's log-sum-exp and its best ids
/// (best first, ties: the smaller id), the student's log-sum-exp and `Σ q²`.
struct Prepared<'a> {
    p: &'a Position,
    lse: f64,
    best: Vec<u32>,
    lse_s: f64,
    q2: f64,
}

impl<'a> Prepared<'a> {
    fn new(p: &'a Position, k: usize) -> Self {
        let z = &p.teacher;
        let better = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b));
        let mut best: Vec<u32> = (0..z.len() as u32).collect();
        best.select_nth_unstable_by(k - 1, better);
        best.truncate(k);
        best.sort_unstable_by(better);
        let lse_s = log_sum_exp(&p.student);
        let q2 = p
            .student
            .iter()
            .map(|&s| (2.0 * (s as f64 - lse_s)).exp())
            .sum();
        Self {
            p,
            lse: log_sum_exp(z),
            best,
            lse_s,
            q2,
        }
    }
}

/// What one (layout, K) accumulates over positions.
#[derive(Default)]
struct Tally {
    positions: usize,
    bytes: f64,
    entry_bytes: f64,
    max_dlog: f64,
    kl: f64,
    loss_exact: f64,
    loss_decoded: f64,
    loss_abs: f64,
    loss_abs_error: f64,
    dot: f64,
    exact_sq: f64,
    decoded_sq: f64,
    diff_sq: f64,
}

pub fn run(args: StoreBenchArgs) -> Result<()> {
    if args.positions == 0 || args.top_k.contains(&0) {
        bail!("--positions and every --top-k must be positive");
    }
    println!(
        "Per layout and top-K: bytes a teacher token takes (all in: its token, its observed \
         log-probability and its entries; entries alone), and against the exact f32 top-K: the \
         largest |Δ log q| of a kept entry, the mean KL(exact ‖ decoded) of the top-K \
         distributions, and P-KL (a student of the teacher's vocabulary) — its loss's relative \
         error summed over the positions (where errors of either sign cancel) and per position \
         (mean |ΔL| over mean |L|), and its student-logit gradient's relative error and \
         1 − cosine; for our layouts, one core's time to read an entry back (its id and value, \
         the positions read from the caches over and over), and that against f32's.\n"
    );
    let zipf_prior: Vec<f64> = (0..args.vocab).map(|id| -((id + 50) as f64).ln()).collect();
    for &synthetic in &args.synthetic {
        let mut rng = SplitMix64(args.seed);
        let ids = match synthetic {
            Synthetic::ZipfUniform => Ids::Uniform,
            Synthetic::ZipfFrequency => Ids::Weighted(&zipf_prior),
        };
        let positions: Vec<Position> = (0..args.positions)
            .map(|_| synthetic_position(ids, args.vocab, &mut rng))
            .collect();
        let what = match synthetic {
            Synthetic::ZipfUniform => "Zipf-shaped logits, ranked ids uniform over the vocabulary",
            Synthetic::ZipfFrequency => {
                "Zipf-shaped logits, ranked ids by a Zipf(1) prior over the id"
            }
        };
        table(
            &format!("{what} (V = {})", args.vocab),
            &positions,
            &args.top_k,
        )?;
    }
    if let Some(tokenizer) = &args.frequencies {
        let (log_weights, what) = token_frequencies(tokenizer, args.vocab)?;
        println!("{}", most_frequent_ids(&log_weights, &args.top_k));
        let mut rng = SplitMix64(args.seed);
        let positions: Vec<Position> = (0..args.positions)
            .map(|_| synthetic_position(Ids::Weighted(&log_weights), args.vocab, &mut rng))
            .collect();
        table(
            &format!(
                "Zipf-shaped logits, ranked ids by {what} (V = {})",
                args.vocab
            ),
            &positions,
            &args.top_k,
        )?;
    }
    if let (Some(model), Some(text)) = (&args.model, &args.text) {
        let positions = model_positions(model, text, args.positions, args.seed)?;
        let v = positions.first().map_or(0, |p| p.teacher.len());
        table(
            &format!(
                "{}'s logits on {} (V = {v})",
                model.display(),
                text.display()
            ),
            &positions,
            &args.top_k,
        )?;
    }
    Ok(())
}

/// Prints one distribution's table.
fn table(what: &str, positions: &[Position], top_k: &[usize]) -> Result<()> {
    let v = positions[0].teacher.len();
    let (entropy, top1) = peakedness(positions);
    println!(
        "**{what}**: {} positions, mean entropy {entropy:.2} nats, mean top-1 probability {top1:.2}\n",
        positions.len()
    );
    println!(
        "| K | layout | bytes/token (all in) | entries' bytes | ids' floor (uniform) | max \\|Δ log q\\| | KL | P-KL loss rel. error (sum) | (per position) | gradient rel. error | gradient 1 − cos | read, ns an entry (× f32's) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ks: Vec<usize> = top_k.iter().map(|&k| k.min(v)).collect();
    ks.dedup();
    let kmax = ks.iter().copied().max().unwrap_or(1);
    let prepared: Vec<Prepared> = positions.iter().map(|p| Prepared::new(p, kmax)).collect();
    for k in ks {
        let mut layouts = vec![
            Layout::Ours(ValueDtype::F32),
            Layout::Ours(ValueDtype::Bf16),
            Layout::Ours(ValueDtype::Q8),
            Layout::Ours(ValueDtype::Compact),
            Layout::Ours(ValueDtype::Packed),
            RECOMMENDED,
        ];
        if k <= 64 {
            layouts.push(BUDGET);
        }
        let mut f32_read = f64::NAN;
        for layout in layouts {
            let read = match layout {
                Layout::Ours(dtype) => {
                    let ns = read_ns(&prepared, k, dtype);
                    if dtype == ValueDtype::F32 {
                        f32_read = ns;
                    }
                    format!("{ns:.2} ({:.2}×)", ns / f32_read)
                }
                Layout::DistillKit { .. } => "—".into(),
            };
            let mut tally = Tally::default();
            for p in &prepared {
                measure(p, k, layout, &mut tally)?;
            }
            let n = tally.positions.max(1) as f64;
            let floor = ids_floor(v, k);
            println!(
                "| {k} | {} | {:.0} | {:.0} | {floor:.0} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {read} |",
                layout.name(),
                tally.bytes / n,
                tally.entry_bytes / n,
                tally.max_dlog,
                tally.kl / n,
                (tally.loss_decoded - tally.loss_exact).abs() / tally.loss_exact.abs().max(1e-30),
                tally.loss_abs_error / tally.loss_abs.max(1e-30),
                (tally.diff_sq / tally.exact_sq.max(1e-300)).sqrt(),
                1.0 - tally.dot / (tally.exact_sq * tally.decoded_sq).sqrt().max(1e-300),
            );
        }
    }
    println!();
    Ok(())
}

/// Mean entropy (nats) and top-1 probability of the teacher positions.
fn peakedness(positions: &[Position]) -> (f64, f64) {
    let (mut h, mut top) = (0.0, 0.0);
    for p in positions {
        let lse = log_sum_exp(&p.teacher);
        for &z in &p.teacher {
            let lp = z as f64 - lse;
            h -= lp.exp() * lp;
        }
        let max = p.teacher.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        top += (max as f64 - lse).exp();
    }
    let n = positions.len() as f64;
    (h / n, top / n)
}

/// `log₂ C(V, K) / 8`: the fewest bytes that name any `K` of `V` ids when all sets are alike.
fn ids_floor(v: usize, k: usize) -> f64 {
    (0..k)
        .map(|i| ((v - i) as f64 / (i + 1) as f64).log2())
        .sum::<f64>()
        .max(0.0)
        / 8.0
}

fn log_sum_exp(z: &[f32]) -> f64 {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + z.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln()
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u = unit(rng.next_u64()).max(1e-300);
    let w = unit(rng.next_u64());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()
}

/// How a synthetic position's ids take their ranks.
#[derive(Clone, Copy)]
enum Ids<'a> {
    /// A uniform shuffle of the vocabulary.
    Uniform,
    /// A Gumbel-top draw by these log-weights (one an id): the ranked ids are a draw without
    /// replacement in proportion to the weights.
    Weighted(&'a [f64]),
}

/// The log-weights of a tokenizer's ids by their tokens' counts (+ 1) in this machine's English
/// prose, and what they are, in words.
fn token_frequencies(tokenizer: &std::path::Path, v: usize) -> Result<(Vec<f64>, String)> {
    let vocab = Vocabulary::load(tokenizer)?;
    let prose = super::corpora::all(8 << 20)
        .into_iter()
        .flatten()
        .find(|c| c.kind == "prose")
        .context("no English prose on this machine (licenses, vim help) to count tokens in")?;
    let mut counts = vec![1f64; v];
    let mut tokens = 0usize;
    for doc in super::corpora::split(&prose.text, 100 << 10) {
        for id in vocab.encode(doc)? {
            if let Some(c) = counts.get_mut(id as usize) {
                *c += 1.0;
            }
            tokens += 1;
        }
    }
    let what = format!(
        "{}'s token frequencies in {} ({} tokens)",
        tokenizer.display(),
        prose.source,
        tokens
    );
    Ok((counts.iter().map(|c| c.ln()).collect(), what))
}

/// Where a vocabulary's most frequent tokens sit: the median id of the `k` heaviest ids for each
/// `k` (ties: the smaller id).
fn most_frequent_ids(log_weights: &[f64], ks: &[usize]) -> String {
    let mut ranked: Vec<u32> = (0..log_weights.len() as u32).collect();
    ranked.sort_by(|&x, &y| log_weights[y as usize].total_cmp(&log_weights[x as usize]));
    let medians: Vec<String> = ks
        .iter()
        .map(|&k| {
            let mut top = ranked[..k.min(ranked.len())].to_vec();
            top.sort_unstable();
            let median = top.get(top.len() / 2).copied().unwrap_or(0);
            format!("K = {k}: {median}")
        })
        .collect();
    format!(
        "The median id of the K most frequent tokens, of {}: {}\n",
        log_weights.len(),
        medians.join(", ")
    )
}

/// A synthetic position: the value of rank `r` is `−a·ln r + 0.5·N(0, 1)` with `a` drawn from
/// `[1.1, 2.6]` per position (peaked as LM outputs: see each table's entropy and top-1
/// probability); the ids take their ranks as `ids` says (the Zipf(1) prior over the id: a
/// Gumbel-top draw by `−ln(id + 50)`). The student is `0.8·z + 0.5·N(0, 1)`.
fn synthetic_position(ids: Ids<'_>, v: usize, rng: &mut SplitMix64) -> Position {
    let a = 1.1 + 1.5 * unit(rng.next_u64());
    let mut order: Vec<u32> = (0..v as u32).collect();
    match ids {
        Ids::Uniform => {
            for i in (1..v).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        Ids::Weighted(log_weights) => {
            let keys: Vec<f64> = (0..v)
                .map(|id| {
                    let gumbel = -(-unit(rng.next_u64()).max(1e-300).ln()).ln();
                    log_weights.get(id).copied().unwrap_or(f64::NEG_INFINITY) + gumbel
                })
                .collect();
            order.sort_unstable_by(|&x, &y| keys[y as usize].total_cmp(&keys[x as usize]));
        }
    }
    let mut teacher = vec![0f32; v];
    for (rank, &id) in order.iter().enumerate() {
        teacher[id as usize] = (-a * ((rank + 1) as f64).ln() + 0.5 * normal(rng)) as f32;
    }
    let student = teacher
        .iter()
        .map(|&z| (0.8 * z as f64 + 0.5 * normal(rng)) as f32)
        .collect();
    Position { teacher, student }
}

/// Up to `count` positions of a trained model's logits on the documents of `text`; its
/// student is the same `0.8·z + 0.5·N(0, 1)` as the synthetic ones'.
fn model_positions(
    dir: &std::path::Path,
    text: &std::path::Path,
    count: usize,
    seed: u64,
) -> Result<Vec<Position>> {
    type B = burn_flex::Flex;
    let device = Default::default();
    let model = Transformer::<B>::load(dir, &device)
        .with_context(|| format!("{}: loading the model", dir.display()))?;
    let vocab = Vocabulary::load(dir.join("tokenizer.json"))?;
    let lines =
        std::fs::read_to_string(text).with_context(|| format!("reading {}", text.display()))?;
    let mut rng = SplitMix64(seed);
    let mut out = Vec::new();
    for (n, line) in lines.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let record: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", text.display(), n + 1))?;
        let Some(doc) = record["text"].as_str() else {
            bail!("{}:{}: no \"text\" field", text.display(), n + 1);
        };
        let ids: Vec<i64> = vocab
            .encode(doc)?
            .into_iter()
            .take(512)
            .map(i64::from)
            .collect();
        if ids.is_empty() {
            continue;
        }
        let tokens =
            xtoken_train::train::teachers::tokens::<B>(&ids, &None, [1, ids.len()], &device)?;
        let logits: Tensor<B, 3> = model.forward_of(&tokens)?;
        let [_, t, v] = logits.dims();
        let values: Vec<f32> = logits
            .into_data()
            .convert::<f32>()
            .to_vec()
            .map_err(|e| anyhow::anyhow!("reading the logits: {e:?}"))?;
        for row in values.chunks_exact(v).take(t) {
            let student = row
                .iter()
                .map(|&z| (0.8 * z as f64 + 0.5 * normal(&mut rng)) as f32)
                .collect();
            out.push(Position {
                teacher: row.to_vec(),
                student,
            });
            if out.len() == count {
                return Ok(out);
            }
        }
    }
    if out.is_empty() {
        bail!("{}: no document with tokens", text.display());
    }
    Ok(out)
}

/// Stores position `p`'s top-`k` in `layout`, decodes it, and adds its bytes and errors.
/// The exact log-probabilities of a position's best `k` entries, best first.
fn exact_values(p: &Prepared, k: usize) -> Vec<f32> {
    let z = &p.p.teacher;
    p.best[..k]
        .iter()
        .map(|&i| (z[i as usize] as f64 - p.lse) as f32)
        .collect()
}

/// Nanoseconds one core takes to read an entry back (its id and value, into a micro-batch's
/// slices, as the loader does) in `dtype`'s layout: the positions' encodings read over and over
/// for [`READ_S`], from the caches (a loader's merge reads them from memory).
fn read_ns(prepared: &[Prepared], k: usize, dtype: ValueDtype) -> f64 {
    let encoded: Vec<Vec<u8>> = prepared
        .iter()
        .map(|p| {
            let (ids, exact) = (&p.best[..k], exact_values(p, k));
            let mut out = Vec::new();
            if let Some(code) = dtype.id_code() {
                compact::encode(ids, &exact, code, &mut Vec::new(), &mut out);
            } else {
                ids.iter()
                    .for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
                dtype.encode(&exact, &mut out);
            }
            out
        })
        .collect();
    let (mut ids, mut values) = (vec![0u32; k], vec![0f32; k]);
    let mut reader = compact::Reader::default();
    let (started, mut entries) = (Instant::now(), 0usize);
    while started.elapsed().as_secs_f64() < READ_S {
        for bytes in &encoded {
            if let Some(code) = dtype.id_code() {
                reader.best_first(bytes, code, k, &mut ids, &mut values, 0.0);
            } else {
                let stored = bytes.split_at(4 * k);
                shard::fixed_entries(dtype, stored, &mut ids, &mut values);
            }
            std::hint::black_box((&mut ids, &mut values));
            entries += k;
        }
    }
    started.elapsed().as_secs_f64() * 1e9 / entries.max(1) as f64
}

/// Seconds each layout's reading is timed over.
const READ_S: f64 = 0.3;

fn measure(p: &Prepared, k: usize, layout: Layout, tally: &mut Tally) -> Result<()> {
    let order = &p.best[..k];
    let z = &p.p.teacher;
    let exact = exact_values(p, k);
    let (decoded, entry_bytes) = store_and_read(order, &exact, layout, z.len())?;
    let all_in = match layout {
        // The token and its observed log-probability (and, in a fixed layout, the confidence
        // terms) besides the entries; the compact layout's block end.
        Layout::Ours(dtype) if dtype.id_code().is_some() => 12,
        Layout::Ours(_) => POSITION_BYTES,
        Layout::DistillKit { .. } => 0,
    };
    tally.positions += 1;
    tally.entry_bytes += entry_bytes as f64;
    tally.bytes += (entry_bytes + all_in) as f64;
    add_errors(p, &exact, &decoded, order, tally);
    Ok(())
}

/// The decoded values of `exact` (for `ids`, best first) and the bytes of their entries.
fn store_and_read(
    ids: &[u32],
    exact: &[f32],
    layout: Layout,
    v: usize,
) -> Result<(Vec<f32>, usize)> {
    let k = ids.len();
    match layout {
        Layout::Ours(dtype) => match dtype.id_code() {
            Some(code) => compact_store_and_read(ids, exact, code),
            None => {
                let mut bytes = Vec::new();
                dtype.encode(exact, &mut bytes);
                let mut decoded = vec![0f32; k];
                dtype.decode(&bytes, &mut decoded);
                Ok((decoded, 4 * k + bytes.len()))
            }
        },
        Layout::DistillKit { exact: head, terms } => {
            let head = head.min(k);
            let mut decoded: Vec<f32> = exact[..head]
                .iter()
                .map(|&x| burn::tensor::bf16::from_f32(x).to_f32())
                .collect();
            decoded.extend(fit_tail(&exact[head..], terms));
            let id_bits = (v as f64).log2().ceil() as usize;
            let bits = k * id_bits + head * 16 + terms.len() * 32;
            Ok((decoded, bits.div_ceil(8)))
        }
    }
}

/// A compact layout's block of `ids` and their `exact` values (best first), its ids coded as
/// `code` says: the decoded values in `ids`' order, and the block's bytes.
fn compact_store_and_read(
    ids: &[u32],
    exact: &[f32],
    code: compact::IdCode,
) -> Result<(Vec<f32>, usize)> {
    let k = ids.len();
    let mut block = Vec::new();
    compact::encode(ids, exact, code, &mut Vec::new(), &mut block);
    let (mut read_ids, mut read) = (vec![0u32; k], vec![0f32; k]);
    let mut reader = compact::Reader::default();
    reader.best_first(&block, code, k, &mut read_ids, &mut read, 0.0);
    // Back to the exact values' order (through the decoded entries sorted by id).
    let mut by_id: Vec<(u32, f32)> = read_ids.into_iter().zip(read).collect();
    by_id.sort_unstable_by_key(|e| e.0);
    let decoded = ids
        .iter()
        .map(|id| {
            let at = by_id.binary_search_by_key(id, |e| e.0);
            at.map(|i| by_id[i].1)
                .map_err(|_| anyhow::anyhow!("compact lost id {id}"))
        })
        .collect::<Result<Vec<f32>>>()?;
    Ok((decoded, block.len()))
}

/// DistillKit's tail: the least-squares fit of `tail` by `terms` of `t = j/(n−1)`, its
/// coefficients rounded to f32, evaluated at each `t`.
fn fit_tail(tail: &[f32], terms: &[Term]) -> Vec<f32> {
    let n = tail.len();
    if n == 0 {
        return Vec::new();
    }
    let m = terms.len();
    let t = |j: usize| {
        if n > 1 {
            j as f64 / (n - 1) as f64
        } else {
            0.0
        }
    };
    let basis = |x: f64, term: Term| match term {
        Term::Power(p) => x.powi(p),
        Term::Sqrt => x.sqrt(),
    };
    // Normal equations AᵀA c = Aᵀy, solved by Gaussian elimination with partial pivoting.
    let mut a = vec![vec![0f64; m + 1]; m];
    for (j, &y) in tail.iter().enumerate() {
        let row: Vec<f64> = terms.iter().map(|&term| basis(t(j), term)).collect();
        for r in 0..m {
            for c in 0..m {
                a[r][c] += row[r] * row[c];
            }
            a[r][m] += row[r] * y as f64;
        }
    }
    for col in 0..m {
        let pivot = (col..m)
            .max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        if a[col][col].abs() < 1e-12 {
            continue;
        }
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    let coeffs: Vec<f32> = (0..m)
        .map(|r| {
            if a[r][r].abs() < 1e-12 {
                0.0
            } else {
                (a[r][m] / a[r][r]) as f32
            }
        })
        .collect();
    (0..n)
        .map(|j| {
            terms
                .iter()
                .zip(&coeffs)
                .map(|(&term, &c)| c as f64 * basis(t(j), term))
                .sum::<f64>() as f32
        })
        .collect()
}

/// Adds the errors of `decoded` against `exact` (both for `ids`) at position `p`: the largest
/// `|Δ log q|`, KL(exact ‖ decoded) over the top-K renormalized, and P-KL with the identity
/// projection: `L = Σ_kept p (log p − log q_S)` (summed over positions, where errors of either
/// sign cancel, and per position), `∂L/∂s = q_S·Σ_kept p − p` (kept ids).
fn add_errors(p: &Prepared, exact: &[f32], decoded: &[f32], ids: &[u32], tally: &mut Tally) {
    for (e, d) in exact.iter().zip(decoded) {
        tally.max_dlog = tally.max_dlog.max((*e as f64 - *d as f64).abs());
    }
    let norm = |x: &[f32]| {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    };
    let (ne, nd) = (norm(exact), norm(decoded));
    tally.kl += exact
        .iter()
        .zip(decoded)
        .map(|(&e, &d)| {
            let (le, ld) = (e as f64 - ne, d as f64 - nd);
            le.exp() * (le - ld)
        })
        .sum::<f64>();
    let log_q = |id: u32| p.p.student[id as usize] as f64 - p.lse_s;
    let (mass_e, mass_d): (f64, f64) = (
        exact.iter().map(|&x| (x as f64).exp()).sum(),
        decoded.iter().map(|&x| (x as f64).exp()).sum(),
    );
    let mut kept_q2 = 0.0;
    let (mut loss_e, mut loss_d) = (0.0, 0.0);
    for ((&e, &d), &id) in exact.iter().zip(decoded).zip(ids) {
        let (pe, pd, lq) = ((e as f64).exp(), (d as f64).exp(), log_q(id));
        loss_e += pe * (e as f64 - lq);
        loss_d += pd * (d as f64 - lq);
        let q = lq.exp();
        kept_q2 += q * q;
        let (ge, gd) = (q * mass_e - pe, q * mass_d - pd);
        tally.dot += ge * gd;
        tally.exact_sq += ge * ge;
        tally.decoded_sq += gd * gd;
        tally.diff_sq += (ge - gd) * (ge - gd);
    }
    tally.loss_exact += loss_e;
    tally.loss_decoded += loss_d;
    tally.loss_abs += loss_e.abs();
    tally.loss_abs_error += (loss_d - loss_e).abs();
    // The ids outside the top-K: ∂L/∂s = q_S·mass on both sides.
    let rest = (p.q2 - kept_q2).max(0.0);
    tally.dot += mass_e * mass_d * rest;
    tally.exact_sq += mass_e * mass_e * rest;
    tally.decoded_sq += mass_d * mass_d * rest;
    tally.diff_sq += (mass_e - mass_d).powi(2) * rest;
}
