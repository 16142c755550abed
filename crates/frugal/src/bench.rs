//! `frugal bench`: drive an endpoint with the load generator, with a progress bar, and
//! print the summary.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use frugal_cloud::price::ThisMachine;
use frugal_cost::Catalog;
use frugal_cost::present::usd;
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
    let config = BenchConfig {
        url: args.url.clone(),
        model: args.model.as_ref().map(|m| m.served_name()),
        rate,
        timeout: Duration::from_secs(args.timeout),
        distinct: args.distinct,
    };
    let done = Arc::new(Counter::default());
    let bar = Bar::count("requests");
    frugal_cost::Progress::start(&bar, total as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let summary = runtime.block_on(async {
        let tick = async {
            loop {
                bar.set(done.0.load(Ordering::Relaxed), String::new());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            summary = loadgen::run(&config, load, done.clone()) => summary,
            () = tick => unreachable!("the progress ticker never ends"),
        }
    });
    bar.finish();
    let s = summary.map_err(|e| anyhow!(e))?;
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
