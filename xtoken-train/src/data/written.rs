//! What the student wrote, made into a training row: a prompt and the student's continuation,
//! cut back to whole characters, read by every teacher as text and aligned with the student's own
//! ids by the DP, as a document is.
//!
//! **The text.** A continuation ends before its first special token (EOS or any other: a special
//! token has no text for a teacher to read). Byte-level tokens can split a character, and a
//! student can write bytes that are no UTF-8 at all; the sequence is cut back to its longest
//! prefix of whole tokens whose bytes are whole characters, so no byte is lost or invented in
//! the text the teachers read. A SentencePiece student's dummy prefix (the space its encoding
//! puts before a text) is not text either.
//!
//! **The loss.** [`Written::trained`] keeps the chunks that lie in the continuation: a chunk
//! starting inside the prompt (or straddling its end) is dropped, so the logits that predict
//! prompt tokens take no gradient. The rows carry no cross-entropy label ([`micro_batch`]): the
//! student's own tokens are no ground truth.

use xtoken_core::align::Workspace;
use xtoken_core::plan::MergeVariant;
use xtoken_core::vocab::{TokenKind, Vocabulary};

use super::batch::{micro_batch, MicroBatch};
use super::pipeline::{AlignedText, Pipeline};
use crate::error::{Context, Result};

/// A prompt and what the student wrote after it.
#[derive(Debug, Clone)]
pub struct Written {
    /// The student's ids (the prompt's, then the continuation's), each teacher's ids of the same
    /// text, and their alignments over the whole sequence.
    pub row: AlignedText,
    /// The prompt's student tokens (the first of `row`'s).
    pub prompt_len: usize,
    /// The continuation's student tokens kept.
    pub generated: usize,
    /// The text the teachers read.
    pub text: String,
}

impl Written {
    /// The row with only the chunks that start in the continuation.
    pub fn trained(mut self) -> AlignedText {
        let start = self.prompt_len as u32;
        for (_, alignment) in &mut self.row.teachers {
            alignment.chunks.retain(|c| c.student.start >= start);
        }
        self.row
    }
}

/// Per student id, whether it ends a continuation: the special tokens.
pub fn stop_ids(vocab: &Vocabulary) -> Vec<bool> {
    vocab
        .tokens()
        .iter()
        .map(|t| t.kind == TokenKind::Special)
        .collect()
}

/// The row of `prompt` followed by `continuation` (student ids), every teacher reading its text.
pub fn written(
    pipeline: &Pipeline,
    ws: &mut Workspace,
    prompt: &[u32],
    continuation: &[u32],
) -> Result<Written> {
    let vocab = &pipeline.student;
    let stops = |id: &u32| {
        vocab
            .token(*id)
            .is_none_or(|t| t.kind == TokenKind::Special)
    };
    let until_stop = continuation
        .iter()
        .position(stops)
        .unwrap_or(continuation.len());
    let mut ids: Vec<u32> = prompt.to_vec();
    ids.extend_from_slice(&continuation[..until_stop]);
    let (kept, text) = whole_text(vocab, &ids);
    ids.truncate(kept);
    let prompt_len = prompt.len().min(kept);
    let mut teachers = Vec::with_capacity(pipeline.teachers.len());
    let mut respelled = Vec::with_capacity(pipeline.teachers.len());
    for (teacher, aligner) in pipeline.teachers.iter().zip(&pipeline.aligners) {
        let teacher_ids = teacher.encode(&text)?;
        let alignment = aligner
            .align_with(ws, &ids, &teacher_ids)
            .with_context(|| format!("aligning the student's text {:?}", preview(&text)))?;
        teachers.push((teacher_ids, alignment));
        respelled.push(!ws.same_text());
    }
    Ok(Written {
        row: AlignedText {
            student_ids: ids,
            teachers,
            respelled,
            spans: Vec::new(),
        },
        prompt_len,
        generated: kept - prompt_len,
        text,
    })
}

/// The longest prefix of `ids` whose bytes are whole UTF-8 characters: its length in tokens, and
/// its text (special tokens spell none; a SentencePiece dummy prefix is dropped).
fn whole_text(vocab: &Vocabulary, ids: &[u32]) -> (usize, String) {
    let mut bytes = Vec::new();
    // The byte offset after each token.
    let mut ends = Vec::with_capacity(ids.len());
    let mut leading = vocab.adds_prefix_space();
    for &id in ids {
        if let Some(token) = vocab.token(id).filter(|t| t.kind != TokenKind::Special) {
            let mut spelled: &[u8] = &token.bytes;
            if leading && !spelled.is_empty() {
                spelled = spelled.strip_prefix(b" ").unwrap_or(spelled);
                leading = false;
            }
            bytes.extend_from_slice(spelled);
        }
        ends.push(bytes.len());
    }
    let valid = match std::str::from_utf8(&bytes) {
        Ok(_) => bytes.len(),
        Err(e) => e.valid_up_to(),
    };
    let kept = ends.iter().take_while(|&&end| end <= valid).count();
    let end = if kept == 0 { 0 } else { ends[kept - 1] };
    bytes.truncate(end);
    // Whole characters by construction: the prefix up to `valid` is UTF-8.
    let text = String::from_utf8(bytes).unwrap_or_default();
    (kept, text)
}

/// The start of a text, for messages.
fn preview(text: &str) -> String {
    let head: String = text.chars().take(60).collect();
    match head.len() < text.len() {
        true => format!("{head}…"),
        false => head,
    }
}

/// The student's rows as an on-policy micro-batch: each keeps only its generated span's chunks,
/// and no position has a cross-entropy label.
pub fn on_policy_batch(
    rows: Vec<Written>,
    variant: MergeVariant,
    length_multiple: usize,
) -> Result<MicroBatch> {
    let generated = rows.iter().map(|r| r.generated).sum();
    let rows: Vec<AlignedText> = rows.into_iter().map(Written::trained).collect();
    let mut micro = micro_batch(&rows, variant, length_multiple)?;
    micro.generated = generated;
    for teacher in &mut micro.teachers {
        teacher.plan.student.next_token.fill(-1);
    }
    micro.on_policy = true;
    Ok(micro)
}
