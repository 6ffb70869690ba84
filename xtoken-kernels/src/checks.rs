//! The input checks the host and the cube paths share, so that both refuse the same inputs with
//! the same errors.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorPrimitive};

use crate::error::KernelError;
use crate::TeacherEntries;

/// Refuses a temperature that is not a positive finite number.
pub(crate) fn check_tau(tau: f32) -> Result<(), KernelError> {
    if tau.is_finite() && tau > 0.0 {
        Ok(())
    } else {
        Err(KernelError::Invalid {
            what: "temperature",
            why: format!("τ = {tau}; it must be a positive finite number"),
        })
    }
}

/// The `(row, target)` pairs of a per-row target array (`-1`: no target), checked against
/// `rows × vocab` logits.
pub(crate) fn checked_targets(
    targets: &[i32],
    n: usize,
    v: usize,
    what: &'static str,
) -> Result<Vec<(u32, u32)>, KernelError> {
    if targets.len() != n {
        return Err(KernelError::Shape {
            what,
            expected: format!("{n} entries"),
            found: format!("{}", targets.len()),
        });
    }
    let rows: Vec<(u32, u32)> = targets
        .iter()
        .enumerate()
        .filter(|(_, &y)| y >= 0)
        .map(|(r, &y)| (r as u32, y as u32))
        .collect();
    match rows.iter().find(|(_, y)| *y as usize >= v) {
        Some(&(_, y)) => Err(KernelError::IndexOutOfRange {
            what,
            field: "token",
            index: y as i64,
            size: v,
        }),
        None => Ok(rows),
    }
}

pub(crate) fn float_dims<B: Backend>(t: &FloatTensor<B>) -> [usize; 2] {
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t.clone())).dims()
}

pub(crate) fn int_dims<B: Backend>(t: &IntTensor<B>) -> [usize; 2] {
    Tensor::<B, 2, Int>::from_primitive(t.clone()).dims()
}

/// Checks the `[slots, k]` shapes of the teacher's ids and log-probabilities.
pub(crate) fn check_teacher<B: Backend>(
    teacher: &TeacherEntries<B>,
    slots: usize,
) -> Result<(), KernelError> {
    let expected = [slots, teacher.k];
    for (what, found) in [
        ("teacher ids", int_dims::<B>(&teacher.ids)),
        ("teacher log-probabilities", float_dims::<B>(&teacher.logp)),
    ] {
        if found != expected {
            return Err(KernelError::Shape {
                what,
                expected: format!("{expected:?}"),
                found: format!("{found:?}"),
            });
        }
    }
    Ok(())
}

/// Checks that W's indices and weights are both `[V_S, K_w]`; returns `K_w`.
pub(crate) fn projection_width(
    indices: &[usize],
    weights: &[usize],
    student_vocab: usize,
) -> Result<usize, KernelError> {
    match indices {
        &[rows, kw] if rows == student_vocab && weights == indices => Ok(kw),
        _ => Err(KernelError::Shape {
            what: "projection",
            expected: format!("indices and weights [{student_vocab}, K]"),
            found: format!("indices {indices:?}, weights {weights:?}"),
        }),
    }
}

/// Refuses ids whose smallest is below `min` or whose largest reaches `limit`, reporting the
/// offending one.
pub(crate) fn check_id_range(
    (low, high): (i64, i64),
    min: i64,
    limit: usize,
    what: &'static str,
    field: &'static str,
) -> Result<(), KernelError> {
    if low < min || high >= limit as i64 {
        return Err(KernelError::IndexOutOfRange {
            what,
            field,
            index: if low < min { low } else { high },
            size: limit,
        });
    }
    Ok(())
}

/// Refuses a projection W without a single entry: P-KL would have nothing to project into.
pub(crate) fn check_projection_entries(indices: &[i64]) -> Result<(), KernelError> {
    if indices.iter().all(|&t| t < 0) {
        return Err(KernelError::Invalid {
            what: "projection indices",
            why: "W has no entry (every slot is -1): P-KL projects nothing into the teacher vocabulary"
                .into(),
        });
    }
    Ok(())
}

/// `(min, max)` of host ids (`(0, -1)` when there are none, which passes every range check).
pub(crate) fn id_range(ids: &[i64]) -> (i64, i64) {
    ids.iter().fold((0, -1), |(lo, hi), &x| {
        if hi < lo {
            (x, x)
        } else {
            (lo.min(x), hi.max(x))
        }
    })
}

/// The error of a loss that came out non-finite although every row it read was finite.
pub(crate) fn finite_loss(value: f64, loss: &'static str) -> Result<f64, KernelError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(KernelError::NonFiniteLoss {
            objective: loss,
            value,
        })
    }
}
