//! The HTML report: one self-contained file (inline CSS and SVG, no scripts, no network).

use crate::report::Report;

pub fn render(report: &Report, source: &str) -> String {
    format!(
        "<!doctype html><title>frugal report</title><p>{source}: {}</p>",
        report.total
    )
}
