//! `eval.csv`: the held-out evaluations of a run, a row each, kept across resumption.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Context, Error, Result};

/// One evaluation's values.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRow {
    /// Steps trained when it was taken.
    pub step: u64,
    /// The student's held-out cross-entropy.
    pub ce: f64,
    /// Per teacher, its held-out `L_m`.
    pub teachers: Vec<f64>,
}

/// `eval.csv`: a row per evaluation; a resumed run keeps the rows up to its step.
pub struct EvalLog {
    path: PathBuf,
    teachers: Vec<String>,
    rows: Vec<EvalRow>,
}

impl EvalLog {
    /// Opens `path` for a run resumed after `start_step` steps.
    pub fn open(path: &Path, teachers: &[String], start_step: u64) -> Result<Self> {
        let mut log = EvalLog {
            path: path.to_path_buf(),
            teachers: teachers.to_vec(),
            rows: Vec::new(),
        };
        if start_step > 0 && path.exists() {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            for (i, line) in text.lines().enumerate().skip(1) {
                let row = log.parse(line).ok_or_else(|| {
                    Error::Run(format!(
                        "{}:{}: not an evaluation row",
                        path.display(),
                        i + 1
                    ))
                })?;
                if row.step <= start_step {
                    log.rows.push(row);
                }
            }
        }
        log.write()?;
        Ok(log)
    }

    fn header(&self) -> String {
        let mut h = String::from("step,ce");
        for name in &self.teachers {
            let _ = write!(h, ",loss_{name}");
        }
        h
    }

    fn parse(&self, line: &str) -> Option<EvalRow> {
        let v: Vec<f64> = line
            .split(',')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        (v.len() == 2 + self.teachers.len()).then(|| EvalRow {
            step: v[0] as u64,
            ce: v[1],
            teachers: v[2..].to_vec(),
        })
    }

    /// Appends one evaluation.
    pub fn push(&mut self, row: EvalRow) -> Result<()> {
        self.rows.push(row);
        self.write()
    }

    /// The evaluations so far.
    pub fn rows(&self) -> &[EvalRow] {
        &self.rows
    }

    fn write(&self) -> Result<()> {
        let mut file = std::fs::File::create(&self.path)
            .with_context(|| format!("{}: cannot write", self.path.display()))?;
        let mut text = self.header();
        text.push('\n');
        for r in &self.rows {
            let _ = write!(text, "{},{}", r.step, r.ce);
            for l in &r.teachers {
                let _ = write!(text, ",{l}");
            }
            text.push('\n');
        }
        file.write_all(text.as_bytes())
            .with_context(|| format!("{}: cannot write", self.path.display()))
    }
}
