//! `frugal report`: cost per unit of work, savings with the quality kept, pools and servers.

use std::io::Write;

use anyhow::{Context, Result};
use frugal_cost::import::parse_ts;
use frugal_cost::present::{interval, pct, pct1, thousands, usd, usd_unit};
use frugal_cost::report::{
    ErrorBudgets, Options, PoolLine, QUALITY_HEAD, QUALITY_NOTE, Report, RightSizing, ServerLine,
    Spend, WrongHits, utilization_note,
};
use frugal_cost::{Catalog, Ledger, Money, Window};

use crate::cli::ReportArgs;
use crate::config::Config;
use crate::table::{self, date};
use frugal_gateway::config::RawServe;

/// `--since`/`--until`: a timestamp, or an age before now such as `7d`, `12h`, `30m`.
fn parse_bound(text: &str, now_ms: i64) -> Result<i64> {
    let t = text.trim();
    let unit = match t.chars().last() {
        Some('d') => Some(86_400_000),
        Some('h') => Some(3_600_000),
        Some('m') => Some(60_000),
        _ => None,
    };
    let number = t
        .get(..t.len().saturating_sub(1))
        .and_then(|n| n.parse::<f64>().ok());
    if let (Some(unit), Some(n)) = (unit, number) {
        return Ok(now_ms - (n * unit as f64) as i64);
    }
    parse_ts(t).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The window of `--since` and `--until` (`frugal report`'s, and `frugal plan`'s).
pub(super) fn window(since: Option<&str>, until: Option<&str>) -> Result<Window> {
    let now = chrono::Utc::now().timestamp_millis();
    Ok(Window {
        since_ms: since
            .map(|s| parse_bound(s, now))
            .transpose()
            .context("--since")?,
        until_ms: until
            .map(|s| parse_bound(s, now))
            .transpose()
            .context("--until")?,
    })
}

/// The semantic cache's bounds as `frugal serve` reads them: `[serve]`'s, and each upstream's,
/// pool's and route's own (its hits are billed under its name).
fn error_budgets(s: &RawServe) -> ErrorBudgets {
    let own = |name: &String, b: Option<f64>| Some((name.clone(), b?));
    ErrorBudgets {
        default: Some(
            s.semantic_max_error
                .unwrap_or(frugal_semantic::budget::DEFAULT_MAX_ERROR),
        ),
        by_model: s
            .upstream
            .iter()
            .filter_map(|u| own(&u.name, u.semantic_max_error))
            .chain(
                s.pool
                    .iter()
                    .filter_map(|p| own(&p.name, p.semantic_max_error)),
            )
            .chain(
                s.route
                    .iter()
                    .filter_map(|r| own(&r.name, r.semantic_max_error)),
            )
            .collect(),
    }
}

pub fn run(config: &Config, catalog: &Catalog, args: &ReportArgs) -> Result<()> {
    let ledger = Ledger::open_existing(&config.ledger)?;
    let window = window(args.since.as_deref(), args.until.as_deref())?;
    let started = std::time::Instant::now();
    let options = Options {
        pool_busy_below: args.pool_busy_below,
        by: args.by,
        error_budgets: error_budgets(&config.serve),
    };
    let report = Report::build_with(&ledger, catalog, window, options)?;
    tracing::info!(
        events = report.events,
        secs = started.elapsed().as_secs_f64(),
        "report built"
    );
    if args.json {
        return table::print_json(&report);
    }
    if let Some(path) = &args.html {
        let html = frugal_cost::html::render(&report, &ledger.location().to_string());
        std::fs::write(path, html).with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(std::io::stderr(), "wrote {}", path.display())?;
    }
    let quality = frugal_engine::eval::quality::store(None, config.data_home.as_deref())
        .map(|path| frugal_engine::eval::quality::all_latest(&path))
        .unwrap_or_default();
    match &report.spend {
        Some(spend) => print_spend(&report, &ledger, spend),
        None => print_report(&report, &ledger, &quality),
    }
}

/// The first line of every report: the ledger, the window, the events.
fn print_heading(out: &mut impl Write, r: &Report, ledger: &Ledger) -> Result<()> {
    let span = match (r.first_ms, r.last_ms) {
        (Some(a), Some(b)) => format!("{} .. {}", date(a), date(b)),
        _ => "no events in the window".to_owned(),
    };
    writeln!(
        out,
        "frugal report: {} ({span}, {} events)",
        ledger.location(),
        thousands(r.events)
    )?;
    Ok(())
}

/// `--by`: the window's spend by tenant, model, workload or day, and its total.
fn print_spend(r: &Report, ledger: &Ledger, spend: &Spend) -> Result<()> {
    let mut out = std::io::stdout().lock();
    print_heading(&mut out, r, ledger)?;
    let noun = spend.by.noun();
    let mut t = table::new(&[
        noun,
        "events>",
        "requests>",
        "tokens>",
        "cost>",
        "waste>",
        "share>",
    ]);
    for l in &spend.lines {
        t.add_row(vec![
            l.name.clone().unwrap_or_else(|| "-".into()),
            thousands(l.events),
            thousands(l.requests),
            thousands(l.input_tokens + l.output_tokens),
            usd(l.cost),
            usd(l.waste),
            pct(l.share),
        ]);
    }
    let waste: Money = spend.lines.iter().map(|l| l.waste).sum();
    let events: u64 = spend.lines.iter().map(|l| l.events).sum();
    t.add_row(vec![
        "total".into(),
        thousands(events),
        String::new(),
        String::new(),
        usd(spend.total),
        usd(waste),
        String::new(),
    ]);
    writeln!(out, "\nSpend by {noun}\n{t}")?;
    Ok(())
}

/// What each lever saved, per workload and model, against what the requests would have cost
/// without them.
fn print_savings(out: &mut impl Write, r: &Report) -> Result<()> {
    let lines: Vec<_> = r
        .inference
        .iter()
        .filter(|l| l.saved.total() > Money::ZERO)
        .collect();
    if lines.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&[
        "workload",
        "model",
        "cache>",
        "semantic cache>",
        "routing>",
        "batching>",
        "prefix cache>",
        "saved>",
        "without them>",
        "cut>",
    ]);
    // Savings are often fractions of a cent per workload: unit figures, and "-" for none.
    let money = |m: Money| {
        if m == Money::ZERO {
            "-".to_owned()
        } else {
            usd_unit(m)
        }
    };
    for l in lines {
        let saved = l.saved.total();
        let without = l.cost + l.idle_cost + saved;
        t.add_row(vec![
            l.workload.clone().unwrap_or_default(),
            l.model.clone().unwrap_or_else(|| "-".into()),
            money(l.saved.cache),
            money(l.saved.semantic_cache),
            money(l.saved.routing),
            money(l.saved.batching),
            money(l.saved.prefix_cache),
            usd_unit(saved),
            usd_unit(without),
            pct(saved.as_f64() / without.as_f64().max(1e-12)),
        ]);
    }
    writeln!(
        out,
        "\nSaved by the levers (what the calls they replaced would have cost)\n{t}"
    )?;
    Ok(())
}

