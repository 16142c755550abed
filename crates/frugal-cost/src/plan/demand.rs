//! Hourly demand in instances of one type, from a `timestamp,value` CSV or from a series the
//! caller already holds.
//!
//! A file is taken as written or refused with the line at fault: no sorting, no dropping of
//! repeats, no filling of missing hours unless the caller asks for it. A planner fed a
//! silently repaired series recommends a commitment for demand that never happened.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::HOUR_MS;
use crate::import::parse_ts;
use crate::money::Millis;

/// A value this close above a whole number counts as that number when rounded up to whole
/// instances: a scale of 0.1 turns 30 into 3.0000000000000004, which is three instances.
const WHOLE_TOLERANCE: f64 = 1e-9;

/// The longest demand series read, in years, and so the most hours held per series (three
/// `Vec`s of ~88,000 values, about 2 MB). A commitment runs three years at most and its
/// backtest wants as much history; a span past ten years is a wrong timestamp (a year 1,
/// seconds read as milliseconds), and every hour of it would be allocated.
pub const MAX_YEARS: i64 = 10;
pub const MAX_HOURS: usize = MAX_YEARS as usize * 366 * 24;

#[derive(Debug, thiserror::Error)]
pub enum DemandError {
    #[error("cannot read demand file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("demand line {line}: {message}")]
    Line { line: u64, message: String },
    #[error("demand line {line}: timestamp `{timestamp}` repeats line {first}")]
    Duplicate {
        line: u64,
        first: u64,
        timestamp: String,
    },
    #[error(
        "demand line {line}: timestamp `{timestamp}` is earlier than line {previous}'s \
         `{previous_timestamp}`; sort the file by time"
    )]
    Unsorted {
        line: u64,
        timestamp: String,
        previous: u64,
        previous_timestamp: String,
    },
    #[error(
        "demand has {missing} hours with no sample, the first at {first_missing}; \
         fill the file or allow filling gaps"
    )]
    Gaps {
        missing: usize,
        first_missing: String,
    },
    #[error(
        "demand line {line}: timestamp `{timestamp}` is more than {MAX_YEARS} years after \
         line {first}'s `{first_timestamp}`; a timestamp is wrong, or the file holds more \
         history than a plan reads"
    )]
    Span {
        line: u64,
        timestamp: String,
        first: u64,
        first_timestamp: String,
    },
    #[error("demand has no samples")]
    Empty,
    #[error("scale must be a positive finite number, got {0}")]
    Scale(f64),
    #[error("demand hour {hour}: {value} is not a number of instances (finite, >= 0)")]
    Value { hour: usize, value: f64 },
    #[error("demand series must start on a whole hour, got {start_ms} ms since the epoch")]
    Unaligned { start_ms: Millis },
}

/// What to do with hours that have no sample between the first and the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gaps {
    /// Refuse the file, saying how many hours are missing.
    #[default]
    Refuse,
    /// Repeat the previous hour's demand into each missing hour, and count them.
    CarryForward,
}

/// How to read a demand file.
#[derive(Debug, Clone, Copy)]
pub struct DemandOptions {
    /// Instances of the planned type per unit of the file's value.
    pub scale: f64,
    pub gaps: Gaps,
    /// Samples later than this are refused: demand that has not happened yet is a forecast,
    /// and a forecast is not history to fit a commitment on.
    pub now_ms: Millis,
}

impl DemandOptions {
    /// Reading at `scale`, refusing gaps, with the clock's now as the latest time allowed.
    pub fn new(scale: f64) -> DemandOptions {
        DemandOptions {
            scale,
            gaps: Gaps::Refuse,
            now_ms: chrono::Utc::now().timestamp_millis(),
        }
    }
}

/// Demand per hour, in instances (fractional as measured; `instances` rounds up).
///
/// An hour's demand is the peak of its samples, not their mean: capacity for an hour must
/// cover its busiest moment, and a commitment is billed by the whole instance-hour whether
/// the instance is busy all of it or not. The mean is kept for charts and for judging how
/// peaky an hour is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HourlyDemand {
    start_ms: Millis,
    peak: Vec<f64>,
    mean: Vec<f64>,
    filled: usize,
}

