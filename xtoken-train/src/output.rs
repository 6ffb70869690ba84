//! The one rule every command that writes follows, so that nothing a user owns is replaced or
//! removed:
//!
//! - an output that **is**, **holds** or **lies inside** any of the command's inputs (a model
//!   directory, a checkpoint, a run directory, a dataset, a tokenizer) is refused;
//! - an existing output is written only when it is the command's own: a file the command
//!   recognizes as one it wrote, a directory holding nothing but files of the command's names
//!   (with its signature file, and none of them read-only), or a work directory the command
//!   marked as its own when it made it;
//! - files and directories are written under a temporary name and moved into place whole, an
//!   earlier output directory swapped for the new one in one rename, so that an error or an
//!   interruption leaves the old output as it was.
//!
//! A command declares its [`Inputs`], checks each output with [`Inputs::check`] before any work,
//! and writes with [`write_file`], [`write_dir`] or [`claim_work_dir`].

use std::path::{Path, PathBuf};

use xtoken_kernels::temporary::Temporary;

use crate::error::{Context, Error, Result};
use crate::paths::{lies_within, same};

/// The files and directories a command reads and leaves as they are, each named by what it is.
#[derive(Debug, Default, Clone)]
pub struct Inputs(Vec<(String, PathBuf)>);

impl Inputs {
    /// No inputs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path`, read as `what` ("the --model directory").
    pub fn with(mut self, what: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        self.add(what, path);
        self
    }

    /// Adds `path`, read as `what`.
    pub fn add(&mut self, what: impl Into<String>, path: impl Into<PathBuf>) -> &mut Self {
        self.0.push((what.into(), path.into()));
        self
    }

    /// Adds a tokenizer argument: the path given and, for a directory, its `tokenizer.json`.
    pub fn tokenizer(mut self, what: &str, path: &Path) -> Self {
        self.add(what, path);
        self.add(what, path.join("tokenizer.json"));
        self
    }

    /// Refuses `out` when it is one of the inputs, holds one, or lies inside one, and when it is
    /// an existing output that is not `own`'s; nothing is written.
    pub fn check(&self, out: &Path, own: &Own) -> Result<()> {
        self.refuse(out)?;
        own.check(out)?;
        own.check_above(out)
    }

    /// Refuses `out` when it is one of the inputs, holds one, or lies inside one.
    pub fn refuse(&self, out: &Path) -> Result<()> {
        for (what, input) in &self.0 {
            if !input.exists() {
                continue;
            }
            let how = if same(out, input) {
                "is"
            } else if lies_within(input, out) {
                "holds"
            } else if lies_within(out, input) {
                "lies inside"
            } else {
                continue;
            };
            return Err(Error::Run(format!(
                "{}: this {how} {what} ({}), which this command reads; refusing to write over an \
                 input, choose another output",
                out.display(),
                input.display()
            )));
        }
        Ok(())
    }
}

/// The names of the files a command writes into an output directory: exact names and
/// `prefix…suffix` patterns.
#[derive(Debug, Clone, Default)]
pub struct Names {
    exact: Vec<String>,
    patterns: Vec<(String, String)>,
}

impl Names {
    /// The exact names `names`.
    pub fn of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Self {
        Self {
            exact: names.into_iter().map(|s| s.as_ref().to_string()).collect(),
            patterns: Vec::new(),
        }
    }

    /// Adds every name that starts with `prefix` and ends with `suffix`.
    pub fn pattern(mut self, prefix: &str, suffix: &str) -> Self {
        self.patterns.push((prefix.into(), suffix.into()));
        self
    }

    /// Whether the command writes a file of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.exact.iter().any(|n| n == name)
            || self.patterns.iter().any(|(p, s)| {
                name.len() >= p.len() + s.len() && name.starts_with(p) && name.ends_with(s)
            })
    }

    fn describe(&self) -> String {
        let mut all = self.exact.clone();
        all.extend(self.patterns.iter().map(|(p, s)| format!("{p}*{s}")));
        all.join(", ")
    }
}

