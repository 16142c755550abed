//! Ledger throughput at scale: import rate of a 10-million-event CSV (parse, price from
//! the catalog, insert) and the time of a full report over it, on SQLite and then on
//! PostgreSQL in the same run.
//!
//! Then the gateway's meter on each: K concurrent writers (each its own `Ledger`, as
//! separate gateways have), each group-committing batches of B events with ids as fast as
//! it can, for `$FRUGAL_BENCH_METER_SECS` (default 3; 0 skips) per (K, B): events/s and the
//! commit latency's p50 and p99.
//!
//! `cargo bench -p frugal-cost --bench ledger [-- EVENTS]`; the files go to a temp folder
//! (or `$FRUGAL_BENCH_DIR`) and are removed afterwards. PostgreSQL is `$FRUGAL_BENCH_PG` (a
//! URL of an empty database), else a throwaway server started here (durable: fsync on),
//! else skipped when none is installed; `$FRUGAL_BENCH_PG_SETTINGS` (`name=value,...`, e.g.
//! `shared_buffers=2GB,max_wal_size=8GB`) sets that server up otherwise than by default,
//! and `FRUGAL_BENCH_SQLITE=0` leaves SQLite out. Figures go to BENCHMARKS.md.

// A benchmark reports on stdout.
#![allow(clippy::print_stdout)]

use std::io::{BufWriter, Write};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use frugal_cost::catalog::PriceSource;
use frugal_cost::import::{ImportOptions, import_file};
use frugal_cost::report::Report;
use frugal_cost::{Catalog, Event, Kind, Ledger, Location, Money, NoProgress, Window};

const WORKLOADS: &[&str] = &["chat", "code-assist", "search", "summarize", "agents"];
const MODELS: &[&str] = &["small", "medium", "large"];
/// Concurrent gateways and events per group commit the meter is measured at.
const GATEWAYS: &[usize] = &[1, 4, 8];
const BATCHES: &[usize] = &[1, 64, 512];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let events: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let dir = match std::env::var_os("FRUGAL_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let csv = dir.path().join("usage.csv");
    let started = Instant::now();
    write_usage(&csv, events)?;
    let csv_bytes = std::fs::metadata(&csv)?.len();
    println!(
        "generated {events} events ({:.0} MB CSV) in {:.1}s",
        csv_bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    let mut catalog = Catalog::builtin()?;
    catalog.extend_from_toml(
        "[[model]]\nname='small'\ninput=0.1\noutput=0.4\n\
         [[model]]\nname='medium'\ninput=0.5\noutput=1.5\ncached_input=0.25\n\
         [[model]]\nname='large'\ninput=2.5\noutput=10\ncached_input=1.25\n",
        PriceSource::Builtin,
    )?;
    let meter_secs: f64 = match std::env::var("FRUGAL_BENCH_METER_SECS") {
        Ok(s) => s.parse()?,
        Err(_) => 3.0,
    };
    let mut meters = Vec::new();
    let mut sqlite = None;
    if std::env::var("FRUGAL_BENCH_SQLITE").as_deref() != Ok("0") {
        let path = dir.path().join("ledger.sqlite");
        sqlite = Some(run(
            Location::Sqlite(path.clone()),
            &csv,
            csv_bytes,
            &catalog,
        )?);
        if meter_secs > 0.0 {
            meters.push((
                "sqlite",
                meter(&Location::Sqlite(path.clone()), meter_secs)?,
            ));
        }
        println!(
            "ledger file {:.0} MB",
            std::fs::metadata(&path)?.len() as f64 / 1e6
        );
    }
    // Kept until the end of the run: the server stops when dropped.
    let mut server = None;
    let url = match std::env::var("FRUGAL_BENCH_PG") {
        Ok(url) => Some(url),
        Err(_) => match frugal_testkit::postgres::Server::start_durable() {
            Ok(mut s) => {
                if let Ok(settings) = std::env::var("FRUGAL_BENCH_PG_SETTINGS") {
                    configure(&mut s, &settings)?;
                }
                let url = s.database()?;
                server = Some(s);
                Some(url)
            }
            Err(e) => {
                println!("postgres: {e}; skipped");
                None
            }
        },
    };
    if let Some(url) = url {
        let pg = run(Location::Postgres(url.clone()), &csv, csv_bytes, &catalog)?;
        if let Some(sqlite) = sqlite {
            println!(
                "postgres / sqlite: import rate {:.2}x, report time {:.2}x",
                pg.0 / sqlite.0,
                pg.1 / sqlite.1
            );
        }
        if meter_secs > 0.0 {
            meters.push(("postgres", meter(&Location::Postgres(url), meter_secs)?));
        }
    }
    drop(server);
    if !meters.is_empty() {
        print_meters(&meters, meter_secs);
    }
    peer_sqlite3(dir.path(), &csv);
    Ok(())
}

/// Sets the throwaway server's `name=value,...` settings and restarts it.
fn configure(
    server: &mut frugal_testkit::postgres::Server,
    settings: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut admin = postgres::Client::connect(&server.url_of("postgres"), postgres::NoTls)?;
    for setting in settings.split(',').filter(|s| !s.trim().is_empty()) {
        let (name, value) = setting
            .split_once('=')
            .ok_or_else(|| format!("{setting:?} is not name=value"))?;
        let (name, value) = (name.trim(), value.trim().replace('\'', "''"));
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{name:?} is not a setting's name").into());
        }
        admin.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'"))?;
    }
    drop(admin);
    server.restart()?;
    println!("postgres settings: {settings}");
    Ok(())
}

