//! Training metrics: one CSV row per step (appended as the run goes, cut back to the resumed
//! step on `--resume`), and the loss curves drawn as an SVG.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::error::{Context, Error, Result};
use crate::harness::report::TaskReport;
use crate::observe::evals::EvalRow;
use crate::observe::tensorboard::EventWriter;

/// One step's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetrics {
    /// Steps completed, this one included.
    pub step: u64,
    /// The student's learning rate of the step.
    pub lr: f64,
    /// The optimized loss (with dynamic scaling: `2 · L_CE` in value).
    pub loss: f64,
    /// The student's next-token cross-entropy.
    pub ce: f64,
    /// `Σ_m α_m L_m`.
    pub kd: f64,
    /// Per teacher: `L_m` and `α_m`.
    pub teachers: Vec<(f64, f64)>,
    /// The student's gradient norm before clipping.
    pub grad_norm: f64,
    /// Student tokens trained on so far.
    pub tokens: u64,
    /// Student tokens per second of this step.
    pub tokens_per_s: f64,
    /// Training time so far.
    pub seconds: f64,
    /// Peak memory so far: the device's pools where the backend reports them (CUDA), else the
    /// process's resident memory (the CPU backend); 0 where neither is known.
    pub memory_bytes: u64,
    /// What the student wrote (runs with `[on_policy]`).
    pub on_policy: Option<OnPolicyMetrics>,
}

/// What the student wrote in one step of on-policy distillation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnPolicyMetrics {
    /// The share of the step's sequences the student wrote.
    pub share: f64,
    /// Tokens written per on-policy sequence, the mean over the step (0 without one).
    pub generated: f64,
    /// Tokens written per second of writing them (this worker's).
    pub tokens_per_s: f64,
    /// Seconds of the step spent writing them and aligning what was written (this worker's).
    pub seconds: f64,
}

/// The CSV file `metrics.csv` of a run, and its TensorBoard event file beside it in
/// `tensorboard/`.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
    events: EventWriter,
    teachers: Vec<String>,
    /// Whether the rows have the on-policy columns.
    on_policy: bool,
    rows: Vec<StepMetrics>,
}

fn header(teachers: &[String], on_policy: bool) -> String {
    let mut h = String::from("step,lr,loss,ce,kd");
    for name in teachers {
        let _ = write!(h, ",loss_{name},alpha_{name}");
    }
    h.push_str(",grad_norm,tokens,tokens_per_s,seconds,memory_bytes");
    if on_policy {
        h.push_str(",on_policy_share,generated_tokens,generation_tokens_per_s,generation_seconds");
    }
    h
}

fn parse_row(line: &str, teachers: usize, on_policy: bool) -> Option<StepMetrics> {
    let v: Vec<f64> = line
        .split(',')
        .map(|x| x.parse::<f64>().ok())
        .collect::<Option<_>>()?;
    if v.len() != 10 + 2 * teachers + 4 * usize::from(on_policy) {
        return None;
    }
    let t = 5 + 2 * teachers;
    Some(StepMetrics {
        step: v[0] as u64,
        lr: v[1],
        loss: v[2],
        ce: v[3],
        kd: v[4],
        teachers: (0..teachers)
            .map(|m| (v[5 + 2 * m], v[6 + 2 * m]))
            .collect(),
        grad_norm: v[t],
        tokens: v[t + 1] as u64,
        tokens_per_s: v[t + 2],
        seconds: v[t + 3],
        memory_bytes: v[t + 4] as u64,
        on_policy: on_policy.then(|| OnPolicyMetrics {
            share: v[t + 5],
            generated: v[t + 6],
            tokens_per_s: v[t + 7],
            seconds: v[t + 8],
        }),
    })
}

