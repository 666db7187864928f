//! Workload S2m of SUITE.md (S2, metadata): N clients of one shared volume do small-file work
//! at once, each through its own mountpoint (its own unkai process). Each client extracts a
//! tree of source-like files (mkdir, then create, write and close each file, as `tar -x`
//! does) and removes it again (unlink, rmdir, as `rm -rf`): first each into a directory of
//! its own, then all into one shared directory (its subdirectories made by whichever client
//! comes first). Reports the aggregate files/s of each phase and the p99 latency of each
//! operation over all clients.
//!
//! The mountpoints come as one comma-separated DIR argument (`/mnt/a,/mnt/b`); giving the
//! same volume's mounts as 1, 2, 4 and 8 such groups shows the scaling side by side (the ratio
//! column is then the speed-up over the first group). Not for: several volumes (the
//! mountpoints must show one tree), nor the data path (that is S2's fio).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::metadata::source_file;
use super::{Ctx, Figure, Scratch};

const W: &str = "S2m";

/// How long a mount may take to show a directory another mount made.
const SHOW: Duration = Duration::from_secs(30);

/// The operations timed.
const OPS: [&str; 6] = ["mkdir", "create", "write", "close", "unlink", "rmdir"];

/// Latencies of each operation of [`OPS`], in microseconds.
#[derive(Default)]
struct Lat([Vec<u32>; 6]);

impl Lat {
    fn time<T>(&mut self, op: usize, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        let t = Instant::now();
        let r = f();
        self.0[op].push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        r
    }

    fn merge(&mut self, other: Lat) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            a.extend(b);
        }
    }

    /// The 99th percentile of operation `op`, in ms (None if it never ran).
    fn p99(&mut self, op: usize) -> Option<f64> {
        let v = &mut self.0[op];
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let k = (v.len() * 99).div_ceil(100).max(1) - 1;
        Some(v[k] as f64 / 1000.0)
    }
}

/// The directory of file `i` in a tree (20 × 20 directories, as S2's source tree).
fn subdir(i: usize) -> PathBuf {
    PathBuf::from(format!("d{}", i % 20)).join(format!("e{}", (i / 20) % 20))
}

/// Every directory of a tree of `n` files, parents first.
fn tree_dirs(n: usize) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for i in 0..n {
        let d = subdir(i);
        let top = d.parent().unwrap().to_path_buf();
        if !out.contains(&top) {
            out.push(top);
        }
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// Extracts `n` files named `f<i><suffix>.rs` into `root`, as tar does: a directory is made
/// when its first file comes (one another client made already is fine).
fn extract(root: &Path, n: usize, suffix: &str, lat: &mut Lat) -> anyhow::Result<()> {
    let mut made = std::collections::HashSet::new();
    for i in 0..n {
        let d = subdir(i);
        for dir in [d.parent().unwrap(), d.as_path()] {
            if made.insert(dir.to_path_buf()) {
                let p = root.join(dir);
                match lat.time(0, || std::fs::create_dir(&p)) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                        return Err(e).with_context(|| format!("mkdir {}", p.display()));
                    }
                    _ => {}
                }
            }
        }
        let p = root.join(&d).join(format!("f{i}{suffix}.rs"));
        let mut f = lat
            .time(1, || File::create(&p))
            .with_context(|| format!("create {}", p.display()))?;
        let data = source_file(i);
        lat.time(2, || f.write_all(&data))
            .with_context(|| format!("write {}", p.display()))?;
        lat.time(3, || {
            // close(2), whose answer drop would hide.
            let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
            // SAFETY: `fd` was just taken out of the File, which no longer closes it; it is
            // closed once, here.
            match unsafe { libc::close(fd) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        })
        .with_context(|| format!("close {}", p.display()))?;
    }
    Ok(())
}

/// Unlinks the files `extract` made.
fn unlink_files(root: &Path, n: usize, suffix: &str, lat: &mut Lat) -> anyhow::Result<()> {
    for i in 0..n {
        let p = root.join(subdir(i)).join(format!("f{i}{suffix}.rs"));
        lat.time(4, || std::fs::remove_file(&p))
            .with_context(|| format!("unlink {}", p.display()))?;
    }
    Ok(())
}

/// Removes the (empty) directories of a tree of `n` files, children first; with `shared`,
/// one another client removed already, or still fills, is passed by.
fn remove_dirs(root: &Path, n: usize, shared: bool, lat: &mut Lat) -> anyhow::Result<()> {
    for d in tree_dirs(n).iter().rev() {
        let p = root.join(d);
        match lat.time(5, || std::fs::remove_dir(&p)) {
            Ok(()) => {}
            Err(e)
                if shared && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTEMPTY)) => {}
            Err(e) => return Err(e).with_context(|| format!("rmdir {}", p.display())),
        }
    }
    Ok(())
}

/// Runs `work(client)` on every client at once (from one barrier); returns the time from the
/// start to the last one's end and the latencies of all.
fn phase(
    n: usize,
    work: impl Fn(usize, &mut Lat) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<(Duration, Lat)> {
    let barrier = Barrier::new(n);
    let results: Vec<anyhow::Result<(Instant, Instant, Lat)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|c| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    let mut lat = Lat::default();
                    barrier.wait();
                    let start = Instant::now();
                    work(c, &mut lat)?;
                    Ok((start, Instant::now(), lat))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a client thread panicked"))
            })
            .collect()
    });
    let mut all = Lat::default();
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for r in results {
        let (start, end, lat) = r?;
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        all.merge(lat);
    }
    Ok((last.unwrap() - first.unwrap(), all))
}

