//! Data parallelism (feature `collective`): one worker thread per device, in one process or in
//! several ([`Nodes`]: one per process, on one machine or many). A worker takes rows `rank,
//! rank + workers, …` of every global batch; after its micro-batches it sums its gradients
//! (student and learnable W, each micro-batch's loss already weighted by its share of the whole
//! step) and its metric sums with the others, so every worker applies the same update and the
//! parameters stay identical. Before the backward passes the workers also sum a few numbers:
//! the step's counts, and its loss values when dynamic scaling or adaptive α is measured once
//! per step. Rank 0 writes metrics, checkpoints and the final student; at the end the workers
//! compare parameter fingerprints.
//!
//! **One exchange, two implementations** ([`Link`], chosen by `parallel.exchange`):
//! - the ring: xtoken-collective (burn-collective 0.21 with its between-node all-reduce fixed),
//!   a tree over one process's devices and a ring over TCP between processes, on any backend;
//!   tensors travel in pieces of at most [`PIECE`] values (burn's WebSocket transport refuses
//!   frames over 512 MiB);
//! - NCCL, on CUDA: one communicator member per GPU worker ([`Communicator`]), global rank =
//!   process × workers + worker, its unique id made by rank 0 and carried to the other
//!   processes by the [`crate::cluster::Session`]; each sum runs on a stream of its own and is
//!   awaited polling NCCL's asynchronous errors and the session's abort.
//!
//! Either way the gradients travel in buckets ([`super::buckets`]) of `parallel.bucket_mb`, in
//! the order the backward produces them.
//!
//! Not here, and why: burn's NCCL DDP (`DistributedBackend`, burn feature `distributed`). It
//! all-reduces marked parameters inside every `backward()` call, so here once per micro-batch
//! and per recomputed layer instead of once per step; the feature also takes `AutodiffBackend`
//! away from ndarray. cubecl-cuda's own NCCL communicators make their unique id inside one
//! process, so they cannot span processes.

use std::sync::Arc;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::nccl::{Communicator, NcclBackend, UniqueId};

pub use super::buckets::{Exchange, Summed};
use super::exchanges::ExchangeLog;
use crate::config::ExchangeKind;
use crate::error::{Error, Result};

/// Whether this build runs data-parallel workers (feature `collective`).
pub const DATA_PARALLEL: bool = cfg!(feature = "collective");

/// The most values one all-reduce of the ring carries (256 MiB of f32).
pub const PIECE: usize = 1 << 26;

/// How often a worker waiting on NCCL polls its errors and the session.
const NCCL_POLL: std::time::Duration = std::time::Duration::from_micros(200);

/// The processes of a run of several, each one node of the exchange.
#[derive(Debug, Clone)]
pub struct Nodes {
    /// This process's rank.
    pub rank: usize,
    /// Processes in the run.
    pub count: usize,
    /// xtoken-collective's orchestrator, `ws://HOST:PORT` (the ring).
    pub orchestrator: String,
    /// The host the other processes reach this one at.
    pub host: String,
    /// One per worker of this process ([`crate::cluster::Session::exchange_logs`]), so that rank
    /// 0 can name the ranks that stay behind; empty: unwatched.
    pub logs: Vec<ExchangeLog>,
    /// The NCCL communicator's id, which rank 0 made and the session carried here (NCCL).
    pub nccl: Option<UniqueId>,
}

/// How a run's workers sum: the exchange and its bucket size.
#[derive(Debug, Clone, Copy)]
pub struct ExchangeSettings {
    /// NCCL or the ring.
    pub kind: ExchangeKind,
    /// Bytes of gradients per all-reduce (`parallel.bucket_mb`).
    pub bucket_bytes: usize,
}

impl Default for ExchangeSettings {
    /// The ring, in PyTorch DDP's 25 MB buckets.
    fn default() -> Self {
        Self {
            kind: ExchangeKind::Ring,
            bucket_bytes: 25_000_000,
        }
    }
}

