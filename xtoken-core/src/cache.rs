//! The alignment cache: every document's token ids and chunks, for one student and one or more
//! teachers, in one memory-mappable file, so training never tokenizes or aligns twice.
//!
//! Layout (little-endian; records 8-byte aligned so ids are read in place from the map):
//!
//! ```text
//! 0   magic "XTKALIGN"           8   version u32 (2), flags u32 (0)
//! 16  metadata offset u64        24  metadata length u64
//! 32  index offset u64           40  document count u64
//! 48  checksum u64: xxh3-64 of bytes 0..48, the metadata and the index
//! 56  reserved u64
//! 64  metadata: JSON (tokenizer paths, sha256 and sizes, alignment parameters, source)
//!     records: per document, u32 words:
//!       n, student ids[n], then per teacher: m, c, teacher ids[m], chunk runs[c]
//!     index: per document (offset u64, length u64, xxh3-64 of the record u64)
//! ```
//!
//! A chunk run is one u32: student length in the low 16 bits, teacher length in the high 16;
//! runs cover both sequences in order, and a run with one side empty is a gap. Every record has
//! its own checksum, checked when it is read, so a damaged document is named and the others stay
//! usable; [`AlignCache::verify`] checks them all. The file is written to a temporary name and
//! renamed into place, so a crash never leaves a half-written cache under the final name.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::align::{AlignParams, Alignment, Chunk, ChunkKind, Positions};
use crate::error::{Error, Result};
use crate::plan::ChunkPlan;
use crate::vocab::Vocabulary;

const MAGIC: &[u8; 8] = b"XTKALIGN";
/// 2: special-token spellings encoded as text, and chunks only where both sides are at the same
/// place of the text; caches of version 1 may pair tokens of different places.
const VERSION: u32 = 2;
const HEADER_LEN: usize = 64;
const INDEX_ENTRY: usize = 24;

/// Whether `path` is a file that begins as an alignment cache does (its magic bytes, whatever its
/// version or state): what a command that writes caches may replace, and nothing else.
pub fn is_cache(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path)
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut magic))
        .is_ok_and(|()| &magic == MAGIC)
}

/// Which tokenizer made one side of the cache.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenizerRecord {
    /// The `tokenizer.json` the ids came from, as given when the cache was written.
    pub path: PathBuf,
    /// SHA-256 of that file.
    pub sha256: String,
    /// The tokenizer's own vocabulary size (for people reading the metadata).
    pub size: usize,
}

impl TokenizerRecord {
    /// Records a loaded vocabulary.
    pub fn of(vocab: &Vocabulary) -> Self {
        TokenizerRecord {
            path: vocab.path().to_path_buf(),
            sha256: vocab.sha256().to_string(),
            size: vocab.tokenizer_size(),
        }
    }
}

/// What a cache was made from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheMetadata {
    /// The student tokenizer.
    pub student: TokenizerRecord,
    /// The teacher tokenizers, in record order.
    pub teachers: Vec<TokenizerRecord>,
    /// The alignment parameters.
    pub params: AlignParams,
    /// The input file, as given.
    pub source: PathBuf,
    /// The JSON field the texts were read from.
    pub text_field: String,
    /// Student tokens over all documents (filled in when the cache is finished).
    #[serde(default)]
    pub student_tokens: u64,
    /// The program that wrote the cache.
    pub created_by: String,
}

/// Packs one document (student ids, then each teacher's ids and alignment) into a record.
pub fn encode_record(student: &[u32], teachers: &[(&[u32], &Alignment)]) -> Result<Vec<u8>> {
    let mut words: Vec<u32> = Vec::with_capacity(1 + student.len() * (1 + 3 * teachers.len()));
    words.push(student.len() as u32);
    words.extend_from_slice(student);
    for &(ids, alignment) in teachers {
        if alignment.student_len as usize != student.len()
            || alignment.teacher_len as usize != ids.len()
        {
            return Err(Error::BadParameter {
                name: "alignment",
                value: format!(
                    "{}×{} for {} student and {} teacher ids",
                    alignment.student_len,
                    alignment.teacher_len,
                    student.len(),
                    ids.len()
                ),
                why: "an alignment must belong to the ids it is stored with",
            });
        }
        words.push(ids.len() as u32);
        let count_at = words.len();
        words.push(0);
        words.extend_from_slice(ids);
        let runs_start = words.len();
        for chunk in &alignment.chunks {
            push_runs(chunk, &mut words)?;
        }
        words[count_at] = (words.len() - runs_start) as u32;
    }
    Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
}

