//! Every option of every command that names a file or directory is either read (an input) or
//! written (an output), and every output follows the library's output rule: pointed at one of
//! its command's inputs, inside one, at a checkpoint, at a run directory, at a model directory,
//! at a folder holding a user's file or at that file, the command refuses and no file changes.
//! The options are found in clap's own command tree, so a new one cannot be left out.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use xtoken_models::{Architecture, SaveDtype, Transformer};
use xtoken_testkit::files::{differences, snapshot};

use crate::cli::Cli;

#[path = "../../tests/it/support/tokenizer_json.rs"]
mod tokenizer_json;

/// The options that name something a command reads: `command path/--option id`.
const INPUTS: &[&str] = &[
    "train/config",
    "teach/config",
    "projection build/student",
    "projection build/teacher",
    "projection show/projection",
    "projection show/student",
    "projection show/teacher",
    "audit/student",
    "audit/teacher",
    "audit/projection",
    "align/student",
    "align/teacher",
    "align/input",
    "cache info/cache",
    "cache info/student",
    "cache info/teacher",
    "cache show/cache",
    "cache show/student",
    "cache show/teacher",
    "cache verify/cache",
    "cache verify/student",
    "cache verify/teacher",
    "logits/model",
    "logits/input",
    "convert/model",
    "export/checkpoint",
    "export/config",
    "eval/model",
    "eval/config",
    "eval/data",
    "bench projection/student",
    "bench projection/teacher",
    "bench align/student",
    "bench align/teacher",
    "bench data/student",
    "bench data/teachers",
    "bench eval/tokenizer",
    "bench eval/data",
    "bench train/student_tokenizer",
    "bench train/teacher_tokenizer",
    "bench store/model",
    "bench store/text",
    "bench store/frequencies",
    "bench on-policy/demo",
    "serve/model",
    "serve/tokenizer",
];

/// The sandbox every command runs in: tokenizers, models, a finished run and its checkpoint,
/// data, a fake demo directory, and a folder of the user's.
struct Sandbox {
    root: PathBuf,
}

impl Sandbox {
    fn at(&self, name: &str) -> String {
        self.root.join(name).display().to_string()
    }

    fn checkpoint(&self) -> String {
        self.at("run/checkpoints/step-00000002")
    }
}

/// Each writing option: `command path/--option id`, and the command line with `OUT` for it.
fn outputs(s: &Sandbox) -> Vec<(&'static str, Vec<String>)> {
    let (student, teacher) = (s.at("student"), s.at("teacher"));
    let pair = |cmd: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = cmd.iter().map(|a| a.to_string()).collect();
        args.extend(["--student".into(), student.clone()]);
        args.extend(["--teacher".into(), teacher.clone()]);
        args
    };
    let with = |mut args: Vec<String>, more: &[&str]| {
        args.extend(more.iter().map(|a| a.to_string()));
        args
    };
    let train = [
        "bench",
        "train",
        "--student-tokenizer",
        &s.at("student/tokenizer.json"),
        "--teacher-tokenizer",
        &s.at("teacher"),
    ]
    .map(String::from)
    .to_vec();
    vec![
        (
            "projection build/out",
            with(pair(&["projection", "build"]), &["--out", "OUT"]),
        ),
        (
            "align/out",
            with(
                pair(&["align"]),
                &["--input", &s.at("train.jsonl"), "--out", "OUT"],
            ),
        ),
        (
            "logits/out",
            with(
                vec![],
                &[
                    "logits",
                    "--model",
                    &student,
                    "--input",
                    &s.at("ids.safetensors"),
                    "--out",
                    "OUT",
                ],
            ),
        ),
        (
            "convert/out",
            with(vec![], &["convert", "--model", &student, "--out", "OUT"]),
        ),
        (
            "export/out",
            with(
                vec![],
                &["export", "--checkpoint", &s.checkpoint(), "--out", "OUT"],
            ),
        ),
        (
            "eval/out",
            with(
                vec![],
                &[
                    "eval",
                    "--model",
                    &s.checkpoint(),
                    "--data",
                    &s.at("tasks"),
                    "--out",
                    "OUT",
                ],
            ),
        ),
        ("demo/out", with(vec![], &["demo", "--out", "OUT"])),
        (
            "teach/out",
            with(
                vec![],
                &["teach", "--config", &s.at("run.toml"), "--out", "OUT"],
            ),
        ),
        // `output_dir` in a configuration of its own, written outside the sandbox per target.
        (
            "train/output_dir",
            with(vec![], &["train", "--config", "CONFIG_WITH_OUT"]),
        ),
        (
            "bench projection/out",
            with(pair(&["bench", "projection"]), &["--out", "OUT"]),
        ),
        (
            "bench on-policy/out",
            with(
                vec![],
                &[
                    "bench",
                    "on-policy",
                    "--demo",
                    &s.at("demo"),
                    "--out",
                    "OUT",
                ],
            ),
        ),
        (
            "bench align/work_dir",
            with(pair(&["bench", "align"]), &["--work-dir", "OUT"]),
        ),
        (
            "bench data/work_dir",
            with(
                vec![],
                &[
                    "bench",
                    "data",
                    "--student",
                    &student,
                    "--teacher",
                    &teacher,
                    "--work-dir",
                    "OUT",
                ],
            ),
        ),
        (
            "bench train/work_dir",
            with(train.clone(), &["--work-dir", "OUT"]),
        ),
        ("bench train/json", with(train, &["--json", "OUT"])),
        (
            "bench kernels/emit_cuda",
            with(vec![], &["bench", "kernels", "--emit-cuda", "OUT"]),
        ),
    ]
}

