//! The data loader: worker threads build the batches of the steps ahead of the trainer.
//!
//! A step's batch is a function of the step alone ([`train_batch`]), so workers may build
//! batches in any order on any thread; the trainer takes them in step order from an ordered
//! buffer, and what it computes is the same whatever the loader's settings.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::data::{Batch, Corpus, train_batch};
use crate::hparams::HParams;

/// How batches are loaded.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Worker threads; 0 builds each batch in the training loop when the step needs it.
    pub threads: usize,
    /// Batches the workers may have built or be building ahead of the trainer (at least 1).
    pub prefetch: usize,
    /// A sleep while building each batch, in the thread that builds it (`--data-delay-ms`).
    pub delay: Duration,
}

/// The batch of `step`, as whichever thread builds it builds it.
fn build(corpus: &Corpus, hp: &HParams, step: u64, delay: Duration) -> Batch {
    let batch = train_batch(corpus, hp, step);
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    batch
}

/// Runs `body` with the batches of `steps`, to be taken in order, and stops the workers
/// (within one batch's build time) when `body` returns, fails or panics.
pub fn scoped<T>(
    corpus: &Corpus,
    hp: &HParams,
    steps: Range<u64>,
    settings: Settings,
    body: impl FnOnce(&mut Batches<'_>) -> Result<T>,
) -> Result<T> {
    let queue = Queue {
        state: Mutex::new(Shared {
            next: steps.start,
            end: steps.end,
            wanted: steps.start,
            ready: BTreeMap::new(),
            closed: false,
        }),
        changed: Condvar::new(),
        prefetch: settings.prefetch.max(1) as u64,
    };
    let make = |step| build(corpus, hp, step, settings.delay);
    let workers = if steps.is_empty() {
        0
    } else {
        settings.threads
    };
    std::thread::scope(|s| {
        // Made first: its drop closes the queue, so no exit from here leaves a worker waiting.
        let mut batches = Batches {
            queue: (workers > 0).then_some(&queue),
            build: &make,
        };
        for i in 0..workers {
            let (queue, make) = (&queue, &make);
            std::thread::Builder::new()
                .name(format!("loader-{i}"))
                .spawn_scoped(s, move || queue.work(make))
                .context("starting a data loader thread")?;
        }
        body(&mut batches)
    })
}

/// The trainer's end of the loader.
pub struct Batches<'a> {
    /// `None`: no workers, build inline.
    queue: Option<&'a Queue>,
    build: &'a (dyn Fn(u64) -> Batch + Sync),
}

impl Batches<'_> {
    /// The batch of `step`, waiting for it if a worker has not built it yet. Steps must be
    /// asked for in order, from the start of the range.
    pub fn next(&mut self, step: u64) -> Result<Batch> {
        match self.queue {
            Some(queue) => queue.take(step),
            None => Ok((self.build)(step)),
        }
    }
}

impl Drop for Batches<'_> {
    fn drop(&mut self) {
        if let Some(queue) = self.queue {
            queue.close();
        }
    }
}

/// The ordered buffer between the workers and the trainer.
struct Queue {
    state: Mutex<Shared>,
    /// Signalled on every change: a batch built, a batch taken, the queue closed.
    changed: Condvar,
    prefetch: u64,
}

