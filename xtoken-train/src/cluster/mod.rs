//! Workers and processes: the gradient exchange between data-parallel workers ([`parallel`]:
//! NCCL on CUDA or xtoken-collective's ring, in [`buckets`]), where this process sits in a run of
//! several ([`Placement`], from torchrun's or srun's variables), the session that joins the
//! processes and watches them ([`Session`]), and [`join_as_node`], which starts
//! xtoken-collective's orchestrator on rank 0, or carries NCCL's unique id from rank 0 to every
//! process.
//!
//! It stands on the ground only (`error`); the training stage runs its workers through it.

pub mod buckets;
mod exchanges;
mod join;
pub mod parallel;
mod placement;
mod session;
mod state;
#[cfg(feature = "collective")]
mod workers;

pub use exchanges::ExchangeLog;
pub use join::{free_port_pair, join_as_node, share_nccl_id, start_orchestrator};
pub use placement::{first_host, Placement};
pub use session::{Plan, Session, Timeouts};
#[cfg(feature = "collective")]
pub use workers::run_workers;

/// Refuses: this build has no data-parallel support.
#[cfg(not(feature = "collective"))]
pub fn run_workers<B, T, F>(
    devices: Vec<B::Device>,
    _nodes: Option<&parallel::Nodes>,
    _settings: parallel::ExchangeSettings,
    _work: F,
) -> crate::error::Result<Vec<T>>
where
    B: burn::tensor::backend::AutodiffBackend,
    T: Send,
    F: Fn(parallel::Worker, B::Device) -> crate::error::Result<T> + Sync,
{
    Err(crate::error::Error::Parallel(format!(
        "{} devices: data-parallel training needs an xtoken built with `--features collective`",
        devices.len()
    )))
}
