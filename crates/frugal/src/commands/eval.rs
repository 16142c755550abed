//! `frugal eval ppl|tasks`: loads the model (as `--quant` would serve it) and its reference,
//! has `frugal_engine::eval` or `frugal_gateway::cascade::eval` measure them on held-out data,
//! prints the figures, records them for `frugal serve` to say at start, and applies the gate.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use frugal_engine::eval::quality::{self, AsRun, FileId, Record};
use frugal_engine::eval::{
    self, Gate, Keep, Made, PplBounds, PplOptions, PplReport, Reference, SavedReference,
    SavedWriter,
};
use frugal_engine::model::{KvType, LoadOptions, Model};
use frugal_engine::quant::WeightType;
use frugal_engine::tokenizer::Tokenizer;
use frugal_gateway::cascade::eval::{Tier, flips, read_questions};
use serde_json::json;

use crate::cli::{EvalEmbedderArgs, EvalModelArgs, EvalPplArgs, EvalTasksArgs};
use crate::progress::Bar;
use crate::table;

fn load(path: &Path, options: LoadOptions) -> Result<(Model, Tokenizer)> {
    let (model, tokenizer, _) = crate::serve::load_model(path, options)?;
    Ok((model, tokenizer))
}

/// How the evaluated model is loaded: as `frugal serve --quant --kv` would run it.
fn evaluated(m: &EvalModelArgs) -> LoadOptions {
    LoadOptions {
        requantize: m.quant.map(|q| q.weight_type()),
        threads: m.threads,
        kv: m.kv.kv_type(),
    }
}

/// The reference when none is named: the model's own file, when the model is run otherwise
/// than as stored (re-quantized, or with an 8-bit KV cache).
fn default_reference(m: &EvalModelArgs) -> Option<PathBuf> {
    (m.quant.is_some() || m.kv.kv_type() != KvType::F32).then(|| m.model.clone())
}

fn kv_name(m: &EvalModelArgs) -> Option<String> {
    let kv = m.kv.kv_type();
    (kv != KvType::F32).then(|| kv.name().to_owned())
}

/// The model as evaluated, in words: its file, the type it was re-quantized to, its cache.
fn described(m: &EvalModelArgs) -> String {
    let kv = kv_name(m);
    let run = AsRun {
        path: &m.model,
        quant: m.quant.map(|q| q.weight_type().name()),
        kv: kv.as_deref(),
    };
    run.words()
}

