//! Which cheap answers are shadowed (a seeded draw at the rate), and the slots that bound
//! how many shadows run at once. Apart from the runner, so the gateway's state holds it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Semaphore;

/// Shadows running at once, at most: more would spend on checking what the gateway serves
/// more than a sample needs.
pub const IN_FLIGHT: usize = 4;

/// The gateway's shadows: the sampling and the slots.
pub struct Shadows {
    /// `[serve] shadow_rate`: the share of cheap answers shadowed where no route sets one.
    pub rate: f64,
    /// SplitMix64's state: one seed gives the same draws.
    draws: AtomicU64,
    pub(super) slots: Arc<Semaphore>,
}

impl Shadows {
    pub fn new(rate: f64, seed: u64) -> Shadows {
        Shadows {
            rate,
            draws: AtomicU64::new(seed),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
        }
    }

    /// Whether one answer is shadowed at `rate`: never at 0, always at 1.
    pub(super) fn draw(&self, rate: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        let mut z = self
            .draws
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) < rate
    }
}

impl Default for Shadows {
    fn default() -> Shadows {
        Shadows::new(0.0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_rate_and_repeat_with_the_seed() {
        let (none, all) = (Shadows::new(0.0, 7), Shadows::new(1.0, 7));
        assert!((0..1000).all(|_| !none.draw(0.0) && all.draw(1.0)));
        let draws = |seed| {
            let s = Shadows::new(0.02, seed);
            (0..10_000).map(|_| s.draw(0.02)).collect::<Vec<bool>>()
        };
        let first = draws(1);
        assert_eq!(first, draws(1), "one seed, the same draws");
        let share = first.iter().filter(|d| **d).count();
        assert!((140..=260).contains(&share), "about 2% of 10,000: {share}");
    }
}
