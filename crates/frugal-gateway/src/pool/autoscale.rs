//! How many replicas a pool wants: Knative's KPA rule, on demand = requests in flight plus
//! requests held by the activator.
//!
//! Demand is sampled once a tick and averaged over two windows. The stable window (60 s)
//! sizes the pool; the panic window (6 s; its mean, or the latest sample when higher, so a
//! burst is seen at its first tick) takes over while demand exceeds `panic_threshold` times
//! the ready capacity, and for a stable window after, during which the pool never shrinks. Scale-up is immediate; scale-down waits until the stable window has passed
//! since the last scale-up, and the pool drains one replica at a time. With no request for
//! `scale_to_zero_after`, the pool goes to `min_replicas` (zero allowed); a request at zero
//! activates one replica at once, without waiting for the averages.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::PoolConfig;

#[derive(Debug)]
pub struct Autoscaler {
    stable: Duration,
    panic: Duration,
    threshold: f64,
    target: f64,
    min: u32,
    max: u32,
    zero_after: Duration,
    /// (when, demand) samples, oldest first, no older than the stable window.
    samples: VecDeque<(Instant, f64)>,
    /// In panic mode until then.
    panic_until: Option<Instant>,
    last_up: Option<Instant>,
    desired: u32,
}

/// What the pool looks like when the autoscaler decides.
#[derive(Debug, Clone, Copy)]
pub struct Observed {
    /// Requests in flight on the pool's replicas plus requests held for one.
    pub demand: u32,
    /// Replicas ready to serve (the capacity panic mode is measured against).
    pub ready: u32,
    /// Replicas ready or starting, not draining: what `desired` is compared with.
    pub live: u32,
    /// Time since the last request arrived or finished.
    pub idle_for: Duration,
}

impl Autoscaler {
    pub fn new(c: &PoolConfig) -> Autoscaler {
        Autoscaler {
            stable: c.stable_window,
            panic: c.panic_window,
            threshold: c.panic_threshold,
            target: f64::from(c.target_in_flight),
            min: c.min_replicas,
            max: c.max_replicas,
            zero_after: c.scale_to_zero_after,
            samples: VecDeque::new(),
            panic_until: None,
            last_up: None,
            desired: c.min_replicas,
        }
    }

    pub fn desired(&self) -> u32 {
        self.desired
    }

    pub fn panicking(&self, now: Instant) -> bool {
        self.panic_until.is_some_and(|t| now < t)
    }

