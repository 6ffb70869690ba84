//! One shard file of stored targets: a header (entries per position, the values' dtype and the
//! temperature they were tempered with), one record per document, an index of the
//! documents, and a footer with the data shard and piece it covers and an xxh3 checksum of
//! everything before it. Little-endian throughout.
//!
//! A document's record of `n` positions and `k` entries each, in the fixed layouts (`f32`,
//! `bf16`, `q8`):
//! `ids [n] u32 · observed [n] f32 · neg_ce [n] f32 · max_prob [n] f32 · neg_entropy [n] f64 ·
//! top ids [n, k] u32 · values [n] × (k values in the store's dtype)`;
//! in the compact layouts (`compact`, `packed`: [`super::compact`]), where the confidence
//! columns are there only when the header's flags say so and each position's entries are a
//! block of its own length:
//! `ids [n] u32 · observed [n] f32 · (neg_ce · max_prob · neg_entropy) · ends [n] u32 ·
//! blocks` (`ends[q]`: the end of position `q`'s block, from the first block's start).

use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use xtoken_kernels::host::PositionTargets;

use super::compact;
use crate::config::ValueDtype;
use crate::error::{Context, Error, Result};

const HEAD: &[u8; 8] = b"XTTSHRD2";
const TAIL: &[u8; 8] = b"XTTSEND2";
/// magic, k (u32), dtype (u8), flags (u8), 2 bytes of padding, temperature (f64).
const HEADER_BYTES: usize = 24;
/// index offset, documents, data shard, piece, last, checksum, magic.
const FOOTER_BYTES: usize = 56;
const INDEX_ENTRY_BYTES: usize = 24;
/// The header's flag: the confidence columns are left out (compact layout only).
const NO_CONFIDENCE: u8 = 1;

/// Bytes of a position besides its entries: its token, observed log-probability, `−CE`,
/// max-probability (4 each) and `Σ p log p` (8).
pub const POSITION_BYTES: usize = 24;

pub use crate::data::doc_key;

/// A shard file being written: documents appended in memory, the file written whole.
pub struct ShardWriter {
    k: usize,
    dtype: ValueDtype,
    confidence: bool,
    body: Vec<u8>,
    index: Vec<(u64, u64, u64)>,
    scratch: Vec<f32>,
}

