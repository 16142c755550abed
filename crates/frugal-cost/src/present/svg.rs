//! Inline SVG: the elements charts are drawn with, axes in dollars, and the horizontal bar
//! chart every chart of named rows uses. Values are floats clamped at zero (`pos`), so a
//! credit cannot draw a bar backwards or an empty axis divide.

use crate::money::Money;
use crate::present::format::usd_text;
use crate::present::page::esc;

/// Charts are drawn in this width and scaled to the page by their viewBox.
pub const WIDTH: f64 = 960.0;
/// Rough advance of one label character, to size label columns without measuring a font.
const CHAR_W: f64 = 6.8;
const BAR_H: f64 = 18.0;
const BAR_GAP: f64 = 4.0;
pub const END: &str = " text-anchor=\"end\"";
pub const MIDDLE: &str = " text-anchor=\"middle\"";
const LABEL: &str = " class=\"lbl\" text-anchor=\"end\"";
const SUB: &str = " class=\"sub\" text-anchor=\"end\"";
pub const INSIDE: &str = " class=\"in\" text-anchor=\"middle\"";
pub const GRID: &str = " class=\"grid\"";
pub const AXIS: &str = " class=\"axis\"";

/// An `<svg>` of `width` x `height` user units; `attrs` (such as a fixed size) go in the
/// tag as they are, `label` is escaped.
pub fn open(width: f64, height: f64, attrs: &str, label: &str) -> String {
    let label = esc(label);
    format!(
        "<svg viewBox=\"0 0 {width} {height:.0}\"{attrs} role=\"img\" aria-label=\"{label}\">\n"
    )
}

/// A `<text>`; `content` is escaped here.
pub fn text(x: f64, y: f64, attrs: &str, content: &str) -> String {
    let content = esc(content);
    format!("<text x=\"{x:.1}\" y=\"{y:.1}\"{attrs}>{content}</text>\n")
}

/// A `<rect>` that names itself on hover, unless `title` is empty.
pub fn rect(x: f64, y: f64, w: f64, h: f64, fill: &str, title: &str) -> String {
    let at = format!("x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\"");
    if title.is_empty() {
        return format!("<rect {at} fill=\"{fill}\"/>\n");
    }
    let title = esc(title);
    format!("<rect {at} fill=\"{fill}\"><title>{title}</title></rect>\n")
}

pub fn line(attrs: &str, (x1, y1): (f64, f64), (x2, y2): (f64, f64)) -> String {
    let at = format!("x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\"");
    format!("<line{attrs} {at}/>\n")
}

