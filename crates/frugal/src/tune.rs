//! `frugal tune --space FILE -- CMD`: the flags into the tuner's settings, the search run
//! (its progress on stderr), and its summary printed. The search is
//! `frugal_train::tune::run`'s.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use frugal_cost::Catalog;
use frugal_cost::event::Event;
use frugal_cost::present::usd_f64;
use frugal_train::tune::Space;
use frugal_train::tune::run::{Report, Settings, TuneEnding, describe, tune};

use crate::cli::TuneArgs;
use crate::config::Config;
use crate::table;
use crate::train::{base_plan, machine_peak, machine_pricing, notice_source, seconds, store_url};
use frugal_train::supervisor::Plan;

/// A search stopped by a signal or a notice, its state saved; `main` exits 75.
#[derive(Debug, thiserror::Error)]
#[error("tune {id} stopped with its state saved in {dir}: run the same command to resume")]
pub struct Stopped {
    id: String,
    dir: String,
}

pub fn run(config: &Config, catalog: &Catalog, args: &TuneArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.space)
        .with_context(|| format!("cannot read the search space {}", args.space.display()))?;
    let space = Space::from_toml(&text)
        .with_context(|| format!("search space {}", args.space.display()))?;
    space.check_args(&args.command)?;
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| frugal_train::names::search_id(&text, &args.command));
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| Path::new(".frugal").join("tune").join(&id));
    let parallel = args.parallel as usize;
    let devices = match &args.devices {
        Some(list) => {
            let d: Vec<String> = list
                .split(',')
                .map(|s| s.trim().replace('+', ","))
                .collect();
            if d.len() < parallel || d.iter().any(String::is_empty) {
                bail!(
                    "--devices: `{list}` names {} slot(s) for --parallel {parallel}",
                    d.len()
                );
            }
            d
        }
        None => Vec::new(),
    };
    let pricing = machine_pricing("tune", catalog, &args.machine)?;
    // Each slot has its share of the machine's accelerators (or of the given peak).
    let mut peak = machine_peak(catalog, &pricing, &args.supervisor)?;
    let slots = f64::from(args.parallel);
    if let Some((_, count)) = &mut peak.accelerators {
        *count /= slots;
    }
    peak.given_tflops = peak.given_tflops.map(|t| t / slots);
    let settings = Settings {
        tune_id: id.clone(),
        dir: std::path::absolute(&dir)?,
        space,
        command: args.command.clone(),
        launcher: args.launcher.clone(),
        parallel,
        devices,
        seed: args.seed,
        speculate: args.speculate,
        trial_timeout: seconds("--trial-timeout", args.trial_timeout)?,
        store: store_url(config, &args.supervisor)?,
        supervisor: Plan {
            peak,
            ..base_plan(&args.supervisor, &args.machine)?
        },
        pricing: pricing.share(args.parallel),
    };
    let mut ledger = config.open_ledger()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let source = notice_source(&args.machine).await?;
        let mut record = |events: &[Event]| {
            ledger
                .append("frugal tune", events)
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        };
        anyhow::Ok(tune(&settings, source, &mut record).await?)
    })?;

    if args.json {
        crate::table::print_json(&report)?;
    } else {
        print_report(&mut std::io::stdout().lock(), &report)?;
    }
    match report.ending {
        TuneEnding::Finished => Ok(()),
        TuneEnding::Stopped => Err(Stopped {
            id,
            dir: dir.display().to_string(),
        }
        .into()),
    }
}

fn print_report(out: &mut impl Write, r: &Report) -> Result<()> {
    let names: Vec<&String> = r
        .trials
        .first()
        .map(|t| t.params.keys().collect())
        .unwrap_or_default();
    let mut headers: Vec<String> = vec!["trial>".into()];
    headers.extend(names.iter().map(|n| format!("{n}>")));
    headers.extend(r.rungs.iter().map(|k| format!("@{k}>")));
    headers.extend(["steps>", "cost>", "status"].map(String::from));
    let mut t = table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    // The furthest first, best first among equals.
    let mut trials: Vec<_> = r.trials.iter().collect();
    let sign = match r.mode {
        frugal_train::tune::Mode::Min => 1.0,
        frugal_train::tune::Mode::Max => -1.0,
    };
    let key = |t: &&frugal_train::tune::run::TrialSummary| {
        let last = t
            .results
            .last()
            .and_then(|x| x.metric)
            .map_or(f64::INFINITY, |m| sign * m);
        (std::cmp::Reverse(t.rungs), last)
    };
    trials.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
    });
    for trial in trials {
        let mut row = vec![trial.trial.to_string()];
        row.extend(names.iter().map(|n| {
            trial
                .params
                .get(*n)
                .map_or_else(String::new, ToString::to_string)
        }));
        row.extend((0..r.rungs.len()).map(|k| match trial.results.get(k) {
            Some(x) => x.metric.map_or_else(|| "NaN".into(), |m| format!("{m:.4}")),
            None => String::new(),
        }));
        row.push(trial.steps.to_string());
        row.push(usd_f64(trial.cost_usd));
        row.push(trial.status.to_owned());
        t.add_row(row);
    }
    let goal = match r.mode {
        frugal_train::tune::Mode::Min => "lowest",
        frugal_train::tune::Mode::Max => "highest",
    };
    writeln!(
        out,
        "Tune {} ({goal} {}, by {})\n{t}",
        r.tune_id, r.metric, r.resource
    )?;
    match &r.best {
        Some(b) => {
            writeln!(
                out,
                "best: trial {} ({}): {} {:.4} at {} {}",
                b.trial,
                describe(&b.params),
                r.metric,
                b.metric,
                b.resource,
                r.resource
            )?;
        }
        None => writeln!(out, "best: none yet")?,
    }
    let share = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    writeln!(
        out,
        "{} {}s of {} had every trial run to the end ({:.0}%); cost {}, {} to run all to \
         the end: early stopping saved {}",
        r.total_steps,
        r.resource,
        r.full_steps,
        share(r.total_steps, r.full_steps),
        usd_f64(r.cost_usd),
        usd_f64(r.full_cost_usd),
        usd_f64(r.saved_usd)
    )?;
    if let Some(u) = r.slot_utilization {
        writeln!(
            out,
            "slots busy {:.0}% of the time ({:.0} s)",
            u * 100.0,
            r.wall_s
        )?;
    }
    Ok(())
}
