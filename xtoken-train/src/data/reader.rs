//! Reading documents from `.jsonl` (a text field per line), `.parquet` (a text column) and
//! `.txt` (a document per line), the text formats also zstd-compressed (`.jsonl.zst`,
//! `.txt.zst`), one at a time or in batches, with errors naming the file and line.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::DataFormat;
use crate::error::{Context, Error, Result};

/// One document as read, before its text is extracted (JSON is parsed by the workers).
pub struct RawDoc {
    /// 1-based line (or row) number, for error messages.
    pub line: usize,
    raw: String,
}

impl RawDoc {
    /// Its size as read, in bytes.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether it read as nothing (never, for a document a reader returns).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
}

/// Reads the documents of a `.jsonl`, `.txt` or `.parquet` file in batches.
pub struct DocumentReader {
    path: PathBuf,
    format: DataFormat,
    field: String,
    lines: Option<Box<dyn BufRead + Send>>,
    rows: Option<parquet::record::reader::RowIter<'static>>,
    line: usize,
    done: u64,
    total: u64,
}

impl DocumentReader {
    /// Opens `path`; `field` is the JSON field or parquet column holding the text.
    pub fn open(path: &Path, format: DataFormat, field: &str) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut reader = DocumentReader {
            path: path.to_path_buf(),
            format,
            field: field.to_string(),
            lines: None,
            rows: None,
            line: 0,
            done: 0,
            total: 0,
        };
        match format {
            DataFormat::Jsonl | DataFormat::Txt => {
                reader.total = file.metadata().map(|m| m.len()).unwrap_or(0);
                reader.lines = Some(if DataFormat::compressed(path) {
                    // Progress then counts decompressed bytes against the compressed size.
                    let decoder = zstd::stream::read::Decoder::new(file).with_context(|| {
                        format!("{}: not a readable zstd stream", path.display())
                    })?;
                    Box::new(BufReader::with_capacity(1 << 20, decoder))
                } else {
                    Box::new(BufReader::with_capacity(1 << 20, file))
                });
            }
            DataFormat::Parquet => {
                use parquet::file::reader::{FileReader, SerializedFileReader};
                let parquet = SerializedFileReader::new(file).map_err(|e| {
                    Error::Data(format!(
                        "{}: not a readable parquet file: {e}",
                        path.display()
                    ))
                })?;
                let metadata = parquet.metadata().file_metadata();
                let columns: Vec<String> = metadata
                    .schema_descr()
                    .root_schema()
                    .get_fields()
                    .iter()
                    .map(|f| f.name().to_string())
                    .collect();
                if !columns.iter().any(|c| c == field) {
                    return Err(Error::Data(format!(
                        "{}: no column `{field}` (columns: {}); set data.text_field",
                        path.display(),
                        columns.join(", ")
                    )));
                }
                reader.total = metadata.num_rows().max(0) as u64;
                let rows = parquet::record::reader::RowIter::from_file_into(Box::new(parquet));
                reader.rows = Some(rows);
            }
        }
        Ok(reader)
    }

    /// The size the progress is measured against: bytes for text files, rows for parquet.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Progress so far, in the unit of [`total`](Self::total).
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Whether progress counts bytes (text files) or rows (parquet).
    pub fn counts_bytes(&self) -> bool {
        self.format != DataFormat::Parquet
    }

    /// The next documents, about `max_bytes` of them; empty only at the end of the file. Blank
    /// lines are skipped.
    pub fn next_batch(&mut self, max_bytes: usize) -> Result<Vec<RawDoc>> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while bytes < max_bytes || batch.is_empty() {
            let Some(doc) = self.next_doc()? else { break };
            bytes += doc.raw.len();
            batch.push(doc);
        }
        Ok(batch)
    }

    /// Reads past the next `n` documents (blank lines not counted); false when the file ended
    /// first.
    pub fn skip(&mut self, n: u64) -> Result<bool> {
        for _ in 0..n {
            if self.next_doc()?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The next document that is not blank, or `None` at the end of the file.
    pub fn next_doc(&mut self) -> Result<Option<RawDoc>> {
        loop {
            let raw = if self.lines.is_some() {
                self.next_line()?
            } else if self.rows.is_some() {
                self.next_row()?
            } else {
                None
            };
            match raw {
                None => return Ok(None),
                Some(raw) if raw.trim().is_empty() => continue,
                Some(raw) => {
                    return Ok(Some(RawDoc {
                        line: self.line,
                        raw,
                    }))
                }
            }
        }
    }

    fn next_line(&mut self) -> Result<Option<String>> {
        let Some(lines) = self.lines.as_mut() else {
            return Ok(None);
        };
        let mut line = String::new();
        let n = lines
            .read_line(&mut line)
            .with_context(|| format!("{}:{}: cannot read", self.path.display(), self.line + 1))?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        self.done += n as u64;
        Ok(Some(line))
    }

    fn next_row(&mut self) -> Result<Option<String>> {
        let Some(row) = self.rows.as_mut().and_then(|rows| rows.next()) else {
            return Ok(None);
        };
        self.line += 1;
        self.done += 1;
        let row = row
            .map_err(|e| Error::Data(format!("{}: row {}: {e}", self.path.display(), self.line)))?;
        let text = row
            .get_column_iter()
            .find(|(name, _)| *name == &self.field)
            .map(|(_, value)| value.clone());
        match text {
            Some(parquet::record::Field::Str(s)) => Ok(Some(s)),
            Some(parquet::record::Field::Null) => Ok(Some(String::new())),
            Some(other) => Err(Error::Data(format!(
                "{}: row {}: column `{}` is {other:?}, not a string",
                self.path.display(),
                self.line,
                self.field
            ))),
            None => Err(Error::Data(format!(
                "{}: row {}: no column `{}`",
                self.path.display(),
                self.line,
                self.field
            ))),
        }
    }

    /// What turns a read document into its text (shareable with worker threads).
    pub fn extractor(&self) -> TextExtractor {
        TextExtractor {
            path: self.path.clone(),
            format: self.format,
            field: self.field.clone(),
        }
    }
}

/// Extracts the text of documents read by a [`DocumentReader`].
#[derive(Debug, Clone)]
pub struct TextExtractor {
    path: PathBuf,
    format: DataFormat,
    field: String,
}

impl TextExtractor {
    /// An extractor of no file, until one is opened.
    pub(crate) fn none() -> Self {
        TextExtractor {
            path: PathBuf::new(),
            format: DataFormat::Txt,
            field: String::new(),
        }
    }

    /// `file:line` of a document, for messages.
    pub fn place(&self, doc: &RawDoc) -> String {
        format!("{}:{}", self.path.display(), doc.line)
    }

    /// The text of a document, with errors naming the file and line.
    pub fn text(&self, doc: &RawDoc) -> Result<String> {
        let where_ = || self.place(doc);
        match self.format {
            DataFormat::Txt => Ok(doc.raw.trim_end_matches(['\n', '\r']).to_string()),
            DataFormat::Parquet => Ok(doc.raw.clone()),
            DataFormat::Jsonl => {
                let value: Value = serde_json::from_str(&doc.raw)
                    .with_context(|| format!("{}: invalid JSON", where_()))?;
                match value.get(&self.field) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(other) => Err(Error::Data(format!(
                        "{}: field `{}` is {}, not a string",
                        where_(),
                        self.field,
                        kind_of(other)
                    ))),
                    None => Err(Error::Data(format!(
                        "{}: no field `{}`",
                        where_(),
                        self.field
                    ))),
                }
            }
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
