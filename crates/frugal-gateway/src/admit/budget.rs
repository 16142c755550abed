//! Budgets shared by gateway replicas, in Redis (`[serve] budget_redis`).
//!
//! Each tenant has its spend this UTC day and this UTC month (integer nanodollars, expiring a
//! day after their period ends), a sorted set of holds, one per request in flight on any
//! replica (`id:nanos`, scored by when it expires, [`HOLD_TTL`]), and a sorted set of the
//! settles it took (by id, for [`SETTLED_TTL`]). Admission is one
//! Lua script, atomic in Redis: drop expired holds, start the totals from this gateway's
//! view if Redis has none (`SET NX`: this gateway's view starts from the ledger, so a fresh
//! Redis does not hand out a budget again), refuse once spend plus holds reach a limit (or
//! the hold alone is more than what is left), else add the hold. Settling is another: remove
//! the hold, and add the real cost to both totals unless a settle of the same id already
//! did. The rule is the single gateway's ([`crate::admit::keys`]), so N replicas overshoot a
//! budget by at most the one hold that found room last, not N budgets.
//!
//! Redis is not needed to serve. A call that fails or takes longer than
//! [`CALL_TIMEOUT`](crate::redis_conn::CALL_TIMEOUT) leaves admission on the local view (this
//! gateway's spend and the shared totals it last saw), counted in `/metrics`, and Redis is
//! tried again a second later. What is spent meanwhile is kept and settled into Redis once it
//! answers again, so the shared totals do not miss it. A call that timed out may still run
//! (a Redis that was only slow, or paused): so a hold whose placement timed out is released
//! by its id, and a settle is retried under its own id, which Redis takes once, so a retry
//! never adds a cost twice and no hold outlives its request by 15 minutes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, Utc};
use frugal_cost::Money;
use redis::aio::ConnectionManager;

use crate::admit::account::{Account, next_day, next_month};
use crate::redis_conn::{CALL_TIMEOUT, connect_redis, redact_url};

/// How long a hold lives when its request never settles (the gateway that held it crashed):
/// a little over the longest a request runs. An upstream call is cut at its `timeout_s`
/// (120 s by default) times its tries; a long generation on the local model's CPU engine
/// (thousands of tokens at a few tokens per second) takes minutes. A request that outlives
/// its hold is still charged in full when it settles.
pub const HOLD_TTL: Duration = Duration::from_secs(15 * 60);

/// After a failed call, admission stays on the local view this long before Redis is tried
/// again: an outage costs one timeout a second, not one per request.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Totals outlive their period by a day, so a late settle (a replica's clock behind, spend
/// replayed after an outage) still finds them.
const GRACE_S: i64 = 86_400;

/// How often spend that Redis missed is offered to it again while nothing else calls.
const REPLAY_EVERY: Duration = Duration::from_secs(2);

/// How long Redis remembers a settle's id (so that a retry of a settle whose answer was
/// lost does not add its cost again) and a released hold's (so that a reservation that
/// runs late does not place it). Retries come within seconds of Redis answering again; one
/// that comes later than this after a try that ran would count twice.
const SETTLED_TTL: Duration = Duration::from_secs(3600);

/// KEYS: holds, day, month, settled. ARGV: day base, day expiry (unix s), month base, month
/// expiry, daily limit, monthly limit (-1: none), the hold (`id:nanos`), its TTL in ms.
/// Refused as [`crate::admit::keys`] refuses: spend and holds reach a limit, or the hold
/// alone is more than what is left of it. A hold already released (this call timed out,
/// and the gateway gave it back first) is not placed. Returns {admitted, day total, month
/// total, held by others}.
const RESERVE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EXAT', ARGV[2])
redis.call('SET', KEYS[3], ARGV[3], 'NX', 'EXAT', ARGV[4])
local held = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  held = held + tonumber(string.match(m, ':(%d+)$'))
end
local day = tonumber(redis.call('GET', KEYS[2]))
local month = tonumber(redis.call('GET', KEYS[3]))
local dl, ml = tonumber(ARGV[5]), tonumber(ARGV[6])
local amount = tonumber(string.match(ARGV[7], ':(%d+)$'))
if (dl >= 0 and (day + held >= dl or day + amount > dl))
  or (ml >= 0 and (month + held >= ml or month + amount > ml)) then
  return {0, day, month, held}
