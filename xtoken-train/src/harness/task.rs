//! What a benchmark is to the evaluator: where its documents are, how a document becomes a
//! prompt (with solved examples before it), and how the model's answer is scored. A new task is
//! a type implementing [`Task`] in a file of its own, added to [`tasks::named`](super::tasks).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::docs::{read_splits, Doc};
use super::pyrandom::PyRandom;
use crate::error::{Error, Result};

/// What the model is asked.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// The log-likelihood of each `(context, continuation)` pair; the answer is the likeliest.
    Choice {
        /// One pair per choice.
        pairs: Vec<(String, String)>,
    },
    /// Greedy generation after `context`, cut at the first of `until` (or the end of text).
    Generate {
        /// The prompt.
        context: String,
        /// Stop sequences.
        until: Vec<String>,
    },
}

/// A continuation's log-likelihood, in nats, and whether it is the greedy continuation (each of
/// its tokens the most likely one): the harness's `(loglikelihood, is_greedy)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogLikelihood {
    /// The log-likelihood.
    pub value: f64,
    /// Whether greedy decoding would have produced the continuation.
    pub greedy: bool,
}

/// What the model answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    /// Each choice's continuation, scored.
    Choice(Vec<LogLikelihood>),
    /// The generated text, cut at the first stop sequence.
    Text(String),
}

/// How a document's solved examples are drawn from the few-shot split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampler {
    /// The first `k` of the subset's examples, the same for every document (MMLU).
    FirstN,
    /// `Random(seed).sample(pool, k)`, one generator per subset drawn document after document.
    Random,
    /// As `Random`, but `k + 1` drawn and the scored document dropped from them (the harness
    /// does so for tasks without a test split, HellaSwag and WinoGrande, where it compares
    /// their missing few-shot split with their missing test split).
    RandomExcludingDoc,
}

/// A benchmark as lm-evaluation-harness defines it.
pub trait Task: Send + Sync {
    /// Its name on the command line and in reports.
    fn name(&self) -> &'static str;
    /// The hub configs to read in preference to the whole directory (the first that exists).
    fn configs(&self) -> &'static [&'static str] {
        &[]
    }
    /// The split that is scored.
    fn eval_split(&self) -> &'static str;
    /// The split solved examples come from.
    fn fewshot_split(&self) -> &'static str;
    /// How they are drawn.
    fn sampler(&self) -> Sampler {
        Sampler::Random
    }
    /// The subset a document belongs to (MMLU's subject, MATH's type); subsets draw examples
    /// from their own documents, with a generator each, and are limited each.
    fn subset(&self, _doc: &Doc) -> Result<String> {
        Ok(String::new())
    }
    /// Text before the examples (MMLU's "The following are multiple choice questions…").
    fn description(&self, _subset: &str) -> String {
        String::new()
    }
    /// A solved example as it appears in the prompt: question, target delimiter, answer.
    fn shot(&self, doc: &Doc) -> Result<String>;
    /// The request for a document, after `prefix` (the description and examples).
    fn request(&self, doc: &Doc, prefix: &str) -> Result<Request>;
    /// The metrics [`score`](Task::score) returns, in order.
    fn metrics(&self) -> &'static [&'static str];
    /// The metric the average over tasks takes.
    fn headline(&self) -> &'static str;
    /// Each metric's score for one document, in `metrics()` order.
    fn score(&self, doc: &Doc, response: &Response) -> Result<Vec<f64>>;
    /// What the harness's `doc_to_target` makes of a document, as its records write it.
    fn target(&self, doc: &Doc) -> Result<String>;
    /// The harness's filters of a generated answer (its `filter_list`); a metric named
    /// `name,filter` is scored after `filter`, one named `name` after `none`.
    fn filters(&self) -> &'static [&'static str] {
        &["none"]
    }
    /// The answer `filter` takes from a generated `text`, as the harness's records show it.
    fn filtered(&self, _filter: &str, text: &str) -> String {
        text.to_string()
    }
    /// The document as the harness's `process_docs` leaves it, which its records show and
    /// hash: the row read, with the fields the task adds after its own.
    fn processed(&self, doc: &Doc) -> Result<Map<String, Value>> {
        Ok(doc.fields.clone())
    }
    /// Whether the harness's `process_results` gives each score as an integer (MATH's
    /// `exact_match`) rather than a float; its records write the score so.
    fn integer_scores(&self) -> bool {
        false
    }
    /// The harness's name of a subset's (sub)task, which names its record's file.
    fn harness_name(&self, _subset: &str) -> String {
        self.name().to_string()
    }
}

/// How prompts are made.
#[derive(Clone, Copy, Debug)]
pub struct PromptSettings {
    /// Solved examples per prompt.
    pub shots: usize,
    /// The few-shot generator's seed (the harness's `fewshot_random_seed`, 1234).
    pub seed: u64,
    /// Documents scored per subset at most (the harness's `--limit`).
    pub limit: Option<usize>,
}