/// Imports `csv` into a new ledger at `location`, then reports over it three times and
/// scans its raw events; returns the import rate (events/s) and the best report time (s).
fn run(
    location: Location,
    csv: &std::path::Path,
    csv_bytes: u64,
    catalog: &Catalog,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let label = match location {
        Location::Sqlite(_) => "sqlite",
        Location::Postgres(_) => "postgres",
    };
    let mut ledger = Ledger::open(&location)?;
    let options = ImportOptions::default();
    let started = Instant::now();
    let summary = import_file(&mut ledger, catalog, csv, options, &NoProgress)?;
    let secs = started.elapsed().as_secs_f64();
    let rate = summary.imported as f64 / secs;
    println!(
        "{label} import: {} events in {secs:.2}s = {rate:.0} events/s ({:.0} MB/s of CSV)",
        summary.imported,
        csv_bytes as f64 / 1e6 / secs,
    );
    drop(ledger);

    let ledger = Ledger::open_existing(&location)?;
    let mut best = f64::MAX;
    for run in 1..=3 {
        let started = Instant::now();
        let report = Report::build(&ledger, catalog, Window::default())?;
        let secs = started.elapsed().as_secs_f64();
        best = best.min(secs);
        println!(
            "{label} report {run}: {} events in {secs:.3}s ({} total, {} inference lines)",
            report.events,
            report.total,
            report.inference.len()
        );
    }
    // What a report that reads every raw event would pay just to read them.
    let started = Instant::now();
    let rows = ledger.scan(Window::default(), |_| {})?;
    println!(
        "{label} raw event scan: {rows} rows in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    Ok((rate, best))
}

/// One (gateways, batch) point of the meter's benchmark.
struct MeterPoint {
    gateways: usize,
    batch: usize,
    events_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Commits that failed (and were retried, as the meter does).
    failed: u64,
}

/// The meter's group commits from 1, 4 and 8 concurrent gateways into the ledger at
/// `location`, `secs` per point.
fn meter(location: &Location, secs: f64) -> Result<Vec<MeterPoint>, Box<dyn std::error::Error>> {
    let mut points = Vec::new();
    for &gateways in GATEWAYS {
        for &batch in BATCHES {
            let ledgers = (0..gateways)
                .map(|_| Ledger::open(location))
                .collect::<Result<Vec<_>, _>>()?;
            let start = Barrier::new(gateways);
            let results: Vec<(Vec<Duration>, u64, u64)> = std::thread::scope(|s| {
                let writers: Vec<_> = ledgers
                    .into_iter()
                    .enumerate()
                    .map(|(g, ledger)| {
                        let start = &start;
                        s.spawn(move || gateway(ledger, g, batch, secs, start))
                    })
                    .collect();
                writers
                    .into_iter()
                    .map(|w| w.join().unwrap_or_default())
                    .collect()
            });
            let mut latencies: Vec<Duration> =
                results.iter().flat_map(|r| r.0.iter().copied()).collect();
            latencies.sort_unstable();
            let events: u64 = results.iter().map(|r| r.1).sum();
            let failed: u64 = results.iter().map(|r| r.2).sum();
            let at = |p: f64| {
                let rank = ((latencies.len() as f64 * p).ceil() as usize).max(1);
                latencies
                    .get(rank - 1)
                    .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
            };
            let point = MeterPoint {
                gateways,
                batch,
                events_per_s: events as f64 / secs,
                p50_ms: at(0.50),
                p99_ms: at(0.99),
                max_ms: at(1.0),
                failed,
            };
            println!(
                "{location} meter: {gateways} gateways x {batch} events a commit: {:.0} events/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {failed} failed",
                point.events_per_s, point.p50_ms, point.p99_ms, point.max_ms
            );
            points.push(point);
        }
    }
    Ok(points)
}

/// One gateway's meter: group commits of `batch` events, each with a random id as the
/// gateway's meter gives them, as fast as the ledger takes them, for `secs`; a failed
/// commit is retried. Returns each commit's latency, the events stored and the failures.
fn gateway(
    mut ledger: Ledger,
    g: usize,
    batch: usize,
    secs: f64,
    start: &Barrier,
) -> (Vec<Duration>, u64, u64) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ ((g as u64 + 1) << 32) ^ batch as u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut latencies, mut stored, mut failed) = (Vec::new(), 0, 0);
    start.wait();
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        let now_ms = 1_796_000_000_000 + started.elapsed().as_millis() as i64;
        let events: Vec<Event> = (0..batch)
            .map(|_| {
                let r = next();
                let mut e = Event::new(
                    now_ms,
                    Kind::Inference,
                    WORKLOADS[(r % 5) as usize],
                    Money::from_nanos((r >> 8) as i64 % 1_000_000),
                );
                e.model = Some(MODELS[((r >> 20) % 3) as usize].into());
                e.tenant = Some(format!("tenant-{}", (r >> 30) % 20));
                e.requests = 1;
                e.input_tokens = 50 + (r >> 8) % 4000;
                e.output_tokens = 5 + (r >> 24) % 500;
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&next().to_le_bytes());
                id[8..].copy_from_slice(&next().to_le_bytes());
                e.id = Some(id);
                e
            })
            .collect();
        let t = Instant::now();
        match ledger.append_with_spans("frugal serve", &events, &[]) {
            Ok(n) => {
                latencies.push(t.elapsed());
                stored += n;
            }
            Err(_) => failed += 1,
        }
    }
    (latencies, stored, failed)
}

