//! `unkai sync SRC DST`: copies a tree of files between local directories, buckets
//! (`file://`, `s3://`, `gs://`, `az://`) and volumes (META-URL[:/path]), incrementally, in
//! parallel, streamed, with a closing summary.
//!
//! What it is for: bringing existing data in and out, like `juicefs sync` or `rclone copy`.
//! A bucket is an [`ObjectStorage`]; a local directory (a path or `file://`) is walked, read
//! and written here with `std::fs` (object_store's paths would re-encode names holding `%`,
//! `#` or a backslash, and it keeps no mtimes); a volume goes through the `vfs` of a client
//! opened in this process (`volume`: no mount needed; quotas, the trash and scanning apply).
//! Files are streamed in pieces of [`PIECE`] bytes (a bucket destination alone holds one
//! object's pieces until its PUT), and the SHA-256 of what was read is compared with what
//! the destination holds under `--check-new`. Every file is written whole under its final
//! name (a temporary name, then a rename; S3 PUTs are atomic): a run killed half-way leaves
//! no partial file that a rerun would take as done, and the rerun copies only what is
//! missing or differs.
//!
//! Not for: permissions, directories or symbolic links on a bucket (`--perms`, `--dirs`
//! and `--links` apply between local directories and volumes; `--dirs` keeps a bucket's
//! directories as `dir/` objects), or a path inside a mount as a volume (it is a local
//! directory, read and written through the kernel).

pub mod filter;
pub mod volume;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

use crate::object::{self, ObjectInfo, ObjectStorage, StorageUrl};

pub use filter::Filter;

/// Bytes read and written at once per file.
pub const PIECE: usize = 8 << 20;

/// Set by SIGINT or SIGTERM while a volume is open: no new file is started.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// What to sync and how.
pub struct Options {
    pub src: String,
    pub dst: String,
    /// Copy an existing file only when the source's is newer.
    pub update: bool,
    /// Copy every file, whatever the destination has.
    pub force_update: bool,
    /// Compare the contents (SHA-256) of files that look the same.
    pub check_all: bool,
    /// Read back every copied file and compare its SHA-256 with the source's.
    pub check_new: bool,
    pub dry_run: bool,
    /// Delete files of the destination the source does not have.
    pub delete_dst: bool,
    /// Delete each file of the source once the destination has it.
    pub delete_src: bool,
    /// Sync directories too (empty ones included).
    pub dirs: bool,
    /// Keep permission bits (between local directories and volumes).
    pub perms: bool,
    /// Copy symbolic links as links (between local directories and volumes).
    pub links: bool,
    pub filter: Filter,
    /// Files copied at once.
    pub threads: usize,
    /// Directories listed at once.
    pub list_threads: usize,
    /// Bytes per second read from the source, all files together (None: no limit).
    pub bwlimit: Option<u64>,
    /// No progress bar.
    pub quiet: bool,
    /// Opens a volume's client from its META-URL (None: volumes are refused).
    pub open_volume: Option<Box<volume::Opener>>,
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub copied: u64,
    pub skipped: u64,
    pub deleted: u64,
    pub failed: u64,
    pub bytes: u64,
    /// The first failure, as `key: error`.
    pub first_failure: Option<String>,
}

/// What an entry of a tree is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EKind {
    File,
    Dir,
    /// A symbolic link, and its target.
    Link(Vec<u8>),
}

/// One entry of a tree, keyed by its `/`-separated path from the endpoint's root.
#[derive(Clone, Debug)]
pub struct Entry {
    pub key: String,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub modified: i64,
    /// Permission bits (0: unknown, on a bucket).
    pub mode: u32,
    pub kind: EKind,
}

impl Entry {
    fn of(o: ObjectInfo) -> Entry {
        Entry {
            key: o.key,
            size: o.size,
            modified: o.modified,
            mode: 0,
            kind: EKind::File,
        }
    }
}

/// Where one side of a sync lives.
enum Side {
    /// A local directory (mtimes are kept and compared there).
    Local(PathBuf),
    Store(ObjectStorage),
    Volume(Arc<volume::Vol>),
}

/// One side of a sync.
struct Endpoint {
    side: Side,
    /// As the user gave it, for messages.
    given: String,
}

const SCHEMES: &[&str] = &["file", "s3", "gs", "az", "memory"];
const VOLUME_SCHEMES: &[&str] = &["sqlite", "sqlite3", "postgres", "postgresql"];

