//! The data layer: file bytes as immutable blocks of slices in the bucket.
//!
//! A slice (one continuous write inside a chunk) is stored as blocks of up to `block_size`
//! bytes under keys that never change meaning (see [`layout`]). This module reads ranges of
//! slices (from the block cache or the bucket, blocks in parallel), uploads blocks (in the
//! background, retried), and deletes the blocks of dead slices. [`DataStore`] offers what
//! `vfs` and `admin::gc` need of the bucket, so that they do not reach into `object`.
//!
//! Not for: which slice holds which byte of a file (that is `meta`), buffering writes
//! (that is `vfs::writer`), or retries and limits of requests (that is `object`).

mod ahead;
pub mod block;
mod budget;
pub mod buffers;
pub mod cache;
pub mod codec;
pub mod external;
mod grouped;
pub mod keys;
pub mod layout;
pub mod pack;
pub mod peers;
pub mod room;
pub mod stage;
pub mod upload;
mod writeback;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::meta::Format;
use crate::object::{self, ObjectStorage};

/// Blocks one read fetches at once (each may be a whole block in memory until copied out).
const FETCHES_AT_ONCE: usize = 16;

pub use crate::object::{ObjectInfo, Traffic};
pub use cache::DiskConfig;
pub use layout::Layout;
pub use pack::PackPiece;
pub use upload::SliceUpload;

/// Errors of the data layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Object(#[from] object::Error),
    #[error("block {key} is damaged in the bucket ({problem}), even when fetched again")]
    Corrupt { key: String, problem: String },
    #[error("upload task failed: {0}")]
    Task(String),
    /// An external slice (`unkai import`) cannot be read: its row is missing or unreadable.
    #[error("{0}")]
    External(String),
    /// Staging had no room for a block, and the bucket refused it too.
    #[error("{stage}; storing the block directly failed too: {put}")]
    NoRoom { stage: String, put: String },
}

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::Object(e) => e.errno(),
            Error::NoRoom { .. } => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Every object under a volume's block prefixes ([`Layout::chunks_prefixes`]) in `obj`.
pub async fn list_blocks(obj: &ObjectStorage, layout: &Layout) -> object::Result<Vec<ObjectInfo>> {
    let mut listed = Vec::new();
    for prefix in layout.chunks_prefixes() {
        listed.extend(obj.list(&prefix).await?);
    }
    Ok(listed)
}

/// Checks block objects as reads do, for `fsck --verify`: their checksums, that each is the
/// block its key names, and on a volume that compresses or encrypts that it decodes (which
/// needs an encrypted volume's data key).
pub struct ObjectCheck {
    layout: Layout,
    codec: Option<codec::Codec>,
    checksums: bool,
}

impl ObjectCheck {
    pub fn new(fmt: &Format, key: Option<Arc<keys::DataKey>>) -> ObjectCheck {
        ObjectCheck {
            layout: Layout::new(fmt),
            codec: fmt.encoded().then(|| codec::Codec::new(fmt, key)),
            checksums: fmt.checksums,
        }
    }

    /// Whether objects' contents can be checked at all (a volume without checksums: no).
    pub fn can_check(&self) -> bool {
        self.checksums || self.codec.is_some()
    }

    /// Whether `obj`, stored under `key`, is that block of `len` bytes, intact; else what is
    /// wrong with it.
    pub fn check(&self, key: &str, obj: Bytes, len: usize) -> std::result::Result<(), String> {
        let d = Decoder {
            codec: self.codec.clone(),
            checksums: self.checksums,
            sums: self.layout.sums(key),
            key: key.to_string(),
            len,
        };
        d.decode(obj).map(|_| ())
    }
}

/// Settings of the data layer.
#[derive(Clone, Debug)]
pub struct Config {
    /// Bytes of blocks kept in memory.
    pub cache_bytes: usize,
    /// Bytes of blocks in flight at most (uploading, fetched for a reader, fetched ahead).
    pub in_flight_bytes: usize,
    /// Threads of the I/O runtime.
    pub io_threads: usize,
    /// Write-back: blocks are staged on local disk and uploaded behind the application
    /// (None: every block is put in the bucket before its slice may be committed).
    pub stage: Option<StageConfig>,
    /// The block cache on local disk (None: blocks are cached in memory only).
    pub disk: Option<cache::DiskConfig>,
    /// The data key of an encrypted volume (`keys::unwrap`); required for one.
    pub key: Option<Arc<keys::DataKey>>,
    /// The share of the disk under a local bucket kept free (see [`room`]).
    pub free_ratio: f64,
}

/// Where and how much to stage (see [`stage`]).
#[derive(Clone, Debug)]
pub struct StageConfig {
    /// Cache directories; the staging area of the volume lives under each.
    pub dirs: Vec<std::path::PathBuf>,
    /// Bytes staged at most; writers wait for room beyond.
    pub limit: u64,
    /// How long a writer waits for room before storing its block directly in the bucket.
    pub wait: Duration,
    /// Whether whole blocks are staged too (false: only small files' packs, `data::pack`;
    /// blocks go straight to the bucket, as for a local-directory bucket, where staging them
    /// would only write their bytes twice on the same disks).
    pub blocks: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cache_bytes: 256 << 20,
            in_flight_bytes: 256 << 20,
            io_threads: 4,
            stage: None,
            disk: None,
            key: None,
            free_ratio: 0.0,
        }
    }
}

/// Encoded blocks at least this large are encoded and decoded on the blocking pool, not on
/// the I/O runtime's few threads (compressing 4 MiB takes milliseconds).
const OFF_RUNTIME: usize = 64 << 10;

/// Turns the object of one block back into its data, checking it: what every read of an
/// object (from the bucket, the stage, the disk cache, another mount's stage) goes through.
#[derive(Clone, Debug)]
pub(crate) struct Decoder {
    codec: Option<codec::Codec>,
    checksums: bool,
    sums: block::Sums,
    key: String,
    len: usize,
}

impl Decoder {
    /// The data of `obj`, or what is wrong with it.
    pub(crate) fn decode(&self, obj: Bytes) -> std::result::Result<Bytes, String> {
        let got = obj.len();
        let data = match &self.codec {
            Some(c) => {
                return c
                    .decode(&self.key, self.sums, obj, self.len)
                    .map_err(|e| e.to_string());
            }
            None if self.checksums => self.sums.decode(obj, self.len),
            None => (got == self.len).then_some(obj),
        };
        data.ok_or_else(|| {
            format!(
                "{got} bytes, checksums {}",
                if self.checksums { "on" } else { "off" }
            )
        })
    }

    /// As [`Decoder::decode`], on the blocking pool when it is heavy.
    pub(crate) async fn decode_async(self, obj: Bytes) -> std::result::Result<Bytes, String> {
        if self.codec.is_none() || obj.len() < OFF_RUNTIME {
            return self.decode(obj);
        }
        let again = (self.clone(), obj.clone());
        match tokio::task::spawn_blocking(move || self.decode(obj)).await {
            Ok(res) => res,
            // The runtime is stopping: done here instead.
            Err(_) => again.0.decode(again.1),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) obj: ObjectStorage,
    pub(crate) format: Format,
    pub(crate) layout: Layout,
    /// How objects are encoded, on a volume that compresses or encrypts (layout 3).
    pub(crate) codec: Option<codec::Codec>,
    pub(crate) cache: cache::MemoryCache,
    /// The second level, on local disk.
    pub(crate) disk: Option<Arc<cache::DiskCache>>,
    /// Slices being uploaded (a [`SliceUpload`] alive): id -> how many uploads of it. Its
    /// lock is held while an upload takes its id (see [`SliceUpload::start`]).
    pub(crate) in_flight: parking_lot::Mutex<std::collections::BTreeMap<u64, usize>>,
    /// Write-back: the staging area, its uploads, and how long a writer waits for room.
    pub(crate) stage: Option<Arc<stage::Stage>>,
    pub(crate) uploader: Option<writeback::Uploader>,
    pub(crate) stage_wait: Duration,
    /// Whether whole blocks are staged (else only packs are).
    pub(crate) stages_blocks: bool,
    /// Write-back: small files packed together (`pack`).
    pub(crate) packer: Option<pack::Packer>,
    /// Blocks being fetched ahead of their readers.
    pub(crate) ahead: ahead::Ahead,
    /// Room for block bytes in flight.
    pub(crate) budget: budget::Budget,
    /// Room on the disk under a local bucket.
    pub(crate) room: room::Room,
    /// The peer cache group this store is a member of, once it joins one.
    pub(crate) peers: std::sync::OnceLock<Arc<peers::Group>>,
    /// External slices read (`unkai import`) and how their rows are found.
    pub(crate) externals: external::Externals,
}

impl Shared {
    /// The cache key of block `index` (of `len` bytes) of slice `id`: its key in the bucket,
    /// or for an external slice its key in the caches alone (`external`).
    pub(crate) fn block_key(&self, id: u64, index: u32, len: u32) -> String {
        if crate::meta::slice::is_external(id) {
            external::block_key(id, index, len)
        } else {
            self.layout.block_key(id, index, len)
        }
    }

