//! A served teacher's answer to one prompt, in the two shapes it travels in: vLLM's
//! `prompt_logprobs` (JSON, what any OpenAI-compatible vLLM server returns) and xtoken's compact
//! binary layout (negotiated between two xtoken ends with `Accept: application/vnd.xtoken.targets`).
//!
//! Either way the answer to a prompt of `n` tokens holds, per position `p < n − 1`, the
//! distribution that predicts token `p + 1`: its top-K ids and log-probabilities (τ = 1, best
//! first), the log-probability and rank of the prompt's own token `p + 1`, and the confidence
//! terms of adaptive weighting — exactly what a store keeps per position
//! ([`PositionTargets`]), so an answer merges as stored entries do.
//!
//! vLLM's list has one entry per prompt token: entry 0 is `null` (nothing predicts the first
//! token), entry `p + 1` is an object keyed by token ids as decimal strings, each value
//! `{"logprob", "rank", "decoded_token"}`, holding the top-K and the prompt token's own entry
//! with its true rank (K + 1 entries, or K when the prompt token is among the top-K). Its
//! log-probabilities cover the whole vocabulary, but the entropy of adaptive weighting can only
//! be summed over the entries it lists; the binary layout carries the exact one.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Deserialize;
use xtoken_kernels::host::PositionTargets;

/// The media type of the binary answer.
pub const BINARY: &str = "application/vnd.xtoken.targets";

const MAGIC: &[u8; 4] = b"XTKA";
const VERSION: u32 = 1;

/// Bytes per position of the binary answer with `k` entries: ids and values, the observed
/// token's log-probability and rank, and the three confidence terms.
pub fn binary_bytes_per_position(k: usize) -> usize {
    8 * k + 4 + 4 + 4 + 8 + 4
}

/// The binary answer: `XTKA`, version, the served model's name, positions, K, then each field
/// of [`PositionTargets`] as a little-endian array, and the xxh3-64 of everything before it.
pub fn encode_binary(model: &str, t: &PositionTargets) -> Vec<u8> {
    let n = t.observed.len();
    let mut out = Vec::with_capacity(24 + model.len() + n * binary_bytes_per_position(t.k));
    out.extend_from_slice(MAGIC);
    for v in [VERSION, model.len() as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(model.as_bytes());
    for v in [n as u32, t.k as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    t.ids
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    t.logp
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    t.observed
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    let ranks = t.observed_rank.iter();
    ranks.for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    t.neg_ce
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    t.neg_entropy
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    t.max_prob
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    let sum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Reads little-endian fields off the front of a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("{} bytes short", n - self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or([0; 4]),
        ))
    }

    fn array<T, const N: usize>(
        &mut self,
        n: usize,
        from: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, String> {
        let bytes = self.take(n.checked_mul(N).ok_or("a length past memory")?)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| from(c.try_into().unwrap_or([0; N])))
            .collect())
    }
}

/// Decodes a binary answer: its model's name and targets. An answer cut short, damaged or of
/// another version is an error saying which.
pub fn decode_binary(bytes: &[u8]) -> Result<(String, PositionTargets), String> {
    let Some((body, sum)) = bytes.split_last_chunk::<8>() else {
        return Err(format!("{} bytes, too short for an answer", bytes.len()));
    };
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(*sum) {
        return Err("its checksum does not match its content (damaged in transit)".into());
    }
    let mut c = Cursor(body);
    if c.take(4)? != MAGIC {
        return Err("not an xtoken answer (no XTKA at its start)".into());
    }
    let version = c.u32()?;
    if version != VERSION {
        return Err(format!(
            "answer version {version}, this build reads {VERSION}"
        ));
    }
    let len = c.u32()? as usize;
    let model = String::from_utf8_lossy(c.take(len)?).into_owned();
    let (n, k) = (c.u32()? as usize, c.u32()? as usize);
    let nk = n.checked_mul(k).ok_or("a length past memory")?;
    let t = PositionTargets {
        k,
        ids: c.array(nk, u32::from_le_bytes)?,
        logp: c.array(nk, f32::from_le_bytes)?,
        observed: c.array(n, f32::from_le_bytes)?,
        observed_rank: c.array(n, u32::from_le_bytes)?,
        neg_ce: c.array(n, f32::from_le_bytes)?,
        neg_entropy: c.array(n, f64::from_le_bytes)?,
        max_prob: c.array(n, f32::from_le_bytes)?,
    };
    if !c.0.is_empty() {
        return Err(format!("{} bytes past its end", c.0.len()));
    }
    Ok((model, t))
}

