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
use burn::tensor::{Tensor, TensorPrimitive};
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
            // The ids checked before the lookup reads them; the lookup off the graph: its
            // gradient is added into the table's below.
            let pass = Pass::new(&self.architecture, tokens)?;
            let inner = self.embed_tokens.valid();
            let embedded =
                Tensor::<B, 3>::from_inner(inner.forward(tokens.ids().inner())).require_grad();
            let hidden = self.hidden_states_from(&pass, embedded.clone())?;
            let value = loss(self, hidden)?;
            let mut grads = value.backward();
            let upstream = embedded.grad_remove(&mut grads);
            let mut model = GradientsParams::new();
            move_grads(self, &mut grads, &mut model);
            add_lookup_grad(self, tokens, upstream, &mut model);
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
        let mut x = inner.scaled_embeddings(embedded);
        for (i, layer) in inner.layers.iter().enumerate() {
            inputs.push(x.clone());
            let (tables, masking) = inner_context.layer(i);
            x = layer.forward(x, tables, masking, compute)?;
        }

        // Final norm and the loss, with a graph from the last layer's output on.
        let top = Tensor::<B, 3>::from_inner(x).require_grad();
        let value = loss(self, self.final_norm(top.clone()))?;
        let mut grads = value.backward();
        let mut upstream = top.grad(&grads);
        let mut model = GradientsParams::new();
        move_grads(self, &mut grads, &mut model);

        // Layers from the top, each rerun with autodiff on its saved input.
        for (i, (layer, input)) in self.layers.iter().zip(inputs).enumerate().rev() {
            let Some(gradient) = upstream else { break };
            let input = Tensor::<B, 3>::from_inner(input).require_grad();
            let (tables, masking) = context.layer(i);
            let output = layer.forward(input.clone(), tables, masking, compute)?;
            let mut layer_grads = (output * Tensor::from_inner(gradient)).sum().backward();
            upstream = input.grad(&layer_grads);
            move_grads(layer, &mut layer_grads, &mut model);
        }

        // The layers read the scaled lookup (Gemma): its gradient is the table's times the scale.
        let upstream = upstream.map(|g| inner.scaled_embeddings(g));
        add_lookup_grad(self, tokens, upstream, &mut model);
        Ok(Backward {
            loss: value.inner(),
            model,
            rest: grads,
        })
    }
}

/// Adds the gradient `upstream` of the embedding lookup's output `[batch, len, hidden]` into
/// the table's gradient in `model` (a tied head's, or zeros): one
/// [`XTokenBackend::xt_add_rows`], where burn's lookup backward would build and add a whole
/// zero table. Nothing when the table is frozen or no gradient reached the lookup.
fn add_lookup_grad<B: AutodiffBackend>(
    transformer: &Transformer<B>,
    tokens: &Tokens<B>,
    upstream: Option<Tensor<B::InnerBackend, 3>>,
    model: &mut GradientsParams,
) where
    B::InnerBackend: XTokenBackend,
{
    let table = &transformer.embed_tokens.weight;
    let Some(upstream) = upstream.filter(|_| table.is_require_grad()) else {
        return;
    };
    let weight = table.val().inner();
    let [batch, len] = tokens.dims();
    let hidden = weight.dims()[1];
    let current = model
        .remove::<B::InnerBackend, 2>(table.id)
        .unwrap_or_else(|| weight.zeros_like());
    let rows = upstream
        .reshape([batch * len, hidden])
        .cast(current.dtype());
    let ids = tokens.ids().inner().reshape([batch * len]);
    let summed = B::InnerBackend::xt_add_rows(
        current.into_primitive().tensor(),
        ids.into_primitive(),
        rows.into_primitive().tensor(),
    );
    let summed = Tensor::<B::InnerBackend, 2>::from_primitive(TensorPrimitive::Float(summed));
    model.register(table.id, summed);
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
