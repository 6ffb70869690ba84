//! Reading documents from `.jsonl` (a text field per line), `.parquet` (a text column) and
//! `.txt` (a document per line), the text formats also zstd-compressed (`.jsonl.zst`,
//! `.txt.zst`), one at a time or in batches, with errors naming the file and line.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::DataFormat;
use crate::error::{Context, Error, Result};

/// The fields a reader takes from each record: the text, and the on-policy prompt where one is
/// configured (`on_policy.prompt_field`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    /// The JSON field or parquet column of the text.
    pub text: String,
    /// The JSON field or parquet column of the prompt.
    pub prompt: Option<String>,
}

impl From<&str> for Fields {
    fn from(text: &str) -> Self {
        Fields {
            text: text.to_string(),
            prompt: None,
        }
    }
}

impl From<&String> for Fields {
    fn from(text: &String) -> Self {
        Fields::from(text.as_str())
    }
}

/// One document as read, before its text is extracted (JSON is parsed by the workers).
pub struct RawDoc {
    /// 1-based line (or row) number, for error messages.
    pub line: usize,
    raw: String,
    /// A parquet row's prompt column (JSON keeps its prompt in `raw`).
    prompt: Option<String>,
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
    fields: Fields,
    lines: Option<Box<dyn BufRead + Send>>,
    rows: Option<parquet::record::reader::RowIter<'static>>,
    line: usize,
    done: u64,
    total: u64,
}

