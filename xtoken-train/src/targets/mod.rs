//! Stored teacher targets: what one pass of a teacher over a corpus (`xtoken teach`) keeps so
//! that any number of training runs, with students of **any** tokenizer, distill from it
//! without loading the teacher.
//!
//! The chunk merge of a chunk starting at teacher position `a` reads, on the teacher's side,
//! the distribution at position `a − 1` and the log-probabilities of the chunk's observed
//! continuation tokens (the paper's chain rule). Both are properties of the teacher's own
//! positions, not of the student: so a stored pass keeps, per document and position, the
//! teacher's token, its top-K tokens with their tempered log-probabilities, the tempered
//! log-probability of the observed next token, and the untempered confidence terms of adaptive
//! weighting. A training run aligns its student with the teacher's tokens as always and merges
//! the stored values ([`store::Store::entries`]).
//!
//! **Context.** The teacher reads each document on its own, from its start, in windows of
//! `teach.window` tokens (a longer document is cut into windows, each read alone): the stored
//! values do not depend on how a student's run packs its rows. An online teacher reads the
//! packed row instead, earlier documents of the row included; with `data.packing = "document"`
//! (one document per row) and documents that fit a row and a window, the two are the same, and
//! stored targets at f32 train exactly as the online teacher does.
//!
//! **Layout.** A store is a directory per teacher: `manifest.json` ([`Manifest`]: the teacher,
//! its weights' and tokenizer's hashes, top-K, dtype, temperature, window and the data's
//! fingerprints), copies of the teacher's `config.json` and `tokenizer.json` (so that a run
//! needs nothing of the teacher but the store), and `shards/`: one file per piece of a data
//! shard ([`shard`]), written under a temporary name and renamed into place, checksummed, read
//! memory-mapped. Documents are found by the hash of their teacher token ids, so a run finds
//! them whatever its order, seed or packing.

pub mod answer;
pub mod compact;
pub mod merge;
pub mod served;
pub mod shard;
pub mod store;

use std::path::Path;

use burn::tensor::bf16;
use serde::{Deserialize, Serialize};

use crate::data::fingerprint::ShardPrint;
use crate::error::{Context, Error, Result};
use shard::f32_at;

pub use crate::data::TeacherSpan;

/// A teacher the process does not run: its entries are merged by the loader.
#[derive(Clone)]
pub enum HostTargets {
    /// Stored targets (`xtoken teach`).
    Stored(std::sync::Arc<store::Store>),
    /// A served teacher (vLLM, `xtoken serve`).
    Served(std::sync::Arc<served::ServedTeacher>),
}

/// The store format this build writes (2: the manifest's checksum, the shards' temperature;
/// 3: the compact layout, the manifest's `confidence` and `error_bound`; 4: compact blocks
/// stored bucket by bucket, best first; 5: their Rice parameters scaled with the ids where that
/// costs fewer bits). It reads 2 to 5, but compact blocks only of format 5.
pub const FORMAT: u32 = 5;

/// The first format whose compact blocks this build reads (3's held ids in one sorted run and
/// a code an entry, 4's one Rice parameter a bucket).
const COMPACT_FORMAT: u32 = 5;

/// The oldest store format this build reads.
const OLDEST_FORMAT: u32 = 2;

/// The manifest's field holding the xxh3-64 of the rest of it.
const CHECKSUM: &str = "checksum";

/// The manifest's file name in a teacher's store directory.
pub const MANIFEST: &str = "manifest.json";

pub use crate::config::ValueDtype;

impl ValueDtype {
    /// How a compact layout's blocks code their ids (`None`: a fixed layout).
    pub fn id_code(self) -> Option<compact::IdCode> {
        match self {
            Self::Compact => Some(compact::IdCode::Rice),
            Self::Packed => Some(compact::IdCode::Packed),
            Self::F32 | Self::Bf16 | Self::Q8 => None,
        }
    }

