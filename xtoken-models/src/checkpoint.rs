//! Hugging Face safetensors checkpoints, read and written without burn-store: one mmap per
//! file, one tensor converted at a time, and errors that name the file and the tensor.
//!
//! Reading accepts `model.safetensors` or a sharded `model.safetensors.index.json`, in F32, BF16,
//! F16 or F64. Writing streams one tensor at a time into a temporary file renamed into place.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::tensor::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorInfo, View};
use safetensors::SafeTensors;
use serde_json::Value;

use xtoken_kernels::temporary::Temporary;

use crate::error::{io_error, ModelError, Result};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

struct Shard {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

/// The safetensors files of one model directory, opened lazily: nothing is read until a tensor
/// is asked for.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    shard_of: HashMap<String, usize>,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let files = if index.exists() {
            shard_files(&index)?
        } else if single.exists() {
            vec![single]
        } else {
            return Err(ModelError::NoWeights {
                dir: dir.to_path_buf(),
            });
        };
        let mut shards = Vec::with_capacity(files.len());
        let mut shard_of = HashMap::new();
        for path in files {
            let shard = Shard::open(path)?;
            for name in shard.tensors.keys() {
                shard_of.insert(name.clone(), shards.len());
            }
            shards.push(shard);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            shard_of,
        })
    }

    /// The names of every tensor of the checkpoint, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.shard_of.keys().map(String::as_str)
    }

    /// The values of `name` as f32 in the file's row-major order, after checking that its shape
    /// is `shape`.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let shard = self
            .shard_of
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| ModelError::MissingTensor {
                dir: self.dir.clone(),
                name: name.into(),
            })?;
        let info = &shard.tensors[name];
        if info.shape != shape {
            return Err(ModelError::TensorShape {
                path: shard.path.clone(),
                name: name.into(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        let (start, end) = info.data_offsets;
        let bytes = &shard.map[shard.data_start + start..shard.data_start + end];
        decode_f32(bytes, info.dtype).ok_or_else(|| ModelError::TensorDtype {
            path: shard.path.clone(),
            name: name.into(),
            dtype: format!("{:?}", info.dtype),
        })
    }
}

impl Shard {
    fn open(path: PathBuf) -> Result<Self> {
        let file = File::open(&path).map_err(io_error(&path))?;
        // SAFETY: the map is read-only; a checkpoint changed underneath a running load is the
        // user's race, exactly as with every mmap-based safetensors reader.
        let map = unsafe { Mmap::map(&file) }.map_err(io_error(&path))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                why: match e {
                    safetensors::SafeTensorError::MetadataIncompleteBuffer
                    | safetensors::SafeTensorError::InvalidHeaderLength
                    | safetensors::SafeTensorError::HeaderTooSmall => {
                        format!("truncated ({} bytes; {e:?})", map.len())
                    }
                    other => format!("{other:?}"),
                },
            })?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        Ok(Shard {
            path,
            map,
            data_start: 8 + header_len,
            tensors,
        })
    }
}

fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(io_error(index))?;
    let json: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: index.to_path_buf(),
        source,
    })?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ModelError::Field {
            path: index.to_path_buf(),
            field: "weight_map".into(),
            why: "missing or not an object".into(),
        })?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| ModelError::Field {
            path: index.to_path_buf(),
            field: format!("weight_map.{name}"),
            why: "must be a file name".into(),
        })?;
        let path = dir.join(file);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The f32 values of little-endian `bytes` of `dtype`, converted on all cores.
fn decode_f32(bytes: &[u8], dtype: Dtype) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let width = match dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        Dtype::F64 => 8,
        _ => return None,
    };
    let decode = |b: &[u8]| -> f32 {
        match dtype {
            Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Dtype::BF16 => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            Dtype::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            _ => f64::from_le_bytes(b.try_into().expect("chunk of 8")) as f32,
        }
    };
    const CHUNK: usize = 1 << 16;
    let mut values = vec![0.0f32; bytes.len() / width];
    values
        .par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * width))
        .for_each(|(out, input)| {
            for (value, b) in out.iter_mut().zip(input.chunks_exact(width)) {
                *value = decode(b);
            }
        });
    Some(values)
}

/// The element type a model is saved in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    F32,
    BF16,
    F16,
}

impl SaveDtype {
    /// The `torch_dtype` string HF writes for it.
    pub fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::BF16 => "bfloat16",
            SaveDtype::F16 => "float16",
        }
    }

    pub fn from_torch_name(name: &str) -> Option<Self> {
        match name {
            "float32" => Some(SaveDtype::F32),
            "bfloat16" => Some(SaveDtype::BF16),
            "float16" => Some(SaveDtype::F16),
            _ => None,
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            SaveDtype::F32 => Dtype::F32,
            SaveDtype::BF16 => Dtype::BF16,
            SaveDtype::F16 => Dtype::F16,
        }
    }

    /// The values' little-endian bytes in this dtype, converted in parallel blocks (a 4B
    /// model's save was mostly this conversion, pushed byte by byte).
    fn encode(self, values: &[f32]) -> Vec<u8> {
        use rayon::prelude::*;
        const BLOCK: usize = 1 << 16;
        let width = self.safetensors().bitsize() / 8;
        let mut out = vec![0u8; values.len() * width];
        out.par_chunks_mut(BLOCK * width)
            .zip(values.par_chunks(BLOCK))
            .for_each(|(bytes, block)| {
                for (to, &v) in bytes.chunks_exact_mut(width).zip(block) {
                    match self {
                        SaveDtype::F32 => to.copy_from_slice(&v.to_le_bytes()),
                        SaveDtype::BF16 => to.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
                        SaveDtype::F16 => to.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
                    }
                }
            });
        out
    }
}

/// One tensor to be written: its HF name and shape, and how to produce its f32 values in that
/// shape's row-major order when the writer reaches it.
pub struct PendingTensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Box<dyn Fn() -> Vec<f32> + 'a>,
}

struct Encoded<'a> {
    tensor: PendingTensor<'a>,
    dtype: SaveDtype,
}

impl View for &Encoded<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.safetensors()
    }
    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let values = (self.tensor.values)();
        Cow::Owned(self.dtype.encode(&values))
    }
    fn data_len(&self) -> usize {
        self.tensor.shape.iter().product::<usize>() * self.dtype.safetensors().bitsize() / 8
    }
}

/// Writes `tensors` to `path` in `dtype`, with HF's `{"format": "pt"}` metadata, through a
/// temporary file so that an interrupted save leaves no half-written checkpoint.
pub fn write_safetensors(
    path: &Path,
    tensors: Vec<PendingTensor<'_>>,
    dtype: SaveDtype,
) -> Result<()> {
    let encoded: Vec<Encoded> = tensors
        .into_iter()
        .map(|tensor| Encoded { tensor, dtype })
        .collect();
    let views = encoded.iter().map(|e| (e.tensor.name.clone(), e));
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let temporary = Temporary::beside(path, "partial");
    safetensors::serialize_to_file(views, Some(metadata), temporary.path()).map_err(|e| {
        ModelError::Safetensors {
            path: temporary.path().to_path_buf(),
            why: format!("writing failed: {e}"),
        }
    })?;
    temporary.persist(path).map_err(io_error(path))
}

/// Writes `text` to `path` through a temporary file renamed into place.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let temporary = Temporary::beside(path, "partial");
    std::fs::write(temporary.path(), text).map_err(io_error(temporary.path()))?;
    temporary.persist(path).map_err(io_error(path))
}
