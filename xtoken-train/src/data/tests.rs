//! Packing, micro-batches and epoch orders on a small hand-made cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use xtoken_core::align::{Alignment, Chunk, ChunkKind, Positions};
use xtoken_core::cache::{encode_record, AlignCache, CacheMetadata, CacheWriter, TokenizerRecord};
use xtoken_core::plan::MergeVariant;

use super::batch::micro_batch;
use super::packer::epoch_order;
use super::packer::{Feed, LoaderState, Packer};
use super::pipeline::AlignedText;

/// The teacher spelling of a student id: odd ids split in two, as a digit-splitting
/// teacher splits a packed numeral.
fn spell(s: u32) -> Vec<u32> {
    if s.is_multiple_of(2) {
        vec![s]
    } else {
        vec![s, s + 1000]
    }
}

/// A cache of `docs` documents of varied lengths, each aligned chunk by chunk, with a
/// teacher-only gap (id 9999) after every seventh token.
fn cache(dir: &Path, docs: usize) -> (AlignCache, Vec<Vec<u32>>) {
    let record = |name: &str| TokenizerRecord {
        path: PathBuf::from(name),
        sha256: String::new(),
        size: 20_000,
    };
    let path = dir.join("docs.xtc");
    let mut writer = CacheWriter::create(
        &path,
        CacheMetadata {
            student: record("student"),
            teachers: vec![record("teacher")],
            params: Default::default(),
            source: PathBuf::from("docs.jsonl"),
            text_field: "text".into(),
            student_tokens: 0,
            created_by: "test".into(),
        },
    )
    .unwrap();
    let mut all = Vec::new();
    for d in 0..docs {
        let student: Vec<u32> = (0..(d * 5 % 17) as u32).map(|i| i * 3 + d as u32).collect();
        let (mut teacher, mut chunks) = (Vec::new(), Vec::new());
        for (p, &s) in student.iter().enumerate() {
            let t = spell(s);
            chunks.push(Chunk {
                student: Positions {
                    start: p as u32,
                    len: 1,
                },
                teacher: Positions {
                    start: teacher.len() as u32,
                    len: t.len() as u32,
                },
                kind: ChunkKind::from_lengths(1, t.len() as u32),
            });
            teacher.extend(t);
            if p % 7 == 6 {
                chunks.push(Chunk {
                    student: Positions {
                        start: p as u32 + 1,
                        len: 0,
                    },
                    teacher: Positions {
                        start: teacher.len() as u32,
                        len: 1,
                    },
                    kind: ChunkKind::Gap,
                });
                teacher.push(9999);
            }
        }
        let alignment = Alignment {
            chunks,
            student_len: student.len() as u32,
            teacher_len: teacher.len() as u32,
            score: 0.0,
            band_bytes: 16,
            band_edge_reached: false,
        };
        let bytes = encode_record(&student, &[(&teacher, &alignment)]).unwrap();
        writer.push(&bytes, student.len()).unwrap();
        all.push(student);
    }
    writer.finish().unwrap();
    (AlignCache::open(&path).unwrap(), all)
}

