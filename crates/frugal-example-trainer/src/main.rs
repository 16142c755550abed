//! `frugal-example-trainer`: a small, deterministic character-level language model that
//! follows the `frugal train` supervisor contract (docs/training.md).
//!
//! It exists for end-to-end tests of the supervisor, which preempt, kill and restart it and
//! then compare its final model file byte for byte against an uninterrupted run. So every
//! run with the same arguments computes the same bits, whatever `--threads` is and however
//! often it is interrupted and resumed from a checkpoint.

mod checkpoint;
mod data;
mod hash;
mod hparams;
mod loader;
mod model;

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::Serialize;
use signal_hook::consts::{SIGHUP, SIGINT, SIGUSR1, SIGUSR2};

use data::Corpus;
use hparams::HParams;
use model::{State, Workspace};

const DEFAULT_DATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/tinyshakespeare/input.txt"
);

const AFTER_HELP: &str = "\
Environment (the `frugal train` contract, docs/training.md):
  FRUGAL_CHECKPOINT_DIR     where checkpoints go, as <dir>/<step> [default: ./checkpoints]
  FRUGAL_RESUME_FROM        a checkpoint directory to resume from; a missing, corrupt or
                            mismatched checkpoint exits with code 2
  FRUGAL_METRICS            file to append one JSON line per step to
  FRUGAL_CHECKPOINT_SIGNAL  SIGUSR1 (default), SIGUSR2, SIGHUP or SIGINT: checkpoint at the
                            next step boundary and carry on
  FRUGAL_ATTEMPT            attempt number [default: 1]; --crash-in-checkpoint acts on 1 only
  FRUGAL_STOP_AT            a step S: train to S, publish its checkpoint and exit 0 without
                            writing --out (ignored when S >= --steps); a resumed run goes on
                            exactly as an uninterrupted one

Results are bit-identical for the same arguments whatever --threads is and however the run
is interrupted and resumed, and whatever the loader settings are. Each metrics line has
step, step_s, data_s (the wait for the step's batch), batch, loss, tokens, flops (model FLOPs
of the step), params and precision; the lines of evaluated steps (every --eval-every, and
the process's last) add eval_loss, the held-out loss. Exit codes: 0 done (or stopped at
FRUGAL_STOP_AT), 1 failure, 2 bad arguments, environment or checkpoint.";

/// Train a character-level MLP language model, deterministically and resumably.
///
/// The shape and rate flags take values starting with `-` (`--lr -3e-3`, `--hidden -8`), so
/// those are refused as bad values of the flag rather than as unknown flags.
#[derive(Parser, Debug)]
// A later flag overrides an earlier one, so callers can append to a base command line.
#[command(name = "frugal-example-trainer", after_help = AFTER_HELP, args_override_self = true)]
struct Args {
    /// Training text; the vocabulary is its distinct bytes, the last 10% is held out.
    #[arg(long, default_value = DEFAULT_DATA)]
    data: PathBuf,
    /// Where to write the final weights.
    #[arg(long, default_value = "model.bin")]
    out: PathBuf,
    /// Total training steps.
    #[arg(long, default_value_t = 2000)]
    steps: u64,
    /// Samples per step.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    #[arg(value_parser = dimension())]
    batch: usize,
    /// Characters of context.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    #[arg(value_parser = dimension())]
    context: usize,
    /// Embedding width per character.
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    #[arg(value_parser = dimension())]
    embed: usize,
    /// Hidden (tanh) units.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    #[arg(value_parser = dimension())]
    hidden: usize,
    /// Adam learning rate: positive, as `0.003` or `3e-3`.
    #[arg(long, default_value_t = 3e-3, allow_hyphen_values = true)]
    #[arg(value_parser = learning_rate)]
    lr: f32,
    /// Seed of the initial weights and of the batches.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads [default: available parallelism]. Batches are split into chunks of
    /// 8 samples, one chunk per thread at a time, so a batch under 8 uses one thread.
    #[arg(long, value_parser = positive())]
    threads: Option<usize>,
    /// Publish a checkpoint every K steps (0: only on signal and at the end).
    #[arg(long, default_value_t = 200)]
    checkpoint_every: u64,
    /// Evaluate the held-out loss every E steps (0: only at the process's last step).
    #[arg(long, default_value_t = 0)]
    eval_every: u64,
    /// Data loader threads, building batches ahead of the trainer (0: each batch is built
    /// in the training loop when its step starts).
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    #[arg(value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(..=64))]
    loader_threads: usize,
    /// Batches the loader threads may prepare ahead of the trainer.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    #[arg(value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    prefetch: usize,

