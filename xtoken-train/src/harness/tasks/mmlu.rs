//! MMLU (`mmlu`): four-way multiple choice scored on the answer letter, the first examples of
//! the subject's `dev` split as shots, accuracy over all questions (subjects weighted by size).

use crate::error::{Error, Result};
use crate::harness::docs::Doc;
use crate::harness::task::{choice_accuracy, Request, Response, Sampler, Task};

/// MMLU, from `cais/mmlu` (`question`, `subject`, `choices`, `answer`).
pub struct Mmlu;

const LETTERS: [&str; 4] = ["A", "B", "C", "D"];

impl Mmlu {
    fn question(doc: &Doc) -> Result<String> {
        let choices = doc.texts("choices")?;
        if choices.len() != 4 {
            return Err(Error::Data(format!(
                "{}: `choices` has {} entries, MMLU has 4",
                doc.place,
                choices.len()
            )));
        }
        Ok(format!(
            "{}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:",
            doc.text("question")?.trim(),
            choices[0],
            choices[1],
            choices[2],
            choices[3]
        ))
    }

    fn answer(doc: &Doc) -> Result<usize> {
        let answer = doc.integer("answer")?;
        usize::try_from(answer)
            .ok()
            .filter(|&a| a < 4)
            .ok_or_else(|| Error::Data(format!("{}: `answer` {answer} is not 0–3", doc.place)))
    }
}

impl Task for Mmlu {
    fn name(&self) -> &'static str {
        "mmlu"
    }
    fn configs(&self) -> &'static [&'static str] {
        &["all"]
    }
    fn eval_split(&self) -> &'static str {
        "test"
    }
    fn fewshot_split(&self) -> &'static str {
        "dev"
    }
    fn sampler(&self) -> Sampler {
        Sampler::FirstN
    }
    fn subset(&self, doc: &Doc) -> Result<String> {
        match doc.fields.get("subject") {
            Some(_) => Ok(doc.text("subject")?.to_string()),
            None => Ok(doc.dir.clone()),
        }
    }
    fn description(&self, subset: &str) -> String {
        format!(
            "The following are multiple choice questions (with answers) about {}.\n\n",
            subset.replace('_', " ")
        )
    }
    fn shot(&self, doc: &Doc) -> Result<String> {
        Ok(format!(
            "{} {}",
            Self::question(doc)?,
            LETTERS[Self::answer(doc)?]
        ))
    }
    fn request(&self, doc: &Doc, prefix: &str) -> Result<Request> {
        let context = format!("{prefix}{}", Self::question(doc)?);
        Ok(Request::Choice {
            pairs: LETTERS
                .iter()
                .map(|l| (context.clone(), format!(" {l}")))
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
        Ok(vec![choice_accuracy(response, Self::answer(doc)?)?])
    }
    fn target(&self, doc: &Doc) -> Result<String> {
        Ok(Self::answer(doc)?.to_string())
    }
    fn harness_name(&self, subset: &str) -> String {
        format!("mmlu_{subset}")
    }
}
