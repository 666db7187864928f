//! The staging area: block objects written on local disk, waiting for their upload.
//!
//! With write-back, a block is staged here (its object bytes, checksums included, in one file
//! named after its key) and the slice can be committed at once; `data::writeback` uploads it
//! behind the application and then removes the file. Reads of a staged block are served from
//! here. Each mount stages into a directory of its own under every cache directory
//! (`CACHE/UUID/stage-PID-N/`), locked while the mount lives; a mount or `fsck` that opens the
//! staging area adopts the blocks of directories nobody holds any more (a client killed, a
//! machine rebooted), so nothing staged is forgotten. A bound on the bytes staged makes
//! writers wait for room (back-pressure).
//!
//! A *raw* entry (`open_raw`) is a block written by appends, its bytes without checksums, in a
//! file whose name ends in `.raw`: a pack of small files (`data::pack`) while it fills. It is
//! staged like any block (adopted, synced, removed); whoever uploads it encodes it first.
//!
//! **One disk flush per sync** (SQLite volumes): the engine's fdatasync of its WAL follows
//! every [`Stage::sync`] (the vfs's fsync), and on ext4 and XFS it ends with a flush of the
//! disk's write cache, which covers every write the disk completed before it. A raw entry
//! in a directory on the same file system as the engine's file ([`Stage::share_flush_with`])
//! is therefore filled with zeros to its full length when it opens, and made durable whole
//! by its first sync (an fdatasync: its length and blocks, allocated and written, are then
//! on disk). Later pieces only overwrite those blocks, which changes no metadata, so a later
//! sync of it only writes its dirty pages and waits for them (`sync_file_range`), and the
//! engine's fdatasync right after makes them durable with its own flush: a small sync write
//! costs one disk flush, not two.
//!
//! Not for: uploading (that is `data::writeback`), or deciding what a block holds (`data::block`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::fcntl::{Flock, FlockArg};
use parking_lot::{Condvar, Mutex};

/// Why a block could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("the staging area is full ({used} of {limit} bytes) and uploads did not make room")]
    Full { used: u64, limit: u64 },
    #[error("staging {key} in {dir}: {source}")]
    Io {
        key: String,
        dir: PathBuf,
        source: io::Error,
    },
}

/// One staged block: its slice id, the bytes it counts for, whether its file is raw, and
/// for a raw one whether it was filled to its length at open (`filled`) and made durable
/// whole since (`settled`; see the module's doc).
#[derive(Clone, Copy, Debug)]
struct Entry {
    id: u64,
    len: u64,
    raw: bool,
    filled: bool,
    settled: bool,
}

impl Entry {
    fn new(id: u64, len: u64, raw: bool) -> Entry {
        Entry {
            id,
            len,
            raw,
            filled: false,
            settled: false,
        }
    }
}

#[derive(Default)]
struct Index {
    blocks: HashMap<String, Entry>,
    bytes: u64,
}

/// A mount's staging directories (one per cache directory) and what they hold.
pub struct Stage {
    dirs: Vec<PathBuf>,
    /// The lock of each directory, held while the stage lives.
    _locks: Vec<Flock<File>>,
    limit: u64,
    index: Mutex<Index>,
    room: Condvar,
    /// For each directory: whether the engine's fdatasync after every sync flushes the disk
    /// it is on (see the module's doc and [`Stage::share_flush_with`]).
    flush_shared: Vec<AtomicBool>,
}

use super::layout::local_name as file_name;

fn key_of(name: &str) -> String {
    super::layout::local_key(name.strip_suffix(RAW).unwrap_or(name))
}

/// Bytes `range` of a raw entry's file (zeros past what was appended).
fn read_range(f: &File, range: std::ops::Range<usize>) -> io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; range.len()];
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], (range.start + done) as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(Bytes::from(buf))
}

/// The suffix of a raw entry's file name.
const RAW: &str = ".raw";

/// The slice id of a block key (`.../<id>_<index>_<len>`).
pub fn slice_id(key: &str) -> Option<u64> {
    key.rsplit('/').next()?.split('_').next()?.parse().ok()
}

