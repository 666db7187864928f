//! The block cache on local disk (the second level, behind the memory cache): block objects
//! in files under each cache directory (`CACHE/UUID/blocks/XX/<key>`), so that a block read
//! once is read from local disk after, across remounts.
//!
//! - Every file holds a block object (`block::Sums::encode`: data, then its checksums,
//!   whatever the volume's checksum setting; on a volume that compresses or encrypts, the
//!   object as the bucket holds it, `data::codec`), so every read is verified: a damaged,
//!   partial or misplaced file is dropped (the caller fetches the block again), never
//!   returned. Files appear whole: each is written under a temporary name, then renamed.
//! - A file written is written out and leaves the kernel's page cache (the block is in
//!   memory already): caching a block costs no fresh page-cache memory, which is most of
//!   what it cost (docs/design.md, "Disk cache: written out, then out of the page cache").
//!   A peer cache owner's blocks stay, as they are read again for each asker.
//! - The least recently used blocks are evicted past the capacity, and each directory's disk
//!   keeps `free_ratio` of its space free (blocks are evicted, and none added, below it).
//! - A directory that fails (gone, full, read-only) is set aside with one log line and tried
//!   again a minute later; reads go on from memory and the bucket meanwhile.
//! - The index (key, size, recency) is rebuilt from the files at start, in the background
//!   (recency before the restart is approximated by when each block entered the cache);
//!   until it is, a miss in the index looks at the disk itself.
//! - One mount of a volume owns a cache directory at a time (a lock file); another mount of
//!   the same volume on the machine does without that directory.
//!
//! Not for: blocks waiting for their upload (`data::stage`: a cache may drop anything at any
//! time), what a block object holds (`data::block`), or when to cache (`data`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use hashlink::LinkedHashMap;
use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;

use crate::data::block::Sums;
use crate::data::layout::{local_key, local_name, parse_block_key};

/// The automatic capacity: at most this, and at most `AUTO_SHARE` of the free space (the
/// cache's own files counted as free).
const AUTO_MAX: u64 = 100 << 30;
const AUTO_SHARE: f64 = 0.5;
/// How long a failed directory is set aside before it is tried again.
const RETRY: Duration = Duration::from_secs(60);
/// How often a directory's free space is looked at (at most, while blocks are added).
const FREE_CHECK: Duration = Duration::from_secs(1);
/// Bytes of blocks waiting to be written at once (more wait for room), counted in units.
const PENDING_MAX: u64 = 64 << 20;
const PENDING_UNIT: u64 = 4 << 10;
const LOCK: &str = ".lock";
const TMP: &str = ".tmp.";