/// Opens SRC or DST. A local destination that does not exist is created (not in a dry run).
fn endpoint(o: &Options, given: &str, is_src: bool) -> anyhow::Result<Endpoint> {
    let role = if is_src { "source" } else { "destination" };
    let dry_run = o.dry_run;
    if let Some((scheme, _)) = given.split_once("://") {
        if VOLUME_SCHEMES.contains(&scheme) {
            let v = volume::open(o.open_volume.as_deref(), given, is_src, dry_run)?;
            return Ok(Endpoint {
                side: Side::Volume(Arc::new(v)),
                given: given.into(),
            });
        }
        if !SCHEMES.contains(&scheme) {
            anyhow::bail!(
                "{role} '{given}': unknown scheme '{scheme}'; give a directory, a storage URL \
                 (s3://bucket/prefix, gs://, az://, file:///dir) or a volume's META-URL[:/path] \
                 (sqlite:///..., postgres://...)"
            );
        }
        return match StorageUrl::parse(given)? {
            StorageUrl::Local(p) => local_endpoint(&p, given, is_src, dry_run),
            _ => Ok(Endpoint {
                side: Side::Store(ObjectStorage::open(given, false)?),
                given: given.into(),
            }),
        };
    }
    local_endpoint(Path::new(given), given, is_src, dry_run)
}

fn local_endpoint(
    path: &Path,
    given: &str,
    is_src: bool,
    dry_run: bool,
) -> anyhow::Result<Endpoint> {
    if is_src {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => anyhow::bail!(
                "source '{given}' is not a directory; give a directory (its contents are synced) \
                 or a storage URL such as s3://bucket/prefix"
            ),
            Err(e) => anyhow::bail!(
                "source '{given}': {e}; give an existing directory or a storage URL such as \
                 s3://bucket/prefix"
            ),
        }
    } else if !dry_run {
        std::fs::create_dir_all(path).map_err(|e| {
            anyhow::anyhow!(
                "destination '{given}': cannot create it: {e}; give a writable directory"
            )
        })?;
    }
    let abs = match std::fs::canonicalize(path) {
        Ok(p) => p,
        // A dry run to a directory not made yet: nothing there.
        Err(_) if !is_src && dry_run => std::path::absolute(path)?,
        Err(e) => anyhow::bail!("{given}: {e}"),
    };
    Ok(Endpoint {
        side: Side::Local(abs),
        given: given.into(),
    })
}

/// The local directory an endpoint names, if it names one.
fn local_path(given: &str) -> Option<PathBuf> {
    if !given.contains("://") {
        return Some(PathBuf::from(given));
    }
    match StorageUrl::parse(given) {
        Ok(StorageUrl::Local(p)) => Some(p),
        _ => None,
    }
}

/// `p` absolute, with its symbolic links resolved as far as it exists.
fn resolved(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut base = abs.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(base) {
            return rest.iter().rev().fold(c, |acc, n| acc.join(n));
        }
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                base = parent;
            }
            _ => return abs,
        }
    }
}

/// Keys as listings give them are percent-encoded where object_store's paths need it;
/// the store encodes them again on the way in.
fn decoded(mut o: ObjectInfo) -> ObjectInfo {
    o.key = percent_encoding::percent_decode_str(&o.key)
        .decode_utf8_lossy()
        .into_owned();
    o
}

/// One directory's entries, and its subdirectories to walk next (with their key prefixes).
pub type Listed<D> = (Vec<Entry>, Vec<(D, String)>);

/// Walks a tree level by level, `threads` directories listed at once: `list` gives one
/// directory's entries and its subdirectories (with their key prefixes).
fn walk_tree<D: Send + Sync>(
    threads: usize,
    root: D,
    list: impl Fn(&D, &str) -> anyhow::Result<Listed<D>> + Sync,
) -> anyhow::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut level = vec![(root, String::new())];
    while !level.is_empty() {
        let per = level.len().div_ceil(threads.max(1));
        let list = &list;
        let done: Vec<anyhow::Result<Listed<D>>> = std::thread::scope(|s| {
            let handles: Vec<_> = level
                .chunks(per)
                .map(|c| s.spawn(move || c.iter().map(|(d, p)| list(d, p)).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join()
                        .unwrap_or_else(|_| vec![Err(anyhow::anyhow!("a listing thread panicked"))])
                })
                .collect()
        });
        let mut next = Vec::new();
        for r in done {
            let (e, subs) = r?;
            out.extend(e);
            next.extend(subs);
        }
        level = next;
    }
    Ok(out)
}

