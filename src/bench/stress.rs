//! The stress programs of issue 34 as a workload (`--workload stress`): each writes and then
//! verifies every byte, and is timed whole.
//!
//! - *mmap*: a file written through a shared mapping in 8 KiB blocks, each block read back
//!   with `pread` once written, the whole file verified after each loop (10 MiB, 10 loops);
//!   and the same with `msync(MS_SYNC)` of each block before it is read back.
//! - *aio*: rounds of up to 64 asynchronous `O_DIRECT` writes (`io_submit`) of up to 32,768
//!   pages each, at random places that do not overlap, all in flight at once, then read back
//!   with `O_DIRECT` reads and verified.
//!
//! A wrong byte fails the workload (with where it was), so the figures are only of runs that
//! stored everything right. Not for: timing single requests (S0, S1 do).

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use rand::{Rng, SeedableRng};

use super::aio::{self, Aligned};
use super::{Ctx, Figure, Scratch};

const PAGE: usize = 4096;

/// Sizes of the two programs.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// The mmap program's file, its block, and how many times it is written.
    pub mmap_file: usize,
    pub mmap_block: usize,
    pub mmap_loops: usize,
    /// Blocks of the synced variant (each one msync'd: a flush each).
    pub msync_blocks: usize,
    /// Rounds of the aio program, writes in flight at most, and pages per write at most.
    pub aio_rounds: usize,
    pub aio_writes: usize,
    pub aio_pages: usize,
}

impl Sizes {
    /// The sizes (the aio rounds are 3; the synced mmap variant writes 1,280 blocks,
    /// one loop's worth).
    pub fn full() -> Sizes {
        Sizes {
            mmap_file: 10 << 20,
            mmap_block: 8 << 10,
            mmap_loops: 10,
            msync_blocks: 1280,
            aio_rounds: 3,
            aio_writes: 64,
            aio_pages: 32 << 10,
        }
    }

    /// Small enough for `--quick` and tests.
    pub fn quick() -> Sizes {
        Sizes {
            mmap_file: 2 << 20,
            mmap_block: 8 << 10,
            mmap_loops: 3,
            msync_blocks: 64,
            aio_rounds: 3,
            aio_writes: 64,
            aio_pages: 256,
        }
    }
}

pub fn run(ctx: &Ctx, dir: &Path) -> anyhow::Result<Vec<Figure>> {
    let sizes = if ctx.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    run_sized(ctx, dir, sizes)
}

pub fn run_sized(ctx: &Ctx, dir: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let s = Scratch::new(dir, "stress")?;
    let mut figs = Vec::new();
    ctx.step("stress: mmap, 8 KiB blocks".into());
    let t = mmap(ctx, &s.path.join("mmap"), sizes, false)?;
    figs.push(Figure::new("stress", "mmap write+verify", "s", t));
    ctx.check()?;
    ctx.step("stress: mmap, 8 KiB blocks, msync each".into());
    let t = mmap(ctx, &s.path.join("msync"), sizes, true)?;
    figs.push(Figure::new(
        "stress",
        "mmap msync each block",
        "ms",
        t * 1000.0 / sizes.msync_blocks as f64,
    ));
    ctx.check()?;
    ctx.step("stress: aio O_DIRECT random writes".into());
    let (t, bytes) = aio_rounds(ctx, &s.path.join("aio"), sizes)?;
    figs.push(Figure::new("stress", "aio write+verify", "s", t));
    figs.push(Figure::new(
        "stress",
        "aio write+verify rate",
        "MB/s",
        bytes as f64 / t / 1e6,
    ));
    Ok(figs)
}

/// The byte at `pos` of loop `lp`'s contents.
fn byte(lp: usize, pos: usize) -> u8 {
    (pos as u8) ^ ((pos / 4096) as u8).rotate_left(3) ^ (lp as u8).wrapping_mul(37)
}

