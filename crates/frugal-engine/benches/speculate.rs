//! Speculative decoding by prompt lookup against plain decoding, in the same run on the same
//! prompts (`data/speculate/prompts.jsonl`): tasks grounded in a text of the prompt
//! (summarize, extract, edit code) and free generation. Each prompt is decoded greedily by
//! an engine that speculates and by one that does not, alternately; decode tokens/s is
//! tokens after the first over the time from the first to the last, best of `--runs`. The
//! outputs must be identical, greedy and seeded: the bench fails otherwise. Then every
//! prompt at once (batched serving), and what one step costs as drafted tokens are added to
//! it.
//!
//! `cargo bench -p frugal-engine --bench speculate -- [MODEL.gguf] [--runs N]` (default: the
//! default model, 2 runs). Figures go to BENCHMARKS.md.

// A benchmark reports on stdout.
#![allow(clippy::print_stdout)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use frugal_engine::gguf::Gguf;
use frugal_engine::model::{Chunk, LoadOptions, Model};
use frugal_engine::prompt::encode_chat;
use frugal_engine::sampling::SamplingParams;
use frugal_engine::scheduler::{Engine, Event, Priority, Request, SchedulerConfig};
use frugal_engine::speculate::Speculate;
use frugal_engine::template::{ChatTemplate, Message};
use frugal_engine::tokenizer::Tokenizer;

type Error = Box<dyn std::error::Error>;

struct Prompt {
    kind: String,
    name: String,
    tokens: Vec<u32>,
    max_tokens: usize,
}

