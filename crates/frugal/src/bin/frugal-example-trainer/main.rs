//! `frugal-example-trainer`: a small, deterministic character-level language model that
//! follows the `frugal train` supervisor contract (docs/training.md).
//!
//! It exists for end-to-end tests of the supervisor, which preempt, kill and restart it and
//! then compare its final model file byte for byte against an uninterrupted run. So every
//! run with the same arguments computes the same bits, whatever `--threads` is and however
//! often it is interrupted and resumed from a checkpoint.

mod checkpoint;
mod data;
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
use model::{HParams, State, Workspace};

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

Results are bit-identical for the same arguments whatever --threads is and however the run
is interrupted and resumed. Exit codes: 0 done, 1 failure, 2 bad arguments or checkpoint.";

/// Train a character-level MLP language model, deterministically and resumably.
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
    #[arg(long, default_value_t = 64, value_parser = positive())]
    batch: usize,
    /// Characters of context.
    #[arg(long, default_value_t = 8, value_parser = positive())]
    context: usize,
    /// Embedding width per character.
    #[arg(long, default_value_t = 16, value_parser = positive())]
    embed: usize,
    /// Hidden (tanh) units.
    #[arg(long, default_value_t = 128, value_parser = positive())]
    hidden: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 3e-3)]
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
    /// Log the held-out loss every E steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    eval_every: u64,

    #[command(flatten)]
    knobs: Knobs,
}

/// Knobs for the supervisor's tests: slow data, slow steps, slow or crashing checkpoints.
/// None changes the numbers computed.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Test knobs")]
struct Knobs {
    /// Sleep D ms while loading each batch (counted in data_s): a data-starved run.
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

/// The contract's environment variables, read once.
struct Env {
    checkpoint_dir: PathBuf,
    resume_from: Option<PathBuf>,
    metrics: Option<PathBuf>,
    signal: i32,
    attempt: u64,
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
        Ok(Self {
            checkpoint_dir: var("FRUGAL_CHECKPOINT_DIR")
                .map_or_else(|| "checkpoints".into(), Into::into),
            resume_from: var("FRUGAL_RESUME_FROM").map(Into::into),
            metrics: var("FRUGAL_METRICS").map(Into::into),
            signal,
            attempt,
        })
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
    data_s: f64,
    batch: usize,
    loss: f32,
}

fn sleep_ms(ms: u64) {
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

fn eval(hp: &HParams, state: &State, set: &data::Batch) {
    let loss = model::mean_loss(hp, &state.params, set);
    log!("step {}: held-out loss {loss:.4}", state.step);
}

/// Trains to `--steps`, checkpointing as the contract asks, then writes `--out`.
/// `checkpoint_now` is set by the checkpoint signal.
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
    if !(hp.lr.is_finite() && hp.lr > 0.0) {
        bail!(BadInput(format!("--lr {} must be positive", hp.lr)));
    }
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
            log!("resuming from {} at step {}", dir.display(), state.step);
            state
        }
        None => State::new(model::init(&hp)),
    };
    log!(
        "attempt {}: {} parameters, vocab {}, {threads} threads, steps {}..{}",
        env.attempt,
        hp.n_params(),
        hp.vocab,
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
    let eval_set = data::eval_batch(&corpus, hp.context);
    let mut evaluated_at = None;
    let mut ws = Workspace::default();

    while state.step < args.steps {
        let t0 = Instant::now();
        let batch = data::train_batch(&corpus, &hp, state.step);
        sleep_ms(args.knobs.data_delay_ms);
        let data_s = t0.elapsed();
        let loss = state.train_step(&hp, &batch, threads, &mut ws);
        sleep_ms(args.knobs.step_delay_ms);
        let step = state.step;

        if let Some(file) = &mut metrics {
            let metric = Metric {
                step,
                step_s: t0.elapsed().as_secs_f64(),
                data_s: data_s.as_secs_f64(),
                batch: hp.batch,
                loss,
            };
            // One write per line, so a kill never interleaves half lines.
            let mut line = serde_json::to_vec(&metric)?;
            line.push(b'\n');
            file.write_all(&line)
                .and_then(|()| file.flush())
                .context("writing FRUGAL_METRICS")?;
        }
        if args.eval_every > 0 && step % args.eval_every == 0 {
            eval(&hp, &state, &eval_set);
            evaluated_at = Some(step);
        }

        // Swap first, so a signal is consumed even when the checkpoint was due anyway.
        let asked = checkpoint_now.swap(false, Ordering::SeqCst);
        let periodic = args.checkpoint_every > 0 && step % args.checkpoint_every == 0;
        if asked || periodic || step == args.steps {
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
    if evaluated_at != Some(state.step) {
        eval(&hp, &state, &eval_set);
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

    #[test]
    fn signal_names() {
        assert_eq!(parse_signal("SIGUSR2").unwrap(), SIGUSR2);
        assert_eq!(parse_signal("hup").unwrap(), SIGHUP);
        assert!(parse_signal("SIGKILL").is_err());
    }
}
