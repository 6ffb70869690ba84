//! Coverage audit (paper §"Selecting P-KL vs H-KL via Coverage Analysis", Table
//! "audit_qwen_phi"): how much of each category of student tokens lands in GOLD's strict common
//! set C and in H-KL's relaxed set, and which loss that recommends.
//!
//! Categories partition the student vocabulary (padding excluded); a token's category is read
//! from its exact bytes, one optional leading space allowed. Numerals count ASCII digits only: the
//! paper's table lists 13 one-digit Llama numerals, which matches no ASCII-only count (Llama-3 has
//! ten), so superscripts and other Unicode digits fall under `non_ascii` here.

use xtoken_kernels::LossKind;

use crate::common::CommonSet;
use crate::error::{Error, Result};
use crate::projection::SparseProjection;
use crate::vocab::{TokenKind, Vocabulary};

/// A category of student tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// One ASCII digit.
    Digits1,
    /// Two ASCII digits.
    Digits2,
    /// Three ASCII digits.
    Digits3,
    /// Four or more ASCII digits.
    DigitsLong,
    /// ASCII punctuation only.
    AsciiPunct,
    /// ASCII letters only: words with and without a leading space.
    Alpha,
    /// Spaces, tabs and newlines only.
    Whitespace,
    /// Other ASCII mixtures (`_init`, `x2`, ` a.`).
    OtherAscii,
    /// Any byte outside ASCII: multi-byte characters and pieces of them.
    NonAscii,
    /// SentencePiece `<0xHH>` byte-fallback tokens.
    ByteFallback,
    /// Special tokens.
    Special,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 11] = [
        Category::Digits1,
        Category::Digits2,
        Category::Digits3,
        Category::DigitsLong,
        Category::AsciiPunct,
        Category::Alpha,
        Category::Whitespace,
        Category::OtherAscii,
        Category::NonAscii,
        Category::ByteFallback,
        Category::Special,
    ];

    /// The stable name used in JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Category::Digits1 => "digits_1",
            Category::Digits2 => "digits_2",
            Category::Digits3 => "digits_3",
            Category::DigitsLong => "digits_long",
            Category::AsciiPunct => "ascii_punct",
            Category::Alpha => "alpha",
            Category::Whitespace => "whitespace",
            Category::OtherAscii => "other_ascii",
            Category::NonAscii => "non_ascii",
            Category::ByteFallback => "byte_fallback",
            Category::Special => "special",
        }
    }

    /// What a person reads in the Markdown table.
    pub fn label(self) -> &'static str {
        match self {
            Category::Digits1 => "1-digit numerals",
            Category::Digits2 => "2-digit numerals",
            Category::Digits3 => "3-digit numerals",
            Category::DigitsLong => "4+-digit numerals",
            Category::AsciiPunct => "ASCII punctuation",
            Category::Alpha => "ASCII alphabetic words",
            Category::Whitespace => "whitespace",
            Category::OtherAscii => "other ASCII",
            Category::NonAscii => "non-ASCII / multi-byte",
            Category::ByteFallback => "byte fallback <0xHH>",
            Category::Special => "special",
        }
    }

    /// Parses a category name (`digits_2`).
    pub fn parse(name: &str) -> Result<Self> {
        Category::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| Error::UnknownCategory {
                name: name.to_string(),
                known: Category::ALL.map(Category::name).join(", "),
            })
    }

    /// The category of a token given its kind and exact bytes.
    pub fn of(kind: TokenKind, bytes: &[u8]) -> Self {
        match kind {
            TokenKind::Special => return Category::Special,
            TokenKind::ByteFallback => return Category::ByteFallback,
            _ => {}
        }
        if !bytes.is_ascii() {
            return Category::NonAscii;
        }
        let body = bytes.strip_prefix(b" ").unwrap_or(bytes);
        if body.is_empty() || bytes.iter().all(u8::is_ascii_whitespace) {
            return Category::Whitespace;
        }
        if body.iter().all(u8::is_ascii_digit) {
            return match body.len() {
                1 => Category::Digits1,
                2 => Category::Digits2,
                3 => Category::Digits3,
                _ => Category::DigitsLong,
            };
        }
        if body.iter().all(u8::is_ascii_punctuation) {
            return Category::AsciiPunct;
        }
        if body.iter().all(u8::is_ascii_alphabetic) {
            return Category::Alpha;
        }
        Category::OtherAscii
    }
}

