//! Canonicalization: the paper's five rules that make functionally equal tokens of different
//! tokenizer families compare equal (appendix "Canonicalization rules").
//!
//! It works in two steps, always on bytes so that a token holding part of a UTF-8 character keeps
//! exactly its bytes:
//!
//! 1. [`surface_bytes`] turns a token's surface form (the string in `tokenizer.json`) into the
//!    exact bytes it stands for, under its family's [`SurfaceScheme`]. This is where the
//!    family-specific markers live:
//!    - rule 1, space prefix: `Ġ` (byte-level BPE) and `▁` (SentencePiece) become `' '`;
//!    - rule 2, newline: `Ċ` (byte-level BPE) becomes `'\n'`;
//!    - rule 3, byte fallback: a SentencePiece `<0xHH>` token becomes the byte `0xHH`.
//!
//!    Byte-level surfaces are decoded through GPT-2's byte alphabet as a whole, so every marker
//!    (`Ġ`, `Ċ`, `ĉ` for tab, …) maps to its byte wherever it stands in the token.
//! 2. [`canonicalize`] applies the text-level rules to those bytes:
//!    - rule 2, newline: the escaped two-character `\n` becomes a newline;
//!    - rule 4, whitespace + punctuation: a token that is exactly a space followed by one of
//!      `,` `.` `:` `;` becomes the punctuation alone.
//!
//!    Because real vocabularies hold both `"\n"` and the two characters `"\\n"` (and both `","` and
//!    `" ,"`), the projection prefers a byte-identical partner whenever one exists; the rules decide
//!    only when the teacher lacks the student's exact spelling.
//!
//! Rule 5, special tokens, is not a string rule: [`SpecialRole`] pairs BOS, EOS, PAD, UNK and
//! chat-turn markers across families by role, when the role is unambiguous on both sides.
//!
//! ```
//! use xtoken_core::canon::{canonical_token, SurfaceScheme};
//! let bl = SurfaceScheme::ByteLevel;
//! let sp = SurfaceScheme::SentencePiece { byte_fallback: true };
//! assert_eq!(canonical_token("Ġthe", bl), b" the");
//! assert_eq!(canonical_token("▁the", sp), b" the");
//! assert_eq!(canonical_token("Ċ", bl), b"\n");
//! assert_eq!(canonical_token("<0x0A>", sp), b"\n");
//! assert_eq!(canonical_token("\\n", bl), b"\n");
//! assert_eq!(canonical_token("Ġ,", bl), b",");
//! // A byte-level token holding the first two bytes of "€" (E2 82 AC) keeps exactly those bytes.
//! assert_eq!(canonical_token("âĤ", bl), [0xE2, 0x82]);
//! ```

use std::borrow::Cow;

/// How a tokenizer family spells token bytes in its vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SurfaceScheme {
    /// GPT-2 style byte-level BPE: every byte is one printable character (`Ġ` = space, `Ċ` = newline).
    ByteLevel,
    /// SentencePiece style: `▁` stands for a space; with byte fallback, `<0xHH>` tokens are raw bytes.
    SentencePiece {
        /// Whether `<0xHH>` tokens are byte-fallback tokens.
        byte_fallback: bool,
    },
    /// The surface is the token's text itself (added tokens: `<|im_start|>`, `<think>`).
    Literal,
}

/// GPT-2's byte alphabet, inverted: `BYTE_OF_CHAR[c]` is the byte that code point `c` stands for,
/// or `NONE` when `c` is not in the alphabet. The alphabet uses code points below 324.
const BYTE_OF_CHAR: [u16; 324] = byte_level_inverse();
const NONE: u16 = u16::MAX;