async fn listing(o: &Options, e: &Endpoint, is_src: bool) -> anyhow::Result<Vec<Entry>> {
    let role = if is_src { "source" } else { "destination" };
    let remove_partial = !is_src && !o.dry_run;
    let (dirs, links, threads) = (o.dirs, o.links, o.list_threads);
    match &e.side {
        Side::Local(root) => {
            if !root.is_dir() {
                return Ok(vec![]);
            }
            let root = root.clone();
            tokio::task::spawn_blocking(move || {
                walk_tree(threads, root.clone(), |dir, prefix| {
                    list_local(dir, prefix, dirs, links, remove_partial)
                })
            })
            .await?
            .map_err(|err| anyhow::anyhow!("{role} '{}': cannot list it: {err:#}", e.given))
        }
        Side::Volume(v) => {
            if !v.exists() {
                return Ok(vec![]);
            }
            let v = v.clone();
            tokio::task::spawn_blocking(move || {
                walk_tree(threads, v.root(), |dir, prefix| {
                    v.list_dir(*dir, prefix, dirs, links, remove_partial)
                })
            })
            .await?
            .map_err(|err| anyhow::anyhow!("{role} '{}': cannot list it: {err:#}", e.given))
        }
        Side::Store(store) => match store.list("").await {
            Ok(v) => Ok(v
                .into_iter()
                .map(decoded)
                .filter_map(|o| match o.key.strip_suffix('/') {
                    Some(dir) if dirs => Some(Entry {
                        key: dir.to_string(),
                        kind: EKind::Dir,
                        ..Entry::of(o.clone())
                    }),
                    Some(_) => None,
                    None => Some(Entry::of(o)),
                })
                .filter(|e| !is_partial(&e.key))
                .collect()),
            Err(err) if !is_src && object::is_missing_bucket(&err) => {
                if o.dry_run {
                    return Ok(vec![]);
                }
                // juicefs sync makes a missing destination bucket too.
                store.create_bucket().await.map_err(|m| {
                    anyhow::anyhow!("destination '{}': the bucket is missing: {m}", e.given)
                })?;
                Ok(vec![])
            }
            Err(err) if object::is_missing_bucket(&err) => anyhow::bail!(
                "{role} '{}': the bucket does not exist; check its name (and the endpoint)",
                e.given
            ),
            Err(err) => anyhow::bail!(
                "{role} '{}': cannot list it: {}; check the URL, the endpoint and the \
                 credentials (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)",
                e.given,
                object::one_line(&err.to_string())
            ),
        },
    }
}

/// Whether the destination's copy must be replaced (or, with `--check-all`, `None`: only
/// the contents can tell).
fn differs(o: &Options, s: &Entry, d: &Entry, mtimes: bool) -> Option<bool> {
    if s.kind != d.kind {
        return Some(true);
    }
    let perms = o.perms && s.mode != 0 && d.mode != 0 && s.mode != d.mode;
    match s.kind {
        EKind::Dir => return Some(perms),
        EKind::Link(_) => return Some(perms),
        EKind::File => {}
    }
    if o.force_update {
        return Some(true);
    }
    if o.update {
        return Some(s.modified > d.modified);
    }
    if s.size != d.size || (mtimes && s.modified != d.modified) || perms {
        return Some(true);
    }
    if o.check_all { None } else { Some(false) }
}

