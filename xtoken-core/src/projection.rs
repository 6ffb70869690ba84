//! The projection matrix W `[V_S, V_T]` (paper §2.2, Algorithm "Rule-based projection matrix
//! construction"), stored sparse as fixed top-K rows.
//!
//! 1. Exact pass: `W[s,t] = 1` for the canonical partners of `s` ([`crate::matching`]); special
//!    tokens pair by role.
//! 2. Multi-token pass: every row still empty re-encodes its token's exact bytes with the teacher
//!    tokenizer into `(τ_0..τ_{ℓ-1})`; if `ℓ ≤ L`, `W[s,τ_i] = β·γ^i`.
//! 3. Each row keeps its top-K entries and is normalized to sum to 1, so `Wᵀp` is a distribution
//!    whenever `p` is.
//!
//! Two choices where the paper's pseudocode is silent or lossy, both for faithfulness to bytes:
//! a teacher token that repeats within one re-encoding (`"000"` → `0 0 0`) keeps the weight of its
//! first, heaviest position (the pseudocode's overwrite would demote the leading sub-token); and a
//! student token that is not valid UTF-8 (a piece of a multi-byte character) is re-encoded as its
//! valid runs plus the teacher's single-byte tokens for the rest, instead of being decoded to `�`.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};
use crate::matching::{ExactMatcher, Partners};
use crate::vocab::{TokenKind, Vocabulary};

/// Metadata field of a stored projection holding the xxh3-64 of its tensors' bytes (`indices`
/// then `weights`); files written elsewhere may lack it.
const CHECKSUM: &str = "data_xxh3";

/// The hex xxh3-64 of W's index bytes followed by its weight bytes.
fn data_checksum(indices: &[u8], weights: &[u8]) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(indices);
    hasher.update(weights);
    format!("{:016x}", hasher.digest())
}

/// Value of the `format` metadata field of a stored projection.
pub const FORMAT: &str = "xtoken-projection/1";

/// Parameters of the rule-based construction; defaults are the paper's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ProjectionParams {
    /// Entries kept per row (K = 4).
    pub top_k: usize,
    /// Longest teacher re-encoding accepted by the multi-token pass (L = 4).
    pub max_span: usize,
    /// Weight of the first sub-token (β = 0.9).
    pub beta: f64,
    /// Decay per further sub-token (γ = 0.1).
    pub gamma: f64,
}

impl Default for ProjectionParams {
    fn default() -> Self {
        ProjectionParams {
            top_k: 4,
            max_span: 4,
            beta: 0.9,
            gamma: 0.1,
        }
    }
}

impl ProjectionParams {
    /// Checks that the parameters define a valid construction.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: String, why| Err(Error::BadParameter { name, value, why });
        if self.top_k == 0 || self.top_k > 1024 {
            return bad("top_k", self.top_k.to_string(), "must be in 1..=1024");
        }
        if self.max_span == 0 {
            return bad("max_span", self.max_span.to_string(), "must be at least 1");
        }
        if !(self.beta.is_finite() && self.beta > 0.0) {
            return bad(
                "beta",
                self.beta.to_string(),
                "must be a finite positive number",
            );
        }
        if !(self.gamma.is_finite() && self.gamma > 0.0 && self.gamma <= 1.0) {
            return bad(
                "gamma",
                self.gamma.to_string(),
                "must be in (0, 1] so that earlier sub-tokens weigh at least as much",
            );
        }
        Ok(())
    }
}

/// Where a row of W came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowSource {
    /// Canonical exact match (pass 1).
    Exact,
    /// Special token paired by role or text (rule 5).
    Special,
    /// Teacher re-encoding of the token's text (pass 2).
    MultiToken,
    /// No teacher counterpart; the row is all empty slots.
    Empty,
    /// A padding id past the student tokenizer; the row is all empty slots.
    Padding,
}

/// Why a row stayed empty.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum EmptyReason {
    /// A special token with no unambiguous counterpart by role or text.
    UnpairedSpecial,
    /// The teacher re-encoding is longer than `max_span`.
    TooLong {
        /// Length of the teacher re-encoding.
        length: usize,
    },
    /// A byte of a partial UTF-8 token has no single-byte token in the teacher vocabulary.
    NoByteToken {
        /// The byte without a teacher token.
        byte: u8,
    },
    /// The teacher tokenizer encoded the text to nothing.
    EncodedToNothing,
}

/// Where the rows of a freshly built W came from, and why the empty ones are empty.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildReport {
    /// Source of each row, indexed by student id.
    pub sources: Vec<RowSource>,
    /// Every empty row (padding excluded) with its reason.
    pub empty: Vec<(u32, EmptyReason)>,
}