    /// Bytes of one position's `k` values in a fixed layout (the compact layouts' vary: 0).
    pub fn value_bytes(self, k: usize) -> usize {
        match self {
            Self::F32 => 4 * k,
            Self::Bf16 => 2 * k,
            Self::Q8 => k + 8,
            Self::Compact | Self::Packed => 0,
        }
    }

    /// What the manifest states of the error of a decoded value `v` against the f32 one.
    pub fn bound_text(self) -> &'static str {
        match self {
            Self::F32 => "exact",
            Self::Bf16 => "|Δ| ≤ 2⁻⁸·|v| (bf16 rounding to nearest)",
            Self::Q8 => {
                "|Δ| ≤ (m − min)/510 (m, min: the position's largest and smallest kept \
                         values; m exact)"
            }
            Self::Compact | Self::Packed => {
                "|Δ| ≤ 0.0005 in the head (within h = min(4, m + 5.55) nats of m), \
                              ≤ 0.066·(R − h) below (m: the position's largest kept value, \
                              exact; R = m − min; the kept mass and the ids exact)"
            }
        }
    }

    /// Appends one position's values (best first, so `values[0]` is the largest).
    pub fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            Self::F32 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Self::Bf16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
            Self::Q8 => {
                let (max, step) = q8_scale(values);
                out.extend_from_slice(&max.to_le_bytes());
                out.extend_from_slice(&step.to_le_bytes());
                out.extend(values.iter().map(|&v| q8_code(max, step, v)));
            }
            // Its blocks carry ids too: `compact::encode`.
            Self::Compact | Self::Packed => {}
        }
    }

    /// Decodes one position's first `out.len()` values from its encoded bytes.
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            Self::F32 => out
                .iter_mut()
                .zip(bytes.chunks_exact(4))
                .for_each(|(v, b)| *v = f32_at(b, 0)),
            Self::Bf16 => out
                .iter_mut()
                .zip(bytes.chunks_exact(2))
                // A bf16 is an f32's upper half (as a shift the loop vectorizes; `to_f32` does not).
                .for_each(|(v, b)| {
                    *v = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
                }),
            Self::Q8 => {
                let (max, step) = (f32_at(bytes, 0), f32_at(bytes, 4));
                let codes = out.iter_mut().zip(&bytes[8..]);
                codes.for_each(|(v, &q)| *v = max - q as f32 * step);
            }
            Self::Compact | Self::Packed => {}
        }
    }

    /// The largest error a decoded value `v` may have, for a position whose kept values span
    /// `[min, max]` (the rounding this encoding does; f32 is exact).
    pub fn error_bound(self, min: f32, max: f32, v: f32) -> f32 {
        match self {
            Self::F32 => 0.0,
            Self::Bf16 => min.abs().max(max.abs()) * 2f32.powi(-8),
            Self::Q8 => {
                let step = (max - min) / 255.0;
                step * 0.5 + (max.abs() + 255.0 * step) * f32::EPSILON * 4.0
            }
            Self::Compact | Self::Packed => compact::error_bound(max, max - min, max - v),
        }
    }
}

/// A position's 8-bit scale: its largest value and the step between codes.
fn q8_scale(values: &[f32]) -> (f32, f32) {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let max = finite.clone().fold(f32::NEG_INFINITY, f32::max);
    let min = finite.fold(f32::INFINITY, f32::min);
    if !max.is_finite() {
        return (0.0, 0.0);
    }
    (max, (max - min) / 255.0)
}

fn q8_code(max: f32, step: f32, v: f32) -> u8 {
    if step <= 0.0 || !v.is_finite() {
        return if step <= 0.0 && v.is_finite() { 0 } else { 255 };
    }
    ((max - v) / step).round().clamp(0.0, 255.0) as u8
}

