//! `unkai bench`: the benchmark suite (docs/benchmarks.md) against any directories, side by side.

use std::path::PathBuf;
use std::time::Duration;

use crate::bench::{self, Options, Workload};

/// Run the benchmark workloads on directories and compare them.
///
/// Each workload runs on every directory given, interleaved run by run (A, B, A, B), and one
/// table shows each figure's median per directory and each directory's ratio to the first
/// (above 1 is better, whichever way the figure goes). Workloads (docs/benchmarks.md): m =
/// metadata and small files (create/stat/read/delete, ls -l of a large directory, tar -x,
/// git clone, rm -rf); s3 = the fileserver personality; s0 = fio latency of 4 KiB I/O; s1 =
/// fio block size × queue depth sweep; s4 = fio Filestore recipes; s2 = fio large file write
/// and read (one client per directory); s2m = small-file trees extracted and removed by N
/// mounts of one volume at once, each in its own directory and all in one (give the
/// mountpoints as one DIR, comma-separated; not part of all). The fio workloads need fio
/// installed. Everything is
/// made in `unkai-bench-<pid>-*` inside each directory and removed afterwards, also on
/// Ctrl-C. As root the page cache is dropped before cold phases.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai bench --quick /mnt/unkai /tmp                 # every workload, small sizes\n  \
unkai bench --workload m --workload s3 /mnt/unkai /srv/ext4\n  \
unkai bench --workload s4 --runs 5 --json out.json /mnt/unkai /mnt/other\n  \
unkai bench --quick --plot chart.svg /mnt/unkai /tmp               # also chart-s0-latency.svg\n  \
unkai bench --workload s2m /mnt/1 /mnt/1,/mnt/2 /mnt/1,/mnt/2,/mnt/3,/mnt/4   # 1, 2, 4 clients\n  \
unkai bench --from-json out.json --plot chart.png                  # redraw a saved run"
)]
pub struct Args {
    /// Directories to run in: the first is the reference of the ratios.
    #[arg(required_unless_present = "from_json", value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Run nothing: print (and with --plot, draw) a report saved earlier with --json.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["dirs", "quick", "runs", "json"])]
    from_json: Option<PathBuf>,
    /// Workloads to run (repeat or comma-separate): s0, s1, s2, s2m, s3, s4, m or all.
    #[arg(long, short, value_enum, value_delimiter = ',', default_value = "all")]
    workload: Vec<Workload>,
    /// Small sizes and short runs: the whole suite in a few minutes on 2 cores.
    #[arg(long)]
    quick: bool,
    /// Runs per directory [default: 1 with --quick, 3 otherwise]; medians are reported.
    #[arg(long)]
    runs: Option<usize>,
    /// Seconds of each timed phase (the fileserver loop), instead of the workload's own.
    #[arg(long, hide = true)]
    duration: Option<f64>,
    /// Also write every figure of every run to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the medians as bar charts into FILE.svg or FILE.png (and S0's latencies into
    /// FILE-s0-latency.svg or .png).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    plot: Option<PathBuf>,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(saved) = &a.from_json {
        if let Some(p) = &a.plot {
            bench::check_plot(p)?;
        }
        let report = bench::load(saved)?;
        print!("{}", bench::table(&report));
        if let Some(p) = &a.plot {
            bench::draw(&report, p)?;
        }
        return Ok(());
    }
    let runs = a.runs.unwrap_or(if a.quick { 1 } else { 3 });
    if runs == 0 {
        anyhow::bail!("invalid --runs 0: give at least 1");
    }
    let duration = match a.duration {
        Some(d) if !(d.is_finite() && d > 0.0) => {
            anyhow::bail!("invalid --duration {d}: give a number of seconds above 0")
        }
        d => d.map(Duration::from_secs_f64),
    };
    let opts = Options {
        dirs: a.dirs,
        workloads: a.workload,
        quick: a.quick,
        runs,
        duration,
        json: a.json,
        plot: a.plot,
        quiet: a.quiet,
    };
    bench::check_dirs(&opts.dirs)?;
    if let Some(p) = &opts.plot {
        bench::check_plot(p)?;
    }
    let stop = super::catch_interrupts(
        "unkai: interrupted: stopping and cleaning up (interrupt again to quit)",
        "unkai: interrupted again: unkai-bench-* directories may be left",
    )?;
    let report = bench::run(&opts, stop)?;
    print!("{}", bench::table(&report));
    Ok(())
}