impl BuildReport {
    /// Number of rows from `source`.
    pub fn count(&self, source: RowSource) -> usize {
        self.sources.iter().filter(|&&s| s == source).count()
    }
}

/// Where a stored projection came from: the tokenizer files and the parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Provenance {
    /// SHA-256 of the student's `tokenizer.json`.
    pub student_sha256: String,
    /// SHA-256 of the teacher's `tokenizer.json`.
    pub teacher_sha256: String,
    /// The student tokenizer path as given when building (informational).
    pub student_tokenizer: String,
    /// The teacher tokenizer path as given when building (informational).
    pub teacher_tokenizer: String,
    /// Construction parameters.
    pub params: ProjectionParams,
}

/// The order of a row's entries: heaviest first, ties broken by the lower teacher id, so that
/// the first slot (H-KL's pairing) does not depend on how a file listed them.
fn heaviest_first<W: PartialOrd>(a: &(u32, W), b: &(u32, W)) -> std::cmp::Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// Puts every row of a loaded W in [`heaviest_first`] order, empty slots last.
fn sort_rows(indices: &mut [i32], weights: &mut [f32], top_k: usize) {
    let mut row = Vec::with_capacity(top_k);
    for (ids, ws) in indices
        .chunks_exact_mut(top_k)
        .zip(weights.chunks_exact_mut(top_k))
    {
        row.clear();
        row.extend(
            ids.iter()
                .zip(ws.iter())
                .filter(|(&t, _)| t >= 0)
                .map(|(&t, &w)| (t as u32, w)),
        );
        row.sort_by(heaviest_first);
        ids.fill(-1);
        ws.fill(0.0);
        for (k, &(t, w)) in row.iter().enumerate() {
            ids[k] = t as i32;
            ws[k] = w;
        }
    }
}

/// W as fixed top-K rows: `indices [V_S, K]` (−1 = empty slot) and `weights [V_S, K]`, slots of a
/// row sorted by weight, heaviest first; every non-empty row sums to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseProjection {
    indices: Vec<i32>,
    weights: Vec<f32>,
    student_vocab_size: usize,
    teacher_vocab_size: usize,
    top_k: usize,
    provenance: Option<Provenance>,
}

impl SparseProjection {
    /// Builds W from two vocabularies (Algorithm "Rule-based projection matrix construction").
    pub fn build(
        student: &Vocabulary,
        teacher: &Vocabulary,
        params: ProjectionParams,
    ) -> Result<(Self, BuildReport)> {
        params.validate()?;
        let matcher = ExactMatcher::new(student, teacher);
        let n_rows = student.size();
        let mut rows: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n_rows];
        let mut sources = vec![RowSource::Padding; n_rows];
        let mut empty = Vec::new();
        let mut pending = Vec::new();
        for (s, token) in student.tokens().iter().enumerate() {
            if token.kind == TokenKind::Padding {
                continue;
            }
            match matcher.partners(token) {
                Partners::Text(ts) => {
                    rows[s] = ts.into_iter().map(|t| (t, 1.0)).collect();
                    sources[s] = RowSource::Exact;
                }
                Partners::Special(t) => {
                    rows[s] = vec![(t, 1.0)];
                    sources[s] = RowSource::Special;
                }
                Partners::None if token.kind == TokenKind::Special => {
                    sources[s] = RowSource::Empty;
                    empty.push((s as u32, EmptyReason::UnpairedSpecial));
                }
                Partners::None => pending.push(s as u32),
            }
        }

        let encoded = encode_token_texts(student, teacher, &pending)?;
        for (&s, result) in pending.iter().zip(encoded) {
            let outcome = result.and_then(|ids| {
                if ids.is_empty() {
                    Err(EmptyReason::EncodedToNothing)
                } else if ids.len() > params.max_span {
                    Err(EmptyReason::TooLong { length: ids.len() })
                } else {
                    Ok(ids)
                }
            });
            match outcome {
                Ok(ids) => {
                    let mut row: Vec<(u32, f64)> = Vec::with_capacity(ids.len());
                    let mut weight = params.beta;
                    for t in ids {
                        if !row.iter().any(|&(seen, _)| seen == t) {
                            row.push((t, weight));
                        }
                        weight *= params.gamma;
                    }
                    rows[s as usize] = row;
                    sources[s as usize] = RowSource::MultiToken;
                }
                Err(reason) => {
                    sources[s as usize] = RowSource::Empty;
                    empty.push((s, reason));
                }
            }
        }
        empty.sort_by_key(|&(s, _)| s);

