//! `iwarp bench --plot FILE.svg`: bandwidth and ping-pong latency against message size, this
//! stack's next to the raw-TCP baseline of the same run, as a self-contained SVG.

use std::fmt::Write as _;

use super::results::{Op, Row, show_size};

const WIDTH: f64 = 960.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 40.0;
const GAP: f64 = 70.0;

/// A colour per operation.
fn colour(op: Op) -> &'static str {
    match op {
        Op::Write => "#1f77b4",
        Op::Read => "#d62728",
        Op::Send => "#2ca02c",
    }
}

/// One panel: a log2 x axis of sizes, a y axis from 0 (linear) or log10 (latency).
struct Panel<'a> {
    title: &'a str,
    unit: &'a str,
    top: f64,
    log_y: bool,
    sizes: &'a [usize],
    y_min: f64,
    y_max: f64,
}

impl Panel<'_> {
    fn x(&self, size: usize) -> f64 {
        let (lo, hi) = (self.sizes[0] as f64, self.sizes[self.sizes.len() - 1] as f64);
        let span = (hi / lo).log2().max(1.0);
        LEFT + (size as f64 / lo).log2() / span * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let f = if self.log_y {
            let (lo, hi) = (self.y_min.max(1e-3).log10(), self.y_max.max(self.y_min * 10.0).log10());
            (v.max(1e-3).log10() - lo) / (hi - lo).max(1e-9)
        } else {
            v / self.y_max.max(1e-9)
        };
        self.top + PANEL_H - f.clamp(0.0, 1.0) * PANEL_H
    }

    fn frame(&self, out: &mut String) {
        let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, self.top, self.top + PANEL_H);
        let _ = writeln!(
            out,
            r##"<rect x="{x0}" y="{y0}" width="{}" height="{PANEL_H}" fill="none" stroke="#999"/>"##,
            x1 - x0
        );
        let _ = writeln!(
            out,
            r#"<text x="{x0}" y="{}" font-size="15" font-weight="bold">{}</text>"#,
            y0 - 10.0,
            self.title
        );
        for &s in self.sizes {
            let x = self.x(s);
            let _ = writeln!(
                out,
                r##"<text x="{x}" y="{}" font-size="11" text-anchor="middle">{}</text><line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="#eee"/>"##,
                y1 + 15.0,
                show_size(s)
            );
        }
        for i in 0..=4 {
            let v = if self.log_y {
                let (lo, hi) = (self.y_min.max(1e-3).log10(), self.y_max.max(self.y_min * 10.0).log10());
                10f64.powf(lo + (hi - lo) * f64::from(i) / 4.0)
            } else {
                self.y_max * f64::from(i) / 4.0
            };
            let y = self.y(v);
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{}" font-size="11" text-anchor="end">{v:.3}</text><line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#eee"/>"##,
                x0 - 5.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="15" y="{}" font-size="12" transform="rotate(-90 15 {})">{}</text>"#,
            y0 + PANEL_H / 2.0,
            y0 + PANEL_H / 2.0,
            self.unit
        );
    }

    fn line(&self, out: &mut String, points: &[(usize, f64)], colour: &str, dashed: bool) {
        if points.is_empty() {
            return;
        }
        let pts: Vec<String> =
            points.iter().map(|&(s, v)| format!("{:.1},{:.1}", self.x(s), self.y(v))).collect();
        let dash = if dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
            pts.join(" ")
        );
    }
}

/// The SVG of a run's rows: bandwidth (top) and p50 round trip (bottom), per operation this
/// stack (solid) and raw TCP (dashed).
pub(super) fn svg(title: &str, ops: &[Op], rows: &[Row]) -> String {
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = String::new();
    let height = TOP + 2.0 * PANEL_H + GAP + 50.0;
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(out, r#"<text x="{LEFT}" y="18" font-size="13">{}</text>"#, escape(title));
    if sizes.is_empty() {
        out.push_str("</svg>\n");
        return out;
    }
    let bw_max = rows.iter().map(|r| r.bw.gbyte_s().max(r.raw.stream.gbyte_s())).fold(0.0, f64::max);
    let lat = rows.iter().flat_map(|r| [r.lat.p50_us, r.raw.ping_pong.p50_us]).filter(|v| *v > 0.0);
    let (lat_min, lat_max) = lat.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let bw = Panel {
        title: "Bandwidth",
        unit: "GB/s",
        top: TOP,
        log_y: false,
        sizes: &sizes,
        y_min: 0.0,
        y_max: bw_max * 1.1,
    };
    let lt = Panel {
        title: "Ping-pong round trip, p50",
        unit: "us (log)",
        top: TOP + PANEL_H + GAP,
        log_y: true,
        sizes: &sizes,
        y_min: if lat_min == f64::MAX { 1.0 } else { lat_min / 1.5 },
        y_max: lat_max * 1.5,
    };
    bw.frame(&mut out);
    lt.frame(&mut out);
    for (i, &op) in ops.iter().enumerate() {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.op == op).collect();
        let c = colour(op);
        bw.line(&mut out, &mine.iter().map(|r| (r.size, r.bw.gbyte_s())).collect::<Vec<_>>(), c, false);
        bw.line(
            &mut out,
            &mine.iter().map(|r| (r.size, r.raw.stream.gbyte_s())).collect::<Vec<_>>(),
            c,
            true,
        );
        lt.line(&mut out, &mine.iter().map(|r| (r.size, r.lat.p50_us)).collect::<Vec<_>>(), c, false);
        lt.line(
            &mut out,
            &mine.iter().map(|r| (r.size, r.raw.ping_pong.p50_us)).collect::<Vec<_>>(),
            c,
            true,
        );
        let y = TOP + 20.0 * i as f64;
        let x = WIDTH - RIGHT + 15.0;
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}" font-size="12">{} iwarp</text>"#,
            x + 25.0,
            x + 30.0,
            y + 4.0,
            op.name()
        );
    }
    let y = TOP + 20.0 * ops.len() as f64;
    let x = WIDTH - RIGHT + 15.0;
    let _ = writeln!(
        out,
        r##"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="#555" stroke-width="2" stroke-dasharray="6 4"/><text x="{}" y="{}" font-size="12">raw TCP</text>"##,
        x + 25.0,
        x + 30.0,
        y + 4.0
    );
    out.push_str("</svg>\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
