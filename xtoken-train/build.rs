//! Tests that need the real tokenizer files run only when `XTOKEN_TOKENIZERS_DIR` is set at build
//! time; otherwise they are compiled as ignored, with the reason, instead of passing silently.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(xtoken_tokenizers)");
    println!("cargo::rerun-if-env-changed=XTOKEN_TOKENIZERS_DIR");
    if std::env::var_os("XTOKEN_TOKENIZERS_DIR").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=xtoken_tokenizers");
    }
}