/// A shared writable mapping of `len` bytes of `f` at `off`, unmapped on drop.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(f: &std::fs::File, off: usize, len: usize) -> anyhow::Result<Map> {
        // SAFETY: a new mapping of an open file; its address is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        Ok(Map {
            ptr: ptr as *mut u8,
            len,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, alive while self is, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// msync(MS_SYNC) of `[off, off + len)`.
    fn sync(&self, off: usize, len: usize) -> anyhow::Result<()> {
        // SAFETY: the range is inside the mapping (page-aligned `off`).
        if unsafe { libc::msync(self.ptr.add(off) as *mut libc::c_void, len, libc::MS_SYNC) } != 0 {
            bail!("msync: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The mmap program: returns its seconds. With `sync`, one loop of `msync_blocks` blocks,
/// each msync'd.
fn mmap(ctx: &Ctx, path: &Path, sizes: Sizes, sync: bool) -> anyhow::Result<f64> {
    let bs = sizes.mmap_block;
    let (size, loops) = match sync {
        true => (sizes.msync_blocks * bs, 1),
        false => (sizes.mmap_file, sizes.mmap_loops),
    };
    let start = Instant::now();
    let mut got = vec![0u8; bs];
    for lp in 0..loops {
        ctx.check()?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        f.set_len(size as u64)?;
        let mut m = Map::new(&f, 0, size)?;
        for b in 0..size / bs {
            let blk = &mut m.bytes()[b * bs..(b + 1) * bs];
            for (i, x) in blk.iter_mut().enumerate() {
                *x = byte(lp, b * bs + i);
            }
            if sync {
                m.sync(b * bs, bs)?;
            }
            f.read_exact_at(&mut got, (b * bs) as u64)?;
            check(&got, lp, b * bs, path)?;
        }
        drop(m);
        drop(f);
        let all = std::fs::read(path)?;
        if all.len() != size {
            bail!("{}: {} bytes, not {size}", path.display(), all.len());
        }
        check(&all, lp, 0, path)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Fails unless `got`, read at `at`, is loop `lp`'s.
fn check(got: &[u8], lp: usize, at: usize, path: &Path) -> anyhow::Result<()> {
    match got
        .iter()
        .enumerate()
        .find(|&(i, &x)| x != byte(lp, at + i))
    {
        Some((i, x)) => bail!(
            "{}: byte {} is {x:#04x}, not {:#04x}: the data is wrong",
            path.display(),
            at + i,
            byte(lp, at + i)
        ),
        None => Ok(()),
    }
}

/// The aio program: returns its seconds and the bytes it wrote and read back.
fn aio_rounds(ctx: &Ctx, path: &Path, sizes: Sizes) -> anyhow::Result<(f64, u64)> {
    let slot = sizes.aio_pages * PAGE;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("cannot open {} with O_DIRECT", path.display()))?;
    // The whole file exists first, so the writes do not extend it (those the kernel makes
    // synchronous).
    f.set_len((slot * sizes.aio_writes) as u64)?;
    let io = aio::Context::new(sizes.aio_writes as u32).context("io_setup")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(34);
    let start = Instant::now();
    let mut moved = 0u64;
    for round in 0..sizes.aio_rounds {
        ctx.check()?;
        // Up to aio_writes writes, each in a slot of its own (no overlap), of 1 to aio_pages
        // pages at a random page of it.
        let n = rng.random_range(1..=sizes.aio_writes);
        let mut writes = Vec::with_capacity(n);
        for i in 0..n {
            let pages = rng.random_range(1..=sizes.aio_pages);
            let first = rng.random_range(0..=sizes.aio_pages - pages);
            let off = i * slot + first * PAGE;
            let mut buf = Aligned::new(pages * PAGE);
            for (j, x) in buf.as_mut_slice().iter_mut().enumerate() {
                *x = byte(round, off + j);
            }
            writes.push((off, buf));
        }
        let mut reqs: Vec<libc::iocb> = writes
            .iter_mut()
            .enumerate()
            .map(|(i, (off, buf))| {
                let len = buf.as_mut_slice().len();
                aio::request(
                    aio::PWRITE,
                    f.as_raw_fd(),
                    buf.as_mut_ptr(),
                    len,
                    *off as u64,
                    i as u64,
                )
            })
            .collect();
        submit_all(&io, &mut reqs)?;
        // Read back, each into its own buffer, all in flight too.
        let mut reads: Vec<Aligned> = writes
            .iter_mut()
            .map(|(_, b)| Aligned::new(b.as_mut_slice().len()))
            .collect();
        let mut reqs: Vec<libc::iocb> = writes
            .iter()
            .zip(reads.iter_mut())
            .enumerate()
            .map(|(i, ((off, _), buf))| {
                let len = buf.as_mut_slice().len();
                aio::request(
                    aio::PREAD,
                    f.as_raw_fd(),
                    buf.as_mut_ptr(),
                    len,
                    *off as u64,
                    i as u64,
                )
            })
            .collect();
        submit_all(&io, &mut reqs)?;
        for ((off, _), got) in writes.iter().zip(reads.iter_mut()) {
            let got = got.as_mut_slice();
            check(got, round, *off, path)?;
            moved += 2 * got.len() as u64;
        }
    }
    Ok((start.elapsed().as_secs_f64(), moved))
}

/// Submits `reqs` (all at once, as far as the kernel takes them) and waits for each; fails
/// on any that did not move all its bytes.
fn submit_all(io: &aio::Context, reqs: &mut [libc::iocb]) -> anyhow::Result<()> {
    let mut sent = 0;
    while sent < reqs.len() {
        // SAFETY: the callers' buffers outlive this call, which reaps every request.
        sent += unsafe { io.submit(&mut reqs[sent..]) }.context("io_submit")?;
    }
    let mut left = reqs.len();
    while left > 0 {
        for ev in io.reap(1, left).context("io_getevents")? {
            left -= 1;
            let want = reqs[ev.data as usize].aio_nbytes as i64;
            if ev.res != want {
                bail!(
                    "an asynchronous O_DIRECT request of {want} bytes at {} returned {}",
                    reqs[ev.data as usize].aio_offset,
                    ev.res
                );
            }
        }
    }
    Ok(())
}