/// Beside the semantic cache's saving, the hits a paraphrase verifier let through and the
/// estimated share of them that was wrong, with the bound they were served under.
fn print_wrong_hits(out: &mut impl Write, r: &Report) -> Result<()> {
    let lines: Vec<(String, String, &WrongHits)> = r
        .inference
        .iter()
        .filter_map(|l| {
            let workload = l.workload.clone().unwrap_or_default();
            let model = l.model.clone().unwrap_or_else(|| "-".into());
            Some((workload, model, l.semantic.as_ref()?))
        })
        .collect();
    if lines.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&[
        "workload",
        "model",
        "verified hits>",
        "likely wrong>",
        "wrong rate>",
        "95% interval>",
        "bound>",
    ]);
    let row = |workload: String, model: String, h: &WrongHits| {
        vec![
            workload,
            model,
            thousands(h.verified_hits),
            format!("{:.1}", h.expected_wrong),
            pct1(h.wrong_rate),
            interval(h.wrong_low, h.wrong_high),
            h.max_error.map_or_else(|| "-".into(), pct1),
        ]
    };
    let several = lines.len() > 1;
    for (workload, model, h) in lines {
        t.add_row(row(workload, model, h));
    }
    if several && let Some(all) = &r.semantic {
        t.add_row(row("total".into(), String::new(), all));
    }
    writeln!(
        out,
        "\nSemantic cache: verified hits and the share likely wrong (bound: semantic_max_error)\n{t}"
    )?;
    Ok(())
}

