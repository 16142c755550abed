//! What commands print: terminal tables and JSON.

use std::io::Write;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};

/// A table with a header; columns whose header ends in `>` are right-aligned.
pub fn new(headers: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(headers.iter().map(|h| Cell::new(h.trim_end_matches('>'))));
    for (i, h) in headers.iter().enumerate() {
        if let Some(col) = table.column_mut(i).filter(|_| h.ends_with('>')) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// `value` as pretty JSON on stdout, for `--json`.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A time in milliseconds as a UTC minute: `2026-12-06 17:37 UTC`.
pub fn date(ms: i64) -> String {
    frugal_cost::present::utc(ms, "%Y-%m-%d %H:%M UTC")
}
