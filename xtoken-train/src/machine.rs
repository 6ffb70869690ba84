//! What the machine allows: host memory a command may still take, read before a large
//! allocation so that a size the machine cannot hold is an error rather than an abort.

use crate::error::{Error, Result};

/// Bytes of host memory available to new allocations (`MemAvailable` of `/proc/meminfo`);
/// `None` where the system does not say.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&info)
}

fn parse_mem_available(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A field of `/proc/self/status` in bytes (`VmRSS:`, `VmHWM:`); `None` off Linux.
fn status_bytes(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// The process's resident memory now; `None` off Linux.
pub fn resident() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// The process's peak resident memory (since it started, or since
/// [`reset_peak_resident`]); `None` where the system does not say.
pub fn peak_resident() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Starts a new peak at the current resident memory, which it returns (Linux).
pub fn reset_peak_resident() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    status_bytes("VmRSS:")
}

/// The longest document aligned so far in this process (where it is, and its bytes), when one
/// was longer than a piece of the alignment: a document is held whole once aligned, so that
/// an out-of-memory ending can name it.
static LONGEST_DOCUMENT: std::sync::Mutex<Option<(String, usize)>> = std::sync::Mutex::new(None);

/// Notes a long document being aligned (`place`: its file and line).
pub fn note_long_document(place: impl FnOnce() -> String, bytes: usize) {
    let mut longest = LONGEST_DOCUMENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if longest.as_ref().is_none_or(|(_, b)| bytes > *b) {
        *longest = Some((place(), bytes));
    }
}

/// The longest document [`note_long_document`] saw; `None` also when another thread holds the
/// record now (this is read while a process ends).
pub fn longest_document() -> Option<(String, usize)> {
    LONGEST_DOCUMENT.try_lock().ok()?.clone()
}

/// Refuses work that needs `need` bytes of host memory when less is available; `what` names
/// the work and `hint` says what to change.
pub fn check_fits(what: &str, need: u64, hint: &str) -> Result<()> {
    match available_memory() {
        Some(available) if need > available => Err(Error::Config(format!(
            "{what} needs about {:.1} GB of memory, more than the {:.1} GB this machine has \
             available; {hint}",
            need as f64 / 1e9,
            available as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let info = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(info), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn more_than_the_machine_has_is_refused_by_name() {
        if available_memory().is_none() {
            return;
        }
        let err = check_fits("this test", u64::MAX, "ask for less").unwrap_err();
        let message = err.to_string();
        assert!(message.contains("this test needs about"), "{message}");
        assert!(message.contains("ask for less"), "{message}");
        check_fits("this test", 1, "").unwrap();
    }
}
