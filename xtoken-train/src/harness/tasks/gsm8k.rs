//! GSM8k (`gsm8k`): greedy generation after "Question: …\nAnswer:", stopped at the next
//! "Question:", scored by exact match on the number the `strict-match` filter (`#### n`) and
//! the `flexible-extract` filter (the last number) take from the text.

use regex::Regex;
use std::sync::LazyLock;

use crate::error::{Error, Result};
use crate::harness::docs::Doc;
use crate::harness::task::{Request, Response, Task};

/// GSM8k, from `openai/gsm8k`'s `main` config (`question`, `answer` ending in `#### n`).
pub struct Gsm8k;

static STRICT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"#### (\-?[0-9\.\,]+)").expect("a valid pattern"));
static FLEXIBLE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(-?[$0-9.,]{2,})|(-?[0-9]+)").expect("a valid pattern"));
/// The metric's `regexes_to_ignore`, applied in order to prediction and reference.
static IGNORED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [r",", r"\$", r"(?s).*#### ", r"\.$"]
        .iter()
        .map(|p| Regex::new(p).expect("a valid pattern"))
        .collect()
});

/// The harness's `regex` filter: the `select`-th match (`-1`: the last), its first non-empty
/// group, stripped; `[invalid]` when nothing matches.
pub fn extract(pattern: &Regex, text: &str, select: isize) -> String {
    let matches: Vec<regex::Captures> = pattern.captures_iter(text).collect();
    let index = if select < 0 {
        matches.len().checked_sub(select.unsigned_abs())
    } else {
        Some(select as usize).filter(|&i| i < matches.len())
    };
    let Some(captures) = index.map(|i| &matches[i]) else {
        return "[invalid]".into();
    };
    let groups: Vec<&str> = (1..captures.len())
        .map(|g| captures.get(g).map_or("", |m| m.as_str()))
        .collect();
    let picked = match groups.as_slice() {
        [] => captures.get(0).map_or("", |m| m.as_str()),
        [only] => only,
        many => many
            .iter()
            .find(|g| !g.is_empty())
            .copied()
            .unwrap_or("[invalid]"),
    };
    picked.trim().to_string()
}

/// The task's `exact_match`: both sides with the ignored patterns removed, lower-cased.
pub fn exact_match(prediction: &str, reference: &str) -> bool {
    let clean = |text: &str| {
        let mut text = text.to_string();
        for pattern in IGNORED.iter() {
            text = pattern.replace_all(&text, "").into_owned();
        }
        text.to_lowercase()
    };
    clean(prediction) == clean(reference)
}

impl Gsm8k {
    fn question(doc: &Doc) -> Result<String> {
        Ok(format!("Question: {}\nAnswer:", doc.text("question")?))
    }

    /// The solution, which ends in its final answer `#### n`: without it the reference would be
    /// the whole solution, which no answer matches.
    fn answer(doc: &Doc) -> Result<&str> {
        let answer = doc.text("answer")?;
        if !answer.contains("####") {
            return Err(Error::Data(format!(
                "{}: field `answer` has no final answer `#### n`",
                doc.place
            )));
        }
        Ok(answer)
    }
}

impl Task for Gsm8k {
    fn name(&self) -> &'static str {
        "gsm8k"
    }
    fn configs(&self) -> &'static [&'static str] {
        &["main"]
    }
    fn eval_split(&self) -> &'static str {
        "test"
    }
    fn fewshot_split(&self) -> &'static str {
        "train"
    }
    fn shot(&self, doc: &Doc) -> Result<String> {
        Ok(format!("{} {}", Self::question(doc)?, Self::answer(doc)?))
    }
    fn request(&self, doc: &Doc, prefix: &str) -> Result<Request> {
        let context = format!("{prefix}{}", Self::question(doc)?);
        // Checked with the prompts, before the model answers.
        Self::answer(doc)?;
        Ok(Request::Generate {
            context,
            until: vec!["Question:".into(), "</s>".into(), "<|im_end|>".into()],
        })
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["exact_match,strict-match", "exact_match,flexible-extract"]
    }
    fn headline(&self) -> &'static str {
        "exact_match,strict-match"
    }
    fn score(&self, doc: &Doc, response: &Response) -> Result<Vec<f64>> {
        let Response::Text(text) = response else {
            return Err(Error::Data(
                "gsm8k was answered with log-likelihoods".into(),
            ));
        };
        let reference = Self::answer(doc)?;
        Ok(vec![
            f64::from(exact_match(&self.filtered("strict-match", text), reference)),
            f64::from(exact_match(
                &self.filtered("flexible-extract", text),
                reference,
            )),
        ])
    }
    fn target(&self, doc: &Doc) -> Result<String> {
        Ok(Self::answer(doc)?.to_string())
    }
    fn filters(&self) -> &'static [&'static str] {
        &["strict-match", "flexible-extract"]
    }
    fn filtered(&self, filter: &str, text: &str) -> String {
        match filter {
            "strict-match" => extract(&STRICT, text, 0),
            _ => extract(&FLEXIBLE, text, -1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_match_as_the_harness() {
        let text = " She pays $1,200 in total.\n#### 1,200";
        assert_eq!(extract(&STRICT, text, 0), "1,200");
        assert_eq!(extract(&FLEXIBLE, text, -1), "1,200");
        assert_eq!(extract(&STRICT, "no answer", 0), "[invalid]");
        assert_eq!(extract(&FLEXIBLE, "so 7 apples", -1), "7");
        assert!(exact_match("1,200", "Step one.\n#### 1200"));
        assert!(exact_match("$18.", "#### 18"));
        assert!(!exact_match("[invalid]", "#### 18"));
    }
}
