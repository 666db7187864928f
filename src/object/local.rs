//! `file:///dir`: a local directory used as the bucket.
//!
//! Not for: durability policy (callers decide when to `sync`).

use std::path::Path;
use std::sync::Arc;

use object_store::ObjectStore;

use super::Error;

pub fn build(url: &str, dir: &Path, create: bool) -> Result<Arc<dyn ObjectStore>, Error> {
    if create {
        std::fs::create_dir_all(dir).map_err(|e| Error::Unusable {
            url: url.into(),
            step: "creating the directory",
            msg: e.to_string(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })?;
    }
    if !dir.is_dir() {
        return Err(Error::Unusable {
            url: url.into(),
            step: "opening",
            msg: format!("{} is not a directory", dir.display()),
            errno: libc::ENOTDIR,
        });
    }
    let fs =
        object_store::local::LocalFileSystem::new_with_prefix(dir)?.with_automatic_cleanup(true);
    Ok(Arc::new(fs))
}

/// How many `fdatasync`s [`sync`] runs at once.
const SYNC_THREADS: usize = 16;

/// Makes the given objects (and their directories) durable.
///
/// Every file's writes are started first (`sync_file_range`, no wait), then the files are
/// synced several at once: the disk gets all the writes in one go, and the file system joins
/// the concurrent syncs' journal commits and flushes. One after the other, each fdatasync
/// paid its own writes and disk flush: the fsync of a 2 GiB file just written (512 blocks)
/// took longer than its writing.
/// Returns how many objects there were (those deleted meanwhile are skipped).
pub fn sync(root: &Path, keys: &[String]) -> std::io::Result<usize> {
    let mut files = Vec::with_capacity(keys.len());
    let mut dirs = std::collections::BTreeSet::new();
    for k in keys {
        let p = root.join(k);
        match std::fs::File::open(&p) {
            Ok(f) => {
                start_write_out(&f);
                files.push(f);
            }
            // Deleted since it was written (its slice was truncated away or compacted).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        if let Some(d) = p.parent() {
            dirs.insert(d.to_path_buf());
        }
    }
    // Its data and the size needed to read it back (its times do not matter).
    all_at_once(&files, |f| f.sync_data())?;
    let dirs: Vec<_> = dirs.into_iter().collect();
    all_at_once(&dirs, |d| match std::fs::File::open(d) {
        Ok(f) => f.sync_all(),
        // Emptied and removed since (the local store removes empty directories).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    })?;
    Ok(files.len())
}

/// Makes everything written to the file system holding `dir` durable (`syncfs`). Also the
/// staging area's (`data::stage`).
pub(crate) fn sync_file_system(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    // SAFETY: a plain system call on a descriptor `d` keeps open.
    match unsafe { libc::syncfs(d.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Objects at least this large have their disk writes started once put
/// ([`write_out_early`]).
pub const WRITE_OUT_EARLY: usize = 1 << 20;

/// Starts the disk writes of the object just put at `path`: a large write's blocks then reach
/// the disk while the application is still writing, and its fsync ([`sync`]) finds most of
/// them written, where it used to write the whole file itself (2 GiB: two seconds of the
/// fsync's). The kernel would write them anyway within half a minute.
pub fn write_out_early(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        start_write_out(&f);
    }
}

/// Starts writing `f`'s dirty pages out, without waiting (a failure leaves them to the
/// fdatasync that follows, if any). Also the staging area's (`data::stage`).
pub(crate) fn start_write_out(f: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor `f` keeps open.
    unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Runs `op` on every item, up to [`SYNC_THREADS`] at once; the first error.
fn all_at_once<T: Sync>(
    items: &[T],
    op: impl Fn(&T) -> std::io::Result<()> + Sync,
) -> std::io::Result<()> {
    if items.len() <= 1 {
        return items.iter().try_for_each(&op);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..SYNC_THREADS.min(items.len()))
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        match items.get(i) {
                            Some(item) => op(item)?,
                            None => return Ok(()),
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a sync thread panicked"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many objects in several directories are synced at once; ones deleted meanwhile (or
    /// whose directory is gone) are skipped; a file that cannot be opened fails it.
    #[test]
    fn many_objects_sync_at_once_and_missing_ones_are_skipped() {
        let t = tempfile::tempdir().unwrap();
        let mut keys = Vec::new();
        for d in 0..3 {
            for i in 0..30 {
                let k = format!("v/chunks/{d}/{i}_0_4");
                let p = t.path().join(&k);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, format!("{d}-{i}")).unwrap();
                keys.push(k);
            }
        }
        std::fs::remove_file(t.path().join(&keys[7])).unwrap();
        keys.push("v/chunks/9/gone_0_4".into());
        assert_eq!(sync(t.path(), &keys).unwrap(), 89, "the objects there");
        sync_file_system(t.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(t.path().join(&keys[31])).unwrap(),
            "1-1"
        );
        // One that exists but cannot be read: the error comes back (as root, a mode does
        // not stop the open; a name too long for the file system does).
        keys.push(format!("v/chunks/0/{}", "x".repeat(300)));
        let e = sync(t.path(), &keys).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{e}");
    }
}
