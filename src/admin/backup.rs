//! Automatic backups of a volume's metadata into its own bucket (`mount --backup-meta`, as
//! JuiceFS): a compressed dump (`dump`) under `NAME/UUID/meta/dump-YYYY-MM-DD-HHMMSS.json.zst`
//! every interval, the newest [`KEEP`] kept. Of all the mounts of a volume, the one that
//! claims a backup makes it: the claim is the setting `lastBackup`, moved in a transaction
//! only if it still holds what the claimant read, so that two mounts never both win.
//!
//! A backup runs in a thread of its own at the lowest CPU and I/O priority, reads the volume
//! through connections of its own (the mount's writer is never held), and streams: the dump
//! goes to a temporary file in the cache directory (the read snapshot lasts only as long as
//! the local write), then that file is uploaded.
//!
//! Not for: what a dump holds (`dump`), restoring (`unkai load` of a downloaded backup).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use indicatif::ProgressBar;

use super::dump::{self, CLAIM_SETTING};
use crate::data::layout::Layout;
use crate::meta::url::MetaUrl;
use crate::meta::{Format, Meta, Nanos, now_nanos};
use crate::object::{ObjectStorage, Payload};

/// Backups kept in the bucket: the newest 24 (a day of hourly backups); older ones are
/// deleted after each new one.
pub const KEEP: usize = 24;
/// The longest wait between two looks at whether a backup is due.
const MAX_TICK: Duration = Duration::from_secs(60);
/// Bytes of the temporary file read per part of the upload.
const PART: usize = 8 << 20;

/// When and how to back up, as `mount` was told.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Time between two backups of the volume (made by whichever mount claims each).
    pub every: Duration,
    /// The volume's META-URL: a backup opens connections of its own.
    pub meta_url: String,
    /// Where the dump is written before its upload (a cache directory).
    pub tmp_dir: PathBuf,
}

/// The name of a backup made at `t`: `dump-YYYY-MM-DD-HHMMSS.json.zst` (UTC), which sorts in
/// time order.
pub fn backup_name(t: Nanos) -> String {
    let secs = t.div_euclid(1_000_000_000).rem_euclid(3600);
    format!(
        "dump-{}{:02}{:02}.json.zst",
        crate::meta::trash::hour_name(t),
        secs / 60,
        secs % 60
    )
}

/// Whether `key` names a backup (under the volume's backups prefix).
fn is_backup(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or("");
    name.starts_with("dump-") && name.ends_with(".json.zst")
}

/// Claims the backup due at `now` for this client: true if the last one claimed (or, when
/// none ever was, `since`) is at least `every` old and no other client claimed it first.
pub fn claim(meta: &dyn Meta, now: Nanos, every: Duration, since: Nanos) -> anyhow::Result<bool> {
    let due = |old: Option<&str>| {
        let last = old.and_then(|v| v.parse::<Nanos>().ok()).unwrap_or(since);
        now.saturating_sub(last) >= every.as_nanos() as i64
    };
    // A read first: most looks find nothing due, and take no write lock.
    let mut seen = None;
    meta.read_rows(&mut |tx| {
        seen = tx.setting(CLAIM_SETTING)?;
        Ok(())
    })?;
    if !due(seen.as_deref()) {
        return Ok(false);
    }
    let mut won = false;
    meta.write_rows(&mut |tx| {
        let old = tx.setting(CLAIM_SETTING)?;
        won = due(old.as_deref())
            && tx.swap_setting(CLAIM_SETTING, old.as_deref(), &now.to_string())?;
        Ok(())
    })?;
    Ok(won)
}

/// Makes one backup of the volume at `meta_url` into `obj` now: its key. Stops early (an
/// error) when `stop` is set.
pub fn back_up(
    meta_url: &str,
    obj: &ObjectStorage,
    tmp_dir: &std::path::Path,
    stop: &AtomicBool,
) -> anyhow::Result<String> {
    // Connections of its own: the dump's long read holds none of the mount's.
    let meta = MetaUrl::parse(meta_url)?.open()?;
    let fmt = meta.format();
    crate::data::layout::private_dir(tmp_dir)
        .with_context(|| format!("cannot create {}", tmp_dir.display()))?;
    let key = format!(
        "{}{}",
        Layout::backups_prefix(&fmt),
        backup_name(now_nanos())
    );
    let tmp = tmp_dir.join(format!("{}.json.zst", std::process::id()));
    let tmp_text = tmp.to_string_lossy().into_owned();
    let res = (|| {
        dump::dump_to(&*meta, &tmp_text, &ProgressBar::hidden(), Some(stop))?;
        drop(meta);
        upload(obj, &key, &tmp)?;
        prune(obj, &fmt)
    })();
    let _ = std::fs::remove_file(&tmp);
    res.map(|()| key)
}