/// The directory holding a volume's staging directories under a cache directory.
fn volume_dir(root: &Path, uuid: &str) -> PathBuf {
    root.join(uuid)
}

const LOCK: &str = ".lock";

impl Stage {
    /// Opens a staging directory of this process under each of `roots` for volume `uuid`,
    /// holding at most `limit` bytes, and adopts the blocks of every staging directory of
    /// the volume that no live process holds. Returns the stage and the keys it holds (the
    /// adopted blocks, to upload).
    pub fn open(roots: &[PathBuf], uuid: &str, limit: u64) -> io::Result<(Stage, Vec<String>)> {
        let mut dirs = Vec::new();
        let mut locks = Vec::new();
        let mut index = Index::default();
        for root in roots {
            let vdir = volume_dir(root, uuid);
            super::layout::private_dir(&vdir).map_err(|e| {
                io::Error::new(e.kind(), format!("cache directory {}: {e}", vdir.display()))
            })?;
            let (dir, lock) = new_dir(&vdir)?;
            for other in fs::read_dir(&vdir)? {
                let other = other?.path();
                if is_unborn_dir(&other) {
                    remove_unborn(&other);
                }
                if other == dir || !is_stage_dir(&other) {
                    continue;
                }
                adopt(&other, &dir, &mut index)?;
            }
            sync_dir(&dir)?;
            dirs.push(dir);
            locks.push(lock);
        }
        let keys = index.blocks.keys().cloned().collect();
        let flush_shared = dirs.iter().map(|_| AtomicBool::new(false)).collect();
        Ok((
            Stage {
                flush_shared,
                dirs,
                _locks: locks,
                limit,
                index: Mutex::new(index),
                room: Condvar::new(),
            },
            keys,
        ))
    }

