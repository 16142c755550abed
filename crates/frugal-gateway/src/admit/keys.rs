//! API keys, tenants and budgets.
//!
//! Keys are configured by their SHA-256 only (`frugal keys new` makes one and prints the
//! hash to configure), so a leaked config leaks no key, and no key is ever logged. Each key
//! belongs to a tenant: the tenant namespaces the cache (one tenant's answer never reaches
//! another) and carries optional daily and monthly budgets in dollars. At admission a
//! request reserves its worst-case cost (its prompt and `max_tokens` at the model's prices,
//! see [`crate::backend::Plan`]), and is refused once spend plus reservations reach a budget,
//! or when its worst case alone is more than what is left unspent (an absurd `max_tokens`:
//! worst cases saturate, never wrap to $0); when it settles, the reservation becomes its real
//! cost. So a tenant overshoots a budget by at most the one reservation that found room last. Failed and abandoned requests are charged
//! what they spent, as the ledger records them. Spend is kept in memory per period (UTC day,
//! UTC month) and preloaded from the ledger at start.
//!
//! With `budget_redis`, reservations and spend live in Redis, shared by every replica
//! ([`crate::admit::budget`]), with the same rule; the memory here is then this gateway's view
//! (its own spend and the shared totals it last saw), which decides while Redis is
//! unreachable. [`Keys::reload`] swaps the keys and budgets while requests go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use axum::http::{HeaderMap, header};
use chrono::{DateTime, Datelike, NaiveDate, Utc};
use frugal_cost::Money;
use sha2::{Digest, Sha256};

use crate::admit::account::{Account, Limits, next_day, next_month, period_starts};
use crate::admit::budget::{Hold, SharedBudgets};
use crate::http::error::ApiError;

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
    spend: Mutex<Spend>,
    /// The budgets shared with other replicas, when `budget_redis` is set.
    shared: Option<Arc<SharedBudgets>>,
}

/// A tenant's limits (changed by a reload), its spend in the current day and month, and
/// what requests in flight here have reserved.
#[derive(Debug, Default)]
struct Spend {
    limits: Limits,
    day: Option<NaiveDate>,
    day_total: Money,
    month: Option<(i32, u32)>,
    month_total: Money,
    /// In nanodollars, wide: holds that saturated (an absurd `max_tokens`) add up and come
    /// off exactly.
    reserved: i128,
}

