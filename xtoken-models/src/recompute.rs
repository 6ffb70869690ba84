//! One training step's forward and backward, with optional activation (gradient) checkpointing
//! per decoder layer.
//!
//! With checkpointing, the forward pass runs on the inner backend (no graph) and keeps only each
//! layer's input `[batch, len, hidden]`. The backward pass then walks the layers from the top:
//! it reruns one layer with autodiff on its saved input, back-propagates the gradient arriving
//! from above (as `Σ y ⊙ g`), and keeps the gradient of the input for the layer below. Only one
//! layer's activations exist at a time, for about one extra forward pass of compute. It uses
//! burn's public autodiff API only, so it works on every `AutodiffBackend`.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use xtoken_kernels::XTokenBackend;

use crate::error::ModelError;
use crate::model::{Pass, Transformer};
use crate::tokens::Tokens;

/// The result of [`Transformer::forward_backward`].
pub struct Backward<B: AutodiffBackend> {
    /// The loss value, off the graph.
    pub loss: Tensor<B::InnerBackend, 1>,
    /// The gradients of the model's parameters, ready for an optimizer.
    pub model: GradientsParams,
    /// The gradients of anything else the loss used (a learnable projection, say), with the
    /// model's parameters removed: `GradientsParams::from_grads(rest, &module)` takes them.
    pub rest: B::Gradients,
}

impl<B: AutodiffBackend + XTokenBackend> Transformer<B>
where
    B::InnerBackend: XTokenBackend,
{
    /// Forward, `loss(model, final hidden states)`, and backward. The closure chooses the
    /// output head (`logits_from_hidden`, or a fused loss reading the hidden states), so the
    /// head is never recomputed. `checkpointing` trades one extra forward pass of the decoder
    /// layers for keeping one layer's activations instead of all of them. The [`Tokens`] are
    /// checked on the host: the pass reads nothing back from the device.
    pub fn forward_backward<E, F>(
        &self,
        tokens: &Tokens<B>,
        checkpointing: bool,
        loss: F,
    ) -> Result<Backward<B>, E>
    where
        E: From<ModelError>,
        F: FnOnce(&Self, Tensor<B, 3>) -> Result<Tensor<B, 1>, E>,
    {
        if !checkpointing {
            let hidden = self.hidden_states_of(tokens)?;
            let value = loss(self, hidden)?;
            let mut grads = value.backward();
            let mut model = GradientsParams::new();
            move_grads(self, &mut grads, &mut model);
            return Ok(Backward {
                loss: value.inner(),
                model,
                rest: grads,
            });
        }

        let pass = Pass::new(&self.architecture, tokens)?;
        let inner = self.valid();
        let embedded = inner.embed_tokens.forward(tokens.ids().inner());
        let (dtype, device) = (embedded.dtype(), embedded.device());
        // Both passes run the attention the training pass would: their outputs agree bitwise.
        let tiled = self.tiled_attention();
        let arch = &self.architecture;
        let inner_context = pass.context::<B::InnerBackend>(arch, tiled, dtype, &device);
        let context = pass.context::<B>(arch, tiled, dtype, &device);
        let compute = self.compute_dtype();

        // Forward without a graph, keeping each layer's input.
        let mut inputs = Vec::with_capacity(self.layers.len() + 1);
        let mut x = embedded;
        for layer in &inner.layers {
            inputs.push(x.clone());
            x = layer.forward(x, &inner_context.tables, &inner_context.masking, compute)?;
        }

        // Final norm and the loss, with a graph from the last layer's output on.
        let top = Tensor::<B, 3>::from_inner(x).require_grad();
        let value = loss(self, crate::model::rms(&self.norm, top.clone()))?;
        let mut grads = value.backward();
        let mut upstream = top.grad(&grads);
        let mut model = GradientsParams::new();
        move_grads(self, &mut grads, &mut model);

        // Layers from the top, each rerun with autodiff on its saved input.
        for (layer, input) in self.layers.iter().zip(inputs).rev() {
            let Some(gradient) = upstream else { break };
            let input = Tensor::<B, 3>::from_inner(input).require_grad();
            let output =
                layer.forward(input.clone(), &context.tables, &context.masking, compute)?;
            let mut layer_grads = (output * Tensor::from_inner(gradient)).sum().backward();
            upstream = input.grad(&layer_grads);
            move_grads(layer, &mut layer_grads, &mut model);
        }

        // The embedding, whose gradient adds to a tied head's.
        if let Some(gradient) = upstream {
            let embedded = self.embed_tokens.forward(tokens.ids());
            let mut embed_grads = (embedded * Tensor::from_inner(gradient)).sum().backward();
            move_grads(&self.embed_tokens, &mut embed_grads, &mut model);
        }
        Ok(Backward {
            loss: value.inner(),
            model,
            rest: grads,
        })
    }
}

/// Moves the gradients of `module`'s parameters from `grads` into `into`, adding to a gradient
/// already there (a parameter used twice, like a tied embedding).
fn move_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut B::Gradients,
    into: &mut GradientsParams,
) {
    struct Mover<'a, B: AutodiffBackend> {
        grads: &'a mut B::Gradients,
        into: &'a mut GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Mover<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(grad) = param.val().grad_remove(self.grads) else {
                return;
            };
            let grad = match self.into.remove::<B::InnerBackend, D>(param.id) {
                Some(earlier) => earlier + grad,
                None => grad,
            };
            self.into.register(param.id, grad);
        }
    }
    module.visit(&mut Mover::<B> { grads, into });
}
