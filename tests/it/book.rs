//! The book (`docs/`, an mdBook) and README hold together: every page is in the summary, every
//! link and anchor resolves, every Rust snippet is an include of compiled code, and every TOML
//! snippet parses (a run's configuration as [`RunConfig`], a manifest as TOML).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use xtoken::train::config::RunConfig;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The book's pages, relative to `docs/src`.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.path());
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path.strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let src = root().join("docs/src");
    let mut out = Vec::new();
    walk(&src, &src, &mut out);
    out
}

/// The documents a reader meets: README and every page, as (path, text with includes expanded).
fn documents() -> Vec<(PathBuf, String)> {
    let src = root().join("docs/src");
    let mut docs = vec![(root().join("README.md"), read(&root().join("README.md")))];
    for page in pages() {
        let path = src.join(&page);
        let text = expand_includes(&path, &read(&path));
        docs.push((path, text));
    }
    docs
}

/// `{{#include path}}` and `{{#include path:anchor}}` replaced by what they include (the
/// mdBook syntax); a missing file or anchor panics, naming the page.
fn expand_includes(page: &Path, text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{#include ") {
        let len = rest[start..].find("}}").expect("an include is closed");
        let spec = &rest[start + "{{#include ".len()..start + len];
        let (file, anchor) = match spec.split_once(':') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (spec, None),
        };
        let path = page.parent().unwrap().join(file);
        let included = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: includes {}: {e}", page.display(), path.display()));
        out.push_str(&rest[..start]);
        out.push_str(&match anchor {
            None => included,
            Some(anchor) => anchored(&included, anchor)
                .unwrap_or_else(|| panic!("{}: no anchor {anchor} in {file}", page.display())),
        });
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// The lines between `ANCHOR: name` and `ANCHOR_END: name`, their common indent removed.
pub fn anchored(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines
        .iter()
        .position(|l| l.trim_end().ends_with(&format!("ANCHOR: {name}")))?;
    let end = begin
        + lines[begin..]
            .iter()
            .position(|l| l.trim_end().ends_with(&format!("ANCHOR_END: {name}")))?;
    let body = &lines[begin + 1..end];
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    Some(
        body.iter()
            .map(|l| format!("{}\n", l.get(indent..).unwrap_or("")))
            .collect(),
    )
}

/// The fenced code blocks of a document: (info string, body).
fn fences(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some((info.trim().to_string(), String::new()));
                }
            }
            Some(_) if line.trim_end() == "```" => out.extend(open.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    out
}

/// The text outside code blocks, so that code's `[a](b)`-like text is not taken for a link.
fn prose(text: &str) -> String {
    let mut inside = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            inside = !inside;
        } else if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The id mdBook gives a heading: its text lowercased, spaces as `-`, punctuation dropped.
fn heading_id(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_lowercase().next()?),
            _ => None,
        })
        .collect()
}

fn heading_ids(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| heading_id(l.trim_start_matches('#').trim()))
        .collect()
}

/// Every `[text](target)` of a document's prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let tail = &rest[at + 2..];
        if let Some(end) = tail.find(')') {
            out.push(tail[..end].to_string());
        }
        rest = tail;
    }
    out
}

