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
        Some(Holder {
            pid: field("pid=")?.parse().ok()?,
            host: field("host=")?,
        })
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
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        match Holder::parse(&text) {
            Some(holder) if holder.is_gone() => {
                tracing::warn!(
                    "{}: taking over the lock of process {} on {}, which no longer runs",
                    path.display(),
                    holder.pid,
                    holder.host
                );
                std::fs::remove_file(&path).ok();
                create(&path).with_context(|| format!("{}: taking the run's lock", path.display()))
            }
            holder => Err(Error::Run(format!(
                "{}: another xtoken process trains in this run directory ({}); wait for it to \
                 end, or, if no process of this run is alive, remove {} and try again",
                dir.display(),
                holder.map_or_else(
                    || "its lock file cannot be read".to_string(),
                    |h| format!("process {} on {}", h.pid, h.host)
                ),
                path.display()
            ))),
        }
    }

    /// Whether another live process holds the lock of `dir` now: its description.
    pub fn held_elsewhere(dir: &Path) -> Option<String> {
        let text = std::fs::read_to_string(dir.join(LOCK_FILE)).ok()?;
        let holder = Holder::parse(&text)?;
        (holder != Holder::this_process() && !holder.is_gone())
            .then(|| format!("process {} on {}", holder.pid, holder.host))
    }
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
        assert_eq!(
            RunLock::held_elsewhere(&dir).as_deref(),
            Some("process 1 on elsewhere")
        );
        let err = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains("process 1 on elsewhere"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
