//! Models: file formats (GGUF, safetensors), configuration, and the Llama family's weights.

pub mod config;
pub mod gguf;
pub mod llama;
pub mod loader;
pub mod ops;
pub mod safetensors;
#[doc(hidden)]
pub mod testing;
pub mod weights;