/// Beside each lever's saving, the quality its shadowed answers kept (`shadow_rate`).
fn print_quality_kept(out: &mut impl Write, r: &Report) -> Result<()> {
    if r.quality.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&QUALITY_HEAD);
    for line in &r.quality {
        t.add_row(line.cells());
    }
    writeln!(
        out,
        "\nQuality kept beside each saving, measured online (shadow_rate)\n{t}\n{QUALITY_NOTE}"
    )?;
    Ok(())
}

/// Beside the savings, what `frugal eval` last measured of the models served here, each way
/// it was run: a lever's saving is never shown without the quality it keeps.
fn print_quality(
    out: &mut impl Write,
    r: &Report,
    quality: &[frugal_engine::eval::quality::Record],
) -> Result<()> {
    let served: Vec<&str> = r
        .inference
        .iter()
        .filter_map(|l| l.model.as_deref())
        .collect();
    let rows = frugal_engine::eval::quality::of_served(quality, &served);
    if rows.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&["model", "run as", "measured", "on", "quality kept", "gate"]);
    for (stem, q) in rows {
        let mut run_as = q.quant.clone().unwrap_or_else(|| "as stored".into());
        if let Some(kv) = &q.kv {
            run_as += &format!(", {kv} KV");
        }
        t.add_row(vec![
            stem.to_owned(),
            run_as,
            format!("{} ({})", q.at.get(..10).unwrap_or(&q.at), q.kind),
            q.data.clone(),
            q.summary.clone(),
            match q.gate {
                Some(true) => "passed".into(),
                Some(false) => "FAILED".into(),
                None => "-".into(),
            },
        ]);
    }
    writeln!(
        out,
        "\nQuality kept, as `frugal eval` last measured it (held-out data, against the model's reference)\n{t}"
    )?;
    Ok(())
}

