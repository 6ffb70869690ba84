//! A teacher's store opened for training: its manifest, every shard mapped and checked, the
//! documents indexed by key, and the entries of a micro-batch merged from the stored values
//! exactly as the online teacher's kernel merges its logits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use xtoken_core::plan::BatchPlan;
use xtoken_kernels::host::HostEntries;
use xtoken_kernels::ConfidenceStats;

use xtoken_core::loss::{LossParams, TopK};
use xtoken_core::vocab::Vocabulary;

use super::merge::continuation_shifts;
use super::shard::{DocRecord, ShardReader};
use super::Manifest;
use crate::data::fingerprint::{self, ShardPrint};
use crate::data::TeacherSpan;
use crate::error::{Context, Error, Result};

/// A teacher's stored targets, ready to serve a run.
pub struct Store {
    dir: PathBuf,
    /// How the targets were made.
    pub manifest: Manifest,
    shards: Vec<ShardReader>,
    docs: HashMap<u64, (u32, u32)>,
}

/// The shard files of a store, sorted by name.
pub fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let shards = dir.join("shards");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&shards) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "xtt"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("{}: listing it", shards.display())),
    };
    files.sort();
    Ok(files)
}

/// A shard file's name: piece `piece` of data shard `data_shard`.
pub fn shard_name(data_shard: usize, piece: usize) -> String {
    format!("{data_shard:05}-{piece:05}.xtt")
}

thread_local! {
    /// This thread's slot: the entries of one slot as they are read and shifted, in its cache.
    static SLOT: std::cell::RefCell<(Vec<u32>, Vec<f32>)> = Default::default();
}

/// The ids and values of `slots` slots of `k` entries, each slot's first ones written by
/// `fill(slot, ids, values)` (on every core; it returns how many), the rest ids 0 and values
/// −∞, into a slot of this thread's cache, then copied out once. The vectors are written only
/// there: zeroing or filling them first, then writing them, passed every byte through memory
/// twice, and at K = 8192 a merge moves little else.
fn write_slots(
    slots: usize,
    k: usize,
    fill: impl Fn(usize, &mut [u32], &mut [f32]) -> usize + Sync,
) -> (Vec<u32>, Vec<f32>) {
    let n = slots * k;
    let (mut ids, mut values) = (Vec::with_capacity(n), Vec::with_capacity(n));
    ids.spare_capacity_mut()[..n]
        .par_chunks_mut(k.max(1))
        .zip(values.spare_capacity_mut()[..n].par_chunks_mut(k.max(1)))
        .enumerate()
        .for_each(|(slot, (ids_out, values_out))| {
            SLOT.with(|cell| {
                let (slot_ids, slot_values) = &mut *cell.borrow_mut();
                slot_ids.resize(k, 0);
                slot_values.resize(k, 0.0);
                let written = fill(slot, &mut slot_ids[..k], &mut slot_values[..k]).min(k);
                slot_ids[written..k].fill(0);
                slot_values[written..k].fill(f32::NEG_INFINITY);
                for (out, &id) in ids_out.iter_mut().zip(&slot_ids[..k]) {
                    out.write(id);
                }
                for (out, &v) in values_out.iter_mut().zip(&slot_values[..k]) {
                    out.write(v);
                }
            });
        });
    // SAFETY: the chunks of `k` cover the first `n` elements of both vectors, and every chunk
    // was written whole above (each slot's `k` values from the thread's slot of `k`).
    unsafe {
        ids.set_len(n);
        values.set_len(n);
    }
    (ids, values)
}

impl Store {
    /// Opens the store in `dir`: reads its manifest, maps and checks every shard (in parallel),
    /// and requires every data shard of the manifest to be complete.
    pub fn open(dir: &Path) -> Result<Self> {
        let manifest = Manifest::read(dir)?;
        let files = shard_files(dir)?;
        let shards: Vec<ShardReader> = files
            .par_iter()
            .map(|f| ShardReader::open(f))
            .collect::<Result<_>>()?;
        for shard in &shards {
            held_as_manifest(shard, &manifest)?;
        }
        let store = Self {
            dir: dir.to_path_buf(),
            docs: index(&shards),
            shards,
            manifest,
        };
        store.check_complete()?;
        Ok(store)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Documents stored.
    pub fn documents(&self) -> usize {
        self.docs.len()
    }

    /// Bytes of every shard.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes() as u64).sum()
    }

    /// Every data shard covered by pieces `0..=last`, none missing.
    fn check_complete(&self) -> Result<()> {
        let mut pieces: Vec<Vec<(usize, bool)>> = vec![Vec::new(); self.manifest.data.len()];
        for s in &self.shards {
            let Some(list) = pieces.get_mut(s.data_shard) else {
                return Err(Error::Targets(format!(
                    "{}: a shard of data shard {} but the manifest lists {} data shards",
                    s.path().display(),
                    s.data_shard,
                    self.manifest.data.len()
                )));
            };
            list.push((s.piece, s.last));
        }
        for (i, list) in pieces.iter_mut().enumerate() {
            list.sort_unstable();
            let whole = list.iter().enumerate().all(|(j, &(p, _))| p == j)
                && list.last().is_some_and(|&(_, last)| last);
            if !whole {
                return Err(Error::Targets(format!(
                    "{}: the targets of data shard {} ({}) are incomplete ({} pieces found); run \
                     `xtoken teach` with the same configuration again to finish them",
                    self.dir.display(),
                    i,
                    self.manifest.data[i].path,
                    list.len()
                )));
            }
        }
        Ok(())
    }