/// Appends a chunk as one or more runs; long gaps are split, a two-sided chunk must fit 16 bits
/// a side.
fn push_runs(chunk: &Chunk, words: &mut Vec<u32>) -> Result<()> {
    let (s, t) = (chunk.student.len, chunk.teacher.len);
    if chunk.is_aligned() {
        if s > 0xFFFF || t > 0xFFFF {
            return Err(Error::BadParameter {
                name: "chunk",
                value: format!("{s} student × {t} teacher tokens"),
                why: "a two-sided chunk can hold at most 65535 tokens a side in the cache",
            });
        }
        words.push(s | (t << 16));
        return Ok(());
    }
    let (mut left, shift) = if s > 0 { (s, 0) } else { (t, 16) };
    while left > 0 {
        let n = left.min(0xFFFF);
        words.push(n << shift);
        left -= n;
    }
    Ok(())
}

/// Writes a cache: records in order, then the index and header, then renames into place. Dropped
/// before [`CacheWriter::finish`] (an error on the way), it removes its temporary file.
pub struct CacheWriter {
    path: PathBuf,
    temp: crate::temporary::Temporary,
    /// `None` once finished.
    file: Option<BufWriter<File>>,
    metadata: CacheMetadata,
    metadata_len: u64,
    at: u64,
    index: Vec<u8>,
    docs: u64,
}

