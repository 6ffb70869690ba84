//! Outputs never replace inputs: every command that writes a file checks its output against the
//! files and directories it reads, by identity rather than by spelling (`./m/` and `m`, a
//! symbolic link, a hard link: the same device and inode).

use std::path::Path;

use crate::error::{Error, Result};

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

/// A tokenizer argument's files: the path given and, for a directory, its `tokenizer.json`.
pub fn tokenizer_files(path: &Path) -> [std::path::PathBuf; 2] {
    [path.to_path_buf(), path.join("tokenizer.json")]
}

/// Refuses to write `out` when it is one of `inputs` (each named by what it is). An output that
/// does not exist yet is new, whatever its spelling.
pub fn refuse_overwriting<P: AsRef<Path>>(out: &Path, inputs: &[(&str, P)]) -> Result<()> {
    let Some(target) = identity(out) else {
        return Ok(());
    };
    for (what, input) in inputs {
        let input = input.as_ref();
        if identity(input) == Some(target) {
            return Err(Error::Run(format!(
                "{}: this is {what} ({}); refusing to overwrite an input, choose another output",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
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

/// Refuses an output directory `out` that is any of `inputs` or holds one of them (writing it
/// would replace or remove an input); each input is named by what it is.
pub fn refuse_holding<P: AsRef<Path>>(out: &Path, inputs: &[(&str, P)]) -> Result<()> {
    for (what, input) in inputs {
        let input = input.as_ref();
        if input.exists() && lies_within(input, out) {
            let how = match identity(input) == identity(out) {
                true => "is",
                false => "holds",
            };
            return Err(Error::Run(format!(
                "{}: this directory {how} {what} ({}); refusing to write over an input, choose \
                 another output",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Refuses an output `out` that lies inside one of `dirs`, directories the command reads and
/// must leave as they are (a checkpoint, a run directory).
pub fn refuse_inside<P: AsRef<Path>>(out: &Path, dirs: &[(&str, P)]) -> Result<()> {
    for (what, dir) in dirs {
        let dir = dir.as_ref();
        if lies_within(out, dir) {
            return Err(Error::Run(format!(
                "{}: this lies inside {what} ({}), which this command reads and leaves as it is; \
                 choose an output outside it",
                out.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_file_under_another_spelling_is_refused() {
        let dir = std::env::temp_dir().join(format!("xtoken-paths-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("m")).unwrap();
        let data = dir.join("d.jsonl");
        std::fs::write(&data, "{}\n").unwrap();
        let spelled = dir.join("m/../d.jsonl");
        let err = refuse_overwriting(&spelled, &[("the input", &data)]).unwrap_err();
        assert!(err.to_string().contains("refusing to overwrite"), "{err}");
        let err = refuse_overwriting(&dir.join("m/."), &[("the model", &dir.join("m"))]);
        assert!(err.is_err());
        assert!(refuse_overwriting(&dir.join("new.xtc"), &[("the input", &data)]).is_ok());
        assert!(refuse_overwriting(&dir.join("m"), &[("the input", &data)]).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn holding_and_lying_inside_are_seen_through_links() {
        let dir = std::env::temp_dir().join(format!("xtoken-paths-in-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("run/checkpoints/step-1")).unwrap();
        let run = dir.join("run");
        let step = run.join("checkpoints/step-1");
        assert!(lies_within(&step, &run));
        assert!(lies_within(&run.join("checkpoints/../new/x"), &run));
        assert!(!lies_within(&dir.join("other"), &run));
        assert!(refuse_holding(&run, &[("the checkpoint", &step)]).is_err());
        assert!(refuse_holding(&dir.join("other"), &[("the checkpoint", &step)]).is_ok());
        let err = refuse_inside(&step.join("student.bin"), &[("the checkpoint", &step)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("inside the checkpoint"), "{err}");
        #[cfg(unix)]
        {
            let link = dir.join("link");
            std::os::unix::fs::symlink(&run, &link).unwrap();
            assert!(refuse_holding(&link, &[("the checkpoint", &step)]).is_err());
            assert!(refuse_inside(&link.join("checkpoints/x"), &[("the run", &run)]).is_err());
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