impl MetricsLog {
    /// Opens `path` for a run resumed after `start_step` steps: a fresh file at 0, else the
    /// rows of steps `1..=start_step` are kept and later ones (written after the checkpoint the
    /// run resumes from) dropped. `on_policy` adds the columns of what the student wrote.
    pub fn open(
        path: &Path,
        teachers: &[String],
        on_policy: bool,
        start_step: u64,
    ) -> Result<Self> {
        let mut rows = Vec::new();
        if start_step > 0 && path.exists() {
            let file =
                File::open(path).with_context(|| format!("{}: cannot read", path.display()))?;
            let mut lines = BufReader::new(file).lines();
            let first = lines.next().transpose()?.unwrap_or_default();
            if first != header(teachers, on_policy) {
                return Err(Error::Run(format!(
                    "{}: its columns do not match this run's teachers; move it away to resume",
                    path.display()
                )));
            }
            for (i, line) in lines.enumerate() {
                let line = line?;
                let row = parse_row(&line, teachers.len(), on_policy).ok_or_else(|| {
                    Error::Run(format!("{}:{}: not a metrics row", path.display(), i + 2))
                })?;
                if row.step <= start_step {
                    rows.push(row);
                }
            }
        }
        let events = path.with_file_name("tensorboard");
        let mut log = MetricsLog {
            path: path.to_path_buf(),
            file: File::create(path)
                .with_context(|| format!("{}: cannot write", path.display()))?,
            events: EventWriter::create(&events, start_step)?,
            teachers: teachers.to_vec(),
            on_policy,
            rows: Vec::new(),
        };
        writeln!(log.file, "{}", header(teachers, on_policy))?;
        for row in rows {
            log.write_row(row)?;
        }
        Ok(log)
    }

    /// Appends one step, to the CSV file and as TensorBoard scalars.
    pub fn push(&mut self, m: StepMetrics) -> Result<()> {
        let mut scalars = vec![
            ("train/loss".to_string(), m.loss),
            ("train/ce".to_string(), m.ce),
            ("train/kd".to_string(), m.kd),
            ("train/lr".to_string(), m.lr),
            ("train/grad_norm".to_string(), m.grad_norm),
            ("perf/tokens_per_s".to_string(), m.tokens_per_s),
            ("perf/memory_gb".to_string(), m.memory_bytes as f64 / 1e9),
        ];
        for (name, (loss, alpha)) in self.teachers.iter().zip(&m.teachers) {
            scalars.push((format!("teacher/{name}/loss"), *loss));
            scalars.push((format!("teacher/{name}/alpha"), *alpha));
        }
        if let Some(on) = &m.on_policy {
            scalars.push(("on_policy/share".to_string(), on.share));
            scalars.push(("on_policy/generated_tokens".to_string(), on.generated));
            scalars.push(("perf/generation_tokens_per_s".to_string(), on.tokens_per_s));
        }
        self.events.scalars(m.step, &scalars)?;
        self.write_row(m)
    }

    fn write_row(&mut self, m: StepMetrics) -> Result<()> {
        let mut line = format!("{},{:e},{},{},{}", m.step, m.lr, m.loss, m.ce, m.kd);
        for (loss, alpha) in &m.teachers {
            let _ = write!(line, ",{loss},{alpha}");
        }
        let _ = write!(
            line,
            ",{},{},{:.1},{:.3},{}",
            m.grad_norm, m.tokens, m.tokens_per_s, m.seconds, m.memory_bytes
        );
        if self.on_policy {
            let on = m.on_policy.unwrap_or(OnPolicyMetrics {
                share: 0.0,
                generated: 0.0,
                tokens_per_s: 0.0,
                seconds: 0.0,
            });
            let _ = write!(
                line,
                ",{},{},{:.1},{:.3}",
                on.share, on.generated, on.tokens_per_s, on.seconds
            );
        }
        writeln!(self.file, "{line}")
            .and_then(|_| self.file.flush())
            .with_context(|| format!("{}: cannot write", self.path.display()))?;
        self.rows.push(m);
        Ok(())
    }

    /// The rows so far.
    #[cfg(test)]
    pub fn rows(&self) -> &[StepMetrics] {
        &self.rows
    }