/// Uploads the file at `path` as `key`, read in parts sent as one object.
fn upload(obj: &ObjectStorage, key: &str, path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut parts = Vec::new();
    loop {
        let mut buf = Vec::with_capacity(PART);
        let n = (&mut f).take(PART as u64).read_to_end(&mut buf)?;
        if n == 0 {
            break;
        }
        parts.push(bytes::Bytes::from(buf));
    }
    let rt = runtime()?;
    rt.block_on(obj.put(key, Payload::from_iter(parts)))
        .with_context(|| format!("uploading the backup {key}"))?;
    Ok(())
}

/// Deletes all but the newest [`KEEP`] backups of the volume.
fn prune(obj: &ObjectStorage, fmt: &Format) -> anyhow::Result<()> {
    let rt = runtime()?;
    let mut keys: Vec<String> = rt
        .block_on(obj.list(&Layout::backups_prefix(fmt)))?
        .into_iter()
        .map(|o| o.key)
        .filter(|k| is_backup(k))
        .collect();
    keys.sort();
    let old = keys.len().saturating_sub(KEEP);
    for k in &keys[..old] {
        rt.block_on(obj.delete(k))?;
        tracing::debug!("metadata backup {k} deleted (the newest {KEEP} are kept)");
    }
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Runs this thread at the lowest CPU priority and in the idle I/O class (best effort).
fn lowest_priority() {
    // SAFETY: plain system calls on the calling thread (Linux keeps nice and I/O priority
    // per thread).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        // ioprio_set(IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT)
        libc::syscall(libc::SYS_ioprio_set, 1, tid, 3 << 13);
    }
}

/// The backup thread of a mount; stopped (a backup in progress abandoned) and joined when
/// dropped.
pub struct Backups {
    stop: Arc<AtomicBool>,
    thread: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Backups {
    /// Starts backing up the volume `meta` (this mount's own) into `obj` on `schedule`.
    pub fn start(meta: Arc<dyn Meta>, obj: ObjectStorage, schedule: Schedule) -> Backups {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<()>();
        let stopping = stop.clone();
        let since = now_nanos();
        let tick = (schedule.every / 2).clamp(Duration::from_millis(500), MAX_TICK);
        let thread = std::thread::Builder::new()
            .name("unkai-backup".into())
            .spawn(move || {
                lowest_priority();
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(tick) {
                    let now = now_nanos();
                    match claim(&*meta, now, schedule.every, since) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => {
                            tracing::warn!("metadata backup: cannot claim it: {e:#}");
                            continue;
                        }
                    }
                    let started = std::time::Instant::now();
                    match back_up(&schedule.meta_url, &obj, &schedule.tmp_dir, &stopping) {
                        Ok(key) => tracing::info!(
                            "metadata backed up to {key} in {:.1}s",
                            started.elapsed().as_secs_f64()
                        ),
                        Err(_) if stopping.load(Ordering::Relaxed) => break,
                        Err(e) => tracing::warn!(
                            "metadata backup failed (tried again in {:?}): {e:#}",
                            schedule.every
                        ),
                    }
                }
            });
        match thread {
            Ok(t) => Backups {
                stop,
                thread: Some((tx, t)),
            },
            Err(e) => {
                tracing::warn!("cannot start the metadata backup thread: {e}");
                Backups { stop, thread: None }
            }
        }
    }
}

impl Drop for Backups {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some((tx, t)) = self.thread.take() {
            drop(tx);
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_in_time_order() {
        let t = 1_795_725_391_315_098_319; // 2026-11-26 ...
        let n = backup_name(t);
        assert!(is_backup(&format!("v/u/meta/{n}")), "{n}");
        assert_eq!(n.len(), "dump-YYYY-MM-DD-HHMMSS.json.zst".len(), "{n}");
        let later = backup_name(t + 61_000_000_000);
        assert!(later > n, "{later} {n}");
        assert!(!is_backup("v/u/meta/other.txt"));
    }

    /// The claim moves only from the value read: a client that read a stale one loses.
    #[test]
    fn one_claim_wins() {
        let fmt = crate::meta::Format::for_tests("v", "memory://", 1 << 20);
        let (_dir, meta) = crate::meta::sqlite::scratch(&fmt);
        let swap = |old: Option<&str>, new: &str| {
            let mut won = false;
            meta.write_rows(&mut |tx| {
                won = tx.swap_setting(CLAIM_SETTING, old, new)?;
                Ok(())
            })
            .unwrap();
            won
        };
        assert!(swap(None, "1"));
        assert!(!swap(None, "2"), "claimed twice from nothing");
        assert!(!swap(Some("0"), "2"), "claimed from a stale value");
        assert!(swap(Some("1"), "2"));
        let hour = Duration::from_secs(3600);
        let now = now_nanos();
        // Due: the last claim ("2") is old; then not again within the interval.
        assert!(claim(&*meta, now, hour, now).unwrap());
        assert!(!claim(&*meta, now + 1, hour, now).unwrap());
        assert!(claim(&*meta, now + hour.as_nanos() as i64, hour, now).unwrap());
    }
}