const fn is_printable_byte(b: u32) -> bool {
    (b >= b'!' as u32 && b <= b'~' as u32) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

const fn byte_level_inverse() -> [u16; 324] {
    let mut table = [NONE; 324];
    let mut shifted = 0;
    let mut b = 0u32;
    while b < 256 {
        if is_printable_byte(b) {
            table[b as usize] = b as u16;
        } else {
            table[(256 + shifted) as usize] = b as u16;
            shifted += 1;
        }
        b += 1;
    }
    table
}

/// The character GPT-2's byte-level alphabet uses for `byte` (`b' '` → `'Ġ'`).
pub fn byte_level_char(byte: u8) -> char {
    let b = byte as u32;
    if is_printable_byte(b) {
        return char::from_u32(b).unwrap_or('\u{FFFD}');
    }
    let shifted = (0..b).filter(|&x| !is_printable_byte(x)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or('\u{FFFD}')
}

/// Decodes a byte-level surface to bytes; `None` when a character is outside the byte alphabet.
fn byte_level_bytes(surface: &str) -> Option<Vec<u8>> {
    surface
        .chars()
        .map(|c| match BYTE_OF_CHAR.get(c as usize) {
            Some(&b) if b != NONE => Some(b as u8),
            _ => None,
        })
        .collect()
}

/// Parses a SentencePiece byte-fallback token `<0xHH>`.
pub fn parse_byte_fallback(surface: &str) -> Option<u8> {
    let hex = surface.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The exact bytes a token surface stands for under `scheme` (rules 1–3).
///
/// A byte-level surface with a character outside the byte alphabet is taken as literal text, the
/// way the `ByteLevel` decoder of `tokenizers` passes such characters through.
pub fn surface_bytes(surface: &str, scheme: SurfaceScheme) -> Vec<u8> {
    match scheme {
        SurfaceScheme::ByteLevel => {
            byte_level_bytes(surface).unwrap_or_else(|| surface.as_bytes().to_vec())
        }
        SurfaceScheme::SentencePiece { byte_fallback } => {
            if byte_fallback {
                if let Some(b) = parse_byte_fallback(surface) {
                    return vec![b];
                }
            }
            surface.replace('\u{2581}', " ").into_bytes()
        }
        SurfaceScheme::Literal => surface.as_bytes().to_vec(),
    }
}

/// Punctuation whose leading space is dropped by rule 4.
const SPACE_DROPPING_PUNCT: &[u8] = b",.:;";

/// Applies the text-level rules (escaped newline, whitespace + punctuation) to a token's bytes.
/// Idempotent: `canonicalize(canonicalize(x)) == canonicalize(x)`.
pub fn canonicalize(bytes: &[u8]) -> Cow<'_, [u8]> {
    let mut out: Cow<'_, [u8]> = Cow::Borrowed(bytes);
    if bytes.windows(2).any(|w| w == b"\\n") {
        let mut unescaped = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'n') {
                unescaped.push(b'\n');
                i += 2;
            } else {
                unescaped.push(bytes[i]);
                i += 1;
            }
        }
        out = Cow::Owned(unescaped);
    }
    if out.len() == 2 && out[0] == b' ' && SPACE_DROPPING_PUNCT.contains(&out[1]) {
        out = Cow::Owned(vec![out[1]]);
    }
    out
}

/// The canonical bytes of a token surface: [`surface_bytes`] then [`canonicalize`].
pub fn canonical_token(surface: &str, scheme: SurfaceScheme) -> Vec<u8> {
    canonicalize(&surface_bytes(surface, scheme)).into_owned()
}

/// The role of a special token, by which special tokens are paired across families (rule 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialRole {
    /// Beginning of sequence (`<s>`, `<|begin_of_text|>`).
    Bos,
    /// End of text / document (`</s>`, `<|end_of_text|>`, `<|endoftext|>`).
    Eos,
    /// Padding.
    Pad,
    /// Unknown token.
    Unk,
    /// Opens a chat turn (`<|im_start|>`, `<|start_header_id|>`).
    TurnStart,
    /// Closes a chat turn (`<|im_end|>`, `<|eot_id|>`, `<|end|>`).
    TurnEnd,
    /// Marks the system role of a turn (`<|system|>`).
    System,
    /// Marks the user role of a turn (`<|user|>`).
    User,
    /// Marks the assistant role of a turn (`<|assistant|>`).
    Assistant,
}

