//! Hand-written inline SVG charts for the simulator's HTML report: line charts (linear or log
//! axes), grouped bar charts and histograms over a continuous x range.
//!
//! Why by hand rather than plotters: the output is plain, deterministic text with no fonts or
//! system libraries, every number is checked to be finite before it is written, and text goes
//! through one escaping function. Charts carry no `xmlns` (inline SVG in HTML5 needs none) so the
//! page references no URL at all.
//!
//! Every chart is one `<svg>` element. Non-finite points are dropped; a chart with nothing left
//! to draw says "no data" inside its frame instead of failing.

use std::fmt::Write;

/// Chart size in pixels (the plot area is inset by the margins below).
const WIDTH: f64 = 620.0;
const PLOT_HEIGHT: f64 = 300.0;
const MARGIN_LEFT: f64 = 64.0;
const MARGIN_RIGHT: f64 = 16.0;
const MARGIN_TOP: f64 = 30.0;
/// Room under the plot for tick labels and the x-axis label.
const MARGIN_BOTTOM: f64 = 46.0;
const LEGEND_ROW_HEIGHT: f64 = 18.0;
/// Rough width of one character of 12px sans-serif, for laying out legend entries.
const CHAR_WIDTH: f64 = 6.6;

/// Tableau 10: distinguishable, colour-blind friendly enough, and stable across charts.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Colour number `i` of the palette (cycles).
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Escapes text for HTML and SVG content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A number for display: finite values with up to `decimals` decimals, trailing zeros removed;
/// "n/a" for NaN and infinities (so that no "NaN" or "inf" ever reaches the page).
pub fn fmt_num(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return "n/a".to_string();
    }
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" { "0".to_string() } else { s }
}

/// A tick label: like [`fmt_num`], but 10,000 and above as thousands ("20k") to stay short.
fn tick_label(v: f64, decimals: usize) -> String {
    if v.abs() >= 10_000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", fmt_num(v / 1000.0, 0))
    } else {
        fmt_num(v, decimals)
    }
}

/// A pixel coordinate (always finite: callers map only finite values inside the axis range).
fn px(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "0".to_string()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Base 10; only positive values are drawn.
    Log,
}

/// One line of a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text; `None` for a line that shares an earlier line's legend entry (e.g. another
    /// seed of the same policy).
    pub label: Option<String>,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
    /// Draw a dot at each point (for sparse data such as one point per rate scale).
    pub markers: bool,
}

/// A vertical marker line with a label (e.g. the gate threshold).
#[derive(Debug, Clone)]
pub struct Marker {
    pub x: f64,
    pub label: String,
}

#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
    /// Fixed y range (e.g. 0..1 for fractions); otherwise from the data.
    pub y_range: Option<(f64, f64)>,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
}

/// Grouped bars: one band per category along x, one bar per group inside each band.
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (legend label, colour, one value per category; missing or non-finite values are skipped).
    pub groups: Vec<(String, &'static str, Vec<f64>)>,
    pub y_range: Option<(f64, f64)>,
    /// Decimals of the value printed on top of each bar.
    pub value_decimals: usize,
}

/// Bars over equal bins of a continuous range `[x_min, x_max]`.
#[derive(Debug, Clone)]
pub struct Histogram {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_min: f64,
    pub x_max: f64,
    pub bins: Vec<f64>,
    pub color: &'static str,
    pub y_scale: Scale,
    pub markers: Vec<Marker>,
}

/// Maps data values on one axis to pixels.
#[derive(Debug, Clone, Copy)]
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    px_lo: f64,
    px_hi: f64,
}

impl Axis {
    fn map(&self, v: f64) -> f64 {
        let (v, lo, hi) = match self.scale {
            Scale::Linear => (v, self.lo, self.hi),
            Scale::Log => (
                v.max(f64::MIN_POSITIVE).log10(),
                self.lo.log10(),
                self.hi.log10(),
            ),
        };
        let t = ((v - lo) / (hi - lo)).clamp(-0.05, 1.05);
        self.px_lo + t * (self.px_hi - self.px_lo)
    }

    fn contains(&self, v: f64) -> bool {
        v.is_finite() && v >= self.lo && v <= self.hi && (self.scale == Scale::Linear || v > 0.0)
    }
}