fn print_report(
    r: &Report,
    ledger: &Ledger,
    quality: &[frugal_engine::eval::quality::Record],
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    print_heading(&mut out, r, ledger)?;
    if r.events == 0 {
        return Ok(());
    }
    writeln!(out)?;
    let waste_share = if r.total.nanos() > 0 {
        r.waste.as_f64() / r.total.as_f64()
    } else {
        0.0
    };
    writeln!(
        out,
        "spent {}   waste {} ({})",
        usd(r.total),
        usd(r.waste),
        pct(waste_share)
    )?;
    if let Some(u) = r.utilization {
        let note = utilization_note(u).unwrap_or_else(|| "capacity fully used".to_owned());
        writeln!(out, "utilization of paid capacity {}: {note}", pct(u))?;
    }
    if let Some(d) = &r.dominant {
        writeln!(out, "dominant: {d}")?;
    }

    let mut t = table::new(&["kind", "cost>", "share>", "waste>"]);
    for k in &r.by_kind {
        t.add_row(vec![
            k.kind.to_string(),
            usd(k.cost),
            pct(k.share),
            usd(k.waste),
        ]);
    }
    writeln!(out, "\nSpend by kind\n{t}")?;

    if !r.top_items.is_empty() {
        let mut t = table::new(&["kind", "item", "cost>", "share>"]);
        for i in &r.top_items {
            t.add_row(vec![
                i.kind.to_string(),
                i.name.clone(),
                usd(i.cost),
                pct(i.share),
            ]);
        }
        writeln!(out, "\nTop items\n{t}")?;
    }

    if !r.inference.is_empty() {
        let mut t = table::new(&[
            "workload",
            "model",
            "requests>",
            "in tok>",
            "out tok>",
            "cost>",
            "idle>",
            "$/1k req>",
            "$/1M in>",
            "$/1M out>",
            "$/1M tok>",
            "util>",
        ]);
        let opt = |m: Option<Money>| m.map(usd_unit).unwrap_or_else(|| "-".into());
        for l in &r.inference {
            t.add_row(vec![
                l.workload.clone().unwrap_or_default(),
                l.model.clone().unwrap_or_else(|| "-".into()),
                thousands(l.requests),
                thousands(l.input_tokens),
                thousands(l.output_tokens),
                usd(l.cost),
                usd(l.idle_cost),
                opt(l.per_1k),
                opt(l.per_m_input),
                opt(l.per_m_output),
                opt(l.per_m_tokens),
                l.utilization.map(pct).unwrap_or_else(|| "-".into()),
            ]);
        }
        writeln!(
            out,
            "\nInference: cost per unit (idle capacity charged to its workload)\n{t}"
        )?;
        print_savings(&mut out, r)?;
        print_wrong_hits(&mut out, r)?;
        print_quality_kept(&mut out, r)?;
        print_quality(&mut out, r, quality)?;
    }

    if !r.batch.is_empty() {
        let mut t = table::new(&[
            "batch job",
            "model",
            "lines>",
            "tokens>",
            "cost>",
            "on demand>",
            "saved>",
            "$/1k lines>",
            "$/1M tok>",
            "interactive $/1k>",
            "interactive $/1M tok>",
        ]);
        let opt = |m: Option<Money>| m.map(usd_unit).unwrap_or_else(|| "-".into());
        for l in &r.batch {
            t.add_row(vec![
                l.job.clone(),
                l.model.clone().unwrap_or_else(|| "-".into()),
                thousands(l.lines),
                thousands(l.input_tokens + l.output_tokens),
                usd_unit(l.cost),
                opt(l.on_demand_cost),
                opt(l.saving),
                opt(l.per_1k),
                opt(l.per_m_tokens),
                opt(l.interactive_per_1k),
                opt(l.interactive_per_m_tokens),
            ]);
        }
        writeln!(
            out,
            "\nBatch jobs: cost per unit beside the same model's interactive traffic (idle included there)\n{t}"
        )?;
    }

    if !r.training.is_empty() {
        let mut t = table::new(&[
            "run",
            "workload",
            "segments>",
            "preempted>",
            "hours>",
            "lost min>",
            "cost>",
            "on demand>",
            "saved>",
            "util>",
            "mfu>",
            "done",
        ]);
        for l in &r.training {
            t.add_row(vec![
                l.run.clone(),
                l.workload.clone(),
                l.segments.to_string(),
                l.preemptions.to_string(),
                format!("{:.1}", l.duration_ms as f64 / 3.6e6),
                format!("{:.1}", l.lost_ms as f64 / 6e4),
                usd(l.cost),
                l.on_demand_cost.map(usd).unwrap_or_else(|| "-".into()),
                l.saving.map(usd).unwrap_or_else(|| "-".into()),
                l.utilization.map(pct).unwrap_or_else(|| "-".into()),
                mfu(l.mfu, l.precision),
                if l.completed { "yes" } else { "no" }.into(),
            ]);
        }
        writeln!(out, "\nTraining runs: cost per run\n{t}")?;
    }

    print_pools(&mut out, &r.pools)?;
    print_servers(&mut out, &r.servers)?;

    if !r.levers.is_empty() {
        let mut t = table::new(&["#>", "lever", "at stake>", "why", "what to do"]);
        for (i, l) in r.levers.iter().enumerate() {
            t.add_row(vec![
                (i + 1).to_string(),
                l.lever.to_owned(),
                usd(l.dollars),
                l.basis.clone(),
                l.action.to_string(),
            ]);
        }
        writeln!(
            out,
            "\nLevers to try first, by dollars at stake in this window\n{t}"
        )?;
    }
    Ok(())
}

/// "3.1% fp32": a run's MFU and the precision it computed in.
fn mfu(mfu: Option<f64>, precision: Option<frugal_cost::Precision>) -> String {
    match (mfu, precision) {
        (Some(m), Some(p)) => format!("{} {p}", pct1(m)),
        (Some(m), None) => pct1(m),
        (None, _) => "-".into(),
    }
}

