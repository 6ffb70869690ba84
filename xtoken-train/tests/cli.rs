//! The `xtoken` binary as a user runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

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
}

fn tokenizers_dir() -> PathBuf {
    let dir = std::env::var("XTOKEN_TOKENIZERS_DIR")
        .ok()
        .or(option_env!("XTOKEN_TOKENIZERS_DIR").map(String::from))
        .expect("needs XTOKEN_TOKENIZERS_DIR");
    let dir = PathBuf::from(dir);
    if dir.is_relative() && !dir.exists() {
        return PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir);
    }
    dir
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