#[test]
fn packing_keeps_every_token_and_chunk_and_resumes_exactly() {
    let dir = std::env::temp_dir().join(format!("xtoken-packing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cache, docs) = cache(&dir, 30);
    let cache = Arc::new(cache);
    let context = 9;
    let feed = Feed::Cache(cache.clone());
    let mut packer = Packer::new(feed, 1, 5, context, LoaderState::default()).unwrap();
    let mut rows = Vec::new();
    let mut states = Vec::new();
    while packer.state().unwrap().epoch == 0 {
        states.push(packer.state().unwrap());
        rows.push(packer.next_row().unwrap());
    }
    // Epoch 0 is every document once, in the seeded order, cut into rows of ≤ context; the
    // row that ends it is filled from epoch 1's order.
    let order = epoch_order(docs.len(), 5, 0);
    let next = epoch_order(docs.len(), 5, 1);
    let expected: Vec<u32> = order
        .iter()
        .flat_map(|&d| docs[d as usize].clone())
        .collect();
    let packed: Vec<u32> = rows.iter().flat_map(|r| r.student_ids.clone()).collect();
    assert_eq!(packed[..expected.len()], expected[..]);
    let spill = &packed[expected.len()..];
    assert!(spill.len() < context);
    let following: Vec<u32> = next
        .iter()
        .flat_map(|&d| docs[d as usize].clone())
        .collect();
    assert_eq!(spill, &following[..spill.len()]);
    for row in &rows {
        assert!(row.student_ids.len() <= context);
        let (teacher, alignment) = &row.teachers[0];
        assert_eq!(alignment.student_len as usize, row.student_ids.len());
        assert_eq!(alignment.teacher_len as usize, teacher.len());
        // Every token is a one-token chunk here, so every chunk survives the cuts…
        assert_eq!(alignment.chunks.len(), row.student_ids.len());
        // …and pairs a student token with its own spelling.
        for c in &alignment.chunks {
            let s = row.student_ids[c.student.start as usize];
            let t = &teacher[c.teacher.range()];
            assert_eq!(t, spell(s).as_slice());
        }
    }
    // Starting from any saved state gives the same rows.
    for (i, state) in states.iter().enumerate().step_by(3) {
        let feed = Feed::Cache(cache.clone());
        let mut resumed = Packer::new(feed, 1, 5, context, state.clone()).unwrap();
        for row in &rows[i..(i + 3).min(rows.len())] {
            assert_eq!(resumed.next_row().unwrap().student_ids, row.student_ids);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn micro_batches_pad_and_plan_every_row() {
    let dir = std::env::temp_dir().join(format!("xtoken-micro-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cache, _) = cache(&dir, 12);
    let feed = Feed::Cache(Arc::new(cache));
    let mut packer = Packer::new(feed, 1, 1, 16, LoaderState::default()).unwrap();
    let rows: Vec<AlignedText> = (0..3).map(|_| packer.next_row().unwrap()).collect();
    let batch = micro_batch(&rows, MergeVariant::FirstToken, 1).unwrap();
    assert_eq!(batch.rows, 3);
    assert_eq!(
        batch.tokens,
        rows.iter().map(|r| r.student_ids.len()).sum::<usize>()
    );
    let plan = &batch.teachers[0].plan;
    assert_eq!((plan.batch, plan.student_len), (3, batch.student_len));
    assert_eq!(plan.teacher_len, batch.teachers[0].len);
    // Every chunk but one starting a row at position 0 is compared.
    let chunks: usize = rows.iter().map(|r| r.teachers[0].1.chunks.len()).sum();
    assert!(plan.valid_chunks() >= chunks - 3 && plan.valid_chunks() <= chunks);

    // Teacher rows padded to a multiple of 8: the same chunks read the same (sequence,
    // position) of every row, and the positions added are padding.
    let padded = micro_batch(&rows, MergeVariant::FirstToken, 8).unwrap();
    let (a, b) = (&batch.teachers[0], &padded.teachers[0]);
    assert_eq!(b.len, a.len.next_multiple_of(8));
    assert_eq!(b.plan.teacher_len, b.len);
    assert_eq!(b.plan.chunk_mask, a.plan.chunk_mask);
    assert_eq!(padded.student_ids, batch.student_ids);
    let place = |row: i32, len: usize| (row as usize / len, row as usize % len);
    let (sa, sb) = (&a.plan.teacher, &b.plan.teacher);
    for (ra, rb) in sa.predict_row.iter().zip(&sb.predict_row) {
        assert_eq!(place(*ra, a.len), place(*rb, b.len));
    }
    for (ra, rb) in sa.continuation_row.iter().zip(&sb.continuation_row) {
        assert_eq!(place(*ra, a.len), place(*rb, b.len));
    }
    let mask = b.padding.as_ref().expect("padding");
    for (r, row) in rows.iter().enumerate() {
        let real = row.teachers[0].0.len();
        assert!((0..b.len).all(|p| mask[r * b.len + p] == (p >= real)));
        assert_eq!(
            &b.ids[r * b.len..r * b.len + real],
            &a.ids[r * a.len..r * a.len + real]
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn epoch_orders_are_seeded_permutations() {
    let a = epoch_order(100, 7, 0);
    assert_eq!(a, epoch_order(100, 7, 0));
    assert_ne!(a, epoch_order(100, 7, 1));
    assert_ne!(a, epoch_order(100, 8, 0));
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..100).collect::<Vec<u32>>());
}