        let provenance = Provenance {
            student_sha256: student.sha256().to_string(),
            teacher_sha256: teacher.sha256().to_string(),
            student_tokenizer: student.path().display().to_string(),
            teacher_tokenizer: teacher.path().display().to_string(),
            params,
        };
        let w = Self::from_rows(&rows, teacher.size(), params.top_k, Some(provenance))?;
        Ok((w, BuildReport { sources, empty }))
    }

    /// Builds W from explicit rows of `(teacher id, non-negative weight)`: each row keeps its
    /// `top_k` heaviest entries (ties: the lower teacher id) and is normalized to sum to 1.
    pub fn from_rows(
        rows: &[Vec<(u32, f64)>],
        teacher_vocab_size: usize,
        top_k: usize,
        provenance: Option<Provenance>,
    ) -> Result<Self> {
        if top_k == 0 {
            return Err(Error::BadParameter {
                name: "top_k",
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        let mut indices = vec![-1i32; rows.len() * top_k];
        let mut weights = vec![0f32; rows.len() * top_k];
        for (s, row) in rows.iter().enumerate() {
            let mut kept: Vec<(u32, f64)> = Vec::with_capacity(row.len());
            for &(t, w) in row {
                if t as usize >= teacher_vocab_size || t > i32::MAX as u32 {
                    return Err(Error::BadParameter {
                        name: "teacher id",
                        value: format!("{t} in row {s}"),
                        why: "is past the teacher vocabulary",
                    });
                }
                if !(w.is_finite() && w >= 0.0) {
                    return Err(Error::BadParameter {
                        name: "weight",
                        value: format!("{w} in row {s}"),
                        why: "must be finite and non-negative",
                    });
                }
                match kept.iter_mut().find(|(seen, _)| *seen == t) {
                    Some(slot) => slot.1 = slot.1.max(w),
                    None if w > 0.0 => kept.push((t, w)),
                    None => {}
                }
            }
            kept.sort_by(heaviest_first);
            kept.truncate(top_k);
            let total: f64 = kept.iter().map(|&(_, w)| w).sum();
            for (k, &(t, w)) in kept.iter().enumerate() {
                indices[s * top_k + k] = t as i32;
                weights[s * top_k + k] = (w / total) as f32;
            }
        }
        Ok(SparseProjection {
            indices,
            weights,
            student_vocab_size: rows.len(),
            teacher_vocab_size,
            top_k,
            provenance,
        })
    }

    /// Rows: the student vocabulary size V_S (padding included).
    pub fn student_vocab_size(&self) -> usize {
        self.student_vocab_size
    }

    /// Columns: the teacher vocabulary size V_T (padding included).
    pub fn teacher_vocab_size(&self) -> usize {
        self.teacher_vocab_size
    }

    /// Slots per row, K.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// `indices [V_S, K]` row-major; −1 marks an empty slot.
    pub fn indices(&self) -> &[i32] {
        &self.indices
    }

    /// `weights [V_S, K]` row-major; 0 in empty slots.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// Where this projection came from, when known.
    pub fn provenance(&self) -> Option<&Provenance> {
        self.provenance.as_ref()
    }

    /// The non-empty slots of row `s`, heaviest first.
    pub fn row(&self, s: u32) -> impl Iterator<Item = (u32, f32)> + '_ {
        let start = s as usize * self.top_k;
        let end = (start + self.top_k).min(self.indices.len());
        let start = start.min(end);
        self.indices[start..end]
            .iter()
            .zip(&self.weights[start..end])
            .filter(|(&t, _)| t >= 0)
            .map(|(&t, &w)| (t as u32, w))
    }

    /// The heaviest teacher token of row `s`, `argmax_t W[s,t]`, if the row is not empty.
    pub fn top1(&self, s: u32) -> Option<(u32, f32)> {
        self.row(s).next().filter(|&(_, w)| w > 0.0)
    }

    /// `Wᵀp` in f64: a student distribution projected onto the teacher vocabulary.
    /// Panics if `p` is not of length V_S.
    pub fn project(&self, p: &[f64]) -> Vec<f64> {
        assert_eq!(p.len(), self.student_vocab_size, "p must have V_S entries");
        let mut out = vec![0.0; self.teacher_vocab_size];
        for (s, &ps) in p.iter().enumerate() {
            for (t, w) in self.row(s as u32) {
                out[t as usize] += w as f64 * ps;
            }
        }
        out
    }

    /// Writes W as safetensors: `indices` (i32) and `weights` (f32), provenance in the metadata.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let index_bytes: Vec<u8> = self.indices.iter().flat_map(|v| v.to_le_bytes()).collect();
        let weight_bytes: Vec<u8> = self.weights.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = vec![self.student_vocab_size, self.top_k];
        let bad = |e: safetensors::SafeTensorError| Error::BadProjectionFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let tensors = [
            (
                "indices",
                TensorView::new(Dtype::I32, shape.clone(), &index_bytes).map_err(bad)?,
            ),
            (
                "weights",
                TensorView::new(Dtype::F32, shape, &weight_bytes).map_err(bad)?,
            ),
        ];
        let mut metadata = self.metadata();
        metadata.insert(CHECKSUM.into(), data_checksum(&index_bytes, &weight_bytes));
        let bytes = safetensors::serialize(tensors, Some(metadata)).map_err(bad)?;
        std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
    }

    fn metadata(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        m.insert("format".into(), FORMAT.into());
        m.insert("xtoken_version".into(), env!("CARGO_PKG_VERSION").into());
        m.insert(
            "student_vocab_size".into(),
            self.student_vocab_size.to_string(),
        );
        m.insert(
            "teacher_vocab_size".into(),
            self.teacher_vocab_size.to_string(),
        );
        m.insert("top_k".into(), self.top_k.to_string());
        if let Some(p) = &self.provenance {
            m.insert("student_sha256".into(), p.student_sha256.clone());
            m.insert("teacher_sha256".into(), p.teacher_sha256.clone());
            m.insert("student_tokenizer".into(), p.student_tokenizer.clone());
            m.insert("teacher_tokenizer".into(), p.teacher_tokenizer.clone());
            m.insert("max_span".into(), p.params.max_span.to_string());
            m.insert("beta".into(), p.params.beta.to_string());
            m.insert("gamma".into(), p.params.gamma.to_string());
        }
        m
    }

    /// Reads a stored W and checks it: shapes, index range, non-negative finite weights, rows
    /// summing to 1. Accepts `indices` as i32 or i64.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let fail = |message: String| Error::BadProjectionFile {
            path: path.to_path_buf(),
            message,
        };
        let tensors = SafeTensors::deserialize(&bytes)
            .map_err(|e| fail(format!("not a safetensors file: {e}")))?;
        let (_, header) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| fail(format!("not a safetensors file: {e}")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let get = |name: &str| meta.get(name).map(String::as_str);
        if let Some(format) = get("format").filter(|&f| f != FORMAT) {
            return Err(fail(format!(
                "metadata format = {format:?}: this xtoken reads {FORMAT:?} (a W written by \
                 another version; rebuild it with `xtoken projection build`)"
            )));
        }
        let parse_usize = |name: &str| -> Result<Option<usize>> {
            get(name)
                .map(|v| {
                    v.parse::<usize>()
                        .map_err(|_| fail(format!("metadata `{name}` = {v:?} is not a count")))
                })
                .transpose()
        };
        let parse_f64 = |name: &str, default: f64| -> Result<f64> {
            get(name).map_or(Ok(default), |v| {
                v.parse::<f64>()
                    .map_err(|_| fail(format!("metadata `{name}` = {v:?} is not a number")))
            })
        };

        let index_view = tensors
            .tensor("indices")
            .map_err(|_| fail("no tensor named `indices`".into()))?;
        let weight_view = tensors
            .tensor("weights")
            .map_err(|_| fail("no tensor named `weights`".into()))?;
        if let Some(want) = get(CHECKSUM) {
            let got = data_checksum(index_view.data(), weight_view.data());
            if got != want {
                return Err(fail(format!(
                    "the tensors' bytes do not match the metadata {CHECKSUM} ({got} where {want} was written): the file is damaged"
                )));
            }
        }
        let shape = index_view.shape().to_vec();
        if shape.len() != 2 || shape[1] == 0 {
            return Err(fail(format!(
                "`indices` has shape {shape:?}; expected [V_S, K] with K ≥ 1"
            )));
        }
        if weight_view.shape() != shape.as_slice() {
            return Err(fail(format!(
                "`weights` has shape {:?} but `indices` has {shape:?}",
                weight_view.shape()
            )));
        }
        let mut indices: Vec<i32> = match index_view.dtype() {
            Dtype::I32 => index_view
                .data()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::I64 => index_view
                .data()
                .chunks_exact(8)
                .map(|c| {
                    let v = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                    i32::try_from(v).map_err(|_| fail(format!("index {v} does not fit in i32")))
                })
                .collect::<Result<_>>()?,
            other => {
                return Err(fail(format!(
                    "`indices` has dtype {other:?}; expected I32 or I64"
                )))
            }
        };
        if weight_view.dtype() != Dtype::F32 {
            return Err(fail(format!(
                "`weights` has dtype {:?}; expected F32",
                weight_view.dtype()
            )));
        }
        let mut weights: Vec<f32> = weight_view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (n_rows, top_k) = (shape[0], shape[1]);
        if let Some(v) = parse_usize("student_vocab_size")? {
            if v != n_rows {
                return Err(fail(format!(
                    "metadata student_vocab_size = {v} but the tensors have {n_rows} rows"
                )));
            }
        }
        let max_index = indices.iter().copied().max().unwrap_or(-1);
        let teacher_vocab_size =
            parse_usize("teacher_vocab_size")?.unwrap_or((max_index + 1).max(0) as usize);

        for s in 0..n_rows {
            let slots = s * top_k..(s + 1) * top_k;
            let mut total = 0.0f64;
            for k in slots.clone() {
                let (t, w) = (indices[k], weights[k]);
                if t < -1 || (t >= 0 && t as usize >= teacher_vocab_size) {
                    return Err(fail(format!(
                        "row {s}: index {t} outside -1..{teacher_vocab_size}"
                    )));
                }
                if !(w.is_finite() && w >= 0.0) || (t == -1 && w != 0.0) {
                    return Err(fail(format!(
                        "row {s}: weight {w} for index {t} (weights must be finite, non-negative, 0 in empty slots)"
                    )));
                }
                if t >= 0 && indices[slots.clone()].iter().filter(|&&u| u == t).count() > 1 {
                    return Err(fail(format!("row {s}: teacher index {t} appears twice")));
                }
                total += w as f64;
            }
            let has_entry = indices[slots].iter().any(|&t| t >= 0);
            if has_entry && (total - 1.0).abs() > 1e-4 {
                return Err(fail(format!("row {s}: weights sum to {total}, not 1")));
            }
        }

        if n_rows > 0 && indices.iter().all(|&t| t < 0) {
            return Err(fail(format!(
                "all {n_rows} rows are empty: W maps no student token to the teacher"
            )));
        }
        sort_rows(&mut indices, &mut weights, top_k);

        let provenance = match (get("student_sha256"), get("teacher_sha256")) {
            (Some(student), Some(teacher)) => Some(Provenance {
                student_sha256: student.to_string(),
                teacher_sha256: teacher.to_string(),
                student_tokenizer: get("student_tokenizer").unwrap_or_default().to_string(),
                teacher_tokenizer: get("teacher_tokenizer").unwrap_or_default().to_string(),
                params: ProjectionParams {
                    top_k,
                    max_span: parse_usize("max_span")?.unwrap_or(4),
                    beta: parse_f64("beta", 0.9)?,
                    gamma: parse_f64("gamma", 0.1)?,
                },
            }),
            _ => None,
        };
        Ok(SparseProjection {
            indices,
            weights,
            student_vocab_size: n_rows,
            teacher_vocab_size,
            top_k,
            provenance,
        })
    }

    /// Loads a stored W and checks it was built from exactly these tokenizer files (by SHA-256)
    /// and for these vocabulary sizes.
    pub fn load_verified(
        path: impl AsRef<Path>,
        student: &Vocabulary,
        teacher: &Vocabulary,
    ) -> Result<Self> {
        let path = path.as_ref();
        let w = Self::load(path)?;
        let Some(p) = &w.provenance else {
            return Err(Error::BadProjectionFile {
                path: path.to_path_buf(),
                message:
                    "no student_sha256/teacher_sha256 metadata to verify the tokenizers against"
                        .into(),
            });
        };
        for (side, expected, vocab) in [
            ("student", &p.student_sha256, student),
            ("teacher", &p.teacher_sha256, teacher),
        ] {
            if expected != vocab.sha256() {
                return Err(Error::ProvenanceMismatch {
                    path: path.to_path_buf(),
                    side,
                    expected: expected.clone(),
                    given: vocab.path().to_path_buf(),
                    actual: vocab.sha256().to_string(),
                });
            }
        }
        for (what, stored, given) in [
            ("student", w.student_vocab_size, student.size()),
            ("teacher", w.teacher_vocab_size, teacher.size()),
        ] {
            if stored != given {
                return Err(Error::BadProjectionFile {
                    path: path.to_path_buf(),
                    message: format!(
                        "built for a {what} vocabulary of {stored} rows, but it has {given} (check --{what}-vocab-size)"
                    ),
                });
            }
        }
        Ok(w)
    }
}