impl HourlyDemand {
    /// A series already hourly (the ledger's busy instances per hour), starting on a whole
    /// hour; each value must be a finite count of instances >= 0.
    pub fn from_hourly(start_ms: Millis, values: Vec<f64>) -> Result<HourlyDemand, DemandError> {
        if start_ms.rem_euclid(HOUR_MS) != 0 {
            return Err(DemandError::Unaligned { start_ms });
        }
        if values.is_empty() {
            return Err(DemandError::Empty);
        }
        if let Some((hour, &value)) = values
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(DemandError::Value { hour, value });
        }
        Ok(HourlyDemand {
            start_ms,
            mean: values.clone(),
            peak: values,
            filled: 0,
        })
    }

    /// Reads a demand file (see `from_csv`).
    pub fn read_csv(path: &Path, options: &DemandOptions) -> Result<HourlyDemand, DemandError> {
        let text = std::fs::read_to_string(path).map_err(|source| DemandError::Read {
            path: path.to_owned(),
            source,
        })?;
        HourlyDemand::from_csv(&text, options)
    }

    /// Parses `timestamp,value` lines (a header line is optional), each value times
    /// `options.scale` instances, into peaks per hour. Timestamps are RFC 3339, or
    /// `YYYY-MM-DD HH:MM:SS` read as UTC (see `import::parse_ts` for every form).
    pub fn from_csv(text: &str, options: &DemandOptions) -> Result<HourlyDemand, DemandError> {
        if !(options.scale.is_finite() && options.scale > 0.0) {
            return Err(DemandError::Scale(options.scale));
        }
        let samples = samples(text, options)?;
        let (first_ts, _) = samples.first().ok_or(DemandError::Empty)?;
        let start_ms = first_ts - first_ts.rem_euclid(HOUR_MS);
        let (mut peak, mut mean) = (Vec::<f64>::new(), Vec::<f64>::new());
        let mut seen = Vec::<u32>::new();
        for &(ts, value) in &samples {
            let hour = ((ts - start_ms) / HOUR_MS) as usize;
            if hour >= peak.len() {
                peak.resize(hour + 1, 0.0);
                mean.resize(hour + 1, 0.0);
                seen.resize(hour + 1, 0);
            }
            peak[hour] = peak[hour].max(value);
            mean[hour] += value;
            seen[hour] += 1;
        }
        for (m, &n) in mean.iter_mut().zip(&seen) {
            if n > 0 {
                *m /= f64::from(n);
            }
        }
        let missing: Vec<usize> = (0..seen.len()).filter(|&h| seen[h] == 0).collect();
        if let (Some(&first), Gaps::Refuse) = (missing.first(), options.gaps) {
            return Err(DemandError::Gaps {
                missing: missing.len(),
                first_missing: format_hour(start_ms + first as Millis * HOUR_MS),
            });
        }
        for &h in &missing {
            // The first hour always has a sample, so `h - 1` exists and is already filled.
            peak[h] = peak[h - 1];
            mean[h] = mean[h - 1];
        }
        Ok(HourlyDemand {
            start_ms,
            peak,
            mean,
            filled: missing.len(),
        })
    }

    /// The first hour, in ms since the epoch.
    pub fn start_ms(&self) -> Millis {
        self.start_ms
    }

    /// Number of hours, gaps filled included.
    pub fn len(&self) -> usize {
        self.peak.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peak.is_empty()
    }

    /// The span in days.
    pub fn days(&self) -> f64 {
        self.len() as f64 / 24.0
    }

    /// Peak instances per hour.
    pub fn peak(&self) -> &[f64] {
        &self.peak
    }

    /// Mean instances per hour over the hour's samples.
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// Hours with no sample that were filled by carrying the previous hour forward.
    pub fn filled_hours(&self) -> usize {
        self.filled
    }

    /// Whole instances per hour: each hour's peak rounded up, since a fraction of an
    /// instance cannot be bought.
    pub fn instances(&self) -> Vec<u32> {
        self.peak
            .iter()
            .map(|&p| (p - WHOLE_TOLERANCE).ceil().clamp(0.0, f64::from(u32::MAX)) as u32)
            .collect()
    }
}