/// Runs a sync; the summary is printed by the caller. Fails only when it cannot start
/// (bad endpoints, a loop, a listing that fails); failed files are counted in the summary.
pub fn run(o: &Options) -> anyhow::Result<(Summary, Duration)> {
    if o.threads == 0 || o.threads > 1024 {
        anyhow::bail!("invalid --threads {}: use 1 to 1024", o.threads);
    }
    if o.list_threads == 0 || o.list_threads > 1024 {
        anyhow::bail!("invalid --list-threads {}: use 1 to 1024", o.list_threads);
    }
    if o.delete_src && o.delete_dst {
        anyhow::bail!("--delete-src and --delete-dst together would empty both sides; give one");
    }
    // Before anything is opened: a loop changes nothing.
    if let (Some(s), Some(d)) = (
        local_path(&o.src).map(|s| resolved(&s)),
        local_path(&o.dst).map(|d| resolved(&d)),
    ) && (d.starts_with(&s) || s.starts_with(&d))
    {
        anyhow::bail!(
            "'{}' and '{}' overlap (one is inside the other): a sync would copy into its own \
             source; give separate directories",
            o.src,
            o.dst
        );
    }
    let src = endpoint(o, &o.src, true)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.threads.clamp(2, 16))
        .enable_all()
        .build()?;
    let started = Instant::now();
    // The source is listed before the destination is touched: a bad source changes
    // nothing. A volume is opened outside the runtime (its data side starts its own).
    let res = rt
        .block_on(listing(o, &src, true))
        .and_then(|from| Ok((from, endpoint(o, &o.dst, false)?)));
    let (from, dst) = match res {
        Ok(x) => x,
        Err(e) => {
            if let Side::Volume(v) = &src.side {
                let _ = v.close();
            }
            return Err(e);
        }
    };
    let res = rt.block_on(async {
        match (&src.side, &dst.side) {
            (Side::Volume(a), Side::Volume(b))
                if a.uuid() == b.uuid()
                    && (b.is_under(b.root(), a.root()) || a.is_under(a.root(), b.root())) =>
            {
                Err(anyhow::anyhow!(
                    "'{}' and '{}' overlap (one is inside the other) in the same volume: a \
                     sync would copy into its own source; give separate directories",
                    o.src,
                    o.dst
                ))
            }
            _ => sync(o, &src, &dst, from, started).await,
        }
    });
    drop(rt);
    if let Side::Volume(v) = &dst.side {
        let closed = v.close();
        if res.is_ok() {
            closed.map_err(|e| anyhow::anyhow!("closing '{}': {e:#}", dst.given))?;
        }
    }
    if let Side::Volume(v) = &src.side {
        let _ = v.close();
    }
    res
}