    /// Benchmark results as TensorBoard scalars (`benchmark/<task>/<metric>`).
    pub fn push_benchmarks(&mut self, step: u64, reports: &[TaskReport]) -> Result<()> {
        let scalars: Vec<(String, f64)> = reports
            .iter()
            .flat_map(|r| {
                r.metrics
                    .iter()
                    .map(move |m| (format!("benchmark/{}/{}", r.task, m.name), m.value))
            })
            .collect();
        self.events.scalars(step, &scalars)
    }

    /// An evaluation's values as TensorBoard scalars (`eval/ce`, `eval/teacher/<name>/loss`).
    pub fn push_eval(&mut self, row: &EvalRow) -> Result<()> {
        let mut scalars = vec![("eval/ce".to_string(), row.ce)];
        for (name, loss) in self.teachers.iter().zip(&row.teachers) {
            scalars.push((format!("eval/teacher/{name}/loss"), *loss));
        }
        self.events.scalars(row.step, &scalars)
    }

    /// Writes the loss curves to `path` (SVG) atomically, with the held-out ones of `eval`.
    pub fn write_svg(&self, path: &Path, title: &str, eval: &[EvalRow]) -> Result<()> {
        let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![
            ("loss".into(), self.points(|m| m.loss)),
            ("CE".into(), self.points(|m| m.ce)),
            ("KD (Σ α·L)".into(), self.points(|m| m.kd)),
        ];
        for (i, name) in self.teachers.iter().enumerate() {
            series.push((name.clone(), self.points(|m| m.teachers[i].0)));
        }
        if !eval.is_empty() {
            let held_out = |f: &dyn Fn(&EvalRow) -> f64| -> Vec<(f64, f64)> {
                eval.iter().map(|r| (r.step as f64, f(r))).collect()
            };
            series.push(("held-out CE".into(), held_out(&|r| r.ce)));
            for (i, name) in self.teachers.iter().enumerate() {
                series.push((format!("held-out {name}"), held_out(&|r| r.teachers[i])));
            }
        }
        let svg = line_chart(title, "step", &series);
        let tmp = path.with_extension("svg.tmp");
        std::fs::write(&tmp, svg)
            .and_then(|_| std::fs::rename(&tmp, path))
            .with_context(|| format!("{}: cannot write", path.display()))
    }

