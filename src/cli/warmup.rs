//! `unkai warmup`: reads files through their mount, in parallel, so that their blocks enter
//! the mount's caches (the disk cache keeps them across remounts), with a progress bar.
//!
//! Not for: caching itself (that is the mount's `data::cache`): this is an application
//! reading, and the pages it read are dropped from the kernel's page cache after.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;

use crate::fuse::mounts;

/// Fill the caches of a mount with files or whole trees, so that they read at local-disk
/// speed later (also after a remount, with a disk cache).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai warmup /mnt/unkai/datasets/train\n  unkai warmup --threads 32 /mnt/unkai/model.bin /mnt/unkai/checkpoints"
)]
pub struct Args {
    /// Files, or directories (read whole, recursively), on an unkai mount.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Files read at once.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.threads == 0 || a.threads > 1024 {
        bail!("invalid --threads {}: use 1 to 1024", a.threads);
    }
    let mut files = Vec::new();
    for p in &a.paths {
        let meta =
            std::fs::symlink_metadata(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        match mounts::containing(p) {
            Some(m) if mounts::is_unkai(&m) => {}
            Some(m) => bail!(
                "{} is not on an unkai mount (it is on {} {} at {}); give a path under an \
                 unkai mountpoint",
                p.display(),
                m.fstype,
                m.source,
                m.mountpoint.display()
            ),
            None => bail!("{} is not on an unkai mount", p.display()),
        }
        if meta.is_dir() {
            walk(p, &mut files);
        } else if meta.is_file() {
            files.push((p.clone(), meta.len()));
        }
    }
    let total: u64 = files.iter().map(|f| f.1).sum();
    let pb = if a.quiet {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::new(total);
        pb.set_style(
            ProgressStyle::with_template(
                "warming up {bar:40} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    };
    let n = files.len();
    let queue = Mutex::new(files);
    let failed: Mutex<Vec<String>> = Mutex::default();
    let read = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..a.threads.min(n.max(1)) {
            s.spawn(|| {
                let mut buf = vec![0u8; 4 << 20];
                loop {
                    let Some((path, _)) = queue.lock().pop() else {
                        return;
                    };
                    match read_through(&path, &mut buf, |n| {
                        pb.inc(n);
                        read.fetch_add(n, Ordering::Relaxed);
                    }) {
                        Ok(()) => {}
                        Err(e) => failed.lock().push(format!("{}: {e}", path.display())),
                    }
                }
            });
        }
    });
    pb.finish_and_clear();
    let bytes = read.load(Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    let failed = failed.into_inner();
    println!(
        "warmed up {} files, {bytes} bytes in {secs:.1} s ({:.0} MB/s)",
        n - failed.len(),
        bytes as f64 / secs.max(1e-3) / 1e6
    );
    if let Some(first) = failed.first() {
        bail!(
            "{} files could not be read (the first: {first}); the mount's log says why",
            failed.len()
        );
    }
    Ok(())
}

/// The regular files under `dir`, with their sizes (symbolic links are not followed).
fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            walk(&e.path(), out);
        } else if t.is_file() {
            out.push((e.path(), e.metadata().map_or(0, |m| m.len())));
        }
    }
}

/// Reads `path` to its end through the mount, reporting each read's bytes to `done`; its
/// pages are dropped from the kernel's page cache before and after (the mount's caches keep
/// the blocks).
fn read_through(path: &Path, buf: &mut [u8], done: impl Fn(u64)) -> std::io::Result<()> {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let mut f = File::open(path)?;
    // Pages the kernel has already would be read from it, never reaching the mount.
    let _ = posix_fadvise(f.as_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    let _ = posix_fadvise(f.as_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL);
    loop {
        match f.read(buf)? {
            0 => break,
            n => done(n as u64),
        }
    }
    let _ = posix_fadvise(f.as_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    Ok(())
}
