//! WinoGrande (`winogrande`): partial scoring. The sentence is cut at its blank; the part
//! after the blank is scored under each option filled into the part before it.

use crate::error::{Error, Result};
use crate::harness::docs::Doc;
use crate::harness::task::{choice_accuracy, Request, Response, Sampler, Task};

/// WinoGrande, from `allenai/winogrande`'s `winogrande_xl` (`sentence`, `option1`,
/// `option2`, `answer`).
pub struct WinoGrande;

struct Parsed {
    contexts: [String; 2],
    continuation: String,
    gold: usize,
}

impl WinoGrande {
    fn parse(doc: &Doc) -> Result<Parsed> {
        let sentence = doc.text("sentence")?;
        let blank = sentence
            .find('_')
            .ok_or_else(|| Error::Data(format!("{}: `sentence` has no blank `_`", doc.place)))?;
        let before = &sentence[..blank];
        let gold = match doc.text("answer")? {
            "1" => 0,
            "2" => 1,
            other => {
                return Err(Error::Data(format!(
                    "{}: `answer` {other:?} is not \"1\" or \"2\" (the test split has no answers)",
                    doc.place
                )))
            }
        };
        Ok(Parsed {
            contexts: [
                format!("{before}{}", doc.text("option1")?),
                format!("{before}{}", doc.text("option2")?),
            ],
            continuation: sentence[blank + 1..].trim().to_string(),
            gold,
        })
    }
}

impl Task for WinoGrande {
    fn name(&self) -> &'static str {
        "winogrande"
    }
    fn configs(&self) -> &'static [&'static str] {
        &["winogrande_xl"]
    }
    fn eval_split(&self) -> &'static str {
        "validation"
    }
    fn fewshot_split(&self) -> &'static str {
        "train"
    }
    fn sampler(&self) -> Sampler {
        Sampler::RandomExcludingDoc
    }
    fn shot(&self, doc: &Doc) -> Result<String> {
        let parsed = Self::parse(doc)?;
        Ok(format!(
            "{} {}",
            parsed.contexts[parsed.gold], parsed.continuation
        ))
    }
    fn request(&self, doc: &Doc, prefix: &str) -> Result<Request> {
        let parsed = Self::parse(doc)?;
        Ok(Request::Choice {
            pairs: parsed
                .contexts
                .iter()
                .map(|c| (format!("{prefix}{c}"), format!(" {}", parsed.continuation)))
                .collect(),
        })
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["acc"]
    }
    fn headline(&self) -> &'static str {
        "acc"
    }
    fn score(&self, doc: &Doc, response: &Response) -> Result<Vec<f64>> {
        Ok(vec![choice_accuracy(response, Self::parse(doc)?.gold)?])
    }
    /// The sentence after its blank, stripped: the continuation both choices are scored on.
    fn target(&self, doc: &Doc) -> Result<String> {
        Ok(Self::parse(doc)?.continuation)
    }
}
