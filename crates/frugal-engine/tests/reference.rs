//! The engine against an independent implementation (candle-transformers'
//! `quantized_llama` on the default model, `quantized_qwen2` on the larger tier), and
//! batching against running alone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::path::{Path, PathBuf};

use frugal_engine::gguf::Gguf;
use frugal_engine::model::{Chunk, KvCache, LoadOptions, Model};
use frugal_engine::template::{ChatTemplate, Message};
use frugal_engine::tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    frugal_testkit::test_model(frugal_engine::DEFAULT_MODEL)
}

fn prompts(g: &Gguf) -> Vec<Vec<u32>> {
    let tok = Tokenizer::from_gguf(g).unwrap();
    let template = ChatTemplate::from_gguf(g).unwrap();
    let chat = template
        .render(&[Message::user("What is the capital of France?")], true)
        .unwrap();
    [
        chat.as_str(),
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:",
    ]
    .iter()
    .map(|p| tok.encode(p).unwrap())
    .collect()
}

fn large_model_path() -> PathBuf {
    frugal_testkit::model(frugal_engine::LARGE_MODEL)
}

fn candle_input(tokens: &[u32]) -> candle_core::Tensor {
    candle_core::Tensor::new(tokens, &candle_core::Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap()
}

fn candle_llama(path: &Path, tokens: &[u32]) -> Vec<f32> {
    use candle_transformers::models::quantized_llama::ModelWeights;
    let mut file = std::fs::File::open(path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut model = ModelWeights::from_gguf(content, &mut file, &candle_core::Device::Cpu).unwrap();
    let logits = model.forward(&candle_input(tokens), 0).unwrap();
    logits.squeeze(0).unwrap().to_vec1::<f32>().unwrap()
}

fn candle_qwen2(path: &Path, tokens: &[u32]) -> Vec<f32> {
    use candle_transformers::models::quantized_qwen2::ModelWeights;
    let mut file = std::fs::File::open(path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut model = ModelWeights::from_gguf(content, &mut file, &candle_core::Device::Cpu).unwrap();
    let logits = model.forward(&candle_input(tokens), 0).unwrap();
    logits.squeeze(0).unwrap().to_vec1::<f32>().unwrap()
}

fn ours(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = KvCache::new(&model.config);
    let mut chunks = [Chunk {
        tokens,
        cache: &mut cache,
        logits: 1,
    }];
    model.forward(&mut chunks).unwrap().remove(0)
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |best, (i, x)| if *x > v[best] { i } else { best })
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Against candle, and both against the exact logits of the same weights (dequantized to
/// f32, f32 activations): both quantize activations to 8 bits inside their kernels, so
/// neither matches the exact logits bit for bit. Ours must stay within 1.5x candle's own
/// error plus 0.1, agree with candle within 6% of the logit spread, and pick candle's greedy
/// token (8-bit activations can move a near tie away from the exact argmax, in both).
#[test]
fn logits_match_candle_quantized_llama() {
    let path = model_path();
    let mut all = vec![vec![504u32], vec![504, 3575, 282, 4649]];
    all.extend(prompts(&Gguf::open(&path).unwrap()));
    check_against_candle(&path, candle_llama, all, STRICT);
}

/// SmolLM2 written by `frugal quantize` in each type (from its Q4_1 file; rows of 576 take
/// llama.cpp's fallbacks for the K types) is read by candle and computes the logits candle
/// computes from the same file: the writer's layout and the quantizers' blocks are what an
/// independent GGUF reader expects. Candle strays further from the exact logits on 4-bit K
/// blocks (2.6 of a spread of 37 on Q4_K, where ours stays under 0.9), so the two may differ
/// by 10% of the spread here, and either may flip a near tie of the exact logits (0.012 apart
/// on the chat prompt at Q4_K, where candle does). Which of the two lands nearer the exact
/// logits varies by type and prompt (ours 1.57 against candle's 0.94 at Q5_0, 0.83 against
/// 2.60 at Q4_K): ours may be twice as far, where the shipped files' test allows 1.5 times.
#[test]
fn requantized_files_match_candle_for_each_type() {
    use frugal_engine::quant::WeightType;
    use frugal_engine::quantize::{NoProgress, QuantizeOptions, quantize_file};
    let dir = tempfile::tempdir().unwrap();
    let input = model_path();
    let all = prompts(&Gguf::open(&input).unwrap());
    for target in [
        WeightType::Q8_0,
        WeightType::Q6_K,
        WeightType::Q5_K,
        WeightType::Q4_K,
        WeightType::Q5_1,
        WeightType::Q5_0,
        WeightType::Q4_0,
    ] {
        let path = dir.path().join(format!("{target}.gguf"));
        let options = QuantizeOptions {
            target,
            keep_output: None,
        };
        quantize_file(&input, &path, options, &NoProgress).unwrap();
        eprintln!("{target}:");
        let tolerance = Tolerance {
            err_ratio: 2.0,
            agree: 0.1,
            same_token: false,
        };
        check_against_candle(&path, candle_llama, all.clone(), tolerance);
        std::fs::remove_file(&path).unwrap();
    }
}

/// The qwen2 family (attention biases, half-split RoPE, untied output, 14 heads over 2 KV
/// heads) on a Q4_K_M file whose Q5_0 / Q4_K / Q6_K / Q8_0 matrices each run natively (the
/// fused Q, K, V of half the layers stacks Q5_0 and Q8_0 parts).
#[test]
fn logits_match_candle_quantized_qwen2() {
    let path = large_model_path();
    let all = prompts(&Gguf::open(&path).unwrap());
    check_against_candle(&path, candle_qwen2, all, STRICT);
}

/// A K-quant file stays resident at its own size: the weights held are within 3% of the
/// file's bytes (tile padding, Q4_K's unpacked scales), where re-quantizing to Q8_0 at load
/// took 650 MB for this 491 MB file.
#[test]
fn qwen2_q4_k_m_loads_at_its_own_size() {
    let path = large_model_path();
    let g = Gguf::open(&path).unwrap();
    let model = Model::from_gguf(&g, LoadOptions::default()).unwrap();
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    let held = model.weight_bytes() as f64;
    eprintln!("{held:.0} bytes held for a {file:.0}-byte file");
    assert!(held < 1.03 * file && held > 0.9 * file, "{held} vs {file}");
}

/// Each natively run type against the exact f32 logits of the same weights: the default
/// model re-quantized at load to every type, then the same matrices dequantized to F32. The
/// only difference is the kernels' 8-bit activations, so the error may be no larger than
/// that of the file's own Q4_1 kernel (which the candle test pins) by more than half, and
/// the greedy token is the exact one or within a near tie of it.
#[test]
fn every_native_type_matches_its_f32_weights() {
    use frugal_engine::quant::WeightType;
    let path = model_path();
    let g = Gguf::open(&path).unwrap();
    let all = prompts(&g);
    let load = |requantize| {
        let options = LoadOptions {
            requantize,
            ..LoadOptions::default()
        };
        let model = Model::from_gguf(&g, options).unwrap();
        let exact = Model::from_gguf(&g, options)
            .unwrap()
            .requantize(WeightType::F32)
            .unwrap();
        (model, exact)
    };
    let (model, exact) = load(None);
    let base: Vec<f32> = all
        .iter()
        .map(|t| max_diff(&ours(&model, t), &ours(&exact, t)))
        .collect();
    for t in [
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ] {
        let (model, exact) = load(Some(t));
        for (tokens, base) in all.iter().zip(&base) {
            let (mine, want) = (ours(&model, tokens), ours(&exact, tokens));
            let err = max_diff(&mine, &want);
            eprintln!(
                "{t} {:>3} tokens: |ours - exact| {err:.3} (Q4_1: {base:.3})",
                tokens.len()
            );
            assert!(err <= 1.5 * base + 0.1, "{t}: {err} against Q4_1's {base}");
            // 8-bit activations may flip a near tie, no more.
            let best = want[argmax(&want)];
            assert!(want[argmax(&mine)] >= best - 0.5, "{t}: greedy token off");
        }
    }
}

/// The types `every_isa_computes_the_same_logits` runs on each kernel.
const ISA_TYPES: [&str; 4] = ["Q4_1", "Q4_K", "Q6_K", "Q5_1"];

/// Every kernel the CPU has, each in a process of its own (the choice is once per process,
/// as `FRUGAL_ISA` makes it), gives the same logits up to float rounding: their integer dots
/// are identical, and only the float operations after them differ (AVX2 and AVX-512 do the
/// same ones, the scalar kernel no FMA). Rounding grows through the layers, as a last-bit
/// change can move an activation's 8-bit quant by one step, so the bound is the one the
/// candle test sets between two implementations: 6% of the logit spread.
#[test]
fn every_isa_computes_the_same_logits() {
    use frugal_engine::quant::Kernel;
    let runs: Vec<(Kernel, Vec<Vec<f32>>)> = [Kernel::Avx512Vnni, Kernel::Avx2, Kernel::Scalar]
        .into_iter()
        .filter(|k| k.is_available())
        .map(|k| {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "logits_on_one_isa",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("FRUGAL_TEST_ISA", k.name())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{k}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let logits = String::from_utf8_lossy(&out.stdout)
                .lines()
                // The harness's "test ... " may start the first line.
                .filter_map(|l| l.split_once("logits ").map(|(_, v)| v))
                .map(|l| l.split(' ').map(|v| v.parse().unwrap()).collect())
                .collect::<Vec<Vec<f32>>>();
            assert_eq!(logits.len(), ISA_TYPES.len(), "{k}");
            (k, logits)
        })
        .collect();
    let (first, want) = &runs[0];
    for (k, got) in &runs[1..] {
        for ((t, a), b) in ISA_TYPES.iter().zip(got).zip(want) {
            let err = max_diff(a, b);
            let spread = b.iter().copied().fold(f32::MIN, f32::max)
                - b.iter().copied().fold(f32::MAX, f32::min);
            eprintln!("{t}: |{k} - {first}| {err:.3}, spread {spread:.1}");
            assert!(err < 0.06 * spread, "{t}: {k} against {first}: {err}");
        }
    }
}

/// The child of `every_isa_computes_the_same_logits`: does nothing unless it names a kernel.
#[test]
#[allow(clippy::print_stdout)]
fn logits_on_one_isa() {
    use frugal_engine::quant::{Kernel, WeightType};
    let Ok(name) = std::env::var("FRUGAL_TEST_ISA") else {
        return;
    };
    Kernel::from_name(&name).unwrap().select().unwrap();
    let g = Gguf::open(model_path()).unwrap();
    let tokens = &prompts(&g)[1];
    for t in ISA_TYPES {
        let requantize = WeightType::ALL.into_iter().find(|w| w.name() == t);
        let options = LoadOptions {
            requantize,
            ..LoadOptions::default()
        };
        let logits = ours(&Model::from_gguf(&g, options).unwrap(), tokens);
        let text: Vec<String> = logits.iter().map(f32::to_string).collect();
        println!("logits {}", text.join(" "));
    }
}

fn check_against_candle(
    path: &Path,
    candle: fn(&Path, &[u32]) -> Vec<f32>,
    all: Vec<Vec<u32>>,
    tolerance: Tolerance,
) {
    let g = Gguf::open(path).unwrap();
    let model = Model::from_gguf(&g, LoadOptions::default()).unwrap();
    let exact_model = Model::from_gguf(
        &g,
        LoadOptions {
            requantize: Some(frugal_engine::quant::WeightType::F32),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    for tokens in all {
        let reference = candle(path, &tokens);
        let mine = ours(&model, &tokens);
        let exact = ours(&exact_model, &tokens);
        let spread = exact.iter().copied().fold(f32::MIN, f32::max)
            - exact.iter().copied().fold(f32::MAX, f32::min);
        let (theirs_err, ours_err, between) = (
            max_diff(&reference, &exact),
            max_diff(&mine, &exact),
            max_diff(&mine, &reference),
        );
        eprintln!(
            "{:>3} tokens: |ours - exact| {ours_err:.3}, |candle - exact| {theirs_err:.3}, |ours - candle| {between:.3}, spread {spread:.1}",
            tokens.len()
        );
        assert!(
            ours_err <= tolerance.err_ratio * theirs_err + 0.1,
            "ours {ours_err} vs candle {theirs_err}"
        );
        assert!(
            between < tolerance.agree * spread,
            "{between} over a spread of {spread}"
        );
        if tolerance.same_token {
            assert_eq!(argmax(&reference), argmax(&mine));
        } else {
            // Either may flip a near tie of the exact logits, no more.
            let best = exact[argmax(&exact)];
            assert!(
                exact[argmax(&mine)] >= best - 0.5,
                "our greedy token is off"
            );
            assert!(
                exact[argmax(&reference)] >= best - 0.5,
                "candle's greedy token is off"
            );
        }
    }
}

/// How close ours and candle's logits must be.
struct Tolerance {
    /// How many times candle's distance from the exact logits ours may be (plus 0.1).
    err_ratio: f32,
    /// Their largest difference, as a share of the exact logits' spread.
    agree: f32,
    /// Whether both must pick the same greedy token (else each within a near tie of the
    /// exact one).
    same_token: bool,
}

/// On the shipped files: within 6% and the same token.
const STRICT: Tolerance = Tolerance {
    err_ratio: 1.5,
    agree: 0.06,
    same_token: true,
};

/// A sequence decoded in a batch with others, and with its prompt prefilled in chunks,
/// yields the same greedy tokens as alone.
#[test]
fn batching_does_not_change_greedy_tokens() {
    let g = Gguf::open(model_path()).unwrap();
    let model = Model::from_gguf(&g, LoadOptions::default()).unwrap();
    let ps = prompts(&g);
    let decode_alone = |tokens: &[u32], steps: usize| {
        let mut cache = KvCache::new(&model.config);
        let mut next = argmax(
            &model
                .forward(&mut [Chunk {
                    tokens,
                    cache: &mut cache,
                    logits: 1,
                }])
                .unwrap()[0],
        ) as u32;
        let mut out = vec![next];
        for _ in 1..steps {
            let t = [next];
            next = argmax(
                &model
                    .forward(&mut [Chunk {
                        tokens: &t,
                        cache: &mut cache,
                        logits: 1,
                    }])
                    .unwrap()[0],
            ) as u32;
            out.push(next);
        }
        out
    };
    let alone: Vec<Vec<u32>> = ps.iter().map(|p| decode_alone(p, 12)).collect();
    // Together: the first prompt in chunks of 5 while the others are prefilled whole.
    let mut caches: Vec<KvCache> = ps.iter().map(|_| KvCache::new(&model.config)).collect();
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); ps.len()];
    let mut fed = vec![0usize; ps.len()];
    while outs.iter().any(|o| o.len() < 12) {
        let mut pieces: Vec<Vec<u32>> = Vec::new();
        let mut wants = Vec::new();
        for (i, p) in ps.iter().enumerate() {
            if fed[i] < p.len() {
                let n = if i == 0 {
                    5.min(p.len() - fed[i])
                } else {
                    p.len()
                };
                pieces.push(p[fed[i]..fed[i] + n].to_vec());
                fed[i] += n;
                wants.push(fed[i] == p.len());
            } else {
                pieces.push(vec![*outs[i].last().unwrap()]);
                wants.push(true);
            }
        }
        let mut chunks: Vec<Chunk<'_>> = pieces
            .iter()
            .zip(caches.iter_mut())
            .zip(&wants)
            .map(|((t, c), w)| Chunk {
                tokens: t,
                cache: c,
                logits: usize::from(*w),
            })
            .collect();
        let logits = model.forward(&mut chunks).unwrap();
        let mut rows = logits.iter();
        for (i, w) in wants.iter().enumerate() {
            if *w {
                let row = rows.next().unwrap();
                if outs[i].len() < 12 {
                    outs[i].push(argmax(row) as u32);
                }
            }
        }
    }
    assert_eq!(outs, alone);
}

/// An 8-bit KV cache, filled in pieces across its growth, gives logits within 6% of the
/// logit spread of the exact cache's at every step (the bound set between two
/// implementations above; `frugal eval ppl --kv q8_0` reads a mean KL divergence of 0.003,
/// as Q8_0 weights do), the same greedy token at nearly every step, and a quarter of its
/// bytes per position.
#[test]
fn an_8_bit_kv_cache_keeps_the_logits() {
    use frugal_engine::model::KvType;
    let g = Gguf::open(model_path()).unwrap();
    let load = |kv| {
        Model::from_gguf(
            &g,
            LoadOptions {
                kv,
                ..LoadOptions::default()
            },
        )
        .unwrap()
    };
    let (exact, q8) = (load(KvType::F32), load(KvType::Q8_0));
    let c = &q8.config;
    let ratio =
        KvType::F32.bytes_per_position(c) as f64 / KvType::Q8_0.bytes_per_position(c) as f64;
    assert!((3.5..4.0).contains(&ratio), "{ratio}");
    // A long input, fed 37 tokens at a time (the cache grows from 0 past 64, 96, 144, ...).
    let tokens: Vec<u32> = prompts(&g).concat().repeat(4);
    assert!(tokens.len() > 150, "{}", tokens.len());
    let (mut ce, mut cq) = (KvCache::new(&exact.config), KvCache::new(&q8.config));
    let (mut steps, mut same) = (0, 0);
    for piece in tokens.chunks(37) {
        let step = |m: &Model, cache: &mut KvCache| {
            m.forward(&mut [Chunk {
                tokens: piece,
                cache,
                logits: 1,
            }])
            .unwrap()
            .remove(0)
        };
        let (a, b) = (step(&exact, &mut ce), step(&q8, &mut cq));
        let spread =
            a.iter().copied().fold(f32::MIN, f32::max) - a.iter().copied().fold(f32::MAX, f32::min);
        assert!(
            max_diff(&a, &b) < 0.06 * spread,
            "{} over {spread}",
            max_diff(&a, &b)
        );
        steps += 1;
        same += usize::from(argmax(&a) == argmax(&b));
    }
    assert_eq!(cq.len(), tokens.len());
    assert!(same * 10 >= steps * 9, "{same} of {steps}");
}

/// A cache sharing another's first positions (as the prefix cache hands them out) gives
/// every logit bit for bit as a cache computed whole, wherever the split falls in a block,
/// with exact and 8-bit KV; writing into the shared cache leaves the original's blocks as
/// they were.
#[test]
fn a_shared_prefix_gives_the_logits_of_a_cache_computed_whole() {
    use frugal_engine::model::KvType;
    let g = Gguf::open(model_path()).unwrap();
    let tokens: Vec<u32> = prompts(&g).concat().repeat(6);
    let n = tokens.len();
    assert!(n > 140, "{n}");
    for kv in [KvType::F32, KvType::Q8_0] {
        let options = LoadOptions {
            kv,
            ..LoadOptions::default()
        };
        let model = Model::from_gguf(&g, options).unwrap();
        let run = |cache: &mut KvCache, part: &[u32]| {
            model
                .forward(&mut [Chunk {
                    tokens: part,
                    cache,
                    logits: 1,
                }])
                .unwrap()
                .remove(0)
        };
        let mut whole = KvCache::new(&model.config);
        let want = run(&mut whole, &tokens);
        for split in [1, 63, 64, 65, 127, 128, n - 1] {
            let mut shared = whole.prefix(split);
            assert_eq!(shared.len(), split);
            let got = run(&mut shared, &tokens[split..]);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kv:?} split {split}: {}",
                max_diff(&got, &want)
            );
            // The shared cache went on with other tokens; the original still answers alike.
            let mut other = whole.prefix(split);
            let _ = run(&mut other, &[7, 8, 9]);
            let mut again = whole.prefix(split);
            assert_eq!(
                run(&mut again, &tokens[split..]),
                want,
                "{kv:?} split {split}"
            );
        }
    }
}