pub fn ppl(args: &EvalPplArgs, data_home: Option<&Path>) -> Result<()> {
    let m = &args.model;
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("cannot read the text {}", args.text.display()))?;
    let (model, tokenizer) = load(&m.model, evaluated(m))?;
    let chunks = eval::chunks(&tokenizer, &text, args.ctx, args.chunks)?;
    let reference_path = args.reference.clone().or_else(|| default_reference(m));
    let saved = reference_path
        .as_deref()
        .filter(|p| eval::is_saved_reference(p));
    if saved.is_some() && args.save_reference.is_some() {
        bail!("--save-reference needs a reference model to run, not a saved reference");
    }
    if reference_path.is_none() && args.save_reference.is_some() {
        bail!(
            "--save-reference needs --reference R.gguf (or --quant or --kv q8_0, whose reference is --model)"
        );
    }
    let bounds = PplBounds {
        max_kld: args.max_kld,
        min_top1: args.min_top1,
        max_ppl_ratio: args.max_ppl_ratio,
    };
    if reference_path.is_none() && bounds.any() {
        bail!(
            "--max-kld, --min-top1 and --max-ppl-ratio compare with a reference: pass --reference"
        );
    }
    let made = |vocab_hash: [u8; 32], k: usize| Made {
        vocab: tokenizer.vocab_size() as u32,
        k: k as u32,
        ctx: args.ctx as u32,
        chunks: chunks.len() as u32,
        vocab_hash,
        tokens_hash: eval::tokens_hash(&chunks),
    };
    let reference_model;
    let (reference, reference_words, top_k) = match (reference_path.as_deref(), saved) {
        (_, Some(path)) => {
            let s = SavedReference::open(path, made(eval::vocabulary_hash(&tokenizer), 0))?;
            let k = s.k();
            (
                Reference::Saved(s),
                format!("the top {k} saved in {}", path.display()),
                k,
            )
        }
        (Some(path), None) => {
            let exact = LoadOptions {
                requantize: Some(WeightType::F32),
                threads: m.threads,
                kv: KvType::F32,
            };
            let (r, r_tok) = load(path, exact)?;
            eval::same_vocabulary(&tokenizer, &r_tok)?;
            reference_model = r;
            (
                Reference::Live(&reference_model),
                format!("{} dequantized to F32", path.display()),
                args.top_k,
            )
        }
        (None, None) => (Reference::None, String::new(), args.top_k),
    };
    let mut writer = match &args.save_reference {
        Some(path) => Some(SavedWriter::create(
            path,
            made(eval::vocabulary_hash(&tokenizer), top_k),
        )?),
        None => None,
    };
    let bar = Bar::count("chunks");
    bar_len(&bar, chunks.len());
    let report = eval::perplexity(
        &model,
        &chunks,
        reference,
        writer.as_mut(),
        &PplOptions { top_k },
        |done| bar.set(done as u64, String::new()),
    )?;
    bar.finish();

    let mut figures = report.figures(&reference_words);
    figures["weights_bytes"] = json!(model.weight_bytes());
    let gate = bounds.check(&report);
    let outcome = Outcome {
        kind: "ppl",
        reference: &reference_words,
        data: &args.text,
        summary: report.summary(),
        figures,
    };
    if !conclude(m, data_home, outcome, &gate)? {
        print_ppl(m, args, &report, &reference_words, model.weight_bytes())?;
        if let Some(path) = &args.save_reference {
            writeln!(std::io::stdout(), "reference saved to {}", path.display())?;
        }
    }
    Ok(gate.outcome()?)
}

fn bar_len(bar: &Bar, n: usize) {
    use frugal_cost::Progress;
    bar.start(n as u64);
}

/// What one evaluation measured, as recorded and as `--json` prints it.
struct Outcome<'a> {
    kind: &'a str,
    reference: &'a str,
    data: &'a Path,
    summary: String,
    figures: serde_json::Value,
}

/// Appends the outcome to the store (one that cannot be written is said, never fatal), then
/// prints it as JSON when `--json` asks; whether it did.
fn conclude(m: &EvalModelArgs, data_home: Option<&Path>, o: Outcome, gate: &Gate) -> Result<bool> {
    if let Some(path) = quality::store(m.record.as_deref(), data_home) {
        let written = FileId::of(&m.model).and_then(|model| {
            quality::append(
                &path,
                &Record {
                    at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    kind: o.kind.into(),
                    model,
                    quant: m.quant.map(|q| q.weight_type().name().to_owned()),
                    kv: kv_name(m),
                    reference: (!o.reference.is_empty()).then(|| o.reference.to_owned()),
                    data: o.data.display().to_string(),
                    summary: o.summary,
                    gate: gate.is_set().then_some(gate.passed()),
                    figures: o.figures.clone(),
                },
            )
        });
        if let Err(e) = written {
            tracing::warn!(store = %path.display(), error = %e, "cannot record the evaluation");
        }
    }
    if m.json {
        let mut v = o.figures;
        v["model"] = json!(described(m));
        v["gate"] = gate.to_json();
        crate::table::print_json(&v)?;
    }
    Ok(m.json)
}