/// Audit settings.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Categories whose tokens must stay in C for H-KL to be safe (numerals by default).
    pub critical: Vec<Category>,
    /// Below this fraction of a critical category in C, P-KL is recommended ("mostly outside").
    pub min_coverage: f64,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            critical: vec![Category::Digits1, Category::Digits2, Category::Digits3],
            min_coverage: 0.5,
        }
    }
}

/// Coverage of one category.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CategoryCoverage {
    /// Category name (`digits_2`).
    pub name: &'static str,
    /// Student tokens in the category.
    pub total: usize,
    /// Of those, in GOLD's strict 1-to-1 common set C.
    pub common: usize,
    /// Of those, in H-KL's relaxed set (C extended by W's top-1).
    pub relaxed: usize,
    /// Of those, with a non-empty row in W (what P-KL supervises).
    pub projected: usize,
}

/// The audit of one student/teacher pair.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditReport {
    /// Student `tokenizer.json`.
    pub student: String,
    /// Teacher `tokenizer.json`.
    pub teacher: String,
    /// Per-category coverage, in [`Category::ALL`] order, empty categories left out.
    pub categories: Vec<CategoryCoverage>,
    /// The recommended loss: P-KL or H-KL.
    pub recommendation: LossKind,
    /// Why, in one sentence.
    pub reason: String,
}

/// Audits a pair given its projection W.
pub fn audit(
    student: &Vocabulary,
    teacher: &Vocabulary,
    w: &SparseProjection,
    options: &AuditOptions,
) -> AuditReport {
    let strict = CommonSet::strict(student, teacher);
    let relaxed = CommonSet::relaxed(&strict, w);
    let mut coverage: Vec<CategoryCoverage> = Category::ALL
        .iter()
        .map(|c| CategoryCoverage {
            name: c.name(),
            total: 0,
            common: 0,
            relaxed: 0,
            projected: 0,
        })
        .collect();
    for (s, token) in student.tokens().iter().enumerate() {
        if token.kind == TokenKind::Padding {
            continue;
        }
        let s = s as u32;
        let category = Category::of(token.kind, &token.bytes);
        let slot = Category::ALL.iter().position(|&c| c == category);
        let Some(entry) = slot.map(|i| &mut coverage[i]) else {
            continue;
        };
        entry.total += 1;
        entry.common += strict.contains_student(s) as usize;
        entry.relaxed += relaxed.contains_student(s) as usize;
        entry.projected += w.top1(s).is_some() as usize;
    }
    let (recommendation, reason) = recommend(&coverage, options);
    coverage.retain(|c| c.total > 0);
    AuditReport {
        student: student.path().display().to_string(),
        teacher: teacher.path().display().to_string(),
        categories: coverage,
        recommendation,
        reason,
    }
}

fn percent(part: usize, total: usize) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

fn recommend(coverage: &[CategoryCoverage], options: &AuditOptions) -> (LossKind, String) {
    let critical: Vec<(Category, &CategoryCoverage)> = options
        .critical
        .iter()
        .filter_map(|&c| {
            coverage
                .iter()
                .find(|cov| cov.name == c.name())
                .filter(|cov| cov.total > 0)
                .map(|cov| (c, cov))
        })
        .collect();
    let worst = critical.iter().min_by(|a, b| {
        let fa = a.1.common as f64 / a.1.total as f64;
        let fb = b.1.common as f64 / b.1.total as f64;
        fa.total_cmp(&fb)
    });
    let Some(&(category, cov)) = worst else {
        return (
            LossKind::Hkl,
            "The student has no tokens in the critical categories, so nothing critical is routed \
             to rank-matched ULD and H-KL's sharper common-KL applies."
                .to_string(),
        );
    };
    let fraction = cov.common as f64 / cov.total as f64;
    if fraction < options.min_coverage {
        (
            LossKind::Pkl,
            format!(
                "Only {}/{} {} ({:.0}%) are in the strict common set C, so GOLD-style partitions \
                 would supervise them by rank-matched ULD; P-KL reaches {}/{} of them through W.",
                cov.common,
                cov.total,
                category.label(),
                percent(cov.common, cov.total),
                cov.projected,
                cov.total
            ),
        )
    } else {
        (
            LossKind::Hkl,
            format!(
                "Every critical category keeps at least {:.0}% of its tokens in C (lowest: {} at \
                 {}/{}), so H-KL's direct common-KL gives sharper targets than P-KL's projection.",
                options.min_coverage * 100.0,
                category.label(),
                cov.common,
                cov.total
            ),
        )
    }
}

