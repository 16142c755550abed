//! `frugal watch`: the `[[watch.target]]` servers scraped, and the `[[watch.prometheus]]`
//! fleets queried, every `--interval` (or once); each interval billed into the ledger, and
//! a line per server printed. The reading and billing are `frugal_watch`'s.

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use frugal_cloud::price::ThisMachine;
use frugal_cost::money::HourlyRate;
use frugal_cost::present::{usd, usd_unit};
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
    let live = !args.once && !args.json && std::io::stdout().is_terminal();
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
        if args.json {
            let servers: Vec<ServerJson> = pass.lines.iter().map(ServerJson::of).collect();
            table::write_json_line(
                &mut out,
                &PassJson {
                    at_ms: now(),
                    servers,
                },
            )?;
        } else {
            let rows: Vec<Row> = pass.lines.iter().map(Row::of).collect();
            print_pass(&mut out, &rows, live.then_some(args.interval))?;
        }
        state.save(&state_path)?;
        if args.once {
            // For cron: a target it could not read must not pass unnoticed.
            let gaps = pass.gaps();
            if gaps.is_empty() || args.allow_gaps {
                return Ok(());
            }
            anyhow::bail!(
                "a gap this pass, not billed: {} (--allow-gaps exits 0 on gaps)",
                gaps.join(", ")
            );
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

/// What `unit` of `n` cost (per 1k requests: `unit` 1,000); `None` for none.
fn per_unit(cost: Money, n: u64, unit: i128) -> Option<Money> {
    (n > 0).then(|| cost.mul_div(unit, i128::from(n))).flatten()
}

/// `watch --json`: one pass, a line of JSON.
#[derive(serde::Serialize)]
struct PassJson {
    at_ms: i64,
    servers: Vec<ServerJson>,
}

/// One server in a pass as JSON: its interval's figures where it was billed, else its note.
#[derive(serde::Serialize)]
struct ServerJson {
    name: String,
    note: Option<String>,
    seconds: Option<f64>,
    /// `None` where the server does not count requests.
    requests: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    busy: Option<f64>,
    per_hour: Option<Money>,
    cost: Option<Money>,
    per_1k_requests: Option<Money>,
    per_1m_tokens: Option<Money>,
    idle_so_far: Option<Money>,
    restarted: bool,
}

impl ServerJson {
    fn of(line: &Line) -> ServerJson {
        let mut json = ServerJson {
            name: String::new(),
            note: None,
            seconds: None,
            requests: None,
            input_tokens: None,
            output_tokens: None,
            busy: None,
            per_hour: None,
            cost: None,
            per_1k_requests: None,
            per_1m_tokens: None,
            idle_so_far: None,
            restarted: false,
        };
        match line {
            Line::Note { name, note, .. } => ServerJson {
                name: name.clone(),
                note: Some(note.clone()),
                ..json
            },
            Line::Billed {
                name,
                interval: i,
                cost,
                rate,
                idle_so_far,
            } => {
                let tokens = i.input_tokens + i.output_tokens;
                let counted = i.counts_requests;
                json = ServerJson {
                    name: name.clone(),
                    seconds: Some(i.seconds),
                    requests: counted.then_some(i.requests),
                    input_tokens: Some(i.input_tokens),
                    output_tokens: Some(i.output_tokens),
                    busy: i.busy_share,
                    per_hour: Some(rate.0),
                    cost: Some(*cost),
                    per_1k_requests: per_unit(*cost, i.requests, 1_000).filter(|_| counted),
                    per_1m_tokens: per_unit(*cost, tokens, 1_000_000),
                    idle_so_far: Some(*idle_so_far),
                    restarted: i.reset,
                    ..json
                };
                json
            }
        }
    }
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
            Line::Note { name, note, .. } => Row {
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
        let per =
            |n: u64, unit: i128| per_unit(cost, n, unit).map_or_else(|| "-".to_owned(), usd_unit);
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
                usd(rate.0),
                counted(per(interval.requests, 1_000)),
                per(interval.input_tokens + interval.output_tokens, 1_000_000),
                usd_unit(idle_so_far),
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
