//! The shards of `data.path`: each entry (a file, a directory, or a glob) expanded into data
//! files in a fixed order, and grouped into the sources a mixture draws from.
//!
//! - A **file** is one shard, whatever its name.
//! - A **directory** holds every `.jsonl`, `.jsonl.zst`, `.parquet`, `.txt` and `.txt.zst` file
//!   under it (subdirectories included, hidden ones not), in path order; other files (a README,
//!   a `dataset_info.json`) are passed over.
//! - A **glob** (`*`, `?`, `[…]`) holds the files it matches, in path order; each must be a data
//!   file.
//!
//! Without `data.weights` the entries' shards form one source; with them each entry is a source
//! of its own, drawn with its weight.

use std::path::{Path, PathBuf};

use crate::config::{DataConfig, DataFormat, DataPaths};
use crate::error::{Context, Error, Result};

/// One shard: a data file and its format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The file.
    pub path: PathBuf,
    /// Its format (compressed or not).
    pub format: DataFormat,
}

/// The shards one mixture weight covers.
#[derive(Debug, Clone)]
pub struct Source {
    /// The `data.path` entry (or entries) it comes from, for messages.
    pub name: String,
    /// Its shards, in path order.
    pub shards: Vec<Shard>,
    /// Its share of the documents drawn (normalized over the sources).
    pub weight: f64,
}

/// The sources of `data`, every entry expanded; an entry that names nothing readable is an
/// error naming it.
pub fn sources(data: &DataConfig) -> Result<Vec<Source>> {
    let entries = data.path.entries();
    let expanded = entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            expand(entry).with_context(|| format!("{} = {}", data.path.key(i), entry.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(match &data.weights {
        Some(weights) => entries
            .iter()
            .zip(expanded)
            .zip(weights)
            .map(|((entry, shards), &weight)| Source {
                name: entry.display().to_string(),
                shards,
                weight,
            })
            .collect(),
        None => vec![Source {
            name: entries
                .iter()
                .map(|e| e.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            shards: expanded.into_iter().flatten().collect(),
            weight: 1.0,
        }],
    })
}

/// The shards of one entry.
pub fn expand(entry: &Path) -> Result<Vec<Shard>> {
    let mut files = if DataPaths::is_glob(entry) {
        glob_files(&entry.to_string_lossy())?
    } else if entry.is_dir() {
        let mut files = Vec::new();
        walk(entry, &mut files)?;
        if files.is_empty() {
            return Err(Error::Data(format!(
                "{}: no .jsonl, .jsonl.zst, .parquet, .txt or .txt.zst file in this directory",
                entry.display()
            )));
        }
        files
    } else if entry.is_file() {
        vec![entry.to_path_buf()]
    } else {
        return Err(Error::Data(format!("{}: no such file", entry.display())));
    };
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let format = DataFormat::of(&path)?;
            Ok(Shard { path, format })
        })
        .collect()
}

/// The files a glob matches; a pattern that matches none is an error.
fn glob_files(pattern: &str) -> Result<Vec<PathBuf>> {
    let paths =
        glob::glob(pattern).map_err(|e| Error::Config(format!("not a valid glob pattern: {e}")))?;
    let mut files = Vec::new();
    for path in paths {
        let path = path.map_err(|e| Error::Data(format!("{e}")))?;
        if path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(Error::Data("the pattern matches no file".into()));
    }
    Ok(files)
}

/// Collects the data files under `dir`, skipping hidden entries.
fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    walk_files(dir, is_data_file, files)
}

/// Collects the files under `dir` that `keep` accepts, recursively, skipping hidden entries.
pub(crate) fn walk_files(
    dir: &Path,
    keep: fn(&Path) -> bool,
    files: &mut Vec<PathBuf>,
) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))?;
    for entry in entries {
        let path = entry.with_context(|| format!("{}", dir.display()))?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            walk_files(&path, keep, files)?;
        } else if keep(&path) {
            files.push(path);
        }
    }
    Ok(())
}

/// Whether a directory's file is training data, by its name (`.json` is left out: in a dataset
/// directory it is metadata).
fn is_data_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    [".jsonl", ".jsonl.zst", ".parquet", ".txt", ".txt.zst"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(path: DataPaths, weights: Option<Vec<f64>>) -> DataConfig {
        DataConfig {
            path,
            weights,
            text_field: "text".into(),
            cache: None,
            workers: 0,
            prefetch: 1,
            packing: "concatenate".into(),
        }
    }

    #[test]
    fn entries_expand_to_sorted_shards_and_sources() {
        let dir = std::env::temp_dir().join(format!("xtoken-sources-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("web/.hidden")).unwrap();
        for name in [
            "web/b.jsonl.zst",
            "web/a.jsonl",
            "web/.hidden/x.jsonl",
            "web/README.md",
            "web/info.json",
            "code.parquet",
            "books.txt",
        ] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let web = expand(&dir.join("web")).unwrap();
        let names: Vec<_> = web.iter().map(|s| s.path.file_name().unwrap()).collect();
        assert_eq!(names, ["a.jsonl", "b.jsonl.zst"]);
        assert_eq!(web[1].format, DataFormat::Jsonl);
        let globbed = expand(&dir.join("*.t*")).unwrap();
        assert_eq!(globbed.len(), 1);
        assert_eq!(globbed[0].format, DataFormat::Txt);

        let list = DataPaths::Many(vec![dir.join("web"), dir.join("code.parquet")]);
        let one = sources(&data(list.clone(), None)).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].shards.len(), 3);
        let mixture = sources(&data(list, Some(vec![3.0, 1.0]))).unwrap();
        assert_eq!(mixture.len(), 2);
        assert_eq!(mixture[1].weight, 1.0);

        let missing = DataPaths::Many(vec![dir.join("web"), dir.join("nothing/*.jsonl")]);
        let err = sources(&data(missing, None)).unwrap_err().report();
        assert!(
            err.contains("data.path[1]") && err.contains("matches no file"),
            "{err}"
        );
        let err = expand(&dir.join("absent.jsonl")).unwrap_err().report();
        assert!(
            err.contains("absent.jsonl") && err.contains("no such file"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
