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
}