/// Writes a just-written cache file's pages to disk, waits for them, and drops them from
/// the kernel's page cache: a block read from the bucket is already kept in memory (the
/// memory cache, and the kernel's cache of the FUSE file), so a third copy in the page
/// cache only takes fresh memory for every block cached, and taking fresh pages is what
/// writing a cached block cost (docs/design.md, "Disk cache: written out, then out of the
/// page cache"). The pages freed are those the next block's file takes. Advice only: on
/// failure (a file system without `sync_file_range`, an I/O error, which the next read's
/// checksums would catch) the pages stay, as before.
fn out_of_memory(f: &File) {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let fd = f.as_raw_fd();
    // SAFETY: plain system calls on a descriptor `f` keeps open.
    unsafe {
        if libc::sync_file_range(fd, 0, 0, flags) == 0 {
            libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

/// Where and how much to cache.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// The cache directories; the cache of a volume lives under each (`ROOT/UUID/blocks`).
    pub roots: Vec<PathBuf>,
    /// Bytes cached at most (`None`: the smaller of 100 GiB and half the free space).
    pub size: Option<u64>,
    /// The share of each directory's disk kept free (0 to 1).
    pub free_ratio: f64,
}

/// What the disk cache did since it opened.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub misses: AtomicU64,
    pub written: AtomicU64,
    pub written_bytes: AtomicU64,
    pub evicted: AtomicU64,
    pub damaged: AtomicU64,
}

/// The disk cache of one mount.
pub struct DiskCache {
    /// One per root, `None` where the cache could not be opened or another mount owns it.
    dirs: Vec<Option<Dir>>,
    index: Mutex<Index>,
    capacity: AtomicU64,
    auto: bool,
    free_ratio: f64,
    /// The index holds every file found at start.
    scanned: AtomicBool,
    /// Room for bytes handed to `put_behind`, not yet written (in `PENDING_UNIT`s).
    pending: Arc<tokio::sync::Semaphore>,
    pub stats: DiskStats,
}

struct Dir {
    path: PathBuf,
    _lock: Flock<File>,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// Set aside after a failure, until then.
    failed_until: Option<Instant>,
    /// When the free space was last looked at, and the bytes that may be added above the
    /// floor since (what was then available above it, less what was added since).
    checked: Option<Instant>,
    room: u64,
    /// Down to the floor at the last look.
    low: bool,
}

/// Cached blocks (key -> bytes of its file), least recently used first.
struct Index {
    blocks: LinkedHashMap<String, u64>,
    bytes: u64,
}

fn crc(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

impl DiskCache {
    /// Opens the cache of volume `uuid` under each root and starts rebuilding its index.
    /// `None` (said in the log) when no directory can be used.
    pub fn open(cfg: &DiskConfig, uuid: &str) -> Option<Arc<DiskCache>> {
        let dirs: Vec<Option<Dir>> = cfg
            .roots
            .iter()
            .map(|root| {
                let path = root.join(uuid).join("blocks");
                match Dir::open(&path) {
                    Ok(Some(d)) => Some(d),
                    Ok(None) => {
                        tracing::info!(
                            "disk cache {}: another mount of this volume on this machine uses \
                             it; this mount does without it",
                            path.display()
                        );
                        None
                    }
                    Err(e) => {
                        tracing::warn!(
                            "disk cache {}: {e}; this mount does without it (give another \
                             --cache-dir, or --cache-size 0)",
                            path.display()
                        );
                        None
                    }
                }
            })
            .collect();
        if dirs.iter().all(Option::is_none) {
            return None;
        }
        let cache = Arc::new(DiskCache {
            capacity: AtomicU64::new(match cfg.size {
                Some(n) => n,
                None => auto_capacity(&dirs, 0),
            }),
            auto: cfg.size.is_none(),
            free_ratio: cfg.free_ratio.clamp(0.0, 1.0),
            dirs,
            index: Mutex::new(Index {
                blocks: LinkedHashMap::new(),
                bytes: 0,
            }),
            scanned: AtomicBool::new(false),
            pending: Arc::new(tokio::sync::Semaphore::new(
                (PENDING_MAX / PENDING_UNIT) as usize,
            )),
            stats: DiskStats::default(),
        });
        let c = cache.clone();
        let spawned = std::thread::Builder::new()
            .name("unkai-cache-scan".into())
            .spawn(move || c.scan());
        if let Err(e) = spawned {
            tracing::warn!(
                "disk cache: cannot start its scan ({e}); blocks cached before are not used"
            );
            cache.scanned.store(true, Relaxed);
        }
        Some(cache)
    }

    /// Bytes cached at most.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Relaxed)
    }

    /// Blocks and bytes cached.
    pub fn usage(&self) -> (u64, u64) {
        let ix = self.index.lock();
        (ix.blocks.len() as u64, ix.bytes)
    }

    /// Whether the index holds every block found at start.
    pub fn scanned(&self) -> bool {
        self.scanned.load(Relaxed)
    }

    /// The directory (by root) that holds `key`. The staging area places blocks by the same
    /// hash, so a staged block moves into the cache by a rename on the same disk.
    fn dir_of(&self, key: &str) -> usize {
        crc(key.as_bytes()) as usize % self.dirs.len()
    }

    /// The directory (by root) that holds `key`, and its file there.
    fn place(&self, key: &str) -> Option<(usize, PathBuf)> {
        let h = crc(key.as_bytes());
        let d = h as usize % self.dirs.len();
        let dir = self.dirs[d].as_ref()?;
        let sub = format!("{:02x}", (h >> 8) & 0xff);
        Some((d, dir.path.join(sub).join(local_name(key))))
    }

    /// The file of `key`, if the cache has it (making it the most recently used).
    fn find(&self, key: &str) -> Option<PathBuf> {
        let (_, path) = self.place(key)?;
        if self.index.lock().blocks.to_back(key).is_some() {
            return Some(path);
        }
        // Until the index is rebuilt, the disk itself says.
        (!self.scanned.load(Relaxed) && path.is_file()).then_some(path)
    }

    /// The data of the whole block `key` (`len` bytes, checked with `sums`), if cached and
    /// intact. A damaged file is dropped.
    pub fn get_block(&self, key: &str, len: usize, sums: Sums) -> Option<Bytes> {
        self.get_object(key, |obj| {
            sums.decode(obj, len)
                .ok_or_else(|| "checksum mismatch or wrong size".to_string())
        })
    }

    /// The data of the whole block `key`, if cached and intact: `decode` turns its object into
    /// its data, checking it, or says what is wrong (the file is then dropped).
    pub fn get_object(
        &self,
        key: &str,
        decode: impl FnOnce(Bytes) -> Result<Bytes, String>,
    ) -> Option<Bytes> {
        let Some(path) = self.find(key) else {
            self.stats.misses.fetch_add(1, Relaxed);
            return None;
        };
        let obj = match fs::read(&path) {
            Ok(obj) => Bytes::from(obj),
            Err(e) => return self.unreadable(key, &path, e),
        };
        match decode(obj) {
            Ok(data) => {
                self.hit(data.len());
                Some(data)
            }
            Err(problem) => self.damaged(key, &path, &problem),
        }
    }

    /// Byte ranges `ranges` of the object of block `key` as cached, one after the other, not
    /// checked (for a reader that checks them itself: a peer cache member's small read); only
    /// those bytes are read. None: not cached, unreadable, or a range past its end.
    pub fn get_object_ranges(&self, key: &str, ranges: &[Range<usize>]) -> Option<Vec<u8>> {
        let Some(path) = self.find(key) else {
            self.stats.misses.fetch_add(1, Relaxed);
            return None;
        };
        let read = || -> io::Result<Option<Vec<u8>>> {
            let f = File::open(&path)?;
            let size = f.metadata()?.len();
            if ranges
                .iter()
                .any(|r| r.start > r.end || r.end as u64 > size)
            {
                return Ok(None);
            }
            let mut out = vec![0u8; ranges.iter().map(|r| r.len()).sum()];
            let mut at = 0;
            for r in ranges {
                f.read_exact_at(&mut out[at..at + r.len()], r.start as u64)?;
                at += r.len();
            }
            Ok(Some(out))
        };
        match read() {
            Ok(Some(out)) => {
                self.hit(out.len());
                Some(out)
            }
            Ok(None) => None,
            Err(e) => self.unreadable(key, &path, e).map(Vec::from),
        }
    }

    /// Bytes `range` of block `key` (`len` bytes, checked with `sums`), if cached and intact:
    /// only the checksum segments they fall in are read and verified.
    pub fn get_range(
        &self,
        key: &str,
        len: usize,
        range: Range<usize>,
        sums: Sums,
    ) -> Option<Bytes> {
        let Some(path) = self.find(key) else {
            self.stats.misses.fetch_add(1, Relaxed);
            return None;
        };
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) => return self.unreadable(key, &path, e),
        };
        let a = sums.aligned(range.clone(), len);
        let s = sums.sums_range(&a, len);
        let (mut data, mut trailer) = (vec![0u8; a.len()], vec![0u8; s.len()]);
        let read = f.metadata().and_then(|m| {
            if m.len() != (len + sums.trailer_len(len)) as u64 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} bytes", m.len()),
                ));
            }
            f.read_exact_at(&mut data, a.start as u64)?;
            f.read_exact_at(&mut trailer, s.start as u64)
        });
        match read {
            Ok(()) if sums.verify(&data, &trailer, a.start) => {
                self.hit(range.len());
                Some(Bytes::from(data).slice(range.start - a.start..range.end - a.start))
            }
            Ok(()) => self.damaged(key, &path, "checksum mismatch"),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                self.damaged(key, &path, &format!("wrong size: {e}"))
            }
            Err(e) => self.unreadable(key, &path, e),
        }
    }

    fn hit(&self, bytes: usize) {
        self.stats.hits.fetch_add(1, Relaxed);
        self.stats.hit_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// A cached file that cannot be read: gone (evicted by hand, its directory removed) or
    /// failing. The block is fetched again.
    fn unreadable(&self, key: &str, path: &Path, e: io::Error) -> Option<Bytes> {
        self.stats.misses.fetch_add(1, Relaxed);
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(
                "disk cache: {} cannot be read ({e}); dropped, the block is fetched again",
                path.display()
            );
        }
        self.remove(key);
        None
    }

    /// A cached file that fails verification: dropped, never returned.
    fn damaged(&self, key: &str, path: &Path, problem: &str) -> Option<Bytes> {
        self.stats.misses.fetch_add(1, Relaxed);
        self.stats.damaged.fetch_add(1, Relaxed);
        tracing::warn!(
            "disk cache: {} is damaged ({problem}); dropped, the block is fetched again",
            path.display()
        );
        self.remove(key);
        None
    }

    /// Drops `key` from the cache (its slice is gone, or its file is damaged).
    pub fn remove(&self, key: &str) {
        let Some((_, path)) = self.place(key) else {
            return;
        };
        let mut ix = self.index.lock();
        if let Some(len) = ix.blocks.remove(key) {
            ix.bytes -= len;
        }
        // Under the lock: a block cached again meanwhile cannot lose its new file.
        let _ = fs::remove_file(path);
    }

    /// Caches the object `obj` of `key` (its data encoded with its `Sums`) in the background (on
    /// the blocking pool of the current runtime); waits first while too many bytes wait to
    /// be written already, so that the bytes held for the cache stay bounded and what is
    /// read is cached even when the disk is slower than the store. Its file leaves the
    /// kernel's page cache once written ([`out_of_memory`]), unless `served`: a block this
    /// mount serves to its peer cache group, read from its file again for each asker.
    pub async fn put_behind(self: &Arc<Self>, key: String, obj: Bytes, served: bool) {
        let len = obj.len();
        self.behind(len, move |c| c.put_parts(&key, &[&obj], !served))
            .await;
    }

    /// As [`DiskCache::put_behind`], for a block's data alone: its checksums are computed,
    /// and the object written (the data, then its checksums, not copied into one buffer), on
    /// the blocking pool. For bytes fetched without checksums (an imported object's), which
    /// would otherwise be summed and copied on the reader's runtime thread.
    pub async fn put_block_behind(self: &Arc<Self>, key: String, data: Bytes, sums: Sums) {
        let len = data.len();
        self.behind(len, move |c| {
            let trailer = sums.trailer(&data);
            c.put_parts(&key, &[&data, &trailer], true);
        })
        .await;
    }

    /// Runs `write` (of about `len` bytes) on the blocking pool, once the bytes waiting to be
    /// written leave room for these.
    async fn behind(self: &Arc<Self>, len: usize, write: impl FnOnce(&DiskCache) + Send + 'static) {
        let units = (len as u64)
            .div_ceil(PENDING_UNIT)
            .clamp(1, PENDING_MAX / PENDING_UNIT);
        let Ok(permit) = self.pending.clone().acquire_many_owned(units as u32).await else {
            return;
        };
        let c = self.clone();
        tokio::task::spawn_blocking(move || {
            write(&c);
            drop(permit);
        });
    }

    /// Whether writes handed over behind ([`DiskCache::put_behind`]) are still running: each
    /// holds its room from before its caller's await returns until its file is renamed into
    /// place. (For tests: nothing else waits for them.)
    #[cfg(test)]
    pub(crate) fn writing(&self) -> bool {
        self.pending.available_permits() < (PENDING_MAX / PENDING_UNIT) as usize
    }

    /// Caches the object `obj` of `key` (its data encoded with its `Sums`), now; its file
    /// leaves the page cache once written.
    pub fn put(&self, key: &str, obj: &[u8]) {
        self.put_parts(key, &[obj], true);
    }

    /// [`DiskCache::put`] of an object given in parts, written one after the other;
    /// `drop_pages`: its file leaves the page cache once written ([`out_of_memory`]).
    fn put_parts(&self, key: &str, parts: &[&[u8]], drop_pages: bool) {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        let Some((d, path)) = self.room_for(key, len) else {
            return;
        };
        let tmp = path.with_file_name(format!("{TMP}{:016x}", rand::random::<u64>()));
        let write = |tmp: &Path| -> io::Result<()> {
            let mut f = File::create(tmp)?;
            for p in parts {
                f.write_all(p)?;
            }
            if drop_pages {
                out_of_memory(&f);
            }
            fs::rename(tmp, &path)
        };
        let written = write(&tmp).or_else(|e| {
            let _ = fs::remove_file(&tmp);
            // Its directory removed under the mount: made again, once.
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
            fs::create_dir_all(tmp.parent().unwrap_or(Path::new("/")))?;
            write(&tmp).inspect_err(|_| {
                let _ = fs::remove_file(&tmp);
            })
        });
        self.written(d, key, len, written);
    }

    /// Moves the file `from` (holding `key`'s data encoded with its `Sums`, on the same disk, as
    /// a staged block is) into the cache. False if it was not taken (the caller removes it).
    pub fn adopt(&self, key: &str, from: &Path) -> bool {
        let Ok(len) = fs::metadata(from).map(|m| m.len()) else {
            return false;
        };
        let Some((d, path)) = self.room_for(key, len) else {
            return false;
        };
        let moved = fs::rename(from, &path).or_else(|e| {
            if e.kind() != io::ErrorKind::NotFound || !from.exists() {
                return Err(e);
            }
            fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
            fs::rename(from, &path)
        });
        let ok = moved.is_ok();
        self.written(d, key, len, moved);
        ok
    }

    /// Where `key` (`len` bytes) goes, if the cache takes it: not cached yet, its directory
    /// working and above its free-space floor, and not larger than the whole cache.
    fn room_for(&self, key: &str, len: u64) -> Option<(usize, PathBuf)> {
        let (d, path) = self.place(key)?;
        if len > self.capacity() || self.index.lock().blocks.contains_key(key) {
            return None;
        }
        let dir = self.dirs[d].as_ref()?;
        let mut h = dir.health.lock();
        let now = Instant::now();
        if h.failed_until.is_some_and(|t| now < t) {
            return None;
        }
        // The free space is looked at once a second, and whenever what was left above the
        // floor at the last look may have run out.
        if h.checked
            .is_none_or(|t| now.duration_since(t) >= FREE_CHECK)
            || h.room < len
        {
            h.checked = Some(now);
            let (avail, floor) = self.space(&dir.path).unwrap_or((u64::MAX, 0));
            h.room = avail.saturating_sub(floor);
            if h.room < len {
                self.evict_from(d, (len + floor).saturating_sub(avail));
                if !h.low {
                    h.low = true;
                    tracing::warn!(
                        "disk cache {}: its disk is down to its free-space floor ({:.0}% \
                         free); blocks are evicted to make room, and cached in memory only \
                         while there is none",
                        dir.path.display(),
                        self.free_ratio * 100.0
                    );
                }
                return None;
            }
            if std::mem::take(&mut h.low) {
                tracing::info!("disk cache {}: room again on its disk", dir.path.display());
            }
        }
        h.room -= len;
        Some((d, path))
    }

    /// The bytes available on `dir`'s disk, and the floor of free bytes to keep.
    fn space(&self, dir: &Path) -> Option<(u64, u64)> {
        let st = nix::sys::statvfs::statvfs(dir).ok()?;
        let unit = st.fragment_size() as u64;
        let (total, avail) = (
            st.blocks() as u64 * unit,
            st.blocks_available() as u64 * unit,
        );
        Some((avail, (total as f64 * self.free_ratio) as u64))
    }

    /// Evicts the least recently used blocks of directory `d`, `bytes` of them at least (or
    /// all it has).
    fn evict_from(&self, d: usize, bytes: u64) {
        let mut ix = self.index.lock();
        let victims: Vec<(String, u64)> = {
            let mut sum = 0;
            ix.blocks
                .iter()
                .filter(|(k, _)| self.dir_of(k) == d)
                .take_while(|(_, len)| {
                    let go = sum < bytes;
                    sum += **len;
                    go
                })
                .map(|(k, len)| (k.clone(), *len))
                .collect()
        };
        for (k, len) in victims {
            ix.blocks.remove(&k);
            self.evicted(&mut ix, &k, len);
        }
    }

    /// Records the outcome of caching `key` (`len` bytes) in directory `d`.
    fn written(&self, d: usize, key: &str, len: u64, res: io::Result<()>) {
        let Some(dir) = self.dirs[d].as_ref() else {
            return;
        };
        if let Err(e) = res {
            let mut h = dir.health.lock();
            if h.failed_until.is_none() {
                tracing::warn!(
                    "disk cache {}: {e}; blocks are cached in memory only meanwhile, the \
                     directory is tried again in a minute",
                    dir.path.display()
                );
            }
            h.failed_until = Some(Instant::now() + RETRY);
            return;
        }
        if dir.health.lock().failed_until.take().is_some() {
            tracing::info!("disk cache {} works again", dir.path.display());
        }
        self.stats.written.fetch_add(1, Relaxed);
        self.stats.written_bytes.fetch_add(len, Relaxed);
        self.admit(key.to_string(), len, false);
    }

    /// Enters `key` in the index (as the most recently used, or the least with `old`), then
    /// evicts past the capacity.
    fn admit(&self, key: String, len: u64, old: bool) {
        let mut ix = self.index.lock();
        if old {
            if ix.blocks.contains_key(&key) {
                return;
            }
            ix.blocks.insert_front(key, len);
        } else if let Some(was) = ix.blocks.insert(key, len) {
            ix.bytes -= was;
        }
        ix.bytes += len;
        self.trim(&mut ix);
    }

    /// Accounts for `key` (`len` bytes), taken out of the index, and removes its file.
    fn evicted(&self, ix: &mut Index, key: &str, len: u64) {
        ix.bytes -= len;
        if let Some((_, p)) = self.place(key) {
            let _ = fs::remove_file(p);
        }
        self.stats.evicted.fetch_add(1, Relaxed);
    }

    /// Whether the cache may hold `key` (its index does, or is not rebuilt yet): a read
    /// that it cannot is a miss without going to the disk. Counts that miss.
    pub fn may_have(&self, key: &str) -> bool {
        let may = !self.scanned.load(Relaxed) || self.index.lock().blocks.contains_key(key);
        if !may {
            self.stats.misses.fetch_add(1, Relaxed);
        }
        may
    }

    /// Evicts the least recently used blocks past the capacity.
    fn trim(&self, ix: &mut Index) {
        let cap = self.capacity();
        while ix.bytes > cap {
            let Some((k, len)) = ix.blocks.pop_front() else {
                break;
            };
            self.evicted(ix, &k, len);
        }
    }

    /// Rebuilds the index from the files (in the background, at start): the newest enter
    /// first as the oldest, behind whatever was cached meanwhile. Temporary files and files
    /// in the wrong place go.
    fn scan(&self) {
        let started = Instant::now();
        let mut found: Vec<(SystemTime, String, u64)> = Vec::new();
        for (d, dir) in self.dirs.iter().enumerate() {
            let Some(dir) = dir else { continue };
            let Ok(subs) = fs::read_dir(&dir.path) else {
                continue;
            };
            for sub in subs
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            {
                for f in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    let key = local_key(&name);
                    let placed = self
                        .place(&key)
                        .is_some_and(|(i, p)| i == d && p == f.path());
                    if name.starts_with(TMP) || !placed || parse_block_key(&key).is_none() {
                        let _ = fs::remove_file(f.path());
                        continue;
                    }
                    if let Ok(m) = f.metadata() {
                        let when = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                        found.push((when, key, m.len()));
                    }
                }
            }
        }
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        let n = found.len();
        for (_, key, len) in found {
            self.admit(key, len, true);
        }
        if self.auto {
            let cached = self.index.lock().bytes;
            self.capacity
                .store(auto_capacity(&self.dirs, cached), Relaxed);
            self.trim(&mut self.index.lock());
        }
        self.scanned.store(true, Relaxed);
        let (blocks, bytes) = self.usage();
        tracing::info!(
            "disk cache: {n} cached blocks found in {:.1?}; {blocks} blocks ({bytes} bytes) \
             kept, up to {} bytes",
            started.elapsed(),
            self.capacity()
        );
    }
}

