//! Opening a volume's data side for any front end (the FUSE mount, the NFS, S3 and WebDAV
//! servers): the bucket with its time limits, write-back staging, the memory and disk
//! caches and the memory limit's shares, each decision logged once.
//!
//! Not for: flags (that is `cli`), the metadata engine (`volume::open_meta`), or what a
//! front end does with the opened store (`volume::serve` for FUSE, `volume::front` for the
//! network servers).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::data::{self, DataStore};
use crate::meta::{EngineKind, Format};
use crate::object::{ObjectStorage, Policy};

/// Whether the kernel's writeback cache, or write-back staging, is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writeback {
    /// When this client has the volume to itself (staging: an SQLite volume; every block
    /// where the store is not a plain local directory, small files' packs only where it is).
    Auto,
    On,
    Off,
}

/// How to open the data side of a volume; every field already checked by the caller.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Write-back staging of blocks on local disk (`data::stage`).
    pub writeback: Writeback,
    /// Cache directories (the staging area lives under each).
    pub cache_dirs: Vec<PathBuf>,
    /// Bytes staged at most.
    pub stage_bytes: u64,
    /// Memory for cached blocks.
    pub cache_bytes: usize,
    /// Bytes of the block cache on local disk (None: automatic, see `disk_cache`).
    pub disk_cache: Option<u64>,
    /// The share of the cache directories' disks the disk cache leaves free, and of the disk
    /// under a local bucket before the oldest trash is deleted early (`data::room`).
    pub free_space_ratio: f64,
    /// Memory for buffered writes.
    pub buffer_bytes: usize,
    /// Memory the client keeps within (see [`StoreConfig::budgets`]).
    pub memory_limit: u64,
    /// Time limit of one request to the object store, and of a request with its retries.
    pub io_timeout: Duration,
    pub io_deadline: Duration,
    /// Puts to the object store in flight at most (`--max-uploads`).
    pub max_uploads: usize,
    /// Bytes per second sent to the store and read from it at most (`--upload-limit`,
    /// `--download-limit`); None: unlimited.
    pub upload_limit: Option<u64>,
    pub download_limit: Option<u64>,
    /// The data key of an encrypted volume, unwrapped (`volume::data_key`).
    pub data_key: Option<Arc<crate::data::keys::DataKey>>,
    /// The peer cache group to join (`--peer-cache`; None: none).
    pub peer: Option<crate::data::peers::Config>,
}

impl StoreConfig {
    /// The memory limit's shares: the memory cache, the write buffers (each as asked for,
    /// at most a quarter of the limit) and the blocks in flight (a quarter). The last
    /// quarter is left to the metadata engine's caches, the threads and the requests.
    pub fn budgets(&self) -> (usize, usize, usize) {
        let quarter = (self.memory_limit / 4) as usize;
        (
            self.cache_bytes.min(quarter),
            self.buffer_bytes.min(quarter),
            quarter,
        )
    }
}

/// What is staged on local disk (write-back): None, nothing; `Some(true)`, every block;
/// `Some(false)`, only small files, packed together (`data::pack`). `auto` stages on a volume of
/// one machine (SQLite: no other client must read what this one closed): every block when the
/// store is remote or answers late, only packs when it is a plain local directory (staging
/// whole blocks there would only write their bytes twice, while packing saves a file created
/// per small file).
fn stages(cfg: &StoreConfig, engine: EngineKind, obj: &ObjectStorage) -> Option<bool> {
    match cfg.writeback {
        Writeback::On => Some(true),
        Writeback::Off => None,
        Writeback::Auto if !engine.one_machine() => None,
        Writeback::Auto => Some(obj.is_remote() || obj.answers_late()),
    }
}

/// Directories as `--cache-dir` takes them.
fn dirs_text(dirs: &[PathBuf]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    dirs.join(":")
}

/// The disk cache: of the size asked for, or, when none was, of an automatic size where the
/// store is remote or answers late (a plain local directory is local disk already: caching
/// it would only double its bytes on the same disks).
fn disk_cache(cfg: &StoreConfig, obj: &ObjectStorage) -> Option<data::DiskConfig> {
    let size = match cfg.disk_cache {
        Some(0) => return None,
        Some(n) => Some(n),
        None if obj.is_remote() || obj.answers_late() => None,
        None => return None,
    };
    Some(data::DiskConfig {
        roots: cfg.cache_dirs.clone(),
        size,
        free_ratio: cfg.free_space_ratio,
    })
}

