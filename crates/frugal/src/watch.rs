//! `frugal watch`: the `[[watch.target]]` servers scraped, and the `[[watch.prometheus]]`
//! fleets queried, every `--interval` (or once); each interval billed into the ledger, and
//! a line per server printed. The reading and billing are `frugal_watch`'s.

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use frugal_cloud::price::ThisMachine;
use frugal_cost::money::HourlyRate;
use frugal_cost::{Catalog, Money};
use frugal_watch::Interval;
use frugal_watch::fleet::{Fleet, Line};
use frugal_watch::watch::{Scraper, State};

use crate::cli::WatchArgs;
use crate::config::Config;
use crate::serve::machine_rate;
use crate::table;

pub fn run(config: &Config, catalog: &Catalog, args: &WatchArgs) -> Result<()> {
    // A server named with no price is priced as the nearest catalog CPU instance to this
    // machine's size (asking no cloud: it may run elsewhere), resolved once and said.
    let unpriced = std::cell::OnceCell::new();
    let price = |per_hour: Option<&str>, instance: Option<&str>| {
        if per_hour.is_some() || instance.is_some() {
            let (rate, instance, _) =
                machine_rate(catalog, per_hour, instance, ThisMachine::Nothing)?;
            return Ok((rate, instance));
        }
        if let Some(found) = unpriced.get() {
            return Ok(Clone::clone(found));
        }
        let (rate, instance, said) = machine_rate(catalog, None, None, ThisMachine::BySize)?;
        writeln!(
            std::io::stderr(),
            "frugal watch: servers with no price_per_hour or instance: {said}"
        )?;
        Ok(unpriced.get_or_init(|| (rate, instance)).clone())
    };
    let mut fleet = Fleet::new(&config.watch, &price)?;
    let mut ledger = config.open_ledger()?;
    // Beside the ledger: the last snapshot of each target, for the next scrape.
    let state_path = match config.ledger.path() {
        Some(path) => path.with_extension("watch.json"),
        None => config.beside_ledger().join("ledger.watch.json"),
    };
    let mut state = State::load(&state_path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let scraper = Scraper::default();
    let live = !args.once && std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let now = || {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(0)
    };
    loop {
        let pass = runtime.block_on(fleet.read(&scraper, args.timeout, &mut state, now))?;
        // Every target's interval in one transaction: a crash leaves all or none.
        ledger.append_with_spans("frugal watch", &pass.events, &pass.spans)?;
        let rows: Vec<Row> = pass.lines.iter().map(Row::of).collect();
        print_pass(&mut out, &rows, live.then_some(args.interval))?;
        state.save(&state_path)?;
        if args.once {
            return Ok(());
        }
        std::thread::sleep(args.interval.max(Duration::from_secs(1)));
    }
}

/// A pass's rows: on a terminal (`live`, with the interval), one table redrawn in place,
/// with why a server is a gap under it; elsewhere a line each, for logs and cron.
fn print_pass(out: &mut impl Write, rows: &[Row], live: Option<Duration>) -> Result<()> {
    let Some(interval) = live else {
        for row in rows {
            writeln!(out, "{}", row.line())?;
        }
        return Ok(());
    };
    let mut t = table::new(&[
        "server",
        "req/s>",
        "tok/s in>",
        "tok/s out>",
        "busy>",
        "$/h>",
        "$/1k req>",
        "$/1M tok>",
        "idle so far>",
        "",
    ]);
    // The table keeps a note's gist; why a server is a gap goes under it, whole.
    let mut details = Vec::new();
    for row in rows {
        let mut cells = vec![row.name.clone()];
        cells.extend(
            row.figures
                .clone()
                .unwrap_or_else(|| vec![String::new(); 8]),
        );
        let (gist, detail) = row.note.split_once(": ").unwrap_or((&row.note, ""));
        cells.push(gist.to_owned());
        t.add_row(cells);
        if !detail.is_empty() {
            details.push(format!("{}: {detail}", row.name));
        }
    }
    write!(out, "\x1b[2J\x1b[H")?;
    let every = humantime::format_duration(interval);
    writeln!(out, "frugal watch, every {every}\n{t}")?;
    for detail in details {
        writeln!(out, "{detail}")?;
    }
    Ok(())
}

/// One server in a pass: its figures where it was billed, and a note.
struct Row {
    name: String,
    /// req/s, tok/s in and out, busy, $/h, $/1k req, $/1M tok, idle so far.
    figures: Option<Vec<String>>,
    note: String,
}

impl Row {
    fn of(line: &Line) -> Row {
        match line {
            Line::Note { name, note } => Row {
                name: name.clone(),
                figures: None,
                note: note.clone(),
            },
            Line::Billed {
                name,
                interval,
                cost,
                rate,
                idle_so_far,
            } => Row::billed(name, interval, *cost, *rate, *idle_so_far),
        }
    }

    fn billed(
        name: &str,
        interval: &Interval,
        cost: Money,
        rate: HourlyRate,
        idle_so_far: Money,
    ) -> Row {
        let per = |n: u64, unit: f64| {
            if n == 0 {
                "-".to_owned()
            } else {
                format!("${:.4}", cost.as_f64() * unit / n as f64)
            }
        };
        let rate_of = |n: u64| format!("{:.1}", n as f64 / interval.seconds);
        let counted = |text: String| {
            if interval.counts_requests {
                text
            } else {
                "-".to_owned()
            }
        };
        Row {
            name: name.to_owned(),
            figures: Some(vec![
                counted(rate_of(interval.requests)),
                rate_of(interval.input_tokens),
                rate_of(interval.output_tokens),
                interval
                    .busy_share
                    .map_or_else(|| "-".into(), |b| format!("{:.0}%", b * 100.0)),
                format!("${:.2}", rate.0.as_f64()),
                counted(per(interval.requests, 1e3)),
                per(interval.input_tokens + interval.output_tokens, 1e6),
                format!("${:.4}", idle_so_far.as_f64()),
            ]),
            note: if interval.reset { "restarted" } else { "" }.to_owned(),
        }
    }

    /// The row as a line, for logs and cron.
    fn line(&self) -> String {
        let Some(f) = &self.figures else {
            return format!("{}: {}", self.name, self.note);
        };
        let note = if self.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.note)
        };
        format!(
            "{}: {} req/s, {} tok/s in, {} out, busy {}, {}/h, {}/1k req, {}/1M tok, idle {} so far{note}",
            self.name, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]
        )
    }
}
