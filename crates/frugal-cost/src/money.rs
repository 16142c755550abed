//! Exact money and the units that money is charged for.
//!
//! Money is an integer count of nano-dollars (1e-9 USD) in an `i64`: sums never drift, the
//! range is about ±9.2 billion dollars, and a per-token price as small as $0.01 per million
//! tokens is still a whole number per thousand tokens. Products (a price times a quantity)
//! are taken in `i128` and rounded once, half away from zero, to the nearest nano-dollar.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

const NANOS_PER_DOLLAR: i64 = 1_000_000_000;
const MS_PER_HOUR: i128 = 3_600_000;
const TOKENS_PER_MILLION: i128 = 1_000_000;

/// An exact amount of US dollars, in nano-dollars. Serialized as the integer count of
/// nano-dollars (the ledger, the state files); the JSON that commands print adds each
/// amount in dollars beside it (`crate::present::json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(transparent)]
pub struct Money(i64);

/// The key of the one-entry map a [`Money`] serializes as while [`tagged`] runs: how
/// `present::json` finds the amounts in a serialized value, whatever their field's name.
pub(crate) const TAG: &str = "$frugal_money_nanos";

thread_local! {
    static TAGGING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every [`Money`] it serializes on this thread tagged as `{TAG: nanos}`.
pub(crate) fn tagged<T>(f: impl FnOnce() -> T) -> T {
    let before = TAGGING.with(|t| t.replace(true));
    let out = f();
    TAGGING.with(|t| t.set(before));
    out
}

impl Serialize for Money {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if TAGGING.with(std::cell::Cell::get) {
            use serde::ser::SerializeMap;
            let mut map = serializer.serialize_map(Some(1))?;
            map.serialize_entry(TAG, &self.0)?;
            map.end()
        } else {
            serializer.serialize_i64(self.0)
        }
    }
}

/// Why a decimal string is not an amount of money.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseMoneyError {
    #[error("empty amount")]
    Empty,
    #[error("`{0}` is not a decimal number")]
    NotDecimal(String),
    #[error("`{0}` has more than 9 decimal places")]
    TooPrecise(String),
    #[error("`{0}` is out of range")]
    OutOfRange(String),
}

impl Money {
    pub const ZERO: Money = Money(0);
    /// The most there is: where a bound (a worst case) past the range saturates.
    pub const MAX: Money = Money(i64::MAX);

    pub const fn from_nanos(nanos: i64) -> Money {
        Money(nanos)
    }

    pub const fn nanos(self) -> i64 {
        self.0
    }

    /// Whole cents, for tests and literals: `Money::from_cents(1234)` is $12.34.
    pub const fn from_cents(cents: i64) -> Money {
        Money(cents * 10_000_000)
    }

