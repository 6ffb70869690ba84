//! HellaSwag (`hellaswag`): the likeliest of four endings, `acc` and the length-normalized
//! `acc_norm` (log-likelihood per character of the ending), on the `validation` split.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::harness::docs::Doc;
use crate::harness::task::{argmax, choice_accuracy, Request, Response, Sampler, Task};

/// HellaSwag, from `Rowan/hellaswag` (`activity_label`, `ctx_a`, `ctx_b`, `endings`,
/// `label`).
pub struct HellaSwag;

struct Parsed {
    query: String,
    choices: Vec<String>,
    gold: usize,
}

/// The harness's cleaning of WikiHow artifacts: `" [title]"` becomes `". "`, other bracketed
/// tags go, double spaces become single.
pub fn preprocess(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

/// Python's `str.capitalize`: the first character upper case, the rest lower case.
fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

impl HellaSwag {
    fn parse(doc: &Doc) -> Result<Parsed> {
        let context = format!("{} {}", doc.text("ctx_a")?, capitalize(doc.text("ctx_b")?));
        let query = preprocess(&format!("{}: {context}", doc.text("activity_label")?));
        let choices: Vec<String> = doc.texts("endings")?.into_iter().map(preprocess).collect();
        let label = doc.integer("label")?;
        let gold = usize::try_from(label)
            .ok()
            .filter(|&g| g < choices.len())
            .ok_or_else(|| {
                Error::Data(format!(
                    "{}: `label` {label} does not name one of {} endings",
                    doc.place,
                    choices.len()
                ))
            })?;
        Ok(Parsed {
            query,
            choices,
            gold,
        })
    }
}

impl Task for HellaSwag {
    fn name(&self) -> &'static str {
        "hellaswag"
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
        Ok(format!("{} {}", parsed.query, parsed.choices[parsed.gold]))
    }
    fn processed(&self, doc: &Doc) -> Result<Map<String, Value>> {
        let parsed = Self::parse(doc)?;
        let mut fields = doc.fields.clone();
        fields.insert("query".into(), json!(parsed.query));
        fields.insert("choices".into(), json!(parsed.choices));
        fields.insert("gold".into(), json!(parsed.gold));
        Ok(fields)
    }
    fn request(&self, doc: &Doc, prefix: &str) -> Result<Request> {
        let parsed = Self::parse(doc)?;
        let context = format!("{prefix}{}", parsed.query);
        Ok(Request::Choice {
            pairs: parsed
                .choices
                .iter()
                .map(|c| (context.clone(), format!(" {c}")))
                .collect(),
        })
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["acc", "acc_norm"]
    }
    fn headline(&self) -> &'static str {
        "acc_norm"
    }
    fn score(&self, doc: &Doc, response: &Response) -> Result<Vec<f64>> {
        let parsed = Self::parse(doc)?;
        let acc = choice_accuracy(response, parsed.gold)?;
        let Response::Choice(lls) = response else {
            unreachable!("choice_accuracy accepted it")
        };
        let normalized: Vec<f64> = lls
            .iter()
            .zip(&parsed.choices)
            .map(|(ll, choice)| ll.value / choice.chars().count() as f64)
            .collect();
        Ok(vec![acc, f64::from(argmax(&normalized) == parsed.gold)])
    }
    fn target(&self, doc: &Doc) -> Result<String> {
        Ok(doc.integer("label")?.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocess_as_the_harness() {
        assert_eq!(
            preprocess(" Removing ice [title] Use salt. [step] Pour it.  "),
            "Removing ice. Use salt. Pour it."
        );
        assert_eq!(capitalize("tHE man"), "The man");
    }
}
