//! Packing: documents (of the alignment cache, or of the stream) concatenated into rows of at
//! most `context` student tokens, in a seeded order, cut only where no teacher's chunk
//! straddles.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xtoken_core::align::{Chunk, ChunkKind, Positions};
use xtoken_core::cache::AlignCache;

use super::pipeline::{doc_key, AlignedText, TeacherSpan};
use super::prompts::PromptSource;
use super::rng::SplitMix64;
use super::stream::{AlignedStream, StreamCursor, StreamedDoc};
use crate::error::{Error, Result};

/// Where the packer stands: at a document (of the cache: the `position`-th of epoch `epoch`'s
/// order; of a stream: the one `stream` points at), `offset` student tokens into it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Epochs completed (cache).
    pub epoch: u64,
    /// The document's place in the epoch's order (cache).
    pub position: u64,
    /// Student tokens of that document already packed.
    pub offset: u32,
    /// The document's place in the stream (streamed data); `None` at its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamCursor>,
}

/// A document's ids and alignments, with the positions where it may be cut.
struct DocView {
    student_ids: Vec<u32>,
    teachers: Vec<(Vec<u32>, Vec<Chunk>)>,
    /// Student positions where no teacher's chunk straddles, with each teacher's position
    /// there; ascending, starting with 0 and ending with the document's length.
    cuts: Vec<(u32, Vec<u32>)>,
    /// The student ids of the record's prompt (streamed data with `on_policy.prompt_field`).
    prompt: Option<Vec<u32>>,
    /// Per teacher, [`doc_key`] of its ids.
    keys: Vec<u64>,
}

impl DocView {
    fn cached(cache: &AlignCache, doc: usize) -> Result<Self> {
        let cached = cache.doc(doc)?;
        let teachers = cached
            .teachers
            .iter()
            .map(|t| (t.ids.to_vec(), t.alignment().chunks))
            .collect();
        Ok(Self::of(cached.student_ids.to_vec(), teachers))
    }

    fn streamed(streamed: StreamedDoc) -> Self {
        let doc = streamed.doc;
        let teachers = doc
            .teachers
            .into_iter()
            .map(|(ids, a)| (ids, a.chunks))
            .collect();
        DocView {
            prompt: streamed.prompt,
            ..Self::of(doc.student_ids, teachers)
        }
    }

    fn of(student_ids: Vec<u32>, teachers: Vec<(Vec<u32>, Vec<Chunk>)>) -> Self {
        // Per teacher: student position → teacher position at every chunk boundary (a
        // teacher-only gap at a boundary stays with the chunks before it).
        let boundaries: Vec<std::collections::HashMap<u32, u32>> = teachers
            .iter()
            .map(|(_, chunks)| {
                let mut map = std::collections::HashMap::new();
                map.insert(0, 0);
                for c in chunks {
                    map.insert(
                        c.student.start + c.student.len,
                        c.teacher.start + c.teacher.len,
                    );
                }
                if let Some(first) = chunks.first() {
                    if first.student.len == 0 {
                        map.insert(0, first.teacher.len);
                    }
                }
                map
            })
            .collect();
        let mut cuts: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut positions: Vec<u32> = boundaries
            .first()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        positions.sort_unstable();
        for p in positions {
            let at: Option<Vec<u32>> = boundaries.iter().map(|m| m.get(&p).copied()).collect();
            if let Some(at) = at {
                cuts.push((p, at));
            }
        }
        // A cut at 0 starts at each teacher's position 0 (leading teacher-only gaps included).
        if let Some(first) = cuts.first_mut() {
            if first.0 == 0 {
                first.1.iter_mut().for_each(|q| *q = 0);
            }
        }
        DocView {
            keys: teachers.iter().map(|(ids, _)| doc_key(ids)).collect(),
            student_ids,
            teachers,
            cuts,
            prompt: None,
        }
    }

    fn len(&self) -> u32 {
        self.student_ids.len() as u32
    }

