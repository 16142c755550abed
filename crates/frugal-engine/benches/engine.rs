//! Whole-model throughput, as llama-bench measures it: prefill of 128 tokens (pp128) and
//! 128 decode steps of one sequence (tg128), plus batched decode at 4, 8 and 16 sequences,
//! and 16 sequences decoding after 512-token prompts (where attention over the cache is a
//! large part of each step).
//!
//! `cargo bench -p frugal-engine --bench engine -- MODEL.gguf [--quant TYPE] [--kv q8_0] [--threads N]`
//! (default: the default model as stored, one thread per core; TYPE a GGML type name such as
//! q8_0, q4_k), on the kernel that
//! `FRUGAL_ISA=avx512|avx2|scalar` names (default: the one `frugal serve` would run, chosen
//! by measurement at start or from its cache; `FRUGAL_CALIBRATE=1` measures again;
//! `FRUGAL_PREFETCH=l1|l2` fixes the weight prefetch). `--tg-only` runs tg128 alone 20 times
//! (for profiling a single stream) and prints the mean, median and best. Figures
//! go to BENCHMARKS.md beside llama.cpp's.

// A benchmark reports on stdout.
#![allow(clippy::print_stdout)]

mod common;

use std::path::PathBuf;
use std::time::Instant;

use frugal_engine::gguf::Gguf;
use frugal_engine::model::{Calibrate, Chunk, KvCache, KvType, LoadOptions, Model};
use frugal_engine::quant::{Kernel, Prefetch, WeightType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let path = args.iter().find(|a| a.ends_with(".gguf")).map_or_else(
        || frugal_testkit::repo(frugal_engine::DEFAULT_MODEL),
        PathBuf::from,
    );
    Kernel::select_from_env()?;
    Prefetch::set_from_env()?;
    let requantize = match args
        .iter()
        .position(|a| a == "--quant")
        .and_then(|i| args.get(i + 1))
    {
        Some(name) => Some(
            WeightType::ALL
                .into_iter()
                .find(|t| t.name().eq_ignore_ascii_case(name))
                .ok_or_else(|| format!("unknown type {name}"))?,
        ),
        None => None,
    };
    let kv = match args
        .iter()
        .position(|a| a == "--kv")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
    {
        Some("q8_0") => KvType::Q8_0,
        Some("f32") | None => KvType::F32,
        Some(other) => return Err(format!("unknown --kv {other}: f32 or q8_0").into()),
    };
    let threads = match args.iter().position(|a| a == "--threads") {
        Some(i) => Some(
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .ok_or("--threads takes a number")?,
        ),
        None => None,
    };
    let g = Gguf::open(&path)?;
    let model = Model::from_gguf(
        &g,
        LoadOptions {
            requantize,
            threads,
            kv,
        },
    )?;
    let started = Instant::now();
    let kernels = model.calibrate(&Calibrate::from_env());
    println!(
        "{} ({:.0} MB of weights{}, {} KV cache)\n{kernels} (in {:.0} ms)",
        path.display(),
        model.weight_bytes() as f64 / 1e6,
        requantize.map_or(String::new(), |q| format!(", requantized to {q}")),
        kv.name(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let prompt: Vec<u32> = (0..128).map(|i| 1000 + (i * 37) % 20000).collect();
    // `--tg-only`: tg128 alone, 20 times (for profiling it).
    if args.iter().any(|a| a == "--tg-only") {
        let mut secs = 0.0;
        let mut each = Vec::new();
        for _ in 0..20 {
            let mut cache = KvCache::new(&model.config);
            let _ = model.forward(&mut [Chunk {
                tokens: &prompt[..8],
                cache: &mut cache,
                logits: 0,
            }]);
            let s = decode(&model, &mut [cache], 128);
            each.push(128.0 / s);
            secs += s;
        }
        each.sort_by(f64::total_cmp);
        println!(
            "tg128 x 20: {:.0} tok/s, median {:.0}, best {:.0}",
            20.0 * 128.0 / secs,
            each[10],
            each[19]
        );
        return Ok(());
    }
    let best =
        |runs: usize, f: &mut dyn FnMut() -> f64| (0..runs).map(|_| f()).fold(f64::MAX, f64::min);

    let pp = best(5, &mut || {
        let mut cache = KvCache::new(&model.config);
        let t = Instant::now();
        let _ = model.forward(&mut [Chunk {
            tokens: &prompt,
            cache: &mut cache,
            logits: 1,
        }]);
        t.elapsed().as_secs_f64()
    });
    println!("pp128: {:.0} tok/s", 128.0 / pp);

    for batch in [1usize, 4, 8, 16] {
        let secs = best(3, &mut || {
            let mut caches: Vec<KvCache> =
                (0..batch).map(|_| KvCache::new(&model.config)).collect();
            // A short prompt each, then 128 steps of one token per sequence.
            for c in caches.iter_mut() {
                let _ = model.forward(&mut [Chunk {
                    tokens: &prompt[..8],
                    cache: c,
                    logits: 0,
                }]);
            }
            decode(&model, &mut caches, 128)
        });
        let label = if batch == 1 {
            "tg128".to_owned()
        } else {
            format!("decode B={batch}")
        };
        println!("{label}: {:.0} tok/s", 128.0 * batch as f64 / secs);
    }

    let mut caches = common::prefilled(&model, 16, 512)?;
    let secs = best(3, &mut || decode(&model, &mut caches, 16));
    println!("decode B=16 after 512: {:.0} tok/s", 16.0 * 16.0 / secs);
    Ok(())
}

/// Seconds for `steps` decode steps of one token for every cache.
fn decode(model: &Model, caches: &mut [KvCache], steps: u32) -> f64 {
    let t = Instant::now();
    for step in 0..steps {
        let tokens: Vec<[u32; 1]> = (0..caches.len() as u32)
            .map(|b| [1000 + step * 7 + b])
            .collect();
        let mut chunks: Vec<Chunk<'_>> = tokens
            .iter()
            .zip(caches.iter_mut())
            .map(|(t, c)| Chunk {
                tokens: t,
                cache: c,
                logits: 1,
            })
            .collect();
        let _ = model.forward(&mut chunks);
    }
    t.elapsed().as_secs_f64()
}
