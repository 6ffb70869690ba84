//! README's code is the code that is compiled: its loss snippet is the excerpt of
//! `examples/own_training_loop.rs` between the `README:begin` and `README:end` markers (cargo
//! builds the example with the tests; CI runs it), and its library snippet is the last example
//! of xtoken-train's crate documentation (a doctest).

fn read(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_readme_loss_snippet_is_the_compiled_example() {
    let example = read("examples/own_training_loop.rs");
    let (begin, end) = ("    // README:begin\n", "    // README:end");
    let start = example.find(begin).expect("the example marks its excerpt") + begin.len();
    let stop = example.find(end).expect("the example ends its excerpt");
    let excerpt: String = example[start..stop]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(excerpt.lines().count() > 10, "the excerpt is the loop");
    let readme = read("README.md");
    assert!(
        readme.contains(&format!("```rust\n{excerpt}```")),
        "README.md's loss snippet differs from the example's excerpt:\n{excerpt}"
    );
}

#[test]
fn the_readme_library_snippet_is_the_crate_doctest() {
    let lib = read("xtoken-train/src/lib.rs");
    let docs: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let fences: Vec<usize> = (0..docs.len())
        .filter(|&i| docs[i].starts_with("```"))
        .collect();
    let (open, close) = (fences[fences.len() - 2], fences[fences.len() - 1]);
    let code: String = docs[open + 1..close]
        .iter()
        .filter(|l| !l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(code.contains("Run::<"), "the doctest is the stepwise run");
    let readme = read("README.md");
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README.md's library snippet differs from the crate's doctest:\n{code}"
    );
}