    /// Dollars as a float, for display ratios and charts only; never for sums.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / NANOS_PER_DOLLAR as f64
    }

    /// The nearest amount to a float number of dollars (for FOCUS exports written as floats).
    pub fn from_f64_dollars(dollars: f64) -> Option<Money> {
        let nanos = (dollars * NANOS_PER_DOLLAR as f64).round();
        (nanos.is_finite() && nanos.abs() < i64::MAX as f64).then_some(Money(nanos as i64))
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// `self * num / den`, rounded half away from zero; `None` on overflow or `den == 0`.
    pub fn mul_div(self, num: i128, den: i128) -> Option<Money> {
        if den == 0 {
            return None;
        }
        let product = i128::from(self.0).checked_mul(num)?;
        let rounded = div_round(product, den);
        i64::try_from(rounded).ok().map(Money)
    }

    /// [`Money::mul_div`] for a bound (a budget's worst case): past the range it is the
    /// range's end, never an error that a caller could turn into $0.
    pub fn saturating_mul_div(self, num: i128, den: i128) -> Money {
        if let Some(m) = self.mul_div(num, den) {
            return m;
        }
        if self.0 == 0 || num == 0 {
            return Money::ZERO;
        }
        let negative = (self.0 < 0) ^ (num < 0) ^ (den < 0);
        if negative {
            Money(i64::MIN)
        } else {
            Money::MAX
        }
    }

    /// Share of this amount, `fraction` in [0, 1]; for waste and savings estimates.
    pub fn scale(self, fraction: f64) -> Money {
        // A fraction with 1e-9 resolution keeps the product exact to the nano-dollar
        // for any amount below a million dollars.
        let parts = (fraction.clamp(-1e6, 1e6) * 1e9).round() as i128;
        self.mul_div(parts, 1_000_000_000)
            .unwrap_or(Money(i64::MAX))
    }

    /// The decimals that show at least `sig` significant digits of a nonzero amount, and no
    /// fewer than `min`: `$0.0038` rather than `$0.00` (at most 9, the nano-dollar).
    pub fn places_for(self, min: u32, sig: u32) -> u32 {
        let n = self.0.unsigned_abs();
        if n == 0 {
            return min.min(9);
        }
        let digits = n.ilog10() + 1;
        (9 + sig).saturating_sub(digits).clamp(min, 9)
    }

    /// The exact amount as a decimal number of dollars, for JSON: at least cents, then as
    /// many places as the nano-dollars need (`0.003802071`, `12.50`, `-3.00`).
    pub fn to_decimal(self) -> String {
        let full = self.to_string_places(9);
        let trimmed = full.trim_end_matches('0');
        let dot = trimmed.find('.').unwrap_or(trimmed.len());
        let keep = trimmed.len().max(dot + 3);
        full[..keep].to_owned()
    }

    /// Text with `places` decimals (rounded), e.g. `$1,234.57` style without the separators.
    pub fn to_string_places(self, places: u32) -> String {
        let places = places.min(9);
        let unit = 10_i128.pow(9 - places);
        let scaled = div_round(i128::from(self.0), unit);
        let sign = if scaled < 0 { "-" } else { "" };
        let scaled = scaled.unsigned_abs();
        let base = 10_u128.pow(places);
        if places == 0 {
            format!("{sign}{scaled}")
        } else {
            let (whole, frac) = (scaled / base, scaled % base);
            format!("{sign}{whole}.{frac:0width$}", width = places as usize)
        }
    }
}

/// Integer division rounding half away from zero.
fn div_round(num: i128, den: i128) -> i128 {
    let (q, r) = (num / den, num % den);
    if 2 * r.abs() >= den.abs() {
        q + if (num < 0) == (den < 0) { 1 } else { -1 }
    } else {
        q
    }
}

impl FromStr for Money {
    type Err = ParseMoneyError;

    /// Parses a plain decimal (`12`, `-0.5`, `13.10904`, `1e-3` is rejected) exactly.
    fn from_str(text: &str) -> Result<Money, ParseMoneyError> {
        let s = text.trim();
        let s = s.strip_prefix('$').unwrap_or(s);
        if s.is_empty() {
            return Err(ParseMoneyError::Empty);
        }
        let (negative, digits) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let is_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && frac.is_empty()) || !is_digits(whole) || !is_digits(frac) {
            return Err(ParseMoneyError::NotDecimal(text.to_owned()));
        }
        let frac = frac.trim_end_matches('0');
        if frac.len() > 9 {
            return Err(ParseMoneyError::TooPrecise(text.to_owned()));
        }
        let out_of_range = || ParseMoneyError::OutOfRange(text.to_owned());
        let whole: i64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| out_of_range())?
        };
        let frac_nanos: i64 = if frac.is_empty() {
            0
        } else {
            frac.parse::<i64>().map_err(|_| out_of_range())? * 10_i64.pow(9 - frac.len() as u32)
        };
        let nanos = whole
            .checked_mul(NANOS_PER_DOLLAR)
            .and_then(|n| n.checked_add(frac_nanos))
            .ok_or_else(out_of_range)?;
        Ok(Money(if negative { -nanos } else { nanos }))
    }
}

impl fmt::Display for Money {
    /// Dollars with cents, more places when the amount is below a cent so small
    /// per-unit costs stay readable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let places = match self.0.unsigned_abs() {
            n if n != 0 && n < 10_000_000 => self.places_for(6, 2),
            _ => 2,
        };
        write!(f, "${}", self.to_string_places(places))
    }
}

