//! The llama-family transformer: weights loaded from GGUF and one batched forward pass.
//!
//! A forward step takes tokens from many sequences at once — prefill chunks and single
//! decode tokens mixed — so every weight matrix is streamed once per step for all of them.
//! Each sequence brings its own KV cache and positions; attention reads only that cache.
//! Q, K and V are one fused matrix, and so are the FFN's gate and up projections: fewer,
//! larger matmuls cost less dispatch than many small ones on a small model.
//! `calibrate` chooses, at start, the kernel that runs the model's matrices fastest here.

mod calibrate;

use std::path::Path;

use crate::gguf::{Gguf, GgufError};
use crate::kv::{BLOCK, BlockRef, Elem, LayerView, Shape};
use crate::quant::{self, QMatrix, QuantError, WeightType};

pub use calibrate::{Calibrate, Calibration, Choice, Source, Timing};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tensor {name}: {source}")]
    Weights {
        name: String,
        #[source]
        source: QuantError,
    },
    #[error("unsupported architecture `{0}` (supported: llama, qwen2)")]
    Architecture(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("model metadata: {0}")]
    Config(String),
    #[error("cannot start the engine's threads: {0}")]
    Threads(String),
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    Token { id: u32, vocab: usize },
    #[error("sequence would reach {need} positions; the context holds {ctx}")]
    Context { need: usize, ctx: usize },
}

/// Hyper-parameters from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub ctx_len: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// How the KV cache stores keys and values (not in the file: a load option).
    pub kv: KvType,
}