/// The file's samples as (ms, scaled value), checked for order, repeats and the future.
fn samples(text: &str, options: &DemandOptions) -> Result<Vec<(Millis, f64)>, DemandError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut out = Vec::new();
    let mut first_line = HashMap::<Millis, u64>::new();
    // (ms, line, text) of the latest sample, for the unsorted error.
    let mut previous: Option<(Millis, u64, String)> = None;
    // (its hour's start, line, text) of the first sample, for the span.
    let mut earliest: Option<(Millis, u64, String)> = None;
    for (index, record) in reader.records().enumerate() {
        let line_error = |line: u64, message: String| DemandError::Line { line, message };
        let record = record.map_err(|e| {
            let line = e.position().map_or(index as u64 + 1, |p| p.line());
            line_error(line, e.to_string())
        })?;
        let line = record.position().map_or(index as u64 + 1, |p| p.line());
        let (Some(ts_text), Some(value_text), 2) = (record.get(0), record.get(1), record.len())
        else {
            return Err(line_error(
                line,
                format!("expected `timestamp,value`, got {} fields", record.len()),
            ));
        };
        let ts = parse_ts(ts_text);
        let value = value_text.parse::<f64>();
        if index == 0 && ts.is_err() && value.is_err() {
            continue; // the header
        }
        let ts = ts.map_err(|e| line_error(line, e))?;
        // A date, so that whole hours and spans of it cannot overflow.
        if chrono::DateTime::from_timestamp_millis(ts).is_none() {
            return Err(line_error(
                line,
                format!("timestamp `{ts_text}` is not a date (out of range)"),
            ));
        }
        let value =
            value.map_err(|_| line_error(line, format!("value `{value_text}` is not a number")))?;
        if !value.is_finite() || value < 0.0 {
            return Err(line_error(
                line,
                format!("value {value_text} is not a count >= 0"),
            ));
        }
        if ts > options.now_ms {
            return Err(line_error(
                line,
                format!("timestamp `{ts_text}` is in the future"),
            ));
        }
        if let Some(&first) = first_line.get(&ts) {
            return Err(DemandError::Duplicate {
                line,
                first,
                timestamp: ts_text.to_owned(),
            });
        }
        if let Some((prev_ts, prev_line, prev_text)) = previous.take()
            && ts < prev_ts
        {
            return Err(DemandError::Unsorted {
                line,
                timestamp: ts_text.to_owned(),
                previous: prev_line,
                previous_timestamp: prev_text,
            });
        }
        // Sorted, so the first sample is the earliest: the span is checked as it grows,
        // before anything is allocated for it.
        let (first_hour, first, first_text) =
            earliest.get_or_insert_with(|| (ts - ts.rem_euclid(HOUR_MS), line, ts_text.to_owned()));
        if i128::from(ts) - i128::from(*first_hour) >= MAX_HOURS as i128 * i128::from(HOUR_MS) {
            return Err(DemandError::Span {
                line,
                timestamp: ts_text.to_owned(),
                first: *first,
                first_timestamp: first_text.clone(),
            });
        }
        first_line.insert(ts, line);
        previous = Some((ts, line, ts_text.to_owned()));
        out.push((ts, value * options.scale));
    }
    Ok(out)
}

