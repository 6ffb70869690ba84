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

#[cfg(test)]
mod tests {
    use super::learning_rate;

    #[test]
    fn warmup_then_cosine_to_zero() {
        let lr = |s| learning_rate(s, 100, 1.0, 0.05, 0.0);
        assert!((lr(0) - 0.2).abs() < 1e-12);
        assert!((lr(4) - 1.0).abs() < 1e-12);
        assert!((lr(5) - 1.0).abs() < 1e-12);
        assert!(lr(52) < 0.55 && lr(52) > 0.45);
        assert!(lr(99) < 1e-3 && lr(99) > 0.0);
        assert!((learning_rate(200, 100, 1.0, 0.05, 0.1) - 0.1).abs() < 1e-12);
        assert_eq!(learning_rate(0, 10, 2.0, 0.0, 0.0), 2.0);
    }
}
