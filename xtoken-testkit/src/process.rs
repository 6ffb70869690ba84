//! Tests that need their process to themselves. Each crate's integration tests are one binary,
//! whose tests run side by side on threads; a test that records something process-wide (every
//! tensor the CPU backend makes, cubecl's compilations) or configures the process before its
//! first device would see or disturb its neighbours. [`alone`] runs such a test in a child
//! process of the same binary in which it is the only test.

use std::process::Command;

/// Set in the child: the name of the one test it runs.
const ALONE: &str = "XTOKEN_TEST_ALONE";

/// Runs `body` as the only test of a process. Called from the test `name` of module `module`
/// (pass `module_path!()`): in the test binary's own run it starts the binary again, filtered to
/// exactly this test, and requires that run to pass one test; in that child it runs `body`.
/// A wrong name runs no test in the child and fails here, so the body cannot be skipped.
pub fn alone(module: &str, name: &str, body: impl FnOnce()) {
    let test = test_path(module, name);
    if std::env::var(ALONE).is_ok_and(|t| t == test) {
        body();
        return;
    }
    let binary = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(&binary)
        .args([test.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, &test)
        .output()
        .unwrap_or_else(|e| panic!("{test}: cannot start {}: {e}", binary.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Printed, so that the harness shows the child's output when this test fails; indented, so
    // that the child's `test result:` line is not read as one of the run's own.
    for line in stdout
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        println!("  | {line}");
    }
    assert!(out.status.success(), "{test} failed in its own process");
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{test} did not run in its own process (no test of that name?)"
    );
}

/// The name libtest gives the test `name` of module `module` (pass `module_path!()`): its path
/// below the crate root, which a test binary takes as a filter to run that test alone.
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, below)) => format!("{below}::{name}"),
        None => name.to_string(),
    }
}
