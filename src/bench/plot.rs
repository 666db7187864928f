//! Charts of a bench report as SVG: one horizontal bar per directory for every figure, each
//! figure scaled to its own largest value, grouped by workload; S0's latencies get a chart of
//! their own (mean, p99, max per job). Plain SVG text: no plotting library needed; `png`
//! rasterizes it (resvg, with the system's fonts).

use super::{Better, Report};

const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];
const LABEL_W: f64 = 330.0;
const BAR_W: f64 = 420.0;
const BAR_H: f64 = 13.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// The SVG document for `r`, limited to the rows `keep` accepts.
fn chart(r: &Report, title: &str, keep: &dyn Fn(&super::ReportRow) -> bool) -> String {
    let rows: Vec<_> = r.figures.iter().filter(|f| keep(f)).collect();
    let n = r.dirs.len().max(1);
    let group_h = BAR_H * n as f64 + 8.0;
    let legend_h = 20.0 * n as f64 + 10.0;
    let mut workloads: Vec<&str> = rows.iter().map(|f| f.workload.as_str()).collect();
    workloads.dedup();
    let height =
        40.0 + legend_h + rows.len() as f64 * group_h + workloads.len() as f64 * 26.0 + 20.0;
    let width = LABEL_W + BAR_W + 140.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"{width}\" height=\"{height}\" \
         fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    );
    let mut y = 40.0;
    for (i, d) in r.dirs.iter().enumerate() {
        s.push_str(&format!(
            "<rect x=\"10\" y=\"{y}\" width=\"14\" height=\"12\" fill=\"{}\"/>\
             <text x=\"30\" y=\"{}\">[{}] {}</text>\n",
            COLORS[i % COLORS.len()],
            y + 10.0,
            i + 1,
            esc(d)
        ));
        y += 20.0;
    }
    y += 10.0;
    let mut current = "";
    for row in rows {
        if row.workload != current {
            current = &row.workload;
            s.push_str(&format!(
                "<text x=\"10\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
                y + 16.0,
                esc(current)
            ));
            y += 26.0;
        }
        let max = row.median.iter().flatten().cloned().fold(0.0f64, f64::max);
        let dir = match row.better {
            Better::Higher => "higher is better",
            Better::Lower => "lower is better",
        };
        s.push_str(&format!(
            "<text x=\"10\" y=\"{}\">{} ({}, {dir})</text>\n",
            y + BAR_H * n as f64 / 2.0 + 4.0,
            esc(&row.name),
            esc(&row.unit)
        ));
        for (i, m) in row.median.iter().enumerate() {
            let by = y + i as f64 * BAR_H;
            if let Some(v) = m {
                // At least a sliver: a zero-width rect is invalid SVG to some renderers.
                let w = if max > 0.0 { v / max * BAR_W } else { 0.0 }.max(0.1);
                s.push_str(&format!(
                    "<rect x=\"{LABEL_W}\" y=\"{by}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"/>\
                     <text x=\"{:.1}\" y=\"{}\">{}</text>\n",
                    BAR_H - 2.0,
                    COLORS[i % COLORS.len()],
                    LABEL_W + w + 4.0,
                    by + BAR_H - 3.0,
                    fmt(*v)
                ));
            }
        }
        y += group_h;
    }
    s.push_str("</svg>\n");
    s
}

/// The chart `svg` (as drawn here) rasterized to PNG bytes, at twice its size for sharp text.
pub fn png(svg: &str) -> anyhow::Result<Vec<u8>> {
    use resvg::{tiny_skia, usvg};
    let mut opt = usvg::Options::default();
    let db = opt.fontdb_mut();
    db.load_system_fonts();
    // The charts ask for "sans-serif"; fontdb maps it to Arial, rarely installed on Linux.
    let sans = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans"]
        .into_iter()
        .find(|f| {
            db.faces()
                .any(|face| face.families.iter().any(|(n, _)| n == f))
        })
        .map(str::to_string)
        .or_else(|| {
            db.faces()
                .next()
                .and_then(|f| f.families.first().map(|(n, _)| n.clone()))
        });
    if let Some(family) = sans {
        db.set_sans_serif_family(family);
    }
    let tree = usvg::Tree::from_str(svg, &opt)
        .map_err(|e| anyhow::anyhow!("cannot draw the chart: {e}"))?;
    let scale = 2.0;
    let size = tree.size();
    let (w, h) = (
        ((size.width() * scale).ceil() as u32).max(1),
        ((size.height() * scale).ceil() as u32).max(1),
    );
    let mut pixmap = tiny_skia::Pixmap::new(w, h)
        .ok_or_else(|| anyhow::anyhow!("cannot draw a chart of {w}x{h} pixels"))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| anyhow::anyhow!("cannot encode the chart as PNG: {e}"))
}

/// Every figure, grouped by workload.
pub fn svg(r: &Report) -> String {
    chart(r, "unkai bench: medians per directory", &|_| true)
}

/// S0's latencies alone (mean, p99, max of each fio job), if S0 ran.
pub fn s0_latency_svg(r: &Report) -> Option<String> {
    let keep = |f: &super::ReportRow| f.workload == "S0" && f.unit == "ms";
    r.figures
        .iter()
        .any(keep)
        .then(|| chart(r, "S0: completion latency of 4 KiB I/O (ms)", &keep))
}

#[cfg(test)]
mod tests {
    use super::super::ReportRow;
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_text_is_escaped() {
        let r = Report {
            dirs: vec!["/a<b".into(), "/c".into()],
            runs: 1,
            quick: true,
            notes: vec![],
            figures: vec![ReportRow {
                workload: "M".into(),
                name: "create & stat".into(),
                unit: "ops/s".into(),
                better: Better::Higher,
                values: vec![vec![50.0], vec![100.0]],
                median: vec![Some(50.0), Some(100.0)],
            }],
        };
        let s = svg(&r);
        assert!(s.starts_with("<svg"));
        assert!(s.contains("/a&lt;b") && s.contains("create &amp; stat"));
        assert!(s.contains(&format!("width=\"{:.1}\"", BAR_W / 2.0)), "{s}");
        assert!(s.contains(&format!("width=\"{BAR_W:.1}\"")), "{s}");
        assert!(s0_latency_svg(&r).is_none());
        // The same chart as PNG: a PNG of twice the SVG's size, with bars drawn on white.
        let png = png(&s).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let svg_w: f64 = s
            .split("width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(w, (svg_w * 2.0).ceil() as u32);
    }
}