impl DocumentReader {
    /// Opens `path`; `fields` names the JSON field or parquet column holding the text (a
    /// `&str`), and the prompt's where one is read.
    pub fn open(path: &Path, format: DataFormat, fields: impl Into<Fields>) -> Result<Self> {
        let fields = fields.into();
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut reader = DocumentReader {
            path: path.to_path_buf(),
            format,
            fields: fields.clone(),
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
                let wanted = std::iter::once((&fields.text, "data.text_field"))
                    .chain(fields.prompt.iter().map(|p| (p, "on_policy.prompt_field")));
                for (field, key) in wanted {
                    if !columns.iter().any(|c| c == field) {
                        return Err(Error::Data(format!(
                            "{}: no column `{field}` (columns: {}); set {key}",
                            path.display(),
                            columns.join(", ")
                        )));
                    }
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
                self.next_line()?.map(|line| (line, None))
            } else if self.rows.is_some() {
                self.next_row()?
            } else {
                None
            };
            match raw {
                None => return Ok(None),
                Some((raw, None)) if raw.trim().is_empty() => continue,
                Some((raw, prompt)) => {
                    return Ok(Some(RawDoc {
                        line: self.line,
                        raw,
                        prompt,
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

    /// The next row's text and (with a prompt field) its prompt, `None` for a null prompt.
    fn next_row(&mut self) -> Result<Option<(String, Option<String>)>> {
        let Some(row) = self.rows.as_mut().and_then(|rows| rows.next()) else {
            return Ok(None);
        };
        self.line += 1;
        self.done += 1;
        let row = row
            .map_err(|e| Error::Data(format!("{}: row {}: {e}", self.path.display(), self.line)))?;
        let text = self.column(&row, &self.fields.text)?.unwrap_or_default();
        let prompt = match &self.fields.prompt {
            Some(field) => self.column(&row, field)?,
            None => None,
        };
        Ok(Some((text, prompt)))
    }

    /// A string column of a parquet row (`None` when null).
    fn column(&self, row: &parquet::record::Row, field: &str) -> Result<Option<String>> {
        let value = row
            .get_column_iter()
            .find(|(name, _)| *name == field)
            .map(|(_, value)| value.clone());
        match value {
            Some(parquet::record::Field::Str(s)) => Ok(Some(s)),
            Some(parquet::record::Field::Null) => Ok(None),
            Some(other) => Err(Error::Data(format!(
                "{}: row {}: column `{field}` is {other:?}, not a string",
                self.path.display(),
                self.line,
            ))),
            None => Err(Error::Data(format!(
                "{}: row {}: no column `{field}`",
                self.path.display(),
                self.line,
            ))),
        }
    }

    /// What turns a read document into its text (shareable with worker threads).
    pub fn extractor(&self) -> TextExtractor {
        TextExtractor {
            path: self.path.clone(),
            format: self.format,
            fields: self.fields.clone(),
        }
    }
}

/// Extracts the text (and the prompt) of documents read by a [`DocumentReader`].
#[derive(Debug, Clone)]
pub struct TextExtractor {
    path: PathBuf,
    format: DataFormat,
    fields: Fields,
}

impl TextExtractor {
    /// An extractor of no file, until one is opened.
    pub(crate) fn none() -> Self {
        TextExtractor {
            path: PathBuf::new(),
            format: DataFormat::Txt,
            fields: Fields::default(),
        }
    }

    /// `file:line` of a document, for messages.
    pub fn place(&self, doc: &RawDoc) -> String {
        format!("{}:{}", self.path.display(), doc.line)
    }

    /// The text of a document, with errors naming the file and line.
    pub fn text(&self, doc: &RawDoc) -> Result<String> {
        Ok(self.extract(doc)?.0)
    }

    /// The text of a document and, with a prompt field, its prompt (`None` where the record
    /// has none: it prompts nothing). With a prompt field, a record without text is one that
    /// only prompts (its text is empty); a record with neither is an error.
    pub fn extract(&self, doc: &RawDoc) -> Result<(String, Option<String>)> {
        let where_ = || self.place(doc);
        match self.format {
            DataFormat::Txt => Ok((doc.raw.trim_end_matches(['\n', '\r']).to_string(), None)),
            DataFormat::Parquet => Ok((doc.raw.clone(), doc.prompt.clone())),
            DataFormat::Jsonl => {
                let value: Value = serde_json::from_str(&doc.raw)
                    .with_context(|| format!("{}: invalid JSON", where_()))?;
                let string = |field: &str| match value.get(field) {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(Value::Null) if self.fields.prompt.is_some() => Ok(None),
                    Some(other) => Err(Error::Data(format!(
                        "{}: field `{field}` is {}, not a string",
                        where_(),
                        kind_of(other)
                    ))),
                    None => Ok(None),
                };
                let text = string(&self.fields.text)?;
                let prompt = match &self.fields.prompt {
                    Some(field) => string(field)?,
                    None => None,
                };
                match (text, &self.fields.prompt) {
                    (Some(text), _) => Ok((text, prompt)),
                    (None, Some(_)) if prompt.is_some() => Ok((String::new(), prompt)),
                    (None, Some(field)) => Err(Error::Data(format!(
                        "{}: no field `{}` nor `{field}`",
                        where_(),
                        self.fields.text
                    ))),
                    (None, None) => Err(Error::Data(format!(
                        "{}: no field `{}`",
                        where_(),
                        self.fields.text
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(prompt: Option<&str>) -> Fields {
        Fields {
            text: "text".into(),
            prompt: prompt.map(String::from),
        }
    }

    fn read_all(
        path: &Path,
        format: DataFormat,
        f: Fields,
    ) -> Result<Vec<(String, Option<String>)>> {
        let mut reader = DocumentReader::open(path, format, f)?;
        let extractor = reader.extractor();
        let mut out = Vec::new();
        while let Some(doc) = reader.next_doc()? {
            out.push(extractor.extract(&doc)?);
        }
        Ok(out)
    }

    /// With a prompt field, a JSON record may hold text, a prompt or both (null is none); one
    /// with neither, or a prompt that is not a string, is an error naming the line.
    #[test]
    fn json_records_give_text_and_prompt() {
        let dir = std::env::temp_dir().join(format!("xtoken-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.jsonl");
        let lines = [
            r#"{"text": "a b", "prompt": "a"}"#,
            r#"{"prompt": "only"}"#,
            r#"{"text": "only text", "prompt": null}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let docs = read_all(&path, DataFormat::Jsonl, fields(Some("prompt"))).unwrap();
        assert_eq!(
            docs,
            [
                ("a b".into(), Some("a".into())),
                (String::new(), Some("only".into())),
                ("only text".into(), None),
            ]
        );
        let texts = read_all(&path, DataFormat::Jsonl, fields(None));
        assert!(texts
            .unwrap_err()
            .to_string()
            .contains("p.jsonl:2: no field `text`"));
        std::fs::write(&path, "{\"other\": 1}\n{\"prompt\": 3}\n").unwrap();
        let err = read_all(&path, DataFormat::Jsonl, fields(Some("prompt"))).unwrap_err();
        assert!(
            err.to_string()
                .contains("p.jsonl:1: no field `text` nor `prompt`"),
            "{err}"
        );
        std::fs::write(&path, "{\"prompt\": 3}\n").unwrap();
        let err = read_all(&path, DataFormat::Jsonl, fields(Some("prompt"))).unwrap_err();
        assert!(
            err.to_string().contains("field `prompt` is a number"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A parquet file's prompt column is read beside its text (a null is no prompt, a row with
    /// neither is blank); a file without the column is refused naming the key.
    #[test]
    fn parquet_rows_give_text_and_prompt() {
        use parquet::data_type::{ByteArray, ByteArrayType};
        use parquet::file::writer::SerializedFileWriter;
        use std::sync::Arc;
        let dir = std::env::temp_dir().join(format!("xtoken-reader-pq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.parquet");
        let schema = parquet::schema::parser::parse_message_type(
            "message docs { optional binary text (UTF8); optional binary prompt (UTF8); }",
        )
        .unwrap();
        let file = File::create(&path).unwrap();
        let mut writer =
            SerializedFileWriter::new(file, Arc::new(schema), Default::default()).unwrap();
        let mut group = writer.next_row_group().unwrap();
        let columns = [
            vec![Some("first text"), Some("second"), None, None],
            vec![Some("q"), None, Some("only"), None],
        ];
        for values in columns {
            let present: Vec<ByteArray> = values.iter().flatten().map(|v| (*v).into()).collect();
            let levels: Vec<i16> = values.iter().map(|v| i16::from(v.is_some())).collect();
            let mut column = group.next_column().unwrap().unwrap();
            column
                .typed::<ByteArrayType>()
                .write_batch(&present, Some(&levels), None)
                .unwrap();
            column.close().unwrap();
        }
        group.close().unwrap();
        writer.close().unwrap();
        let docs = read_all(&path, DataFormat::Parquet, fields(Some("prompt"))).unwrap();
        // The row with neither is blank, passed over as a blank line is.
        let want = [
            ("first text".into(), Some("q".into())),
            ("second".into(), None),
            (String::new(), Some("only".into())),
        ];
        assert_eq!(docs, want);
        let err = read_all(&path, DataFormat::Parquet, fields(Some("question"))).unwrap_err();
        assert!(
            err.to_string().contains(
                "no column `question` (columns: text, prompt); set on_policy.prompt_field"
            ),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
