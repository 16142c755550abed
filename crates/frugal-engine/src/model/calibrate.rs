//! Which integer kernel and weight prefetch run this model fastest on this CPU, measured at
//! start rather than read off the instruction-set flags: on AMD EPYC (Zen 4) the kernels
//! decode 1.3x faster prefetching into L2 than into L1, the reverse of the Intel Xeon hosts
//! they were first tuned on, and which SIMD width wins a lone decode differs by CPU too.
//!
//! [`Model::calibrate`] times every (kernel, [`Prefetch`]) pair the CPU has: a decode step
//! (one activation row) over all the model's matrices, streamed from memory as a real step
//! streams them (a prefetch only shows there), and a batched one (8 rows) over two layers'
//! matrices and the output projection, a few interleaved rounds each; it keeps the fastest
//! per token for the process. The result is cached per CPU and model shape in
//! `$XDG_CACHE_HOME/frugal/kernels.json` (else `~/.cache/frugal/kernels.json`), so later
//! starts skip the measurement. `FRUGAL_ISA` fixes the kernel and `FRUGAL_PREFETCH` the
//! prefetch (only what is left is measured); `FRUGAL_CALIBRATE=1` measures again (and
//! rewrites the cache), `FRUGAL_CALIBRATE=0` takes the widest kernel and the L1 prefetch
//! without measuring.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Model;
use crate::quant::{self, Kernel, Prefetch, QMatrix, Scratch};

/// Activation rows of the batched measurement (a few sequences decoding together).
const BATCH: usize = 8;
/// Rounds of the measurement: at least `MIN_ROUNDS`, more while under `SOFT_LIMIT`.
const MIN_ROUNDS: usize = 3;
const MAX_ROUNDS: usize = 9;
const SOFT_LIMIT: Duration = Duration::from_millis(150);
/// The cache file's format; a file of another is ignored (1 had no prefetch).
const CACHE_VERSION: u32 = 2;

/// How [`Model::calibrate`] goes about it.
#[derive(Debug, Clone, Default)]
pub struct Calibrate {
    /// The cache file; `None`: measure at every start.
    pub cache: Option<PathBuf>,
    /// Measure even when the cache holds a choice for this CPU and model.
    pub force: bool,
    /// Measure nothing: the widest kernel by instruction set, prefetching into L1.
    pub off: bool,
}

impl Calibrate {
    /// `FRUGAL_CALIBRATE` (`1`: measure again, `0`: off) and the cache file in
    /// `$XDG_CACHE_HOME/frugal` (else `~/.cache/frugal`; neither set: no cache).
    pub fn from_env() -> Calibrate {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let cache_home = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")));
        let calibrate = std::env::var("FRUGAL_CALIBRATE").unwrap_or_default();
        Calibrate {
            cache: cache_home.map(|c| c.join("frugal").join("kernels.json")),
            force: calibrate == "1",
            off: calibrate == "0",
        }
    }
}

/// Where the kernel in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Fixed before the calibration: `FRUGAL_ISA` ([`Kernel::select`], or a matmul already
    /// run in this process) and `FRUGAL_PREFETCH` (or a kernel without prefetch).
    Fixed,
    /// The fastest by instruction set, unmeasured: calibration off, or one kernel to run.
    Flags,
    /// An earlier measurement on this CPU and model shape, from the cache.
    Cached,
    /// Measured at this start.
    Measured,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Fixed => "fixed",
            Source::Flags => "flags",
            Source::Cached => "cached",
            Source::Measured => "measured",
        }
    }
}

/// A kernel with the prefetch it runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub kernel: Kernel,
    pub prefetch: Prefetch,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kernel, self.prefetch)
    }
}

/// One choice's measurement, the best of the rounds: a decode step's matmuls at one
/// activation row (all matrices), and a batched step's at [`BATCH`] rows (estimated from the
/// sampled matrices, scaled by bytes to all of them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub choice: Choice,
    pub decode: Duration,
    pub batch: Duration,
}