    #[command(flatten)]
    knobs: Knobs,
}

/// Knobs for the supervisor's tests: slow data, slow steps, slow or crashing checkpoints.
/// None changes the numbers computed.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Test knobs")]
struct Knobs {
    /// Sleep D ms while building each batch, in the thread that builds it: with
    /// --loader-threads 0 a data-starved run (counted in data_s); loader threads hide it
    /// while D / threads is below a step's compute.
    #[arg(long, default_value_t = 0, value_name = "D")]
    data_delay_ms: u64,
    /// Sleep D ms inside each step's compute (counted in step_s, not data_s).
    #[arg(long, default_value_t = 0, value_name = "D")]
    step_delay_ms: u64,
    /// Sleep D ms halfway through writing each checkpoint's state.bin.
    #[arg(long, default_value_t = 0, value_name = "D")]
    checkpoint_delay_ms: u64,
    /// On attempt 1, abort halfway through writing the checkpoint of STEP.
    #[arg(long, value_name = "STEP")]
    crash_in_checkpoint: Option<u64>,
}

fn positive() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// A model or batch dimension: positive, and small enough that sizes computed from it do
/// not overflow (the memory check in `run` bounds their product).
fn dimension() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=1 << 20)
}

fn learning_rate(text: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(lr) if lr.is_finite() && lr > 0.0 => Ok(lr),
        Ok(_) => Err("must be a positive, finite number (as f32)".into()),
        Err(e) => Err(format!("not a number: {e}")),
    }
}

/// Parameters, Adam's two moments and one gradient per chunk of the batch, in f32s: more
/// than this exits with code 2 instead of failing to allocate.
const MAX_FLOATS: f64 = (1u64 << 30) as f64;

/// The contract's environment variables, read once.
struct Env {
    checkpoint_dir: PathBuf,
    resume_from: Option<PathBuf>,
    metrics: Option<PathBuf>,
    signal: i32,
    attempt: u64,
    /// FRUGAL_STOP_AT: stop after this step (a tuner's rung), without writing `--out`.
    stop_at: Option<u64>,
}

