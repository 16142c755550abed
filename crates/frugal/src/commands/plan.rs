//! `frugal plan`: the capacity mix for a workload from its demand, backtested; the planner
//! is `frugal_cost::plan`.

use std::io::Write;

use anyhow::{Context, Result, bail};
use frugal_cost::money::HourlyRate;
use frugal_cost::plan::{
    BacktestConfig, DemandOptions, Gaps, HourlyDemand, Job, Measured, Plan, RightSizing, Slo,
    SpotAsk, SpotTrace, TraceReading, ZeroPlan, html, ledger_demand, ledger_scale_to_zero,
    right_size,
};
use frugal_cost::present::{pct, usd_unit, utc};
use frugal_cost::{Catalog, Ledger};

use crate::cli::PlanArgs;
use crate::config::Config;
use crate::table;

pub fn run(config: &Config, catalog: &Catalog, args: &PlanArgs) -> Result<()> {
    if !(args.scale.is_finite() && args.scale > 0.0) {
        bail!("--scale must be a positive number, not {}", args.scale);
    }
    let offer = catalog.instance(&args.instance, args.region.as_deref())?;
    let (demand, source) = demand(config, args)?;
    let windows = match (args.fit, args.test) {
        (None, None) => None,
        (fit, test) => {
            let fit = fit.or(test).unwrap_or_default();
            Some(BacktestConfig::new(fit, test.unwrap_or(fit))?)
        }
    };
    let trace;
    let spot = match spot_job(args)? {
        Some(job) => {
            trace = SpotTrace::read(&args.spot_trace, TraceReading::Unavailable)
                .with_context(|| format!("--spot-trace {}", args.spot_trace.display()))?;
            Some(SpotAsk {
                trace: &trace,
                trace_name: args.spot_trace.display().to_string(),
                job,
                deadline_hours: args.deadline.map(|d| d.as_secs_f64() / 3600.0),
            })
        }
        None => None,
    };
    let mut plan = Plan::build(source, &demand, offer, windows.as_ref(), spot)?;
    plan.sizing = sizing(catalog, args)?;
    plan.scale_to_zero = match &args.workload {
        Some(workload) => zero(config, args, workload, offer.on_demand)?,
        None => None,
    };
    if let Some(path) = &args.html {
        std::fs::write(path, frugal_cost::plan::html::render(&plan))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        return crate::table::print_json(&plan);
    }
    print(&plan, demand.filled_hours())
}

/// The hourly demand and where it came from: a file, or the ledger's workload.
fn demand(config: &Config, args: &PlanArgs) -> Result<(HourlyDemand, String)> {
    if let Some(path) = &args.demand {
        let options = DemandOptions {
            gaps: if args.fill_gaps {
                Gaps::CarryForward
            } else {
                Gaps::Refuse
            },
            ..DemandOptions::new(args.scale)
        };
        let demand = HourlyDemand::read_csv(path, &options).map_err(|e| match e {
            frugal_cost::plan::DemandError::Gaps { .. } => {
                anyhow::anyhow!("{e} (--fill-gaps repeats the hour before)")
            }
            e => e.into(),
        })?;
        let source = format!("{} ({} x {})", path.display(), args.unit, args.scale);
        return Ok((demand, source));
    }
    let Some(workload) = &args.workload else {
        bail!("give --demand FILE.csv or --workload NAME (the ledger's demand)");
    };
    let ledger = Ledger::open_existing(&config.ledger)?;
    let window = super::report::window(args.since.as_deref(), args.until.as_deref())?;
    let found = ledger_demand(&ledger, workload, window)?;
    // Calls to per-token APIs hold no instance: the plan says it left them out.
    let per_token = match found.per_token_requests {
        0 => String::new(),
        n => format!("; {n} requests to per-token APIs left out, as they hold no instance"),
    };
    let demand = found.demand.with_context(|| {
        format!(
            "the ledger {} holds no machine time of workload `{workload}`{per_token}",
            config.ledger
        )
    })?;
    Ok((
        demand,
        format!("the ledger's workload {workload} (machine time{per_token})"),
    ))
}

/// The right size among the instance types of `--bench`, when given.
fn sizing(catalog: &Catalog, args: &PlanArgs) -> Result<Option<RightSizing>> {
    if args.bench.is_empty() {
        return Ok(None);
    }
    let mut measured = Vec::new();
    for (ty, path) in &args.bench {
        let context = || format!("--bench {ty}={}", path.display());
        let offer = catalog
            .instance(ty, args.region.as_deref())
            .with_context(context)?;
        let json = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))
            .with_context(context)?;
        measured.push(Measured::from_bench_json(ty, offer.on_demand, &json).with_context(context)?);
    }
    let slo = Slo {
        ttft_p99_s: args.slo_ttft_p99.map(|d| d.as_secs_f64()),
    };
    Ok(Some(right_size(&measured, slo)))
}

/// Scale to zero replayed on the ledger's arrivals of `workload`, at `rate`.
fn zero(
    config: &Config,
    args: &PlanArgs,
    workload: &str,
    rate: HourlyRate,
) -> Result<Option<ZeroPlan>> {
    let ledger = Ledger::open_existing(&config.ledger)?;
    Ok(ledger_scale_to_zero(
        &ledger,
        workload,
        args.cold_start,
        args.scale_to_zero_after,
        args.max_waiting_share,
        rate,
    )?)
}

