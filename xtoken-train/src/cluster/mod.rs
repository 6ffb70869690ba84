//! A run over several processes, on one machine or many: where this process sits
//! ([`Placement`], from torchrun's or srun's variables), and the session that joins the
//! processes and watches them ([`Session`]). The gradients themselves travel through
//! burn-collective (see [`crate::parallel`]); this module starts its orchestrator on rank 0.

mod exchanges;
mod placement;
mod session;

pub use exchanges::ExchangeLog;
pub use placement::{first_host, Placement};
pub use session::{Plan, Session, Timeouts};

/// Starts burn-collective's global orchestrator on `port` of this machine (rank 0), on a thread
/// of its own that lives as long as the process.
#[cfg(feature = "collective")]
pub fn start_orchestrator(port: u16) -> crate::Result<()> {
    use crate::error::Error;
    // The port is checked first: the server reports a port in use only on its own thread.
    std::net::TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        Error::Parallel(format!(
            "rank 0 cannot listen on port {port} (MASTER_PORT + 1, burn-collective's \
             orchestrator): {e}"
        ))
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("xtoken-orchestrator".into())
        .spawn(move || {
            let served = runtime.block_on(burn_collective::serve_global_orchestrator(
                port,
                std::future::pending(),
            ));
            if let Err(e) = served {
                eprintln!("burn-collective's orchestrator on port {port} stopped: {e}");
            }
        })?;
    Ok(())
}
