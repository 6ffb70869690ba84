//! One process trains in a run directory at a time: the lead worker of a run holds
//! `<output_dir>/xtoken.lock`, a file naming its process id and host, created exclusively and
//! removed when the run ends (or is interrupted). A second process is refused, naming the
//! holder; a lock left by a process of this host that no longer exists (killed) is taken over
//! with a warning. The other ranks of one multi-process run share the directory without it.

use std::io::Write;
use std::path::{Path, PathBuf};

use xtoken_core::temporary::Temporary;

use crate::error::{Context, Error, Result};

/// The lock file's name in a run directory.
pub const LOCK_FILE: &str = "xtoken.lock";

/// The lock of a run directory, released on drop.
#[derive(Debug)]
pub struct RunLock {
    _file: Temporary,
}

/// Who holds a lock, as its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    pid: u32,
    host: String,
}

impl Holder {
    fn this_process() -> Self {
        Holder {
            pid: std::process::id(),
            host: host_name(),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        // No process has id 0: such a file is not a lock xtoken wrote.
        let pid = field("pid=")?.parse().ok().filter(|&pid| pid > 0)?;
        let host = field("host=").filter(|h| !h.is_empty())?;
        Some(Holder { pid, host })
    }

    fn text(&self) -> String {
        format!("pid={}\nhost={}\n", self.pid, self.host)
    }

    /// Whether the holder is a process of this host that no longer runs.
    fn is_gone(&self) -> bool {
        self.host == host_name()
            && Path::new("/proc/self").exists()
            && !Path::new(&format!("/proc/{}", self.pid)).exists()
    }
}

/// This machine's host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into())
}

impl RunLock {
    /// Takes the lock of the run directory `dir` (which exists).
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        match create(&path) {
            Ok(lock) => return Ok(lock),
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).with_context(|| format!("{}: taking the run's lock", path.display()))
            }
            Err(_) => {}
        }
        let holder = read_holder(&path)?;
        if !holder.is_gone() {
            return Err(Error::Run(held_by(dir, &holder)));
        }
        tracing::warn!(
            "{}: taking over the lock of process {} on {}, which no longer runs",
            path.display(),
            holder.pid,
            holder.host
        );
        std::fs::remove_file(&path).ok();
        create(&path).with_context(|| format!("{}: taking the run's lock", path.display()))
    }

    /// Whether the lock of `dir` keeps a run out now, and why: another live process holds it,
    /// or the lock file is none xtoken wrote.
    pub fn held_elsewhere(dir: &Path) -> Option<String> {
        let path = dir.join(LOCK_FILE);
        std::fs::symlink_metadata(&path).ok()?;
        match read_holder(&path) {
            Err(e) => Some(e.to_string()),
            Ok(holder) => (holder != Holder::this_process() && !holder.is_gone())
                .then(|| held_by(dir, &holder)),
        }
    }
}

/// Why `holder`, alive, keeps another run out of `dir`.
fn held_by(dir: &Path, holder: &Holder) -> String {
    format!(
        "{}: another xtoken process trains in this run directory (process {} on {}); wait for it \
         to end, or, if no process of this run is alive, remove {} and try again",
        dir.display(),
        holder.pid,
        holder.host,
        dir.join(LOCK_FILE).display()
    )
}

/// The holder the existing lock file `path` names; an error when it is none xtoken wrote: a
/// directory, a link, or a file that names no process.
fn read_holder(path: &Path) -> Result<Holder> {
    not_a_lock(path)?;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    Holder::parse(&text).ok_or_else(|| {
        Error::Run(format!(
            "{}: the lock file names no process (it is empty or damaged: not a lock an xtoken \
             process finished writing); if no process of this run is alive, remove it and try \
             again",
            path.display()
        ))
    })
}

/// Refuses a lock path that is a directory or a symbolic link: no xtoken process made it.
fn not_a_lock(path: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("{}", path.display()))?;
    let what = match meta.file_type() {
        t if t.is_symlink() => "a symbolic link",
        t if t.is_dir() => "a directory",
        t if t.is_file() => return Ok(()),
        _ => "not a plain file",
    };
    Err(Error::Run(format!(
        "{}: {what} is where the run's lock goes; xtoken makes the lock as a plain file, so \
         something else put this here: move it away and try again",
        path.display()
    )))
}

/// Creates the lock file exclusively, naming this process.
fn create(path: &PathBuf) -> std::io::Result<RunLock> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let guard = Temporary::new(path.clone());
    file.write_all(Holder::this_process().text().as_bytes())?;
    Ok(RunLock { _file: guard })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_a_dead_ones_lock_taken_over() {
        let dir = std::env::temp_dir().join(format!("xtoken-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = RunLock::acquire(&dir).unwrap();
        let err = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(
            err.contains(&format!("process {}", std::process::id())),
            "{err}"
        );
        drop(lock);
        assert!(!dir.join(LOCK_FILE).exists());

        // A process of this host that has ended (no process has this pid).
        let dead = Holder {
            pid: u32::MAX - 1,
            host: host_name(),
        };
        std::fs::write(dir.join(LOCK_FILE), dead.text()).unwrap();
        assert_eq!(RunLock::held_elsewhere(&dir), None);
        let lock = RunLock::acquire(&dir).unwrap();
        drop(lock);

        // Another host's holder is never taken over.
        let remote = Holder {
            pid: 1,
            host: "elsewhere".into(),
        };
        std::fs::write(dir.join(LOCK_FILE), remote.text()).unwrap();
        let why = RunLock::held_elsewhere(&dir).unwrap();
        assert!(why.contains("another xtoken process trains"), "{why}");
        assert!(why.contains("process 1 on elsewhere"), "{why}");
        let err = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains("process 1 on elsewhere"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Garbage, an empty file, `pid = 0`, a directory or a link where the lock goes are named
    /// for what they are, never as another process training or one that ended.
    #[test]
    fn a_lock_file_xtoken_did_not_write_is_named_as_such() {
        let dir = std::env::temp_dir().join(format!("xtoken-lock-odd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(LOCK_FILE);
        let host = host_name();
        for text in ["garbage", "", &format!("pid=0\nhost={host}\n")] {
            std::fs::write(&path, text).unwrap();
            let err = RunLock::acquire(&dir).unwrap_err().to_string();
            assert!(err.contains("names no process"), "{text:?}: {err}");
            assert!(RunLock::held_elsewhere(&dir)
                .unwrap()
                .contains("names no process"));
            assert!(
                path.exists(),
                "a damaged lock is left for the user to remove"
            );
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let err = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(
            err.contains("a directory is where the run's lock goes"),
            "{err}"
        );
        std::fs::remove_dir(&path).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.join("elsewhere"), &path).unwrap();
            let err = RunLock::acquire(&dir).unwrap_err().to_string();
            assert!(err.contains("a symbolic link"), "{err}");
            assert!(RunLock::held_elsewhere(&dir)
                .unwrap()
                .contains("symbolic link"));
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
