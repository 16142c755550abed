//! The line chart of the evaluation pages (hit rate against wrong-hit rate, quality against
//! cost), and the page of such charts with a caption under each.

use std::fmt::Write;

use crate::present::page::{esc, styled};
use crate::present::svg::{line, open, rect, text};

/// One line of a chart.
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    /// (x, y) in the chart's units, drawn in the order given.
    pub points: Vec<(f64, f64)>,
}

/// A highlighted point with its label.
pub struct Mark {
    pub label: String,
    pub x: f64,
    pub y: f64,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Axis ranges: (min, max).
    pub x_range: (f64, f64),
    pub y_range: (f64, f64),
    pub series: Vec<Series>,
    pub marks: Vec<Mark>,
}

const W: f64 = 640.0;
const H: f64 = 400.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 50.0;
const TOP: f64 = 20.0;
const RIGHT: f64 = 20.0;
const GRID: &str = " stroke=\"#eee\"";
const SMALL: &str = " font-size=\"12\"";

impl Chart {
    fn px(&self, x: f64, y: f64) -> (f64, f64) {
        let (x0, x1) = self.x_range;
        let (y0, y1) = self.y_range;
        let fx = (x - x0) / (x1 - x0).max(f64::MIN_POSITIVE);
        let fy = (y - y0) / (y1 - y0).max(f64::MIN_POSITIVE);
        (
            LEFT + fx.clamp(0.0, 1.0) * (W - LEFT - RIGHT),
            H - BOTTOM - fy.clamp(0.0, 1.0) * (H - BOTTOM - TOP),
        )
    }

    /// The chart as an inline SVG element, with gridlines at tenths of each axis.
    pub fn svg(&self) -> String {
        let mut s = open(W, H, &format!(" width=\"{W}\" height=\"{H}\""), &self.title);
        for i in 0..=10 {
            let f = f64::from(i) / 10.0;
            let x = self.x_range.0 + f * (self.x_range.1 - self.x_range.0);
            let y = self.y_range.0 + f * (self.y_range.1 - self.y_range.0);
            let (gx, _) = self.px(x, self.y_range.0);
            let (_, gy) = self.px(self.x_range.0, y);
            s.push_str(&line(GRID, (gx, TOP), (gx, H - BOTTOM)));
            s.push_str(&line(GRID, (LEFT, gy), (W - RIGHT, gy)));
            if i % 2 == 0 {
                let below = " font-size=\"11\" text-anchor=\"middle\"";
                s.push_str(&text(gx, H - BOTTOM + 16.0, below, &tick(x)));
                let beside = " font-size=\"11\" text-anchor=\"end\"";
                s.push_str(&text(LEFT - 6.0, gy + 4.0, beside, &tick(y)));
            }
        }
        let centred = " font-size=\"13\" text-anchor=\"middle\"";
        s.push_str(&text(
            (LEFT + W - RIGHT) / 2.0,
            H - 12.0,
            centred,
            &self.x_label,
        ));
        let mid = (TOP + H - BOTTOM) / 2.0;
        let turned = format!("{centred} transform=\"rotate(-90 14 {mid:.1})\"");
        s.push_str(&text(14.0, mid, &turned, &self.y_label));
        for (i, series) in self.series.iter().enumerate() {
            // Points beyond the axes are left out, not drawn along the edge.
            let inside = |&&(x, y): &&(f64, f64)| {
                (self.x_range.0..=self.x_range.1).contains(&x)
                    && (self.y_range.0..=self.y_range.1).contains(&y)
            };
            let points: Vec<String> = series
                .points
                .iter()
                .filter(inside)
                .map(|&(x, y)| {
                    let (px, py) = self.px(x, y);
                    format!("{px:.1},{py:.1}")
                })
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
                series.colour,
                points.join(" "),
                esc(&series.name)
            );
            let ly = TOP + 14.0 + 16.0 * i as f64;
            s.push_str(&rect(
                W - RIGHT - 200.0,
                ly - 4.0,
                12.0,
                3.0,
                series.colour,
                "",
            ));
            s.push_str(&text(W - RIGHT - 184.0, ly, SMALL, &series.name));
        }
        for m in &self.marks {
            let (px, py) = self.px(m.x, m.y);
            let _ = writeln!(
                s,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="5" fill="none" stroke="black" stroke-width="2"/>"#
            );
            s.push_str(&text(px + 8.0, py - 8.0, SMALL, &m.label));
        }
        s.push_str("</svg>");
        s
    }
}

fn tick(v: f64) -> String {
    if v.abs() >= 10.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A page of charts, each with a caption under it.
pub fn page(title: &str, charts: &[(&Chart, &str)]) -> String {
    let mut body = format!("<h1>{}</h1>\n", esc(title));
    for (chart, caption) in charts {
        let _ = writeln!(
            body,
            "<figure><h2>{}</h2>{}<figcaption>{}</figcaption></figure>",
            esc(&chart.title),
            chart.svg(),
            esc(caption)
        );
    }
    styled(title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_its_series_marks_and_labels() {
        let chart = Chart {
            title: "Hits <and> wrong hits".into(),
            x_label: "wrong".into(),
            y_label: "hit".into(),
            x_range: (0.0, 0.2),
            y_range: (0.0, 1.0),
            series: vec![Series {
                name: "guarded".into(),
                colour: "#1f77b4",
                points: vec![(0.0, 0.0), (0.1, 0.5), (0.2, 0.8)],
            }],
            marks: vec![Mark {
                label: "default".into(),
                x: 0.1,
                y: 0.5,
            }],
        };
        let html = page("eval", &[(&chart, "caption")]);
        assert!(html.contains("<polyline") && html.contains("guarded"));
        assert!(html.contains("Hits &lt;and&gt; wrong hits"), "escaped");
        assert!(html.contains("<circle") && html.contains("default"));
        assert!(html.contains("<h1>eval</h1>") && html.contains("<figcaption>caption<"));
        // (0.1, 0.5) is the middle of the plot area.
        let (x, y) = chart.px(0.1, 0.5);
        assert!((x - (LEFT + (W - LEFT - RIGHT) / 2.0)).abs() < 1e-9);
        assert!((y - (H - BOTTOM - (H - BOTTOM - TOP) / 2.0)).abs() < 1e-9);
        // Points outside the range stay on the plot's edge.
        assert_eq!(chart.px(9.0, -1.0), (W - RIGHT, H - BOTTOM));
    }
}
