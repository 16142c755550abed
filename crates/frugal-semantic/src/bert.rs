//! BERT's encoder as all-MiniLM-L6-v2 shapes it (384 wide, 12 heads), run on the engine's
//! quantized kernels on the calling thread: the forward pass under the cache's embedder
//! (`embed`) and its paraphrase verifier (`verify`, the first layers with an adapter merged).
//!
//! Our own forward pass rather than candle-transformers' `BertModel`: a short query is ~12
//! tokens, where candle spends its time in per-op overhead (~25 ms for one 12-token sentence
//! on one core here), while the arithmetic is ~250 MFLOP. This allocates nothing per op and
//! stays within 0.5% (cosine) of candle's f32 embedding (`embed::tests::matches_candle`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use frugal_engine::quant::{self, QMatrix, QuantError, Scratch, WeightType};
use safetensors::{Dtype, SafeTensors};

pub(crate) const HIDDEN: usize = 384;
const HEADS: usize = 12;
const HEAD_DIM: usize = HIDDEN / HEADS;
const INTERMEDIATE: usize = 1536;
/// all-MiniLM-L6-v2's layers.
pub(crate) const LAYERS: usize = 6;
const POSITIONS: usize = 512;
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

/// A low-rank update to a linear layer's weight, `W + B A` (`B` already scaled), by the base
/// weight's name without `.weight` (`encoder.layer.0.attention.self.query`).
/// `(A, B, rank, in)`.
pub(crate) type Adapter = HashMap<String, (Vec<f32>, Vec<f32>, usize, usize)>;

/// The encoder's weights. Immutable once loaded: share it across threads.
#[derive(Debug)]
pub(crate) struct Bert {
    word: Vec<f32>,
    position: Vec<f32>,
    /// Token types 0 and 1 (the first and second text of a pair).
    types: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
}

/// Reads tensors out of one safetensors file, naming the file and tensor in every error.
pub(crate) struct Weights<'a> {
    pub(crate) path: &'a Path,
    pub(crate) st: SafeTensors<'a>,
}

impl Weights<'_> {
    /// The shape of tensor `name`, if the file has it.
    pub(crate) fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.st.tensor(name).ok().map(|t| t.shape().to_vec())
    }

    pub(crate) fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EmbedError> {
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

impl Bert {
    /// The first `layers` layers of the BERT in `dir/model.safetensors`, linear weights as
    /// `t`, with `adapter`'s updates added before they are quantized.
    pub(crate) fn load(
        dir: &Path,
        t: WeightType,
        layers: usize,
        adapter: &Adapter,
    ) -> Result<Bert, EmbedError> {
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
        let linear = |name: String, rows: usize, cols: usize| -> Result<_, EmbedError> {
            let (mut wt, b) = w.linear(&name, rows, cols)?;
            if let Some((a, bm, rank, inputs)) = adapter.get(&name) {
                if *inputs != cols || bm.len() != rows * rank {
                    return Err(EmbedError::Tensor {
                        path: path.clone(),
                        name,
                        why: format!(
                            "the adapter is {}x{inputs}, the layer {rows}x{cols}",
                            bm.len() / rank.max(&1)
                        ),
                    });
                }
                add_low_rank(&mut wt, bm, a, rows, cols, *rank);
            }
            Ok((wt, b))
        };
        let q = |rows: usize, cols: usize, w: &[f32]| -> Result<QMatrix, EmbedError> {
            Ok(QMatrix::from_f32(t, rows, cols, w)?)
        };
        let word = w.f32s("embeddings.word_embeddings.weight", &[30522, HIDDEN])?;
        let position = w.f32s(
            "embeddings.position_embeddings.weight",
            &[POSITIONS, HIDDEN],
        )?;
        let types = w.f32s("embeddings.token_type_embeddings.weight", &[2, HIDDEN])?;
        let mut out = Vec::with_capacity(layers);
        for l in 0..layers.min(LAYERS) {
            let p = format!("encoder.layer.{l}");
            let mut qkv = Vec::with_capacity(3 * HIDDEN * HIDDEN);
            let mut qkv_bias = Vec::with_capacity(3 * HIDDEN);
            for part in ["query", "key", "value"] {
                let (wt, b) = linear(format!("{p}.attention.self.{part}"), HIDDEN, HIDDEN)?;
                qkv.extend(wt);
                qkv_bias.extend(b);
            }
            let (o, out_bias) = linear(format!("{p}.attention.output.dense"), HIDDEN, HIDDEN)?;
            let (up, up_bias) = linear(format!("{p}.intermediate.dense"), INTERMEDIATE, HIDDEN)?;
            let (down, down_bias) = linear(format!("{p}.output.dense"), HIDDEN, INTERMEDIATE)?;
            out.push(Layer {
                qkv: q(3 * HIDDEN, HIDDEN, &qkv)?,
                qkv_bias,
                out: q(HIDDEN, HIDDEN, &o)?,
                out_bias,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"))?,
                up: q(INTERMEDIATE, HIDDEN, &up)?,
                up_bias,
                down: q(HIDDEN, INTERMEDIATE, &down)?,
                down_bias,
                ffn_norm: w.norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            word,
            position,
            types,
            emb_norm: w.norm("embeddings.LayerNorm")?,
            layers: out,
        })
    }

    /// The last layer's hidden states (`ids.len()` rows of [`HIDDEN`]) for word pieces `ids`
    /// of token types `types` (0 for a single text), at most [`POSITIONS`] of them.
    pub(crate) fn forward(&self, ids: &[u32], types: &[u32]) -> Result<Vec<f32>, EmbedError> {
        let n = ids.len().min(POSITIONS);
        let mut x = vec![0f32; n * HIDDEN];
        for (t, (row, &id)) in x.chunks_exact_mut(HIDDEN).zip(ids).enumerate() {
            let id = (id as usize).min(self.word.len() / HIDDEN - 1);
            let ty = types.get(t).map_or(0, |&k| (k as usize).min(1));
            let word = &self.word[id * HIDDEN..(id + 1) * HIDDEN];
            let pos = &self.position[t * HIDDEN..(t + 1) * HIDDEN];
            let typ = &self.types[ty * HIDDEN..(ty + 1) * HIDDEN];
            for (((o, w), p), k) in row.iter_mut().zip(word).zip(pos).zip(typ) {
                *o = w + p + k;
            }
            layer_norm(row, &self.emb_norm);
        }
        let mut buf = Buffers::new(n);
        let mut scratch = Scratch::new();
        for layer in &self.layers {
            layer.forward(&mut x, n, &mut buf, &mut scratch)?;
        }
        Ok(x)
    }
}

/// `w += b a`: `w` is `rows x cols`, `b` is `rows x rank`, `a` is `rank x cols`.
fn add_low_rank(w: &mut [f32], b: &[f32], a: &[f32], rows: usize, cols: usize, rank: usize) {
    for r in 0..rows {
        let out = &mut w[r * cols..(r + 1) * cols];
        for k in 0..rank {
            let s = b[r * rank + k];
            for (o, x) in out.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                *o += s * x;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
