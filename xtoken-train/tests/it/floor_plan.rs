//! The library's floor plan holds: no circle of imports between its files, and each floor uses
//! only the floors below it (the book's Architecture and layout, the module docs of `lib.rs`).
//!
//! An import is any path a file names with `crate::`, `super::` or `self::`, and, in a folder's
//! `mod.rs`, a `use` of one of its own files: so a folder that re-exports its files and a file
//! that imports through that folder form a circle too. Test modules count as their file. The
//! crate root (`lib.rs`, `main.rs`) only declares and re-exports, and is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's floors, from the ground up; a file is on the floor of its top folder, or on
/// the ground when it stands at the top.
const FLOORS: [&[&str]; 4] = [
    &["data", "cluster"],
    &["harness", "targets"],
    &["observe"],
    &["train"],
];

/// The ground's folders (beside its files: `error`, `backend`, `machine`, `paths`, `output`).
const GROUND: [&str; 1] = ["config"];

/// The binary's own modules; everything else under `src/` is the library's.
const BINARY: [&str; 2] = ["cli", "bench"];

/// A crate's files by module path (`["train", "step"]` for `src/train/step.rs`).
struct Files {
    modules: BTreeMap<Vec<String>, PathBuf>,
}

impl Files {
    fn of(src: &Path, keep: impl Fn(&[String]) -> bool) -> Self {
        let mut modules = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let module = module_of(path.strip_prefix(src).unwrap());
                    if !module.is_empty() && keep(&module) {
                        modules.insert(module, path);
                    }
                }
            }
        }
        Files { modules }
    }

    /// The file a path names: its longest prefix that is a file's module.
    fn resolve(&self, path: &[String]) -> Option<&Vec<String>> {
        (1..=path.len())
            .rev()
            .find_map(|n| self.modules.get_key_value(&path[..n]).map(|(k, _)| k))
    }

    /// Every file's imports of other files of the crate.
    fn imports(&self) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let mut graph = BTreeMap::new();
        for (module, path) in &self.modules {
            let code = code_of(&std::fs::read_to_string(path).unwrap());
            let folder = path.ends_with("mod.rs");
            let mut targets = BTreeSet::new();
            for named in paths_named(&code, module, folder, self) {
                if let Some(target) = self.resolve(&named) {
                    if target != module {
                        targets.insert(target.clone());
                    }
                }
            }
            graph.insert(module.clone(), targets);
        }
        graph
    }

    /// Whether `module` has a child file named `name`.
    fn has_child(&self, module: &[String], name: &str) -> bool {
        let mut child = module.to_vec();
        child.push(name.to_string());
        self.modules.contains_key(&child)
    }
}

fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// The source without comments, and with every string and character literal emptied, so that
/// braces and paths inside them are not read as code.
fn code_of(source: &str) -> String {
    let s: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let rest = |k: usize| s.get(i + k).copied().unwrap_or(' ');
        match s[i] {
            '/' if rest(1) == '/' => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            '/' if rest(1) == '*' => {
                i += 2;
                while i + 1 < s.len() && !(s[i] == '*' && s[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            'r' if (rest(1) == '"' || rest(1) == '#') && !ident_char(prev(&s, i)) => {
                let mut hashes = 0;
                let mut j = i + 1;
                while s.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if s.get(j) != Some(&'"') {
                    out.push(s[i]);
                    i += 1;
                    continue;
                }
                j += 1;
                let close: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                while j < s.len() && !s[j..].starts_with(&close) {
                    j += 1;
                }
                out.push_str("\"\"");
                i = j + close.len();
            }
            '"' => {
                i += 1;
                while i < s.len() && s[i] != '"' {
                    i += if s[i] == '\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
                i += 1;
            }
            // A character literal ('{', '\n', '\u{7b}'); a lifetime has no closing quote.
            '\'' if rest(1) == '\\' => {
                i += 2;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                out.push_str("' '");
                i += 1;
            }
            '\'' if rest(2) == '\'' => {
                out.push_str("' '");
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn prev(s: &[char], i: usize) -> char {
    if i == 0 {
        ' '
    } else {
        s[i - 1]
    }
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The crate-relative module paths `code` (the file of `module`) names.
fn paths_named(code: &str, module: &[String], folder: bool, files: &Files) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    // The inline modules (`mod tests { … }`) open at each brace depth.
    let mut scopes: Vec<Option<String>> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            scopes.push(inline_module_before(&chars, i));
            i += 1;
            continue;
        }
        if c == '}' {
            scopes.pop();
            i += 1;
            continue;
        }
        if !ident_char(c) || ident_char(prev(&chars, i)) {
            i += 1;
            continue;
        }
        let word: String = chars[i..].iter().take_while(|c| ident_char(**c)).collect();
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(scopes.iter().flatten().cloned())
            .collect();
        // Only the file's own module has child files: `use child::…` in a mod.rs.
        let at_file = here.len() == module.len();
        if word == "use" {
            let end = chars[i..]
                .iter()
                .position(|&c| c == ';')
                .map_or(chars.len(), |p| i + p);
            let tree: String = chars[i + 3..end].iter().collect();
            for path in expand(&tree) {
                let child =
                    folder && at_file && path.first().is_some_and(|p| files.has_child(module, p));
                if let Some(p) = absolute(&path, &here, child) {
                    found.push(p);
                }
            }
            i = end;
            continue;
        }
        if (word == "crate" || word == "super" || word == "self")
            && chars.get(i + word.len()..i + word.len() + 2) == Some(&[':', ':'])
        {
            let path: String = chars[i..]
                .iter()
                .take_while(|c| ident_char(**c) || **c == ':')
                .collect();
            let path: Vec<String> = path.split("::").map(str::to_string).collect();
            if let Some(p) = absolute(&path, &here, false) {
                found.push(p);
            }
            i += path_len(&path);
            continue;
        }
        i += word.chars().count();
    }
    found
}

fn path_len(path: &[String]) -> usize {
    path.iter().map(|p| p.chars().count()).sum::<usize>() + 2 * (path.len() - 1)
}

/// `mod name` just before the brace at `at`, if any.
fn inline_module_before(chars: &[char], at: usize) -> Option<String> {
    let before: String = chars[at.saturating_sub(80)..at].iter().collect();
    let words: Vec<&str> = before.split_whitespace().collect();
    match words.as_slice() {
        [.., "mod", name] => Some(name.to_string()),
        _ => None,
    }
}

/// The paths of a `use` tree (`a::{b, c::{d as e, f}}`), renames dropped.
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn segments(text: &str) -> impl Iterator<Item = String> + '_ {
        let path = text.split_whitespace().next().unwrap_or_default();
        path.split("::")
            .filter(|p| !p.is_empty())
            .map(str::to_string)
    }
    fn items(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut current = String::new();
        let flush = |current: &mut String, out: &mut Vec<Vec<String>>| {
            if !current.trim().is_empty() {
                out.push(prefix.iter().cloned().chain(segments(current)).collect());
            }
            current.clear();
        };
        while *i < s.len() {
            let c = s[*i];
            *i += 1;
            match c {
                '{' => {
                    let deeper: Vec<String> =
                        prefix.iter().cloned().chain(segments(&current)).collect();
                    current.clear();
                    items(s, i, &deeper, out);
                }
                '}' => {
                    flush(&mut current, out);
                    return;
                }
                ',' => flush(&mut current, out),
                c => current.push(c),
            }
        }
        flush(&mut current, out);
    }
    let chars: Vec<char> = tree.chars().collect();
    let mut out = Vec::new();
    items(&chars, &mut 0, &[], &mut out);
    out
}

/// A path made crate-relative from the module `here`; `None` for another crate's.
fn absolute(path: &[String], here: &[String], child: bool) -> Option<Vec<String>> {
    let mut base = here.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|p| p == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ if child => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// A circle in `graph`, as the files around it, if there is one.
fn circle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        node: &'a Vec<String>,
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        marks: &mut BTreeMap<&'a Vec<String>, Mark>,
        path: &mut Vec<&'a Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| *n == node).unwrap_or(0);
                return Some(path[start..].iter().map(|n| (*n).clone()).collect());
            }
            None => {}
        }
        marks.insert(node, Mark::Open);
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, marks, path) {
                return Some(found);
            }
        }
        path.pop();
        marks.insert(node, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn in_binary(module: &[String]) -> bool {
    module.first().is_some_and(|m| BINARY.contains(&m.as_str()))
}

/// The floor of a file: its top folder's, or the ground's (0).
fn floor(module: &[String]) -> usize {
    FLOORS
        .iter()
        .position(|floor| floor.contains(&module[0].as_str()))
        .map_or(0, |f| f + 1)
}

fn shown(module: &[String]) -> String {
    module.join("::")
}

#[test]
fn no_file_of_the_library_or_the_binary_imports_itself_in_a_circle() {
    for (name, files) in [
        ("library", Files::of(&src(), |m| !in_binary(m))),
        ("binary", Files::of(&src(), in_binary)),
    ] {
        let graph = files.imports();
        assert!(graph.len() > 10, "{name}: too few files found under src/");
        if let Some(found) = circle(&graph) {
            let names: Vec<String> = found.iter().map(|m| shown(m)).collect();
            panic!(
                "{name}: a circle of imports: {} -> (again)",
                names.join(" -> ")
            );
        }
    }
}

#[test]
fn each_floor_uses_only_its_own_folder_and_the_floors_below() {
    let files = Files::of(&src(), |m| !in_binary(m));
    for (module, path) in &files.modules {
        let folder = path.parent() != Some(src().as_path());
        assert!(
            !folder || floor(module) > 0 || GROUND.contains(&module[0].as_str()),
            "src/{}: a folder on no floor (add it to FLOORS or GROUND)",
            module[0]
        );
    }
    let mut wrong = Vec::new();
    for (module, targets) in files.imports() {
        let (f, own) = (floor(&module), module.first());
        for target in targets {
            let t = floor(&target);
            let same_folder = f > 0 && target.first() == own;
            if t > f || (t == f && f > 0 && !same_folder) {
                wrong.push(format!("{} uses {}", shown(&module), shown(&target)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the floor plan:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_of_imports_sees_what_it_must() {
    let code = code_of(
        "use crate::a::{b, c::{d as e, f}};\n// use crate::x;\nlet s = \"crate::y {\";\n\
         mod tests { use super::*; fn f() { crate::z::g(); } }\nuse std::io;",
    );
    let files = Files {
        modules: [
            vec!["m"],
            vec!["a", "b"],
            vec!["a", "c"],
            vec!["z"],
            vec!["x"],
            vec!["y"],
        ]
        .into_iter()
        .map(|m| (m.into_iter().map(String::from).collect(), PathBuf::new()))
        .collect(),
    };
    let named = paths_named(&code, &["m".to_string()], false, &files);
    let resolved: BTreeSet<String> = named
        .iter()
        .filter_map(|p| files.resolve(p))
        .map(|m| shown(m))
        .collect();
    let expected: BTreeSet<String> = ["a::b", "a::c", "m", "z"].map(String::from).into();
    assert_eq!(resolved, expected);
    let graph = BTreeMap::from([
        (
            vec!["a".to_string()],
            BTreeSet::from([vec!["b".to_string()]]),
        ),
        (
            vec!["b".to_string()],
            BTreeSet::from([vec!["a".to_string()]]),
        ),
    ]);
    assert_eq!(circle(&graph).map(|c| c.len()), Some(2));
}