    /// The teacher positions at student position `p`: exact at a cut, else (a forced cut) the
    /// start of the chunk that straddles `p`.
    fn teacher_positions(&self, p: u32) -> Vec<u32> {
        if let Ok(i) = self.cuts.binary_search_by_key(&p, |c| c.0) {
            return self.cuts[i].1.clone();
        }
        self.teachers
            .iter()
            .map(|(ids, chunks)| {
                chunks
                    .iter()
                    .find(|c| c.student.start + c.student.len > p)
                    .map_or(ids.len() as u32, |c| c.teacher.start)
            })
            .collect()
    }

    /// Appends student positions `[a, b)` (and the matching teacher spans) to `row`.
    fn append_to(&self, row: &mut AlignedText, a: u32, b: u32) {
        let (from, to) = (self.teacher_positions(a), self.teacher_positions(b));
        let student_offset = row.student_ids.len() as u32;
        row.student_ids
            .extend_from_slice(&self.student_ids[a as usize..b as usize]);
        for (m, (ids, chunks)) in self.teachers.iter().enumerate() {
            let (ta, tb) = (from[m], to[m].max(from[m]));
            let (out_ids, out) = &mut row.teachers[m];
            let teacher_offset = out_ids.len() as u32;
            out_ids.extend_from_slice(&ids[ta as usize..tb as usize]);
            if tb > ta {
                row.spans[m].push(TeacherSpan {
                    at: teacher_offset,
                    len: tb - ta,
                    key: self.keys[m],
                    from: ta,
                });
            }
            for c in chunks {
                let inside = c.student.start >= a
                    && c.student.start + c.student.len <= b
                    && c.teacher.start >= ta
                    && c.teacher.start + c.teacher.len <= tb;
                if inside && c.kind != ChunkKind::Gap {
                    out.chunks.push(Chunk {
                        student: Positions {
                            start: c.student.start - a + student_offset,
                            len: c.student.len,
                        },
                        teacher: Positions {
                            start: c.teacher.start - ta + teacher_offset,
                            len: c.teacher.len,
                        },
                        kind: c.kind,
                    });
                }
            }
            out.student_len = row.student_ids.len() as u32;
            out.teacher_len = out_ids.len() as u32;
        }
    }
}