end
if redis.call('ZSCORE', KEYS[4], ARGV[7]) then return {0, day, month, held} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[8]), ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return {1, day, month, held}
";

/// KEYS: holds, day, month, settled. ARGV: day base, day expiry, month base, month expiry,
/// the hold ('' for none), the cost, the settle's id, how long its id is kept (ms). The
/// cost is added once per id: a retry of a settle that ran (its answer lost to a timeout)
/// only removes the hold again. A Redis that lost its data since has no record of it, and
/// its totals start from this gateway's view without the cost: added. A period already
/// over is left alone. Returns {day total, month total}, -1 for a period over.
const SETTLE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1])
local now_ms = now * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms)
if ARGV[5] ~= '' then redis.call('ZREM', KEYS[1], ARGV[5]) end
local add = redis.call('ZADD', KEYS[4], 'NX', now_ms + tonumber(ARGV[8]), ARGV[7]) == 1
redis.call('PEXPIRE', KEYS[4], ARGV[8])
local out = {-1, -1}
for i = 1, 2 do
  local exat = tonumber(ARGV[2 * i])
  if exat > now then
    redis.call('SET', KEYS[i + 1], ARGV[2 * i - 1], 'NX', 'EXAT', exat)
    if add then redis.call('INCRBY', KEYS[i + 1], ARGV[6]) end
    out[i] = tonumber(redis.call('GET', KEYS[i + 1]))
  end
end
return out
";

/// KEYS: holds, settled. ARGV: the hold, how long its release is remembered (ms): removes
/// it, and keeps it from being placed by a reservation that runs late.
const RELEASE: &str = r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], now_ms + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
";

/// What Redis said to a reservation.
pub(crate) struct Verdict {
    pub admitted: bool,
    pub day: Money,
    pub month: Money,
    /// Held by requests in flight on every replica (before this one).
    pub held: Money,
    /// This one's hold, when admitted.
    pub hold: Hold,
}

/// A request's hold in Redis: its member of the holds set.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    member: String,
}

/// A cost not yet added to the shared totals: being settled, or waiting for Redis.
struct Pending {
    id: u64,
    tenant: Arc<dyn Account>,
    at: DateTime<Utc>,
    cost: Money,
    hold: Option<Hold>,
    in_flight: bool,
    /// A settle of it was sent: Redis may have taken it under its id, so nothing more is
    /// added to it.
    tried: bool,
}

pub struct SharedBudgets {
    conn: ConnectionManager,
    /// The URL without its password, for the log.
    shown: String,
    /// Whether the last call reached Redis.
    reached: AtomicBool,
    /// Until when admission skips Redis after a failed call.
    retry_at: Mutex<Option<Instant>>,
    /// Admissions decided on the local view.
    pub fallbacks: AtomicU64,
    pending: Mutex<Vec<Pending>>,
    /// Holds to remove that Redis has not confirmed removed (tenant, member): placed by a
    /// call that timed out, or given back while Redis did not answer.
    releases: Mutex<Vec<(String, String)>>,
    /// Makes hold and pending ids unique: a random prefix per process, then a count.
    prefix: String,
    next: AtomicU64,
    /// Wakes the task that replays pending spend.
    wake: Arc<tokio::sync::Notify>,
    hold_ttl: Duration,
}

impl std::fmt::Debug for SharedBudgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBudgets")
            .field("redis", &self.shown)
            .finish_non_exhaustive()
    }
}

/// `EVAL` of `source` on the tenant's four keys, with what both scripts take first: each
/// period's base total (where Redis has none) and when its key expires.
fn script(source: &str, tenant: &str, at: DateTime<Utc>, bases: [Money; 2]) -> redis::Cmd {
    let (keys, expiry) = keys(tenant, at);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source)
        .arg(4)
        .arg(&keys[..])
        .arg(bases[0].nanos())
        .arg(expiry[0])
        .arg(bases[1].nanos())
        .arg(expiry[1]);
    cmd
}

