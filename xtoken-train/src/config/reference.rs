//! The `run.toml` reference of the book (`docs/src/reference/config.md`), written from this
//! module's own source: each key's doc comment is its meaning, its Rust type its kind, and its
//! default is what [`RunConfig::parse`] fills in, so that the page cannot drift from the code.
//! A test compares the checked-in page with what this writes.

use std::collections::BTreeMap;

use super::RunConfig;

/// A struct of the configuration as its source declares it.
struct Declared {
    doc: String,
    /// `#[serde(default)]` on the struct: every key may be left out.
    all_default: bool,
    fields: Vec<Field>,
}

struct Field {
    name: String,
    ty: String,
    doc: String,
    /// A key that must be given: no `default`, not an `Option`.
    required: bool,
}

/// The configuration's structs, by name, parsed from the text of `config/mod.rs`.
fn declared(source: &str) -> BTreeMap<String, Declared> {
    let mut structs = BTreeMap::new();
    let (mut doc, mut serde) = (Vec::<String>::new(), Vec::<String>::new());
    let mut open: Option<(String, Declared)> = None;
    for line in source.lines() {
        let trimmed = line.trim();
        if let Some(text) = trimmed.strip_prefix("///") {
            doc.push(text.trim().to_string());
        } else if trimmed.starts_with("#[serde(") {
            serde.push(trimmed.to_string());
        } else if let Some(rest) = line.strip_prefix("pub struct ") {
            let name = rest.trim_end_matches(" {").trim().to_string();
            let all_default = serde.iter().any(|s| s.contains(" default)"));
            let declared = Declared {
                doc: doc.join(" "),
                all_default,
                fields: Vec::new(),
            };
            open = Some((name, declared));
        } else if line == "}" {
            if let Some((name, declared)) = open.take() {
                structs.insert(name, declared);
            }
        } else if let (Some((_, declared)), Some(rest)) =
            (open.as_mut(), trimmed.strip_prefix("pub "))
        {
            if let Some((name, ty)) = rest.trim_end_matches(',').split_once(": ") {
                let defaulted = serde.iter().any(|s| s.contains("default"));
                declared.fields.push(Field {
                    name: name.to_string(),
                    required: !declared.all_default && !defaulted && !ty.starts_with("Option<"),
                    ty: ty.to_string(),
                    doc: doc.join(" "),
                });
            }
        }
        if !trimmed.starts_with("///") && !trimmed.starts_with("#[") {
            doc.clear();
            serde.clear();
        }
    }
    structs
}

/// A configuration with every section present and only the required keys given: what
/// [`RunConfig::parse`] fills in around them are the defaults.
const REQUIRED_ONLY: &str = r#"
output_dir = "runs/x"
[student]
model = "models/student"
[[teachers]]
model = "models/teacher"
[data]
path = "data/train.jsonl"
[eval]
path = "data/held-out.jsonl"
[on_policy]
"#;

/// The whole reference page.
pub fn markdown(source: &str) -> String {
    let structs = declared(source);
    let defaults: toml::Table = RunConfig::parse(REQUIRED_ONLY)
        .ok()
        .and_then(|c| toml::to_string(&c).ok())
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    let mut out = String::from(
        "# run.toml\n\n\
         Every key of a run's configuration: its kind, its default (the paper's setting where \
         the paper has one) and what it does. A key the page does not list is refused by name. \
         This page is generated from the configuration's code (a test fails when it differs; \
         `XTOKEN_WRITE_REFERENCE=1 cargo test -p xtoken-train --lib reference` writes it); \
         [Configuration](../training/configuration.md) has a commented example.\n",
    );
    let Some(run) = structs.get("RunConfig") else {
        return out;
    };
    let mut sections = Vec::new();
    let mut top = Vec::new();
    for field in &run.fields {
        let inner = unwrap_type(&field.ty);
        match structs.get(inner) {
            Some(declared) => sections.push((field, declared)),
            None => top.push(field),
        }
    }
    out.push_str("\n## Top level\n\n");
    table(&top, defaults_of(&defaults, None), &mut out);
    for (field, declared) in sections {
        let header = if field.ty.starts_with("Vec<") {
            format!("[[{}]]", field.name)
        } else {
            format!("[{}]", field.name)
        };
        out.push_str(&format!("\n## `{header}`\n\n{}\n\n", clean(&declared.doc)));
        let fields: Vec<&Field> = declared.fields.iter().collect();
        table(&fields, defaults_of(&defaults, Some(&field.name)), &mut out);
    }
    out
}

