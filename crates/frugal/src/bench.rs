//! `frugal bench`: drive an endpoint with the load generator, with a progress bar, and
//! print the summary.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use frugal_cloud::price::ThisMachine;
use frugal_cost::Catalog;
use frugal_cost::money::HourlyRate;
use frugal_cost::present::usd;
use frugal_gateway::loadgen::replay::{self, ReplayConfig};
use frugal_gateway::loadgen::{self, BenchConfig, Counter, Load, Percentiles, Shot};

use crate::cli::BenchArgs;
use crate::progress::Bar;
use crate::serve::machine_rate;
use crate::table;

pub fn run(catalog: &Catalog, args: &BenchArgs) -> Result<()> {
    // The server benched may run anywhere: priced only as given.
    let (rate, _, _) = machine_rate(
        catalog,
        args.price_per_hour.as_deref(),
        args.instance.as_deref(),
        ThisMachine::Nothing,
    )?;
    if let Some(path) = &args.conversations {
        return replay_conversations(args, path, rate);
    }
    let load = match (&args.workload, &args.trace) {
        (Some(path), _) => Load::Open {
            shots: loadgen::workload_shots(path, args.speedup, args.requests)
                .map_err(|e| anyhow!(e))?,
        },
        (None, Some(path)) => Load::Open {
            shots: loadgen::trace_shots(
                path,
                args.speedup,
                args.scale,
                args.output_scale.unwrap_or(args.scale),
                args.max_prompt,
                args.max_output,
                args.requests,
            )
            .map_err(|e| anyhow!(e))?,
        },
        (None, None) => Load::Closed {
            clients: args.concurrency,
            shots: vec![
                Shot {
                    at: 0.0,
                    prompt_words: args.prompt_tokens,
                    max_tokens: args.max_tokens,
                    text: None,
                };
                args.requests
            ],
        },
    };
    let total = match &load {
        Load::Closed { shots, .. } | Load::Open { shots } => shots.len(),
    };
    let config = bench_config(args, rate);
    let done = Arc::new(Counter::default());
    let s = with_progress(total, &done, loadgen::run(&config, load, done.clone()))?;
    if args.json {
        return crate::table::print_json(&s);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} requests ({} errors) in {:.1}s: {:.2} req/s, {:.1} output tok/s; {} prompt + {} output tokens",
        s.requests,
        s.errors,
        s.wall_s,
        s.requests_per_s,
        s.output_tokens_per_s,
        s.prompt_tokens,
        s.output_tokens
    )?;
    let mut t = table::new(&["seconds", "p50>", "p90>", "p99>", "mean>"]);
    let row = |name: &str, p: &Percentiles| {
        vec![
            name.to_owned(),
            format!("{:.3}", p.p50),
            format!("{:.3}", p.p90),
            format!("{:.3}", p.p99),
            format!("{:.3}", p.mean),
        ]
    };
    // Unstreamed requests (a workload's) have no first token to time.
    if s.ttft.mean > 0.0 {
        t.add_row(row("time to first token", &s.ttft));
        t.add_row(row("time per output token", &s.tpot));
    }
    t.add_row(row("latency", &s.latency));
    writeln!(out, "{t}")?;
    let unit =
        |m: Option<frugal_cost::Money>| m.map_or("-".into(), frugal_cost::present::usd_per_1m);
    if rate.0 > frugal_cost::Money::ZERO {
        writeln!(
            out,
            "at {}/h: {} for the run, {} per 1,000 requests, {} per 1M tokens",
            usd(rate.0),
            usd(s.cost),
            unit(s.cost_per_1k_requests),
            unit(s.cost_per_1m_tokens)
        )?;
    }
    if let Some(metered) = s.metered_cost {
        writeln!(
            out,
            "the responses say they cost {} in all, {} per 1,000 requests",
            usd(metered),
            unit(s.metered_per_1k_requests)
        )?;
    }
    let counts = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !s.cache.is_empty() {
        writeln!(out, "cache: {}", counts(&s.cache))?;
    }
    if !s.routes.is_empty() {
        writeln!(out, "routes: {}", counts(&s.routes))?;
    }
    for e in &s.error_samples {
        writeln!(out, "error: {e}")?;
    }
    Ok(())
}