enum Job<'a> {
    Copy(&'a Entry),
    /// Same size (and mtime): compare the contents.
    Check(&'a Entry),
    Delete(&'a Entry),
    /// The destination has it: delete it from the source (`--delete-src`).
    DeleteSrc(&'a Entry),
}

async fn sync(
    o: &Options,
    src: &Endpoint,
    dst: &Endpoint,
    from: Vec<Entry>,
    started: Instant,
) -> anyhow::Result<(Summary, Duration)> {
    let to = listing(o, dst, false).await?;
    let mtimes = !matches!(src.side, Side::Store(_)) && !matches!(dst.side, Side::Store(_));
    let have: HashMap<&str, &Entry> = to.iter().map(|d| (d.key.as_str(), d)).collect();
    let mut jobs = Vec::new();
    let mut skipped = 0;
    let mut total = 0;
    let mut later = Vec::new();
    for s in from.iter().filter(|s| accepts(o, s)) {
        match have.get(s.key.as_str()) {
            None => jobs.push(Job::Copy(s)),
            Some(d) => match differs(o, s, d, mtimes) {
                Some(true) => jobs.push(Job::Copy(s)),
                Some(false) => {
                    skipped += 1;
                    if o.delete_src {
                        later.push(Job::DeleteSrc(s));
                    }
                }
                None => jobs.push(Job::Check(s)),
            },
        }
        if let Some(Job::Copy(s)) = jobs.last() {
            total += s.size;
        }
    }
    // Directories first (their files go in them), in order.
    jobs.sort_by_key(|j| {
        !matches!(
            j,
            Job::Copy(Entry {
                kind: EKind::Dir,
                ..
            })
        )
    });
    jobs.extend(later);
    if o.delete_dst {
        let keys: HashSet<&str> = from.iter().map(|s| s.key.as_str()).collect();
        let mut gone: Vec<_> = to
            .iter()
            .filter(|d| !keys.contains(d.key.as_str()) && accepts(o, d))
            .collect();
        // Directories last, deepest first (they are empty by then).
        gone.sort_by_key(|d| (d.kind == EKind::Dir, std::cmp::Reverse(d.key.len())));
        jobs.extend(gone.into_iter().map(Job::Delete));
    }
    let pb = if o.quiet {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::new(total);
        pb.set_style(
            ProgressStyle::with_template(
                "syncing {bar:40} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    };
    let rate = o.bwlimit.map(object::throttle::Rate::new);
    let copied = AtomicU64::new(0);
    let deleted = AtomicU64::new(0);
    let same = AtomicU64::new(skipped);
    let bytes = AtomicU64::new(0);
    let failures = parking_lot::Mutex::new(Vec::<String>::new());
    // Directories (made or deleted) go one at a time, before or after the files.
    let (ordered, parallel): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| {
        matches!(
            j,
            Job::Copy(Entry {
                kind: EKind::Dir,
                ..
            }) | Job::Delete(Entry {
                kind: EKind::Dir,
                ..
            })
        )
    });
    let (dir_makes, dir_deletes): (Vec<_>, Vec<_>) =
        ordered.into_iter().partition(|j| matches!(j, Job::Copy(_)));
    for (batch, width) in [(dir_makes, 1), (parallel, o.threads), (dir_deletes, 1)] {
        futures::stream::iter(batch)
            .for_each_concurrent(width, |job| {
                let (pb, copied, deleted, same, bytes, failures, rate) =
                    (&pb, &copied, &deleted, &same, &bytes, &failures, &rate);
                async move {
                    if STOP.load(Ordering::Relaxed) {
                        return;
                    }
                    let key = match &job {
                        Job::Copy(s) | Job::Check(s) | Job::Delete(s) | Job::DeleteSrc(s) => {
                            s.key.clone()
                        }
                    };
                    let r: anyhow::Result<()> = async {
                        match job {
                            Job::Delete(d) => {
                                if !o.dry_run {
                                    dst.delete(d).await?;
                                }
                                deleted.fetch_add(1, Ordering::Relaxed);
                            }
                            Job::DeleteSrc(s) => {
                                if !o.dry_run {
                                    src.delete(s).await?;
                                }
                            }
                            Job::Check(s) => {
                                let a = src.hash(&key, rate.as_ref()).await?;
                                let b = dst.hash(&key, None).await?;
                                if a == b {
                                    same.fetch_add(1, Ordering::Relaxed);
                                } else {
                                    pb.inc_length(s.size);
                                    copy(o, src, dst, s, rate.as_ref()).await?;
                                    pb.inc(s.size);
                                    copied.fetch_add(1, Ordering::Relaxed);
                                    bytes.fetch_add(s.size, Ordering::Relaxed);
                                }
                                if o.delete_src && !o.dry_run {
                                    src.delete(s).await?;
                                }
                            }
                            Job::Copy(s) => {
                                copy(o, src, dst, s, rate.as_ref()).await?;
                                if o.delete_src && !o.dry_run {
                                    src.delete(s).await?;
                                }
                                pb.inc(s.size);
                                copied.fetch_add(1, Ordering::Relaxed);
                                bytes.fetch_add(s.size, Ordering::Relaxed);
                            }
                        }
                        Ok(())
                    }
                    .await;
                    if let Err(e) = r {
                        failures.lock().push(format!("{key}: {e:#}"));
                    }
                    pb.set_message(format!(
                        "{} copied, {} deleted",
                        copied.load(Ordering::Relaxed),
                        deleted.load(Ordering::Relaxed)
                    ));
                }
            })
            .await;
    }
    pb.finish_and_clear();
    let failures = failures.into_inner();
    if STOP.load(Ordering::Relaxed) {
        tracing::warn!("stopped by a signal: run the same command again to finish");
    }
    Ok((
        Summary {
            copied: copied.into_inner(),
            skipped: same.into_inner(),
            deleted: deleted.into_inner(),
            failed: failures.len() as u64,
            bytes: bytes.into_inner(),
            first_failure: failures.into_iter().next(),
        },
        started.elapsed(),
    ))
}

fn accepts(o: &Options, e: &Entry) -> bool {
    match e.kind {
        EKind::Dir => o.filter.accepts_dir(&e.key),
        _ => o.filter.accepts(&e.key),
    }
}

/// An open source file.
enum Reader {
    Local(Arc<std::fs::File>),
    Store(String),
    Volume(Arc<volume::Vol>, u64),
}

/// A destination file being written under a temporary name.
enum Writer {
    Local {
        tmp: PathBuf,
        file: Arc<std::fs::File>,
        path: PathBuf,
    },
    Store(String, Vec<bytes::Bytes>),
    Volume(Arc<volume::Vol>, (crate::meta::Ino, String, u64)),
}

impl Endpoint {
    async fn open_read(&self, key: &str) -> anyhow::Result<Reader> {
        Ok(match &self.side {
            Side::Local(root) => {
                let path = root.join(key);
                Reader::Local(Arc::new(
                    tokio::task::spawn_blocking(move || std::fs::File::open(path)).await??,
                ))
            }
            Side::Store(_) => Reader::Store(key.to_string()),
            Side::Volume(v) => {
                let (v, k) = (v.clone(), key.to_string());
                let fh = tokio::task::spawn_blocking({
                    let v = v.clone();
                    move || v.open_read(&k)
                })
                .await??;
                Reader::Volume(v, fh)
            }
        })
    }

    /// Up to `len` bytes at `off` of `r` (fewer only at its end); `size` is the listed size.
    async fn read(
        &self,
        r: &Reader,
        off: u64,
        len: usize,
        size: u64,
    ) -> anyhow::Result<bytes::Bytes> {
        Ok(match (r, &self.side) {
            (Reader::Local(f), _) => {
                let f = f.clone();
                tokio::task::spawn_blocking(move || -> std::io::Result<bytes::Bytes> {
                    use std::os::unix::fs::FileExt;
                    let mut buf = vec![0u8; len];
                    let mut n = 0;
                    while n < len {
                        let got = f.read_at(&mut buf[n..], off + n as u64)?;
                        if got == 0 {
                            break;
                        }
                        n += got;
                    }
                    buf.truncate(n);
                    Ok(buf.into())
                })
                .await??
            }
            (Reader::Store(key), Side::Store(s)) => {
                let end = (off + len as u64).min(size);
                if off >= end {
                    bytes::Bytes::new()
                } else {
                    s.get_range(key, off..end).await?
                }
            }
            (Reader::Volume(v, fh), _) => {
                let (v, fh) = (v.clone(), *fh);
                tokio::task::spawn_blocking(move || v.read(fh, off, len))
                    .await??
                    .into()
            }
            (Reader::Store(_), _) => anyhow::bail!("a reader of another endpoint"),
        })
    }

    async fn close_read(&self, r: Reader) {
        if let Reader::Volume(v, fh) = r {
            let _ = tokio::task::spawn_blocking(move || v.release(fh)).await;
        }
    }

    /// The SHA-256 of `key`'s contents, streamed.
    async fn hash(
        &self,
        key: &str,
        rate: Option<&object::throttle::Rate>,
    ) -> anyhow::Result<Vec<u8>> {
        let size = match &self.side {
            Side::Store(s) => s
                .list(key)
                .await?
                .into_iter()
                .map(decoded)
                .find(|o| o.key == key)
                .map(|o| o.size)
                .ok_or_else(|| anyhow::anyhow!("{key}: not found"))?,
            _ => u64::MAX,
        };
        let r = self.open_read(key).await?;
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        let mut off = 0;
        let res = loop {
            match self.read(&r, off, PIECE, size).await {
                Ok(b) if b.is_empty() => break Ok(()),
                Ok(b) => {
                    if let Some(rate) = rate {
                        rate.take(b.len() as u64).await;
                    }
                    h.update(&b);
                    off += b.len() as u64;
                }
                Err(e) => break Err(e),
            }
        };
        self.close_read(r).await;
        res?;
        Ok(h.finish().as_ref().to_vec())
    }

    async fn open_write(&self, key: &str) -> anyhow::Result<Writer> {
        Ok(match &self.side {
            Side::Local(root) => {
                let path = root.join(key);
                let (tmp, file) = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || -> std::io::Result<(PathBuf, std::fs::File)> {
                        let dir = path.parent().unwrap_or(Path::new("/"));
                        std::fs::create_dir_all(dir)?;
                        let name = path.file_name().unwrap_or_default().to_string_lossy();
                        let tmp =
                            dir.join(format!("{PARTIAL}{name}.{:08x}.tmp", rand::random::<u32>()));
                        let f = std::fs::File::create(&tmp)?;
                        Ok((tmp, f))
                    }
                })
                .await??;
                Writer::Local {
                    tmp,
                    file: Arc::new(file),
                    path,
                }
            }
            Side::Store(_) => Writer::Store(key.to_string(), Vec::new()),
            Side::Volume(v) => {
                let (v2, k) = (v.clone(), key.to_string());
                Writer::Volume(
                    v.clone(),
                    tokio::task::spawn_blocking(move || v2.create_tmp(&k)).await??,
                )
            }
        })
    }

    async fn write(&self, w: &mut Writer, off: u64, data: bytes::Bytes) -> anyhow::Result<()> {
        match w {
            Writer::Local { file, .. } => {
                let f = file.clone();
                tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    f.write_all_at(&data, off)
                })
                .await??
            }
            Writer::Store(_, parts) => parts.push(data),
            Writer::Volume(v, t) => {
                let (v, fh) = (v.clone(), t.2);
                tokio::task::spawn_blocking(move || v.write(fh, off, &data)).await??
            }
        }
        Ok(())
    }

    /// Puts the file written in place, with the source's mtime (and mode).
    async fn finish(&self, w: Writer, s: &Entry, mode: Option<u32>) -> anyhow::Result<()> {
        match w {
            Writer::Local { tmp, file, path } => {
                let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(s.modified.max(0) as u64);
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    let r = (|| {
                        file.set_modified(at)?;
                        if let Some(m) = mode {
                            use std::os::unix::fs::PermissionsExt;
                            file.set_permissions(std::fs::Permissions::from_mode(m))?;
                        }
                        drop(file);
                        std::fs::rename(&tmp, &path)
                    })();
                    if r.is_err() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                    r
                })
                .await??
            }
            Writer::Store(key, parts) => match &self.side {
                Side::Store(st) => {
                    st.put(&key, parts.into_iter().collect::<object::Payload>())
                        .await?
                }
                _ => anyhow::bail!("a writer of another endpoint"),
            },
            Writer::Volume(v, t) => {
                let (key, mtime) = (s.key.clone(), s.modified);
                tokio::task::spawn_blocking(move || v.finish(t, &key, mtime, mode)).await??
            }
        }
        Ok(())
    }

    async fn abort(&self, w: Writer) {
        match w {
            Writer::Local { tmp, .. } => {
                let _ = std::fs::remove_file(tmp);
            }
            Writer::Store(..) => {}
            Writer::Volume(v, t) => {
                let _ = tokio::task::spawn_blocking(move || v.abort(t)).await;
            }
        }
    }

    /// Makes directory or link `s` (nothing else is made whole this way).
    async fn make(&self, s: &Entry, mode: Option<u32>) -> anyhow::Result<()> {
        let key = s.key.clone();
        match (&self.side, &s.kind) {
            (Side::Local(root), EKind::Dir) => {
                let path = root.join(&key);
                let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(s.modified.max(0) as u64);
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    std::fs::create_dir_all(&path)?;
                    if let Some(m) = mode {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m))?;
                    }
                    std::fs::File::open(&path)?.set_modified(at)
                })
                .await??
            }
            (Side::Local(root), EKind::Link(target)) => {
                let path = root.join(&key);
                let target = PathBuf::from(
                    <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(target),
                );
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    if let Some(d) = path.parent() {
                        std::fs::create_dir_all(d)?;
                    }
                    match std::fs::remove_file(&path) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                    std::os::unix::fs::symlink(target, &path)
                })
                .await??
            }
            (Side::Volume(v), EKind::Dir) => {
                let (v, mtime) = (v.clone(), s.modified);
                tokio::task::spawn_blocking(move || v.mkdir(&key, mtime, mode)).await??
            }
            (Side::Volume(v), EKind::Link(target)) => {
                let (v, target) = (v.clone(), target.clone());
                tokio::task::spawn_blocking(move || v.symlink(&key, &target)).await??
            }
            (Side::Store(st), EKind::Dir) => {
                st.put(&format!("{key}/"), bytes::Bytes::new()).await?
            }
            (Side::Store(_), EKind::Link(_)) => anyhow::bail!(
                "a bucket keeps no symbolic links; leave out --links, or sync to a directory or \
                 a volume"
            ),
            (_, EKind::File) => anyhow::bail!("a file is copied, not made"),
        }
        Ok(())
    }

    async fn delete(&self, e: &Entry) -> anyhow::Result<()> {
        let key = e.key.clone();
        let is_dir = e.kind == EKind::Dir;
        match &self.side {
            Side::Local(root) => {
                let path = root.join(&key);
                let r = tokio::task::spawn_blocking(move || {
                    if is_dir {
                        std::fs::remove_dir(path)
                    } else {
                        std::fs::remove_file(path)
                    }
                })
                .await?;
                match r {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                    _ => Ok(()),
                }
            }
            Side::Store(st) if is_dir => Ok(st.delete(&format!("{key}/")).await?),
            Side::Store(st) => Ok(st.delete(&key).await?),
            Side::Volume(v) => {
                let v = v.clone();
                tokio::task::spawn_blocking(move || v.delete(&key, is_dir)).await?
            }
        }
    }
}