/// Opens the bucket of the volume formatted as `fmt` and the data store over it, as `cfg`
/// says, and logs what was decided. With `backups`, also a second handle on the bucket for
/// the metadata backups (`--backup-meta`), opened now (its probe object written and read)
/// rather than once the front end serves, where it would race with programs using it; None
/// (with a warning) if it cannot be.
pub fn open_store(
    fmt: &Format,
    engine: EngineKind,
    cfg: &StoreConfig,
    backups: bool,
) -> anyhow::Result<(DataStore, Option<ObjectStorage>)> {
    let open_obj = || {
        super::open_storage_with(
            fmt,
            Policy {
                timeout: cfg.io_timeout,
                deadline: cfg.io_deadline,
                max_uploads: cfg.max_uploads,
                upload_limit: cfg.upload_limit,
                download_limit: cfg.download_limit,
                ..Policy::default()
            },
        )
    };
    let obj = open_obj()?;
    let backup_obj = backups
        .then(|| match open_obj() {
            Ok(obj) => Some(obj),
            Err(e) => {
                tracing::warn!("metadata backups off: cannot open the bucket: {e:#}");
                None
            }
        })
        .flatten();
    let stage = stages(cfg, engine, &obj).map(|blocks| data::StageConfig {
        dirs: cfg.cache_dirs.clone(),
        limit: cfg.stage_bytes,
        wait: cfg.io_deadline,
        blocks,
    });
    let disk = disk_cache(cfg, &obj);
    let config = |stage| data::Config {
        cache_bytes: cfg.budgets().0,
        in_flight_bytes: cfg.budgets().2,
        stage,
        disk: disk.clone(),
        key: cfg.data_key.clone(),
        free_ratio: cfg.free_space_ratio,
        ..data::Config::default()
    };
    let packs_only = stage.as_ref().is_some_and(|s| !s.blocks);
    let store = match DataStore::new(obj, fmt.clone(), config(stage)) {
        Ok(store) => store,
        // Packing is only a saving: without a staging area, small files go up one by one.
        Err(e) if packs_only => {
            tracing::warn!(
                "cannot open the staging area under {} ({e}): small files are not packed; \
                 give another --cache-dir, or --writeback off to silence this",
                cfg.cache_dirs[0].display()
            );
            DataStore::new(open_obj()?, fmt.clone(), config(None))?
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "cannot open the staging area under {}: give another --cache-dir, or \
                 --writeback off",
                cfg.cache_dirs[0].display()
            )));
        }
    };
    if fmt.encoded() {
        tracing::info!(
            "blocks compressed: {}; encrypted: {} (objects are read whole)",
            fmt.compress.name(),
            fmt.encryption
                .as_ref()
                .map_or_else(|| "no".to_string(), |e| e.describe())
        );
    }
    match store.disk_cache() {
        Some(d) => tracing::info!(
            "disk cache on: blocks read or uploaded are kept under {} (up to {} bytes{}, \
             {:.0}% of each disk left free)",
            dirs_text(&cfg.cache_dirs),
            d.capacity(),
            if cfg.disk_cache.is_none() {
                ", set when its index is rebuilt"
            } else {
                ""
            },
            cfg.free_space_ratio * 100.0
        ),
        None => tracing::info!("disk cache off: blocks are cached in memory only"),
    }
    let (cached, buffered, in_flight) = cfg.budgets();
    tracing::info!(
        "memory limit {} bytes: up to {cached} of blocks cached, {buffered} of writes \
         buffered, {in_flight} of blocks in flight",
        cfg.memory_limit
    );
    if store.writes_back() {
        let (blocks, bytes) = store.staged();
        tracing::info!(
            "write-back on: {} staged under {} (up to {} bytes), uploaded behind the \
             application{}",
            if store.stages_blocks() {
                "blocks"
            } else {
                "small files, packed together,"
            },
            dirs_text(&cfg.cache_dirs),
            cfg.stage_bytes,
            if blocks > 0 {
                format!("; {blocks} blocks ({bytes} bytes) left staged by an earlier mount")
            } else {
                String::new()
            }
        );
    } else {
        tracing::info!("write-back off: close and fsync wait for the store");
    }
    Ok((store, backup_obj))
}

/// Antivirus scanning of what a client writes (`--scan`, `--scan-fail`).
#[derive(Clone, Debug)]
pub struct ScanConfig {
    /// clamd's address (`vfs::scan::clamd::Clamd::new` takes it; checked by the caller).
    pub url: String,
    pub fail: crate::vfs::scan::FailPolicy,
}

/// Starts scanning what `vfs` writes as `cfg` says; `events` gets the infected files and
/// those not scanned, `changed` the scanner's own changes of the namespace (None: nobody).
/// A scanner that does not answer now is warned about (files are then handled as
/// `--scan-fail` says until it does).
pub fn start_scanning(
    vfs: &crate::vfs::Vfs,
    cfg: &ScanConfig,
    events: crate::vfs::scan::Events,
    changed: Option<crate::meta::ChangeSink>,
) -> anyhow::Result<()> {
    use crate::vfs::scan::{FailPolicy, Scanner, clamd::Clamd};
    let clamd = Clamd::new(&cfg.url).map_err(anyhow::Error::msg)?;
    match clamd.ping() {
        Ok(()) => tracing::info!(
            "antivirus scanning on: files written are scanned by {} after their last close; \
             infected ones go to /{} (--scan-fail {})",
            clamd.describe(),
            String::from_utf8_lossy(crate::vfs::scan::QUARANTINE_DIR),
            match cfg.fail {
                FailPolicy::Open => "open",
                FailPolicy::Closed => "closed",
            }
        ),
        Err(e) => tracing::warn!(
            "{e}: files written are {} until it answers (--scan-fail {})",
            match cfg.fail {
                FailPolicy::Open => "readable unscanned",
                FailPolicy::Closed => "refused (EACCES)",
            },
            match cfg.fail {
                FailPolicy::Open => "open",
                FailPolicy::Closed => "closed",
            }
        ),
    }
    vfs.scan_with(Arc::new(clamd), cfg.fail, events, changed);
    Ok(())
}