/// A tenant's keys at `at` (holds, day, month, settled), and when each total expires.
fn keys(tenant: &str, at: DateTime<Utc>) -> ([String; 4], [i64; 2]) {
    // The hash tag keeps a tenant's keys in one slot of a Redis Cluster.
    let base = format!("frugal:budget:v1:{{{tenant}}}");
    (
        [
            format!("{base}:holds"),
            format!("{base}:day:{}", at.format("%Y-%m-%d")),
            format!("{base}:month:{}", at.format("%Y-%m")),
            format!("{base}:settled"),
        ],
        [
            next_day(at).timestamp() + GRACE_S,
            next_month(at).timestamp() + GRACE_S,
        ],
    )
}

fn limit(l: Option<Money>) -> i64 {
    l.map_or(-1, Money::nanos)
}

impl SharedBudgets {
    /// Connects (and checks Redis answers) before serving starts, and starts the task that
    /// settles into Redis what was spent while it was unreachable.
    pub async fn connect(url: &str) -> Result<Arc<SharedBudgets>, String> {
        SharedBudgets::connect_holding(url, HOLD_TTL).await
    }

    async fn connect_holding(url: &str, hold_ttl: Duration) -> Result<Arc<SharedBudgets>, String> {
        let conn = connect_redis("budget_redis", url).await?;
        let mut random = [0u8; 6];
        getrandom::fill(&mut random).map_err(|e| format!("budget_redis: no randomness: {e}"))?;
        let budgets = Arc::new(SharedBudgets {
            conn,
            shown: redact_url(url),
            reached: AtomicBool::new(true),
            retry_at: Mutex::new(None),
            fallbacks: AtomicU64::new(0),
            pending: Mutex::new(Vec::new()),
            releases: Mutex::new(Vec::new()),
            prefix: random.iter().map(|b| format!("{b:02x}")).collect(),
            next: AtomicU64::new(0),
            wake: Arc::new(tokio::sync::Notify::new()),
            hold_ttl,
        });
        tokio::spawn(replay(Arc::downgrade(&budgets), budgets.wake.clone()));
        Ok(budgets)
    }

    /// Whether the last budget call reached Redis (else admission is on the local view).
    pub fn is_shared(&self) -> bool {
        self.reached.load(Ordering::Relaxed)
    }

    /// Costs waiting to be added to the shared totals.
    pub fn unsettled(&self) -> usize {
        self.lock_pending().len()
    }

