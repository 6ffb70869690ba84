//! MATH (`hendrycks_math`): greedy generation after "Problem: …\nAnswer:", stopped at the next
//! "Problem:"; the answer (between the first and last `$` when there are two) is compared with
//! the solution's last `\boxed{…}` after the Hendrycks string normalization.

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::harness::docs::Doc;
use crate::harness::task::{Request, Response, Task};

/// MATH, from `EleutherAI/hendrycks_math` (`problem`, `solution`, `type`), all seven subjects.
pub struct Math;

impl Math {
    fn question(doc: &Doc) -> Result<String> {
        Ok(format!("Problem: {}\nAnswer:", doc.text("problem")?))
    }

    fn answer(doc: &Doc) -> Result<String> {
        let solution = doc.text("solution")?;
        last_boxed(solution)
            .and_then(remove_boxed)
            .map(str::to_string)
            .ok_or_else(|| {
                Error::Data(format!(
                    "{}: `solution` has no \\boxed{{…}} answer",
                    doc.place
                ))
            })
    }
}

impl Task for Math {
    fn name(&self) -> &'static str {
        "math"
    }
    fn eval_split(&self) -> &'static str {
        "test"
    }
    fn fewshot_split(&self) -> &'static str {
        "train"
    }
    fn subset(&self, doc: &Doc) -> Result<String> {
        match doc.fields.get("type") {
            Some(_) => Ok(doc.text("type")?.to_string()),
            None => Ok(doc.dir.clone()),
        }
    }
    fn shot(&self, doc: &Doc) -> Result<String> {
        Ok(format!("{} {}", Self::question(doc)?, Self::answer(doc)?))
    }
    fn request(&self, doc: &Doc, prefix: &str) -> Result<Request> {
        Ok(Request::Generate {
            context: format!("{prefix}{}", Self::question(doc)?),
            until: vec!["Problem:".into()],
        })
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["exact_match"]
    }
    fn headline(&self) -> &'static str {
        "exact_match"
    }
    fn score(&self, doc: &Doc, response: &Response) -> Result<Vec<f64>> {
        let Response::Text(text) = response else {
            return Err(Error::Data("math was answered with log-likelihoods".into()));
        };
        let dollars: Vec<usize> = text.match_indices('$').map(|(i, _)| i).collect();
        let answer = match dollars.as_slice() {
            [first, .., last] => &text[first + 1..*last],
            _ => text.as_str(),
        };
        Ok(vec![f64::from(is_equiv(answer, &Self::answer(doc)?))])
    }
    fn target(&self, doc: &Doc) -> Result<String> {
        Self::answer(doc)
    }
    fn processed(&self, doc: &Doc) -> Result<Map<String, Value>> {
        let mut fields = doc.fields.clone();
        fields.insert("answer".into(), Value::String(Self::answer(doc)?));
        Ok(fields)
    }
    fn integer_scores(&self) -> bool {
        true
    }
    fn harness_name(&self, subset: &str) -> String {
        format!("hendrycks_math_{}", subject_name(subset))
    }
}

/// The harness's name of a MATH subject, from its `type` or its hub directory.
fn subject_name(subset: &str) -> String {
    match subset {
        "Algebra" | "algebra" => "algebra".into(),
        "Counting & Probability" | "counting_and_probability" => "counting_and_prob".into(),
        "Geometry" | "geometry" => "geometry".into(),
        "Intermediate Algebra" | "intermediate_algebra" => "intermediate_algebra".into(),
        "Number Theory" | "number_theory" => "num_theory".into(),
        "Prealgebra" | "prealgebra" => "prealgebra".into(),
        "Precalculus" | "precalculus" => "precalc".into(),
        other => other
            .chars()
            .map(|c| {
                if c.is_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect(),
    }
}

/// The last `\boxed{…}` (or `\fbox{…}`, or `\boxed x`) of a solution, braces balanced.
pub fn last_boxed(text: &str) -> Option<&str> {
    if let Some((_, after)) = text.rsplit_once("\\boxed ") {
        let end = after.find('$').unwrap_or(after.len());
        let start = text.len() - after.len() - "\\boxed ".len();
        return Some(&text[start..text.len() - after.len() + end]);
    }
    let start = text.rfind("\\boxed").or_else(|| text.rfind("\\fbox"))?;
    let mut depth = 0i64;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[start..start + i + 1]);
                }
            }
            _ => {}
        }
    }
    None
}

