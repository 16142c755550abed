//! How figures are shown, wherever they are shown: money, counts and shares as text
//! (`format`), HTML escaping and the page around a body (`page`), SVG drawing and the
//! horizontal bar chart (`svg`), the line chart of the evaluation pages (`chart`), and the
//! JSON commands print, money in dollars beside the nano-dollars (`json`).
//!
//! The report's page (`html`), the terminal tables and the evaluation pages of the binary
//! all draw with these, so a dollar reads the same everywhere.

pub mod chart;
pub mod format;
pub mod json;
pub mod page;
pub mod svg;

pub use format::{interval, pct, pct1, thousands, usd, usd_f64, usd_per_1m, usd_unit, utc};
pub use page::esc;