    /// Holds waiting to be removed from Redis.
    pub fn unreleased(&self) -> usize {
        self.lock_releases().len()
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_releases(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.releases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// At shutdown: settles into Redis what it has not taken yet, and removes the holds
    /// it still has, for up to `wait`; what is left then is said, not silently dropped.
    pub async fn flush(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        loop {
            if self.worth_trying() {
                self.replay_pending().await;
            }
            let (unsettled, unreleased) = (self.unsettled(), self.unreleased());
            if unsettled + unreleased == 0 {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    redis = %self.shown,
                    unsettled,
                    unreleased,
                    "budgets: Redis did not take every cost before shutdown; the ledger has them, and a gateway starting from it counts them"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether to call Redis now: it answered last time, or the pause after a failure is over.
    fn worth_trying(&self) -> bool {
        let retry = self.retry_at.lock().unwrap_or_else(|p| p.into_inner());
        self.is_shared() || retry.is_none_or(|t| Instant::now() >= t)
    }

    fn reached_it(&self) {
        *self.retry_at.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if !self.reached.swap(true, Ordering::Relaxed) {
            // At the fallback's level, so that whoever saw it go sees it come back.
            tracing::warn!(
                redis = %self.shown,
                "budgets: Redis answers again; admission is shared again, and what was spent meanwhile is settled into it"
            );
            self.wake.notify_one();
        }
    }

    fn missed_it(&self, why: &str) {
        *self.retry_at.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() + RETRY_AFTER);
        if self.reached.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                redis = %self.shown,
                "budgets: Redis {why}; admission falls back to this gateway's view of each tenant's spend"
            );
        }
    }

    fn new_id(&self) -> (u64, String) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (n, format!("{}-{n}", self.prefix))
    }

    /// A hold's member in the holds set: a unique id and the amount held.
    fn new_hold(&self, amount: Money) -> String {
        format!("{}:{}", self.new_id().1, amount.nanos().max(0))
    }

    /// What Redis should start `tenant`'s totals of `at`'s periods from if it has none: this
    /// gateway's view of the current periods, less what it has not yet added to Redis
    /// (added as it settles); 0 for a period that is over.
    fn bases(
        &self,
        pending: &[Pending],
        tenant: &Arc<dyn Account>,
        at: DateTime<Utc>,
    ) -> [Money; 2] {
        let now = Utc::now();
        let (day, month) = tenant.totals(now);
        let same_day = |t: DateTime<Utc>| t.date_naive() == now.date_naive();
        let same_month = |t: DateTime<Utc>| (t.year(), t.month()) == (now.year(), now.month());
        let mut bases = [
            if same_day(at) { day } else { Money::ZERO },
            if same_month(at) { month } else { Money::ZERO },
        ];
        for p in pending.iter().filter(|p| Arc::ptr_eq(&p.tenant, tenant)) {
            if same_day(at) && same_day(p.at) {
                bases[0] -= p.cost;
            }
            if same_month(at) && same_month(p.at) {
                bases[1] -= p.cost;
            }
        }
        bases.map(|b| b.max(Money::ZERO))
    }

    async fn call<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, String> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(CALL_TIMEOUT, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("failed: {e}")),
            Err(_) => Err(format!(
                "did not answer within {} ms",
                CALL_TIMEOUT.as_millis()
            )),
        }
    }

    /// Holds `amount` of `tenant`'s budgets in Redis; `None` when Redis did not answer (the
    /// caller decides on its local view, counted as a fallback).
    pub(crate) async fn reserve(
        &self,
        tenant: &Arc<dyn Account>,
        amount: Money,
        now: DateTime<Utc>,
    ) -> Option<Verdict> {
        if !self.worth_trying() {
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let bases = self.bases(&self.lock_pending(), tenant, now);
        let limits = tenant.limits();
        let member = self.new_hold(amount);
        let mut cmd = script(RESERVE, tenant.name(), now, bases);
        cmd.arg(limit(limits.daily))
            .arg(limit(limits.monthly))
            .arg(&member)
            .arg(self.hold_ttl.as_millis() as u64);
        match self.call::<(i64, i64, i64, i64)>(cmd).await {
            Ok((admitted, day, month, held)) => {
                self.reached_it();
                Some(Verdict {
                    admitted: admitted == 1,
                    day: Money::from_nanos(day),
                    month: Money::from_nanos(month),
                    held: Money::from_nanos(held),
                    hold: Hold { member },
                })
            }
            Err(why) => {
                // The script may yet run (a Redis that was slow, or paused): its hold would
                // fill the budget for 15 minutes. It is released by its id once Redis
                // answers, which also keeps a late run from placing it.
                self.lock_releases()
                    .push((tenant.name().to_owned(), member));
                self.missed_it(&why);
                self.fallbacks.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Charges `cost` to `tenant` (in this gateway's view now, in Redis in the background)
    /// and drops its `hold`, if any. Until Redis has it, the cost is pending: left out of
    /// the totals Redis would start from, and replayed when Redis answers again.
    pub(crate) fn charge(
        self: &Arc<Self>,
        tenant: Arc<dyn Account>,
        hold: Option<Hold>,
        cost: Money,
        now: DateTime<Utc>,
    ) {
        let (id, _) = self.new_id();
        let attempt = self.worth_trying() && tokio::runtime::Handle::try_current().is_ok();
        {
            let mut pending = self.lock_pending();
            tenant.add_local(cost, now);
            // While Redis is away, a tenant's spend of a day without holds waits as one
            // entry, so a long outage costs memory and replay per tenant, not per request.
            let waiting = (!attempt && hold.is_none())
                .then(|| {
                    pending.iter_mut().find(|p| {
                        Arc::ptr_eq(&p.tenant, &tenant)
                            && p.at.date_naive() == now.date_naive()
                            && p.hold.is_none()
                            && !p.in_flight
                            && !p.tried
                    })
                })
                .flatten();
            if let Some(p) = waiting {
                p.cost += cost;
                return;
            }
            pending.push(Pending {
                id,
                tenant,
                at: now,
                cost,
                hold,
                in_flight: attempt,
                tried: false,
            });
        }
        if attempt {
            let this = self.clone();
            tokio::spawn(async move { this.settle(id).await });
        }
    }

    /// Gives back a hold whose request settled nothing (refused before any work, or
    /// dropped); retried until Redis answers, so the hold does not block the tenant until
    /// it expires.
    pub(crate) fn release(self: &Arc<Self>, tenant: &str, hold: Hold) {
        if tokio::runtime::Handle::try_current().is_err() {
            return; // It expires.
        }
        let (tenant, this) = (tenant.to_owned(), self.clone());
        tokio::spawn(async move {
            if let Err(why) = this.remove_hold(&tenant, &hold.member).await {
                this.lock_releases().push((tenant, hold.member));
                this.missed_it(&why);
            }
        });
    }

    async fn remove_hold(&self, tenant: &str, member: &str) -> Result<(), String> {
        let (keys, _) = keys(tenant, Utc::now());
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE)
            .arg(2)
            .arg(&keys[0])
            .arg(&keys[3])
            .arg(member)
            .arg(SETTLED_TTL.as_millis() as u64);
        self.call::<i64>(cmd).await.map(drop)
    }

    /// Removes the holds Redis has not confirmed removed; stops at the first failure.
    async fn release_pending(&self) -> bool {
        loop {
            let Some((tenant, member)) = self.lock_releases().first().cloned() else {
                return true;
            };
            if let Err(why) = self.remove_hold(&tenant, &member).await {
                self.missed_it(&why);
                return false;
            }
            self.reached_it();
            self.lock_releases()
                .retain(|(t, m)| (t, m) != (&tenant, &member));
        }
    }

    /// Adds pending cost `id` to the shared totals; false when Redis did not take it.
    async fn settle(&self, id: u64) -> bool {
        let (cmd, tenant, at) = {
            let mut pending = self.lock_pending();
            let Some(i) = pending.iter().position(|p| p.id == id) else {
                return true;
            };
            pending[i].tried = true;
            let p = &pending[i];
            let bases = self.bases(&pending, &p.tenant, p.at);
            let mut cmd = script(SETTLE, p.tenant.name(), p.at, bases);
            cmd.arg(p.hold.as_ref().map_or("", |h| &h.member))
                .arg(p.cost.nanos())
                .arg(format!("{}-s{id}", self.prefix))
                .arg(SETTLED_TTL.as_millis() as u64);
            (cmd, p.tenant.clone(), p.at)
        };
        let result = self.call::<(i64, i64)>(cmd).await;
        let mut pending = self.lock_pending();
        let Some(i) = pending.iter().position(|p| p.id == id) else {
            return true;
        };
        match result {
            Ok((day, month)) => {
                pending.swap_remove(i);
                drop(pending);
                tenant.seen(at, day, month);
                self.reached_it();
                true
            }
            Err(why) => {
                // It may have run: the retry carries the same id, which Redis takes once.
                pending[i].in_flight = false;
                drop(pending);
                self.missed_it(&why);
                false
            }
        }
    }

    /// Removes the holds and settles, oldest first, what Redis has not taken yet; stops at
    /// the first failure.
    async fn replay_pending(&self) {
        if !self.release_pending().await {
            return;
        }
        let ids: Vec<u64> = {
            let mut pending = self.lock_pending();
            pending
                .iter_mut()
                .filter(|p| !p.in_flight)
                .map(|p| {
                    p.in_flight = true;
                    p.id
                })
                .collect()
        };
        if ids.is_empty() {
            return;
        }
        let mut settled = 0;
        for (i, id) in ids.iter().enumerate() {
            if !self.settle(*id).await {
                // The rest wait for the next try.
                let mut pending = self.lock_pending();
                for p in pending.iter_mut().filter(|p| ids[i..].contains(&p.id)) {
                    p.in_flight = false;
                }
                break;
            }
            settled += 1;
        }
        if settled > 0 {
            tracing::info!(
                requests = settled,
                "budgets: settled into Redis what was spent while it was unreachable"
            );
        }
    }
}

/// Replays pending spend when Redis answers again, and every few seconds while some waits
/// (a gateway with no traffic to find Redis back).
async fn replay(budgets: Weak<SharedBudgets>, wake: Arc<tokio::sync::Notify>) {
    loop {
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(REPLAY_EVERY) => {}
        }
        let Some(budgets) = budgets.upgrade() else {
            return;
        };
        if budgets.worth_trying() {
            budgets.replay_pending().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::keys::{KeyConfig, Keys, hash_key};
    use crate::http::error::ApiError;
    use frugal_testkit::redis::Redis;

    fn replica(budgets: &Arc<SharedBudgets>, daily: Money, monthly: Option<Money>) -> Keys {
        Keys::with_budgets(
            &[KeyConfig {
                tenant: "t".into(),
                sha256: hash_key("k"),
                daily: Some(daily),
                monthly,
            }],
            Some(budgets.clone()),
        )
    }

    /// The tenant's day and month totals and holds in Redis.
    async fn in_redis(url: &str) -> (Option<i64>, Option<i64>, i64) {
        let mut conn = connect_redis("test", url).await.unwrap();
        let (k, _) = keys("t", Utc::now());
        let day: Option<i64> = redis::cmd("GET")
            .arg(&k[1])
            .query_async(&mut conn)
            .await
            .unwrap();
        let month: Option<i64> = redis::cmd("GET")
            .arg(&k[2])
            .query_async(&mut conn)
            .await
            .unwrap();
        let holds: i64 = redis::cmd("ZCARD")
            .arg(&k[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        (day, month, holds)
    }

    /// Waits until every cost is in Redis.
    async fn settled(budgets: &[&Arc<SharedBudgets>]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while budgets.iter().any(|b| b.unsettled() > 0 || !b.is_shared()) {
            assert!(
                Instant::now() < deadline,
                "spend was not settled into Redis"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_reserving_at_once_stop_within_one_hold_of_the_limit() {
        let redis = Redis::start().unwrap();
        let (a, b) = (
            SharedBudgets::connect(&redis.url).await.unwrap(),
            SharedBudgets::connect(&redis.url).await.unwrap(),
        );
        let limit = Money::from_cents(100);
        let hold = Money::from_cents(7);
        let replicas = [replica(&a, limit, None), replica(&b, limit, None)];
        let mut tasks = Vec::new();
        for i in 0..16 {
            let t = replicas[i % 2].tenant("t").unwrap();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                loop {
                    match t.reserve(hold, Utc::now()).await {
                        Ok(r) => {
                            tokio::task::yield_now().await;
                            r.settle(hold, Utc::now());
                            admitted += 1;
                        }
                        Err(ApiError::Budget { message, .. }) => {
                            assert!(message.contains("daily budget of `t`"), "{message}");
                            return admitted;
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        settled(&[&a, &b]).await;
        assert_eq!(a.fallbacks.load(Ordering::Relaxed), 0);
        let (day, month, holds) = in_redis(&redis.url).await;
        // Admitted while spend + holds < $1.00 and the hold fits what is unspent, each
        // settling at its whole hold: the total stops within one hold of the limit, short of
        // it or (holds in flight together) past it.
        let day = day.unwrap();
        assert!(
            day > (limit - hold).nanos() && day < (limit + hold).nanos(),
            "{day} after {admitted} requests"
        );
        assert_eq!(day, admitted * hold.nanos());
        assert_eq!(month, Some(day));
        assert_eq!(holds, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashed_gateways_holds_expire() {
        let redis = Redis::start().unwrap();
        let budgets = SharedBudgets::connect_holding(&redis.url, Duration::from_millis(300))
            .await
            .unwrap();
        let keys = replica(&budgets, Money::from_cents(100), None);
        let t = keys.tenant("t").unwrap();
        // Held by a gateway that died: never settled, never released.
        std::mem::forget(t.reserve(Money::from_cents(100), Utc::now()).await.unwrap());
        let Err(ApiError::Budget { message, .. }) =
            t.reserve(Money::from_cents(1), Utc::now()).await
        else {
            panic!("the hold fills the budget")
        };
        assert!(
            message.contains("$1.000000 more held by requests in flight"),
            "{message}"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let r = t.reserve(Money::from_cents(1), Utc::now()).await.unwrap();
        assert_eq!(in_redis(&redis.url).await.2, 1, "the expired hold is gone");
        drop(r);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            in_redis(&redis.url).await,
            (Some(0), Some(0), 0),
            "released"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settling_adds_the_real_cost_to_totals_that_start_from_the_ledger() {
        let redis = Redis::start().unwrap();
        let budgets = SharedBudgets::connect(&redis.url).await.unwrap();
        let keys = replica(
            &budgets,
            Money::from_cents(45),
            Some(Money::from_cents(500)),
        );
        // The ledger says $0.30 today and $0.50 this month.
        let now = Utc::now();
        keys.preload(now, |start| {
            let cents = if start == crate::admit::account::period_starts(now).0 {
                30
            } else {
                50
            };
            Ok::<_, ()>(vec![("t".to_owned(), Money::from_cents(cents))])
        })
        .unwrap();
        let t = keys.tenant("t").unwrap();
        // $0.20 more than the $0.15 left: refused, by Redis.
        let Err(ApiError::Budget { message, .. }) =
            t.reserve(Money::from_cents(20), Utc::now()).await
        else {
            panic!("a hold past what is left is refused")
        };
        assert!(
            message.contains("more than the $0.150000 left"),
            "{message}"
        );
        let r = t.reserve(Money::from_cents(15), Utc::now()).await.unwrap();
        assert_eq!(
            in_redis(&redis.url).await,
            (Some(30 * 10_000_000), Some(50 * 10_000_000), 1)
        );
        r.settle(Money::from_cents(10), Utc::now());
        settled(&[&budgets]).await;
        assert_eq!(
            in_redis(&redis.url).await,
            (Some(40 * 10_000_000), Some(60 * 10_000_000), 0)
        );
        // Another replica, which has seen none of it, is refused by the shared total.
        let other = SharedBudgets::connect(&redis.url).await.unwrap();
        let keys = replica(&other, Money::from_cents(40), None);
        let Err(ApiError::Budget { message, .. }) = keys
            .tenant("t")
            .unwrap()
            .reserve(Money::from_cents(1), Utc::now())
            .await
        else {
            panic!("the shared total reaches the limit")
        };
        assert!(
            message.contains("is spent: $0.400000 of $0.40; it resets at"),
            "{message}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_redis_admission_is_local_and_the_spend_is_settled_when_it_returns() {
        let mut redis = Redis::start().unwrap();
        let budgets = SharedBudgets::connect(&redis.url).await.unwrap();
        let keys = replica(&budgets, Money::from_cents(100), None);
        let t = keys.tenant("t").unwrap();
        t.add_local(Money::from_cents(20), Utc::now());
        let first = t.reserve(Money::from_cents(5), Utc::now()).await.unwrap();
        assert_eq!(in_redis(&redis.url).await.0, Some(20 * 10_000_000));
        redis.kill();
        first.settle(Money::from_cents(5), Utc::now());
        let second = t.reserve(Money::from_cents(5), Utc::now()).await.unwrap();
        assert!(!budgets.is_shared());
        assert!(budgets.fallbacks.load(Ordering::Relaxed) >= 1);
        second.settle(Money::from_cents(5), Utc::now());
        // Spend without a hold waits as one entry with the second's.
        t.spend(Money::from_cents(1), Utc::now());
        t.spend(Money::from_cents(1), Utc::now());
        assert_eq!(budgets.unsettled(), 2);
        assert_eq!(t.totals(Utc::now()).0, Money::from_cents(32));
        // It comes back empty (no persistence): the totals start again from this gateway's
        // view, and what was spent meanwhile is added once.
        // The first settle's hold is gone with the old Redis: its cost is added anyway,
        // whether the totals start at the replay or at a reservation before it.
        redis.restart().unwrap();
        tokio::time::sleep(RETRY_AFTER).await;
        let third = t.reserve(Money::from_cents(5), Utc::now()).await.unwrap();
        third.settle(Money::from_cents(5), Utc::now());
        settled(&[&budgets]).await;
        assert_eq!(
            in_redis(&redis.url).await,
            (Some(37 * 10_000_000), Some(37 * 10_000_000), 0)
        );
    }

    /// Issue 31, the fault suite's "Redis frozen under shared budgets": calls that timed
    /// out left their holds for 15 minutes, or added a cost twice. Redis paused past the
    /// timeout while a cost settles and while a hold is placed, then resumed: every cost
    /// is added once, no hold is left, and the tenant is admitted while budget remains.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_redis_keeps_no_hold_and_counts_each_cost_once() {
        let redis = Redis::start().unwrap();
        let budgets = SharedBudgets::connect(&redis.url).await.unwrap();
        let keys = replica(&budgets, Money::from_cents(30), None);
        let t = keys.tenant("t").unwrap();
        let cents = Money::from_cents;
        let first = t.reserve(cents(5), Utc::now()).await.unwrap();
        first.settle(cents(4), Utc::now());
        settled(&[&budgets]).await;
        let held = t.reserve(cents(5), Utc::now()).await.unwrap();
        assert_eq!(in_redis(&redis.url).await.2, 1);

        redis.pause();
        // Spent without a hold, and settled with one: both calls time out, their scripts
        // wait in Redis.
        t.spend(cents(6), Utc::now());
        held.settle(cents(5), Utc::now());
        let deadline = Instant::now() + Duration::from_secs(10);
        while budgets
            .lock_pending()
            .iter()
            .any(|p| p.in_flight || !p.tried)
            || budgets.is_shared()
        {
            assert!(Instant::now() < deadline, "the settles did not time out");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Placed once Redis is tried again: that call times out too, and the request is
        // admitted on this gateway's view ($0.15 spent, $0.15 held).
        while !budgets.worth_trying() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let late = t.reserve(cents(15), Utc::now()).await.unwrap();
        assert!(budgets.fallbacks.load(Ordering::Relaxed) >= 1);
        assert_eq!(budgets.unreleased(), 1, "its hold may yet be placed");
        late.settle(cents(3), Utc::now());
        assert_eq!(budgets.unsettled(), 3);

        redis.resume();
        let deadline = Instant::now() + Duration::from_secs(10);
        while budgets.unsettled() + budgets.unreleased() > 0 || !budgets.is_shared() {
            assert!(Instant::now() < deadline, "Redis did not take it all back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // $0.04 + $0.06 + $0.05 + $0.03, each once; the late hold released (placed late,
        // or kept from being placed).
        let (day, month, holds) = in_redis(&redis.url).await;
        assert_eq!(day, Some(cents(18).nanos()), "the day's total");
        assert_eq!(month, Some(cents(18).nanos()));
        assert_eq!(holds, 0, "no hold outlives its request");
        // $0.12 left: a hold of $0.12 fits (the late one of $0.15 would have refused it).
        let again = t.reserve(cents(12), Utc::now()).await.unwrap();
        again.settle(cents(1), Utc::now());
        settled(&[&budgets]).await;
        assert_eq!(in_redis(&redis.url).await.0, Some(cents(19).nanos()));
    }
}
