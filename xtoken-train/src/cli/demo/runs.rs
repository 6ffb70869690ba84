//! The demo's training runs, through `xtoken train`'s library, and the pool that runs them side
//! by side.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};

use xtoken_train::train::launch::{train_on, Devices};
use xtoken_train::{RunConfig, RunOptions};

/// One training run of the demo.
pub struct Run<'a> {
    pub out: &'a Path,
    pub student: &'a Path,
    pub teacher: &'a Path,
    /// The objective (`kl` with `alpha` 0 trains on cross-entropy alone).
    pub loss: &'a str,
    pub alpha: f64,
    pub steps: u64,
    /// Peak learning rate (warm-up over the first 5 %, cosine decay to 0).
    pub lr: f64,
    pub data: &'a Path,
    /// Seeds the batches (the same for every student).
    pub seed: u64,
    /// `cpu`, `flex` or `ndarray`.
    pub device: &'a str,
    /// Read the teacher's stored targets in this directory instead of running `teacher`, with
    /// this top-K (`None`: the teacher runs, the whole vocabulary kept).
    pub stored: Option<(&'a Path, usize)>,
    /// Or ask the teacher served at this API base, as `teacher`, with this top-K.
    pub served: Option<(&'a str, usize)>,
}

impl Run<'_> {
    /// The run's configuration. Tiny models trained from scratch take a far larger learning
    /// rate than the paper's fine-tuning of a pretrained 1B. Dynamic scaling is off: the
    /// questions are a template that teacher and student agree on, so `L_KD` is 10–50× below
    /// `L_CE` (whose value is mostly the names' and phrasings' irreducible entropy), and
    /// `γ = L_CE / L_KD` would weigh KD's gradient by as much; everything else is the default.
    pub(crate) fn toml(&self) -> String {
        let Run {
            steps, lr, seed, ..
        } = *self;
        let path = |p: &Path| format!("{:?}", p.display().to_string());
        format!(
            r#"
output_dir = {out}
seed = {seed}
device = {device:?}
[student]
model = {student}
[[teachers]]
name = "teacher"
{source}
loss = "{loss}"
alpha = {alpha}
[data]
path = {data}
[training]
steps = {steps}
batch_size = 16
micro_batch = 16
context_length = 96
lr = {lr:e}
warmup = 0.05
log_every = {steps}
activation_checkpointing = false
[loss]
top_k = {top_k}
dynamic_scaling = false
[checkpoint]
every = {steps}
keep = 1
save_dtype = "f32"
"#,
            out = path(self.out),
            student = path(self.student),
            source = match (self.stored, self.served) {
                (Some((dir, _)), _) => format!("targets = {}", path(dir)),
                (None, Some((url, _))) => format!(
                    "server = {url:?}\nserved_model = \"teacher\"\ntokenizer = {}",
                    path(self.teacher)
                ),
                (None, None) => format!("model = {}", path(self.teacher)),
            },
            top_k = self
                .stored
                .or(self.served.map(|(_, k)| (self.teacher, k)))
                .map_or(0, |(_, k)| k),
            data = path(self.data),
            loss = self.loss,
            alpha = self.alpha,
            device = self.device,
        )
    }

    /// Trains on the CPU backend `device`; the model is left in `<out>/student`.
    pub fn train(&self) -> Result<()> {
        let config = RunConfig::parse(&self.toml())?;
        let devices = Devices::of(&config)?;
        train_on(config, &RunOptions::default(), &devices)
            .with_context(|| format!("training {}", self.out.display()))?;
        Ok(())
    }
}

/// A run's training cross-entropy curve (`metrics.csv`'s `ce` column), and its mean over the
/// last 10 % of steps: the one loss every method shares.
pub fn ce_curve(run: &Path) -> Result<(f64, Vec<(f64, f64)>)> {
    let path = run.join("metrics.csv");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|&h| h == name)
            .ok_or_else(|| anyhow!("{}: no `{name}` column", path.display()))
    };
    let (step, ce) = (column("step")?, column("ce")?);
    let points = lines
        .map(|l| {
            let v: Vec<&str> = l.split(',').collect();
            let number = |i: usize| v.get(i).and_then(|x| x.parse::<f64>().ok());
            number(step)
                .zip(number(ce))
                .ok_or_else(|| anyhow!("{}: bad row {l:?}", path.display()))
        })
        .collect::<Result<Vec<(f64, f64)>>>()?;
    let tail = (points.len() / 10).max(1);
    let last = &points[points.len().saturating_sub(tail)..];
    let mean = last.iter().map(|p| p.1).sum::<f64>() / last.len().max(1) as f64;
    Ok((mean, points))
}

/// A unit of work for [`pool`].
pub type Job<'a, T> = Box<dyn FnOnce() -> Result<T> + Send + 'a>;

/// Runs `jobs` on up to `threads` threads, each job whole on one thread, and returns their
/// results in order (the first error, if any). The demo's models are too small for one run to
/// keep two cores busy; two runs side by side do.
pub fn pool<T: Send>(threads: usize, jobs: Vec<Job<'_, T>>) -> Result<Vec<T>> {
    let n = jobs.len();
    let queue: Vec<Mutex<Option<Job<'_, T>>>> =
        jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<Result<T>>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(slot) = queue.get(i) else { break };
                let job = slot.lock().ok().and_then(|mut j| j.take());
                if let Some(job) = job {
                    let result = job();
                    if let Ok(mut r) = results[i].lock() {
                        *r = Some(result);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .map_err(|_| anyhow!("a demo job panicked"))?
                .ok_or_else(|| anyhow!("a demo job did not run"))?
        })
        .collect()
}
