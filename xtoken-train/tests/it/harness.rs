//! `xtoken eval` against lm-evaluation-harness and HF transformers, on the fixtures
//! `fixtures/harness/make_harness.py` wrote: a few documents of each task in its public format,
//! a tiny random Llama with its own BPE tokenizer, and what the harness (with HF transformers)
//! made of them: every prompt, every log-likelihood and generation, every metric.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::tensor::DType;
use serde_json::Value;
use xtoken_models::{Decoding, Transformer};
use xtoken_train::harness::docs::Doc;
use xtoken_train::harness::model::{token_loglikelihoods, Loaded, Scorable};
use xtoken_train::harness::task::{prompts, Item, PromptSettings, Request, Response, Task};
use xtoken_train::harness::{answer, evaluate, task_dir, tasks};
use xtoken_train::train::export::load_for_eval;

type B = NdArray;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harness")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

const SETTINGS: PromptSettings = PromptSettings {
    shots: 3,
    seed: 1234,
    limit: None,
};

/// The harness's task of each (task, subset) here.
fn harness_name(task: &str, subset: &str) -> String {
    match (task, subset) {
        ("mmlu", subject) => format!("mmlu_{subject}"),
        ("math", kind) => format!("math_{}", kind.to_lowercase()),
        (task, _) => task.to_string(),
    }
}

fn items(task: &str) -> Vec<Item> {
    let task = tasks::named(task).unwrap();
    let dir = task_dir(&fixtures().join("data"), task.as_ref()).unwrap();
    prompts(task.as_ref(), &dir, &SETTINGS).unwrap()
}

/// Each item with its harness sample: the same subset's documents in order.
fn with_samples(task: &str, expected: &Value) -> Vec<(Item, Value)> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    items(task)
        .into_iter()
        .map(|item| {
            let name = harness_name(task, &item.subset);
            let index = seen.entry(name.clone()).or_default();
            let sample = expected[&name]["samples"][*index].clone();
            *index += 1;
            assert!(!sample.is_null(), "{name}: no harness sample {index}");
            (item, sample)
        })
        .collect()
}

fn loaded() -> Loaded<B> {
    load_for_eval::<B>(
        &fixtures().join("model"),
        None,
        DType::F32,
        &Default::default(),
    )
    .unwrap()
}

#[test]
fn prompts_are_the_harness_prompts() {
    let expected = expected();
    for task in tasks::NAMES {
        let pairs = with_samples(task, &expected);
        assert!(!pairs.is_empty(), "{task}: no documents");
        for (item, sample) in pairs {
            let arguments = sample["arguments"].as_array().unwrap();
            match &item.request {
                Request::Choice { pairs } => {
                    assert_eq!(pairs.len(), arguments.len(), "{task}: choices");
                    for ((context, continuation), theirs) in pairs.iter().zip(arguments) {
                        assert_eq!(context, theirs[0].as_str().unwrap(), "{task}: context");
                        assert_eq!(continuation, theirs[1].as_str().unwrap(), "{task}");
                    }
                }
                Request::Generate { context, until } => {
                    assert_eq!(
                        context,
                        arguments[0][0].as_str().unwrap(),
                        "{task}: context"
                    );
                    let theirs: Vec<&str> = arguments[0][1]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s.as_str().unwrap())
                        .collect();
                    assert_eq!(until, &theirs, "{task}: stop sequences");
                }
            }
        }
    }
}

/// Per request: HF transformers' log-likelihood (through the harness) within 1e-4, and the
/// same generated text, with the KV cache and without.
#[test]
fn responses_are_hf_transformers_responses() {
    let expected = expected();
    let model = loaded();
    for use_cache in [true, false] {
        for task in tasks::NAMES {
            let pairs = with_samples(task, &expected);
            let scorable = Scorable {
                model: &model.model,
                tokenizer: &model.tokenizer,
                special: model.special.clone(),
                batch: 3,
                max_gen_toks: 16,
                use_cache,
            };
            let requests: Vec<&Request> = pairs.iter().map(|(item, _)| &item.request).collect();
            let responses = answer(&scorable, task, &requests).unwrap();
            for ((_, sample), response) in pairs.iter().zip(&responses) {
                let theirs = sample["responses"].as_array().unwrap();
                match response {
                    Response::Choice(lls) => {
                        for (ours, theirs) in lls.iter().zip(theirs) {
                            let (ours, theirs) = (ours.value, theirs[0].as_f64().unwrap());
                            assert!((ours - theirs).abs() <= 1e-4, "{task}: {ours} vs {theirs}");
                        }
                    }
                    Response::Text(text) => {
                        assert_eq!(
                            text,
                            theirs[0].as_str().unwrap(),
                            "{task} (cache {use_cache})"
                        )
                    }
                }
            }
        }
    }
}

