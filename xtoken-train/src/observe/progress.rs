//! The progress of a run: a bar on a terminal, else a line every `log_every` steps.

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::RunConfig;
use crate::observe::metrics::StepMetrics;

/// What a run shows while it goes: a progress bar on a terminal, else a line every
/// `log_every` steps (lead worker only).
pub struct Progress {
    /// The bar (hidden off a terminal); a line printed meanwhile goes through its `suspend`.
    pub bar: ProgressBar,
    /// Whether the bar shows (the lead worker, on a terminal).
    pub visible: bool,
    lead: bool,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

impl Progress {
    /// The progress of the lead worker (`lead`) of a run of `config`.
    pub fn new(lead: bool, config: &RunConfig) -> Self {
        let visible = lead && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = if visible {
            ProgressBar::new(config.training.steps)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps · {msg} · ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self { bar, visible, lead }
    }

    /// Positions the bar and says what the run will do.
    pub fn start(
        &self,
        config: &RunConfig,
        step: u64,
        last: u64,
        (accum, workers): (usize, usize),
    ) {
        self.bar.set_position(step);
        let t = &config.training;
        if self.lead {
            tracing::info!(
                "training steps {}..{last} of {}: {} sequences × {} tokens per step ({} per micro-batch, {} micro-batches × {workers} workers)",
                step,
                t.steps,
                t.batch_size,
                t.context_length,
                t.micro_batch,
                accum,
            );
        }
    }

    /// Moves the bar; off a terminal, prints the step's line when `due`, naming each teacher
    /// by `teachers`; `served` says how fast the served teachers answer (empty: none).
    pub fn show(&self, row: &StepMetrics, teachers: &[&str], steps: u64, due: bool, served: &str) {
        self.bar.set_position(row.step);
        self.bar.set_message(format!(
            "loss {:.4} (CE {:.4}, KD {:.4}) · {:.0} tok/s{served}",
            row.loss, row.ce, row.kd, row.tokens_per_s
        ));
        if !self.lead || self.visible || !due {
            return;
        }
        let per_teacher: Vec<String> = teachers
            .iter()
            .zip(&row.teachers)
            .map(|(name, (l, a))| format!("{name} {l:.4} (α {a:.3})"))
            .collect();
        let written = match &row.on_policy {
            Some(on) => format!(
                " · on-policy {:.0} %, {:.1} tokens written each at {:.0} tok/s",
                100.0 * on.share,
                on.generated,
                on.tokens_per_s
            ),
            None => String::new(),
        };
        tracing::info!(
            "step {}/{steps} · lr {:.3e} · loss {:.4} · CE {:.4} · KD {:.4} [{}] · |g| {:.3} · {:.0} tok/s · {:.2} GB{written}{served}",
            row.step,
            row.lr,
            row.loss,
            row.ce,
            row.kd,
            per_teacher.join(", "),
            row.grad_norm,
            row.tokens_per_s,
            row.memory_bytes as f64 / 1e9
        );
    }
}