impl Add for Money {
    type Output = Money;
    fn add(self, rhs: Money) -> Money {
        Money(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Money {
    fn add_assign(&mut self, rhs: Money) {
        *self = *self + rhs;
    }
}

impl Sub for Money {
    type Output = Money;
    fn sub(self, rhs: Money) -> Money {
        Money(self.0.saturating_sub(rhs.0))
    }
}

impl SubAssign for Money {
    fn sub_assign(&mut self, rhs: Money) {
        *self = *self - rhs;
    }
}

impl Neg for Money {
    type Output = Money;
    fn neg(self) -> Money {
        Money(self.0.saturating_neg())
    }
}

impl Sum for Money {
    fn sum<I: Iterator<Item = Money>>(iter: I) -> Money {
        iter.fold(Money::ZERO, Add::add)
    }
}

/// A price per hour of one instance (or one accelerator, for accelerators priced apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HourlyRate(pub Money);

impl HourlyRate {
    /// Cost of `instances` running for `duration_ms` milliseconds.
    pub fn cost(self, duration_ms: i64, instances: u32) -> Option<Money> {
        self.0
            .mul_div(i128::from(duration_ms) * i128::from(instances), MS_PER_HOUR)
    }

    /// Cost of one instance for `time`, to the microsecond: the resolution every request's
    /// share of a machine is priced at.
    pub fn cost_of(self, time: std::time::Duration) -> Option<Money> {
        let micros = i128::try_from(time.as_micros()).ok()?;
        self.0.mul_div(micros, MS_PER_HOUR * 1000)
    }
}

/// A price per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TokenRate(pub Money);

impl TokenRate {
    pub fn cost(self, tokens: u64) -> Option<Money> {
        self.0.mul_div(i128::from(tokens), TOKENS_PER_MILLION)
    }

    /// [`TokenRate::cost`], saturating at [`Money::MAX`]: any count of tokens has a price.
    pub fn saturating_cost(self, tokens: u64) -> Money {
        self.0
            .saturating_mul_div(i128::from(tokens), TOKENS_PER_MILLION)
    }
}

/// Milliseconds of wall time, the unit every duration in the ledger is kept in.
pub type Millis = i64;

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap_or_else(|e| unreachable!("{s}: {e}"))
    }

    #[test]
    fn bounds_saturate_instead_of_wrapping() {
        let rate = TokenRate(m("2000"));
        // 10^15 tokens at $2,000 per million is $2e12, past the range: the most there is.
        assert_eq!(rate.cost(1_000_000_000_000_000), None);
        assert_eq!(rate.saturating_cost(1_000_000_000_000_000), Money::MAX);
        assert_eq!(rate.saturating_cost(u64::MAX), Money::MAX);
        assert_eq!(rate.saturating_cost(5), m("0.01"));
        assert_eq!(
            TokenRate(Money::ZERO).saturating_cost(u64::MAX),
            Money::ZERO
        );
        assert_eq!(m("-1").saturating_mul_div(i128::MAX, 1), Money(i64::MIN));
        assert_eq!(m("1").saturating_mul_div(1, 0), Money::MAX);
        // Sums of bounds stay at the end of the range.
        assert_eq!(Money::MAX + m("1"), Money::MAX);
    }

    #[test]
    fn parses_decimals_exactly() {
        assert_eq!(m("13.10904").nanos(), 13_109_040_000);
        assert_eq!(m("0.000000001").nanos(), 1);
        assert_eq!(m("-2.5").nanos(), -2_500_000_000);
        assert_eq!(m("$7").nanos(), 7_000_000_000);
        assert_eq!(m(".5").nanos(), 500_000_000);
        assert_eq!(m("1.100000000000").nanos(), 1_100_000_000);
    }

    #[test]
    fn rejects_what_is_not_money() {
        assert_eq!("".parse::<Money>(), Err(ParseMoneyError::Empty));
        assert!(matches!(
            "1e-3".parse::<Money>(),
            Err(ParseMoneyError::NotDecimal(_))
        ));
        assert!(matches!(
            "abc".parse::<Money>(),
            Err(ParseMoneyError::NotDecimal(_))
        ));
        assert!(matches!(
            ".".parse::<Money>(),
            Err(ParseMoneyError::NotDecimal(_))
        ));
        assert!(matches!(
            "0.0000000001".parse::<Money>(),
            Err(ParseMoneyError::TooPrecise(_))
        ));
        assert!(matches!(
            "99999999999999".parse::<Money>(),
            Err(ParseMoneyError::OutOfRange(_))
        ));
    }

    #[test]
    fn sums_do_not_drift() {
        // 0.1 + 0.2 in floats is 0.30000000000000004; here ten million dimes are a million dollars.
        let dime = m("0.1");
        let total: Money = std::iter::repeat_n(dime, 10_000_000).sum();
        assert_eq!(total, m("1000000"));
        assert_eq!(m("0.1") + m("0.2"), m("0.3"));
    }

    #[test]
    fn hourly_cost_by_hand() {
        // p3.2xlarge on demand at $3.06/h for 90 minutes on 2 instances: 3.06 * 1.5 * 2 = 9.18.
        let rate = HourlyRate(m("3.06"));
        assert_eq!(rate.cost(90 * 60_000, 2), Some(m("9.18")));
        // One millisecond of a $3.60/h machine is exactly one micro-dollar.
        assert_eq!(HourlyRate(m("3.6")).cost(1, 1), Some(m("0.000001")));
        // 1 ms at $1/h is 277.77.. nano-dollars: rounds to 278.
        assert_eq!(HourlyRate(m("1")).cost(1, 1), Some(Money::from_nanos(278)));
    }

    #[test]
    fn token_cost_by_hand() {
        // 1,234 tokens at $0.075 per million: 92.55 micro-dollars.
        assert_eq!(TokenRate(m("0.075")).cost(1234), Some(m("0.00009255")));
        // 3 tokens at $0.15 per million = 0.45 micro-dollars, exact in nanos.
        assert_eq!(TokenRate(m("0.15")).cost(3), Some(Money::from_nanos(450)));
    }

    #[test]
    fn rounding_is_half_away_from_zero() {
        assert_eq!(
            Money::from_nanos(5).mul_div(1, 10),
            Some(Money::from_nanos(1))
        );
        assert_eq!(
            Money::from_nanos(-5).mul_div(1, 10),
            Some(Money::from_nanos(-1))
        );
        assert_eq!(Money::from_nanos(4).mul_div(1, 10), Some(Money::ZERO));
        assert_eq!(Money::from_nanos(1).mul_div(1, 0), None);
    }

    #[test]
    fn displays_cents_and_small_amounts() {
        assert_eq!(m("1234.565").to_string(), "$1234.57");
        assert_eq!(m("0.00009255").to_string(), "$0.000093");
        assert_eq!(m("-3.5").to_string(), "$-3.50");
        assert_eq!(Money::ZERO.to_string(), "$0.00");
        // Under a micro-dollar, still two significant digits: never $0.000000.
        assert_eq!(Money::from_nanos(450).to_string(), "$0.00000045");
        assert_eq!(Money::from_nanos(1).to_string(), "$0.000000001");
        assert_eq!(m("2.5").to_string_places(0), "3");
    }

    #[test]
    fn decimals_are_exact_dollars() {
        assert_eq!(Money::from_nanos(3_802_071).to_decimal(), "0.003802071");
        assert_eq!(m("12.5").to_decimal(), "12.50");
        assert_eq!(m("-3").to_decimal(), "-3.00");
        assert_eq!(Money::ZERO.to_decimal(), "0.00");
        assert_eq!(Money::from_nanos(-1).to_decimal(), "-0.000000001");
        assert_eq!(m("1234567.891").to_decimal(), "1234567.891");
        assert_eq!(Money::MAX.to_decimal(), "9223372036.854775807");
    }

    #[test]
    fn places_show_significant_digits() {
        assert_eq!(Money::from_nanos(3_802_071).places_for(2, 2), 4);
        assert_eq!(m("0.000012").places_for(2, 2), 6);
        assert_eq!(m("5").places_for(2, 2), 2);
        assert_eq!(Money::ZERO.places_for(2, 2), 2);
        assert_eq!(Money::from_nanos(7).places_for(2, 2), 9);
    }

    #[test]
    fn scale_takes_exact_shares() {
        assert_eq!(m("100").scale(0.65), m("65"));
        assert_eq!(m("8").scale(0.125), m("1"));
        // A fraction is kept to 1e-9: a third of $3 is one nano-dollar short of $1.
        assert_eq!(m("3").scale(1.0 / 3.0), m("0.999999999"));
    }
}
