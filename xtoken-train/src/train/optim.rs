//! What a step updates and how: the student with its AdamW in two groups (norm weights exempt
//! from weight decay, as Hugging Face's Trainer does), each P-KL teacher's learnable W with its
//! own AdamW (no clipping, no decay), and the global-norm clipping of the student's gradients.
//!
//! AdamW runs as [`FusedAdamW`]: each parameter tensor's update, with the clipping of its
//! gradient, is one [`XTokenBackend::xt_adamw`] (one kernel launch on a GPU), and its state is
//! burn's `AdamWState`, so checkpoints keep burn's optimizer records.

use std::collections::HashSet;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{
    AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate, Optimizer, SimpleOptimizer,
};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_core::loss::XTokenBackend;
use xtoken_kernels::adamw::{AdamWStep, Moments};
use xtoken_models::Transformer;

use crate::backend::TrainBackend;
use crate::config::TrainingConfig;

/// AdamW (decoupled weight decay) whose per-tensor update is the backend's fused
/// [`XTokenBackend::xt_adamw`], the gradient first scaled by `grad_scale` (the global-norm
/// clipping's factor). Without a kernel the update is burn's `AdamW`'s ops in burn's order, so
/// the two give the same weights there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAdamW {
    /// β₁.
    pub beta_1: f32,
    /// β₂.
    pub beta_2: f32,
    /// ε.
    pub epsilon: f32,
    /// The decoupled weight decay λ.
    pub weight_decay: f32,
    /// The factor every gradient is scaled by in the next step (1: none).
    pub grad_scale: f64,
}

impl<B: XTokenBackend> SimpleOptimizer<B> for FusedAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let time = state.as_ref().map_or(0, |s| s.momentum.time) + 1;
        let moments = state.map(|s| Moments {
            first: s.momentum.moment_1.into_primitive().tensor(),
            second: s.momentum.moment_2.into_primitive().tensor(),
        });
        let step = AdamWStep {
            lr,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            time,
            grad_scale: self.grad_scale,
        };
        let primitive = |t: Tensor<B, D>| t.into_primitive().tensor();
        let update = B::xt_adamw(primitive(tensor), primitive(grad), moments, &step);
        let tensor = |t| Tensor::from_primitive(TensorPrimitive::Float(t));
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: tensor(update.moments.first),
            moment_2: tensor(update.moments.second),
            max_moment_2: None,
        };
        (tensor(update.param), Some(AdamWState { momentum }))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        AdamWState {
            momentum: state.momentum.to_device(device),
        }
    }
}

/// [`FusedAdamW`] for module `M`.
pub type AdamW<M, B> = OptimizerAdaptor<FusedAdamW, M, B>;

/// A new AdamW for a module.
fn adamw<M: AutodiffModule<B>, B: TrainBackend>(optim: FusedAdamW) -> AdamW<M, B> {
    OptimizerAdaptor::from(optim)
}

/// The same optimizer state, its next step's gradients scaled by `grad_scale`.
fn with_grad_scale<M: AutodiffModule<B>, B: TrainBackend>(
    optim: &mut AdamW<M, B>,
    grad_scale: f64,
) {
    if optim.optim().grad_scale != grad_scale {
        let records = optim.to_record();
        let fused = FusedAdamW {
            grad_scale,
            ..*optim.optim()
        };
        *optim = adamw(fused).load_record(records);
    }
}

/// The student and the optimizers of everything a step trains.
pub struct Trainable<B: TrainBackend> {
    /// The student being distilled.
    pub student: Transformer<B>,
    /// AdamW of the student's matrices (with weight decay).
    pub decay: AdamW<Transformer<B>, B>,
    /// AdamW of the student's norm weights (no weight decay).
    pub no_decay: AdamW<Transformer<B>, B>,
    /// Per teacher, the AdamW of its learnable W (P-KL teachers whose W is trained).
    pub projections: Vec<Option<AdamW<LearnableProjection<B>, B>>>,
    norm_ids: HashSet<ParamId>,
}

