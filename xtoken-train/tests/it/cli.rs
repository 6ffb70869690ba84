//! The `xtoken` binary as a user runs it.

use crate::support::tokenizers_dir;
use std::process::{Command, Output};

use crate::tokenizer_json;

fn xtoken(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(args)
        .output()
        .expect("run xtoken")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn errors_name_the_file_and_exit_non_zero_without_a_backtrace() {
    let out = xtoken(&[
        "projection",
        "build",
        "--student",
        "/no/such/student",
        "--teacher",
        "/no/such/teacher",
        "--out",
        "/tmp/never.safetensors",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("/no/such/student"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );

    let out = xtoken(&[
        "projection",
        "build",
        "--student",
        "a",
        "--teacher",
        "b",
        "--out",
        "w",
        "--gamma",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("gamma"), "{}", text(&out.stderr));

    let out = xtoken(&[
        "audit",
        "--student",
        "a",
        "--teacher",
        "b",
        "--critical",
        "digits_9",
    ]);
    assert!(text(&out.stderr).contains("unknown audit category `digits_9`"));

    // A tokenizer without a single entry is refused, not built into a W of 0 rows.
    let dir = std::env::temp_dir().join(format!("xtoken-cli-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("tokenizer.json");
    std::fs::write(&empty, tokenizer_json::byte_level(&[], &[], &[])).unwrap();
    let w = dir.join("w.safetensors");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let out = xtoken(&[
        "projection",
        "build",
        "--student",
        &path(&empty),
        "--teacher",
        &path(&empty),
        "--out",
        &path(&w),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("the vocabulary is empty") && err.contains(&path(&empty)),
        "{err}"
    );
    assert!(!w.exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// `--device cuda` where it cannot run: built without the feature `cuda`, the run stops with an
/// error naming the feature to rebuild with; built with it on a machine without the NVIDIA
/// driver (whose binding would panic), with an error naming the driver library. Either way exit
/// code 1, before anything is read, and no panic. Where the driver is present there is nothing
/// to test. CI builds xtoken-train without `cuda` (its CUDA code is linted there, and
/// xtoken-kernels' `on_cuda` tests the driver's name with the CUDA backend built).
#[test]
fn cuda_where_it_cannot_run_is_a_named_error() {
    let expected = if cfg!(feature = "cuda") {
        if xtoken_kernels::device::missing_cuda_driver().is_none() {
            return;
        }
        "device = \"cuda\": the CUDA driver library"
    } else {
        "device = \"cuda\": this xtoken was built without it; rebuild with `--features cuda`"
    };
    let dir = std::env::temp_dir().join(format!("xtoken-cli-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("run.toml");
    let toml = format!(
        "output_dir = \"{out}\"\n[student]\nmodel = \"{out}/student\"\n[[teachers]]\n\
         model = \"{out}/teacher\"\n[data]\npath = \"{out}/d.jsonl\"\n",
        out = dir.display()
    );
    std::fs::write(&config, toml).unwrap();
    let config = config.to_str().unwrap();
    // The training run, and the benchmarks that start a device themselves: each names what
    // is missing before it touches the device, whose initialization would panic.
    let (data, tokenizer) = (dir.to_str().unwrap(), dir.join("t.json"));
    let tokenizer = tokenizer.to_str().unwrap();
    for args in [
        &["train", "--config", config, "--device", "cuda"][..],
        &[
            "bench", "forward", "--device", "cuda", "--preset", "tiny", "--len", "4",
        ],
        &["bench", "kernels", "--device", "cuda"],
        &[
            "bench",
            "eval",
            "--device",
            "cuda",
            "--preset",
            "tiny",
            "--tokenizer",
            tokenizer,
            "--data",
            data,
        ],
    ] {
        let out = xtoken(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(expected) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn build_show_and_audit_llama_to_qwen() {
    let dir = tokenizers_dir();
    let (llama, qwen) = (dir.join("llama-3.2"), dir.join("qwen3"));
    let (llama, qwen) = (llama.to_str().unwrap(), qwen.to_str().unwrap());
    let w = std::env::temp_dir().join(format!("xtoken-cli-{}.safetensors", std::process::id()));
    let w = w.to_str().unwrap();
    let pair = [
        "--student",
        llama,
        "--teacher",
        qwen,
        "--teacher-vocab-size",
        "151936",
    ];

    let out = xtoken(&[&["projection", "build", "--out", w][..], &pair].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("W: 128256 × 151936"), "{stdout}");
    assert!(
        stdout.contains("multi-token (re-encoded)      17991"),
        "{stdout}"
    );
    assert!(stdout.contains("examples of empty rows"), "{stdout}");

    let out = xtoken(&[&["projection", "show", w, "--token", "201"][..], &pair].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("multi-token rule"), "{stdout}");
    for line in [
        "\"2\"                      0.9009",
        "\"0\"                      0.0901",
        "\"1\"                      0.0090",
    ] {
        assert!(stdout.contains(line), "{stdout}");
    }

    // `show` refuses a W built for other tokenizers.
    let phi = dir.join("phi-4-mini");
    let out = xtoken(&[
        "projection",
        "show",
        w,
        "--token",
        "201",
        "--student",
        llama,
        "--teacher",
        phi.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("teacher tokenizer with sha256"),
        "{}",
        text(&out.stderr)
    );

    let out = xtoken(&[&["audit", "--json", "--projection", w][..], &pair].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["recommendation"], "pkl");
    let digits_3 = json["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "digits_3")
        .unwrap();
    assert_eq!(
        (digits_3["total"].as_u64(), digits_3["common"].as_u64()),
        (Some(1000), Some(0))
    );

    let out = xtoken(&[
        "audit",
        "--student",
        llama,
        "--teacher",
        phi.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("| 3-digit numerals | `digits_3` | 1000 | 1000/1000 (100%)"),
        "{stdout}"
    );
    assert!(stdout.contains("**Recommendation: H-KL.**"), "{stdout}");
    std::fs::remove_file(w).ok();
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn align_text_table_and_json() {
    let dir = tokenizers_dir();
    let (llama, qwen) = (dir.join("llama-3.2"), dir.join("qwen3"));
    let pair = [
        "align",
        "--student",
        llama.to_str().unwrap(),
        "--teacher",
        qwen.to_str().unwrap(),
        "--text",
        "Hello world.",
    ];
    let out = xtoken(&pair);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("| 0 | **gap** | 0: <\\|begin_of_text\\|> | · |"),
        "{table}"
    );
    assert!(
        table.contains("| 1 | match | 1: \"Hello\" | 0: \"Hello\" |"),
        "{table}"
    );

    let out = xtoken(&[&pair[..], &["--json"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["student_ids"],
        serde_json::json!([128000, 9906, 1917, 13])
    );
    assert_eq!(v["teacher_ids"], serde_json::json!([9707, 1879, 13]));
    assert_eq!(
        v["chunks"],
        serde_json::json!([[[0], []], [[1], [0]], [[2], [1]], [[3], [2]]])
    );
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn special_token_spellings_align_as_the_text_they_are() {
    // Each side used to turn its own specials into control ids, and a chunk paired the student's
    // "<" of `<|im_start|>` with the teacher's "<" of `<|begin_of_text|>`.
    let dir = tokenizers_dir();
    let (llama, qwen) = (dir.join("llama-3.2"), dir.join("qwen3"));
    let out = xtoken(&[
        "align",
        "--student",
        llama.to_str().unwrap(),
        "--teacher",
        qwen.to_str().unwrap(),
        "--text",
        "<|begin_of_text|>hi<|im_start|>user",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = |key: &str| -> Vec<u64> {
        let list = v[key].as_array().unwrap();
        list.iter().map(|id| id.as_u64().unwrap()).collect()
    };
    let (student, teacher) = (ids("student_ids"), ids("teacher_ids"));
    // Only the BOS Llama-3's post-processor adds is a control id; Qwen3's `<|im_start|>` is not
    // there.
    assert_eq!(student.iter().filter(|&&id| id >= 128000).count(), 1);
    assert!(!teacher.contains(&151644), "{teacher:?}");
    // Every token but the BOS is paired with the same place of the text: one-to-one here.
    let chunks = v["chunks"].as_array().unwrap();
    assert_eq!(chunks[0], serde_json::json!([[0], []]));
    for (k, chunk) in chunks[1..].iter().enumerate() {
        assert_eq!(chunk, &serde_json::json!([[k + 1], [k]]), "{chunks:?}");
    }
    assert_eq!(chunks.len(), student.len());
    assert_eq!(student.len(), teacher.len() + 1);
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn align_jsonl_to_cache_and_json_lines() {
    use xtoken_core::cache::AlignCache;
    use xtoken_core::vocab::Vocabulary;

    let dir = tokenizers_dir();
    let (llama, qwen, phi) = (
        dir.join("llama-3.2"),
        dir.join("qwen3"),
        dir.join("phi-4-mini"),
    );
    let work = std::env::temp_dir().join(format!("xtoken-cli-align-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let input = work.join("in.jsonl");
    let texts = [
        "Hello world.",
        "π ≈ 3.14159 日本 😀",
        "", // an empty text is skipped, like a blank line
        "def f(x):\n    return x\n",
    ];
    let mut lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t, "id": 1 }).to_string())
        .collect();
    lines.insert(2, String::new()); // blank lines are skipped
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let cache = work.join("out.xtalign");
    let base = [
        "align",
        "--student",
        llama.to_str().unwrap(),
        "--teacher",
        qwen.to_str().unwrap(),
        "--teacher",
        phi.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    let out = xtoken(&[&base[..], &["--out", cache.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("3 documents"),
        "{}",
        text(&out.stderr)
    );

    let student = Vocabulary::load(&llama).unwrap();
    let (q, p) = (
        Vocabulary::load(&qwen).unwrap(),
        Vocabulary::load(&phi).unwrap(),
    );
    let opened = AlignCache::open_verified(&cache, &student, &[&q, &p]).unwrap();
    assert_eq!(opened.len(), 3);
    opened.verify().unwrap();

    // --json prints the same documents, one object per line, in input order.
    let out = xtoken(&[&base[..], &["--json"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objects: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objects.len(), 3);
    for (i, object) in objects.iter().enumerate() {
        let doc = opened.doc(i).unwrap();
        assert_eq!(object["student_ids"], serde_json::json!(doc.student_ids));
        for (t, teacher) in doc.teachers.iter().enumerate() {
            assert_eq!(
                object["teachers"][t]["teacher_ids"],
                serde_json::json!(teacher.ids)
            );
            let chunks: Vec<serde_json::Value> = teacher
                .alignment()
                .chunks
                .iter()
                .map(|c| {
                    serde_json::json!([
                        c.student.range().collect::<Vec<_>>(),
                        c.teacher.range().collect::<Vec<_>>()
                    ])
                })
                .collect();
            assert_eq!(object["teachers"][t]["chunks"], serde_json::json!(chunks));
        }
    }
    drop(opened);

    // `xtoken cache` reads it back: info, verify (with the tokenizers), show = `align --json`.
    let c = cache.to_str().unwrap();
    let (l, q_, p_) = (
        llama.to_str().unwrap(),
        qwen.to_str().unwrap(),
        phi.to_str().unwrap(),
    );
    let info = xtoken(&["cache", "info", c]);
    assert!(
        text(&info.stdout).contains("3 documents"),
        "{}",
        text(&info.stderr)
    );
    let verify = [
        "cache",
        "verify",
        c,
        "--student",
        l,
        "--teacher",
        q_,
        "--teacher",
        p_,
    ];
    let ok = xtoken(&verify);
    assert!(
        text(&ok.stdout).contains("ok, 3 documents"),
        "{}",
        text(&ok.stderr)
    );
    let show = xtoken(&[
        "cache",
        "show",
        c,
        "--doc",
        "1",
        "--student",
        l,
        "--teacher",
        q_,
        "--teacher",
        p_,
        "--json",
    ]);
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown, objects[1]);
    let mut bytes = std::fs::read(&cache).unwrap();
    let last_record_byte = bytes.len() - 3 * 24 - 8;
    bytes[last_record_byte] ^= 0x55;
    let damaged = work.join("damaged.xtalign");
    std::fs::write(&damaged, &bytes).unwrap();
    let bad = xtoken(&["cache", "verify", damaged.to_str().unwrap()]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("document 2: checksum mismatch"),
        "{}",
        text(&bad.stderr)
    );

    // Bad input names the file and line; a cache from other tokenizers is refused.
    std::fs::write(&input, "{\"text\": \"ok\"}\n{\"text\": 3}\n").unwrap();
    let out = xtoken(&[&base[..], &["--json"]].concat());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("in.jsonl:2: field `text` is a number"),
        "{err}"
    );
    std::fs::write(&input, "{\"text\": \"ok\"}\n{not json\n").unwrap();
    let err = text(&xtoken(&[&base[..], &["--json"]].concat()).stderr);
    assert!(err.contains("in.jsonl:2: invalid JSON"), "{err}");
    let err = text(&xtoken(&base).stderr);
    assert!(err.contains("--out CACHE"), "{err}");
    assert!(AlignCache::open_verified(&cache, &q, &[&student, &p]).is_err());
    std::fs::remove_dir_all(&work).ok();
}

/// `align --out` naming its `--input`, and `projection build --out` naming the student's
/// tokenizer.json, are refused before anything is written (on copies of the tokenizers).
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn outputs_never_replace_inputs() {
    let work = std::env::temp_dir().join(format!("xtoken-cli-aliases-{}", std::process::id()));
    let student = work.join("llama-3.2");
    std::fs::create_dir_all(&student).unwrap();
    let json = student.join("tokenizer.json");
    std::fs::copy(tokenizers_dir().join("llama-3.2/tokenizer.json"), &json).unwrap();
    let qwen = tokenizers_dir().join("qwen3");
    let data = work.join("d.jsonl");
    std::fs::write(&data, "{\"text\": \"Hello world.\"}\n").unwrap();
    let (s, q, d) = (
        student.to_str().unwrap(),
        qwen.to_str().unwrap(),
        data.to_str().unwrap(),
    );

    let out = xtoken(&[
        "align",
        "--student",
        s,
        "--teacher",
        q,
        "--input",
        d,
        "--out",
        d,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to write over an input") && err.contains("--input"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&data).unwrap(),
        "{\"text\": \"Hello world.\"}\n"
    );

    let before = std::fs::read(&json).unwrap();
    let out = xtoken(&[
        "projection",
        "build",
        "--student",
        s,
        "--teacher",
        q,
        "--out",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("the student tokenizer"), "{err}");
    assert_eq!(std::fs::read(&json).unwrap(), before);
    std::fs::remove_dir_all(&work).ok();
}