impl CacheWriter {
    /// Starts a cache at `path` (written as `path.tmp` until [`CacheWriter::finish`]).
    pub fn create(path: impl AsRef<Path>, metadata: CacheMetadata) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        let temp = crate::temporary::Temporary::new(PathBuf::from(temp));
        let file = File::create(temp.path()).map_err(|e| Error::io(temp.path(), e))?;
        let mut writer = CacheWriter {
            path,
            temp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            metadata,
            metadata_len: 0,
            at: 0,
            index: Vec::new(),
            docs: 0,
        };
        // Header and metadata are rewritten at the end: reserve room for the metadata with the
        // longest possible token count.
        writer.metadata.student_tokens = u64::MAX;
        let json = writer.metadata_json()?;
        writer.metadata.student_tokens = 0;
        writer.metadata_len = json.len() as u64;
        writer.write(&[0u8; HEADER_LEN])?;
        writer.write(&json)?;
        writer.pad()?;
        Ok(writer)
    }

    fn metadata_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(&self.metadata).map_err(|e| Error::BadCache {
            path: self.path.clone(),
            message: format!("metadata: {e}"),
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let temp = self.temp.path();
        self.file
            .as_mut()
            .ok_or_else(|| Error::io(temp, std::io::Error::other("the cache was finished")))?
            .write_all(bytes)
            .map_err(|e| Error::io(temp, e))?;
        self.at += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<()> {
        let pad = (8 - self.at % 8) % 8;
        self.write(&[0u8; 8][..pad as usize])
    }

    /// Appends one document's record (from [`encode_record`]); `student_tokens` is its student
    /// length, for the metadata's total.
    pub fn push(&mut self, record: &[u8], student_tokens: usize) -> Result<()> {
        let offset = self.at;
        self.write(record)?;
        self.pad()?;
        self.index.extend_from_slice(&offset.to_le_bytes());
        self.index
            .extend_from_slice(&(record.len() as u64).to_le_bytes());
        self.index.extend_from_slice(&xxh3_64(record).to_le_bytes());
        self.docs += 1;
        self.metadata.student_tokens += student_tokens as u64;
        Ok(())
    }

    /// Documents written so far.
    pub fn len(&self) -> u64 {
        self.docs
    }

    /// Whether no document was written yet.
    pub fn is_empty(&self) -> bool {
        self.docs == 0
    }

    /// Writes the index and header, syncs, and renames the file into place.
    pub fn finish(mut self) -> Result<PathBuf> {
        let index_offset = self.at;
        let index = std::mem::take(&mut self.index);
        self.write(&index)?;
        // The final metadata is never longer than the reserved one (u64::MAX is the longest
        // number); pad it with spaces, which JSON ignores.
        let mut json = self.metadata_json()?;
        json.resize(self.metadata_len as usize, b' ');
        let mut header = [0u8; HEADER_LEN];
        header[0..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[16..24].copy_from_slice(&(HEADER_LEN as u64).to_le_bytes());
        header[24..32].copy_from_slice(&self.metadata_len.to_le_bytes());
        header[32..40].copy_from_slice(&index_offset.to_le_bytes());
        header[40..48].copy_from_slice(&self.docs.to_le_bytes());
        let checksum = header_checksum(&header[..48], &json, &index);
        header[48..56].copy_from_slice(&checksum.to_le_bytes());
        let temp = self.temp.path().to_path_buf();
        let io = |e| Error::io(&temp, e);
        let writer = self
            .file
            .take()
            .ok_or_else(|| io(std::io::Error::other("the cache was finished")))?;
        let mut file = writer.into_inner().map_err(|e| io(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header).map_err(io)?;
        file.write_all(&json).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(self.temp.path(), &self.path).map_err(|e| Error::io(&self.path, e))?;
        self.temp.release();
        Ok(self.path.clone())
    }
}

impl Drop for CacheWriter {
    fn drop(&mut self) {
        // Closed before the temporary guard removes the file.
        self.file.take();
    }
}

fn header_checksum(header: &[u8], metadata: &[u8], index: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(header);
    h.update(metadata);
    h.update(index);
    h.digest()
}

/// A cache opened for reading, memory-mapped.
pub struct AlignCache {
    path: PathBuf,
    map: Mmap,
    metadata: CacheMetadata,
    index_offset: usize,
    docs: usize,
}

impl std::fmt::Debug for AlignCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignCache")
            .field("path", &self.path)
            .field("docs", &self.docs)
            .finish()
    }
}

/// One teacher's side of a cached document.
#[derive(Debug, Clone, Copy)]
pub struct CachedTeacher<'a> {
    /// The teacher's token ids.
    pub ids: &'a [u32],
    runs: &'a [u32],
    student_len: u32,
}

impl CachedTeacher<'_> {
    /// The stored alignment (its score is not stored: NaN).
    pub fn alignment(&self) -> Alignment {
        let mut chunks = Vec::with_capacity(self.runs.len());
        let (mut p, mut q) = (0u32, 0u32);
        for &run in self.runs {
            let (s, t) = (run & 0xFFFF, run >> 16);
            chunks.push(Chunk {
                student: Positions { start: p, len: s },
                teacher: Positions { start: q, len: t },
                kind: ChunkKind::from_lengths(s, t),
            });
            p += s;
            q += t;
        }
        Alignment {
            chunks,
            student_len: self.student_len,
            teacher_len: self.ids.len() as u32,
            score: f64::NAN,
            band_bytes: 0,
            band_edge_reached: false,
        }
    }

    /// The chunk plan of this teacher against the document's student ids.
    pub fn plan(&self) -> ChunkPlan {
        ChunkPlan::new(&self.alignment())
    }
}

/// One cached document, read in place from the map.
#[derive(Debug, Clone)]
pub struct CachedDoc<'a> {
    /// The student's token ids.
    pub student_ids: &'a [u32],
    /// One entry per teacher, in the cache's teacher order.
    pub teachers: Vec<CachedTeacher<'a>>,
}

