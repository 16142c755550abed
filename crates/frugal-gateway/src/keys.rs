//! API keys, tenants and budgets.
//!
//! Keys are configured by their SHA-256 only (`frugal keys new` makes one and prints the
//! hash to configure), so a leaked config leaks no key, and no key is ever logged. Each key
//! belongs to a tenant: the tenant namespaces the cache (one tenant's answer never reaches
//! another) and carries optional daily and monthly budgets in dollars. At admission a
//! request reserves its worst-case cost (its prompt and `max_tokens` at the model's prices,
//! see [`crate::backend::Plan`]), and is refused once spend plus reservations reach a budget;
//! when it settles, the reservation becomes its real cost. So a tenant overshoots a budget by
//! at most the one reservation that found room last. Failed and abandoned requests are charged
//! what they spent, as the ledger records them. Spend is kept in memory per period (UTC day,
//! UTC month) and preloaded from the ledger at start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, header};
use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use frugal_cost::Money;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// One configured key.
#[derive(Debug, Clone)]
pub struct KeyConfig {
    pub tenant: String,
    /// SHA-256 of the key, as lowercase hex.
    pub sha256: String,
    pub daily: Option<Money>,
    pub monthly: Option<Money>,
}

/// The hex SHA-256 of a key: what the config stores.
pub fn hash_key(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new random key: `fk-` and 32 random bytes in hex.
pub fn new_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "fk-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

#[derive(Debug)]
pub struct Tenant {
    pub name: String,
    daily: Option<Money>,
    monthly: Option<Money>,
    spend: Mutex<Spend>,
}

/// Spend in the current day and month, and what requests in flight have reserved.
#[derive(Debug, Default)]
struct Spend {
    day: Option<NaiveDate>,
    day_total: Money,
    month: Option<(i32, u32)>,
    month_total: Money,
    reserved: Money,
}

impl Spend {
    /// Starts a new period's total when `now` has left the one on record.
    fn roll(&mut self, now: DateTime<Utc>) {
        let day = now.date_naive();
        if self.day != Some(day) {
            self.day = Some(day);
            self.day_total = Money::ZERO;
        }
        let month = (now.year(), now.month());
        if self.month != Some(month) {
            self.month = Some(month);
            self.month_total = Money::ZERO;
        }
    }
}

impl Tenant {
    /// Refuses a request once a budget is spent (or reserved by requests in flight),
    /// naming it and when it resets.
    pub fn admit(&self, now: DateTime<Utc>) -> Result<(), ApiError> {
        let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        self.check(&mut spend, now)
    }

    fn check(&self, spend: &mut Spend, now: DateTime<Utc>) -> Result<(), ApiError> {
        spend.roll(now);
        let checks = [
            ("daily", self.daily, spend.day_total, next_day(now)),
            ("monthly", self.monthly, spend.month_total, next_month(now)),
        ];
        for (period, limit, spent, resets) in checks {
            let committed = spent + spend.reserved;
            if let Some(limit) = limit.filter(|l| committed >= *l) {
                let held = if spend.reserved > Money::ZERO {
                    format!(
                        " (${} more held by requests in flight)",
                        spend.reserved.to_string_places(6)
                    )
                } else {
                    String::new()
                };
                return Err(ApiError::Budget {
                    message: format!(
                        "the {period} budget of `{}` is spent: ${} of ${}{held}; it resets at {}",
                        self.name,
                        spent.to_string_places(6),
                        limit.to_string_places(2),
                        resets.format("%Y-%m-%dT%H:%MZ")
                    ),
                    retry_after_s: (resets - now).num_seconds().max(1) as u64,
                });
            }
        }
        Ok(())
    }

    /// Admits a request whose cost can reach `worst`, holding that much of the budgets until
    /// it settles.
    pub fn reserve(
        self: &Arc<Self>,
        worst: Money,
        now: DateTime<Utc>,
    ) -> Result<Reservation, ApiError> {
        let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        self.check(&mut spend, now)?;
        spend.reserved += worst;
        Ok(Reservation {
            tenant: self.clone(),
            held: worst,
        })
    }

    /// Starts from what the ledger says was spent this day and this month (before a restart).
    fn preload(&self, day: Money, month: Money, now: DateTime<Utc>) {
        let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        spend.roll(now);
        spend.day_total = day;
        spend.month_total = month;
    }

    /// Adds a finished request's cost.
    pub fn spend(&self, cost: Money, now: DateTime<Utc>) {
        let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        spend.roll(now);
        spend.day_total += cost;
        spend.month_total += cost;
    }
}

/// Part of a tenant's budgets held for a request in flight.
#[derive(Debug)]
pub struct Reservation {
    tenant: Arc<Tenant>,
    held: Money,
}

impl Reservation {
    /// The request settled at `cost`: the hold becomes that spend.
    pub fn settle(mut self, cost: Money, now: DateTime<Utc>) {
        self.release();
        self.tenant.spend(cost, now);
    }

    fn release(&mut self) {
        let held = std::mem::replace(&mut self.held, Money::ZERO);
        let mut spend = self.tenant.spend.lock().unwrap_or_else(|p| p.into_inner());
        spend.reserved = (spend.reserved - held).max(Money::ZERO);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release();
    }
}

/// Midnight UTC of `now`'s day and the first of its month: where budgets start counting.
pub fn period_starts(now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let day = next_day(now) - Duration::days(1);
    let month = NaiveDate::from_ymd_opt(now.year(), now.month(), 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(day, |t| Utc.from_utc_datetime(&t));
    (day, month)
}

fn next_day(now: DateTime<Utc>) -> DateTime<Utc> {
    let midnight = now
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|t| Utc.from_utc_datetime(&t));
    midnight.map_or(now, |m| m + Duration::days(1))
}

fn next_month(now: DateTime<Utc>) -> DateTime<Utc> {
    let (y, m) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    NaiveDate::from_ymd_opt(y, m, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(now, |t| Utc.from_utc_datetime(&t))
}

/// The configured keys; empty means the API is open.
#[derive(Debug, Default)]
pub struct Keys {
    by_hash: HashMap<String, Arc<Tenant>>,
}

impl Keys {
    /// Keys of one tenant share its budgets.
    pub fn new(configs: &[KeyConfig]) -> Keys {
        let mut tenants: HashMap<&str, Arc<Tenant>> = HashMap::new();
        let mut by_hash = HashMap::new();
        for k in configs {
            let tenant = tenants.entry(&k.tenant).or_insert_with(|| {
                Arc::new(Tenant {
                    name: k.tenant.clone(),
                    daily: k.daily,
                    monthly: k.monthly,
                    spend: Mutex::new(Spend::default()),
                })
            });
            by_hash.insert(k.sha256.to_ascii_lowercase(), tenant.clone());
        }
        Keys { by_hash }
    }

    /// Each tenant's spend so far this day and month, from `spent_since(start)` (the
    /// ledger's), so a restart does not hand out a budget again.
    pub fn preload<E>(
        &self,
        now: DateTime<Utc>,
        spent_since: impl Fn(DateTime<Utc>) -> Result<Vec<(String, Money)>, E>,
    ) -> Result<(), E> {
        if self.by_hash.is_empty() {
            return Ok(());
        }
        let (day_start, month_start) = period_starts(now);
        let day: HashMap<String, Money> = spent_since(day_start)?.into_iter().collect();
        let month: HashMap<String, Money> = spent_since(month_start)?.into_iter().collect();
        let spent = |m: &HashMap<String, Money>, t: &str| m.get(t).copied().unwrap_or(Money::ZERO);
        for t in self.by_hash.values() {
            t.preload(spent(&day, &t.name), spent(&month, &t.name), now);
        }
        Ok(())
    }

    pub fn is_open(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The tenant named `name`, if a configured key still belongs to it.
    pub fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.by_hash.values().find(|t| t.name == name).cloned()
    }

    /// The tenant of the request's bearer key; `None` when no keys are configured.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Option<Arc<Tenant>>, ApiError> {
        if self.by_hash.is_empty() {
            return Ok(None);
        }
        let key = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                ApiError::Unauthorized(
                    "this server needs an API key: send `Authorization: Bearer <key>`".into(),
                )
            })?;
        self.by_hash
            .get(&hash_key(key))
            .cloned()
            .map(Some)
            .ok_or_else(|| ApiError::Unauthorized("the API key is not valid".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn keys_are_checked_by_hash() {
        // echo -n abc | sha256sum
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let key = new_key().unwrap();
        assert!(key.starts_with("fk-") && key.len() == 67, "{key}");
        assert_ne!(new_key().unwrap(), key);
        let keys = Keys::new(&[KeyConfig {
            tenant: "a".into(),
            sha256: hash_key(&key).to_uppercase(),
            daily: None,
            monthly: None,
        }]);
        let mut h = HeaderMap::new();
        assert!(matches!(
            keys.authenticate(&h),
            Err(ApiError::Unauthorized(_))
        ));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert!(matches!(
            keys.authenticate(&h),
            Err(ApiError::Unauthorized(_))
        ));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        assert_eq!(keys.authenticate(&h).unwrap().unwrap().name, "a");
        assert!(
            Keys::default()
                .authenticate(&HeaderMap::new())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn budgets_refuse_once_spent_and_reset_with_their_period() {
        let keys = Keys::new(&[
            KeyConfig {
                tenant: "a".into(),
                sha256: hash_key("k1"),
                daily: Some(Money::from_cents(100)),
                monthly: Some(Money::from_cents(150)),
            },
            KeyConfig {
                tenant: "a".into(),
                sha256: hash_key("k2"),
                daily: None,
                monthly: None,
            },
        ]);
        let t = keys.by_hash[&hash_key("k1")].clone();
        // Both keys of a tenant share its budget.
        assert!(Arc::ptr_eq(&t, &keys.by_hash[&hash_key("k2")]));
        let now = at("2026-12-03T10:00:00Z");
        t.admit(now).unwrap();
        t.spend(Money::from_cents(99), now);
        t.admit(now).unwrap();
        t.spend(Money::from_cents(2), now);
        let Err(ApiError::Budget {
            message,
            retry_after_s,
        }) = t.admit(now)
        else {
            panic!("the daily budget is spent")
        };
        assert!(message.contains("daily budget of `a`"), "{message}");
        assert!(message.contains("$1.010000 of $1.00"), "{message}");
        assert!(message.contains("2026-12-04T00:00Z"), "{message}");
        assert_eq!(retry_after_s, 14 * 3600);
        // The next day has room again, until the month's $1.50 is gone.
        let tomorrow = at("2026-12-04T00:00:01Z");
        t.admit(tomorrow).unwrap();
        t.spend(Money::from_cents(50), tomorrow);
        let Err(ApiError::Budget { message, .. }) = t.admit(tomorrow) else {
            panic!("the monthly budget is spent")
        };
        assert!(
            message.contains("monthly") && message.contains("2027-01-01T00:00Z"),
            "{message}"
        );
        t.admit(at("2027-01-01T00:00:00Z")).unwrap();
    }

    #[test]
    fn reservations_bound_the_overshoot_to_one_worst_case() {
        let keys = Keys::new(&[KeyConfig {
            tenant: "a".into(),
            sha256: hash_key("k"),
            daily: Some(Money::from_cents(100)),
            monthly: None,
        }]);
        let t = keys.by_hash[&hash_key("k")].clone();
        let now = at("2026-12-03T10:00:00Z");
        // Three requests of up to $0.60 each arrive at once: the first two find room (the
        // second overshoots by at most its own reservation), the third does not.
        let a = t.reserve(Money::from_cents(60), now).unwrap();
        let b = t.reserve(Money::from_cents(60), now).unwrap();
        let Err(ApiError::Budget { message, .. }) = t.reserve(Money::from_cents(60), now) else {
            panic!("reservations fill the budget")
        };
        assert!(message.contains("held by requests in flight"), "{message}");
        // They settle at their real cost; the holds are released.
        a.settle(Money::from_cents(10), now);
        b.settle(Money::from_cents(15), now);
        let c = t.reserve(Money::from_cents(60), now).unwrap();
        // Dropped unsettled (a task that died): the hold goes, nothing is spent.
        drop(c);
        let spend = t.spend.lock().unwrap();
        assert_eq!(spend.reserved, Money::ZERO);
        assert_eq!(spend.day_total, Money::from_cents(25));
    }
}