/// What an existing output must be for the command to write it.
pub enum Own<'a> {
    /// A file, replaced only when `is_own` recognizes it as `what` (a file this command writes).
    File {
        /// What the command writes ("a projection matrix W").
        what: &'a str,
        /// Whether an existing file is one.
        is_own: fn(&Path) -> bool,
    },
    /// A directory of files of `names`; an existing non-empty one must hold `signature`, a file
    /// `signed` recognizes as one the command wrote.
    Dir {
        /// Who writes it ("an evaluation", "an export").
        what: &'a str,
        /// The names it writes.
        names: Names,
        /// The file every earlier output holds.
        signature: &'a str,
        /// Whether the signature file is the command's own.
        signed: fn(&Path) -> bool,
    },
    /// A work directory a command makes and reuses: new, empty, or holding the marker file
    /// [`WORK_MARKER`] that [`claim_work_dir`] leaves.
    WorkDir,
    /// A directory a command fills over time and comes back to (a training run's): new, empty,
    /// one `recognized` as the command's own, or holding nothing but entries `leftover` accepts
    /// (what an attempt that failed keeps for the next one). It may not lie inside a directory
    /// `recognized` as the command's own either: that one's files are not this output's.
    Tree {
        /// Who writes it ("a training run").
        what: &'a str,
        /// Whether a directory is one the command wrote.
        recognized: fn(&Path) -> bool,
        /// Whether an entry of a directory not recognized is what a failed attempt left.
        leftover: fn(&Path) -> bool,
    },
}

/// The file that marks a directory as a work directory of xtoken's own.
pub const WORK_MARKER: &str = ".xtoken-work";

