//! Data parallelism (feature `collective`): one worker thread per device, each a
//! xtoken-collective peer, in one process or in several ([`Nodes`]: one xtoken-collective node per
//! process, on one machine or many). A worker takes rows `rank, rank + workers, …` of
//! every global batch; after its micro-batches it sums its gradients (student and learnable W,
//! each micro-batch's loss already weighted by its share of the whole step) and its metric sums
//! with the others in one `xtoken_collective::all_reduce` of a flat tensor (a tree over the
//! devices, then a ring over the processes), so every worker applies the same update and the
//! parameters stay identical. Before the backward passes the workers also sum a few numbers:
//! the step's counts, and its loss values when dynamic scaling or adaptive α is measured once
//! per step. Rank 0 writes metrics, checkpoints and the final student; at the end the workers
//! compare parameter fingerprints.
//!
//! Between processes the flat tensor travels in pieces of at most [`PIECE`] values: burn's
//! WebSocket transport refuses frames over 512 MiB. The collective is xtoken-collective:
//! burn-collective 0.21, whose between-node all-reduce as published hangs at a session's second
//! exchange, with that fixed.
//!
//! Not here, and why:
//! - NCCL DDP (`DistributedBackend`, burn feature `distributed`). It all-reduces marked
//!   parameters inside every `backward()` call, so here once per micro-batch and per
//!   recomputed layer instead of once per step; the feature also takes `AutodiffBackend` away
//!   from ndarray, so it could not be tested on a CPU.
//! - NCCL between processes. cubecl-cuda's NCCL communicators are made from a unique id created
//!   inside one process, with ranks from the device indices of that process, so they cannot
//!   span processes; xtoken would need its own communicator (the unique id sent through the
//!   [`crate::cluster::Session`]) over the buffers of the flat tensor. Not built yet: it can
//!   only be checked on a GPU.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_models::Transformer;

use super::exchanges::ExchangeLog;
use crate::error::Result;

/// Whether this build runs data-parallel workers (feature `collective`).
pub const DATA_PARALLEL: bool = cfg!(feature = "collective");

/// The most values one all-reduce carries (256 MiB of f32).
pub const PIECE: usize = 1 << 26;

/// The processes of a run of several, each one xtoken-collective node.
#[derive(Debug, Clone)]
pub struct Nodes {
    /// This process's rank.
    pub rank: usize,
    /// Processes in the run.
    pub count: usize,
    /// xtoken-collective's orchestrator, `ws://HOST:PORT`.
    pub orchestrator: String,
    /// The host the other processes reach this one at.
    pub host: String,
    /// One per worker of this process ([`crate::cluster::Session::exchange_logs`]), so that rank
    /// 0 can name the ranks that stay behind; empty: unwatched.
    pub logs: Vec<ExchangeLog>,
}

/// This worker among the data-parallel workers of the run.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Global rank; rank 0 writes metrics, checkpoints and the final student.
    pub rank: usize,
    /// Workers in the run.
    pub count: usize,
    /// Its xtoken-collective peer when there are several workers.
    #[cfg(feature = "collective")]
    pub peer: Option<xtoken_collective::PeerId>,
    /// Where it notes the all-reduces it enters, in a run of several processes.
    pub log: Option<ExchangeLog>,
}

/// What the workers sum after each step: the student's gradients, each learnable W's, and the
/// step's metric sums.
pub struct Exchange<'a, B: AutodiffBackend> {
    /// Gives the parameters' order, the same on every worker.
    pub student: &'a Transformer<B>,
    /// The student's gradients, summed over this worker's micro-batches.
    pub student_grads: GradientsParams,
    /// Per teacher: its learnable W and W's gradients.
    pub projections: Vec<Option<(&'a LearnableProjection<B>, GradientsParams)>>,
    /// The step's metric sums.
    pub values: Vec<f64>,
}

/// The summed result of an [`Exchange`].
pub struct Summed {
    /// The student's gradients.
    pub student_grads: GradientsParams,
    /// Per teacher, W's gradients.
    pub projection_grads: Vec<Option<GradientsParams>>,
    /// The metric sums.
    pub values: Vec<f64>,
}

impl Worker {
    /// The only worker of a single-device run.
    pub fn alone() -> Self {
        Worker {
            rank: 0,
            count: 1,
            #[cfg(feature = "collective")]
            peer: None,
            log: None,
        }
    }

    /// Notes an all-reduce about to start (see [`crate::cluster::ExchangeLog`]).
    #[cfg(feature = "collective")]
    fn entering(&self) {
        if let Some(log) = &self.log {
            log.entered();
        }
    }