    /// Counts slice `id` in flight once more (a block of it staged, not yet uploaded).
    pub(crate) fn hold(&self, id: u64) {
        *self.in_flight.lock().entry(id).or_default() += 1;
    }

    /// Ends one count of slice `id` in flight (see [`Shared::hold`]).
    pub(crate) fn release(&self, id: u64) {
        let mut live = self.in_flight.lock();
        if let Some(n) = live.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                live.remove(&id);
            }
        }
    }

    /// Removes a staged block (its slice is gone, or its file is lost) so that it is never
    /// uploaded.
    fn unstage(&self, key: &str) {
        if let Some(id) = self.stage.as_ref().and_then(|s| s.remove(key)) {
            self.release(id);
        }
    }

    /// Caches on disk, in the background, the block `key` whose data is `data` (or whose
    /// object as the bucket holds it is `obj`, on a volume with checksums).
    pub(crate) async fn cache_on_disk(&self, key: &str, data: &Bytes, obj: Option<Bytes>) {
        let Some(disk) = &self.disk else {
            return;
        };
        let obj = match obj.filter(|_| self.format.checksums) {
            Some(o) => o,
            None if self.codec.is_some() => {
                self.encode_async(key, data.clone()).await.concat().into()
            }
            None => self.layout.sums(key).encode(data),
        };
        disk.put_behind(key.to_string(), obj, false).await;
    }

    /// The object of block `data` stored under `key`, as the parts a put sends (or a staged
    /// file is written from): the data (not copied) and its checksums, or one encoded object.
    pub(crate) fn encode(&self, key: &str, data: Bytes) -> Vec<Bytes> {
        let sums = self.layout.sums(key);
        match &self.codec {
            Some(c) => vec![c.encode(key, sums, &data)],
            None if self.format.checksums => sums.parts(data).into(),
            None => vec![data],
        }
    }

    /// As [`Shared::encode`], on the blocking pool when it is heavy.
    pub(crate) async fn encode_async(&self, key: &str, data: Bytes) -> Vec<Bytes> {
        let Some(c) = self.codec.clone().filter(|_| data.len() >= OFF_RUNTIME) else {
            return self.encode(key, data);
        };
        let (sums, k, d) = (self.layout.sums(key), key.to_string(), data.clone());
        match tokio::task::spawn_blocking(move || c.encode(&k, sums, &d)).await {
            Ok(obj) => vec![obj],
            Err(_) => self.encode(key, data),
        }
    }

    /// What reads and checks the object of block `key` (`len` bytes).
    pub(crate) fn decoder(&self, key: &str, len: usize) -> Decoder {
        Decoder {
            codec: self.codec.clone(),
            checksums: self.format.checksums,
            sums: self.layout.sums(key),
            key: key.to_string(),
            len,
        }
    }

    /// Whether objects are read whole only (encoded: `codec`).
    pub(crate) fn whole_only(&self) -> bool {
        self.codec.is_some()
    }
}

/// Reads and writes blocks. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct DataStore {
    pub(crate) shared: Arc<Shared>,
    rt: Arc<tokio::runtime::Runtime>,
}

/// A part of a slice to read: bytes `[start, start + len)` of slice `id` (of `size` bytes).
#[derive(Clone, Copy, Debug)]
pub struct SliceRange {
    pub id: u64,
    pub size: u32,
    pub start: u32,
    pub len: u32,
}