/// What a teacher's store holds and how it was made; a run compares it with its own settings
/// before step 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The teacher's name in the run that wrote it.
    pub teacher: String,
    /// The teacher's model directory, as the configuration named it.
    pub model: String,
    /// SHA-256 of the teacher's `config.json`.
    pub config_sha256: String,
    /// SHA-256 of its weight files, in name order, one after another.
    pub weights_sha256: String,
    /// SHA-256 of its tokenizer's vocabulary (as `xtoken` computes it for W).
    pub tokenizer_sha256: String,
    /// Its vocabulary size (the width of its logits).
    pub vocab_size: usize,
    /// The dtype its weights ran in.
    pub compute_dtype: String,
    /// Entries kept per position.
    pub top_k: usize,
    /// How the values are encoded.
    pub dtype: ValueDtype,
    /// The error of a decoded value against the f32 one, as the dtype bounds it.
    #[serde(default)]
    pub error_bound: String,
    /// Whether the confidence terms of adaptive weighting are stored (format 2: always).
    #[serde(default = "stored_by_default")]
    pub confidence: bool,
    /// τ the values are tempered with.
    pub temperature: f64,
    /// Teacher tokens per window.
    pub window: usize,
    /// Documents per shard file.
    pub shard_documents: usize,
    /// The data field the texts were read from.
    pub text_field: String,
    /// The data's shards when the store was written, in the order of `data.path`.
    pub data: Vec<ShardPrint>,
}

fn stored_by_default() -> bool {
    true
}

impl Manifest {
    /// Bytes a stored position takes in a fixed layout: its token, the five per-position values
    /// and its `top_k` entries (ids and values); `None` for the compact layout, whose blocks
    /// vary with the ids (`xtoken bench store` measures them).
    pub fn bytes_per_token(top_k: usize, dtype: ValueDtype) -> Option<usize> {
        (dtype.id_code().is_none())
            .then(|| shard::POSITION_BYTES + 4 * top_k + dtype.value_bytes(top_k))
    }

    /// Reads `dir/manifest.json` and checks its checksum: a manifest edited or damaged since
    /// `xtoken teach` wrote it is refused, never believed.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{}: no stored teacher targets here (written by `xtoken teach`)",
                path.display()
            )
        })?;
        let not_one = || format!("{}: not a manifest of stored targets", path.display());
        let mut value: serde_json::Value = serde_json::from_str(&text).with_context(not_one)?;
        let format = value.get("format").and_then(serde_json::Value::as_u64);
        if !format.is_some_and(|f| (OLDEST_FORMAT as u64..=FORMAT as u64).contains(&f)) {
            return Err(Error::Targets(format!(
                "{}: format {} of stored targets, this build reads formats {OLDEST_FORMAT} to \
                 {FORMAT}; write them again with `xtoken teach`",
                path.display(),
                format.map_or("unknown".into(), |f| f.to_string())
            )));
        }
        let stored = value
            .as_object_mut()
            .and_then(|map| map.remove(CHECKSUM))
            .and_then(|c| c.as_str().map(String::from));
        if stored.as_deref() != Some(checksum(&value)?.as_str()) {
            return Err(Error::Targets(format!(
                "{}: its checksum does not match its content (edited or damaged since `xtoken \
                 teach` wrote it); the targets cannot be trusted to be what it says, write them \
                 again",
                path.display()
            )));
        }
        let manifest: Self = serde_json::from_value(value).with_context(not_one)?;
        if manifest.format < COMPACT_FORMAT && manifest.dtype.id_code().is_some() {
            return Err(Error::Targets(format!(
                "{}: compact targets of format {}, whose blocks this build no longer reads \
                 (format {FORMAT} codes them to read faster); write them again with `xtoken \
                 teach`",
                path.display(),
                manifest.format
            )));
        }
        Ok(manifest)
    }

    /// Writes `dir/manifest.json` with the checksum of its content (under a temporary name,
    /// then renamed).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST);
        let mut value = serde_json::to_value(self)?;
        let sum = checksum(&value)?;
        if let Some(map) = value.as_object_mut() {
            map.insert(CHECKSUM.into(), sum.into());
        }
        let text = serde_json::to_string_pretty(&value)?;
        crate::output::write_file(&path, |tmp| Ok(std::fs::write(tmp, text)?))
    }
}