    /// The keys of every block staged on this machine for volume `uuid` (held by a live
    /// mount or waiting for adoption), without taking any.
    pub fn peek(roots: &[PathBuf], uuid: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for root in roots {
            let Ok(rd) = fs::read_dir(volume_dir(root, uuid)) else {
                continue;
            };
            for d in rd.flatten().map(|e| e.path()).filter(|p| is_stage_dir(p)) {
                for f in fs::read_dir(&d).into_iter().flatten().flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    if !name.starts_with('.') {
                        keys.push(key_of(&name));
                    }
                }
            }
        }
        keys
    }

    fn dir_index(&self, key: &str) -> usize {
        let h = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, key.as_bytes());
        h as usize % self.dirs.len()
    }

    fn dir_of(&self, key: &str) -> &Path {
        &self.dirs[self.dir_index(key)]
    }

    /// Whether the engine's fdatasync after each sync flushes the disk of `key`'s directory.
    fn flushed_by_engine(&self, key: &str) -> bool {
        self.flush_shared[self.dir_index(key)].load(Ordering::Relaxed)
    }

    /// Tells the stage that every [`Stage::sync`] is followed by an fdatasync of `file` (the
    /// engine's database: its WAL lives beside it): raw entries in directories on the same
    /// ext4 or XFS file system then cost a sync no flush of their own (see the module's doc).
    /// Returns how many directories share it.
    pub fn share_flush_with(&self, file: &Path) -> usize {
        let Some(target) = file.parent().and_then(flushing_fs) else {
            return 0;
        };
        let mut n = 0;
        for (d, shared) in self.dirs.iter().zip(&self.flush_shared) {
            if flushing_fs(d) == Some(target) {
                shared.store(true, Ordering::Relaxed);
                n += 1;
            }
        }
        n
    }

    fn path_of(&self, key: &str) -> PathBuf {
        self.dir_of(key).join(file_name(key))
    }

    /// The file of a staged entry, and whether it is raw (`None`: not staged).
    fn file_of(&self, key: &str) -> Option<(PathBuf, bool)> {
        let raw = self.index.lock().blocks.get(key)?.raw;
        Some(match raw {
            true => (self.dir_of(key).join(file_name(key) + RAW), true),
            false => (self.path_of(key), false),
        })
    }

    /// Waits up to `wait` for room for `len` more bytes, and takes it.
    fn take_room(&self, len: u64, wait: Duration) -> Result<(), StageError> {
        let deadline = Instant::now() + wait;
        let mut ix = self.index.lock();
        // An empty stage takes any block, so a block larger than the bound still goes.
        while ix.bytes > 0 && ix.bytes + len > self.limit {
            if self.room.wait_until(&mut ix, deadline).timed_out() {
                return Err(StageError::Full {
                    used: ix.bytes,
                    limit: self.limit,
                });
            }
        }
        ix.bytes += len;
        Ok(())
    }

    /// Starts a raw entry for `key` (a block of slice `id`, `len` bytes at most), empty, and
    /// returns its file for the caller's appends: its bytes count as staged from now on (up
    /// to `len`), and the directory entry is durable when this returns (a sync of the entry
    /// then syncs its file alone).
    pub fn open_raw(
        &self,
        key: &str,
        id: u64,
        len: u64,
        wait: Duration,
    ) -> Result<File, StageError> {
        self.take_room(len, wait)?;
        let dir = self.dir_of(key);
        // Filled to its length when the engine's flush will cover its later syncs.
        let fill = self.flushed_by_engine(key);
        let made = File::options()
            .write(true)
            .create_new(true)
            .open(dir.join(file_name(key) + RAW))
            .and_then(|f| {
                if fill {
                    use std::os::unix::fs::FileExt;
                    let zeros = vec![0u8; (len as usize).min(1 << 20)];
                    let mut at = 0;
                    while at < len {
                        let n = (len - at).min(zeros.len() as u64) as usize;
                        f.write_all_at(&zeros[..n], at)?;
                        at += n as u64;
                    }
                }
                sync_dir(dir).map(|()| f)
            });
        let mut ix = self.index.lock();
        match made {
            Ok(f) => {
                let mut e = Entry::new(id, len, true);
                e.filled = fill;
                ix.blocks.insert(key.into(), e);
                Ok(f)
            }
            Err(source) => {
                ix.bytes -= len;
                self.room.notify_all();
                Err(StageError::Io {
                    key: key.into(),
                    dir: dir.to_path_buf(),
                    source,
                })
            }
        }
    }

    /// Whether `key` is staged as a raw entry.
    pub fn is_raw(&self, key: &str) -> bool {
        self.index.lock().blocks.get(key).is_some_and(|e| e.raw)
    }

    /// Bytes `range` of the raw entry `key` (zeros past what was appended); `None` if it is
    /// not staged as one.
    pub fn read_raw(&self, key: &str, range: std::ops::Range<usize>) -> io::Result<Option<Bytes>> {
        let Some((path, true)) = self.file_of(key) else {
            return Ok(None);
        };
        read_range(&File::open(path)?, range).map(Some)
    }

    /// Stages `body` (the parts of its object, written one after the other) as the object of
    /// `key` (a block of slice `id`). Waits up to `wait` for room when the stage is full.
    pub fn put(
        &self,
        key: &str,
        id: u64,
        body: &[Bytes],
        wait: Duration,
    ) -> Result<(), StageError> {
        let len = body.iter().map(|b| b.len() as u64).sum();
        // Room is taken now (the key is not visible until its file is complete).
        self.take_room(len, wait)?;
        let dir = self.dir_of(key);
        let io = |source| StageError::Io {
            key: key.into(),
            dir: dir.to_path_buf(),
            source,
        };
        let tmp = dir.join(format!(".tmp.{}.{}", file_name(key), rand::random::<u32>()));
        let written = (|| {
            let mut f = File::create(&tmp)?;
            for part in body {
                f.write_all(part)?;
            }
            fs::rename(&tmp, dir.join(file_name(key)))
        })();
        let mut ix = self.index.lock();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            ix.bytes -= len;
            self.room.notify_all();
            return Err(io(e));
        }
        if let Some(old) = ix.blocks.insert(key.into(), Entry::new(id, len, false)) {
            // The same block staged again (a retried write): counted once.
            ix.bytes -= old.len;
        }
        Ok(())
    }

    /// The object staged for `key` (a raw entry's bytes as appended), if it is staged. A
    /// file gone or unreadable reads as an error (the caller may find the block in the
    /// bucket instead).
    pub fn read(&self, key: &str) -> io::Result<Option<Bytes>> {
        let Some((path, _)) = self.file_of(key) else {
            return Ok(None);
        };
        fs::read(path).map(|b| Some(Bytes::from(b)))
    }

    /// The object of `key` as another mount of this machine staged it (a raw pack: bytes
    /// `range` as appended, else the whole object with its checksums), looked for in the
    /// volume's staging directories beside this one. Two mounts of one SQLite volume stage
    /// apart: a block one staged and committed is read by the other from there until it is
    /// uploaded. `None`: no other mount has it staged.
    pub fn read_peer(&self, key: &str, range: std::ops::Range<usize>) -> Option<(Bytes, bool)> {
        let name = file_name(key);
        for vdir in self.dirs.iter().filter_map(|d| d.parent()) {
            let Ok(rd) = fs::read_dir(vdir) else {
                continue;
            };
            for d in rd.flatten().map(|e| e.path()) {
                if self.dirs.contains(&d) || !is_stage_dir(&d) {
                    continue;
                }
                if let Ok(f) = File::open(d.join(name.clone() + RAW)) {
                    return read_range(&f, range).ok().map(|b| (b, true));
                }
                if let Ok(b) = fs::read(d.join(&name)) {
                    return Some((Bytes::from(b), false));
                }
            }
        }
        None
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.lock().blocks.contains_key(key)
    }

    /// Removes a staged block (uploaded, or its slice dropped); returns its slice id if it
    /// was staged.
    pub fn remove(&self, key: &str) -> Option<u64> {
        self.remove_with(key, |_| false)
    }

    /// As [`Stage::remove`], offering the file of a block that is not raw to `keep` first
    /// (which returns whether it moved the file away, e.g. into the disk cache).
    pub fn remove_with(&self, key: &str, keep: impl FnOnce(&Path) -> bool) -> Option<u64> {
        let mut ix = self.index.lock();
        let e = ix.blocks.remove(key)?;
        ix.bytes -= e.len;
        // The file goes while the index is locked: a block staged again under the same key
        // (after this removal) cannot lose its new file to this one's deletion.
        let mut path = self.path_of(key);
        if e.raw {
            path.as_mut_os_string().push(RAW);
        }
        if e.raw || !keep(&path) {
            let _ = fs::remove_file(path);
        }
        self.room.notify_all();
        Some(e.id)
    }

    /// Starts writing out the staged pieces of `keys` whose sync costs no flush of its own
    /// (settled, flushed by the engine), without waiting: the [`Stage::sync`] that follows
    /// waits for writes already under way while the engine commits. Best effort: that sync
    /// reports what fails.
    pub fn start_sync(&self, keys: &[String]) {
        for k in keys {
            let Some((path, _)) = self.file_of(k) else {
                continue;
            };
            let settled = self.index.lock().blocks.get(k).is_some_and(|e| e.settled);
            if settled && self.flushed_by_engine(k) {
                if let Ok(f) = File::open(path) {
                    crate::object::local::start_write_out(&f);
                }
            }
        }
    }

    /// Makes the staged blocks among `keys` durable (their files and directories); returns
    /// the keys that are not staged (already uploaded, or never staged). A settled raw entry
    /// whose directory shares the engine's flush ([`Stage::share_flush_with`]) is only
    /// written out here: it is durable once the engine's fdatasync that follows returns.
    pub fn sync(&self, keys: &[String]) -> io::Result<Vec<String>> {
        let mut rest = Vec::new();
        let mut dirs: Vec<&Path> = Vec::new();
        for k in keys {
            let Some((path, raw)) = self.file_of(k) else {
                rest.push(k.clone());
                continue;
            };
            let (filled, settled) = self
                .index
                .lock()
                .blocks
                .get(k)
                .map_or((false, false), |e| (e.filled, e.settled));
            let synced = File::open(path).and_then(|f| {
                if settled && self.flushed_by_engine(k) {
                    write_out(&f)
                } else {
                    f.sync_data()
                }
            });
            match synced {
                Ok(()) if filled && !settled => {
                    if let Some(e) = self.index.lock().blocks.get_mut(k) {
                        e.settled = true;
                    }
                }
                Ok(()) => {}
                // Uploaded (and removed) meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound && !self.contains(k) => {
                    rest.push(k.clone());
                    continue;
                }
                Err(e) => return Err(e),
            }
            // A raw entry's name was made durable when it was opened.
            let d = self.dir_of(k);
            if !raw && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        for d in dirs {
            sync_dir(d)?;
        }
        Ok(rest)
    }

    /// Makes every staged block durable (`syncfs` of each staging directory's file system).
    pub fn sync_everything(&self) -> io::Result<()> {
        self.dirs
            .iter()
            .try_for_each(|d| crate::object::local::sync_file_system(d))
    }

    /// Blocks and bytes staged.
    pub fn usage(&self) -> (u64, u64) {
        let ix = self.index.lock();
        (ix.blocks.len() as u64, ix.bytes)
    }

    /// The slice id of every block staged (one entry per block).
    pub fn ids(&self) -> Vec<u64> {
        self.index.lock().blocks.values().map(|e| e.id).collect()
    }

    /// The bound on the bytes staged.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The staging directories of this stage.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // An empty directory goes; one still holding blocks stays, for the next mount.
        if self.index.lock().blocks.is_empty() {
            for d in &self.dirs {
                remove_empty(d);
            }
        }
    }
}

