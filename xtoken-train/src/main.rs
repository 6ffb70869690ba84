//! `xtoken`: the command-line tool of the X-Token cross-tokenizer distillation framework. It
//! parses the command line and dispatches to [`cli`] (the commands) and [`bench`] (the
//! benchmarks); the work itself is done by the xtoken libraries.

mod bench;
mod cli;
#[cfg(test)]
mod every_output;

#[global_allocator]
static ALLOCATOR: bench::alloc::Counting = bench::alloc::Counting;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};

fn main() -> ExitCode {
    // Under an address-space limit alone (`ulimit -v`) nothing is counted: the allocation the
    // system refuses ends the process by name (`bench::alloc`).
    match xtoken_train::train::memory::cap() {
        Ok(Some(bytes)) => bench::alloc::cap(bytes),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    keep_freed_memory();
    bench::alloc::reserve();
    init_logging();
    remove_temporaries_on_interrupt();
    match dispatch(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`xtoken … | head`): nothing left to say.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // What an error left under a temporary name goes, as on Ctrl-C.
            xtoken_core::temporary::remove_all();
            eprintln!("error: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// Runs a command.
fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo(args) => cli::demo::run(args),
        Command::Train(args) => cli::train::run(args),
        Command::Teach(args) => cli::teach::run(args),
        Command::Serve(args) => cli::serve::run(args),
        Command::Projection(command) => cli::projection::run(command),
        Command::Audit(args) => cli::audit::run(args),
        Command::Align(args) => cli::align::run(args),
        Command::Cache(command) => cli::align::cache(command),
        Command::Logits(args) => cli::models::logits(args),
        Command::Convert(args) => cli::models::convert(args),
        Command::Export(args) => cli::models::export(args),
        Command::Eval(args) => cli::eval::run(args),
        Command::Bench(command) => bench::run(command),
    }
}

/// On glibc, large blocks (a step's logits, a weight's gradient: hundreds of MB each) are
/// mapped from the kernel at each allocation and unmapped when freed, so every step faults in
/// and zeroes the same pages again: a fifth of a CPU training step's time. Taken from the heap
/// and kept there when freed, they are reused; the peak resident memory grows by a little (15 %
/// for `bench forward`'s 100M model). A `GLIBC_TUNABLES` the user set is left to decide.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: mallopt only sets allocator parameters; called before any other thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

/// Ctrl-C or SIGTERM removes every file still being written under a temporary name (a cache,
/// an export, a checkpoint, the run's lock) before the process ends with the signal's usual
/// exit code, 130.
fn remove_temporaries_on_interrupt() {
    let installed = ctrlc::set_handler(|| {
        xtoken_core::temporary::remove_all();
        eprintln!("interrupted: temporary files removed");
        std::process::exit(130);
    });
    if let Err(e) = installed {
        tracing::warn!(
            "no interrupt handler ({e}): an interrupted command may leave temporary files"
        );
    }
}

/// Log lines on stderr with a timestamp and a level; `RUST_LOG` filters them (default: xtoken's
/// `info`, other crates' `warn`; `RUST_LOG=debug` shows everything).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,xtoken_train=info,xtoken=info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .init();
}

/// The error and its causes, joined with ": "; a cause its error already quotes (`{path}:
/// {source}`) is not repeated.
fn report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}