/// The fixture model as the harness ran it: 4 sequences a batch, 16 generated tokens at most.
fn as_the_harness_ran(model: &Loaded<B>) -> Scorable<'_, B> {
    Scorable {
        model: &model.model,
        tokenizer: &model.tokenizer,
        special: model.special.clone(),
        batch: 4,
        max_gen_toks: 16,
        use_cache: true,
    }
}

fn all_tasks() -> Vec<Box<dyn Task>> {
    tasks::NAMES
        .iter()
        .map(|n| tasks::named(n).unwrap())
        .collect()
}

/// Each task's metrics and standard errors as the harness reported them (MMLU's and MATH's
/// subjects aggregated as its groups are), and the Markdown and JSON reports.
#[test]
fn metrics_are_the_harness_metrics() {
    let expected = expected();
    let model = loaded();
    let scorable = as_the_harness_ran(&model);
    let all = all_tasks();
    let report = evaluate(&scorable, &all, &fixtures().join("data"), &SETTINGS, None).unwrap();
    for task in &report.tasks {
        let results = &expected[&task.task]["results"];
        for metric in &task.metrics {
            let (name, filter) = metric
                .name
                .split_once(',')
                .unwrap_or((&metric.name, "none"));
            let value = results[format!("{name},{filter}")].as_f64().unwrap();
            let stderr = results[format!("{name}_stderr,{filter}")].as_f64().unwrap();
            assert!(
                (metric.value - value).abs() < 1e-12,
                "{}: {}",
                task.task,
                metric.name
            );
            assert!(
                (metric.stderr - stderr).abs() < 1e-12,
                "{}: {} stderr",
                task.task,
                metric.name
            );
        }
    }
    let markdown = report.markdown();
    assert!(
        markdown.contains("| mmlu | acc * | 5 | 40.00 | 27.89 |"),
        "{markdown}"
    );
    assert!(markdown.contains("**Average**"), "{markdown}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["tasks"][0]["subsets"]["abstract_algebra"][0]["n"], 3);
}

/// GSM8k's filters and MATH's answer extraction and equivalence on given responses, as the
/// harness scores them.
#[test]
fn scoring_is_the_harness_scoring() {
    let expected = expected();
    let by_task: BTreeMap<&str, Vec<Item>> = [("gsm8k", items("gsm8k")), ("math", items("math"))]
        .into_iter()
        .collect();
    let cases = expected["scoring"].as_array().unwrap();
    assert!(cases.len() > 50);
    for case in cases {
        let name = case["task"].as_str().unwrap();
        let (task, subset) = match name.strip_prefix("math_") {
            Some(kind) => ("math", kind),
            None => (name, ""),
        };
        let doc: &Doc = &by_task[task]
            .iter()
            .filter(|item| item.subset.to_lowercase() == subset)
            .nth(case["doc_id"].as_u64().unwrap() as usize)
            .unwrap()
            .doc;
        let response = Response::Text(case["response"].as_str().unwrap().to_string());
        let ours = tasks::named(task).unwrap().score(doc, &response).unwrap();
        let theirs: Vec<f64> = case["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect();
        assert_eq!(
            ours, theirs,
            "{name} {}: {:?}",
            case["doc_id"], case["response"]
        );
    }
}

fn parity(case: &str) -> Transformer<B> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../xtoken-models/tests/fixtures/parity")
        .join(case);
    Transformer::load(&dir, &Default::default()).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// On every tiny parity checkpoint (Llama-3, Qwen3, Phi-3 with a sliding window): the
/// log-likelihood of token continuations equals HF transformers' within 1e-4, batched and
/// padded; greedy generation equals HF's, and is the same with the KV cache and without.
#[test]
fn parity_checkpoints_score_and_generate_as_hf() {
    let text = std::fs::read_to_string(fixtures().join("parity_loglikelihoods.json")).unwrap();
    let expected: BTreeMap<String, Value> = serde_json::from_str(&text).unwrap();
    for (case, expected) in expected {
        let model = parity(&case);
        let requests = expected["requests"].as_array().unwrap();
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = requests
            .iter()
            .map(|r| (ids(&r["context"]), ids(&r["continuation"])))
            .collect();
        for batch in [1, 2, 5] {
            let ours = token_loglikelihoods(&model, batch, &pairs, |_| {}).unwrap();
            for (ours, request) in ours.iter().zip(requests) {
                let (ours, theirs) = (ours.value, request["loglikelihood"].as_f64().unwrap());
                assert!(
                    (ours - theirs).abs() <= 1e-4,
                    "{case} batch {batch}: {ours} vs {theirs}"
                );
            }
        }
        let generations = expected["generations"].as_array().unwrap();
        let prompts: Vec<Vec<u32>> = generations.iter().map(|g| ids(&g["prompt"])).collect();
        for use_cache in [true, false] {
            let settings = Decoding {
                max_new_tokens: 6,
                use_cache,
            };
            let ours = model
                .generate_greedy(&prompts, settings, |_, _| false)
                .unwrap();
            for (ours, generation) in ours.iter().zip(generations) {
                assert_eq!(
                    ours,
                    &ids(&generation["generated"]),
                    "{case} (cache {use_cache})"
                );
            }
        }
    }
}

/// Batched, left-padded decoding through the cache gives every row what it gets alone without
/// the cache, token for token, over prompts of different lengths.
#[test]
fn kv_cache_generation_equals_recomputation() {
    for case in ["llama3", "qwen3", "phi3"] {
        let model = parity(case);
        let prompts = vec![vec![3, 17, 5, 9, 2, 11, 4], vec![8], vec![1, 2, 3]];
        let cached = Decoding {
            max_new_tokens: 12,
            use_cache: true,
        };
        let batched = model
            .generate_greedy(&prompts, cached, |_, _| false)
            .unwrap();
        for (prompt, tokens) in prompts.iter().zip(&batched) {
            let alone = Decoding {
                use_cache: false,
                ..cached
            };
            let alone = model
                .generate_greedy(std::slice::from_ref(prompt), alone, |_, _| false)
                .unwrap();
            assert_eq!(tokens, &alone[0], "{case}: {prompt:?}");
        }
        // A row that stops early leaves the others as they were.
        let stopped = model
            .generate_greedy(&prompts, cached, |row, generated| {
                row == 1 && generated.len() == 2
            })
            .unwrap();
        assert_eq!(stopped[1], batched[1][..2]);
        assert_eq!(stopped[0], batched[0]);
    }
}

/// Sampled decoding draws each row's tokens from that row's own seeded generator: batched
/// through the cache it gives every row what it gets alone by recomputation, token for token;
/// another seed writes another text; temperature 0 is greedy decoding.
#[test]
fn sampled_generation_is_seeded_per_row() {
    use xtoken_models::Sampling;
    use xtoken_train::data::rng::{unit, SplitMix64};
    let sample = |model: &Transformer<NdArray>, prompts: &[Vec<u32>], seeds: &[u64], cache, t| {
        let mut generators: Vec<SplitMix64> = seeds.iter().map(|&s| SplitMix64(s)).collect();
        let settings = Decoding {
            max_new_tokens: 12,
            use_cache: cache,
        };
        let sampling = Sampling {
            temperature: t,
            top_p: 0.95,
            vocab: model.architecture.vocab_size,
        };
        let uniform = |row: usize| unit(generators[row].next_u64());
        model
            .generate_sampled(prompts, settings, sampling, uniform, |_, _| false)
            .unwrap()
    };
    for case in ["llama3", "qwen3", "phi3"] {
        let model = parity(case);
        let prompts = vec![vec![3, 17, 5, 9, 2, 11, 4], vec![8], vec![1, 2, 3]];
        let seeds = [11, 12, 13];
        let batched = sample(&model, &prompts, &seeds, true, 1.0);
        for ((prompt, &seed), tokens) in prompts.iter().zip(&seeds).zip(&batched) {
            let alone = sample(&model, std::slice::from_ref(prompt), &[seed], false, 1.0);
            assert_eq!(tokens, &alone[0], "{case}: {prompt:?}");
        }
        let reseeded = sample(&model, &prompts, &[21, 22, 23], true, 1.0);
        assert_ne!(batched, reseeded, "{case}");
        let greedy = model
            .generate_greedy(
                &prompts,
                Decoding {
                    max_new_tokens: 12,
                    use_cache: true,
                },
                |_, _| false,
            )
            .unwrap();
        assert_eq!(
            sample(&model, &prompts, &seeds, true, 0.0),
            greedy,
            "{case}"
        );
    }
}

#[test]
fn bad_inputs_name_what_is_wrong() {
    let data = fixtures().join("data");
    let err = task_dir(
        &data.join("missing"),
        tasks::named("mmlu").unwrap().as_ref(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("missing: no such directory"), "{err}");
    let empty = std::env::temp_dir().join(format!("xtoken-no-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let err = task_dir(&empty, tasks::named("hellaswag").unwrap().as_ref())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no `hellaswag` directory"), "{err}");
    std::fs::remove_dir(&empty).unwrap();
    let err = tasks::named("arc").err().unwrap().to_string();
    assert!(err.contains("unknown task `arc`"), "{err}");
    // More shots than the subset has solved examples.
    let task = tasks::named("mmlu").unwrap();
    let dir = task_dir(&data, task.as_ref()).unwrap();
    let many = PromptSettings {
        shots: 4,
        ..SETTINGS
    };
    let err = prompts(task.as_ref(), &dir, &many).unwrap_err().to_string();
    assert!(
        err.contains("3 solved examples in the `dev` split, 4 asked for"),
        "{err}"
    );
    // A malformed row names its file and line.
    let tmp = std::env::temp_dir().join(format!("xtoken-harness-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("gsm8k")).unwrap();
    std::fs::write(
        tmp.join("gsm8k/test.jsonl"),
        "{\"question\": \"q\"}\nnot json\n",
    )
    .unwrap();
    let task = tasks::named("gsm8k").unwrap();
    let zero = PromptSettings {
        shots: 0,
        ..SETTINGS
    };
    let err = prompts(task.as_ref(), &tmp.join("gsm8k"), &zero)
        .unwrap_err()
        .to_string();
    assert!(err.contains("test.jsonl:2: invalid JSON"), "{err}");
    std::fs::write(tmp.join("gsm8k/test.jsonl"), "{\"question\": 3}\n").unwrap();
    let err = prompts(task.as_ref(), &tmp.join("gsm8k"), &zero)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("test.jsonl:1: field `question` is not a string"),
        "{err}"
    );
    // A GSM8k solution without its final answer `#### n` is named, not scored as never matched.
    std::fs::write(
        tmp.join("gsm8k/test.jsonl"),
        "{\"question\": \"q\", \"answer\": \"4 #### 4\"}\n{\"question\": \"q\", \"answer\": \"4\"}\n",
    )
    .unwrap();
    let err = prompts(task.as_ref(), &tmp.join("gsm8k"), &zero)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("test.jsonl:2: field `answer` has no final answer `#### n`"),
        "{err}"
    );
    // A missing few-shot split lists the splits there are.
    std::fs::write(
        tmp.join("gsm8k/test.jsonl"),
        "{\"question\": \"q\", \"answer\": \"4 #### 4\"}\n",
    )
    .unwrap();
    let err = prompts(task.as_ref(), &tmp.join("gsm8k"), &SETTINGS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no `train` split (found: test)"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

/// Eval's log-likelihoods at Llama-3.2's vocabulary width (128,256 rows), against an f64
/// log-softmax of the same model's f32 logits: each token within 2e-5 and without a sign bias,
/// continuations of up to 128 tokens within 1e-4. (A row summed term after term in f32 makes
/// every token too likely.)
#[test]
fn loglikelihoods_are_exact_at_full_vocabulary() {
    let device = Default::default();
    let vocab = 128_256;
    let arch = xtoken_models::config::Architecture::llama(vocab, 32, 64, 1, 2, 1);
    let mut model = Transformer::<B>::random(&arch, 5, DType::F32, &device).unwrap();
    // Logits as spread as a trained model's.
    model.norm.gamma = model.norm.gamma.map(|g| g * 25.0);
    let doc: Vec<u32> = (0..200u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect();
    let ids = burn::tensor::Tensor::<B, 2, burn::tensor::Int>::from_data(
        burn::tensor::TensorData::new(doc.iter().map(|&t| t as i64).collect(), [1, doc.len()]),
        &device,
    );
    let logits: Vec<f32> = xtoken_models::CausalLm::forward(&model, ids, None)
        .unwrap()
        .into_data()
        .into_vec()
        .unwrap();
    // exact[i]: log p(doc[i] | doc[..i]) in f64.
    let exact: Vec<f64> = (1..doc.len())
        .map(|i| {
            let row: Vec<f64> = logits[(i - 1) * vocab..i * vocab]
                .iter()
                .map(|&x| x as f64)
                .collect();
            xtoken_testkit::reference::log_softmax(&row, 1.0)[doc[i] as usize]
        })
        .collect();
    let spread = exact.iter().map(|lp| -lp).sum::<f64>() / exact.len() as f64;
    assert!(
        spread > 13.0,
        "the logits barely spread: {spread:.2} nats per token"
    );

    // Each of the last 100 tokens alone.
    let single: Vec<(Vec<u32>, Vec<u32>)> = (100..doc.len())
        .map(|i| (doc[..i].to_vec(), vec![doc[i]]))
        .collect();
    let scored = token_loglikelihoods(&model, 16, &single, |_| {}).unwrap();
    let errors: Vec<f64> = scored
        .iter()
        .zip(&exact[99..])
        .map(|(ours, exact)| ours.value - exact)
        .collect();
    let worst = errors.iter().fold(0.0f64, |m, e| m.max(e.abs()));
    let bias = errors.iter().sum::<f64>() / errors.len() as f64;
    eprintln!("per token: max |error| {worst:.1e}, mean {bias:+.1e}");
    assert!(
        worst <= 2e-5,
        "a token's log-probability is off by {worst:.2e}"
    );
    assert!(
        bias.abs() <= 2e-6,
        "log-probabilities are off by {bias:+.2e} on average"
    );

    // Continuations of 1 to 128 tokens.
    let lengths = [1, 8, 32, 100, 128];
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = lengths
        .iter()
        .map(|&n| (doc[..200 - n].to_vec(), doc[200 - n..].to_vec()))
        .collect();
    let scored = token_loglikelihoods(&model, 4, &pairs, |_| {}).unwrap();
    for (&n, ours) in lengths.iter().zip(&scored) {
        let expected: f64 = exact[199 - n..].iter().sum();
        let error = (ours.value - expected).abs();
        eprintln!(
            "{n} tokens: {:.6} vs {expected:.6} ({error:.1e})",
            ours.value
        );
        assert!(error <= 1e-4, "{n} tokens: off by {error:.2e}");
    }
}

fn xtoken(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(args)
        .output()
        .expect("run xtoken")
}

/// The command prints the table the library computes and writes it with its JSON; a task that
/// does not exist and a model directory that does not exist are named.
#[test]
fn the_eval_command_prints_and_writes_the_report() {
    let model = fixtures().join("model");
    let data = fixtures().join("data");
    let out = std::env::temp_dir().join(format!("xtoken-eval-cli-{}", std::process::id()));
    let run = |tasks: &str, model: &Path| {
        xtoken(&[
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--tasks",
            tasks,
            "--batch",
            "2",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    // A task named twice is scored once.
    let done = run("mmlu,hellaswag,mmlu", &model);
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "{stderr}");
    assert_eq!(stdout.matches("| mmlu |").count(), 1, "{stdout}");
    assert!(
        stdout.contains("| mmlu | acc * | 5 | 40.00 | 27.89 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| hellaswag | acc_norm * | 3 | 33.33 | 33.33 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| **Average** | * | | **36.67** | |"),
        "{stdout}"
    );
    let written = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert_eq!(written.trim(), stdout.trim());
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["shots"], 3);
    // An earlier evaluation's results are replaced; a file of the user's is never.
    assert!(run("hellaswag", &model).status.success());
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let refused = run("hellaswag", &model);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(stderr.contains("it holds notes.txt"), "{stderr}");
    std::fs::remove_file(out.join("notes.txt")).unwrap();
    let file = out.join("results.md");
    let refused = xtoken(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        stderr.contains("a file is there; an evaluation writes a directory"),
        "{stderr}"
    );
    let failed = run("mmlu,arc", &model);
    let stderr = String::from_utf8_lossy(&failed.stderr).into_owned();
    assert!(
        !failed.status.success() && stderr.contains("unknown task `arc`"),
        "{stderr}"
    );
    let failed = run("mmlu", Path::new("/no/such/model"));
    let stderr = String::from_utf8_lossy(&failed.stderr).into_owned();
    assert!(
        !failed.status.success() && stderr.contains("/no/such/model"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&out).ok();
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

/// A log-likelihood pair `[value, is_greedy]` as both write it: the values within 1e-4, the
/// flags equal.
fn same_pair(ours: &Value, theirs: &Value, what: &str) {
    let value = |v: &Value| v[0].as_str().unwrap().parse::<f64>().unwrap();
    assert!(
        (value(ours) - value(theirs)).abs() <= 1e-4,
        "{what}: {ours} vs {theirs}"
    );
    assert_eq!(ours[1], theirs[1], "{what}: is_greedy");
}

/// `--log-samples`: every document's record is the harness's own (`samples/`, written by its
/// `--log_samples`) byte for byte — the same files, lines, keys in the same order, processed
/// documents and their hashes, prompts, targets, filters, generations, typed metric values —
/// but for the log-likelihoods' digits, which agree within 1e-4.
#[test]
fn log_samples_are_the_harness_records() {
    let model = loaded();
    let scorable = as_the_harness_ran(&model);
    let all = all_tasks();
    let out = std::env::temp_dir().join(format!("xtoken-samples-{}", std::process::id()));
    let data = fixtures().join("data");
    evaluate(&scorable, &all, &data, &SETTINGS, Some(&out)).unwrap();
    let theirs_dir = fixtures().join("samples");
    let mut files: Vec<String> = std::fs::read_dir(&theirs_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 7, "{files:?}");
    for file in files {
        // The fixture's harness run named MATH's subjects `math_<subject>`.
        let ours_name = file.replace("samples_math_", "samples_hendrycks_math_");
        let ours = lines(&out.join(&ours_name));
        let theirs = lines(&theirs_dir.join(&file));
        assert_eq!(ours.len(), theirs.len(), "{file}: records");
        for (n, (our_line, their_line)) in ours.iter().zip(&theirs).enumerate() {
            let what = format!("{file} line {}", n + 1);
            let mut ours: Value = serde_json::from_str(our_line).unwrap();
            let theirs: Value = serde_json::from_str(their_line).unwrap();
            // The log-likelihoods agree within 1e-4; then theirs replace ours.
            for key in ["resps", "filtered_resps"] {
                let pairs = ours[key].as_array_mut().unwrap();
                assert_eq!(pairs.len(), theirs[key].as_array().unwrap().len(), "{what}");
                for (i, pair) in pairs.iter_mut().enumerate() {
                    let their_pair = &theirs[key][i];
                    let (mine, their) = match key {
                        "resps" => (&mut pair[0], &their_pair[0]),
                        _ => (pair, their_pair),
                    };
                    if their.is_array() {
                        same_pair(mine, their, &what);
                        *mine = their.clone();
                    }
                }
            }
            let written = xtoken_train::harness::pyjson::dumps(&ours);
            if written != *their_line {
                let at = written
                    .bytes()
                    .zip(their_line.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                let near = |s: &str| {
                    let from = (0..=at.saturating_sub(80))
                        .rev()
                        .find(|&i| s.is_char_boundary(i));
                    let to = ((at + 80).min(s.len())..=s.len()).find(|&i| s.is_char_boundary(i));
                    s[from.unwrap_or(0)..to.unwrap_or(s.len())].to_string()
                };
                panic!(
                    "{what}: differs at byte {at}:\n ours: …{}…\n    harness: …{}…",
                    near(&written),
                    near(their_line)
                );
            }
        }
    }
    std::fs::remove_dir_all(&out).ok();
}