fn bench_config(args: &BenchArgs, rate: HourlyRate) -> BenchConfig {
    BenchConfig {
        url: args.url.clone(),
        model: args.model.as_ref().map(|m| m.served_name()),
        rate,
        timeout: Duration::from_secs(args.timeout),
        distinct: args.distinct,
    }
}

/// Runs `work` under a progress bar counting `done` up to `total` requests.
fn with_progress<T>(
    total: usize,
    done: &Counter,
    work: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T> {
    let bar = Bar::count("requests");
    frugal_cost::Progress::start(&bar, total as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let out = runtime.block_on(async {
        let tick = async {
            loop {
                bar.set(done.0.load(Ordering::Relaxed), String::new());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            out = work => out,
            () = tick => unreachable!("the progress ticker never ends"),
        }
    });
    bar.finish();
    out.map_err(|e| anyhow!(e))
}

/// `--conversations`: the multi-turn replay, its table or JSON, and the transcripts if asked.
fn replay_conversations(args: &BenchArgs, path: &std::path::Path, rate: HourlyRate) -> Result<()> {
    let conversations = replay::conversations(path, args.requests).map_err(|e| anyhow!(e))?;
    let system = args
        .system_prompt
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display())))
        .transpose()?;
    let arrivals = args
        .trace
        .as_ref()
        .map(|p| {
            loadgen::trace_shots(p, args.speedup, 1.0, 1.0, 1, 1, conversations.len())
                .map(|shots| shots.iter().map(|s| s.at).collect::<Vec<_>>())
        })
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let config = ReplayConfig {
        bench: bench_config(args, rate),
        system,
        max_turns: args.turns,
        max_prompt: args.max_prompt,
        max_tokens: args.max_tokens,
        in_flight: args.concurrency,
        arrivals,
    };
    // Turns sent at most: the bar's end.
    let total = conversations
        .iter()
        .map(|c| c.turns.len().min(args.turns.max(1)))
        .sum();
    let done = Arc::new(Counter::default());
    let (s, transcripts) = with_progress(
        total,
        &done,
        replay::run(&config, conversations, done.clone()),
    )?;
    if let Some(path) = &args.transcript {
        let mut text = String::new();
        for t in &transcripts {
            text.push_str(&serde_json::to_string(t)?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        return crate::table::print_json(&s);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} conversations, {} turns ({} errors) in {:.1}s: {:.1} output tok/s",
        s.conversations, s.requests, s.errors, s.wall_s, s.output_tokens_per_s
    )?;
    let mut t = table::new(&["", "p50>", "p90>", "p99>", "mean>"]);
    let row = |name: &str, p: &Percentiles, digits: usize| {
        [p.p50, p.p90, p.p99, p.mean]
            .iter()
            .fold(vec![name.to_owned()], |mut row, v| {
                row.push(format!("{v:.digits$}"));
                row
            })
    };
    t.add_row(row("first-turn TTFT, s", &s.first_turn_ttft, 3));
    t.add_row(row(
        &format!("later-turn TTFT, s ({} turns)", s.later_turns),
        &s.later_turn_ttft,
        3,
    ));
    t.add_row(row("decode tok/s per stream", &s.decode_tok_s, 1));
    writeln!(out, "{t}")?;
    let cached = if s.cache_reported {
        format!("{} cached", s.cached_tokens)
    } else {
        "the server reported no cached tokens".to_owned()
    };
    writeln!(
        out,
        "prompt tokens {}: {} computed, {cached}; {} output tokens",
        s.prompt_tokens, s.prefill_tokens, s.output_tokens
    )?;
    if rate.0 > frugal_cost::Money::ZERO {
        writeln!(
            out,
            "at {}/h: {} for the run, {} per 1,000 requests",
            usd(rate.0),
            usd(s.cost),
            s.cost_per_1k_requests
                .map_or("-".into(), frugal_cost::present::usd_per_1m)
        )?;
    }
    for e in &s.error_samples {
        writeln!(out, "error: {e}")?;
    }
    Ok(())
}
