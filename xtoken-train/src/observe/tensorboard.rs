//! TensorBoard event files: a run's metrics as scalars TensorBoard reads while the run goes
//! (`tensorboard --logdir <output_dir>/tensorboard`).
//!
//! No maintained Rust crate writes them, and the format is small: a file of records, each a
//! little-endian u64 length, its masked CRC-32C, the bytes, and their masked CRC-32C; each record
//! an `Event` protocol buffer (wall time, step, and a `Summary` of `(tag, simple_value)` pairs).
//! The first record names the version, `brain.Event:2`. A run resumed after step `s` starts its
//! file with a `SessionLog` START at step `s + 1`, which makes TensorBoard drop the older file's
//! steps from `s + 1` on (written after the checkpoint), as `metrics.csv` does.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Context, Result};

/// An event file being written.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Creates a new event file in `dir` for a run (re)started after `start_step` steps.
    pub fn create(dir: &Path, start_step: u64) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        let now = wall_time();
        let path = dir.join(format!(
            "events.out.tfevents.{}.xtoken.{}",
            now as u64,
            std::process::id()
        ));
        let file = File::create(&path).with_context(|| format!("{}", path.display()))?;
        let mut writer = EventWriter {
            path,
            file: BufWriter::new(file),
        };
        let mut version = event_head(now, 0);
        bytes_field(&mut version, 3, b"brain.Event:2");
        writer.record(&version)?;
        if start_step > 0 {
            let mut start = event_head(now, start_step + 1);
            // SessionLog { status: START (1) } as field 7 (6 is the deprecated LogMessage).
            bytes_field(&mut start, 7, &[0x08, 0x01]);
            writer.record(&start)?;
        }
        writer.flush()?;
        Ok(writer)
    }

    /// Appends one step's scalars and flushes them.
    pub fn scalars(&mut self, step: u64, values: &[(String, f64)]) -> Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in values {
            let mut entry = Vec::new();
            bytes_field(&mut entry, 1, tag.as_bytes());
            entry.push(0x15); // field 2, 32-bit: simple_value
            entry.extend_from_slice(&(*value as f32).to_le_bytes());
            bytes_field(&mut summary, 1, &entry);
        }
        let mut event = event_head(wall_time(), step);
        bytes_field(&mut event, 5, &summary);
        self.record(&event)?;
        self.flush()
    }

    fn record(&mut self, data: &[u8]) -> Result<()> {
        let length = (data.len() as u64).to_le_bytes();
        let mut out = Vec::with_capacity(data.len() + 16);
        out.extend_from_slice(&length);
        out.extend_from_slice(&masked_crc(&length).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.file
            .write_all(&out)
            .with_context(|| format!("{}: cannot write", self.path.display()))
    }

    fn flush(&mut self) -> Result<()> {
        self.file
            .flush()
            .with_context(|| format!("{}: cannot write", self.path.display()))
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An `Event` with its wall time (field 1, double) and step (field 2, varint).
fn event_head(wall_time: f64, step: u64) -> Vec<u8> {
    let mut event = vec![0x09];
    event.extend_from_slice(&wall_time.to_le_bytes());
    event.push(0x10);
    varint(&mut event, step);
    event
}

/// A length-delimited field.
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// CRC-32C (Castagnoli), bit by bit: records are small.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// The record format's masked CRC.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xA282_EAD8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the records of an event file back, checking both CRCs of each.
    fn records(path: &Path) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0;
        let mut out = Vec::new();
        while at < bytes.len() {
            let length = &bytes[at..at + 8];
            let n = u64::from_le_bytes(length.try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(length));
            let data = bytes[at + 12..at + 12 + n].to_vec();
            let crc = u32::from_le_bytes(bytes[at + 12 + n..at + 16 + n].try_into().unwrap());
            assert_eq!(crc, masked_crc(&data));
            out.push(data);
            at += 16 + n;
        }
        out
    }

    #[test]
    fn crc32c_matches_its_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn events_are_framed_and_encoded() {
        let dir = std::env::temp_dir().join(format!("xtoken-tb-{}", std::process::id()));
        let mut w = EventWriter::create(&dir, 3).unwrap();
        w.scalars(4, &[("train/loss".into(), 2.5), ("train/ce".into(), 1.25)])
            .unwrap();
        let path = w.path.clone();
        drop(w);
        let recs = records(&path);
        assert_eq!(recs.len(), 3);
        assert!(recs[0].ends_with(b"\x1a\x0dbrain.Event:2"));
        assert_eq!(recs[1][9..], [0x10, 4, 0x3a, 2, 0x08, 0x01]);
        // Step 4, then Summary { value { tag, simple_value } × 2 }.
        let r = &recs[2];
        assert_eq!(r[0], 0x09);
        assert_eq!(&r[9..11], &[0x10, 4]);
        assert_eq!(r[11], 0x2a);
        let mut value = vec![0x0a, 10];
        value.extend_from_slice(b"train/loss");
        value.push(0x15);
        value.extend_from_slice(&2.5f32.to_le_bytes());
        assert_eq!(&r[13..15], &[0x0a, value.len() as u8]);
        assert_eq!(&r[15..15 + value.len()], value.as_slice());
        std::fs::remove_dir_all(&dir).ok();
    }
}