/// Epoch `epoch`'s document order.
pub(crate) fn epoch_order(docs: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..docs as u32).collect();
    let mut rng = SplitMix64(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Where a packer's documents come from.
pub enum Feed {
    /// The alignment cache, in a seeded shuffle per epoch.
    Cache(Arc<AlignCache>),
    /// Documents aligned as they are read.
    Stream(AlignedStream),
}

/// Streamed documents in a row with no student token after which the data is refused.
const EMPTY_STREAMED: usize = 1 << 20;

/// Streamed documents in a row without a prompt (`on_policy.prompt_field`) after which the data
/// is refused: prompts rarer than this are a misnamed or empty field, not a dataset.
pub const PROMPTLESS_STREAMED: usize = 10_000;

/// Packs documents into rows of at most `context` student tokens, deterministically.
pub struct Packer {
    feed: Feed,
    seed: u64,
    context: u32,
    teachers: usize,
    state: LoaderState,
    /// Epoch `state.epoch`'s order of the cache's documents.
    order: Vec<u32>,
    current: Option<DocView>,
    /// Each row ends with its document (`data.packing = "document"`).
    one_document: bool,
}

impl Packer {
    /// A packer of `teachers` teachers' rows, positioned at `state` (a stream must already stand
    /// at `state.stream`).
    pub fn new(
        feed: Feed,
        teachers: usize,
        seed: u64,
        context: usize,
        state: LoaderState,
    ) -> Result<Self> {
        let order = match &feed {
            Feed::Cache(cache) if cache.is_empty() => {
                return Err(Error::Data(format!(
                    "the training data has no documents (the cache {} is empty)",
                    cache.metadata().source.display()
                )))
            }
            Feed::Cache(cache) => epoch_order(cache.len(), seed, state.epoch),
            Feed::Stream(_) => Vec::new(),
        };
        Ok(Packer {
            feed,
            seed,
            context: context as u32,
            teachers,
            state,
            order,
            current: None,
            one_document: false,
        })
    }

    /// Ends every row with its document (`data.packing = "document"`): a row holds one
    /// document, or one piece of a document longer than a row.
    pub fn one_document_per_row(mut self, on: bool) -> Self {
        self.one_document = on;
        self
    }

    /// The state before the next row.
    pub fn state(&mut self) -> Result<LoaderState> {
        if matches!(self.feed, Feed::Stream(_)) {
            // A stream's position is the next document's: fetch it.
            self.view()?;
        }
        Ok(self.state.clone())
    }

    fn advance_document(&mut self) {
        self.current = None;
        self.state.offset = 0;
        if let Feed::Cache(cache) = &self.feed {
            self.state.position += 1;
            if self.state.position as usize >= self.order.len() {
                self.state.epoch += 1;
                self.state.position = 0;
                self.order = epoch_order(cache.len(), self.seed, self.state.epoch);
            }
        }
    }

    fn view(&mut self) -> Result<&DocView> {
        if self.current.is_none() {
            let view = match &mut self.feed {
                Feed::Cache(cache) => {
                    DocView::cached(cache, self.order[self.state.position as usize] as usize)?
                }
                Feed::Stream(stream) => {
                    let doc = stream.next_doc()?;
                    self.state.stream = Some(doc.cursor.clone());
                    DocView::streamed(doc)
                }
            };
            self.current = Some(view);
        }
        Ok(self.current.as_ref().expect("just set"))
    }

    /// Documents in a row that may hold no token before the data is refused as empty.
    fn empty_limit(&self) -> usize {
        match self.feed {
            Feed::Cache(_) => self.order.len(),
            Feed::Stream(_) => EMPTY_STREAMED,
        }
    }

    /// The next on-policy prompt, from the next document: its first student ids or its
    /// record's prompt, as `source` says; the document is used up (the rest of a document
    /// partly packed into an earlier row is left, and a document without a prompt skipped).
    pub fn next_prompt(&mut self, source: PromptSource) -> Result<Vec<u32>> {
        if self.state.offset > 0 {
            self.advance_document();
        }
        let mut skipped = 0usize;
        loop {
            let view = self.view()?;
            let prompt = match source {
                PromptSource::FirstTokens(n) => {
                    let n = n.min(view.student_ids.len());
                    (n > 0).then(|| view.student_ids[..n].to_vec())
                }
                PromptSource::Field => view.prompt.clone().filter(|p| !p.is_empty()),
            };
            self.advance_document();
            if let Some(prompt) = prompt {
                return Ok(prompt);
            }
            skipped += 1;
            let limit = match (source, &self.feed) {
                (PromptSource::Field, Feed::Stream(_)) => PROMPTLESS_STREAMED,
                _ => self.empty_limit(),
            };
            if skipped > limit {
                return Err(Error::Data(match source {
                    PromptSource::FirstTokens(_) => {
                        "every document of the training data is empty: no prompt to draw".into()
                    }
                    PromptSource::Field => format!(
                        "the last {skipped} documents of the training data have no prompt: \
                         on_policy.prompt_field is missing, null or an empty string in each"
                    ),
                }));
            }
        }
    }

    /// The next row.
    pub fn next_row(&mut self) -> Result<AlignedText> {
        let mut row = AlignedText::empty(self.teachers);
        let mut empty_documents = 0usize;
        loop {
            let room = self.context - row.student_ids.len() as u32;
            if room == 0 {
                return Ok(row);
            }
            let offset = self.state.offset;
            let view = self.view()?;
            let len = view.len();
            if len <= offset {
                empty_documents += 1;
                if empty_documents > self.empty_limit() {
                    return Err(Error::Data(
                        "every document of the training data is empty".into(),
                    ));
                }
                self.advance_document();
                continue;
            }
            let limit = offset + room;
            if len <= limit {
                view.append_to(&mut row, offset, len);
                self.advance_document();
                if self.one_document {
                    return Ok(row);
                }
                continue;
            }
            // The largest clean cut that fits.
            let cut = view
                .cuts
                .iter()
                .rev()
                .map(|c| c.0)
                .find(|&p| p > offset && p <= limit);
            let cut = match cut {
                Some(p) => p,
                None if !row.student_ids.is_empty() => return Ok(row),
                None => limit,
            };
            view.append_to(&mut row, offset, cut);
            self.state.offset = cut;
        }
    }
}
