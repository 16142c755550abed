//! `frugal quantize`: re-encode a GGUF model's weight matrices in another type.
//!
//! [`quantize_file`] plans every tensor first (so a bad input is refused before a byte is
//! written), then streams the output through [`GgufWriter`] one tensor at a time, each
//! converted row by row in parallel: dequantize the source row to f32 with the engine's
//! decoders, quantize it with ggml's reference quantizers (`quant::quantize_row`).
//!
//! What is quantized, as `llama-quantize` does it:
//! * 2-D (and higher) tensors whose name ends in `weight`, the token embedding included, go
//!   to the target type; 1-D tensors (norms, biases) are copied unchanged (F32 in every
//!   real file).
//! * The output projection (`output.weight`, or `token_embd.weight` when the model ties its
//!   embeddings and has no `output.weight`, as llama.cpp decides) goes to `keep_output` when
//!   given, since it is the tensor whose error the logits feel most.
//! * A matrix whose rows are not whole blocks of the chosen type falls back, per tensor, to
//!   the type llama.cpp picks (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, and from there or
//!   any other type to F16), and the report says so.
//! * A tensor already in its target type is copied byte for byte.
//!
//! All metadata is carried over as read (tokenizer, chat template, architecture keys), except
//! `general.file_type` (llama.cpp's `LLAMA_FTYPE` of the target) and
//! `general.quantization_version` (2).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use thiserror::Error;

use crate::gguf::write::{GgufWriter, TensorSpec, WriteError};
use crate::gguf::{GgmlType, Gguf, GgufError, Value};
use crate::quant::{self, QuantError, WeightType};

/// The types `frugal quantize --type` accepts, by their lower-case names.
pub const TARGETS: [(&str, WeightType); 9] = [
    ("q8_0", WeightType::Q8_0),
    ("q6_k", WeightType::Q6_K),
    ("q5_k", WeightType::Q5_K),
    ("q4_k", WeightType::Q4_K),
    ("q5_1", WeightType::Q5_1),
    ("q5_0", WeightType::Q5_0),
    ("q4_1", WeightType::Q4_1),
    ("q4_0", WeightType::Q4_0),
    ("f16", WeightType::F16),
];

/// Everything that can go wrong quantizing a file.
#[derive(Debug, Error)]
pub enum QuantizeError {
    #[error("unknown type {name:?}: expected one of {}", target_names())]
    UnknownType { name: String },
    #[error("the output is the input file ({}): choose another output path", path.display())]
    SameFile { path: PathBuf },
    #[error("reading {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: GgufError,
    },
    #[error(
        "tensor {tensor:?} has type {dtype}, which frugal cannot read (it reads f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K)"
    )]
    UnsupportedTensorType { tensor: String, dtype: GgmlType },
    #[error("reading tensor {tensor:?}")]
    Tensor {
        tensor: String,
        #[source]
        source: GgufError,
    },
    #[error("converting tensor {tensor:?}")]
    Convert {
        tensor: String,
        #[source]
        source: QuantError,
    },
    #[error(transparent)]
    Write(#[from] WriteError),
}

fn target_names() -> String {
    TARGETS.map(|(n, _)| n).join(", ")
}

/// The target type called `name` (`"q4_k"`, case-insensitive), or an error listing them all.
pub fn target_from_name(name: &str) -> Result<WeightType, QuantizeError> {
    TARGETS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|&(_, t)| t)
        .ok_or_else(|| QuantizeError::UnknownType {
            name: name.to_owned(),
        })
}

/// The lower-case name `--type` uses for `t`.
pub fn target_name(t: WeightType) -> &'static str {
    TARGETS
        .iter()
        .find(|(_, w)| *w == t)
        .map_or("f32", |(n, _)| n)
}

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// The type of every weight matrix.
    pub target: WeightType,
    /// The output projection's type, when it should differ from `target`.
    pub keep_output: Option<WeightType>,
}

