//! frugal-engine: a local LLM engine for llama-family GGUF models.
//!
//! `gguf` reads model files, `tokenizer` and `template` turn chat messages into tokens and
//! `prompt` combines them into a model's input (message contents cannot forge special
//! tokens there), `quant` holds the quantized weight formats and their matrix kernels,
//! `model` runs the batched forward pass, `scheduler` batches requests into its steps and
//! `speculate` drafts tokens for them to verify, `quantize` re-encodes a model file's weights
//! in another type, `eval` measures what a quantization costs in quality. It knows nothing of
//! HTTP or money.

/// The default model, relative to the repository root; `scripts/fetch-models.sh` fetches it.
pub const DEFAULT_MODEL: &str = "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The larger tier (qwen2 architecture, mixed Q4_K_M types), fetched by the same script.
pub const LARGE_MODEL: &str = "models/qwen2.5/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf";

/// Data files compiled in, by their path in the repository, so that the paths the docs name
/// work from any folder (the binary installs them into its data folder when the path is not
/// there): the held-out texts of `frugal eval ppl`.
pub const BUNDLED: &[(&str, &[u8])] = &[
    (
        "data/eval/shakespeare-heldout.txt",
        include_bytes!("../../../data/eval/shakespeare-heldout.txt"),
    ),
    (
        "data/eval/python-difflib.py.txt",
        include_bytes!("../../../data/eval/python-difflib.py.txt"),
    ),
];

pub mod eval;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod prefix;
pub mod prompt;
pub mod quant;
pub mod quantize;
pub mod sampling;
pub mod scheduler;
pub mod speculate;
pub mod template;
pub mod tokenizer;

/// The fuzz targets (`fuzz_*`) cap what a parser may allocate; other tests are unaffected.
#[cfg(test)]
#[global_allocator]
static ALLOC: frugal_testkit::fuzz::Capped = frugal_testkit::fuzz::Capped;
