//! A crate of your own that depends on xtoken (the book: "Depending on xtoken").
//!
//! ```sh
//! cargo run --release -- [STUDENT_TOKENIZER TEACHER_TOKENIZER] [STEPS]
//! cargo run --release --features collective -- --processes 2 [STUDENT_TOKENIZER TEACHER_TOKENIZER] [STEPS]
//! ```
//!
//! The first trains with a loop of its own ([`own_loop`]); the second runs that loop as data
//! parallel processes on this machine, which must end with the parameters of one process on the
//! combined batch ([`data_parallel`]). The tokenizers are directories holding `tokenizer.json`
//! (or the files); without them the program takes Llama-3.2's and Qwen3's from
//! `$XTOKEN_TOKENIZERS_DIR`.

use std::path::PathBuf;

use burn::backend::{Autodiff, NdArray};

#[cfg(feature = "collective")]
mod data_parallel;
mod own_loop;

/// The student's backend; the teacher runs on its inner backend, without a graph.
type B = Autodiff<NdArray>;
type Inner = NdArray;
type Error = Box<dyn std::error::Error>;

/// The command line.
#[derive(Debug, Clone)]
pub struct Arguments {
    student_tokenizer: PathBuf,
    teacher_tokenizer: PathBuf,
    steps: usize,
    /// Data-parallel processes, `--processes N`.
    processes: Option<usize>,
    /// Where a process started by `--processes` writes its parameters (set by the parent).
    parameters_out: Option<PathBuf>,
}

const USAGE: &str =
    "usage: xtoken-downstream [--processes N] [STUDENT_TOKENIZER TEACHER_TOKENIZER] [STEPS]";

impl Arguments {
    fn parse(mut args: Vec<String>) -> Result<Self, Error> {
        let mut option = |name: &str| -> Result<Option<String>, Error> {
            match args.iter().position(|a| a == name) {
                None => Ok(None),
                Some(i) if i + 1 < args.len() => {
                    let value = args.remove(i + 1);
                    args.remove(i);
                    Ok(Some(value))
                }
                Some(_) => Err(format!("{name} needs a value; {USAGE}").into()),
            }
        };
        let processes = option("--processes")?
            .map(|n| n.parse::<usize>())
            .transpose()?;
        let parameters_out = option("--parameters-out")?.map(PathBuf::from);
        let steps = |s: Option<&String>| -> Result<usize, Error> {
            Ok(s.map(|s| s.parse()).transpose()?.unwrap_or(10))
        };
        let (student_tokenizer, teacher_tokenizer, steps) = match args.as_slice() {
            [student, teacher, rest @ ..] if rest.len() <= 1 => {
                (student.into(), teacher.into(), steps(rest.first())?)
            }
            [] | [_] => {
                let dir = std::env::var_os("XTOKEN_TOKENIZERS_DIR").ok_or(
                    "give STUDENT_TOKENIZER TEACHER_TOKENIZER, or set XTOKEN_TOKENIZERS_DIR to a \
                     directory holding llama-3.2/ and qwen3/",
                )?;
                let dir = PathBuf::from(dir);
                (
                    dir.join("llama-3.2"),
                    dir.join("qwen3"),
                    steps(args.first())?,
                )
            }
            _ => return Err(USAGE.into()),
        };
        Ok(Arguments {
            student_tokenizer,
            teacher_tokenizer,
            steps,
            processes,
            parameters_out,
        })
    }
}

fn main() -> Result<(), Error> {
    let args = Arguments::parse(std::env::args().skip(1).collect())?;
    match args.processes {
        None => own_loop::run(&args),
        #[cfg(feature = "collective")]
        Some(processes) => data_parallel::run(&args, processes),
        #[cfg(not(feature = "collective"))]
        Some(_) => Err("--processes needs the `collective` feature: \
                        cargo run --features collective -- --processes 2"
            .into()),
    }
}