impl DataStore {
    /// Opens the data layer of a volume. With a staging area, blocks a previous mount left
    /// staged (adopted from directories no live process holds) are queued for upload at
    /// once, and served from the stage until then.
    pub fn new(obj: ObjectStorage, format: Format, cfg: Config) -> std::io::Result<DataStore> {
        if format.encryption.is_some() && cfg.key.is_none() {
            return Err(std::io::Error::other(format!(
                "volume '{}' is encrypted and its data key was not given",
                format.name
            )));
        }
        let codec = format
            .encoded()
            .then(|| codec::Codec::new(&format, cfg.key.clone()));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.io_threads.max(1))
            .thread_name("unkai-io")
            .enable_all()
            .build()?;
        let (stage, adopted, stage_wait, stages_blocks) = match &cfg.stage {
            Some(sc) => {
                let (st, keys) = stage::Stage::open(&sc.dirs, &format.uuid, sc.limit)?;
                (Some(Arc::new(st)), keys, sc.wait, sc.blocks)
            }
            None => (None, Vec::new(), Duration::ZERO, false),
        };
        let disk = cfg
            .disk
            .as_ref()
            .and_then(|d| cache::DiskCache::open(d, &format.uuid));
        let room = room::Room::new(obj.local_root(), cfg.free_ratio, format.block_size);
        let at_once = obj.max_uploads();
        let shared = Arc::new_cyclic(|weak| Shared {
            room,
            obj,
            cache: cache::MemoryCache::new(cfg.cache_bytes),
            disk,
            layout: Layout::new(&format),
            codec,
            format,
            in_flight: Default::default(),
            uploader: stage
                .as_ref()
                .map(|_| writeback::Uploader::start(&rt, weak.clone(), at_once)),
            packer: stage.as_ref().map(|_| pack::Packer::default()),
            ahead: Default::default(),
            budget: budget::Budget::new(cfg.in_flight_bytes),
            stage,
            stage_wait,
            stages_blocks,
            peers: Default::default(),
            externals: Default::default(),
        });
        if shared.packer.is_some() {
            // Seals a pack that has gone quiet; ends with the data store.
            let weak = Arc::downgrade(&shared);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(pack::QUIET / 4).await;
                    let Some(shared) = weak.upgrade() else {
                        return;
                    };
                    if let Some(p) = &shared.packer {
                        p.seal_quiet(&shared, pack::QUIET);
                    }
                }
            });
        }
        if let (Some(st), Some(up)) = (&shared.stage, &shared.uploader) {
            for id in st.ids() {
                shared.hold(id);
            }
            for key in adopted {
                up.enqueue(key);
            }
        }
        Ok(DataStore {
            shared,
            rt: Arc::new(rt),
        })
    }

    /// Joins a peer cache group (`peers`) with the volume's peer `key`: serves this store's
    /// blocks on `cfg.listen` (bound now) and asks the group's members before the bucket.
    pub fn join_group(&self, cfg: &peers::Config, key: &str) -> std::io::Result<Arc<peers::Group>> {
        let held = grouped::Held(Arc::downgrade(&self.shared));
        let g = peers::Group::start(cfg, key, Box::new(held), &self.rt)?;
        if self.shared.peers.set(g.clone()).is_err() {
            return Err(std::io::Error::other(
                "this store is in a peer cache group already",
            ));
        }
        Ok(g)
    }

    /// The peer cache group this store is a member of.
    pub fn peer_group(&self) -> Option<&Arc<peers::Group>> {
        self.shared.peers.get()
    }

    /// Whether blocks are staged on local disk and uploaded behind the application.
    pub fn writes_back(&self) -> bool {
        self.shared.stage.is_some()
    }

    /// Whether whole blocks are staged too, not only small files' packs.
    pub fn stages_blocks(&self) -> bool {
        self.shared.stages_blocks
    }

    /// Whether small files are packed together (with write-back: see [`pack`]).
    pub fn packs_small(&self) -> bool {
        self.shared.packer.is_some()
    }

    /// Blocks and bytes staged, not yet uploaded.
    pub fn staged(&self) -> (u64, u64) {
        self.shared.stage.as_ref().map_or((0, 0), |s| s.usage())
    }

    /// The block cache on local disk, if this store has one.
    pub fn disk_cache(&self) -> Option<&cache::DiskCache> {
        self.shared.disk.as_deref()
    }

    /// Why uploads of staged blocks fail, while they do.
    pub fn upload_trouble(&self) -> Option<String> {
        self.shared.uploader.as_ref().and_then(|u| u.trouble())
    }

    /// Bytes of blocks in flight now (see [`Config::in_flight_bytes`]).
    pub fn in_flight_bytes(&self) -> usize {
        self.shared.budget.used()
    }

    /// Blocks uploaded from the staging area since the start.
    pub fn uploaded(&self) -> u64 {
        self.shared
            .uploader
            .as_ref()
            .map_or(0, |u| u.uploaded.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The data layer's figures as the mount's metrics: the block caches, the staging area
    /// and its uploads, the block bytes in flight, and the bucket's traffic.
    pub fn figures(&self, out: &mut crate::metrics::Families) {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        let n = |a: &AtomicU64| a.load(Relaxed);
        let s = &self.shared;
        let mem = &s.cache;
        let mut levels = vec![("memory", n(&mem.hits), n(&mem.hit_bytes), n(&mem.misses))];
        if let Some(d) = &s.disk {
            let st = &d.stats;
            levels.push(("disk", n(&st.hits), n(&st.hit_bytes), n(&st.misses)));
        }
        for &(level, hits, _, _) in &levels {
            out.counter(
                "unkai_cache_hits_total",
                "Blocks found in the block cache, by level (memory, then disk).",
                &[("level", level)],
                hits,
            );
        }
        for &(level, _, bytes, _) in &levels {
            out.counter(
                "unkai_cache_hit_bytes_total",
                "Bytes of the blocks found in the block cache, by level.",
                &[("level", level)],
                bytes,
            );
        }
        for &(level, _, _, misses) in &levels {
            out.counter(
                "unkai_cache_misses_total",
                "Blocks looked for in the block cache and not found there, by level.",
                &[("level", level)],
                misses,
            );
        }
        let mut cached = vec![("memory", mem.used() as u64)];
        if let Some(d) = &s.disk {
            cached.push(("disk", d.usage().1));
        }
        for (level, bytes) in cached {
            out.gauge(
                "unkai_cache_bytes",
                "Bytes of blocks in the block cache now, by level.",
                &[("level", level)],
                bytes,
            );
        }
        let (blocks, bytes) = self.staged();
        out.gauge(
            "unkai_staged_blocks",
            "Blocks staged on local disk (write-back), not uploaded yet.",
            &[],
            blocks,
        );
        out.gauge(
            "unkai_staged_bytes",
            "Bytes staged on local disk (write-back), not uploaded yet.",
            &[],
            bytes,
        );
        let uploading = s.uploader.as_ref().map_or(0, |u| u.busy());
        out.gauge(
            "unkai_uploading_blocks",
            "Staged blocks queued for upload or being uploaded now.",
            &[],
            uploading,
        );
        out.counter(
            "unkai_uploaded_blocks_total",
            "Staged blocks uploaded to the object store.",
            &[],
            self.uploaded(),
        );
        out.gauge(
            "unkai_memory_bytes",
            crate::metrics::MEMORY_HELP,
            &[("use", "cache")],
            mem.used() as u64,
        );
        out.gauge(
            "unkai_memory_bytes",
            crate::metrics::MEMORY_HELP,
            &[("use", "in_flight")],
            self.in_flight_bytes() as u64,
        );
        self.traffic().figures(out);
        if let Some(g) = s.peers.get() {
            g.figures(out);
        }
    }

    /// Waits until everything staged is uploaded, and every upload has ended (one whose block
    /// was unstaged meanwhile still has to delete what it put); `progress(blocks, bytes)` is
    /// called about once a second while some are left.
    pub fn drain(&self, mut progress: impl FnMut(u64, u64)) {
        if let Some(p) = &self.shared.packer {
            p.seal_quiet(&self.shared, Duration::ZERO);
        }
        let mut last = std::time::Instant::now();
        let busy = || self.shared.uploader.as_ref().map_or(0, |u| u.busy());
        loop {
            let (blocks, bytes) = self.staged();
            if blocks == 0 && busy() == 0 {
                return;
            }
            if last.elapsed() >= Duration::from_secs(1) {
                progress(blocks, bytes);
                last = std::time::Instant::now();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the keys a writer uploads must be synced at fsync (a local-directory bucket,
    /// or a staging area).
    pub fn syncs_keys(&self) -> bool {
        self.local_root().is_some() || self.writes_back()
    }

    /// The lowest slice id this client may still commit: the lowest of the slices being
    /// uploaded, or `next` (the lowest id not handed out yet), whichever is lower. `next` is
    /// read under the lock uploads take their ids under, so no id taken after is below it.
    pub fn in_flight_floor(&self, next: impl FnOnce() -> u64) -> u64 {
        let live = self.shared.in_flight.lock();
        let next = next();
        live.keys().next().map_or(next, |low| (*low).min(next))
    }

    pub fn block_size(&self) -> u32 {
        self.shared.format.block_size
    }

    pub fn format(&self) -> &Format {
        &self.shared.format
    }

    /// Where this volume's blocks live in the bucket.
    pub fn layout(&self) -> &Layout {
        &self.shared.layout
    }

    /// The object layer itself, for tests that need raw access to the bucket. The layers
    /// above use the methods of `DataStore` instead.
    pub fn storage(&self) -> &ObjectStorage {
        &self.shared.obj
    }

    /// The local directory holding the blocks, for `file://` storage.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.shared.obj.local_root()
    }

    /// Room on the disk under a local bucket: its free-space floor, and the puts waiting for
    /// room to be made (see [`room`]).
    pub fn room(&self) -> &room::Room {
        &self.shared.room
    }

    /// What the bucket was sent and returned since it was opened.
    pub fn traffic(&self) -> &Traffic {
        self.shared.obj.traffic()
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// Runs a future of the data layer to completion from a plain thread.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Reads several slice ranges in parallel into their buffers. `whole_blocks` fetches and
    /// caches whole blocks (sequential access); otherwise only the bytes asked for are fetched.
    pub fn read(&self, parts: &mut [(SliceRange, &mut [u8])], whole_blocks: bool) -> Result<()> {
        let bs = self.block_size() as u64;
        let external = parts.iter().map(|(r, _)| r.id);
        self.shared
            .externals
            .learn(external.filter(|id| crate::meta::slice::is_external(*id)))?;
        // Each block once, over the span its pieces need: the pieces of a chunk of packed
        // random writes are many small ranges of few blocks, and a fetch per piece held a
        // whole block per piece at once (gigabytes for one compaction).
        let mut blocks: Vec<(String, u32, std::ops::Range<usize>)> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        // (block, part, range in the block, offset in the part)
        let mut copies = Vec::new();
        for (pi, (r, _)) in parts.iter().enumerate() {
            let (start, end) = (r.start as u64, r.start as u64 + r.len as u64);
            let mut b = start / bs;
            while b * bs < end {
                let blen = (r.size as u64 - b * bs).min(bs) as u32;
                let key = self.shared.block_key(r.id, b as u32, blen);
                let (s, e) = (
                    (start.max(b * bs) - b * bs) as usize,
                    (end.min(b * bs + blen as u64) - b * bs) as usize,
                );
                let dst = (b * bs + s as u64 - start) as usize;
                let bi = match seen.get(&key) {
                    Some(&bi) => {
                        let span = &mut blocks[bi].2;
                        *span = span.start.min(s)..span.end.max(e);
                        bi
                    }
                    None => {
                        seen.insert(key.clone(), blocks.len());
                        blocks.push((key, blen, s..e));
                        blocks.len() - 1
                    }
                };
                copies.push((bi, pi, s..e, dst));
                b += 1;
            }
        }
        let shared = self.shared.clone();
        // Room for what is fetched, until it is copied out (whole blocks are fetched for a
        // sequential read).
        let whole_blocks = whole_blocks || self.shared.whole_only();
        let need: usize = blocks
            .iter()
            .map(|(_, blen, span)| {
                if whole_blocks {
                    *blen as usize
                } else {
                    span.len()
                }
            })
            .sum();
        let fetched: Vec<Result<Bytes>> = self.rt.block_on(async {
            let _room = shared.budget.take(need).await;
            futures::stream::iter(blocks.iter().map(|(key, blen, span)| {
                let shared = shared.clone();
                let (key, blen, span) = (key.clone(), *blen as usize, span.clone());
                async move { fetch(&shared, &key, blen, span, whole_blocks).await }
            }))
            .buffered(FETCHES_AT_ONCE)
            .collect()
            .await
        });
        let fetched = fetched.into_iter().collect::<Result<Vec<Bytes>>>()?;
        for (bi, pi, range, dst) in copies {
            let from = range.start - blocks[bi].2.start;
            let out = &mut parts[pi].1;
            out[dst..dst + range.len()].copy_from_slice(&fetched[bi][from..from + range.len()]);
        }
        Ok(())
    }

    /// The bytes of `r`, if they lie in one block: a view of that block when the memory
    /// cache holds it (no copy: a sequential reader's replies are sent from the cache's
    /// blocks), else a copy of just them (a view would keep a block outside the cache's
    /// bounds). `None` when `r` spans blocks: [`DataStore::read`] reads those.
    pub fn read_shared(&self, r: SliceRange, whole_blocks: bool) -> Result<Option<Bytes>> {
        let bs = self.block_size() as u64;
        let (start, end) = (r.start as u64, r.start as u64 + r.len as u64);
        let b = start / bs;
        if r.len == 0 || (end - 1) / bs != b {
            return Ok(None);
        }
        if crate::meta::slice::is_external(r.id) {
            self.shared.externals.learn(std::iter::once(r.id))?;
        }
        let blen = (r.size as u64 - b * bs).min(bs) as u32;
        let key = self.shared.block_key(r.id, b as u32, blen);
        let span = (start - b * bs) as usize..(end - b * bs) as usize;
        let shared = self.shared.clone();
        let whole = whole_blocks || self.shared.whole_only();
        let need = if whole { blen as usize } else { span.len() };
        let got = self.rt.block_on(async {
            let _room = shared.budget.take(need).await;
            fetch(&shared, &key, blen as usize, span, whole).await
        })?;
        Ok(Some(match self.shared.cache.contains(&key) {
            true => got,
            false => Bytes::copy_from_slice(&got),
        }))
    }

    /// Deletes the blocks of a dead slice. An external slice's object is not the volume's:
    /// only what the caches hold of it goes.
    pub fn delete_slice(&self, id: u64, size: u32) -> Result<()> {
        let layout = &self.shared.layout;
        if crate::meta::slice::is_external(id) {
            for (i, len) in layout.blocks_of(size) {
                let k = external::block_key(id, i, len);
                self.shared.cache.remove(&k);
                if let Some(d) = &self.shared.disk {
                    d.remove(&k);
                }
            }
            return Ok(());
        }
        let keys: Vec<String> = layout
            .blocks_of(size)
            .map(|(i, len)| layout.block_key(id, i, len))
            .collect();
        for k in &keys {
            self.shared.cache.remove(k);
            self.shared.unstage(k);
            if let Some(d) = &self.shared.disk {
                d.remove(k);
            }
        }
        let obj = &self.shared.obj;
        self.rt.block_on(async {
            let res = futures::future::join_all(keys.iter().map(|k| obj.delete(k))).await;
            res.into_iter().collect::<object::Result<Vec<()>>>()
        })?;
        Ok(())
    }

    /// Deletes one block object by its key (a missing object is not an error). The memory
    /// cache is left as it is.
    pub fn delete_block(&self, key: &str) -> Result<()> {
        self.shared.unstage(key);
        if let Some(d) = &self.shared.disk {
            d.remove(key);
        }
        Ok(self.rt.block_on(self.shared.obj.delete(key))?)
    }

    /// Every object under the volume's block prefixes ([`Layout::chunks_prefixes`]).
    pub fn list_blocks(&self) -> Result<Vec<ObjectInfo>> {
        let s = &self.shared;
        Ok(self.rt.block_on(list_blocks(&s.obj, &s.layout))?)
    }

    /// Tells the store that every [`DataStore::sync`] is followed by an fdatasync of `file`
    /// (the metadata engine's): staged packs on the same disk then share its flush (see
    /// `data::stage`). Returns how many staging directories do.
    pub fn share_flush_with(&self, file: &std::path::Path) -> usize {
        self.shared
            .stage
            .as_ref()
            .map_or(0, |st| st.share_flush_with(file))
    }

    /// Starts writing out what [`DataStore::sync`] of `keys` will wait for (staged pieces),
    /// without waiting.
    pub fn start_sync(&self, keys: &[String]) {
        if let Some(st) = &self.shared.stage {
            st.start_sync(keys);
        }
    }

    /// Makes uploaded or staged blocks durable (fsync of their files on local disk; a staged
    /// pack that shares the engine's flush is durable once the engine's sync that follows
    /// returns, see [`DataStore::share_flush_with`]).
    pub fn sync(&self, keys: &[String]) -> Result<()> {
        let rest = match &self.shared.stage {
            Some(st) => st.sync(keys).map_err(|e| Error::Object(e.into()))?,
            None => keys.to_vec(),
        };
        Ok(self.shared.obj.sync(&rest)?)
    }

    /// Makes every staged block and every object of a local-directory bucket durable (for
    /// blocks whose keys were not kept to [`DataStore::sync`] them).
    pub fn sync_everything(&self) -> Result<()> {
        if let Some(st) = &self.shared.stage {
            st.sync_everything().map_err(|e| Error::Object(e.into()))?;
        }
        Ok(self.shared.obj.sync_everything()?)
    }
}

/// Fetches bytes `range` of a block of length `blen`, from the cache, a fetch ahead of it
/// already running, the stage or the bucket.
async fn fetch(
    shared: &Shared,
    key: &str,
    blen: usize,
    range: std::ops::Range<usize>,
    whole: bool,
) -> Result<Bytes> {
    if let Some(b) = shared.cache.get(key) {
        return Ok(b.slice(range));
    }
    if let Some(b) = ahead::wait_ahead(shared, key).await {
        return Ok(b.slice(range));
    }
    Ok(fetch_uncached(shared, key, blen, range, whole).await?.0)
}

/// As [`fetch`], from the stage or the bucket; with whether the bytes are settled. A pack
/// still open (staged raw, here or by another mount) is not: pieces are appended to it, and
/// bytes read from it past its last piece are zeros that a later piece replaces, so what is
/// read of it serves the read that asked and no other (a fetch ahead shared with later
/// readers, or a cache, would hand them zeros for pieces appended since).
async fn fetch_uncached(
    shared: &Shared,
    key: &str,
    blen: usize,
    range: std::ops::Range<usize>,
    whole: bool,
) -> Result<(Bytes, bool)> {
    if let Some(got) = external::fetch(shared, key, blen, range.clone(), whole).await {
        return Ok((got?, true));
    }
    let checksums = shared.format.checksums;
    let sums = shared.layout.sums(key);
    let decoder = shared.decoder(key, blen);
    // Encoded objects are read whole: their bytes are not the block's at the same offsets.
    let whole = whole || shared.whole_only();
    if let Some(st) = shared.stage.as_ref().filter(|st| st.is_raw(key)) {
        // A pack still staged: its bytes as appended (local, never sent: no checksums yet).
        match st.read_raw(key, range.clone()) {
            Ok(Some(b)) => return Ok((b, false)),
            Ok(None) => {}
            Err(e) if st.contains(key) => {
                tracing::error!("staged pack {key} cannot be read ({e}); trying the bucket")
            }
            Err(_) => {}
        }
    } else if let Some(st) = &shared.stage {
        match st.read(key) {
            Ok(None) => {}
            Ok(Some(obj)) => match decoder.clone().decode_async(obj).await {
                Ok(d) => {
                    shared.cache.put(key, d.clone());
                    return Ok((d.slice(range), true));
                }
                Err(e) => tracing::error!(
                    "staged block {key} is damaged on local disk ({e}); trying the bucket"
                ),
            },
            // Uploaded and removed between the check and the read, or lost: the bucket may
            // have it.
            Err(e) if st.contains(key) => {
                tracing::error!("staged block {key} cannot be read ({e}); trying the bucket")
            }
            Err(_) => {}
        }
    }
    if let Some(b) = from_disk(shared, key, blen, range.clone(), whole).await {
        return Ok((b, true));
    }
    let mut problem = String::new();
    // A block that fails verification is fetched once more before the read fails.
    for attempt in 0..2 {
        if attempt > 0 {
            tracing::warn!("block {key} failed verification ({problem}); fetching it again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if whole || range.len() * 2 >= blen {
            // A member of a peer cache group asks the block's owner first (once: a block
            // that fails verification is fetched again from the bucket).
            if attempt == 0 {
                if let Some(d) = grouped::from_group(shared, key, &decoder).await {
                    shared.cache.put(key, d.clone());
                    return Ok((d.slice(range), true));
                }
            }
            let obj = match shared.obj.get(key).await {
                // Staged by another mount, or uploaded by it since (its file then gone).
                Err(object::Error::NotFound(_)) => {
                    match from_peers(shared, key, blen, &range).await {
                        Some(got) => return Ok(got),
                        None => shared.obj.get(key).await?,
                    }
                }
                other => other?,
            };
            match decoder.clone().decode_async(obj.clone()).await {
                Ok(d) => {
                    shared.cache.put(key, d.clone());
                    shared.cache_on_disk(key, &d, Some(obj)).await;
                    return Ok((d.slice(range), true));
                }
                Err(e) => problem = e,
            }
            continue;
        }
        if checksums {
            let a = sums.aligned(range.clone(), blen);
            let s = sums.sums_range(&a, blen);
            // A member of a peer cache group asks the block's owner first, which answers
            // only if it holds the block (a LAN round trip, where a GET is a bucket's).
            if attempt == 0 {
                let check = |d: &[u8], t: &[u8]| sums.verify(d, t, a.start);
                let got = grouped::held_ranges_from_group(shared, key, a.clone(), s.clone(), check);
                if let Some(d) = got.await {
                    return Ok((d.slice(range.start - a.start..range.end - a.start), true));
                }
            }
            let get = || async {
                futures::try_join!(
                    shared.obj.get_range(key, a.start as u64..a.end as u64),
                    shared.obj.get_range(key, s.start as u64..s.end as u64),
                )
            };
            let (d, trailer) = match get().await {
                Err(object::Error::NotFound(_)) => {
                    match from_peers(shared, key, blen, &range).await {
                        Some(got) => return Ok(got),
                        None => get().await?,
                    }
                }
                other => other?,
            };
            if d.len() == a.len() && sums.verify(&d, &trailer, a.start) {
                return Ok((d.slice(range.start - a.start..range.end - a.start), true));
            }
            problem = format!("range {a:?}: {} bytes, checksum mismatch or short", d.len());
            continue;
        }
        let b = shared
            .obj
            .get_range(key, range.start as u64..range.end as u64)
            .await?;
        if b.len() == range.len() {
            return Ok((b, true));
        }
        problem = format!("range {range:?}: {} bytes", b.len());
    }
    Err(Error::Corrupt {
        key: key.into(),
        problem,
    })
}

/// Bytes `range` of block `key` (`blen` bytes) as another mount of this machine staged it
/// (see [`stage::Stage::read_peer`]), verified as any staged block; for a block missing from
/// the bucket. With whether they are settled (not read from a pack still open).
async fn from_peers(
    shared: &Shared,
    key: &str,
    blen: usize,
    range: &std::ops::Range<usize>,
) -> Option<(Bytes, bool)> {
    // A raw pack's range is read as asked; an object is read whole, and decoded.
    let (obj, raw) = shared.stage.as_ref()?.read_peer(key, range.clone())?;
    if raw {
        return Some((obj, false));
    }
    match shared.decoder(key, blen).decode_async(obj).await {
        Ok(d) => Some((d.slice(range.clone()), true)),
        Err(e) => {
            tracing::error!("block {key} staged by another mount is damaged on local disk ({e})");
            None
        }
    }
}

/// Bytes `range` of block `key` (`blen` bytes) from the disk cache, if it has them intact;
/// a whole block read (`whole`, or most of it asked for) enters the memory cache too.
async fn from_disk(
    shared: &Shared,
    key: &str,
    blen: usize,
    range: std::ops::Range<usize>,
    whole: bool,
) -> Option<Bytes> {
    let disk = shared.disk.clone().filter(|d| d.may_have(key))?;
    let sums = shared.layout.sums(key);
    let whole = whole || range.len() * 2 >= blen || shared.whole_only();
    let (k, r, decoder) = (key.to_string(), range.clone(), shared.decoder(key, blen));
    let got = tokio::task::spawn_blocking(move || match whole {
        true => disk.get_object(&k, |obj| decoder.decode(obj)),
        false => disk.get_range(&k, blen, r, sums),
    })
    .await
    .ok()??;
    if whole {
        shared.cache.put(key, got.clone());
        return Some(got.slice(range));
    }
    Some(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `file://` bucket under `dir` whose requests hang while the returned path exists
    /// (`faults.held` counts them).
    pub(crate) fn hanging_bucket(
        dir: &std::path::Path,
    ) -> (
        ObjectStorage,
        Arc<crate::object::faulty::Faults>,
        std::path::PathBuf,
    ) {
        let (bucket, hang) = (dir.join("bucket"), dir.join("hang"));
        let spec = format!("hang_file={}", hang.display());
        let faults = Arc::new(crate::object::faulty::Faults::parse(&spec).unwrap());
        let url = format!("file://{}", bucket.display());
        let obj = ObjectStorage::with_faults(&url, faults.clone()).unwrap();
        (obj, faults, hang)
    }

    pub(crate) fn store(block_size: u32) -> DataStore {
        let fmt = Format::for_tests("t", "memory://", block_size);
        let obj = ObjectStorage::open("memory://", false).unwrap();
        DataStore::new(
            obj,
            fmt,
            Config {
                cache_bytes: 1 << 20,
                ..Config::default()
            },
        )
        .unwrap()
    }

    /// With a staging area, `wait` returns once blocks are staged; the uploader then puts
    /// them in the bucket and empties the stage, and the slice stays in flight until then.
    /// A slice deleted while staged never reaches the bucket.
    #[test]
    fn staged_blocks_go_up_behind_and_keep_their_slice_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let ds = staged_store(dir.path());
        assert!(ds.writes_back() && ds.syncs_keys());
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 241) as u8).collect();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(21)).unwrap();
        for (i, part) in data.chunks(1000).enumerate() {
            up.put_block(i as u32, Bytes::copy_from_slice(part));
        }
        let keys = up.wait().unwrap();
        ds.sync(&keys).unwrap();
        drop(up);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while ds.staged().0 > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "uploads did not finish"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ds.in_flight_floor(|| 50), 50);
        assert_eq!(ds.uploaded(), 3);
        let listed = ds.list_blocks().unwrap();
        assert_eq!(listed.len(), 3, "{listed:?}");
        ds.shared.cache.remove(&keys[1]);
        let mut buf = vec![0u8; 2500];
        let mut parts = [(
            SliceRange {
                id: 21,
                size: 2500,
                start: 0,
                len: 2500,
            },
            &mut buf[..],
        )];
        ds.read(&mut parts, true).unwrap();
        assert_eq!(buf, data);
        // A block staged and then dropped with its slice is never uploaded.
        ds.shared.hold(22);
        let key = ds.layout().block_key(22, 0, 10);
        ds.shared
            .stage
            .as_ref()
            .unwrap()
            .put(
                &key,
                22,
                &[Bytes::from_static(b"0123456789")],
                Duration::ZERO,
            )
            .unwrap();
        ds.delete_block(&key).unwrap();
        assert_eq!(ds.staged(), (0, 0));
        assert_eq!(ds.in_flight_floor(|| 50), 50);
    }

    /// A write discarded while its blocks are being staged (a file deleted while written)
    /// leaves nothing behind: cancel returns every block that reached the stage, and once
    /// they are deleted nothing goes up. An abort used to leave a block staging on its
    /// blocking thread, which then went up with nothing referencing it.
    #[test]
    fn a_cancelled_upload_leaves_nothing_staged_or_stored() {
        let dir = tempfile::tempdir().unwrap();
        let ds = staged_store(dir.path());
        for round in 0..20u64 {
            let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(100 + round)).unwrap();
            for i in 0..8 {
                up.put_block(i, Bytes::from(vec![i as u8; 1000]));
            }
            for key in up.cancel() {
                ds.delete_block(&key).unwrap();
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while ds.staged().0 > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?} staged",
                ds.staged()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // An upload that raced a deletion deletes its object again once its put returns.
        loop {
            let listed = ds.list_blocks().unwrap();
            if listed.is_empty() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "left: {listed:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A data store on the `file://` bucket under `dir` with a disk cache under `dir/cache`
    /// (and a staging area there, with `stage`).
    fn cached_store(dir: &std::path::Path, stage: bool) -> DataStore {
        std::fs::create_dir_all(dir.join("bucket")).unwrap();
        let url = format!("file://{}", dir.join("bucket").display());
        let roots = vec![dir.join("cache")];
        let cfg = Config {
            cache_bytes: 1 << 20,
            stage: stage.then(|| StageConfig {
                dirs: roots.clone(),
                limit: 1 << 20,
                wait: Duration::from_secs(5),
                blocks: true,
            }),
            disk: Some(DiskConfig {
                roots,
                size: Some(1 << 20),
                free_ratio: 0.0,
            }),
            ..Config::default()
        };
        let fmt = store(1000).format().clone();
        let ds = DataStore::new(ObjectStorage::open(&url, false).unwrap(), fmt, cfg).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !ds.disk_cache().unwrap().scanned() {
            assert!(std::time::Instant::now() < deadline, "no index");
            std::thread::sleep(Duration::from_millis(5));
        }
        ds
    }

    /// Uploaded staged blocks move into the disk cache, and blocks fetched from the bucket
    /// are written there: a data store opened after reads them with no request to the bucket.
    #[test]
    fn the_disk_cache_keeps_blocks_uploaded_or_fetched_across_reopenings() {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 239) as u8).collect();
        let whole = SliceRange {
            id: 40,
            size: 2500,
            start: 0,
            len: 2500,
        };
        let read = |ds: &DataStore| {
            let mut buf = vec![0u8; 2500];
            ds.read(&mut [(whole, &mut buf[..])], true).unwrap();
            buf
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let ds = cached_store(dir.path(), true);
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(40)).unwrap();
        for (i, part) in data.chunks(1000).enumerate() {
            up.put_block(i as u32, Bytes::copy_from_slice(part));
        }
        up.wait().unwrap();
        drop(up);
        let cached = |ds: &DataStore| {
            while ds.staged().0 > 0 || ds.disk_cache().unwrap().usage().0 < 3 {
                assert!(std::time::Instant::now() < deadline, "never cached");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        cached(&ds);
        drop(ds);
        let ds = cached_store(dir.path(), false);
        assert_eq!(read(&ds), data);
        assert_eq!(
            ds.traffic().gets.load(Relaxed),
            0,
            "read from the disk cache"
        );
        drop(ds);
        // Fetched from the bucket once the cache is gone, then cached again.
        std::fs::remove_dir_all(dir.path().join("cache")).unwrap();
        let ds = cached_store(dir.path(), false);
        assert_eq!(read(&ds), data);
        assert_eq!(ds.traffic().gets.load(Relaxed), 3);
        cached(&ds);
        drop(ds);
        let ds = cached_store(dir.path(), false);
        assert_eq!(read(&ds), data);
        assert_eq!(
            ds.traffic().gets.load(Relaxed),
            0,
            "read from the disk cache"
        );
        // A slice deleted leaves the cache too.
        ds.delete_slice(40, 2500).unwrap();
        assert_eq!(ds.disk_cache().unwrap().usage(), (0, 0));
    }

    /// With room for one unit of blocks in flight, uploads and reads larger than that still
    /// go (each takes the whole room, in turn), the room is all given back after, and while
    /// a reader holds it nothing is fetched ahead.
    #[test]
    fn blocks_in_flight_stay_within_their_room() {
        let fmt = store(1000).format().clone();
        let cfg = Config {
            in_flight_bytes: 1,
            ..Config::default()
        };
        let ds =
            DataStore::new(ObjectStorage::open("memory://", false).unwrap(), fmt, cfg).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 233) as u8).collect();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(50)).unwrap();
        for (i, part) in data.chunks(1000).enumerate() {
            up.put_block(i as u32, Bytes::copy_from_slice(part));
        }
        up.wait().unwrap();
        drop(up);
        assert_eq!(ds.in_flight_bytes(), 0);
        let whole = SliceRange {
            id: 50,
            size: 200_000,
            start: 0,
            len: 200_000,
        };
        let mut buf = vec![0u8; 200_000];
        ds.read(&mut [(whole, &mut buf[..])], true).unwrap();
        assert_eq!(buf, data);
        assert_eq!(ds.in_flight_bytes(), 0);
        let room = ds.block_on(ds.shared.budget.take(1));
        for i in 0..200 {
            ds.shared.cache.remove(&ds.layout().block_key(50, i, 1000));
        }
        let first = ds.layout().block_key(50, 0, 1000);
        ds.fetch_ahead(&[whole]);
        assert!(
            ds.shared.ahead.running(&first).is_none(),
            "fetched ahead without room"
        );
        drop(room);
        ds.fetch_ahead(&[whole]);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !ds.shared.cache.contains(&first) {
            assert!(std::time::Instant::now() < deadline, "never fetched ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A block unstaged while its upload is in flight (its slice deleted): the upload deletes
    /// the object it put, and `drain` (unmount) waits for that. Drain used to return once the
    /// stage was empty, the runtime then stopped before that delete, and the object stayed in
    /// the bucket with no slice referencing it (seen by CI on Azurite).
    #[test]
    fn drain_waits_for_an_upload_whose_block_was_unstaged() {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = tempfile::tempdir().unwrap();
        let (obj, faults, hang) = hanging_bucket(dir.path());
        let cfg = Config {
            cache_bytes: 1 << 20,
            stage: Some(StageConfig {
                dirs: vec![dir.path().join("stage")],
                limit: 1 << 20,
                wait: Duration::from_secs(5),
                blocks: true,
            }),
            ..Config::default()
        };
        let ds = DataStore::new(obj, store(1000).format().clone(), cfg).unwrap();
        std::fs::write(&hang, b"").unwrap();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(31)).unwrap();
        up.put_block(0, Bytes::from(vec![7u8; 1000]));
        let key = up.wait().unwrap().remove(0);
        drop(up);
        // Its upload has read the block and holds it in a put.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while faults.held.load(Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the upload never started"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        ds.shared.unstage(&key);
        assert_eq!(ds.staged(), (0, 0));
        std::fs::remove_file(&hang).unwrap();
        ds.drain(|_, _| {});
        assert_eq!(ds.shared.uploader.as_ref().unwrap().busy(), 0);
        let objects: Vec<_> = walkdir(&dir.path().join("bucket"));
        assert!(objects.is_empty(), "left in the bucket: {objects:?}");
    }

    /// Files under `dir`, recursively.
    pub(crate) fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(dir) else {
            return out;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walkdir(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    fn staged_store(dir: &std::path::Path) -> DataStore {
        let fmt = store(1000).format().clone();
        let cfg = Config {
            cache_bytes: 1 << 20,
            stage: Some(StageConfig {
                dirs: vec![dir.to_path_buf()],
                limit: 1 << 20,
                wait: Duration::from_secs(5),
                blocks: true,
            }),
            ..Config::default()
        };
        DataStore::new(ObjectStorage::open("memory://", false).unwrap(), fmt, cfg).unwrap()
    }

    /// A volume that compresses and/or encrypts (layout 3), its bucket `dir/bucket`, staging
    /// and caching on disk under `dir/cache` when `local` (64 KiB blocks).
    fn encoded_store(
        dir: &std::path::Path,
        compress: crate::meta::format::Compression,
        key: Option<[u8; 32]>,
        local: bool,
    ) -> std::io::Result<DataStore> {
        encoded_store_as(dir, compress, key.is_some(), key, local)
    }

    /// As [`encoded_store`], encrypted or not whatever the key given.
    fn encoded_store_as(
        dir: &std::path::Path,
        compress: crate::meta::format::Compression,
        encrypted: bool,
        key: Option<[u8; 32]>,
        local: bool,
    ) -> std::io::Result<DataStore> {
        std::fs::create_dir_all(dir.join("bucket")).unwrap();
        let url = format!("file://{}", dir.join("bucket").display());
        let mut fmt = Format::for_tests("t", &url, 64 << 10);
        fmt.layout = crate::meta::format::LAYOUT_ENCODED;
        fmt.compress = compress;
        if encrypted {
            fmt.encryption = Some(crate::meta::format::Encryption {
                cipher: keys::CIPHER.into(),
                wrap: crate::meta::format::KeyWrap::KeyFile,
                wrapped_key: String::new(),
                rsa_key: None,
                rsa_fingerprint: None,
            });
        }
        let roots = vec![dir.join("cache")];
        let cfg = Config {
            cache_bytes: 1 << 20,
            stage: local.then(|| StageConfig {
                dirs: roots.clone(),
                limit: 1 << 30,
                wait: Duration::from_secs(5),
                blocks: true,
            }),
            disk: local.then_some(DiskConfig {
                roots,
                size: Some(1 << 30),
                free_ratio: 0.0,
            }),
            key: key.map(|k| Arc::new(keys::DataKey::from_bytes(k))),
            ..Config::default()
        };
        let ds = DataStore::new(ObjectStorage::open(&url, false).unwrap(), fmt, cfg)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while ds.disk_cache().is_some_and(|d| !d.scanned()) {
            assert!(std::time::Instant::now() < deadline, "no index");
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(ds)
    }

    /// Source-like text holding `marker` now and then: compresses well.
    fn marked_text(n: usize, marker: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 100);
        let mut i = 0u64;
        while out.len() < n {
            let line = match i % 7 {
                0 => format!("    let {marker}_{i} = read(&mut buf, {})?;\n", i % 13),
                _ => format!(
                    "    fn step_{}(x: u64) -> u64 {{ x * {} + 1 }}\n",
                    i % 17,
                    i % 5
                ),
            };
            out.extend_from_slice(line.as_bytes());
            i += 1;
        }
        out.truncate(n);
        out
    }

    /// Blocks of an encoded volume go through every path — staged, uploaded, packed, cached
    /// on disk, fetched from the bucket — and read back the same by random ranges; the bucket
    /// holds fewer bytes than were written when compressed and no plaintext when encrypted
    /// (nor does the disk cache), reads fetch whole objects, and a byte flipped in the
    /// bucket is an error of the read (EIO), never other data.
    #[test]
    fn encoded_volumes_round_trip_and_catch_tampering() {
        use crate::meta::format::Compression;
        use std::sync::atomic::Ordering::Relaxed;
        let marker = "UNKAI_MARKER_7f3a";
        for (compress, key) in [
            (Compression::Lz4, None),
            (Compression::Zstd, Some([7u8; 32])),
            (Compression::None, Some([8u8; 32])),
        ] {
            let what = format!("{compress:?} encrypted={}", key.is_some());
            let dir = tempfile::tempdir().unwrap();
            let data = marked_text(300_000, marker);
            let whole = SliceRange {
                id: 40,
                size: data.len() as u32,
                start: 0,
                len: data.len() as u32,
            };
            let ranges = |ds: &DataStore| {
                for (start, len) in [
                    (0, 10),
                    (65_530, 20),
                    (100_000, 70_000),
                    (200_000, 9),
                    (299_990, 10),
                ] {
                    let mut buf = vec![0u8; len];
                    let r = SliceRange {
                        start: start as u32,
                        len: len as u32,
                        ..whole
                    };
                    ds.read(&mut [(r, &mut buf[..])], false).unwrap();
                    assert_eq!(buf, &data[start..start + len], "{what}: {start}+{len}");
                }
            };
            let ds = encoded_store(dir.path(), compress, key, true).unwrap();
            let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(40)).unwrap();
            for (i, part) in data.chunks(64 << 10).enumerate() {
                up.put_block(i as u32, Bytes::copy_from_slice(part));
            }
            let keys = up.wait().unwrap();
            drop(up);
            for k in &keys {
                ds.shared.cache.remove(k);
            }
            ranges(&ds); // from the stage
            let mut ids = 100..;
            let piece = ds
                .pack(marker.repeat(50).as_bytes(), || {
                    Ok::<_, ()>(ids.next().unwrap())
                })
                .unwrap()
                .unwrap();
            let read_piece = |ds: &DataStore| {
                let mut buf = vec![0u8; marker.len() * 50];
                let r = SliceRange {
                    id: piece.id,
                    size: piece.size,
                    start: piece.off,
                    len: buf.len() as u32,
                };
                ds.read(&mut [(r, &mut buf[..])], false).unwrap();
                assert_eq!(
                    buf,
                    marker.repeat(50).as_bytes(),
                    "{what}: the packed piece"
                );
            };
            read_piece(&ds); // from the raw pack
            let (pid, psize, poff) = (piece.id, piece.size, piece.off);
            drop(piece);
            ds.drain(|_, _| {});
            let stored: Vec<_> = walkdir(&dir.path().join("bucket"))
                .into_iter()
                .filter(|p| p.to_string_lossy().contains("/chunks/"))
                .collect();
            assert_eq!(stored.len(), keys.len() + 1, "{what}: {stored:?}");
            let bytes: u64 = stored.iter().map(|p| p.metadata().unwrap().len()).sum();
            let written = data.len() as u64 + psize as u64;
            if compress != Compression::None {
                assert!(bytes < written / 3, "{what}: {bytes} stored of {written}");
            }
            // The disk cache's files are written behind the reads (a file seen under its
            // temporary name may be renamed before it is read, CI caught it): all of them.
            if let Some(disk) = ds.shared.disk.clone() {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while disk.writing() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                assert!(
                    !disk.writing(),
                    "{what}: the disk cache's writes never ended"
                );
            }
            let cached = walkdir(&dir.path().join("cache"));
            if key.is_some() {
                for p in stored.iter().chain(&cached) {
                    let b = std::fs::read(p).unwrap();
                    assert!(
                        !b.windows(marker.len()).any(|w| w == marker.as_bytes()),
                        "{what}: plaintext in {}",
                        p.display()
                    );
                }
            }
            // The disk cache holds the objects: read from it after a reopening.
            drop(ds);
            let ds = encoded_store(dir.path(), compress, key, true).unwrap();
            ranges(&ds);
            assert_eq!(
                ds.traffic().gets.load(Relaxed),
                0,
                "{what}: from the disk cache"
            );
            drop(ds);
            // From the bucket: whole objects, one GET each.
            std::fs::remove_dir_all(dir.path().join("cache")).unwrap();
            let ds = encoded_store(dir.path(), compress, key, false).unwrap();
            ranges(&ds);
            let mut buf = vec![0u8; marker.len() * 50];
            let r = SliceRange {
                id: pid,
                size: psize,
                start: poff,
                len: buf.len() as u32,
            };
            ds.read(&mut [(r, &mut buf[..])], false).unwrap();
            assert_eq!(
                buf,
                marker.repeat(50).as_bytes(),
                "{what}: piece from the bucket"
            );
            let gets = ds.traffic().gets.load(Relaxed);
            assert_eq!(
                gets,
                keys.len() as u64 + 1,
                "{what}: one whole GET per object"
            );
            assert_eq!(
                ds.traffic().get_bytes.load(Relaxed),
                bytes,
                "{what}: whole objects"
            );
            drop(ds);
            // One byte flipped in the bucket: the read fails with EIO.
            let victim = stored
                .iter()
                .find(|p| p.to_string_lossy().ends_with(&format!("40_1_{}", 64 << 10)))
                .unwrap();
            let mut b = std::fs::read(victim).unwrap();
            let at = b.len() / 2;
            b[at] ^= 0x01;
            std::fs::write(victim, b).unwrap();
            let ds = encoded_store(dir.path(), compress, key, false).unwrap();
            let mut buf = [0u8; 100];
            let r = SliceRange {
                start: 70_000,
                len: 100,
                ..whole
            };
            let err = ds.read(&mut [(r, &mut buf[..])], false).unwrap_err();
            assert_eq!(err.errno(), libc::EIO, "{what}: {err}");
            drop(ds);
            if let Some(k) = key {
                // Without the data key, no store; under another key, every read fails.
                assert!(encoded_store_as(dir.path(), compress, true, None, false).is_err());
                let mut other = k;
                other[0] ^= 1;
                let ds = encoded_store(dir.path(), compress, Some(other), false).unwrap();
                let r = SliceRange {
                    start: 0,
                    len: 100,
                    ..whole
                };
                let err = ds.read(&mut [(r, &mut buf[..])], false).unwrap_err();
                assert!(err.to_string().contains("authentication"), "{what}: {err}");
            }
        }
    }

    /// A slice is in flight from its start until its upload is dropped; the floor is the
    /// lowest such id, or the next id when none is.
    #[test]
    fn in_flight_floor_follows_uploads() {
        let ds = store(1000);
        assert_eq!(ds.in_flight_floor(|| 50), 50);
        let a = SliceUpload::start(&ds, || Ok::<_, ()>(10)).unwrap();
        let b = SliceUpload::start(&ds, || Ok::<_, ()>(12)).unwrap();
        assert_eq!(ds.in_flight_floor(|| 50), 10);
        assert_eq!(ds.in_flight_floor(|| 5), 5);
        assert!(SliceUpload::start(&ds, || Err::<u64, _>("no id")).is_err());
        drop(a);
        assert_eq!(ds.in_flight_floor(|| 50), 12);
        drop(b);
        assert_eq!(ds.in_flight_floor(|| 50), 50);
    }

    /// A read of many small pieces of one block (a chunk of packed random writes, read by
    /// compaction or a page fault) fetches the block once, not once per piece: a fetch per
    /// piece held a whole block per piece at once, and a mount writing through mmap grew to
    /// tens of gigabytes.
    #[test]
    fn pieces_of_one_block_are_fetched_once() {
        let ds = store(64 << 10);
        let data: Vec<u8> = (0..64u32 << 10).map(|i| (i % 253) as u8).collect();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(9)).unwrap();
        up.put_block(0, Bytes::copy_from_slice(&data));
        up.wait().unwrap();
        ds.shared
            .cache
            .remove(&ds.shared.layout.block_key(9, 0, 64 << 10));
        let gets = || ds.traffic().gets.load(std::sync::atomic::Ordering::Relaxed);
        let before = gets();
        // Every other 512-byte piece of the block, out of order.
        let starts: Vec<u32> = (0..64).rev().map(|i| i * 1024).collect();
        let mut bufs = vec![vec![0u8; 512]; starts.len()];
        let mut parts: Vec<(SliceRange, &mut [u8])> = starts
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&start, b)| {
                let r = SliceRange {
                    id: 9,
                    size: 64 << 10,
                    start,
                    len: 512,
                };
                (r, b.as_mut_slice())
            })
            .collect();
        ds.read(&mut parts, false).unwrap();
        assert_eq!(gets() - before, 1, "one GET for 64 pieces of one block");
        for (start, b) in starts.iter().zip(&bufs) {
            let s = *start as usize;
            assert_eq!(b.as_slice(), &data[s..s + 512], "piece at {start}");
        }
    }

    /// A block given for the wait is not started before it (nothing of it in the bucket),
    /// is stored by the wait beside the blocks already going up, and reads back; one given
    /// to an upload then cancelled is never stored.
    #[test]
    fn a_block_given_for_the_wait_is_stored_by_it() {
        let ds = store(1000);
        let data: Vec<u8> = (0..1600u32).map(|i| (i % 239) as u8).collect();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(8)).unwrap();
        up.put_block(0, Bytes::copy_from_slice(&data[..1000]));
        up.put_block_at_wait(1, Bytes::copy_from_slice(&data[1000..]));
        let last = ds.layout().block_key(8, 1, 600);
        let listed = || -> Vec<String> {
            let l = ds.block_on(ds.storage().list("t")).unwrap();
            l.into_iter().map(|o| o.key).collect()
        };
        assert!(!listed().contains(&last), "started before the wait");
        let mut keys = up.wait().unwrap();
        keys.sort();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(keys.contains(&last), "{keys:?}");
        assert!(listed().contains(&last));
        ds.shared.cache.remove(&last);
        let mut buf = vec![0u8; 1600];
        let mut parts = [(
            SliceRange {
                id: 8,
                size: 1600,
                start: 0,
                len: 1600,
            },
            &mut buf[..],
        )];
        ds.read(&mut parts, true).unwrap();
        assert_eq!(buf, data);
        let mut gone = SliceUpload::start(&ds, || Ok::<_, ()>(9)).unwrap();
        gone.put_block_at_wait(0, Bytes::from_static(b"never stored"));
        assert!(gone.cancel().is_empty());
        drop(gone);
        let key = ds.layout().block_key(9, 0, 12);
        assert!(!listed().contains(&key));
    }

    #[test]
    fn upload_read_delete() {
        let ds = store(1000);
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(7)).unwrap();
        up.put_block(0, Bytes::copy_from_slice(&data[..1000]));
        up.put_block(1, Bytes::copy_from_slice(&data[1000..2000]));
        up.put_block(2, Bytes::copy_from_slice(&data[2000..]));
        let keys = up.wait().unwrap();
        assert_eq!(keys.len(), 3);
        for whole in [false, true] {
            let mut a = vec![0u8; 1700];
            let mut b = [0u8; 10];
            let mut parts = [
                (
                    SliceRange {
                        id: 7,
                        size: 2500,
                        start: 500,
                        len: 1700,
                    },
                    &mut a[..],
                ),
                (
                    SliceRange {
                        id: 7,
                        size: 2500,
                        start: 2490,
                        len: 10,
                    },
                    &mut b[..],
                ),
            ];
            ds.read(&mut parts, whole).unwrap();
            assert_eq!(&a[..], &data[500..2200]);
            assert_eq!(&b[..], &data[2490..]);
        }
        ds.delete_slice(7, 2500).unwrap();
        let listed = ds.block_on(ds.storage().list("t")).unwrap();
        assert!(listed.is_empty(), "{listed:?}");
        let mut a = [0u8; 10];
        let mut parts = [(
            SliceRange {
                id: 7,
                size: 2500,
                start: 0,
                len: 10,
            },
            &mut a[..],
        )];
        assert!(ds.read(&mut parts, false).is_err());
    }
}
