//! What a step updates and how: the student with its AdamW in two groups (norm weights exempt
//! from weight decay, as Hugging Face's Trainer does), each P-KL teacher's learnable W with its
//! own AdamW (no clipping, no decay), and the global-norm clipping of the student's gradients.

use std::collections::HashSet;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_models::Transformer;

use crate::config::TrainingConfig;

/// burn's AdamW for module `M`.
pub type AdamW<M, B> = OptimizerAdaptor<burn::optim::AdamW, M, B>;

/// The student and the optimizers of everything a step trains.
pub struct Trainable<B: AutodiffBackend> {
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

impl<B: AutodiffBackend> Trainable<B> {
    /// The student with fresh optimizers; `learnable_w[m]` says whether teacher `m` has a W to
    /// train.
    pub fn new(student: Transformer<B>, t: &TrainingConfig, learnable_w: &[bool]) -> Self {
        let adam = |decay: f64| {
            AdamWConfig::new()
                .with_beta_1(t.beta1 as f32)
                .with_beta_2(t.beta2 as f32)
                .with_epsilon(t.epsilon as f32)
                .with_weight_decay(decay as f32)
        };
        let w_adam = || {
            AdamWConfig::new()
                .with_epsilon(1e-8)
                .with_weight_decay(0.0)
                .init()
        };
        Self {
            norm_ids: norm_param_ids(&student),
            decay: adam(t.weight_decay).init(),
            no_decay: adam(0.0).init(),
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

    /// One AdamW step of the student at `lr`: the norm weights without decay, the rest with.
    pub fn step_student(&mut self, lr: f64, mut grads: GradientsParams) {
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

/// Scales the student's gradients to global L2 norm ≤ `max` (0: no clipping), given their
/// `norm` before clipping.
pub fn clip_to_norm<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &mut GradientsParams,
    norm: f64,
    max: f64,
) {
    struct Scale<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        factor: f64,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.factor));
            }
        }
    }
    if max > 0.0 && norm > max {
        let mut scale = Scale::<B> {
            grads,
            factor: max / (norm + 1e-6),
            _b: std::marker::PhantomData,
        };
        model.visit(&mut scale);
    }
}