impl AuditReport {
    /// The report as a Markdown table with the recommendation below it.
    pub fn to_markdown(&self) -> String {
        let cell = |n: usize, total: usize| format!("{n}/{total} ({:.0}%)", percent(n, total));
        let mut out = format!(
            "# Coverage audit\n\nstudent: `{}`  \nteacher: `{}`\n\n\
             | category | name | total | common C (GOLD) | relaxed C (H-KL) | row in W (P-KL) |\n\
             |---|---|---:|---:|---:|---:|\n",
            self.student, self.teacher
        );
        let mut sums = [0usize; 4];
        for c in &self.categories {
            let label = Category::parse(c.name)
                .map(Category::label)
                .unwrap_or(c.name);
            out += &format!(
                "| {label} | `{}` | {} | {} | {} | {} |\n",
                c.name,
                c.total,
                cell(c.common, c.total),
                cell(c.relaxed, c.total),
                cell(c.projected, c.total)
            );
            for (sum, v) in sums
                .iter_mut()
                .zip([c.total, c.common, c.relaxed, c.projected])
            {
                *sum += v;
            }
        }
        out += &format!(
            "| **all** | | {} | {} | {} | {} |\n\n",
            sums[0],
            cell(sums[1], sums[0]),
            cell(sums[2], sums[0]),
            cell(sums[3], sums[0])
        );
        out += &format!(
            "**Recommendation: {}.** {}\n",
            self.recommendation.name(),
            self.reason
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_read_from_bytes() {
        let n = TokenKind::Normal;
        assert_eq!(Category::of(n, b"7"), Category::Digits1);
        assert_eq!(Category::of(n, b" 42"), Category::Digits2);
        assert_eq!(Category::of(n, b"201"), Category::Digits3);
        assert_eq!(Category::of(n, b"2024"), Category::DigitsLong);
        assert_eq!(Category::of(n, b" ,"), Category::AsciiPunct);
        assert_eq!(Category::of(n, b"...)"), Category::AsciiPunct);
        assert_eq!(Category::of(n, b" the"), Category::Alpha);
        assert_eq!(Category::of(n, b"The"), Category::Alpha);
        assert_eq!(Category::of(n, b"\n\n"), Category::Whitespace);
        assert_eq!(Category::of(n, b" "), Category::Whitespace);
        assert_eq!(Category::of(n, b"_init"), Category::OtherAscii);
        assert_eq!(Category::of(n, "²".as_bytes()), Category::NonAscii);
        assert_eq!(Category::of(n, &[0xE2]), Category::NonAscii);
        assert_eq!(
            Category::of(TokenKind::ByteFallback, b"A"),
            Category::ByteFallback
        );
        assert_eq!(Category::of(TokenKind::Special, b"<s>"), Category::Special);
    }

    fn cov(name: &'static str, total: usize, common: usize) -> CategoryCoverage {
        CategoryCoverage {
            name,
            total,
            common,
            relaxed: common,
            projected: total,
        }
    }

    #[test]
    fn numerals_outside_c_recommend_pkl() {
        let c = [
            cov("digits_1", 10, 10),
            cov("digits_2", 100, 0),
            cov("digits_3", 1000, 0),
        ];
        let (choice, reason) = recommend(&c, &AuditOptions::default());
        assert_eq!(choice, LossKind::Pkl);
        assert!(reason.contains("0/100 2-digit numerals"), "{reason}");
    }

    #[test]
    fn numerals_inside_c_recommend_hkl() {
        let c = [
            cov("digits_1", 10, 10),
            cov("digits_2", 100, 100),
            cov("digits_3", 1000, 999),
        ];
        let (choice, reason) = recommend(&c, &AuditOptions::default());
        assert_eq!(choice, LossKind::Hkl);
        assert!(reason.contains("3-digit numerals at 999/1000"), "{reason}");
    }

    #[test]
    fn unknown_category_lists_the_known_ones() {
        let err = Category::parse("digits_9").unwrap_err().to_string();
        assert!(
            err.contains("digits_9") && err.contains("ascii_punct"),
            "{err}"
        );
    }
}