/// One scored document with its request.
#[derive(Clone, Debug)]
pub struct Item {
    /// The subset it belongs to.
    pub subset: String,
    /// The document.
    pub doc: Doc,
    /// What the model is asked.
    pub request: Request,
}

/// Reads a task's documents under `dir` and makes every request, subsets in name order and
/// documents in file order, as the harness builds them.
pub fn prompts(task: &dyn Task, dir: &Path, settings: &PromptSettings) -> Result<Vec<Item>> {
    let mut splits = read_splits(dir, task.configs())?;
    // Named before any split is taken out, so that a missing second split lists the first.
    let found: Vec<String> = splits.keys().cloned().collect();
    let split = |splits: &mut BTreeMap<String, Vec<Doc>>, name: &str| {
        splits.remove(name).ok_or_else(|| {
            Error::Data(format!(
                "{}: {}: no `{name}` split (found: {})",
                dir.display(),
                task.name(),
                found.join(", ")
            ))
        })
    };
    let eval = split(&mut splits, task.eval_split())?;
    let fewshot = if settings.shots > 0 {
        split(&mut splits, task.fewshot_split())?
    } else {
        Vec::new()
    };
    let eval = by_subset(task, eval)?;
    let mut pools = by_subset(task, fewshot)?;
    let mut items = Vec::new();
    for (subset, docs) in eval {
        let pool = pools.remove(&subset).unwrap_or_default();
        if pool.len() < settings.shots {
            return Err(Error::Data(format!(
                "{}: {}{}: {} solved examples in the `{}` split, {} asked for",
                dir.display(),
                task.name(),
                if subset.is_empty() {
                    String::new()
                } else {
                    format!(" ({subset})")
                },
                pool.len(),
                task.fewshot_split(),
                settings.shots
            )));
        }
        let mut rng = PyRandom::new(settings.seed);
        let limit = settings.limit.unwrap_or(usize::MAX);
        for doc in docs.into_iter().take(limit) {
            let picked = draw(task.sampler(), &mut rng, &pool, &doc, settings.shots);
            let prefix = prefix(task, &subset, picked.iter().map(|&i| &pool[i]))?;
            let request = task.request(&doc, &prefix)?;
            items.push(Item {
                subset: subset.clone(),
                doc,
                request,
            });
        }
    }
    Ok(items)
}

/// The indices of a document's solved examples in its subset's pool.
fn draw(sampler: Sampler, rng: &mut PyRandom, pool: &[Doc], doc: &Doc, k: usize) -> Vec<usize> {
    match sampler {
        Sampler::FirstN => (0..k).collect(),
        Sampler::Random => rng.sample(pool.len(), k),
        Sampler::RandomExcludingDoc => {
            let same = |i: &usize| pool[*i].fields == doc.fields;
            let drawn = rng.sample(pool.len(), (k + 1).min(pool.len()));
            let kept: Vec<usize> = drawn.into_iter().filter(|i| !same(i)).take(k).collect();
            if kept.len() == k {
                return kept;
            }
            // Copies of the document in the pool were drawn too: draw again without them.
            let others: Vec<usize> = (0..pool.len()).filter(|i| !same(i)).collect();
            rng.sample(others.len(), k.min(others.len()))
                .into_iter()
                .map(|i| others[i])
                .collect()
        }
    }
}

/// The description, then each solved example followed by the few-shot delimiter `"\n\n"`.
fn prefix<'a>(
    task: &dyn Task,
    subset: &str,
    shots: impl Iterator<Item = &'a Doc>,
) -> Result<String> {
    let mut text = task.description(subset);
    for doc in shots {
        text.push_str(&task.shot(doc)?);
        text.push_str("\n\n");
    }
    Ok(text)
}

fn by_subset(task: &dyn Task, docs: Vec<Doc>) -> Result<BTreeMap<String, Vec<Doc>>> {
    let mut subsets: BTreeMap<String, Vec<Doc>> = BTreeMap::new();
    for doc in docs {
        subsets.entry(task.subset(&doc)?).or_default().push(doc);
    }
    Ok(subsets)
}

/// The index of the largest value (the first on ties, as `numpy.argmax`).
pub fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// The log-likelihoods of scored continuations.
pub fn values(lls: &[LogLikelihood]) -> Vec<f64> {
    lls.iter().map(|ll| ll.value).collect()
}

/// `acc` for a multiple-choice response: 1 when the likeliest choice is `gold`.
pub fn choice_accuracy(response: &Response, gold: usize) -> Result<f64> {
    match response {
        Response::Choice(lls) => Ok(f64::from(argmax(&values(lls)) == gold)),
        Response::Text(_) => Err(Error::Data(
            "a multiple-choice task was answered with text".into(),
        )),
    }
}