impl ShardWriter {
    /// An empty shard of `k` entries per position in `dtype`, tempered at `temperature`, with
    /// the confidence columns when `confidence` (the fixed layouts always have them).
    pub fn new(k: usize, dtype: ValueDtype, temperature: f64, confidence: bool) -> Self {
        let confidence = confidence || dtype.id_code().is_none();
        let mut body = Vec::with_capacity(1 << 20);
        body.extend_from_slice(HEAD);
        body.extend_from_slice(&(k as u32).to_le_bytes());
        body.push(match dtype {
            ValueDtype::F32 => 0,
            ValueDtype::Bf16 => 1,
            ValueDtype::Q8 => 2,
            ValueDtype::Compact => 3,
            ValueDtype::Packed => 4,
        });
        body.push(if confidence { 0 } else { NO_CONFIDENCE });
        body.extend_from_slice(&[0; 2]);
        body.extend_from_slice(&temperature.to_le_bytes());
        Self {
            k,
            dtype,
            confidence,
            body,
            index: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Documents appended.
    pub fn documents(&self) -> usize {
        self.index.len()
    }

    /// Bytes so far.
    pub fn bytes(&self) -> usize {
        self.body.len()
    }

    /// Appends a document: its teacher `ids` and each position's targets (`targets.k` must be
    /// the shard's).
    pub fn push(&mut self, ids: &[u32], targets: &PositionTargets) -> Result<()> {
        let (n, k) = (ids.len(), self.k);
        let stats = [
            targets.neg_ce.len(),
            targets.max_prob.len(),
            targets.neg_entropy.len(),
        ];
        let fits = targets.k == k
            && targets.ids.len() == n * k
            && targets.logp.len() == n * k
            && targets.observed.len() == n
            && (!self.confidence || stats == [n; 3]);
        if !fits {
            return Err(Error::Targets(format!(
                "a document of {n} positions came with targets of another shape (k = {}, {} \
                 entries) than the shard's (k = {k})",
                targets.k,
                targets.ids.len()
            )));
        }
        self.index
            .push((doc_key(ids), self.body.len() as u64, n as u64));
        let b = &mut self.body;
        ids.iter()
            .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        let columns: &[&Vec<f32>] = match self.confidence {
            true => &[&targets.observed, &targets.neg_ce, &targets.max_prob],
            false => &[&targets.observed],
        };
        for column in columns {
            column
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        }
        if self.confidence {
            targets
                .neg_entropy
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        }
        if let Some(code) = self.dtype.id_code() {
            self.push_blocks(targets, code);
            return Ok(());
        }
        targets
            .ids
            .iter()
            .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        for row in targets.logp.chunks_exact(k.max(1)) {
            self.scratch.clear();
            self.scratch.extend_from_slice(row);
            self.dtype.encode(&self.scratch, b);
        }
        Ok(())
    }

    /// The compact layout's `ends` and blocks of a document's positions, encoded on every
    /// core.
    fn push_blocks(&mut self, targets: &PositionTargets, code: compact::IdCode) {
        let k = self.k.max(1);
        let blocks: Vec<Vec<u8>> = targets
            .ids
            .par_chunks_exact(k)
            .zip(targets.logp.par_chunks_exact(k))
            .map_init(Vec::new, |order, (ids, logp)| {
                let mut block = Vec::with_capacity(compact::BLOCK_HEADER + 2 * k);
                compact::encode(ids, logp, code, order, &mut block);
                block
            })
            .collect();
        let mut end = 0u32;
        for block in &blocks {
            end += block.len() as u32;
            self.body.extend_from_slice(&end.to_le_bytes());
        }
        self.body.reserve(end as usize);
        blocks.iter().for_each(|b| self.body.extend_from_slice(b));
    }

    /// Writes the shard to `path` (through a temporary file, renamed into place), as piece
    /// `piece` of data shard `data_shard`, `last` when no piece follows it.
    pub fn finish(
        mut self,
        path: &Path,
        data_shard: usize,
        piece: usize,
        last: bool,
    ) -> Result<()> {
        let index_offset = self.body.len() as u64;
        for &(key, offset, n) in &self.index {
            for v in [key, offset, n] {
                self.body.extend_from_slice(&v.to_le_bytes());
            }
        }
        let docs = self.index.len() as u64;
        for v in [
            index_offset,
            docs,
            data_shard as u64,
            piece as u64,
            last as u64,
        ] {
            self.body.extend_from_slice(&v.to_le_bytes());
        }
        let checksum = xxhash_rust::xxh3::xxh3_64(&self.body);
        self.body.extend_from_slice(&checksum.to_le_bytes());
        self.body.extend_from_slice(TAIL);
        crate::output::write_file(path, |tmp| {
            let mut file = std::fs::File::create(tmp)?;
            file.write_all(&self.body)?;
            file.sync_all()?;
            Ok(())
        })
    }
}

/// A shard file, memory-mapped and checked.
pub struct ShardReader {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Entries per position.
    pub k: usize,
    /// The values' encoding.
    pub dtype: ValueDtype,
    /// Whether it holds the confidence terms of adaptive weighting.
    pub confidence: bool,
    /// τ its values were tempered with.
    pub temperature: f64,
    /// The data shard it covers (its place in `data.path`'s expansion).
    pub data_shard: usize,
    /// Its piece of that data shard.
    pub piece: usize,
    /// Whether no piece follows it.
    pub last: bool,
    /// `(key, offset, positions)` per document.
    pub index: Vec<(u64, u64, u64)>,
}

/// The little-endian f32 at `at`.
pub(crate) fn f32_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

impl ShardReader {
    /// Maps `path` and checks its magic, checksum and index; a damaged file is an error naming
    /// it.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path)
            .with_context(|| format!("{}: opening a shard of stored targets", path.display()))?;
        // Safety: the shard is never written once in place (shards are renamed in whole); a
        // file truncated under a running reader is the one hazard memory maps carry.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("{}: mapping it", path.display()))?;
        let damaged = |why: &str| {
            Error::Targets(format!(
                "{}: damaged shard of stored targets ({why}); delete it and run `xtoken teach` \
                 again to rewrite it",
                path.display()
            ))
        };
        let len = map.len();
        if len >= 8 && map[..7] == HEAD[..7] && map[7] != HEAD[7] {
            return Err(Error::Targets(format!(
                "{}: a shard of another store format; write the store again with `xtoken teach`",
                path.display()
            )));
        }
        if len < HEADER_BYTES + FOOTER_BYTES || &map[..8] != HEAD || &map[len - 8..] != TAIL {
            return Err(damaged("no shard header or footer"));
        }
        let foot = len - FOOTER_BYTES;
        let checksum = u64_at(&map, foot + 40);
        if xxhash_rust::xxh3::xxh3_64(&map[..foot + 40]) != checksum {
            return Err(damaged("its checksum does not match its bytes"));
        }
        let k = u32::from_le_bytes([map[8], map[9], map[10], map[11]]) as usize;
        let dtype = match map[12] {
            0 => ValueDtype::F32,
            1 => ValueDtype::Bf16,
            2 => ValueDtype::Q8,
            3 => ValueDtype::Compact,
            4 => ValueDtype::Packed,
            _ => return Err(damaged("an unknown value dtype")),
        };
        let confidence = dtype.id_code().is_none() || map[13] & NO_CONFIDENCE == 0;
        let (index_offset, docs) = (u64_at(&map, foot) as usize, u64_at(&map, foot + 8) as usize);
        if index_offset + docs * INDEX_ENTRY_BYTES != foot {
            return Err(damaged("its index does not end at its footer"));
        }
        let layout = Layout {
            k,
            dtype,
            confidence,
        };
        let index: Vec<(u64, u64, u64)> = (0..docs)
            .map(|d| {
                let at = index_offset + d * INDEX_ENTRY_BYTES;
                (
                    u64_at(&map, at),
                    u64_at(&map, at + 8),
                    u64_at(&map, at + 16),
                )
            })
            .collect();
        let within = |&(_, off, n): &(u64, u64, u64)| {
            layout
                .record_bytes(&map[..index_offset], off as usize, n as usize)
                .is_some_and(|b| off as usize + b <= index_offset)
        };
        if !index.iter().all(within) {
            return Err(damaged("a document runs past its records"));
        }
        Ok(Self {
            path: path.to_path_buf(),
            k,
            dtype,
            confidence,
            temperature: f64::from_bits(u64_at(&map, 16)),
            data_shard: u64_at(&map, foot + 16) as usize,
            piece: u64_at(&map, foot + 24) as usize,
            last: u64_at(&map, foot + 32) != 0,
            index,
            map,
        })
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Document `d` of the index.
    pub fn doc(&self, d: usize) -> DocRecord<'_> {
        let (_, offset, n) = self.index[d];
        let layout = Layout {
            k: self.k,
            dtype: self.dtype,
            confidence: self.confidence,
        };
        let (start, n) = (offset as usize, n as usize);
        // Checked at open.
        let bytes = layout.record_bytes(&self.map, start, n).unwrap_or(0);
        DocRecord {
            n,
            k: self.k,
            dtype: self.dtype,
            confidence: self.confidence,
            bytes: &self.map[start..start + bytes],
        }
    }
}

/// How a shard lays out its records.
struct Layout {
    k: usize,
    dtype: ValueDtype,
    confidence: bool,
}

impl Layout {
    /// Bytes of the record of `n` positions at `start` of `map` (`None`: it runs past it).
    fn record_bytes(&self, map: &[u8], start: usize, n: usize) -> Option<usize> {
        if self.dtype.id_code().is_none() {
            return Some(n * (POSITION_BYTES + 4 * self.k + self.dtype.value_bytes(self.k)));
        }
        let blocks = compact_columns(n, self.confidence) + 4 * n;
        if n == 0 {
            return Some(blocks);
        }
        let last_end = start.checked_add(blocks)?;
        let end = map.get(last_end - 4..last_end)?;
        Some(blocks + u32_at(end, 0) as usize)
    }
}

/// Bytes of a compact record's columns before its `ends`.
fn compact_columns(n: usize, confidence: bool) -> usize {
    if confidence {
        POSITION_BYTES * n
    } else {
        8 * n
    }
}

/// A fixed layout's entries: `stored` is a position's ids (`u32`, little-endian) and its
/// values in `dtype`; as many as `ids` and `values` hold.
pub fn fixed_entries(
    dtype: ValueDtype,
    stored: (&[u8], &[u8]),
    ids: &mut [u32],
    values: &mut [f32],
) {
    let (id_bytes, value_bytes) = stored;
    ids.iter_mut()
        .zip(id_bytes.chunks_exact(4))
        .for_each(|(id, b)| *id = u32_at(b, 0));
    dtype.decode(value_bytes, values);
}

thread_local! {
    /// This thread's reader of compact blocks.
    static READER: std::cell::RefCell<compact::Reader> = Default::default();
}

/// One stored document, read in place.
#[derive(Clone, Copy)]
pub struct DocRecord<'a> {
    /// Positions.
    pub n: usize,
    /// Entries per position.
    pub k: usize,
    /// The values' encoding.
    pub dtype: ValueDtype,
    /// Whether it holds the confidence terms.
    pub confidence: bool,
    bytes: &'a [u8],
}