fn print_ppl(
    m: &EvalModelArgs,
    args: &EvalPplArgs,
    r: &PplReport,
    reference: &str,
    weights: usize,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} ({:.1} MB of weights): {} chunks of {} tokens of {}, {} tokens scored (each with at least {} before it)",
        described(m),
        weights as f64 / 1e6,
        r.chunks,
        r.ctx,
        args.text.display(),
        r.tokens_scored,
        eval::first_scored(r.ctx)
    )?;
    let Some(c) = &r.reference else {
        writeln!(out, "perplexity {:.4} ± {:.4}", r.ppl, r.ppl_err)?;
        return Ok(());
    };
    writeln!(out, "reference: {reference}\n")?;
    let mut t = table::new(&["", "model", "reference", "ratio"]);
    t.add_row(vec![
        "perplexity".into(),
        format!("{:.4} ± {:.4}", r.ppl, r.ppl_err),
        format!("{:.4}", c.ppl),
        format!("{:.4}", c.ppl_ratio),
    ]);
    writeln!(out, "{t}\n")?;
    let mut t = table::new(&["per token", "mean", "median", "p95", "p99", "max"]);
    let kld_name = if c.kld_is_top_k {
        format!("KL divergence (top {})", c.top_k)
    } else {
        "KL divergence".to_owned()
    };
    t.add_row(vec![
        kld_name,
        format!("{:.5}", c.kld.mean),
        format!("{:.5}", c.kld.median),
        format!("{:.5}", c.kld.p95),
        format!("{:.5}", c.kld.p99),
        format!("{:.5}", c.kld.max),
    ]);
    t.add_row(vec![
        "Δp (model − reference)".into(),
        format!("{:+.3}%", c.dp.mean * 100.0),
        format!("{:+.3}%", c.dp.median * 100.0),
        format!("{:+.3}%", c.dp.p95 * 100.0),
        format!("{:+.3}%", c.dp.p99 * 100.0),
        format!("{:+.3}%", c.dp.max * 100.0),
    ]);
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "same top token {:.2}% · RMS Δp {:.3}% · Δp p1 {:+.3}%, p5 {:+.3}%, min {:+.3}%",
        c.top1 * 100.0,
        c.dp_rms * 100.0,
        c.dp.p1 * 100.0,
        c.dp.p5 * 100.0,
        c.dp.min * 100.0
    )?;
    if let Some(top) = c.top_k_mean {
        let gap = if c.kld.mean > 0.0 {
            (1.0 - top / c.kld.mean) * 100.0
        } else {
            0.0
        };
        writeln!(
            out,
            "a saved top-{} reference would read the mean KLD as {top:.5}, {gap:.2}% under the full one",
            c.top_k
        )?;
    }
    Ok(())
}

pub fn tasks(args: &EvalTasksArgs, data_home: Option<&Path>) -> Result<()> {
    let m = &args.model;
    let mut questions = read_questions(&args.questions)?;
    if let Some(n) = args.limit {
        questions.truncate(n);
    }
    if questions.is_empty() {
        bail!("{} holds no questions", args.questions.display());
    }
    let Some(reference_path) = args.reference.clone().or_else(|| default_reference(m)) else {
        bail!("eval tasks compares with a reference: pass --reference R.gguf (or --quant)");
    };
    let ours = Tier::load(&m.model, evaluated(m))?;
    let as_stored = LoadOptions {
        threads: m.threads,
        ..LoadOptions::default()
    };
    let theirs = Tier::load(&reference_path, as_stored)?;
    eval::same_vocabulary(&ours.tokenizer, &theirs.tokenizer)?;
    let answer = |tier: &Tier, what: &str| -> Result<Vec<bool>> {
        let bar = Bar::count(what);
        let got = tier.answer_all(&questions, args.max_tokens, &bar);
        bar.finish();
        Ok(got?.into_iter().map(|a| a.correct).collect())
    };
    let ours_right = answer(&ours, "model")?;
    let theirs_right = answer(&theirs, "reference")?;
    let n = questions.len();
    let acc = |v: &[bool]| v.iter().filter(|&&c| c).count() as f64 / n as f64;
    let (lost, gained) = flips(&questions, &ours_right, &theirs_right);
    let flips = lost.len() + gained.len();
    let reference_words = format!("{} as stored", reference_path.display());
    let figures = json!({
        "questions": n,
        "accuracy": acc(&ours_right),
        "reference_accuracy": acc(&theirs_right),
        "flips": flips,
        "right_only_in_reference": lost,
        "right_only_in_model": gained,
        "reference": reference_words,
    });
    let summary = format!(
        "accuracy {:.1}% vs the reference's {:.1}% on {n} questions, {flips} flips",
        acc(&ours_right) * 100.0,
        acc(&theirs_right) * 100.0
    );
    let mut gate = Gate::default();
    gate.check("--max-flips", Keep::AtMost, args.max_flips, flips, || {
        format!("{flips} flips")
    });
    let outcome = Outcome {
        kind: "tasks",
        reference: &reference_words,
        data: &args.questions,
        summary,
        figures,
    };
    if !conclude(m, data_home, outcome, &gate)? {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{}: {n} questions of {}",
            described(m),
            args.questions.display()
        )?;
        writeln!(out, "reference: {reference_words}\n")?;
        let mut t = table::new(&["", "right", "accuracy"]);
        let right = |v: &[bool]| v.iter().filter(|&&c| c).count().to_string();
        t.add_row(vec![
            "model".into(),
            right(&ours_right),
            format!("{:.1}%", acc(&ours_right) * 100.0),
        ]);
        t.add_row(vec![
            "reference".into(),
            right(&theirs_right),
            format!("{:.1}%", acc(&theirs_right) * 100.0),
        ]);
        writeln!(out, "{t}")?;
        writeln!(
            out,
            "flips: {flips} ({} right only in the reference, {} only in the model)",
            lost.len(),
            gained.len()
        )?;
    }
    Ok(gate.outcome()?)
}

