//! The learning-rate schedule of the paper: linear warmup, then a half cosine to the floor.

/// Learning rate of step `step` (0-based) of `total`: linear warmup over the first
/// `warmup · total` steps, then a half cosine from `lr` to `min_lr`.
pub fn learning_rate(step: u64, total: u64, lr: f64, warmup: f64, min_lr: f64) -> f64 {
    let warmup_steps = (warmup * total as f64).ceil() as u64;
    if step < warmup_steps {
        return lr * (step + 1) as f64 / warmup_steps as f64;
    }
    let span = total.saturating_sub(warmup_steps).max(1) as f64;
    let progress = ((step - warmup_steps) as f64 / span).min(1.0);
    min_lr + (lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// Where a run extended with [`Extension::Decay`](crate::train::resume::Extension) starts its new
/// decay: the step it resumed at and the rate it had reached.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DecayAnchor {
    /// Steps completed when the run was extended.
    pub step: u64,
    /// The learning rate of that step.
    pub lr: f64,
}

/// Learning rate of step `step` of `total` when a decay starts at `anchor`: the paper's
/// schedule before it, then a half cosine from `anchor.lr` to `min_lr` at `total`.
pub fn anchored_rate(
    step: u64,
    total: u64,
    (lr, warmup, min_lr): (f64, f64, f64),
    anchor: Option<DecayAnchor>,
) -> f64 {
    match anchor {
        Some(a) if step >= a.step => {
            let span = total.saturating_sub(a.step).max(1) as f64;
            let progress = ((step - a.step) as f64 / span).min(1.0);
            min_lr + (a.lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
        _ => learning_rate(step, total, lr, warmup, min_lr),
    }
}

#[cfg(test)]
mod tests {
    use super::{anchored_rate, learning_rate, DecayAnchor};

    #[test]
    fn an_anchored_decay_starts_where_the_rate_stood_and_ends_at_the_floor() {
        let rates = (1.0, 0.1, 0.01);
        let before = learning_rate(60, 100, 1.0, 0.1, 0.01);
        let anchor = DecayAnchor {
            step: 60,
            lr: before,
        };
        assert_eq!(
            anchored_rate(30, 200, rates, Some(anchor)),
            learning_rate(30, 200, 1.0, 0.1, 0.01)
        );
        assert!((anchored_rate(60, 200, rates, Some(anchor)) - before).abs() < 1e-12);
        assert!(
            (anchored_rate(130, 200, rates, Some(anchor)) - (0.01 + (before - 0.01) * 0.5)).abs()
                < 1e-12
        );
        assert!((anchored_rate(200, 200, rates, Some(anchor)) - 0.01).abs() < 1e-12);
        assert_eq!(
            anchored_rate(7, 100, rates, None),
            learning_rate(7, 100, 1.0, 0.1, 0.01)
        );
    }

    #[test]
    fn warmup_then_cosine_to_zero() {
        let lr = |s| learning_rate(s, 100, 1.0, 0.05, 0.0);
        assert!((lr(0) - 0.2).abs() < 1e-12);
        assert!((lr(4) - 1.0).abs() < 1e-12);
        assert!((lr(5) - 1.0).abs() < 1e-12);
        // After the 5 warmup steps, step s is at progress (s - 5) / 95 of the half cosine:
        // 0.5 · (1 + cos(π · progress)), written out to 16 digits. At a quarter and three
        // quarters of the way, cosine (0.851, 0.149) and a linear decay (0.747, 0.253) are
        // ten times the tolerance apart.
        for (step, want) in [
            (29, 0.850_618_392_136_244_2),
            (52, 0.508_266_972_383_179_3),
            (76, 0.149_381_607_863_755_7),
            (99, 0.000_273_371_329_536_975_5),
        ] {
            assert!((lr(step) - want).abs() < 1e-12, "step {step}: {}", lr(step));
        }
        assert!((learning_rate(200, 100, 1.0, 0.05, 0.1) - 0.1).abs() < 1e-12);
        assert_eq!(learning_rate(0, 10, 2.0, 0.0, 0.0), 2.0);
    }
}