impl<B: TrainBackend> Trainable<B> {
    /// The student with fresh optimizers; `learnable_w[m]` says whether teacher `m` has a W to
    /// train.
    pub fn new(student: Transformer<B>, t: &TrainingConfig, learnable_w: &[bool]) -> Self {
        let adam = |decay: f64| FusedAdamW {
            beta_1: t.beta1 as f32,
            beta_2: t.beta2 as f32,
            epsilon: t.epsilon as f32,
            weight_decay: decay as f32,
            grad_scale: 1.0,
        };
        // W's AdamW: burn's defaults for β, ε = 1e-8, no decay, no clipping.
        let w_adam = || {
            adamw(FusedAdamW {
                beta_1: 0.9,
                beta_2: 0.999,
                epsilon: 1e-8,
                weight_decay: 0.0,
                grad_scale: 1.0,
            })
        };
        Self {
            norm_ids: norm_param_ids(&student),
            decay: adamw(adam(t.weight_decay)),
            no_decay: adamw(adam(0.0)),
            projections: learnable_w.iter().map(|&w| w.then(w_adam)).collect(),
            student,
        }
    }

    /// Replaces the student (a restored checkpoint's, whose parameter ids the optimizers'
    /// state is keyed by).
    pub fn set_student(&mut self, student: Transformer<B>) {
        self.norm_ids = norm_param_ids(&student);
        self.student = student;
    }

    /// One AdamW step of the student at `lr`, its gradients scaled by `grad_scale` (the
    /// clipping's factor, [`clip_scale`]) inside the update: the norm weights without decay,
    /// the rest with.
    pub fn step_student(&mut self, lr: f64, grad_scale: f64, mut grads: GradientsParams) {
        with_grad_scale(&mut self.decay, grad_scale);
        with_grad_scale(&mut self.no_decay, grad_scale);
        let no_decay_grads = split_grads(&self.student, &mut grads, &self.norm_ids);
        let student = self.decay.step(lr, self.student.clone(), grads);
        self.student = self.no_decay.step(lr, student, no_decay_grads);
    }
}

/// The ids of the student's rank-1 parameters (norm weights), exempt from weight decay.
fn norm_param_ids<B: AutodiffBackend>(model: &Transformer<B>) -> HashSet<ParamId> {
    struct Collect(HashSet<ParamId>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if D == 1 {
                self.0.insert(param.id);
            }
        }
    }
    let mut collect = Collect(HashSet::new());
    model.visit(&mut collect);
    collect.0
}

/// Moves the gradients of `ids` out of `grads` into a new set.
fn split_grads<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &mut GradientsParams,
    ids: &HashSet<ParamId>,
) -> GradientsParams {
    struct Split<'a, B: AutodiffBackend> {
        from: &'a mut GradientsParams,
        into: GradientsParams,
        ids: &'a HashSet<ParamId>,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Split<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.ids.contains(&param.id) {
                if let Some(g) = self.from.remove::<B::InnerBackend, D>(param.id) {
                    self.into.register(param.id, g);
                }
            }
        }
    }
    let mut split = Split::<B> {
        from: grads,
        into: GradientsParams::new(),
        ids,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut split);
    split.into
}

/// The squared global L2 norm of the student's gradients, on the device (f32, `[1]`); `None`
/// when there are none. It stays there until the step reads it with its loss values.
pub fn squared_norm<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &GradientsParams,
) -> Option<Tensor<B::InnerBackend, 1>> {
    struct SquaredNorm<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        sum: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let s = g.cast(DType::F32).square().sum();
                self.sum = Some(match self.sum.take() {
                    Some(a) => a + s,
                    None => s,
                });
            }
        }
    }
    let mut norm = SquaredNorm::<B> { grads, sum: None };
    model.visit(&mut norm);
    norm.sum
}

