//! The record of every scored document (`--log-samples`), in lm-evaluation-harness's
//! `--log_samples` layout, so that a score can be debugged document by document and two runs,
//! or a run and the harness, compared: a JSON Lines file `samples_<task>.jsonl` per task (per
//! subject for MMLU and MATH, named as the harness names the subtask: `mmlu_anatomy`,
//! `hendrycks_math_algebra`), a line per document, or per document and filter where a task has
//! several (GSM8k's `strict-match` and `flexible-extract`), with the harness's fields:
//!
//! - `doc_id` (the document's place in its subset's scored split), `doc` (the document as the
//!   task processed it: the row read, with the fields the harness's `process_docs` adds, such
//!   as HellaSwag's `query`, `choices` and `gold`), `target` (the harness's `doc_to_target`, as
//!   a string);
//! - `arguments`: `{"gen_args_<i>": {"arg_0": context, "arg_1": continuation or the
//!   generation's settings}}`, a request each;
//! - `resps` and `filtered_resps`: each continuation's log-likelihood and whether it is the
//!   greedy one, or the generated text and the answer a filter takes from it, as the harness
//!   writes them (Python's `str` of each value);
//! - `filter`, `metrics` (their names), `doc_hash`, `prompt_hash` and `target_hash` (SHA-256 of
//!   the document as `json.dumps(doc, indent=2)` writes it, of the first request's context and
//!   of the target), then each metric's value, typed as the harness's (MATH's `exact_match` an
//!   integer, the others floats).
//!
//! Keys are in the harness's order and each line is written as Python's `json.dumps` writes
//! it, so that a line diff against the harness's records shows only the log-likelihoods' last
//! digits.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use xtoken_core::vocab::sha256_hex;
use xtoken_models::checkpoint::write_atomically;

use super::pyjson::{self, python_str};
use super::task::{Item, LogLikelihood, Request, Response, Task};
use crate::error::{Context, Result};

/// The records of one task, or of one subject of it.
#[derive(Clone, Debug)]
pub struct SampleFile {
    /// The harness's name of the (sub)task: the file is `samples_<name>.jsonl`.
    pub name: String,
    /// A JSON object per line.
    pub records: Vec<Value>,
}

/// The records of one task's scored documents (`items`, with their `responses` and each
/// metric's `scores`), a file per subset; `max_gen_toks` is the generations' limit.
pub fn records(
    task: &dyn Task,
    items: &[Item],
    responses: &[Response],
    scores: &[Vec<f64>],
    max_gen_toks: usize,
) -> Result<Vec<SampleFile>> {
    let mut files = Vec::new();
    // `prompts` lays the subsets out one after another, in name order.
    let mut start = 0;
    while start < items.len() {
        let subset = &items[start].subset;
        let end = start
            + items[start..]
                .iter()
                .take_while(|i| &i.subset == subset)
                .count();
        let mut records = Vec::with_capacity((end - start) * task.filters().len());
        for filter in task.filters() {
            for (doc_id, at) in (start..end).enumerate() {
                let scored = Scored {
                    doc_id,
                    item: &items[at],
                    response: &responses[at],
                    scores: &scores[at],
                };
                records.push(record(task, &scored, filter, max_gen_toks)?);
            }
        }
        files.push(SampleFile {
            name: task.harness_name(subset),
            records,
        });
        start = end;
    }
    Ok(files)
}

/// Writes each file into `dir` (created if need be), replacing an earlier record of the same
/// task; returns the paths.
pub fn write(dir: &Path, files: &[SampleFile]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::with_capacity(files.len());
    for file in files {
        let path = dir.join(format!("samples_{}.jsonl", file.name));
        let mut text = String::new();
        for record in &file.records {
            text.push_str(&pyjson::dumps(record));
            text.push('\n');
        }
        write_atomically(&path, &text)?;
        written.push(path);
    }
    Ok(written)
}

/// One scored document.
struct Scored<'a> {
    doc_id: usize,
    item: &'a Item,
    response: &'a Response,
    scores: &'a [f64],
}

fn record(task: &dyn Task, scored: &Scored, filter: &str, max_gen_toks: usize) -> Result<Value> {
    let target = task.target(&scored.item.doc)?;
    let doc = Value::Object(task.processed(&scored.item.doc)?);
    let doc_hash = sha256_hex(pyjson::dumps_indented(&doc, 2).as_bytes());
    let (resps, filtered) = responses(task, scored.response, filter);
    let (arguments, first_context) = arguments(&scored.item.request, max_gen_toks);
    let mut metrics = Vec::new();
    for (metric, &value) in task.metrics().iter().zip(scored.scores) {
        let (name, of) = metric.split_once(',').unwrap_or((metric, "none"));
        if of == filter {
            let value = match task.integer_scores() {
                true => json!(value as i64),
                false => json!(value),
            };
            metrics.push((name, value));
        }
    }
    let names: Vec<&str> = metrics.iter().map(|(name, _)| *name).collect();
    let mut record = Map::new();
    record.insert("doc_id".into(), json!(scored.doc_id));
    record.insert("doc".into(), doc);
    record.insert("target".into(), json!(target));
    record.insert("arguments".into(), arguments);
    record.insert("resps".into(), resps);
    record.insert("filtered_resps".into(), filtered);
    record.insert("filter".into(), json!(filter));
    record.insert("metrics".into(), json!(names));
    record.insert("doc_hash".into(), json!(doc_hash));
    record.insert(
        "prompt_hash".into(),
        json!(sha256_hex(first_context.as_bytes())),
    );
    record.insert("target_hash".into(), json!(sha256_hex(target.as_bytes())));
    for (name, value) in metrics {
        record.insert(name.into(), value);
    }
    Ok(Value::Object(record))
}

/// The requests' arguments, and the first request's context (which `prompt_hash` hashes).
fn arguments(request: &Request, max_gen_toks: usize) -> (Value, &str) {
    let mut arguments = Map::new();
    match request {
        Request::Choice { pairs } => {
            for (i, (context, continuation)) in pairs.iter().enumerate() {
                arguments.insert(
                    format!("gen_args_{i}"),
                    json!({ "arg_0": context, "arg_1": continuation }),
                );
            }
            let first = pairs.first().map_or("", |(context, _)| context.as_str());
            (Value::Object(arguments), first)
        }
        Request::Generate { context, until } => {
            // Greedy decoding, as the tasks' `generation_kwargs` ask.
            let settings = json!({
                "until": until,
                "do_sample": false,
                "temperature": 0.0,
                "max_gen_toks": max_gen_toks,
            });
            arguments.insert(
                "gen_args_0".into(),
                json!({ "arg_0": context, "arg_1": settings }),
            );
            (Value::Object(arguments), context.as_str())
        }
    }
}

/// `resps` and `filtered_resps` of a response under `filter`.
fn responses(task: &dyn Task, response: &Response, filter: &str) -> (Value, Value) {
    match response {
        Response::Choice(lls) => {
            let pairs: Vec<Value> = lls.iter().map(loglikelihood).collect();
            let nested: Vec<Value> = pairs.iter().map(|p| json!([p])).collect();
            (json!(nested), json!(pairs))
        }
        Response::Text(text) => (json!([[text]]), json!([task.filtered(filter, text)])),
    }
}

/// `(loglikelihood, is_greedy)` as the harness writes the pair: both as Python's `str`.
fn loglikelihood(ll: &LogLikelihood) -> Value {
    let greedy = if ll.greedy { "True" } else { "False" };
    json!([python_str(ll.value), greedy])
}