fn is_stage_dir(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("stage-"))
        && p.is_dir()
}

/// Takes the exclusive lock of a staging directory's lock file, if no live process holds it.
fn try_lock(f: File) -> Result<Flock<File>, nix::Error> {
    Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e)
}

/// Creates and locks a new staging directory in `vdir`. It is made and locked under a name
/// adoption never looks at (`.new-stage-*`) and then renamed into place, so that another
/// mount starting at the same moment never finds it before it is locked (it would take the
/// empty directory for a dead mount's, lock it and remove it, under the new mount's feet).
fn new_dir(vdir: &Path) -> io::Result<(PathBuf, Flock<File>)> {
    loop {
        let name = format!("stage-{}-{:08x}", std::process::id(), rand::random::<u32>());
        let (tmp, dir) = (vdir.join(format!(".new-{name}")), vdir.join(&name));
        if dir.exists() {
            continue;
        }
        match fs::create_dir(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        let lock = try_lock(File::create(tmp.join(LOCK))?)
            .map_err(|e| io::Error::other(format!("locking {}: {e}", tmp.display())))?;
        fs::rename(&tmp, &dir)?;
        return Ok((dir, lock));
    }
}

/// Removes `p`, a directory `new_dir` made and never renamed into place (its mount ended in
/// between), once it is an hour old: an empty directory and its lock file.
fn remove_unborn(p: &Path) {
    let old = fs::metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > Duration::from_secs(3600));
    if !old {
        return;
    }
    // (Asked only of an old one: taking the lock of a young one, even for a moment, would
    // fail its mount's own locking.)
    let free = match File::open(p.join(LOCK)) {
        Ok(f) => try_lock(f).is_ok(),
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    };
    if free {
        remove_empty(p);
    }
}