impl DocRecord<'_> {
    fn column(&self, c: usize, q: usize) -> usize {
        c * 4 * self.n + 4 * q
    }

    /// The teacher's token at position `q`.
    pub fn id(&self, q: usize) -> u32 {
        u32_at(self.bytes, self.column(0, q))
    }

    /// The teacher's tokens.
    pub fn ids(&self) -> Vec<u32> {
        (0..self.n).map(|q| self.id(q)).collect()
    }

    /// The tempered log-probability position `q` gave its next token (0 for the last).
    pub fn observed(&self, q: usize) -> f32 {
        f32_at(self.bytes, self.column(1, q))
    }

    /// `log p[y]` at τ = 1 of position `q`'s next token.
    pub fn neg_ce(&self, q: usize) -> f32 {
        f32_at(self.bytes, self.column(2, q))
    }

    /// `max p` at τ = 1 of position `q`.
    pub fn max_prob(&self, q: usize) -> f32 {
        f32_at(self.bytes, self.column(3, q))
    }

    /// `Σ p log p` at τ = 1 of position `q`.
    pub fn neg_entropy(&self, q: usize) -> f64 {
        f64::from_bits(u64_at(self.bytes, 16 * self.n + 8 * q))
    }

    /// Position `q`'s first `ids.len()` entries (best first; `values` as long): ids into
    /// `ids`, values plus `shift` (added in f64, as the merge shifts a slot by its
    /// continuation) into `values`; how many it wrote (fewer only where a compact block holds
    /// fewer).
    pub fn entries(&self, q: usize, ids: &mut [u32], values: &mut [f32], shift: f64) -> usize {
        if let Some(code) = self.dtype.id_code() {
            return self.compact_entries(q, code, ids, values, shift);
        }
        let k = ids.len().min(values.len()).min(self.k);
        let top = 24 * self.n + 4 * self.k * q;
        let per = self.dtype.value_bytes(self.k);
        let at = 24 * self.n + 4 * self.k * self.n + per * q;
        let stored = (&self.bytes[top..top + 4 * k], &self.bytes[at..at + per]);
        fixed_entries(self.dtype, stored, &mut ids[..k], &mut values[..k]);
        for v in &mut values[..k] {
            *v = (*v as f64 + shift) as f32;
        }
        k
    }

    /// Position `q`'s compact block: its best entries, decoded in order.
    fn compact_entries(
        &self,
        q: usize,
        code: compact::IdCode,
        ids: &mut [u32],
        values: &mut [f32],
        shift: f64,
    ) -> usize {
        let ends = compact_columns(self.n, self.confidence);
        let blocks = ends + 4 * self.n;
        let end = |q: usize| u32_at(self.bytes, ends + 4 * q) as usize;
        let from = if q == 0 { 0 } else { end(q - 1) };
        let block = &self.bytes[blocks + from..blocks + end(q)];
        READER.with(|r| {
            r.borrow_mut()
                .best_first(block, code, self.k, ids, values, shift)
        })
    }
}
