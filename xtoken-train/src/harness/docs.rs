//! A benchmark's documents, read from local copies of its public release: parquet or JSON
//! Lines files laid out as the Hugging Face hub lays them out (`<config>/<split>-00000-of-
//! 00001.parquet`, or `<split>.jsonl`). A file's split is the start of its name; its subset
//! (MATH's subject) is the directory it lies in.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::data::sources::walk_files;
use crate::error::{Context, Error, Result};

/// One row of a dataset, with where it was read for messages.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    /// Its columns.
    pub fields: Map<String, Value>,
    /// The directory it was read from, relative to the task's (`""` at the top).
    pub dir: String,
    /// `file:row`, 1-based.
    pub place: String,
}

impl Doc {
    fn field(&self, name: &str) -> Result<&Value> {
        self.fields.get(name).ok_or_else(|| {
            Error::Data(format!(
                "{}: no field `{name}` (fields: {})",
                self.place,
                self.fields.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    fn wrong(&self, name: &str, what: &str) -> Error {
        Error::Data(format!("{}: field `{name}` is not {what}", self.place))
    }

    /// A text field.
    pub fn text(&self, name: &str) -> Result<&str> {
        self.field(name)?
            .as_str()
            .ok_or_else(|| self.wrong(name, "a string"))
    }

    /// A list-of-texts field.
    pub fn texts(&self, name: &str) -> Result<Vec<&str>> {
        let items = self
            .field(name)?
            .as_array()
            .ok_or_else(|| self.wrong(name, "a list"))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| self.wrong(name, "a list of strings"))
            })
            .collect()
    }

    /// An integer field, written as a number or as digits in a string (HellaSwag's `label`).
    pub fn integer(&self, name: &str) -> Result<i64> {
        let value = self.field(name)?;
        value
            .as_i64()
            .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| self.wrong(name, "an integer"))
    }
}

/// Every split of a task's directory: `split → documents` in file order (files sorted by path).
pub type Splits = BTreeMap<String, Vec<Doc>>;

/// Reads the dataset files under `dir`, or under the first of `configs` that is a
/// subdirectory of it (the hub's configs, e.g. MMLU's `all`, GSM8k's `main`), so that one
/// download of several configs is read once.
pub fn read_splits(dir: &Path, configs: &[&str]) -> Result<Splits> {
    if !dir.is_dir() {
        return Err(Error::Data(format!(
            "{}: no such directory (see the book's Evaluation page on fetching the datasets)",
            dir.display()
        )));
    }
    let root = configs
        .iter()
        .map(|c| dir.join(c))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| dir.to_path_buf());
    let mut files = Vec::new();
    walk_files(&root, |path| split_of(path).is_some(), &mut files)?;
    files.sort();
    let mut splits = Splits::new();
    for file in files {
        let Some((split, dir)) = split_of(&file) else {
            continue;
        };
        let subdir = dir
            .strip_prefix(&root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let docs = read_file(&file, &subdir)?;
        splits.entry(split).or_default().extend(docs);
    }
    if splits.is_empty() {
        return Err(Error::Data(format!(
            "{}: no .parquet or .jsonl files named after a split (test-…, train-…)",
            root.display()
        )));
    }
    Ok(splits)
}

/// A data file's split and the directory of its subset: the start of its name
/// (`test-00000-of-00001.parquet` → `test`, `validation.jsonl` → `validation`), or, for a
/// numbered file, its directory's name (`train/0000.parquet` → `train`, as the hub's parquet
/// conversion lays files out). Other files: `None`.
fn split_of(path: &Path) -> Option<(String, PathBuf)> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    let data = name.ends_with(".parquet") || name.ends_with(".jsonl") || name.ends_with(".json");
    if !data {
        return None;
    }
    let end = name.find(['-', '.']).unwrap_or(name.len());
    let parent = path.parent()?;
    if name[..end].chars().all(|c| c.is_ascii_digit()) {
        let split = parent.file_name()?.to_string_lossy().to_ascii_lowercase();
        return Some((split, parent.parent()?.to_path_buf()));
    }
    Some((name[..end].to_string(), parent.to_path_buf()))
}

fn read_file(path: &Path, dir: &str) -> Result<Vec<Doc>> {
    let rows = if path.extension().is_some_and(|e| e == "parquet") {
        parquet_rows(path)?
    } else {
        json_rows(path)?
    };
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(i, fields)| Doc {
            fields,
            dir: dir.to_string(),
            place: format!("{}:{}", path.display(), i + 1),
        })
        .collect())
}

fn parquet_rows(path: &Path) -> Result<Vec<Map<String, Value>>> {
    use parquet::file::reader::SerializedFileReader;
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let reader = SerializedFileReader::new(file).map_err(|e| {
        Error::Data(format!(
            "{}: not a readable parquet file: {e}",
            path.display()
        ))
    })?;
    let rows = parquet::record::reader::RowIter::from_file_into(Box::new(reader));
    rows.enumerate()
        .map(|(i, row)| {
            let row =
                row.map_err(|e| Error::Data(format!("{}: row {}: {e}", path.display(), i + 1)))?;
            match row.to_json_value() {
                Value::Object(map) => Ok(map),
                _ => Err(Error::Data(format!(
                    "{}: row {}: not a record",
                    path.display(),
                    i + 1
                ))),
            }
        })
        .collect()
}

fn json_rows(path: &Path) -> Result<Vec<Map<String, Value>>> {
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(Value::Object(map)) => rows.push(map),
            Ok(_) => {
                return Err(Error::Data(format!(
                    "{}:{}: not a JSON object",
                    path.display(),
                    i + 1
                )))
            }
            Err(e) => {
                return Err(Error::Data(format!(
                    "{}:{}: invalid JSON: {e}",
                    path.display(),
                    i + 1
                )))
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_follow_the_hub() {
        let split =
            |name: &str| split_of(Path::new(name)).map(|(s, d)| (s, d.display().to_string()));
        let pair = |s: &str, d: &str| Some((s.to_string(), d.to_string()));
        assert_eq!(
            split("all/test-00000-of-00001.parquet"),
            pair("test", "all")
        );
        assert_eq!(split("d/validation.jsonl"), pair("validation", "d"));
        assert_eq!(
            split("d/auxiliary_train-0.parquet"),
            pair("auxiliary_train", "d")
        );
        assert_eq!(
            split("algebra/train/0000.parquet"),
            pair("train", "algebra")
        );
        assert_eq!(split("d/README.md"), None);
    }
}