    /// Checks that these targets serve a run: the run's teacher tokenizer (`teacher`, logits
    /// `vocab` wide) is the one they were written with, its temperature theirs, its top-K at
    /// most theirs, and its data the data they were written from (by content, wherever it now
    /// lies; with `allow_data_change`, other data is logged, and a document of it that the store
    /// lacks is an error when a step meets it).
    pub fn check_run(
        &self,
        teacher: &Vocabulary,
        vocab: usize,
        params: &LossParams,
        data: &[ShardPrint],
        allow_data_change: bool,
    ) -> Result<()> {
        let m = &self.manifest;
        let at = self.dir.display();
        if teacher.sha256() != m.tokenizer_sha256 || vocab != m.vocab_size {
            return Err(Error::Targets(format!(
                "{at}: written with another teacher tokenizer than {} ({} tokens here, {} there)",
                teacher.path().display(),
                vocab,
                m.vocab_size
            )));
        }
        if params.tau != m.temperature {
            return Err(Error::Targets(format!(
                "{at}: written at temperature {}, the run's loss.temperature is {}; write them \
                 again with the run's",
                m.temperature, params.tau
            )));
        }
        let k = match params.top_k {
            TopK::K(k) => k.min(vocab),
            TopK::All => vocab,
        };
        if k > m.top_k.min(vocab) {
            return Err(Error::Targets(format!(
                "{at}: they keep {} entries per position, the run's loss.top_k asks for {k}; \
                 lower loss.top_k or write them again with a larger teach.top_k",
                m.top_k
            )));
        }
        let changes = fingerprint::content_changes(&m.data, data)?;
        if changes.is_empty() {
            return Ok(());
        }
        if !allow_data_change {
            return Err(Error::Targets(format!(
                "{at}: written from other data than the run's data.path: {}; restore it, write \
                 the targets again, or pass --allow-data-change to train on the data as it is now",
                changes.join("; ")
            )));
        }
        for change in &changes {
            tracing::warn!("--allow-data-change: {at}: {change}");
        }
        Ok(())
    }

    /// The stored document of `key`.
    fn doc(&self, key: u64) -> Option<DocRecord<'_>> {
        let &(s, d) = self.docs.get(&key)?;
        Some(self.shards[s as usize].doc(d as usize))
    }

    /// Finds every span of `rows` (per row, its spans in order) and checks that the stored
    /// tokens are the row's (`ids [rows, len]`).
    fn locate<'a>(
        &'a self,
        spans: &[Vec<TeacherSpan>],
        ids: &[i64],
        len: usize,
    ) -> Result<Rows<'a>> {
        let mut rows = Vec::with_capacity(spans.len());
        for (b, row) in spans.iter().enumerate() {
            let mut found = Vec::with_capacity(row.len());
            for span in row {
                let doc = self
                    .doc(span.key)
                    .ok_or_else(|| self.missing(span, ids, b, len))?;
                let inside = (span.from + span.len) as usize <= doc.n;
                let same = inside
                    && (0..span.len as usize).all(|i| {
                        ids[b * len + span.at as usize + i] == doc.id(span.from as usize + i) as i64
                    });
                if !same {
                    return Err(self.missing(span, ids, b, len));
                }
                found.push((*span, doc));
            }
            rows.push(found);
        }
        Ok(Rows { rows, len })
    }

    fn missing(&self, span: &TeacherSpan, ids: &[i64], b: usize, len: usize) -> Error {
        let start = b * len + span.at as usize;
        let shown: Vec<i64> = ids[start..start + (span.len as usize).min(8)].to_vec();
        Error::Targets(format!(
            "{}: a document of the training data is not in these stored targets (its teacher \
             tokens at positions {}.. are {shown:?}…): they were written from other data or with \
             another teacher tokenizer; run `xtoken teach` on this run's data",
            self.dir.display(),
            span.from
        ))
    }

    /// The teacher entries of a micro-batch laid out by `plan` (rows of `len` teacher
    /// positions, `ids [rows, len]`, each row's document `spans`): per compared chunk slot the
    /// first `k` stored entries of its predicting position shifted by the stored log-probabilities
    /// of its continuation, as the online merge computes them. A slot whose chunk starts a
    /// document has no predicting position: it is taken out of `plan.chunk_mask`. With
    /// `confidence`, the batch means of adaptive weighting over the positions whose next token
    /// lies in their own document.
    pub fn entries(
        &self,
        plan: &mut BatchPlan,
        spans: &[Vec<TeacherSpan>],
        ids: &[i64],
        k: usize,
        confidence: bool,
    ) -> Result<HostEntries> {
        if k > self.manifest.top_k.min(self.manifest.vocab_size) {
            return Err(Error::Targets(format!(
                "{}: the run keeps {k} teacher entries per chunk, these targets {}",
                self.dir.display(),
                self.manifest.top_k
            )));
        }
        if confidence && !self.manifest.confidence {
            return Err(Error::Targets(format!(
                "{}: written without the confidence terms adaptive weighting reads (write them \
                 again with teach.confidence = true)",
                self.dir.display()
            )));
        }
        let rows = self.locate(spans, ids, plan.teacher_len)?;
        let slots = plan.batch * plan.chunks;
        let sigma = continuation_shifts(plan, |row| {
            let (doc, q) = rows.predicting(row)?;
            Some(doc.observed(q))
        });
        let side = &plan.teacher;
        // Each slot's entries, found, decoded and shifted on every core.
        let found: Vec<Option<(DocRecord<'_>, usize)>> = (0..slots)
            .map(|slot| {
                let compared = plan.chunk_mask[slot] > 0.0;
                compared
                    .then(|| rows.predicting(side.predict_row[slot] as usize))
                    .flatten()
            })
            .collect();
        for (slot, f) in found.iter().enumerate() {
            if f.is_none() {
                plan.chunk_mask[slot] = 0.0;
            }
        }
        let (ids, logp) = write_slots(slots, k, |slot, ids, logp| {
            let Some((doc, q)) = found[slot] else {
                return 0;
            };
            doc.entries(q, ids, logp, sigma[slot])
        });
        let mut out = HostEntries {
            ids,
            logp,
            k,
            confidence: None,
        };
        if confidence {
            out.confidence = Some(rows.confidence(&side.next_token));
        }
        Ok(out)
    }
}

