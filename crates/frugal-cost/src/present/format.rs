//! Money, counts, shares and times as people read them.

use chrono::DateTime;

use crate::money::{Millis, Money};

/// A cent in nano-dollars: below it, cents would print a nonzero amount as `$0.00`.
const CENT: u64 = 10_000_000;

/// Dollars with thousands separators and cents: `-$1,234.57`; under a cent, two
/// significant digits (`$0.0038`, `$0.000012`): no amount but zero reads `$0.00`.
pub fn usd(m: Money) -> String {
    let places = if m.nanos().unsigned_abs() < CENT {
        m.places_for(2, 2)
    } else {
        2
    };
    usd_text(&m.to_string_places(places))
}

/// A unit cost, or any amount that may be under a cent: cents, or 6 decimals under a cent
/// so that `$0.000093` per request stays readable (more where 6 would not show two
/// significant digits).
pub fn usd_unit(m: Money) -> String {
    let places = match m.nanos().unsigned_abs() {
        n if n != 0 && n < CENT => m.places_for(6, 2),
        _ => 2,
    };
    usd_text(&m.to_string_places(places))
}

/// A price per million tokens to four decimals: instance types a few tenths of a cent
/// apart per million still differ by thousands of dollars a year; more for a price that
/// four would show as zero.
pub fn usd_per_1m(m: Money) -> String {
    usd_text(&m.to_string_places(m.places_for(4, 2)))
}

/// Float dollars (a chart value) as money.
pub fn usd_f64(v: f64) -> String {
    Money::from_f64_dollars(v).map_or_else(|| format!("${v:.2}"), usd_unit)
}

/// A decimal number of dollars as money: `-1234.5` -> `-$1,234.5`.
pub fn usd_text(number: &str) -> String {
    let (sign, body) = number.strip_prefix('-').map_or(("", number), |b| ("-", b));
    let (whole, frac) = body.split_once('.').map_or((body, ""), |(w, f)| (w, f));
    let dot = if frac.is_empty() { "" } else { "." };
    format!("{sign}${}{dot}{frac}", digits(whole))
}

/// A count with thousands separators: `1,000`.
pub fn thousands(n: u64) -> String {
    digits(&n.to_string())
}

/// Thousands separators in a run of ASCII digits.
fn digits(run: &str) -> String {
    let len = run.len();
    let mut out = String::with_capacity(len + len / 3);
    for (i, c) in run.chars().enumerate() {
        if i > 0 && (len - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A share as a whole percentage: `0.354` -> `35%`.
pub fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// A share to a tenth of a percent, for rates compared closely: `0.0354` -> `3.5%`.
pub fn pct1(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// An interval of shares to a tenth of a percent: `0.0% .. 4.7%`.
pub fn interval(low: f64, high: f64) -> String {
    format!("{} .. {}", pct1(low), pct1(high))
}

/// Epoch milliseconds in UTC, in a `chrono` format; the number itself when out of range.
pub fn utc(ms: Millis, fmt: &str) -> String {
    let when = DateTime::from_timestamp_millis(ms);
    when.map_or_else(|| ms.to_string(), |d| d.format(fmt).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn money_counts_and_shares_read_well() {
        assert_eq!(usd(m("1234567.891")), "$1,234,567.89");
        assert_eq!(usd(m("-12.5")), "-$12.50");
        assert_eq!(usd(m("0.00009255")), "$0.000093");
        assert_eq!(usd(Money::from_nanos(3_802_071)), "$0.0038");
        assert_eq!(usd(m("0.000012")), "$0.000012");
        assert_eq!(usd(m("-0.004")), "-$0.0040");
        assert_eq!(usd(m("0.01")), "$0.01");
        assert_eq!(usd(Money::ZERO), "$0.00");
        assert_eq!(usd_unit(Money::from_nanos(450)), "$0.00000045");
        assert_eq!(usd_per_1m(m("0.15")), "$0.1500");
        assert_eq!(usd_per_1m(m("0.00002")), "$0.000020");
        assert_eq!(usd_unit(m("1234.567")), "$1,234.57");
        assert_eq!(usd_unit(m("-1234567.891")), "-$1,234,567.89");
        assert_eq!(usd_unit(m("0.00009255")), "$0.000093");
        assert_eq!(usd_unit(m("-0.005")), "-$0.005000");
        assert_eq!(usd_unit(Money::ZERO), "$0.00");
        assert_eq!(usd_f64(12.345), "$12.35");
        assert_eq!(usd_text("1200"), "$1,200");
        assert_eq!(
            (thousands(1_000), thousands(999)),
            ("1,000".into(), "999".into())
        );
        assert_eq!((pct(0.354), pct1(0.0354)), ("35%".into(), "3.5%".into()));
        assert_eq!(
            utc(86_400_000, "%Y-%m-%d %H:%M UTC"),
            "1970-01-02 00:00 UTC"
        );
    }
}