/// Every option whose value is a path, as `command path/--option id`.
fn path_options() -> Vec<String> {
    fn walk(command: &clap::Command, path: &str, found: &mut Vec<String>) {
        for arg in command.get_arguments() {
            if arg.get_value_parser().type_id() == std::any::TypeId::of::<PathBuf>() {
                found.push(format!("{path}/{}", arg.get_id()));
            }
        }
        for sub in command.get_subcommands() {
            let name = match path {
                "" => sub.get_name().to_string(),
                _ => format!("{path} {}", sub.get_name()),
            };
            walk(sub, &name, found);
        }
    }
    let mut found = Vec::new();
    walk(&Cli::command(), "", &mut found);
    found
}

fn model(dir: &Path, seed: u64, user: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let bytes: Vec<String> = (0..=255u8)
        .map(|b| xtoken_core::canon::byte_level_char(b).to_string())
        .collect();
    let vocab: Vec<&str> = bytes.iter().map(String::as_str).collect();
    let json = tokenizer_json::byte_level(&vocab, &[], &[]);
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    let arch = Architecture::llama(256, 32, 64, 2, 4, 2);
    let device = Default::default();
    let random = Transformer::<burn::backend::NdArray>::random(
        &arch,
        seed,
        burn::tensor::DType::F32,
        &device,
    );
    random.unwrap().save(dir, SaveDtype::F32).unwrap();
    if user {
        // As a model from the hub is: no mark of xtoken's in its config.json.
        let path = dir.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config
            .as_object_mut()
            .unwrap()
            .remove(xtoken_models::WRITER_FIELD);
        std::fs::write(&path, config.to_string()).unwrap();
    }
}

fn run(args: &[String]) -> anyhow::Result<()> {
    use clap::Parser;
    let cli =
        Cli::try_parse_from(std::iter::once("xtoken".to_string()).chain(args.iter().cloned()))?;
    crate::dispatch(cli.command)
}

