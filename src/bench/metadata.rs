//! Workload M of SUITE.md: metadata and small files. Create, stat, read and delete files in
//! one directory and in a tree; `ls -l` (readdir and lstat of every entry) of a large
//! directory, cold and warm; extracting a tarball of source-like files, `git clone` of a
//! local repository, and `rm -rf` of the tree.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use super::{Ctx, Figure, Scratch};

const W: &str = "M";

fn rate(n: usize, t: Instant) -> f64 {
    n as f64 / t.elapsed().as_secs_f64().max(1e-9)
}

/// A deterministic source-like file: lines of text, a few hundred bytes to a few KiB.
pub(super) fn source_file(i: usize) -> Vec<u8> {
    let lines = 10 + (i * 7919) % 120;
    let mut s = String::with_capacity(lines * 40);
    for l in 0..lines {
        s.push_str(&format!(
            "    let value_{l} = compute({i}, {l}) + {}; // line {l}\n",
            (i * 31 + l * 17) % 1000
        ));
    }
    s.into_bytes()
}

/// Writes `n` source-like files into `root` as a tree of width 20.
fn make_tree(root: &Path, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        let d = root
            .join(format!("d{}", i % 20))
            .join(format!("e{}", (i / 20) % 20));
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join(format!("f{i}.rs")), source_file(i))?;
    }
    Ok(())
}

