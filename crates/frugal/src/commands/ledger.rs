//! `frugal ledger import`, `info` and `migrate`.

use std::io::Write;

use anyhow::{Context, Result, bail};
use frugal_cost::import::{Format, ImportOptions, import_file};
use frugal_cost::ledger::PriorImport;
use frugal_cost::present::{thousands, usd};
use frugal_cost::{Catalog, Ledger};

use crate::cli::{ImportArgs, ImportFormat, InfoArgs, MigrateArgs};
use crate::config::Config;
use crate::progress::Bar;
use crate::table::{self, date};

/// `frugal ledger info`: what the ledger holds, and its integrity when asked.
pub fn info(config: &Config, args: &InfoArgs) -> Result<()> {
    let ledger = Ledger::open_existing(&config.ledger)?;
    let info = ledger.info()?;
    let check = args.check.then(|| ledger.integrity_check()).transpose()?;
    if args.json {
        let mut value = frugal_cost::present::json::to_value(&info)?;
        if let Some(check) = &check {
            value["integrity"] = serde_json::Value::String(check.clone());
        }
        return table::print_json(&value);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ledger    {}", info.path.display())?;
    writeln!(out, "schema    v{}", info.schema_version)?;
    writeln!(out, "events    {}", thousands(info.events))?;
    writeln!(out, "imports   {}", info.imports)?;
    if let (Some(first), Some(last)) = (info.first_ms, info.last_ms) {
        writeln!(out, "span      {} .. {}", date(first), date(last))?;
    }
    writeln!(out, "cost      {}", usd(info.total_cost))?;
    writeln!(out, "size      {:.1} MB", info.bytes as f64 / 1e6)?;
    if let Some(check) = check {
        writeln!(out, "integrity {check}")?;
    }
    print_files(&mut out, &info.files)
}

/// `frugal ledger migrate`: the copy, with a bar of events read, then what it did.
pub fn migrate(args: &MigrateArgs) -> Result<()> {
    let from = Ledger::open_existing(&args.from)?;
    let to_location = frugal_cost::Location::parse(&args.to);
    if to_location.path() == Some(args.from.as_path()) {
        bail!("--from and --to are the same ledger");
    }
    let mut to = Ledger::open(to_location)?;
    let bar = Bar::count("events");
    let done = frugal_cost::ledger::migrate(&from, &mut to, args.batch, &bar)
        .with_context(|| format!("cannot copy {} into {}", args.from.display(), to.location()))?;
    if args.json {
        return table::print_json(&done);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} events read from {} ({}): {} copied, {} already in {}; {} imported files and {} spans recorded",
        thousands(done.events),
        args.from.display(),
        usd(done.cost),
        thousands(done.copied),
        thousands(done.skipped),
        to.location(),
        thousands(done.files),
        thousands(done.spans),
    )?;
    Ok(())
}

/// Files imported, newest last; only the latest few, `--json` has them all.
fn print_files(out: &mut impl Write, files: &[PriorImport]) -> Result<()> {
    const SHOWN: usize = 10;
    if files.is_empty() {
        return Ok(());
    }
    let mut t = table::new(&["imported", "sha256", "format", "rows>", "file"]);
    for f in files.iter().skip(files.len().saturating_sub(SHOWN)) {
        t.add_row(vec![
            date(f.at_ms),
            f.sha256
                .as_deref()
                .map_or("-", |s| s.get(..12).unwrap_or(s))
                .to_owned(),
            f.format.clone(),
            thousands(f.rows),
            f.source.clone(),
        ]);
    }
    writeln!(out, "\nFiles imported\n{t}")?;
    if files.len() > SHOWN {
        writeln!(
            out,
            "the latest {SHOWN} of {}; --json lists all",
            files.len()
        )?;
    }
    Ok(())
}

pub fn import(mut ledger: Ledger, catalog: &Catalog, args: &ImportArgs) -> Result<()> {
    let format = args.format.map(|f| match f {
        ImportFormat::Csv => Format::Csv,
        ImportFormat::Jsonl => Format::Jsonl,
        ImportFormat::Focus => Format::Focus,
    });
    let options = ImportOptions {
        format,
        skip_invalid: args.skip_invalid,
        allow_duplicates: args.allow_duplicates,
    };
    let mut summaries = Vec::new();
    for file in &args.files {
        let bar = Bar::bytes(&file.display().to_string());
        let started = std::time::Instant::now();
        let summary = import_file(&mut ledger, catalog, file, options, &bar)?;
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(file = %file.display(), rows = summary.imported, secs, "imported");
        if !args.json {
            let mut err = std::io::stderr().lock();
            writeln!(
                err,
                "imported {} events ({}) from {} as {} in {:.2}s{}{}{}",
                thousands(summary.imported),
                usd(summary.cost),
                file.display(),
                summary.format.as_str(),
                secs,
                if summary.skipped > 0 {
                    format!(
                        "; skipped {} prepaid purchase rows (amortized into usage)",
                        summary.skipped
                    )
                } else {
                    String::new()
                },
                if summary.invalid_total > 0 {
                    format!("; left out {} bad rows", summary.invalid_total)
                } else {
                    String::new()
                },
                if summary.duplicates > 0 {
                    format!(
                        "; {} of them imported before (--allow-duplicates)",
                        thousands(summary.duplicates)
                    )
                } else {
                    String::new()
                },
            )?;
            for bad in &summary.invalid {
                writeln!(err, "  line {}: {}", bad.line, bad.message)?;
            }
        }
        summaries.push(summary);
    }
    if args.json {
        table::print_json(&summaries)?;
    }
    Ok(())
}