/// xxh3-64 of a manifest's compact JSON without its checksum, in hex.
fn checksum(value: &serde_json::Value) -> Result<String> {
    let text = serde_json::to_string(value)?;
    Ok(format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    ))
}

#[cfg(test)]
mod tests {
    use super::shard::{ShardReader, ShardWriter};
    use super::*;
    use proptest::prelude::*;
    use xtoken_kernels::host::PositionTargets;

    /// Targets of `n` positions with `k` descending values each.
    fn targets(n: usize, k: usize, seed: u32) -> PositionTargets {
        let mut logp = Vec::new();
        for q in 0..n {
            let mut v = -0.1 - (q as f32 + seed as f32) * 0.01;
            for j in 0..k {
                logp.push(v);
                v -= 0.37 + ((j as u32 * 7 + seed) % 5) as f32 * 0.21;
            }
        }
        PositionTargets {
            k,
            ids: (0..n * k).map(|i| (i as u32 * 31 + seed) % 1000).collect(),
            logp,
            observed: (0..n).map(|q| -(q as f32) * 0.5).collect(),
            neg_ce: (0..n).map(|q| -(q as f32) * 0.25).collect(),
            neg_entropy: (0..n).map(|q| -(q as f64) * 1.5).collect(),
            max_prob: (0..n).map(|q| 1.0 / (q as f32 + 2.0)).collect(),
            observed_rank: (0..n as u32).collect(),
        }
    }

    proptest! {
        /// Every dtype decodes within its stated bound (f32 exactly).
        #[test]
        fn values_decode_within_their_bound(seed in 0u32..1000, k in 1usize..300) {
            let t = targets(1, k, seed);
            for dtype in [ValueDtype::F32, ValueDtype::Bf16, ValueDtype::Q8] {
                let mut bytes = Vec::new();
                dtype.encode(&t.logp, &mut bytes);
                prop_assert_eq!(bytes.len(), dtype.value_bytes(k));
                let mut back = vec![0f32; k];
                dtype.decode(&bytes, &mut back);
                let (min, max) = (t.logp[k - 1], t.logp[0]);
                for (a, b) in t.logp.iter().zip(&back) {
                    let bound = dtype.error_bound(min, max, *a);
                    prop_assert!((a - b).abs() <= bound, "{:?}: {} vs {} (bound {})", dtype, a, b, bound);
                }
            }
        }
    }