/// Pools of replicas against a fixed pool of their largest size, and what to right-size.
fn print_pools(out: &mut impl Write, pools: &[PoolLine]) -> Result<()> {
    if pools.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&[
        "pool",
        "replica-h>",
        "requests>",
        "cost>",
        "$/1k req>",
        "busy>",
        "cold starts>",
        "p99 wait>",
        "fixed pool>",
        "saved>",
    ]);
    let dash = || "-".to_owned();
    for p in pools {
        let starts = match p.failed_starts {
            0 => p.cold_starts.to_string(),
            n => format!("{} ({n} failed)", p.cold_starts),
        };
        t.add_row(vec![
            p.pool.clone(),
            format!("{:.1}", p.replica_hours),
            thousands(p.requests),
            usd(p.cost),
            p.per_1k.map_or_else(dash, usd_unit),
            p.busy_share.map_or_else(dash, pct),
            starts,
            p.wait_p99_ms.map_or_else(dash, seconds),
            p.fixed_cost.map_or_else(dash, usd),
            p.saving_vs_fixed.map_or_else(dash, usd),
        ]);
    }
    writeln!(
        out,
        "\nPools: replicas scaled to demand against a fixed pool of max_replicas\n{t}"
    )?;
    let flags = pools
        .iter()
        .flat_map(|p| p.right_sizing.iter().map(move |f| (p.pool.as_str(), f)));
    print_flags(out, "pool", "Right-sizing pools", flags)
}

/// The right-sizing flags of pools or servers, a row each; nothing when there is none.
fn print_flags<'a>(
    out: &mut impl Write,
    subject: &str,
    title: &str,
    flags: impl Iterator<Item = (&'a str, &'a RightSizing)>,
) -> Result<()> {
    let mut t = table::new(&[subject, "at stake>", "why", "what to do"]);
    let mut any = false;
    for (name, f) in flags {
        any = true;
        t.add_row(vec![
            name.to_owned(),
            usd(f.dollars),
            f.basis.clone(),
            f.action.clone(),
        ]);
    }
    if any {
        writeln!(out, "\n{title}\n{t}")?;
    }
    Ok(())
}

/// Servers `frugal watch` measured: unit costs, busy share, idle dollars, and their flags.
fn print_servers(out: &mut impl Write, servers: &[ServerLine]) -> Result<()> {
    if servers.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&[
        "server",
        "model",
        "instance",
        "hours>",
        "requests>",
        "tokens>",
        "cost>",
        "busy>",
        "idle>",
        "$/1k req>",
        "$/1M tok>",
        "$/1k busy>",
        "GPU mem>",
    ]);
    let dash = || "-".to_owned();
    for s in servers {
        t.add_row(vec![
            s.server.clone(),
            s.model.clone(),
            s.instance_type.clone().unwrap_or_else(dash),
            format!("{:.1}", s.hours),
            thousands(s.requests),
            thousands(s.input_tokens + s.output_tokens),
            usd(s.cost),
            s.busy_share.map_or_else(dash, pct),
            usd(s.idle_cost),
            s.per_1k.map_or_else(dash, usd_unit),
            s.per_m_tokens.map_or_else(dash, usd_unit),
            s.busy_per_1k.map_or_else(dash, usd_unit),
            s.gpu_memory_gib
                .map_or_else(dash, |g| format!("{g:.1} GiB")),
        ]);
    }
    writeln!(
        out,
        "\nWatched servers (`frugal watch`): unit costs with idle time, and at full use ($/1k busy)\n{t}"
    )?;
    let flags = servers
        .iter()
        .flat_map(|s| s.right_sizing.iter().map(move |f| (s.server.as_str(), f)));
    print_flags(out, "server", "Right-sizing watched servers", flags)
}

/// A wait in milliseconds as seconds: `0.25 s`, `12.0 s`.
fn seconds(ms: i64) -> String {
    match ms {
        0 => "0 s".to_owned(),
        ms if ms < 1000 => format!("{:.2} s", ms as f64 / 1000.0),
        ms => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_take_ages_and_timestamps() {
        let now = 10 * 86_400_000;
        assert_eq!(parse_bound("7d", now).unwrap(), 3 * 86_400_000);
        assert_eq!(parse_bound("1970-01-02", now).unwrap(), 86_400_000);
        assert!(parse_bound("soon", now).is_err());
    }
}