/// One piece of a student token's bytes, as the teacher will encode it.
enum Piece {
    /// A valid UTF-8 run: index into the batch of texts to encode.
    Text(usize),
    /// A byte that is not part of valid UTF-8.
    Byte(u8),
}

/// Teacher re-encodings of the given student tokens' exact bytes, in one parallel batch.
fn encode_token_texts(
    student: &Vocabulary,
    teacher: &Vocabulary,
    rows: &[u32],
) -> Result<Vec<std::result::Result<Vec<u32>, EmptyReason>>> {
    let mut texts: Vec<&str> = Vec::with_capacity(rows.len());
    let mut plans: Vec<Vec<Piece>> = Vec::with_capacity(rows.len());
    for &s in rows {
        let bytes = &student.tokens()[s as usize].bytes;
        let mut plan = Vec::new();
        for chunk in bytes.utf8_chunks() {
            if !chunk.valid().is_empty() {
                plan.push(Piece::Text(texts.len()));
                texts.push(chunk.valid());
            }
            plan.extend(chunk.invalid().iter().map(|&b| Piece::Byte(b)));
        }
        plans.push(plan);
    }
    let encoded = teacher.encode_pieces(&texts)?;
    let byte_tokens = single_byte_tokens(teacher);
    Ok(plans
        .into_iter()
        .map(|plan| {
            let mut ids = Vec::new();
            for piece in plan {
                match piece {
                    Piece::Text(i) => ids.extend_from_slice(&encoded[i]),
                    Piece::Byte(b) => match byte_tokens[b as usize] {
                        Some(t) => ids.push(t),
                        None => return Err(EmptyReason::NoByteToken { byte: b }),
                    },
                }
            }
            Ok(ids)
        })
        .collect())
}