impl Timing {
    /// What the choice minimizes: the mean time per token of a lone decode and of a batched
    /// one.
    pub fn per_token(&self) -> Duration {
        (self.decode + self.batch / BATCH as u32) / 2
    }
}

/// The kernel the process runs and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub kernel: Kernel,
    pub prefetch: Prefetch,
    /// Threads of the model's pool.
    pub threads: usize,
    pub source: Source,
    /// Measured (now or, cached, earlier); empty when nothing was.
    pub timings: Vec<Timing>,
}

impl fmt::Display for Calibration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} kernels, {} prefetch, on {} threads, ",
            self.kernel, self.prefetch, self.threads
        )?;
        f.write_str(match self.source {
            Source::Fixed => "fixed before (FRUGAL_ISA, FRUGAL_PREFETCH)",
            Source::Flags => "by instruction set",
            Source::Cached => "measured before",
            Source::Measured => "measured",
        })?;
        for (i, t) in self.timings.iter().enumerate() {
            let sep = if i == 0 { ": " } else { ", " };
            let us = t.per_token().as_secs_f64() * 1e6;
            write!(f, "{sep}{} {us:.0} us/token", t.choice)?;
        }
        Ok(())
    }
}

impl Model {
    /// Chooses the process's kernel for this model (see the module's comment) and fixes it
    /// with [`Kernel::select`]. Never fails: a cache that cannot be read or written is passed
    /// over with a debug line, and a kernel fixed before stays.
    pub fn calibrate(&self, how: &Calibrate) -> Calibration {
        let threads = self.pool.current_num_threads();
        let chosen = |choice: Choice, source, timings| {
            let kernel = match choice.kernel.select() {
                Ok(()) => choice.kernel,
                Err(why) => {
                    tracing::debug!(%why, "kernel already fixed");
                    Kernel::active()
                }
            };
            choice.prefetch.set();
            let c = Calibration {
                kernel,
                prefetch: choice.prefetch,
                threads,
                source,
                timings,
            };
            tracing::info!(
                kernel = %c.kernel,
                prefetch = %c.prefetch,
                threads,
                source = c.source.name(),
                "engine kernels: {c}"
            );
            c
        };
        let widest = Choice {
            kernel: Kernel::fixed().unwrap_or_else(Kernel::best),
            prefetch: Prefetch::active(),
        };
        if how.off {
            return chosen(widest, Source::Flags, Vec::new());
        }
        let choices = candidates();
        if choices.len() < 2 {
            let source = if Kernel::fixed().is_some() {
                Source::Fixed
            } else {
                Source::Flags
            };
            return chosen(
                choices.first().copied().unwrap_or(widest),
                source,
                Vec::new(),
            );
        }
        let key = self.cache_key(&choices);
        if !how.force
            && let Some(path) = &how.cache
            && let Some((c, timings)) = cached(path, &key, &choices)
        {
            return chosen(c, Source::Cached, timings);
        }
        let timings = self.measure(&choices);
        let Some(best) = timings.iter().min_by_key(|t| t.per_token()) else {
            return chosen(widest, Source::Flags, Vec::new());
        };
        if let Some(path) = &how.cache
            && let Err(why) = store(path, &key, best.choice, &timings)
        {
            tracing::debug!(path = %path.display(), %why, "kernel choice not cached");
        }
        chosen(best.choice, Source::Measured, timings)
    }

