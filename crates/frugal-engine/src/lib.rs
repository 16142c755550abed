//! frugal-engine: a local LLM engine for llama-family GGUF models.
//!
//! `gguf` reads model files, `tokenizer` and `template` turn chat messages into tokens,
//! `quant` holds the quantized weight formats and their matrix kernels, `model` runs the
//! batched forward pass. It knows nothing of HTTP or money.

pub mod gguf;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod scheduler;
pub mod template;
pub mod tokenizer;