/// Writes vLLM's `prompt_logprobs` list for `prompt` and its targets (`t` over positions
/// `0..prompt.len() − 1`): `decoded[id]` is the token's text, already a JSON string literal.
/// Values are written as the f64 of the f32 they are, as vLLM (Python) writes them, so they read
/// back exactly.
pub fn write_prompt_logprobs(
    out: &mut String,
    prompt: &[u32],
    t: &PositionTargets,
    decoded: &[String],
) {
    let text = |id: u32| decoded.get(id as usize).map_or("\"\"", String::as_str);
    out.push_str("[null");
    for p in 0..prompt.len().saturating_sub(1) {
        let ids = &t.ids[p * t.k..(p + 1) * t.k];
        let logp = &t.logp[p * t.k..(p + 1) * t.k];
        out.push_str(",{");
        let mut entry = |first: bool, id: u32, logprob: f32, rank: u32| {
            let comma = if first { "" } else { "," };
            let _ = write!(
                out,
                "{comma}\"{id}\":{{\"logprob\":{},\"rank\":{rank},\"decoded_token\":{}}}",
                logprob as f64,
                text(id)
            );
        };
        for (j, (&id, &v)) in ids.iter().zip(logp).enumerate() {
            entry(j == 0, id, v, j as u32 + 1);
        }
        let own = prompt[p + 1];
        if !ids.contains(&own) {
            entry(ids.is_empty(), own, t.observed[p], t.observed_rank[p]);
        }
        out.push('}');
    }
    out.push(']');
}

/// One entry of vLLM's `prompt_logprobs`.
#[derive(Debug, Deserialize)]
pub struct LogprobEntry {
    /// `log p` at τ = 1.
    pub logprob: f64,
    /// 1-based rank among the vocabulary.
    pub rank: Option<u64>,
    /// The token's text.
    pub decoded_token: Option<String>,
}

/// vLLM's `prompt_logprobs`: per prompt token, its entries by token id (`None` for the first).
pub type PromptLogprobs = Vec<Option<HashMap<String, LogprobEntry>>>;

