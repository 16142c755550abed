//! Fuzz targets of the importers: real native CSV, JSONL and FOCUS files mutated byte by
//! byte, and generated rows at the edges of their fields. Every row must become an event
//! that holds together, a row skipped on purpose, or a bad row named by its line.

use std::io::Cursor;

use proptest::collection::vec;
use proptest::prelude::*;

use super::tests::catalog;
use super::*;
use frugal_testkit::fuzz::{Mutation, capped, cases, mutate};

const NATIVE_CSV: &str = "\
ts,duration_s,kind,workload,model,instance_type,capacity,instances,input_tokens,output_tokens,cached_input_tokens,utilization,cost_usd
2026-11-16 18:00:00,,inference,chat,small,,,,1000,200,400,,
2026-11-16T18:00:00Z,5400,training,pretrain,,p3.2xlarge,on_demand,2,,,,0.35,
2026-11-16T19:00:00+01:00,3600,training,pretrain,,p3.2xlarge,spot,1,,,,,
1763316000000,60,idle,chat,,,,,,,,,0.25
";

const JSONL: &str = r#"{"ts": "2026-11-16T18:00:00Z", "kind": "inference", "workload": "chat", "model": "small", "input_tokens": 1000, "output_tokens": 1000, "requests": 3}

{"TS": 1763316000000, "Kind": "training", "workload": "ft", "run_id": "r1", "cost_usd": "12.5", "duration_s": 3600.0, "outcome": "preempted", "lost_s": 600}
{"ts": "2026-11-16 18:00", "end": "2026-11-16T19:30:00Z", "kind": "training", "workload": "ft", "instance_type": "p3.2xlarge", "capacity": "spot", "instances": 2}
"#;

/// Every row `text` holds as `import_file` reads a file named `name`: its format sniffed
/// as there, then the rows; checks what each row became. Returns the rows read.
fn check(text: &[u8], name: &str, catalog: &Catalog) -> Result<usize, TestCaseError> {
    let path = Path::new(name);
    let mut reader = std::io::BufReader::new(Cursor::new(text));
    let format = sniff(&mut reader, path).unwrap();
    let lines = text.split(|b| *b == b'\n').count() as u64;
    let mut rows = Vec::new();
    let (result, peak) = capped(64 << 20, text, || {
        parse_rows(&mut reader, path, format, catalog, &mut |row: Parsed| {
            rows.push((row.line, row.event));
            Ok(())
        })
    });
    prop_assert!(peak <= 64 * text.len() + (1 << 20), "{peak} bytes");
    if let Err(e) = result {
        // A header or a read the importer refuses whole, saying why.
        prop_assert!(!e.to_string().is_empty());
    }
    for (line, event) in &rows {
        prop_assert!(*line >= 1 && *line <= lines, "line {line} of {lines}");
        if let Ok(Some(e)) = event {
            prop_assert!(e.duration_ms >= 0, "line {line}: {e:?}");
        }
    }
    Ok(rows.len())
}

const DICT: &[&[u8]] = &[
    b",",
    b"\n",
    b"\r\n",
    b"\"",
    b"\"\"",
    b"{",
    b"}",
    b":",
    b"-",
    b"T",
    b"Z",
    b"+01:00",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"1e308",
    b"NaN",
    b"-1",
    b"0",
    b"1970-01-01",
    b"262143-12-31 23:59:59",
    b"\xff",
    b"\xc3",
];

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    vec(any::<Mutation>(), 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_import_mutated_files", 400)))]

    /// Real native CSV, JSONL and FOCUS files, mutated.
    #[test]
    fn fuzz_import_mutated_files(which in 0usize..3, m in mutations()) {
        let (seed, name) = [
            (NATIVE_CSV, "usage.csv"),
            (JSONL, "usage.jsonl"),
            (super::tests::FOCUS, "billing.csv"),
        ][which];
        let catalog = catalog();
        check(&mutate(seed.as_bytes(), &m, DICT), name, &catalog)?;
    }
}

/// A timestamp in each form `parse_ts` reads, at the ends of its range and past them.
fn timestamp() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|ms| ms.to_string()),
        (-1i64 << 45..1i64 << 45).prop_map(|ms| ms.to_string()),
        Just(i64::MIN.to_string()),
        Just(i64::MAX.to_string()),
        "[+-]?[0-9]{1,6}-[01][0-9]-[0-3][0-9][T ][0-2][0-9]:[0-5][0-9](:[0-6][0-9](\\.[0-9]{1,9})?)?(Z|[+-][0-2][0-9]:[0-5][0-9])?",
        "[0-9]{4}-[01][0-9]-[0-3][0-9]",
    ]
}