/// Marks errors in what the caller gave us (environment, checkpoint): exit code 2.
#[derive(Debug)]
struct BadInput(String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Env {
    fn from_process() -> Result<Self> {
        // An empty variable counts as unset.
        let var = |name| std::env::var_os(name).filter(|v: &OsString| !v.is_empty());
        let text = |name| {
            var(name)
                .map(|v| {
                    v.into_string()
                        .map_err(|v| anyhow::anyhow!("{name} is not UTF-8: {v:?}"))
                })
                .transpose()
        };
        let signal = match text("FRUGAL_CHECKPOINT_SIGNAL")? {
            Some(name) => parse_signal(&name)?,
            None => SIGUSR1,
        };
        let attempt = match text("FRUGAL_ATTEMPT")? {
            Some(a) => a
                .trim()
                .parse()
                .with_context(|| format!("FRUGAL_ATTEMPT={a:?} is not an integer"))?,
            None => 1,
        };
        let stop_at = text("FRUGAL_STOP_AT")?
            .map(|s| parse_stop_at(&s))
            .transpose()?;
        Ok(Self {
            checkpoint_dir: var("FRUGAL_CHECKPOINT_DIR")
                .map_or_else(|| "checkpoints".into(), Into::into),
            resume_from: var("FRUGAL_RESUME_FROM").map(Into::into),
            metrics: var("FRUGAL_METRICS").map(Into::into),
            signal,
            attempt,
            stop_at,
        })
    }
}

fn parse_stop_at(text: &str) -> Result<u64> {
    match text.trim().parse::<u64>() {
        Ok(step) if step > 0 => Ok(step),
        _ => bail!("FRUGAL_STOP_AT={text:?} is not a step number (an integer of at least 1)"),
    }
}

fn parse_signal(name: &str) -> Result<i32> {
    let upper = name.trim().to_ascii_uppercase();
    Ok(match upper.strip_prefix("SIG").unwrap_or(&upper) {
        "USR1" => SIGUSR1,
        "USR2" => SIGUSR2,
        "HUP" => SIGHUP,
        "INT" => SIGINT,
        _ => bail!(
            "FRUGAL_CHECKPOINT_SIGNAL={name:?} is not supported: use SIGUSR1, SIGUSR2, SIGHUP or SIGINT"
        ),
    })
}

macro_rules! log {
    ($($t:tt)*) => {
        // Logging is best effort: a closed stderr must not stop training.
        let _ = writeln!(std::io::stderr(), "frugal-example-trainer: {}", format_args!($($t)*));
    };
}

#[derive(Serialize)]
struct Metric {
    step: u64,
    step_s: f64,
    /// The time the step waited for its batch.
    data_s: f64,
    batch: usize,
    loss: f32,
    /// The held-out loss after the step, on evaluated steps only.
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_loss: Option<f64>,
    /// Predictions made by the step: one per sample.
    tokens: usize,
    /// Model FLOPs of the step, forward and backward ([`HParams::step_flops`]).
    flops: u64,
    params: usize,
    precision: &'static str,
}

fn sleep_ms(ms: u64) {
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

fn eval(hp: &HParams, state: &State, set: &data::Batch) -> f64 {
    let loss = model::mean_loss(hp, &state.params, set);
    log!("step {}: held-out loss {loss:.4}", state.step);
    loss
}

/// Trains to `--steps` (or FRUGAL_STOP_AT), checkpointing as the contract asks, then writes
/// `--out` (not when stopped early). `checkpoint_now` is set by the checkpoint signal.
fn run(args: &Args, env: &Env, checkpoint_now: &AtomicBool) -> Result<()> {
    let corpus = Corpus::load(&args.data, args.context)?;
    let hp = HParams {
        vocab: corpus.vocab.len(),
        context: args.context,
        embed: args.embed,
        hidden: args.hidden,
        batch: args.batch,
        seed: args.seed,
        lr: args.lr,
        data_hash: corpus.hash,
    };
    let floats = hp.n_params() as f64 * (3 + hp.batch.div_ceil(model::CHUNK)) as f64;
    if floats > MAX_FLOATS {
        bail!(BadInput(format!(
            "--batch {} --context {} --embed {} --hidden {} need {:.1} GiB of parameters, \
             optimizer state and gradients, over the limit of {} GiB",
            hp.batch,
            hp.context,
            hp.embed,
            hp.hidden,
            floats * 4.0 / f64::from(1 << 30),
            MAX_FLOATS * 4.0 / f64::from(1 << 30)
        )));
    }
    // Where this process stops: FRUGAL_STOP_AT when it comes before the end.
    let end = env
        .stop_at
        .filter(|&s| s < args.steps)
        .unwrap_or(args.steps);
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));

    let mut state = match &env.resume_from {
        Some(dir) => {
            let bad = || BadInput(format!("cannot resume from {}", dir.display()));
            let state = checkpoint::load(dir, &hp).with_context(bad)?;
            if state.step > args.steps {
                bail!(BadInput(format!(
                    "checkpoint {} is at step {}, past --steps {}",
                    dir.display(),
                    state.step,
                    args.steps
                )));
            }
            if state.step > end {
                bail!(BadInput(format!(
                    "checkpoint {} is at step {}, past FRUGAL_STOP_AT {end}",
                    dir.display(),
                    state.step,
                )));
            }
            log!("resuming from {} at step {}", dir.display(), state.step);
            state
        }
        None => State::new(model::init(&hp)),
    };
    let stop = if end < args.steps {
        format!(" (stopping at {end})")
    } else {
        String::new()
    };
    log!(
        "attempt {}: {} parameters, vocab {}, {threads} threads, {} loaders, steps {}..{}{stop}",
        env.attempt,
        hp.n_params(),
        hp.vocab,
        args.loader_threads,
        state.step,
        args.steps
    );

    std::fs::create_dir_all(&env.checkpoint_dir)
        .with_context(|| format!("creating {}", env.checkpoint_dir.display()))?;
    let mut metrics = match &env.metrics {
        Some(path) => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening FRUGAL_METRICS {}", path.display()))?,
        ),
        None => None,
    };
    // A fixed subset of the held-out 10%: 2048 positions drawn from a seed of its own, the
    // same for every run on this --data and --context. Forward only, it costs about 6 steps
    // at the default shapes (9 ms against 1.7 ms a step, 1 thread, release), so an eval
    // every 100 steps adds about 6%.
    let eval_set = data::eval_batch(&corpus, hp.context);
    let mut evaluated_at = None;
    let mut ws = Workspace::default();
    let loading = loader::Settings {
        threads: args.loader_threads,
        prefetch: args.prefetch,
        delay: Duration::from_millis(args.knobs.data_delay_ms),
    };

    loader::scoped(&corpus, &hp, state.step..end, loading, |batches| {
        while state.step < end {
            let t0 = Instant::now();
            let batch = batches.next(state.step)?;
            let data_s = t0.elapsed();
            let loss = state.train_step(&hp, &batch, threads, &mut ws);
            sleep_ms(args.knobs.step_delay_ms);
            let step_s = t0.elapsed();
            let step = state.step;

            let eval_loss = (step == end || (args.eval_every > 0 && step % args.eval_every == 0))
                .then(|| eval(&hp, &state, &eval_set));
            if eval_loss.is_some() {
                evaluated_at = Some(step);
            }
            if let Some(file) = &mut metrics {
                let metric = Metric {
                    step,
                    step_s: step_s.as_secs_f64(),
                    data_s: data_s.as_secs_f64(),
                    batch: hp.batch,
                    loss,
                    eval_loss,
                    tokens: hp.batch,
                    flops: hp.step_flops(),
                    params: hp.n_params(),
                    precision: "fp32",
                };
                // One write per line, so a kill never interleaves half lines.
                let mut line = serde_json::to_vec(&metric)?;
                line.push(b'\n');
                file.write_all(&line)
                    .and_then(|()| file.flush())
                    .context("writing FRUGAL_METRICS")?;
            }

            // Swap first, so a signal is consumed even when the checkpoint was due anyway.
            let asked = checkpoint_now.swap(false, Ordering::SeqCst);
            let periodic = args.checkpoint_every > 0 && step % args.checkpoint_every == 0;
            if asked || periodic || step == end {
                let faults = checkpoint::Faults {
                    delay: Duration::from_millis(args.knobs.checkpoint_delay_ms),
                    crash: env.attempt == 1 && args.knobs.crash_in_checkpoint == Some(step),
                };
                let dir = checkpoint::save(&env.checkpoint_dir, &hp, &state, loss, &faults)?;
                let why = if asked { " (on signal)" } else { "" };
                log!(
                    "step {step}: loss {loss:.4}, published {}{why}",
                    dir.display()
                );
            }
        }
        Ok(())
    })?;
    if evaluated_at != Some(state.step) {
        eval(&hp, &state, &eval_set);
    }
    if end < args.steps {
        log!(
            "stopped at step {end} (FRUGAL_STOP_AT), before --steps {}: {} not written",
            args.steps,
            args.out.display()
        );
        return Ok(());
    }
    checkpoint::write_model(&args.out, &hp, &corpus.vocab, &state.params)?;
    log!("wrote {}", args.out.display());
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = Env::from_process()
        .map_err(|e| e.context(BadInput("bad environment".into())))
        .and_then(|env| {
            let flag = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(env.signal, Arc::clone(&flag))
                .context("installing the checkpoint signal handler")?;
            run(&args, &env, &flag)
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log!("error: {e:#}");
            ExitCode::from(if e.downcast_ref::<BadInput>().is_some() {
                2
            } else {
                1
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn env(dir: &Path, resume: Option<PathBuf>) -> Env {
        Env {
            checkpoint_dir: dir.join("ckpt"),
            resume_from: resume,
            metrics: Some(dir.join("metrics.jsonl")),
            signal: SIGUSR1,
            attempt: 1,
            stop_at: None,
        }
    }

    fn args(dir: &Path, extra: &[&str]) -> Args {
        let data = dir.join("data.txt");
        if !data.exists() {
            let text = b"Now is the winter of our discontent made glorious summer. ".repeat(50);
            std::fs::write(&data, text).unwrap();
        }
        let base = [
            "t",
            "--steps",
            "6",
            "--batch",
            "12",
            "--context",
            "4",
            "--embed",
            "4",
            "--hidden",
            "16",
            "--checkpoint-every",
            "3",
        ];
        let (data, out) = (data.to_str().unwrap(), dir.join("model.bin"));
        let paths = ["--data", data, "--out", out.to_str().unwrap()];
        Args::try_parse_from(base.iter().chain(&paths).chain(extra)).unwrap()
    }

    /// A run resumed from a checkpoint, on another thread count, ends with the same bytes
    /// as an uninterrupted one; a mismatched resume is refused with a BadInput error.
    #[test]
    fn resume_is_exact() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let no_signal = AtomicBool::new(false);
        run(
            &args(a.path(), &["--threads", "1"]),
            &env(a.path(), None),
            &no_signal,
        )
        .unwrap();
        let ckpt = a.path().join("ckpt");
        let mut names: Vec<_> = std::fs::read_dir(&ckpt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["3", "6"]);
        let lines = std::fs::read_to_string(a.path().join("metrics.jsonl")).unwrap();
        let last: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
        assert_eq!(
            (lines.lines().count(), &last["step"], &last["batch"]),
            (6, &6.into(), &12.into())
        );

        let resume = Some(ckpt.join("3"));
        run(
            &args(b.path(), &["--threads", "2"]),
            &env(b.path(), resume.clone()),
            &no_signal,
        )
        .unwrap();
        let model = |d: &Path| std::fs::read(d.join("model.bin")).unwrap();
        assert_eq!(model(a.path()), model(b.path()));

        let err = run(
            &args(b.path(), &["--hidden", "8"]),
            &env(b.path(), resume),
            &no_signal,
        )
        .unwrap_err();
        assert!(err.downcast_ref::<BadInput>().is_some(), "{err:#}");
        assert!(
            format!("{err:#}").contains("hidden: checkpoint 16, run 8"),
            "{err:#}"
        );
    }

    fn metrics(dir: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Steps whose lines carry `eval_loss`.
    fn evaluated(lines: &[serde_json::Value]) -> Vec<u64> {
        let with_eval = lines.iter().filter(|l| l.get("eval_loss").is_some());
        with_eval.map(|l| l["step"].as_u64().unwrap()).collect()
    }

    /// What a run computes, to compare runs by: step, loss and eval_loss of every line.
    fn numbers(lines: &[serde_json::Value]) -> Vec<[serde_json::Value; 3]> {
        let field = |l: &serde_json::Value, k| l.get(k).cloned().unwrap_or_default();
        lines
            .iter()
            .map(|l| [field(l, "step"), field(l, "loss"), field(l, "eval_loss")])
            .collect()
    }

    fn model(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join("model.bin")).unwrap()
    }

    /// eval_loss on every --eval-every step and on the last; the advisor's fields on all.
    #[test]
    fn metrics_lines() {
        let a = tempfile::tempdir().unwrap();
        let args = args(a.path(), &["--eval-every", "4", "--threads", "1"]);
        run(&args, &env(a.path(), None), &AtomicBool::new(false)).unwrap();
        let lines = metrics(a.path());
        assert_eq!(evaluated(&lines), [4, 6]);
        let vocab = Corpus::load(&args.data, 4).unwrap().vocab.len();
        let params = vocab * 4 + 16 * 16 + 16 + 16 * vocab + vocab;
        let flops = 6 * 12 * (4 * 4 * 16 + 16 * vocab);
        for l in &lines {
            assert_eq!(
                (&l["tokens"], &l["params"], &l["flops"], &l["precision"]),
                (&12.into(), &params.into(), &flops.into(), &"fp32".into()),
                "{l}"
            );
        }
        let loss = lines[5]["eval_loss"].as_f64().unwrap();
        assert!(loss > 0.0 && loss < (vocab as f64).ln() + 1.0, "{loss}");

        // Without --eval-every, the last step only.
        let b = tempfile::tempdir().unwrap();
        run(
            &super::tests::args(b.path(), &[]),
            &env(b.path(), None),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(evaluated(&metrics(b.path())), [6]);
    }

    /// Stopping at FRUGAL_STOP_AT and resuming, twice, on other thread and loader settings,
    /// ends with the model bytes and the numbers of an uninterrupted run.
    #[test]
    fn stop_at_then_resume_is_exact() {
        let no_signal = AtomicBool::new(false);
        let base = [
            "--eval-every",
            "2",
            "--threads",
            "1",
            "--loader-threads",
            "0",
        ];
        let whole = tempfile::tempdir().unwrap();
        run(
            &args(whole.path(), &base),
            &env(whole.path(), None),
            &no_signal,
        )
        .unwrap();

        let d = tempfile::tempdir().unwrap();
        let ckpt = |step: &str| Some(d.path().join("ckpt").join(step));
        let segment = |resume, stop_at, extra: &[&str]| {
            let extra: Vec<&str> = base.iter().chain(extra).copied().collect();
            let env = Env {
                stop_at,
                ..env(d.path(), resume)
            };
            run(&args(d.path(), &extra), &env, &no_signal)
        };
        segment(None, Some(2), &[]).unwrap();
        assert!(ckpt("2").unwrap().is_dir());
        assert!(
            !d.path().join("model.bin").exists(),
            "--out waits for the end"
        );
        assert_eq!(evaluated(&metrics(d.path())), [2]);
        segment(
            ckpt("2"),
            Some(5),
            &["--threads", "2", "--loader-threads", "3"],
        )
        .unwrap();
        assert!(ckpt("5").unwrap().is_dir() && ckpt("3").unwrap().is_dir());
        assert!(!d.path().join("model.bin").exists());
        // A stop past the checkpoint is refused; one at or past --steps is ignored.
        let err = segment(ckpt("5"), Some(4), &[]).unwrap_err();
        assert!(err.downcast_ref::<BadInput>().is_some(), "{err:#}");
        segment(ckpt("5"), Some(6), &["--prefetch", "1"]).unwrap();

        assert_eq!(model(whole.path()), model(d.path()));
        let (a, b) = (metrics(whole.path()), metrics(d.path()));
        assert_eq!(evaluated(&a), [2, 4, 6]);
        assert_eq!(evaluated(&b), [2, 4, 5, 6], "the stop at 5 evaluates too");
        let mut without_5 = b.clone();
        without_5[4].as_object_mut().unwrap().remove("eval_loss");
        assert_eq!(numbers(&a), numbers(&without_5));
    }

    /// The loader's settings do not change the bits.
    #[test]
    fn loader_threads_do_not_change_bits() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let no_signal = AtomicBool::new(false);
        let inline = ["--loader-threads", "0", "--eval-every", "3"];
        run(&args(a.path(), &inline), &env(a.path(), None), &no_signal).unwrap();
        let three = [
            "--loader-threads",
            "3",
            "--prefetch",
            "2",
            "--eval-every",
            "3",
        ];
        run(&args(b.path(), &three), &env(b.path(), None), &no_signal).unwrap();
        assert_eq!(model(a.path()), model(b.path()));
        assert_eq!(numbers(&metrics(a.path())), numbers(&metrics(b.path())));
    }

    #[test]
    fn flags_and_environment_are_validated() {
        let parse = |extra: &[&str]| Args::try_parse_from(["t"].iter().chain(extra));
        for (text, lr) in [
            ("0.0031622776601683794", 0.003_162_277_6),
            ("3e-3", 3e-3),
            ("3E-3", 3e-3),
            ("1", 1.0),
        ] {
            assert_eq!(parse(&["--lr", text]).unwrap().lr, lr, "{text}");
        }
        for (flag, bad) in [
            ("--lr", "0"),
            ("--lr", "-3e-3"),
            ("--lr", "NaN"),
            ("--lr", "inf"),
            ("--lr", "1e-60"),
            ("--lr", "fast"),
            ("--hidden", "0"),
            ("--hidden", "-8"),
            ("--hidden", "64.0"),
            ("--batch", "0"),
            ("--batch", "lots"),
            ("--embed", "0"),
            ("--embed", "9999999999"),
            ("--loader-threads", "-1"),
            ("--prefetch", "0"),
        ] {
            let err = parse(&[flag, bad]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{flag} {bad}");
            assert!(err.to_string().contains(flag), "{flag} {bad}: {err}");
        }

        // Shapes each in range, but too big together: refused before allocating.
        let d = tempfile::tempdir().unwrap();
        let big = args(d.path(), &["--hidden", "1048576", "--embed", "1024"]);
        let err = run(&big, &env(d.path(), None), &AtomicBool::new(false)).unwrap_err();
        assert!(err.downcast_ref::<BadInput>().is_some(), "{err:#}");
        assert!(format!("{err}").contains("--hidden 1048576"), "{err}");

        assert_eq!(parse_stop_at(" 40 ").unwrap(), 40);
        for bad in ["0", "-5", "2.5", "rung", ""] {
            let err = parse_stop_at(bad).unwrap_err().to_string();
            assert!(err.contains("FRUGAL_STOP_AT"), "{err}");
        }
    }

    #[test]
    fn signal_names() {
        assert_eq!(parse_signal("SIGUSR2").unwrap(), SIGUSR2);
        assert_eq!(parse_signal("hup").unwrap(), SIGHUP);
        assert!(parse_signal("SIGKILL").is_err());
    }
}