/// Waits until `p` shows on a mount as `made`, the same path made through another mount:
/// the same inode, not only the name (another client's changes reach this one within a
/// group's age, and a directory of that name removed just before may still show meanwhile).
fn shows(p: &Path, made: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(made)?.ino();
    let start = Instant::now();
    while std::fs::metadata(p).map_or(true, |m| m.ino() != ino) {
        if start.elapsed() > SHOW {
            bail!(
                "{} did not show within {SHOW:?} of being made through another mountpoint: \
                 give s2m mountpoints of one volume, comma-separated (e.g. /mnt/a,/mnt/b)",
                p.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The mountpoints of a DIR argument (comma-separated).
pub fn mountpoints(dir: &Path) -> Vec<PathBuf> {
    dir.to_string_lossy()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect()
}

fn figures(figs: &mut Vec<Figure>, what: &str, files: usize, took: Duration, lat: &mut Lat) {
    let rate = files as f64 / took.as_secs_f64().max(1e-9);
    figs.push(Figure::new(W, format!("{what}: files/s"), "files/s", rate));
    for (op, name) in OPS.iter().enumerate() {
        if let Some(p) = lat.p99(op) {
            figs.push(Figure::new(W, format!("{what}: p99 {name}"), "ms", p));
        }
    }
}

pub fn run(ctx: &Ctx, dir: &Path) -> anyhow::Result<Vec<Figure>> {
    let mounts = mountpoints(dir);
    let n = mounts.len();
    let files = if ctx.quick { 200 } else { 1000 };
    let scratch = Scratch::new(&mounts[0], "s2m")?;
    let name = scratch.path.file_name().unwrap().to_owned();
    let roots: Vec<PathBuf> = mounts.iter().map(|m| m.join(&name)).collect();
    for r in &roots[1..] {
        shows(r, &roots[0])?;
    }
    let mut figs = Vec::new();

    // Each client in a directory of its own.
    ctx.step(format!(
        "{n} client(s) extract {files} files each, own directories"
    ));
    let own = |c: usize| roots[c].join(format!("own{c}"));
    let (took, mut lat) = phase(n, |c, lat| {
        std::fs::create_dir(own(c))?;
        extract(&own(c), files, "", lat)
    })?;
    figures(&mut figs, "own dir, extract", n * files, took, &mut lat);
    ctx.check()?;
    ctx.step(format!("{n} client(s) remove their trees"));
    let (took, mut lat) = phase(n, |c, lat| {
        unlink_files(&own(c), files, "", lat)?;
        remove_dirs(&own(c), files, false, lat)?;
        Ok(std::fs::remove_dir(own(c))?)
    })?;
    figures(&mut figs, "own dir, remove", n * files, took, &mut lat);
    ctx.check()?;

    // All clients in one shared directory.
    std::fs::create_dir(roots[0].join("shared"))?;
    for r in &roots[1..] {
        shows(&r.join("shared"), &roots[0].join("shared"))?;
    }
    ctx.step(format!(
        "{n} client(s) extract {files} files each, one shared directory"
    ));
    let shared = |c: usize| roots[c].join("shared");
    let (took, mut lat) = phase(n, |c, lat| {
        extract(&shared(c), files, &format!("-c{c}"), lat)
    })?;
    figures(&mut figs, "shared dir, extract", n * files, took, &mut lat);
    ctx.check()?;
    ctx.step(format!(
        "{n} client(s) remove their files from the shared directory"
    ));
    let (took_files, mut lat) = phase(n, |c, lat| {
        unlink_files(&shared(c), files, &format!("-c{c}"), lat)
    })?;
    let (took_dirs, lat_dirs) = phase(n, |c, lat| remove_dirs(&shared(c), files, true, lat))?;
    lat.merge(lat_dirs);
    figures(
        &mut figs,
        "shared dir, remove",
        n * files,
        took_files + took_dirs,
        &mut lat,
    );
    Ok(figs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_value_below_which_99_percent_lie() {
        let mut l = Lat::default();
        l.0[0] = (1..=1000).rev().collect();
        assert_eq!(l.p99(0), Some(0.990));
        l.0[1] = vec![5000];
        assert_eq!(l.p99(1), Some(5.0));
        assert_eq!(l.p99(2), None);
    }

    #[test]
    fn a_tree_s_directories_come_parents_first() {
        let d = tree_dirs(30);
        assert_eq!(d.len(), 20 + 30);
        for (k, p) in d.iter().enumerate() {
            if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
                assert!(d[..k].contains(&parent.to_path_buf()), "{p:?}");
            }
        }
    }

    #[test]
    fn a_dir_argument_lists_mountpoints() {
        assert_eq!(
            mountpoints(Path::new("/mnt/a,/mnt/b")),
            vec![PathBuf::from("/mnt/a"), PathBuf::from("/mnt/b")]
        );
        assert_eq!(
            mountpoints(Path::new("/mnt/a")),
            vec![PathBuf::from("/mnt/a")]
        );
    }
}