impl Spend {
    /// What requests in flight here hold.
    fn held(&self) -> Money {
        Money::from_nanos(i64::try_from(self.reserved).unwrap_or(i64::MAX))
    }

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

/// Refuses a request once `spent` plus `held` (by requests in flight) reaches a budget, or
/// when its own `worst` case is more than what is left of it (an absurd `max_tokens`),
/// naming the budget and when it resets.
fn check(
    name: &str,
    limits: Limits,
    (day, month): (Money, Money),
    held: Money,
    worst: Money,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let checks = [
        ("daily", limits.daily, day, next_day(now)),
        ("monthly", limits.monthly, month, next_month(now)),
    ];
    for (period, limit, spent, resets) in checks {
        let retry_after_s = (resets - now).num_seconds().max(1) as u64;
        if let Some(limit) = limit.filter(|l| spent + held < *l && spent + worst > *l) {
            return Err(ApiError::Budget {
                message: format!(
                    "this request may cost up to ${} (its prompt and max_tokens at the model's prices), more than the ${} left of the {period} budget of `{name}`; ask for fewer max_tokens, or wait until it resets at {}",
                    worst.to_string_places(6),
                    (limit - spent).max(Money::ZERO).to_string_places(6),
                    resets.format("%Y-%m-%dT%H:%MZ")
                ),
                retry_after_s,
            });
        }
        if let Some(limit) = limit.filter(|l| spent + held >= *l) {
            let held = if held > Money::ZERO {
                format!(
                    " (${} more held by requests in flight)",
                    held.to_string_places(6)
                )
            } else {
                String::new()
            };
            return Err(ApiError::Budget {
                message: format!(
                    "the {period} budget of `{name}` is spent: ${} of ${}{held}; it resets at {}",
                    spent.to_string_places(6),
                    limit.to_string_places(2),
                    resets.format("%Y-%m-%dT%H:%MZ")
                ),
                retry_after_s,
            });
        }
    }
    Ok(())
}

impl Tenant {
    fn new(name: String, limits: Limits, shared: Option<Arc<SharedBudgets>>) -> Tenant {
        Tenant {
            name,
            spend: Mutex::new(Spend {
                limits,
                ..Spend::default()
            }),
            shared,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spend> {
        self.spend.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// [`check`] on this gateway's view of the tenant's spend.
    fn check_local(&self, spend: &Spend, worst: Money, now: DateTime<Utc>) -> Result<(), ApiError> {
        check(
            &self.name,
            spend.limits,
            (spend.day_total, spend.month_total),
            spend.held(),
            worst,
            now,
        )
    }

    /// Refuses a request once a budget is spent (or reserved by requests in flight here),
    /// as this gateway sees it: a check before the request is read; [`Tenant::reserve`]
    /// decides.
    pub fn admit(&self, now: DateTime<Utc>) -> Result<(), ApiError> {
        let mut spend = self.lock();
        spend.roll(now);
        self.check_local(&spend, Money::ZERO, now)
    }

    /// Admits a request whose cost can reach `worst`, holding that much of the budgets until
    /// it settles: in Redis when budgets are shared and it answers, else in this gateway.
    pub async fn reserve(
        self: &Arc<Self>,
        worst: Money,
        now: DateTime<Utc>,
    ) -> Result<Reservation, ApiError> {
        if let Some(shared) = &self.shared
            && let Some(v) = shared
                .reserve(&(self.clone() as Arc<dyn Account>), worst, now)
                .await
        {
            let mut spend = self.lock();
            spend.roll(now);
            spend.seen(now, v.day.nanos(), v.month.nanos());
            if !v.admitted {
                return Err(check(
                    &self.name,
                    spend.limits,
                    (v.day, v.month),
                    v.held,
                    worst,
                    now,
                )
                .err()
                .unwrap_or_else(|| {
                    ApiError::Internal("the shared budget check disagreed".into())
                }));
            }
            spend.reserved += i128::from(worst.nanos());
            return Ok(Reservation {
                tenant: self.clone(),
                held: worst,
                hold: Some(v.hold),
            });
        }
        let mut spend = self.lock();
        spend.roll(now);
        self.check_local(&spend, worst, now)?;
        spend.reserved += i128::from(worst.nanos());
        Ok(Reservation {
            tenant: self.clone(),
            held: worst,
            hold: None,
        })
    }

    /// Catches up with what the ledger says was spent this day and this month: at start
    /// (spend before a restart), and on a ledger other gateways write, now and then (their
    /// spend). Never lowers a total: this gateway's latest spend may not be in the ledger yet.
    fn preload(&self, day: Money, month: Money, now: DateTime<Utc>) {
        let mut spend = self.lock();
        spend.roll(now);
        spend.day_total = spend.day_total.max(day);
        spend.month_total = spend.month_total.max(month);
    }

    /// Adds a finished request's cost (to the shared totals too, when budgets are shared).
    pub fn spend(self: &Arc<Self>, cost: Money, now: DateTime<Utc>) {
        self.charge(cost, None, now);
    }

    fn charge(self: &Arc<Self>, cost: Money, hold: Option<Hold>, now: DateTime<Utc>) {
        match &self.shared {
            Some(shared) => shared.charge(self.clone(), hold, cost, now),
            None => self.add_local(cost, now),
        }
    }
}

impl Account for Tenant {
    fn name(&self) -> &str {
        &self.name
    }

    fn limits(&self) -> Limits {
        Tenant::limits(self)
    }

    /// Adds `cost` to this gateway's view only.
    fn add_local(&self, cost: Money, now: DateTime<Utc>) {
        let mut spend = self.lock();
        spend.roll(now);
        spend.day_total += cost;
        spend.month_total += cost;
    }

    /// This day's and month's spend as this gateway sees it.
    fn totals(&self, now: DateTime<Utc>) -> (Money, Money) {
        let mut spend = self.lock();
        spend.roll(now);
        (spend.day_total, spend.month_total)
    }

    /// Takes in the shared totals (in nanodollars, negative: unknown) of the periods of
    /// `at`, as Redis gave them: this gateway's view is never below them.
    fn seen(&self, at: DateTime<Utc>, day: i64, month: i64) {
        self.lock().seen(at, day, month);
    }
}

impl Spend {
    fn seen(&mut self, at: DateTime<Utc>, day: i64, month: i64) {
        if self.day == Some(at.date_naive()) && day >= 0 {
            self.day_total = self.day_total.max(Money::from_nanos(day));
        }
        if self.month == Some((at.year(), at.month())) && month >= 0 {
            self.month_total = self.month_total.max(Money::from_nanos(month));
        }
    }
}

/// Part of a tenant's budgets held for a request in flight.
#[derive(Debug)]
pub struct Reservation {
    tenant: Arc<Tenant>,
    held: Money,
    /// Its hold in Redis, when Redis took it.
    hold: Option<Hold>,
}

impl Reservation {
    /// The request settled at `cost`: the hold becomes that spend.
    pub fn settle(mut self, cost: Money, now: DateTime<Utc>) {
        self.release_here();
        let hold = self.hold.take();
        self.tenant.charge(cost, hold, now);
    }

    fn release_here(&mut self) {
        let held = std::mem::replace(&mut self.held, Money::ZERO);
        let mut spend = self.tenant.lock();
        spend.reserved = (spend.reserved - i128::from(held.nanos())).max(0);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release_here();
        if let (Some(hold), Some(shared)) = (self.hold.take(), &self.tenant.shared) {
            shared.release(&self.tenant.name, hold);
        }
    }
}

/// `[[serve.key]]` and `[serve] allow_open`, checked: what a reload swaps in.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    pub keys: Vec<KeyConfig>,
    /// A reload may remove every key, opening the API.
    pub allow_open: bool,
}

/// A reload refused because it would remove every key and open the API.
#[derive(Debug, thiserror::Error)]
#[error(
    "the config has no [[serve.key]] any more: reloading it would drop all {keys} keys and open the API to anyone; `allow_open = true` under [serve] allows it"
)]
pub struct WouldOpen {
    pub keys: usize,
}

/// The configured keys; empty means the API is open. Swapped whole by [`Keys::reload`].
#[derive(Debug, Default)]
pub struct Keys {
    by_hash: RwLock<HashMap<String, Arc<Tenant>>>,
    shared: Option<Arc<SharedBudgets>>,
}

/// What a reload changed, for the log: tenant names and counts, never a key or its hash.
#[derive(Debug, Default)]
pub struct Changes {
    pub keys_before: usize,
    pub keys_after: usize,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Tenants whose budgets changed.
    pub budgets: Vec<String>,
    /// The tenants added, to start from the ledger's spend.
    pub new_tenants: Vec<Arc<Tenant>>,
}

impl std::fmt::Display for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} keys (were {})", self.keys_after, self.keys_before)?;
        for (what, names) in [
            ("tenants added", &self.added),
            ("tenants removed", &self.removed),
            ("budgets changed", &self.budgets),
        ] {
            if !names.is_empty() {
                write!(f, "; {what}: {}", names.join(", "))?;
            }
        }
        Ok(())
    }
}

