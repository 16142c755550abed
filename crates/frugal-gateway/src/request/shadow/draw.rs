//! Which cheap answers are shadowed (a seeded draw at the rate), and the slots that bound
//! how many shadows run at once. Apart from the runner (which calls the pipeline), so the
//! gateway's state and the pipeline hold and use it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::Backend;
use crate::cascade::route::SkipExample;
use crate::http::validate::Job;
use crate::meter::ShadowOf;
use crate::metrics::Metrics;

/// Shadows running at once, at most: more would spend on checking what the gateway serves
/// more than a sample needs.
pub const IN_FLIGHT: usize = 4;

/// The gateway's shadows: the sampling and the slots.
pub struct Shadows {
    /// `[serve] shadow_rate`: the share of cheap answers shadowed where no route sets one.
    pub rate: f64,
    /// SplitMix64's state: one seed gives the same draws.
    draws: AtomicU64,
    slots: Arc<Semaphore>,
    /// `[serve] shadow_examples`.
    pub examples: Option<Examples>,
}

/// `[serve] shadow_examples`: the file each routing shadow's question and verdict is
/// appended to, one skip example a line, so that the router can be refitted on what the
/// shadows measured (`frugal route train --from`).
#[derive(Debug)]
pub struct Examples {
    path: PathBuf,
    file: Mutex<File>,
}

impl Examples {
    /// Opens `path` to append to, created if missing.
    pub fn open(path: &Path) -> std::io::Result<Examples> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(Examples {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }

    /// Appends one example as a whole line (one write, so a line is never torn by another);
    /// a failed write (a full disk) is logged and the example lost, never the request.
    pub fn append(&self, example: &SkipExample) {
        let Ok(mut line) = serde_json::to_vec(example) else {
            return;
        };
        line.push(b'\n');
        let written = match self.file.lock() {
            Ok(mut f) => f.write_all(&line),
            Err(_) => return,
        };
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot append a shadow's example");
        }
    }
}

impl Shadows {
    pub fn new(rate: f64, seed: u64) -> Shadows {
        Shadows {
            rate,
            draws: AtomicU64::new(seed),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            examples: None,
        }
    }

    /// Appending each routing shadow's example to `examples`, if any.
    pub fn with_examples(self, examples: Option<Examples>) -> Shadows {
        Shadows { examples, ..self }
    }

    /// Whether one answer is shadowed at `rate`: never at 0, always at 1.
    fn draw(&self, rate: f64) -> bool {
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

impl Shadows {
    /// The answer `served` describes, drawn at `rate` and given a slot; `served` is built
    /// only when drawn. Drawn with every slot taken: dropped, and counted in `metrics`.
    pub fn pick<T>(
        &self,
        rate: f64,
        metrics: &Metrics,
        served: impl FnOnce() -> Option<T>,
    ) -> Option<Drawn<T>> {
        if !self.draw(rate) {
            return None;
        }
        let served = served()?;
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            metrics.count_shadow_dropped();
            return None;
        };
        Some(Drawn { served, slot })
    }

    /// Waits, up to `within`, for the shadows running to finish (their slots back).
    pub async fn finish(&self, within: std::time::Duration) {
        let all = self.slots.acquire_many(IN_FLIGHT as u32);
        drop(tokio::time::timeout(within, all).await);
    }
}

/// An answer a cheap lever served, to check.
pub struct Served {
    pub of: ShadowOf,
    /// Its text.
    pub text: String,
    /// The reference path: the backend that answers without the lever.
    pub reference: Arc<dyn Backend>,
    /// The request as the client sent it.
    pub job: Arc<Job>,
}

/// A shadow drawn (a [`Served`]), with its slot.
pub struct Drawn<T = Served> {
    pub served: T,
    pub slot: OwnedSemaphorePermit,
}

impl Default for Shadows {
    fn default() -> Shadows {
        Shadows::new(0.0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over the slots, a drawn shadow is dropped and counted; one with nothing to check
    /// is neither; a slot given back is taken again.
    #[test]
    fn shadows_beyond_the_slots_are_dropped_and_counted() {
        let shadows = Shadows::new(1.0, 0);
        let metrics = Metrics::default();
        let one = || Some(());
        let held: Vec<Drawn<()>> = (0..IN_FLIGHT)
            .map(|_| shadows.pick(1.0, &metrics, one).unwrap())
            .collect();
        assert!(shadows.pick(1.0, &metrics, one).is_none());
        assert!(shadows.pick(0.0, &metrics, one).is_none(), "not drawn");
        assert!(shadows.pick(1.0, &metrics, || None::<()>).is_none());
        assert!(
            metrics
                .render(None)
                .contains("frugal_shadow_dropped_total 1\n")
        );
        drop(held);
        assert!(shadows.pick(1.0, &metrics, one).is_some());
    }

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