pub use crate::kv::{KvCache, KvType};

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Config, ModelError> {
        let arch = g.str("general.architecture")?.to_owned();
        if !matches!(arch.as_str(), "llama" | "qwen2") {
            return Err(ModelError::Architecture(arch));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let n_embd = g.u32(&key("embedding_length"))? as usize;
        let n_head = g.u32(&key("attention.head_count"))? as usize;
        let n_head_kv = g
            .opt_u32(&key("attention.head_count_kv"))?
            .map_or(n_head, |v| v as usize);
        if n_head == 0
            || n_head_kv == 0
            || !n_embd.is_multiple_of(n_head)
            || !n_head.is_multiple_of(n_head_kv)
        {
            return Err(ModelError::Config(format!(
                "{n_head} heads, {n_head_kv} KV heads and width {n_embd} do not divide"
            )));
        }
        let vocab = match g.opt_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => g.str_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(Config {
            n_layer: g.u32(&key("block_count"))? as usize,
            n_embd,
            n_head,
            n_head_kv,
            head_dim: n_embd / n_head,
            n_ff: g.u32(&key("feed_forward_length"))? as usize,
            vocab,
            ctx_len: g.u32(&key("context_length"))? as usize,
            rope_base: g.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rms_eps: g.f32(&key("attention.layer_norm_rms_epsilon"))?,
            kv: KvType::F32,
            arch,
        })
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

impl From<&Config> for Shape {
    fn from(c: &Config) -> Shape {
        Shape {
            layers: c.n_layer,
            rows: c.kv_dim(),
            heads: c.n_head_kv,
            head_dim: c.head_dim,
            kv: c.kv,
        }
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V rows stacked; qwen2 adds biases.
    wqkv: QMatrix,
    bqkv: Option<Vec<f32>>,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    /// Gate rows then up rows.
    w_gate_up: QMatrix,
    w_down: QMatrix,
}

pub struct Model {
    pub config: Config,
    embedding: QMatrix,
    layers: Vec<Layer>,
    out_norm: Vec<f32>,
    /// `None` when the output projection is tied to the embedding.
    output: Option<QMatrix>,
    pool: rayon::ThreadPool,
}

/// One sequence's part of a forward step: its new tokens, appended after its cache.
pub struct Chunk<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    /// Of how many of its last tokens the logits are wanted: none in the middle of a
    /// prefill, the last one to sample the next token, several to verify drafted tokens.
    pub logits: usize,
}

/// The type matrices without an integer kernel of their own (F16) run as: Q8_0 keeps their
/// values to within half a 1/127 step, and its kernel is the fastest per byte.
const FALLBACK_TYPE: WeightType = WeightType::Q8_0;

/// What a matrix stored as `t` is re-quantized to by default: nothing when a fast kernel
/// reads it as it is (and for F32, which asks for exact values).
fn fallback(t: WeightType) -> Option<WeightType> {
    (!t.has_fast_kernel() && t != WeightType::F32).then_some(FALLBACK_TYPE)
}

/// `to`, or what llama.cpp's quantizer uses instead when a row of `cols` weights is no whole
/// number of `to`'s blocks (K types take multiples of 256: SmolLM2's 576 columns are not).
fn holdable(to: WeightType, cols: usize) -> WeightType {
    let instead = match to {
        WeightType::Q4_K => WeightType::Q5_0,
        WeightType::Q5_K => WeightType::Q5_1,
        WeightType::Q6_K => WeightType::Q8_0,
        _ => to,
    };
    let t = [to, instead, WeightType::F32]
        .into_iter()
        .find(|t| t.row_bytes(cols).is_ok())
        .unwrap_or(WeightType::F32);
    if t != to {
        tracing::debug!(%to, cols, instead = %t, "rows do not fit the type's blocks");
    }
    t
}

/// How to load the weights.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Re-quantize every matrix to this type (e.g. Q8_0 or Q4_0, for speed or size). Without
    /// it every quantized matrix keeps its type and size (a Q4_K_M file's Q4_K, Q5_0, Q6_K and
    /// Q8_0 matrices each on their own kernel), and only F16 ones are re-quantized, to Q8_0.
    /// A matrix whose rows are no whole number of the type's blocks takes llama.cpp's
    /// substitute (Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0).
    pub requantize: Option<WeightType>,
    /// Threads for the kernels; `None`: one per core.
    pub threads: Option<usize>,
    /// How the KV caches of this model store keys and values.
    pub kv: KvType,
}

impl Model {
    pub fn load(path: &Path, options: LoadOptions) -> Result<Model, ModelError> {
        let gguf = Gguf::open(path)?;
        Model::from_gguf(&gguf, options)
    }

    pub fn from_gguf(g: &Gguf, options: LoadOptions) -> Result<Model, ModelError> {
        let mut config = Config::from_gguf(g)?;
        config.kv = options.kv;
        let c = &config;
        let (d, kvd, ff) = (c.n_embd as u64, c.kv_dim() as u64, c.n_ff as u64);
        let matrix = |names: &[&str], rows: &[u64], cols: u64| -> Result<QMatrix, ModelError> {
            let name = names.join("+");
            let weights = |source| ModelError::Weights {
                name: name.clone(),
                source,
            };
            let mut parts = Vec::with_capacity(names.len());
            for (name, &r) in names.iter().zip(rows) {
                let t = g.tensor(name)?;
                if *t.dims != [cols, r] {
                    return Err(ModelError::Shape {
                        name: (*name).to_owned(),
                        found: t.dims.to_vec(),
                        expected: vec![cols, r],
                    });
                }
                let wt = WeightType::from_ggml_id(t.dtype.id()).map_err(|source| {
                    ModelError::Weights {
                        name: (*name).to_owned(),
                        source,
                    }
                })?;
                parts.push((wt, r as usize, t.data));
            }
            let total_rows = rows.iter().sum::<u64>() as usize;
            let cols = cols as usize;
            let first = parts.first().map_or(WeightType::F32, |p| p.0);
            let m = if parts.iter().all(|p| p.0 == first) {
                let bytes = parts
                    .iter()
                    .flat_map(|p| p.2.iter().copied())
                    .collect::<Vec<_>>();
                QMatrix::from_bytes(first, total_rows, cols, &bytes).map_err(weights)?
            } else {
                // Mixed files (Q4_K_M and friends) give Q, K and V different types: the fused
                // matrix stacks them, each part on its own kernel.
                let load = || {
                    parts
                        .iter()
                        .map(|&(wt, r, data)| QMatrix::from_bytes(wt, r, cols, data))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(weights)
                };
                match QMatrix::stack(load()?) {
                    Ok(m) => m,
                    Err(why) => {
                        // Parts that do not stack (F16, or rows not whole tiles) meet in f32
                        // and take one type.
                        tracing::debug!(matrix = %name, %why, "re-quantizing mixed parts");
                        let mut values = Vec::with_capacity(total_rows * cols);
                        let mut row = vec![0f32; cols];
                        for part in load()? {
                            for i in 0..part.rows() {
                                part.dequantize_row(i, &mut row).map_err(weights)?;
                                values.extend_from_slice(&row);
                            }
                        }
                        let to = holdable(options.requantize.unwrap_or(FALLBACK_TYPE), cols);
                        return QMatrix::from_f32(to, total_rows, cols, &values).map_err(weights);
                    }
                }
            };
            match options
                .requantize
                .or_else(|| fallback(first))
                .map(|to| holdable(to, cols))
            {
                Some(to) if to != first => m.requantize(to).map_err(weights),
                _ => Ok(m),
            }
        };
        let vector = |name: &str, len: u64| -> Result<Vec<f32>, ModelError> {
            let t = g.tensor(name)?;
            if *t.dims != [len] {
                return Err(ModelError::Shape {
                    name: name.to_owned(),
                    found: t.dims.to_vec(),
                    expected: vec![len],
                });
            }
            let wt =
                WeightType::from_ggml_id(t.dtype.id()).map_err(|source| ModelError::Weights {
                    name: name.to_owned(),
                    source,
                })?;
            let mut out = vec![0.0; len as usize];
            quant::dequantize_row(wt, t.data, &mut out).map_err(|source| ModelError::Weights {
                name: name.to_owned(),
                source,
            })?;
            Ok(out)
        };
        // Each layer is tensors of the file, so a count past the file's tensors fails on the
        // first missing one: reserve no more than that (block_count = 2^31 asked for 773 GB).
        let mut layers = Vec::with_capacity(c.n_layer.min(g.tensors.len()));
        for i in 0..c.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let (q, k, v) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
            let bqkv = if g.tensor_info(&n("attn_q.bias")).is_some() {
                let mut b = vector(&n("attn_q.bias"), d)?;
                b.extend(vector(&n("attn_k.bias"), kvd)?);
                b.extend(vector(&n("attn_v.bias"), kvd)?);
                Some(b)
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: vector(&n("attn_norm.weight"), d)?,
                wqkv: matrix(&[&q, &k, &v], &[d, kvd, kvd], d)?,
                bqkv,
                wo: matrix(&[&n("attn_output.weight")], &[d], d)?,
                ffn_norm: vector(&n("ffn_norm.weight"), d)?,
                w_gate_up: matrix(&[&n("ffn_gate.weight"), &n("ffn_up.weight")], &[ff, ff], d)?,
                w_down: matrix(&[&n("ffn_down.weight")], &[d], ff)?,
            });
        }
        let vocab = c.vocab as u64;
        // The embedding is only read a row at a time; it keeps its type unless it also
        // serves as the (tied) output projection.
        let embedding_options = if g.tensor_info("output.weight").is_some() {
            LoadOptions {
                requantize: None,
                ..options
            }
        } else {
            options
        };
        let embedding = {
            let t = g.tensor("token_embd.weight")?;
            let wt =
                WeightType::from_ggml_id(t.dtype.id()).map_err(|source| ModelError::Weights {
                    name: "token_embd.weight".into(),
                    source,
                })?;
            if *t.dims != [d, vocab] {
                return Err(ModelError::Shape {
                    name: "token_embd.weight".into(),
                    found: t.dims.to_vec(),
                    expected: vec![d, vocab],
                });
            }
            let m = QMatrix::from_bytes(wt, c.vocab, c.n_embd, t.data).map_err(|source| {
                ModelError::Weights {
                    name: "token_embd.weight".into(),
                    source,
                }
            })?;
            match embedding_options
                .requantize
                .map(|to| holdable(to, c.n_embd))
            {
                Some(to) if to != wt => m.requantize(to).map_err(|source| ModelError::Weights {
                    name: "token_embd.weight".into(),
                    source,
                })?,
                _ => m,
            }
        };
        let output = if g.tensor_info("output.weight").is_some() {
            Some(matrix(&["output.weight"], &[vocab], d)?)
        } else {
            None
        };
        let threads = options
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("frugal-engine-{i}"))
            .build()
            .map_err(|e| ModelError::Threads(e.to_string()))?;
        Ok(Model {
            out_norm: vector("output_norm.weight", d)?,
            config,
            embedding,
            layers,
            output,
            pool,
        })
    }

    /// The same model with every matrix re-quantized to `to` (or its substitute, as at load);
    /// F32 gives the exact values of these weights on the f32 path, the reference the integer
    /// kernels are checked against. The embedding changes only when it is also the (tied)
    /// output projection, as at load.
    pub fn requantize(mut self, to: WeightType) -> Result<Model, ModelError> {
        let re = |name: &str, m: &QMatrix| {
            m.requantize(holdable(to, m.cols()))
                .map_err(|source| ModelError::Weights {
                    name: name.to_owned(),
                    source,
                })
        };
        for l in &mut self.layers {
            l.wqkv = re("wqkv", &l.wqkv)?;
            l.wo = re("attn_output", &l.wo)?;
            l.w_gate_up = re("ffn_gate+ffn_up", &l.w_gate_up)?;
            l.w_down = re("ffn_down", &l.w_down)?;
        }
        match &mut self.output {
            Some(out) => *out = re("output.weight", out)?,
            None => self.embedding = re("token_embd.weight", &self.embedding)?,
        }
        Ok(self)
    }

    /// Bytes of weights held.
    pub fn weight_bytes(&self) -> usize {
        let layer =
            |l: &Layer| l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes();
        self.layers.iter().map(layer).sum::<usize>()
            + self.embedding.bytes()
            + self.output.as_ref().map_or(0, QMatrix::bytes)
    }

    /// Runs one step over every chunk; returns the logits the chunks asked for, chunk by
    /// chunk and position by position, each `vocab` long.
    pub fn forward(&self, chunks: &mut [Chunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        // Inside the pool every matmul starts on a pool thread and the other steals half;
        // from outside, each call would hand work over and sleep (3x slower per step).
        self.pool.install(|| self.step(chunks))
    }

    fn step(&self, chunks: &mut [Chunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let (d, kvd, hd) = (c.n_embd, c.kv_dim(), c.head_dim);
        let total: usize = chunks.iter().map(|ch| ch.tokens.len()).sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        // Positions of every token of the step, and the checks that make the rest safe.
        let mut positions = Vec::with_capacity(total);
        for ch in chunks.iter() {
            let need = ch.cache.len() + ch.tokens.len();
            if need > c.ctx_len {
                return Err(ModelError::Context {
                    need,
                    ctx: c.ctx_len,
                });
            }
            positions.extend(ch.cache.len()..need);
            if let Some(&id) = ch.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::Token { id, vocab: c.vocab });
            }
        }
        for ch in chunks.iter_mut() {
            ch.cache.reserve(ch.cache.len() + ch.tokens.len());
        }
        let mut x = vec![0.0f32; total * d];
        let tokens = chunks.iter().flat_map(|ch| ch.tokens.iter().copied());
        for (row, id) in x.chunks_exact_mut(d).zip(tokens) {
            self.embedding
                .dequantize_row(id as usize, row)
                .map_err(|source| ModelError::Weights {
                    name: "token_embd.weight".into(),
                    source,
                })?;
        }
        let qkv_w = d + 2 * kvd;
        let mut h = vec![0.0f32; total * d];
        let mut qkv = vec![0.0f32; total * qkv_w];
        let mut attn = vec![0.0f32; total * d];
        let mut proj = vec![0.0f32; total * d];
        let mut gate_up = vec![0.0f32; total * 2 * c.n_ff];
        let mut act = vec![0.0f32; total * c.n_ff];
        let rope = Rope::new(hd, c.rope_base, &c.arch);
        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, c.rms_eps, &mut h);
            self.matmul(&layer.wqkv, &h, total, &mut qkv)?;
            if let Some(b) = &layer.bqkv {
                qkv.chunks_exact_mut(qkv_w)
                    .for_each(|r| r.iter_mut().zip(b).for_each(|(v, b)| *v += b));
            }
            for (row, &pos) in qkv.chunks_exact_mut(qkv_w).zip(&positions) {
                let (q, kv) = row.split_at_mut(d);
                rope.apply(q, pos);
                rope.apply(&mut kv[..kvd], pos);
            }
            // Append this step's K and V to each sequence's cache, then attend.
            let mut start = 0;
            for ch in chunks.iter_mut() {
                let n = ch.tokens.len();
                for (i, row) in qkv[start * qkv_w..(start + n) * qkv_w]
                    .chunks_exact(qkv_w)
                    .enumerate()
                {
                    let pos = ch.cache.len() + i;
                    ch.cache.write(li, pos, &row[d..d + kvd], &row[d + kvd..]);
                }
                start += n;
            }
            self.attention(chunks, li, &qkv, &mut attn);
            self.matmul(&layer.wo, &attn, total, &mut proj)?;
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            rms_norm(&x, &layer.ffn_norm, c.rms_eps, &mut h);
            self.matmul(&layer.w_gate_up, &h, total, &mut gate_up)?;
            for (a, gu) in act
                .chunks_exact_mut(c.n_ff)
                .zip(gate_up.chunks_exact(2 * c.n_ff))
            {
                let (g, u) = gu.split_at(c.n_ff);
                a.iter_mut()
                    .zip(g.iter().zip(u))
                    .for_each(|(a, (g, u))| *a = silu(*g) * u);
            }
            self.matmul(&layer.w_down, &act, total, &mut proj)?;
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
        }
        for ch in chunks.iter_mut() {
            ch.cache.advance(ch.tokens.len());
        }
        // Logits only for the positions asked for: the output projection is a fifth of the
        // weights, and prefill positions need none.
        let mut wanted = Vec::new();
        let mut end = 0;
        for ch in chunks.iter() {
            end += ch.tokens.len();
            let from = end - ch.logits.min(ch.tokens.len());
            wanted.extend_from_slice(&x[from * d..end * d]);
        }
        let n = wanted.len() / d;
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut normed = vec![0.0f32; n * d];
        rms_norm(&wanted, &self.out_norm, c.rms_eps, &mut normed);
        let mut logits = vec![0.0f32; n * c.vocab];
        let output = self.output.as_ref().unwrap_or(&self.embedding);
        self.matmul(output, &normed, n, &mut logits)?;
        Ok(logits.chunks_exact(c.vocab).map(<[f32]>::to_vec).collect())
    }

    fn matmul(
        &self,
        w: &QMatrix,
        x: &[f32],
        batch: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        quant::matmul(w, x, batch, out, &self.pool).map_err(|source| ModelError::Weights {
            name: "matmul".into(),
            source,
        })
    }

    /// Causal attention of every new token against its own sequence's cache. One job per
    /// (sequence, KV head) runs the heads sharing that KV head together, so each cached key
    /// and value is read once per group rather than once per head (the cache outgrows the
    /// CPU caches at long contexts); jobs run in parallel.
    fn attention(&self, chunks: &[Chunk<'_>], layer: usize, qkv: &[f32], out: &mut [f32]) {
        let c = &self.config;
        let (d, kvd, hd) = (c.n_embd, c.kv_dim(), c.head_dim);
        let qkv_w = d + 2 * kvd;
        let group = c.n_head / c.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        // (each new token's output slice for the group, the cache, first token's row in
        // `qkv`, positions already cached, KV head)
        type Job<'a> = (Vec<&'a mut [f32]>, &'a KvCache, usize, usize, usize);
        let mut jobs: Vec<Job<'_>> = Vec::with_capacity(chunks.len() * c.n_head_kv);
        let mut rows = out.chunks_exact_mut(d);
        let mut start = 0;
        for ch in chunks {
            let n = ch.tokens.len();
            let mut per_head: Vec<Vec<&mut [f32]>> =
                (0..c.n_head_kv).map(|_| Vec::with_capacity(n)).collect();
            for row in rows.by_ref().take(n) {
                for (outs, part) in per_head.iter_mut().zip(row.chunks_exact_mut(group * hd)) {
                    outs.push(part);
                }
            }
            for (kv_head, outs) in per_head.into_iter().enumerate() {
                jobs.push((outs, &*ch.cache, start, ch.cache.len(), kv_head));
            }
            start += n;
        }
        self.pool.install(|| {
            use rayon::prelude::*;
            jobs.into_par_iter().for_each_init(
                Vec::new,
                |scores, (outs, cache, start, past, kv_head)| {
                    for (t, o) in outs.into_iter().enumerate() {
                        let row = (start + t) * qkv_w + kv_head * group * hd;
                        let head = HeadGroup {
                            qs: &qkv[row..row + group * hd],
                            cache,
                            layer,
                            kv_head,
                            first_row: kv_head * hd,
                            hd,
                            visible: past + t + 1,
                            scale,
                        };
                        quant::vectorized(Attend {
                            head,
                            scores: &mut *scores,
                            out: o,
                        });
                    }
                },
            );
        });
    }
}