    /// Times `choices` (see the module's comment), each round every choice in turn (so a
    /// burst of other load on the machine slows them alike), after one round unmeasured.
    pub fn measure(&self, choices: &[Choice]) -> Vec<Timing> {
        let all = self.matrices();
        let sample = self.sample();
        let bytes = |ms: &[&QMatrix]| ms.iter().map(|m| m.bytes()).sum::<usize>().max(1) as f64;
        let scale = bytes(&all) / bytes(&sample);
        let cols = all.iter().map(|m| m.cols()).max().unwrap_or(0);
        let rows = all.iter().map(|m| m.rows()).max().unwrap_or(0);
        // Activations of both signs and many magnitudes, as a hidden state has.
        let x: Vec<f32> = (0..cols * BATCH)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 13) as f32))
            .collect();
        let mut out = vec![0f32; rows * BATCH];
        let mut scratch = Scratch::new();
        let mut pass = |c: Choice, matrices: &[&QMatrix], batch: usize| {
            let started = Instant::now();
            for m in matrices {
                let (x, out) = (&x[..m.cols() * batch], &mut out[..m.rows() * batch]);
                let done = quant::matmul_with_kernel(
                    m,
                    x,
                    batch,
                    out,
                    &self.pool,
                    &mut scratch,
                    c.kernel,
                    c.prefetch,
                );
                if let Err(why) = done {
                    tracing::debug!(choice = %c, %why, "calibration matmul failed");
                    return Duration::MAX;
                }
            }
            started.elapsed()
        };
        let mut best: Vec<Timing> = choices
            .iter()
            .map(|&choice| Timing {
                choice,
                decode: Duration::MAX,
                batch: Duration::MAX,
            })
            .collect();
        // Inside the pool, as a forward step runs (see `quant`'s threading note).
        self.pool.install(|| {
            let started = Instant::now();
            for round in 0..=MAX_ROUNDS {
                if round > MIN_ROUNDS && started.elapsed() > SOFT_LIMIT {
                    break;
                }
                for t in &mut best {
                    let decode = pass(t.choice, &all, 1);
                    let batch = pass(t.choice, &sample, BATCH);
                    if round > 0 && batch < Duration::MAX {
                        t.decode = t.decode.min(decode);
                        t.batch = t.batch.min(batch.mul_f64(scale));
                    }
                }
            }
        });
        best.retain(|t| t.decode < Duration::MAX && t.batch < Duration::MAX);
        best
    }

    /// Every matrix a decode step streams, in its order: each layer's, then the output
    /// projection.
    fn matrices(&self) -> Vec<&QMatrix> {
        self.layers
            .iter()
            .flat_map(|l| [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down])
            .chain([self.output.as_ref().unwrap_or(&self.embedding)])
            .collect()
    }

    /// The matrices timed: every matrix of the first layer and of a middle one (their shapes
    /// and types), and the output projection (a large part of a small model's decode).
    fn sample(&self) -> Vec<&QMatrix> {
        let mid = self.layers.len() / 2;
        let mut layers: Vec<_> = [self.layers.first(), self.layers.get(mid)]
            .into_iter()
            .flatten()
            .collect();
        layers.dedup_by(|a, b| std::ptr::eq(*a, *b));
        layers
            .into_iter()
            .flat_map(|l| [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down])
            .chain([self.output.as_ref().unwrap_or(&self.embedding)])
            .collect()
    }

    /// What a measurement holds for: the CPU, the pool, the choices, and the sampled
    /// matrices' types and shapes.
    fn cache_key(&self, choices: &[Choice]) -> String {
        let choices: Vec<String> = choices.iter().map(Choice::to_string).collect();
        let matrices: Vec<String> = self
            .sample()
            .iter()
            .map(|m| format!("{}:{}x{}", m.weight_type(), m.rows(), m.cols()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        format!(
            "{}; {} threads; {}; {}",
            cpu_name(),
            self.pool.current_num_threads(),
            choices.join(" "),
            matrices.join(" ")
        )
    }
}

/// The choices worth timing: the SIMD kernels the CPU has (the scalar kernel is there for
/// CPUs without them, and is several times slower than either), or the one fixed before,
/// each with every prefetch unless `FRUGAL_PREFETCH` fixed it (the scalar kernel has none).
pub fn candidates() -> Vec<Choice> {
    let kernels: Vec<Kernel> = match Kernel::fixed() {
        Some(k) => vec![k],
        None => {
            let simd: Vec<Kernel> = [Kernel::Avx512Vnni, Kernel::Avx2]
                .into_iter()
                .filter(|k| k.is_available())
                .collect();
            if simd.is_empty() {
                vec![Kernel::Scalar]
            } else {
                simd
            }
        }
    };
    kernels
        .into_iter()
        .flat_map(|kernel| {
            let prefetches = if kernel == Kernel::Scalar || Prefetch::is_set() {
                vec![Prefetch::active()]
            } else {
                Prefetch::ALL.to_vec()
            };
            prefetches
                .into_iter()
                .map(move |prefetch| Choice { kernel, prefetch })
        })
        .collect()
}

/// The CPU's vendor and model as `/proc/cpuinfo` names them, and its logical cores.
fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{} {} ({cores} cores)",
        field("vendor_id").unwrap_or_else(|| std::env::consts::ARCH.to_owned()),
        field("model name").unwrap_or_default()
    )
}

