//! The errors of a training run. Each names what is at fault (the file and line, the
//! configuration key, the step, the worker); [`Error::Context`] adds what was being done, as a
//! chain of sources that [`Error::report`] prints whole.

use std::fmt::Display;

/// Why a run, or one of its parts, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value of the run configuration that cannot be used; the message names its key.
    #[error("{0}")]
    Config(String),
    /// Training data that cannot be read or used; the message names the file and line.
    #[error("{0}")]
    Data(String),
    /// A run that cannot start, continue or finish as asked.
    #[error("{0}")]
    Run(String),
    /// A run that does not fit its memory, or ran out of it; the message names the limit, the
    /// largest part and the setting to lower.
    #[error("{0}")]
    Memory(String),
    /// Stored teacher targets (`xtoken teach`) that cannot be used; the message names the
    /// directory, shard or document at fault.
    #[error("{0}")]
    Targets(String),
    /// A served teacher (`teachers[].server`: vLLM or `xtoken serve`) that cannot answer, or
    /// answered what cannot be used; the message names the server and its last answer.
    #[error("{0}")]
    Served(String),
    /// Data-parallel workers that could not exchange their gradients or diverged.
    #[error("{0}")]
    Parallel(String),
    /// From the tokenizers, W, the alignment, the cache or the losses.
    #[error(transparent)]
    Core(#[from] xtoken_core::Error),
    /// From loading, running or saving a model.
    #[error(transparent)]
    Model(#[from] xtoken_models::ModelError),
    /// From reading or writing a checkpoint's tensors.
    #[error(transparent)]
    Record(#[from] burn::record::RecorderError),
    /// From the file system.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// From reading or writing JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Several problems found together (by `train --check`, or reading a run's inputs), each
    /// of which stops the run.
    #[error("{} problems, each of which stops the run before its first step:\n  - {}", .0.len(), .0.join("\n  - "))]
    Several(Vec<String>),
    /// What was being done when `source` happened.
    #[error("{context}")]
    Context {
        /// What was being done (often the file or the step).
        context: String,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },
}

/// The result of the training library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The whole chain, outermost first: `context: context: cause`.
    pub fn report(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            // Most errors quote their cause already (`{path}: {source}`).
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        text
    }
}

/// The failures of checks that all run, each kept as its report; a success's value is kept.
#[derive(Debug, Default)]
pub struct Failures(Vec<String>);

impl Failures {
    /// Keeps a failure (each of several ones, flattened; one met twice, through two checks that
    /// read the same value, once); the value of a success.
    pub fn note<T>(&mut self, result: Result<T>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(Error::Several(list)) => {
                list.into_iter().for_each(|one| self.keep(one));
                None
            }
            Err(e) => {
                self.keep(e.report());
                None
            }
        }
    }

    fn keep(&mut self, report: String) {
        if !self.0.contains(&report) {
            self.0.push(report);
        }
    }

    /// Whether every check so far passed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The one failure, or all of them.
    pub fn into_error(self) -> Error {
        match <[String; 1]>::try_from(self.0) {
            Ok([one]) => Error::Config(one),
            Err(many) => Error::Several(many),
        }
    }

    /// `value` when nothing failed.
    pub fn or_value<T>(self, value: T) -> Result<T> {
        match self.is_empty() {
            true => Ok(value),
            false => Err(self.into_error()),
        }
    }
}

/// Adds what was being done to an error.
pub trait Context<T> {
    /// Wraps the error with `context`.
    fn context<C: Display>(self, context: C) -> Result<T>;
    /// Wraps the error with the context `f` gives (built only on error).
    fn with_context<C: Display, F: FnOnce() -> C>(self, f: F) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context<C: Display>(self, context: C) -> Result<T> {
        self.with_context(|| context)
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: f().to_string(),
            source: Box::new(e.into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_prints_every_context_and_the_cause() {
        let inner: Result<()> = Err(Error::Data("train.jsonl:2: no field `text`".into()));
        let outer = inner.context("step 3").context("worker 1").unwrap_err();
        assert_eq!(outer.to_string(), "worker 1");
        assert_eq!(
            outer.report(),
            "worker 1: step 3: train.jsonl:2: no field `text`"
        );
    }
}