/// Copies one entry (nothing in a dry run): a file streamed in pieces under a temporary
/// name then put in place with the source's mtime; with `--check-new` the destination's
/// SHA-256 is compared with that of the bytes read.
async fn copy(
    o: &Options,
    src: &Endpoint,
    dst: &Endpoint,
    s: &Entry,
    rate: Option<&object::throttle::Rate>,
) -> anyhow::Result<()> {
    if o.dry_run {
        return Ok(());
    }
    let mode = (o.perms && s.mode != 0).then_some(s.mode);
    if s.kind != EKind::File {
        return dst.make(s, mode).await;
    }
    let r = src.open_read(&s.key).await?;
    let mut w = match dst.open_write(&s.key).await {
        Ok(w) => w,
        Err(e) => {
            src.close_read(r).await;
            return Err(e);
        }
    };
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let mut off = 0u64;
    let res = async {
        loop {
            // One byte past the listed size: a file that grew is seen.
            let want = PIECE.min((s.size - off.min(s.size)) as usize + 1);
            let b = src.read(&r, off, want, s.size).await?;
            if b.is_empty() {
                return Ok(());
            }
            if let Some(rate) = rate {
                rate.take(b.len() as u64).await;
            }
            h.update(&b);
            off += b.len() as u64;
            if off > s.size {
                anyhow::bail!("the source grew while it was read; run again");
            }
            dst.write(&mut w, off - b.len() as u64, b).await?;
            if off == s.size && matches!(r, Reader::Store(_)) {
                return Ok(());
            }
        }
    }
    .await;
    src.close_read(r).await;
    let res = res.and_then(|()| {
        if off != s.size {
            anyhow::bail!(
                "the source changed while it was read ({} bytes listed, {off} read); run again",
                s.size
            );
        }
        Ok(())
    });
    if let Err(e) = res {
        dst.abort(w).await;
        return Err(e);
    }
    dst.finish(w, s, mode).await?;
    if o.check_new {
        let want = h.finish().as_ref().to_vec();
        if dst.hash(&s.key, None).await? != want {
            anyhow::bail!("the copy read back differs from the source (SHA-256)");
        }
    }
    Ok(())
}

