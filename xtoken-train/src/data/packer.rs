//! Packing: documents of the alignment cache concatenated into rows of at most `context`
//! student tokens, in a seeded order per epoch, cut only where no teacher's chunk straddles.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xtoken_core::align::{Alignment, Chunk, ChunkKind, Positions};
use xtoken_core::cache::AlignCache;

use super::AlignedText;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// `position`-th document of epoch `epoch`'s order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Epochs completed.
    pub epoch: u64,
    /// The document's place in the epoch's order.
    pub position: u64,
    /// Student tokens of that document already packed.
    pub offset: u32,
}

/// A document's ids and alignments, with the positions where it may be cut.
struct DocView {
    student_ids: Vec<u32>,
    teachers: Vec<(Vec<u32>, Vec<Chunk>)>,
    /// Student positions where no teacher's chunk straddles, with each teacher's position
    /// there; ascending, starting with 0 and ending with the document's length.
    cuts: Vec<(u32, Vec<u32>)>,
}

impl DocView {
    fn new(cache: &AlignCache, doc: usize) -> Result<Self> {
        let cached = cache.doc(doc)?;
        let student_ids = cached.student_ids.to_vec();
        let teachers: Vec<(Vec<u32>, Vec<Chunk>)> = cached
            .teachers
            .iter()
            .map(|t| (t.ids.to_vec(), t.alignment().chunks))
            .collect();
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
        Ok(DocView {
            student_ids,
            teachers,
            cuts,
        })
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

/// Packs documents into rows of at most `context` student tokens, deterministically.
pub struct Packer {
    cache: Arc<AlignCache>,
    seed: u64,
    context: u32,
    teachers: usize,
    state: LoaderState,
    order: Vec<u32>,
    current: Option<(u64, DocView)>,
}

impl Packer {
    /// A packer positioned at `state`.
    pub fn new(
        cache: Arc<AlignCache>,
        seed: u64,
        context: usize,
        state: LoaderState,
    ) -> Result<Self> {
        if cache.is_empty() {
            return Err(Error::Data(format!(
                "the training data has no documents (the cache {} is empty)",
                cache.metadata().source.display()
            )));
        }
        let teachers = cache.metadata().teachers.len();
        let order = epoch_order(cache.len(), seed, state.epoch);
        Ok(Packer {
            cache,
            seed,
            context: context as u32,
            teachers,
            state,
            order,
            current: None,
        })
    }

    /// The state before the next row.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    fn advance_document(&mut self) {
        self.state.position += 1;
        self.state.offset = 0;
        if self.state.position as usize >= self.order.len() {
            self.state.epoch += 1;
            self.state.position = 0;
            self.order = epoch_order(self.cache.len(), self.seed, self.state.epoch);
        }
    }

    fn view(&mut self) -> Result<&DocView> {
        let key = self.state.epoch * self.order.len() as u64 + self.state.position;
        if self.current.as_ref().map(|c| c.0) != Some(key) {
            let doc = self.order[self.state.position as usize] as usize;
            self.current = Some((key, DocView::new(&self.cache, doc)?));
        }
        Ok(&self.current.as_ref().expect("just set").1)
    }

    /// The next row.
    pub fn next_row(&mut self) -> Result<AlignedText> {
        let mut row = AlignedText {
            student_ids: Vec::new(),
            teachers: vec![
                (
                    Vec::new(),
                    Alignment {
                        chunks: Vec::new(),
                        student_len: 0,
                        teacher_len: 0,
                        score: f64::NAN,
                        band_bytes: 0,
                        band_edge_reached: false,
                    },
                );
                self.teachers
            ],
            respelled: Vec::new(),
        };
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
                if empty_documents > self.order.len() {
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
