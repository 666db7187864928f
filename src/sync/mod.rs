//! `unkai sync SRC DST`: copies a tree of files between local directories and buckets
//! (`file://`, `s3://`, `gs://`, `az://`), incrementally, in parallel, with a closing summary.
//!
//! What it is for: bringing existing data in and out, like `juicefs sync` or `rclone copy`.
//! A bucket is an [`ObjectStorage`]; a local directory (a path or `file://`) is walked, read
//! and written here with `std::fs` (object_store's paths would re-encode names holding `%`,
//! `#` or a backslash, and it keeps no mtimes). Every file is written whole under its final name (a
//! temporary name, then a rename; S3 PUTs are atomic): a run killed half-way leaves no
//! partial file that a rerun would take as done, and the rerun copies only what is missing
//! or differs.
//!
//! Not for: volumes as an endpoint yet (META-URL[:/path] through `vfs` is issue 38's next
//! step: until then, mount the volume and give a path in the mount), empty directories,
//! permissions or symbolic links (`--dirs`, `--perms`, `--links`), or objects larger than
//! memory (each object is read whole, then written whole).

pub mod filter;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

use crate::object::{self, ObjectInfo, ObjectStorage, StorageUrl};

pub use filter::Filter;

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
    pub filter: Filter,
    /// Files copied at once.
    pub threads: usize,
    /// No progress bar.
    pub quiet: bool,
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

/// One side of a sync.
struct Endpoint {
    store: ObjectStorage,
    /// For a local directory: its path (mtimes are kept and compared there).
    local: Option<PathBuf>,
    /// As the user gave it, for messages.
    given: String,
}

const SCHEMES: &[&str] = &["file", "s3", "gs", "az", "memory"];