/// A top for the y axis at or above `max` (> 0), and a round step giving it 3 to 5 gridlines.
pub fn nice_axis(max: f64) -> (f64, f64) {
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let steps = [1.0, 2.0, 2.5, 5.0, 10.0].map(|m| m * magnitude);
    let step = steps.into_iter().find(|s| *s >= raw);
    let step = step.unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

/// A gridline's dollars, with only the decimals its step needs.
pub fn axis_label(v: f64, step: f64) -> String {
    let places = match step {
        s if s >= 1.0 => 0,
        s if s >= 0.01 => 2,
        _ => 6,
    };
    let text = Money::from_f64_dollars(v).map(|m| m.to_string_places(places));
    usd_text(&text.unwrap_or_else(|| format!("{v:.0}")))
}

/// A chart value as drawn: negatives (credits) and non-numbers draw no bar at all.
pub fn pos(v: Option<f64>) -> f64 {
    v.filter(|v| v.is_finite() && *v > 0.0).unwrap_or(0.0)
}

fn clip(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// A bar of a horizontal bar chart, with `text` drawn past its end.
pub struct Bar {
    pub value: f64,
    pub fill: &'static str,
    pub text: String,
}

pub fn bar(value: Money, fill: &'static str, text: String) -> Bar {
    let value = value.as_f64();
    Bar { value, fill, text }
}

/// A labelled group of one or more bars; `sub` is a second, smaller label line.
pub struct BarRow {
    pub label: String,
    pub sub: String,
    pub bars: Vec<Bar>,
}

/// Horizontal bars on one shared scale: every chart of named rows draws with this.
pub fn hbars(rows: &[BarRow], label: &str) -> String {
    let chars = |r: &BarRow| r.label.chars().count().max(r.sub.chars().count());
    let longest = rows.iter().map(chars).max().unwrap_or(0);
    let label_w = (longest as f64 * CHAR_W + 24.0).clamp(120.0, 380.0);
    let max_chars = ((label_w - 24.0) / CHAR_W).round() as usize;
    let bars = rows.iter().flat_map(|r| &r.bars);
    let max = bars.map(|b| pos(Some(b.value))).fold(0.0, f64::max);
    // Room past the longest bar for its value text; a floor of a nano-dollar keeps an
    // all-zero chart finite (0 x scale, never 0 / 0).
    let scale = (WIDTH - label_w - 200.0) / max.max(1e-9);
    let mut body = String::new();
    let mut y0 = 4.0;
    for row in rows {
        let n = row.bars.len() as f64;
        let bars_h = n * BAR_H + (n - 1.0).max(0.0) * BAR_GAP;
        let h = bars_h.max(if row.sub.is_empty() { BAR_H } else { 34.0 });
        let label_y = y0 + h / 2.0 + if row.sub.is_empty() { 4.5 } else { -3.0 };
        let x = label_w - 12.0;
        let (label, sub) = (clip(&row.label, max_chars), clip(&row.sub, max_chars));
        body.push_str(&text(x, label_y, LABEL, &label));
        if !sub.is_empty() {
            body.push_str(&text(x, label_y + 15.0, SUB, &sub));
        }
        let mut by = y0 + (h - bars_h) / 2.0;
        for b in &row.bars {
            let w = pos(Some(b.value)) * scale;
            let title = format!("{}: {}", row.label, b.text);
            body.push_str(&rect(label_w, by, w, BAR_H, b.fill, &title));
            body.push_str(&text(label_w + w + 6.0, by + 13.0, "", &b.text));
            by += BAR_H + BAR_GAP;
        }
        y0 += h + 14.0;
    }
    let axis = line(AXIS, (label_w, 0.0), (label_w, y0 - 10.0));
    format!("{}{axis}{body}</svg>\n", open(WIDTH, y0 - 6.0, "", label))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rust's float text for infinity or not-a-number, drawn as a coordinate.
    fn finite(svg: &str) -> bool {
        !svg.contains("NaN") && !svg.contains("\"inf") && !svg.contains("\"-inf")
    }

    #[test]
    fn zero_and_negative_bars_are_flat() {
        let m = |s: &str| s.parse::<Money>().unwrap();
        let bars = vec![
            bar(Money::ZERO, "#bab0ac", "a".into()),
            bar(m("-2"), "#bab0ac", "b".into()),
        ];
        let (label, sub) = ("zero".to_owned(), String::new());
        let svg = hbars(&[BarRow { label, sub, bars }], "t");
        assert_eq!(svg.matches("width=\"0.0\"").count(), 2, "{svg}");
        assert!(finite(&svg));
    }

    #[test]
    fn axes_are_round_and_read_as_dollars() {
        assert_eq!(nice_axis(315.0), (400.0, 100.0));
        assert_eq!(nice_axis(101.0), (125.0, 25.0));
        assert_eq!(axis_label(1200.0, 100.0), "$1,200");
        assert_eq!(axis_label(0.5, 0.25), "$0.50");
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(
            rect(1.0, 2.0, 3.0, 4.0, "#fff", ""),
            "<rect x=\"1.0\" y=\"2.0\" width=\"3.0\" height=\"4.0\" fill=\"#fff\"/>\n"
        );
        assert!(
            open(960.0, 40.0, "", "a \"b\"")
                .contains("viewBox=\"0 0 960 40\" role=\"img\" aria-label=\"a &quot;b&quot;\"")
        );
    }
}
