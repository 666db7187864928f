//! fsx-style data integrity: a seeded random sequence of operations on one file in a mount,
//! checked after every step against an in-memory model of its bytes.
//!
//! Operations: pwrite (inside, across block boundaries, far beyond EOF making holes, now and
//! then at large offsets across the 64 MiB chunk boundary), pread, ftruncate (grow and
//! shrink), fallocate (0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE, ZERO_RANGE with and without
//! KEEP_SIZE), mmap reads and writes (MAP_SHARED, with msync(MS_SYNC) or left to writeback),
//! copy_file_range (inside the file, and from a helper file), O_DIRECT reads, close/reopen
//! (sometimes O_TRUNC), fsync/fdatasync, and unmount/remount in the middle of some runs.
//!
//! After every operation the size is checked twice: as the kernel sees it (fstat) and as unkai
//! reports it (statx with AT_STATX_FORCE_SYNC, a FUSE getattr). Reads are compared with the
//! model (a third of them after dropping the file's page cache so they reach unkai); the whole
//! content (and the helper's) is compared every `verify_every` operations with the page cache
//! dropped (POSIX_FADV_DONTNEED), after every remount, and at the end after a last remount.
//!
//! Reproduce a failure with the seed it prints: `FSX_SEED=<seed> FSX_OPS=<n> cargo test --test
//! fsx_model <test name>` runs that seed alone (the remount points scale with FSX_OPS, so pass
//! the count printed too). FSX_OPS alone changes the count of every run; FSX_KEEP_LOG=1 copies
//! the mount log of a failed run to /tmp. `UNKAI_LOG=trace` is passed on to the mounts.

use crate::common::rng::SplitMix;
use crate::common::*;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::time::Instant;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Size of a chunk of unkai's metadata (slices never cross one).
const CHUNK: u64 = 64 * MIB;
const PAGE: u64 = 4096;
/// Operations kept for the failure report.
const HISTORY: usize = 24;

// ---------------------------------------------------------------------------------------------
// PRNG: splitmix64 (`common::rng::SplitMix`), salted with this test's constant.

const RNG_SALT: u64 = 0x5eed_f5c0_ffee_1234;

/// Random bytes for writes: slices of one pool filled once (generating bytes one by one is
/// slow in debug builds), at random offsets so no two writes look alike.
struct Pool(Vec<u8>);

const POOL: usize = 8 << 20;