/// For each byte, the teacher token that is exactly that byte (an ordinary token before a
/// `<0xHH>` byte-fallback token).
fn single_byte_tokens(vocab: &Vocabulary) -> [Option<u32>; 256] {
    let mut out = [None; 256];
    for (id, token) in vocab.tokens().iter().enumerate() {
        if token.bytes.len() != 1
            || !matches!(token.kind, TokenKind::Normal | TokenKind::ByteFallback)
        {
            continue;
        }
        let slot = &mut out[token.bytes[0] as usize];
        let better = match slot {
            None => true,
            Some(prev) => {
                vocab.tokens()[*prev as usize].kind == TokenKind::ByteFallback
                    && token.kind == TokenKind::Normal
            }
        };
        if better {
            *slot = Some(id as u32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rows_strategy() -> impl Strategy<Value = (Vec<Vec<(u32, f64)>>, usize, usize)> {
        (1usize..40, 1usize..6).prop_flat_map(|(v_t, k)| {
            let row = proptest::collection::vec((0..v_t as u32, 0.0f64..5.0), 0..8);
            (proptest::collection::vec(row, 1..30), Just(v_t), Just(k))
        })
    }

    #[test]
    fn paper_weights_for_spans_of_two_to_four() {
        // Appendix "Multi-token weight decay": (0.909, 0.091), (0.9009, 0.0901, 0.0090), ...
        let spans = [2usize, 3, 4];
        let rows: Vec<Vec<(u32, f64)>> = spans
            .iter()
            .map(|&l| {
                (0..l)
                    .map(|i| (i as u32, 0.9 * 0.1f64.powi(i as i32)))
                    .collect()
            })
            .collect();
        let w = SparseProjection::from_rows(&rows, 8, 4, None).unwrap();
        let got: Vec<Vec<f32>> = (0..3).map(|s| w.row(s).map(|(_, v)| v).collect()).collect();
        let expect = [
            vec![0.909, 0.091],
            vec![0.9009, 0.0901, 0.0090],
            vec![0.9000, 0.0900, 0.0090, 0.0009],
        ];
        for (g, e) in got.iter().zip(expect.iter()) {
            assert_eq!(g.len(), e.len());
            for (a, b) in g.iter().zip(e) {
                assert!((a - b).abs() < 5e-4, "{g:?} vs {e:?}");
            }
        }
    }

    #[test]
    fn top_k_keeps_the_heaviest_then_normalizes() {
        let rows = vec![vec![(0, 0.1), (1, 0.5), (2, 0.3), (3, 0.05), (4, 0.05)]];
        let w = SparseProjection::from_rows(&rows, 5, 2, None).unwrap();
        let row: Vec<_> = w.row(0).collect();
        assert_eq!(row[0].0, 1);
        assert_eq!(row[1].0, 2);
        assert!((row[0].1 - 0.625).abs() < 1e-6 && (row[1].1 - 0.375).abs() < 1e-6);
    }

    #[test]
    fn bad_parameters_are_named() {
        let p = ProjectionParams {
            gamma: 1.5,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("gamma"));
        let p = ProjectionParams {
            top_k: 0,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("top_k"));
    }

    #[test]
    fn malformed_files_are_rejected_with_the_path() {
        let dir = std::env::temp_dir().join(format!("xtoken-proj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_st = dir.join("garbage.safetensors");
        std::fs::write(&not_st, b"hello").unwrap();
        let err = SparseProjection::load(&not_st).unwrap_err().to_string();
        assert!(err.contains("garbage.safetensors"), "{err}");

        // A row that does not sum to 1.
        let bad = dir.join("unnormalized.safetensors");
        let idx: Vec<u8> = [0i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let wts: Vec<u8> = [0.5f32, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = [
            (
                "indices",
                TensorView::new(Dtype::I32, vec![1, 2], &idx).unwrap(),
            ),
            (
                "weights",
                TensorView::new(Dtype::F32, vec![1, 2], &wts).unwrap(),
            ),
        ];
        std::fs::write(&bad, safetensors::serialize(views, None).unwrap()).unwrap();
        let err = SparseProjection::load(&bad).unwrap_err().to_string();
        assert!(err.contains("row 0") && err.contains("sum"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A saved W carries a checksum of its tensors: one flipped bit that every other check
    /// would pass (a teacher id moved to another valid id) is refused, naming the file.
    #[test]
    fn a_damaged_w_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("xtoken-proj-flip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rows = vec![vec![(2u32, 1.0)], vec![(0, 0.9), (1, 0.1)]];
        let w = SparseProjection::from_rows(&rows, 8, 2, None).unwrap();
        let path = dir.join("w.safetensors");
        w.save(&path).unwrap();
        assert_eq!(
            SparseProjection::load(&path).unwrap().indices(),
            w.indices()
        );
        let mut bytes = std::fs::read(&path).unwrap();
        // The indices [2, -1, 0, 1] as little-endian i32: 2 → 3 stays a valid teacher id.
        let pattern: Vec<u8> = [2i32, -1, 0, 1]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let at = bytes
            .windows(pattern.len())
            .position(|w| w == pattern.as_slice())
            .unwrap();
        bytes[at] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = SparseProjection::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("w.safetensors") && err.contains("damaged"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Writes W's rows with the slots in the order given (a file another tool wrote), with
    /// `metadata`'s format, and no checksum.
    fn write_slots(path: &Path, slots: &[[(i32, f32); 3]], format: &str) {
        let idx: Vec<u8> = slots
            .iter()
            .flatten()
            .flat_map(|(t, _)| t.to_le_bytes())
            .collect();
        let wts: Vec<u8> = slots
            .iter()
            .flatten()
            .flat_map(|(_, w)| w.to_le_bytes())
            .collect();
        let shape = vec![slots.len(), 3];
        let views = [
            (
                "indices",
                TensorView::new(Dtype::I32, shape.clone(), &idx).unwrap(),
            ),
            ("weights", TensorView::new(Dtype::F32, shape, &wts).unwrap()),
        ];
        let metadata = HashMap::from([
            ("format".to_string(), format.to_string()),
            ("teacher_vocab_size".to_string(), "8".to_string()),
        ]);
        std::fs::write(path, safetensors::serialize(views, Some(metadata)).unwrap()).unwrap();
    }

    /// The same W with each row's slots in another order (empty slots first, ties swapped,
    /// lightest first) loads as the same W: the first slot, which H-KL pairs with, and every
    /// projection (P-KL) are the same, so no loss depends on how a file lists a row.
    #[test]
    fn slot_order_in_a_file_does_not_change_w() {
        let dir = std::env::temp_dir().join(format!("xtoken-proj-order-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let heaviest_first = [
            [(3, 0.6), (1, 0.3), (5, 0.1)],
            [(2, 0.5), (6, 0.5), (-1, 0.0)],
            [(7, 1.0), (-1, 0.0), (-1, 0.0)],
            [(-1, 0.0), (-1, 0.0), (-1, 0.0)],
        ];
        let shuffled = [
            [(5, 0.1), (1, 0.3), (3, 0.6)],
            [(-1, 0.0), (6, 0.5), (2, 0.5)],
            [(-1, 0.0), (-1, 0.0), (7, 1.0)],
            [(-1, 0.0), (-1, 0.0), (-1, 0.0)],
        ];
        let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
        write_slots(&a, &heaviest_first, FORMAT);
        write_slots(&b, &shuffled, FORMAT);
        let (wa, wb) = (
            SparseProjection::load(&a).unwrap(),
            SparseProjection::load(&b).unwrap(),
        );
        assert_eq!(wa, wb);
        assert_eq!(wb.top1(0), Some((3, 0.6)));
        assert_eq!(wb.top1(1), Some((2, 0.5)), "a tie goes to the lower id");
        let p = [0.1, 0.2, 0.3, 0.4];
        assert_eq!(wa.project(&p), wb.project(&p));
        // Built rows follow the same order: a tie listed high id first still pairs the lower.
        let built = SparseProjection::from_rows(&[vec![(6, 1.0), (2, 1.0)]], 8, 2, None).unwrap();
        assert_eq!(built.top1(0), Some((2, 0.5)));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A W of another format version, or one whose rows are all empty, is refused by name.
    #[test]
    fn other_formats_and_empty_ws_are_refused() {
        let dir = std::env::temp_dir().join(format!("xtoken-proj-format-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.safetensors");
        write_slots(
            &path,
            &[[(3, 1.0), (-1, 0.0), (-1, 0.0)]],
            "xtoken-projection/99",
        );
        let err = SparseProjection::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("w.safetensors") && err.contains("xtoken-projection/99"),
            "{err}"
        );
        write_slots(&path, &[[(-1, 0.0); 3], [(-1, 0.0); 3]], FORMAT);
        let err = SparseProjection::load(&path).unwrap_err().to_string();
        assert!(err.contains("all 2 rows are empty"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    proptest! {
        #[test]
        fn rows_sum_to_one_and_respect_top_k((rows, v_t, k) in rows_strategy()) {
            let w = SparseProjection::from_rows(&rows, v_t, k, None).unwrap();
            for s in 0..rows.len() as u32 {
                let row: Vec<_> = w.row(s).collect();
                prop_assert!(row.len() <= k);
                if !row.is_empty() {
                    let total: f64 = row.iter().map(|&(_, v)| v as f64).sum();
                    prop_assert!((total - 1.0).abs() < 1e-6, "row {} sums to {}", s, total);
                    prop_assert!(row.windows(2).all(|p| p[0].1 >= p[1].1));
                }
            }
        }

        #[test]
        fn projection_of_a_distribution_is_a_distribution(
            (rows, v_t, k) in rows_strategy(), seed in proptest::collection::vec(0.0f64..1.0, 30)) {
            let w = SparseProjection::from_rows(&rows, v_t, k, None).unwrap();
            // Only rows with entries carry mass: Wᵀp sums to the mass on non-empty rows.
            let p: Vec<f64> = (0..rows.len()).map(|s| if w.row(s as u32).next().is_some() { seed[s] } else { 0.0 }).collect();
            let z: f64 = p.iter().sum();
            prop_assume!(z > 0.0);
            let p: Vec<f64> = p.iter().map(|v| v / z).collect();
            let q = w.project(&p);
            prop_assert!(q.iter().all(|&v| v >= 0.0));
            prop_assert!((q.iter().sum::<f64>() - 1.0).abs() < 1e-6);
        }

        #[test]
        fn save_then_load_is_identity((rows, v_t, k) in rows_strategy()) {
            let provenance = Provenance {
                student_sha256: "a".repeat(64),
                teacher_sha256: "b".repeat(64),
                student_tokenizer: "student/tokenizer.json".into(),
                teacher_tokenizer: "teacher/tokenizer.json".into(),
                params: ProjectionParams { top_k: k, max_span: 3, beta: 0.8, gamma: 0.25 },
            };
            let w = SparseProjection::from_rows(&rows, v_t, k, Some(provenance)).unwrap();
            // A W with no entry at all is refused on load (other_formats_and_empty_ws_are_refused).
            prop_assume!(w.indices().iter().any(|&t| t >= 0));
            let file = std::env::temp_dir().join(format!("xtoken-roundtrip-{}-{}.safetensors", std::process::id(), rows.len() * 100 + k));
            w.save(&file).unwrap();
            let back = SparseProjection::load(&file).unwrap();
            std::fs::remove_file(&file).ok();
            prop_assert_eq!(back, w);
        }
    }
}