    /// A shard reads back what was written, finds documents by key, and a flipped byte anywhere
    /// is named.
    #[test]
    fn shards_round_trip_and_name_damage() {
        let dir = std::env::temp_dir().join(format!("xtoken-shard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let layouts = [
            (ValueDtype::F32, true),
            (ValueDtype::Compact, true),
            (ValueDtype::Compact, false),
            (ValueDtype::Packed, false),
        ];
        for (dtype, confidence) in layouts {
            let path = dir.join("00000-00000.xtt");
            let mut writer = ShardWriter::new(5, dtype, 1.0, confidence);
            let docs: Vec<Vec<u32>> = vec![vec![3, 1, 4], vec![], vec![1, 5, 9, 2, 6]];
            for (i, ids) in docs.iter().enumerate() {
                writer.push(ids, &targets(ids.len(), 5, i as u32)).unwrap();
            }
            writer.finish(&path, 0, 0, true).unwrap();
            let reader = ShardReader::open(&path).unwrap();
            assert!(reader.last);
            assert_eq!((reader.dtype, reader.confidence), (dtype, confidence));
            assert_eq!(reader.index.len(), 3);
            for (d, ids) in docs.iter().enumerate() {
                let doc = reader.doc(d);
                assert_eq!(reader.index[d].0, shard::doc_key(ids));
                assert_eq!(doc.ids(), *ids);
                let t = targets(ids.len(), 5, d as u32);
                for q in 0..ids.len() {
                    let (mut top, mut values) = (vec![0u32; 5], vec![0f32; 5]);
                    doc.entries(q, &mut top, &mut values, 0.0);
                    let row = q * 5..q * 5 + 5;
                    let (min, max) = (t.logp[row.end - 1], t.logp[row.start]);
                    let mut got: Vec<(u32, f32)> = top.into_iter().zip(values).collect();
                    assert!(
                        got.windows(2).all(|w| w[0].1 >= w[1].1),
                        "{dtype:?}: best first"
                    );
                    got.sort_by_key(|e| e.0);
                    let mut want: Vec<(u32, f32)> = t.ids[row.clone()]
                        .iter()
                        .copied()
                        .zip(t.logp[row].iter().copied())
                        .collect();
                    want.sort_by_key(|e| e.0);
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(g.0, w.0);
                        let bound = dtype.error_bound(min, max, w.1);
                        assert!((g.1 - w.1).abs() <= bound, "{dtype:?}: {g:?} vs {w:?}");
                    }
                    assert_eq!(doc.observed(q), t.observed[q]);
                    if confidence {
                        assert_eq!(doc.neg_ce(q), t.neg_ce[q]);
                        assert_eq!(doc.neg_entropy(q), t.neg_entropy[q]);
                        assert_eq!(doc.max_prob(q), t.max_prob[q]);
                    }
                }
                if dtype == ValueDtype::F32 && !ids.is_empty() {
                    let (mut top, mut values) = (vec![0u32; 3], vec![0f32; 3]);
                    doc.entries(0, &mut top, &mut values, 0.0);
                    assert_eq!(top, t.ids[..3]);
                    assert_eq!(values, t.logp[..3]);
                }
            }
            drop(reader);
            let bytes = std::fs::read(&path).unwrap();
            for at in [20, bytes.len() / 2, bytes.len() - 30] {
                let mut bad = bytes.clone();
                bad[at] ^= 0x10;
                std::fs::write(&path, &bad).unwrap();
                let err = ShardReader::open(&path)
                    .err()
                    .expect("damage found")
                    .to_string();
                assert!(err.contains("damaged shard"), "{err}");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Format-3 and format-4 stores' compact blocks are refused by name; their fixed layouts
    /// still read.
    #[test]
    fn older_compact_blocks_are_refused() {
        let dir = std::env::temp_dir().join(format!("xtoken-format-3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = |format, dtype| Manifest {
            format,
            teacher: "t".into(),
            model: "m".into(),
            config_sha256: String::new(),
            weights_sha256: String::new(),
            tokenizer_sha256: String::new(),
            vocab_size: 10,
            compute_dtype: "F32".into(),
            top_k: 4,
            dtype,
            error_bound: dtype.bound_text().into(),
            confidence: true,
            temperature: 1.0,
            window: 8,
            shard_documents: 1,
            text_field: "text".into(),
            data: Vec::new(),
        };
        for format in [3, 4] {
            manifest(format, ValueDtype::Q8).write(&dir).unwrap();
            assert_eq!(Manifest::read(&dir).unwrap().dtype, ValueDtype::Q8);
            manifest(format, ValueDtype::Compact).write(&dir).unwrap();
            let err = Manifest::read(&dir).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "manifest.json: compact targets of format {format}"
                )) && err.contains("write them again with `xtoken teach`"),
                "{err}"
            );
        }
        manifest(5, ValueDtype::Compact).write(&dir).unwrap();
        assert_eq!(Manifest::read(&dir).unwrap().dtype, ValueDtype::Compact);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Bytes per stored token, as the format lays them out.
    #[test]
    fn bytes_per_token_follow_the_layout() {
        assert_eq!(
            Manifest::bytes_per_token(64, ValueDtype::F32),
            Some(24 + 64 * 8)
        );
        assert_eq!(
            Manifest::bytes_per_token(64, ValueDtype::Bf16),
            Some(24 + 64 * 6)
        );
        assert_eq!(
            Manifest::bytes_per_token(64, ValueDtype::Q8),
            Some(24 + 64 * 5 + 8)
        );
        assert_eq!(Manifest::bytes_per_token(64, ValueDtype::Compact), None);
    }
}