/// One new token's heads that share a KV head, against that KV head's cached rows.
struct HeadGroup<'a> {
    /// The group's query heads, `hd` each.
    qs: &'a [f32],
    cache: &'a KvCache,
    layer: usize,
    kv_head: usize,
    /// The KV head's first row in a block's keys and in each position's values.
    first_row: usize,
    hd: usize,
    visible: usize,
    scale: f32,
}

/// A head group's attention as wide-vector work.
struct Attend<'a> {
    head: HeadGroup<'a>,
    scores: &'a mut Vec<f32>,
    /// The group's heads, `hd` each.
    out: &'a mut [f32],
}

impl quant::Wide for Attend<'_> {
    #[inline(always)]
    fn run(self) {
        self.head.attend(self.scores, self.out);
    }
}

impl HeadGroup<'_> {
    /// Softmax-weighted values into `o` (the group's heads, `hd` each), block by block;
    /// inlined, with `dot`, `softmax` and `axpy`, into the wide-vector context of
    /// [`Attend`].
    #[inline(always)]
    fn attend(&self, scores: &mut Vec<f32>, o: &mut [f32]) {
        let (hd, visible) = (self.hd, self.visible);
        scores.clear();
        scores.resize(self.qs.len() / hd * visible, 0.0);
        let shape = self.cache.shape();
        for (b, block) in self.blocks() {
            match block {
                BlockRef::F32(k) => self.block_scores(&k.layer(shape, self.layer), scores, b),
                BlockRef::Q8(k) => self.block_scores(&k.layer(shape, self.layer), scores, b),
            }
        }
        scores.chunks_exact_mut(visible).for_each(softmax);
        // An 8-bit value's scale multiplies its weight.
        for (b, block) in self.blocks() {
            if let BlockRef::Q8(k) = block
                && let Some(vs) = k.layer(shape, self.layer).v_scale
            {
                let (from, n) = self.span(b);
                let vs = &vs[self.kv_head * BLOCK..][..n];
                for w in scores.chunks_exact_mut(visible) {
                    w[from..from + n]
                        .iter_mut()
                        .zip(vs)
                        .for_each(|(w, d)| *w *= d);
                }
            }
        }
        for (og, w) in o.chunks_exact_mut(hd).zip(scores.chunks_exact(visible)) {
            match hd {
                64 => self.weighted_sum::<64>(w, og),
                128 => self.weighted_sum::<128>(w, og),
                _ => self.weighted_sum_any(w, og),
            }
        }
    }

    /// The blocks holding the visible positions, with their index.
    #[inline(always)]
    fn blocks(&self) -> impl Iterator<Item = (usize, &BlockRef)> {
        self.cache.blocks()[..self.visible.div_ceil(BLOCK)]
            .iter()
            .enumerate()
    }

    /// Block `b`'s first position and how many of its positions are visible.
    #[inline(always)]
    fn span(&self, b: usize) -> (usize, usize) {
        let from = b * BLOCK;
        (from, (self.visible - from).min(BLOCK))
    }

    /// The scores of block `b`'s positions: scores[g] = sum over dimensions of
    /// q_g[dim] * keys[dim][..], key rows serving every head of the group while they are in
    /// L1, four dimensions per pass; an 8-bit key's scale multiplies its whole dot product.
    #[inline(always)]
    fn block_scores<T: Elem>(&self, view: &LayerView<'_, T>, scores: &mut [f32], b: usize) {
        let (hd, visible) = (self.hd, self.visible);
        let (from, n) = self.span(b);
        let key = |dim: usize| &view.keys[(self.first_row + dim) * BLOCK..][..n];
        let mut dim = 0;
        while dim + 4 <= hd {
            let k = [key(dim), key(dim + 1), key(dim + 2), key(dim + 3)];
            for (q, s) in self
                .qs
                .chunks_exact(hd)
                .zip(scores.chunks_exact_mut(visible))
            {
                let a = [q[dim], q[dim + 1], q[dim + 2], q[dim + 3]].map(|x| x * self.scale);
                axpy4(&mut s[from..from + n], a, k);
            }
            dim += 4;
        }
        for dim in dim..hd {
            for (q, s) in self
                .qs
                .chunks_exact(hd)
                .zip(scores.chunks_exact_mut(visible))
            {
                let a = q[dim] * self.scale;
                s[from..from + n]
                    .iter_mut()
                    .zip(key(dim))
                    .for_each(|(s, k)| *s += a * k.f());
            }
        }
        if let Some(ks) = view.k_scale {
            let ks = &ks[self.kv_head * BLOCK..][..n];
            for s in scores.chunks_exact_mut(visible) {
                s[from..from + n]
                    .iter_mut()
                    .zip(ks)
                    .for_each(|(s, d)| *s *= d);
            }
        }
    }

    /// `out = sum_p w[p] * value_p` over every visible position, the sum held in registers.
    #[inline(always)]
    fn weighted_sum<const HD: usize>(&self, w: &[f32], out: &mut [f32]) {
        let mut acc = [0.0f32; HD];
        let shape = self.cache.shape();
        for (b, block) in self.blocks() {
            let (from, n) = self.span(b);
            let w = &w[from..from + n];
            match block {
                BlockRef::F32(v) => self.add_values(&v.layer(shape, self.layer), w, &mut acc),
                BlockRef::Q8(v) => self.add_values(&v.layer(shape, self.layer), w, &mut acc),
            }
        }
        out.copy_from_slice(&acc);
    }

    #[inline(always)]
    fn add_values<const HD: usize, T: Elem>(
        &self,
        view: &LayerView<'_, T>,
        w: &[f32],
        acc: &mut [f32; HD],
    ) {
        let rows = self.cache.shape().rows;
        for (p, &wp) in w.iter().enumerate() {
            if let Some(v) = view.values[p * rows + self.first_row..].first_chunk::<HD>() {
                for i in 0..HD {
                    acc[i] += wp * v[i].f();
                }
            }
        }
    }

    /// [`HeadGroup::weighted_sum`] for a head size without registers of its own.
    fn weighted_sum_any(&self, w: &[f32], out: &mut [f32]) {
        let (shape, rows, hd) = (self.cache.shape(), self.cache.shape().rows, self.hd);
        out.fill(0.0);
        for (b, block) in self.blocks() {
            let (from, n) = self.span(b);
            for (p, &wp) in w[from..from + n].iter().enumerate() {
                let at = p * rows + self.first_row;
                match block {
                    BlockRef::F32(v) => {
                        let v = &v.layer(shape, self.layer).values[at..at + hd];
                        out.iter_mut().zip(v).for_each(|(o, v)| *o += wp * v);
                    }
                    BlockRef::Q8(v) => {
                        let v = &v.layer(shape, self.layer).values[at..at + hd];
                        out.iter_mut().zip(v).for_each(|(o, v)| *o += wp * v.f());
                    }
                }
            }
        }
    }
}