/// Progress of [`quantize_file`], in bytes of input tensor data; the binary draws it.
pub trait QuantizeProgress: Sync {
    /// Before the first tensor: the input tensor bytes there are to convert.
    fn start(&self, _total_bytes: u64) {}
    /// One tensor done, with its input bytes.
    fn tensor_done(&self, _name: &str, _bytes: u64) {}
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl QuantizeProgress for NoProgress {}

/// Why a tensor is not in the type it was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// The type asked for (the target, or `keep_output`).
    pub wanted: WeightType,
    /// Its block, which the rows (`dims[0]`) are not a multiple of.
    pub block: usize,
}

/// How one tensor was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorReport {
    pub name: String,
    pub dims: Vec<u64>,
    pub from: GgmlType,
    pub to: GgmlType,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Set when the tensor could not take the type asked for.
    pub fallback: Option<Fallback>,
    /// Whether it went through dequantize and quantize (else its bytes were copied).
    pub converted: bool,
}

/// What [`quantize_file`] did.
#[derive(Debug, Clone)]
pub struct Report {
    pub input: PathBuf,
    pub output: PathBuf,
    pub options: QuantizeOptions,
    /// The name of the tensor `keep_output` applies to, if the model has one.
    pub output_tensor: Option<String>,
    /// `general.file_type` as written.
    pub file_type: u32,
    pub file_bytes_in: u64,
    pub file_bytes_out: u64,
    pub tensors: Vec<TensorReport>,
    /// Some converted matrix was already quantized (not F32/F16/BF16): its error compounds.
    pub source_quantized: bool,
    pub seconds: f64,
}

impl Report {
    /// Tensors written in each type, with their input and output bytes, by type id order.
    pub fn by_type(&self) -> Vec<(GgmlType, usize, u64, u64)> {
        let mut out: Vec<(GgmlType, usize, u64, u64)> = Vec::new();
        for t in &self.tensors {
            match out.iter_mut().find(|e| e.0 == t.to) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += t.bytes_in;
                    e.3 += t.bytes_out;
                }
                None => out.push((t.to, 1, t.bytes_in, t.bytes_out)),
            }
        }
        out.sort_by_key(|e| e.0.id());
        out
    }

    /// The tensors that fell back to another type.
    pub fn fallbacks(&self) -> impl Iterator<Item = &TensorReport> {
        self.tensors.iter().filter(|t| t.fallback.is_some())
    }

    /// The fallbacks grouped by their reason, in the order each reason first occurs.
    pub fn fallback_kinds(&self) -> Vec<FallbackKind<'_>> {
        let mut kinds: Vec<FallbackKind> = Vec::new();
        for t in &self.tensors {
            let Some(fb) = &t.fallback else { continue };
            let kind = FallbackKind {
                wanted: fb.wanted,
                to: t.to,
                row: t.dims.first().copied().unwrap_or(0),
                block: fb.block,
                tensors: vec![t.name.as_str()],
            };
            match kinds.iter_mut().find(|k| k.same_reason(&kind)) {
                Some(k) => k.tensors.push(&t.name),
                None => kinds.push(kind),
            }
        }
        kinds
    }

    /// How many converted tensors were read in each type, in type id order: what a
    /// quantized source's error compounds with.
    pub fn converted_from(&self) -> Vec<(GgmlType, usize)> {
        let mut from: Vec<(GgmlType, usize)> = Vec::new();
        for t in self.tensors.iter().filter(|t| t.converted) {
            match from.iter_mut().find(|(ty, _)| *ty == t.from) {
                Some((_, n)) => *n += 1,
                None => from.push((t.from, 1)),
            }
        }
        from.sort_by_key(|(t, _)| t.id());
        from
    }
}

/// Tensors that fell back for one reason: asked for `wanted`, written as `to`, their rows of
/// `row` values not whole blocks of `block`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackKind<'a> {
    pub wanted: WeightType,
    pub to: GgmlType,
    pub row: u64,
    pub block: usize,
    pub tensors: Vec<&'a str>,
}

