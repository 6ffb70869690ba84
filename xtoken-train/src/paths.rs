//! Files compared by identity rather than by spelling (`./m/` and `m`, a symbolic link, a hard
//! link: the same device and inode), for the output rule of [`crate::output`].

use std::path::Path;

/// The identity of an existing file or directory: its device and inode.
#[cfg(unix)]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Elsewhere: the canonical path's hash.
#[cfg(not(unix))]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::hash::{Hash, Hasher};
    let canonical = std::fs::canonicalize(path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    canonical.hash(&mut h);
    Some((0, h.finish()))
}

/// Whether `a` and `b` are the same existing file or directory, however spelled.
pub fn same(a: &Path, b: &Path) -> bool {
    identity(a).is_some_and(|id| identity(b) == Some(id))
}

/// Whether `inner` is `outer` or lies anywhere inside it, by identity: `inner`'s nearest
/// existing ancestor (itself, when it exists) is resolved through every symbolic link and each
/// of its ancestors compared with `outer`.
pub fn lies_within(inner: &Path, outer: &Path) -> bool {
    let Some(target) = identity(outer) else {
        return false;
    };
    let existing = inner
        .ancestors()
        .find(|p| p.exists() && !p.as_os_str().is_empty());
    let resolved = existing
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))
        .or_else(|| std::env::current_dir().ok());
    resolved.is_some_and(|path| path.ancestors().any(|a| identity(a) == Some(target)))
}

/// The existing directories strictly above `path`, nearest first, resolved through every
/// symbolic link (a relative path is taken from the working directory).
pub fn directories_above(path: &Path) -> Vec<std::path::PathBuf> {
    let absolute = std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .unwrap_or_else(|_| path.to_path_buf());
    let Some(parent) = absolute.parent() else {
        return Vec::new();
    };
    let existing = parent.ancestors().find(|p| p.is_dir());
    let resolved = existing.map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
    resolved.map_or_else(Vec::new, |p| p.ancestors().map(Path::to_path_buf).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_file_under_another_spelling_is_the_same() {
        let dir = std::env::temp_dir().join(format!("xtoken-paths-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("m")).unwrap();
        let data = dir.join("d.jsonl");
        std::fs::write(&data, "{}\n").unwrap();
        assert!(same(&dir.join("m/../d.jsonl"), &data));
        assert!(same(&dir.join("m/."), &dir.join("m")));
        assert!(!same(&dir.join("new.xtc"), &data));
        assert!(!same(&dir.join("m"), &data));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn lying_inside_is_seen_through_links() {
        let dir = std::env::temp_dir().join(format!("xtoken-paths-in-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("run/checkpoints/step-1")).unwrap();
        let run = dir.join("run");
        let step = run.join("checkpoints/step-1");
        assert!(lies_within(&step, &run));
        assert!(lies_within(&run.join("checkpoints/../new/x"), &run));
        assert!(!lies_within(&dir.join("other"), &run));
        assert!(lies_within(&step.join("student.bin"), &step));
        #[cfg(unix)]
        {
            let link = dir.join("link");
            std::os::unix::fs::symlink(&run, &link).unwrap();
            assert!(
                lies_within(&step, &link),
                "a link to a directory that holds it"
            );
            assert!(lies_within(&link.join("checkpoints/x"), &run));
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