/// Rotary position embedding. llama GGUFs rotate adjacent pairs (the converter permutes
/// Q and K rows for it); qwen2 GGUFs keep the halves layout, pairing `i` with `i + d/2`.
struct Rope {
    inv_freq: Vec<f32>,
    halves: bool,
}

impl Rope {
    fn new(head_dim: usize, base: f32, arch: &str) -> Rope {
        Rope {
            inv_freq: (0..head_dim / 2)
                .map(|i| base.powf(-2.0 * i as f32 / head_dim as f32))
                .collect(),
            halves: arch == "qwen2",
        }
    }

    fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for head in x.chunks_exact_mut(half * 2) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                let (sin, cos) = (pos as f32 * f).sin_cos();
                let (ia, ib) = if self.halves {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (a, b) = (head[ia], head[ib]);
                head[ia] = a * cos - b * sin;
                head[ib] = a * sin + b * cos;
            }
        }
    }
}

fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = dot(row, row) / d as f32;
        let inv = 1.0 / (mean + eps).sqrt();
        o.iter_mut()
            .zip(row.iter().zip(weight))
            .for_each(|(o, (v, w))| *o = v * inv * w);
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Sixteen lanes of partial sums: a single running f32 sum cannot be reordered, so the
/// compiler would keep it scalar; lanes let it use vector registers.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `s += a[0] * k[0] + ... + a[3] * k[3]`: four key rows per pass over the scores, so the
/// scores are loaded and stored a quarter as often as with four `axpy`s.
#[inline(always)]
fn axpy4<T: Elem>(s: &mut [f32], a: [f32; 4], k: [&[T]; 4]) {
    let n = s.len();
    let (k0, k1, k2, k3) = (&k[0][..n], &k[1][..n], &k[2][..n], &k[3][..n]);
    for i in 0..n {
        s[i] += a[0] * k0[i].f() + a[1] * k1[i].f() + a[2] * k2[i].f() + a[3] * k3[i].f();
    }
}

