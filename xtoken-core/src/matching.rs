//! Exact canonical matching of one vocabulary against another: the partners a token has under
//! canonical string equality (rules 1–4) or role pairing (rule 5). W's exact pass, GOLD's common
//! set and H-KL's relaxed set all read their pairs from here, so they can never disagree.

use std::collections::HashMap;

use crate::canon::{canonicalize, SpecialRole};
use crate::vocab::{Token, TokenKind, Vocabulary};

/// How a token found its partners on the other side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partners {
    /// Canonical-string equal tokens (several only when the other side spells one text twice).
    Text(Vec<u32>),
    /// The one special token with the same role, or failing that the same text.
    Special(u32),
    /// No exact partner.
    None,
}

/// Finds the exact partners of `from`-side tokens among `to`-side tokens.
pub struct ExactMatcher<'a> {
    to: &'a Vocabulary,
    by_canonical: HashMap<Box<[u8]>, Vec<u32>>,
    /// Roles held by exactly one special token on each side, with the `to`-side holder.
    unique_roles: HashMap<SpecialRole, u32>,
    from_role_counts: HashMap<SpecialRole, usize>,
    specials_by_text: HashMap<&'a str, Vec<u32>>,
}

impl<'a> ExactMatcher<'a> {
    /// Indexes `to` for lookups of `from`'s tokens: O(|V_from| + |V_to|), no double loop.
    pub fn new(from: &'a Vocabulary, to: &'a Vocabulary) -> Self {
        let mut by_canonical: HashMap<Box<[u8]>, Vec<u32>> =
            HashMap::with_capacity(to.tokenizer_size());
        let mut to_roles: HashMap<SpecialRole, Vec<u32>> = HashMap::new();
        let mut specials_by_text: HashMap<&str, Vec<u32>> = HashMap::new();
        for (id, token) in to.tokens().iter().enumerate() {
            let id = id as u32;
            match token.kind {
                TokenKind::Normal | TokenKind::ByteFallback | TokenKind::Added => {
                    by_canonical
                        .entry(canonicalize(&token.bytes).into())
                        .or_default()
                        .push(id);
                }
                TokenKind::Special => {
                    if let Some(role) = token.role {
                        to_roles.entry(role).or_default().push(id);
                    }
                    specials_by_text
                        .entry(token.surface.as_str())
                        .or_default()
                        .push(id);
                }
                TokenKind::Padding => {}
            }
        }
        let mut from_role_counts: HashMap<SpecialRole, usize> = HashMap::new();
        for token in from.tokens() {
            if let (TokenKind::Special, Some(role)) = (token.kind, token.role) {
                *from_role_counts.entry(role).or_default() += 1;
            }
        }
        let unique_roles = to_roles
            .into_iter()
            .filter(|(role, ids)| ids.len() == 1 && from_role_counts.get(role) == Some(&1))
            .map(|(role, ids)| (role, ids[0]))
            .collect();
        ExactMatcher {
            to,
            by_canonical,
            unique_roles,
            from_role_counts,
            specials_by_text,
        }
    }

    /// The exact partners of a `from`-side token.
    ///
    /// Among canonical-equal candidates a byte-identical one wins (the rules only decide when the
    /// other side lacks the exact spelling: `" ,"` pairs with `" ,"` where it exists, else with
    /// `","`), and an ordinary token wins over a `<0xHH>` byte-fallback token of the same byte.
    pub fn partners(&self, token: &Token) -> Partners {
        match token.kind {
            TokenKind::Padding => Partners::None,
            TokenKind::Special => self.special_partner(token),
            _ => {
                let Some(candidates) = self.by_canonical.get(&*canonicalize(&token.bytes)) else {
                    return Partners::None;
                };
                let tokens = self.to.tokens();
                let identical: Vec<u32> = candidates
                    .iter()
                    .copied()
                    .filter(|&t| tokens[t as usize].bytes == token.bytes)
                    .collect();
                let pool = if identical.is_empty() {
                    candidates.clone()
                } else {
                    identical
                };
                let ordinary: Vec<u32> = pool
                    .iter()
                    .copied()
                    .filter(|&t| tokens[t as usize].kind != TokenKind::ByteFallback)
                    .collect();
                Partners::Text(if ordinary.is_empty() { pool } else { ordinary })
            }
        }
    }

    fn special_partner(&self, token: &Token) -> Partners {
        if let Some(role) = token.role {
            if self.from_role_counts.get(&role) == Some(&1) {
                if let Some(&t) = self.unique_roles.get(&role) {
                    return Partners::Special(t);
                }
            }
        }
        match self.specials_by_text.get(token.surface.as_str()) {
            Some(ids) if ids.len() == 1 => {
                // Same text, but only if the other side's token is not already paired by role.
                let t = ids[0];
                let taken = self.unique_roles.values().any(|&r| r == t)
                    && self.to.tokens()[t as usize].role != token.role;
                if taken {
                    Partners::None
                } else {
                    Partners::Special(t)
                }
            }
            _ => Partners::None,
        }
    }
}