/// Opens SRC or DST. A local destination that does not exist is created (not in a dry run).
fn endpoint(given: &str, is_src: bool, dry_run: bool) -> anyhow::Result<Endpoint> {
    let role = if is_src { "source" } else { "destination" };
    if let Some((scheme, _)) = given.split_once("://") {
        if !SCHEMES.contains(&scheme) {
            anyhow::bail!(
                "{role} '{given}': volumes (META-URL) are not yet supported by unkai sync; \
                 mount the volume and give a path inside the mount, or give a directory or a \
                 storage URL (s3://bucket/prefix, file:///dir)"
            );
        }
        let local = match StorageUrl::parse(given)? {
            StorageUrl::Local(p) => Some(p),
            _ => None,
        };
        return match &local {
            Some(p) => local_endpoint(p, given, is_src, dry_run),
            None => Ok(Endpoint {
                store: ObjectStorage::open(given, false)?,
                local: None,
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
    let url = format!("file://{}", abs.display());
    let store = if abs.is_dir() {
        ObjectStorage::open(&url, false)?
    } else {
        ObjectStorage::open("memory://", false)?
    };
    Ok(Endpoint {
        store,
        local: Some(abs),
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

async fn listing(e: &Endpoint, is_src: bool, dry_run: bool) -> anyhow::Result<Vec<ObjectInfo>> {
    let role = if is_src { "source" } else { "destination" };
    if let Some(root) = &e.local {
        let root = root.clone();
        let found = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            walk_local(&root, &root, &mut out).map(|()| out)
        })
        .await?
        .map_err(|err| anyhow::anyhow!("{role} '{}': cannot list it: {err}", e.given))?;
        let (partial, whole): (Vec<_>, Vec<_>) =
            found.into_iter().partition(|o| is_partial(&o.key));
        if let Some(root) = e.local.as_ref().filter(|_| !is_src && !dry_run) {
            for p in partial {
                let _ = std::fs::remove_file(root.join(&p.key));
            }
        }
        return Ok(whole);
    }
    match e.store.list("").await {
        Ok(v) => {
            let (partial, whole): (Vec<_>, Vec<_>) =
                v.into_iter().map(decoded).partition(|o| is_partial(&o.key));
            if let Some(root) = e.local.as_ref().filter(|_| !is_src && !dry_run) {
                for p in partial {
                    let _ = std::fs::remove_file(root.join(&p.key));
                }
            }
            Ok(whole)
        }
        Err(err) if !is_src && object::is_missing_bucket(&err) => {
            // juicefs sync makes a missing destination bucket too.
            e.store.create_bucket().await.map_err(|m| {
                anyhow::anyhow!("destination '{}': the bucket is missing: {m}", e.given)
            })?;
            Ok(vec![])
        }
        Err(err) if object::is_missing_bucket(&err) => anyhow::bail!(
            "{role} '{}': the bucket does not exist; check its name (and the endpoint)",
            e.given
        ),
        Err(err) => anyhow::bail!(
            "{role} '{}': cannot list it: {}; check the URL, the endpoint and the credentials \
             (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)",
            e.given,
            object::one_line(&err.to_string())
        ),
    }
}

fn sha256(b: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .to_vec()
}

/// Whether the destination's copy must be replaced (or, with `--check-all`, `None`: only
/// the contents can tell).
fn differs(o: &Options, s: &ObjectInfo, d: &ObjectInfo, mtimes: bool) -> Option<bool> {
    if o.force_update {
        return Some(true);
    }
    if o.update {
        return Some(s.modified > d.modified);
    }
    if s.size != d.size || (mtimes && s.modified != d.modified) {
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
    let src = endpoint(&o.src, true, o.dry_run)?;
    // Before the destination is made: a loop changes nothing.
    if let (Some(s), Some(d)) = (&src.local, local_path(&o.dst).map(|d| resolved(&d)))
        && (d.starts_with(s) || s.starts_with(&d))
    {
        anyhow::bail!(
            "'{}' and '{}' overlap (one is inside the other): a sync would copy into its own \
             source; give separate directories",
            o.src,
            o.dst
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.threads.clamp(2, 16))
        .enable_all()
        .build()?;
    rt.block_on(async {
        let started = Instant::now();
        // The source is listed before the destination is touched: a bad source changes
        // nothing.
        let from = listing(&src, true, o.dry_run).await?;
        let dst = endpoint(&o.dst, false, o.dry_run)?;
        sync(o, &src, &dst, from, started).await
    })
}

enum Job<'a> {
    Copy(&'a ObjectInfo),
    /// Same size (and mtime): compare the contents.
    Check(&'a ObjectInfo),
    Delete(&'a ObjectInfo),
}

async fn sync(
    o: &Options,
    src: &Endpoint,
    dst: &Endpoint,
    from: Vec<ObjectInfo>,
    started: Instant,
) -> anyhow::Result<(Summary, Duration)> {
    let to = if dst.local.as_ref().is_some_and(|p| !p.is_dir()) {
        vec![]
    } else {
        listing(dst, false, o.dry_run).await?
    };
    let mtimes = src.local.is_some() && dst.local.is_some();
    let have: HashMap<&str, &ObjectInfo> = to.iter().map(|d| (d.key.as_str(), d)).collect();
    let mut jobs = Vec::new();
    let mut skipped = 0;
    let mut total = 0;
    for s in from.iter().filter(|s| o.filter.accepts(&s.key)) {
        match have.get(s.key.as_str()) {
            None => jobs.push(Job::Copy(s)),
            Some(d) => match differs(o, s, d, mtimes) {
                Some(true) => jobs.push(Job::Copy(s)),
                Some(false) => skipped += 1,
                None => jobs.push(Job::Check(s)),
            },
        }
        if let Some(Job::Copy(s)) = jobs.last() {
            total += s.size;
        }
    }
    if o.delete_dst {
        let keys: std::collections::HashSet<&str> = from.iter().map(|s| s.key.as_str()).collect();
        jobs.extend(
            to.iter()
                .filter(|d| !keys.contains(d.key.as_str()) && o.filter.accepts(&d.key))
                .map(Job::Delete),
        );
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
    let copied = AtomicU64::new(0);
    let deleted = AtomicU64::new(0);
    let same = AtomicU64::new(skipped);
    let bytes = AtomicU64::new(0);
    let failures = parking_lot::Mutex::new(Vec::<String>::new());
    futures::stream::iter(jobs)
        .for_each_concurrent(o.threads, |job| {
            let (pb, copied, deleted, same, bytes, failures) =
                (&pb, &copied, &deleted, &same, &bytes, &failures);
            async move {
                let key = match &job {
                    Job::Copy(s) | Job::Check(s) | Job::Delete(s) => s.key.clone(),
                };
                let r: anyhow::Result<()> = async {
                    match job {
                        Job::Delete(_) => {
                            if !o.dry_run {
                                dst.delete(&key).await?;
                            }
                            deleted.fetch_add(1, Ordering::Relaxed);
                        }
                        Job::Check(s) => {
                            let a = src.get(&key).await?;
                            let b = dst.get(&key).await?;
                            if sha256(&a) == sha256(&b) {
                                same.fetch_add(1, Ordering::Relaxed);
                            } else {
                                pb.inc_length(s.size);
                                copy(o, dst, s, a).await?;
                                pb.inc(s.size);
                                copied.fetch_add(1, Ordering::Relaxed);
                                bytes.fetch_add(s.size, Ordering::Relaxed);
                            }
                        }
                        Job::Copy(s) => {
                            if !o.dry_run {
                                let data = src.get(&key).await?;
                                copy(o, dst, s, data).await?;
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
    pb.finish_and_clear();
    let failures = failures.into_inner();
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

/// Writes one object whole under its name (nothing in a dry run), keeps the source's mtime
/// on a local destination, and with `--check-new` reads it back and compares.
async fn copy(
    o: &Options,
    dst: &Endpoint,
    s: &ObjectInfo,
    data: bytes::Bytes,
) -> anyhow::Result<()> {
    if o.dry_run {
        return Ok(());
    }
    if data.len() as u64 != s.size {
        anyhow::bail!(
            "the source changed while it was read ({} bytes listed, {} read); run again",
            s.size,
            data.len()
        );
    }
    let want = o.check_new.then(|| sha256(&data));
    match &dst.local {
        Some(root) => {
            let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(s.modified.max(0) as u64);
            let path = root.join(&s.key);
            let data = data.clone();
            tokio::task::spawn_blocking(move || write_local(&path, &data, at)).await??;
        }
        None => dst.store.put(&s.key, data).await?,
    }
    if let Some(want) = want {
        let got = dst.get(&s.key).await?;
        if sha256(&got) != want {
            anyhow::bail!("the copy read back differs from the source (SHA-256)");
        }
    }
    Ok(())
}

/// What starts the name of a file being written into a local directory: renamed to its
/// name once whole; one left by a killed run is removed by the next.
const PARTIAL: &str = ".unkai-sync.";

fn is_partial(key: &str) -> bool {
    key.rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with(PARTIAL) && n.ends_with(".tmp"))
}

/// Writes `data` to a temporary name beside `path`, with the mtime `at`, then renames it:
/// `path` is only ever whole.
fn write_local(path: &Path, data: &[u8], at: SystemTime) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!("{PARTIAL}{name}.{:08x}.tmp", rand::random::<u32>()));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, data)?;
        f.set_modified(at)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// The regular files under `dir` (symbolic links and special files are not synced yet),
/// keyed by their path from `root`.
fn walk_local(root: &Path, dir: &Path, out: &mut Vec<ObjectInfo>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let t = entry.file_type()?;
        let path = entry.path();
        if t.is_dir() {
            walk_local(root, &path, out)?;
        } else if t.is_file() {
            let m = entry.metadata()?;
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos() as i64);
            let Some(key) = path.strip_prefix(root).ok().and_then(|k| k.to_str()) else {
                tracing::warn!("{}: not UTF-8, skipped", path.display());
                continue;
            };
            out.push(ObjectInfo {
                key: key.to_string(),
                size: m.len(),
                modified,
            });
        }
    }
    Ok(())
}

impl Endpoint {
    async fn get(&self, key: &str) -> anyhow::Result<bytes::Bytes> {
        match &self.local {
            Some(root) => {
                let path = root.join(key);
                Ok(tokio::task::spawn_blocking(move || std::fs::read(path))
                    .await??
                    .into())
            }
            None => Ok(self.store.get(key).await?),
        }
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        match &self.local {
            Some(root) => {
                let path = root.join(key);
                match tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await? {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                    _ => Ok(()),
                }
            }
            None => Ok(self.store.delete(key).await?),
        }
    }
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