/// The defaults of one section (the first `[[teachers]]` entry for a list).
fn defaults_of<'a>(all: &'a toml::Table, section: Option<&str>) -> Option<&'a toml::Table> {
    match section {
        None => Some(all),
        Some(name) => match all.get(name)? {
            toml::Value::Table(table) => Some(table),
            toml::Value::Array(list) => list.first()?.as_table(),
            _ => None,
        },
    }
}

fn table(fields: &[&Field], defaults: Option<&toml::Table>, out: &mut String) {
    out.push_str("| key | kind | default | meaning |\n|---|---|---|---|\n");
    for field in fields {
        let default = if field.required {
            "required".to_string()
        } else if field.ty.starts_with("Option<") {
            // None unless given, whatever the required-only configuration set.
            "—".to_string()
        } else {
            match defaults.and_then(|d| d.get(&field.name)) {
                Some(toml::Value::Table(_)) | None => "—".to_string(),
                Some(value) => format!("`{value}`"),
            }
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            field.name,
            kind(&field.ty),
            default,
            clean(&field.doc)
        ));
    }
}

/// `Option<T>` and `Vec<T>` as `T`.
fn unwrap_type(ty: &str) -> &str {
    ["Option<", "Vec<"]
        .iter()
        .find_map(|w| ty.strip_prefix(w).and_then(|t| t.strip_suffix('>')))
        .map_or(ty, unwrap_type)
}

/// A Rust type as the kind of TOML value it takes.
fn kind(ty: &str) -> String {
    let inner = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    if let Some(item) = inner.strip_prefix("Vec<").and_then(|t| t.strip_suffix('>')) {
        return format!("list of {}s", kind(item));
    }
    match inner {
        "String" => "string",
        "PathBuf" => "path",
        "u32" | "u64" | "usize" => "integer",
        "f64" => "number",
        "bool" => "boolean",
        "DataPaths" => "path or list of paths",
        "CacheSetting" => "boolean or path",
        _ => "table",
    }
    .to_string()
}

/// A doc comment as one table cell: rustdoc's links become code, `|` is escaped.
fn clean(doc: &str) -> String {
    let mut text = String::new();
    let mut rest = doc;
    while let Some(start) = rest.find("[`") {
        let Some(len) = rest[start..].find("`]") else {
            break;
        };
        text.push_str(&rest[..start]);
        text.push_str(&rest[start + 1..start + len + 1]);
        rest = &rest[start + len + 2..];
    }
    text.push_str(rest);
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The checked-in page is what the configuration's code writes.
    #[test]
    fn the_config_reference_is_the_code() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let source = std::fs::read_to_string(root.join("src/config/mod.rs")).unwrap();
        assert!(
            super::RunConfig::parse(super::REQUIRED_ONLY).is_ok(),
            "the defaults come from a configuration that parses"
        );
        let written = super::markdown(&source);
        let page = root.join("../docs/src/reference/config.md");
        if std::env::var_os("XTOKEN_WRITE_REFERENCE").is_some() {
            std::fs::write(&page, &written).unwrap();
        }
        let checked_in = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            checked_in == written,
            "{} differs from the configuration's code: run \
             `XTOKEN_WRITE_REFERENCE=1 cargo test -p xtoken-train --lib reference` and commit \
             the page",
            page.display()
        );
    }

    /// Every key of every section is on the page: the parse of the source found them all.
    #[test]
    fn every_key_is_listed() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let source = std::fs::read_to_string(root.join("src/config/mod.rs")).unwrap();
        let structs = super::declared(&source);
        let run = &structs["RunConfig"];
        assert_eq!(run.fields.len(), 14);
        assert!(
            !run.fields
                .iter()
                .find(|f| f.name == "seed")
                .unwrap()
                .required
        );
        assert!(
            run.fields
                .iter()
                .find(|f| f.name == "output_dir")
                .unwrap()
                .required
        );
        let training = &structs["TrainingConfig"];
        assert!(training.all_default && training.fields.len() >= 17);
        let written = super::markdown(&source);
        for (name, declared) in &structs {
            for field in &declared.fields {
                let section = structs.contains_key(super::unwrap_type(&field.ty));
                let listed = if section {
                    let name = &field.name;
                    written.contains(&format!("## `[{name}]`\n"))
                        || written.contains(&format!("## `[[{name}]]`\n"))
                } else {
                    written.contains(&format!("| `{}` |", field.name))
                };
                assert!(listed, "{name}.{} is not on the page", field.name);
            }
        }
    }
}