/// What starts the name of a file being written: renamed to its name once whole; one left
/// by a killed run is removed by the next.
pub(crate) const PARTIAL: &str = ".unkai-sync.";

pub(crate) fn is_partial(key: &str) -> bool {
    key.rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with(PARTIAL) && n.ends_with(".tmp"))
}

/// One local directory's entries: regular files, and with `dirs`/`links` directories and
/// symbolic links (other kinds are not synced), keyed by `prefix` and their name; and its
/// subdirectories. A destination's partial files left by a killed run are removed.
fn list_local(
    dir: &Path,
    prefix: &str,
    dirs: bool,
    links: bool,
    remove_partial: bool,
) -> anyhow::Result<Listed<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut subs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let t = entry.file_type()?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            tracing::warn!("{}: not UTF-8, skipped", path.display());
            continue;
        };
        let key = format!("{prefix}{name}");
        if !(t.is_dir() || t.is_file() || (t.is_symlink() && links)) {
            continue;
        }
        let m = std::fs::symlink_metadata(&path)?;
        let modified = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i64);
        let mode = m.permissions().mode() & 0o7777;
        let kind = if t.is_dir() {
            subs.push((path.clone(), format!("{key}/")));
            if !dirs {
                continue;
            }
            EKind::Dir
        } else if t.is_symlink() {
            use std::os::unix::ffi::OsStrExt;
            EKind::Link(std::fs::read_link(&path)?.as_os_str().as_bytes().to_vec())
        } else if is_partial(&key) {
            if remove_partial {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        } else {
            EKind::File
        };
        let size = match &kind {
            EKind::Link(t) => t.len() as u64,
            EKind::Dir => 0,
            EKind::File => m.len(),
        };
        out.push(Entry {
            key,
            size,
            modified,
            mode,
            kind,
        });
    }
    Ok((out, subs))
}

/// The closing line.
pub fn summary_line(s: &Summary, took: Duration, dry_run: bool) -> String {
    let secs = took.as_secs_f64();
    format!(
        "{}copied {}, skipped {}, deleted {}, failed {}, {} bytes in {secs:.1} s ({:.1} MB/s)",
        if dry_run {
            "dry run (nothing changed): "
        } else {
            ""
        },
        s.copied,
        s.skipped,
        s.deleted,
        s.failed,
        s.bytes,
        s.bytes as f64 / secs.max(1e-3) / 1e6
    )
}