    /// Sums a few values over the workers (alone: returns them).
    pub fn sum_values<B: AutodiffBackend>(
        &self,
        values: Vec<f64>,
        device: &B::Device,
    ) -> Result<Vec<f64>> {
        #[cfg(feature = "collective")]
        if let Some(peer) = self.peer {
            self.entering();
            return collective::sum_values::<B>(peer, values, self.count, device);
        }
        let _ = device;
        Ok(values)
    }

    /// Whether this worker writes the run's outputs.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    /// Sums a flat tensor over the workers, as [`Worker::sum`] sums a step's gradients (in
    /// pieces of at most [`PIECE`] values); alone: returns it.
    pub fn sum_flat<B: burn::tensor::backend::Backend>(
        &self,
        flat: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>> {
        #[cfg(feature = "collective")]
        if let Some(peer) = self.peer {
            self.entering();
            return collective::reduce(peer, flat)
                .map_err(|e| crate::error::Error::Parallel(format!("all-reduce failed: {e}")));
        }
        Ok(flat)
    }

    /// Sums a step's gradients and values over the workers (one all-reduce of everything).
    pub fn sum<B: AutodiffBackend>(
        &self,
        exchange: Exchange<'_, B>,
        device: &B::Device,
    ) -> Result<Summed> {
        #[cfg(feature = "collective")]
        if let Some(peer) = self.peer {
            self.entering();
            return collective::all_reduce(peer, exchange, device);
        }
        let _ = device;
        Ok(Summed {
            student_grads: exchange.student_grads,
            projection_grads: exchange
                .projections
                .into_iter()
                .map(|p| p.map(|(_, g)| g))
                .collect(),
            values: exchange.values,
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

/// Runs `work` on one thread per device, each a worker of one data-parallel run (with `nodes`,
/// of a run over several processes, each running as many workers), and returns their results
/// in rank order; the first error (or panic) of any worker is the result.
#[cfg(feature = "collective")]
pub fn run_workers<B, T, F>(
    devices: Vec<B::Device>,
    nodes: Option<&Nodes>,
    work: F,
) -> Result<Vec<T>>
where
    B: AutodiffBackend,
    T: Send,
    F: Fn(Worker, B::Device) -> Result<T> + Sync,
{
    collective::run_workers::<B, T, F>(devices, nodes, work)
}

/// Refuses: this build has no data-parallel support.
#[cfg(not(feature = "collective"))]
pub fn run_workers<B, T, F>(
    devices: Vec<B::Device>,
    _nodes: Option<&Nodes>,
    _work: F,
) -> Result<Vec<T>>
where
    B: AutodiffBackend,
    T: Send,
    F: Fn(Worker, B::Device) -> Result<T> + Sync,
{
    Err(crate::error::Error::Parallel(format!(
        "{} devices: data-parallel training needs an xtoken built with `--features collective`",
        devices.len()
    )))
}

#[cfg(feature = "collective")]
mod collective {
    use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
    use xtoken_collective::{
        self as collective, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation,
    };
    use xtoken_core::loss::pkl::LearnableProjection;

    use super::{Exchange, ExchangeLog, Nodes, Summed, Worker, PIECE};
    use crate::error::{Error, Result};

    /// Where each gradient sits in the flat exchange tensor: its parameter, shape and dtype.
    type Layout = Vec<(ParamId, Vec<usize>, DType)>;

    /// Moves every gradient of `module` out of `grads` as flat f32 pieces, in visit order.
    fn flatten<B: AutodiffBackend, M: AutodiffModule<B>>(
        module: &M,
        grads: &mut GradientsParams,
        pieces: &mut Vec<Tensor<B::InnerBackend, 1>>,
    ) -> Layout {
        struct Take<'a, B: AutodiffBackend> {
            grads: &'a mut GradientsParams,
            pieces: &'a mut Vec<Tensor<B::InnerBackend, 1>>,
            layout: Layout,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Take<'_, B> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                    let dims = g.dims().to_vec();
                    self.layout.push((param.id, dims.clone(), g.dtype()));
                    let count = dims.iter().product::<usize>();
                    self.pieces.push(g.cast(DType::F32).reshape([count]));
                }
            }
        }
        let mut visitor = Take::<B> {
            grads,
            pieces,
            layout: Vec::new(),
        };
        module.visit(&mut visitor);
        visitor.layout
    }

    /// The inverse of [`flatten`]: cuts the reduced flat tensor back into `module`'s gradients.
    fn unflatten<B: AutodiffBackend, M: AutodiffModule<B>>(
        module: &M,
        flat: &Tensor<B::InnerBackend, 1>,
        offset: &mut usize,
        layout: Layout,
    ) -> GradientsParams {
        struct Put<'a, B: AutodiffBackend> {
            flat: &'a Tensor<B::InnerBackend, 1>,
            offset: &'a mut usize,
            layout: std::iter::Peekable<std::vec::IntoIter<(ParamId, Vec<usize>, DType)>>,
            grads: GradientsParams,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Put<'_, B> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if self.layout.peek().map(|l| l.0) != Some(param.id) {
                    return;
                }
                let Some((_, dims, dtype)) = self.layout.next() else {
                    return;
                };
                let count = dims.iter().product::<usize>();
                let Ok(shape) = <[usize; D]>::try_from(dims) else {
                    return;
                };
                let piece = self
                    .flat
                    .clone()
                    .narrow(0, *self.offset, count)
                    .reshape(shape)
                    .cast(dtype);
                *self.offset += count;
                self.grads.register(param.id, piece);
            }
        }
        let mut visitor = Put::<B> {
            flat,
            offset,
            layout: layout.into_iter().peekable(),
            grads: GradientsParams::new(),
        };
        module.visit(&mut visitor);
        visitor.grads
    }

    /// Sums values over every worker (f64 travels as f32). Padded to one value per worker at
    /// least: the ring between processes cuts the tensor into that many pieces.
    pub(super) fn sum_values<B: AutodiffBackend>(
        peer: PeerId,
        mut values: Vec<f64>,
        workers: usize,
        device: &B::Device,
    ) -> Result<Vec<f64>> {
        let count = values.len();
        values.resize(count.max(workers), 0.0);
        let padded = values.len();
        let tensor =
            Tensor::<B::InnerBackend, 1>::from_data(TensorData::new(values, [padded]), device);
        let mut sums = reduce(peer, tensor)
            .map_err(|e| Error::Parallel(format!("all-reduce of the step's values failed: {e}")))?
            .into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .map_err(|e| Error::Parallel(format!("reading the step's values: {e:?}")))?;
        sums.truncate(count);
        Ok(sums)
    }

    /// Sums a flat tensor over every worker, in pieces of at most [`PIECE`] values.
    pub(super) fn reduce<B: burn::tensor::backend::Backend>(
        peer: PeerId,
        flat: Tensor<B, 1>,
    ) -> std::result::Result<Tensor<B, 1>, String> {
        let total = flat.dims()[0];
        let mut pieces = Vec::with_capacity(total.div_ceil(PIECE));
        for start in (0..total).step_by(PIECE) {
            let piece = flat.clone().narrow(0, start, PIECE.min(total - start));
            let reduced = collective::all_reduce::<B>(
                peer,
                piece.into_primitive().tensor(),
                ReduceOperation::Sum,
            )
            .map_err(|e| format!("{e:?}"))?;
            pieces.push(Tensor::from_primitive(TensorPrimitive::Float(reduced)));
        }
        Ok(match pieces.len() {
            1 => pieces.remove(0),
            _ => Tensor::cat(pieces, 0),
        })
    }

    /// Sums a step's gradients and metric values over every worker with one all-reduce of a
    /// single flat tensor (one exchange per step, like DDP's gradient buckets).
    pub(super) fn all_reduce<B: AutodiffBackend>(
        peer: PeerId,
        exchange: Exchange<'_, B>,
        device: &B::Device,
    ) -> Result<Summed> {
        let Exchange {
            student,
            mut student_grads,
            projections,
            values,
        } = exchange;
        let modules: Vec<Option<&LearnableProjection<B>>> = projections
            .iter()
            .map(|p| p.as_ref().map(|(w, _)| *w))
            .collect();
        let mut pieces = Vec::new();
        let student_layout = flatten(student, &mut student_grads, &mut pieces);
        let projection_layouts: Vec<Option<Layout>> = projections
            .into_iter()
            .map(|p| p.map(|(w, mut g)| (w, flatten(w, &mut g, &mut pieces))))
            .map(|p| p.map(|(_, layout)| layout))
            .collect();
        let value_count = values.len();
        pieces.push(Tensor::from_data(
            TensorData::new(values, [value_count]),
            device,
        ));
        let flat = reduce(peer, Tensor::cat(pieces, 0))
            .map_err(|e| Error::Parallel(format!("all-reduce of the gradients failed: {e}")))?;
        let mut offset = 0usize;
        let student_grads = unflatten(student, &flat, &mut offset, student_layout);
        let projection_grads = modules
            .iter()
            .zip(projection_layouts)
            .map(|(w, layout)| match (w, layout) {
                (Some(w), Some(layout)) => Some(unflatten(*w, &flat, &mut offset, layout)),
                _ => None,
            })
            .collect();
        let total = flat.dims()[0];
        let values = flat
            .narrow(0, offset, total - offset)
            .into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .map_err(|e| Error::Parallel(format!("reading the reduced metrics: {e:?}")))?;
        Ok(Summed {
            student_grads,
            projection_grads,
            values,
        })
    }

    /// The error that ends a run of workers: the first one raised, not the errors it causes in
    /// the others (an operation of the collective ended because a peer left).
    type FirstError = std::sync::Mutex<Option<Error>>;

    /// Keeps `e` if it is the run's first error.
    fn note(first: &FirstError, e: Error) {
        let mut slot = first.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }

    /// One worker thread: joins the collective, works, and leaves it even after an error or a
    /// panic, so that the collective ends the operations the others wait on instead of leaving
    /// them hanging. An error is noted in `first` before the worker leaves: the cause comes
    /// before the errors it causes. `None` when this worker failed.
    fn worker<B, T, F>(
        (rank, count, log): (usize, usize, Option<ExchangeLog>),
        device: B::Device,
        config: CollectiveConfig,
        (work, first): (&F, &FirstError),
    ) -> Option<T>
    where
        B: AutodiffBackend,
        F: Fn(Worker, B::Device) -> Result<T>,
    {
        let peer = PeerId::from(rank);
        if let Err(e) = collective::register::<B::InnerBackend>(peer, device.clone(), config) {
            let e = Error::Parallel(format!("worker {rank}: joining the collective: {e:?}"));
            note(first, e);
            return None;
        }
        let worker = Worker {
            rank,
            count,
            peer: Some(peer),
            log,
        };
        let run = std::panic::AssertUnwindSafe(|| work(worker, device));
        let value = match std::panic::catch_unwind(run) {
            Ok(Ok(value)) => Some(value),
            Ok(Err(e)) => {
                let context = format!("worker {rank}");
                let source = Box::new(e);
                note(first, Error::Context { context, source });
                None
            }
            Err(panic) => {
                let text = xtoken_kernels::device::panic_text(&*panic)
                    .unwrap_or("a panic without a message");
                note(
                    first,
                    Error::Parallel(format!("worker {rank} panicked: {text}")),
                );
                None
            }
        };
        if let Err(e) = collective::finish_collective::<B::InnerBackend>(peer) {
            let e = Error::Parallel(format!("worker {rank}: leaving the collective: {e:?}"));
            note(first, e);
            return None;
        }
        value
    }

    /// The collective's settings: a tree over this process's devices and, with `nodes`, a ring
    /// over the processes, this one's data service on a free port.
    fn settings(local: usize, nodes: Option<&Nodes>) -> Result<CollectiveConfig> {
        let config = CollectiveConfig::default()
            .with_num_devices(local)
            .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
        let Some(nodes) = nodes else {
            return Ok(config);
        };
        // A port the system hands out now; xtoken-collective binds it again when the workers join.
        let port = std::net::TcpListener::bind(("0.0.0.0", 0))?
            .local_addr()?
            .port();
        let address = |text: String| {
            text.parse()
                .map_err(|e| Error::Parallel(format!("xtoken-collective address {text}: {e:?}")))
        };
        Ok(config
            .with_num_nodes(nodes.count as u32)
            .with_global_address(address(nodes.orchestrator.clone())?)
            .with_node_address(address(format!("ws://{}:{port}", nodes.host))?)
            .with_data_service_port(port)
            .with_global_all_reduce_strategy(AllReduceStrategy::Ring))
    }

    pub(super) fn run_workers<B, T, F>(
        devices: Vec<B::Device>,
        nodes: Option<&Nodes>,
        work: F,
    ) -> Result<Vec<T>>
    where
        B: AutodiffBackend,
        T: Send,
        F: Fn(Worker, B::Device) -> Result<T> + Sync,
    {
        let local = devices.len();
        let config = settings(local, nodes)?;
        let (start, count) = nodes.map_or((0, local), |n| (n.rank * local, n.count * local));
        let first = FirstError::default();
        std::thread::scope(|scope| {
            let mut handles = Vec::with_capacity(local);
            for (i, device) in devices.into_iter().enumerate() {
                let (config, jobs, rank) = (config.clone(), (&work, &first), start + i);
                let log = nodes.and_then(|n| n.logs.get(i).cloned());
                let handle = std::thread::Builder::new()
                    .name(format!("xtoken-worker-{rank}"))
                    .spawn_scoped(scope, move || {
                        worker::<B, T, F>((rank, count, log), device, config, jobs)
                    })?;
                handles.push(handle);
            }
            let results: Vec<Option<T>> = handles
                .into_iter()
                .map(|handle| handle.join().ok().flatten())
                .collect();
            if let Some(e) = first.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return Err(e);
            }
            results
                .into_iter()
                .collect::<Option<Vec<T>>>()
                .ok_or_else(|| Error::Parallel("a worker thread ended without a result".into()))
        })
    }
}