/// A count, a share or seconds: sometimes right, often at or past an edge.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        (0u32..100_000).prop_map(|n| format!("{n}.0")),
        Just("1e308".to_owned()),
        Just("inf".to_owned()),
        Just("NaN".to_owned()),
        Just("-0".to_owned()),
        Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_import_native_rows", 400)))]

    /// Generated native rows at the edges of each field: an event that holds together
    /// (an `end` after `ts` is `ts` plus the duration) or a bad row.
    #[test]
    fn fuzz_import_native_rows(
        rows in vec((
            timestamp(),
            proptest::option::of(timestamp()),
            prop::sample::select(&["inference", "training", "idle", "other", "bogus"][..]),
            prop::sample::select(&["small", "gpt-nope", ""][..]),
            prop::sample::select(&["p3.2xlarge", "", "x9.huge"][..]),
            prop::sample::select(&["on_demand", "spot", "reserved_1y", ""][..]),
            (number(), number(), number(), number()),
            (number(), number()),
        ), 1..6),
    ) {
        let mut csv = String::from(
            "ts,end,kind,workload,model,instance_type,capacity,instances,input_tokens,cached_input_tokens,utilization,cost_usd,lost_s\n",
        );
        for (ts, end, kind, model, instance, capacity, (n, input, cached, util), (cost, lost)) in &rows {
            let end = end.as_deref().unwrap_or("");
            csv += &format!("{ts},{end},{kind},w,{model},{instance},{capacity},{n},{input},{cached},{util},{cost},{lost}\n");
        }
        let catalog = catalog();
        let path = Path::new("usage.csv");
        let mut reader = std::io::BufReader::new(Cursor::new(csv.as_bytes()));
        let mut events = Vec::new();
        parse_rows(&mut reader, path, Format::Csv, &catalog, &mut |row: Parsed| {
            events.push(row.event);
            Ok(())
        })
        .unwrap();
        prop_assert_eq!(events.len(), rows.len());
        for (event, row) in events.iter().zip(&rows) {
            let Ok(Some(e)) = event else { continue };
            prop_assert!(e.duration_ms >= 0, "{e:?}");
            prop_assert!(e.instances >= 1 && e.cached_input_tokens <= e.input_tokens);
            prop_assert!(e.utilization.is_none_or(|u| (0.0..=1.0).contains(&u)));
            prop_assert!(!e.cost.is_negative(), "{e:?}");
            if let Some(end) = &row.1 {
                prop_assert_eq!(Some(e.ts_ms + e.duration_ms), parse_ts(end).ok());
            }
        }
        check(csv.as_bytes(), "usage.csv", &catalog)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_import_focus_rows", 400)))]

    /// Generated FOCUS rows with periods, quantities and tags at their edges.
    #[test]
    fn fuzz_import_focus_rows(
        rows in vec((
            timestamp(),
            proptest::option::of(timestamp()),
            number(),
            number(),
            prop::sample::select(&["Hours", "1K Tokens", "Tokens", "Requests", ""][..]),
            prop::sample::select(&["", "{}", "{\"\"frugal-kind\"\": \"\"training\"\"}", "{\"\"kind\"\": 3}", "[", "{\"\"kind\"\": \"\"bogus\"\"}"][..]),
            prop::sample::select(&["Usage", "Purchase", "Credit", "usage"][..]),
        ), 1..6),
    ) {
        let mut csv = String::from(
            "ChargePeriodStart,ChargePeriodEnd,EffectiveCost,ConsumedQuantity,ConsumedUnit,Tags,ChargeCategory,ChargeDescription\n",
        );
        for (start, end, cost, q, unit, tags, category) in &rows {
            let end = end.as_deref().unwrap_or("");
            csv += &format!("{start},{end},{cost},{q},{unit},\"{tags}\",{category},output tokens\n");
        }
        let catalog = catalog();
        prop_assert!(check(csv.as_bytes(), "billing.csv", &catalog)? <= rows.len());
    }
}

/// Found by `fuzz_import_focus_rows`: a period from epoch ms i64::MIN to 0 wrapped to a
/// negative duration; a row whose end is too far from its start is a bad row now, in both
/// column sets.
#[test]
fn fuzz_import_found_periods_too_long_for_a_duration() {
    let catalog = catalog();
    let rows = |text: &str, name: &str| {
        let mut reader = std::io::BufReader::new(Cursor::new(text.as_bytes()));
        let mut out = Vec::new();
        let format = sniff(&mut reader, Path::new(name)).unwrap();
        parse_rows(
            &mut reader,
            Path::new(name),
            format,
            &catalog,
            &mut |row: Parsed| {
                out.push(row.event.map(|e| e.map(|e| e.duration_ms)));
                Ok(())
            },
        )
        .unwrap();
        out
    };
    let focus = "ChargePeriodStart,ChargePeriodEnd,EffectiveCost\n\
                 -9223372036854775808,0,0.0\n\
                 -9223372036854775808,-1,0.0\n";
    assert_eq!(
        rows(focus, "billing.csv"),
        [
            Err("ChargePeriodEnd: the charge period is too long to be a duration".to_owned()),
            Ok(Some(i64::MAX)),
        ]
    );
    let native = "ts,end,kind,workload,cost_usd\n\
                  -9223372036854775808,1,idle,w,1\n\
                  9223372036854775807,-9223372036854775808,idle,w,1\n";
    assert_eq!(
        rows(native, "usage.csv"),
        [
            Err("end: too far after ts to be a duration".to_owned()),
            Err("end: before ts by 18446744073709551615 ms".to_owned()),
        ]
    );
}