    /// Takes this tick's sample and returns the replicas wanted.
    pub fn tick(&mut self, now: Instant, o: Observed) -> u32 {
        self.samples.push_back((now, f64::from(o.demand)));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.stable)
        {
            self.samples.pop_front();
        }
        let stable = self.average(now, self.stable);
        // A burst counts at its first tick: the panic window's mean, or this sample when
        // higher (Knative's mean would take several ticks of a sudden burst to cross 200%).
        let panic = self.average(now, self.panic).max(f64::from(o.demand));
        // Capacity is the ready replicas' (one, at zero, so that any demand there counts).
        let capacity = f64::from(o.ready.max(1)) * self.target;
        if panic / capacity >= self.threshold {
            self.panic_until = Some(now + self.stable);
        }
        let want_stable = (stable / self.target).ceil() as u32;
        let want_panic = (panic / self.target).ceil() as u32;
        let mut want = if self.panicking(now) {
            // Panic mode never shrinks the pool.
            want_panic.max(want_stable).max(self.desired).max(o.live)
        } else {
            want_stable
        };
        if o.demand > 0 {
            want = want.max(1);
        } else if o.idle_for >= self.zero_after {
            // Idle past the grace: to zero, whatever the averages still remember.
            want = 0;
        } else if want == 0 && o.live > 0 {
            // Averages reach zero before the idle grace is over: keep one warm until then.
            want = 1;
        }
        if want < o.live {
            let recent_up = self
                .last_up
                .is_some_and(|t| now.saturating_duration_since(t) < self.stable);
            if recent_up || self.panicking(now) {
                want = o.live;
            } else {
                // One replica at a time.
                want = o.live - 1;
            }
        }
        self.set(now, want, o.live)
    }

    /// A request is held at a pool with nothing ready or starting: one replica now,
    /// without a sample (activation must not wait for the next tick).
    pub fn activate(&mut self, now: Instant, live: u32) -> u32 {
        let want = self.desired.max(1);
        self.set(now, want, live)
    }

    fn set(&mut self, now: Instant, want: u32, live: u32) -> u32 {
        let want = want.clamp(self.min, self.max);
        if want > live {
            self.last_up = Some(now);
        }
        self.desired = want;
        want
    }

    /// Mean demand over the last `window`, counting the samples in it.
    fn average(&self, now: Instant, window: Duration) -> f64 {
        let (sum, n) = self
            .samples
            .iter()
            .rev()
            .take_while(|(t, _)| now.saturating_duration_since(*t) <= window)
            .fold((0.0, 0u32), |(s, n), (_, d)| (s + d, n + 1));
        if n == 0 { 0.0 } else { sum / f64::from(n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Kind;

    fn config() -> PoolConfig {
        let mut c = PoolConfig::new(
            "p",
            Kind::External {
                url: "http://x".into(),
            },
        );
        c.min_replicas = 0;
        c.max_replicas = 10;
        c.target_in_flight = 10;
        c.stable_window = Duration::from_secs(60);
        c.panic_window = Duration::from_secs(6);
        c.scale_to_zero_after = Duration::from_secs(300);
        c
    }

    struct Run {
        a: Autoscaler,
        t0: Instant,
        live: u32,
        second: u64,
    }

    impl Run {
        fn new(c: &PoolConfig) -> Run {
            Run {
                a: Autoscaler::new(c),
                t0: Instant::now(),
                live: 0,
                second: 0,
            }
        }

        /// One tick a second at `demand`; every wanted replica is ready at once.
        fn tick(&mut self, demand: u32, idle_for: u64) -> u32 {
            self.second += 1;
            let now = self.t0 + Duration::from_secs(self.second);
            let want = self.a.tick(
                now,
                Observed {
                    demand,
                    ready: self.live,
                    live: self.live,
                    idle_for: Duration::from_secs(idle_for),
                },
            );
            self.live = want;
            want
        }
    }

    #[test]
    fn a_burst_panics_within_a_tick_and_a_calm_rise_follows_the_stable_window() {
        let c = config();
        let mut r = Run::new(&c);
        for _ in 0..60 {
            assert_eq!(r.tick(10, 0), 1);
        }
        // Demand jumps to 8x capacity: over 200% of one replica at the first tick, sized
        // to the burst at once.
        assert_eq!(r.tick(80, 0), 8, "scaled up on the first tick of the burst");
        for _ in 0..7 {
            r.tick(80, 0);
        }
        assert_eq!(r.live, 8, "80 over 10 each");
        // A slow rise from 10 to 19 never doubles capacity: the stable window sizes it.
        let mut r = Run::new(&c);
        for _ in 0..60 {
            r.tick(10, 0);
        }
        r.tick(19, 0);
        assert_eq!(r.live, 2, "ceil of the stable mean (just over 10) over 10");
        assert!(!r.a.panicking(r.t0 + Duration::from_secs(r.second)));
    }

    #[test]
    fn the_pool_shrinks_one_at_a_time_only_after_the_stable_window_and_never_in_panic() {
        let c = config();
        let mut r = Run::new(&c);
        for _ in 0..10 {
            r.tick(80, 0);
        }
        assert_eq!(r.live, 8);
        // Demand gone: panic mode, entered at the burst's first tick, holds the pool for a
        // stable window from then.
        let mut sizes = Vec::new();
        for _ in 0..140 {
            sizes.push(r.tick(0, 0));
        }
        assert!(sizes[..50].iter().all(|&n| n == 8), "{sizes:?}");
        for w in sizes.windows(2) {
            assert!(w[0] - w[1] <= 1, "one replica at a time: {sizes:?}");
        }
        assert_eq!(
            *sizes.last().unwrap_or(&0),
            1,
            "one kept warm until the idle grace"
        );
    }

    #[test]
    fn idle_past_the_grace_goes_to_zero_and_a_request_at_zero_activates_one() {
        let mut c = config();
        c.scale_to_zero_after = Duration::from_secs(30);
        let mut r = Run::new(&c);
        r.tick(5, 0);
        assert_eq!(r.live, 1);
        // The stable mean reaches zero after 60 s; the grace has passed by then.
        for s in 0..61 {
            r.tick(0, s);
        }
        assert_eq!(r.live, 0);
        // A held request wakes the pool at once.
        assert_eq!(r.a.activate(r.t0, 0), 1);
        // min_replicas holds however idle.
        c.min_replicas = 2;
        let mut r = Run::new(&c);
        for s in 0..200 {
            r.tick(0, s);
        }
        assert_eq!(r.live, 2);
    }

    #[test]
    fn max_replicas_caps_any_demand() {
        let mut c = config();
        c.max_replicas = 3;
        let mut r = Run::new(&c);
        for _ in 0..10 {
            r.tick(10_000, 0);
        }
        assert_eq!(r.live, 3);
    }
}
