//! Files and directories written under a temporary name and renamed into place once whole.
//! A [`Temporary`] removes what it names when dropped before [`Temporary::persist`] (an error on
//! the way), and every living one is listed in a process-wide registry that
//! [`remove_all`] empties: a command's interrupt handler calls it, so that Ctrl-C leaves no
//! half-written file behind either. [`NewEntries`] guards a directory the same way: what an
//! operation adds to it is removed when the operation fails.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The temporaries alive in this process.
static REGISTRY: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A temporary file or directory, removed on drop unless persisted.
#[derive(Debug)]
pub struct Temporary {
    path: PathBuf,
    kept: bool,
}

impl Temporary {
    /// Guards `path` (not created here: the caller writes it).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        registry().push(path.clone());
        Self { path, kept: false }
    }

    /// A sibling of `target` for writing it: `<name>.<tag>-<pid>` in the same directory, so that
    /// the rename into place stays on one file system and never replaces a file of the user's.
    pub fn beside(target: &Path, tag: &str) -> Self {
        let mut name = target
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(format!(".{tag}-{}", std::process::id()));
        Self::new(target.with_file_name(name))
    }

    /// The temporary path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary to `target` and stops guarding it.
    pub fn persist(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.release();
        Ok(())
    }

    /// Stops guarding the path without touching it (it was moved or removed by the caller).
    pub fn release(&mut self) {
        self.kept = true;
        let mut list = registry();
        if let Some(i) = list.iter().position(|p| p == &self.path) {
            list.swap_remove(i);
        }
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if !self.kept {
            remove(&self.path);
            self.release();
        }
    }
}

fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        // Another thread may still be writing into it: try again when that left it non-empty.
        Ok(m) if m.is_dir() => {
            for _ in 0..5 {
                if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        Ok(_) => {
            std::fs::remove_file(path).ok();
        }
        Err(_) => {}
    }
}

/// The entries an operation adds to a directory, removed when the guard drops before
/// [`NewEntries::keep`]; the directory too, when the operation created it and it is left empty.
/// What was there before, and the names [`NewEntries::sparing`] lists, are never touched.
#[derive(Debug)]
pub struct NewEntries {
    dir: PathBuf,
    /// The names there before; `None`: the directory did not exist.
    before: Option<Vec<OsString>>,
    spared: Vec<OsString>,
    kept: bool,
}

impl NewEntries {
    /// Notes what `dir` holds now.
    pub fn of(dir: &Path) -> Self {
        let before = std::fs::read_dir(dir)
            .ok()
            .map(|list| list.filter_map(|e| e.ok().map(|e| e.file_name())).collect());
        Self {
            dir: dir.to_path_buf(),
            before,
            spared: Vec::new(),
            kept: false,
        }
    }

    /// Leaves an entry of this name in place even when it is new (it outlives the operation).
    pub fn sparing(mut self, name: &str) -> Self {
        self.spared.push(name.into());
        self
    }

    /// The operation succeeded: its entries stay.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for NewEntries {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let Ok(list) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let old = self.before.as_deref().unwrap_or_default();
        for entry in list.flatten() {
            let name = entry.file_name();
            if !old.contains(&name) && !self.spared.contains(&name) {
                remove(&entry.path());
            }
        }
        if self.before.is_none() {
            std::fs::remove_dir(&self.dir).ok();
        }
    }
}

/// Removes every temporary alive in this process (for an interrupt handler, which exits next).
pub fn remove_all() {
    remove_listed(std::mem::take(&mut *registry()));
}

/// [`remove_all`] for a process ending from inside an allocation (out of memory): when the
/// registry is locked at that moment (by the allocating thread itself, perhaps), nothing is
/// removed rather than waiting forever.
pub fn remove_all_unless_busy() {
    let list = match REGISTRY.try_lock() {
        Ok(mut list) => std::mem::take(&mut *list),
        Err(std::sync::TryLockError::Poisoned(p)) => std::mem::take(&mut *p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    remove_listed(list);
}

fn remove_listed(list: Vec<PathBuf>) {
    for path in list {
        remove(&path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_temporaries_vanish_persisted_ones_stay() {
        let dir = std::env::temp_dir().join(format!("xtoken-temporary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("out.bin");
        let t = Temporary::beside(&target, "tmp");
        assert_eq!(
            t.path().file_name().unwrap().to_string_lossy(),
            format!("out.bin.tmp-{}", std::process::id())
        );
        std::fs::write(t.path(), b"x").unwrap();
        t.persist(&target).unwrap();
        assert!(target.exists());

        let d = Temporary::beside(&dir.join("tree"), "tmp");
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        let path = d.path().to_path_buf();
        drop(d);
        assert!(!path.exists());

        // (`remove_all` is left to the command-line tests: here it would take the
        // temporaries of the tests running beside this one.)
        assert!(!registry().contains(&path));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn new_entries_go_unless_kept_and_old_ones_stay() {
        let dir = std::env::temp_dir().join(format!("xtoken-entries-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("old"), b"mine").unwrap();
        let guard = NewEntries::of(&dir).sparing("data");
        std::fs::write(dir.join("new"), b"x").unwrap();
        std::fs::create_dir_all(dir.join("tree/a")).unwrap();
        std::fs::create_dir_all(dir.join("data")).unwrap();
        drop(guard);
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["data", "old"]);
        NewEntries::of(&dir).keep();
        let guard = NewEntries::of(&dir);
        std::fs::write(dir.join("kept"), b"x").unwrap();
        guard.keep();
        assert!(dir.join("kept").exists());
        std::fs::remove_dir_all(&dir).unwrap();

        // A directory the operation made goes with its entries; an existing empty one stays.
        let made = dir.join("made");
        let guard = NewEntries::of(&made);
        std::fs::create_dir_all(made.join("x")).unwrap();
        drop(guard);
        assert!(!made.exists());
        std::fs::create_dir_all(&made).unwrap();
        drop(NewEntries::of(&made));
        assert!(made.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
