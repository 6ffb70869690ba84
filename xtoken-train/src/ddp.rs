//! Data-parallel training (feature `collective`): one worker thread per device of this machine,
//! each a burn-collective peer. A worker takes rows `rank, rank + workers, …` of every global
//! batch; after its micro-batches it averages its gradients (student and learnable W) and its
//! metric values with the others in one `burn::collective::all_reduce` of a flat tensor (a tree
//! over the devices), so every worker applies the same update and the parameters stay
//! identical. Rank 0 writes metrics, checkpoints and the final student; at the end the workers
//! compare parameter fingerprints.
//!
//! Not here, and why:
//! - Several machines. burn-collective 0.21's global (between-node) all-reduce reuses fixed
//!   transfer ids, so the second exchange of a session hangs (tracel-ai/burn#4549, reproduced
//!   here); leaving and re-joining the session after each exchange gets past it in a bare
//!   loop but crashes burn-collective's local server inside training (`SendError` in
//!   `local/client.rs`). Upstream removed the crate after 0.21.
//! - NCCL DDP (`DistributedBackend`, burn feature `distributed`). It all-reduces marked
//!   parameters inside every `backward()` call, so here once per micro-batch and per
//!   recomputed layer instead of once per step; it cannot run on CPU (the feature breaks
//!   ndarray's autodiff, trap T1), and no machine here has two GPUs to test it on. burn-
//!   collective's all-reduce runs on CUDA devices too (tensor ops plus device-to-device
//!   copies), which is what `--devices 0,1,…` uses there.

#[cfg(feature = "collective")]
pub use enabled::*;

#[cfg(not(feature = "collective"))]
mod disabled {
    use anyhow::{bail, Result};

    use crate::config::RunConfig;
    use crate::train::{RunSummary, TrainArgs};

    /// Refuses: this build has no data-parallel support.
    pub fn start(_config: RunConfig, args: TrainArgs, _device: &str) -> Result<RunSummary> {
        bail!(
            "--devices {:?}: data-parallel training needs an xtoken built with `--features collective`",
            args.workers.devices
        )
    }
}

#[cfg(not(feature = "collective"))]
pub use disabled::*;

#[cfg(feature = "collective")]
mod enabled {
    use anyhow::{anyhow, bail, Context, Result};
    use burn::collective::{self, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation};
    use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
    use xtoken_core::loss::pkl::LearnableProjection;
    use xtoken_core::loss::XTokenBackend;

    use crate::config::RunConfig;
    use crate::train::{prepare, run, Averaged, Exchange, RunSummary, TrainArgs, Worker};
    use xtoken_kernels::memory::DeviceMemory;

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

    /// Averages a step's gradients and metric values over every worker with one all-reduce of
    /// a single flat tensor (one exchange per step, like DDP's gradient buckets).
    ///
    pub fn average<B: AutodiffBackend>(
        peer: PeerId,
        exchange: Exchange<'_, B>,
        device: &B::Device,
    ) -> Result<Averaged> {
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
        let flat = Tensor::cat(pieces, 0);
        let reduced = collective::all_reduce::<B::InnerBackend>(
            peer,
            flat.into_primitive().tensor(),
            ReduceOperation::Mean,
        )
        .map_err(|e| anyhow!("all-reduce of the gradients failed: {e:?}"))?;
        let flat = Tensor::<B::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(reduced));
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
            .map_err(|e| anyhow!("reading the reduced metrics: {e:?}"))?;
        Ok(Averaged {
            student_grads,
            projection_grads,
            values,
        })
    }

    /// One worker thread: registers its peer, trains, and leaves the collective.
    fn worker<B>(
        config: RunConfig,
        args: TrainArgs,
        device: B::Device,
        rank: usize,
        count: usize,
        collective_config: CollectiveConfig,
    ) -> Result<RunSummary>
    where
        B: AutodiffBackend + XTokenBackend + DeviceMemory,
        B::InnerBackend: XTokenBackend,
    {
        let peer = PeerId::from(rank);
        collective::register::<B::InnerBackend>(peer, device.clone(), collective_config)
            .map_err(|e| anyhow!("worker {rank}: joining the collective: {e:?}"))?;
        let worker = Worker {
            rank,
            count,
            peer: Some(peer),
        };
        let result = run::<B>(config, &args, device, worker);
        // Leave the collective even after an error, so the others are not left waiting on it
        // forever by a registration that never ends.
        let finished = collective::finish_collective::<B::InnerBackend>(peer);
        let summary = result.with_context(|| format!("worker {rank}"))?;
        finished.map_err(|e| anyhow!("worker {rank}: leaving the collective: {e:?}"))?;
        Ok(summary)
    }

    fn spawn_all<B>(
        config: RunConfig,
        args: TrainArgs,
        devices: Vec<B::Device>,
    ) -> Result<RunSummary>
    where
        B: AutodiffBackend + XTokenBackend + DeviceMemory,
        B::InnerBackend: XTokenBackend,
    {
        let count = devices.len();
        config.grad_accum(count)?;
        prepare(&config)?;
        let collective_config = CollectiveConfig::default()
            .with_num_devices(count)
            .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
        let handles: Vec<_> = devices
            .into_iter()
            .enumerate()
            .map(|(i, device)| {
                let rank = i;
                let (config, args, cc) = (config.clone(), args.clone(), collective_config.clone());
                std::thread::Builder::new()
                    .name(format!("xtoken-worker-{rank}"))
                    .spawn(move || worker::<B>(config, args, device, rank, count, cc))
                    .map_err(anyhow::Error::from)
            })
            .collect::<Result<_>>()?;
        let mut summaries = Vec::new();
        let mut first_error = None;
        for handle in handles {
            match handle.join() {
                Ok(Ok(s)) => summaries.push(s),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(anyhow!("a worker thread panicked"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let fingerprints: Vec<u64> = summaries.iter().map(|s| s.fingerprint).collect();
        if fingerprints.windows(2).any(|w| w[0] != w[1]) {
            bail!("the workers' parameters diverged (fingerprints {fingerprints:x?})");
        }
        eprintln!(
            "{count} workers ended with identical parameters (fingerprint {:016x})",
            fingerprints.first().copied().unwrap_or(0)
        );
        Ok(summaries.into_iter().next().unwrap_or_default())
    }

    /// Starts one worker per `--devices` entry of this node.
    pub fn start(config: RunConfig, args: TrainArgs, device: &str) -> Result<RunSummary> {
        let indices = if args.workers.devices.is_empty() {
            vec![0]
        } else {
            args.workers.devices.clone()
        };
        match device {
            // ndarray has one device; its workers are threads sharing it (for tests and
            // for trying a multi-node setup on CPUs).
            "cpu" => spawn_all::<burn::backend::Autodiff<burn::backend::NdArray>>(
                config,
                args,
                indices.iter().map(|_| Default::default()).collect(),
            ),
            #[cfg(feature = "cuda")]
            "cuda" => spawn_all::<burn::backend::Autodiff<burn::backend::Cuda>>(
                config,
                args,
                indices
                    .iter()
                    .map(|&i| burn::backend::cuda::CudaDevice::new(i))
                    .collect(),
            ),
            #[cfg(feature = "wgpu")]
            "wgpu" => spawn_all::<burn::backend::Autodiff<burn::backend::Wgpu>>(
                config,
                args,
                indices
                    .iter()
                    .map(|&i| burn::backend::wgpu::WgpuDevice::DiscreteGpu(i))
                    .collect(),
            ),
            other => {
                bail!("device = {other:?}: not available in this build for data-parallel training")
            }
        }
    }
}
