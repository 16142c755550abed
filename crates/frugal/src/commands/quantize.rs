//! `frugal quantize`: arguments in, report out; the work is `frugal_engine::quantize`.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result};
use frugal_engine::gguf::GgmlType;
use frugal_engine::quantize::{QuantizeOptions, Report, quantize_file, target_name};
use serde_json::json;

use crate::cli::QuantizeArgs;
use crate::progress::Bar;
use crate::table;

pub fn run(args: &QuantizeArgs) -> Result<()> {
    let options = QuantizeOptions {
        target: args.target,
        keep_output: args.keep_output,
    };
    let bar = Bar::bytes("quantizing");
    let report = quantize_file(&args.input, &args.output, options, &bar);
    bar.finish();
    let report = report.with_context(|| {
        format!(
            "cannot quantize {} to {}",
            args.input.display(),
            args.output.display()
        )
    })?;
    if args.json {
        // Written as text, so that a closed pipe is an io::Error (which is no failure).
        let text = serde_json::to_string_pretty(&to_json(&report))?;
        writeln!(std::io::stdout().lock(), "{text}")?;
        return Ok(());
    }
    print(&report)
}

/// A tensor type as `--type` spells it (ggml writes `q4_K`).
fn ty(t: GgmlType) -> String {
    t.name().to_ascii_lowercase()
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn ratio(before: u64, after: u64) -> f64 {
    if before == 0 {
        0.0
    } else {
        after as f64 / before as f64
    }
}

/// Tensor names with their layer number starred (`blk.*.attn_q.weight`), each with how many
/// layers it stands for: 181 names in a few lines.
fn grouped<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut groups: Vec<(String, usize)> = Vec::new();
    for name in names {
        let key = match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((n, rest)) if n.chars().all(|c| c.is_ascii_digit()) => format!("blk.*.{rest}"),
            _ => name.to_owned(),
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => groups.push((key, 1)),
        }
    }
    groups
        .into_iter()
        .map(|(k, n)| if n > 1 { format!("{k} (x{n})") } else { k })
        .collect()
}

fn print(r: &Report) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let keep = r
        .options
        .keep_output
        .zip(r.output_tensor.as_deref())
        .map(|(t, name)| format!(", {name} {}", target_name(t)))
        .unwrap_or_default();
    writeln!(
        out,
        "{} -> {} ({}{keep})",
        r.input.display(),
        r.output.display(),
        target_name(r.options.target)
    )?;
    let mut t = table::new(&["type", "tensors>", "before>", "after>", "after/before>"]);
    for (dtype, n, before, after) in r.by_type() {
        t.add_row(vec![
            ty(dtype),
            n.to_string(),
            mb(before),
            mb(after),
            format!("{:.2}", ratio(before, after)),
        ]);
    }
    t.add_row(vec![
        "file".to_owned(),
        r.tensors.len().to_string(),
        mb(r.file_bytes_in),
        mb(r.file_bytes_out),
        format!("{:.2}", ratio(r.file_bytes_in, r.file_bytes_out)),
    ]);
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "{} -> {} bytes in {:.1} s",
        r.file_bytes_in, r.file_bytes_out, r.seconds
    )?;
    let fallbacks = r.fallbacks().count();
    if fallbacks > 0 {
        writeln!(
            out,
            "{fallbacks} tensors fell back to a type that holds their rows, as llama.cpp does:"
        )?;
        // One line per (asked, written, row length, block), naming its tensors.
        for k in r.fallback_kinds() {
            writeln!(
                out,
                "  {} -> {}, rows of {} not whole blocks of {}: {}",
                target_name(k.wanted),
                ty(k.to),
                k.row,
                k.block,
                grouped(k.tensors.into_iter()).join(", ")
            )?;
        }
    }
    if r.source_quantized {
        let from: BTreeMap<String, usize> = r
            .converted_from()
            .into_iter()
            .map(|(t, n)| (ty(t), n))
            .collect();
        let from: Vec<String> = from.iter().map(|(k, n)| format!("{n} {k}")).collect();
        writeln!(
            out,
            "note: the source was already quantized ({}): its error compounds with this one; quantize from an F16 or F32 file where there is one",
            from.join(", ")
        )?;
    }
    Ok(())
}

fn to_json(r: &Report) -> serde_json::Value {
    let by_type: Vec<_> = r
        .by_type()
        .into_iter()
        .map(|(t, n, before, after)| {
            json!({"type": ty(t), "tensors": n, "bytes_before": before, "bytes_after": after})
        })
        .collect();
    let tensors: Vec<_> = r
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "dims": t.dims,
                "from": ty(t.from),
                "to": ty(t.to),
                "bytes_before": t.bytes_in,
                "bytes_after": t.bytes_out,
                "converted": t.converted,
                "fallback_from": t.fallback.as_ref().map(|f| target_name(f.wanted)),
            })
        })
        .collect();
    let fallbacks: Vec<&str> = r.fallbacks().map(|t| t.name.as_str()).collect();
    json!({
        "input": r.input,
        "output": r.output,
        "type": target_name(r.options.target),
        "keep_output": r.options.keep_output.map(target_name),
        "output_tensor": r.output_tensor,
        "file_type": r.file_type,
        "bytes_before": r.file_bytes_in,
        "bytes_after": r.file_bytes_out,
        "ratio": ratio(r.file_bytes_in, r.file_bytes_out),
        "seconds": r.seconds,
        "source_quantized": r.source_quantized,
        "by_type": by_type,
        "fallbacks": fallbacks,
        "tensors": tensors,
    })
}
