//! What commands print: terminal tables and JSON.
//!
//! On a terminal a table is boxed and fitted to its width (text columns wrap, figures never
//! do); piped or written to a file it is plain columns at their full width, with nothing
//! but ASCII spaces and dashes, so `grep`, `awk` and a diff read it. `COLUMNS` set by hand
//! asks for the boxed table at that width wherever it goes (terminal captures in docs/).

use std::io::{IsTerminal, Write};

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{
    Cell, CellAlignment, ColumnConstraint, ContentArrangement, LineStyle, Table, TableStyle, Width,
};

/// Piped tables: columns apart by spaces, a rule under the header.
const PLAIN: TableStyle =
    TableStyle::new().header_separator(LineStyle::none().fill('-').junction('-'));

/// How a table is drawn on stdout as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Boxed, fitted to this many columns (`None`: the terminal's own width).
    Boxed(Option<u16>),
    /// Plain columns, no width limit.
    Plain,
}

impl Layout {
    /// `COLUMNS` when set, else boxed on a terminal and plain elsewhere.
    pub fn of_stdout() -> Layout {
        let columns = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok())
            .filter(|&c| c > 0);
        match (columns, std::io::stdout().is_terminal()) {
            (Some(c), _) => Layout::Boxed(Some(c)),
            (None, true) => Layout::Boxed(None),
            (None, false) => Layout::Plain,
        }
    }
}

/// The widest a text column's floor gets: longer words wrap inside it.
const WORD_FLOOR: usize = 16;
/// The narrowest a text column gets to fit a terminal: a word is cut, never shredded.
const TEXT_MIN: usize = 8;

/// A table as commands fill and print it.
pub struct Tab(Table);

impl std::ops::Deref for Tab {
    type Target = Table;
    fn deref(&self) -> &Table {
        &self.0
    }
}

impl std::ops::DerefMut for Tab {
    fn deref_mut(&mut self) -> &mut Table {
        &mut self.0
    }
}

impl std::fmt::Display for Tab {
    /// A text column is never narrower than its longest word (up to [`WORD_FLOOR`]): it wraps
    /// between words, and a table that cannot fit goes past the edge rather than cut
    /// `workload` into `wor`/`klo`/`ad`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut table = self.0.clone();
        let rows: Vec<Vec<String>> = table
            .header()
            .into_iter()
            .chain(table.row_iter())
            .map(|r| r.cell_iter().map(comfy_table::Cell::content).collect())
            .collect();
        let widest = |i: usize, cell: &dyn Fn(&str) -> usize| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| cell(c))
                .max()
                .unwrap_or(0)
        };
        let longest_word = |c: &str| c.split_whitespace().map(|w| w.chars().count()).max();
        let line = |c: &str| c.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        // Each column's floor with its padding (a space each side): figures whole, words
        // up to WORD_FLOOR.
        let text: Vec<bool> = table
            .column_iter()
            .map(|c| c.constraint().is_none())
            .collect();
        let mut floors: Vec<usize> = text
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let w = if t {
                    widest(i, &|c| longest_word(c).unwrap_or(0)).min(WORD_FLOOR)
                } else {
                    widest(i, &line)
                };
                w + 2
            })
            .collect();
        // Where the floors overflow the width, text gives way first, down to TEXT_MIN
        // characters a column; past that the table runs over the edge, since a name cut
        // into three-letter pieces (`wor`/`klo`/`ad`) reads worse than a wrapped line.
        if let Some(width) = table.width() {
            let borders = floors.len() + 1;
            let mut over = (floors.iter().sum::<usize>() + borders).saturating_sub(width.into());
            while over > 0 {
                let Some(i) = (0..floors.len())
                    .filter(|&i| text[i] && floors[i] > TEXT_MIN + 2)
                    .max_by_key(|&i| floors[i])
                else {
                    break;
                };
                floors[i] -= 1;
                over -= 1;
            }
        }
        for (i, column) in table.column_iter_mut().enumerate() {
            if text[i] {
                let floor = Width::Fixed(u16::try_from(floors[i]).unwrap_or(u16::MAX));
                column.set_constraint(ColumnConstraint::LowerBoundary(floor));
            }
        }
        write!(f, "{table}")
    }
}

/// A table with a header; columns whose header ends in `>` are right-aligned figures,
/// never wrapped.
pub fn new(headers: &[&str]) -> Tab {
    Tab(with_layout(headers, Layout::of_stdout()))
}

fn with_layout(headers: &[&str], layout: Layout) -> Table {
    let mut table = Table::new();
    match layout {
        Layout::Boxed(width) => {
            table
                .load_style(UTF8_FULL_CONDENSED)
                .set_content_arrangement(ContentArrangement::Dynamic);
            if let Some(width) = width {
                table.set_width(width);
            }
        }
        Layout::Plain => {
            table
                .load_style(PLAIN)
                .set_content_arrangement(ContentArrangement::Disabled);
        }
    }
    table.set_header(headers.iter().map(|h| Cell::new(h.trim_end_matches('>'))));
    for (i, h) in headers.iter().enumerate() {
        if let Some(col) = table.column_mut(i).filter(|_| h.ends_with('>')) {
            col.set_cell_alignment(CellAlignment::Right);
            col.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
    table
}

/// `value` as pretty JSON on stdout, for `--json`: each amount of money in nano-dollars
/// (deprecated) and in dollars beside it (`cost_usd: "0.003802"`, docs/json.md).
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let value = frugal_cost::present::json::to_value(value)?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &value)?;
    writeln!(out)?;
    Ok(())
}

/// `value` as one line of JSON on `out`, for streams (`watch --json`), money as in
/// [`print_json`].
pub fn write_json_line(out: &mut impl Write, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let value = frugal_cost::present::json::to_value(value)?;
    serde_json::to_writer(&mut *out, &value)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// A time in milliseconds as a UTC minute: `2026-12-06 17:37 UTC`.
pub fn date(ms: i64) -> String {
    frugal_cost::present::utc(ms, "%Y-%m-%d %H:%M UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wide() -> Tab {
        let mut t = with_layout(
            &["workload", "why", "requests>", "cost>"],
            Layout::Boxed(Some(60)),
        );
        t.add_row(vec![
            "chat-support-long-name",
            "idle most of the night, scale to zero",
            "271,351,977",
            "$12,345.67",
        ]);
        Tab(t)
    }

    #[test]
    fn figures_never_wrap_in_a_narrow_terminal() {
        let text = wide().to_string();
        assert!(text.contains("271,351,977"), "{text}");
        assert!(text.contains("$12,345.67"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= 60), "{text}");
        // Text wraps between words, never inside one.
        assert!(text.contains("chat-support-lon"), "{text}");
        assert!(text.contains("idle"), "{text}");
    }

    #[test]
    fn piped_tables_are_plain_ascii_at_full_width() {
        let mut t = with_layout(&["workload", "cost>"], Layout::Plain);
        t.add_row(vec!["chat", "$0.0038"]);
        let text = t.to_string();
        assert!(text.is_ascii(), "{text}");
        assert_eq!(
            text.lines().map(str::trim_end).collect::<Vec<_>>(),
            [
                " workload      cost",
                "--------------------",
                " chat       $0.0038"
            ]
        );
    }
}