impl SpecialRole {
    /// Every role, in the order used for reports.
    pub const ALL: [SpecialRole; 9] = [
        SpecialRole::Bos,
        SpecialRole::Eos,
        SpecialRole::Pad,
        SpecialRole::Unk,
        SpecialRole::TurnStart,
        SpecialRole::TurnEnd,
        SpecialRole::System,
        SpecialRole::User,
        SpecialRole::Assistant,
    ];

    /// Short lowercase name (`bos`, `turn_end`, …).
    pub fn name(self) -> &'static str {
        match self {
            SpecialRole::Bos => "bos",
            SpecialRole::Eos => "eos",
            SpecialRole::Pad => "pad",
            SpecialRole::Unk => "unk",
            SpecialRole::TurnStart => "turn_start",
            SpecialRole::TurnEnd => "turn_end",
            SpecialRole::System => "system",
            SpecialRole::User => "user",
            SpecialRole::Assistant => "assistant",
        }
    }
}

/// Special tokens whose role is fixed by their family's convention. They win over the
/// `bos_token`/`eos_token` fields of a config: Llama-3.2-Instruct declares `<|eot_id|>` its EOS,
/// yet it closes a turn, as `<|im_end|>` does for Qwen and `<|end|>` for Phi-4-mini.
const KNOWN_SPECIALS: &[(&str, SpecialRole)] = &[
    ("<s>", SpecialRole::Bos),
    ("<|begin_of_text|>", SpecialRole::Bos),
    ("<|startoftext|>", SpecialRole::Bos),
    ("<bos>", SpecialRole::Bos),
    ("</s>", SpecialRole::Eos),
    ("<|end_of_text|>", SpecialRole::Eos),
    ("<|endoftext|>", SpecialRole::Eos),
    ("<eos>", SpecialRole::Eos),
    ("<pad>", SpecialRole::Pad),
    ("<|pad|>", SpecialRole::Pad),
    ("<|finetune_right_pad_id|>", SpecialRole::Pad),
    ("<unk>", SpecialRole::Unk),
    ("<|im_start|>", SpecialRole::TurnStart),
    ("<|start_header_id|>", SpecialRole::TurnStart),
    ("<start_of_turn>", SpecialRole::TurnStart),
    ("<|im_end|>", SpecialRole::TurnEnd),
    ("<|eot_id|>", SpecialRole::TurnEnd),
    ("<|end|>", SpecialRole::TurnEnd),
    ("<end_of_turn>", SpecialRole::TurnEnd),
    ("<|system|>", SpecialRole::System),
    ("<|user|>", SpecialRole::User),
    ("<|assistant|>", SpecialRole::Assistant),
];