/// How one worker reaches the others: the exchange interface's two implementations.
#[derive(Debug, Clone)]
pub enum Link {
    /// Its xtoken-collective peer (the ring).
    #[cfg(feature = "collective")]
    Ring(xtoken_collective::PeerId),
    /// Its member of the NCCL communicator.
    Nccl(Arc<Communicator>),
}

/// This worker among the data-parallel workers of the run.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Global rank; rank 0 writes metrics, checkpoints and the final student.
    pub rank: usize,
    /// Workers in the run.
    pub count: usize,
    /// How it reaches the others; `None`: alone.
    pub link: Option<Link>,
    /// Where it notes the all-reduces it enters, in a run of several processes.
    pub log: Option<ExchangeLog>,
    /// Bytes of gradients per all-reduce.
    pub bucket_bytes: usize,
    /// Set when another worker of this process fails: a wait on NCCL ends on it.
    pub halt: Arc<Halt>,
}

/// The first failure among the workers of one process, which ends the others' waits on NCCL
/// (a sum a failed worker never joins would otherwise wait forever).
#[derive(Debug, Default)]
pub struct Halt(std::sync::Mutex<Option<String>>);

impl Halt {
    /// Notes why the workers stop (the first reason is kept).
    pub fn stop(&self, why: String) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(why);
    }

    /// Why they stop, once a worker failed.
    pub fn stopped(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Worker {
    /// The only worker of a single-device run.
    pub fn alone() -> Self {
        Worker {
            rank: 0,
            count: 1,
            link: None,
            log: None,
            bucket_bytes: ExchangeSettings::default().bucket_bytes,
            halt: Arc::default(),
        }
    }

    /// Whether this worker writes the run's outputs.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    /// Notes an all-reduce about to start (see [`crate::cluster::ExchangeLog`]).
    fn entering(&self) {
        if let Some(log) = &self.log {
            log.entered();
        }
    }

    /// Starts the sum of one flat tensor over the workers: the ring sums it at once, NCCL
    /// enqueues it (read it after [`Worker::settle`]).
    fn start<B: Backend + NcclBackend>(
        &self,
        link: &Link,
        flat: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>> {
        match link {
            #[cfg(feature = "collective")]
            Link::Ring(peer) => ring::reduce(*peer, flat, self.count)
                .map_err(|e| Error::Parallel(format!("all-reduce failed: {e}"))),
            Link::Nccl(comm) => {
                let primitive = flat.into_primitive().tensor();
                let summed = B::nccl_enqueue_sum(primitive, comm)
                    .map_err(|e| Error::Parallel(e.to_string()))?;
                Ok(Tensor::from_primitive(TensorPrimitive::Float(summed)))
            }
        }
    }

    /// Waits for every sum [`Worker::start`] began (NCCL), ending early, with the
    /// communicator aborted, when the session stops the run.
    fn settle(&self, link: &Link) -> Result<()> {
        match link {
            #[cfg(feature = "collective")]
            Link::Ring(_) => Ok(()),
            Link::Nccl(comm) => {
                let (log, halt) = (self.log.clone(), self.halt.clone());
                let stop = move || {
                    let session = log.as_ref().and_then(ExchangeLog::stopped);
                    session.or_else(|| halt.stopped())
                };
                comm.wait(NCCL_POLL, &stop)
                    .map_err(|e| Error::Parallel(e.to_string()))
            }
        }
    }

    /// Sums a few values over the workers (alone: returns them).
    pub fn sum_values<B: AutodiffBackend>(
        &self,
        values: Vec<f64>,
        device: &B::Device,
    ) -> Result<Vec<f64>>
    where
        B::InnerBackend: NcclBackend,
    {
        let Some(link) = &self.link else {
            return Ok(values);
        };
        self.entering();
        let count = values.len();
        let tensor = Tensor::<B::InnerBackend, 1>::from_data(
            TensorData::new(values, [count]).convert::<f32>(),
            device,
        );
        let sums = self.start(link, tensor)?;
        self.settle(link)?;
        sums.into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .map_err(|e| Error::Parallel(format!("reading the step's values: {e:?}")))
    }

    /// Sums a flat tensor over the workers, as [`Worker::sum`] sums a step's gradients; alone:
    /// returns it.
    pub fn sum_flat<B: Backend + NcclBackend>(&self, flat: Tensor<B, 1>) -> Result<Tensor<B, 1>> {
        let Some(link) = &self.link else {
            return Ok(flat);
        };
        self.entering();
        let summed = self.start(link, flat)?;
        self.settle(link)?;
        Ok(summed)
    }

    /// Sums a step's gradients and values over the workers, in buckets of
    /// [`Worker::bucket_bytes`] sent as they are gathered.
    pub fn sum<B: AutodiffBackend>(
        &self,
        exchange: Exchange<'_, B>,
        device: &B::Device,
    ) -> Result<Summed>
    where
        B::InnerBackend: NcclBackend,
    {
        let Some(link) = &self.link else {
            return Ok(Summed {
                student_grads: exchange.student_grads,
                projection_grads: exchange
                    .projections
                    .into_iter()
                    .map(|p| p.map(|(_, g)| g))
                    .collect(),
                values: exchange.values,
            });
        };
        self.entering();
        let mut reduce = |bucket| self.start(link, bucket);
        let mut settle = || self.settle(link);
        super::buckets::all_reduce(
            exchange,
            self.bucket_bytes,
            device,
            &mut reduce,
            &mut settle,
        )
        .map_err(|e| match e {
            Error::Parallel(m) => Error::Parallel(format!("all-reduce of the gradients: {m}")),
            other => other,
        })
    }
}

/// A hash of every parameter's bytes: data-parallel workers must end with equal ones.
pub fn fingerprint<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> u64 {
    use std::hash::Hasher;
    struct Hash(std::collections::hash_map::DefaultHasher);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Hash {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.write(&param.val().into_data().bytes);
        }
    }
    let mut hash = Hash(std::collections::hash_map::DefaultHasher::new());
    module.visit(&mut hash);
    hash.0.finish()
}

/// The ring: sums over xtoken-collective.
#[cfg(feature = "collective")]
mod ring {
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorPrimitive};
    use xtoken_collective::{self as collective, PeerId, ReduceOperation};

    use super::PIECE;

    /// Sums a flat tensor over every worker, in pieces of at most [`PIECE`] values; padded to
    /// one value per worker at least (the ring between processes cuts it into that many).
    pub(super) fn reduce<B: Backend>(
        peer: PeerId,
        flat: Tensor<B, 1>,
        workers: usize,
    ) -> std::result::Result<Tensor<B, 1>, String> {
        let total = flat.dims()[0];
        let padded = match total < workers {
            true => {
                let zeros =
                    Tensor::<B, 1>::zeros([workers - total], &flat.device()).cast(flat.dtype());
                Tensor::cat(vec![flat, zeros], 0)
            }
            false => flat,
        };
        let length = padded.dims()[0];
        let mut pieces = Vec::with_capacity(length.div_ceil(PIECE));
        for start in (0..length).step_by(PIECE) {
            let piece = padded.clone().narrow(0, start, PIECE.min(length - start));
            let reduced = collective::all_reduce::<B>(
                peer,
                piece.into_primitive().tensor(),
                ReduceOperation::Sum,
            )
            .map_err(|e| format!("{e:?}"))?;
            pieces.push(Tensor::from_primitive(TensorPrimitive::Float(reduced)));
        }
        let summed = match pieces.len() {
            1 => pieces.remove(0),
            _ => Tensor::cat(pieces, 0),
        };
        Ok(match length == total {
            true => summed,
            false => summed.narrow(0, 0, total),
        })
    }
}