fn print_meters(meters: &[(&str, Vec<MeterPoint>)], secs: f64) {
    println!();
    println!(
        "meter: group commits with ids, K gateways (one ledger handle each), {secs} s a point"
    );
    println!(
        "{:<9} {:>2} {:>6} {:>11} {:>9} {:>9} {:>9} {:>7}",
        "backend", "K", "batch", "events/s", "p50 ms", "p99 ms", "max ms", "failed"
    );
    for (label, points) in meters {
        for p in points {
            println!(
                "{label:<9} {:>2} {:>6} {:>11.0} {:>9.2} {:>9.2} {:>9.1} {:>7}",
                p.gateways, p.batch, p.events_per_s, p.p50_ms, p.p99_ms, p.max_ms, p.failed
            );
        }
    }
}

/// The same CSV through the sqlite3 shell, when it is installed: `.import` into a plain
/// table (no parsing of times, no pricing, no rollups) and one GROUP BY over it.
fn peer_sqlite3(dir: &std::path::Path, csv: &std::path::Path) {
    let db = dir.join("peer.sqlite");
    let run = |sql: &str| {
        let started = Instant::now();
        let status = std::process::Command::new("sqlite3")
            .arg(&db)
            .arg(sql)
            .stdout(std::process::Stdio::null())
            .status();
        status
            .ok()
            .filter(|s| s.success())
            .map(|_| started.elapsed().as_secs_f64())
    };
    let import = format!(".import --csv {} raw", csv.display());
    let Some(import_secs) = run(&import) else {
        println!("peer: sqlite3 shell not found; skipped");
        return;
    };
    println!("peer sqlite3 .import: {import_secs:.2}s");
    let query = "SELECT workload, model, count(*), sum(input_tokens), sum(output_tokens) FROM raw GROUP BY 1, 2";
    if let Some(secs) = run(query) {
        println!("peer sqlite3 GROUP BY workload, model over raw rows: {secs:.2}s");
    }
}

/// A week of inference events over five workloads and three models, with a tenth of the
/// rows on a self-hosted instance, in frugal's CSV columns.
fn write_usage(path: &std::path::Path, events: usize) -> std::io::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    writeln!(
        out,
        "ts,kind,workload,model,instance_type,duration_s,input_tokens,output_tokens,cached_input_tokens,cost_usd"
    )?;
    let start_ms: i64 = 1_795_392_000_000; // 2026-11-23T00:00:00Z
    let step = 7 * 86_400_000 / events.max(1) as i64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..events {
        // xorshift: cheap, deterministic token counts.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let ts = start_ms + i as i64 * step.max(1);
        let workload = WORKLOADS[(x % 5) as usize];
        let input = 50 + (x >> 8) % 4000;
        let output = 5 + (x >> 24) % 500;
        if i % 10 == 0 {
            let busy = (input as f64 / 8000.0 + output as f64 / 400.0) as f32;
            writeln!(
                out,
                "{ts},inference,{workload},self-hosted,g5.2xlarge,{busy:.3},{input},{output},,"
            )?;
        } else {
            let model = MODELS[((x >> 40) % 3) as usize];
            let cached = input / 4;
            writeln!(
                out,
                "{ts},inference,{workload},{model},,,{input},{output},{cached},"
            )?;
        }
    }
    out.flush()
}