/// Removes staging directory `d` with its lock file, if nothing else is left in it.
fn remove_empty(d: &Path) {
    let _ = fs::remove_file(d.join(LOCK));
    let _ = fs::remove_dir(d);
}

fn is_unborn_dir(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(".new-stage-"))
}

/// Moves the blocks of `other` into `dir` if no live process holds `other`, then removes it.
fn adopt(other: &Path, dir: &Path, index: &mut Index) -> io::Result<()> {
    let file = match File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(other.join(LOCK))
    {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("staging directory {}: {e}; left alone", other.display());
            return Ok(());
        }
    };
    let Ok(_lock) = try_lock(file) else {
        return Ok(()); // a live mount holds it
    };
    let mut adopted = 0;
    let files = match fs::read_dir(other) {
        Ok(rd) => rd,
        // Removed since it was listed: its mount emptied it as it ended, or another mount
        // starting adopted it first.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for f in files {
        let f = f?;
        let name = f.file_name().to_string_lossy().into_owned();
        if name == LOCK {
            continue;
        }
        if name.starts_with(".tmp.") {
            // Never complete: its write was never acknowledged.
            let _ = fs::remove_file(f.path());
            continue;
        }
        let key = key_of(&name);
        let Some(id) = slice_id(&key) else {
            tracing::warn!("staging: {} is not a block; left alone", f.path().display());
            continue;
        };
        let to = dir.join(&name);
        fs::rename(f.path(), &to)?;
        let len = fs::metadata(&to)?.len();
        // A raw entry is adopted as it is: its mount appends no more, so it goes up as it stands.
        let raw = name.ends_with(RAW);
        if let Some(old) = index.blocks.insert(key, Entry::new(id, len, raw)) {
            index.bytes -= old.len;
        }
        index.bytes += len;
        adopted += 1;
    }
    if adopted > 0 {
        tracing::info!(
            "staging: adopted {adopted} blocks left by a mount that ended without uploading \
             them ({}); uploading them now",
            other.display()
        );
    }
    let _ = fs::remove_file(other.join(LOCK));
    if let Err(e) = fs::remove_dir(other) {
        tracing::warn!("staging directory {}: {e}", other.display());
    }
    Ok(())
}

