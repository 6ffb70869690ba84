//! A run step by step on a backend of your choice, for a loop of your own (README and the book's
//! "The trainer as a library" show the part between the anchors; it is also the crate's
//! documented example): `cargo run --release -p xtoken-train --example stepwise`, after
//! `xtoken demo` has written the models that `examples/configs/demo-cpu.toml` names.

fn main() -> Result<(), xtoken_train::Error> {
    // ANCHOR: stepwise
    use burn::backend::{Autodiff, NdArray};
    use xtoken_train::{config::RunConfig, Run, RunOptions, Worker};

    let config = RunConfig::load("examples/configs/demo-cpu.toml".as_ref())?;
    let options = RunOptions::default(); // or `resume: true`, `stop_after: Some(step)`
    let device = Default::default();
    let mut run = Run::<Autodiff<NdArray>>::open(config, &options, device, Worker::alone())?;
    while !run.done() {
        let metrics = run.step()?; // one optimizer step: loader, teachers, student, AdamW
        run.log(metrics)?; // metrics.csv and the progress
        if run.checkpoint_due() {
            run.checkpoint()?; // atomic; `resume` continues from it bit for bit
        }
    }
    run.export()?; // the student as a Hugging Face directory

    // ANCHOR_END: stepwise
    Ok(())
}