/// Ticks and the range they span (the data range widened to round numbers).
#[derive(Debug, Clone)]
struct Ticks {
    lo: f64,
    hi: f64,
    values: Vec<f64>,
    decimals: usize,
}

/// "Nice" linear ticks (1, 2, 5 × 10^k steps), about five of them.
fn linear_ticks(lo: f64, hi: f64) -> Ticks {
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else if lo == 0.0 {
        (0.0, 1.0)
    } else {
        (lo - lo.abs() * 0.5, hi + hi.abs() * 0.5)
    };
    let raw = (hi - lo) / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step).floor();
    let last = (hi / step).ceil();
    let count = ((last - first) as usize).min(50);
    let values: Vec<f64> = (0..=count).map(|i| (first + i as f64) * step).collect();
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    Ticks {
        lo: first * step,
        hi: (first + count as f64) * step,
        values,
        decimals,
    }
}

/// Decade ticks for a log axis (with 2 and 5 multiples when the range spans under 2 decades).
fn log_ticks(lo: f64, hi: f64) -> Ticks {
    let lo_exp = lo.log10().floor() as i32;
    let hi_exp = (hi.log10().ceil() as i32).max(lo_exp + 1);
    let hi_exp = hi_exp.min(lo_exp + 30);
    let multiples: &[f64] = if hi_exp - lo_exp <= 2 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let mut values = Vec::new();
    for e in lo_exp..=hi_exp {
        for m in multiples {
            let v = m * 10f64.powi(e);
            if v <= 10f64.powi(hi_exp) {
                values.push(v);
            }
        }
    }
    Ticks {
        lo: 10f64.powi(lo_exp),
        hi: 10f64.powi(hi_exp),
        values,
        decimals: (-lo_exp).max(0) as usize,
    }
}

