//! `unkai bench`: the benchmark suite of ../shared/bench/SUITE.md as a command, run against
//! any directories (an unkai mount, a local file system, another mount), interleaved run by
//! run, reported side by side with each directory's ratio to the first.
//!
//! Not for: measuring unkai's internals (that is `cargo bench`) or a bucket (`objbench`).
//! It only uses the directories it is given.

pub mod aio;
pub mod fileserver;
pub mod fio;
pub mod metadata;
pub mod plot;
pub mod scaling;
pub mod stress;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// The workloads, named as in SUITE.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    S0,
    S1,
    S2,
    /// S2 for metadata: N mounts of one volume extract and remove small-file trees at once,
    /// each in its own directory and all in one (`bench::scaling`); a DIR argument lists
    /// the mountpoints, comma-separated. Not part of `all`.
    S2m,
    S3,
    S4,
    M,
    /// The stress programs of issue 34: a file written through mmap and verified, and
    /// asynchronous O_DIRECT random writes verified (`bench::stress`).
    Stress,
    All,
}

impl Workload {
    pub fn expand(list: &[Workload]) -> Vec<Workload> {
        let mut out: Vec<Workload> = if list.contains(&Workload::All) {
            vec![
                Workload::M,
                Workload::S3,
                Workload::S0,
                Workload::Stress,
                Workload::S4,
                Workload::S1,
                Workload::S2,
            ]
        } else {
            list.to_vec()
        };
        out.dedup();
        out
    }
}

/// Whether a larger figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

/// One measured quantity of one run on one directory.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub workload: &'static str,
    pub name: String,
    pub unit: &'static str,
    pub better: Better,
    pub value: f64,
}

impl Figure {
    pub fn new(
        workload: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        value: f64,
    ) -> Self {
        let better = match unit {
            "s" | "ms" | "µs" => Better::Lower,
            _ => Better::Higher,
        };
        Figure {
            workload,
            name: name.into(),
            unit,
            better,
            value,
        }
    }
}

/// What the workloads share: sizes, where to work, and the stop flag (Ctrl-C).
pub struct Ctx {
    pub quick: bool,
    pub stop: Arc<AtomicBool>,
    /// Whether the page cache can be dropped (root).
    pub can_drop_caches: bool,
    /// Progress display of the current step.
    pub progress: indicatif::ProgressBar,
    /// Overrides the duration of timed phases (tests).
    pub duration: Option<Duration>,
}

impl Ctx {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if self.stopped() {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Drops the kernel's page, dentry and inode caches (cold reads); false if not allowed.
    pub fn drop_caches(&self) -> bool {
        if !self.can_drop_caches {
            return false;
        }
        nix::unistd::sync();
        std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
    }

    pub fn step(&self, msg: String) {
        self.progress.set_message(msg);
    }

    pub fn timed(&self, default: Duration, quick: Duration) -> Duration {
        self.duration
            .unwrap_or(if self.quick { quick } else { default })
    }
}

/// Options of a bench run.
pub struct Options {
    pub dirs: Vec<PathBuf>,
    pub workloads: Vec<Workload>,
    pub quick: bool,
    pub runs: usize,
    pub duration: Option<Duration>,
    pub json: Option<PathBuf>,
    /// Charts: FILE.svg (all figures) and FILE-s0-latency.svg (S0's latencies).
    pub plot: Option<PathBuf>,
    pub quiet: bool,
}

/// Results: per directory, per (workload, figure name), the values of each run.
#[derive(Serialize, Deserialize)]
pub struct Report {
    pub dirs: Vec<String>,
    pub runs: usize,
    pub quick: bool,
    pub notes: Vec<String>,
    pub figures: Vec<ReportRow>,
}

#[derive(Serialize, Deserialize)]
pub struct ReportRow {
    pub workload: String,
    pub name: String,
    pub unit: String,
    pub better: Better,
    /// Per directory: the value of each run.
    pub values: Vec<Vec<f64>>,
    /// Per directory: the median.
    pub median: Vec<Option<f64>>,
}

/// A directory's scratch area: `unkai-bench-<pid>` inside it, removed when dropped.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(dir: &Path, tag: &str) -> anyhow::Result<Scratch> {
        let path = dir.join(format!("unkai-bench-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("unkai bench: could not remove {}: {e}", self.path.display());
        }
    }
}