fn sync_dir(d: &Path) -> io::Result<()> {
    File::open(d)?.sync_all()
}

/// Writes `f`'s dirty pages and waits for the disk to complete them (into its write cache:
/// a flush must follow to make them durable; see the module's doc). Changes no metadata.
fn write_out(f: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain system call on a descriptor `f` keeps open.
    match unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, flags) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The device of `p`'s file system if its fdatasync always ends with a flush of the disk's
/// write cache and overwriting written blocks changes no metadata there (ext4, XFS).
fn flushing_fs(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    let st = nix::sys::statfs::statfs(p).ok()?;
    let kind = st.filesystem_type().0 as i64;
    (kind == EXT4 || kind == XFS).then_some(())?;
    Some(fs::metadata(p).ok()?.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(t: &tempfile::TempDir) -> Vec<PathBuf> {
        vec![t.path().join("a"), t.path().join("b")]
    }

    #[test]
    fn names_round_trip_and_name_their_slice() {
        let k = "vol/uu-id/chunks/0/12/12345_3_4096";
        assert_eq!(key_of(&file_name(k)), k);
        assert_eq!(key_of(&file_name("a%2Fb/c")), "a%2Fb/c");
        assert_eq!(slice_id(k), Some(12345));
        assert_eq!(slice_id("vol/x"), None);
    }

    /// Mounts starting at the same moment never take each other's new staging directory for
    /// a dead mount's (removing it under the new mount): each is locked before it is seen.
    #[test]
    fn stages_opened_at_once_keep_their_directories() {
        let t = tempfile::tempdir().unwrap();
        let roots = vec![t.path().join("a")];
        std::thread::scope(|sc| {
            for th in 0..3u64 {
                let roots = &roots;
                sc.spawn(move || {
                    for i in 0..300u64 {
                        let (s, _) = Stage::open(roots, "u1", 1 << 20).unwrap();
                        let id = th * 1000 + i;
                        let k = format!("v/u1/chunks/0/0/{id}_0_5");
                        s.put(&k, id, &[vec![7u8; 5].into()], Duration::ZERO)
                            .unwrap();
                        assert!(s.dirs()[0].join(LOCK).exists(), "{:?}", s.dirs());
                        assert_eq!(s.read(&k).unwrap().unwrap(), vec![7u8; 5]);
                        assert_eq!(s.remove(&k), Some(id));
                    }
                });
            }
        });
        // Nothing left behind: every stage went empty, and no directory was left unborn.
        let left: Vec<_> = fs::read_dir(volume_dir(&roots[0], "u1"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// A directory left between its making and its renaming (a mount killed there) goes
    /// once old; a young one stays (it may be a mount starting now).
    #[test]
    fn unborn_staging_directories_go_once_old() {
        let t = tempfile::tempdir().unwrap();
        let roots = vec![t.path().join("a")];
        let vdir = volume_dir(&roots[0], "u1");
        fs::create_dir_all(&vdir).unwrap();
        let (old, young) = (vdir.join(".new-stage-1-aa"), vdir.join(".new-stage-2-bb"));
        for d in [&old, &young] {
            fs::create_dir(d).unwrap();
            File::create(d.join(LOCK)).unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
        File::open(&old).unwrap().set_modified(hour_ago).unwrap();
        let (s, _) = Stage::open(&roots, "u1", 1 << 20).unwrap();
        assert!(!old.exists());
        assert!(young.exists());
        assert!(s.dirs()[0].starts_with(&vdir));
    }

    /// Blocks put are read back, synced, removed; a stage dropped with blocks leaves them
    /// for the next, which adopts them; one dropped empty leaves nothing.
    #[test]
    fn blocks_outlive_the_stage_that_staged_them() {
        let t = tempfile::tempdir().unwrap();
        let (s, keys) = Stage::open(&roots(&t), "u1", 1 << 20).unwrap();
        assert!(keys.is_empty());
        let keys: Vec<String> = (0..6).map(|i| format!("v/u1/chunks/0/0/{i}_0_5")).collect();
        for (i, k) in keys.iter().enumerate() {
            // In two parts (data, then checksums), written as one file.
            let parts = [vec![i as u8; 3].into(), vec![i as u8; 2].into()];
            s.put(k, i as u64, &parts, Duration::ZERO).unwrap();
        }
        assert_eq!(s.usage(), (6, 30));
        assert_eq!(s.read(&keys[2]).unwrap().unwrap(), vec![2u8; 5]);
        assert_eq!(s.sync(&keys[..3]).unwrap(), Vec::<String>::new());
        assert_eq!(s.remove(&keys[0]), Some(0));
        assert_eq!(s.remove(&keys[0]), None);
        assert_eq!(s.read(&keys[0]).unwrap(), None);
        assert_eq!(s.sync(&keys[..1]).unwrap(), vec![keys[0].clone()]);
        let mut peeked = Stage::peek(&roots(&t), "u1");
        peeked.sort();
        assert_eq!(peeked, keys[1..].to_vec());
        // A live stage's blocks are not adopted by another.
        let (other, adopted) = Stage::open(&roots(&t), "u1", 1 << 20).unwrap();
        assert!(adopted.is_empty());
        drop(other);
        drop(s);
        let (s2, mut adopted) = Stage::open(&roots(&t), "u1", 1 << 20).unwrap();
        adopted.sort();
        assert_eq!(adopted, keys[1..].to_vec());
        assert_eq!(s2.usage(), (5, 25));
        assert_eq!(s2.read(&keys[4]).unwrap().unwrap(), vec![4u8; 5]);
        for k in &keys[1..] {
            assert!(s2.remove(k).is_some());
        }
        drop(s2);
        for r in roots(&t) {
            let left: Vec<_> = fs::read_dir(r.join("u1")).unwrap().collect();
            assert!(left.is_empty(), "{left:?}");
        }
    }

    /// A full stage makes a writer wait until a removal makes room, and refuses after the
    /// wait runs out.
    #[test]
    fn a_full_stage_makes_writers_wait() {
        let t = tempfile::tempdir().unwrap();
        let (s, _) = Stage::open(&roots(&t)[..1], "u2", 10).unwrap();
        let s = std::sync::Arc::new(s);
        s.put("v/1_0_8", 1, &[vec![1; 8].into()], Duration::ZERO)
            .unwrap();
        let err = s.put(
            "v/2_0_8",
            2,
            &[vec![2; 8].into()],
            Duration::from_millis(10),
        );
        assert!(
            matches!(err, Err(StageError::Full { used: 8, limit: 10 })),
            "{err:?}"
        );
        let s2 = s.clone();
        let waiter = std::thread::spawn(move || {
            s2.put("v/2_0_8", 2, &[vec![2; 8].into()], Duration::from_secs(60))
        });
        // The waiter can only finish after the removal below.
        assert!(s.contains("v/1_0_8"));
        assert_eq!(s.remove("v/1_0_8"), Some(1));
        waiter.join().unwrap().unwrap();
        assert_eq!(s.usage(), (1, 8));
    }
}