struct Shared {
    /// The next step a worker claims.
    next: u64,
    /// One past the last step to build.
    end: u64,
    /// The step whose batch the trainer takes next. Workers claim steps below
    /// `wanted + prefetch` only, which bounds the batches in memory.
    wanted: u64,
    /// Built and not yet taken.
    ready: BTreeMap<u64, Batch>,
    /// Set when the trainer is done (or a worker panicked): the workers stop.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // Nothing panics while holding the lock, and the state stays consistent if it did.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, Shared>) -> MutexGuard<'a, Shared> {
        self.changed
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// A worker's loop: claim the next step, build its batch outside the lock, file it.
    fn work(&self, build: &(dyn Fn(u64) -> Batch + Sync)) {
        // Closes the queue if `build` panics, so the trainer is not left waiting for it.
        struct CloseOnPanic<'a>(&'a Queue);
        impl Drop for CloseOnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.close();
                }
            }
        }
        let _guard = CloseOnPanic(self);
        let mut state = self.lock();
        loop {
            if state.closed || state.next >= state.end {
                return;
            }
            if state.next >= state.wanted + self.prefetch {
                state = self.wait(state);
                continue;
            }
            let step = state.next;
            state.next += 1;
            drop(state);
            let batch = build(step);
            state = self.lock();
            state.ready.insert(step, batch);
            self.changed.notify_all();
        }
    }

    fn take(&self, step: u64) -> Result<Batch> {
        let mut state = self.lock();
        ensure!(
            step == state.wanted && step < state.end,
            "the loader was asked for step {step}, not the expected {} (of ..{})",
            state.wanted,
            state.end
        );
        loop {
            if let Some(batch) = state.ready.remove(&step) {
                state.wanted = step + 1;
                self.changed.notify_all();
                return Ok(batch);
            }
            if state.closed {
                bail!("the data loader stopped before the batch of step {step}");
            }
            state = self.wait(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn setup() -> (Corpus, HParams) {
        let corpus =
            Corpus::from_bytes(&b"the quick brown fox jumps over the dog ".repeat(20), 3).unwrap();
        let hp = HParams {
            vocab: corpus.vocab.len(),
            context: 3,
            embed: 2,
            hidden: 4,
            batch: 5,
            seed: 9,
            lr: 1e-2,
            data_hash: corpus.hash,
        };
        (corpus, hp)
    }

    fn settings(threads: usize, prefetch: usize, delay_ms: u64) -> Settings {
        Settings {
            threads,
            prefetch,
            delay: Duration::from_millis(delay_ms),
        }
    }

    /// Any number of workers and any prefetch hand out each step's own batch, in order.
    #[test]
    fn batches_come_in_step_order() {
        let (corpus, hp) = setup();
        for (threads, prefetch) in [(0, 1), (1, 1), (3, 2), (4, 8)] {
            let got = scoped(&corpus, &hp, 5..25, settings(threads, prefetch, 0), |b| {
                (5..25).map(|s| b.next(s)).collect::<Result<Vec<_>>>()
            })
            .unwrap();
            for (s, batch) in (5..).zip(&got) {
                let want = train_batch(&corpus, &hp, s);
                assert_eq!((&batch.xs, &batch.ys), (&want.xs, &want.ys), "step {s}");
            }
        }
        let err = scoped(&corpus, &hp, 0..4, settings(2, 2, 0), |b| {
            b.next(1).map(drop)
        });
        let err = err.unwrap_err();
        assert!(err.to_string().contains("step 1"), "{err}");
    }

    /// Leaving early, by success or error, neither hangs nor waits for the unbuilt steps.
    #[test]
    fn leaving_early_stops_the_workers() {
        let (corpus, hp) = setup();
        let t0 = Instant::now();
        scoped(&corpus, &hp, 0..10_000, settings(3, 4, 20), |b| {
            b.next(0).map(drop)
        })
        .unwrap();
        let err = scoped(
            &corpus,
            &hp,
            0..10_000,
            settings(3, 4, 20),
            |b| -> Result<()> {
                b.next(0)?;
                bail!("the trainer failed")
            },
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "the trainer failed");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    /// Four workers hide a delay that one thread cannot: the batches arrive 4 at a time.
    #[test]
    fn workers_build_ahead() {
        let (corpus, hp) = setup();
        let waits = |threads| {
            scoped(&corpus, &hp, 0..12, settings(threads, 4, 20), |b| {
                let t0 = Instant::now();
                for s in 0..12 {
                    b.next(s)?;
                }
                Ok(t0.elapsed())
            })
            .unwrap()
        };
        let (inline, four) = (waits(0), waits(4));
        assert!(inline >= Duration::from_millis(240), "{inline:?}");
        assert!(four < inline / 2, "{four:?} against {inline:?}");
    }
}
