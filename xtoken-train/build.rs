//! Tests that need the real tokenizer files run only when `XTOKEN_TOKENIZERS_DIR` is set at build
//! time, and the test against the real vLLM only when `XTOKEN_VLLM_PYTHON` is; otherwise they are
//! compiled as ignored, with the reason, instead of passing silently.
fn main() {
    for (var, cfg) in [
        ("XTOKEN_TOKENIZERS_DIR", "xtoken_tokenizers"),
        ("XTOKEN_VLLM_PYTHON", "xtoken_vllm"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