/// The role of a special token: its family convention first, else the first role the tokenizer's
/// config files give it (`config_roles`, in the order bos, eos, pad, unk).
pub fn special_role(content: &str, config_roles: &[SpecialRole]) -> Option<SpecialRole> {
    KNOWN_SPECIALS
        .iter()
        .find(|(known, _)| *known == content)
        .map(|&(_, role)| role)
        .or_else(|| config_roles.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BL: SurfaceScheme = SurfaceScheme::ByteLevel;
    const SP: SurfaceScheme = SurfaceScheme::SentencePiece {
        byte_fallback: true,
    };

    #[test]
    fn byte_level_alphabet_round_trips_every_byte() {
        for b in 0..=255u8 {
            let c = byte_level_char(b);
            assert_eq!(surface_bytes(&c.to_string(), BL), vec![b], "byte {b:#04x}");
        }
        assert_eq!(byte_level_char(b' '), 'Ġ');
        assert_eq!(byte_level_char(b'\n'), 'Ċ');
        assert_eq!(byte_level_char(b'\t'), 'ĉ');
    }

    #[test]
    fn space_markers_of_every_family_become_one_space() {
        assert_eq!(canonical_token("Ġworld", BL), b" world");
        assert_eq!(canonical_token("▁world", SP), b" world");
        assert_eq!(canonical_token(" world", SurfaceScheme::Literal), b" world");
        // Two markers are two spaces: runs of spaces are distinct tokens in every family.
        assert_eq!(canonical_token("ĠĠ", BL), b"  ");
        assert_eq!(canonical_token("▁▁", SP), b"  ");
    }

    #[test]
    fn newlines_unify() {
        assert_eq!(canonical_token("Ċ", BL), b"\n");
        assert_eq!(canonical_token("ĊĊ", BL), b"\n\n");
        assert_eq!(canonical_token("\n", SurfaceScheme::Literal), b"\n");
        assert_eq!(canonical_token("\\n", BL), b"\n");
        assert_eq!(canonical_token("<0x0A>", SP), b"\n");
    }

    #[test]
    fn byte_fallback_only_where_the_family_has_it() {
        assert_eq!(canonical_token("<0xFF>", SP), [0xFF]);
        let no_fallback = SurfaceScheme::SentencePiece {
            byte_fallback: false,
        };
        assert_eq!(canonical_token("<0xFF>", no_fallback), b"<0xFF>");
        assert_eq!(canonical_token("<0xF>", SP), b"<0xF>");
        assert_eq!(canonical_token("<0xZZ>", SP), b"<0xZZ>");
    }

    #[test]
    fn space_before_listed_punctuation_is_dropped() {
        for p in [",", ".", ":", ";"] {
            assert_eq!(canonical_token(&format!("Ġ{p}"), BL), p.as_bytes());
        }
        assert_eq!(canonical_token("Ġ!", BL), b" !");
        assert_eq!(canonical_token("Ġ...", BL), b" ...");
        assert_eq!(canonical_token("ĠĠ,", BL), b"  ,");
    }

    #[test]
    fn partial_utf8_keeps_its_bytes() {
        // "€" is E2 82 AC; a token holding E2 82 must neither lose nor replace them.
        assert_eq!(canonical_token("âĤ", BL), [0xE2, 0x82]);
        assert_eq!(canonical_token("<0xE2>", SP), [0xE2]);
    }

    #[test]
    fn roles_prefer_family_convention_over_config() {
        assert_eq!(
            special_role("<|eot_id|>", &[SpecialRole::Eos]),
            Some(SpecialRole::TurnEnd)
        );
        assert_eq!(
            special_role("<|endoftext|>", &[SpecialRole::Pad]),
            Some(SpecialRole::Eos)
        );
        assert_eq!(
            special_role("<|my_bos|>", &[SpecialRole::Bos]),
            Some(SpecialRole::Bos)
        );
        assert_eq!(special_role("<|reserved_special_token_0|>", &[]), None);
    }

    proptest! {
        #[test]
        fn canonicalize_is_idempotent(bytes in proptest::collection::vec(
            prop_oneof![Just(b'\\'), Just(b'n'), Just(b' '), Just(b','), Just(b'\n'), any::<u8>()], 0..12)) {
            let once = canonicalize(&bytes).into_owned();
            let twice = canonicalize(&once).into_owned();
            prop_assert_eq!(once, twice);
        }

        #[test]
        fn canonical_token_is_idempotent_on_its_own_output(bytes in proptest::collection::vec(any::<u8>(), 0..12)) {
            // Re-spelling canonical bytes as a byte-level surface and canonicalizing again changes nothing.
            let once = canonicalize(&bytes).into_owned();
            let surface: String = once.iter().map(|&b| byte_level_char(b)).collect();
            prop_assert_eq!(canonical_token(&surface, BL), once);
        }

        #[test]
        fn byte_level_surfaces_never_lose_or_invent_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let surface: String = bytes.iter().map(|&b| byte_level_char(b)).collect();
            prop_assert_eq!(surface_bytes(&surface, BL), bytes);
        }
    }
}