impl FallbackKind<'_> {
    fn same_reason(&self, other: &FallbackKind) -> bool {
        (self.wanted, self.to, self.row, self.block)
            == (other.wanted, other.to, other.row, other.block)
    }
}

/// llama.cpp's `LLAMA_FTYPE` for a file whose matrices are mostly `t` (`llama.h`). Uniform
/// Q4_K / Q5_K are the `_S` ("small") mixes' numbers: the `_M` ones promote some matrices to
/// Q6_K, which this does not do.
pub fn llama_file_type(t: WeightType) -> u32 {
    match t {
        WeightType::F32 => 0,
        WeightType::F16 => 1,
        WeightType::Q4_0 => 2,
        WeightType::Q4_1 => 3,
        WeightType::Q8_0 => 7,
        WeightType::Q5_0 => 8,
        WeightType::Q5_1 => 9,
        WeightType::Q4_K => 14,
        WeightType::Q5_K => 16,
        WeightType::Q6_K => 18,
    }
}

/// The type llama.cpp falls back to when rows are not whole blocks of `t`.
fn fallback_for(t: WeightType) -> WeightType {
    match t {
        WeightType::Q4_K => WeightType::Q5_0,
        WeightType::Q5_K => WeightType::Q5_1,
        WeightType::Q6_K => WeightType::Q8_0,
        WeightType::Q8_0
        | WeightType::Q5_0
        | WeightType::Q5_1
        | WeightType::Q4_0
        | WeightType::Q4_1
        | WeightType::F16
        | WeightType::F32 => WeightType::F16,
    }
}

fn ggml(t: WeightType) -> GgmlType {
    match t {
        WeightType::F32 => GgmlType::F32,
        WeightType::F16 => GgmlType::F16,
        WeightType::Q4_0 => GgmlType::Q4_0,
        WeightType::Q4_1 => GgmlType::Q4_1,
        WeightType::Q5_0 => GgmlType::Q5_0,
        WeightType::Q5_1 => GgmlType::Q5_1,
        WeightType::Q8_0 => GgmlType::Q8_0,
        WeightType::Q4_K => GgmlType::Q4_K,
        WeightType::Q5_K => GgmlType::Q5_K,
        WeightType::Q6_K => GgmlType::Q6_K,
    }
}

/// One tensor's plan.
struct Step {
    spec: TensorSpec,
    from: GgmlType,
    /// `Some` when converted: the engine's types of the source and the destination.
    convert: Option<(WeightType, WeightType)>,
    fallback: Option<Fallback>,
}

/// The tensor `keep_output` applies to: `output.weight`, or the tied token embedding.
fn output_tensor(g: &Gguf) -> Option<&str> {
    ["output.weight", "token_embd.weight"]
        .into_iter()
        .find(|n| g.tensor_info(n).is_some())
}

fn plan(g: &Gguf, options: &QuantizeOptions) -> Result<Vec<Step>, QuantizeError> {
    let out_name = output_tensor(g);
    let mut steps = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let is_matrix = t.dims.len() >= 2 && t.name.ends_with("weight");
        let copy = |t: &crate::gguf::TensorInfo| Step {
            spec: TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                dtype: t.dtype,
            },
            from: t.dtype,
            convert: None,
            fallback: None,
        };
        if !is_matrix {
            steps.push(copy(t));
            continue;
        }
        let wanted = match options.keep_output {
            Some(k) if Some(t.name.as_str()) == out_name => k,
            _ => options.target,
        };
        let ne0 = t.dims.first().copied().unwrap_or(1);
        let fits = |w: WeightType| ne0.is_multiple_of(w.block_size() as u64);
        let mut to = wanted;
        while !fits(to) {
            // Ends at F16, whose block of one fits any row.
            to = fallback_for(to);
        }
        let fallback = (to != wanted).then(|| Fallback {
            wanted,
            block: wanted.block_size(),
        });
        if ggml(to) == t.dtype {
            steps.push(Step {
                fallback,
                ..copy(t)
            });
            continue;
        }
        let src = WeightType::from_ggml_id(t.dtype.id()).map_err(|_| {
            QuantizeError::UnsupportedTensorType {
                tensor: t.name.clone(),
                dtype: t.dtype,
            }
        })?;
        steps.push(Step {
            spec: TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                dtype: ggml(to),
            },
            from: t.dtype,
            convert: Some((src, to)),
            fallback,
        });
    }
    Ok(steps)
}

