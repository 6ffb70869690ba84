//! Load two Hugging Face model directories, run them, and save one back (the book's "The models"
//! page shows the part between the anchors):
//! `cargo run --release -p xtoken-models --example models -- STUDENT_DIR TEACHER_DIR OUT_DIR`.

use std::path::PathBuf;

use burn::backend::NdArray;
use burn::tensor::{DType, Int, Tensor};
use xtoken_models::{CausalLm, LoadOptions, ModelError, SaveDtype, Transformer};

type MyBackend = NdArray;

fn main() -> Result<(), ModelError> {
    let dirs: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let [student_dir, teacher_dir, out_dir] = dirs.as_slice() else {
        eprintln!("usage: models STUDENT_DIR TEACHER_DIR OUT_DIR");
        std::process::exit(2);
    };
    let device = Default::default();
    let ids = Tensor::<MyBackend, 2, Int>::from_ints([[1, 2, 3, 4]], &device);
    // ANCHOR: models
    let student = Transformer::<MyBackend>::load(student_dir, &device)?; // f32
    let options = LoadOptions { dtype: DType::F32 }; // BF16 where the backend has it (CUDA)
    let teacher = Transformer::<MyBackend>::load_with(teacher_dir, options, &device)?;
    let logits = teacher.forward(ids.clone(), None)?; // [B, T, V]; padding: true = pad
    let hidden = student.hidden_states(ids, None)?; // [B, T, H], for a fused head
    student.save(out_dir, SaveDtype::BF16)?; // config.json + model.safetensors

    // ANCHOR_END: models
    println!("logits {:?}, hidden {:?}", logits.dims(), hidden.dims());
    Ok(())
}
