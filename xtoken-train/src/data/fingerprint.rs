//! What the training data was when a checkpoint was written: each shard's path, size,
//! modification time and the xxh3 of its first and last MiB. A resumed run compares them with
//! the shards it finds, so that data rewritten, truncated, added or removed under a checkpoint
//! is named instead of silently changing what the run trains on.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::sources::Source;
use crate::error::{Context, Result};

/// Bytes read at each end of a shard for its fingerprint.
const END_BYTES: u64 = 1 << 20;

/// One shard as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPrint {
    /// The shard's path, as the configuration's entries expand to it.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its modification time, in nanoseconds since the Unix epoch (0 where unknown).
    pub modified_ns: u64,
    /// xxh3-64 of its first and last MiB, in hex.
    pub ends_xxh3: String,
    /// xxh3-64 of all its bytes, in hex, where recorded (a store's manifest): a shard whose
    /// time or path changed is then the same data when its content is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_xxh3: Option<String>,
}

/// The fingerprints of every shard of `sources`, in order.
pub fn of_sources(sources: &[Source]) -> Result<Vec<ShardPrint>> {
    sources
        .iter()
        .flat_map(|s| &s.shards)
        .map(|shard| of_file(&shard.path))
        .collect()
}

/// The fingerprint of one file.
pub fn of_file(path: &Path) -> Result<ShardPrint> {
    let at = || format!("{}: fingerprinting the shard", path.display());
    let mut file = std::fs::File::open(path).with_context(at)?;
    let meta = file.metadata().with_context(at)?;
    let bytes = meta.len();
    let modified_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buffer = Vec::new();
    file.by_ref()
        .take(END_BYTES)
        .read_to_end(&mut buffer)
        .with_context(at)?;
    hasher.update(&buffer);
    if bytes > END_BYTES {
        buffer.clear();
        file.seek(SeekFrom::Start(
            bytes.saturating_sub(END_BYTES).max(END_BYTES),
        ))
        .with_context(at)?;
        file.read_to_end(&mut buffer).with_context(at)?;
        hasher.update(&buffer);
    }
    Ok(ShardPrint {
        path: path.display().to_string(),
        bytes,
        modified_ns,
        ends_xxh3: format!("{:016x}", hasher.digest()),
        content_xxh3: None,
    })
}

/// The fingerprint of one file with the hash of all its bytes (read once, streamed).
pub fn of_file_with_content(path: &Path) -> Result<ShardPrint> {
    Ok(ShardPrint {
        content_xxh3: Some(content_xxh3(path)?),
        ..of_file(path)?
    })
}

/// xxh3-64 of all the bytes of `path`, in hex.
fn content_xxh3(path: &Path) -> Result<String> {
    let at = || format!("{}: hashing the shard", path.display());
    let mut file = std::fs::File::open(path).with_context(at)?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buffer = vec![0u8; 8 << 20];
    loop {
        let n = file.read(&mut buffer).with_context(at)?;
        if n == 0 {
            return Ok(format!("{:016x}", hasher.digest()));
        }
        hasher.update(&buffer[..n]);
    }
}

/// What differs between the shards a store was written from (`recorded`, with their content
/// hashes) and the run's shards `now`, taken in order: a shard is the same when its size, ends
/// and time are, or, where only its time or path changed (touched, copied, moved), when all its
/// bytes hash as they did. One line per changed, added or missing shard.
pub fn content_changes(recorded: &[ShardPrint], now: &[ShardPrint]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (was, is) in recorded.iter().zip(now) {
        let ends = is.bytes == was.bytes && is.ends_xxh3 == was.ends_xxh3;
        if ends && is.modified_ns == was.modified_ns && is.path == was.path {
            continue;
        }
        if let (true, Some(content)) = (ends, &was.content_xxh3) {
            // A fingerprint made with its content (teach's own) is not hashed a second time.
            let now = match &is.content_xxh3 {
                Some(known) => known.clone(),
                None => content_xxh3(Path::new(&is.path))?,
            };
            if &now == content {
                continue;
            }
        }
        let mut what = Vec::new();
        if is.path != was.path {
            what.push(format!("in place of {}", was.path));
        }
        if is.bytes != was.bytes {
            what.push(format!("{} bytes where {} were", is.bytes, was.bytes));
        } else {
            what.push("other bytes".to_string());
        }
        out.push(format!("{} changed ({})", is.path, what.join(", ")));
    }
    for was in recorded.iter().skip(now.len()) {
        out.push(format!("{} is missing", was.path));
    }
    for is in now.iter().skip(recorded.len()) {
        out.push(format!("{} was added", is.path));
    }
    Ok(out)
}

/// What differs between the shards a checkpoint recorded and those found now, one line per
/// shard: rewritten (with what changed), added or missing.
pub fn changes(recorded: &[ShardPrint], now: &[ShardPrint]) -> Vec<String> {
    let mut out = Vec::new();
    for was in recorded {
        match now.iter().find(|s| s.path == was.path) {
            None => out.push(format!("{} is missing", was.path)),
            Some(is) if is != was => {
                let mut what = Vec::new();
                if is.bytes != was.bytes {
                    what.push(format!("{} bytes where {} were", is.bytes, was.bytes));
                }
                if is.ends_xxh3 != was.ends_xxh3 {
                    what.push("its first or last MiB differs".to_string());
                }
                if is.modified_ns != was.modified_ns {
                    what.push("modified since".to_string());
                }
                out.push(format!("{} changed ({})", was.path, what.join(", ")));
            }
            Some(_) => {}
        }
    }
    for is in now {
        if !recorded.iter().any(|s| s.path == is.path) {
            out.push(format!("{} was added", is.path));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewritten_truncated_added_and_missing_shards_are_named() {
        let dir = std::env::temp_dir().join(format!("xtoken-prints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = (dir.join("a.txt"), dir.join("b.txt"), dir.join("c.txt"));
        std::fs::write(&a, "one\ntwo\n").unwrap();
        std::fs::write(&b, vec![b'x'; 3 << 20]).unwrap();
        let before = vec![of_file(&a).unwrap(), of_file(&b).unwrap()];
        assert!(changes(&before, &before).is_empty());

        // The same size, one byte changed in the last MiB.
        let mut bytes = std::fs::read(&b).unwrap();
        bytes[(3 << 20) - 10] = b'y';
        std::fs::write(&b, bytes).unwrap();
        std::fs::write(&c, "new\n").unwrap();
        let after = vec![of_file(&b).unwrap(), of_file(&c).unwrap()];
        let lines = changes(&before, &after);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].ends_with("a.txt is missing"), "{lines:?}");
        assert!(
            lines[1].contains("b.txt changed") && lines[1].contains("last MiB"),
            "{lines:?}"
        );
        assert!(lines[2].ends_with("c.txt was added"), "{lines:?}");

        std::fs::write(&a, "one\n").unwrap();
        let line = &changes(&before[..1], &[of_file(&a).unwrap()])[0];
        assert!(line.contains("4 bytes where 8 were"), "{line}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
