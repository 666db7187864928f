//! The fio workloads of SUITE.md (S0, S1, S2 with one client, S4): fio runs them and its JSON
//! output is parsed. Without fio they are skipped with a note saying how to get it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use super::{Ctx, Figure, Scratch};

const NEED_FIO: &str = "fio is needed for S0, S1, S2 and S4: install it (apt-get install fio)";

fn have_fio() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs fio with `args` (job options, `--name=...` first) in a scratch directory of `dir`;
/// returns the parsed JSON of its report.
fn fio(ctx: &Ctx, dir: &Path, tag: &str, args: &[String]) -> anyhow::Result<Value> {
    let s = Scratch::new(dir, tag)?;
    ctx.step(format!("fio {}", args.join(" ")));
    let out = Command::new("fio")
        .arg("--output-format=json")
        .arg(format!("--directory={}", s.path.display()))
        .arg("--group_reporting")
        .args(args)
        .output()
        .context("cannot run fio")?;
    if !out.status.success() {
        bail!(
            "fio {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // fio may print notes before the JSON document.
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find('{').context("fio printed no JSON")?;
    let v: Value = serde_json::from_str(&text[at..]).context("parsing fio's JSON output")?;
    Ok(v)
}

/// The read or write side of the first (grouped) job.
fn side<'a>(v: &'a Value, rw: &str) -> anyhow::Result<&'a Value> {
    let dir = if rw.contains("read") { "read" } else { "write" };
    v["jobs"]
        .get(0)
        .map(|j| &j[dir])
        .context("fio's JSON has no job")
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

/// S0: latency of 4 KiB psync I/O on one large file and on many 1 MiB files.
pub fn s0(ctx: &Ctx, dir: &Path, notes: &mut Vec<String>) -> anyhow::Result<Vec<Figure>> {
    if !have_fio() {
        notes.push(NEED_FIO.into());
        return Ok(Vec::new());
    }
    let (big, jobs, runtime) = if ctx.quick {
        ("64m", 20, "3")
    } else {
        ("1g", 500, "30")
    };
    let mut figs = Vec::new();
    for (label, size, numjobs) in [
        (format!("{big}x1"), big, 1),
        (format!("1Mx{jobs}"), "1m", jobs),
    ] {
        for rw in ["randread", "randwrite", "read", "write"] {
            ctx.check()?;
            let v = fio(
                ctx,
                dir,
                "s0",
                &[
                    s("--name=s0"),
                    format!("--rw={rw}"),
                    s("--bs=4k"),
                    s("--ioengine=psync"),
                    format!("--size={size}"),
                    format!("--numjobs={numjobs}"),
                    s("--thread"),
                    format!("--runtime={runtime}"),
                ],
            )?;
            let sd = side(&v, rw)?;
            let clat = &sd["clat_ns"];
            figs.push(Figure::new(
                "S0",
                format!("{rw} {label} iops"),
                "IOPS",
                num(sd, "iops"),
            ));
            figs.push(Figure::new(
                "S0",
                format!("{rw} {label} mean lat"),
                "ms",
                num(clat, "mean") / 1e6,
            ));
            let p99 = clat["percentile"]["99.000000"].as_f64().unwrap_or(0.0);
            if p99 > 0.0 {
                figs.push(Figure::new(
                    "S0",
                    format!("{rw} {label} p99 lat"),
                    "ms",
                    p99 / 1e6,
                ));
            }
            figs.push(Figure::new(
                "S0",
                format!("{rw} {label} max lat"),
                "ms",
                num(clat, "max") / 1e6,
            ));
        }
    }
    Ok(figs)
}

/// S1: block size × queue depth sweep, the best figure per access pattern.
pub fn s1(ctx: &Ctx, dir: &Path, notes: &mut Vec<String>) -> anyhow::Result<Vec<Figure>> {
    if !have_fio() {
        notes.push(NEED_FIO.into());
        return Ok(Vec::new());
    }
    let (bss, depths, rws, size, runtime): (&[&str], &[u32], &[&str], &str, &str) = if ctx.quick {
        (
            &["4k", "64k"],
            &[1, 16],
            &["randread", "randwrite"],
            "64m",
            "2",
        )
    } else {
        (
            &["4k", "16k", "64k", "256k"],
            &[1, 4, 16, 64, 256],
            &["read", "write", "randread", "randwrite"],
            "1g",
            "10",
        )
    };
    let mut figs = Vec::new();
    let mut direct = 1;
    for rw in rws {
        let (mut best_iops, mut best_mbs) = (0f64, 0f64);
        for bs in bss {
            for depth in depths {
                ctx.check()?;
                let args = |direct: u32| {
                    vec![
                        s("--name=s1"),
                        format!("--rw={rw}"),
                        format!("--bs={bs}"),
                        format!("--iodepth={depth}"),
                        s("--ioengine=libaio"),
                        format!("--direct={direct}"),
                        format!("--size={size}"),
                        format!("--runtime={runtime}"),
                        s("--time_based"),
                    ]
                };
                let v = match fio(ctx, dir, "s1", &args(direct)) {
                    Ok(v) => v,
                    Err(e) if direct == 1 => {
                        notes.push(format!(
                            "S1 on {}: direct=1 refused ({}), measured with direct=0",
                            dir.display(),
                            e.to_string().lines().next().unwrap_or("")
                        ));
                        direct = 0;
                        fio(ctx, dir, "s1", &args(0))?
                    }
                    Err(e) => return Err(e),
                };
                let sd = side(&v, rw)?;
                best_iops = best_iops.max(num(sd, "iops"));
                best_mbs = best_mbs.max(num(sd, "bw_bytes") / 1e6);
            }
        }
        figs.push(Figure::new("S1", format!("{rw} best"), "IOPS", best_iops));
        figs.push(Figure::new("S1", format!("{rw} best bw"), "MB/s", best_mbs));
    }
    Ok(figs)
}

/// S4: the Filestore recipes.
pub fn s4(ctx: &Ctx, dir: &Path, notes: &mut Vec<String>) -> anyhow::Result<Vec<Figure>> {
    if !have_fio() {
        notes.push(NEED_FIO.into());
        return Ok(Vec::new());
    }
    let q = ctx.quick;
    let common = [
        s("--ioengine=sync"),
        s("--direct=0"),
        s("--fsync_on_close=1"),
        s("--end_fsync=1"),
    ];
    let jobs: [(&str, &str, Vec<String>); 4] = [
        (
            "seq write 1M",
            "write",
            vec![
                s("--bs=1m"),
                format!("--size={}", if q { "256m" } else { "2g" }),
                s("--numjobs=1"),
            ],
        ),
        (
            "rand write 4K sync",
            "randwrite",
            vec![
                s("--bs=4k"),
                format!("--size={}", if q { "8m" } else { "64m" }),
                s("--sync=1"),
                format!("--numjobs={}", if q { 4 } else { 16 }),
                format!("--runtime={}", if q { 3 } else { 30 }),
            ],
        ),
        (
            "seq read 1M",
            "read",
            vec![
                s("--bs=1m"),
                format!("--size={}", if q { "256m" } else { "2g" }),
                s("--invalidate=1"),
                s("--numjobs=1"),
            ],
        ),
        (
            "rand read 4K",
            "randread",
            vec![
                s("--bs=4k"),
                format!("--size={}", if q { "32m" } else { "256m" }),
                s("--sync=1"),
                s("--invalidate=1"),
                format!("--numjobs={}", if q { 4 } else { 8 }),
                s("--time_based"),
                format!("--runtime={}", if q { 3 } else { 30 }),
            ],
        ),
    ];
    let mut figs = Vec::new();
    for (label, rw, extra) in jobs {
        ctx.check()?;
        let mut args = vec![s("--name=s4"), format!("--rw={rw}")];
        args.extend(common.iter().cloned());
        args.extend(extra);
        let v = fio(ctx, dir, "s4", &args)?;
        let sd = side(&v, rw)?;
        if label.starts_with("seq") {
            figs.push(Figure::new("S4", label, "MB/s", num(sd, "bw_bytes") / 1e6));
        } else {
            figs.push(Figure::new("S4", label, "IOPS", num(sd, "iops")));
        }
    }
    Ok(figs)
}

/// S2 with one client per directory: write then read a large file; several mounts of one
/// volume make the scaling figure when given as separate runs.
pub fn s2(ctx: &Ctx, dir: &Path, notes: &mut Vec<String>) -> anyhow::Result<Vec<Figure>> {
    if !have_fio() {
        notes.push(NEED_FIO.into());
        return Ok(Vec::new());
    }
    notes.push(
        "S2 measures one client per directory here (N=1); scaling with N clients needs N \
         mounts of one volume"
            .into(),
    );
    let size = if ctx.quick { "256m" } else { "4g" };
    let mut figs = Vec::new();
    for rw in ["write", "read"] {
        ctx.check()?;
        let v = fio(
            ctx,
            dir,
            "s2",
            &[
                s("--name=s2"),
                format!("--rw={rw}"),
                s("--bs=1m"),
                format!("--size={size}"),
                s("--ioengine=sync"),
                s("--end_fsync=1"),
                s("--invalidate=1"),
            ],
        )?;
        figs.push(Figure::new(
            "S2",
            format!("{rw} 1 client"),
            "MB/s",
            num(side(&v, rw)?, "bw_bytes") / 1e6,
        ));
    }
    Ok(figs)
}
