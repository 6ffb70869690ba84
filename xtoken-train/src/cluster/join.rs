//! Joining a run of several processes: rank 0 starts xtoken-collective's orchestrator, every rank
//! joins the session, and the node is handed to the workers' all-reduce.

use super::parallel::Nodes;
use super::placement::Placement;
use super::session::{Plan, Session, Timeouts};
use crate::config::ExchangeKind;
use crate::error::{Error, Result};
use xtoken_kernels::nccl::UniqueId;

/// Joins the run `placement` describes as one node of `plan.workers` workers summing through
/// `exchange`. The ring: rank 0 starts xtoken-collective's orchestrator on the port after the
/// rendezvous's. NCCL: rank 0 makes the communicator's unique id and the session carries it to
/// every process (a rank 0 that cannot load NCCL ends every rank, naming where it looked).
/// Returns the session and the node as [`crate::cluster::run_workers`] takes it.
pub fn join_as_node(
    placement: &Placement,
    plan: Plan,
    timeouts: Timeouts,
    exchange: ExchangeKind,
) -> Result<(Session, Nodes)> {
    if placement.rank == 0 && exchange == ExchangeKind::Ring {
        start_orchestrator(placement.port + 1)?;
    }
    let session = Session::join(placement, plan, timeouts)?;
    let nccl = match exchange {
        ExchangeKind::Ring => None,
        ExchangeKind::Nccl => Some(share_nccl_id(&session)?),
    };
    let nodes = Nodes {
        rank: placement.rank,
        count: placement.world,
        orchestrator: format!("ws://{}:{}", placement.master, placement.port + 1),
        host: session.host.clone(),
        logs: session.exchange_logs(plan.workers),
        nccl,
    };
    Ok((session, nodes))
}

/// NCCL's unique id, made on rank 0 and carried to this process by the session.
pub fn share_nccl_id(session: &Session) -> Result<UniqueId> {
    let make = || {
        UniqueId::new()
            .map(|id| id.to_hex())
            .map_err(|e| Error::Parallel(format!("rank 0: {e}")))
    };
    let text = session.share("nccl-id", make)?;
    UniqueId::from_hex(&text).ok_or_else(|| {
        Error::Parallel(format!(
            "the NCCL id rank 0 sent is not 256 hex digits: {text:?}"
        ))
    })
}

/// A port of this machine free now whose next port is free too (a rendezvous and its
/// orchestrator), for runs of several processes on one machine.
pub fn free_port_pair() -> Result<u16> {
    for _ in 0..100 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if port < u16::MAX && std::net::TcpListener::bind(("0.0.0.0", port + 1)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Parallel(
        "no two free ports in a row on this machine".into(),
    ))
}

/// Refuses: this build has no xtoken-collective.
#[cfg(not(feature = "collective"))]
pub fn start_orchestrator(port: u16) -> Result<()> {
    Err(Error::Parallel(format!(
        "port {port}: xtoken-collective's orchestrator needs an xtoken built with `--features \
         collective`"
    )))
}

/// Starts xtoken-collective's global orchestrator on `port` of this machine (rank 0), on a thread
/// of its own that lives as long as the process.
#[cfg(feature = "collective")]
pub fn start_orchestrator(port: u16) -> Result<()> {
    // The port is checked first: the server reports a port in use only on its own thread.
    std::net::TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        Error::Parallel(format!(
            "rank 0 cannot listen on port {port} (MASTER_PORT + 1, xtoken-collective's \
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
            let served = runtime.block_on(xtoken_collective::serve_global_orchestrator(
                port,
                std::future::pending(),
            ));
            if let Err(e) = served {
                tracing::error!("xtoken-collective's orchestrator on port {port} stopped: {e}");
            }
        })?;
    Ok(())
}