    fn points(&self, f: impl Fn(&StepMetrics) -> f64) -> Vec<(f64, f64)> {
        self.rows
            .iter()
            .map(|m| (m.step as f64, f(m)))
            .filter(|(_, y)| y.is_finite())
            .collect()
    }
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A self-contained SVG line chart of several series sharing the axes.
pub fn line_chart(title: &str, x_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let frame = Frame::fit(series);
    let (width, height, left, top) = (Frame::WIDTH, Frame::HEIGHT, Frame::LEFT, Frame::TOP);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="24" font-size="15">{}</text>"#,
        left,
        escape(title)
    );
    frame.grid(&mut svg);
    let (plot_w, plot_h) = frame.plot_size();
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/><text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
        left + plot_w / 2.0,
        height - 12.0,
        escape(x_label)
    );
    for (i, (name, points)) in series.iter().enumerate() {
        frame.curve(&mut svg, i, name, points);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A self-contained SVG chart of grouped bars: per group, one bar per series, labelled with its
/// value; the y axis runs from 0 to the largest value. Series are coloured alike across groups.
pub fn bar_chart(title: &str, y_label: &str, groups: &[(String, Vec<(String, f64)>)]) -> String {
    let bounds: Vec<(String, Vec<(f64, f64)>)> = vec![(
        String::new(),
        groups
            .iter()
            .flat_map(|(_, bars)| bars.iter().map(|b| (0.0, b.1)))
            .collect(),
    )];
    let frame = Frame::fit(&bounds);
    let (width, height, left, top) = (Frame::WIDTH, Frame::HEIGHT, Frame::LEFT, Frame::TOP);
    let (plot_w, plot_h) = frame.plot_size();
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="white"/><text x="{left}" y="24" font-size="15">{}</text><text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"##,
        escape(title),
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        escape(y_label)
    );
    frame.y_grid(&mut svg);
    let slot = plot_w / groups.len().max(1) as f64;
    let mut legend: Vec<String> = Vec::new();
    for (g, (group, bars)) in groups.iter().enumerate() {
        let bar_w = slot * 0.8 / bars.len().max(1) as f64;
        let x0 = left + slot * g as f64 + slot * 0.1;
        for (i, (name, value)) in bars.iter().enumerate() {
            let color_index = legend.iter().position(|n| n == name).unwrap_or_else(|| {
                legend.push(name.clone());
                legend.len() - 1
            });
            let (x, y) = (x0 + bar_w * i as f64, frame.sy(*value));
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                bar_w * 0.9,
                (frame.sy(0.0) - y).max(0.0),
                COLORS[color_index % COLORS.len()],
                x + bar_w * 0.45,
                y - 3.0,
                tick((value * 10.0).round() / 10.0)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            left + slot * (g as f64 + 0.5),
            top + plot_h + 18.0,
            escape(group)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##
    );
    for (i, name) in legend.iter().enumerate() {
        frame.legend(&mut svg, i, name);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The chart's geometry: the data's bounds and where they are drawn.
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    const WIDTH: f64 = 760.0;
    const HEIGHT: f64 = 420.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 170.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 50.0;

    /// Bounds around every point (the y axis starts at 0 or below); unit bounds for none.
    fn fit(series: &[(String, Vec<(f64, f64)>)]) -> Self {
        let all = series.iter().flat_map(|(_, p)| p.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in all {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 - x0 < 1e-12 {
            x1 = x0 + 1.0;
        }
        if y1 - y0 < 1e-12 {
            y1 = y0 + 1.0;
        }
        y0 = y0.min(0.0);
        Self { x0, x1, y0, y1 }
    }

    fn plot_size(&self) -> (f64, f64) {
        (
            Self::WIDTH - Self::LEFT - Self::RIGHT,
            Self::HEIGHT - Self::TOP - Self::BOTTOM,
        )
    }

    fn sx(&self, x: f64) -> f64 {
        Self::LEFT + (x - self.x0) / (self.x1 - self.x0) * self.plot_size().0
    }

    fn sy(&self, y: f64) -> f64 {
        Self::TOP + (1.0 - (y - self.y0) / (self.y1 - self.y0)) * self.plot_size().1
    }

    /// Six horizontal grid lines with their values, and six x ticks.
    fn grid(&self, svg: &mut String) {
        self.y_grid(svg);
        for i in 0..=5 {
            let x = self.x0 + i as f64 / 5.0 * (self.x1 - self.x0);
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                self.sx(x),
                Self::TOP + self.plot_size().1 + 18.0,
                tick(x)
            );
        }
    }

    /// Six horizontal grid lines with their values.
    fn y_grid(&self, svg: &mut String) {
        let (left, plot_w) = (Self::LEFT, self.plot_size().0);
        for i in 0..=5 {
            let y = self.y0 + i as f64 / 5.0 * (self.y1 - self.y0);
            let _ = writeln!(
                svg,
                r##"<line x1="{left}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + plot_w,
                left - 6.0,
                self.sy(y) + 4.0,
                tick(y),
                py = self.sy(y)
            );
        }
    }

    /// Series `i`: its polyline and its legend entry.
    fn curve(&self, svg: &mut String, i: usize, name: &str, points: &[(f64, f64)]) {
        let color = COLORS[i % COLORS.len()];
        if !points.is_empty() {
            let path: Vec<String> = points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", self.sx(x), self.sy(y)))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                path.join(" ")
            );
        }
        self.legend(svg, i, name);
    }

    /// Legend entry `i`, in series `i`'s colour.
    fn legend(&self, svg: &mut String, i: usize, name: &str) {
        let color = COLORS[i % COLORS.len()];
        let (width, right) = (Self::WIDTH, Self::RIGHT);
        let ly = Self::TOP + 14.0 + 18.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            width - right + 12.0,
            width - right + 32.0,
            width - right + 38.0,
            ly + 4.0,
            escape(name)
        );
    }
}

fn tick(v: f64) -> String {
    if v == 0.0 || (v.abs() >= 0.01 && v.abs() < 1e5) {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.2e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64) -> StepMetrics {
        StepMetrics {
            step,
            lr: 1e-4,
            loss: 3.0 - step as f64 * 0.1,
            ce: 1.5,
            kd: 0.7,
            teachers: vec![(0.7, 1.0)],
            grad_norm: 2.0,
            tokens: 100,
            tokens_per_s: 50.0,
            seconds: step as f64,
            memory_bytes: 1 << 30,
            on_policy: None,
        }
    }

    #[test]
    fn resuming_keeps_the_rows_before_the_checkpoint() {
        let dir = std::env::temp_dir().join(format!("xtoken-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.csv");
        let teachers = vec!["qwen".to_string()];
        let mut log = MetricsLog::open(&path, &teachers, false, 0).unwrap();
        for s in 0..5 {
            log.push(row(s)).unwrap();
        }
        drop(log);
        let log = MetricsLog::open(&path, &teachers, false, 2).unwrap();
        assert_eq!(log.rows(), &[row(0), row(1), row(2)]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4);
        assert!(text.starts_with("step,lr,loss,ce,kd,loss_qwen,alpha_qwen,grad_norm"));
        let eval = [EvalRow {
            step: 2,
            ce: 1.4,
            teachers: vec![0.6],
        }];
        log.write_svg(&dir.join("loss.svg"), "run", &eval).unwrap();
        let svg = std::fs::read_to_string(dir.join("loss.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("qwen"));
        assert!(svg.contains("held-out CE") && svg.contains("held-out qwen"));
        assert!(MetricsLog::open(&path, &["other".to_string()], false, 3).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// An on-policy run's rows carry what the student wrote, and read back as written; its
    /// file does not open as one without those columns.
    #[test]
    fn on_policy_columns_round_trip() {
        let dir = std::env::temp_dir().join(format!("xtoken-metrics-op-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.csv");
        let teachers = vec!["qwen".to_string()];
        let written = |step| StepMetrics {
            on_policy: Some(OnPolicyMetrics {
                share: 0.5,
                generated: 12.25,
                tokens_per_s: 300.5,
                seconds: 0.125,
            }),
            ..row(step)
        };
        let mut log = MetricsLog::open(&path, &teachers, true, 0).unwrap();
        for s in 1..4 {
            log.push(written(s)).unwrap();
        }
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().next().unwrap().ends_with(
            "on_policy_share,generated_tokens,generation_tokens_per_s,generation_seconds"
        ));
        let log = MetricsLog::open(&path, &teachers, true, 2).unwrap();
        assert_eq!(log.rows(), &[written(1), written(2)]);
        drop(log);
        assert!(MetricsLog::open(&path, &teachers, false, 2).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bar_heights_follow_the_values_and_each_series_has_one_colour() {
        let bars = |a: f64, b: f64| vec![("P-KL".to_string(), a), ("GOLD".to_string(), b)];
        let groups = [
            ("one".to_string(), bars(80.0, 20.0)),
            ("two".to_string(), bars(40.0, 0.0)),
        ];
        let svg = bar_chart("accuracy", "%", &groups);
        let heights: Vec<f64> = svg
            .lines()
            .filter(|l| l.starts_with("<rect x=") && l.contains("fill=\"#"))
            .map(|l| {
                let h = l.split("height=\"").nth(1).unwrap();
                h[..h.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert_eq!(heights.len(), 4, "{svg}");
        // The axis starts at 0: heights are proportional to the values.
        assert!((heights[0] / heights[1] - 4.0).abs() < 0.05, "{heights:?}");
        assert!((heights[0] / heights[2] - 2.0).abs() < 0.05, "{heights:?}");
        assert_eq!(heights[3], 0.0);
        // One legend entry per series, not per bar.
        assert_eq!(svg.matches(">P-KL</text>").count(), 1);
        assert_eq!(svg.matches(COLORS[0]).count(), 3);
        assert!(svg.contains(">one</text>") && svg.contains(">two</text>"));
    }
}
