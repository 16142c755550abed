//! Fuzz targets of the demand CSV that `frugal plan` reads: generated series whose hours
//! are known, and a real trace mutated byte by byte.

use proptest::collection::vec;
use proptest::prelude::*;

use super::HOUR_MS;
use super::demand::{DemandOptions, Gaps, HourlyDemand};
use crate::money::Millis;
use frugal_testkit::fuzz::{Mutation, capped, cases, mutate};

/// 2026-12-01 00:00 UTC: "now" for these targets, after every generated sample.
const NOW: Millis = 1_796_083_200_000;

fn options(scale: f64, gaps: Gaps) -> DemandOptions {
    DemandOptions {
        scale,
        gaps,
        now_ms: NOW,
    }
}

fn write_ts(ms: Millis, rfc3339: bool) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap();
    if rfc3339 {
        t.to_rfc3339()
    } else {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_demand_generated", 300)))]

    /// A sorted series over at most three weeks: one value per hour from the first sample's
    /// hour to the last's, each the hour's peak times the scale; missing hours refused, or
    /// carried forward and counted.
    #[test]
    fn fuzz_demand_generated(
        start_hour in 0i64..100_000,
        steps in vec((1i64..400, 0.0f64..1e6), 1..60),
        scale in prop_oneof![Just(1.0), 0.001f64..100.0],
        header in any::<bool>(),
        rfc3339 in any::<bool>(),
    ) {
        // Minutes after a whole hour of 2014 onwards; each sample strictly after the last.
        let mut ms = 1_388_534_400_000 + start_hour * HOUR_MS;
        let mut samples = Vec::new();
        for (gap_min, value) in &steps {
            ms += gap_min * 60_000;
            samples.push((ms, *value));
        }
        let mut text = if header { "timestamp,value\n".to_owned() } else { String::new() };
        for (ms, v) in &samples {
            text += &format!("{},{v}\n", write_ts(*ms, rfc3339));
        }
        let first_hour = samples[0].0 - samples[0].0.rem_euclid(HOUR_MS);
        let hours = ((samples.last().unwrap().0 - first_hour) / HOUR_MS + 1) as usize;
        let mut peak = vec![None::<f64>; hours];
        for (ms, v) in &samples {
            let h = ((ms - first_hour) / HOUR_MS) as usize;
            let v = v * scale;
            peak[h] = Some(peak[h].map_or(v, |p: f64| p.max(v)));
        }
        let missing = peak.iter().filter(|p| p.is_none()).count();

        let refused = HourlyDemand::from_csv(&text, &options(scale, Gaps::Refuse));
        prop_assert_eq!(refused.is_ok(), missing == 0, "{:?}", refused.err());
        let d = HourlyDemand::from_csv(&text, &options(scale, Gaps::CarryForward))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(d.start_ms(), first_hour);
        prop_assert_eq!(d.len(), hours);
        prop_assert_eq!(d.filled_hours(), missing);
        let mut last = 0.0;
        for (h, want) in peak.iter().enumerate() {
            let want = want.unwrap_or(last);
            prop_assert_eq!(d.peak()[h], want, "hour {}", h);
            prop_assert!(d.mean()[h] <= want * (1.0 + 1e-12));
            last = want;
        }
    }
}

/// The first two days of a real trace (data/demand-traces, NYC taxi demand every 30 min).
fn trace() -> Vec<u8> {
    let text =
        std::fs::read_to_string(frugal_testkit::repo("data/demand-traces/nyc_taxi.csv")).unwrap();
    let lines: Vec<&str> = text.lines().take(97).collect();
    format!("{}\n", lines.join("\n")).into_bytes()
}

const DICT: &[&[u8]] = &[
    b",",
    b"\n",
    b"\r\n",
    b"\"",
    b"-",
    b":",
    b"T",
    b"Z",
    b"+05:00",
    b"0",
    b"-1",
    b"1e308",
    b"NaN",
    b"1970-01-01 00:00:00",
    b"0001-01-01 00:00:00",
    b"-262143-01-01 00:00:00",
    b"-9223372036854775808",
    b"\xff",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_demand_mutated_trace", 400)))]

    /// A real trace mutated: hourly demand or an error, in memory bounded by the input, not
    /// by the span of its timestamps.
    #[test]
    fn fuzz_demand_mutated_trace(m in vec(any::<Mutation>(), 0..8), scale in 0.01f64..10.0) {
        let data = mutate(&trace(), &m, DICT);
        let text = String::from_utf8_lossy(&data);
        let (parsed, peak) = capped(64 << 20, &data, || {
            HourlyDemand::from_csv(&text, &options(scale, Gaps::CarryForward))
        });
        // Carried forward, a span of years is a long series; a span of ages is not one.
        prop_assert!(peak <= 64 << 20, "{} bytes", peak);
        if let Ok(d) = parsed {
            prop_assert!(!d.is_empty() && d.peak().iter().all(|p| p.is_finite() && *p >= 0.0));
        }
    }
}

/// A timestamp in each form `parse_ts` reads, across and past its range.
fn timestamp() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|ms| ms.to_string()),
        Just(i64::MIN.to_string()),
        (-262_143i32..=262_143).prop_map(|y| format!("{y:04}-01-01 00:00:00")),
        (1900i32..2026).prop_map(|y| format!("{y}-07-01T00:00:00Z")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_demand_timestamps", 200)))]

    /// A real trace with some of its timestamps replaced, anywhere in time: hourly demand or
    /// an error, in memory bounded by the input, not by the span of its timestamps.
    // It found a far-past first timestamp (epoch ms `-5480954912051333161`) asking for
    // 12 TB, one slot per hour of the span; spans past `MAX_HOURS` are now refused.
    #[test]
    fn fuzz_demand_timestamps(
        replace in vec((any::<prop::sample::Index>(), timestamp()), 1..3),
    ) {
        let trace = String::from_utf8(trace()).unwrap();
        let mut lines: Vec<String> = trace.lines().map(str::to_owned).collect();
        for (at, ts) in &replace {
            let i = 1 + at.index(lines.len() - 1);
            let value = lines[i].split(',').nth(1).unwrap().to_owned();
            lines[i] = format!("{ts},{value}");
        }
        let text = lines.join("\n");
        let (parsed, peak) = capped(64 << 20, text.as_bytes(), || {
            HourlyDemand::from_csv(&text, &options(1.0, Gaps::CarryForward))
        });
        prop_assert!(peak <= 64 << 20, "{} bytes", peak);
        if let Ok(d) = parsed {
            prop_assert!(!d.is_empty());
        }
    }
}