/// The targets of `prompt` from vLLM's `prompt_logprobs`: the first `k` entries by rank per
/// position, the prompt token's own log-probability and rank. Ids must lie below `width`. The
/// confidence terms are taken from the listed entries (τ = 1): `log p[y]`, `max p`, and the
/// entropy summed over the top-K only.
pub fn from_prompt_logprobs(
    prompt: &[u32],
    list: &PromptLogprobs,
    k: usize,
    width: usize,
) -> Result<PositionTargets, String> {
    if list.len() != prompt.len() {
        return Err(format!(
            "{} prompt_logprobs entries for a prompt of {} tokens",
            list.len(),
            prompt.len()
        ));
    }
    let n = prompt.len().saturating_sub(1);
    let mut t = PositionTargets {
        k,
        ids: Vec::with_capacity(n * k),
        logp: Vec::with_capacity(n * k),
        ..Default::default()
    };
    let mut sorted: Vec<(u64, f32, u32)> = Vec::new();
    for p in 0..n {
        let at = p + 1;
        let entries = list[at]
            .as_ref()
            .ok_or_else(|| format!("prompt_logprobs[{at}] is null"))?;
        sorted.clear();
        for (key, e) in entries {
            let id: u32 = key
                .parse()
                .map_err(|_| format!("prompt_logprobs[{at}]: key {key:?} is not a token id"))?;
            if id as usize >= width {
                return Err(format!(
                    "prompt_logprobs[{at}]: token id {id}, past the teacher tokenizer's {width} \
                     ids (another tokenizer?)"
                ));
            }
            sorted.push((e.rank.unwrap_or(u64::MAX), e.logprob as f32, id));
        }
        sorted.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
        let own = prompt[at];
        let observed = sorted.iter().find(|e| e.2 == own).ok_or_else(|| {
            format!("prompt_logprobs[{at}] lacks the prompt token {own}'s own entry")
        })?;
        let top = &sorted[..k.min(sorted.len())];
        if top.len() < k || top.iter().any(|e| e.0 > k as u64) {
            let kept = sorted.iter().filter(|e| e.0 <= k as u64).count();
            return Err(format!(
                "prompt_logprobs[{at}] holds the top-{kept}, the run reads the top-{k} (the \
                 server's --max-logprobs?)"
            ));
        }
        t.ids.extend(top.iter().map(|e| e.2));
        t.logp.extend(top.iter().map(|e| e.1));
        t.observed.push(observed.1);
        t.observed_rank.push(observed.0.min(u32::MAX as u64) as u32);
        t.neg_ce.push(observed.1);
        t.max_prob.push(top.first().map_or(0.0, |e| e.1.exp()));
        let plogp = top.iter().map(|e| (e.1 as f64).exp() * e.1 as f64).sum();
        t.neg_entropy.push(plogp);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> PositionTargets {
        PositionTargets {
            k: 2,
            ids: vec![5, 3, 7, 1],
            logp: vec![-0.25, -1.5, -0.1, -3.0],
            observed: vec![-1.5, -4.0],
            observed_rank: vec![2, 9],
            neg_ce: vec![-1.5, -4.0],
            neg_entropy: vec![-0.7, -0.3],
            max_prob: vec![0.77, 0.9],
        }
    }

    /// The binary answer reads back whole; any flipped byte or cut is named.
    #[test]
    fn binary_answers_round_trip_and_name_damage() {
        let bytes = encode_binary("tiny", &targets());
        assert_eq!(decode_binary(&bytes).unwrap(), ("tiny".into(), targets()));
        for at in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            let err = decode_binary(&bad).unwrap_err();
            assert!(err.contains("checksum"), "{err}");
        }
        assert!(decode_binary(&bytes[..6]).is_err());
    }

    /// vLLM's shape: entry 0 null, ids as decimal keys, the prompt token's own entry with its
    /// rank when outside the top-K; read back, the values are the f32 written.
    #[test]
    fn prompt_logprobs_have_vllms_shape_and_read_back() {
        let decoded: Vec<String> = (0..10).map(|i| format!("\"t{i}\"")).collect();
        let prompt = [2, 3, 4];
        let mut text = String::new();
        write_prompt_logprobs(&mut text, &prompt, &targets(), &decoded);
        let list: PromptLogprobs = serde_json::from_str(&text).unwrap();
        assert!(list[0].is_none());
        let first = list[1].as_ref().unwrap();
        assert_eq!(first.len(), 2, "the prompt token 3 is in the top-2");
        assert_eq!(first["3"].rank, Some(2));
        let second = list[2].as_ref().unwrap();
        assert_eq!(second.len(), 3);
        assert_eq!(second["4"].rank, Some(9));
        assert_eq!(second["4"].decoded_token.as_deref(), Some("t4"));
        let back = from_prompt_logprobs(&prompt, &list, 2, 10).unwrap();
        let want = targets();
        assert_eq!(back.ids, want.ids);
        assert_eq!(back.logp, want.logp);
        assert_eq!(back.observed, want.observed);
        assert_eq!(back.observed_rank, want.observed_rank);
        assert!(from_prompt_logprobs(&prompt, &list, 3, 10).is_err());
        assert!(from_prompt_logprobs(&prompt, &list, 2, 6).is_err());
    }
}