fn ticks_for(scale: Scale, values: impl Iterator<Item = f64>) -> Option<Ticks> {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for v in values.filter(|v| v.is_finite() && (scale == Scale::Linear || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return None;
    }
    Some(match scale {
        Scale::Linear => linear_ticks(lo, hi),
        Scale::Log => log_ticks(lo, hi),
    })
}

/// Lays out legend entries left to right, wrapping; returns the SVG and the height it takes.
fn legend(entries: &[(String, &'static str)], top: f64) -> (String, f64) {
    let mut out = String::new();
    let mut x = MARGIN_LEFT;
    let mut row = 0.0;
    for (label, color) in entries {
        let w = 26.0 + CHAR_WIDTH * label.chars().count() as f64;
        if x + w > WIDTH - MARGIN_RIGHT && x > MARGIN_LEFT {
            x = MARGIN_LEFT;
            row += 1.0;
        }
        let y = top + row * LEGEND_ROW_HEIGHT;
        let _ = write!(
            out,
            r#"<rect x="{}" y="{}" width="14" height="10" fill="{color}"/><text x="{}" y="{}" class="legend">{}</text>"#,
            px(x),
            px(y - 9.0),
            px(x + 18.0),
            px(y),
            escape(label)
        );
        x += w + 10.0;
    }
    let height = if entries.is_empty() {
        0.0
    } else {
        (row + 1.0) * LEGEND_ROW_HEIGHT + 4.0
    };
    (out, height)
}

/// Frame: opening tag, title, and the closing wrapper once the body is known.
fn wrap(title: &str, body: &str, legend_height: f64) -> String {
    let height = MARGIN_TOP + PLOT_HEIGHT + MARGIN_BOTTOM + legend_height;
    format!(
        r#"<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{t}"><text x="{cx}" y="18" class="title">{t}</text>{body}</svg>"#,
        w = px(WIDTH),
        h = px(height),
        cx = px(WIDTH / 2.0),
        t = escape(title),
    )
}

fn no_data_body() -> String {
    format!(
        r#"<rect x="{}" y="{}" width="{}" height="{}" class="frame"/><text x="{}" y="{}" class="nodata">no data</text>"#,
        px(MARGIN_LEFT),
        px(MARGIN_TOP),
        px(WIDTH - MARGIN_LEFT - MARGIN_RIGHT),
        px(PLOT_HEIGHT),
        px(WIDTH / 2.0),
        px(MARGIN_TOP + PLOT_HEIGHT / 2.0)
    )
}

fn plot_bottom() -> f64 {
    MARGIN_TOP + PLOT_HEIGHT
}

/// Grid lines, tick labels, axis labels and the plot frame.
fn axes(x: Option<(&Axis, &Ticks)>, y: (&Axis, &Ticks), x_label: &str, y_label: &str) -> String {
    let mut out = String::new();
    let (left, right) = (MARGIN_LEFT, WIDTH - MARGIN_RIGHT);
    let (top, bottom) = (MARGIN_TOP, plot_bottom());
    let (y_axis, y_ticks) = y;
    for v in &y_ticks.values {
        let yp = y_axis.map(*v);
        let _ = write!(
            out,
            r#"<line x1="{}" y1="{yp}" x2="{}" y2="{yp}" class="grid"/><text x="{}" y="{}" class="ytick">{}</text>"#,
            px(left),
            px(right),
            px(left - 6.0),
            px(y_axis.map(*v) + 4.0),
            tick_label(*v, y_ticks.decimals),
            yp = px(yp),
        );
    }
    if let Some((x_axis, x_ticks)) = x {
        for v in &x_ticks.values {
            let xp = x_axis.map(*v);
            let _ = write!(
                out,
                r#"<line x1="{xp}" y1="{}" x2="{xp}" y2="{}" class="grid"/><text x="{xp}" y="{}" class="xtick">{}</text>"#,
                px(top),
                px(bottom),
                px(bottom + 16.0),
                tick_label(*v, x_ticks.decimals),
                xp = px(xp),
            );
        }
    }
    let _ = write!(
        out,
        r#"<rect x="{}" y="{}" width="{}" height="{}" class="frame"/><text x="{}" y="{}" class="xlabel">{}</text><text x="14" y="{cy}" class="ylabel" transform="rotate(-90 14 {cy})">{}</text>"#,
        px(left),
        px(top),
        px(right - left),
        px(bottom - top),
        px((left + right) / 2.0),
        px(bottom + 36.0),
        escape(x_label),
        escape(y_label),
        cy = px((top + bottom) / 2.0),
    );
    out
}

fn marker_lines(markers: &[Marker], x: &Axis) -> String {
    let mut out = String::new();
    for m in markers.iter().filter(|m| x.contains(m.x)) {
        let xp = x.map(m.x);
        let _ = write!(
            out,
            r#"<line x1="{xp}" y1="{}" x2="{xp}" y2="{}" class="marker"/><text x="{}" y="{}" class="markerlabel">{}</text>"#,
            px(MARGIN_TOP),
            px(plot_bottom()),
            px(xp - 4.0),
            px(MARGIN_TOP + 14.0),
            escape(&m.label),
            xp = px(xp),
        );
    }
    out
}

fn x_axis(ticks: &Ticks, scale: Scale) -> Axis {
    Axis {
        scale,
        lo: ticks.lo,
        hi: ticks.hi,
        px_lo: MARGIN_LEFT,
        px_hi: WIDTH - MARGIN_RIGHT,
    }
}

fn y_axis(ticks: &Ticks, scale: Scale) -> Axis {
    Axis {
        scale,
        lo: ticks.lo,
        hi: ticks.hi,
        px_lo: plot_bottom(),
        px_hi: MARGIN_TOP,
    }
}

/// Renders a line chart as one `<svg>` element.
pub fn line_chart(chart: &LineChart) -> String {
    let usable = |s: Scale, v: f64| v.is_finite() && (s == Scale::Linear || v > 0.0);
    let points = || {
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| usable(chart.x_scale, *x) && usable(chart.y_scale, *y))
    };
    let x_ticks = ticks_for(chart.x_scale, points().map(|p| p.0));
    let y_ticks = match chart.y_range {
        Some((lo, hi)) if lo.is_finite() && hi.is_finite() => {
            ticks_for(chart.y_scale, [lo, hi].into_iter())
        }
        _ => ticks_for(chart.y_scale, points().map(|p| p.1)),
    };
    let (Some(x_ticks), Some(y_ticks)) = (x_ticks, y_ticks) else {
        return wrap(&chart.title, &no_data_body(), 0.0);
    };
    let x = x_axis(&x_ticks, chart.x_scale);
    let y = y_axis(&y_ticks, chart.y_scale);
    let mut body = axes(
        Some((&x, &x_ticks)),
        (&y, &y_ticks),
        &chart.x_label,
        &chart.y_label,
    );
    body.push_str(&marker_lines(&chart.markers, &x));
    for s in &chart.series {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(px_, py)| x.contains(*px_) && y.contains(*py))
            .map(|(a, b)| (x.map(*a), y.map(*b)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let mut path = String::new();
        for (a, b) in &pts {
            let _ = write!(path, "{},{} ", px(*a), px(*b));
        }
        let title = s.label.as_deref().map(escape).unwrap_or_default();
        let _ = write!(
            body,
            r#"<polyline points="{}" fill="none" stroke="{}" class="line"><title>{title}</title></polyline>"#,
            path.trim_end(),
            s.color
        );
        if s.markers {
            for (a, b) in &pts {
                let _ = write!(
                    body,
                    r#"<circle cx="{}" cy="{}" r="3" fill="{}"/>"#,
                    px(*a),
                    px(*b),
                    s.color
                );
            }
        }
    }
    let entries: Vec<(String, &'static str)> = chart
        .series
        .iter()
        .filter_map(|s| s.label.clone().map(|l| (l, s.color)))
        .collect();
    let (legend_svg, legend_height) = legend(&entries, plot_bottom() + MARGIN_BOTTOM + 10.0);
    body.push_str(&legend_svg);
    wrap(&chart.title, &body, legend_height)
}

/// Renders grouped bars as one `<svg>` element; values are printed above the bars.
pub fn bar_chart(chart: &BarChart) -> String {
    let values = || {
        chart
            .groups
            .iter()
            .flat_map(|g| g.2.iter().copied())
            .filter(|v| v.is_finite())
    };
    let y_ticks = match chart.y_range {
        Some((lo, hi)) if lo.is_finite() && hi.is_finite() => linear_ticks(lo, hi),
        _ => {
            // Headroom so that the value printed above the tallest bar stays inside the plot.
            let hi = values().fold(0.0_f64, f64::max) * 1.08;
            let lo = values().fold(0.0_f64, f64::min) * 1.08;
            linear_ticks(lo, hi)
        }
    };
    if chart.categories.is_empty() || chart.groups.is_empty() || values().next().is_none() {
        return wrap(&chart.title, &no_data_body(), 0.0);
    }
    let y = y_axis(&y_ticks, Scale::Linear);
    let mut body = axes(None, (&y, &y_ticks), &chart.x_label, &chart.y_label);
    let band = (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) / chart.categories.len() as f64;
    let bar = band * 0.8 / chart.groups.len() as f64;
    let zero = y.map(0.0_f64.clamp(y.lo, y.hi));
    for (ci, category) in chart.categories.iter().enumerate() {
        let band_left = MARGIN_LEFT + ci as f64 * band;
        let _ = write!(
            body,
            r#"<text x="{}" y="{}" class="xtick">{}</text>"#,
            px(band_left + band / 2.0),
            px(plot_bottom() + 16.0),
            escape(category)
        );
        for (gi, (label, color, vals)) in chart.groups.iter().enumerate() {
            let Some(v) = vals.get(ci).copied().filter(|v| v.is_finite()) else {
                continue;
            };
            let top = y.map(v.clamp(y.lo, y.hi));
            let left = band_left + band * 0.1 + gi as f64 * bar;
            let _ = write!(
                body,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{color}"><title>{}: {}</title></rect>"#,
                px(left),
                px(top.min(zero)),
                px(bar.max(1.0) - 1.0),
                px((zero - top).abs()),
                escape(label),
                fmt_num(v, chart.value_decimals),
            );
            if chart.groups.len() * chart.categories.len() <= 32 {
                let _ = write!(
                    body,
                    r#"<text x="{}" y="{}" class="barvalue">{}</text>"#,
                    px(left + bar / 2.0),
                    px(top.min(zero) - 3.0),
                    fmt_num(v, chart.value_decimals)
                );
            }
        }
    }
    let entries: Vec<(String, &'static str)> = chart
        .groups
        .iter()
        .map(|(l, c, _)| (l.clone(), *c))
        .collect();
    let (legend_svg, legend_height) = legend(&entries, plot_bottom() + MARGIN_BOTTOM + 10.0);
    body.push_str(&legend_svg);
    wrap(&chart.title, &body, legend_height)
}

/// Renders a histogram as one `<svg>` element. On a log y axis empty bins draw nothing.
pub fn histogram(chart: &Histogram) -> String {
    let n = chart.bins.len();
    let range_ok = chart.x_min.is_finite() && chart.x_max.is_finite() && chart.x_max > chart.x_min;
    let usable = |v: &f64| v.is_finite() && (chart.y_scale == Scale::Linear || *v > 0.0);
    let y_ticks = match chart.y_scale {
        Scale::Linear => {
            let hi = chart
                .bins
                .iter()
                .copied()
                .filter(usable)
                .fold(0.0_f64, f64::max);
            Some(linear_ticks(0.0, hi))
        }
        Scale::Log => ticks_for(Scale::Log, chart.bins.iter().copied()),
    };
    let Some(y_ticks) = y_ticks.filter(|_| range_ok && chart.bins.iter().any(&usable)) else {
        return wrap(&chart.title, &no_data_body(), 0.0);
    };
    let x_ticks = linear_ticks(chart.x_min, chart.x_max);
    let x = x_axis(&x_ticks, Scale::Linear);
    let y = y_axis(&y_ticks, chart.y_scale);
    let mut body = axes(
        Some((&x, &x_ticks)),
        (&y, &y_ticks),
        &chart.x_label,
        &chart.y_label,
    );
    let width = (chart.x_max - chart.x_min) / n as f64;
    let bottom = plot_bottom();
    for (i, v) in chart.bins.iter().enumerate().filter(|(_, v)| usable(v)) {
        let lo = chart.x_min + i as f64 * width;
        let (l, r) = (x.map(lo), x.map(lo + width));
        let top = y.map(v.clamp(y.lo, y.hi));
        let _ = write!(
            body,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}" class="bin"><title>[{}, {}): {}</title></rect>"#,
            px(l),
            px(top),
            px((r - l - 1.0).max(0.5)),
            px((bottom - top).max(0.0)),
            chart.color,
            fmt_num(lo, 3),
            fmt_num(lo + width, 3),
            fmt_num(*v, 4)
        );
    }
    body.push_str(&marker_lines(&chart.markers, &x));
    wrap(&chart.title, &body, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_replaces_markup_characters() {
        assert_eq!(
            escape(r#"<a & "b" 'c'>"#),
            "&lt;a &amp; &quot;b&quot; &#39;c&#39;&gt;"
        );
    }

    #[test]
    fn fmt_num_trims_zeros_and_hides_non_finite() {
        assert_eq!(fmt_num(1.50, 2), "1.5");
        assert_eq!(fmt_num(200.0, 0), "200");
        assert_eq!(fmt_num(-0.0001, 2), "0");
        assert_eq!(fmt_num(f64::NAN, 2), "n/a");
        assert_eq!(fmt_num(f64::INFINITY, 2), "n/a");
    }

    #[test]
    fn linear_ticks_cover_the_range_with_round_steps() {
        let t = linear_ticks(3.0, 97.0);
        assert_eq!((t.lo, t.hi), (0.0, 100.0));
        assert_eq!(t.values, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let flat = linear_ticks(0.0, 0.0);
        assert_eq!((flat.lo, flat.hi), (0.0, 1.0));
    }

    #[test]
    fn tick_labels_abbreviate_thousands() {
        assert_eq!(tick_label(10_000.0, 0), "10k");
        assert_eq!(tick_label(5000.0, 0), "5000");
        assert_eq!(tick_label(0.25, 2), "0.25");
    }

    #[test]
    fn log_ticks_are_decades_over_wide_ranges() {
        let t = log_ticks(35.0, 12_000.0);
        assert_eq!((t.lo, t.hi), (10.0, 100_000.0));
        assert_eq!(t.values, vec![10.0, 100.0, 1000.0, 10_000.0, 100_000.0]);
    }

    #[test]
    fn line_chart_without_usable_points_says_no_data() {
        let chart = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Linear,
            y_range: None,
            series: vec![Series {
                label: Some("s".into()),
                color: color(0),
                points: vec![(0.0, 1.0), (f64::NAN, 2.0), (-1.0, f64::INFINITY)],
                markers: true,
            }],
            markers: vec![],
        };
        let svg = line_chart(&chart);
        assert!(svg.contains("no data"), "{svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }
}