/// The cache file: measurements by [`Model::cache_key`].
#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    entries: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    kernel: String,
    prefetch: String,
    timings: Vec<EntryTiming>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct EntryTiming {
    kernel: String,
    prefetch: String,
    decode_us: f64,
    batch_us: f64,
}

fn read_cache(path: &Path) -> Result<CacheFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let file: CacheFile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if file.version != CACHE_VERSION {
        return Err(format!(
            "format {} (expected {CACHE_VERSION})",
            file.version
        ));
    }
    Ok(file)
}

/// The cached choice for `key`, when the file has one among `choices`.
fn cached(path: &Path, key: &str, choices: &[Choice]) -> Option<(Choice, Vec<Timing>)> {
    let file = read_cache(path)
        .map_err(|why| tracing::debug!(path = %path.display(), %why, "kernel cache ignored"))
        .ok()?;
    let Some(entry) = file.entries.get(key) else {
        tracing::debug!(path = %path.display(), key, "kernel cache has no entry for this CPU and model");
        return None;
    };
    let known = |kernel: &str, prefetch: &str| {
        let c = Choice {
            kernel: Kernel::from_name(kernel).ok()?,
            prefetch: Prefetch::from_name(prefetch)?,
        };
        choices.contains(&c).then_some(c)
    };
    let Some(choice) = known(&entry.kernel, &entry.prefetch) else {
        tracing::debug!(path = %path.display(), kernel = entry.kernel, prefetch = entry.prefetch, "cached choice not among those here");
        return None;
    };
    let us = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1e6);
    let timings = entry
        .timings
        .iter()
        .filter_map(|t| {
            Some(Timing {
                choice: known(&t.kernel, &t.prefetch)?,
                decode: us(t.decode_us),
                batch: us(t.batch_us),
            })
        })
        .collect();
    Some((choice, timings))
}

