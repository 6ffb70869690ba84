//! Which distillation loss a teacher is distilled with: one type from the run configuration
//! through the coverage audit and the losses down to the kernels.

use std::fmt;
use std::str::FromStr;

/// A distillation loss of the paper (§2.3–2.6). GOLD, H-KL and ULD are evaluated by one hybrid
/// computation (common KL + sorted L1) with different common sets: the strict set, the set
/// relaxed by W, and no set at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// Same-tokenizer KL on the teacher's top-K: `KL(p̂_T ‖ p̂_S)`.
    Kl,
    /// Projected KL: `KL(p̂_T ‖ p̃_S)` with `p̃_S = Wᵀp̂_S` re-normalized over the teacher
    /// vocabulary, with a learnable W.
    Pkl,
    /// Hybrid KL: GOLD over the common set relaxed by W's top-1.
    Hkl,
    /// GOLD: common KL over the strict 1-to-1 set + ULD over the remainders.
    Gold,
    /// Universal logit distillation: sorted L1 over the whole vocabularies.
    Uld,
}

impl LossKind {
    /// Every kind, in the paper's order of introduction.
    pub const ALL: [LossKind; 5] = [
        LossKind::Kl,
        LossKind::Uld,
        LossKind::Gold,
        LossKind::Pkl,
        LossKind::Hkl,
    ];

    /// The paper's name: `KL`, `P-KL`, `H-KL`, `GOLD`, `ULD`.
    pub fn name(self) -> &'static str {
        match self {
            LossKind::Kl => "KL",
            LossKind::Pkl => "P-KL",
            LossKind::Hkl => "H-KL",
            LossKind::Gold => "GOLD",
            LossKind::Uld => "ULD",
        }
    }

    /// The spelling in configuration files and on the command line: `kl`, `pkl`, `hkl`, `gold`,
    /// `uld`.
    pub fn key(self) -> &'static str {
        match self {
            LossKind::Kl => "kl",
            LossKind::Pkl => "pkl",
            LossKind::Hkl => "hkl",
            LossKind::Gold => "gold",
            LossKind::Uld => "uld",
        }
    }

    /// Whether the loss reads the common set C (GOLD and H-KL).
    pub fn reads_common_set(self) -> bool {
        matches!(self, LossKind::Gold | LossKind::Hkl)
    }

    /// Whether the loss needs the projection W: P-KL trains it, H-KL builds its relaxed set
    /// from it.
    pub fn needs_projection(self) -> bool {
        matches!(self, LossKind::Pkl | LossKind::Hkl)
    }
}

impl fmt::Display for LossKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A spelling that names no loss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected one of \"kl\", \"pkl\", \"hkl\", \"gold\", \"uld\"")]
pub struct UnknownLoss(pub String);

impl FromStr for LossKind {
    type Err = UnknownLoss;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LossKind::ALL
            .into_iter()
            .find(|kind| kind.key() == s)
            .ok_or_else(|| UnknownLoss(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back_and_names_are_the_papers() {
        for kind in LossKind::ALL {
            assert_eq!(kind.key().parse::<LossKind>(), Ok(kind));
        }
        assert_eq!(LossKind::Pkl.to_string(), "P-KL");
        assert_eq!(
            "pkll".parse::<LossKind>().unwrap_err().to_string(),
            "\"pkll\": expected one of \"kl\", \"pkl\", \"hkl\", \"gold\", \"uld\""
        );
    }
}
