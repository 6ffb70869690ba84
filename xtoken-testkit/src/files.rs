//! What a command changed on disk: a snapshot of every file under a directory, compared before
//! and after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file, directory and symbolic link under `dir`: a file with its bytes, a link with its
/// target, a directory with nothing.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(path, target.to_string_lossy().as_bytes().to_vec());
            } else if meta.is_dir() {
                out.insert(path.clone(), Vec::new());
                stack.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// The paths that differ between two snapshots (added, removed or changed).
pub fn differences(a: &BTreeMap<PathBuf, Vec<u8>>, b: &BTreeMap<PathBuf, Vec<u8>>) -> Vec<PathBuf> {
    let mut keys: Vec<&PathBuf> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}