/// The interruptible run to plan on spot, when asked for (`--work`, or `--deadline` with a
/// day's work).
fn spot_job(args: &PlanArgs) -> Result<Option<Job>> {
    let work = match (args.work, args.deadline) {
        (Some(w), _) => w,
        (None, Some(_)) => std::time::Duration::from_secs(24 * 3600),
        (None, None) => return Ok(None),
    };
    let hours = |d: std::time::Duration| d.as_secs_f64() / 3600.0;
    if work.is_zero() {
        bail!("--work must be longer than zero");
    }
    Ok(Some(Job {
        work_hours: hours(work),
        checkpoint_hours: hours(args.checkpoint),
        restart_hours: hours(args.restart),
        // Replaced by Young/Daly's where the trace gives an MTBF.
        interval_hours: 1.0,
    }))
}

fn print(plan: &Plan, filled: usize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Plan for {} ({}) from {}: {} hours from {} UTC, peak {:.1}, mean {:.1} instances{}",
        plan.instance_type,
        plan.region,
        plan.source,
        plan.hourly.len(),
        utc(plan.start_ms, "%Y-%m-%d"),
        plan.peak,
        plan.mean,
        if filled > 0 {
            format!(" ({filled} missing hours filled with the hour before)")
        } else {
            String::new()
        }
    )?;
    let mut t = table::new(&html::OPTION_HEAD);
    for o in html::options(plan) {
        t.add_row(html::option_cells(o));
    }
    writeln!(out, "\nWhat to commit to\n{t}")?;
    match &plan.reserved_rests_on {
        Some(basis) => writeln!(out, "reserved prices: {basis}")?,
        None => writeln!(
            out,
            "reserved prices: none known for {}: give reserved_1y / reserved_3y in a price file",
            plan.instance_type
        )?,
    }
    for r in &plan.commitments.refused {
        writeln!(out, "no {}: {}", r.capacity, r.reason)?;
    }
    if let Some(b) = &plan.backtest {
        let rules: Vec<_> = std::iter::once(&b.ours).chain(&b.lookbacks).collect();
        let mut heads = vec!["test window".to_owned(), "ours>".into(), "optimum>".into()];
        heads.extend(
            rules
                .iter()
                .map(|r| format!("{} regret>", html::rule_name(&r.rule))),
        );
        heads.push("ours busy>".into());
        let heads: Vec<&str> = heads.iter().map(String::as_str).collect();
        let mut t = table::new(&heads);
        let points = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        for (i, w) in b.ours.windows.iter().enumerate() {
            let mut row = vec![
                utc(w.test_start_ms, "%Y-%m-%d"),
                w.count.to_string(),
                w.optimum_count.to_string(),
            ];
            row.extend(
                rules
                    .iter()
                    .map(|r| points(r.windows.get(i).and_then(|w| w.regret))),
            );
            row.push(w.utilization.map_or("-".into(), pct));
            t.add_row(row);
        }
        let mut row = vec!["mean".to_owned(), String::new(), String::new()];
        row.extend(rules.iter().map(|r| points(r.mean_regret)));
        row.push(b.ours.utilization.map_or("-".into(), pct));
        t.add_row(row);
        writeln!(
            out,
            "\nBacktest of {} at {}/h against {}/h on demand, fit on {} days, scored on the next {}: regret in points of the all-on-demand cost\n{t}",
            b.capacity,
            usd_unit(b.reserved.0),
            usd_unit(b.on_demand.0),
            b.fit_hours / 24,
            b.test_hours / 24,
        )?;
    }
    if let Some(s) = &plan.spot {
        writeln!(
            out,
            "\nSpot for {:.0} h of work on {}: {} preemptions in {:.0} h (MTBF {}); checkpoint every {:.2} h (Young/Daly)",
            s.job.work_hours,
            s.trace,
            s.stats.preemptions,
            s.stats.hours,
            s.stats
                .mtbf_hours
                .map_or("none".into(), |h| format!("{h:.2} h")),
            s.job.interval_hours
        )?;
        let mut t = table::new(html::replay_head(s));
        for (name, r) in html::replays(s) {
            t.add_row(html::replay_cells(name, r));
        }
        writeln!(out, "{t}")?;
        if let Some(d) = &s.deadline {
            writeln!(
                out,
                "spot alone {} the {:.0} h deadline",
                if d.spot_only_meets { "meets" } else { "misses" },
                d.deadline_hours
            )?;
        }
    }
    if let Some(s) = &plan.sizing {
        print_sizing(&mut out, s)?;
    }
    if let Some(z) = &plan.scale_to_zero {
        print_zero(&mut out, z)?;
    }
    Ok(())
}

fn print_sizing(out: &mut impl Write, s: &RightSizing) -> Result<()> {
    let mut t = table::new(&html::SIZE_HEAD);
    for c in &s.candidates {
        t.add_row(html::candidate_cells(c));
    }
    writeln!(
        out,
        "\nRight size per 1M tokens: {}\n{t}",
        html::sizing_summary(s)
    )?;
    Ok(())
}

fn print_zero(out: &mut impl Write, z: &ZeroPlan) -> Result<()> {
    let mut t = table::new(&html::ZERO_HEAD);
    t.add_row(html::zero_cells(z));
    writeln!(out, "\nScale to zero: {}\n{t}", html::zero_summary(z))?;
    Ok(())
}
