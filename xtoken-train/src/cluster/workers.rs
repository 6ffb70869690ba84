//! The worker threads of a data-parallel run (feature `collective`): one per device, each joined
//! to the exchange the settings name (xtoken-collective's ring, or a member of the NCCL
//! communicator), run, and taken out of it again even after an error or a panic, so that the
//! others' operations end instead of hanging. The first error is the run's.

use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use xtoken_collective::{self as collective, AllReduceStrategy, CollectiveConfig, PeerId};
use xtoken_kernels::nccl::{Communicator, UniqueId};

use super::exchanges::ExchangeLog;
use super::parallel::{ExchangeSettings, Halt, Link, Nodes, Worker};
use crate::config::ExchangeKind;
use crate::error::{Error, Result};

/// The error that ends a run of workers: the first one raised, not the errors it causes in
/// the others (an operation of the collective ended because a peer left).
type FirstError = std::sync::Mutex<Option<Error>>;

/// Keeps `e` if it is the run's first error.
fn note(first: &FirstError, e: Error) {
    let mut slot = first.lock().unwrap_or_else(|p| p.into_inner());
    slot.get_or_insert(e);
}

/// How a worker joins the exchange.
#[derive(Clone)]
enum Join {
    Ring(CollectiveConfig),
    /// NCCL: the communicator's id, and the device index of each of this process's workers.
    Nccl(UniqueId, Arc<Vec<usize>>),
}

/// Where a worker stands: its global rank, the workers in all, this process's worker index.
type Place = (usize, usize, usize);

/// Joins this worker to the exchange; the link and how to leave it.
fn join<B: AutodiffBackend>(
    (rank, count, local): Place,
    device: &B::Device,
    how: &Join,
) -> Result<Link> {
    match how {
        Join::Ring(config) => {
            let peer = PeerId::from(rank);
            collective::register::<B::InnerBackend>(peer, device.clone(), config.clone()).map_err(
                |e| Error::Parallel(format!("worker {rank}: joining the collective: {e:?}")),
            )?;
            Ok(Link::Ring(peer))
        }
        Join::Nccl(id, indices) => {
            let index = indices.get(local).copied().unwrap_or(local);
            let comm = Communicator::init(index, rank, count, id)
                .map_err(|e| Error::Parallel(format!("worker {rank}: joining NCCL: {e}")))?;
            Ok(Link::Nccl(Arc::new(comm)))
        }
    }
}

/// Takes the worker out of the exchange (the ring's peer leaves; a communicator is destroyed
/// when its last reference goes).
fn leave<B: AutodiffBackend>(rank: usize, link: &Link) -> Result<()> {
    match link {
        Link::Ring(peer) => collective::finish_collective::<B::InnerBackend>(*peer)
            .map_err(|e| Error::Parallel(format!("worker {rank}: leaving the collective: {e:?}"))),
        Link::Nccl(_) => Ok(()),
    }
}

/// One worker thread: joins, works, and leaves even after an error or a panic. An error is
/// noted in `first` before the worker leaves: the cause comes before the errors it causes.
/// `None` when this worker failed.
fn worker<B, T, F>(
    place: Place,
    (device, log, bucket_bytes): (B::Device, Option<ExchangeLog>, usize),
    halt: &Arc<Halt>,
    how: &Join,
    (work, first): (&F, &FirstError),
) -> Option<T>
where
    B: AutodiffBackend,
    F: Fn(Worker, B::Device) -> Result<T>,
{
    let (rank, count, _) = place;
    let link = match join::<B>(place, &device, how) {
        Ok(link) => link,
        Err(e) => {
            note(first, e);
            return None;
        }
    };
    let worker = Worker {
        rank,
        count,
        link: Some(link.clone()),
        log,
        bucket_bytes,
        halt: halt.clone(),
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
            let text =
                xtoken_kernels::device::panic_text(&*panic).unwrap_or("a panic without a message");
            let e = Error::Parallel(format!("worker {rank} panicked: {text}"));
            note(first, e);
            None
        }
    };
    if value.is_none() {
        // The others may wait in a sum this worker will not join.
        halt.stop(format!("worker {rank} failed"));
        if let Link::Nccl(comm) = &link {
            comm.abort();
        }
    }
    if let Err(e) = leave::<B>(rank, &link) {
        note(first, e);
        return None;
    }
    value
}

/// The ring's settings: a tree over this process's devices and, with `nodes`, a ring over the
/// processes, this one's data service on a free port.
fn ring_settings(local: usize, nodes: Option<&Nodes>) -> Result<CollectiveConfig> {
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

/// How this process's workers join: the ring's settings, or NCCL's id (rank 0's, carried by
/// the session; a process alone makes its own) and each worker's device index.
fn joining<B: AutodiffBackend>(
    devices: &[B::Device],
    nodes: Option<&Nodes>,
    kind: ExchangeKind,
) -> Result<Join> {
    if kind == ExchangeKind::Ring {
        return Ok(Join::Ring(ring_settings(devices.len(), nodes)?));
    }
    let id = match nodes {
        Some(nodes) => nodes.nccl.ok_or_else(|| {
            Error::Parallel("NCCL: the session carried no communicator id from rank 0".into())
        })?,
        None => UniqueId::new().map_err(|e| Error::Parallel(e.to_string()))?,
    };
    let indices: Vec<usize> = devices.iter().map(device_index::<B>).collect();
    xtoken_kernels::nccl::check_devices(&indices).map_err(|e| Error::Parallel(e.to_string()))?;
    Ok(Join::Nccl(id, Arc::new(indices)))
}

/// A device's index among its kind (burn's device id).
fn device_index<B: AutodiffBackend>(device: &B::Device) -> usize {
    use burn::tensor::backend::DeviceOps;
    device.id().index_id as usize
}

/// Runs `work` on one thread per device, each a worker of one data-parallel run (with `nodes`,
/// of a run over several processes, each running as many workers) that sums as `settings`
/// says, and returns their results in rank order; the first error (or panic) of any worker is
/// the result. NCCL with one device runs its one worker through a communicator of one.
#[cfg(feature = "collective")]
pub fn run_workers<B, T, F>(
    devices: Vec<B::Device>,
    nodes: Option<&Nodes>,
    settings: ExchangeSettings,
    work: F,
) -> Result<Vec<T>>
where
    B: AutodiffBackend,
    T: Send,
    F: Fn(Worker, B::Device) -> Result<T> + Sync,
{
    let local = devices.len();
    let how = joining::<B>(&devices, nodes, settings.kind)?;
    let (start, count) = nodes.map_or((0, local), |n| (n.rank * local, n.count * local));
    let first = FirstError::default();
    let halt = Arc::new(Halt::default());
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(local);
        for (i, device) in devices.into_iter().enumerate() {
            let (how, jobs, rank, halt) = (&how, (&work, &first), start + i, &halt);
            let log = nodes.and_then(|n| n.logs.get(i).cloned());
            let own = (device, log, settings.bucket_bytes);
            let handle = std::thread::Builder::new()
                .name(format!("xtoken-worker-{rank}"))
                .spawn_scoped(scope, move || {
                    worker::<B, T, F>((rank, count, i), own, halt, how, jobs)
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
