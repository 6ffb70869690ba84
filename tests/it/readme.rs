//! README's code is the code that is compiled: its library snippet is xtoken-train's `stepwise`
//! example between its anchors (the book includes the same lines) and the last example of the
//! crate's documentation (a doctest); and the crate of your own that CI builds locks what the
//! workspace locks.

use std::collections::{BTreeMap, BTreeSet};

fn read(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
    let example = read("xtoken-train/examples/stepwise.rs");
    let excerpt =
        crate::book::anchored(&example, "stepwise").expect("the example marks its excerpt");
    // rustfmt keeps a blank line between the last statement's comment and the anchor.
    let excerpt = format!("{}\n", excerpt.trim_end());
    assert_eq!(
        excerpt, code,
        "the stepwise example differs from the crate's doctest"
    );
    let readme = read("README.md");
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README.md's library snippet differs from the crate's doctest:\n{code}"
    );
}

/// The versions in a lock file, by package name.
fn locked(path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let text = read(path);
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            packages
                .entry(n)
                .or_default()
                .insert(v.trim_matches('"').to_string());
        }
    }
    packages
}

/// The downstream crate's lock file pins what the workspace's pins: every package both use is
/// locked there at a version the workspace locks too (it may hold other crates, and other
/// versions beside, for burn's default features), so that what CI builds it with is what the
/// tests test.
#[test]
fn the_downstream_crate_locks_the_workspace_versions() {
    let ours = locked("Cargo.lock");
    let theirs = locked("examples/downstream/Cargo.lock");
    assert!(theirs.contains_key("burn-tensor") && theirs.contains_key("xtoken-train"));
    let differ: Vec<String> = theirs
        .iter()
        .filter_map(|(name, versions)| {
            let locked_here = ours.get(name)?;
            versions
                .is_disjoint(locked_here)
                .then(|| format!("{name} {versions:?} (here {locked_here:?})"))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "examples/downstream/Cargo.lock pins other versions than Cargo.lock: {differ:?}; \
         copy Cargo.lock there and run `cargo tree` in it"
    );
}
