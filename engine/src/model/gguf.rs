//! GGUF (v2 and v3) reader: metadata and tensor descriptors, with tensor data memory-mapped.
//!
//! Every count and size in the header is checked against the file before anything is
//! allocated, so a truncated or hostile file is a [`GgufError`], never a panic or a huge
//! allocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::weights::{DType, Storage, Tensor};

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a GGUF tensor may have.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Unsigned integer (u8, u16, u32 or u64 on disk).
    U64(u64),
    /// Signed integer (i8, i16, i32 or i64 on disk).
    I64(i64),
    /// Float (f32 or f64 on disk).
    F64(f64),
    /// A GGUF boolean (one byte, 0 or 1).
    Bool(bool),
    /// UTF-8 string (invalid UTF-8 is replaced).
    String(String),
    /// Array of values.
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) => Some(v),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a float, if it is numeric.
    #[allow(clippy::cast_precision_loss)]
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => None,
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// The value as an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("{path}: not a GGUF file (bad magic)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// The GGUF version is not 2 or 3.
    #[error("{path}: unsupported GGUF version {version} (2 and 3 are supported)")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// The file ends before the header says it should, or a count is impossible.
    #[error("{path}: truncated or corrupt at byte {offset}: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where reading failed.
        offset: u64,
        /// What was being read.
        what: String,
    },
    /// A tensor has a type this engine cannot compute with.
    #[error("{path}: tensor {tensor} has unsupported type {type_name} ({type_id})")]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The GGML type id.
        type_id: u32,
        /// The GGML type name, when known.
        type_name: &'static str,
    },
}

/// One tensor's descriptor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Tensor name, for example `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape with the outermost dimension first (GGUF stores the innermost first).
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Offset of the data from the start of the file.
    pub offset: usize,
    /// Size of the data in bytes.
    pub len: usize,
}

/// A parsed GGUF file, with its data mapped.
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: BTreeMap<String, TensorInfo>,
    map: Arc<Mmap>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Reader<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
    version: u32,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            offset: self.pos as u64,
            what: what.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| self.corrupt(format!("{what}: needs {n} bytes past the end")))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count: u64 in v2+, checked so that `count * min_size` fits in what is left.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let n =
            usize::try_from(n).map_err(|_| self.corrupt(format!("{what}: {n} is too large")))?;
        if n.saturating_mul(min_size.max(1)) > self.remaining() {
            return Err(self.corrupt(format!(
                "{what}: {n} items cannot fit in the {} bytes left",
                self.remaining()
            )));
        }
        Ok(n)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U64(u64::from(self.array::<1>("u8")?[0])),
            1 => Value::I64(i64::from(i8::from_le_bytes(self.array("i8")?))),
            2 => Value::U64(u64::from(u16::from_le_bytes(self.array("u16")?))),
            3 => Value::I64(i64::from(i16::from_le_bytes(self.array("i16")?))),
            4 => Value::U64(u64::from(self.u32("u32")?)),
            5 => Value::I64(i64::from(i32::from_le_bytes(self.array("i32")?))),
            6 => Value::F64(f64::from(f32::from_le_bytes(self.array("f32")?))),
            7 => Value::Bool(self.array::<1>("bool")?[0] != 0),
            8 => Value::String(self.string("string")?),
            9 => {
                if depth > 2 {
                    return Err(self.corrupt("arrays nested too deeply"));
                }
                let elem = self.u32("array type")?;
                let n = self.count("array length", value_min_size(elem))?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64("u64")?),
            11 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            12 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
            other => return Err(self.corrupt(format!("unknown metadata value type {other}"))),
        })
    }
}