fn run_cmd(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub fn run(ctx: &Ctx, dir: &Path) -> anyhow::Result<Vec<Figure>> {
    let n = if ctx.quick { 1000 } else { 10_000 };
    let big = if ctx.quick { 10_000 } else { 100_000 };
    let tar_files = if ctx.quick { 500 } else { 3000 };
    let mut figs = Vec::new();
    let data = vec![b'x'; 4096];

    // One directory: 4 KiB files.
    let s = Scratch::new(dir, "m")?;
    let flat = s.path.join("flat");
    std::fs::create_dir(&flat)?;
    ctx.step(format!("create {n} files of 4 KiB"));
    let t = Instant::now();
    for i in 0..n {
        std::fs::write(flat.join(format!("f{i}")), &data)?;
    }
    figs.push(Figure::new(W, "create 4KiB (one dir)", "ops/s", rate(n, t)));
    ctx.check()?;
    ctx.drop_caches();
    ctx.step(format!("stat {n} files"));
    let t = Instant::now();
    for i in 0..n {
        std::fs::symlink_metadata(flat.join(format!("f{i}")))?;
    }
    figs.push(Figure::new(W, "stat (one dir)", "ops/s", rate(n, t)));
    ctx.step(format!("read {n} files"));
    let t = Instant::now();
    for i in 0..n {
        let got = std::fs::read(flat.join(format!("f{i}")))?;
        if got.len() != data.len() {
            bail!(
                "f{i} reads back {} bytes instead of {}",
                got.len(),
                data.len()
            );
        }
    }
    figs.push(Figure::new(W, "read 4KiB (one dir)", "ops/s", rate(n, t)));
    ctx.check()?;
    ctx.step(format!("delete {n} files"));
    let t = Instant::now();
    for i in 0..n {
        std::fs::remove_file(flat.join(format!("f{i}")))?;
    }
    figs.push(Figure::new(W, "delete (one dir)", "ops/s", rate(n, t)));

    // A tree: empty files.
    ctx.check()?;
    let tree = s.path.join("tree");
    ctx.step(format!("create {n} empty files in a tree"));
    let t = Instant::now();
    for i in 0..n {
        let d = tree
            .join(format!("d{}", i % 20))
            .join(format!("e{}", (i / 20) % 20));
        if i < 400 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::File::create(d.join(format!("f{i}")))?;
    }
    figs.push(Figure::new(W, "create empty (tree)", "ops/s", rate(n, t)));
    ctx.step(format!("stat {n} files in a tree"));
    let t = Instant::now();
    for i in 0..n {
        let d = tree
            .join(format!("d{}", i % 20))
            .join(format!("e{}", (i / 20) % 20));
        std::fs::symlink_metadata(d.join(format!("f{i}")))?;
    }
    figs.push(Figure::new(W, "stat (tree)", "ops/s", rate(n, t)));
    ctx.step(format!("delete {n} files in a tree"));
    let t = Instant::now();
    for i in 0..n {
        let d = tree
            .join(format!("d{}", i % 20))
            .join(format!("e{}", (i / 20) % 20));
        std::fs::remove_file(d.join(format!("f{i}")))?;
    }
    figs.push(Figure::new(W, "delete (tree)", "ops/s", rate(n, t)));
    std::fs::remove_dir_all(&tree)?;

    // ls -l of a large directory.
    ctx.check()?;
    let large = s.path.join("large");
    std::fs::create_dir(&large)?;
    ctx.step(format!("create {big} entries for ls -l"));
    for i in 0..big {
        std::fs::File::create(large.join(format!("entry-{i:06}")))?;
        if i % 1000 == 0 {
            ctx.check()?;
        }
    }
    let ls = |label: &str| -> anyhow::Result<f64> {
        ctx.step(format!("ls -l of {big} entries ({label})"));
        let t = Instant::now();
        let mut count = 0;
        for e in std::fs::read_dir(&large)? {
            std::fs::symlink_metadata(e?.path())?;
            count += 1;
        }
        if count != big {
            bail!("ls -l listed {count} entries instead of {big}");
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let cold = ctx.drop_caches();
    let first = ls(if cold { "cold" } else { "first" })?;
    figs.push(Figure::new(
        W,
        format!("ls -l {big} ({})", if cold { "cold" } else { "first" }),
        "s",
        first,
    ));
    figs.push(Figure::new(
        W,
        format!("ls -l {big} (warm)"),
        "s",
        ls("warm")?,
    ));
    ctx.step("removing the large directory".into());
    std::fs::remove_dir_all(&large)?;

    // A source tree: tar extract, git clone, rm -rf. The tarball and the repository are made
    // outside the measured directory.
    ctx.check()?;
    let src = Scratch::new(&std::env::temp_dir(), "src")?;
    make_tree(&src.path.join("tree"), tar_files)?;
    let tarball = src.path.join("tree.tar");
    run_cmd(
        Command::new("tar")
            .arg("-cf")
            .arg(&tarball)
            .arg("-C")
            .arg(&src.path)
            .arg("tree"),
        "tar -c",
    )?;
    let into = s.path.join("untar");
    std::fs::create_dir(&into)?;
    ctx.step(format!("tar -x of {tar_files} files"));
    let t = Instant::now();
    run_cmd(
        Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&into),
        "tar -x",
    )?;
    figs.push(Figure::new(
        W,
        format!("tar -x {tar_files} files"),
        "s",
        t.elapsed().as_secs_f64(),
    ));
    ctx.step("rm -rf of the extracted tree".into());
    let t = Instant::now();
    run_cmd(Command::new("rm").arg("-rf").arg(&into), "rm -rf")?;
    figs.push(Figure::new(
        W,
        format!("rm -rf {tar_files} files"),
        "s",
        t.elapsed().as_secs_f64(),
    ));
    if Command::new("git").arg("--version").output().is_ok() {
        let repo = src.path.join("tree");
        let git = |args: &[&str]| {
            run_cmd(
                Command::new("git")
                    .arg("-C")
                    .arg(&repo)
                    .args(args)
                    .env("GIT_AUTHOR_NAME", "bench")
                    .env("GIT_AUTHOR_EMAIL", "bench@localhost")
                    .env("GIT_COMMITTER_NAME", "bench")
                    .env("GIT_COMMITTER_EMAIL", "bench@localhost"),
                "git",
            )
        };
        git(&["init", "-q"])?;
        git(&["add", "-A"])?;
        git(&["commit", "-q", "-m", "bench"])?;
        ctx.step(format!("git clone of {tar_files} files"));
        let dst = s.path.join("clone");
        let t = Instant::now();
        run_cmd(
            Command::new("git")
                .args(["clone", "-q", "--no-hardlinks"])
                .arg(&repo)
                .arg(&dst),
            "git clone",
        )?;
        figs.push(Figure::new(
            W,
            format!("git clone {tar_files} files"),
            "s",
            t.elapsed().as_secs_f64(),
        ));
    }
    Ok(figs)
}
