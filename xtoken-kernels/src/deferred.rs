//! Checks that would read the device, left for later. The cube kernels report a logit row that
//! holds NaN, +∞ or only −∞ by name, and a loss that came out non-finite; finding out reads
//! their flags and value back, and on a GPU every read waits for the device's queue. A training
//! step would wait several times per micro-batch for checks that almost never fail.
//!
//! While a [`Deferred`] guard lives on a thread, its kernels keep those checks instead of
//! running them. A bad row still shows: it makes the loss non-finite on the device, which the
//! caller sees when it reads its loss values; [`Deferred::explain`] then runs the kept checks and
//! returns the error that names the row. The host kernels read host memory and check at once.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

use crate::error::KernelError;

type Check = Box<dyn FnOnce() -> Result<(), KernelError>>;

thread_local! {
    static DEFERRING: Cell<u32> = const { Cell::new(0) };
    static KEPT: RefCell<Vec<Check>> = const { RefCell::new(Vec::new()) };
}

/// While alive, this thread's kernels keep the checks that read the device (see the module).
#[must_use = "checks are deferred only while the guard lives"]
pub struct Deferred {
    /// Thread-bound: the checks are kept per thread.
    _thread: PhantomData<*const ()>,
}

/// Defers this thread's device-reading checks until the guard is dropped or explains them.
pub fn defer() -> Deferred {
    DEFERRING.with(|d| d.set(d.get() + 1));
    Deferred {
        _thread: PhantomData,
    }
}

impl Deferred {
    /// Runs the checks kept so far (each reads the device) and returns the first error: call it
    /// when a loss came out non-finite, to name the row at fault. `Ok` when every check passes.
    pub fn explain(&self) -> Result<(), KernelError> {
        let kept = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
        kept.into_iter().try_for_each(|check| check())
    }

    /// Forgets the checks kept so far (their values were read and found finite).
    pub fn clear(&self) {
        KEPT.with(|k| k.borrow_mut().clear());
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        let left = DEFERRING.with(|d| {
            d.set(d.get() - 1);
            d.get()
        });
        if left == 0 {
            self.clear();
        }
    }
}

/// Runs `check` now, or keeps it when this thread defers its checks.
#[cfg_attr(not(feature = "cube"), allow(dead_code))]
pub(crate) fn check_later(
    check: impl FnOnce() -> Result<(), KernelError> + 'static,
) -> Result<(), KernelError> {
    if DEFERRING.with(Cell::get) > 0 {
        KEPT.with(|k| k.borrow_mut().push(Box::new(check)));
        Ok(())
    } else {
        check()
    }
}

/// Whether this thread defers its device-reading checks.
#[cfg_attr(not(feature = "cube"), allow(dead_code))]
pub(crate) fn deferring() -> bool {
    DEFERRING.with(Cell::get) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing() -> Result<(), KernelError> {
        Err(KernelError::NonFinite {
            side: "student",
            row: 3,
        })
    }

    /// Without a guard a check runs at once; with one it waits for `explain`, and dropping the
    /// last guard forgets it.
    #[test]
    fn checks_wait_for_explain_while_deferred() {
        assert!(check_later(failing).is_err());
        let deferred = defer();
        assert!(check_later(failing).is_ok());
        assert!(check_later(|| Ok(())).is_ok());
        let e = deferred.explain().unwrap_err();
        assert!(e.to_string().contains("row 3"), "{e}");
        assert!(deferred.explain().is_ok(), "explained checks are gone");
        assert!(check_later(failing).is_ok());
        drop(deferred);
        assert!(!deferring());
        assert!(
            defer().explain().is_ok(),
            "the last guard forgot its checks"
        );
    }
}
