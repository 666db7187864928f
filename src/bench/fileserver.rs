//! Workload S3 of SUITE.md: filebench's "fileserver" personality, implemented here.
//!
//! Before: a tree of mean width 20 holding `files` files of mean size `mean` (sizes uniform in
//! [mean/2, 3·mean/2]; filebench draws them from a gamma distribution of the same mean). Then
//! `threads` threads loop for a fixed time over: create a new file, write it whole (1 MiB
//! I/O), close; open a random file, append `mean/8` (16 KiB for 128 KiB) on average, close;
//! open a random file, read it whole, close; delete a random file; stat a random file. Every
//! one of those 11 steps counts as one operation, as filebench counts flowops.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};

use super::{Ctx, Figure, Scratch};

const W: &str = "S3";
const IO: usize = 1 << 20;

struct Params {
    files: usize,
    mean: usize,
    threads: usize,
    duration: Duration,
}

fn params(ctx: &Ctx) -> Params {
    if ctx.quick {
        Params {
            files: 1000,
            mean: 32 << 10,
            threads: 8,
            duration: ctx.timed(Duration::from_secs(60), Duration::from_secs(5)),
        }
    } else {
        Params {
            files: 10_000,
            mean: 128 << 10,
            threads: 50,
            duration: ctx.timed(Duration::from_secs(60), Duration::from_secs(5)),
        }
    }
}

fn file_path(root: &Path, id: u64) -> PathBuf {
    root.join(format!("d{}", id % 20))
        .join(format!("e{}", (id / 20) % 20))
        .join(format!("f{id}"))
}

fn write_whole(path: &Path, size: usize, buf: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(IO);
        f.write_all(&buf[..n])?;
        left -= n;
    }
    Ok(())
}

pub fn run(ctx: &Ctx, dir: &Path) -> anyhow::Result<Vec<Figure>> {
    let p = params(ctx);
    let s = Scratch::new(dir, "s3")?;
    let root = s.path.clone();
    for a in 0..20 {
        for b in 0..20 {
            std::fs::create_dir_all(root.join(format!("d{a}")).join(format!("e{b}")))?;
        }
    }
    let buf = vec![0x5au8; IO];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    ctx.step(format!(
        "creating {} files of mean {} KiB",
        p.files,
        p.mean >> 10
    ));
    for id in 0..p.files as u64 {
        let size = rng.random_range(p.mean / 2..=p.mean * 3 / 2);
        write_whole(&file_path(&root, id), size, &buf)
            .with_context(|| format!("creating the file set in {}", root.display()))?;
        if id % 200 == 0 {
            ctx.check()?;
        }
    }
    let live = Mutex::new((0..p.files as u64).collect::<Vec<u64>>());
    let next = AtomicU64::new(p.files as u64);
    let ops = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let errors = Mutex::new(Vec::<String>::new());
    ctx.step(format!("{} threads for {:?}", p.threads, p.duration));
    let start = Instant::now();
    std::thread::scope(|sc| {
        for t in 0..p.threads {
            let (live, next, ops, bytes, errors, root, buf) =
                (&live, &next, &ops, &bytes, &errors, &root, &buf);
            let p = &p;
            sc.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + t as u64);
                let pick = |rng: &mut rand::rngs::StdRng| -> Option<u64> {
                    let l = live.lock().unwrap();
                    (!l.is_empty()).then(|| l[rng.random_range(0..l.len())])
                };
                let mut read_buf = Vec::new();
                while start.elapsed() < p.duration && !ctx.stopped() {
                    let res = (|| -> std::io::Result<()> {
                        // create, write whole, close
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        let size = rng.random_range(p.mean / 2..=p.mean * 3 / 2);
                        write_whole(&file_path(root, id), size, buf)?;
                        live.lock().unwrap().push(id);
                        ops.fetch_add(3, Ordering::Relaxed);
                        bytes.fetch_add(size as u64, Ordering::Relaxed);
                        // open, append, close
                        if let Some(id) = pick(&mut rng) {
                            let n = rng.random_range(1..=p.mean / 4);
                            match std::fs::OpenOptions::new()
                                .append(true)
                                .open(file_path(root, id))
                            {
                                Ok(mut f) => {
                                    f.write_all(&buf[..n])?;
                                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                                }
                                // deleted by another thread meanwhile
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                Err(e) => return Err(e),
                            }
                            ops.fetch_add(3, Ordering::Relaxed);
                        }
                        // open, read whole, close
                        if let Some(id) = pick(&mut rng) {
                            match std::fs::File::open(file_path(root, id)) {
                                Ok(mut f) => {
                                    read_buf.clear();
                                    let n = f.read_to_end(&mut read_buf)?;
                                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                Err(e) => return Err(e),
                            }
                            ops.fetch_add(3, Ordering::Relaxed);
                        }
                        // delete
                        let victim = {
                            let mut l = live.lock().unwrap();
                            (!l.is_empty()).then(|| {
                                let i = rng.random_range(0..l.len());
                                l.swap_remove(i)
                            })
                        };
                        if let Some(id) = victim {
                            std::fs::remove_file(file_path(root, id))?;
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        // stat
                        if let Some(id) = pick(&mut rng) {
                            match std::fs::metadata(file_path(root, id)) {
                                Ok(_) => {}
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                Err(e) => return Err(e),
                            }
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    })();
                    if let Err(e) = res {
                        errors.lock().unwrap().push(e.to_string());
                        break;
                    }
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    ctx.check()?;
    if let Some(e) = errors.into_inner().unwrap().first() {
        anyhow::bail!("fileserver in {}: {e}", root.display());
    }
    let ops = ops.load(Ordering::Relaxed) as f64;
    let mb = bytes.load(Ordering::Relaxed) as f64 / 1e6;
    ctx.step("removing the file set".into());
    Ok(vec![
        Figure::new(W, "fileserver ops", "ops/s", ops / secs),
        Figure::new(W, "fileserver throughput", "MB/s", mb / secs),
        Figure::new(
            W,
            "fileserver per op",
            "ms",
            secs * 1000.0 * p.threads as f64 / ops.max(1.0),
        ),
    ])
}
