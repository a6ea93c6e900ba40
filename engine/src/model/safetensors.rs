//! Hugging Face checkpoints: `*.safetensors` files (F32, F16, BF16), memory-mapped.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::weights::{DType, Storage, Tensor};

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// A file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The folder holds no `.safetensors` file.
    #[error("{0}: no .safetensors files")]
    Empty(PathBuf),
    /// A file is not valid safetensors.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// All tensors of a checkpoint folder, by name.
pub struct Checkpoint {
    tensors: HashMap<String, Tensor>,
}

impl Checkpoint {
    /// Maps every `*.safetensors` file in `dir`.
    pub fn open(dir: &Path) -> Result<Self, SafetensorsError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SafetensorsError::Io { path, source }
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(SafetensorsError::Empty(dir.to_path_buf()));
        }
        let mut tensors = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(io(&path))?;
            // SAFETY: read-only map of a model file the engine never writes.
            let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io(&path))?);
            let st = SafeTensors::deserialize(&map).map_err(|e| SafetensorsError::Format {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let base = map.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let dtype = match view.dtype() {
                    Dtype::F32 => DType::F32,
                    Dtype::F16 => DType::F16,
                    Dtype::BF16 => DType::BF16,
                    other => {
                        return Err(SafetensorsError::Format {
                            path: path.clone(),
                            message: format!(
                                "tensor {name} has unsupported dtype {other:?} (F32, F16, BF16 are supported)"
                            ),
                        });
                    }
                };
                let data = view.data();
                let offset = data.as_ptr() as usize - base;
                let t = Tensor::new(
                    name.clone(),
                    dtype,
                    view.shape().to_vec(),
                    Storage::Mapped {
                        map: Arc::clone(&map),
                        offset,
                        len: data.len(),
                    },
                );
                tensors.insert(name, t);
            }
        }
        Ok(Self { tensors })
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        self.tensors.get(name).cloned()
    }
}