impl Own<'_> {
    fn check(&self, out: &Path) -> Result<()> {
        let Ok(meta) = std::fs::metadata(out) else {
            return Ok(());
        };
        match self {
            Own::File { what, is_own } => {
                if meta.is_dir() {
                    return Err(refusal(
                        out,
                        &format!("a directory is there; {what} is a file"),
                    ));
                }
                if !is_own(out) {
                    return Err(refusal(
                        out,
                        &format!("this file is not {what} this command wrote; it is left alone"),
                    ));
                }
                writable(out)
            }
            Own::Dir {
                what,
                names,
                signature,
                signed,
            } => {
                let entries = check_dir(out, &meta, what, names)?;
                let path = out.join(signature);
                if entries > 0 && !(path.is_file() && signed(&path)) {
                    return Err(refusal(
                        out,
                        &format!(
                            "its {signature} is not one {what} wrote, so this is no earlier \
                             output of it"
                        ),
                    ));
                }
                Ok(())
            }
            Own::WorkDir => check_work_dir(out, &meta),
            Own::Tree {
                what,
                recognized,
                leftover,
            } => check_tree(out, &meta, what, *recognized, *leftover),
        }
    }

    /// Refuses `out` when an existing directory above it is the command's own (an [`Own::Tree`]
    /// `recognized`); other kinds of output need no look upwards.
    fn check_above(&self, out: &Path) -> Result<()> {
        let Own::Tree {
            what, recognized, ..
        } = self
        else {
            return Ok(());
        };
        for above in crate::paths::directories_above(out) {
            if recognized(&above) {
                return Err(refusal(
                    out,
                    &format!(
                        "it lies inside {}, the directory of {what}, whose files are that \
                         one's",
                        above.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn check_tree(
    out: &Path,
    meta: &std::fs::Metadata,
    what: &str,
    recognized: fn(&Path) -> bool,
    leftover: fn(&Path) -> bool,
) -> Result<()> {
    if !meta.is_dir() {
        return Err(refusal(
            out,
            &format!("a file is there; {what} writes a directory"),
        ));
    }
    if recognized(out) {
        return Ok(());
    }
    let listing = std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))?;
    for entry in listing {
        let entry = entry.with_context(|| format!("listing {}", out.display()))?;
        if !leftover(&entry.path()) {
            return Err(refusal(
                out,
                &format!(
                    "it holds {}, which {what} did not write; its directory is new, empty, or \
                     one it wrote earlier",
                    entry.file_name().to_string_lossy()
                ),
            ));
        }
    }
    Ok(())
}

fn refusal(out: &Path, why: &str) -> Error {
    Error::Run(format!(
        "{}: {why}; refusing to write over it, choose another output",
        out.display()
    ))
}

fn writable(path: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.permissions().readonly() {
        return Err(refusal(path, "it is read-only (someone protected it)"));
    }
    Ok(())
}

/// Checks that the existing directory `out` holds only writable files of `names`; returns how
/// many it holds.
fn check_dir(out: &Path, meta: &std::fs::Metadata, what: &str, names: &Names) -> Result<usize> {
    if !meta.is_dir() {
        return Err(refusal(
            out,
            &format!("a file is there; {what} writes a directory"),
        ));
    }
    let listing = std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))?;
    let mut entries = 0;
    for entry in listing {
        let entry = entry.with_context(|| format!("listing {}", out.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let plain = entry.file_type().is_ok_and(|t| t.is_file());
        if !plain || !names.contains(&name) {
            return Err(refusal(
                out,
                &format!(
                    "it holds {name}, which {what} does not write; an output directory is new, \
                     empty, or an earlier output of this command (only {})",
                    names.describe()
                ),
            ));
        }
        writable(&entry.path())?;
        entries += 1;
    }
    Ok(entries)
}

fn check_work_dir(out: &Path, meta: &std::fs::Metadata) -> Result<()> {
    if !meta.is_dir() {
        return Err(refusal(
            out,
            "a file is there; a work directory is a directory",
        ));
    }
    let empty = std::fs::read_dir(out)
        .with_context(|| format!("listing {}", out.display()))?
        .next()
        .is_none();
    if empty || out.join(WORK_MARKER).is_file() {
        return Ok(());
    }
    Err(refusal(
        out,
        &format!(
            "it holds files xtoken did not make (no {WORK_MARKER}); a work directory is new, \
             empty, or one xtoken made"
        ),
    ))
}

/// Writes the file `out` through a temporary file beside it (`write` fills it), renamed into
/// place once whole: an error or an interruption leaves an earlier `out` as it was.
pub fn write_file<T>(out: &Path, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let tmp = Temporary::beside(out, "xtoken-tmp");
    let value = write(tmp.path())?;
    tmp.persist(out)
        .with_context(|| format!("moving the new {} into place", out.display()))?;
    Ok(value)
}

/// Writes the directory `out` through a temporary directory beside it (`write` fills it): a new
/// `out` is the temporary renamed; an earlier output is swapped for it in one atomic exchange
/// (on Linux), so that an error or an interruption leaves the earlier output whole.
pub fn write_dir<T>(out: &Path, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let tmp = Temporary::beside(out, "xtoken-tmp");
    std::fs::create_dir_all(tmp.path())
        .with_context(|| format!("creating {}", tmp.path().display()))?;
    let value = write(tmp.path())?;
    if !out.exists() {
        let at = tmp.path().display().to_string();
        tmp.persist(out)
            .with_context(|| format!("renaming {at} into place"))?;
        return Ok(value);
    }
    // `tmp` now names the earlier output, which goes when it drops.
    exchange(tmp.path(), out)?;
    Ok(value)
}

/// Swaps the directories `a` and `b` in one step.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| Error::Run(format!("{}: a NUL byte in the path", p.display())))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: both are NUL-terminated paths that live across the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        // A file system or kernel without the exchange: replace file by file.
        Some(libc::EINVAL) | Some(libc::ENOSYS) => replace_files(a, b),
        _ => Err(err).with_context(|| format!("swapping the new {} into place", b.display())),
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(a: &Path, b: &Path) -> Result<()> {
    replace_files(a, b)
}

/// Moves every file of `new` into `out`, one rename each; `new` is left with `out`'s old files
/// of those names. Used only where the directories cannot be exchanged.
fn replace_files(new: &Path, out: &Path) -> Result<()> {
    for entry in std::fs::read_dir(new).with_context(|| format!("listing {}", new.display()))? {
        let from = entry?.path();
        let to = out.join(from.file_name().unwrap_or_default());
        std::fs::rename(&from, &to).with_context(|| format!("replacing {}", to.display()))?;
    }
    Ok(())
}

/// Takes the work directory `dir` of `command` once `inputs` and [`Own::WorkDir`] allow it:
/// creates it and leaves the marker [`WORK_MARKER`] in it, so that later runs know it as
/// xtoken's own (and may replace what they made there).
pub fn claim_work_dir(inputs: &Inputs, dir: &Path, command: &str) -> Result<()> {
    inputs.check(dir, &Own::WorkDir)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(WORK_MARKER);
    if !path.is_file() {
        let text =
            format!("A work directory of `{command}`: xtoken may replace what it made here.\n");
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Whether `path` is a JSON object with every one of `fields`.
pub fn json_has(path: &Path, fields: &[&str]) -> bool {
    let text = std::fs::read(path).ok();
    let value = text.and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok());
    value.is_some_and(|v| fields.iter().all(|f| v.get(f).is_some()))
}

/// Whether `path` is the `config.json` of a model directory xtoken wrote.
pub fn written_by_xtoken(path: &Path) -> bool {
    json_has(path, &[xtoken_models::WRITER_FIELD])
}

/// Whether `path` is a safetensors file whose tensors are exactly `names` (its header alone is
/// read).
pub fn safetensors_holds(path: &Path, names: &[&str]) -> bool {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut len = [0u8; 8];
    if file.read_exact(&mut len).is_err() {
        return false;
    }
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return false;
    }
    let mut header = vec![0u8; len as usize];
    if file.read_exact(&mut header).is_err() {
        return false;
    }
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(&header) else {
        return false;
    };
    let mut held: Vec<&str> = map
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "__metadata__")
        .collect();
    let mut wanted = names.to_vec();
    held.sort_unstable();
    wanted.sort_unstable();
    held == wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtoken-output-{tag}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn results() -> Own<'static> {
        Own::Dir {
            what: "an evaluation",
            names: Names::of(["results.json", "results.md"]).pattern("samples_", ".jsonl"),
            signature: "results.json",
            signed: |path| json_has(path, &["tasks"]),
        }
    }

    #[test]
    fn an_output_that_is_holds_or_lies_inside_an_input_is_refused() {
        let dir = scratch("inputs");
        let model = dir.join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        let inputs = Inputs::new().with("the model", &model);
        for (out, how) in [
            (model.clone(), "is the model"),
            (dir.clone(), "holds the model"),
            (model.join("new"), "lies inside the model"),
        ] {
            let err = inputs.check(&out, &results()).unwrap_err().to_string();
            assert!(err.contains(how), "{err}");
        }
        assert!(inputs.check(&dir.join("out"), &results()).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn only_an_earlier_output_is_written_over() {
        let dir = scratch("own");
        let none = Inputs::new();
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        assert!(none.check(&out, &results()).is_ok(), "empty");
        std::fs::write(out.join("results.md"), "mine").unwrap();
        let err = none.check(&out, &results()).unwrap_err().to_string();
        assert!(err.contains("results.json is not one"), "{err}");
        std::fs::write(out.join("results.json"), "{}").unwrap();
        let err = none.check(&out, &results()).unwrap_err().to_string();
        assert!(err.contains("results.json is not one"), "{err}");
        std::fs::write(out.join("results.json"), r#"{"tasks": []}"#).unwrap();
        std::fs::write(out.join("samples_mmlu.jsonl"), "").unwrap();
        assert!(none.check(&out, &results()).is_ok(), "an earlier output");
        std::fs::write(out.join("notes.txt"), "").unwrap();
        let err = none.check(&out, &results()).unwrap_err().to_string();
        assert!(err.contains("holds notes.txt"), "{err}");
        std::fs::remove_file(out.join("notes.txt")).unwrap();
        let sample = out.join("samples_mmlu.jsonl");
        let mut permissions = std::fs::metadata(&sample).unwrap().permissions();
        permissions.set_readonly(true);
        std::fs::set_permissions(&sample, permissions).unwrap();
        let err = none.check(&out, &results()).unwrap_err().to_string();
        assert!(err.contains("read-only"), "{err}");
        let err = none.check(&sample, &results()).unwrap_err().to_string();
        assert!(err.contains("a file is there"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_earlier_directory_is_swapped_whole_and_kept_on_error() {
        let dir = scratch("swap");
        let out = dir.join("out");
        write_dir(&out, |tmp| Ok(std::fs::write(tmp.join("a"), "1")?)).unwrap();
        #[cfg(target_os = "linux")]
        let before = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&out).unwrap());
        write_dir(&out, |tmp| Ok(std::fs::write(tmp.join("a"), "2")?)).unwrap();
        assert_eq!(std::fs::read_to_string(out.join("a")).unwrap(), "2");
        // One exchange of directories, not file after file into the old one.
        #[cfg(target_os = "linux")]
        assert_ne!(
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&out).unwrap()),
            before
        );
        let failed: Result<()> = write_dir(&out, |tmp| {
            std::fs::write(tmp.join("a"), "3")?;
            Err(Error::Run("stopped".into()))
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read_to_string(out.join("a")).unwrap(), "2");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary left beside the output");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_work_directory_is_new_empty_or_marked() {
        let dir = scratch("work");
        let none = Inputs::new();
        assert!(none.check(&dir.join("new"), &Own::WorkDir).is_ok());
        std::fs::write(dir.join("user.txt"), "").unwrap();
        let err = claim_work_dir(&none, &dir, "test").unwrap_err().to_string();
        assert!(err.contains("did not make"), "{err}");
        assert!(!dir.join(WORK_MARKER).exists());
        let work = dir.join("work");
        claim_work_dir(&none, &work, "test").unwrap();
        std::fs::write(work.join("corpus.jsonl"), "").unwrap();
        assert!(claim_work_dir(&none, &work, "test").is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }
}