/// One generation: its tokens, and seconds from its first token to its last.
struct Run {
    tokens: Vec<u32>,
    decode: f64,
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let path = args.iter().find(|a| a.ends_with(".gguf")).map_or_else(
        || frugal_testkit::repo(frugal_engine::DEFAULT_MODEL),
        PathBuf::from,
    );
    let runs: usize = match args.iter().position(|a| a == "--runs") {
        Some(i) => args.get(i + 1).ok_or("--runs N")?.parse()?,
        None => 2,
    };
    let g = Gguf::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&g)?;
    let template = ChatTemplate::from_gguf(&g)?;
    let stop_tokens = tokenizer.end_of_generation().to_vec();
    let text = std::fs::read_to_string(frugal_testkit::repo("data/speculate/prompts.jsonl"))?;
    let mut prompts = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let field = |k: &str| v[k].as_str().map(str::to_owned).ok_or(format!("no {k}"));
        let user = [Message::user(field("prompt")?)];
        prompts.push(Prompt {
            kind: field("kind")?,
            name: field("name")?,
            tokens: encode_chat(&tokenizer, &template, &user, true)?,
            max_tokens: v["max_tokens"].as_u64().ok_or("no max_tokens")? as usize,
        });
    }
    let engine = |speculate| -> Result<Engine, Error> {
        let model = Model::from_gguf(&g, LoadOptions::default())?;
        let config = SchedulerConfig {
            speculate,
            // Each run computes its prompt: the comparison is of decoding alone.
            prefix_cache: false,
            ..SchedulerConfig::default()
        };
        Ok(Engine::start(model, config)?)
    };
    let (plain, spec) = (engine(Speculate::None)?, engine(Speculate::Ngram)?);
    println!("{}, {runs} runs, best of each", path.display());
    step_costs(&Model::from_gguf(&g, LoadOptions::default())?)?;

    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let request = |p: &Prompt, sampling| Request {
        prompt: p.tokens.clone(),
        max_tokens: p.max_tokens,
        sampling,
        stop_tokens: stop_tokens.clone(),
        ignore_eos: false,
        priority: Priority::Interactive,
    };
    println!(
        "\n{:<20} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6} {:>9} {:>9}",
        "prompt",
        "kind",
        "prompt",
        "tokens",
        "plain t/s",
        "ngram t/s",
        "ratio",
        "accepted",
        "steps"
    );
    // Per kind: tokens decoded and seconds, plain and speculating.
    let mut totals: Vec<(String, usize, f64, f64)> = Vec::new();
    let mut mismatches = Vec::new();
    for p in &prompts {
        let (mut best_plain, mut best_spec): (Option<Run>, Option<Run>) = (None, None);
        let (before, plain_before) = (counters(&spec), counters(&plain));
        for _ in 0..runs {
            for (engine, best) in [(&plain, &mut best_plain), (&spec, &mut best_spec)] {
                let run = generate(engine, request(p, greedy))?;
                if best.as_ref().is_none_or(|b| run.decode < b.decode) {
                    *best = Some(run);
                }
            }
        }
        let (after, plain_after) = (counters(&spec), counters(&plain));
        let (Some(a), Some(b)) = (best_plain, best_spec) else {
            continue;
        };
        if a.tokens != b.tokens {
            mismatches.push(format!("{} (greedy)", p.name));
        }
        let n = a.tokens.len().saturating_sub(1);
        let (ta, tb) = (n as f64 / a.decode, n as f64 / b.decode);
        let (drafted, accepted) = (after.0 - before.0, after.1 - before.1);
        let steps = |a: (u64, u64, u64), b: (u64, u64, u64)| (b.2 - a.2) / runs as u64;
        println!(
            "{:<20} {:>8} {:>6} {:>6} {:>9.1} {:>9.1} {:>5.2}x {:>4}/{:<4} {:>4}/{:<4}",
            p.name,
            p.kind,
            p.tokens.len(),
            a.tokens.len(),
            ta,
            tb,
            tb / ta,
            accepted,
            drafted,
            steps(before, after),
            steps(plain_before, plain_after),
        );
        match totals.iter_mut().find(|t| t.0 == p.kind) {
            Some(t) => {
                t.1 += n;
                t.2 += a.decode;
                t.3 += b.decode;
            }
            None => totals.push((p.kind.clone(), n, a.decode, b.decode)),
        }
    }
    for (kind, n, a, b) in &totals {
        println!(
            "{kind}: plain {:.1} tok/s, ngram {:.1} tok/s: {:.2}x",
            *n as f64 / a,
            *n as f64 / b,
            a / b
        );
    }

    // Seeded sampling draws once per emitted token either way: the same tokens.
    let seeded = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(7),
        ..SamplingParams::default()
    };
    for p in &prompts {
        let a = generate(&plain, request(p, seeded))?;
        let b = generate(&spec, request(p, seeded))?;
        if a.tokens != b.tokens {
            mismatches.push(format!("{} (seeded)", p.name));
        }
    }
    println!("seeded (temperature 0.8, top_p 0.95): outputs compared");

    // Batched serving: every prompt at once, greedy.
    for (label, engine) in [("plain", &plain), ("ngram", &spec)] {
        let started = Instant::now();
        let rxs = prompts
            .iter()
            .map(|p| engine.submit(request(p, greedy)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut tokens = 0;
        for rx in rxs {
            tokens += collect(rx)?.0.len();
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "batched, {} prompts at once, {label}: {tokens} tokens in {secs:.2} s, {:.1} tok/s",
            prompts.len(),
            tokens as f64 / secs
        );
    }
    if mismatches.is_empty() {
        println!("outputs identical with and without speculation");
        Ok(())
    } else {
        Err(format!("outputs differ: {}", mismatches.join(", ")).into())
    }
}

/// Drafted and accepted tokens, and steps, so far.
fn counters(e: &Engine) -> (u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let st = e.stats();
    (
        st.drafted_tokens.load(Relaxed),
        st.accepted_tokens.load(Relaxed),
        st.steps.load(Relaxed),
    )
}

fn generate(engine: &Engine, request: Request) -> Result<Run, Error> {
    let (tokens, decode) = collect(engine.submit(request)?)?;
    Ok(Run {
        tokens,
        decode: decode.as_secs_f64(),
    })
}

/// A request's tokens, and the time from its first token to its end.
fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<(Vec<u32>, Duration), Error> {
    let mut tokens = Vec::new();
    let mut first = None;
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Admitted { .. } => {}
            Event::Token(s, _) => {
                first.get_or_insert_with(Instant::now);
                tokens.push(s.token);
            }
            Event::Done { .. } => {
                return Ok((tokens, first.map_or(Duration::ZERO, |f| f.elapsed())));
            }
            Event::Failed(e) => return Err(e.into()),
        }
    }
    Err("no Done event".into())
}

/// What a step costs with drafted tokens added: one sequence after 300 positions, and eight
/// decoding together, each with `k` drafted tokens; milliseconds, best of 5.
fn step_costs(model: &Model) -> Result<(), Error> {
    const CONTEXT: u32 = 300;
    let mut caches = common::prefilled(model, 8, CONTEXT)?;
    print!("step ms by drafted tokens per sequence:");
    for batch in [1usize, 8] {
        print!("\n  {batch} sequence(s):");
        for k in [0usize, 1, 2, 3, 4, 7, 8] {
            let tokens: Vec<u32> = (0..=k as u32).map(|i| 2000 + i * 13).collect();
            let mut best = f64::MAX;
            for _ in 0..5 {
                let mut chunks: Vec<Chunk<'_>> = caches[..batch]
                    .iter_mut()
                    .map(|cache| Chunk {
                        tokens: &tokens,
                        cache,
                        logits: k + 1,
                    })
                    .collect();
                let t = Instant::now();
                model.forward(&mut chunks)?;
                best = best.min(t.elapsed().as_secs_f64());
                caches.iter_mut().for_each(|c| c.truncate(CONTEXT as usize));
            }
            print!(" k={k} {:.1}", best * 1e3);
        }
    }
    println!(
        "\na drafted token adds {:.2} of a step, as the engine measures it at start",
        frugal_engine::speculate::draft_cost(model)
    );
    Ok(())
}
