//! What a budget counts: a tenant's limits, the periods they count over (the UTC day and
//! month), and [`Account`], the view of a tenant's spend that the shared budgets
//! ([`crate::admit::budget`]) read and update, kept by the tenant ([`crate::admit::keys`]).

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use frugal_cost::Money;

/// A tenant's budgets; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub daily: Option<Money>,
    pub monthly: Option<Money>,
}

/// A tenant as the shared budgets see it: its name, its limits and this gateway's view of
/// its spend.
pub trait Account: std::fmt::Debug + Send + Sync {
    fn name(&self) -> &str;

    fn limits(&self) -> Limits;

    /// Adds `cost` to this gateway's view only.
    fn add_local(&self, cost: Money, now: DateTime<Utc>);

    /// This day's and month's spend as this gateway sees it.
    fn totals(&self, now: DateTime<Utc>) -> (Money, Money);

    /// Takes in the shared totals (in nanodollars, negative: unknown) of the periods of
    /// `at`, as Redis gave them: this gateway's view is never below them.
    fn seen(&self, at: DateTime<Utc>, day: i64, month: i64);
}

/// Midnight UTC of `now`'s day and the first of its month: where budgets start counting.
pub fn period_starts(now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let day = next_day(now) - Duration::days(1);
    let month = NaiveDate::from_ymd_opt(now.year(), now.month(), 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(day, |t| Utc.from_utc_datetime(&t));
    (day, month)
}

pub(crate) fn next_day(now: DateTime<Utc>) -> DateTime<Utc> {
    let midnight = now
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|t| Utc.from_utc_datetime(&t));
    midnight.map_or(now, |m| m + Duration::days(1))
}

pub(crate) fn next_month(now: DateTime<Utc>) -> DateTime<Utc> {
    let (y, m) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    NaiveDate::from_ymd_opt(y, m, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(now, |t| Utc.from_utc_datetime(&t))
}