/// `\boxed{x}` → `x`, `\boxed x` → `x`; `None` for anything else.
pub fn remove_boxed(boxed: &str) -> Option<&str> {
    if let Some(rest) = boxed.strip_prefix("\\boxed ") {
        return Some(rest);
    }
    boxed.strip_prefix("\\boxed{")?.strip_suffix('}')
}

/// Equal after normalization; when normalizing fails (where Python raises), equal as written.
pub fn is_equiv(a: &str, b: &str) -> bool {
    match (strip_string(a), strip_string(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// The Hendrycks normalization; `None` where the Python original raises.
pub fn strip_string(text: &str) -> Option<String> {
    let mut s = text
        .replace('\n', "")
        .replace("\\!", "")
        .replace("\\\\", "\\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac");
    s = s.replace("\\left", "").replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "");
    s = s.replace("\\$", "");
    s = remove_right_units(&s)?;
    s = s.replace("\\%", "");
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    let halves: Vec<&str> = s.split('=').collect();
    if halves.len() == 2 && halves[0].chars().count() <= 2 {
        s = halves[1].to_string();
    }
    s = fix_sqrt(&s)?;
    s = s.replace(' ', "");
    s = fix_fracs(&s)?;
    if s == "0.5" {
        s = "\\frac{1}{2}".into();
    }
    fix_a_slash_b(&s)
}

fn remove_right_units(s: &str) -> Option<String> {
    if !s.contains("\\text{ ") {
        return Some(s.to_string());
    }
    let parts: Vec<&str> = s.split("\\text{ ").collect();
    (parts.len() == 2).then(|| parts[0].to_string())
}

fn fix_sqrt(s: &str) -> Option<String> {
    let mut parts = s.split("\\sqrt");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        let first = part.chars().next()?;
        if first == '{' {
            out.push_str("\\sqrt");
            out.push_str(part);
        } else {
            out.push_str(&format!("\\sqrt{{{first}}}{}", &part[first.len_utf8()..]));
        }
    }
    Some(out)
}

fn fix_fracs(s: &str) -> Option<String> {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        out.push_str("\\frac");
        let chars: Vec<char> = part.chars().collect();
        match chars.as_slice() {
            [] => return None,
            ['{', ..] => out.push_str(part),
            [_] => return Some(s.to_string()),
            [a, '{', rest @ ..] => {
                out.push_str(&format!("{{{a}}}{{"));
                out.extend(rest);
            }
            [a, b, rest @ ..] => {
                out.push_str(&format!("{{{a}}}{{{b}}}"));
                out.extend(rest);
            }
        }
    }
    Some(out)
}

/// `a/b` of two integers written plainly → `\frac{a}{b}`.
fn fix_a_slash_b(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split('/').collect();
    let [a, b] = parts.as_slice() else {
        return Some(s.to_string());
    };
    // Python's int() raises on anything but an integer: the caller then compares as written.
    let (a, b) = (python_int(a)?, python_int(b)?);
    if s == format!("{a}/{b}") {
        Some(format!("\\frac{{{a}}}{{{b}}}"))
    } else {
        Some(s.to_string())
    }
}

/// `str(int(text))` for an integer literal; `None` where `int()` raises.
fn python_int(text: &str) -> Option<String> {
    let text = text.trim();
    let (sign, digits) = match text.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", text.strip_prefix('+').unwrap_or(text)),
    };
    let digits = digits.replace('_', "");
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    Some(match trimmed {
        "" => "0".into(),
        t => format!("{sign}{t}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_answers() {
        let solution = "So $x = \\boxed{\\frac{1}{2}}$.";
        assert_eq!(last_boxed(solution), Some("\\boxed{\\frac{1}{2}}"));
        assert_eq!(remove_boxed("\\boxed{\\frac{1}{2}}"), Some("\\frac{1}{2}"));
        assert_eq!(last_boxed("is \\boxed 5$."), Some("\\boxed 5"));
        assert_eq!(last_boxed("nothing"), None);
    }

    #[test]
    fn normalization_as_hendrycks() {
        assert!(is_equiv("0.5", "\\frac{1}{2}"));
        assert!(is_equiv("\\dfrac12", "\\frac{1}{2}"));
        assert!(is_equiv("1/2", "\\frac{1}{2}"));
        assert!(is_equiv("x = 3", "3"));
        assert!(is_equiv("\\sqrt2", "\\sqrt{2}"));
        assert!(is_equiv("10\\%", "10"));
        assert!(is_equiv("5 \\text{ cm}", "5"));
        assert!(!is_equiv("3", "4"));
        // int("a") raises in Python: compared as written.
        assert!(!is_equiv("a/b", "\\frac{a}{b}"));
    }
}