impl Dir {
    /// Makes and locks a volume's cache directory; `None` if another live mount holds it.
    fn open(path: &Path) -> io::Result<Option<Dir>> {
        if let Some(vdir) = path.parent() {
            crate::data::layout::private_dir(vdir)?;
        }
        fs::create_dir_all(path)?;
        let lock = File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path.join(LOCK))?;
        let lock = match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(e.into()),
        };
        for i in 0..256u32 {
            fs::create_dir_all(path.join(format!("{i:02x}")))?;
        }
        Ok(Some(Dir {
            path: path.to_path_buf(),
            _lock: lock,
            health: Mutex::default(),
        }))
    }
}

/// The automatic capacity over `dirs` holding `cached` bytes already.
fn auto_capacity(dirs: &[Option<Dir>], cached: u64) -> u64 {
    let free: u64 = dirs
        .iter()
        .flatten()
        .filter_map(|d| nix::sys::statvfs::statvfs(&d.path).ok())
        .map(|st| st.blocks_available() * st.fragment_size())
        .sum();
    (((free + cached) as f64 * AUTO_SHARE) as u64).min(AUTO_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(root: &Path, size: u64) -> DiskConfig {
        DiskConfig {
            roots: vec![root.join("a"), root.join("b")],
            size: Some(size),
            free_ratio: 0.0,
        }
    }

    fn key(id: u64, len: usize) -> String {
        format!("vol/u/chunks/0/0/{id}_0_{len}")
    }

    fn block(id: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u64 * 31 + id) as u8).collect()
    }

    /// How block `id`'s checksums are made.
    fn sums(id: u64, len: usize) -> Sums {
        Sums {
            seal: crate::data::block::seal_of(&key(id, len)),
            segment: crate::data::block::SEGMENT,
        }
    }

    /// The object of block `id` as the cache keeps it.
    fn obj(id: u64, len: usize) -> Bytes {
        sums(id, len).encode(&block(id, len))
    }

    fn wait_scanned(c: &DiskCache) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !c.scanned() {
            assert!(Instant::now() < deadline, "the index was never rebuilt");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn file_of(c: &DiskCache, k: &str) -> PathBuf {
        c.place(k).unwrap().1
    }

    /// Blocks put are read back whole and by range; a reopened cache finds them (and a
    /// second cache of the same directories, while the first lives, does without them).
    #[test]
    fn blocks_outlive_the_mount_that_cached_them() {
        let t = tempfile::tempdir().unwrap();
        let len = 200_000;
        let c = DiskCache::open(&cfg(t.path(), 1 << 20), "u").unwrap();
        wait_scanned(&c);
        for id in 1..=3 {
            c.put(&key(id, len), &obj(id, len));
        }
        assert_eq!(c.usage(), (3, 3 * obj(1, len).len() as u64));
        let (k, seal) = (key(2, len), sums(2, len));
        assert_eq!(c.get_block(&k, len, seal).unwrap(), block(2, len));
        let r = c.get_range(&k, len, 70_000..70_010, seal).unwrap();
        assert_eq!(r, block(2, len)[70_000..70_010]);
        assert!(c.get_block(&key(9, len), len, sums(9, len)).is_none());
        assert!(DiskCache::open(&cfg(t.path(), 1 << 20), "u").is_none());
        drop(c);
        let c = DiskCache::open(&cfg(t.path(), 1 << 20), "u").unwrap();
        // Found before and after the index is rebuilt.
        assert_eq!(c.get_block(&k, len, seal).unwrap(), block(2, len));
        wait_scanned(&c);
        assert_eq!(c.usage().0, 3);
        assert_eq!(
            c.get_block(&key(3, len), len, sums(3, len)).unwrap(),
            block(3, len)
        );
        assert_eq!(c.stats.hits.load(Relaxed), 2);
    }

    /// A block's file is written out and leaves the kernel's page cache as it is cached (on a
    /// disk file system: tmpfs keeps its pages), and reads back whole, verified.
    #[test]
    fn cached_files_leave_the_page_cache() {
        use std::os::fd::AsRawFd;
        let t = tempfile::tempdir().unwrap();
        let len = 1 << 20;
        let c = DiskCache::open(&cfg(t.path(), 8 << 20), "u").unwrap();
        wait_scanned(&c);
        let (k, seal) = (key(1, len), sums(1, len));
        c.put(&k, &obj(1, len));
        let path = file_of(&c, &k);
        const EXT4: i64 = 0xEF53;
        const XFS: i64 = 0x5846_5342;
        const BTRFS: i64 = 0x9123_683E;
        let kind = nix::sys::statfs::statfs(&path).unwrap().filesystem_type().0 as i64;
        if [EXT4, XFS, BTRFS].contains(&kind) {
            let f = File::open(&path).unwrap();
            let size = f.metadata().unwrap().len() as usize;
            let pages = size.div_ceil(4096);
            let mut resident = vec![0u8; pages];
            // SAFETY: a read-only shared mapping of `size` bytes of an open file, looked at
            // by mincore (which touches no page) and unmapped before `f` closes.
            let n = unsafe {
                let m = libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                assert_ne!(m, libc::MAP_FAILED);
                assert_eq!(libc::mincore(m, size, resident.as_mut_ptr()), 0);
                libc::munmap(m, size);
                resident.iter().filter(|r| *r & 1 == 1).count()
            };
            assert_eq!(
                n, 0,
                "{n} of {pages} pages of the cached file stayed in memory"
            );
        } else {
            eprintln!("{kind:#x} is not a disk file system: the page cache is not checked");
        }
        assert_eq!(c.get_block(&k, len, seal).unwrap(), block(1, len));
    }

    /// A byte flipped or a file cut short is never returned: the read misses, the file goes.
    #[test]
    fn damaged_files_are_dropped() {
        let t = tempfile::tempdir().unwrap();
        let len = 200_000;
        let c = DiskCache::open(&cfg(t.path(), 1 << 20), "u").unwrap();
        wait_scanned(&c);
        let (k, seal) = (key(1, len), sums(1, len));
        c.put(&k, &obj(1, len));
        let path = file_of(&c, &k);
        let mut bytes = fs::read(&path).unwrap();
        bytes[100_000] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        assert!(c.get_range(&k, len, 99_000..101_000, seal).is_none());
        assert!(!path.exists());
        assert_eq!(c.usage(), (0, 0));
        c.put(&k, &obj(1, len));
        assert_eq!(
            c.get_range(&k, len, 99_000..101_000, seal).unwrap(),
            block(1, len)[99_000..101_000]
        );
        fs::write(&path, &obj(1, len)[..1000]).unwrap();
        assert!(c.get_block(&k, len, seal).is_none());
        assert!(!path.exists());
        // Another block's object under this key fails its seal.
        c.put(&k, &obj(2, len));
        assert!(c.get_block(&k, len, seal).is_none());
        assert_eq!(c.stats.damaged.load(Relaxed), 3);
    }

    /// Past its size the cache evicts the least recently used blocks, files included.
    #[test]
    fn evicts_the_least_recently_used_past_its_size() {
        let t = tempfile::tempdir().unwrap();
        let len = 10_000;
        let size = obj(0, len).len() as u64;
        let c = DiskCache::open(&cfg(t.path(), 3 * size), "u").unwrap();
        wait_scanned(&c);
        for id in 0..3 {
            c.put(&key(id, len), &obj(id, len));
        }
        let seal = |id| sums(id, len);
        assert!(c.get_block(&key(0, len), len, seal(0)).is_some()); // 1 is now the oldest
        c.put(&key(3, len), &obj(3, len));
        assert_eq!(c.usage(), (3, 3 * size));
        assert!(!file_of(&c, &key(1, len)).exists());
        assert!(c.get_block(&key(1, len), len, seal(1)).is_none());
        for id in [0, 2, 3] {
            assert!(c.get_block(&key(id, len), len, seal(id)).is_some(), "{id}");
        }
        let files: usize = ["a", "b"]
            .iter()
            .map(|r| crate::data::tests::walkdir(&t.path().join(r)).len())
            .sum();
        assert_eq!(files, 3 + 2, "three blocks and two lock files");
    }

    /// A cache directory removed under the mount: reads miss, caching goes on (the directory
    /// is made again).
    #[test]
    fn a_directory_removed_underneath_is_survived() {
        let t = tempfile::tempdir().unwrap();
        let len = 1000;
        let c = DiskCache::open(&cfg(t.path(), 1 << 20), "u").unwrap();
        wait_scanned(&c);
        for id in 0..8 {
            c.put(&key(id, len), &obj(id, len));
        }
        fs::remove_dir_all(t.path().join("a")).unwrap();
        fs::remove_dir_all(t.path().join("b")).unwrap();
        for id in 0..8 {
            assert!(c.get_block(&key(id, len), len, sums(id, len)).is_none());
        }
        assert_eq!(c.usage(), (0, 0));
        c.put(&key(1, len), &obj(1, len));
        assert!(c.get_block(&key(1, len), len, sums(1, len)).is_some());
    }
}