fn sandbox() -> Sandbox {
    let root = std::env::temp_dir().join(format!("xtoken-every-output-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    std::fs::create_dir_all(&root).unwrap();
    let s = Sandbox { root };
    model(&s.root.join("student"), 1, false);
    model(&s.root.join("teacher"), 2, false);
    model(&s.root.join("hub-model"), 3, true);
    let texts: Vec<String> = (0..24)
        .map(|i| serde_json::json!({ "text": format!("{i} plus {i} is {}.", 2 * i) }).to_string())
        .collect();
    std::fs::write(s.root.join("train.jsonl"), texts.join("\n") + "\n").unwrap();
    let config = format!(
        "output_dir = \"{run}\"\n[student]\nmodel = \"{student}\"\n[[teachers]]\nname = \"t\"\n\
         model = \"{teacher}\"\n[data]\npath = \"{data}\"\n[training]\nsteps = 2\nbatch_size = 2\n\
         micro_batch = 2\ncontext_length = 16\n[checkpoint]\nevery = 2\n",
        run = s.at("run"),
        student = s.at("student"),
        teacher = s.at("teacher"),
        data = s.at("train.jsonl"),
    );
    std::fs::write(s.root.join("run.toml"), config).unwrap();
    run(&["train".into(), "--config".into(), s.at("run.toml")]).unwrap();
    assert!(Path::new(&s.checkpoint()).join("state.json").is_file());
    let ids_bytes: Vec<u8> = [5i64, 6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![1, 2], &ids_bytes)
            .unwrap();
    safetensors::serialize_to_file([("input_ids", view)], None, &s.root.join("ids.safetensors"))
        .unwrap();
    std::fs::create_dir_all(s.root.join("tasks/gsm8k")).unwrap();
    for dir in [
        "runs/warm-up/student",
        "runs/numeral-keeping/teacher/student",
    ] {
        std::fs::create_dir_all(s.root.join("demo").join(dir)).unwrap();
    }
    std::fs::write(s.root.join("demo/train.jsonl"), "{\"text\": \"x\"}\n").unwrap();
    std::fs::create_dir_all(s.root.join("notes")).unwrap();
    std::fs::write(s.root.join("notes/todo.txt"), "keep me").unwrap();
    s
}

/// Where each output is pointed: its command's inputs (and a new path inside each directory
/// among them), the checkpoint, the run directory, a model directory from the hub, a folder
/// holding a user's file, and the file.
fn targets(s: &Sandbox, args: &[String]) -> Vec<String> {
    let mut targets = Vec::new();
    // A command that reads a run configuration reads its models and data too.
    let configured = args.iter().any(|a| a == "--config");
    let read_by_config = ["student", "teacher", "train.jsonl"].map(|name| s.at(name));
    let config_inputs = read_by_config
        .iter()
        .filter(|_| configured)
        .map(|path| ["--input".to_string(), path.clone()]);
    let windows: Vec<[String; 2]> = args
        .windows(2)
        .map(|w| [w[0].clone(), w[1].clone()])
        .chain(config_inputs)
        .collect();
    let options_with_paths = windows
        .iter()
        .filter(|w| w[0].starts_with("--") && w[1] != "OUT" && w[1] != "CONFIG_WITH_OUT");
    for w in options_with_paths {
        let path = Path::new(&w[1]);
        if w[0] == "--demo" {
            // The demo directory holds what on-policy reads, and its default output.
            let student = path.join("runs/warm-up/student");
            for p in [
                path.to_path_buf(),
                path.join("train.jsonl"),
                student.join("new"),
                student,
            ] {
                targets.push(p.display().to_string());
            }
            continue;
        }
        if path.exists() {
            targets.push(w[1].clone());
            if path.is_dir() {
                targets.push(path.join("new").display().to_string());
                if path.join("tokenizer.json").exists() {
                    targets.push(path.join("tokenizer.json").display().to_string());
                }
            }
        }
    }
    targets.extend([
        s.checkpoint(),
        s.at("run"),
        s.at("hub-model"),
        s.at("notes"),
        s.at("notes/todo.txt"),
    ]);
    targets
}

#[test]
fn every_output_refuses_inputs_and_files_of_the_users() {
    let s = sandbox();
    let outputs = outputs(&s);
    let unknown: Vec<String> = path_options()
        .into_iter()
        .filter(|o| !INPUTS.contains(&o.as_str()) && !outputs.iter().any(|(name, _)| name == o))
        .collect();
    assert!(
        unknown.is_empty(),
        "{unknown:?} name paths: list each among this test's INPUTS, or among its outputs \
         (guarded by xtoken_train::output) with a command line to try it"
    );
    let configs = s.root.with_extension("configs");
    std::fs::create_dir_all(&configs).unwrap();
    let mut tried = 0;
    for (option, args) in &outputs {
        for target in targets(&s, args) {
            let config = configs.join(format!("{tried}.toml"));
            let text = std::fs::read_to_string(s.root.join("run.toml")).unwrap();
            let line = text.lines().next().unwrap();
            let text = text.replacen(line, &format!("output_dir = {target:?}"), 1);
            std::fs::write(&config, text).unwrap();
            let line: Vec<String> = args
                .iter()
                .map(|a| match a.as_str() {
                    "OUT" => target.clone(),
                    "CONFIG_WITH_OUT" => config.display().to_string(),
                    _ => a.clone(),
                })
                .collect();
            let before = snapshot(&s.root);
            let result = run(&line);
            let after = snapshot(&s.root);
            let err = match result {
                Ok(()) => panic!("{option}: `xtoken {}` was not refused", line.join(" ")),
                Err(e) => format!("{e:#}"),
            };
            assert!(
                err.contains("choose another output"),
                "{option}: `xtoken {}` failed, but not by the output rule: {err}",
                line.join(" ")
            );
            let changed = differences(&before, &after);
            assert!(
                changed.is_empty(),
                "{option} at {target} changed {changed:?}"
            );
            tried += 1;
        }
    }
    assert!(tried > 100, "{tried} refusals tried");
    eprintln!("{tried} refusals tried");
    std::fs::remove_dir_all(&s.root).ok();
    std::fs::remove_dir_all(&configs).ok();
}