#[test]
fn every_page_is_in_the_summary_and_every_entry_exists() {
    let src = root().join("docs/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary).iter().map(PathBuf::from).collect();
    for entry in &listed {
        assert!(
            src.join(entry).is_file(),
            "SUMMARY.md lists {}, which is missing",
            entry.display()
        );
    }
    let unlisted: Vec<_> = pages()
        .into_iter()
        .filter(|p| p != Path::new("SUMMARY.md") && !listed.contains(p))
        .collect();
    assert!(unlisted.is_empty(), "pages not in SUMMARY.md: {unlisted:?}");
}

/// Relative links name a file that exists (in the book: a page or a picture beside it), with
/// the heading an anchor names; no link points at a home the project does not have (a
/// repository's files are named by their path, which must exist here).
#[test]
fn every_link_resolves() {
    let mut broken = Vec::new();
    for (path, text) in documents() {
        for file in repository_paths(&text) {
            if !root().join(&file).exists() {
                broken.push(format!("{}: `{file}` (no such file here)", path.display()));
            }
        }
        for link in links(&text) {
            let link = link.split_whitespace().next().unwrap_or("").to_string();
            if link.contains("github.com/xtoken") {
                broken.push(format!("{}: {link} (not this project's)", path.display()));
                continue;
            }
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            let in_book = path.starts_with(root().join("docs/src"));
            let outside = in_book && !target.starts_with(root().join("docs/src"));
            if outside || !target.exists() {
                broken.push(format!("{}: {link}", path.display()));
                continue;
            }
            if !anchor.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let text = expand_includes(&target, &read(&target));
                if !heading_ids(&text).contains(anchor) {
                    broken.push(format!("{}: {link} (no such heading)", path.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The paths of the repository's files a text names in backticks (`xtoken-train/src/x.rs`,
/// `examples/configs/`).
fn repository_paths(text: &str) -> Vec<String> {
    let roots = [
        "xtoken-core/",
        "xtoken-kernels/",
        "xtoken-models/",
        "xtoken-train/",
        "xtoken-collective/",
        "xtoken-communication/",
        "examples/",
        "scripts/",
    ];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|code| roots.iter().any(|r| code.starts_with(r)))
        .filter(|code| !code.contains([' ', '\n', '*', '<', '{', ',', ':']))
        .map(String::from)
        .collect()
}

/// The book's Rust is compiled: each snippet includes a file that a build compiles (an example
/// or a crate's source), never code typed into the page.
#[test]
fn every_rust_snippet_of_the_book_is_compiled_code() {
    let src = root().join("docs/src");
    for page in pages() {
        let text = read(&src.join(&page));
        for (info, body) in fences(&text) {
            if info.split(',').next() == Some("rust") {
                assert!(
                    body.trim().starts_with("{{#include ") && body.trim().lines().count() == 1,
                    "{}: a Rust snippet that is not an include of compiled code:\n{body}",
                    page.display()
                );
            }
        }
    }
}

/// A required-only configuration, under a snippet that is a part of one.
const BASE: &str = r#"
output_dir = "runs/x"
[student]
model = "models/student"
[[teachers]]
model = "models/teacher"
[data]
path = "data/train.jsonl"
"#;

/// `snippet`'s keys over `base`'s, section by section.
fn merged(base: toml::Table, snippet: toml::Table) -> toml::Table {
    let mut out = base;
    for (key, value) in snippet {
        match (out.get_mut(&key), value) {
            (Some(toml::Value::Table(into)), toml::Value::Table(from)) => {
                *into = merged(into.clone(), from);
            }
            (_, value) => {
                out.insert(key, value);
            }
        }
    }
    out
}

/// Every TOML snippet parses: a `Cargo.toml` (its first line says so) as TOML with
/// dependencies, any other as a run's configuration, completed by [`BASE`] when it is a part.
#[test]
fn every_toml_snippet_is_a_valid_configuration() {
    let mut seen = 0;
    for (path, text) in documents() {
        for (info, body) in fences(&text) {
            if info != "toml" {
                continue;
            }
            seen += 1;
            let table: toml::Table = body.parse().unwrap_or_else(|e| {
                panic!(
                    "{}: a TOML snippet does not parse: {e}\n{body}",
                    path.display()
                )
            });
            if body.starts_with("# Cargo.toml") {
                assert!(
                    table.contains_key("dependencies"),
                    "{}: {body}",
                    path.display()
                );
                continue;
            }
            let whole = merged(BASE.parse().unwrap(), table);
            if let Err(e) = RunConfig::parse(&toml::to_string(&whole).unwrap()) {
                panic!(
                    "{}: a run.toml snippet is refused: {e}\n{body}",
                    path.display()
                );
            }
        }
    }
    assert!(
        seen >= 3,
        "the README and the book hold run.toml snippets ({seen} found)"
    );
}

#[test]
fn includes_take_anchored_lines_without_their_indent() {
    let text = "fn f() {\n    // ANCHOR: a\n    let x = 1;\n        x;\n    // ANCHOR_END: a\n}\n";
    assert_eq!(anchored(text, "a").unwrap(), "let x = 1;\n    x;\n");
    assert_eq!(anchored(text, "b"), None);
    assert_eq!(heading_id("`xtoken bench train`"), "xtoken-bench-train");
    assert_eq!(
        heading_id("Several GPUs, one machine"),
        "several-gpus-one-machine"
    );
}
