//! Models: file formats (GGUF, safetensors), configuration, the families (one file each, in
//! [`family`]), and their weights.

pub mod config;
pub mod family;
pub mod gguf;
pub mod llama;
pub mod loader;
pub mod ops;
pub mod safetensors;
#[doc(hidden)]
pub mod testing;
pub mod weights;