#[inline(always)]
pub(crate) fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    x.iter_mut().for_each(|v| {
        *v = (*v - max).exp();
        sum += *v;
    });
    x.iter_mut().for_each(|v| *v /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_the_right_pairs() {
        // One head of 4: frequencies 1 and 1/100 for base 10,000; position 1.
        let x = [1.0, 2.0, 3.0, 4.0];
        let (s1, c1) = 1.0f32.sin_cos();
        let (s2, c2) = 0.01f32.sin_cos();
        let mut adjacent = x;
        Rope::new(4, 10_000.0, "llama").apply(&mut adjacent, 1);
        let want = [
            c1 - 2.0 * s1,
            s1 + 2.0 * c1,
            3.0 * c2 - 4.0 * s2,
            3.0 * s2 + 4.0 * c2,
        ];
        adjacent
            .iter()
            .zip(want)
            .for_each(|(a, b)| assert!((a - b).abs() < 1e-6));
        let mut halves = x;
        Rope::new(4, 10_000.0, "qwen2").apply(&mut halves, 1);
        let want = [
            c1 - 3.0 * s1,
            2.0 * c2 - 4.0 * s2,
            s1 + 3.0 * c1,
            2.0 * s2 + 4.0 * c2,
        ];
        halves
            .iter()
            .zip(want)
            .for_each(|(a, b)| assert!((a - b).abs() < 1e-6));
        let mut zero = x;
        Rope::new(4, 10_000.0, "llama").apply(&mut zero, 0);
        assert_eq!(zero, x, "position 0 is the identity");
    }
}