impl Keys {
    /// Keys of one tenant share its budgets.
    pub fn new(configs: &[KeyConfig]) -> Keys {
        Keys::with_budgets(configs, None)
    }

    /// Keys whose tenants' budgets are shared with other replicas through `shared`.
    pub fn with_budgets(configs: &[KeyConfig], shared: Option<Arc<SharedBudgets>>) -> Keys {
        let keys = Keys {
            by_hash: RwLock::default(),
            shared,
        };
        keys.reload(configs);
        keys
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Tenant>>> {
        self.by_hash.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the keys with `configs`. A tenant that stays keeps its spend and the
    /// reservations of its requests in flight, with its budgets as `configs` now say; a
    /// tenant removed is refused from now on (its requests in flight settle as usual).
    pub fn reload(&self, configs: &[KeyConfig]) -> Changes {
        let mut by_hash = self.by_hash.write().unwrap_or_else(|p| p.into_inner());
        self.swap(&mut by_hash, configs)
    }

    /// [`Keys::reload`] from a re-read config, unless it would drop every key of a gateway
    /// that has some: that opens the API to anyone (a config emptied by mistake, a
    /// truncated file), so it takes `[serve] allow_open = true`; else the keys stay.
    pub fn reload_set(&self, set: &KeySet) -> Result<Changes, WouldOpen> {
        let mut by_hash = self.by_hash.write().unwrap_or_else(|p| p.into_inner());
        if set.keys.is_empty() && !by_hash.is_empty() && !set.allow_open {
            return Err(WouldOpen {
                keys: by_hash.len(),
            });
        }
        Ok(self.swap(&mut by_hash, &set.keys))
    }

    fn swap(&self, by_hash: &mut HashMap<String, Arc<Tenant>>, configs: &[KeyConfig]) -> Changes {
        let before: HashMap<&str, &Arc<Tenant>> =
            by_hash.values().map(|t| (t.name.as_str(), t)).collect();
        let mut changes = Changes {
            keys_before: by_hash.len(),
            ..Changes::default()
        };
        let mut tenants: HashMap<&str, Arc<Tenant>> = HashMap::new();
        let mut next = HashMap::new();
        for k in configs {
            let tenant = tenants.entry(&k.tenant).or_insert_with(|| {
                let limits = Limits {
                    daily: k.daily,
                    monthly: k.monthly,
                };
                match before.get(k.tenant.as_str()) {
                    Some(t) => {
                        let mut spend = t.lock();
                        if spend.limits != limits {
                            spend.limits = limits;
                            changes.budgets.push(k.tenant.clone());
                        }
                        Arc::clone(t)
                    }
                    None => {
                        let t =
                            Arc::new(Tenant::new(k.tenant.clone(), limits, self.shared.clone()));
                        changes.added.push(k.tenant.clone());
                        changes.new_tenants.push(t.clone());
                        t
                    }
                }
            });
            next.insert(k.sha256.to_ascii_lowercase(), tenant.clone());
        }
        changes.removed = before
            .keys()
            .filter(|name| !tenants.contains_key(*name))
            .map(|name| (*name).to_owned())
            .collect();
        changes.removed.sort();
        changes.keys_after = next.len();
        drop(before);
        *by_hash = next;
        changes
    }

    /// The budgets shared with other replicas, when configured.
    pub fn shared(&self) -> Option<&Arc<SharedBudgets>> {
        self.shared.as_ref()
    }

    /// Each tenant's spend so far this day and month, from `spent_since(start)` (the
    /// ledger's), so a restart does not hand out a budget again.
    pub fn preload<E>(
        &self,
        now: DateTime<Utc>,
        spent_since: impl Fn(DateTime<Utc>) -> Result<Vec<(String, Money)>, E>,
    ) -> Result<(), E> {
        let tenants: Vec<Arc<Tenant>> = self.read().values().cloned().collect();
        preload(&tenants, now, spent_since)
    }

    /// [`Keys::preload`] for the tenants with a budget only: catching up with the other
    /// replicas' spend reads nothing while no tenant has one (a reload may add one).
    pub fn catch_up<E>(
        &self,
        now: DateTime<Utc>,
        spent_since: impl Fn(DateTime<Utc>) -> Result<Vec<(String, Money)>, E>,
    ) -> Result<(), E> {
        let tenants: Vec<Arc<Tenant>> = self
            .read()
            .values()
            .filter(|t| t.limits() != Limits::default())
            .cloned()
            .collect();
        preload(&tenants, now, spent_since)
    }

    pub fn is_open(&self) -> bool {
        self.read().is_empty()
    }

    /// The tenant named `name`, if a configured key still belongs to it.
    pub fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.read().values().find(|t| t.name == name).cloned()
    }

    /// The tenant of the request's bearer key; `None` when no keys are configured.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Option<Arc<Tenant>>, ApiError> {
        let by_hash = self.read();
        if by_hash.is_empty() {
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
        by_hash
            .get(&hash_key(key))
            .cloned()
            .map(Some)
            .ok_or_else(|| ApiError::Unauthorized("the API key is not valid".into()))
    }
}

/// Starts `tenants` from their spend this day and month by `spent_since(start)` (the
/// ledger's).
pub fn preload<E>(
    tenants: &[Arc<Tenant>],
    now: DateTime<Utc>,
    spent_since: impl Fn(DateTime<Utc>) -> Result<Vec<(String, Money)>, E>,
) -> Result<(), E> {
    if tenants.is_empty() {
        return Ok(());
    }
    let (day_start, month_start) = period_starts(now);
    let day: HashMap<String, Money> = spent_since(day_start)?.into_iter().collect();
    let month: HashMap<String, Money> = spent_since(month_start)?.into_iter().collect();
    let spent = |m: &HashMap<String, Money>, t: &str| m.get(t).copied().unwrap_or(Money::ZERO);
    for t in tenants {
        t.preload(spent(&day, &t.name), spent(&month, &t.name), now);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use futures_util::FutureExt;

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
        let t = keys.read()[&hash_key("k1")].clone();
        // Both keys of a tenant share its budget.
        assert!(Arc::ptr_eq(&t, &keys.read()[&hash_key("k2")]));
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
        let t = keys.read()[&hash_key("k")].clone();
        let now = at("2026-12-03T10:00:00Z");
        // Three requests of up to $0.60 each arrive at once: the first two find room (the
        // second overshoots by at most its own reservation), the third does not.
        let a = t
            .reserve(Money::from_cents(60), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        let b = t
            .reserve(Money::from_cents(60), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        let Err(ApiError::Budget { message, .. }) = t
            .reserve(Money::from_cents(60), now)
            .now_or_never()
            .unwrap()
        else {
            panic!("reservations fill the budget")
        };
        assert!(message.contains("held by requests in flight"), "{message}");
        // They settle at their real cost; the holds are released.
        a.settle(Money::from_cents(10), now);
        b.settle(Money::from_cents(15), now);
        let c = t
            .reserve(Money::from_cents(60), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        // Dropped unsettled (a task that died): the hold goes, nothing is spent.
        drop(c);
        let spend = t.spend.lock().unwrap();
        assert_eq!(spend.reserved, 0);
        assert_eq!(spend.day_total, Money::from_cents(25));
    }

    /// Issue 31: `max_tokens` 10^15 overflowed the reservation into $0, and 8 of 8
    /// requests were admitted on a $0.01 budget. A worst case saturates, and one more than
    /// what is left of a budget is refused.
    #[test]
    fn a_saturated_reservation_is_refused_and_holds_add_up_exactly() {
        let keys = Keys::new(&[
            KeyConfig {
                tenant: "a".into(),
                sha256: hash_key("ka"),
                daily: Some(Money::from_cents(1)),
                monthly: None,
            },
            KeyConfig {
                tenant: "free".into(),
                sha256: hash_key("kf"),
                daily: None,
                monthly: None,
            },
        ]);
        let now = at("2026-12-03T10:00:00Z");
        let a = keys.tenant("a").unwrap();
        for _ in 0..32 {
            let Err(ApiError::Budget { message, .. }) =
                a.reserve(Money::MAX, now).now_or_never().unwrap()
            else {
                panic!("a worst case past the budget is refused")
            };
            assert!(
                message.contains("more than the $0.010000 left of the daily budget of `a`"),
                "{message}"
            );
        }
        // What fits is admitted; the next that does not fit what is left is refused.
        let r = a
            .reserve(Money::from_cents(1), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        r.settle(Money::from_nanos(6_000_000), now);
        assert!(
            a.reserve(Money::from_nanos(5_000_000), now)
                .now_or_never()
                .unwrap()
                .is_err()
        );
        a.reserve(Money::from_nanos(4_000_000), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        // Without a limit, two saturated holds add up and come off exactly.
        let free = keys.tenant("free").unwrap();
        let x = free
            .reserve(Money::MAX, now)
            .now_or_never()
            .unwrap()
            .unwrap();
        let y = free
            .reserve(Money::MAX, now)
            .now_or_never()
            .unwrap()
            .unwrap();
        let small = free
            .reserve(Money::from_cents(1), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        assert_eq!(free.lock().held(), Money::MAX);
        drop(x);
        drop(y);
        assert_eq!(free.lock().held(), Money::from_cents(1));
        drop(small);
        assert_eq!(free.lock().reserved, 0);
    }

    #[test]
    fn a_reload_keeps_the_spend_and_holds_of_tenants_that_stay() {
        let key = |tenant: &str, k: &str, daily: i64| KeyConfig {
            tenant: tenant.into(),
            sha256: hash_key(k),
            daily: Some(Money::from_cents(daily)),
            monthly: None,
        };
        let keys = Keys::new(&[key("a", "ka", 100), key("b", "kb", 100)]);
        let now = at("2026-12-03T10:00:00Z");
        let a = keys.tenant("a").unwrap();
        a.spend(Money::from_cents(90), now);
        let held = a
            .reserve(Money::from_cents(5), now)
            .now_or_never()
            .unwrap()
            .unwrap();
        let changes = keys.reload(&[
            key("a", "ka", 200),
            key("c", "kc", 100),
            key("c", "kc2", 100),
        ]);
        assert_eq!(
            changes.to_string(),
            "3 keys (were 2); tenants added: c; tenants removed: b; budgets changed: a"
        );
        assert_eq!(changes.new_tenants.len(), 1);
        assert!(!changes.to_string().contains(&hash_key("kc")[..8]));
        // The same tenant: its spend and hold carry over, under its new budget.
        assert!(Arc::ptr_eq(&a, &keys.tenant("a").unwrap()));
        assert!(keys.tenant("b").is_none());
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer kb"));
        assert!(matches!(
            keys.authenticate(&h),
            Err(ApiError::Unauthorized(_))
        ));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer kc2"),
        );
        assert_eq!(keys.authenticate(&h).unwrap().unwrap().name, "c");
        held.settle(Money::from_cents(5), now);
        assert_eq!(a.totals(now).0, Money::from_cents(95));
        assert_eq!(a.lock().reserved, 0);
        a.admit(now).unwrap();
        assert_eq!(
            keys.reload(&[]).to_string(),
            "0 keys (were 3); tenants removed: a, c"
        );
        assert!(keys.is_open());
    }

    /// Issue 31: a config emptied of keys does not open the API on a reload unless it
    /// says so.
    #[test]
    fn a_reload_that_would_drop_every_key_needs_allow_open() {
        let key = KeyConfig {
            tenant: "a".into(),
            sha256: hash_key("ka"),
            daily: None,
            monthly: None,
        };
        let keys = Keys::new(std::slice::from_ref(&key));
        let mut set = KeySet::default();
        let refused = keys.reload_set(&set).unwrap_err();
        assert!(refused.to_string().contains("drop all 1 keys"), "{refused}");
        assert!(
            refused.to_string().contains("allow_open = true"),
            "{refused}"
        );
        assert!(!keys.is_open());
        assert!(keys.tenant("a").is_some());
        set.allow_open = true;
        keys.reload_set(&set).unwrap();
        assert!(keys.is_open());
        // An open gateway given no keys again stays open, as it started.
        keys.reload_set(&KeySet::default()).unwrap();
        set.keys = vec![key];
        keys.reload_set(&set).unwrap();
        assert!(!keys.is_open());
    }
}