pub fn embedder(args: &EvalEmbedderArgs) -> Result<()> {
    use frugal_semantic::Embedder;
    use frugal_semantic::eval::{is_held_out, quant_kept, read_pairs};
    let t = args.quant.weight_type();
    let exact = Embedder::load_as(&args.embedder, WeightType::F32)
        .with_context(|| format!("cannot load the embedder in {}", args.embedder.display()))?;
    let quant = Embedder::load_as(&args.embedder, t)
        .with_context(|| format!("cannot quantize the embedder to {t}"))?;
    let pairs: Vec<_> = read_pairs(&args.pairs)?
        .into_iter()
        .filter(|p| is_held_out(p, 0.5))
        .take(args.limit)
        .collect();
    if pairs.is_empty() {
        bail!("{} holds no held-out pairs", args.pairs.display());
    }
    let bar = Bar::count("pairs");
    bar_len(&bar, pairs.len());
    let k = quant_kept(&exact, &quant, &pairs, &|| {
        use frugal_cost::Progress;
        bar.advance(1);
    })?;
    bar.finish();
    let drop = k.auc_exact - k.auc_quant;
    let mut gate = Gate::default();
    gate.check(
        "--min-cosine",
        Keep::AtLeast,
        args.min_cosine,
        k.cosine_mean,
        || format!("mean cosine {:.5}", k.cosine_mean),
    );
    gate.check(
        "--max-auc-drop",
        Keep::AtMost,
        args.max_auc_drop,
        drop,
        || format!("ROC AUC drop {drop:.5}"),
    );
    if args.json {
        crate::table::print_json(&json!({
            "embedder": args.embedder.display().to_string(),
            "quant": t.name(),
            "pairs": pairs.len(),
            "texts": k.texts,
            "cosine": {"mean": k.cosine_mean, "p1": k.cosine_p1, "min": k.cosine_min},
            "auc": {"f32": k.auc_exact, "quant": k.auc_quant, "drop": drop},
            "ms_per_embedding": {"f32": k.ms_exact, "quant": k.ms_quant},
            "gate": gate.to_json(),
        }))?;
    } else {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{} as {t} against F32, on {} held-out pairs of {} ({} texts)\n",
            args.embedder.display(),
            pairs.len(),
            args.pairs.display(),
            k.texts
        )?;
        let mut tb = table::new(&["", "F32", t.name(), "change"]);
        tb.add_row(vec![
            "ROC AUC of the pairs' cosine".into(),
            format!("{:.4}", k.auc_exact),
            format!("{:.4}", k.auc_quant),
            format!("{:+.4}", -drop),
        ]);
        tb.add_row(vec![
            "ms per embedding".into(),
            format!("{:.2}", k.ms_exact),
            format!("{:.2}", k.ms_quant),
            format!("{:.2}x", k.ms_exact / k.ms_quant.max(1e-9)),
        ]);
        writeln!(out, "{tb}")?;
        writeln!(
            out,
            "cosine of each {t} embedding to its F32 one: mean {:.5}, p1 {:.5}, least {:.5}",
            k.cosine_mean, k.cosine_p1, k.cosine_min
        )?;
    }
    Ok(gate.outcome()?)
}