/// The documents under each row of a micro-batch.
struct Rows<'a> {
    rows: Vec<Vec<(TeacherSpan, DocRecord<'a>)>>,
    len: usize,
}

impl<'a> Rows<'a> {
    /// The document and position of flattened row position `r`.
    fn at(&self, r: usize) -> Option<(DocRecord<'a>, usize)> {
        let (b, p) = (r / self.len, (r % self.len) as u32);
        let row = self.rows.get(b)?;
        let i = row.partition_point(|(s, _)| s.at + s.len <= p);
        let (span, doc) = row.get(i)?;
        (span.at <= p).then(|| (*doc, (span.from + p - span.at) as usize))
    }

    /// The stored position whose distribution predicts the token at flattened row position
    /// `r + 1`: the position before that token in its own document (`None` at a document's
    /// start).
    fn predicting(&self, r: usize) -> Option<(DocRecord<'a>, usize)> {
        let (doc, q) = self.at(r + 1)?;
        (q > 0).then(|| (doc, q - 1))
    }

    /// Adaptive weighting's batch means over the rows with a next token in their document.
    fn confidence(&self, next: &[i32]) -> ConfidenceStats {
        let mut sums = (0.0f64, 0.0f64, 0.0f64);
        let mut count = 0usize;
        for (r, &y) in next.iter().enumerate() {
            if y < 0 {
                continue;
            }
            let Some((doc, q)) = self.at(r) else { continue };
            if q + 1 >= doc.n || doc.id(q + 1) as i32 != y {
                continue;
            }
            sums.0 += doc.neg_ce(q) as f64;
            sums.1 += doc.neg_entropy(q);
            sums.2 += doc.max_prob(q) as f64;
            count += 1;
        }
        let n = count.max(1) as f64;
        ConfidenceStats {
            neg_cross_entropy: sums.0 / n,
            neg_entropy: sums.1 / n,
            max_prob: sums.2 / n,
            positions: count,
        }
    }
}

/// Refuses a shard whose own header disagrees with the manifest on what it holds: its top-K,
/// dtype or temperature.
fn held_as_manifest(shard: &ShardReader, m: &Manifest) -> Result<()> {
    let mut wrong = Vec::new();
    if shard.k != m.top_k {
        wrong.push(format!("top_k {} (the manifest: {})", shard.k, m.top_k));
    }
    if shard.dtype != m.dtype {
        let (a, b) = (shard.dtype.name(), m.dtype.name());
        wrong.push(format!("dtype {a} (the manifest: {b})"));
    }
    if shard.confidence != m.confidence {
        let (a, b) = (shard.confidence, m.confidence);
        wrong.push(format!("confidence terms {a} (the manifest: {b})"));
    }
    if shard.temperature != m.temperature {
        let (a, b) = (shard.temperature, m.temperature);
        wrong.push(format!("temperature {a} (the manifest: {b})"));
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Error::Targets(format!(
        "{}: the shard holds {}; the store's manifest does not describe its shards, write the \
         targets again",
        shard.path().display(),
        wrong.join(", ")
    )))
}

/// Every document's place, by key (a document stored twice keeps its first place).
fn index(shards: &[ShardReader]) -> HashMap<u64, (u32, u32)> {
    let mut docs = HashMap::new();
    for (s, shard) in shards.iter().enumerate() {
        for (d, &(key, _, _)) in shard.index.iter().enumerate() {
            docs.entry(key).or_insert((s as u32, d as u32));
        }
    }
    docs
}