/// An hour as `YYYY-MM-DD HH:00 UTC`, for messages.
fn format_hour(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms} ms"),
        |t| t.format("%Y-%m-%d %H:00 UTC").to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2014-07-01 00:00 UTC.
    const JULY_1: Millis = 1_404_172_800_000;

    fn opts() -> DemandOptions {
        DemandOptions {
            scale: 1.0,
            gaps: Gaps::Refuse,
            now_ms: JULY_1 + 365 * 24 * HOUR_MS,
        }
    }

    fn parse(text: &str) -> Result<HourlyDemand, DemandError> {
        HourlyDemand::from_csv(text, &opts())
    }

    #[test]
    fn takes_the_peak_and_the_mean_of_each_hour() {
        let d = parse(
            "timestamp,value\n\
             2014-07-01 00:00:00,4\n\
             2014-07-01 00:30:00,10\n\
             2014-07-01 01:00:00,3\n",
        )
        .unwrap();
        assert_eq!(d.start_ms(), JULY_1);
        assert_eq!(d.peak(), &[10.0, 3.0]);
        assert_eq!(d.mean(), &[7.0, 3.0]);
        assert_eq!(d.instances(), vec![10, 3]);
        assert_eq!(d.filled_hours(), 0);
    }

    #[test]
    fn reads_without_a_header_and_with_rfc3339() {
        let d = parse("2014-07-01T00:10:00Z,1.5\n2014-07-01T01:00:00+00:00,2\n").unwrap();
        assert_eq!(d.start_ms(), JULY_1);
        assert_eq!(d.peak(), &[1.5, 2.0]);
        // Half an instance more is a whole instance more; float dust from a scale is not.
        assert_eq!(d.instances(), vec![2, 2]);
        let scaled = HourlyDemand::from_csv(
            "2014-07-01 00:00:00,30\n",
            &DemandOptions {
                scale: 0.1,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(scaled.instances(), vec![3]);
    }

    #[test]
    fn an_unparsable_line_is_named() {
        let err = parse("timestamp,value\n2014-07-01 00:00:00,4\nyesterday,5\n").unwrap_err();
        assert!(matches!(err, DemandError::Line { line: 3, .. }), "{err}");
        assert!(
            err.to_string().contains("`yesterday` is not a timestamp"),
            "{err}"
        );
        let err = parse("2014-07-01 00:00:00,four\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "demand line 1: value `four` is not a number"
        );
        let err = parse("2014-07-01 00:00:00,4,5\n").unwrap_err();
        assert!(err.to_string().contains("got 3 fields"), "{err}");
    }

    #[test]
    fn a_negative_value_is_refused() {
        let err = parse("2014-07-01 00:00:00,4\n2014-07-01 00:30:00,-1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "demand line 2: value -1 is not a count >= 0"
        );
        assert!(parse("2014-07-01 00:00:00,NaN\n").is_err());
    }

    #[test]
    fn a_duplicate_timestamp_names_both_lines() {
        let err = parse(
            "timestamp,value\n2014-07-01 00:00:00,4\n2014-07-01 00:30:00,5\n\
             2014-07-01 00:30:00,6\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "demand line 4: timestamp `2014-07-01 00:30:00` repeats line 3"
        );
        // The same instant written another way is the same sample.
        let err = parse("2014-07-01 00:00:00,4\n2014-07-01T00:00:00Z,4\n").unwrap_err();
        assert!(matches!(
            err,
            DemandError::Duplicate {
                line: 2,
                first: 1,
                ..
            }
        ));
    }

    #[test]
    fn unsorted_timestamps_name_both_lines() {
        let err = parse("2014-07-01 00:00:00,4\n2014-07-01 01:00:00,5\n2014-07-01 00:30:00,6\n")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "demand line 3: timestamp `2014-07-01 00:30:00` is earlier than line 2's \
             `2014-07-01 01:00:00`; sort the file by time"
        );
    }

    #[test]
    fn a_timestamp_in_the_future_is_refused() {
        let options = DemandOptions {
            now_ms: JULY_1 + HOUR_MS,
            ..opts()
        };
        let err = HourlyDemand::from_csv(
            "2014-07-01 00:00:00,4\n2014-07-01 01:00:00,4\n2014-07-01 01:00:01,4\n",
            &options,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "demand line 3: timestamp `2014-07-01 01:00:01` is in the future"
        );
    }

    /// Issue 31: a far-past timestamp made an hourly series of the whole span (a 20 GB
    /// allocation), and `i64::MIN` wrapped. Absurd spans are refused, naming the lines, before
    /// anything is allocated for them, with or without gaps filled.
    #[test]
    fn absurd_timestamps_are_refused_before_any_allocation() {
        let fill = DemandOptions {
            gaps: Gaps::CarryForward,
            ..opts()
        };
        for (text, says) in [
            (
                "0001-01-01 00:00:00,1\n2014-07-01 00:00:00,1\n",
                "demand line 2: timestamp `2014-07-01 00:00:00` is more than 10 years after \
                 line 1's `0001-01-01 00:00:00`",
            ),
            (
                "-9223372036854775808,1\n2014-07-01 00:00:00,1\n",
                "demand line 1: timestamp `-9223372036854775808` is not a date (out of range)",
            ),
            (
                "-9000000000000000,1\n1404172800000,1\n",
                "demand line 1: timestamp `-9000000000000000` is not a date (out of range)",
            ),
            (
                "2014-07-01 00:00:00,1\n9223372036854775807,1\n",
                "demand line 2: timestamp `9223372036854775807` is not a date (out of range)",
            ),
            // Seconds since the epoch read as milliseconds: January 1970, then 2014.
            (
                "1404172800,1\n1404172800000,1\n",
                "demand line 2: timestamp `1404172800000` is more than 10 years after line 1's",
            ),
        ] {
            for options in [opts(), fill] {
                let err = HourlyDemand::from_csv(text, &options).unwrap_err();
                assert!(err.to_string().starts_with(says), "{err}");
            }
        }
        // Just inside the limit is read, every hour of it.
        let last = JULY_1 + (MAX_HOURS as Millis - 1) * HOUR_MS;
        let options = DemandOptions {
            now_ms: last,
            ..fill
        };
        let d = HourlyDemand::from_csv(&format!("{JULY_1},1\n{last},2\n"), &options).unwrap();
        assert_eq!(d.len(), MAX_HOURS);
        assert_eq!(d.filled_hours(), MAX_HOURS - 2);
    }

    #[test]
    fn gaps_are_refused_with_a_count_unless_filling_is_allowed() {
        let text = "2014-07-01 00:00:00,4\n2014-07-01 01:00:00,5\n2014-07-01 04:30:00,6\n";
        let err = parse(text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "demand has 2 hours with no sample, the first at 2014-07-01 02:00 UTC; \
             fill the file or allow filling gaps"
        );
        let options = DemandOptions {
            gaps: Gaps::CarryForward,
            ..opts()
        };
        let d = HourlyDemand::from_csv(text, &options).unwrap();
        assert_eq!(d.peak(), &[4.0, 5.0, 5.0, 5.0, 6.0]);
        assert_eq!(d.filled_hours(), 2);
    }

    #[test]
    fn empty_input_and_a_bad_scale_are_refused() {
        assert!(matches!(
            parse("timestamp,value\n"),
            Err(DemandError::Empty)
        ));
        assert!(matches!(parse(""), Err(DemandError::Empty)));
        for scale in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let options = DemandOptions { scale, ..opts() };
            assert!(matches!(
                HourlyDemand::from_csv("2014-07-01 00:00:00,4\n", &options),
                Err(DemandError::Scale(_))
            ));
        }
    }

    #[test]
    fn an_in_memory_series_is_checked() {
        let d = HourlyDemand::from_hourly(JULY_1, vec![1.0, 2.5]).unwrap();
        assert_eq!(d.instances(), vec![1, 3]);
        assert_eq!(d.mean(), d.peak());
        assert!(matches!(
            HourlyDemand::from_hourly(JULY_1 + 1, vec![1.0]),
            Err(DemandError::Unaligned { .. })
        ));
        assert!(matches!(
            HourlyDemand::from_hourly(JULY_1, vec![1.0, -2.0]),
            Err(DemandError::Value { hour: 1, .. })
        ));
        assert!(matches!(
            HourlyDemand::from_hourly(JULY_1, vec![]),
            Err(DemandError::Empty)
        ));
    }

    #[test]
    fn reads_the_shipped_nyc_taxi_series() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/demand-traces/nyc_taxi.csv");
        let d = HourlyDemand::read_csv(&path, &DemandOptions::new(1.0)).unwrap();
        // 10,320 half-hour samples from 2014-07-01 to 2015-01-31: 5,160 hours, none missing.
        assert_eq!(d.len(), 5160);
        assert_eq!(d.filled_hours(), 0);
        assert_eq!(d.start_ms(), JULY_1);
        assert_eq!(d.peak().iter().copied().fold(0.0, f64::max), 39197.0);
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let err =
            HourlyDemand::read_csv(Path::new("/nonexistent/demand.csv"), &opts()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read demand file /nonexistent/demand.csv"
        );
    }
}