/// The fewest bytes a value of this type takes on disk (for bounding counts).
fn value_min_size(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

impl GgufFile {
    /// Opens and parses a GGUF file, mapping its data.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; the engine never writes model files, and a file changed
        // under us is outside what any mmap-based loader can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Arc::new(map))
    }

    fn parse(path: &Path, map: Arc<Mmap>) -> Result<Self, GgufError> {
        let data: &[u8] = &map;
        let mut r = Reader {
            path,
            data,
            pos: 0,
            version: 0,
        };
        if data.len() < 4 || r.u32("magic")? != MAGIC {
            return Err(GgufError::BadMagic {
                path: path.to_path_buf(),
            });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        r.version = version;
        // Each tensor descriptor takes at least 8+4+8+4+8 bytes; each key/value at least 8+4+1.
        let n_tensors = r.count("tensor count", 32)?;
        let n_kv = r.count("metadata count", 13)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32("metadata type")?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two() && *a <= 1 << 20)
                .ok_or_else(|| r.corrupt("general.alignment is not a power of two"))?,
        };
        let mut infos = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32("tensor dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.corrupt(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64("tensor dim")?;
                let d = usize::try_from(d)
                    .ok()
                    .filter(|&d| d > 0 && d < (1 << 40))
                    .ok_or_else(|| r.corrupt(format!("tensor {name} has dimension {d}")))?;
                ne.push(d);
            }
            let type_id = r.u32("tensor type")?;
            let offset = r.u64("tensor offset")?;
            infos.push((name, ne, type_id, offset));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, ne, type_id, offset) in infos {
            let dtype = DType::from_ggml(type_id).ok_or_else(|| GgufError::UnsupportedType {
                path: path.to_path_buf(),
                tensor: name.clone(),
                type_id,
                type_name: DType::ggml_name(type_id),
            })?;
            let shape: Vec<usize> = ne.iter().rev().copied().collect();
            let corrupt = |what: String| GgufError::Corrupt {
                path: path.to_path_buf(),
                offset: data_start + offset,
                what,
            };
            let elems = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| corrupt(format!("tensor {name}: element count overflows")))?;
            let len = dtype.bytes_for(ne[0], elems).ok_or_else(|| {
                corrupt(format!(
                    "tensor {name}: row of {} is not a whole number of {} blocks",
                    ne[0],
                    dtype.name()
                ))
            })?;
            let start = data_start
                .checked_add(offset)
                .and_then(|s| usize::try_from(s).ok())
                .ok_or_else(|| corrupt(format!("tensor {name}: offset overflows")))?;
            if start.checked_add(len).is_none_or(|end| end > data.len()) {
                return Err(corrupt(format!(
                    "tensor {name} ({len} bytes) runs past the end of the file ({} bytes): the file is truncated",
                    data.len()
                )));
            }
            if offset % alignment != 0 {
                return Err(corrupt(format!(
                    "tensor {name} is not aligned to {alignment}"
                )));
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    name,
                    shape,
                    dtype,
                    offset: start,
                    len,
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            map,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// All tensor descriptors, by name.
    pub fn tensor_infos(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    /// A tensor, its data borrowed from the map (nothing is copied).
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        let info = self.tensors.get(name)?;
        Some(Tensor::new(
            info.name.clone(),
            info.dtype,
            info.shape.clone(),
            Storage::Mapped {
                map: Arc::clone(&self.map),
                offset: info.offset,
                len: info.len,
            },
        ))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::testing::GgufBuilder;

    #[test]
    fn reads_metadata_and_tensors() {
        let mut b = GgufBuilder::new();
        b.kv_str("general.architecture", "llama");
        b.kv_u32("llama.block_count", 2);
        b.kv_f32("llama.rope.freq_base", 10000.0);
        b.kv_str_array("tokenizer.ggml.tokens", &["a", "b"]);
        b.tensor_f32("x", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (_dir, path) = b.write_temp();
        let g = GgufFile::open(&path).expect("parse");
        assert_eq!(g.version(), 3);
        assert_eq!(
            g.get("general.architecture").and_then(Value::as_str),
            Some("llama")
        );
        assert_eq!(g.get("llama.block_count").and_then(Value::as_u64), Some(2));
        assert_eq!(
            g.get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(<[_]>::len),
            Some(2)
        );
        let t = g.tensor("x").expect("tensor");
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.dtype(), DType::F32);
        assert_eq!(t.row_f32(1), vec![4.0, 5.0, 6.0]);
    }

    #[test]
    fn truncated_files_are_errors_not_panics() {
        let mut b = GgufBuilder::new();
        b.kv_str("general.architecture", "llama");
        b.tensor_f32("x", &[4, 4], &[0.5; 16]);
        let bytes = b.bytes();
        let dir = tempdir();
        for cut in [0, 3, 4, 8, 20, 30, bytes.len() / 2, bytes.len() - 1] {
            let p = dir.join(format!("cut{cut}.gguf"));
            std::fs::write(&p, &bytes[..cut]).expect("write");
            let err = GgufFile::open(&p).expect_err("truncated file must fail");
            let msg = err.to_string();
            assert!(msg.contains(&format!("cut{cut}.gguf")), "{msg}");
        }
    }

    #[test]
    fn absurd_counts_do_not_allocate() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC.to_le_bytes());
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        let dir = tempdir();
        let p = dir.join("absurd.gguf");
        std::fs::write(&p, &bytes).expect("write");
        let err = GgufFile::open(&p).expect_err("must fail");
        assert!(err.to_string().contains("cannot fit"), "{err}");
    }

    #[test]
    fn bad_magic_and_version() {
        let dir = tempdir();
        let p = dir.join("notgguf.bin");
        std::fs::write(&p, b"hello world, not a model").expect("write");
        assert!(matches!(
            GgufFile::open(&p),
            Err(GgufError::BadMagic { .. })
        ));
        let mut bytes = MAGIC.to_le_bytes().to_vec();
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&[0; 16]);
        std::fs::write(&p, &bytes).expect("write");
        assert!(matches!(
            GgufFile::open(&p),
            Err(GgufError::Version { version: 9, .. })
        ));
    }

    #[test]
    fn unknown_tensor_type_is_named() {
        let mut b = GgufBuilder::new();
        b.tensor_raw("w", &[32], 17, &[0u8; 64]);
        let (_dir, path) = b.write_temp();
        let err = GgufFile::open(&path).expect_err("must fail");
        assert!(
            err.to_string().contains("tensor w has unsupported type"),
            "{err}"
        );
    }

    pub(crate) fn tempdir() -> PathBuf {
        crate::model::testing::temp_dir("gguf")
    }
}