/// Where the S0 latency chart of `--plot FILE.svg` goes: FILE-s0-latency.svg (or .png).
pub fn s0_plot_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let ext = path.extension().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!("{stem}-s0-latency.{ext}"))
}

/// Checks that a `--plot` path can be drawn (SVG or PNG).
pub fn check_plot(path: &Path) -> anyhow::Result<()> {
    if !matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("svg" | "png")
    ) {
        bail!(
            "--plot {}: charts are drawn as SVG or PNG; give a path ending in .svg or .png",
            path.display()
        );
    }
    Ok(())
}

/// Writes a chart (SVG text) to `path`, rasterized first if the path ends in .png.
fn write_chart(path: &Path, svg: &str) -> anyhow::Result<()> {
    let bytes = if path.extension().and_then(|e| e.to_str()) == Some("png") {
        plot::png(svg)?
    } else {
        svg.as_bytes().to_vec()
    };
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Draws the report's charts into `path` (and the S0 latency chart beside it).
pub fn draw(report: &Report, path: &Path) -> anyhow::Result<()> {
    write_chart(path, &plot::svg(report))?;
    if let Some(lat) = plot::s0_latency_svg(report) {
        write_chart(&s0_plot_path(path), &lat)?;
    }
    Ok(())
}

/// Reads a report written by `--json`.
pub fn load(path: &Path) -> anyhow::Result<Report> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a report written by `unkai bench --json`",
            path.display()
        )
    })
}