impl AlignCache {
    /// Opens and checks a cache: magic, version, bounds, and the header checksum.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let bad = |message: String| Error::BadCache {
            path: path.clone(),
            message,
        };
        if cfg!(target_endian = "big") {
            return Err(bad(
                "alignment caches are little-endian; this host is big-endian".into(),
            ));
        }
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the map is read-only. Truncating the file while it is mapped is undefined
        // behaviour, as for every memory-mapped reader; caches are written once and renamed
        // into place, never modified.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        if map.len() < HEADER_LEN || &map[0..8] != MAGIC {
            return Err(bad("not an xtoken alignment cache (bad magic)".into()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(map[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().unwrap_or([0; 8]));
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "cache format version {version}; this xtoken reads version {VERSION}: rebuild it with `xtoken align`"
            )));
        }
        let (meta_at, meta_len) = (u64_at(16) as usize, u64_at(24) as usize);
        let (index_offset, docs) = (u64_at(32) as usize, u64_at(40) as usize);
        let index_len = docs.checked_mul(INDEX_ENTRY);
        let truncated = meta_at.checked_add(meta_len).is_none_or(|e| e > map.len())
            || index_len
                .and_then(|l| index_offset.checked_add(l))
                .is_none_or(|e| e != map.len());
        if truncated {
            return Err(bad(
                "truncated or corrupted (sections do not fit the file)".into()
            ));
        }
        let index = &map[index_offset..];
        let metadata_bytes = &map[meta_at..meta_at + meta_len];
        if header_checksum(&map[..48], metadata_bytes, index) != u64_at(48) {
            return Err(bad("header checksum mismatch: the file is corrupted".into()));
        }
        let metadata: CacheMetadata =
            serde_json::from_slice(metadata_bytes).map_err(|e| bad(format!("metadata: {e}")))?;
        Ok(AlignCache {
            path,
            map,
            metadata,
            index_offset,
            docs,
        })
    }

    /// Opens a cache and checks it was made with exactly these tokenizer files (by SHA-256).
    pub fn open_verified(
        path: impl AsRef<Path>,
        student: &Vocabulary,
        teachers: &[&Vocabulary],
    ) -> Result<Self> {
        let cache = Self::open(path)?;
        cache.check_tokenizers(student, teachers)?;
        Ok(cache)
    }

    /// Refuses a cache made with other tokenizers than `student` and `teachers`.
    pub fn check_tokenizers(&self, student: &Vocabulary, teachers: &[&Vocabulary]) -> Result<()> {
        if teachers.len() != self.metadata.teachers.len() {
            return Err(Error::BadCache {
                path: self.path.clone(),
                message: format!(
                    "made for {} teacher(s), {} given",
                    self.metadata.teachers.len(),
                    teachers.len()
                ),
            });
        }
        let sides = std::iter::once(("student", &self.metadata.student, student)).chain(
            self.metadata
                .teachers
                .iter()
                .zip(teachers)
                .map(|(r, v)| ("teacher", r, *v)),
        );
        for (side, record, vocab) in sides {
            if record.sha256 != vocab.sha256() {
                return Err(Error::ProvenanceMismatch {
                    path: self.path.clone(),
                    side,
                    expected: record.sha256.clone(),
                    given: vocab.path().to_path_buf(),
                    actual: vocab.sha256().to_string(),
                });
            }
        }
        Ok(())
    }

    /// What the cache was made from.
    pub fn metadata(&self) -> &CacheMetadata {
        &self.metadata
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs
    }

    /// Whether the cache holds no document.
    pub fn is_empty(&self) -> bool {
        self.docs == 0
    }

    /// Document `i`, checked against its checksum.
    pub fn doc(&self, i: usize) -> Result<CachedDoc<'_>> {
        let bad = |message: String| Error::BadCache {
            path: self.path.clone(),
            message: format!("document {i}: {message}"),
        };
        if i >= self.docs {
            return Err(bad(format!("out of range (the cache has {})", self.docs)));
        }
        let entry = &self.map[self.index_offset + i * INDEX_ENTRY..][..INDEX_ENTRY];
        let word =
            |k: usize| u64::from_le_bytes(entry[8 * k..8 * k + 8].try_into().unwrap_or([0; 8]));
        let (offset, len, checksum) = (word(0) as usize, word(1) as usize, word(2));
        let record = offset
            .checked_add(len)
            .filter(|&end| end <= self.index_offset && offset % 8 == 0 && len % 4 == 0)
            .map(|end| &self.map[offset..end])
            .ok_or_else(|| bad("record outside the data section".into()))?;
        if xxh3_64(record) != checksum {
            return Err(bad("checksum mismatch: the record is corrupted".into()));
        }
        let words: &[u32] =
            bytemuck::try_cast_slice(record).map_err(|e| bad(format!("misaligned record: {e}")))?;
        let malformed = || bad("malformed record".into());
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u32]> {
            let slice = words.get(at..at.checked_add(n)?)?;
            at += n;
            Some(slice)
        };
        let n = take(1).ok_or_else(malformed)?[0] as usize;
        let student_ids = take(n).ok_or_else(malformed)?;
        let mut teachers = Vec::with_capacity(self.metadata.teachers.len());
        for _ in 0..self.metadata.teachers.len() {
            let head = take(2).ok_or_else(malformed)?;
            let (m, c) = (head[0] as usize, head[1] as usize);
            let ids = take(m).ok_or_else(malformed)?;
            let runs = take(c).ok_or_else(malformed)?;
            let (s, t) = runs.iter().fold((0usize, 0usize), |(s, t), &r| {
                (s + (r & 0xFFFF) as usize, t + (r >> 16) as usize)
            });
            if (s, t) != (n, m) {
                return Err(bad(format!(
                    "chunks cover {s}×{t} positions of a {n}×{m} pair"
                )));
            }
            teachers.push(CachedTeacher {
                ids,
                runs,
                student_len: n as u32,
            });
        }
        if at != words.len() {
            return Err(malformed());
        }
        Ok(CachedDoc {
            student_ids,
            teachers,
        })
    }

    /// Checks every document's checksum and structure; returns the first damaged one's error.
    pub fn verify(&self) -> Result<()> {
        (0..self.docs).try_for_each(|i| self.doc(i).map(|_| ()))
    }

    /// Checks `count` documents spread evenly over the cache, the first and the last among
    /// them: a quick look before training that a damaged file shows early, while the full check
    /// of every record stays with each read.
    pub fn verify_sample(&self, count: usize) -> Result<()> {
        let n = self.docs;
        if n == 0 || count == 0 {
            return Ok(());
        }
        let count = count.min(n);
        let picks = (0..count).map(|k| {
            if count == 1 {
                0
            } else {
                k * (n - 1) / (count - 1)
            }
        });
        picks.into_iter().try_for_each(|i| self.doc(i).map(|_| ()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alignment(s: u32, t: u32, runs: &[(u32, u32)]) -> Alignment {
        let (mut p, mut q) = (0, 0);
        let chunks = runs
            .iter()
            .map(|&(a, b)| {
                let c = Chunk {
                    student: Positions { start: p, len: a },
                    teacher: Positions { start: q, len: b },
                    kind: ChunkKind::from_lengths(a, b),
                };
                p += a;
                q += b;
                c
            })
            .collect();
        Alignment {
            chunks,
            student_len: s,
            teacher_len: t,
            score: 1.0,
            band_bytes: 16,
            band_edge_reached: false,
        }
    }

    fn metadata() -> CacheMetadata {
        let record = |name: &str| TokenizerRecord {
            path: name.into(),
            sha256: format!("{name}-sha"),
            size: 10,
        };
        CacheMetadata {
            student: record("s"),
            teachers: vec![record("t1"), record("t2")],
            params: AlignParams::default(),
            source: "in.jsonl".into(),
            text_field: "text".into(),
            student_tokens: 0,
            created_by: "test".into(),
        }
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("xtoken-cache-{name}-{}", std::process::id()))
    }

    #[test]
    fn round_trip_and_corruption() {
        let path = temp("rt");
        let a1 = alignment(3, 4, &[(1, 0), (1, 1), (1, 3)]);
        let a2 = alignment(3, 2, &[(1, 0), (2, 1), (0, 1)]);
        let mut w = CacheWriter::create(&path, metadata()).unwrap();
        let student = [1u32, 2, 3];
        let rec = encode_record(&student, &[(&[4, 5, 6, 7], &a1), (&[8, 9], &a2)]).unwrap();
        w.push(&rec, 3).unwrap();
        w.push(
            &encode_record(
                &[],
                &[
                    (&[], &alignment(0, 0, &[])),
                    (&[1], &alignment(0, 1, &[(0, 1)])),
                ],
            )
            .unwrap(),
            0,
        )
        .unwrap();
        w.finish().unwrap();
        let cache = AlignCache::open(&path).unwrap();
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.metadata().student_tokens, 3);
        cache.verify().unwrap();
        let doc = cache.doc(0).unwrap();
        assert_eq!(doc.student_ids, &student);
        assert_eq!(doc.teachers[0].ids, &[4, 5, 6, 7]);
        let back = doc.teachers[1].alignment();
        assert_eq!(back.chunks, a2.chunks);
        assert_eq!(doc.teachers[0].alignment().chunks, a1.chunks);
        assert!(cache.doc(2).is_err());
        drop(cache);

        // Flip one byte of the first record: that document is refused by name, the header still
        // opens and the second document still reads.
        let mut bytes = std::fs::read(&path).unwrap();
        let reserved = serde_json::to_vec(&CacheMetadata {
            student_tokens: u64::MAX,
            ..metadata()
        })
        .unwrap()
        .len();
        let first_record = HEADER_LEN + reserved.div_ceil(8) * 8;
        bytes[first_record + 4] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let cache = AlignCache::open(&path).unwrap();
        let err = cache.doc(0).unwrap_err().to_string();
        assert!(err.contains("document 0: checksum mismatch"), "{err}");
        assert!(cache.doc(1).is_ok());
        assert!(cache.verify().is_err());
        let err = cache.verify_sample(2).unwrap_err().to_string();
        assert!(err.contains("document 0: checksum mismatch"), "{err}");
        drop(cache);

        // Truncation and header damage are refused at open.
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let err = AlignCache::open(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        let mut damaged = bytes.clone();
        damaged[HEADER_LEN + 3] ^= 0x20;
        std::fs::write(&path, &damaged).unwrap();
        let err = AlignCache::open(&path).unwrap_err().to_string();
        assert!(err.contains("header checksum"), "{err}");
        std::fs::write(
            &path,
            b"not a cache at all, just text....................................",
        )
        .unwrap();
        let err = AlignCache::open(&path).unwrap_err().to_string();
        assert!(err.contains("bad magic"), "{err}");
        // A damaged cache is still recognized as one (it may be replaced); text is not.
        assert!(!is_cache(&path));
        std::fs::write(&path, &damaged).unwrap();
        assert!(is_cache(&path));
        std::fs::write(&path, b"XTKALI").unwrap();
        assert!(!is_cache(&path) && !is_cache(&temp("missing")));
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn long_gaps_split_and_mismatched_alignments_are_refused() {
        let a = alignment(70_000, 1, &[(70_000, 0), (0, 1)]);
        let ids: Vec<u32> = vec![0; 70_000];
        let rec = encode_record(&ids, &[(&[0], &a)]).unwrap();
        let words: Vec<u32> = rec
            .chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // n, ids, m, c, teacher id, then runs 65535 + 4465 student-only and one teacher-only.
        let runs = &words[1 + 70_000 + 2 + 1..];
        assert_eq!(runs, &[0xFFFF, 70_000 - 0xFFFF, 1 << 16]);
        let wrong = encode_record(&ids[..5], &[(&[0], &a)]);
        assert!(wrong.is_err());
    }

    /// A writer dropped before `finish` (an error while aligning) leaves no file behind.
    #[test]
    fn an_unfinished_cache_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("xtoken-cache-drop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.xtc");
        let mut writer = CacheWriter::create(&path, metadata()).unwrap();
        writer.push(b"12345678", 2).unwrap();
        assert!(dir.join("c.xtc.tmp").exists());
        drop(writer);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).ok();
    }
}