impl Pool {
    fn new(seed: u64) -> Pool {
        Pool(SplitMix::salted(seed ^ 0x9001, RNG_SALT).fill(POOL))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let n = if let Some(h) = v.strip_prefix("0x") {
        u64::from_str_radix(h, 16)
    } else {
        v.parse()
    };
    Some(n.unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

// ---------------------------------------------------------------------------------------------
// Configuration of a run.

#[derive(Clone)]
struct Cfg {
    name: &'static str,
    seed: u64,
    ops: usize,
    /// Unmount and remount after these fractions of the run (e.g. 0.5).
    remounts: Vec<f64>,
    /// `unkai format` flags.
    format: Vec<&'static str>,
    /// `unkai mount` flags.
    mount: Vec<&'static str>,
    /// Block size of the volume (for aiming writes at block boundaries).
    block: u64,
    /// Soft limit of the file size; only "large" writes go past it.
    max_size: u64,
    /// Per mille of writes aimed at large offsets (across the 64 MiB chunk boundary).
    large_permille: u64,
    /// Full content check every so many operations.
    verify_every: usize,
}

impl Cfg {
    fn new(name: &'static str, ops: usize) -> Cfg {
        Cfg {
            name,
            seed: 0,
            ops: env_u64("FSX_OPS").map(|n| n as usize).unwrap_or(ops),
            remounts: Vec::new(),
            format: Vec::new(),
            mount: Vec::new(),
            block: 4 * MIB,
            max_size: 6 * MIB,
            large_permille: 2,
            verify_every: 200,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Syscall helpers.

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn errname(e: &std::io::Error) -> String {
    format!("{e} (errno {})", e.raw_os_error().unwrap_or(0))
}

fn copy_file_range(
    src: &File,
    src_off: u64,
    dst: &File,
    dst_off: u64,
    len: u64,
) -> std::io::Result<u64> {
    let mut si = src_off as i64;
    let mut di = dst_off as i64;
    let r = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut si,
            dst.as_raw_fd(),
            &mut di,
            len as usize,
            0,
        )
    };
    if r < 0 { Err(last_err()) } else { Ok(r as u64) }
}

/// The size as the file system reports it now (a FUSE GETATTR, not the kernel's cache).
fn server_size(f: &File) -> std::io::Result<u64> {
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_SIZE,
            &mut stx,
        )
    };
    if r == 0 {
        Ok(stx.stx_size)
    } else {
        Err(last_err())
    }
}

/// Reads `len` bytes at `off` (fewer at EOF), looping over short reads.
fn read_full(f: &File, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// A MAP_SHARED read-write mapping of `[off, off+len)` (page-aligned internally).
struct Map {
    ptr: *mut libc::c_void,
    maplen: usize,
    skip: usize,
    len: usize,
}

impl Map {
    fn new(f: &File, off: u64, len: usize) -> std::io::Result<Map> {
        let start = off & !(PAGE - 1);
        let skip = (off - start) as usize;
        let maplen = skip + len;
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                maplen,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                start as i64,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_err());
        }
        Ok(Map {
            ptr,
            maplen,
            skip,
            len,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut((self.ptr as *mut u8).add(self.skip), self.len) }
    }

    fn sync(&self) -> std::io::Result<()> {
        if unsafe { libc::msync(self.ptr, self.maplen, libc::MS_SYNC) } == 0 {
            Ok(())
        } else {
            Err(last_err())
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        unsafe {
            libc::munmap(self.ptr, self.maplen);
        }
    }
}

/// The last lines of the volume's mount log (all mounts of the run), for failure reports.
fn log_tail(vol: &Volume) -> String {
    let log = std::fs::read_to_string(vol.dir.path().join("mount.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(30);
    let mut s = String::from("mount log (last lines):\n");
    for l in &lines[from..] {
        s += "  | ";
        s += l;
        s += "\n";
    }
    s
}

/// Where two byte strings first differ, described for a failure report.
fn describe_diff(off: u64, want: &[u8], got: &[u8]) -> Option<String> {
    if want == got {
        return None;
    }
    let n = want.len().min(got.len());
    let first = (0..n).find(|&i| want[i] != got[i]);
    if first.is_none() && want.len() == got.len() {
        return None;
    }
    let mut s = String::new();
    if want.len() != got.len() {
        s += &format!(
            "length differs: expected {} bytes, got {}; ",
            want.len(),
            got.len()
        );
    }
    if let Some(i) = first {
        let last = (i..n).rev().find(|&j| want[j] != got[j]).unwrap();
        let zeros = got[i..=last].iter().all(|&b| b == 0);
        let show = |v: &[u8]| {
            v[i..(i + 16).min(v.len())]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        s += &format!(
            "first difference at file offset {} (0x{:x}), last at {} (0x{:x}){}; expected [{}] got [{}]",
            off + i as u64,
            off + i as u64,
            off + last as u64,
            off + last as u64,
            if zeros {
                ", observed bytes all zero"
            } else {
                ""
            },
            show(want),
            show(got)
        );
    }
    Some(s)
}

// ---------------------------------------------------------------------------------------------
// The run.

type Res = Result<(), String>;

#[derive(Default, Debug)]
struct Stats {
    write: u64,
    read: u64,
    dread: u64,
    truncate: u64,
    falloc: [u64; 5],
    mmap_read: u64,
    mmap_write: u64,
    copy_self: u64,
    copy_helper: u64,
    reopen: u64,
    fsync: u64,
    helper: u64,
    verify: u64,
    remount: u64,
    large: u64,
    max_size: u64,
}

const FALLOC_MODES: [(i32, &str); 5] = [
    (0, "0"),
    (libc::FALLOC_FL_KEEP_SIZE, "KEEP_SIZE"),
    (
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        "PUNCH_HOLE|KEEP_SIZE",
    ),
    (libc::FALLOC_FL_ZERO_RANGE, "ZERO_RANGE"),
    (
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        "ZERO_RANGE|KEEP_SIZE",
    ),
];

struct Fsx<'v> {
    // Fields drop in order: descriptors before the mount.
    file: Option<File>,
    direct: Option<File>,
    helper: Option<File>,
    mount: Option<Mount>,
    vol: &'v Volume,
    cfg: Cfg,
    rng: SplitMix,
    pool: Pool,
    model: Vec<u8>,
    hmodel: Vec<u8>,
    history: VecDeque<String>,
    op: usize,
    stats: Stats,
    zero_range: bool,
}

impl<'v> Fsx<'v> {
    fn f(&self) -> &File {
        self.file.as_ref().unwrap()
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    /// `len` (at most 3 MiB) random bytes.
    fn data(&mut self, len: u64) -> Vec<u8> {
        let at = self.rng.below((POOL - len as usize) as u64) as usize;
        self.pool.0[at..at + len as usize].to_vec()
    }

    fn note(&mut self, s: String) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(format!("#{} {}", self.op, s));
    }

    fn fail(&self, what: String) -> ! {
        let mut msg = format!(
            "\nFSX FAILURE in {} (seed {} = 0x{:x}, op #{} of {}): {what}\n\
             model size {}, helper size {}\n\
             reproduce: FSX_SEED={} FSX_OPS={} cargo test --test fsx_model {}\n\
             last operations (oldest first):\n",
            self.cfg.name,
            self.cfg.seed,
            self.cfg.seed,
            self.op,
            self.cfg.ops,
            self.model.len(),
            self.hmodel.len(),
            self.cfg.seed,
            self.cfg.ops,
            self.cfg.name,
        );
        for h in &self.history {
            msg += "  ";
            msg += h;
            msg += "\n";
        }
        msg += &log_tail(self.vol);
        if std::env::var_os("FSX_KEEP_LOG").is_some() {
            let to = format!("/tmp/{}-{}.mount.log", self.cfg.name, self.cfg.seed);
            let _ = std::fs::copy(self.vol.dir.path().join("mount.log"), &to);
            msg += &format!("mount log copied to {to}\n");
        }
        panic!("{msg}");
    }

    fn open_main(&self, trunc: bool) -> File {
        let mp = self.mount.as_ref().unwrap();
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(trunc)
            .open(mp.p("fsx"))
            .unwrap_or_else(|e| self.fail(format!("open fsx: {}", errname(&e))))
    }

    fn open_all(&mut self) {
        self.file = Some(self.open_main(false));
        let mp = self.mount.as_ref().unwrap();
        self.helper = Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(mp.p("helper"))
                .unwrap_or_else(|e| self.fail(format!("open helper: {}", errname(&e)))),
        );
    }

    fn close_all(&mut self) {
        self.file = None;
        self.direct = None;
        self.helper = None;
    }

    fn check_size(&self) -> Res {
        let want = self.size();
        let k = self
            .f()
            .metadata()
            .map_err(|e| format!("fstat: {}", errname(&e)))?
            .len();
        if k != want {
            return Err(format!("fstat size {k}, expected {want}"));
        }
        let s = server_size(self.f()).map_err(|e| format!("statx: {}", errname(&e)))?;
        if s != want {
            return Err(format!(
                "size reported by unkai (statx FORCE_SYNC) {s}, expected {want}"
            ));
        }
        Ok(())
    }

    /// Compares `got` (read at `off`) with the model; on a difference, reads again without the
    /// page cache to tell a stale cache from wrong data in unkai.
    fn compare(&self, what: &str, f: &File, model: &[u8], off: u64, len: u64, got: &[u8]) -> Res {
        let size = model.len() as u64;
        let want = &model[off.min(size) as usize..(off + len).min(size) as usize];
        if let Some(d) = describe_diff(off, want, got) {
            drop_cache(f);
            let verdict = match read_full(f, off, len as usize) {
                Ok(a) => match describe_diff(off, want, &a) {
                    None => "after dropping the page cache the data read from unkai is right \
                             (a stale kernel page cache?)"
                        .to_string(),
                    Some(d2) => format!("after dropping the page cache, still wrong: {d2}"),
                },
                Err(e) => format!("re-read failed: {}", errname(&e)),
            };
            return Err(format!("{what} at {off} len {len}: {d}\n  {verdict}"));
        }
        Ok(())
    }

    fn verify_file(&self, what: &str, f: &File, model: &[u8], drop: bool) -> Res {
        if drop {
            drop_cache(f);
        }
        let mut off = 0u64;
        let total = model.len() as u64;
        while off < total {
            let n = (total - off).min(4 * MIB) as usize;
            let got = read_full(f, off, n)
                .map_err(|e| format!("{what}: read at {off}: {}", errname(&e)))?;
            self.compare(what, f, model, off, n as u64, &got)?;
            off += n as u64;
        }
        // Nothing past the end.
        let tail = read_full(f, total, 4096)
            .map_err(|e| format!("{what}: read at EOF: {}", errname(&e)))?;
        if !tail.is_empty() {
            return Err(format!(
                "{what}: {} bytes read past EOF {total}",
                tail.len()
            ));
        }
        Ok(())
    }

    fn verify_all(&mut self, why: &str) -> Res {
        self.stats.verify += 1;
        self.check_size()?;
        let h = self.helper.as_ref().unwrap();
        let hs = h.metadata().map_err(|e| errname(&e))?.len();
        if hs != self.hmodel.len() as u64 {
            return Err(format!("helper size {hs}, expected {}", self.hmodel.len()));
        }
        self.verify_file(&format!("full check ({why})"), self.f(), &self.model, true)?;
        self.verify_file(&format!("helper check ({why})"), h, &self.hmodel, true)
    }

    // ---- choosing ranges ----

    fn pick_len(&mut self) -> u64 {
        match self.rng.below(100) {
            0..60 => self.rng.between(1, 16 * KIB),
            60..85 => self.rng.between(1, 128 * KIB),
            85..97 => self.rng.between(1, MIB),
            _ => self.rng.between(MIB, 3 * MIB),
        }
    }

    /// An offset near a block boundary (or an aligned one).
    fn near_boundary(&mut self) -> u64 {
        let bs = self.cfg.block;
        let k = self.rng.between(1, (self.cfg.max_size / bs).max(1));
        let b = k * bs;
        match self.rng.below(3) {
            0 => b,
            1 => b.saturating_sub(self.rng.between(1, 64 * KIB)),
            _ => b + self.rng.below(64 * KIB),
        }
    }

    fn large_offset(&mut self) -> u64 {
        self.stats.large += 1;
        match self.rng.below(3) {
            0 => CHUNK - self.rng.between(1, 256 * KIB),
            1 => CHUNK + self.rng.below(256 * KIB),
            _ => self.rng.between(self.cfg.max_size, CHUNK + 4 * MIB),
        }
    }

    /// Keeps `[off, off+len)` under the soft size limit unless the file is already past it.
    fn fit(&mut self, off: u64, len: u64) -> (u64, u64) {
        let limit = self.cfg.max_size.max(self.size());
        let len = len.min(limit);
        if off + len <= limit {
            (off, len)
        } else {
            (self.rng.below(limit - len + 1), len)
        }
    }

    fn pick_write(&mut self) -> (u64, u64) {
        let size = self.size();
        let len = self.pick_len();
        if self.rng.below(1000) < self.cfg.large_permille {
            return (self.large_offset(), len.min(512 * KIB));
        }
        let off = match self.rng.below(100) {
            0..45 => self.rng.below(size.max(1)),
            45..58 => size + self.rng.below(64 * KIB),
            58..68 => size + self.rng.below(2 * MIB),
            68..88 => self.near_boundary(),
            _ => self.rng.below(self.cfg.max_size),
        };
        self.fit(off, len)
    }

    // ---- operations ----

    fn op_write(&mut self) -> Res {
        let (off, len) = self.pick_write();
        let data = self.data(len);
        let old = self.size();
        self.note(format!(
            "write off={off} (0x{off:x}) len={len} [size {old}]"
        ));
        self.f()
            .write_all_at(&data, off)
            .map_err(|e| format!("pwrite: {}", errname(&e)))?;
        let end = (off + len) as usize;
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(&data);
        self.stats.write += 1;
        Ok(())
    }

    fn pick_read(&mut self) -> (u64, u64) {
        let size = self.size();
        let off = match self.rng.below(10) {
            0 => self.near_boundary().min(size),
            1 => size.saturating_sub(self.rng.below(8 * KIB)),
            _ => self.rng.below(size + 16 * KIB),
        };
        let len = if self.rng.chance(1, 10) {
            self.rng.between(256 * KIB, 2 * MIB)
        } else {
            self.rng.between(1, 128 * KIB)
        };
        (off, len)
    }

    fn op_read(&mut self) -> Res {
        let (off, len) = self.pick_read();
        let drop = self.rng.chance(1, 3);
        self.note(format!(
            "read off={off} len={len}{} [size {}]",
            if drop { " (page cache dropped)" } else { "" },
            self.size()
        ));
        if drop {
            drop_cache(self.f());
        }
        let got = read_full(self.f(), off, len as usize)
            .map_err(|e| format!("pread: {}", errname(&e)))?;
        self.compare("read", self.f(), &self.model, off, len, &got)?;
        self.stats.read += 1;
        Ok(())
    }

    fn op_direct_read(&mut self) -> Res {
        let (off, len) = self.pick_read();
        // O_DIRECT through FUSE goes to the file system whatever the alignment; keep it
        // page-aligned anyway.
        let off = off & !(PAGE - 1);
        let len = len.div_ceil(PAGE) * PAGE;
        self.note(format!(
            "O_DIRECT read off={off} len={len} [size {}]",
            self.size()
        ));
        if self.direct.is_none() {
            let mp = self.mount.as_ref().unwrap();
            self.direct = Some(
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(mp.p("fsx"))
                    .map_err(|e| format!("open O_DIRECT: {}", errname(&e)))?,
            );
        }
        // An aligned buffer.
        let mut raw = vec![0u8; len as usize + PAGE as usize];
        let a = raw.as_ptr().align_offset(PAGE as usize);
        let buf = &mut raw[a..a + len as usize];
        let d = self.direct.as_ref().unwrap();
        let mut done = 0usize;
        while done < buf.len() {
            match d.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) => return Err(format!("O_DIRECT pread: {}", errname(&e))),
            }
        }
        let got = buf[..done].to_vec();
        self.compare("O_DIRECT read", self.f(), &self.model, off, len, &got)?;
        self.stats.dread += 1;
        Ok(())
    }

    fn op_truncate(&mut self) -> Res {
        let size = self.size();
        let big = size > self.cfg.max_size;
        let new = match self.rng.below(10) {
            _ if big => self.rng.below(self.cfg.max_size / 2),
            0..4 => self.rng.below(size + 1),
            4..7 => size + self.rng.between(1, MIB),
            7 => self.near_boundary(),
            8 => (self.rng.below(size + 1) / PAGE) * PAGE,
            _ => self.rng.below(self.cfg.max_size),
        };
        let new = new.min(self.cfg.max_size.max(size));
        self.note(format!("ftruncate {size} -> {new}"));
        self.f()
            .set_len(new)
            .map_err(|e| format!("ftruncate: {}", errname(&e)))?;
        self.model.resize(new as usize, 0);
        self.stats.truncate += 1;
        Ok(())
    }

    fn op_fallocate(&mut self) -> Res {
        let n = if self.zero_range { 5 } else { 3 };
        let k = self.rng.below(n) as usize;
        let (mode, name) = FALLOC_MODES[k];
        let size = self.size();
        let off = match self.rng.below(10) {
            0..6 => self.rng.below(size.max(1)),
            6 => size + self.rng.below(MIB),
            7 => self.near_boundary(),
            8 => (self.rng.below(size.max(1)) / PAGE) * PAGE,
            _ => self.rng.below(self.cfg.max_size),
        };
        let len = match self.rng.below(10) {
            0..6 => self.rng.between(1, 64 * KIB),
            6..9 => self.rng.between(1, MIB),
            _ => self.rng.between(1, 5 * MIB),
        };
        let (off, len) = self.fit(off, len);
        let len = len.max(1);
        self.note(format!(
            "fallocate {name} off={off} (0x{off:x}) len={len} end={} [size {size}]",
            off + len
        ));
        fallocate(self.f(), mode, off, len)
            .map_err(|e| format!("fallocate {name}: {}", errname(&e)))?;
        let end = off + len;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if !keep && end > size {
            self.model.resize(end as usize, 0);
        }
        if zero {
            let ze = end.min(self.size());
            if off < ze {
                self.model[off as usize..ze as usize].fill(0);
            }
        }
        self.stats.falloc[k] += 1;
        Ok(())
    }

    fn pick_inside(&mut self, max: u64) -> Option<(u64, u64)> {
        let size = self.size();
        if size == 0 {
            return None;
        }
        let off = if self.rng.chance(1, 5) {
            self.near_boundary().min(size - 1)
        } else {
            self.rng.below(size)
        };
        let len = self.rng.between(1, max.min(size - off));
        Some((off, len))
    }

    fn op_mmap_read(&mut self) -> Res {
        let Some((off, len)) = self.pick_inside(256 * KIB) else {
            return Ok(());
        };
        self.note(format!(
            "mmap read off={off} len={len} [size {}]",
            self.size()
        ));
        let mut m =
            Map::new(self.f(), off, len as usize).map_err(|e| format!("mmap: {}", errname(&e)))?;
        let got = m.bytes().to_vec();
        drop(m);
        self.compare("mmap read", self.f(), &self.model, off, len, &got)?;
        self.stats.mmap_read += 1;
        Ok(())
    }

    fn op_mmap_write(&mut self) -> Res {
        let Some((off, len)) = self.pick_inside(256 * KIB) else {
            return Ok(());
        };
        let data = self.data(len);
        // Half the time the dirty pages are left to the kernel to write back (at close,
        // fsync, truncate, or when it likes).
        let sync = self.rng.chance(1, 2);
        self.note(format!(
            "mmap write off={off} len={len}{} [size {}]",
            if sync {
                " + msync(MS_SYNC)"
            } else {
                ", no msync"
            },
            self.size()
        ));
        let mut m =
            Map::new(self.f(), off, len as usize).map_err(|e| format!("mmap: {}", errname(&e)))?;
        m.bytes().copy_from_slice(&data);
        if sync {
            m.sync().map_err(|e| format!("msync: {}", errname(&e)))?;
        }
        drop(m);
        self.model[off as usize..(off + len) as usize].copy_from_slice(&data);
        self.stats.mmap_write += 1;
        Ok(())
    }

    fn op_copy_self(&mut self) -> Res {
        let size = self.size();
        let Some((src, len)) = self.pick_inside(MIB) else {
            return Ok(());
        };
        // A destination that does not overlap the source, maybe past EOF.
        let mut dst = None;
        for _ in 0..8 {
            let d = match self.rng.below(4) {
                0 => size + self.rng.below(512 * KIB),
                1 => self.near_boundary(),
                _ => self.rng.below(size + 1),
            };
            if (d + len <= src || d >= src + len) && d + len <= self.cfg.max_size.max(size) {
                dst = Some(d);
                break;
            }
        }
        let Some(dst) = dst else { return Ok(()) };
        self.note(format!(
            "copy_file_range self src={src} dst={dst} (0x{dst:x}) len={len} [size {size}]"
        ));
        let (mut done, f) = (0u64, self.f());
        while done < len {
            let n = copy_file_range(f, src + done, f, dst + done, len - done)
                .map_err(|e| format!("copy_file_range: {}", errname(&e)))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        if done != len {
            return Err(format!("copy_file_range copied {done} of {len} bytes"));
        }
        let piece = self.model[src as usize..(src + len) as usize].to_vec();
        let end = (dst + len) as usize;
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
        self.model[dst as usize..end].copy_from_slice(&piece);
        self.stats.copy_self += 1;
        Ok(())
    }

    fn op_copy_helper(&mut self) -> Res {
        let hs = self.hmodel.len() as u64;
        let size = self.size();
        let src = if self.rng.chance(1, 10) {
            hs + self.rng.below(4 * KIB) // at or past the helper's EOF: copies nothing
        } else {
            self.rng.below(hs.max(1))
        };
        let len = self.rng.between(1, MIB);
        let dst = match self.rng.below(4) {
            0 => size + self.rng.below(MIB),
            1 => self.near_boundary(),
            _ => self.rng.below(size + 1),
        };
        let (dst, len) = self.fit(dst, len);
        let len = len.max(1);
        let expect = len.min(hs.saturating_sub(src));
        self.note(format!(
            "copy_file_range helper src={src} -> dst={dst} (0x{dst:x}) len={len} (expect {expect}) [size {size}, helper {hs}]"
        ));
        let (h, f) = (self.helper.as_ref().unwrap(), self.f());
        let mut done = 0u64;
        while done < len {
            let n = copy_file_range(h, src + done, f, dst + done, len - done)
                .map_err(|e| format!("copy_file_range: {}", errname(&e)))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        if done != expect {
            return Err(format!(
                "copy_file_range from helper copied {done} bytes, expected {expect}"
            ));
        }
        if done > 0 {
            let piece = self.hmodel[src as usize..(src + done) as usize].to_vec();
            let end = (dst + done) as usize;
            if end > self.model.len() {
                self.model.resize(end, 0);
            }
            self.model[dst as usize..end].copy_from_slice(&piece);
        }
        self.stats.copy_helper += 1;
        Ok(())
    }

    /// Gives the helper file new content with holes.
    fn op_helper(&mut self) -> Res {
        let size = self.rng.between(0, 3 * MIB);
        self.note(format!("helper: rewrite with size {size}"));
        let h = self.helper.as_ref().unwrap();
        h.set_len(0)
            .map_err(|e| format!("helper ftruncate: {}", errname(&e)))?;
        h.set_len(size)
            .map_err(|e| format!("helper ftruncate: {}", errname(&e)))?;
        let mut model = vec![0u8; size as usize];
        for _ in 0..self.rng.between(1, 4) {
            if size == 0 {
                break;
            }
            let off = self.rng.below(size);
            let len = self.rng.between(1, (size - off).min(MIB));
            let data = self.data(len);
            self.helper
                .as_ref()
                .unwrap()
                .write_all_at(&data, off)
                .map_err(|e| format!("helper pwrite: {}", errname(&e)))?;
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
        self.hmodel = model;
        self.stats.helper += 1;
        Ok(())
    }

    fn op_reopen(&mut self) -> Res {
        let trunc = self.rng.chance(1, 10);
        self.note(format!(
            "close + reopen{} [size {}]",
            if trunc { " O_TRUNC" } else { "" },
            self.size()
        ));
        self.file = None;
        self.direct = None;
        self.file = Some(self.open_main(trunc));
        if trunc {
            self.model.clear();
        }
        self.stats.reopen += 1;
        Ok(())
    }

    fn op_fsync(&mut self) -> Res {
        let data = self.rng.chance(1, 2);
        self.note(if data { "fdatasync" } else { "fsync" }.to_string());
        let r = if data {
            self.f().sync_data()
        } else {
            self.f().sync_all()
        };
        r.map_err(|e| format!("fsync: {}", errname(&e)))?;
        self.stats.fsync += 1;
        Ok(())
    }

    fn remount(&mut self) -> Res {
        self.note(format!("unmount + remount [size {}]", self.size()));
        self.close_all();
        let m = self.mount.take().unwrap();
        m.unmount();
        self.mount = Some(self.vol.mount_with(&self.cfg.mount));
        self.open_all();
        self.stats.remount += 1;
        self.verify_all("after remount")
    }

    fn step(&mut self) -> Res {
        // A file past the soft limit (a large write) is soon cut back.
        if self.size() > self.cfg.max_size && self.rng.chance(1, 4) {
            return self.op_truncate();
        }
        match self.rng.below(1000) {
            0..280 => self.op_write(),
            280..450 => self.op_read(),
            450..490 => self.op_direct_read(),
            490..570 => self.op_truncate(),
            570..690 => self.op_fallocate(),
            690..740 => self.op_mmap_read(),
            740..800 => self.op_mmap_write(),
            800..860 => self.op_copy_self(),
            860..910 => self.op_copy_helper(),
            910..920 => self.op_helper(),
            920..960 => self.op_reopen(),
            _ => self.op_fsync(),
        }
    }
}

/// Does the kernel pass FALLOC_FL_ZERO_RANGE through to FUSE file systems?
fn zero_range_supported(f: &File) -> bool {
    match fallocate(
        f,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        0,
        1,
    ) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => false,
        Err(e) => panic!("probing FALLOC_FL_ZERO_RANGE: {}", errname(&e)),
    }
}

fn run(cfg: Cfg) {
    let t0 = Instant::now();
    let vol = Volume::with_args(&cfg.format);
    let mount = vol.mount_with(&cfg.mount);
    let mut fsx = Fsx {
        file: None,
        direct: None,
        helper: None,
        mount: Some(mount),
        vol: &vol,
        rng: SplitMix::salted(cfg.seed, RNG_SALT),
        pool: Pool::new(cfg.seed),
        cfg: cfg.clone(),
        model: Vec::new(),
        hmodel: Vec::new(),
        history: VecDeque::new(),
        op: 0,
        stats: Stats::default(),
        zero_range: false,
    };
    fsx.open_all();
    fsx.zero_range = zero_range_supported(fsx.f());
    if !fsx.zero_range {
        eprintln!(
            "{}: the kernel does not pass FALLOC_FL_ZERO_RANGE to FUSE; not tested",
            cfg.name
        );
    }
    if let Err(e) = fsx.op_helper() {
        fsx.fail(e);
    }
    let remount_at: Vec<usize> = cfg
        .remounts
        .iter()
        .map(|f| ((cfg.ops as f64) * f) as usize)
        .collect();
    for i in 0..cfg.ops {
        fsx.op = i;
        let mut res = if remount_at.contains(&i) {
            fsx.remount()
        } else {
            Ok(())
        };
        if res.is_ok() {
            res = fsx.step();
        }
        if res.is_ok() {
            res = fsx.check_size();
        }
        if res.is_ok() && (i + 1) % cfg.verify_every == 0 {
            res = fsx.verify_all("periodic");
        }
        fsx.stats.max_size = fsx.stats.max_size.max(fsx.size());
        if let Err(e) = res {
            fsx.fail(e);
        }
    }
    fsx.op = cfg.ops;
    if let Err(e) = fsx.verify_all("end") {
        fsx.fail(e);
    }
    // Everything must survive a clean unmount.
    if let Err(e) = fsx.remount() {
        fsx.fail(e);
    }
    fsx.close_all();
    fsx.mount.take().unwrap().unmount();
    eprintln!(
        "{}: seed {} ops {} in {:.1?}: {:?}",
        cfg.name,
        cfg.seed,
        cfg.ops,
        t0.elapsed(),
        fsx.stats
    );
}

/// Runs `cfg` once per seed, the runs in parallel (each with its own volume and mount), or
/// only with FSX_SEED if that is set.
fn run_seeds(cfg: Cfg, seeds: &[u64]) {
    if let Some(seed) = env_u64("FSX_SEED") {
        return run(Cfg { seed, ..cfg });
    }
    let threads: Vec<_> = seeds
        .iter()
        .map(|&seed| {
            let c = Cfg {
                seed,
                ..cfg.clone()
            };
            std::thread::Builder::new()
                .name(format!("{}-{seed}", cfg.name))
                .spawn(move || run(c))
                .unwrap()
        })
        .collect();
    let mut panic = None;
    for t in threads {
        if let Err(p) = t.join() {
            panic.get_or_insert(p);
        }
    }
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

// ---------------------------------------------------------------------------------------------
// The runs: 8 runs of 12,500 operations, 100,000 in all (FSX_OPS changes the count per run).
// Two runs per test go in parallel: a run spends much of its time waiting on FUSE round trips.

const OPS: usize = 12_500;

/// Default volume (4 MiB blocks) and mount options, no remount.
#[test]
fn fsx_plain() {
    run_seeds(Cfg::new("fsx_plain", OPS), &[1, 11]);
}

/// Unmount and remount in the middle: the same model continues on the remounted file.
#[test]
fn fsx_remount() {
    let mut c = Cfg::new("fsx_remount", OPS);
    c.remounts = vec![0.25, 0.5, 0.75];
    run_seeds(c, &[2, 12]);
}

/// 64 KiB blocks: small files cross many block boundaries; more large writes.
#[test]
fn fsx_small_blocks() {
    let mut c = Cfg::new("fsx_small_blocks", OPS);
    c.format = vec!["--block-size", "64K"];
    c.block = 64 * KIB;
    c.large_permille = 4;
    c.remounts = vec![0.6];
    run_seeds(c, &[3, 13]);
}

/// A 1 MiB write buffer: writers flush themselves under pressure, in the middle of sequences.
#[test]
fn fsx_small_buffer() {
    let mut c = Cfg::new("fsx_small_buffer", OPS);
    c.mount = vec!["--buffer-size", "1M"];
    c.remounts = vec![0.5];
    run_seeds(c, &[4, 14]);
}