/// Checks that each directory exists and is writable (each mountpoint of a comma-separated
/// list, for S2m).
pub fn check_dirs(dirs: &[PathBuf]) -> anyhow::Result<()> {
    if dirs.is_empty() {
        bail!("no directory given: e.g. `unkai bench --quick /mnt/unkai /tmp`");
    }
    for d in dirs.iter().flat_map(|d| scaling::mountpoints(d)) {
        let d = &d;
        let md = std::fs::metadata(d).map_err(|e| {
            anyhow::anyhow!(
                "directory {} cannot be used ({e}): give an existing directory, e.g. a mount",
                d.display()
            )
        })?;
        if !md.is_dir() {
            bail!(
                "{} is not a directory: give directories to run the workloads in",
                d.display()
            );
        }
        let probe = d.join(format!(".unkai-bench-probe-{}", std::process::id()));
        std::fs::write(&probe, b"x").map_err(|e| {
            anyhow::anyhow!(
                "directory {} is not writable ({e}): give a directory you can write to",
                d.display()
            )
        })?;
        let _ = std::fs::remove_file(&probe);
    }
    Ok(())
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Runs one workload once on one directory.
fn run_one(
    ctx: &Ctx,
    w: Workload,
    dir: &Path,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<Figure>> {
    // A list of mountpoints (for S2m): the other workloads run on the first.
    let first = scaling::mountpoints(dir).into_iter().next();
    let one = first.as_deref().unwrap_or(dir);
    let dir = if w == Workload::S2m { dir } else { one };
    match w {
        Workload::S2m => scaling::run(ctx, dir),
        Workload::M => metadata::run(ctx, dir),
        Workload::S3 => fileserver::run(ctx, dir),
        Workload::S0 => fio::s0(ctx, dir, notes),
        Workload::S1 => fio::s1(ctx, dir, notes),
        Workload::S4 => fio::s4(ctx, dir, notes),
        Workload::S2 => fio::s2(ctx, dir, notes),
        Workload::Stress => stress::run(ctx, dir),
        Workload::All => unreachable!("expanded"),
    }
}

/// A figure's identity in the report: (workload, name).
type RowKey = (&'static str, String);
/// Its unit, its direction, and per directory the value of each run.
type RowValues = (&'static str, Better, Vec<Vec<f64>>);

/// Runs the workloads on every directory, interleaved (A, B, A, B), and returns the report.
pub fn run(opts: &Options, stop: Arc<AtomicBool>) -> anyhow::Result<Report> {
    check_dirs(&opts.dirs)?;
    let workloads = Workload::expand(&opts.workloads);
    let progress = if opts.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed}] {prefix} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        pb.enable_steady_tick(Duration::from_millis(200));
        pb
    };
    let ctx = Ctx {
        quick: opts.quick,
        stop,
        can_drop_caches: nix::unistd::geteuid().is_root(),
        progress,
        duration: opts.duration,
    };
    let mut notes = Vec::new();
    if !ctx.can_drop_caches {
        notes.push("not root: page caches are not dropped, cold figures are warm".into());
    }
    // (workload, name) -> (unit, better, per-dir values), in first-seen order.
    let mut order: Vec<(&'static str, String)> = Vec::new();
    let mut rows: BTreeMap<RowKey, RowValues> = BTreeMap::new();
    for w in &workloads {
        for run in 0..opts.runs {
            for (i, dir) in opts.dirs.iter().enumerate() {
                ctx.check()?;
                ctx.progress.set_prefix(format!(
                    "{w:?} run {}/{} on {}",
                    run + 1,
                    opts.runs,
                    dir.display()
                ));
                let figs = match run_one(&ctx, *w, dir, &mut notes) {
                    Ok(figs) => figs,
                    Err(e) if ctx.stopped() => {
                        return Err(e.context(format!("{w:?} on {}", dir.display())));
                    }
                    // One file system failing a workload (a peer's "database is locked", a
                    // full disk) leaves its figures blank; the comparison goes on.
                    Err(e) => {
                        let msg = format!("{w:?} on {} failed: {e:#}", dir.display());
                        ctx.progress.suspend(|| eprintln!("unkai bench: {msg}"));
                        notes.push(msg);
                        Vec::new()
                    }
                };
                for f in figs {
                    let key = (f.workload, f.name.clone());
                    let e = rows.entry(key.clone()).or_insert_with(|| {
                        order.push(key.clone());
                        (f.unit, f.better, vec![Vec::new(); opts.dirs.len()])
                    });
                    e.2[i].push(f.value);
                }
            }
        }
    }
    ctx.progress.finish_and_clear();
    notes.dedup();
    let figures = order
        .into_iter()
        .map(|key| {
            let (unit, better, values) = rows.remove(&key).expect("row");
            let median = values.iter().map(|v| median(v)).collect();
            ReportRow {
                workload: key.0.to_string(),
                name: key.1,
                unit: unit.to_string(),
                better,
                values,
                median,
            }
        })
        .collect();
    let report = Report {
        dirs: opts.dirs.iter().map(|d| d.display().to_string()).collect(),
        runs: opts.runs,
        quick: opts.quick,
        notes,
        figures,
    };
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &opts.plot {
        draw(&report, path)?;
    }
    Ok(report)
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// The table: one row per figure, one column per directory (median), then each directory's
/// ratio to the first (above 1 = better than the first, whichever way the figure is better).
pub fn table(r: &Report) -> String {
    let mut head = vec!["workload".to_string(), "figure".into(), "unit".into()];
    for (i, d) in r.dirs.iter().enumerate() {
        head.push(format!("[{}] {}", i + 1, d));
    }
    for i in 1..r.dirs.len() {
        head.push(format!("[{}]/[1]", i + 1));
    }
    let mut lines = vec![head];
    for row in &r.figures {
        let mut l = vec![
            row.workload.to_string(),
            row.name.clone(),
            row.unit.to_string(),
        ];
        for m in &row.median {
            l.push(m.map(fmt_value).unwrap_or_else(|| "-".into()));
        }
        for m in row.median.iter().skip(1) {
            let ratio = match (row.median[0], m) {
                (Some(a), Some(b)) if a > 0.0 && *b > 0.0 => Some(match row.better {
                    Better::Higher => b / a,
                    Better::Lower => a / b,
                }),
                _ => None,
            };
            l.push(
                ratio
                    .map(|x| format!("{x:.2}"))
                    .unwrap_or_else(|| "-".into()),
            );
        }
        lines.push(l);
    }
    let cols = lines[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (n, l) in lines.iter().enumerate() {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if c < 3 {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (cols - 1)));
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "{} run(s) per directory, medians; ratios are [n]/[1] made so that above 1 is better.\n",
        r.runs
    ));
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}