/// Adds `key`'s choice to the cache file (others' entries kept, a broken file replaced),
/// written whole beside it and renamed over it, so that a reader never sees half of it.
fn store(path: &Path, key: &str, choice: Choice, timings: &[Timing]) -> std::io::Result<()> {
    let mut file = read_cache(path).unwrap_or(CacheFile {
        version: CACHE_VERSION,
        entries: BTreeMap::new(),
    });
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    file.entries.insert(
        key.to_owned(),
        Entry {
            kernel: choice.kernel.name().to_owned(),
            prefetch: choice.prefetch.name().to_owned(),
            timings: timings
                .iter()
                .map(|t| EntryTiming {
                    kernel: t.choice.kernel.name().to_owned(),
                    prefetch: t.choice.prefetch.name().to_owned(),
                    decode_us: us(t.decode),
                    batch_us: us(t.batch),
                })
                .collect(),
        },
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(kernel: Kernel, prefetch: Prefetch) -> Choice {
        Choice { kernel, prefetch }
    }

    fn timing(c: Choice, decode_us: u64, batch_us: u64) -> Timing {
        Timing {
            choice: c,
            decode: Duration::from_micros(decode_us),
            batch: Duration::from_micros(batch_us),
        }
    }

    /// A stored choice reads back for its key only, with its timings.
    #[test]
    fn the_cache_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/kernels.json");
        let choices: Vec<Choice> = Prefetch::ALL
            .into_iter()
            .map(|p| choice(Kernel::Scalar, p))
            .collect();
        let k = choices[1];
        let timings: Vec<Timing> = choices.iter().map(|&c| timing(c, 1500, 4000)).collect();
        store(&path, "cpu a", k, &timings).unwrap();
        store(&path, "cpu b", choices[0], &timings[..1]).unwrap();
        let (got, back) = cached(&path, "cpu a", &choices).unwrap();
        assert_eq!(got, k);
        assert_eq!(back, timings);
        assert_eq!(cached(&path, "cpu b", &choices).unwrap().0, choices[0]);
        assert!(cached(&path, "cpu c", &choices).is_none());
        // No temporary file is left beside it.
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }

    /// A file that is not the cache, of another format (1 had no prefetch), or naming a
    /// choice not among those to choose from gives no choice, and is replaced by the next
    /// store.
    #[test]
    fn a_broken_or_foreign_cache_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kernels.json");
        let choices = [choice(Kernel::Avx2, Prefetch::L2)];
        let entry = |version: u32, kernel: &str, prefetch: &str| {
            format!(
                "{{\"version\": {version}, \"entries\": {{\"k\": {{\"kernel\": \"{kernel}\", \"prefetch\": \"{prefetch}\", \"timings\": []}}}}}}"
            )
        };
        for text in [
            "not json".to_owned(),
            "{\"version\": 2}".to_owned(),
            "{\"version\": 1, \"entries\": {\"k\": {\"kernel\": \"avx2\", \"timings\": []}}}"
                .to_owned(),
            entry(99, "avx2", "l2"),
            entry(2, "neon", "l2"),
            entry(2, "avx512", "l2"),
            entry(2, "avx2", "l1"),
            entry(2, "avx2", "l9"),
        ] {
            std::fs::write(&path, &text).unwrap();
            assert!(cached(&path, "k", &choices).is_none(), "{text}");
        }
        std::fs::write(&path, entry(2, "avx2", "l2")).unwrap();
        assert_eq!(cached(&path, "k", &choices).unwrap().0, choices[0]);
        assert!(cached(&dir.path().join("absent.json"), "k", &choices).is_none());
        std::fs::write(&path, "not json").unwrap();
        store(&path, "k", choices[0], &[]).unwrap();
        assert_eq!(cached(&path, "k", &choices).unwrap().0, choices[0]);
    }

    /// The measurement times every choice asked for on the model's own matrices (all of
    /// them for a decode, two layers' four and the output projection batched), and fixes
    /// no prefetch for the process.
    #[test]
    fn measure_times_each_choice_on_the_models_matrices() {
        let g = crate::gguf::testutil::test_model();
        let model = Model::from_gguf(g, crate::model::LoadOptions::default()).unwrap();
        assert_eq!(model.sample().len(), 9);
        assert_eq!(model.matrices().len(), 4 * model.layers.len() + 1);
        let choices = candidates();
        let prefetch = Prefetch::active();
        let timings = model.measure(&choices);
        assert_eq!(Prefetch::active(), prefetch);
        let got: Vec<Choice> = timings.iter().map(|t| t.choice).collect();
        assert_eq!(got, choices);
        for t in &timings {
            assert!(
                t.decode > Duration::ZERO && t.batch > Duration::ZERO,
                "{t:?}"
            );
        }
        let key = model.cache_key(&choices);
        assert!(key.contains("x576") && key.contains("threads"), "{key}");
    }

    /// The choice is the least mean time per token of a lone and a batched decode.
    #[test]
    fn per_token_weighs_decode_and_batch() {
        let a = timing(choice(Kernel::Avx512Vnni, Prefetch::L1), 1000, 4000);
        let b = timing(choice(Kernel::Avx2, Prefetch::L2), 900, 8000);
        assert_eq!(a.per_token(), Duration::from_micros(750));
        assert_eq!(b.per_token(), Duration::from_micros(950));
    }
}