/// The factor that brings the student's gradients of global L2 `norm` to `max` at most
/// (0: no clipping); 1 when they are within it.
pub fn clip_scale(norm: f64, max: f64) -> f64 {
    if max > 0.0 && norm > max {
        max / (norm + 1e-6)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::optim::AdamWConfig;
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    use xtoken_models::{Architecture, Tokens};

    use super::*;

    type A = Autodiff<NdArray>;
    type Bytes = BinBytesRecorder<FullPrecisionSettings>;

    fn gradients(student: &Transformer<A>, seed: i64) -> GradientsParams {
        let ids: Vec<i64> = (0..8).map(|i| (i * 7 + seed) % 32).collect();
        let tokens = Tokens::<A>::from_host(&ids, None, [1, 8], &Default::default()).unwrap();
        let loss = student.forward_of(&tokens).unwrap().square().sum();
        GradientsParams::from_grads(loss.backward(), student)
    }

    /// The gradients times `scale`, as a clipping pass makes them (none at 1).
    fn scaled(model: &Transformer<A>, grads: &GradientsParams, scale: f64) -> GradientsParams {
        struct Scale<'a>(GradientsParams, &'a GradientsParams, f64);
        impl ModuleVisitor<A> for Scale<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<A, D>>) {
                if let Some(g) = self.1.get::<NdArray, D>(p.id) {
                    let g = if self.2 == 1.0 {
                        g
                    } else {
                        g.mul_scalar(self.2)
                    };
                    self.0.register(p.id, g);
                }
            }
        }
        let mut scale = Scale(GradientsParams::new(), grads, scale);
        model.visit(&mut scale);
        scale.0
    }

    /// Every parameter's bits, in visiting order.
    fn bits(model: &Transformer<A>) -> Vec<u32> {
        struct Bits(Vec<u32>);
        impl ModuleVisitor<A> for Bits {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<A, D>>) {
                let data = p.val().into_data().to_vec::<f32>().unwrap();
                self.0.extend(data.into_iter().map(f32::to_bits));
            }
        }
        let mut all = Bits(Vec::new());
        model.visit(&mut all);
        all.0
    }

    /// Asserts that two models' parameters are bitwise equal, naming the first that is not.
    fn same(a: &Transformer<A>, b: &Transformer<A>, when: &str) {
        let (a, b) = (bits(a), bits(b));
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        let first = a.iter().zip(&b).position(|(x, y)| x != y);
        assert_eq!(
            differ, 0,
            "{when}: {differ} values differ, the first at {first:?}"
        );
    }

    /// The fused AdamW with its clipping scale gives burn's `AdamW` after a separate clipping
    /// pass, bitwise on ndarray, over three steps (the first from no state and scaled, then
    /// unscaled); and burn's `AdamW`'s record, saved and loaded into it, takes the same fourth
    /// step as its own state: checkpoints made before it still resume exactly.
    #[test]
    fn the_fused_adamw_steps_as_burns_and_reads_its_records() {
        let device = Default::default();
        let arch = Architecture::llama(32, 16, 32, 1, 2, 1);
        let start = Transformer::<A>::random(&arch, 5, DType::F32, &device).unwrap();
        let fused = FusedAdamW {
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.1,
            grad_scale: 1.0,
        };
        let mut burns = AdamWConfig::new()
            .with_beta_2(0.95)
            .with_epsilon(1e-8)
            .with_weight_decay(0.1)
            .init::<A, Transformer<A>>();
        let mut optim: AdamW<Transformer<A>, A> = adamw(fused);
        let (mut ours, mut theirs) = (start.clone(), start);
        for (step, scale) in [0.25, 1.0, 1.0].into_iter().enumerate() {
            let lr = 1e-2 / (step + 1) as f64;
            let grads = gradients(&theirs, step as i64);
            theirs = burns.step(lr, theirs.clone(), scaled(&theirs, &grads, scale));
            with_grad_scale(&mut optim, scale);
            ours = optim.step(lr, ours.clone(), gradients(&ours, step as i64));
            same(&ours, &theirs, &format!("step {}", step + 1));
        }
        let saved = Bytes::new().record(burns.to_record(), ()).unwrap();
        let mut loaded: AdamW<Transformer<A>, A> =
            adamw(fused).load_record(Bytes::new().load(saved, &device).unwrap());
        let from_burns = loaded.step(1e-3, ours.clone(), gradients(&ours, 3));
        let own = optim.step(1e-3, ours.clone(), gradients(&ours, 3));
        same(&from_burns, &own, "step 4 from burn's record");
        assert_ne!(bits(&own), bits(&ours), "the fourth step changed nothing");
    }
}