/// The metadata to write: the input's, with the file type and quantization version set.
/// `general.architecture` goes first, as llama.cpp's writers put it.
fn metadata(g: &Gguf, file_type: u32) -> Vec<(String, Value)> {
    let mut kv: Vec<(String, Value)> = g
        .metadata
        .iter()
        .filter(|(k, _)| *k != "general.file_type" && *k != "general.quantization_version")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    kv.sort_by_key(|(k, _)| k != "general.architecture");
    kv.push(("general.file_type".into(), Value::U32(file_type)));
    kv.push(("general.quantization_version".into(), Value::U32(2)));
    kv
}

/// Whether two paths name the same file (the output may not exist yet).
fn same_file(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| {
        p.canonicalize().ok().or_else(|| {
            let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
            let dir = parent.unwrap_or(Path::new(".")).canonicalize().ok()?;
            Some(dir.join(p.file_name()?))
        })
    };
    match (canon(a), canon(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Rows of this many bytes or more are converted in parallel chunks; a tensor smaller than
/// this is converted on one thread (spawning costs more than it saves).
const PAR_MIN_BYTES: usize = 1 << 16;

/// Converts one tensor's bytes from `src` to `dst`, rows in parallel.
fn convert(
    data: &[u8],
    cols: usize,
    src: WeightType,
    dst: WeightType,
) -> Result<Vec<u8>, QuantError> {
    let rb_in = src.row_bytes(cols)?;
    let rb_out = dst.row_bytes(cols)?;
    let rows = data.len() / rb_in.max(1);
    let mut out = vec![0u8; rows * rb_out];
    let one = |row: &mut Vec<f32>, i: &[u8], o: &mut [u8]| {
        quant::dequantize_row(src, i, row)?;
        quant::quantize_row(dst, row, o)
    };
    if data.len() < PAR_MIN_BYTES {
        let mut row = vec![0f32; cols];
        for (i, o) in data.chunks_exact(rb_in).zip(out.chunks_exact_mut(rb_out)) {
            one(&mut row, i, o)?;
        }
    } else {
        data.par_chunks_exact(rb_in)
            .zip(out.par_chunks_exact_mut(rb_out))
            .try_for_each_init(|| vec![0f32; cols], |row, (i, o)| one(row, i, o))?;
    }
    Ok(out)
}

/// Quantizes `input` into `output`; see the module docs. Nothing is written at `output`
/// unless the whole file is.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    options: QuantizeOptions,
    progress: &dyn QuantizeProgress,
) -> Result<Report, QuantizeError> {
    let started = Instant::now();
    if same_file(input, output) {
        return Err(QuantizeError::SameFile {
            path: input.to_owned(),
        });
    }
    let g = Gguf::open(input).map_err(|e| QuantizeError::Open {
        path: input.to_owned(),
        // The path is said once, here.
        source: match e {
            GgufError::InFile { source, .. } => *source,
            other => other,
        },
    })?;
    let steps = plan(&g, &options)?;
    let file_type = llama_file_type(options.target);
    let specs: Vec<TensorSpec> = steps.iter().map(|s| s.spec.clone()).collect();
    let mut writer = GgufWriter::create(output, &metadata(&g, file_type), &specs)?;

    let total: u64 = g.tensors.iter().map(|t| t.n_bytes()).sum();
    progress.start(total);
    let mut tensors = Vec::with_capacity(steps.len());
    let mut source_quantized = false;
    for step in steps {
        let name = step.spec.name;
        let t = g.tensor(&name).map_err(|source| QuantizeError::Tensor {
            tensor: name.clone(),
            source,
        })?;
        let converted = step.convert.is_some();
        let bytes_out = match step.convert {
            None => {
                writer.write_tensor(t.data)?;
                t.data.len() as u64
            }
            Some((src, dst)) => {
                source_quantized |= !matches!(src, WeightType::F32 | WeightType::F16);
                let cols = t.dims.first().copied().unwrap_or(1) as usize;
                let out =
                    convert(t.data, cols, src, dst).map_err(|source| QuantizeError::Convert {
                        tensor: name.clone(),
                        source,
                    })?;
                writer.write_tensor(&out)?;
                out.len() as u64
            }
        };
        progress.tensor_done(&name, t.data.len() as u64);
        tensors.push(TensorReport {
            dims: step.spec.dims,
            from: step.from,
            to: step.spec.dtype,
            bytes_in: t.data.len() as u64,
            bytes_out,
            fallback: step.fallback,
            converted,
            name,
        });
    }
    let file_bytes_out = writer.finish()?;
    let report = Report {
        input: input.to_owned(),
        output: output.to_owned(),
        options,
        output_tensor: output_tensor(&g).map(str::to_owned),
        file_type,
        file_bytes_in: g.bytes().len() as u64,
        file_bytes_out,
        tensors,
        source_quantized,
        seconds: started.elapsed().as_secs_f64(),
    };
    tracing::info!(
        input = %input.display(),
        output = %output.display(),
        target = target_name(options.target),
        bytes_in = report.file_bytes_in,
        bytes_out = report.file_bytes_out,
        seconds = report.seconds,
        "quantized"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::testutil::{GgufBuilder, test_model, test_model_path};
    use crate::model::{LoadOptions, Model};

    fn opts(target: WeightType) -> QuantizeOptions {
        QuantizeOptions {
            target,
            keep_output: None,
        }
    }

    /// Fallbacks grouped by reason in order of first occurrence; converted tensors counted
    /// per source type.
    #[test]
    fn a_report_groups_fallbacks_and_sources() {
        let tensor = |name: &str, row: u64, fallback: Option<usize>, from| TensorReport {
            name: name.into(),
            dims: vec![row, 2],
            from,
            to: if fallback.is_some() {
                GgmlType::Q5_0
            } else {
                GgmlType::Q4_K
            },
            bytes_in: 0,
            bytes_out: 0,
            fallback: fallback.map(|block| Fallback {
                wanted: WeightType::Q4_K,
                block,
            }),
            converted: from != GgmlType::F32,
        };
        let r = Report {
            input: "in.gguf".into(),
            output: "out.gguf".into(),
            options: opts(WeightType::Q4_K),
            output_tensor: None,
            file_type: 15,
            file_bytes_in: 0,
            file_bytes_out: 0,
            tensors: vec![
                tensor("a", 576, Some(256), GgmlType::Q8_0),
                tensor("b", 1536, None, GgmlType::F16),
                tensor("c", 576, Some(256), GgmlType::Q8_0),
                tensor("d", 64, Some(256), GgmlType::F32),
            ],
            source_quantized: true,
            seconds: 0.0,
        };
        let kinds: Vec<(u64, Vec<&str>)> = r
            .fallback_kinds()
            .into_iter()
            .map(|k| (k.row, k.tensors))
            .collect();
        assert_eq!(kinds, [(576, vec!["a", "c"]), (64, vec!["d"])]);
        assert_eq!(
            r.converted_from(),
            [(GgmlType::F16, 1), (GgmlType::Q8_0, 2)]
        );
    }

    /// SmolLM2's rows are 576 wide (not whole super-blocks) except ffn_down's 1536: for Q4_K
    /// every other matrix falls back to Q5_0, the norms stay F32, and the tied embedding is
    /// the output tensor `keep_output` applies to.
    #[test]
    fn smollm2_q4_k_plan_falls_back_per_tensor() {
        let g = test_model();
        let o = QuantizeOptions {
            target: WeightType::Q4_K,
            keep_output: Some(WeightType::Q8_0),
        };
        let steps = plan(g, &o).unwrap();
        assert_eq!(steps.len(), g.tensors.len());
        assert_eq!(output_tensor(g), Some("token_embd.weight"));
        for (s, t) in steps.iter().zip(&g.tensors) {
            assert_eq!(s.spec.name, t.name);
            let want = if t.dims.len() == 1 {
                GgmlType::F32
            } else if t.name == "token_embd.weight" {
                GgmlType::Q8_0
            } else if t.name.ends_with("ffn_down.weight") {
                GgmlType::Q4_K
            } else {
                GgmlType::Q5_0
            };
            assert_eq!(s.spec.dtype, want, "{}", t.name);
            let fell_back = want == GgmlType::Q5_0;
            assert_eq!(s.fallback.is_some(), fell_back, "{}", t.name);
            if let Some(f) = &s.fallback {
                assert_eq!((f.wanted, f.block), (WeightType::Q4_K, 256));
            }
        }
    }

    /// Q8_0 of SmolLM2: the same metadata (but the file type), the same tensors in the same
    /// order and shapes, a file the engine loads, and nothing but the output in the directory.
    #[test]
    fn smollm2_to_q8_0_round_trips_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("q8.gguf");
        let r = quantize_file(
            &test_model_path(),
            &out,
            opts(WeightType::Q8_0),
            &NoProgress,
        )
        .unwrap();
        let (a, b) = (test_model(), Gguf::open(&out).unwrap());
        assert_eq!(r.file_bytes_out, std::fs::metadata(&out).unwrap().len());
        assert!(r.source_quantized, "the test model is Q4_1");
        assert_eq!(r.file_type, 7);
        assert_eq!(r.fallbacks().count(), 0);
        for (k, v) in &a.metadata {
            if k != "general.file_type" {
                assert_eq!(b.get(k), Some(v), "{k}");
            }
        }
        assert_eq!(b.u32("general.file_type").unwrap(), 7);
        assert_eq!(b.u32("general.quantization_version").unwrap(), 2);
        let added = usize::from(a.get("general.quantization_version").is_none());
        assert_eq!(b.metadata.len(), a.metadata.len() + added);
        for (x, y) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!((&x.name, &x.dims), (&y.name, &y.dims));
            let want = if x.dims.len() == 1 {
                x.dtype
            } else {
                GgmlType::Q8_0
            };
            assert_eq!(y.dtype, want, "{}", x.name);
            if x.dims.len() == 1 {
                assert_eq!(
                    a.tensor(&x.name).unwrap().data,
                    b.tensor(&y.name).unwrap().data
                );
            }
        }
        assert_eq!(a.tensors.len(), b.tensors.len());
        // Q8_0 holds Q4_1's 16 levels per block nearly exactly.
        let (x, y) = (
            a.tensor("blk.3.attn_q.weight").unwrap(),
            b.tensor("blk.3.attn_q.weight").unwrap(),
        );
        let mut fx = vec![0f32; 576];
        let mut fy = vec![0f32; 576];
        quant::dequantize_row(
            WeightType::Q4_1,
            &x.data[..WeightType::Q4_1.row_bytes(576).unwrap()],
            &mut fx,
        )
        .unwrap();
        quant::dequantize_row(
            WeightType::Q8_0,
            &y.data[..WeightType::Q8_0.row_bytes(576).unwrap()],
            &mut fy,
        )
        .unwrap();
        let amax = fx.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (p, q) in fx.iter().zip(&fy) {
            assert!((p - q).abs() <= amax / 127.0, "{p} vs {q}");
        }
        Model::from_gguf(&b, LoadOptions::default()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A tensor already in its target type is copied, not re-quantized.
    #[test]
    fn same_type_is_copied() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("q41.gguf");
        let r = quantize_file(
            &test_model_path(),
            &out,
            opts(WeightType::Q4_1),
            &NoProgress,
        )
        .unwrap();
        let (a, b) = (test_model(), Gguf::open(&out).unwrap());
        for (t, rt) in a.tensors.iter().zip(&r.tensors) {
            // The file's one Q8_0 matrix is its embedding.
            let converted = t.name == "token_embd.weight";
            assert_eq!(rt.converted, converted, "{}", t.name);
            if !converted {
                assert_eq!(
                    a.tensor(&t.name).unwrap().data,
                    b.tensor(&t.name).unwrap().data
                );
            }
        }
    }

    #[test]
    fn bad_inputs_are_refused_without_an_output() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let o = opts(WeightType::Q8_0);

        let garbage = dir.path().join("garbage.gguf");
        std::fs::write(&garbage, b"PK\x03\x04 not a model").unwrap();
        let e = quantize_file(&garbage, &out, o, &NoProgress).unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("not a GGUF file"), "{chain}");

        let truncated = dir.path().join("truncated.gguf");
        let bytes = std::fs::read(test_model_path()).unwrap();
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
        let e = quantize_file(&truncated, &out, o, &NoProgress).unwrap_err();
        let source = std::error::Error::source(&e).unwrap().to_string();
        assert!(
            source.contains("out of bounds") || source.contains("truncated"),
            "{source}"
        );

        let bf16 = dir.path().join("bf16.gguf");
        let file = GgufBuilder::new()
            .kv("general.architecture", Value::String("llama".into()))
            .tensor(
                "blk.0.ffn_up.weight",
                &[32, 2],
                GgmlType::BF16.id(),
                vec![0; 128],
            )
            .build();
        std::fs::write(&bf16, file).unwrap();
        let e = quantize_file(&bf16, &out, o, &NoProgress).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "tensor \"blk.0.ffn_up.weight\" has type bf16, which frugal cannot read"
            ),
            "{e}"
        );

        let e = quantize_file(&bf16, &bf16, o, &NoProgress).unwrap_err();
        assert!(matches!(e, QuantizeError::SameFile { .. }), "{e}");
        let dotted = dir.path().join(".").join("bf16.gguf");
        let e = quantize_file(&bf16, &dotted, o, &NoProgress).unwrap_err();
        assert!(matches!(e, QuantizeError::SameFile { .. }), "{e}");

        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    }

    #[test]
    fn type_names() {
        assert_eq!(target_from_name("q4_k").unwrap(), WeightType::Q4_K);
        assert_eq!(target_from_name("Q6_K").unwrap(), WeightType::Q6_K);
        assert_eq!(
            target_from_name("q3_k").unwrap_err().to_string(),
            "unknown type \"q3_k\": expected one of q8_0, q6_k, q5_k, q4_k, q5_1, q5_0, q4_1, q4_0, f16"
        );
        for (n, t) in TARGETS {
            assert_eq!(target_name(t), n);
        }
    }

    /// A fallback chain ends at F16 for rows that are no multiple of 32.
    #[test]
    fn odd_rows_fall_back_to_f16() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("odd.gguf");
        let vals: Vec<u8> = (0..48 * 2)
            .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
            .collect();
        let file = GgufBuilder::new()
            .kv("general.architecture", Value::String("llama".into()))
            .tensor("a.weight", &[48, 2], GgmlType::F32.id(), vals)
            .tensor("a.bias", &[2], GgmlType::F32.id(), vec![0; 8])
            .build();
        std::fs::write(&input, file).unwrap();
        let out = dir.path().join("out.gguf");
        let r = quantize_file(&input, &out, opts(WeightType::Q6_K), &NoProgress).unwrap();
        assert_eq!(r.tensors[0].to, GgmlType::F16);
        assert_eq!(
            r.tensors[0].fallback,
            Some(Fallback {
                wanted: WeightType::Q6_K,
                block: 256
            })
        );
        assert_eq!(r.tensors[1].to, GgmlType::F32);
        assert!(!r.source_quantized);
        let g = Gguf::open(&out).unwrap();
        assert_eq!(g.tensor_info("a.weight").unwrap().dtype, GgmlType::F16);
    }
}
