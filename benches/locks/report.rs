//! The report: one row per figure, printed as a table and written as JSON, Markdown and an
//! SVG chart, all by hand (no serde, no plotting crate).

use std::fmt::Write as _;

/// How a value is shown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unit {
    /// Microseconds (shown in ms from 10 ms on).
    Us,
    PerSec,
    Count,
    /// A plain number with two decimals.
    Num,
    Percent,
}

impl Unit {
    fn json(self) -> &'static str {
        match self {
            Unit::Us => "us",
            Unit::PerSec => "per_s",
            Unit::Count => "count",
            Unit::Num => "number",
            Unit::Percent => "percent",
        }
    }
}

pub fn fmt_value(v: f64, unit: Unit) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    match unit {
        Unit::Us if v >= 10_000.0 => format!("{:.1} ms", v / 1000.0),
        Unit::Us if v >= 100.0 => format!("{v:.0} µs"),
        Unit::Us => format!("{v:.1} µs"),
        Unit::PerSec if v >= 100.0 => format!("{v:.0}/s"),
        Unit::PerSec => format!("{v:.2}/s"),
        Unit::Count => format!("{v:.0}"),
        Unit::Num => format!("{v:.2}"),
        Unit::Percent => format!("{v:.2} %"),
    }
}

/// What a figure must meet.
#[derive(Debug, Clone, Copy)]
pub enum Bar {
    RatioAtMost(f64),
    RatioAtLeast(f64),
    AtMost(f64),
    Equals(f64),
}

/// One figure.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: String,
    pub figure: String,
    pub value: f64,
    pub unit: Unit,
    /// The floor (or reference) it is compared with: name, value, unit.
    pub floor: Option<(String, f64, Unit)>,
    pub bar: Option<Bar>,
    pub note: String,
}

impl Row {
    pub fn new(workload: &str, figure: &str, value: f64, unit: Unit) -> Row {
        Row {
            workload: workload.to_owned(),
            figure: figure.to_owned(),
            value,
            unit,
            floor: None,
            bar: None,
            note: String::new(),
        }
    }

    pub fn floor(mut self, name: &str, value: f64, unit: Unit) -> Row {
        self.floor = Some((name.to_owned(), value, unit));
        self
    }

    pub fn bar(mut self, bar: Bar) -> Row {
        self.bar = Some(bar);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }

    pub fn ratio(&self) -> Option<f64> {
        self.floor
            .as_ref()
            .filter(|f| f.1 > 0.0)
            .map(|f| self.value / f.1)
    }

    /// `Some(true)` met, `Some(false)` missed, `None` no bar (information only).
    pub fn pass(&self) -> Option<bool> {
        let bar = self.bar?;
        if self.value.is_nan() {
            return Some(false);
        }
        Some(match bar {
            Bar::RatioAtMost(x) => self.ratio().is_some_and(|r| r <= x),
            Bar::RatioAtLeast(x) => self.ratio().is_some_and(|r| r >= x),
            Bar::AtMost(x) => self.value <= x,
            Bar::Equals(x) => self.value == x,
        })
    }

    fn bar_text(&self) -> String {
        match self.bar {
            None => "—".into(),
            Some(Bar::RatioAtMost(x)) => format!("ratio ≤ {x}"),
            Some(Bar::RatioAtLeast(x)) => format!("ratio ≥ {}", (x * 1000.0).round() / 1000.0),
            Some(Bar::AtMost(x)) => format!("≤ {}", fmt_value(x, self.unit)),
            Some(Bar::Equals(x)) => format!("= {}", fmt_value(x, self.unit)),
        }
    }

    fn result_text(&self) -> &'static str {
        match self.pass() {
            None => "info",
            Some(true) => "pass",
            Some(false) => "MISS",
        }
    }

    fn cells(&self) -> [String; 7] {
        [
            self.workload.clone(),
            self.figure.clone(),
            fmt_value(self.value, self.unit),
            self.floor
                .as_ref()
                .map(|(n, v, u)| format!("{} ({n})", fmt_value(*v, *u)))
                .unwrap_or_else(|| "—".into()),
            self.ratio()
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "—".into()),
            self.bar_text(),
            self.result_text().into(),
        ]
    }
}

const HEAD: [&str; 7] = [
    "workload", "figure", "value", "floor", "ratio", "bar", "result",
];

/// The table for the terminal.
pub fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 7]> = rows.iter().map(Row::cells).collect();
    let mut w = HEAD.map(|h| h.chars().count());
    for c in &cells {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.chars().count());
        }
    }
    let line = |c: &[String]| {
        let mut s = String::new();
        for (i, x) in c.iter().enumerate() {
            let pad = w[i].saturating_sub(x.chars().count());
            if i == 2 || i == 4 {
                s.push_str(&" ".repeat(pad));
                s.push_str(x);
            } else {
                s.push_str(x);
                s.push_str(&" ".repeat(pad));
            }
            s.push_str("  ");
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&HEAD.map(String::from));
    out.push_str(&line(&w.map(|n| "-".repeat(n))));
    let mut last = String::new();
    for (r, c) in rows.iter().zip(&cells) {
        if r.workload != last && !last.is_empty() {
            out.push('\n');
        }
        last.clone_from(&r.workload);
        out.push_str(&line(c));
    }
    out
}

pub fn markdown(title: &str, meta: &[(String, String)], rows: &[Row], notes: &[String]) -> String {
    let mut s = format!("# {title}\n\n");
    for (k, v) in meta {
        let _ = writeln!(s, "- **{k}**: {v}");
    }
    s.push_str("\n| ");
    s.push_str(&HEAD.join(" | "));
    s.push_str(" |\n|");
    for i in 0..HEAD.len() {
        s.push_str(if i == 2 || i == 4 { "---:|" } else { "---|" });
    }
    s.push('\n');
    for r in rows {
        let c = r.cells().map(|x| x.replace('|', "\\|"));
        let _ = writeln!(s, "| {} |", c.join(" | "));
    }
    let with_notes: Vec<&Row> = rows.iter().filter(|r| !r.note.is_empty()).collect();
    if !with_notes.is_empty() {
        s.push_str("\n## Row notes\n\n");
        for r in with_notes {
            let _ = writeln!(s, "- *{} / {}*: {}", r.workload, r.figure, r.note);
        }
    }
    if !notes.is_empty() {
        s.push_str("\n## Notes\n\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

pub fn json(meta: &[(String, String)], rows: &[Row], notes: &[String]) -> String {
    let mut s = String::from("{\n  \"meta\": {");
    for (i, (k, v)) in meta.iter().enumerate() {
        let _ = write!(
            s,
            "{}\n    {}: {}",
            if i > 0 { "," } else { "" },
            json_str(k),
            json_str(v)
        );
    }
    s.push_str("\n  },\n  \"rows\": [");
    for (i, r) in rows.iter().enumerate() {
        let floor = match &r.floor {
            Some((n, v, u)) => format!(
                "{{\"name\": {}, \"value\": {}, \"unit\": {}}}",
                json_str(n),
                json_num(*v),
                json_str(u.json())
            ),
            None => "null".into(),
        };
        let pass = match r.pass() {
            Some(p) => p.to_string(),
            None => "null".into(),
        };
        let _ = write!(
            s,
            "{}\n    {{\"workload\": {}, \"figure\": {}, \"value\": {}, \"unit\": {}, \"display\": {}, \"floor\": {}, \"ratio\": {}, \"bar\": {}, \"pass\": {}, \"note\": {}}}",
            if i > 0 { "," } else { "" },
            json_str(&r.workload),
            json_str(&r.figure),
            json_num(r.value),
            json_str(r.unit.json()),
            json_str(&fmt_value(r.value, r.unit)),
            floor,
            r.ratio().map_or("null".into(), json_num),
            if r.bar.is_some() {
                json_str(&r.bar_text())
            } else {
                "null".into()
            },
            pass,
            json_str(&r.note),
        );
    }
    s.push_str("\n  ],\n  \"notes\": [");
    for (i, n) in notes.iter().enumerate() {
        let _ = write!(s, "{}\n    {}", if i > 0 { "," } else { "" }, json_str(n));
    }
    s.push_str("\n  ]\n}\n");
    s
}

/// One series of the handoff chart: label, colour, samples in µs (sorted).
#[derive(Debug)]
pub struct Series<'a> {
    pub label: String,
    pub color: &'static str,
    pub sorted_us: &'a [f64],
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A CDF of handoff latency on a log-x axis, with vertical guides (label, µs).
pub fn cdf_svg(title: &str, series: &[Series<'_>], guides: &[(String, f64)]) -> String {
    // One legend line per series between the title and the plot: more than two make room.
    let extra = 17.0 * series.len().saturating_sub(2) as f64;
    let (w, h) = (760.0_f64, 470.0_f64 + extra);
    let (ml, mr, mt, mb) = (70.0, 34.0, 84.0 + extra, 56.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let all = series
        .iter()
        .flat_map(|s| s.sorted_us.iter().copied())
        .chain(guides.iter().map(|g| g.1))
        .filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo > hi { (1.0, 10.0) } else { (lo, hi) };
    let d0 = lo.log10().floor();
    let d1 = hi.log10().ceil().max(d0 + 1.0);
    let x = |us: f64| ml + (us.max(10f64.powf(d0)).log10() - d0) / (d1 - d0) * pw;
    let y = |f: f64| mt + (1.0 - f) * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>
"##,
        w / 2.0,
        xml(title)
    );
    // Grid and ticks.
    let mut d = d0;
    while d <= d1 + 1e-9 {
        let v = 10f64.powf(d);
        let xv = x(v);
        let label = if v >= 1e6 {
            format!("{} s", v / 1e6)
        } else if v >= 1000.0 {
            format!("{} ms", v / 1000.0)
        } else {
            format!("{v} µs")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{xv:.1}" y1="{mt}" x2="{xv:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xv:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            mt + ph,
            mt + ph + 16.0
        );
        for k in 2..10 {
            let xm = x(v * k as f64);
            if d < d1 - 1e-9 {
                let _ = writeln!(
                    s,
                    r##"<line x1="{xm:.1}" y1="{mt}" x2="{xm:.1}" y2="{:.1}" stroke="#f2f2f2"/>"##,
                    mt + ph
                );
            }
        }
        d += 1.0;
    }
    for k in 0..=4 {
        let f = k as f64 / 4.0;
        let yv = y(f);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{yv:.1}" x2="{:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{f:.2}</text>"##,
            ml + pw,
            ml - 6.0,
            yv + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">handoff latency: holder calls unlock() → waiter's lock() returns in another process (log scale)</text>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">fraction of handoffs at or below</text>"##,
        ml + pw / 2.0,
        h - 16.0,
        mt + ph / 2.0,
        mt + ph / 2.0
    );
    for (i, (label, v)) in guides.iter().enumerate() {
        let xv = x(*v);
        let _ = writeln!(
            s,
            r##"<line x1="{xv:.1}" y1="{mt}" x2="{xv:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="#555" font-size="11">{}</text>"##,
            mt + ph,
            xv + 3.0,
            mt + ph - 6.0 - 14.0 * i as f64,
            xml(label)
        );
    }
    // Step CDFs (at most ~600 points each).
    for sr in series {
        let n = sr.sorted_us.len();
        if n == 0 {
            continue;
        }
        let step = n.div_ceil(600).max(1);
        let mut idx: Vec<usize> = (0..n).step_by(step).collect();
        if idx.last() != Some(&(n - 1)) {
            idx.push(n - 1);
        }
        let mut pts = Vec::with_capacity(2 * idx.len());
        let mut prev_f = 0.0;
        for i in idx {
            let v = sr.sorted_us[i];
            let f = (i + 1) as f64 / n as f64;
            pts.push(format!("{:.1},{:.1}", x(v), y(prev_f)));
            pts.push(format!("{:.1},{:.1}", x(v), y(f)));
            prev_f = f;
        }
        let _ = writeln!(
            s,
            r##"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"##,
            sr.color,
            pts.join(" ")
        );
    }
    // Legend, between the title and the plot.
    for (i, sr) in series.iter().enumerate() {
        let ly = 46.0 + 17.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{ml:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"##,
            ml + 24.0,
            sr.color,
            ml + 30.0,
            ly + 4.0,
            xml(&sr.label)
        );
    }
    s.push_str("</svg>\n");
    s
}
